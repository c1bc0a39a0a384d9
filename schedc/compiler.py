"""``schedc.compile(problem, method)`` and the CompiledSchedule it returns (and ``schedc.load`` reads).

A CompiledSchedule holds what the runtime needs without solving again: the Problem (placement of
stages on ranks, costs), the Schedule, the lowered Program (``program.for_rank(r)``), the simulated
Timeline, solver statistics and provenance.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from schedc.inputs import one_line
from schedc.problem import Problem
from schedc.program import Program, lower
from schedc.schedule import Schedule
from schedc.simulate import Timeline, simulate


@dataclass(frozen=True)
class CompiledSchedule:
    problem: Problem
    schedule: Schedule
    program: Program
    timeline: Timeline
    solver: dict[str, Any] | None  # the ILP's statistics; None for a named schedule
    provenance: dict[str, str]  # schedc version, command, created (UTC, ISO 8601)

    @property
    def name(self) -> str:
        return self.schedule.name

    def save(self, path: str | Path) -> None:
        from schedc.schedfile import save

        save(self, path)

    @classmethod
    def build(
        cls, problem: Problem, schedule: Schedule, solver: dict | None = None, command: str | None = None,
        timeline: Timeline | None = None,
    ) -> "CompiledSchedule":
        """Lower ``schedule`` (checked complete and deadlock-free by the simulator first)."""
        from schedc import __version__

        timeline = timeline or simulate(problem, schedule)
        provenance = {
            "schedc": __version__,
            "command": command if command is not None else _command(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        return cls(problem, schedule, lower(problem, schedule, timeline), timeline, solver, provenance)


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
    """Compile ``problem`` (a Problem or a problem file) with ``method``: "ilp" (solve under the
    memory limit, see ``schedc.solvers.ilp.solve`` for the options) or a registry schedule name
    (``schedc schedules`` lists them)."""
    import schedc.solvers as solvers
    from schedc.problem import load_problem

    if not isinstance(problem, Problem):
        problem = load_problem(problem)
    if method == "ilp":
        from schedc.solvers.ilp import solve

        result = solve(problem, solver=solver, time_limit=time_limit, gap=gap, threads=threads, progress=progress)
        return CompiledSchedule.build(problem, result.schedule, result.summary(), timeline=result.timeline)
    return CompiledSchedule.build(problem, solvers.build(method, problem))


def _command() -> str:
    """How this process was started: the schedc command line, or the Python program."""
    argv = [Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]
    return one_line(" ".join(argv), 2000)  # the file's provenance is plain text on one line
