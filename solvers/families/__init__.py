"""The registry's schedule families: each module builds named schedules from a Problem and
registers them (``schedc.solvers.registry.register``). Imported in this order, which is the
registry's order (``schedc list``, ``compare``); none imports the search."""

from schedc.solvers.families import heuristics  # noqa: F401  (gpipe, 1f1b, interleaved, zb-h1, zb-h2, ...)
from schedc.solvers.families import vshape  # noqa: F401  (zb-v, v-half, v-min)
from schedc.solvers.families import bidirectional  # noqa: F401  (two directions: chimera, bidir-zb, dualpipe, bitpipe)
from schedc.solvers.families import greedy  # noqa: F401  (the memory-aware zero-bubble greedy, zb-greedy)
from schedc.solvers.families import memtime  # noqa: F401  (recompute and offload baselines)
from schedc.solvers.families import asynchronous  # noqa: F401  (weight versions: 2bw)
from schedc.solvers.families import sequence  # noqa: F401  (sequence chunks: seq1f1b, seq1f1b-zb)
