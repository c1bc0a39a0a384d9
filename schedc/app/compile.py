"""``schedc.compile(problem, method)``: a problem to a CompiledSchedule (``schedc.schedfile``), by
the solver or a named schedule of the registry."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import schedc.solvers as solvers
from schedc.problem import Problem, load_problem
from schedc.schedfile import CompiledSchedule


def compile(  # noqa: A001 - schedc.compile is the documented name
    problem: Problem | str | Path,
    method: str = "ilp",
    *,
    time_limit: float = 60.0,
    gap: float = 1e-4,
    solver: str = "cbc",
    threads: int | None = None,
    progress: Callable | None = None,
) -> CompiledSchedule:
    """Compile ``problem`` (a Problem or a problem file) with ``method``: a search ("ilp": solve
    under the memory limit, see ``schedc.solvers.solve.solve`` for the options) or a registry
    schedule name (``schedc schedules`` lists them)."""
    if not isinstance(problem, Problem):
        problem = load_problem(problem)
    if method in solvers.SEARCHES:
        search = solvers.SEARCHES[method]
        result = search(problem, solver=solver, time_limit=time_limit, gap=gap, threads=threads, progress=progress)
        return CompiledSchedule.build(problem, result.schedule, result.summary(), timeline=result.timeline)
    return CompiledSchedule.build(problem, solvers.build(method, problem))
