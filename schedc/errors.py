"""Errors a user can cause. The CLI prints their message on one line and exits with status 2."""


class SchedcError(Exception):
    """Base of every error that is the input's fault, not a bug in schedc."""


class ProblemError(SchedcError):
    """A problem file or Problem that is malformed or infeasible."""


class ScheduleError(SchedcError):
    """A schedule that is incomplete, deadlocks, or does not apply to a problem."""


class ProgramError(SchedcError):
    """A per-rank instruction Program that is malformed, mismatched or can deadlock."""


class ScheduleFileError(SchedcError):
    """A schedule file that cannot be read: corrupt, truncated, inconsistent or too new."""
