"""The core model of memory for time (issue 25): the problem's recompute and offload sections, the
new kinds (R, S recompute; O, L offload and reload on the copy lane), what a schedule holding
them must satisfy, and how the simulator times them and counts their memory."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from schedc import Problem
from schedc.errors import ProblemError, ScheduleError
from schedc.kinds import Kind
from schedc.schedule import Op, Schedule
from schedc.program import lower
from schedc.simulate import back_to_back, simulate
from schedc.solvers.families.memtime import with_policies
from schedc.solvers.registry import build
from tests.strategies import pipeline_problems

BASE = dict(ranks=2, microbatches=2, costs=dict(F=1, B=1, W=1), memory=dict(F=4))
FULL = dict(BASE, recompute=dict(keep=1, selective=dict(time=0.25, keep=2)), offload=dict(time=0.5))


def test_sections_give_kinds_costs_and_deltas():
    plain = Problem.parse(BASE)
    assert plain.kinds == (Kind.F, Kind.B, Kind.W, Kind.BW) and plain.policies == ()
    p = Problem.parse(FULL)
    assert p.kinds == tuple(k for k in Kind if k not in (Kind.AR, Kind.RS, Kind.TS)) and p.policies == (Kind.R, Kind.S, Kind.O)
    assert p.cost[Kind.R] == p.cost[Kind.F]  # recompute.time defaults to the forward's
    assert p.cost[Kind.S] == (0.25, 0.25) and p.cost[Kind.O] == p.cost[Kind.L] == (0.5, 0.5)
    assert p.mem[Kind.R] == (3.0, 3.0) and p.mem[Kind.S] == (2.0, 2.0)
    assert p.mem[Kind.O] == (-4.0, -4.0) and p.mem[Kind.L] == (4.0, 4.0)
    assert p.delta(Kind.F, 0) == 4 and p.delta(Kind.F, 0, Kind.R) == 1 and p.delta(Kind.F, 0, Kind.S) == 2
    assert p.delta(Kind.F, 0, Kind.O) == 4 and p.least_kept(0) == 0.0  # an offload keeps nothing
    only_r = Problem.parse(dict(BASE, recompute=dict(time=[2, 3], keep=[0.5, 1])))
    assert only_r.kinds == (Kind.F, Kind.B, Kind.W, Kind.BW, Kind.R, Kind.RG) and only_r.policies == (Kind.R,)
    assert only_r.mem[Kind.RG] == only_r.mem[Kind.R] and only_r.cost[Kind.RG] == only_r.cost[Kind.R]
    assert only_r.cost[Kind.R] == (2.0, 3.0) and only_r.least_kept(1) == 1.0


def test_a_limit_only_a_policy_can_meet_is_accepted():
    # One stage per rank, activation 4: a plain schedule needs 4 on each rank.
    with pytest.raises(ProblemError, match="memory.limit of rank 0 is 2, below the 4"):
        Problem.parse(dict(BASE, memory=dict(F=4, limit=2)))
    p = Problem.parse(dict(BASE, memory=dict(F=4, limit=4), recompute=dict(keep=1)))
    assert p.min_memory(0) == 4  # a recomputed microbatch is whole again from its R to its W
    # Two stages on a rank: the first stage's microbatch waits at its keep while the second runs.
    two = dict(ranks=1, microbatches=2, chunks=2, costs=dict(F=1, B=1, W=1), memory=dict(F=4))
    assert Problem.parse(two).min_memory(0) == 8
    assert Problem.parse(dict(two, recompute=dict(keep=1))).min_memory(0) == 5
    assert Problem.parse(dict(two, offload=dict(time=1))).min_memory(0) == 4
    Problem.parse(dict(two, memory=dict(F=4, limit=5), recompute=dict(keep=1)))


@pytest.mark.parametrize("change, field", [
    (dict(recompute=dict(time=0)), r"recompute.time: must be > 0"),
    (dict(recompute=dict(time=[1, -1])), r"recompute.time: must be > 0, got -1 \(index 1\)"),
    (dict(recompute=dict(keep=5)), r"recompute.keep of stage 0 is 5, above the stage's activation memory.F 4"),
    (dict(recompute=dict(keep=[1, 1, 1])), r"recompute.keep has 3 values but there are 2 stages"),
    (dict(recompute=dict(selective=dict(time=1, keep=9))), r"recompute.selective.keep of stage 0 is 9"),
    (dict(recompute=dict(selective=dict(time=1))), r"recompute.selective.keep: Field required"),
    (dict(offload=dict(time=-0.5)), r"offload.time: must be > 0"),
    (dict(offload=dict(time=[1, 1, 1])), r"offload.time has 3 values but there are 2 stages"),
    (dict(offload=dict(tme=1)), r"unknown field 'offload.tme' \(did you mean 'time'\?\)"),
])
def test_bad_sections_are_one_line_errors_naming_the_field(change, field):
    with pytest.raises(ProblemError, match=field) as e:
        Problem.parse(dict(BASE, **change))
    assert "\n" not in str(e.value)


def test_scaled_scales_times_and_kept_amounts():
    p = Problem.parse(FULL)
    q = p.scaled(time=1000, memory=1024)
    assert q.cost[Kind.R] == (1000.0, 1000.0) and q.cost[Kind.S] == (250.0, 250.0) and q.cost[Kind.O] == (500.0, 500.0)
    assert q.mem[Kind.R] == (3072.0, 3072.0) and q.mem[Kind.S] == (2048.0, 2048.0)


def test_a_schedule_holding_policy_ops_is_checked():
    p = Problem.parse(FULL)
    plain = [[Op("F", 0, i) for i in range(2)] + [Op(k, 0, i) for i in range(2) for k in "BW"],
             [Op(k, 1, i) for i in range(2) for k in "FBW"]]
    bad = {
        "needs the problem's 'recompute' section": (Problem.parse(BASE), [plain[0][:2] + [Op("R", 0, 0)] + plain[0][2:], plain[1]], ()),
        "has R0@s0 and S0@s0": (p, [plain[0][:2] + [Op("R", 0, 0), Op("S", 0, 0)] + plain[0][2:], plain[1]], ()),
        "O0@s0 has no L0@s0": (p, plain, [[Op("O", 0, 0)], []]),
        "runs on the copy lane, not the compute lane": (p, [[Op("O", 0, 0)] + plain[0], plain[1]], ()),
        "runs on the compute lane, not the copy lane": (p, plain, [[Op("R", 0, 0)], []]),
        "has a copy lane for 1 ranks": (p, plain, [[Op("O", 0, 0), Op("L", 0, 0)]]),
    }
    for message, (problem, ranks, copy) in bad.items():
        with pytest.raises(ScheduleError, match=message):
            simulate(problem, Schedule.from_lists("bad", ranks, copy))


def test_simulated_times_and_memory_of_recompute_and_offload():
    p = Problem.parse(FULL)
    s = Schedule.from_lists("x", [
        [("F", 0, 0), ("F", 0, 1), ("R", 0, 0), ("B", 0, 0), ("W", 0, 0), ("B", 0, 1), ("W", 0, 1)],
        [("F", 1, 0), ("B", 1, 0), ("W", 1, 0), ("F", 1, 1), ("B", 1, 1), ("W", 1, 1)],
    ], copy=[[("O", 0, 1), ("L", 0, 1)], []])
    t = simulate(p, s)
    assert t.start[0] == (0, 1, 2, 3, 4, 6, 7) and t.end[0] == (1, 2, 3, 4, 5, 7, 8)
    assert t.copy_start == ((2.0, 2.5), ()) and t.copy_end == ((2.5, 3.0), ())
    # F0 keeps 1; F1 allocates 4; R0 brings 3 back at 2 while O1 still holds F1's 4 until 2.5: 8.
    assert t.memory[0] == (1, 5, 8, 6, 4, 2, 0) and t.peak_activation == (8.0, 4.0)
    assert t.makespan == 8 and s.policy_counts() == {"recompute": 1, "selective": 0, "offload": 1}
    assert t.op_times()[Op("L", 0, 1)] == (0, 2.5, 3.0)
    # Under a limit of 7 the overlap is a violation from R0 on.
    tight = simulate(p.with_changes(memory={"limit": 7}), s)
    assert [str(v.op) for v in tight.violations] == ["R0@s0"]
    assert back_to_back(p, s, 1) == [t.makespan]


def test_the_copy_lane_runs_one_copy_at_a_time_beside_compute():
    p = Problem.parse(dict(FULL, microbatches=2, ranks=1, offload=dict(time=3)))
    s = Schedule.from_lists("x", [[("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("W", 0, 0), ("B", 0, 1), ("W", 0, 1)]],
                            copy=[[("O", 0, 0), ("O", 0, 1), ("L", 0, 0), ("L", 0, 1)]])
    t = simulate(p, s)
    assert t.copy_start == ((1, 4, 7, 10),) and t.copy_end == ((4, 7, 10, 13),)
    assert t.start[0] == (0, 1, 10, 11, 13, 14)  # B0 waits for L0, B1 for L1
    # A copy lane that waits on itself is a deadlock named by lane.
    stuck = Schedule.from_lists("y", s.ranks, copy=[[("L", 0, 0), ("O", 0, 0), ("O", 0, 1), ("L", 0, 1)]])
    with pytest.raises(ScheduleError, match=r"rank 0 \(copy lane\) waits at L0@s0 for O0@s0"):
        simulate(p, stuck)


def test_a_reload_waits_for_the_compute_op_it_is_issued_after():
    """One rank, F0..F3 then the backwards in reverse: microbatch 0 waits longest. Offloaded, its
    reload issued as early as it can be comes right back and the peak is not lowered; issued
    after B1 (``after``), it runs just before B0 and the peak falls by its activation."""
    p = Problem.parse(dict(ranks=1, microbatches=4, costs=dict(F=1, B=1, W=1), memory=dict(F=4), offload=dict(time=1)))
    order = [("F", 0, i) for i in range(4)] + [(k, 0, i) for i in (3, 2, 1, 0) for k in "BW"]
    copy = [[("O", 0, 0), ("L", 0, 0)]]
    early = simulate(p, Schedule.from_lists("early", [order], copy))
    assert early.schedule.after == ((Op("F", 0, 0), Op("F", 0, 0)),)  # the default: as early as it can
    assert early.copy_start == ((1, 2),) and early.peak_activation == (16,)
    late = simulate(p, Schedule.from_lists("late", [order], copy, after=[[("F", 0, 0), ("B", 0, 1)]]))
    assert late.copy_start == ((1, 9),) and late.copy_end == ((2, 10),)  # L0 from B1's end
    assert late.start == early.start and late.makespan == 12  # B0 at 10, as without the offload
    assert late.memory[0] == (4, 8, 8, 12, 10, 8, 6, 4, 2, 4, 2, 0) and late.peak_activation == (12,)
    # The program issues the reload right after B1 (before W1), as the simulator times it.
    listing = [str(i) for i in lower(p, late.schedule).for_rank(0)]
    assert listing[listing.index("B1@s0") + 1] == "L0@s0" and listing[listing.index("F0@s0") + 1] == "O0@s0"
    # with_policies issues it so: after the last compute op that ends in time for B0.
    planned = with_policies(p, Schedule.from_lists("x", [order]), {(0, 0): Kind.O})
    assert planned.after == late.schedule.after and simulate(p, planned).peak_activation == (12,)
    # A reload issued after (or at) the backward that waits for it is refused, by name.
    with pytest.raises(ScheduleError, match="L0@s0 is issued after B0@s0, which waits for it"):
        simulate(p, Schedule.from_lists("bad", [order], copy, after=[[("F", 0, 0), ("B", 0, 0)]]))


@settings(max_examples=60, deadline=None)
@given(pipeline_problems(max_microbatches=8), st.sampled_from(["1f1b", "zb-h1", "gpipe"]), st.data())
def test_recompute_and_offload_trade_time_for_memory(problem, name, data):
    """Whatever (stage, mb) recompute or offload in a schedule: the makespan never shrinks, the
    peak never grows, every op still runs and memory returns to zero."""
    assume(problem.chunks == 1)
    f = problem.mem[Kind.F][0]
    problem = problem.with_changes(recompute=dict(keep=f * data.draw(st.floats(0, 1))),
                                   offload=dict(time=data.draw(st.floats(0.05, 5))))
    base = build(name, problem)
    pairs = [(s, i) for s in range(problem.n_stages) for i in range(problem.microbatches)]
    chosen = {pair: data.draw(st.sampled_from([Kind.R, Kind.O, None])) for pair in pairs}
    policies = with_policies(problem, base, {k: v for k, v in chosen.items() if v is not None})
    plain_t, t = simulate(problem, base), simulate(problem, policies)
    tol = problem.time_tol
    assert tol.le(plain_t.makespan, t.makespan)
    for r in range(problem.ranks):
        assert problem.memory_tol.le(t.peak_activation[r], plain_t.peak_activation[r])
        assert problem.memory_tol.eq(t.memory[r][-1], 0.0)
    assert policies.policy_counts()["recompute"] == sum(v is Kind.R for v in chosen.values())
    assert policies.policy_counts()["offload"] == sum(v is Kind.O for v in chosen.values())
