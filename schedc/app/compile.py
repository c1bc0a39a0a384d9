"""``schedc.compile(problem, method)``: a problem to a CompiledSchedule (``schedc.schedfile``), by
the solver or a named schedule of the registry."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import schedc.solvers as solvers
from schedc.interop import torch_ready
from schedc.problem import Problem, load_problem
from schedc.schedfile import CompiledSchedule


def compile(  # noqa: A001 - schedc.compile is the documented name
    problem: Problem | str | Path,
    method: str = "ilp",
    *,
    time_limit: float = 60.0,
    gap: float = 1e-4,
    solver: str = "auto",
    threads: int | None = None,
    progress: Callable | None = None,
    torch: bool = False,
) -> CompiledSchedule:
    """Compile ``problem`` (a Problem or a problem file) with ``method``: a search ("ilp": solve
    under the memory limit, see ``schedc.solvers.search.solve.solve`` for the options) or a registry
    schedule name (``schedc schedules`` lists them). With ``torch``, for torch.distributed.pipelining's
    runtime (``schedc.runtime.torch_pipeline``): what it cannot run is refused in one line, and the
    microbatches are numbered in the order the last stage runs their forwards, as it assumes (the
    same schedule: ``schedc.interop.in_torch_order``)."""
    if not isinstance(problem, Problem):
        problem = load_problem(problem)
    if method in solvers.SEARCHES:
        search = solvers.SEARCHES[method]
        result = search(problem, solver=solver, time_limit=time_limit, gap=gap, threads=threads, progress=progress,
                        **({"torch": True} if torch else {}))
        return CompiledSchedule.build(problem, result.schedule, result.summary(), timeline=result.timeline)
    schedule = solvers.build(method, problem)
    return CompiledSchedule.build(problem, torch_ready(problem, schedule, renumber=True) if torch else schedule)
