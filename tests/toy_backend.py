"""A search backend that is not an ILP: it tries every swap of two neighbouring ops on one rank
and keeps the first that the simulator finds better. It exists to show the solver seam (one new
file, one registry line: see tests/test_plugins.py); it proves no bound."""

from __future__ import annotations

from schedc.schedule import Schedule
from schedc.simulate import simulate
from schedc.solvers.search.common import Found, Settings

CALLS: list[str] = []  # the problems it was asked to search, for the test


def search(problem, incumbent, settings: Settings) -> Found:
    CALLS.append(problem.name)
    best = incumbent
    for r, ops in enumerate(incumbent.schedule.ranks):
        for k in range(len(ops) - 1):
            if settings.budget.expired():
                return Found(None if best is incumbent else best.schedule, note="time limit")
            swapped = [list(o) for o in best.schedule.ranks]
            swapped[r][k], swapped[r][k + 1] = swapped[r][k + 1], swapped[r][k]
            try:
                t = simulate(problem, Schedule.from_lists("swap", swapped))
            except Exception:  # noqa: BLE001 - a swap that deadlocks is simply not taken
                continue
            if t.fits and problem.time_tol.lt(t.objective_value(), best.objective_value()):
                best = t
    return Found(None if best is incumbent else best.schedule)
