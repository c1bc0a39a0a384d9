import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedc.solvers as solvers
from schedc import Op, Problem, Schedule, ScheduleError, simulate
from tests.strategies import pipeline_problems


def two_ranks(**changes):
    data = dict(ranks=2, microbatches=2, costs=dict(F=1, B=2, W=3), comm=0.5, memory=dict(F=4, B=-1))
    data.update(changes)
    return Problem.parse(data)


def sched(*ranks):
    return Schedule.from_lists("hand", [[Op(*x) for x in r] for r in ranks])


GOOD = (
    [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("W", 0, 0), ("B", 0, 1), ("W", 0, 1)],
    [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1), ("W", 1, 0), ("W", 1, 1)],
)


def test_times_by_hand():
    t = simulate(two_ranks(), sched(*GOOD))
    times = {op: (s, e) for op, (_, s, e) in t.op_times().items()}
    # rank 0: F0 0-1, F1 1-2; rank 1: F0 1.5-2.5, B0 2.5-4.5, F1 4.5-5.5, B1 5.5-7.5
    assert times[Op("F", 1, 0)] == (1.5, 2.5)
    assert times[Op("B", 1, 0)] == (2.5, 4.5)
    assert times[Op("F", 1, 1)] == (4.5, 5.5)
    # rank 0: B0 waits for B0@s1 + comm = 5.0, W0 7-10, B1 needs 7.5 + 0.5 = 8 but rank busy until 10
    assert times[Op("B", 0, 0)] == (5.0, 7.0)
    assert times[Op("W", 0, 0)] == (7.0, 10.0)
    assert times[Op("B", 0, 1)] == (10.0, 12.0)
    assert t.makespan == 15.0
    assert t.rank_span == (15.0, 13.5 - 1.5)
    assert t.busy == (12.0, 12.0)
    assert t.bubble_rate("makespan") == pytest.approx(1 - 24 / 30)
    assert t.bubble_rate("span") == pytest.approx(1 - 24 / 30)  # span is the max over ranks
    assert t.idle("span") == (3.0, 0.0)


def test_memory_levels_and_peak():
    t = simulate(two_ranks(memory=dict(F=4, B=-1, static=[1, 2])), sched(*GOOD))
    assert t.memory[0] == (4, 8, 7, 4, 3, 0)
    assert t.peak_activation == (8, 4 + 4 - 1)
    assert t.peak_memory == (9, 9)
    assert t.fits


def test_memory_violation_names_rank_op_and_amount():
    problem = two_ranks(memory=dict(F=4, B=-1, static=1, limit=[8, 20]))
    t = simulate(problem, sched(*GOOD))
    assert not t.fits
    (v,) = t.violations
    assert (v.rank, v.op, v.peak, v.limit, v.over) == (0, Op("F", 0, 1), 9.0, 8.0, 1.0)
    assert str(v) == "rank 0 exceeds its limit 8 from F1@s0 on, peaking at 9 (1 over)"


def test_working_memory_adds_to_the_peak_and_to_what_must_fit():
    # Rank 0 holds stage 0 (working 0.5), rank 1 stage 1 (working 2): each rank's peak is its
    # highest level plus its working memory, whichever op runs at the highest level.
    memory = dict(F=4, B=-1, static=[1, 2], working=[0.5, 2])
    t = simulate(two_ranks(memory=memory), sched(*GOOD))
    assert t.memory[0] == (4, 8, 7, 4, 3, 0)  # levels: the deltas alone
    assert t.peak_activation == (8 + 0.5, 7 + 2)
    assert t.peak_memory == (1 + 8.5, 2 + 9)
    assert t.fits
    assert simulate(two_ranks(memory={**memory, "limit": [9.5, 11]}), sched(*GOOD)).fits  # exactly at the limit
    t = simulate(two_ranks(memory={**memory, "limit": [9.4, 20]}), sched(*GOOD))
    (v,) = t.violations  # 9 without working memory: it would fit
    assert (v.rank, v.op, v.peak, v.limit) == (0, Op("F", 0, 1), 9.5, 9.4)
    assert v.over == pytest.approx(0.1)


def test_violation_reports_the_peak_not_the_first_excess():
    problem = two_ranks(microbatches=4, memory=dict(F=4, B=-1, limit=[6, 100]))
    gpipe_like = [[("F", 0, i) for i in range(4)] + [x for i in range(4) for x in (("B", 0, i), ("W", 0, i))],
                  [x for i in range(4) for x in (("F", 1, i), ("B", 1, i), ("W", 1, i))]]
    (v,) = simulate(problem, sched(*gpipe_like)).violations
    assert (v.op, v.peak, v.over) == (Op("F", 0, 1), 16.0, 10.0)


def test_fused_backward_and_no_latency_on_one_rank():
    # V placement with p = 1: both stages on rank 0, hand-off without comm latency.
    p = Problem.parse(dict(ranks=1, chunks=2, placement="v", microbatches=1, costs=dict(F=1, B=1, W=1), comm=9))
    t = simulate(p, sched([("F", 0, 0), ("F", 1, 0), ("BW", 1, 0), ("BW", 0, 0)]))
    assert t.makespan == 6.0 and t.bubble_rate() == 0.0


def test_missing_duplicated_and_misplaced_ops():
    p = two_ranks()
    with pytest.raises(ScheduleError, match=r"2 ops missing: W0@s1, W1@s1"):
        simulate(p, sched(GOOD[0], GOOD[1][:4]))
    with pytest.raises(ScheduleError, match=r"F0@s0 is scheduled twice"):
        simulate(p, sched(GOOD[0] + [("F", 0, 0)], GOOD[1]))
    with pytest.raises(ScheduleError, match=r"F0@s1 is on rank 0 but stage 1 is placed on rank 1"):
        simulate(p, sched(GOOD[0] + [("F", 1, 0)], GOOD[1][1:]))
    with pytest.raises(ScheduleError, match="both BW and B/W"):
        simulate(p, sched(GOOD[0] + [("BW", 0, 0)], GOOD[1]))
    with pytest.raises(ScheduleError, match="has 1 ranks"):
        simulate(p, sched(GOOD[0]))
    with pytest.raises(ScheduleError, match="unknown op kind 'X'"):
        simulate(p, sched(GOOD[0] + [("X", 0, 0)], GOOD[1]))


def test_deadlock_names_who_waits_on_what():
    p = two_ranks()
    # rank 0 wants B0@s0 before sending F1@s0; rank 1 wants F1@s1 before doing B0@s1.
    r0 = [("F", 0, 0), ("B", 0, 0), ("W", 0, 0), ("F", 0, 1), ("B", 0, 1), ("W", 0, 1)]
    r1 = [("F", 1, 0), ("F", 1, 1), ("B", 1, 0), ("B", 1, 1), ("W", 1, 0), ("W", 1, 1)]
    with pytest.raises(ScheduleError) as e:
        simulate(p, sched(r0, r1))
    msg = str(e.value)
    assert "deadlock" in msg
    assert "rank 0 waits at B0@s0 for B0@s1 (rank 1, behind its F1@s1)" in msg
    assert "rank 1 waits at F1@s1 for F1@s0 (rank 0, behind its B0@s0)" in msg


@settings(max_examples=40, deadline=None)
@given(pipeline_problems(max_microbatches=6))
def test_back_to_back_steps_take_between_the_span_and_the_makespan(problem):
    """The first step ends at the makespan; each later step adds at most the makespan (the first
    step's pattern, shifted, is always possible) and at least the busiest rank's work."""
    from schedc.simulate import back_to_back

    for name in ("1f1b", "zb-h1", "zb-h2", "zb-greedy"):
        schedule = solvers.build(name, problem) if solvers.REGISTRY[name].why_not(problem) is None else None
        if schedule is None:
            continue
        t = simulate(problem, schedule)
        ends = back_to_back(problem, schedule, 4)
        assert ends[0] == pytest.approx(t.makespan)
        for a, b in zip(ends, ends[1:]):
            assert max(t.busy) - 1e-9 * t.makespan <= b - a <= t.makespan + 1e-9 * t.makespan


@settings(max_examples=60, deadline=None)
@given(pipeline_problems(max_microbatches=8), st.sampled_from(["makespan", "span"]))
def test_the_objective_ranks_time_is_its_work_recompute_and_idle_by_phase(problem, objective):
    """Every registry schedule that applies: the rank rank_time names sets the objective, and its
    work, recompute and the three idle parts add up to its window, which is what the objective
    measures on it; each part is >= 0."""
    problem = problem.with_changes(objective=objective)
    for name in ("gpipe", "1f1b", "zb-h1", "zb-v", "interleaved-1f1b", "zb-greedy"):
        if solvers.REGISTRY[name].why_not(problem) is not None:
            continue
        t = simulate(problem, solvers.build(name, problem))
        rt = t.rank_time()
        assert t.rank_objective()[rt.rank] == max(t.rank_objective())
        start, end = rt.window
        assert end - start == pytest.approx(t.objective_value(), rel=1e-9, abs=1e-12)
        assert rt.work == pytest.approx(t.busy[rt.rank]) and rt.recompute == 0
        assert min(rt.warm_up, rt.steady, rt.cool_down) >= 0
        assert rt.work + rt.idle == pytest.approx(end - start, rel=1e-9, abs=1e-12)
        assert rt.idle == pytest.approx(t.idle()[rt.rank], rel=1e-9, abs=1e-12)
        assert rt.sets and str(rt).startswith(f"rank {rt.rank} sets the {objective}: ")
        for r in range(problem.ranks):  # another rank's time says whether it sets the objective too
            other = t.rank_time(rank=r)
            assert other.sets == problem.time_tol.ge(t.rank_objective()[r], max(t.rank_objective()))
            assert str(other).startswith(f"rank {r} sets the {objective}: " if other.sets
                                         else f"rank {r} over its {objective} window: ")


@pytest.mark.parametrize("p, m", [(4, 8), (3, 5)])
def test_1f1bs_idle_is_its_warm_up_and_cool_down(p, m):
    """1F1B with a fused backward, every pass 1 and no latency (BW = B + W = 2): rank 0 runs p
    forwards, and its first backward starts at p + 2 (p - 1) (the forwards down, the backwards of
    ranks p - 1 to 1 up): idle 2 (p - 1); after its last forward the last microbatch's round trip
    leaves it p - 1 idle; nothing in between. GPipe has no steady state (every forward ends before
    the first backward): all of rank 0's idle comes before its first backward."""
    problem = Problem.parse(dict(ranks=p, microbatches=m, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=-1)))
    rt = simulate(problem, solvers.build("1f1b", problem)).rank_time()
    assert (rt.rank, rt.work, rt.warm_up, rt.steady, rt.cool_down) == (0, 3 * m, 2 * (p - 1), 0, p - 1)
    t = simulate(problem, solvers.build("gpipe", problem))
    rt = t.rank_time()
    assert (rt.rank, rt.steady, rt.cool_down) == (0, 0, 0) and rt.warm_up == pytest.approx(t.idle()[0]) and rt.warm_up > 0


def test_recompute_is_apart_from_the_work_and_idle_in_a_v_is_phased_by_its_first_stage():
    """A V rank holds stages r and 2p - 1 - r: its warm-up lasts until its first microbatch comes
    back, to the first backward of stage r (not of its later stage, which comes sooner); its
    cool-down starts when its last microbatch enters, after the last forward of stage r (not of its
    later stage, which comes later); a recompute op counts as recompute, not work."""
    problem = Problem.parse(dict(ranks=2, microbatches=6, chunks=2, placement="v", costs=dict(F=1, B=2, W=0.5),
                                 comm=0.3, memory=dict(F=1, B=-1), recompute=dict(time=1, keep=0.1),
                                 objective="span"))
    from schedc.solvers.families.memtime import with_policies

    schedule = with_policies(problem, solvers.build("v-min", problem), {(0, 0): "R", (3, 1): "R"})
    t = simulate(problem, schedule)
    rt = t.rank_time(rank=0)
    ops, ss, es = schedule.ranks[0], t.start[0], t.end[0]
    back = min(s for op, s in zip(ops, ss) if op.kind == "B" and op.stage == 0)
    last_entry = max(e for op, e in zip(ops, es) if op.kind == "F" and op.stage == 0)
    gaps = [(ss[k] - es[k - 1], es[k - 1], ss[k]) for k in range(1, len(ops)) if ss[k] > es[k - 1]]
    assert rt.recompute == 2 and rt.work == pytest.approx(2 * 6 * 3.5)
    later = min(s for op, s in zip(ops, ss) if op.kind == "B" and op.stage == 3)  # (its first backward)
    assert sum(g for g, at, end in gaps if at >= later and end <= back) > 0  # idle the warm-up must count
    assert rt.warm_up > 0 and rt.cool_down > 0 and rt.steady > 0
    assert rt.warm_up == pytest.approx(sum(g for g, _, end in gaps if end <= back))
    assert rt.cool_down == pytest.approx(sum(g for g, at, _ in gaps if at >= last_entry) + t.rank_end[0] - es[-1])
    assert rt.work + rt.recompute + rt.idle == pytest.approx(t.rank_span[0])


@settings(max_examples=60, deadline=None)
@given(pipeline_problems(max_microbatches=8), st.sampled_from(["zb-greedy", "1f1b", "gpipe"]), st.floats(0, 1))
def test_a_replay_resumed_from_any_time_gives_the_times_of_a_replay_from_nothing(problem, name, when):
    """``resume`` from the state a replay reaches at a time t (every op that started before t, the
    rest not run) ends with the whole replay's times."""
    from bisect import bisect_left

    from schedc.simulate import _lanes, dependencies, durations, replay, resume

    try:
        schedule = solvers.build(name, problem)
    except ScheduleError:  # (not every schedule applies to every placement)
        return
    where = schedule.check_complete(problem)
    lanes, anchors = _lanes(problem, schedule)
    orders = [ops for per_rank in lanes.values() for ops in per_rank]
    ops = [op for lane_ops in orders for op in lane_ops]
    index = {op: k for k, op in enumerate(ops)}
    deps = dependencies(problem, ops, index, where, anchors, lanes.get("comm", ()), {})
    dur = durations(problem, ops, {})
    ids = [[index[op] for op in lane_ops] for lane_ops in orders]
    start, end, pos = replay(ids, deps, dur)
    t = when * max((es[-1] for es in end if es), default=0.0)
    keep = [bisect_left(ss, t) for ss in start]
    finish = [-1.0] * len(dur)
    for ks, es, x in zip(ids, end, keep):
        for k, e in zip(ks[:x], es[:x]):
            finish[k] = e
    again = resume(ids, deps, dur, finish, [ss[:x] for ss, x in zip(start, keep)],
                   [es[:x] for es, x in zip(end, keep)], keep)
    assert again == (start, end, pos)
