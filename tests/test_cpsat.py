"""The CP-SAT backend (solvers/search/cpsat.py) against the exhaustive search of tests/exhaustive.py."""

import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("ortools")

from schedc import Problem, simulate  # noqa: E402
from schedc.errors import SchedcError  # noqa: E402
from schedc.solvers.bounds import lower_bound  # noqa: E402
from schedc.solvers.search.cpsat import _CpModel, solve_cpsat  # noqa: E402
from schedc.solvers.search.common import Progress, Settings  # noqa: E402
from schedc.solvers.deadline import Budget  # noqa: E402
from schedc.solvers.search.solve import best_registry_schedule, solve  # noqa: E402
from tests.exhaustive import exhaustive_optimum
from tests.strategies import add_working, small_problems  # noqa: E402
from tests.test_ilp import SMALL  # noqa: E402


def check_against_truth(problem, result, truth):
    assert result.timeline.fits
    assert result.bound <= truth + 1e-6
    assert result.objective <= result.warm_objective + 1e-9
    assert result.objective >= truth - 1e-6


@pytest.mark.parametrize("data", SMALL, ids=range(len(SMALL)))
def test_cpsat_is_optimal_on_small_problems(data):
    problem = Problem.parse(data)
    truth, _ = exhaustive_optimum(problem, time_budget=60)
    result = solve(problem, solver="cpsat", time_limit=60, threads=1)
    check_against_truth(problem, result, truth)
    assert result.objective == pytest.approx(truth, abs=1e-6)
    assert result.solver == "cpsat"
    if problem.objective == "makespan":
        assert result.status == "optimal" and result.gap == pytest.approx(0, abs=1e-6)


@pytest.mark.parametrize("data", SMALL[6:], ids=range(6, len(SMALL)))  # warm start not optimal
def test_solve_cpsat_improves_a_suboptimal_warm_start(data):
    problem = Problem.parse(data)
    truth, _ = exhaustive_optimum(problem, time_budget=60)
    _, warm = best_registry_schedule(problem)
    assert warm.objective_value() > truth + 1e-6  # the point of these two problems
    events = []
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(60), 0.0, 1, 0.0, events.append))
    found, bound, history, result = out.schedule, out.bound, out.history, out.note
    t = simulate(problem, found)
    assert t.fits
    assert not any(op.kind == "BW" for ops in found.ranks for op in ops)
    assert t.objective_value() == pytest.approx(truth, abs=1e-6)
    assert bound is not None and bound <= truth + 1e-6
    assert "Optimal" in result and "time" not in result
    assert events and all(isinstance(e, Progress) for e in events)
    if problem.objective == "makespan":
        assert events[-1].incumbent == pytest.approx(truth)
    else:  # the model's span (free start times) can only be shorter than the simulator's
        assert events[-1].incumbent <= truth + 1e-6
    assert history[: len(events)] == events
    assert [e.seconds for e in history] == sorted(e.seconds for e in history)


def test_memory_limit_is_respected_where_it_binds():
    problem = Problem.parse(
        dict(ranks=3, microbatches=4, costs=dict(F=[1, 2, 1], B=[2, 2, 1], W=[1, 1, 2]),
             memory=dict(F=[2, 1.5, 1], B=[-1, -0.5, -0.5], static=[1, 0.5, 0], limit=[5, 4, 2]))
    )
    truth, _ = exhaustive_optimum(problem, time_budget=60)
    unlimited, _ = exhaustive_optimum(problem.with_changes(memory={"limit": 100}), time_budget=60)
    assert truth > unlimited  # the limit binds (25 against 21)
    assert lower_bound(problem).value < truth - 1e-6  # so solve() runs CP-SAT rather than stopping at its bound
    result = solve(problem, solver="cpsat", time_limit=30, threads=1)
    assert all(peak <= limit + 1e-9 for peak, limit in zip(result.timeline.peak_memory, problem.memory_limit))
    check_against_truth(problem, result, truth)
    assert result.status == "optimal" and result.objective == pytest.approx(truth)


def test_decimal_costs_are_scaled_exactly():
    problem = Problem.parse(
        dict(ranks=2, microbatches=3, costs=dict(F=[0.1, 0.25], B=[0.3, 0.125], W=[0.2, 0.05]), comm=0.05,
             memory=dict(F=0.3, limit=0.6))
    )
    _, warm = best_registry_schedule(problem)
    model = _CpModel(problem, warm, pytest.importorskip("ortools.sat.python.cp_model"))
    assert model.time.exact and model.time.factor == 40  # the least common denominator of 1/10, 1/4, 1/8, 1/20
    assert model.memory.exact and model.memory.factor == 20  # F 0.3, B and W -0.15
    truth, _ = exhaustive_optimum(problem, time_budget=60)
    result = solve(problem, solver="cpsat", time_limit=30, threads=1)
    check_against_truth(problem, result, truth)
    assert result.objective == pytest.approx(truth, abs=1e-9) and result.status == "optimal"


@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_costs_without_a_small_scale_are_rounded_down_and_the_bound_stays_valid(objective):
    root2, pi = 2**0.5, 3.141592653589793
    problem = Problem.parse(
        dict(ranks=2, microbatches=3, costs=dict(F=[root2, 1], B=[pi / 2, root2], W=[1, pi / 3]), comm=pi / 10,
             objective=objective, memory=dict(F=1, limit=2))
    )
    _, warm = best_registry_schedule(problem)
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(30), 0.0, 1, 0.0, None))
    found, bound = out.schedule, out.bound
    truth, _ = exhaustive_optimum(problem, time_budget=60)
    t = simulate(problem, found)
    assert t.fits and t.objective_value() >= truth - 1e-9
    assert bound is not None and bound <= truth + 1e-9
    assert truth - bound < 0.01 * truth  # rounding at 1/1000 costs little


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems(max_microbatches=lambda p: 3 if p == 3 else 4), st.sampled_from([None, 0.25, 0.5]),
       st.booleans())
def test_random_small_problems_against_exhaustive_search(problem, working, same_room):
    problem = add_working(problem, working, same_room)
    truth, _ = exhaustive_optimum(problem, time_budget=30)
    result = solve(problem, solver="cpsat", time_limit=20, threads=1)
    check_against_truth(problem, result, truth)
    if problem.objective == "makespan":
        assert result.objective == pytest.approx(truth, abs=1e-6) and result.status == "optimal"


def test_time_limit_is_reported():
    problem = Problem.parse(
        dict(ranks=4, microbatches=12, costs=dict(F=[14, 10, 10, 18], B=[13, 10, 10, 22], W=[9, 7, 7, 12]),
             comm=0.4, memory=dict(F=[2.5, 2, 2, 3], B=[-1.5, -1.2, -1.2, -2], limit=[10, 8, 8, 12]))
    )
    _, warm = best_registry_schedule(problem)
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(0.5), 0.0, 1, 0.0, None))
    found, bound, history, result = out.schedule, out.bound, out.history, out.note
    if "Optimal" not in result:  # not expected in half a second, but not an error either
        assert "time" in result
    if found is not None:
        t = simulate(problem, found)
        assert t.fits and t.objective_value() <= warm.objective_value() + 1e-9
    if bound is not None:
        assert bound <= warm.objective_value() + 1e-9


def test_missing_ortools_says_how_to_install(monkeypatch):
    problem = Problem.parse(SMALL[0])
    _, warm = best_registry_schedule(problem)
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    with pytest.raises(SchedcError, match=r"pip install 'schedc\[cpsat\]'"):
        solve_cpsat(problem, warm, Settings(Budget.seconds(1), 0.0, 1, 0.0, None))


# ---- overlapped pairs (costs.FB, issue 26) ----

PAIR_CASES = [  # each: pairs gain, and the registry's best start is not optimal
    dict(ranks=2, microbatches=2, costs=dict(F=[2, 1], B=[2, 3], W=1, FB=[3, 2.5]), comm=0.5),
    dict(ranks=1, microbatches=2, chunks=2, costs=dict(F=2, B=2, W=1, FB=3)),
    dict(ranks=1, microbatches=2, chunks=2, placement="v", costs=dict(F=[1, 2], B=[3, 1], W=[1, 2], FB=2.5),
         memory=dict(F=1, limit=3)),  # FB 2.5 with integer F, B, W: the time scale must count it
    dict(ranks=1, microbatches=2, chunks=2, costs=dict(F=2, B=2, W=1, FB=1.5), memory=dict(F=1, limit=2)),
    dict(ranks=1, microbatches=2, chunks=2, costs=dict(F=2, B=2, W=1, FB=3), objective="span"),
]


@pytest.mark.parametrize("data", PAIR_CASES, ids=range(len(PAIR_CASES)))
def test_cpsat_with_overlapped_pairs_reaches_the_enumerated_optimum_and_keeps_its_bound(data):
    """CP-SAT's model holds the overlapped pairs: from a start without them it finds the best over
    every order and choice of pairs (``pair_optimum``, the simulator's timing), which no schedule
    without pairs reaches, and proves it (its bound kept, never above the enumeration)."""
    from tests.exhaustive import pair_optimum

    problem = Problem.parse(data)
    truth, _ = pair_optimum(problem)
    without = Problem.parse({**data, "costs": {k: v for k, v in data["costs"].items() if k != "FB"}})
    assert pair_optimum(without)[0] > truth + 1e-6  # a model without pairs could not reach it
    _, warm = best_registry_schedule(problem)
    assert warm.objective_value() > truth + 1e-6
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(30), 0.0, 1, 0.0, None))
    t = simulate(problem, out.schedule)
    assert t.fits and any(out.schedule.pairs)
    assert t.objective_value() == pytest.approx(truth, abs=1e-6)
    assert "Optimal" in out.note and "dropped" not in out.note
    assert out.bound is not None and out.bound <= truth + 1e-6
    if problem.objective == "makespan":
        assert out.bound == pytest.approx(truth, abs=1e-6)


def test_cpsat_pair_bound_stays_valid_when_fb_is_rounded_down():
    """costs.FB without a small exact scale: rounded down with the others, the bound still holds."""
    from tests.exhaustive import pair_optimum

    root2 = 2**0.5
    problem = Problem.parse(dict(ranks=1, microbatches=2, chunks=2, costs=dict(F=root2, B=root2, W=1, FB=1.5 * root2)))
    _, warm = best_registry_schedule(problem)
    model = _CpModel(problem, warm, pytest.importorskip("ortools.sat.python.cp_model"))
    assert not model.time.exact and model.pairs
    truth, _ = pair_optimum(problem)
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(30), 0.0, 1, 0.0, None))
    t = simulate(problem, out.schedule)
    assert t.fits and t.objective_value() >= truth - 1e-9
    assert out.bound is not None and out.bound <= truth + 1e-9 and truth - out.bound < 0.01 * truth


def test_cpsat_hints_a_warm_start_whose_pairs_hold_fused_backwards():
    """DualPipe's schedule pairs forwards with fused backwards BW, which the model does not hold:
    its other ops still hint the model, and the search from it keeps the schedule's pairs."""
    from schedc.solvers.registry import build

    problem = Problem.parse({"ranks": 2, "microbatches": 4, "costs": {"F": 2, "B": 2, "W": 1, "FB": 3},
                             "replicas": 2, "memory": {"F": 1, "limit": 3}})
    warm = simulate(problem, build("dualpipe", problem))
    assert any(b.kind == "BW" for b in warm.schedule.paired().values())
    model = _CpModel(problem, warm, pytest.importorskip("ortools.sat.python.cp_model"))
    assert model.pairs
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(10), 0.0, 1, 0.0, None))
    t = simulate(problem, out.schedule)
    assert t.fits and t.makespan <= warm.makespan + 1e-9 and out.bound <= t.makespan + 1e-9


def test_an_offload_problem_gives_cpsat_a_valid_model_and_a_search():
    """O and L of one (stage, microbatch) share one presence literal: hinted once, not twice
    (CP-SAT refuses a model whose hint names a variable twice: MODEL_INVALID, and the solve then
    fell back to the local search's answer without a word of CP-SAT's)."""
    cp_model = pytest.importorskip("ortools.sat.python.cp_model")
    problem = Problem.parse({"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": 1, "W": 1}, "comm": 0.1,
                             "memory": {"F": 1, "B": -0.5, "limit": 2.5}, "recompute": {"time": 1, "keep": 0.1},
                             "offload": {"time": 0.5}})
    warm = simulate(problem, best_registry_schedule(problem)[1].schedule)
    model = _CpModel(problem, warm, cp_model)
    assert any(op.kind == "L" for op in model.ops)
    assert model.cp.Validate() == ""
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(10), 0.0, 1, 0.0, None))
    assert out.schedule is not None and "no solution" not in out.note
    t = simulate(problem, out.schedule)
    assert t.fits and t.objective_value() <= warm.objective_value() + 1e-9


@pytest.mark.parametrize("b, exact", [(-0.633587786, True), (-0.1234567891234, False), (-1 + 0.459459459, True)])
def test_a_limit_at_the_peak_is_feasible_whether_memory_scales_exactly_or_not(b, exact):
    """One microbatch at a time fits exactly (limit = the forward's activation). Memory written to 9
    decimals scales exactly (10**9, so CP-SAT's bound counts), also where a subtraction left an error
    in the last digit (1 - 0.459459459 = 0.5405405409999999); with more decimals the levels are
    rounded up per (stage, microbatch), so a finished microbatch leaves nothing. Rounding each
    op's delta instead left a unit per microbatch, and CP-SAT called the problem infeasible."""
    cp_model = pytest.importorskip("ortools.sat.python.cp_model")
    problem = Problem.parse({"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": 1, "W": 1}, "comm": 0.1,
                             "memory": {"F": 1.0, "B": b, "W": -1.0 - b, "limit": 1.0}})
    warm = simulate(problem, best_registry_schedule(problem)[1].schedule)
    assert warm.fits
    model = _CpModel(problem, warm, cp_model)
    assert model.memory.exact is exact
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(20), 0.0, 1, 0.0, None))
    assert out.note.startswith("Optimal")
    t = simulate(problem, out.schedule)
    assert t.fits and t.objective_value() <= warm.objective_value() + 1e-9
    if exact:
        assert out.bound == pytest.approx(t.objective_value(), abs=1e-6)


def test_the_solves_bound_is_where_cpsats_starts():
    """C's least value is the bound solve hands over (Settings.lower): an incumbent at that bound
    is proven optimal at once, where CP-SAT on its own does not prove it within the same budget."""
    problem = Problem.parse(
        dict(ranks=4, microbatches=12, costs=dict(F=[1.0, 1.2, 0.9, 1.5], B=[1.1, 1.0, 1.3, 1.6], W=[0.7, 0.9, 0.8, 1.0]),
             comm=0.05, objective="span", memory=dict(F=1, B=-0.5, W=-0.5, limit=4))
    )
    _, warm = best_registry_schedule(problem)
    lower = lower_bound(problem).value
    assert warm.objective_value() == pytest.approx(lower)  # the greedy's schedule meets schedc's bound
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(30), 0.0, 1, lower, None))
    assert "Optimal" in out.note and out.bound == pytest.approx(lower)
    alone = solve_cpsat(problem, warm, Settings(Budget.seconds(2), 0.0, 1, 0.0, None))
    assert alone.bound is None or alone.bound <= lower + 1e-9  # (its own bound, valid, lower or equal)


def test_relaxation_bounds_the_problem_and_holds_only_the_ranks_named():
    """``relaxation`` (benchmarks/relaxed.py): holding every rank it solves the problem itself; holding
    fewer it drops their lanes and memory, so its optimum lies below and bounds every schedule."""
    from schedc.solvers.search.cpsat import relaxation

    problem = Problem.parse(
        dict(ranks=3, microbatches=4, costs=dict(F=[1, 2, 1], B=[2, 2, 1], W=[1, 1, 2]),
             memory=dict(F=[2, 1.5, 1], B=[-1, -0.5, -0.5], static=[1, 0.5, 0], limit=[5, 4, 2]))
    )
    truth, _ = exhaustive_optimum(problem, time_budget=60)
    _, warm = best_registry_schedule(problem)
    whole = relaxation(problem, warm, range(3), 30, threads=1)
    assert whole.optimal and whole.bound == pytest.approx(truth) and whole.value == pytest.approx(truth)
    free = relaxation(problem, warm, (), 30, threads=1)
    assert free.optimal and free.bound < truth - 1e-6  # nothing held: the longest chain only
    for r in range(3):
        alone = relaxation(problem, warm, (r,), 30, threads=1)
        assert alone.optimal and free.bound - 1e-6 <= alone.bound <= truth + 1e-6
    lifted = relaxation(problem, warm, (), 30, lower=truth - 1, threads=1)
    assert lifted.optimal and lifted.bound == pytest.approx(truth - 1)  # from the bound given, not below it


@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_a_recompute_chosen_counts_in_its_ranks_work(objective, monkeypatch):
    """C is at least each rank's work (from its first start for makespan): with recompute allowed,
    on a small model, the R or S ops chosen count in it too (they run on the compute lane, between
    the F and the B), the copies (O, L, on the copy lane) do not. Without the recompute the bound a
    search proves missed what the limit forces: on the zero-bubble paper's 1.5B cut to p = 2, m = 4
    on the V at 1F1B's memory (benchmarks/memtime_small.py), CP-SAT then did not prove 185.7 optimal
    in 120 s. Above ``RECOMPUTE_WORK_OPS`` F, B and W (here set below the model's 24) they do not."""
    from schedc.solvers.search import cpsat

    cp_model = pytest.importorskip("ortools.sat.python.cp_model")
    problem = Problem.parse({"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": 1, "W": 1}, "comm": 0.1,
                             "objective": objective, "memory": {"F": 1, "B": -0.5, "limit": 2.5},
                             "recompute": {"time": 1, "keep": 0.1, "selective": {"time": 0.25, "keep": 0.5}},
                             "offload": {"time": 0.5}})
    warm = simulate(problem, best_registry_schedule(problem)[1].schedule)
    model = _CpModel(problem, warm, cp_model)
    proto = model.cp.Proto()
    c = model.C.Index()
    works = [ct.linear for ct in proto.constraints
             if ct.has_linear() and c in ct.linear.vars and len(ct.linear.vars) > 2]
    for r in range(problem.ranks):
        policy = [k for k in model.on_rank[r] if k in model.present]
        compute = {model.present[k].Index(): model.dur[k] for k in policy if model.ops[k].kind in ("R", "S")}
        copies = {model.present[k].Index() for k in policy if model.ops[k].kind in ("O", "L")}
        assert compute and copies
        (work,) = [w for w in works if set(compute) <= set(w.vars)]  # one constraint per rank
        coeff = dict(zip(work.vars, work.coeffs))
        assert all(coeff[v] == -coeff[c] * d for v, d in compute.items())  # (C one side, each recompute the other)
        assert not copies & set(work.vars)
    monkeypatch.setattr(cpsat, "RECOMPUTE_WORK_OPS", 23)
    model = _CpModel(problem, warm, cp_model)
    literals = {lit.Index() for lit in model.present.values()}
    assert not any(literals & set(ct.linear.vars) for ct in model.cp.Proto().constraints
                   if ct.has_linear() and model.C.Index() in ct.linear.vars)


def test_cpsat_is_not_started_where_its_time_cannot_reach_a_first_solution(monkeypatch):
    """More F, B and W ops than ``OPS_PER_SECOND`` times the seconds left: CP-SAT returns at once,
    its note a time limit (the solve's status then says so) and no model built; with the time
    that size needs, it builds its model."""
    import schedc.solvers.search.cpsat as cpsat

    class Built(Exception):
        pass

    def refuse(*args, **kwargs):
        raise Built

    monkeypatch.setattr(cpsat, "_CpModel", refuse)
    problem = Problem.parse(dict(ranks=4, microbatches=64, costs=dict(F=1.0, B=1.0, W=1.0), comm=0.1,
                                 memory=dict(F=1.0, B=-0.5, limit=6.0), recompute=dict(keep=0.1)))
    _, warm = best_registry_schedule(problem)
    ops = 3 * 4 * 64
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(0.9 * ops / cpsat.OPS_PER_SECOND), 0.0, 1, 0.0))
    assert out.schedule is None and out.bound is None and "time" in out.note and "not searched" in out.note
    with pytest.raises(Built):
        solve_cpsat(problem, warm, Settings(Budget.seconds(1.5 * ops / cpsat.OPS_PER_SECOND), 0.0, 1, 0.0))
