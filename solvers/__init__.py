"""Everything that turns a Problem into a Schedule (imported as ``schedc.solvers``).

``REGISTRY`` maps each named schedule to its builder; importing this package fills it.
"""

from schedc.solvers import heuristics  # noqa: F401  (registers the named schedules)
from schedc.solvers import vshape  # noqa: F401
from schedc.solvers import greedy  # noqa: F401
from schedc.solvers.registry import REGISTRY, Evaluated, ScheduleSpec, build, evaluate, get

__all__ = ["REGISTRY", "ScheduleSpec", "build", "get"]
