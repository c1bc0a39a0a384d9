"""Registry schedules against their published closed forms (exactly), and their invariants
on random problems (hypothesis)."""

import pytest
from hypothesis import HealthCheck, given, settings

import schedc.solvers as solvers
from schedc import Problem, ScheduleError, simulate
from schedc.analytic import FORMULAS, bubble_table
from tests.strategies import pipeline_problems

FORMULA = {f.schedule: f for f in FORMULAS}

# Integer costs keep every sum exact in floating point, so the checks below use ==.
COSTS = [(1, 1, 1), (2, 3, 1), (3, 3, 2), (2, 2, 1), (5, 4, 3), (1, 2, 1)]


def uniform(p, m, v, f, b, w, placement="loop", memory=None):
    return Problem.parse(
        dict(
            ranks=p,
            microbatches=m,
            chunks=v,
            placement=placement,
            costs=dict(F=f, B=b, W=w),
            memory=memory or dict(F=1, B=-0.5),
        )
    )


def bubble_of(t, m, f, b, w, v=1):
    """Idle time of the busiest rank: objective window minus one rank's work."""
    return t.objective_value() - m * v * (f + b + w)


def check_formula(name, p, m, v, f, b, w, objective="makespan"):
    problem = uniform(p, m, v, f, b, w).with_changes(objective=objective)
    t = simulate(problem, solvers.build(name, problem))
    formula = FORMULA[name]
    # The formulas take per-rank costs: v chunks of a stage's cost each.
    assert bubble_of(t, m, f, b, w, v) == formula.bubble(p, m, v, v * f, v * b, v * w)
    # Peak on rank 0 in one rank's microbatch activations (each chunk holds 1/v of it).
    assert t.peak_activation[0] * 1.0 == formula.peak_activation(p, m, v) * v
    return t


@pytest.mark.parametrize("p", [1, 2, 4, 7])
@pytest.mark.parametrize("m_over_p", [1, 2, 3])
@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
def test_one_chunk_formulas(name, p, m_over_p, costs):
    for objective in ("makespan", "span"):
        check_formula(name, p, p * m_over_p, 1, *costs, objective=objective)


@pytest.mark.parametrize("p", [3, 5, 8])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_fused_formulas_hold_with_fewer_microbatches_than_ranks(name, p):
    for m in range(1, p):
        for costs in COSTS[:2]:
            check_formula(name, p, m, 1, *costs)


@pytest.mark.parametrize("p", [2, 4, 5])
@pytest.mark.parametrize("m", [None, "2p", "3p"])
@pytest.mark.parametrize("costs", [c for c in COSTS if c[0] + c[1] >= 2 * c[2]])
def test_zb_h2_formula_by_span(p, m, costs):
    m = 2 * p - 1 if m is None else int(m[0]) * p
    check_formula("zb-h2", p, m, 1, *costs, objective="span")


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("m_over_p", [1, 2, 4])
@pytest.mark.parametrize("costs", COSTS[:4])
@pytest.mark.parametrize("name", ["interleaved-1f1b", "looped-bfs"])
def test_multi_chunk_formulas(name, p, v, m_over_p, costs):
    check_formula(name, p, p * m_over_p, v, *costs)


def test_literal_values():
    """A few figures worked out by hand, independent of analytic.py."""
    p = uniform(4, 8, 1, 1, 1, 1)
    assert simulate(p, solvers.build("1f1b", p)).makespan == 24 + 9
    assert simulate(p, solvers.build("zb-h1", p)).makespan == 24 + 3
    assert simulate(p, solvers.build("zb-h2", p)).span == 24
    q = uniform(4, 8, 2, 1, 1, 1)
    assert simulate(q, solvers.build("interleaved-1f1b", q)).makespan == 48 + 9


def test_zb_h1_keeps_1f1b_peak_memory_and_zb_h2_doubles_it():
    p = uniform(6, 18, 1, 1, 1, 1, memory=dict(F=1, B=-0.5))
    peak = {n: max(simulate(p, solvers.build(n, p)).peak_activation) for n in ("1f1b", "zb-h1", "zb-h2")}
    assert peak == {"1f1b": 6, "zb-h1": 6, "zb-h2": 11}


def test_bubble_table_rates():
    rows = {r["schedule"]: r for r in bubble_table(4, 8, 1, 1, 1, 1)}
    assert rows["1f1b"]["bubble"] == 9 and rows["1f1b"]["bubble_rate"] == 9 / 33
    assert rows["zb-h2"]["bubble"] == 0 and rows["zb-h2"]["peak_activation"] == 7


def test_not_applicable_is_a_clear_error():
    p = uniform(4, 8, 2, 1, 1, 1, placement="v")
    with pytest.raises(ScheduleError, match="does not apply.*one chunk"):
        solvers.build("1f1b", p)
    with pytest.raises(ScheduleError, match="loop placement"):
        solvers.build("interleaved-1f1b", p)
    with pytest.raises(ScheduleError, match="a multiple of ranks"):
        solvers.build("interleaved-1f1b", uniform(4, 6, 2, 1, 1, 1))
    with pytest.raises(ScheduleError, match="unknown schedule 'zb-h3'; did you mean 'zb-h2' or 'zb-h1'.*`schedc schedules` lists"):
        solvers.get("zb-h3")


# ---- properties on random problems ----


def producers_of(op, kinds_present):
    """The dependency rule, written again independently of schedc.schedule.producers."""
    kind, s, i = op
    if kind == "F":
        return [("F", s - 1, i)] if s > 0 else []
    if kind == "W":
        return [("B", s, i)]
    after = [(k, s + 1, i) for k in ("B", "BW") if (k, s + 1, i) in kinds_present]
    return [("F", s, i)] + after


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_problems())
def test_every_schedule_is_complete_deadlock_free_and_respects_dependencies(problem):
    applicable = [s for s in solvers.REGISTRY.values() if s.why_not(problem) is None]
    assert applicable  # looped-bfs applies to every placement
    for spec in applicable:
        schedule = spec.build(problem)
        t = simulate(problem, schedule)  # raises on missing/duplicate ops or deadlock
        times = t.op_times()
        want = problem.n_stages * problem.microbatches * schedule.rounds * (3 if spec.split_backward else 2)
        assert len(times) == want
        for op, (r, start, end) in times.items():
            assert problem.stage_rank[op.stage] == r
            assert end - start == pytest.approx(problem.cost[op.kind][op.stage])
            for dep in producers_of(tuple(op), times):
                dr, _, dend = times[dep]
                lat = problem.comm if dr != r else 0.0
                assert start >= dend + lat - 1e-9, (spec.name, op, dep)
        for r, ops in enumerate(schedule.ranks):  # one op at a time, in the schedule's order
            for k in range(1, len(ops)):
                assert t.start[r][k] >= t.end[r][k - 1] - 1e-9
        assert t.makespan >= max(t.busy) - 1e-9
