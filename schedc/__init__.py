"""schedc: a compiler for pipeline-parallel training schedules.

Problem -> Schedule (a heuristic from the registry, or solved) -> Timeline (simulate)
-> Program (lower) -> schedule file (``CompiledSchedule.save``, ``schedc.load``) -> runtime.
Nothing heavy is imported here: torch, PuLP and matplotlib load only where they are used.
"""

from schedc.check import check
from schedc.compiler import CompiledSchedule, compile
from schedc.errors import ProblemError, ProgramError, SchedcError, ScheduleError, ScheduleFileError
from schedc.problem import Problem, load_problem
from schedc.program import Instr, Program, lower
from schedc.schedfile import load
from schedc.schedule import Op, Schedule
from schedc.simulate import Timeline, simulate

__version__ = "0.1.0"

__all__ = [
    "CompiledSchedule",
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
