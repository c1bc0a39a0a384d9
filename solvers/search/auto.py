"""The default search backend, "auto": the backend installed that searches the problem best.

Measured (benchmarks/RESULTS.md, "Memory for time on small problems" and docs/solver.md): where a
problem lets the search choose recompute or offload, CP-SAT models the choice per (stage,
microbatch) with the order and the copy lane, and finds and proves the optimum of small problems
that the ILP's CBC search does not improve on its warm start (the ILP leaves offload out and its
policy binaries make its neighbourhoods slow); on problems without those choices CBC is the
measured default. So "auto" is CP-SAT for a problem with policies when OR-Tools loads in this
process (``pip install 'schedc[cpsat]'``; not beside highspy, which bundles its own HiGHS), and CBC
otherwise, sequence-chunked problems included (CP-SAT's model takes one cost per stage and kind)."""

from __future__ import annotations

from schedc.problem import Problem
from schedc.simulate import Timeline
from schedc.solvers.search.common import BACKENDS, Found, Settings, register_backend

AUTO = "auto"


def backend_for(problem: Problem) -> str:
    """The backend "auto" runs on ``problem`` (see the module notes)."""
    if not problem.policies or problem.seq_chunks > 1:
        return "cbc"
    try:
        from ortools.sat.python import cp_model  # noqa: F401  (whether it loads here, not only whether it is installed)
    except ImportError:  # not installed, or highspy's HiGHS loaded first ("undefined symbol")
        return "cbc"
    return "cpsat"


@register_backend(AUTO)
def solve_auto(problem: Problem, incumbent: Timeline, settings: Settings) -> Found:
    """The backend ``backend_for(problem)`` names, on the same arguments."""
    return BACKENDS[backend_for(problem)](problem, incumbent, settings)
