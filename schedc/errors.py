"""Errors a user can cause. The CLI prints their message on one line and exits with status 2."""


class SchedcError(Exception):
    """Base of every error that is the input's fault, not a bug in schedc."""


# The errors of pydantic models at the boundary (ProblemError, ScheduleFileError, ConfigError) are
# also ValueErrors, as pydantic's ValidationError that they replace is: code that caught ValueError
# around ``Problem(...)`` still catches them.


class ProblemError(SchedcError, ValueError):
    """A problem file or Problem that is malformed or infeasible."""


class ScheduleError(SchedcError):
    """A schedule that is incomplete, deadlocks, or does not apply to a problem."""


class ProgramError(SchedcError):
    """A per-rank instruction Program that is malformed, mismatched or can deadlock."""


class ScheduleFileError(SchedcError, ValueError):
    """A schedule file that cannot be read: corrupt, truncated, inconsistent or too new."""


class ConfigError(SchedcError, ValueError):
    """An ablation config that is malformed, names something that does not exist, or asks for
    more cells than the ceiling."""
