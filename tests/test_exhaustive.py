"""The exhaustive-search oracle (tests/exhaustive.py) checked on its own, before the ILP is judged by it:

- against a brute force that tries literally every per-rank order on tiny problems;
- against hand-worked optima and published closed forms;
- as a lower bound on every applicable registry schedule (judged by schedc's simulator), and its
  own optimal orders replayed by that simulator give the value it claims.
"""

import itertools
import math
import random

import pytest

import schedc.solvers as S
from schedc import Problem, Schedule, simulate
from schedc.analytic import FORMULAS

from tests.exhaustive import BudgetExceeded, exhaustive_optimum, span_with_delays

TOL = 1e-9


def problem(p, m, F=1, B=1, W=1, *, comm=0.0, v=1, placement="loop", objective="makespan", **memory):
    return Problem.parse(
        dict(ranks=p, microbatches=m, chunks=v, placement=placement, costs=dict(F=F, B=B, W=W),
             comm=comm, memory=dict(F=2, B=-1, **memory), objective=objective)
    )


def replay(prob, orders, objective):
    """The oracle's orders judged by schedc's simulator: (objective value, fits)."""
    t = simulate(prob, Schedule.from_lists("oracle", [orders[r] for r in range(prob.ranks)]))
    return t.objective_value(objective), t.fits


def optimum(prob, objective=None):
    objective = objective or prob.objective
    value, orders = exhaustive_optimum(prob, objective=objective, time_budget=60)
    got, fits = replay(prob, orders, objective)
    assert fits and got == pytest.approx(value, abs=TOL)
    return value


# ---- a brute force over every per-rank order (tiny problems only) ----

def brute_force(prob, objective, *, in_order=False):
    """The best objective over every per-rank order (tiny problems only); with ``in_order``, only
    orders that run each stage's ops of one kind by increasing microbatch."""
    n, m, comm, rank = prob.n_stages, prob.microbatches, prob.comm, prob.stage_rank
    ops = [(k, s, i) for k in "FBW" for s in range(n) for i in range(m)]

    def inputs(op):
        k, s, i = op
        if k == "F":
            return [("F", s - 1, i)] if s else []
        if k == "W":
            return [("B", s, i)]
        return [("F", s, i)] + ([("B", s + 1, i)] if s + 1 < n else [])

    ancestors = {}  # ops in an order where inputs come first: F by stage, B by stage descending, W
    for op in sorted(ops, key=lambda o: ("FBW".index(o[0]), o[1] if o[0] != "B" else -o[1])):
        ancestors[op] = set().union(*({d} | ancestors[d] for d in inputs(op)))

    def same_rank_orders(r):
        """Every order of rank r's ops (those that run an op before an ancestor on r deadlock anyway)."""
        mine = [op for op in ops if rank[op[1]] == r]
        before = {op: {d for d in ancestors[op] if rank[d[1]] == r} for op in mine}
        if in_order:
            for k, s, i in mine:
                before[(k, s, i)] |= {(k, s, i - 1)} if i else set()
        out = []

        def extend(prefix, done):
            if len(prefix) == len(mine):
                out.append(list(prefix))
            for op in mine:
                if op not in done and before[op] <= done:
                    extend(prefix + [op], done | {op})

        extend([], frozenset())
        return out

    def fits(r, order):
        level = prob.static_memory[r]
        for k, s, _ in order:
            level += prob.mem[k][s]
            if k == "F" and prob.memory_limit and level > prob.memory_limit[r] + TOL:
                return False
        return True

    def evaluate(orders):
        end, start, pos = {}, {}, [0] * len(orders)
        free = [0.0] * len(orders)
        progress = True
        while progress:
            progress = False
            for r, order in enumerate(orders):
                while pos[r] < len(order) and all(d in end for d in inputs(order[pos[r]])):
                    op = order[pos[r]]
                    t = max([free[r]] + [end[d] + (comm if rank[d[1]] != r else 0) for d in inputs(op)])
                    start[op], end[op] = t, t + prob.cost[op[0]][op[1]]
                    free[r] = end[op]
                    pos[r] += 1
                    progress = True
        if len(end) < len(ops):
            return None  # deadlock
        if objective == "makespan":
            return max(end.values())
        return max(end[o[-1]] - start[o[0]] for o in orders)

    per_rank = [[o for o in same_rank_orders(r) if fits(r, o)] for r in range(prob.ranks)]
    values = [evaluate(c) for c in itertools.product(*per_rank)]
    return min(v for v in values if v is not None)


def tiny_problems(seed=2024, count=40):
    """Seeded random tiny problems: costs (integers or decimals), comm, limits, both objectives."""
    rng = random.Random(seed)
    shapes = [(1, 1, 1), (1, 2, 1), (1, 3, 1), (1, 2, 2), (2, 1, 1), (2, 2, 1), (3, 1, 1), (3, 2, 1),
              (2, 1, 2), (4, 1, 1)]
    out = []
    for k in range(count):
        p, m, v = shapes[k % len(shapes)]
        n = p * v

        def costs():
            return [rng.choice([1, 2, 3]) if k % 3 else rng.choice([0.1, 0.2, 0.3, 0.7]) for _ in range(n)]

        f_mem = [rng.choice([1, 2, 3]) for _ in range(n)]
        prob = Problem.parse(dict(
            ranks=p, microbatches=m, chunks=v, placement=rng.choice(["loop", "v"]),
            costs=dict(F=costs(), B=costs(), W=costs()), comm=rng.choice([0, 0, 0.5, 0.25]),
            memory=dict(F=f_mem, B=[-rng.choice([0.5, 1]) * f for f in f_mem], static=1),
            objective=rng.choice(["makespan", "span"]),
        ))
        need = max(prob.min_memory(r) for r in range(p))
        roomy = max(prob.static_memory) + sum(f_mem) * m
        limit = rng.choice([None, need, need + 1, (need + roomy) / 2])
        if limit is not None:
            prob = prob.with_changes(memory={"limit": limit})
        out.append(pytest.param(prob, id=f"{k}-p{p}m{m}v{v}-{prob.objective}-lim{limit}"))
    return out


@pytest.mark.parametrize("prob", tiny_problems())
def test_matches_brute_force(prob):
    assert optimum(prob) == pytest.approx(brute_force(prob, prob.objective), abs=TOL)
    in_order, _ = exhaustive_optimum(prob, in_order=True)
    assert in_order == pytest.approx(brute_force(prob, prob.objective, in_order=True), abs=TOL)


def test_the_next_op_may_be_one_whose_inputs_are_not_scheduled_yet():
    # Found by random search. The optimum (19) has rank 1 run B0 of stage 1 at 8, when its
    # input from rank 2 arrives, although F1 of stage 1 had its input already scheduled
    # (arriving at 8 too); a search that prefers ops whose inputs are already scheduled gets 21.
    prob = Problem.parse(dict(
        ranks=3, microbatches=2, costs=dict(F=[4, 2, 1], B=[1, 1, 1], W=[4, 1, 1]),
        memory=dict(F=[1, 3, 2], B=[-1, -1.5, -1], static=1),
    ))
    assert optimum(prob) == brute_force(prob, "makespan") == 19


def test_the_optimum_may_run_microbatches_out_of_order():
    # Found by random search (span, two chunks per rank): the best schedule that runs each
    # stage's F (and B, and W) by increasing microbatch spans 44; the optimum, 43, starts rank 1
    # with microbatch 1 (an ILP that fixes the microbatch order cannot reach it).
    prob = Problem.parse(dict(
        ranks=2, microbatches=2, chunks=2, objective="span",
        costs=dict(F=[3, 1, 4, 4], B=[2, 4, 2, 4], W=[3, 4, 4, 3]),
        memory=dict(F=1, B=[-0.5, -0.5, -0.5, -1], static=1),
    ))
    value, orders = exhaustive_optimum(prob)
    assert value == 43 and replay(prob, orders, "span") == (43, True)
    assert exhaustive_optimum(prob, in_order=True)[0] == 44  # brute force agrees (about a minute)
    mbs = {}  # (rank, kind, stage) -> microbatches in the order run
    for r, ops in orders.items():
        for k, s, i in ops:
            mbs.setdefault((r, k, s), []).append(i)
    assert any(order != sorted(order) for order in mbs.values())


def test_costs_that_are_not_simple_fractions():
    prob = problem(2, 2, F=math.pi, B=math.e, W=math.sqrt(2), comm=0.1, limit=3)
    for objective in ("makespan", "span"):
        assert optimum(prob, objective) == pytest.approx(brute_force(prob, objective), abs=TOL)


# ---- hand-worked optima ----

@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_one_rank_is_its_total_work(m, objective):
    prob = problem(1, m, F=2, B=3, W=1.5, objective=objective)
    assert optimum(prob) == pytest.approx(m * 6.5, abs=TOL)
    assert optimum(problem(1, m, F=2, B=3, W=1.5, v=2, objective=objective)) == pytest.approx(2 * m * 6.5)


def test_two_ranks_one_microbatch_is_the_critical_path():
    # F0 0-1 | F1 1-2 | B1 2-3 | B0 3-4 | W0 4-5 (W1 3-4 beside it); comm c adds 2c.
    assert optimum(problem(2, 1)) == 5
    assert optimum(problem(2, 1, comm=0.5)) == 6
    assert optimum(problem(2, 1, objective="span")) == 5  # rank 0 runs 0-5
    assert optimum(problem(2, 1, F=1, B=2, W=3, comm=0.5)) == 1 + 0.5 + 1 + 2 + 0.5 + 2 + 3


def test_two_ranks_two_microbatches():
    # Makespan: rank 1 cannot start before 1 and has 6 units of work: 7, and 7 is reached.
    assert optimum(problem(2, 2)) == 7
    # Span: rank 0 starts at 0 with F0 F1 (0-2) and has nothing else to do before B0 of
    # stage 1 ends at 3 (F 1-2, B 2-3): idle at least 1, so 7 again.
    assert optimum(problem(2, 2, objective="span")) == 7
    # With comm 0.5: rank 1 starts at 1.5, and the later of its two B comes after both its F and
    # the other B: it ends at >= 5.5; then comm 0.5, B and W on rank 0: >= 8, and 8 is reached.
    assert optimum(problem(2, 2, comm=0.5)) == 8


# ---- published closed forms (upper bounds; equal where they meet a lower bound) ----

@pytest.mark.parametrize("p,m", [(2, 2), (2, 3), (2, 4), (3, 3), (3, 4), (4, 4)])
@pytest.mark.parametrize("costs", [(1, 1, 1), (2, 2, 1), (1, 2, 1)])
def test_never_worse_than_closed_forms(p, m, costs):
    F, B, W = costs
    work = m * (F + B + W)
    best = {obj: optimum(problem(p, m, F, B, W), obj) for obj in ("makespan", "span")}
    assert best["span"] <= best["makespan"] + TOL
    assert best["span"] >= work - TOL  # no rank can beat its own work
    for f in FORMULAS:
        if f.schedule not in ("gpipe", "1f1b", "zb-h1", "zb-h2"):
            continue  # the others are for several chunks per rank
        if f.schedule.startswith("zb") and m < p or f.schedule == "zb-h2" and (m < 2 * p - 1 or F + B < 2 * W):
            continue  # outside the conditions under which the form holds
        objective = "span" if f.schedule == "zb-h2" else "makespan"
        bubble = f.bubble(p, m, 1, F, B, W)
        assert best[objective] <= work + bubble + TOL, f.schedule
        if bubble == 0:  # no rank can beat its own work: the closed form is the optimum
            assert best[objective] == work


def test_zero_bubble_by_span_for_two_ranks():
    # ZB-H2 (Qi et al. 2024) has no bubble by span at p=2, m>=3, F=B=W: the oracle finds it,
    # while makespan keeps the one-unit start-up delay of rank 1.
    assert optimum(problem(2, 3, objective="span")) == 9
    assert optimum(problem(2, 3)) == 10


# ---- registry schedules are upper bounds ----

def as_split(schedule):
    """Fused BW -> B then W at once: a valid split order with the same times."""
    return Schedule.from_lists(schedule.name, [
        [x for op in ops for x in ([("B", op.stage, op.mb), ("W", op.stage, op.mb)] if op.kind == "BW" else [op])]
        for ops in schedule.ranks
    ])


REGISTRY_PROBLEMS = [
    problem(2, 2), problem(2, 4, comm=0.5), problem(3, 3, F=1, B=2, W=1), problem(4, 2),
    problem(2, 3, F=[1, 2], B=[2, 2], W=[1, 2], objective="span"),
    problem(2, 2, v=2, placement="v"), problem(2, 2, v=2), problem(3, 3, limit=4),
    problem(2, 4, F=2, B=2, W=1, static=1, limit=6, objective="span"),
]


@pytest.mark.parametrize("prob", REGISTRY_PROBLEMS)
def test_registry_schedules_are_no_better(prob):
    best = optimum(prob)
    checked = 0
    for name, spec in S.REGISTRY.items():
        if spec.why_not(prob) is not None or not spec.synchronous:  # (the optimum is over synchronous orders)
            continue
        t = simulate(prob, as_split(spec.build(prob)))
        if t.fits:
            checked += 1
            assert t.objective_value() >= best - TOL, name
    assert checked > 0


# ---- memory limits ----

@pytest.mark.parametrize("m", [1, 3])
def test_one_activation_on_one_rank_is_sequential(m):
    # static + one F: every microbatch must run F, B, W before the next F: total work.
    prob = problem(1, m, F=1, B=2, W=3, static=5, limit=7)
    assert optimum(prob) == m * 6
    _, orders = exhaustive_optimum(prob)
    assert orders[0] == [(k, 0, i) for i in range(m) for k in "FBW"]


@pytest.mark.parametrize("p,m", [(2, 2), (3, 2), (2, 3)])
def test_one_activation_per_rank_runs_microbatches_one_at_a_time(p, m):
    # Each rank holds one activation: microbatch i+1 enters when rank 0 finished W of i, which
    # waits for the whole chain F...F B...B through the p ranks: m (p (F + B) + W) in all.
    F, B, W = 1, 2, 1
    tight = problem(p, m, F, B, W, static=3, limit=5)
    assert optimum(tight) == m * (p * (F + B) + W)
    assert optimum(tight) > optimum(problem(p, m, F, B, W, static=3)) + TOL  # the limit costs time


def test_a_limit_between_strictly_increases_the_optimum():
    free = optimum(problem(2, 4))
    one_and_a_half = optimum(problem(2, 4, limit=3))  # F then B leave 1: a second F fits (3), a third not
    tight = optimum(problem(2, 4, limit=2))
    assert free < one_and_a_half < tight


# ---- span where running everything as early as possible is optimal ----

def test_span_with_nothing_delayed():
    # p=2, m=4, F=B=W=1: rank 1 runs without a gap from its first F (span 12 = its work) and
    # rank 0 too, so the span is the work of one rank; the makespan adds rank 1's start (1).
    span_value, orders = exhaustive_optimum(problem(2, 4, objective="span"))
    assert span_value == 12
    t = simulate(problem(2, 4), Schedule.from_lists("o", [orders[0], orders[1]]))
    assert t.rank_span == (12, 12) and all(b == 12 for b in t.busy)
    assert optimum(problem(2, 4)) == 13


# ---- the budget ----

def test_budget_exceeded_raises_instead_of_guessing():
    hard = problem(4, 6, F=[1, 2, 3, 1], B=[2, 2, 3, 2], W=[1, 2, 1, 2], comm=0.5, limit=5)
    with pytest.raises(BudgetExceeded, match="not proven optimal"):
        exhaustive_optimum(hard, time_budget=0.0)


# ---- span: as soon as possible, and over every timing ----

def span_problems(seed=7, count=12):
    """Seeded tiny span problems, memory from just feasible to none, W often small."""
    rng = random.Random(seed)
    shapes = [(2, 2, 1), (3, 1, 1), (3, 2, 1), (2, 1, 2), (4, 1, 1), (1, 2, 2)]
    out = []
    for k in range(count):
        p, m, v = shapes[k % len(shapes)]
        n = p * v

        def costs(choices):
            return [rng.choice(choices) for _ in range(n)]

        prob = Problem.parse(dict(
            ranks=p, microbatches=m, chunks=v, placement=rng.choice(["loop", "v"]),
            costs=dict(F=costs([1, 2, 3]), B=costs([1, 2, 3]), W=costs([0.5, 1, 3])), comm=rng.choice([0, 0.5]),
            memory=dict(F=1, B=-rng.choice([0.5, 1])), objective="span",
        ))
        need = max(prob.min_memory(r) for r in range(p))
        room = rng.choice([None, 0, 1, 2])
        if room is not None:
            prob = prob.with_changes(memory={"limit": need + room})
        out.append(pytest.param(prob, id=f"{k}-p{p}m{m}v{v}-room{room}"))
    return out


def every_order(prob):
    """Every per-rank order of the split ops that fits the memory limit (tiny problems only)."""
    n, m = prob.n_stages, prob.microbatches

    def before(op):
        k, s, i = op
        if k == "F":
            return {("F", t, i) for t in range(s)}
        if k == "B":
            return {("F", t, i) for t in range(s + 1)} | {("B", t, i) for t in range(s + 1, n)}
        return {("B", s, i)}

    def orders(r):
        mine = [(k, s, i) for k in "FBW" for s in prob.rank_stages[r] for i in range(m)]
        out = []

        def extend(prefix, done, level):
            if len(prefix) == len(mine):
                out.append(list(prefix))
            for op in mine:
                if op not in done and all(d in done or prob.stage_rank[d[1]] != r for d in before(op)):
                    new = level + prob.mem[op[0]][op[1]]
                    if op[0] == "F" and prob.memory_limit and new > prob.memory_limit[r] + TOL:
                        continue
                    extend(prefix + [op], done | {op}, new)

        extend([], frozenset(), prob.static_memory[r])
        return out

    return itertools.product(*(orders(r) for r in range(prob.ranks)))


def lp_span(prob, orders):
    """The least span of ``orders`` over every timing, as a linear program (PuLP + CBC): start
    times free, each rank's order kept, inputs waited for (comm across ranks)."""
    import warnings

    import pulp

    n, comm, rank = prob.n_stages, prob.comm, prob.stage_rank
    lp = pulp.LpProblem("span", pulp.LpMinimize)
    T = lp.add_variable("T")
    x = {op: lp.add_variable(f"x_{op[0]}_{op[1]}_{op[2]}", lowBound=0) for ops in orders for op in ops}
    dur = {op: prob.cost[op[0]][op[1]] for op in x}
    lp += T
    for ops in orders:
        for a, b in zip(ops, ops[1:]):
            lp += x[b] >= x[a] + dur[a]
        lp += x[ops[-1]] + dur[ops[-1]] - x[ops[0]] <= T
    for k, s, i in x:
        ins = [("F", s - 1, i)] if k == "F" and s else []
        ins += [("F", s, i)] + ([("B", s + 1, i)] if s + 1 < n else []) if k == "B" else []
        ins += [("B", s, i)] if k == "W" else []
        for d in ins:
            lp += x[(k, s, i)] >= x[d] + dur[d] + (comm if rank[d[1]] != rank[s] else 0)
    with warnings.catch_warnings():  # PuLP 3.3 marks its bundled CBC deprecated for 4.0
        warnings.simplefilter("ignore", DeprecationWarning)
        lp.solve(pulp.PULP_CBC_CMD(msg=False))
    assert pulp.LpStatus[lp.status] == "Optimal"
    return T.value()


@pytest.mark.parametrize("prob", span_problems())
def test_span_over_every_timing(prob):
    """The oracle's span optimum is over as-soon-as-possible timings (as the simulator runs
    schedules); the least span over every timing of every order (a rank may start late on
    purpose) is no larger, and span_with_delays (maximum mean cycle) agrees with an LP."""
    asap = optimum(prob)
    assert asap == pytest.approx(brute_force(prob, "span"), abs=TOL)
    best, checked = math.inf, 0
    for orders in every_order(prob):
        value = span_with_delays(prob, orders)
        if value is None:
            continue  # deadlock
        best = min(best, value)
        if checked < 4 and (checked == 0 or value < best + TOL):  # the first, and new bests
            assert value == pytest.approx(lp_span(prob, orders), abs=1e-6)
            checked += 1
    assert best <= asap + TOL


def test_an_order_may_span_less_with_a_late_start():
    """p=2, m=2, F 2 | 1, B 1, W 1 | 3. With rank 1 running F F B B W W, as soon as possible its
    F(1, 0) starts at 2 and waits for F(1, 1)'s input until 4: span 11 (2 .. 13). Started at 3
    instead, it ends at 13 all the same: span 10. Another order reaches 10 as soon as possible,
    which is the oracle's optimum (over as-soon-as-possible timings)."""
    prob = problem(2, 2, F=[2, 1], B=1, W=[1, 3], objective="span")
    rank0 = [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("W", 0, 0), ("B", 0, 1), ("W", 0, 1)]
    rank1 = [("F", 1, 0), ("F", 1, 1), ("B", 1, 0), ("B", 1, 1), ("W", 1, 0), ("W", 1, 1)]
    assert replay(prob, {0: rank0, 1: rank1}, "span") == (11, True)
    assert span_with_delays(prob, [rank0, rank1]) == 10
    assert lp_span(prob, [rank0, rank1]) == pytest.approx(10, abs=1e-6)
    value, orders = exhaustive_optimum(prob)
    assert value == 10 and span_with_delays(prob, orders) == 10


# ---- recompute policies: the search against the enumeration of every policy and order ----

def with_recompute(p, m, limit, *, v=1, selective=True, objective="makespan", keep=0.1, comm=0.1):
    """F allocates 1 (B frees 0.6, W the rest); R restores all but ``keep`` in 0.8, S all but 0.5 in 0.3."""
    recompute = dict(time=0.8, keep=keep, **({"selective": dict(time=0.3, keep=0.5)} if selective else {}))
    return Problem.parse(dict(ranks=p, microbatches=m, chunks=v, placement="v" if v == 2 else "loop",
                              costs=dict(F=1, B=1.5, W=0.7), comm=comm, objective=objective,
                              memory=dict(F=1, B=-0.6, limit=limit), recompute=recompute))


@pytest.mark.parametrize("p, m, v, limit, selective, objective", [
    (2, 2, 1, 1.0, False, "makespan"), (2, 2, 1, 1.0, True, "span"), (2, 2, 1, 1.5, True, "makespan"),
    (2, 2, 1, 1.2, False, "span"), (2, 1, 2, 1.2, True, "makespan"), (2, 1, 2, 1.6, True, "span"),
])
def test_the_search_with_policies_finds_the_enumerated_optimum(p, m, v, limit, selective, objective):
    """With recompute policies the search agrees with ``policy_optimum`` (every policy per (stage,
    microbatch) and every order, judged by schedc's simulator), and its orders, R and S included,
    replay to the value it claims and fit."""
    from tests.exhaustive import policy_optimum

    prob = with_recompute(p, m, limit, v=v, selective=selective, objective=objective)
    truth, _ = policy_optimum(prob)
    value, orders = exhaustive_optimum(prob, policies=("R", "S") if selective else ("R",), time_budget=60)
    assert value == pytest.approx(truth, abs=TOL)
    got, fits = replay(prob, orders, objective)
    assert fits and got == pytest.approx(value, abs=TOL)


def test_policies_are_chosen_where_the_limit_needs_them():
    """At a limit of one whole activation and a keep, two microbatches can only overlap with
    recompute: the optimum with policies is below the one without, and uses them."""
    prob = with_recompute(2, 3, 1.2, selective=False)
    without, _ = exhaustive_optimum(prob, time_budget=60)
    value, orders = exhaustive_optimum(prob, policies=("R",), time_budget=60)
    assert value < without - TOL
    assert any(k == "R" for ops in orders.values() for k, _, _ in ops)


def test_below_returns_nothing_when_no_schedule_is_better():
    prob = with_recompute(2, 2, 1.0, selective=False)
    best, _ = exhaustive_optimum(prob, policies=("R",))
    assert exhaustive_optimum(prob, policies=("R",), below=best) == (best, None)
    value, orders = exhaustive_optimum(prob, policies=("R",), below=best + 0.5)
    assert value == pytest.approx(best, abs=TOL) and orders is not None
