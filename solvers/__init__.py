"""Everything that turns a Problem into a Schedule (imported as ``schedc.solvers``).

``REGISTRY`` maps each named schedule to its builder, ``SEARCHES`` each search (the exact one,
"ilp", ``solve.solve``) to its function, ``common.BACKENDS`` each search backend
(``schedc solve --solver``); importing this package fills them. A new schedule, search or backend
is a module here and one import line below.
"""

from schedc.solvers import heuristics  # noqa: F401  (registers the named schedules)
from schedc.solvers import vshape  # noqa: F401
from schedc.solvers import bidirectional  # noqa: F401  (two directions: chimera, bidir-zb, dualpipe, bitpipe)
from schedc.solvers import greedy  # noqa: F401
from schedc.solvers import memtime  # noqa: F401  (recompute and offload baselines)
from schedc.solvers import asynchronous  # noqa: F401  (weight versions: 2bw)
from schedc.solvers import sequence  # noqa: F401  (sequence chunks: seq1f1b, seq1f1b-zb)
from schedc.solvers import solve  # noqa: F401  (registers the exact search, "ilp")
from schedc.solvers import ilp  # noqa: F401  (registers the PuLP backends, "cbc" and "highs")
from schedc.solvers import cpsat  # noqa: F401  (registers the CP-SAT backend, "cpsat")
from schedc.solvers.registry import REGISTRY, SEARCHES, Evaluated, ScheduleSpec, build, evaluate, get

__all__ = ["REGISTRY", "SEARCHES", "Evaluated", "ScheduleSpec", "build", "evaluate", "get"]
