"""Periodic schedules: one pattern of ops repeated every period, searched by CP-SAT (OR-Tools,
optional: ``pip install ".[cpsat]"``), for measuring the steady state under a memory limit
(``benchmarks/periodic.py``) and as a start for ``solve`` where the steady state is most of the
schedule.

A periodic schedule with period P and k slots runs op (kind, stage) of microbatch i = q k + j at
``offset(j, kind, stage) + q P``: every k microbatches the same pattern again, each (slot, stage)
with one policy (kept, or recomputed with R or S before its backward). ``plan`` searches the offsets
and policies for one period at a time (offload is not searched, nor data-parallel syncs, which run
once per step):

- the data edges (F down the stages, B up, W after B, a recompute after F and before B), with the
  problem's link latency between ranks;
- one op at a time per rank, on the circle of length P (each op's phase and its copy one period on
  may not overlap another's);
- the memory limit, exact on the circle: an activation held for a length L from phase a covers
  every phase floor(L / P) times and once more on the arc from a of length L mod P; the
  simulator's rule (an allocation counts from its op's start, a free from its op's end): F holds
  what its policy keeps from its start to its B's end, a recompute brings back the rest from its
  start, and what W frees stays from B's end to W's end.

Durations are rounded up to 1/1000 of the time unit and memory up to a millionth of the unit, so a
plan found holds with the real costs. ``check`` verifies a plan without CP-SAT (edges, lanes, the
periodic memory sampled at every event), so a modelling error shows. The objective: the least
overflow of the room (so a pattern is found even where none fits), then the recompute time, then
one microbatch's life (its first start to its last end).

``unrolled`` cuts the periodic schedule to the problem's microbatches (each rank's ops in the order
of their planned starts, which the simulator times as early as that order allows, so its fit is
judged there, not assumed); it pays the fill and drain the pattern leaves idle. ``seed`` makes it a
start for the search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, producers
from schedc.simulate import Timeline, simulate
from schedc.solvers.search.mixed import polished, relax

TICKS = 1000  # time steps per unit of time
MEM = 10**6  # memory steps per unit of memory


@dataclass
class Plan:
    period: float  # the pattern's length (time units), holding ``slots`` microbatches
    slots: int
    start: dict[tuple[int, Kind, int], float]  # (slot, kind, stage) -> offset, for the ops present
    policy: dict[tuple[int, int], Kind | None]  # (slot, stage) -> R, S or None (kept)
    overflow: float  # the most the pattern holds beyond a rank's room (0: it fits)
    status: str


class NoPattern(Exception):
    """CP-SAT proved that no pattern of the period exists within the holds asked for."""


def _ticks(x: float) -> int:
    return int(math.ceil(x * TICKS - 1e-9))


def _latency(problem: Problem, a: int, b: int) -> float:
    """The link's latency from stage a to stage b (none on one rank)."""
    return problem.comm if problem.stage_rank[a] != problem.stage_rank[b] else 0.0


def _needs(problem: Problem, op: Op, where=None) -> list[tuple[Op, float]]:
    """What ``op`` waits for (``producers``, the rule every pass uses: ``where`` the ops present,
    None for a schedule that keeps every activation), each with the latency after its end."""
    return [(d, _latency(problem, d.stage, op.stage)) for d in producers(op, problem.pipeline_stages, where)]


def segments(problem: Problem, s: int, policy: Kind | None) -> list[tuple[float, tuple[Kind, str], tuple[Kind, str]]]:
    """What one microbatch holds at stage s: (level, (op, 'start' or 'end') it holds from, to)."""
    a, mW = problem.mem[Kind.F][s], -problem.mem[Kind.W][s]
    out = [(mW, (Kind.B, "end"), (Kind.W, "end"))]
    if policy is None:
        return out + [(a, (Kind.F, "start"), (Kind.B, "end"))]
    keep = problem.delta(Kind.F, s, policy)
    return out + [(keep, (Kind.F, "start"), (Kind.B, "end")), (a - keep, (policy, "start"), (Kind.B, "end"))]


def plan(problem: Problem, period: float, slots: int = 1, seconds: float = 60.0, workers: int = 8,
         hint: Plan | None = None, policies: bool = True,
         holds: dict[int, tuple[float, float]] | None = None, w_after_b: tuple[int, ...] = (),
         first_fit: bool = False) -> Plan | None:
    """CP-SAT's best periodic pattern of ``period`` (time units per ``slots`` microbatches) within
    ``seconds``, None where it finds none. ``policies``: the recompute kinds may be chosen (else
    every stage keeps its activation). ``holds``: per stage, the least and most time from the start
    of each slot's F to the start of its B (how deep the pattern runs; ``holds_of``). ``w_after_b``:
    stages whose W starts as its B ends (no W of theirs is pending at a later backward). Raises
    ``NoPattern`` where CP-SAT proves there is none (the room never makes the model infeasible:
    the overflow is minimised, so only the lanes, the edges and the holds can). ``first_fit``: stop
    at the first pattern found that fits (its recompute and life are not minimised then)."""
    from ortools.sat.python import cp_model

    n, sr, cost = problem.n_stages, problem.stage_rank, problem.cost
    P = _ticks(period)
    recs = list(problem.recomputes) if policies else []
    life = sum(_ticks(cost[k][s]) for s in range(n) for k in (Kind.F, Kind.B, Kind.W) + tuple(recs))
    life += 2 * sum(_ticks(_latency(problem, s, s + 1)) for s in range(n - 1))
    horizon = 2 * life + 2 * P + sum(_ticks(hi) for _, hi in (holds or {}).values())  # room for the holds asked
    wraps = horizon // P + 1
    cp = cp_model.CpModel()
    room = problem.activation_room
    lanes: list[list] = [[] for _ in range(problem.ranks)]
    arcs: list[list] = [[] for _ in range(problem.ranks)]  # (interval, level)
    whole: list[list] = [[] for _ in range(problem.ranks)]  # (level, full turns)
    at: dict[tuple[int, Kind, int], tuple] = {}  # -> (start, phase, duration, present)
    chosen: dict[tuple[int, int], list] = {}

    def phase_of(x, name: str):
        ph, k = cp.new_int_var(0, P - 1, "p" + name), cp.new_int_var(0, wraps + 1, "k" + name)
        cp.add(x == ph + P * k)
        return ph

    for j in range(slots):
        for s in range(n):
            lits = [cp.new_bool_var(f"u{j},{s},{k.value}") for k in recs]
            keep_lit = cp.new_bool_var(f"kept{j},{s}")
            cp.add_exactly_one([keep_lit] + lits)
            chosen[j, s] = [(None, keep_lit)] + list(zip(recs, lits))
            for kind, lit in [(Kind.F, None), (Kind.B, None), (Kind.W, None)] + list(zip(recs, lits)):
                d = _ticks(cost[kind][s])
                x = cp.new_int_var(0, horizon, f"o{j},{kind.value},{s}")
                ph = phase_of(x, f"{j},{kind.value},{s}")
                for shift in (0, P):
                    if lit is None:
                        lanes[sr[s]].append(cp.new_interval_var(ph + shift, d, ph + shift + d, ""))
                    else:
                        lanes[sr[s]].append(cp.new_optional_interval_var(ph + shift, d, ph + shift + d, lit, ""))
                if lit is not None:
                    cp.add(x == 0).only_enforce_if(~lit)
                at[j, kind, s] = (x, ph, d, lit)
        for s in range(n):
            for kind in (Kind.F, Kind.B, Kind.W, *recs):  # what every policy's op needs
                x, _, _, lit = at[j, kind, s]
                for d, lat in _needs(problem, Op(kind, s, 0)):
                    y, _, dy, _ = at[j, d.kind, d.stage]
                    c = cp.add(x >= y + dy + _ticks(lat))
                    if lit is not None:
                        c.only_enforce_if(lit)
            for k, lit in chosen[j, s][1:]:  # B after its recompute
                x, y, dy = at[j, Kind.B, s][0], at[j, k, s][0], at[j, k, s][2]
                cp.add(x >= y + dy).only_enforce_if(lit)
            for pol, plit in chosen[j, s]:
                for level, (k0, e0), (k1, e1) in segments(problem, s, pol):
                    lv = int(math.ceil(level * MEM - 1e-9))
                    if lv <= 0:
                        continue
                    x0, ph0, d0, _ = at[j, k0, s]
                    x1, _, d1, _ = at[j, k1, s]
                    begin = x0 + (d0 if e0 == "end" else 0)
                    end = x1 + (d1 if e1 == "end" else 0)
                    bph = ph0 if e0 == "start" else phase_of(begin, f"b{j},{s},{k0.value}{level}")
                    turns, rest = cp.new_int_var(0, wraps, ""), cp.new_int_var(0, P - 1, "")
                    cp.add(end - begin == P * turns + rest).only_enforce_if(plit)
                    cp.add(turns == 0).only_enforce_if(~plit)
                    cp.add(rest == 0).only_enforce_if(~plit)
                    for shift in (0, P):
                        e = cp.new_int_var(0, 3 * P, "")
                        cp.add(e == bph + shift + rest)
                        arcs[sr[s]].append((cp.new_optional_interval_var(bph + shift, rest, e, plit, ""), lv))
                    whole[sr[s]].append((lv, turns))
        if j:
            cp.add(at[j, Kind.F, 0][0] >= at[j - 1, Kind.F, 0][0])
    cp.add(at[0, Kind.F, 0][0] == 0)
    for s in w_after_b:
        for j in range(slots):
            cp.add(at[j, Kind.W, s][0] == at[j, Kind.B, s][0] + at[j, Kind.B, s][2])
    for s, (lo, hi) in (holds or {}).items():
        for j in range(slots):
            cp.add_linear_constraint(at[j, Kind.B, s][0] - at[j, Kind.F, s][0], _ticks(lo), int(hi * TICKS))
    overs = []
    for r in range(problem.ranks):
        cp.add_no_overlap(lanes[r])
        if room is None:
            continue
        cap = int(math.floor(room[r] * MEM))
        full = sum(lv * (wraps + 1) for lv, _ in whole[r])  # all a rank's segments at their longest:
        # the domains below never bind, so that the room only adds overflow, never infeasibility
        base = cp.new_int_var(0, full, f"base{r}")
        cp.add(base == sum(lv * t for lv, t in whole[r]))
        peak = cp.new_int_var(0, full, f"peak{r}")
        everywhere = cp.new_interval_var(0, 3 * P, 3 * P, "")
        cp.add_cumulative([everywhere] + [iv for iv, _ in arcs[r]], [base] + [lv for _, lv in arcs[r]], peak)
        over = cp.new_int_var(0, full // (MEM // 1000) + 1, f"over{r}")  # in thousandths of a unit of memory
        cp.add(over * (MEM // 1000) >= peak - cap)
        overs.append(over)
    ends = cp.new_int_var(0, horizon + P, "life")
    cp.add_max_equality(ends, [at[j, Kind.W, s][0] + at[j, Kind.W, s][2] for j in range(slots) for s in range(n)])
    spent = sum(_ticks(cost[k][s]) * lit for (j, s), opts in chosen.items() for k, lit in opts if k is not None)
    most = 1 + slots * sum(_ticks(max(cost[k][s] for k in recs)) for s in range(n)) if recs else 1
    weight = (horizon + P + 1) * most  # above any recompute and life: the overflow first
    cp.minimize(weight * sum(overs) + (horizon + P + 1) * spent + ends)
    if hint is not None:
        for key, t in hint.start.items():
            if key in at:
                cp.add_hint(at[key][0], _ticks(t))
        for key, opts in chosen.items():
            if key in hint.policy:
                for k, lit in opts:
                    cp.add_hint(lit, k == hint.policy[key])
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = workers
    status = solver.solve(cp, _stop_at_fit(overs) if first_fit else None)
    if status == cp_model.INFEASIBLE:
        raise NoPattern(f"no pattern of period {period:g} with {slots} slot(s) within these holds")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    policy = {key: next(k for k, lit in opts if solver.value(lit)) for key, opts in chosen.items()}
    start = {(j, kind, s): solver.value(x) / TICKS for (j, kind, s), (x, _, _, lit) in at.items()
             if lit is None or solver.value(lit)}
    over = max([solver.value(x) / 1000 for x in overs], default=0.0)
    return Plan(P / TICKS, slots, start, policy, over, solver.status_name(status))


def _stop_at_fit(overs: list):
    """A CP-SAT solution callback that stops the search at the first solution in which every
    ``overs`` is 0 (a class made on use: OR-Tools is optional)."""
    from ortools.sat.python import cp_model

    class StopAtFit(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if all(self.value(x) == 0 for x in overs):
                self.stop_search()

    return StopAtFit()


def _worth(problem: Problem, p: Plan) -> tuple[float, float]:
    """How ``search`` ranks two patterns of one period: less overflow, then less recompute time."""
    return p.overflow, sum(problem.cost[k][s] for (_, s), k in p.policy.items() if k is not None)


def repeated(p: Plan, slots: int) -> Plan:
    """A one-slot pattern as a pattern of ``slots`` slots: slot j is slot 0 moved on by j periods,
    with its policies (the same schedule, a point of the larger model to start from)."""
    start = {(j, kind, s): t + j * p.period for j in range(slots) for (_, kind, s), t in p.start.items()}
    policy = {(j, s): k for j in range(slots) for (_, s), k in p.policy.items()}
    return Plan(p.period * slots, slots, start, policy, p.overflow, p.status)


def search(problem: Problem, period: float, slots: int = 1, seconds: float = 60.0, workers: int = 8,
           holds: dict[int, tuple[float, float]] | None = None, w_after_b: tuple[int, ...] = (),
           first_fit: bool = False) -> Plan | None:
    """``plan`` hinted with the pattern of the same period without the limit (a quarter of the
    seconds, every stage kept), which CP-SAT finds at once: from it, the memory limit's version.
    With several slots, the hint is the one-slot pattern of the same time per microbatch (found so,
    in half the seconds) repeated: CP-SAT finds no k-slot pattern on its own in minutes (1.5B and
    6.2B, p = 8, two or three slots), and from this one it only has to improve. The period is then
    rounded up to a whole number of ticks per slot (less than ``slots`` ticks more), so that the
    repeated pattern is a point of the k-slot model (a tick off, CP-SAT had to repair it and could
    end over the room where the one-slot pattern fitted), and where CP-SAT ends no better than it
    (less overflow first, then less recompute), the repeated pattern is the answer.
    ``first_fit``: as ``plan``'s (with several slots, for the one-slot pattern too)."""
    if slots > 1:
        each = math.ceil(_ticks(period) / slots) / TICKS
        try:
            one = search(problem, each, 1, seconds / 2, workers, holds, w_after_b, first_fit)
        except NoPattern:  # one slot may be too few for the holds where several are not
            one = None
        hint = None if one is None else repeated(one, slots)
        found = plan(problem, each * slots, slots, seconds, workers, hint=hint, holds=holds, w_after_b=w_after_b,
                     first_fit=first_fit)
        if hint is None or (found is not None and _worth(problem, found) <= _worth(problem, hint)):
            return found
        return replace(hint, status=f"one slot repeated ({hint.status}): CP-SAT found none better")
    free = plan(problem.with_changes(memory={"limit": None}), period, slots, seconds / 4, workers, policies=False,
                holds=holds, w_after_b=w_after_b)  # (a first pattern here makes a poor hint)
    return plan(problem, period, slots, seconds, workers, hint=free, holds=holds, w_after_b=w_after_b,
                first_fit=first_fit)


def holds_of(timeline, slack: float, around: int = 4) -> dict[int, tuple[float, float]]:
    """Per stage, how long a schedule's middle microbatches (``around`` either side of m / 2) run
    from their F's start to their B's start, widened by ``slack`` either way: ``plan``'s holds for a
    pattern as deep as that schedule."""
    times = timeline.op_times()  # op -> (rank, start, end)
    m, n = timeline.problem.microbatches, timeline.problem.n_stages
    mids = range(max(0, m // 2 - around), min(m, m // 2 + around))
    out = {}
    for s in range(n):
        held = [times[Op(Kind.B, s, i)][1] - times[Op(Kind.F, s, i)][1] for i in mids]
        out[s] = (max(0.0, min(held) - slack), max(held) + slack)
    return out


def _timed(problem: Problem, p: Plan, count: int) -> list[tuple[float, float, Op]]:
    """(start, end, op) of the periodic schedule's microbatches 0 .. count - 1 (planned times)."""
    out = []
    for i in range(count):
        j, q = i % p.slots, i // p.slots
        for (jj, kind, s), t in p.start.items():
            if jj == j:
                out.append((t + q * p.period, t + q * p.period + problem.cost[kind][s], Op(kind, s, i)))
    return out


def check(problem: Problem, p: Plan, eps: float = 1e-6) -> list[str]:
    """What the plan breaks, found without CP-SAT (empty: nothing): each op after what it needs,
    one op at a time per rank, and, over enough microbatches that the middle one sees every
    microbatch it overlaps, every rank's level at each event of the middle periods within its room."""
    life = max(t for t in p.start.values()) + max(max(row) for row in problem.cost.values() if row) + p.period
    turns = int(math.ceil(life / p.period)) + 1
    count = p.slots * (2 * turns + 1)
    ops = _timed(problem, p, count)
    begin = {op: a for a, _, op in ops}
    end = {op: e for _, e, op in ops}
    pol = {(i, s): p.policy[i % p.slots, s] for i in range(count) for s in range(problem.n_stages)}
    wrong = []
    for a, _, op in ops:
        for d, lat in _needs(problem, op, begin):
            if a + eps < end[d] + lat:
                wrong.append(f"{op} starts before {d.kind.value}{op.mb}@{d.stage} ends (+ {lat:g})")
    by_rank: list[list] = [[] for _ in range(problem.ranks)]
    for a, e, op in ops:
        by_rank[problem.stage_rank[op.stage]].append((a, e, op))
    for r, lst in enumerate(by_rank):
        lst.sort(key=lambda x: x[0])
        for (a0, e0, o0), (a1, _, o1) in zip(lst, lst[1:]):
            if a1 + eps < e0:
                wrong.append(f"rank {r}: {o1} starts before {o0} ends")
    room = problem.activation_room
    if room is not None:
        lo, hi = turns * p.period, (turns + 1) * p.period  # every microbatch alive there is in the window
        for r in range(problem.ranks):
            events = []
            for i in range(count):
                for s in problem.rank_stages[r]:
                    for level, (k0, e0), (k1, e1) in segments(problem, s, pol[i, s]):
                        x0 = (begin if e0 == "start" else end)[Op(k0, s, i)]
                        x1 = (begin if e1 == "start" else end)[Op(k1, s, i)]
                        events += [(x0, 1, level), (x1, 0, -level)]
            # frees at an instant before allocations (an instant up to float noise: times are sums of periods)
            events.sort(key=lambda x: (round(x[0], 6), x[1]))
            level = 0.0
            for t, _, delta in events:
                level += delta
                if lo <= t < hi and level > room[r] + 1e-6 * max(1.0, room[r]):
                    wrong.append(f"rank {r}: holds {level:g} at {t:g}, room {room[r]:g}")
                    break
    return wrong


def unrolled(problem: Problem, p: Plan, name: str = "periodic") -> Schedule:
    """The periodic schedule cut to the problem's microbatches: each rank's ops in the order of their
    planned starts."""
    ranks: list[list] = [[] for _ in range(problem.ranks)]
    for a, _, op in sorted(_timed(problem, p, problem.microbatches), key=lambda x: x[0]):
        ranks[problem.stage_rank[op.stage]].append(op)
    return Schedule.from_lists(name, ranks)


def seed(problem: Problem, p: Plan) -> Timeline | None:
    """The plan unrolled for the problem's microbatches as a start for ``schedc solve --start``:
    the unrolled order as it is, relaxed (``mixed.relax``) and with its W re-placed
    (``mixed.polished``), the shortest of them that fits in the simulator (its timeline); None where
    none fits. The pattern's steady state is what it brings: its fill and drain are the plain
    unroll's."""
    order = unrolled(problem, p)
    best = None
    for schedule in (order, relax(problem, order), *polished(problem, order)):
        t = simulate(problem, schedule)
        if t.fits and (best is None or t.objective_value() < best.objective_value()):
            best = t
    return best


def busiest_work(problem: Problem) -> float:
    """The most F, B and W work per microbatch on one rank: no period is shorter."""
    c = problem.cost
    return max(sum(c[k][s] for s in stages for k in (Kind.F, Kind.B, Kind.W)) for stages in problem.rank_stages)


START_STAGES = 4  # ``start``: only where the pattern holds at most this many stages (see there)
START_PERIOD = 1.1  # ``start``'s period, in the busiest rank's work (F, B and W) per microbatch


def start(problem: Problem, seconds: float) -> Timeline | None:
    """A start for ``solve``'s search where the steady state is most of the schedule and the memory
    limit forces recompute into it: a one-slot pattern (one CP-SAT worker, within ``seconds``) of
    period ``START_PERIOD`` times the busiest rank's work per microbatch, unrolled (``seed``: its
    timeline); None where the problem is not of that kind or no pattern fits.

    Measured (docs/results.md, "Which side is loose"): on the V with two ranks at half of 1F1B's
    memory, `solve` from this start ends 2-4 % shorter than from its own warm start (1.5B, m = 8:
    397.0 against 405.5), whose orders hold a microbatch more and pay full recomputes; there the
    first pattern that fits at this period takes about 2.5 s. On the V with three and four ranks
    (six and eight stages) the unrolled pattern's fill and drain made it 5-25 % longer than the
    warm start wherever measured, and on eight ranks (16 stages) its search takes minutes: hence
    ``START_STAGES``. Gradient syncs, sequence chunks and several pipelines are outside the model
    (offload is not searched: the start keeps or recomputes)."""
    if (problem.n_stages > START_STAGES or not problem.recomputes or problem.activation_room is None
            or problem.data_parallel is not None or problem.replicas is not None
            or problem.tied is not None or problem.seq_chunks > 1 or problem.microbatches < 2 * problem.ranks):
        return None
    try:
        from ortools.sat.python import cp_model  # noqa: F401  (whether it loads here)
    except ImportError:
        return None
    try:
        found = search(problem, START_PERIOD * busiest_work(problem), seconds=seconds, workers=1, first_fit=True)
    except NoPattern:
        return None
    if found is None or found.overflow > 0 or check(problem, found):
        return None
    return seed(problem, found)
