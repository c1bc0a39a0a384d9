"""What the exact searches share: the backend protocol and its registry, the live progress
report, the precedence edges of a problem's ops and the longest paths over them (the windows
every model tightens with).

A search backend is a function ``search(problem, incumbent, settings) -> Found``: it looks for a
better order than the incumbent (a fitting Timeline) before ``settings.budget`` runs out and
reports what it found and what it proved. ``schedc.solvers.search.solve.solve`` does the rest (warm
start, local search, judging the result with the simulator, the status). A backend registers
itself with ``@register_backend(NAME)`` (or one line ``BACKENDS[NAME] = search``), the name that
``solve(problem, solver=NAME)`` and ``schedc solve --solver NAME`` take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from schedc.kinds import RECOMPUTES, Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, producers
from schedc.simulate import Timeline
from schedc.solvers.deadline import Budget

WINDOW_MIN_SECONDS = 5.0  # the least time worth a search step (a neighbourhood of the ILP's search)


@dataclass(frozen=True)
class Settings:
    """What every search backend is given."""

    budget: Budget  # it returns before this runs out
    gap: float  # it may stop when (incumbent - bound) / incumbent is below this
    threads: int | None  # None: the backend's own default
    lower: float  # a proven lower bound on the objective (the independent one)
    progress: Callable | None = None  # hears Progress events, seconds on the backend's own clock


@dataclass
class Found:
    """What a search backend returns."""

    schedule: Schedule | None  # a better order than the incumbent, or None
    bound: float | None = None  # a lower bound the backend proved, or None
    history: list = field(default_factory=list)  # its Progress events
    note: str = ""  # contains "time" when the budget cut it short
    binaries: int = 0  # the size of its model, for the report


Backend = Callable[[Problem, Timeline, Settings], Found]
BACKENDS: dict[str, Backend] = {}  # name -> search; filled by the backends' modules
COPY_LANE: set[str] = set()  # the backends that model the copy lane (offload); the others get an incumbent without


def register_backend(name: str) -> Callable[[Backend], Backend]:
    """Register a search backend under ``name`` (as ``registry.register`` does a schedule)."""

    def wrap(fn: Backend) -> Backend:
        if name in BACKENDS:
            raise ValueError(f"search backend {name!r} registered twice")
        BACKENDS[name] = fn
        return fn

    return wrap


@dataclass(frozen=True)
class Progress:
    """A live report: seconds since ``solve`` began, the search's incumbent and bound (None when
    unknown), or a ``note`` on a step that is not the search (the warm start, the time limit)."""

    seconds: float
    incumbent: float | None
    bound: float | None
    note: str = ""


def order_edges(
    problem: Problem, ops: list[Op], index: dict[Op, int], in_order: Schedule | bool = False
) -> list[tuple[int, int, float]]:
    """Edges ``(a, b, latency)`` that fix "a ends before b starts": data dependencies (latency
    ``comm`` across ranks) and a microbatch order.

    Microbatches are interchangeable, so numbering them in the order they enter stage 0 loses
    no schedule: F(0, i) before F(0, i+1) is always added. ``in_order`` also runs every kind on
    every stage in microbatch order: a restriction (some optimal schedules reorder microbatches,
    tests/test_exhaustive.py has one), so only searches that claim no bound may use it. With a
    Schedule as ``in_order``, only the pairs that schedule runs in microbatch order are fixed so
    (it stays a solution of the model).

    With sequence chunks (k = ``Problem.seq_chunks``; an op's mb is a unit, sequence * k + chunk),
    the chunk rule's edges too (``producers``), and sequences, not units, are interchangeable (a
    chunk position has its own costs and memory): the symmetry edge is F(0, chunk 0 of sequence i)
    before F(0, chunk 0 of sequence i+1), which any schedule keeps once its sequences are numbered
    by when their first chunk enters stage 0 (the other chunks of sequence i may still run after
    sequence i+1's first); ``in_order`` likewise orders the units of one chunk position."""
    rank_of, k = problem.stage_rank, problem.seq_chunks
    pos = {op: x for ops in in_order.ranks for x, op in enumerate(ops)} if isinstance(in_order, Schedule) else None
    edges = []
    for op in ops:
        for d in producers(op, problem.pipeline_stages, index, k):
            edges.append((index[d], index[op], 0.0 if rank_of[d.stage] == rank_of[op.stage] else problem.comm))
        if op.mb < k:
            continue
        prev = op._replace(mb=op.mb - k)  # the same chunk position of the sequence before
        first = op.kind == Kind.F and op.stage % problem.pipeline_stages == 0 and op.mb % k == 0
        if first or (in_order and (pos is None or pos[prev] < pos[op])):
            edges.append((index[prev], index[op], 0.0))
    return edges


def longest_paths(dur: list, edges: list[tuple[int, int, float]]):
    """Over the DAG of ``edges`` ``(a, b, latency)`` with op durations ``dur``: a topological
    order, each op's earliest start (longest path from the sources), its tail (longest path from
    its start to the end of the last op it leads to, its own duration included), and successors."""
    succ: list[list[tuple[int, float]]] = [[] for _ in dur]
    indeg = [0] * len(dur)
    for a, b, lat in edges:
        succ[a].append((b, lat))
        indeg[b] += 1
    order = [k for k in range(len(dur)) if indeg[k] == 0]
    earliest = [0 * d for d in dur]  # zeros of the durations' type (CP-SAT works in integers)
    for a in order:  # grows while iterating: a topological order
        for b, lat in succ[a]:
            earliest[b] = max(earliest[b], earliest[a] + dur[a] + lat)
            indeg[b] -= 1
            if indeg[b] == 0:
                order.append(b)
    tail = list(dur)
    for a in reversed(order):
        for b, lat in succ[a]:
            tail[a] = max(tail[a], dur[a] + lat + tail[b])
    return order, earliest, tail, succ


def descendants(order: list[int], succ: list[list[tuple[int, float]]]) -> list[int]:
    """Per op, the ops its edges lead to, as a bit set (``longest_paths``' topological order and
    successors)."""
    reach = [0] * len(succ)
    for a in reversed(order):
        bits = 0
        for b, _ in succ[a]:
            bits |= reach[b] | (1 << b)
        reach[a] = bits
    return reach


# ---- recompute as the searches model it ----

# The recompute ops (schedc.kinds.RECOMPUTES) are the policies the models choose: each is always in the
# model, lasting its time x its binary.


def model_kinds(problem: Problem) -> tuple[Kind, ...]:
    """The kinds of the model's ops on ``problem``: F, B, W and the recomputes it allows."""
    return (Kind.F, Kind.B, Kind.W) + problem.recomputes


def model_deltas(problem: Problem, stage: int) -> dict[Kind, float]:
    """The model's memory delta per kind on ``stage``, constants whatever the policy: a recompute
    op that is not chosen lasts 0 and sits right after its F, so F's delta plus those of the
    recompute ops right after it must give what the chosen policy holds at each of them: F + R + S
    = the activation (kept), F + S = R's keep (R chosen: S at F), F + R = S's keep (S chosen)."""
    a = problem.mem[Kind.F][stage]
    out = {k: problem.mem[k][stage] for k in (Kind.B, Kind.W)}
    out[Kind.F] = a
    for k in RECOMPUTES:
        if k in problem.policies:
            out[k] = problem.mem[k][stage]  # what it brings back: the activation less its keep
            out[Kind.F] -= out[k]
    return out


def model_op_deltas(problem: Problem, ops: list[Op]) -> list[float]:
    """Per op, the model's memory delta (``model_deltas``), a sequence chunk's its chunk
    position's share of it (``Problem.memory_share``; no recompute with sequence chunks)."""
    deltas = [model_deltas(problem, s) for s in range(problem.n_stages)]
    return [deltas[op.stage].get(op.kind, problem.mem[op.kind][op.stage]) * problem.memory_share(op.mb) for op in ops]
