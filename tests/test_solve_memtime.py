"""solve() where recompute or offload may buy memory with time: below the memory plain schedules
need it returns a schedule that fits, no slower than any registry baseline that fits, with a
bound no higher than its objective; the exact search matches the exhaustive optimum on tiny
problems; declaring recompute never makes the answer worse."""

from __future__ import annotations

import pytest

from schedc import Problem, simulate
from schedc.errors import ProblemError, SchedcError
from schedc.kinds import Kind
from schedc.problem import load_problem
from schedc.solvers.search.ilp import augmented
from schedc.solvers.search.solve import best_registry_schedule, fitting_registry_schedules, solve
from tests.exhaustive import policy_optimum

TOL = 1e-9


def problem(p, m, fraction, *, v=1, placement="loop", selective=False, offload=False, objective="makespan",
            costs=(1.0, 1.0, 1.0), keep=0.1):
    """p ranks, m microbatches, at ``fraction`` of 1F1B's activation memory (p activations)."""
    F, B, W = costs
    data = dict(ranks=p, microbatches=m, chunks=v, placement=placement, costs=dict(F=F, B=B, W=W),
                memory=dict(F=1.0 / v, B=-0.5 / v, limit=fraction * p), objective=objective,
                recompute=dict(keep=keep / v, **({"selective": dict(time=0.3 * F, keep=0.4 / v)} if selective else {})))
    if offload:
        data["offload"] = dict(time=0.5 * F)
    return Problem.parse(data)


def plain(problem):
    data = problem.model_dump(exclude_none=True)
    data.pop("recompute", None)
    data.pop("offload", None)
    return Problem.parse(data)


@pytest.mark.parametrize("case", [
    dict(p=3, m=6, fraction=0.5),
    dict(p=3, m=6, fraction=0.34, selective=True),
    dict(p=2, m=4, fraction=0.4, v=2, placement="v", objective="span"),  # plain needs 0.5 x 1F1B here
    dict(p=3, m=6, fraction=0.5, offload=True, costs=(1.0, 2.0, 1.0)),
    dict(p=2, m=4, fraction=0.4, v=2, placement="v", offload=True, solver="cpsat"),
])
def test_below_what_plain_schedules_need_solve_fits_and_beats_every_baseline(case):
    case = dict(case)
    solver = case.pop("solver", "cbc")
    prob = problem(**case)
    if case.get("v") == 2:  # a limit only recompute can meet: it is solved, not refused
        with pytest.raises(ProblemError, match="below the 1 that any schedule needs"):
            plain(prob)
    result = solve(prob, time_limit=8, solver=solver)
    t = simulate(prob, result.schedule)
    assert t.fits and t.objective_value() == pytest.approx(result.objective)
    for name, baseline in fitting_registry_schedules(prob):
        assert result.objective <= baseline.objective_value() + TOL, name
    assert result.bound <= result.objective + TOL
    assert result.summary()["policies"] == result.schedule.policy_counts()


@pytest.mark.parametrize("solver", ["cbc", "cpsat"])
@pytest.mark.parametrize("limit, selective", [(1.0, False), (1.2, True), (1.5, False), (1.5, True)])
def test_the_exact_search_finds_the_exhaustive_optimum(limit, selective, solver):
    """On tiny problems (p = 2, m = 2) the ILP and CP-SAT find (and where they prove it, prove)
    exactly the optimum that trying every policy and every order finds."""
    prob = Problem.parse(dict(ranks=2, microbatches=2, costs=dict(F=1, B=1.5, W=0.7), comm=0.1,
                              memory=dict(F=1, B=-0.6, limit=limit),
                              recompute=dict(time=0.8, keep=0.1, **({"selective": dict(time=0.3, keep=0.5)}
                                                                    if selective else {}))))
    best, _ = policy_optimum(prob)
    result = solve(prob, time_limit=30, solver=solver)
    assert result.objective == pytest.approx(best, abs=1e-6)
    assert result.bound <= best + 1e-6
    if result.status == "optimal":
        assert result.bound == pytest.approx(best, abs=1e-6)


OFFLOAD_ONLY = """\
ranks: 2
microbatches: 4
chunks: 2
placement: {placement}
costs: {{F: 1.0, B: 1.0, W: 1.0}}
comm: 0.05
memory: {{F: 2.0, B: -1.0, static: 10, limit: {limit}}}
offload:
  time: 0.6
"""


def test_a_limit_only_offload_meets_is_solved_without_recompute_declared(tmp_path):
    """A problem file with offload: and no recompute:, its limit at the least any schedule needs
    (12: one stage's activation over static 10; keeping everything needs 14): no registry
    schedule fits, and each offloaded one overlaps an offload with the next forward; solve starts
    from the order that holds least (one microbatch at a time, O after each forward, L just
    before each backward), which meets it. Before, solve refused it ("each rank needs at least 12, 12")."""
    path = tmp_path / "offload.yaml"
    path.write_text(OFFLOAD_ONLY.format(placement="loop", limit=12))
    prob = load_problem(path)
    assert prob.recomputes == () and [prob.min_memory(r) for r in range(2)] == [12, 12]
    assert best_registry_schedule(prob) is None
    result = solve(prob, time_limit=5)
    t = simulate(prob, result.schedule)
    assert t.fits and t.peak_memory == (12, 12) and t.objective_value() == pytest.approx(result.objective)
    assert set(result.schedule.policies().values()) == {Kind.O}
    assert result.bound <= result.objective + TOL


def test_a_limit_no_schedule_built_meets_is_refused_saying_what_the_least_holds(tmp_path):
    """On the V, rank 1 holds stages 1 and 2, whose forwards of one microbatch run back to back:
    the offload of the first still runs when the second allocates, so the order that holds least
    peaks at 14 there. The refusal says so, and names the bound (12) as a bound, not as enough."""
    path = tmp_path / "offload.yaml"
    path.write_text(OFFLOAD_ONLY.format(placement="v", limit=12))
    with pytest.raises(SchedcError) as refused:
        solve(load_problem(path), time_limit=5)
    assert str(refused.value) == (
        "no schedule fits the memory limit (12, 12) to start from: the one that holds least, one-at-a-time+offload"
        " (one microbatch at a time, every activation offloaded), peaks at 12, 14; raise the limit to that, or"
        " declare recompute: (no schedule needs less than 12, 12)")


@pytest.mark.parametrize("case", [
    dict(p=2, m=3, fraction=1.5),
    dict(p=2, m=3, fraction=1.0, selective=True, objective="span"),
    dict(p=3, m=3, fraction=1.0, costs=(1.0, 2.0, 0.5)),
])
def test_declaring_recompute_never_makes_the_answer_worse(case):
    """Where plain schedules fit, the problem with recompute declared gets an answer no worse
    than without (both searches prove optimality on problems this small)."""
    with_rc = problem(**case)
    without = plain(with_rc)
    a, b = solve(with_rc, time_limit=20), solve(without, time_limit=20)
    assert a.objective <= b.objective + TOL
    assert a.objective <= best_registry_schedule(without)[1].objective_value() + TOL


def test_augmented_puts_every_recompute_op_not_chosen_right_after_its_f():
    prob = problem(2, 2, 1.0, selective=True)
    base = best_registry_schedule(prob)[1].schedule
    aug = augmented(prob, base)
    for ops in aug.ranks:
        for x, op in enumerate(ops):
            if op.kind.value in "RS" and op not in set(base.ops()):
                prev = ops[x - 1] if ops[x - 1].kind.value == "F" else ops[x - 2]
                assert (prev.kind.value, prev.stage, prev.mb) == ("F", op.stage, op.mb)


@pytest.mark.parametrize("solver", ["cbc", "cpsat"])
@pytest.mark.parametrize("limit, selective, objective", [(1.0, True, "makespan"), (1.2, False, "span"),
                                                         (1.5, True, "makespan")])
def test_the_backend_alone_reaches_the_exhaustive_optimum_from_the_worst_baseline(limit, selective, objective, solver):
    """The exact model itself (no local search first), started from the slowest baseline that
    fits: the order and policies it finds, re-timed by the simulator, are the exhaustive optimum,
    and its bound is that optimum."""
    import schedc.solvers.search.cpsat  # noqa: F401  (registers the cpsat backend)
    from schedc.solvers.search.common import BACKENDS, Settings
    from schedc.solvers.deadline import Budget

    prob = Problem.parse(dict(ranks=2, microbatches=2, costs=dict(F=1, B=1.5, W=0.7), comm=0.1, objective=objective,
                              memory=dict(F=1, B=-0.6, limit=limit),
                              recompute=dict(time=0.8, keep=0.1, **({"selective": dict(time=0.3, keep=0.5)}
                                                                    if selective else {}))))
    best, _ = policy_optimum(prob)
    worst = max((t for _, t in fitting_registry_schedules(prob)), key=lambda t: t.objective_value())
    assert worst.objective_value() > best + 1e-6  # there is something to find
    found = BACKENDS[solver](prob, worst, Settings(Budget.seconds(30), 0.0, None, 0.0))
    assert found.schedule is not None
    t = simulate(prob, found.schedule)
    assert t.fits and t.objective_value() == pytest.approx(best, abs=1e-6)
    assert found.bound is not None and found.bound <= best + 1e-6


@pytest.mark.parametrize("neighbourhood", [False, True])
def test_the_model_holds_the_incumbent_and_a_neighbourhood_keeps_its_policies(neighbourhood):
    """The ILP accepts its warm start (a schedule that recomputes some microbatches) as a solution:
    every row holds at the incumbent's values. In a neighbourhood (the model above FULL_MODEL_OPS)
    every recompute op outside the window keeps the incumbent's choice (its binary fixed), inside
    it the choice stays open."""
    import pulp

    from schedc.solvers.search.ilp import _Model

    prob = problem(3, 6, 0.5, selective=True)
    warm = min((t for _, t in fitting_registry_schedules(prob) if t.schedule.policies()),
               key=lambda t: t.objective_value())
    held = set(warm.schedule.ops())
    window = [range(4, 10) for _ in range(prob.ranks)] if neighbourhood else None
    model = _Model(prob, warm.objective_value(), 0.0, keep=warm.schedule if neighbourhood else None, window=window)
    model.warm(warm)
    fixed = 0
    for k, z in model.chosen.items():
        if k in model.free:
            assert z.lowBound in (0, None) and z.upBound in (1, None)
        else:
            fixed += 1
            assert z.lowBound == z.upBound == (1 if model.ops[k] in held else 0)
    if neighbourhood:
        assert fixed > 0 and any(model.ops[k] in held for k in model.chosen if k not in model.free)
    # the incumbent's values (each rank's first start: its earliest op's) satisfy every row of the model
    for r, ks in enumerate(model.on_rank):
        first = next(v for v in model.lp.variables() if v.name == f"first{r}")
        first.setInitialValue(min(model.start[k].value() for k in ks))
    for row in model.lp.constraints():
        value = row.value()
        if row.sense == pulp.LpConstraintLE:
            assert value <= 1e-6, row
        elif row.sense == pulp.LpConstraintGE:
            assert value >= -1e-6, row
        else:
            assert abs(value) <= 1e-6, row


def test_auto_searches_problems_with_policies_with_cpsat_and_the_rest_with_cbc(monkeypatch):
    """The default backend, "auto": CP-SAT where the problem lets the search choose recompute or
    offload and OR-Tools loads; CBC for a plain problem, and wherever OR-Tools does not load."""
    import builtins

    from schedc.solvers.search.auto import backend_for

    prob = problem(3, 6, 0.5, selective=True)
    assert backend_for(prob) == "cpsat"
    assert backend_for(plain(problem(3, 6, 1.0))) == "cbc"
    result = solve(prob, time_limit=8)  # the default
    assert result.summary()["solver"] == "cpsat"
    assert result.objective <= min(t.objective_value() for _, t in fitting_registry_schedules(prob)) + TOL

    real_import = builtins.__import__

    def without_ortools(name, *args, **kwargs):
        if name.startswith("ortools"):
            raise ImportError("No module named 'ortools'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_ortools)
    assert backend_for(prob) == "cbc"
