"""Empty stages: a stage that holds no layer (F, B and W all 0), as Megatron-LM's layouts allow.
It passes activations and gradients along and holds nothing; every pass takes it as it stands:
the registry's schedules, the bounds, the search, lowering and the checker."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc.solvers as solvers
from schedc import Problem, simulate
from schedc.check import check
from schedc.errors import ProblemError
from schedc.program import lower
from schedc.solvers.bounds import lower_bound


def _problem(costs: dict, n: int, **extra) -> Problem:
    return Problem.parse(dict(ranks=2, microbatches=4, chunks=n // 2, costs=costs, **extra))


def test_a_stage_with_f_b_and_w_zero_is_empty():
    problem = _problem(dict(F=[1, 0, 1, 1], B=[1, 0, 1, 1], W=[1, 0, 1, 1]), 4, memory=dict(F=[1, 0, 1, 1]))
    assert problem.empty_stages == {1}


@pytest.mark.parametrize("costs, message", [
    (dict(F=[1, 0, 1, 1], B=1, W=1), "costs.F: must be > 0, got 0 (index 1)"),  # (B and W are not 0 there)
    (dict(F=[1, 0, 1, 1], B=[1, 0, 1, 1], W=1), "costs.F: must be > 0, got 0 (index 1)"),
    (dict(F=0, B=0, W=0), "costs.F: must be > 0, got 0"),  # (every stage empty)
    (dict(F=[1, 0, 1, 1], B=[1, 0, 1, 1], W=[1, 0, 1, 1], BW=[2, 2, 2, 0]), "costs.BW: must be > 0, got 0 (index 3)"),
])
def test_only_a_whole_stage_may_cost_nothing(costs, message):
    with pytest.raises(ProblemError, match=re.escape(message)):
        _problem(costs, 4)


def test_a_policy_time_is_zero_only_on_an_empty_stage():
    costs = dict(F=[1, 0, 1, 1], B=[1, 0, 1, 1], W=[1, 0, 1, 1])
    assert _problem(costs, 4, recompute=dict(time=[1, 0, 1, 1])).empty_stages == {1}
    with pytest.raises(ProblemError, match=r"recompute.time: must be > 0, got 0 \(index 2\)"):
        _problem(costs, 4, recompute=dict(time=[1, 0, 0, 1]))
    with pytest.raises(ProblemError, match="offload.time: must be > 0, got 0"):
        _problem(costs, 4, offload=dict(time=0))


@st.composite
def problems_with_empty_stages(draw):
    p = draw(st.integers(2, 4))
    v = draw(st.sampled_from([1, 2]))
    placement = draw(st.sampled_from(["loop", "v"])) if v == 2 else "loop"
    n = p * v
    empty = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))
    cost = st.floats(0.1, 5)

    def per_stage():
        return [0.0 if s in empty else draw(cost) for s in range(n)]

    f = [0.0 if s in empty else draw(st.floats(0.1, 2)) for s in range(n)]
    return Problem.parse(dict(
        ranks=p, microbatches=draw(st.integers(1, 6)), chunks=v, placement=placement,
        costs=dict(F=per_stage(), B=per_stage(), W=per_stage()), comm=draw(st.floats(0, 1)),
        memory=dict(F=f, B=[-x / 2 for x in f]), objective=draw(st.sampled_from(["makespan", "span"])),
    ))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_with_empty_stages())
def test_every_schedule_of_a_problem_with_empty_stages_lowers_and_checks(problem):
    """Each registry schedule that applies: simulated no shorter than the lower bound, lowered to a
    program the checker passes (a send of an empty stage's output follows the op that makes it,
    which starts and ends at once)."""
    bound = lower_bound(problem).value
    built = 0
    for name, spec in solvers.REGISTRY.items():
        if spec.why_not(problem) is not None:
            continue
        schedule = spec.build(problem)
        t = simulate(problem, schedule)
        assert problem.time_tol.le(bound, t.objective_value()), name
        check(problem, lower(problem, schedule, t), schedule)
        built += 1
    assert built


def test_solve_schedules_around_an_empty_stage():
    problem = Problem.parse(dict(
        ranks=4, microbatches=8, chunks=2, placement="v", comm=0.05,
        costs=dict(F=[1.0, 1.2, 1.0, 0.9, 0, 1.1, 1.0, 1.3], B=[1.1, 1.3, 1.0, 1.0, 0, 1.2, 1.1, 1.4],
                   W=[0.9, 1.0, 0.8, 0.9, 0, 0.9, 0.9, 1.0]),
        memory=dict(F=[1, 1, 1, 1, 0, 1, 1, 1]),
    ))
    found = solvers.solve(problem, time_limit=5)
    t = simulate(problem, found.schedule)
    assert t.objective_value() == found.objective and problem.time_tol.le(found.bound, found.objective)
    check(problem, lower(problem, found.schedule, t), found.schedule)


def test_stage_blocks_name_the_empty_stages():
    costs = dict(F=[1, 0, 1, 1], B=[1, 0, 1, 1], W=[1, 0, 1, 1])
    assert _problem(costs, 4, stage_blocks=[2, 0, 1, 3]).stage_blocks == [2, 0, 1, 3]
    with pytest.raises(ProblemError, match="stage_blocks gives stage 1 1 blocks, but its costs F, B and W are all 0"):
        _problem(costs, 4, stage_blocks=[2, 1, 1, 3])
    with pytest.raises(ProblemError, match="stage_blocks gives stage 2 0 blocks, but its costs F, B and W are not 0"):
        _problem(costs, 4, stage_blocks=[2, 0, 0, 3])
