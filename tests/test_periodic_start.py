"""The periodic start of solve's warm start (``schedc.solvers.search.periodic.start``,
``solve.periodic_candidates``): where it applies, an unrolled pattern that fits; elsewhere nothing."""

import pytest

from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.simulate import simulate

pytest.importorskip("ortools")

from schedc.solvers.deadline import Budget  # noqa: E402
from schedc.solvers.search import periodic  # noqa: E402
from schedc.solvers.search.solve import RegistryRun, periodic_candidates  # noqa: E402


def v_problem(ranks: int = 2, microbatches: int = 8, limit: float = 1.0, **changes) -> Problem:
    """The zero-bubble paper's 1.5B on the V with recompute and offload declared (the model of
    benchmarks/memory_time.py), cut to ``ranks`` and ``microbatches``; limit 1.0 is half of 1F1B's
    activation memory on two ranks."""
    data = dict(
        ranks=ranks, microbatches=microbatches, chunks=2, placement="v",
        costs={"F": 9.261, "B": 9.043, "W": 4.6685}, comm=0.601,
        memory={"F": 0.5, "B": -0.316793893, "W": -0.183206107, "limit": limit},
        recompute={"time": 9.261, "keep": 0.003816794, "selective": {"time": 0.63869, "keep": 0.194656489}},
        offload={"time": 199.729122}, objective="span",
    )
    data.update(changes)
    return Problem.parse(data)


def test_the_periodic_start_fits_and_runs_every_op():
    """Two ranks, the V, half of 1F1B's memory: a pattern of period 1.1 x the busiest rank's work
    fits only with recompute; unrolled it runs every F, B and W once and fits the limit."""
    problem = v_problem()
    start = periodic.start(problem, 20.0)
    assert start is not None
    schedule = start.schedule
    t = simulate(problem, schedule)
    assert t.fits and t.objective_value() == start.objective_value()
    ops = [op for ops in schedule.ranks for op in ops]
    for kind in (Kind.F, Kind.B, Kind.W):
        assert sorted((op.stage, op.mb) for op in ops if op.kind == kind) == [
            (s, i) for s in range(problem.n_stages) for i in range(problem.microbatches)]
    assert schedule.policies()  # kept everywhere, it would not fit


@pytest.mark.parametrize("changes", [
    dict(ranks=4),  # eight stages: past START_STAGES
    dict(microbatches=3),  # fewer than two per rank: no steady state to speak of
    dict(recompute=None),  # nothing to choose: the warm start's orders hold what they can
    dict(memory={"F": 0.5, "B": -0.316793893, "W": -0.183206107}),  # no limit
])
def test_no_periodic_start_where_it_does_not_apply(changes):
    assert periodic.start(v_problem(**changes), 20.0) is None


def test_the_warm_start_judges_the_periodic_start(monkeypatch):
    """``periodic_candidates``: the start judged by the simulator, reported as it is judged; none
    with less than PERIODIC_MIN_SECONDS to search. (The pattern takes about 2.5 s alone, more than
    PERIODIC_SECONDS on a loaded machine: the cap is raised here, so the test does not depend on the
    machine's speed.)"""
    from schedc.solvers.search import solve as solve_module

    monkeypatch.setattr(solve_module, "PERIODIC_SECONDS", 20.0)
    said = []
    found = periodic_candidates(v_problem(), RegistryRun([], [], [], 0.0), Budget.seconds(20.0), said.append)
    assert len(found) == 1
    name, t = found[0]
    assert name.startswith("periodic") and t.fits
    assert said == [f"warm start: {name} span {t.objective_value():.6g}"]
    assert periodic_candidates(v_problem(), RegistryRun([], [], [], 0.0), Budget.seconds(0.5), said.append) == []
