"""schedc: a compiler for pipeline-parallel training schedules.

Problem -> Schedule (a heuristic from the registry, or solved) -> Timeline (simulate)
-> Program (lower) -> schedule file (``CompiledSchedule.save``, ``schedc.load``) -> runtime.
Nothing heavy is imported here: torch, PuLP and matplotlib load only where they are used.
The layers (README, "Architecture"): the core (this package's own modules), ``schedc.solvers``
and ``schedc.runtime`` over it, and ``schedc.app`` (CLI, compile, studies, figures) on top.
"""

from schedc.app.compile import compile
from schedc.check import check
from schedc.errors import ConfigError, ProblemError, ProgramError, SchedcError, ScheduleError, ScheduleFileError
from schedc.problem import Problem, load_problem
from schedc.program import Instr, Program, lower
from schedc.schedfile import CompiledSchedule, load
from schedc.schedule import Op, Schedule
from schedc.simulate import Timeline, simulate
from schedc.version import __version__

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
