"""Lower bounds (solvers/bounds.py): never above a schedule that fits, exact where the optimum
is known."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc.solvers as solvers
from schedc import Problem, simulate
from schedc.solvers.bounds import Bound, all_bounds, lower_bound


def uniform(p, m, v=1, placement="loop", comm=0.0, limit=None, objective="makespan", costs=(1, 1, 1)):
    memory = dict(F=1, B=-0.5, static=0)
    if limit is not None:
        memory["limit"] = limit
    f, b, w = costs
    return Problem.parse(
        dict(
            ranks=p, microbatches=m, chunks=v, placement=placement, comm=comm,
            costs=dict(F=f, B=b, W=w), memory=memory, objective=objective,
        )
    )


def fitting_timelines(problem):
    """Every registry schedule that applies to ``problem`` and fits its memory limit, simulated."""
    out = {}
    for name, spec in solvers.REGISTRY.items():
        if spec.why_not(problem) is None:
            t = simulate(problem, spec.build(problem))
            if t.fits:
                out[name] = t
    return out


def best(problem, objective):
    return min(t.objective_value(objective) for t in fitting_timelines(problem).values())


# ---- validity: never above a schedule that fits ----


@st.composite
def problems(draw):
    p = draw(st.integers(1, 8))
    v = draw(st.sampled_from([1, 2]))
    n = p * v
    m = draw(st.integers(1, 24))
    cost = st.floats(0.1, 10)
    per_stage = draw(st.booleans())

    def costs_of():
        return draw(st.lists(cost, min_size=n, max_size=n)) if per_stage else draw(cost)

    f = draw(st.lists(st.floats(0, 3), min_size=n, max_size=n))
    b = [-x * draw(st.floats(0, 1)) for x in f]
    problem = Problem.parse(
        dict(
            ranks=p, microbatches=m, chunks=v, placement=draw(st.sampled_from(["loop", "v"])),
            costs=dict(F=costs_of(), B=costs_of(), W=costs_of()),
            comm=draw(st.floats(0, 3)),
            memory=dict(F=f, B=b, static=draw(st.floats(0, 5))),
            objective=draw(st.sampled_from(["makespan", "span"])),
        )
    )
    if draw(st.booleans()):
        # From just feasible to plenty; per rank, each at least what any schedule needs there.
        limits = [problem.min_memory(r) * draw(st.floats(1, 4)) + draw(st.floats(0, 2)) for r in range(p)]
        problem = problem.with_changes(memory={"limit": limits})
    return problem


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_bound_never_above_a_schedule_that_fits(problem):
    for objective in ("makespan", "span"):
        bound = lower_bound(problem, objective)
        assert isinstance(bound, Bound) and bound.reason
        for name, t in fitting_timelines(problem).items():
            assert bound.value <= t.objective_value(objective) + 1e-9, (name, objective, bound)


@pytest.mark.parametrize("p, m", [(2, 2), (3, 7), (4, 8), (5, 3)])
@pytest.mark.parametrize("v, placement", [(1, "loop"), (2, "loop"), (2, "v")])
@pytest.mark.parametrize("limit", [None, "1f1b", "tight"])
def test_bound_below_registry_on_uniform_grid(p, m, v, placement, limit):
    problem = uniform(p, m, v, placement, comm=0.5)
    if limit is not None:
        need = max(problem.min_memory(r) for r in range(p))
        problem = problem.with_changes(memory={"limit": need if limit == "tight" else need + p - 1})
    timelines = fitting_timelines(problem)
    for objective in ("makespan", "span"):
        for b in all_bounds(problem, objective):
            for name, t in timelines.items():
                assert b.value <= t.objective_value(objective) + 1e-9, (name, objective, b)


# ---- tightness where the optimum is known ----


def test_zero_bubble_optimum_unlimited():
    """p=4, m=8, F=B=W=1, comm 0, no limit: rank 3 cannot start before 3 and has 24 of work, so
    makespan >= 27 (ZB-H1/ZB-H2 reach it); by span, rank 0's work 24 (ZB-H2 reaches it)."""
    problem = uniform(4, 8)
    assert lower_bound(problem, "makespan").value == 27 == best(problem, "makespan")
    assert lower_bound(problem, "span").value == 24 == best(problem, "span")
    assert "rank 3" in lower_bound(problem, "makespan").reason


@pytest.mark.parametrize("p, m", [(4, 8), (4, 4), (8, 16), (4, 2), (4, 3)])
def test_one_f_one_b_memory_warm_up_binds(p, m):
    """Limit = p activations (1F1B's peak on rank 0), F=B=W=1: on rank 0 the first B starts >= 2p-1
    after its first forward and only p forwards fit before it, so span >= m*3 + (p-1), and for
    m <= p, where no more forwards exist, m*3 + 2p-1 - m. ZB-H1 reaches both. Without the limit the
    span bound is the work alone (m > p) or the same (m <= p)."""
    limited = uniform(p, m, limit=p)
    warm = (2 * p - 1) - min(p, m)
    expected = 3 * m + warm
    for objective in ("makespan", "span"):
        b = lower_bound(limited, objective)
        assert b.value == expected == best(limited, objective), b
        assert b.reason.startswith("rank 0: work") and "warm-up idle" in b.reason
    unlimited = lower_bound(uniform(p, m), "span").value
    if m > p:
        assert unlimited == 3 * m < expected
    else:
        assert unlimited == expected


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_tighter_memory_raises_the_makespan_bound(limit):
    """p=4, m=4: the makespan bound without a limit is 15 (rank 3 starts at 3 plus work 12; rank 0's
    warm-up gives the same); with room for fewer than p activations it must rise."""
    base = lower_bound(uniform(4, 4), "makespan").value
    assert base == 15
    b = lower_bound(uniform(4, 4, limit=limit), "makespan")
    assert b.value > base
    assert b.value <= best(uniform(4, 4, limit=limit), "makespan") + 1e-9


def test_memory_time_term_on_two_activations():
    """p=4, m=8, room for 2 activations (B frees half): each microbatch holds a whole activation on
    rank 0 for >= F + round trip 6 + B = 8 and half of it for W = 1 more: 8 x 8.5 / 2 = 34."""
    b = lower_bound(uniform(4, 8, limit=2), "makespan")
    assert b.value == pytest.approx(34, abs=1e-6) and "memory-time" in b.reason


def test_critical_path_binds_for_one_microbatch():
    """m=1: F up (4), B back (4), W of stage 0 (1) = 9 with comm 0; comm 0.5 adds 6 transfers."""
    assert lower_bound(uniform(4, 1), "makespan").value == 9
    assert lower_bound(uniform(4, 1, comm=0.5), "makespan").value == 12
    assert best(uniform(4, 1, comm=0.5), "makespan") == 12


def test_one_microbatch_at_a_time_is_proven_optimal():
    """B frees nothing, W frees everything and the limit holds one activation: each rank serves one
    microbatch at a time, and rank 0 holds each for F + round trip 6 + B + W = 9, so 4 x 9 = 36
    (less the simulator's 1e-9 memory tolerance); the memory-aware heuristics reach 36."""
    problem = Problem.parse(
        dict(ranks=4, microbatches=4, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=0, limit=1))
    )
    for objective in ("makespan", "span"):
        b = lower_bound(problem, objective)
        assert b.value == pytest.approx(36, abs=1e-6) and "rank 0: memory-time" in b.reason
        assert best(problem, objective) == 36
    # No W can be deferred past rank 3's last B but one, so its tail term shows (not binding).
    rank3 = all_bounds(problem, "makespan")[3]
    assert rank3.value == 18 and "tail 3" in rank3.reason
