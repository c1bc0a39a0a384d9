"""The exact search: ``solve.solve`` (the driver: warm start from the registry, local search,
then a backend within the wall-clock budget), registered as the search "ilp", and its backends
(``common.BACKENDS``): CBC and HiGHS on the PuLP model (``ilp``, ``cbc``), CP-SAT (``cpsat``), and the default,
"auto", which picks one of them per problem (``auto``)."""

from schedc.solvers.search import solve  # noqa: F401  (registers the exact search, "ilp")
from schedc.solvers.search import ilp  # noqa: F401  (registers the PuLP backends, "cbc" and "highs")
from schedc.solvers.search import cpsat  # noqa: F401  (registers the CP-SAT backend, "cpsat")
from schedc.solvers.search import auto  # noqa: F401  (registers the default, "auto")
