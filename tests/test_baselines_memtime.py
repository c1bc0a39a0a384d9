"""The memory-for-time baselines (schedc.solvers.families.memtime): the policy transform, the registry
schedules built on it (closed forms where they exist, the simulator for everything), and the
registry's quick memory test under policies."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedc import Problem, solvers
from schedc.errors import ScheduleError
from schedc.kinds import BACKWARDS, Kind
from schedc.schedule import Op
from schedc.simulate import simulate
from schedc.solvers.families import greedy, memtime

from schedc.solvers import registry
NEW = ["1f1b-recompute", "1f1b-selective", "interleaved-1f1b-recompute", "interleaved-1f1b-selective",
       "1f1b-recompute-prefetch", "interleaved-1f1b-recompute-prefetch", "zb-h1-recompute", "1f1b-recompute-fit",
       "zb-v-offload"]
POLICY_OF = {"1f1b-recompute": Kind.RG, "1f1b-selective": Kind.SG, "interleaved-1f1b-recompute": Kind.RG,
             "interleaved-1f1b-selective": Kind.SG, "1f1b-recompute-prefetch": Kind.R,
             "interleaved-1f1b-recompute-prefetch": Kind.R, "zb-h1-recompute": Kind.R}


def uniform(p: int, m: int, F=1.0, B=1.0, W=1.0, R=1.0, a=1.0, keep=0.0, v=1, placement="loop", **more) -> Problem:
    return Problem.parse(dict(ranks=p, microbatches=m, chunks=v, placement=placement, costs=dict(F=F, B=B, W=W),
                              memory=dict(F=a), recompute=dict(time=R, keep=keep), **more))


@st.composite
def memtime_problems(draw):
    """Problems that declare recompute (with selective) and offload: p <= 5, v in {1, 2}, loop or
    V placement, per-stage float costs and keeps, an optional limit."""
    p = draw(st.integers(1, 5))
    v = draw(st.sampled_from([1, 2]))
    m = draw(st.sampled_from([p, 2 * p, 2 * p + 1, 3 * p]))
    n = p * v
    placement = draw(st.sampled_from(["loop", "v"])) if v == 2 else "loop"
    cost = st.floats(0.1, 5, allow_nan=False)
    per_stage = lambda x: draw(st.one_of(x, st.lists(x, min_size=n, max_size=n)))  # noqa: E731
    a = draw(st.floats(0.5, 3))
    frac = st.floats(0, 1)
    problem = Problem.parse(dict(
        ranks=p, microbatches=m, chunks=v, placement=placement,
        costs=dict(F=per_stage(cost), B=per_stage(cost), W=per_stage(cost)),
        comm=draw(st.sampled_from([0.0, 0.3])), objective=draw(st.sampled_from(["makespan", "span"])),
        memory=dict(F=a, B=-a * draw(frac)),
        recompute=dict(time=per_stage(cost), keep=a * draw(frac) * 0.5,
                       selective=dict(time=per_stage(cost), keep=a * (0.5 + 0.5 * draw(frac)))),
        offload=dict(time=per_stage(cost)),
    ))
    if draw(st.booleans()):
        least = max(problem.min_memory(r) for r in range(p))
        problem = problem.with_changes(memory={"limit": least * draw(st.floats(1, 4))})
    return problem


# ---- the transform ----


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memtime_problems(), st.data())
def test_the_transform_puts_each_policy_where_it_runs(problem, data):
    base = solvers.build("looped-bfs", problem)
    keys = [(s, i) for s in range(problem.n_stages) for i in range(problem.microbatches)]
    chosen = data.draw(st.lists(st.sampled_from(keys), unique=True))
    policy = {key: data.draw(st.sampled_from([Kind.R, Kind.S, Kind.O])) for key in chosen}
    out = memtime.with_policies(problem, base, policy, "t")
    t = simulate(problem, out)  # complete, no deadlock
    assert out.policies() == policy
    assert memtime.plain(out).ranks == base.ranks  # the order of what was there is kept
    where = out.locate()
    for (s, i), kind in policy.items():
        backward = next(op for op in out.ranks[problem.stage_rank[s]] if op.kind in BACKWARDS and op[1:] == (s, i))
        r, k = where[backward]
        if kind in (Kind.R, Kind.S):
            assert out.ranks[r][k - 1] == Op(kind, s, i)  # right before its backward
        else:
            times = t.op_times()
            assert times[Op(Kind.O, s, i)][1] >= times[Op(Kind.F, s, i)][2]
            assert times[Op(Kind.L, s, i)][2] <= times[backward][1]


def test_the_transform_with_no_policy_is_the_schedule():
    problem = uniform(3, 6, offload=dict(time=0.5))
    base = solvers.build("zb-h1", problem)
    assert memtime.with_policies(problem, base, {}).ranks == base.ranks
    assert memtime.with_policies(problem, base, {}).copy == ()


def test_the_transform_refuses_a_policy_the_problem_does_not_declare():
    problem = uniform(2, 4)  # recompute, no selective, no offload
    base = solvers.build("1f1b", problem)
    with pytest.raises(ScheduleError, match="'O'.*offload"):
        memtime.with_policies(problem, base, {(0, 0): Kind.O})
    with pytest.raises(ScheduleError, match="'S'"):
        memtime.with_policies(problem, base, {(0, 0): Kind.S})


# ---- the order that holds least ----


def _forwards_apart(problem: Problem, r: int) -> bool:
    """Whether each of rank ``r``'s forwards of one microbatch starts, one at a time, at least its
    predecessor's offload time after it ends (the other ranks' forwards and hops in between)."""
    stages, owner = problem.rank_stages[r], problem.stage_rank
    for a, b in zip(stages, stages[1:]):
        gap = sum(problem.cost[Kind.F][j] for j in range(a + 1, b))
        gap += problem.comm * sum(owner[j] != owner[j + 1] for j in range(a, b))
        if gap < problem.cost[Kind.O][a] + 1e-9:
            return False
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memtime_problems(), st.sampled_from(["both", "offload", "recompute", "none"]))
def test_the_least_memory_order_holds_what_min_memory_counts(problem, declared):
    """memtime.least_memory (one microbatch at a time, each stage under its lightest policy) never
    holds less than Problem.min_memory on a rank (it is a bound), and holds exactly that where the
    rank's forwards of one microbatch lie at least an offload apart (or nothing is offloaded)."""
    drop = {"both": {}, "offload": {"recompute": None}, "recompute": {"offload": None},
            "none": {"recompute": None, "offload": None}}[declared]
    problem = problem.with_changes(memory={"limit": None}, **drop)
    schedule = memtime.least_memory(problem)
    t = simulate(problem, schedule)  # complete, no deadlock
    tol = problem.memory_tol
    for r in range(problem.ranks):
        least = problem.min_memory(r)
        assert not tol.lt(t.peak_memory[r], least), (r, t.peak_memory, least)
        if declared in ("recompute", "none") or _forwards_apart(problem, r):
            assert tol.eq(t.peak_memory[r], least), (r, t.peak_memory, least)
    if declared != "none":
        assert set(schedule.policies().values()) <= set(problem.policies)
        assert len(schedule.policies()) == sum(problem.least_kept(s) < problem.mem[Kind.F][s]
                                               for s in range(problem.n_stages)) * problem.microbatches


@pytest.mark.parametrize("more", [
    dict(replicas=dict(count=2, sync=1)),
    dict(sequence_chunks=dict(count=3)),
    dict(chunks=2, placement="loop", tied=dict(groups=[[0, 3]], sync=1)),
])
def test_the_one_at_a_time_order_runs_on_every_kind_of_problem(more):
    """Replicas, sequence chunks (a sequence's chunks forward in order, backward last chunk first),
    tied weights: a complete schedule, never below the bound."""
    problem = Problem.parse(dict(ranks=2, microbatches=3, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=-0.5),
                                 **more))
    t = simulate(problem, memtime.one_at_a_time(problem))
    assert all(not problem.memory_tol.lt(t.peak_memory[r], problem.min_memory(r)) for r in range(problem.ranks))


# ---- the registry schedules ----


def test_the_baselines_apply_only_where_the_problem_declares_their_policy():
    plain = Problem.parse(dict(ranks=2, microbatches=4, costs=dict(F=1, B=1, W=1)))
    for name in NEW:
        assert "section" in solvers.REGISTRY[name].why_not(plain)
    problem = uniform(2, 4)  # full recompute only
    assert solvers.REGISTRY["1f1b-recompute"].why_not(problem) is None
    assert "recompute.selective" in solvers.REGISTRY["1f1b-selective"].why_not(problem)
    assert "offload" in solvers.REGISTRY["zb-v-offload"].why_not(problem)
    with pytest.raises(ScheduleError, match="does not apply"):
        solvers.build("zb-v-offload", problem)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memtime_problems())
def test_every_baseline_simulates_and_holds_its_policy(problem):
    """Against the simulator, for everything: each applicable baseline is complete, runs without
    deadlock, and holds the policy it says; the uniform ones recompute every (stage, microbatch)
    and do what their base schedule does otherwise."""
    every = problem.n_stages * problem.microbatches
    for name in NEW:
        if solvers.REGISTRY[name].why_not(problem):
            continue
        schedule = solvers.build(name, problem)
        t = simulate(problem, schedule)
        assert schedule.name == name
        if name in POLICY_OF:
            assert set(schedule.policies().values()) == {POLICY_OF[name]} and len(schedule.policies()) == every
            base = solvers.build(name.removesuffix("-prefetch").rsplit("-", 1)[0], problem)
            assert memtime.plain(schedule).ranks == base.ranks
        if name == "1f1b-recompute-fit":
            plain_t = simulate(problem, solvers.build("1f1b", problem))
            full = simulate(problem, solvers.build("1f1b-recompute", problem))
            if plain_t.fits:
                assert not schedule.policies()
            if full.fits:
                assert t.fits
        if name == "zb-v-offload":
            base = simulate(problem, solvers.build("zb-v", problem))
            assert problem.time_tol.le(t.objective_value(), base.objective_value())  # hidden
            assert all(problem.memory_tol.le(x, y) for x, y in zip(t.peak_activation, base.peak_activation))


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), costs=st.lists(st.sampled_from([0.5, 1, 1.5, 2, 3]), min_size=4,
       max_size=4), keep=st.sampled_from([0, 0.1, 0.5]), a=st.sampled_from([1, 2.5]))
def test_1f1b_with_prefetched_recompute_meets_its_closed_form(p, m, costs, keep, a):
    """Uniform costs, no latency: each backward becomes R + B + W, and R runs while the gradient is
    on its way, so the makespan is (p-1)(F+B+W) + m(F+R+B+W), 1F1B's plus m R; rank r holds its
    in-flight microbatches' keep, and one whole activation from an R to its backward:
    (min(p - r, m) - 1) keep + a."""
    F, B, W, R = costs
    problem = uniform(p, m, F, B, W, R, a=a, keep=keep * a)
    t = simulate(problem, solvers.build("1f1b-recompute-prefetch", problem))
    assert t.makespan == pytest.approx((p - 1) * (F + B + W) + m * (F + R + B + W))
    assert t.makespan == pytest.approx(simulate(problem, solvers.build("1f1b", problem)).makespan + m * R)
    for r in range(p):
        assert t.peak_activation[r] == pytest.approx((min(p - r, m) - 1) * keep * a + a)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), costs=st.lists(st.sampled_from([0.5, 1, 1.5, 2, 3]), min_size=4,
       max_size=4), keep=st.sampled_from([0, 0.1, 0.5]), a=st.sampled_from([1, 2.5]))
def test_1f1b_with_recompute_as_megatron_runs_it_meets_its_closed_form(p, m, costs, keep, a):
    """Megatron's RG waits for the gradient, so the recompute is on the critical path as part of
    the backward: 1F1B with a backward of R + B + W, (m + p - 1)(F + R + B + W), longer than the
    prefetched one's by (p - 1) R; the same memory."""
    F, B, W, R = costs
    problem = uniform(p, m, F, B, W, R, a=a, keep=keep * a)
    t = simulate(problem, solvers.build("1f1b-recompute", problem))
    assert t.makespan == pytest.approx((m + p - 1) * (F + R + B + W))
    early = simulate(problem, solvers.build("1f1b-recompute-prefetch", problem))
    assert t.makespan == pytest.approx(early.makespan + (p - 1) * R)
    for r in range(p):
        assert t.peak_activation[r] == pytest.approx((min(p - r, m) - 1) * keep * a + a)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 5), m=st.integers(1, 10), costs=st.lists(st.sampled_from([0.5, 1, 2]), min_size=5,
       max_size=5), keeps=st.tuples(st.sampled_from([0, 0.2]), st.sampled_from([0.3, 0.6])))
def test_1f1b_with_selective_recompute_meets_its_closed_form(p, m, costs, keeps):
    """Megatron's closed form with S's time and the selective keep."""
    F, B, W, R, S = costs
    keep, sel = keeps
    problem = Problem.parse(dict(
        ranks=p, microbatches=m, costs=dict(F=F, B=B, W=W), memory=dict(F=1),
        recompute=dict(time=R, keep=keep, selective=dict(time=S, keep=sel))))
    t = simulate(problem, solvers.build("1f1b-selective", problem))
    assert t.makespan == pytest.approx((m + p - 1) * (F + S + B + W))
    for r in range(p):
        assert t.peak_activation[r] == pytest.approx((min(p - r, m) - 1) * sel + 1)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 6), extra=st.integers(0, 8), costs=st.lists(st.sampled_from([0.5, 1, 1.5, 2, 3]), min_size=4,
       max_size=4))
def test_zb_h1_with_full_recompute_costs_m_recomputes_more(p, extra, costs):
    """Uniform costs, no latency, m >= p: ZB-H1's makespan plus m R (each R sits in its rank's
    steady state; the gradient's trip does not hide it as in 1F1B's cool-down, since zero bubble
    has none)."""
    F, B, W, R = costs
    m = p + extra
    problem = uniform(p, m, F, B, W, R, keep=0.25)
    t = simulate(problem, solvers.build("zb-h1-recompute", problem))
    assert t.makespan == pytest.approx(simulate(problem, solvers.build("zb-h1", problem)).makespan + m * R)


def test_interleaved_with_one_chunk_is_1f1b():
    problem = uniform(3, 6, keep=0.2)
    assert solvers.build("interleaved-1f1b-recompute", problem).ranks == solvers.build("1f1b-recompute", problem).ranks


def test_the_recomputed_activation_stays_until_w_in_zb_h1():
    """pytorch#136766: what R brings back is held until W, so ZB-H1 with recompute holds more on
    the later ranks, whose W wait longer, than 1F1B with recompute."""
    problem = uniform(4, 8, keep=0.1)
    zb = simulate(problem, solvers.build("zb-h1-recompute", problem))
    one = simulate(problem, solvers.build("1f1b-recompute", problem))
    assert zb.peak_activation[3] > one.peak_activation[3]
    assert zb.peak_activation[3] == pytest.approx(max(zb.peak_activation))


@pytest.mark.parametrize("limit", [3.5, 3.0, 2.5, 2.0, 1.75])
def test_recompute_fit_recomputes_no_more_than_it_needs(limit):
    """Per rank, the fewest microbatches, greedily: it fits where full recompute fits (1.75 here),
    keeps every rank that fits without recompute as it is, and keeping any one microbatch it
    recomputes instead takes that rank over the limit."""
    problem = uniform(4, 8, keep=0.25).with_changes(memory={"limit": limit})
    fit = solvers.build("1f1b-recompute-fit", problem)
    t = simulate(problem, fit)
    assert t.fits
    plain = simulate(problem, solvers.build("1f1b", problem))
    policy = fit.policies()
    for r in range(problem.ranks):
        mine = [key for key in policy if problem.stage_rank[key[0]] == r]
        if problem.memory_tol.le(plain.peak_activation[r], limit):
            assert not mine
        for key in mine:
            fewer = memtime.with_policies(problem, fit, {k: v for k, v in policy.items() if k != key})
            assert any(v.rank == r for v in simulate(problem, fewer).violations), key
    assert 0 < len(policy) < problem.n_stages * problem.microbatches


def test_recompute_fit_recomputes_everything_on_a_rank_that_cannot_fit():
    problem = uniform(4, 8, keep=0.25).with_changes(memory={"limit": 1.5})  # full recompute needs 1.75 on rank 0
    fit = solvers.build("1f1b-recompute-fit", problem)
    t = simulate(problem, fit)
    assert [v.rank for v in t.violations] == [0]
    assert t.peak_activation[0] == pytest.approx(1.75)
    assert sum(1 for s, _ in fit.policies() if s == 0) == problem.microbatches


def test_recompute_fit_without_a_limit_is_1f1b():
    problem = uniform(4, 8, keep=0.25)
    assert solvers.build("1f1b-recompute-fit", problem).ranks == solvers.build("1f1b", problem).ranks


def test_offload_on_the_v_hides_at_least_half_of_the_activations():
    """PipeOffload's finding: with copies cheap against compute (here a copy each way of a quarter
    of F, uniform costs, m = 4p), at least half of the activations offload at no cost in time."""
    p = 4
    problem = uniform(p, 4 * p, v=2, placement="v", offload=dict(time=0.25))
    out = solvers.build("zb-v-offload", problem)
    t, base = simulate(problem, out), simulate(problem, solvers.build("zb-v", problem))
    assert t.makespan == pytest.approx(base.makespan)
    assert out.policy_counts()["offload"] >= problem.n_stages * problem.microbatches / 2
    # Every rank holds less at its peak but rank 0, where the cool-down's reloads (no forward left
    # whose offload holds them back on the copy lane) all run at once, up to ZB-V's own peak.
    assert all(x < y for x, y in zip(t.peak_activation[1:], base.peak_activation[1:]))
    assert t.peak_activation[0] <= base.peak_activation[0]
    assert out.copy and all(op.kind in (Kind.O, Kind.L) for ops in out.copy for op in ops)


# ---- the registry's quick memory test, and the warm start ----


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memtime_problems(), st.data())
def test_the_quick_memory_test_counts_the_policies(problem, data):
    """registry._cannot_fit walks the deltas under each (stage, microbatch)'s policy: it never rules
    out a schedule the simulator finds fitting, and on one lane it agrees with the simulator."""
    base = solvers.build("looped-bfs", problem)
    keys = [(s, i) for s in range(problem.n_stages) for i in range(problem.microbatches)]
    chosen = data.draw(st.lists(st.sampled_from(keys), unique=True))
    policy = {key: data.draw(st.sampled_from([Kind.R, Kind.S, Kind.O])) for key in chosen}
    limit = max(problem.min_memory(r) for r in range(problem.ranks)) * data.draw(st.floats(1, 3))
    problem = problem.with_changes(memory={"limit": limit})
    schedule = registry.unfuse(memtime.with_policies(problem, base, policy))
    t = simulate(problem, schedule)
    if registry._cannot_fit(problem, schedule):
        assert not t.fits
    if not schedule.copy and not t.fits:
        over = [v.peak - v.limit for v in t.violations]
        if max(over) > 1e-6 * problem.memory_scale * 10:
            assert registry._cannot_fit(problem, schedule)


def test_the_warm_start_sees_the_baselines_with_their_copy_lanes():
    problem = uniform(2, 8, v=2, placement="v", offload=dict(time=0.25))
    judged = {e.name: e for e in solvers.evaluate(problem, NEW, warm_start=True)}
    offload = judged["zb-v-offload"]
    assert offload.reason is None and offload.schedule.copy
    assert offload.timeline.makespan == pytest.approx(simulate(problem, solvers.build("zb-v", problem)).makespan)
    assert "interleaved-1f1b-recompute" in judged and judged["1f1b-recompute"].reason is not None  # v = 2


# ---- zb-greedy recomputes rather than stalls ----


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memtime_problems(), st.floats(1, 3))
def test_zb_greedy_fits_any_limit_recompute_can_meet(problem, factor):
    """Down to the least memory recompute allows (``min_memory`` without offload, which zb-greedy
    does not use), zb-greedy finds a schedule that fits, recomputing where memory made it; with room
    for everything kept it recomputes nothing."""
    problem = problem.with_changes(memory={"limit": None}).with_changes(offload=None)
    least = [problem.min_memory(r) for r in range(problem.ranks)]
    limited = problem.with_changes(memory={"limit": [x * factor for x in least]})
    schedule = solvers.build("zb-greedy", limited)
    t = simulate(limited, schedule)
    assert t.fits, t.violations
    assert set(schedule.policies().values()) <= {Kind.R, Kind.S}
    free = problem.with_changes(memory={"limit": None})
    assert not solvers.build("zb-greedy", free).policies()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memtime_problems())
def test_zb_greedy_without_the_recompute_switch_is_the_schedule_without_recompute(problem):
    """The switch off, the list scheduler builds what it builds for the problem without the
    recompute section: recompute changes nothing unless it is used."""
    problem = problem.with_changes(memory={"limit": None})
    bare = problem.with_changes(recompute=None, offload=None)
    limit = max(bare.min_memory(r) for r in range(bare.ranks)) * 1.5
    problem, bare = (x.with_changes(memory={"limit": limit}) for x in (problem, bare))
    for policy in (greedy.Policy(recompute=False), greedy.replace(greedy.PAPER_LIKE, recompute=False)):
        try:
            ours = greedy.greedy_schedule(problem, policy, "g")
        except RuntimeError:
            with pytest.raises(RuntimeError):
                greedy.greedy_schedule(bare, policy, "g")
            continue
        assert ours.ranks == greedy.greedy_schedule(bare, policy, "g").ranks


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memtime_problems(), st.sampled_from([greedy.Policy(), greedy.PAPER_LIKE, greedy.Policy(lean=True),
                                            greedy.Policy(recompute=False, cheap_target=True)]))
def test_a_pass_no_memory_gate_held_back_is_the_same_with_any_recompute_switch(problem, policy):
    """Where no memory gate of a pass would have kept a microbatch out under the strictest
    recompute switches (``memory_gated`` False; greedy_search then skips those switches), each
    recompute switch flipped builds the same schedule; a pass that recomputes was gated."""
    scheduler = greedy.ListScheduler(problem, policy)
    try:
        built = scheduler.build("g")
    except RuntimeError:
        return
    if built.policies():
        assert scheduler.memory_gated
    if scheduler.memory_gated:
        return
    for flag in greedy.RECOMPUTE_FLAGS:
        other = greedy.replace(policy, **{flag: not getattr(policy, flag)})
        assert greedy.greedy_schedule(problem, other, "g").ranks == built.ranks, flag


def test_zb_greedy_recomputes_in_the_bubbles_below_1f1b_memory():
    """At half of 1F1B's activation memory (uniform costs, keep a quarter): zb-greedy recomputes,
    runs some recomputes ahead of their backward's gradient (in a gap), and beats both itself
    without recompute and 1F1B with full recompute (what Megatron users run there)."""
    problem = uniform(4, 8, keep=0.25).with_changes(memory={"limit": 2})
    ours = solvers.build("zb-greedy", problem)
    t = simulate(problem, ours)
    bare = simulate(problem.with_changes(recompute=None), solvers.build("zb-greedy", problem.with_changes(recompute=None)))
    megatron = simulate(problem, solvers.build("1f1b-recompute", problem))
    assert t.fits and bare.fits and megatron.fits
    assert t.makespan < bare.makespan and t.makespan < megatron.makespan
    times = t.op_times()
    early = [op for op in times if op.kind is Kind.R and op.stage < problem.n_stages - 1
             and times[op][1] < times[Op(Kind.B, op.stage + 1, op.mb)][2]]
    assert early  # started before the gradient its backward needs had arrived


def test_zb_greedy_recomputes_where_one_kept_microbatch_fills_the_rank():
    """A limit of 1.25 activations: without recompute a rank holds one microbatch at a time (a
    second needs 1.5), with recompute a second one keeps only 0.25: zb-greedy fits, recomputing,
    faster than without recompute."""
    problem = uniform(4, 8, keep=0.25).with_changes(memory={"limit": 1.25})
    t = simulate(problem, solvers.build("zb-greedy", problem))
    bare = problem.with_changes(recompute=None)
    assert t.fits and t.schedule.policies()
    assert t.makespan < simulate(bare, solvers.build("zb-greedy", bare)).makespan


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memtime_problems(), st.sampled_from([greedy.Policy(), greedy.Policy(recompute_before_w=True, cheap_target=True),
                                            greedy.replace(greedy.PAPER_LIKE, early_recompute=False)]))
def test_the_list_schedulers_ranks_end_drained_with_recompute(problem, policy):
    """After a pass that recomputes, each rank ran every op once (one recompute per recomputed
    (stage, microbatch), each right where the simulator finds it before its backward), holds no
    memory or reservation, and has no recompute left to run. The simulator never ends a rank later
    than the pass thought: a recompute the pass held back for memory runs, in the simulator, as soon
    as its lane is free (a lane's memory depends on its order only, so the verdict is the same)."""
    problem = problem.with_changes(memory={"limit": None}).with_changes(offload=None)
    least = max(problem.min_memory(r) for r in range(problem.ranks))
    problem = problem.with_changes(memory={"limit": least * 1.3})
    scheduler = greedy.ListScheduler(problem, policy)
    try:
        schedule = scheduler.build("g")
    except RuntimeError:
        return  # a variant may stall on memory; best_greedy then drops it
    t = simulate(problem, schedule)
    policies = schedule.policies()
    assert policies == scheduler.recomputed
    for r, rank in enumerate(scheduler.ranks):
        mine = sum(1 for s, _ in policies if problem.stage_rank[s] == r)
        assert len(rank.ops) == 3 * problem.microbatches * len(rank.stages) + mine
        assert rank.remaining == 0 and rank.unrecomputed == 0 and rank.finished == problem.microbatches
        assert problem.memory_tol.eq(rank.level, 0.0) and problem.memory_tol.eq(rank.reserved, 0.0)
        assert problem.time_tol.le(t.end[r][-1], rank.last_end)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(memtime_problems(), st.sampled_from([(1e-3, 1.0), (1.0, 1e3), (3.7e-2, 0.1)]))
def test_the_baselines_and_zb_greedy_do_not_depend_on_the_units(problem, factors):
    """The same problem in other units of time and memory (``Problem.scaled``) gives every new
    baseline, and zb-greedy with recompute, the same order on every lane of every rank."""
    time, memory = factors
    other = problem.scaled(time=time, memory=memory)
    for name in [*NEW, "zb-greedy"]:
        if solvers.REGISTRY[name].why_not(problem):
            continue
        a, b = solvers.build(name, problem), solvers.build(name, other)
        assert (a.ranks, a.copy) == (b.ranks, b.copy), name


def test_zb_greedy_under_a_limit_only_offload_meets_returns_the_schedule_that_does_not_fit():
    """The list scheduler never offloads: where only offload meets the limit, every variant stalls
    and zb-greedy gives its schedule without the limit, which the judge finds over it."""
    problem = Problem.parse(dict(ranks=1, microbatches=1, chunks=2, costs=dict(F=1, B=1, W=1),
                                 memory=dict(F=1, B=0, limit=1), recompute=dict(keep=0.5), offload=dict(time=1)))
    t = simulate(problem, solvers.build("zb-greedy", problem))
    assert not t.fits and t.peak_activation == (2.0,)  # both stages kept: what no limit asks
