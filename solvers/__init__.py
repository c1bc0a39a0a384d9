"""Everything that turns a Problem into a Schedule (imported as ``schedc.solvers``), in two parts
and what they share:

- ``families/``: the named schedules, one module per family, each registering its builders in
  ``REGISTRY``: GPipe, 1F1B and the handcrafted zero-bubble ones (``heuristics``), the V shapes
  (``vshape``), two directions (``bidirectional``), the memory-aware greedy (``greedy``), recompute
  and offload baselines (``memtime``), asynchronous weight versions (``asynchronous``), sequence
  chunks (``sequence``);
- ``search/``: the exact search, ``solve`` (registered in ``SEARCHES`` as "ilp"): the warm start
  from the registry, the local search (``localsearch``), mixed recompute policies (``mixed``,
  ``lazyw``), and the backends in ``search.common.BACKENDS`` (``schedc solve --solver``): CBC and
  HiGHS through PuLP (``ilp``, ``cbc``), CP-SAT (``cpsat``);
- here, what both use: ``registry`` (the one table of named schedules and searches), ``bounds``
  (the proven lower bounds: the search's gap, and the greedy's early stop) and ``deadline`` (the
  wall-clock budget and the worker processes that keep it).

A family imports no search module (pyproject's import contracts). Importing this package fills
the registries; a new family, search or backend is a module in its folder and one import line in
that folder's ``__init__``.
"""

from schedc.solvers import families, search  # noqa: F401  (register the named schedules, the search, its backends)
from schedc.solvers.registry import REGISTRY, SEARCHES, Evaluated, ScheduleSpec, build, evaluate, get
from schedc.solvers.search.solve import SolveResult, solve

__all__ = ["REGISTRY", "SEARCHES", "Evaluated", "ScheduleSpec", "SolveResult", "build", "evaluate", "get", "solve"]
