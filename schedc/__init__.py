"""schedc: a compiler for pipeline-parallel training schedules.

Problem -> Schedule (a heuristic from the registry, or solved) -> Timeline (simulate)
-> Program (lower) -> schedule file (``CompiledSchedule.save``, ``schedc.load``) -> runtime.
Nothing heavy is imported here: torch, PuLP and matplotlib load only where they are used, and
``import schedc`` loads the core alone (no solver, no application module: the runtime's ranks
import it). ``schedc.compile`` belongs to the application layer and is loaded on first use.
The layers (docs/architecture.md): the core (this package's own modules), ``schedc.solvers``
and ``schedc.runtime`` over it, and ``schedc.app`` (CLI, compile, studies, figures) on top.
"""

from schedc.check import check
from schedc.errors import ConfigError, ProblemError, ProgramError, SchedcError, ScheduleError, ScheduleFileError
from schedc.problem import Problem, load_problem
from schedc.program import Instr, Program, lower
from schedc.schedfile import CompiledSchedule, load
from schedc.schedule import Op, Schedule
from schedc.simulate import Timeline, simulate
from schedc.version import __version__


def __getattr__(name: str):
    """``schedc.compile``, loaded from the application layer on first use (PEP 562)."""
    if name == "compile":
        from schedc.app.compile import compile  # the front door's one upward arrow: pyproject's ignore_imports

        globals()["compile"] = compile
        return compile
    raise AttributeError(f"module 'schedc' has no attribute {name!r}")


__all__ = [
    "CompiledSchedule",
    "ConfigError",
    "Instr",
    "Op",
    "Problem",
    "ProblemError",
    "Program",
    "ProgramError",
    "SchedcError",
    "Schedule",
    "ScheduleError",
    "ScheduleFileError",
    "Timeline",
    "check",
    "compile",
    "load",
    "load_problem",
    "lower",
    "simulate",
]
