"""schedc: a compiler for pipeline-parallel training schedules.

Problem -> Schedule (a heuristic from the registry, or solved) -> Timeline (simulate).
Nothing heavy is imported here: torch, PuLP and matplotlib load only where they are used.
"""

from schedc.errors import ProblemError, SchedcError, ScheduleError
from schedc.problem import Problem, load_problem
from schedc.schedule import Op, Schedule
from schedc.simulate import Timeline, simulate

__version__ = "0.1.0"

__all__ = [
    "Op",
    "Problem",
    "ProblemError",
    "SchedcError",
    "Schedule",
    "ScheduleError",
    "Timeline",
    "load_problem",
    "simulate",
]
