"""The local search of schedc solve: never worse, always what the simulator says, any size."""

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc
import schedc.solvers as solvers
from schedc import load_problem, simulate
from schedc.solvers.deadline import Budget
from schedc.solvers.search.localsearch import (
    _apply, _candidates, _Evaluator, _kick, _policy_rank, _repaired, improve, renumbered, score,
)
from tests.strategies import pipeline_problems

PAPER = Path(__file__).parent.parent / "examples" / "problems" / "zb-paper"
QUARTER = Path(__file__).parent / "data" / "memtime_p8_m12_quarter.json"  # solve's, before the exchanges


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_problems(max_microbatches=6), st.sampled_from(["makespan", "span"]), st.sampled_from([1.0, 1.5, 3.0]))
def test_improve_is_never_worse_fits_and_is_the_simulated_timeline(problem, objective, room):
    start_sched = solvers.build("zb-greedy", problem)
    peak = max(simulate(problem, start_sched).peak_activation)
    problem = problem.with_changes(
        objective=objective, memory={"limit": [s + peak * room for s in problem.static_memory]}
    )
    start = simulate(problem, solvers.build("zb-greedy", problem))
    assert start.fits
    best = improve(problem, start, Budget.seconds(2.0))
    again = simulate(problem, best.schedule)
    assert best.fits and again.fits
    assert again.objective_value() == best.objective_value()
    # never worse, up to float noise: a search step may keep the objective (up to noise) for a
    # shorter sum of per-rank ends (found: 152.00818256322594 from 152.00818256322592)
    assert problem.time_tol.le(best.objective_value(), start.objective_value())
    entry = [op.mb for ops in best.schedule.ranks for op in ops if op.kind == "F" and op.stage == 0]
    assert entry == sorted(entry)  # numbered as the exact models expect


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_problems(max_microbatches=6), st.sampled_from([None, 0.5]))
def test_the_quick_evaluator_agrees_with_the_simulator(problem, working):
    if working is not None:
        problem = problem.with_changes(memory={"working": working})
    schedule = solvers.build("zb-greedy", problem)
    t = simulate(problem, schedule)
    ev = _Evaluator(problem, schedule)
    assert ev.score(ev.orders(schedule)) == score(t)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_problems(max_microbatches=8), st.booleans(), st.sampled_from([1.0, 1.5]), st.integers(0, 2**16))
def test_an_order_replayed_from_its_neighbour_has_the_times_of_a_replay_from_nothing(problem, recompute, room, seed):
    """``_Evaluator.replayed(trial, base)`` resumes from ``base``'s times: for every move the
    climb tries (order, policy, exchange, repaired) and for kicks that change several ranks, the
    same verdict and times as replaying ``trial`` from nothing."""
    import random

    if recompute:
        a = min(problem.mem["F"])
        problem = problem.with_changes(recompute=dict(time=1.0, keep=0.0, selective=dict(time=0.3, keep=a / 2)))
    peak = max(simulate(problem, solvers.build("zb-greedy", problem)).peak_activation)
    problem = problem.with_changes(memory={"limit": [s + peak * room for s in problem.static_memory]})
    schedule = solvers.build("zb-greedy", problem)
    ev = _Evaluator(problem, schedule)
    orders = ev.orders(schedule)
    base = ev.replayed(orders)
    assert base is not None
    rng = random.Random(seed)
    moves = list(_candidates(ev, orders, *ev.times(base), 3, True))
    trials = []
    for move in rng.sample(moves, min(len(moves), 40)):
        trials.append(_apply(ev, orders, move))
        if (r := _policy_rank(move)) is not None and (fixed := _repaired(ev, trials[-1], r)) is not None:
            trials.append(fixed)
    trials += [_kick(ev, orders, rng) for _ in range(5)]
    for trial in trials:
        fresh, resumed = ev.replayed(trial), ev.replayed(trial, base)
        assert (fresh is None) == (resumed is None)
        if fresh is not None:
            assert (resumed.score, resumed.start, resumed.end) == (fresh.score, fresh.start, fresh.end)
            assert ev.times(resumed) == ev.times(fresh)


def test_renumbering_keeps_times_and_memory():
    problem = load_problem(PAPER / "zb-1.5B-m24-2p.yaml")
    t = simulate(problem, solvers.build("zb-2p", problem))
    swapped = [[op._replace(mb=(op.mb + 5) % problem.microbatches) for op in ops] for ops in t.schedule.ranks]
    from schedc.schedule import Schedule

    back = simulate(problem, renumbered(Schedule.from_lists("x", swapped)))
    assert back.start == t.start and back.peak_activation == t.peak_activation


def test_a_window_model_accepts_an_incumbent_out_of_microbatch_order():
    """The neighbourhood search fixes microbatch order only where the incumbent keeps it: an
    incumbent from the local search may run two W of a stage the other way round."""
    from schedc import Problem
    from schedc.schedule import Schedule
    from schedc.solvers.search.common import Settings
    from schedc.solvers.search.ilp import solve_pulp

    problem = Problem.parse(dict(ranks=2, microbatches=4, costs=dict(F=1, B=1, W=1), objective="span"))
    base = solvers.build("zb-h1", problem)
    ranks = [list(ops) for ops in base.ranks]
    w0 = ranks[0].pop(ranks[0].index(("W", 0, 0)))
    ranks[0].insert(ranks[0].index(("W", 0, 1)) + 1, w0)  # W0 after W1
    keep = simulate(problem, Schedule.from_lists("keep", ranks))
    window = [range(0, len(ops) // 2) for ops in ranks]
    found = solve_pulp(problem, keep, Settings(Budget.seconds(30), 0.0, None, 0.0), "cbc",
                       keep=keep.schedule, window=window).schedule
    assert found is not None
    assert simulate(problem, found).objective_value() <= keep.objective_value() + 1e-9


def test_kicks_and_other_starts_reach_an_optimum_the_climb_alone_misses():
    """A small problem (benchmarks/solve_small.py seed 41) where a plain hill climb from the best
    registry schedule (zb-greedy, 98) stays at 98: with the other registry starts and the kicks,
    the search ends (200 kicks without a better order, long before the deadline, so the result
    does not depend on the machine's speed) at 94, the exhaustive optimum."""
    from schedc import Problem
    from schedc.solvers.search.solve import fitting_registry_schedules
    from tests.exhaustive import exhaustive_optimum

    problem = Problem.parse(dict(
        ranks=2, microbatches=5, chunks=2, placement="loop", comm=3.0, objective="makespan",
        costs=dict(F=[4, 1, 2, 1], B=[4, 2, 2, 3], W=[2, 3, 1, 1]),
        memory=dict(F=[2, 3, 3, 2], B=[-1, -1.5, -1.5, -1], limit=[10, 10]),
    ))
    fitting = [t for _, t in fitting_registry_schedules(problem)]
    start = min(fitting, key=lambda t: t.objective_value())
    assert start.objective_value() == 98
    best = improve(problem, start, Budget.seconds(600), others=[t for t in fitting if t is not start])
    optimum, _ = exhaustive_optimum(problem, time_budget=120)
    assert optimum == 94 == best.objective_value()
    assert simulate(problem, best.schedule).objective_value() == 94


# ---- overlapped pairs (costs.FB, issue 26) ----


def test_the_evaluator_times_overlapped_pairs_as_the_simulator_does():
    """DualPipe's pairs, as the evaluator writes them (a paired forward's id + n), score what the
    simulator says; its schedule keeps them."""
    from schedc import Problem
    from schedc.solvers.registry import build

    for fb in (3.0, 5.0):  # a pair faster than F then B, and one slower (kept, not made)
        p = Problem.parse({"ranks": 4, "microbatches": 6, "costs": {"F": 2, "B": 2, "W": 1, "FB": fb}, "replicas": 2})
        t = simulate(p, build("dualpipe", p))
        ev = _Evaluator(p, t.schedule)
        orders = ev.orders(t.schedule)
        assert ev.run(orders)[0] == score(t)
        assert ev.schedule("x", orders).pairs == t.schedule.pairs
        assert ev.pair_moves is (fb == 3.0)


def test_the_search_makes_overlapped_pairs_where_they_are_faster():
    """From the registry's best (none of which pairs ops on one pipeline), the search pairs a
    forward with a backward where that is faster, and the simulator agrees; without costs.FB the
    same search makes none."""
    from schedc import Problem
    from schedc.solvers.search.solve import best_registry_schedule

    data = {"ranks": 2, "microbatches": 4, "costs": {"F": 2, "B": 2, "W": 1, "FB": 3}}
    p = Problem.parse(data)
    _, warm = best_registry_schedule(p)
    assert not any(warm.schedule.pairs)
    t = improve(p, warm, Budget.seconds(120))  # (seeded: stops after PATIENCE kicks in a row, not on time)
    assert any(t.schedule.pairs) and t.makespan < warm.makespan
    assert simulate(p, t.schedule).makespan == t.makespan
    plain = Problem.parse({**data, "costs": {"F": 2, "B": 2, "W": 1}})
    _, warm = best_registry_schedule(plain)
    assert not any(improve(plain, warm, Budget.seconds(120)).schedule.pairs)


def test_a_policy_move_over_the_room_pulls_a_weight_gradient_earlier_or_pushes_a_forward_later(monkeypatch):
    """One rank, a room of 1.2: with microbatch 1 recomputed (keep 0.1) the order fits; keeping it
    whole instead passes the room at F1 (W0, which frees 0.4, runs after it), so the repair moves
    W0 in front of F1, where B0 has already run. Where the W that would free the room comes after
    its own B, which comes after the point, nothing can be pulled: the forward held there (F1)
    moves after the first backward after it (B0), and then W0 is pulled in front of it; with
    fewer steps allowed than that takes, None."""
    from schedc import Problem, Schedule
    from schedc.solvers.search import localsearch
    from schedc.solvers.search.localsearch import _apply, _repaired

    problem = Problem.parse(dict(ranks=1, microbatches=2, costs=dict(F=1, B=1, W=1),
                                 memory=dict(F=1, B=-0.6, limit=1.2), recompute=dict(time=1, keep=0.1)))

    def dropped(order):
        schedule = Schedule.from_lists("s", [[tuple(op) for op in order]])
        ev = _Evaluator(problem, schedule)
        orders = ev.orders(schedule)
        assert ev.run(orders) is not None
        out = _apply(ev, orders, (0, order.index(("R", 0, 1)), None, None))
        assert ev.run(out) is None
        return ev, out

    ev, out = dropped([("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("W", 0, 0), ("R", 0, 1), ("B", 0, 1), ("W", 0, 1)])
    fixed = _repaired(ev, out, 0)
    assert [str(ev.ops[k]) for k in fixed[0]] == ["F0@s0", "B0@s0", "W0@s0", "F1@s0", "B1@s0", "W1@s0"]
    assert ev.run(fixed) is not None
    ev, out = dropped([("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("W", 0, 0), ("R", 0, 1), ("B", 0, 1), ("W", 0, 1)])
    fixed = _repaired(ev, out, 0)
    assert [str(ev.ops[k]) for k in fixed[0]] == ["F0@s0", "B0@s0", "W0@s0", "F1@s0", "B1@s0", "W1@s0"]
    assert ev.run(fixed) is not None
    monkeypatch.setattr(localsearch, "REPAIR_STEPS", 0)  # one step: F1 after B0, still over the room
    assert _repaired(ev, out, 0) is None


def test_an_exchange_of_policies_moves_the_cheap_recompute_to_the_end(monkeypatch):
    """The zero-bubble paper's 1.5B at a quarter of 1F1B's memory, cut to p = 8, m = 12
    (tests/data/memtime_p8_m12_quarter.json: solve's schedule before the exchange move, 839.64).
    Rank 0 recomputes microbatches 2-10 fully and 0, 1 and 11 selectively, and no move of one op or
    one policy shortens it. Exchanging a late microbatch's full recompute (on the chain of the last
    backwards through every rank) for an early one's selective one (rank 0 then holds about as
    much) does: 822.40."""
    import schedc.solvers.search.localsearch as localsearch

    loaded = schedc.load(QUARTER)
    start = simulate(loaded.problem, loaded.schedule)
    assert abs(start.span - 839.6415) < 1e-3
    better = improve(loaded.problem, start, Budget.seconds(60), patience=0)
    assert better.fits and better.span < start.span - 15
    monkeypatch.setattr(localsearch, "EXCHANGE_TAIL", 0)  # without it, the start is a local optimum
    assert improve(loaded.problem, start, Budget.seconds(60), patience=0).span == start.span


def test_the_climb_tries_the_exchanges_after_every_other_move():
    """Tried first, an exchange that gains a little led the climb away from where the other moves
    go (28.3B cut to p = 3, m = 6 at half of 1F1B's memory: no longer proven optimal in 20 s)."""
    from schedc.solvers.search.localsearch import _candidates

    loaded = schedc.load(QUARTER)
    ev = _Evaluator(loaded.problem, loaded.schedule)
    orders = ev.orders(loaded.schedule)
    _, start, end = ev.run(orders)
    kinds = [move[0] == "exchange" for move in _candidates(ev, orders, start, end, 3, True)]
    first = kinds.index(True)  # (there are some: rank 0 recomputes fully and selectively on its stage)
    assert first > 0 and all(kinds[first:])


def test_a_fused_schedule_that_recomputes_is_searched_with_each_forward_holding_what_its_policy_keeps():
    """A schedule of fused backwards (BW) on a problem that declares recompute: Megatron's 1F1B with
    full or selective recompute (RG, SG: the backward waits for them), the prefetched form (R), and
    plain 1F1B. The search used to fail on the first three (no B for a recompute to precede) and
    count plain 1F1B's forwards as keeping only what a recompute keeps, so the order it returned
    passed the limit. Each now gives a schedule that fits and is no longer than its start."""
    problem = schedc.Problem.parse(dict(
        ranks=3, microbatches=6, costs=dict(F=[1, 2, 1], B=[2, 2, 1], W=[1, 1, 2]), memory=dict(F=1, B=-0.5, limit=3),
        recompute=dict(keep=0.1, selective=dict(time=0.2, keep=0.4))))
    for name in ("1f1b", "1f1b-recompute", "1f1b-selective", "1f1b-recompute-prefetch"):
        start = simulate(problem, solvers.REGISTRY[name].build(problem))
        assert start.fits and any(op.kind.value == "BW" for op in start.schedule.ranks[0])
        found = improve(problem, start, Budget.seconds(0.5))
        assert found.fits and found.objective_value() <= start.objective_value() + 1e-9, name
