"""One study's results: a row per cell and schedule, and the comparison each cell is judged by
(the best fitting heuristic against the solved schedule, and 1F1B). Read by the study's report
and by its figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from schedc.solvers.registry import REGISTRY

ILP = "ilp"  # the solved schedule's name in a study


@dataclass
class Row:
    cell: str
    problem: str
    ranks: int
    microbatches: int
    chunks: int
    placement: str
    comm: float
    objective: str
    memory_factor: Optional[float]
    memory_limit: Optional[float]
    schedule: str
    status: str  # "fits", "over memory", "n/a: ...", or the ILP status
    makespan: Optional[float] = None
    span: Optional[float] = None
    objective_value: Optional[float] = None
    bubble: Optional[float] = None
    peak_memory: Optional[float] = None
    bound: Optional[float] = None
    gap: Optional[float] = None
    seconds: Optional[float] = None
    measured_ms: Optional[float] = None
    policies: Optional[str] = None  # the cell's value of the policies axis (None: no such axis)
    recompute: Optional[int] = None  # (stage, microbatch)s the schedule recomputes, where the problem allows it
    selective: Optional[int] = None  # ... recomputes selectively
    offload: Optional[int] = None  # ... offloads
    extra: dict = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.objective_value is not None and self.status != "over memory"


def best_heuristic(rows: list[Row]) -> Row | None:
    """The fitting synchronous registry schedule with the best objective (first of equals, config
    order): the solved schedule is synchronous, and an asynchronous one (2bw) runs other
    semantics (stale gradients), so it is listed in the results but is not what the search is
    judged against."""
    best = None
    for r in rows:
        spec = REGISTRY.get(r.schedule)
        if r.schedule != ILP and r.status == "fits" and (spec is None or spec.synchronous):
            if best is None or r.objective_value < best.objective_value - 1e-12:
                best = r
    return best


@dataclass(frozen=True)
class Outcome:
    """One cell's comparison: the best fitting heuristic, the solved row, and the solved
    schedule's speed-ups (objective ratios) over the former and over 1F1B where each exists."""

    best: Row | None
    ilp: Row | None
    vs_best: float | None
    vs_1f1b: float | None


def outcome(rows: list[Row]) -> Outcome:
    best = best_heuristic(rows)
    ilp = next((r for r in rows if r.schedule == ILP and r.objective_value is not None), None)
    ofob = next((r for r in rows if r.schedule == "1f1b" and r.status == "fits"), None)
    ratio = lambda r: r.objective_value / ilp.objective_value if r and ilp else None  # noqa: E731
    return Outcome(best, ilp, ratio(best), ratio(ofob))
