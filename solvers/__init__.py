"""Everything that turns a Problem into a Schedule (imported as ``schedc.solvers``).

``REGISTRY`` maps each named schedule to its builder, ``SEARCHES`` each search (the exact one,
"ilp") to its function; importing this package fills them. A new schedule or search is a module
here and one import line below.
"""

from schedc.solvers import heuristics  # noqa: F401  (registers the named schedules)
from schedc.solvers import vshape  # noqa: F401
from schedc.solvers import greedy  # noqa: F401
from schedc.solvers import ilp  # noqa: F401  (registers the exact search, "ilp", and its backends)
from schedc.solvers.registry import REGISTRY, SEARCHES, Evaluated, ScheduleSpec, build, evaluate, get

__all__ = ["REGISTRY", "SEARCHES", "Evaluated", "ScheduleSpec", "build", "evaluate", "get"]
