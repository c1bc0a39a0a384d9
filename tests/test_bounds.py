"""Lower bounds (solvers/bounds.py): never above a schedule that fits, exact where the optimum
is known."""

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc.solvers as solvers
from schedc import Op, Problem, Schedule, ScheduleError, load_problem, simulate
from schedc.solvers.bounds import Bound, all_bounds, lower_bound
from schedc.solvers.search.solve import best_registry_schedule
from tests.exhaustive import exhaustive_optimum, linear_extensions, span_with_delays
from tests.strategies import with_working, working_memory

EXAMPLES = Path(__file__).parent.parent / "examples" / "problems"
ZB_PAPER = EXAMPLES / "zb-paper"


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
            memory=with_working(dict(F=f, B=b, static=draw(st.floats(0, 5))), working_memory(draw, n)),
            objective=draw(st.sampled_from(["makespan", "span"])),
        )
    )
    if draw(st.booleans()):  # a fused backward cheaper than B + W (as measured on CPUs)
        c = problem.cost
        problem = problem.with_changes(costs={"BW": [(b + w) * draw(st.floats(0.5, 1)) for b, w in zip(c["B"], c["W"])]})
    if draw(st.booleans()):
        # From just feasible to plenty; per rank, each at least what any schedule needs there.
        limits = [problem.min_memory(r) * draw(st.floats(1, 4)) + draw(st.floats(0, 2)) for r in range(p)]
        problem = problem.with_changes(memory={"limit": limits})
    return problem


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_bound_never_above_a_schedule_that_fits(problem):
    timelines = fitting_timelines(problem)
    for objective in ("makespan", "span"):
        bound = lower_bound(problem, objective)
        assert isinstance(bound, Bound) and bound.reason
        terms = all_bounds(problem, objective)
        assert bound.value == pytest.approx(max(b.value for b in terms), abs=1e-9)
        for name, t in timelines.items():
            for b in terms:  # every term is a bound on its own
                assert b.value <= t.objective_value(objective) + 1e-9, (name, objective, b)


@st.composite
def span_problems(draw):
    """Span problems shaped like the zero-bubble paper's (uniform or per-stage costs, W often
    small against F + B, B freeing most of the activation) with few microbatches per rank, where
    the start offsets between ranks matter; memory limits from just feasible to plenty."""
    p = draw(st.integers(2, 6))
    v = draw(st.sampled_from([1, 1, 2]))
    n = p * v
    m = draw(st.integers(1, 3 * p))
    if draw(st.booleans()):
        f, b, w = draw(st.floats(0.5, 2)), draw(st.floats(0.5, 2)), draw(st.floats(0.05, 2))
    else:
        f, b, w = (draw(st.lists(st.floats(0.05, 2), min_size=n, max_size=n)) for _ in range(3))
    mem_f = draw(st.sampled_from([1.0, 0.5]))
    problem = Problem.parse(
        dict(
            ranks=p, microbatches=m, chunks=v, placement=draw(st.sampled_from(["loop", "v"])),
            costs=dict(F=f, B=b, W=w), comm=draw(st.sampled_from([0.0, 0.05, 0.5, 1.0])),
            memory=with_working(dict(F=mem_f, B=-mem_f * draw(st.floats(0.3, 1))), working_memory(draw, n)),
            objective="span",
        )
    )
    if draw(st.integers(0, 4)) == 0:  # a fused backward cheaper than B + W
        c = problem.cost
        problem = problem.with_changes(costs={"BW": [(b + w) * draw(st.floats(0.6, 1)) for b, w in zip(c["B"], c["W"])]})
    room = draw(st.sampled_from([None, 0, 0.5, 1, 2, 4, 8]))  # activations beyond the least feasible
    if room is not None:
        need = max(problem.min_memory(r) for r in range(p))
        problem = problem.with_changes(memory={"limit": need + room * mem_f * v})
    return problem


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(span_problems())
def test_span_bound_never_above_a_schedule_that_fits(problem):
    """Every term of the span bound, against every registry schedule that fits, on problems where
    the terms that couple two ranks (start offset, deferred W, the chain back) can bind."""
    terms = all_bounds(problem, "span")
    timelines = fitting_timelines(problem)
    for name, t in timelines.items():
        for b in terms:
            assert b.value <= t.span + 1e-9, (name, b)


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


# ---- validity against every schedule, on problems small enough to enumerate ----


def rank_orders(problem, r, fused):
    """Every order of rank r's ops that respects the dependencies among them (any other order
    deadlocks), all split (F, B, W) or all fused (F, BW)."""
    stages, m = problem.rank_stages[r], problem.microbatches
    back = "BW" if fused else "B"
    before = {}
    for s in stages:
        for i in range(m):
            before[Op("F", s, i)] = {Op("F", t, i) for t in stages if t < s}
            before[Op(back, s, i)] = {Op("F", s, i)} | {Op(back, t, i) for t in stages if t > s}
            if not fused:
                before[Op("W", s, i)] = {Op("B", s, i)}
    return linear_extensions(before)


def optimum(problem, delays=False):
    """objective -> the best value over every split and every fused schedule that fits, timed as
    soon as possible; with ``delays``, "span" is over every timing (a rank may start late on
    purpose) and "asap span" as the simulator times them."""
    best = {"makespan": float("inf"), "span": float("inf"), "asap span": float("inf")}
    for fused in (False, True):
        for ranks in itertools.product(*(rank_orders(problem, r, fused) for r in range(problem.ranks))):
            try:
                t = simulate(problem, Schedule("any", ranks))
            except ScheduleError:  # deadlock: the ranks wait on each other
                continue
            if t.fits:
                best["makespan"] = min(best["makespan"], t.makespan)
                best["asap span"] = min(best["asap span"], t.span)
                any_timing = span_with_delays(problem, [[tuple(op) for op in ops] for ops in ranks]) if delays else t.span
                assert any_timing <= t.span + 1e-9
                best["span"] = min(best["span"], any_timing)
    return best


@st.composite
def tiny_problems(draw):
    p, v, m = draw(st.sampled_from([(1, 1, 1), (1, 1, 2), (1, 1, 3), (2, 1, 1), (2, 1, 2), (3, 1, 1),
                                    (3, 1, 2), (1, 2, 1), (1, 2, 2), (2, 2, 1)]))
    n = p * v
    costs = st.lists(st.floats(0.1, 10), min_size=n, max_size=n)
    f = draw(st.lists(st.floats(0, 3), min_size=n, max_size=n))
    problem = Problem.parse(
        dict(
            ranks=p, microbatches=m, chunks=v, placement=draw(st.sampled_from(["loop", "v"])),
            costs=dict(F=draw(costs), B=draw(costs), W=draw(costs)), comm=draw(st.floats(0, 3)),
            memory=dict(F=f, B=[-x * draw(st.floats(0, 1)) for x in f]),
        )
    )
    if draw(st.booleans()):
        extra = [draw(st.sampled_from([0, 0.5, 1, 3])) * max(f) for _ in range(p)]
        problem = problem.with_changes(memory={"limit": [problem.min_memory(r) + x for r, x in enumerate(extra)]})
    return problem


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_problems())
def test_bound_never_above_the_true_optimum(problem):
    best = optimum(problem)
    for objective in ("makespan", "span"):
        for b in all_bounds(problem, objective):
            assert b.value <= best[objective] + 1e-9, (objective, b)


@st.composite
def tiny_span_problems(draw):
    """Tiny span problems where the terms coupling two ranks bind: W small, several ranks."""
    p, v, m = draw(st.sampled_from([(2, 1, 1), (2, 1, 2), (3, 1, 1), (3, 1, 2), (4, 1, 1), (2, 2, 1)]))
    n = p * v
    costs = st.lists(st.sampled_from([0.25, 0.5, 1, 2, 3]), min_size=n, max_size=n)
    problem = Problem.parse(
        dict(
            ranks=p, microbatches=m, chunks=v, placement=draw(st.sampled_from(["loop", "v"])),
            costs=dict(F=draw(costs), B=draw(costs), W=draw(st.lists(st.sampled_from([0.1, 0.25, 1]), min_size=n, max_size=n))),
            comm=draw(st.sampled_from([0, 0.5])), memory=dict(F=1, B=-draw(st.sampled_from([0.5, 0.75, 1]))),
            objective="span",
        )
    )
    room = draw(st.sampled_from([None, 0, 1, 2]))
    if room is not None:
        problem = problem.with_changes(memory={"limit": max(problem.min_memory(r) for r in range(p)) + room})
    return problem


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_span_problems())
def test_span_bound_never_above_the_optimum_over_every_timing(problem):
    """Stronger than against the simulator's timings: a span bound must hold for schedules whose
    ranks start late on purpose (tests/exhaustive.py, span_with_delays)."""
    best = optimum(problem, delays=True)["span"]
    for b in all_bounds(problem, "span"):
        assert b.value <= best + 1e-9, b


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


def test_memory_tight_example_is_proven_optimal():
    """examples/problems/memory_tight.yaml (p=4, m=12, F 1, B 1.1, W 0.8, comm 0.05, room for 4
    activations): rank 0 has work 12 x 2.9 = 34.8; its first B waits 1 + 6.3 + 0.3 = 7.6 with 4
    forwards done (warm-up idle 3.6); after its last forward the gradient needs 6.6 while memory
    holds 3 other microbatches' B + W = 5.7 (cool-down idle 0.9): 39.3, which ZB-H1 reaches."""
    problem = load_problem(EXAMPLES / "memory_tight.yaml")
    b = lower_bound(problem)
    assert b.value == pytest.approx(39.3, abs=1e-9)
    assert "warm-up idle 3.6" in b.reason and "cool-down idle 0.9" in b.reason
    assert best(problem, "makespan") == pytest.approx(39.3, abs=1e-9)


# Where the bound meets the best registry schedule, that schedule is proven optimal.
PROVEN = {"uniform", "uniform_comm", "heterogeneous", "memory_tight", "v_shape"}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_examples(path):
    """Below every registry schedule on the example problems, and equal to the best one on the
    examples in PROVEN, by makespan and by span."""
    problem = load_problem(path)
    for objective in ("makespan", "span"):
        bound = lower_bound(problem, objective).value
        found = best(problem, objective)
        assert bound <= found + 1e-9
        if path.stem in PROVEN:
            assert bound == pytest.approx(found, abs=1e-9), objective


# ---- span: terms that couple two ranks ----


def test_span_pair_term_through_the_last_backward_is_optimal():
    """p=4, m=2, F=B=1, W=0.25, no limit: rank 3's first op starts >= 3 after rank 0's (forward
    chain); by its last backward it has done its work 4.5 but for the W it defers (at most both,
    0.5); from there the gradient needs 3 to reach stage 0 and W 0.25 more. Rank 0's span >= 3 +
    4 + 3.25 = 10.25 although each rank's work is 4.5, and that is the optimum."""
    problem = uniform(4, 2, objective="span", costs=(1, 1, 0.25))
    b = lower_bound(problem)
    assert b.value == pytest.approx(10.25, abs=1e-12)
    assert "rank 0: its span holds rank 3's first op to last backward" in b.reason
    assert exhaustive_optimum(problem)[0] == pytest.approx(10.25, abs=1e-9)


def test_span_pair_term_through_the_last_forward_is_optimal():
    """V placement, p=2 (rank 0: stages 0 and 3; rank 1: stages 1 and 2), m=2, F=B=2, W=0.5,
    room for 3 activations: rank 1 starts >= 2 after rank 0 and works 18, less the backward work
    that memory holds at its last forward (3 activations x (B + W) = 7.5), and idles >= 2 in
    warm-up (its first B waits 8 after its first op, 3 forwards fit); from the end of its last
    forward F(2, j) the microbatch goes round stage 3 (4), B(2), B(1), B(0) (6) and W(0) (0.5):
    rank 0's span >= 2 + 10.5 + 2 + 10.5 = 25, the optimum."""
    problem = Problem.parse(
        dict(ranks=2, microbatches=2, chunks=2, placement="v", costs=dict(F=2, B=2, W=0.5),
             memory=dict(F=1, B=-0.5, limit=3), objective="span")
    )
    b = lower_bound(problem)
    assert b.value == pytest.approx(25, abs=1e-6)  # less the simulator's 1e-9 memory tolerance
    assert "rank 0: its span holds rank 1's first op to last forward" in b.reason and "warm-up idle 2" in b.reason
    assert exhaustive_optimum(problem)[0] == pytest.approx(25, abs=1e-9)


def test_span_warm_up_counts_the_forward_chain_between_a_ranks_stages():
    """Rank 0 of a V placement holds the first and the last stage: its first B (of the last stage)
    waits for the whole forward chain after its first op, and only the forwards that memory
    holds can fill it. p=4, v=2, F=B=W=1, room for 4 activations: 8 forwards later, of which 4
    fit: idle >= 4 (the term counted only F + rt of the last stage, 1, before)."""
    problem = uniform(4, 8, v=2, placement="v", limit=4, objective="span")
    rank0 = all_bounds(problem)[0]
    assert rank0.value == pytest.approx(48 + 4, abs=1e-6) and "warm-up idle 4" in rank0.reason
    assert lower_bound(problem).value <= best(problem, "span") + 1e-9


def test_span_warm_up_counts_when_a_ranks_later_stage_can_arrive():
    """V placement, p=2 (rank 0: stages 0 and 3), m=2, F=B=W=1, no limit: stage 3's forwards reach
    rank 0 no sooner than 3 after its first op (the forward chain), and by then only its two
    forwards of stage 0 can have run: idle >= 1, span >= 12 + 1 = 13, the optimum (the term
    counted all four forwards against the first backward's wait of 4 before: 12)."""
    problem = Problem.parse(dict(ranks=2, microbatches=2, chunks=2, placement="v", costs=dict(F=1, B=1, W=1),
                                 objective="span"))
    b = lower_bound(problem)
    assert b.value == pytest.approx(13, abs=1e-12)
    assert "rank 0: work 12 + warm-up idle 1 (by 3 after its first op only so many" in b.reason
    assert exhaustive_optimum(problem)[0] == pytest.approx(13, abs=1e-9)


def test_zero_bubble_paper_2p_optimum_is_certified():
    """The paper's 1.5B model at m=24, p=8, memory 2p (examples/problems/zb-paper): rank 7 starts
    >= 7 (F + comm) after rank 0, may defer all its 24 W past its last B, and from there the
    gradient needs 7 (B + comm) and W(0): the span is >= 1152.6, the published ZB-2p bubble
    (0.0433 of 1152.6, against rank work 1102.68) exactly, so that schedule is optimal."""
    problem = load_problem(ZB_PAPER / "zb-1.5B-m24-2p.yaml")
    b = lower_bound(problem)
    work = 24 * (18.522 + 18.086 + 9.337)
    assert b.value == pytest.approx(7 * (18.522 + 0.601) + work - 24 * 9.337 + 7 * (18.086 + 0.601) + 9.337)
    assert 1 - work / b.value == pytest.approx(0.0433, abs=5e-5)
    assert "rank 0: its span holds rank 7's first op to last backward" in b.reason


@pytest.mark.parametrize("name", ["zb-1.5B-m24-2p", "zb-1.5B-m24-1p-v", "zb-6.2B-m24-2p", "zb-6.2B-m24-1p"])
def test_zero_bubble_paper_bound_below_the_best_registry_schedule(name):
    problem = load_problem(ZB_PAPER / f"{name}.yaml")
    _, t = best_registry_schedule(problem)
    for b in all_bounds(problem):
        assert b.value <= t.span + 1e-9, b


def test_span_bound_is_cheap_at_the_largest_paper_setting():
    """p=32, m=256 bounds in well under a second (one pass over pairs of ranks)."""
    import time

    problem = load_problem(ZB_PAPER / "zb-28.3B-m256-2p.yaml")
    t0 = time.perf_counter()
    lower_bound(problem)
    assert time.perf_counter() - t0 < 0.5


def test_the_warm_up_counts_what_the_room_holds_of_the_forwards_that_have_arrived():
    """V placement, p = 2 (rank 0 holds stages 0 and 3), F = 1, 1, 1, 3, B = W = 1, room for two
    activations, m = 3. Stage 3's first forward reaches rank 0 at 3; until then only stage 0's
    forwards can run, and only two of them fit: idle 1 by 3. By 6 (the earliest the first backward,
    B(3, 0), can start) the rank has run at most one F(3) (3) and one more F(0) (the room holds two
    forwards): busy 4, idle 2, so the makespan is at least its work 24 + 2 = 26 (the exhaustive
    optimum is 31). Counting the room in forward work instead (two F(3), 6) saw no idle at all."""
    problem = Problem.parse(dict(ranks=2, microbatches=3, chunks=2, placement="v", costs=dict(F=[1, 1, 1, 3], B=1, W=1),
                                 memory=dict(F=1, B=-0.5, limit=2)))
    bound = lower_bound(problem, "makespan")
    assert bound.value == pytest.approx(26) and "warm-up idle 2 (by 6 only so many" in bound.reason
    assert exhaustive_optimum(problem, objective="makespan")[0] == pytest.approx(31)


@st.composite
def heavy_last_stage_problems(draw):
    """p = 2, V or loop, m 2-3, a heavier last stage and room for one to three activations: the
    memory the warm-up fills before the later stages' forwards arrive binds."""
    v = draw(st.sampled_from([1, 2]))
    n = 2 * v
    cost = st.sampled_from([0.5, 1, 2])
    f = [draw(cost) for _ in range(n - 1)] + [draw(st.sampled_from([2, 3, 4]))]
    problem = Problem.parse(dict(
        ranks=2, microbatches=draw(st.sampled_from([2, 3])), chunks=v, placement="v" if v == 2 else "loop",
        costs=dict(F=f, B=[draw(cost) for _ in range(n)], W=[draw(cost) for _ in range(n)]),
        comm=draw(st.sampled_from([0, 0.5])), memory=dict(F=1, B=-draw(st.sampled_from([0.5, 1]))),
        objective=draw(st.sampled_from(["makespan", "span"])),
    ))
    room = draw(st.sampled_from([0, 1, 2]))
    return problem.with_changes(memory={"limit": max(problem.min_memory(r) for r in range(2)) + room})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heavy_last_stage_problems())
def test_the_warm_up_term_stays_below_the_exhaustive_optimum(problem):
    best = exhaustive_optimum(problem, time_budget=120)[0]
    for b in all_bounds(problem):
        assert b.value <= best + 1e-9, b
