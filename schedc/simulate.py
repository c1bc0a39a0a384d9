"""simulate(problem, schedule) -> Timeline: the one judge of every schedule.

Each lane of each rank (compute, and copy where the schedule offloads) runs its ops in the
schedule's order. An op starts when its lane is free and every op it consumes has finished, plus
``problem.comm`` when the producer is on another rank, and a copy op no earlier than the end of the
compute op it is issued after (``Schedule.after``) (a list schedule: as soon as possible, never
reordered). With ``data_parallel``, each rank has a communication lane too: each stage's gradient
all-reduce AR, issued after its last weight gradient (``schedule.comm_lane``); the rank's step, so
the makespan and its span, ends with its last reduce. A collective (RS: a model stage's copies in
two-direction pipelines; TS: tied weights) runs on the communication lane of every rank of its
group, starting when all of them have come to it (``together``). An overlapped pair
(``Schedule.pairs``: a forward and the backward after it) starts when both may and both end after
``Problem.pair_time``. Memory: F allocates its stage's activation
(only what it keeps where its microbatch recomputes), a recompute or reload allocates what it
brings back, B, W and an offload free;
an allocation counts from its op's start, a free from its op's end (``Problem.delta``). On one lane
that is the order alone; with a copy lane, the lanes' events merge by time (a free before an
allocation at the same instant). A rank's memory is static memory plus the running sum plus its
working memory (``Problem.working_memory``: what an op needs while it runs), over the limit when
beyond float noise (``Problem.memory_tol``, relative to the problem's memory scale, so the verdict
does not depend on the unit).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from operator import itemgetter, sub

from schedc.bulk import bulk
from schedc.errors import ScheduleError
from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, chunk_producers, comm_lane, members, producers, stage_needs

_KIND_STAGE = itemgetter(0, 1)


@dataclass(frozen=True)
class MemoryViolation:
    rank: int
    op: Op  # the first op during which the rank is over its limit
    peak: float  # the rank's peak memory, static included
    limit: float

    @property
    def over(self) -> float:
        return self.peak - self.limit

    def __str__(self) -> str:
        return (
            f"rank {self.rank} exceeds its limit {self.limit:g} from {self.op} on, peaking at"
            f" {self.peak:g} ({self.over:g} over)"
        )


@dataclass(frozen=True)
class RankTime:
    """Where the time of the rank that sets the objective (or of another rank, ``sets`` False) goes
    (``Timeline.rank_time``): its window (what the objective measures on it: its own span, or from 0
    to its step for the makespan) holds its passes (F, B, W, BW), its other compute ops (recompute:
    R, S, RG, SG), and idle. Idle is split by phase, at the rank's first stage (where microbatches
    enter it and, last, leave it): the warm-up, until the first microbatch has come back (its first
    backward there starts); the cool-down, once the last microbatch has entered (its last forward
    there has ended; the wait for reduces included); the steady state between them, where a rank
    that never idles runs at its work per microbatch, the steady state's own bound. Where that
    forward ends before that backward starts (GPipe's order) there is no steady state: the idle
    before the backward counts as warm-up, the rest as cool-down."""

    rank: int
    objective: str  # "span" or "makespan" (what ``window`` measures)
    window: tuple[float, float]
    work: float  # F, B, W and BW on its compute lane (an overlapped pair once)
    recompute: float  # its other compute ops: R, S, RG, SG
    warm_up: float
    steady: float
    cool_down: float
    sets: bool = True  # whether this rank sets the objective (``rank_time`` of another rank: False)

    @property
    def idle(self) -> float:
        return self.warm_up + self.steady + self.cool_down

    def __str__(self) -> str:
        who = f"sets the {self.objective}" if self.sets else f"over its {self.objective} window"
        return (f"rank {self.rank} {who}: work {self.work:g}"
                + (f", recompute {self.recompute:g}" if self.recompute else "")
                + f", idle {self.idle:g} (warm-up {self.warm_up:g}, steady {self.steady:g},"
                f" cool-down {self.cool_down:g})")

    def summary(self) -> dict:
        return {"rank": self.rank, "objective": self.objective, "window": list(self.window), "work": self.work,
                "recompute": self.recompute, "idle_warm_up": self.warm_up, "idle_steady": self.steady,
                "idle_cool_down": self.cool_down}


_PASSES = frozenset({Kind.F, Kind.B, Kind.W, Kind.BW})


@dataclass(frozen=True)
class Timeline:
    problem: Problem
    schedule: Schedule
    start: tuple[tuple[float, ...], ...]  # per rank, aligned with schedule.ranks (the compute lane)
    end: tuple[tuple[float, ...], ...]
    memory: tuple[tuple[float, ...], ...]  # per rank: activation memory after each compute op
    peak_activation: tuple[float, ...]  # per rank: the highest level plus working memory; static excluded
    violations: tuple[MemoryViolation, ...] = field(default=())
    copy_start: tuple[tuple[float, ...], ...] = ()  # per rank, aligned with schedule.copy (() without one)
    copy_end: tuple[tuple[float, ...], ...] = ()
    comm: tuple[tuple[Op, ...], ...] = ()  # per rank, its communication lane's ops (``comm_lane``; () without one)
    comm_start: tuple[tuple[float, ...], ...] = ()  # aligned with comm
    comm_end: tuple[tuple[float, ...], ...] = ()

    # ---- times ----
    @cached_property
    def busy(self) -> tuple[float, ...]:
        """Per rank, the time its compute lane runs (an overlapped pair once)."""
        if not self.schedule.pairs:
            return tuple(sum(map(sub, es, ss)) for ss, es in zip(self.start, self.end))
        out = []
        for r, (ss, es) in enumerate(zip(self.start, self.end)):
            paired = set(self.schedule.pairs[r])
            out.append(sum(e - s for op, s, e in zip(self.schedule.ranks[r], ss, es) if op not in paired))
        return tuple(out)

    @property
    def makespan(self) -> float:
        return max((es[-1] for es in (*self.end, *self.copy_end, *self.comm_end) if es), default=0.0)

    @property
    def rank_end(self) -> tuple[float, ...]:
        """Per rank, when its step may run: its last compute op's end, or its last reduce's."""
        return tuple(max(es[-1] if es else 0.0, cs[-1] if cs else 0.0)
                     for es, cs in zip(self.end, self.comm_end or ((),) * len(self.end)))

    @property
    def exposed_reduce(self) -> tuple[float, ...]:
        """Per rank, how long its step waits for its gradient all-reduces after its last compute op
        (0 where they end before it, or without data parallelism)."""
        return tuple(max(0.0, e - (es[-1] if es else 0.0)) for e, es in zip(self.rank_end, self.end))

    @property
    def rank_span(self) -> tuple[float, ...]:
        """Per rank, its own first op's start to its step (``rank_end``)."""
        return tuple(e - ss[0] if ss else 0.0 for ss, e in zip(self.start, self.rank_end))

    @property
    def span(self) -> float:
        return max(self.rank_span, default=0.0)

    @property
    def microbatches_run(self) -> int:
        """How many microbatches the schedule runs: the problem's, of every pipeline, of every round."""
        return self.problem.microbatches * self.problem.pipelines * self.schedule.rounds

    def round_ends(self) -> tuple[float, ...]:
        """Per round (``Schedule.rounds``), when its last op ends, on any lane."""
        m, ends = self.problem.microbatches, [0.0] * self.schedule.rounds
        for op, (_, _, e) in self.op_times().items():
            r = op.mb // m
            ends[r] = max(ends[r], e)
        return tuple(ends)

    @property
    def per_microbatch(self) -> float:
        """The steady-state time per microbatch (the ``steady`` objective). Synchronous: the
        makespan over the microbatches, iterations running back to back, each flushed.
        Asynchronous (``rounds`` R >= 3): the time from the end of the first round to the end of
        the last but one, over the microbatches in between; the first round's fill and the last's
        drain (where no later forward fills the bubbles) fall outside. The mean over those
        rounds: a schedule that repeats every round (2BW without latency) gives its period
        exactly; with latency 2BW's pattern can repeat only every few rounds, or settle after a
        few, and the mean over R - 2 rounds is then within the rounds' variation divided by R - 2
        of the limit. R = 2 has no round in between: the mean with both."""
        rounds, m = self.schedule.rounds, self.problem.microbatches * self.problem.pipelines
        if rounds == 1:
            return self.makespan / m
        ends = self.round_ends()
        if rounds == 2:
            return self.makespan / (2 * m)
        return (ends[-2] - ends[0]) / ((rounds - 2) * m)

    def objective_value(self, objective: str | None = None) -> float:
        objective = objective or self.problem.objective
        if objective == "steady":
            return self.per_microbatch
        return self.makespan if objective == "makespan" else self.span

    def rank_objective(self, objective: str | None = None) -> tuple[float, ...]:
        """Per rank, what it gives the objective: its step's time (``rank_end``, makespan and
        steady) or its own span; the rank with the largest sets the objective (copy lanes aside)."""
        if (objective or self.problem.objective) == "span":
            return self.rank_span
        return self.rank_end

    def idle(self, objective: str | None = None) -> tuple[float, ...]:
        """Per rank idle time within the objective's window (the makespan, or its own span; steady:
        per round of the problem's microbatches in the steady state)."""
        objective = objective or self.problem.objective
        if objective == "span":
            return tuple(sp - b for sp, b in zip(self.rank_span, self.busy))
        if objective == "steady" and not self.schedule.synchronous:
            m, rounds = self.problem.microbatches * self.problem.pipelines, self.schedule.rounds
            return tuple(self.per_microbatch * m - b / rounds for b in self.busy)
        return tuple(self.makespan - b for b in self.busy)

    def objective_rank(self, objective: str | None = None) -> int:
        """The rank that sets the objective: the largest ``rank_objective``, the lowest among ties."""
        per_rank = self.rank_objective(objective)
        return max(range(len(per_rank)), key=per_rank.__getitem__)

    def window(self, rank: int, objective: str | None = None) -> tuple[float, float]:
        """What the objective measures on ``rank``: its own span (from its first op), else from 0
        to its step (``rank_end``)."""
        ss = self.start[rank]
        return (ss[0] if ss and (objective or self.problem.objective) == "span" else 0.0), self.rank_end[rank]

    def rank_time(self, objective: str | None = None, rank: int | None = None) -> RankTime:
        """``RankTime`` of ``rank``, by default the rank that sets the objective (``objective_rank``;
        "steady" as the makespan)."""
        objective = "span" if (objective or self.problem.objective) == "span" else "makespan"
        per_rank = self.rank_objective(objective)
        r = self.objective_rank(objective) if rank is None else rank
        sets = self.problem.time_tol.ge(per_rank[r], max(per_rank))  # (a tie sets it too)
        ops, ss, es = self.schedule.ranks[r], self.start[r], self.end[r]
        if not ops:
            return RankTime(r, objective, (0.0, 0.0), 0.0, 0.0, 0.0, 0.0, 0.0, sets)
        window = self.window(r, objective)
        other = sum(e - s for op, s, e in zip(ops, ss, es) if op.kind not in _PASSES)
        first = min(op.stage for op in ops)
        first_b = min((s for op, s in zip(ops, ss) if op.kind in (Kind.B, Kind.BW) and op.stage == first),
                      default=window[1])
        last_f = max((e for op, e in zip(ops, es) if op.kind is Kind.F and op.stage == first), default=window[0])
        idle = {"warm": 0.0, "steady": 0.0, "cool": 0.0}
        at = window[0]  # the end of the work so far (an overlapped pair's ops overlap: the later end)
        for s, e in [*zip(ss, es), (window[1], window[1])]:
            if s > at:
                phase = "warm" if s <= first_b else "cool" if at >= last_f else "steady"
                idle[phase] += s - at
            at = max(at, e)
        return RankTime(r, objective, window, self.busy[r] - other, other,
                        idle["warm"], idle["steady"], idle["cool"], sets)

    def bubble_rate(self, objective: str | None = None) -> float:
        """Idle fraction of the rank-time the objective measures: 1 - busy / (p * T) (steady: per
        microbatch, the rank-time of one microbatch against the work of one)."""
        objective = objective or self.problem.objective
        work, length = sum(self.busy), self.objective_value(objective)
        if objective == "steady":
            work /= self.microbatches_run
        total = length * self.problem.ranks
        return 1.0 - work / total if total > 0 else 0.0

    # ---- memory ----
    @property
    def static_memory(self) -> tuple[float, ...]:
        """Per rank, the problem's static memory, and for an asynchronous schedule its second copy
        of the weights (``Problem.weight_copy``)."""
        return static_memory(self.problem, self.schedule)

    @property
    def peak_memory(self) -> tuple[float, ...]:
        return tuple(s + a for s, a in zip(self.static_memory, self.peak_activation))

    @property
    def fits(self) -> bool:
        return not self.violations

    @property
    def lanes(self) -> dict[str, tuple[tuple[Op, ...], ...]]:
        """lane -> per rank, its order: the schedule's lanes, then "comm" where the problem has one."""
        return {**self.schedule.lanes, **({"comm": self.comm} if self.comm else {})}

    def anchors(self) -> dict[Op, Op]:
        """op -> the compute op it is issued after: the copies (``Schedule.after``) and the reduces
        (``comm_lane``)."""
        return _lanes(self.problem, self.schedule)[1]

    def last_op(self, rank: int) -> Op:
        """The op that ends ``rank``'s step (``rank_end``): its last compute op, or its last reduce."""
        comm = self.comm[rank] if self.comm else ()
        if comm and self.comm_end[rank][-1] > self.end[rank][-1]:
            return comm[-1]
        return self.schedule.ranks[rank][-1]

    def lane_times(self) -> dict[str, tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]]]:
        """lane -> (start, end), per rank aligned with ``lanes[lane]``."""
        return {"compute": (self.start, self.end),
                **({"copy": (self.copy_start, self.copy_end)} if self.schedule.copy else {}),
                **({"comm": (self.comm_start, self.comm_end)} if self.comm else {})}

    def op_times(self) -> dict[Op, tuple[int, float, float]]:
        """op -> (rank, start, end), every lane's."""
        lanes = self.lanes
        return {
            op: (r, s, e)
            for lane, (starts, ends) in self.lane_times().items()
            for r, ops in enumerate(lanes[lane])
            for op, s, e in zip(ops, starts[r], ends[r])
        }

    def summary(self) -> dict:
        """Plain data for tables and --json."""
        p = self.problem
        return {
            "schedule": self.schedule.name,
            "problem": p.name,
            "objective": p.objective,
            "makespan": self.makespan,
            "span": self.span,
            "bubble_makespan": self.bubble_rate("makespan"),
            "bubble_span": self.bubble_rate("span"),
            "busy": list(self.busy),
            "idle": list(self.idle()),
            "peak_activation": list(self.peak_activation),
            "peak_memory": list(self.peak_memory),
            "memory_limit": list(p.memory_limit) if p.memory_limit else None,
            "fits": self.fits,
            "violations": [str(v) for v in self.violations],
            **({"exposed_reduce": list(self.exposed_reduce)} if self.comm else {}),
            **({} if self.schedule.synchronous else {
                "rounds": self.schedule.rounds, "per_microbatch": self.per_microbatch,
                "bubble_steady": self.bubble_rate("steady")}),
        }


@bulk
def simulate(problem: Problem, schedule: Schedule) -> Timeline:
    """Replay ``schedule`` on ``problem``. Raises ScheduleError for missing or duplicated ops
    and for deadlock; memory-limit violations are reported in the Timeline."""
    if not isinstance(problem, Problem) or not isinstance(schedule, Schedule):
        raise TypeError(f"simulate(problem, schedule) takes a Problem and a Schedule, got"
                        f" {type(problem).__name__} and {type(schedule).__name__}")
    where = schedule.check_complete(problem)
    lanes, anchors = _lanes(problem, schedule)
    orders = [ops for per_rank in lanes.values() for ops in per_rank]
    ops = [op for lane_ops in orders for op in lane_ops]
    index = {op: k for k, op in enumerate(ops)}
    paired = schedule.paired() if schedule.pairs else {}
    deps = dependencies(problem, ops, index, where, anchors, lanes.get("comm", ()), paired)
    start, end, pos = replay([[index[op] for op in lane_ops] for lane_ops in orders], deps,
                             durations(problem, ops, paired))
    stuck = [x for x, lane_ops in enumerate(orders) if pos[x] < len(lane_ops)]
    if stuck:
        deps = {op: [(ops[d], 0.0) for d, _ in waits] for op, waits in zip(ops, deps)}
        raise ScheduleError(f"{schedule.name}: deadlock: {_describe_wait(list(lanes), orders, pos, stuck, deps)}")
    p = problem.ranks
    for r, paired_ops in enumerate(schedule.pairs):  # a pair's backward starts with its forward
        at = {op: k for k, op in enumerate(schedule.ranks[r])}
        for op in paired_ops:
            start[r][at[op]] = start[r][at[op] - 1]
    times = {lane: (start[k * p:(k + 1) * p], end[k * p:(k + 1) * p]) for k, lane in enumerate(lanes)}
    return _timeline(problem, schedule, times, lanes.get("comm", ()))


def _lanes(problem: Problem, schedule: Schedule) -> tuple[dict[str, tuple[tuple[Op, ...], ...]], dict[Op, Op]]:
    """Every lane of every rank, each a sequential resource of ``replay`` (lane -> per rank its
    order: the schedule's compute and copy lanes, then the communication lanes ``comm_lane``
    derives), and op -> the compute op it is issued after (copies and reduces)."""
    lanes, anchors = dict(schedule.lanes), schedule.anchors()
    comm = comm_lane(problem, schedule)
    if comm:
        lanes["comm"] = tuple(tuple(op for op, _ in ops) for ops in comm)
        anchors.update((op, after) for ops in comm for op, after in ops)
    return lanes, anchors


def dependencies(problem: Problem, ops: list[Op], index: dict[Op, int], where,
                 anchors: dict[Op, Op], comm: tuple[tuple[Op, ...], ...] = (),
                 paired: dict[Op, Op] | None = None) -> list[list[tuple[int, float]]]:
    """Per op (by its index in ``ops``), the indices of the ops it waits for and the latency added
    after each one's end: its producers (``comm`` across ranks), for a copy op or a reduce the
    compute op it is issued after (``anchors``: ``_lanes``), for a collective what its members
    on other ranks wait for (``together``; ``comm`` is the communication lanes), and for the
    forward of an overlapped pair (``paired``: forward -> its backward) its backward's producers
    too: the pair starts when both may."""
    rank_of, depth, chunks, comm_latency = problem.stage_rank, problem.pipeline_stages, problem.seq_chunks, problem.comm
    joint = together(problem, comm, anchors) if comm else {}
    paired = paired or {}

    def latency(d: Op, op: Op) -> float:
        return 0.0 if rank_of[d.stage] == rank_of[op.stage] else comm_latency

    # (kind, stage) -> per need of its own microbatch: (the kinds that meet it ahead of the last, the
    # kind that meets it else, the stage, the latency): ``producers``' _met, looked up once
    rules: dict[tuple[Kind, int], tuple[tuple[tuple[Kind, ...], Kind, int, float], ...]] = {}
    out = []
    for op in ops:
        kind, s, i = op
        rule = rules.get((kind, s))
        if rule is None:
            rule = rules[kind, s] = tuple(
                ((kinds[:-1], kinds[-1]) if where is not None and len(kinds) > 1 else ((), usual))
                + (t, 0.0 if rank_of[t] == rank_of[s] else comm_latency)
                for kinds, usual, t in stage_needs(kind, s, depth))
        deps = []
        for ahead, met, t, lat in rule:
            for k in ahead:
                if (k, t, i) in where:
                    met = k
                    break
            deps.append((index[met, t, i], lat))  # (a plain tuple finds its Op in an index: equal, same hash)
        if chunks > 1:
            deps += [(index[d], 0.0) for d in chunk_producers(op, where, chunks)]
        if paired and op in paired:
            deps += [(index[d], latency(d, op)) for d in producers(paired[op], depth, where, chunks)]
        if anchors and op in anchors:
            deps.append((index[anchors[op]], latency(anchors[op], op)))
        if joint and op in joint:
            deps += [(index[d], 0.0) for d in joint[op]]
        out.append(deps)
    return out


def durations(problem: Problem, ops: list[Op], paired: dict[Op, Op]) -> list[float]:
    """Each op's duration on its lane: its cost; for an overlapped pair (``paired``: forward -> its
    backward) the pair's time (``Problem.pair_time``) on the forward and none on the backward, which
    ends with it."""
    if problem.sequence_chunks is not None:  # (no pairs with sequence chunks: Problem refuses costs.FB)
        return [problem.op_cost(*op) for op in ops]
    backs = set(paired.values())
    out = []
    for op in ops:
        if op in paired:
            out.append(problem.pair_time(op.stage, paired[op].kind, paired[op].stage))
        else:
            out.append(0.0 if op in backs else problem.cost[op.kind][op.stage])
    return out


def together(problem: Problem, comm: tuple[tuple[Op, ...], ...], anchors: dict[Op, Op]) -> dict[Op, list[Op]]:
    """Collective op -> what its members (each on another rank: ``Problem``) wait for: each one's
    issue point and the op before it on its lane, so that all members start together, when the last
    is ready."""
    before = {op: ops[k - 1] for ops in comm for k, op in enumerate(ops) if k}
    out: dict[Op, list[Op]] = {}
    for ops in comm:
        for op in ops:
            waits = [d for other in members(problem, op) for d in (anchors.get(other), before.get(other))
                     if d is not None]
            if waits:
                out[op] = waits
    return out


def replay(
    orders: list[list[int]], deps: list[list[tuple[int, float]]], dur: list[float], finish: list[float] | None = None
) -> tuple[list[list[float]], list[list[float]], list[int]]:
    """The list scheduling every schedule is judged by, over integer op ids: rank r runs the ops
    ``orders[r]`` in that order, each as soon as its rank is free and every producer ``(id,
    latency)`` in ``deps[op]`` has ended, plus the latency. Returns per rank the start and end
    times of the ops that ran and how many ran (fewer than the rank's list: a deadlock).
    ``finish``, where given, is a list of -1.0 per op that the replay fills in with each op's end
    (what ``resume`` goes on from)."""
    p = len(orders)
    finish = [-1.0] * len(dur) if finish is None else finish
    return resume(orders, deps, dur, finish, [[] for _ in range(p)], [[] for _ in range(p)], [0] * p)


def resume(
    orders: list[list[int]], deps: list[list[tuple[int, float]]], dur: list[float], finish: list[float],
    start: list[list[float]], end: list[list[float]], pos: list[int],
) -> tuple[list[list[float]], list[list[float]], list[int]]:
    """``replay`` on from a state where each rank r has run ``orders[r][:pos[r]]`` at the times
    ``start[r]`` and ``end[r]`` (``pos[r]`` of each) and ``finish`` holds every op's end (-1 for
    those not run): the same times as replaying from nothing, where that state is what the replay
    reaches. Fills in ``finish``, ``start``, ``end`` and ``pos`` and returns the last three."""
    p = len(orders)
    free = [es[-1] if es else 0.0 for es in end]
    waiting: dict[int, list[int]] = {}  # unfinished op -> ranks blocked on it
    ready = list(range(p))
    while ready:
        r = ready.pop()
        ks = orders[r]
        while pos[r] < len(ks):
            k = ks[pos[r]]
            t = free[r]
            blocked = -1
            for d, lat in deps[k]:
                done = finish[d]
                if done < 0:
                    blocked = d
                    break
                if done + lat > t:
                    t = done + lat
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(r)
                break
            t_end = t + dur[k]
            start[r].append(t)
            end[r].append(t_end)
            finish[k] = free[r] = t_end
            pos[r] += 1
            ready.extend(waiting.pop(k, ()))
    return start, end, pos


def back_to_back(problem: Problem, schedule: Schedule, steps: int) -> list[float]:
    """When each rank starts step k + 1 as soon as its own step k is done (no barrier between
    steps; the optimizer step takes no time): the time by which every rank has finished step k,
    for k = 1 .. ``steps``. Steps are copies of ``schedule``: each lane of a rank runs its ops of
    every step in order, each op as ``simulate`` would. The steady-state time per step is the limit
    of the differences; it lies between the span and the makespan of one step."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    where = schedule.check_complete(problem)
    by_lane, anchors = _lanes(problem, schedule)
    lanes = [ops for per_rank in by_lane.values() for ops in per_rank]
    ops = [op for lane_ops in lanes for op in lane_ops]
    n = len(ops)
    index = {op: k for k, op in enumerate(ops)}
    paired = schedule.paired() if schedule.pairs else {}
    one = dependencies(problem, ops, index, where, anchors, by_lane.get("comm", ()), paired)
    deps = [[(d + j * n, lat) for d, lat in one[k]] for j in range(steps) for k in range(n)]
    orders = [[index[op] + j * n for j in range(steps) for op in lane_ops] for lane_ops in lanes]
    dur = durations(problem, ops, paired) * steps
    start, end, pos = replay(orders, deps, dur)
    if any(pos[x] < len(ks) for x, ks in enumerate(orders)):
        simulate(problem, schedule)  # raises the deadlock, described
    per = [len(lane_ops) for lane_ops in lanes]
    return [max(end[x][(j + 1) * per[x] - 1] for x in range(len(lanes)) if per[x]) for j in range(steps)]


def with_times(problem: Problem, schedule: Schedule, start, end, copy_start=(), copy_end=(),
               comm_start=(), comm_end=()) -> Timeline:
    """A Timeline of ``schedule`` with given (e.g. measured) op times, aligned with
    ``schedule.ranks`` (and ``schedule.copy``, and the communication lane ``comm_lane`` derives
    where the problem has one); memory as in ``simulate``."""
    schedule.check_complete(problem)
    lanes, _ = _lanes(problem, schedule)
    times = {"compute": (start, end), "copy": (copy_start, copy_end), "comm": (comm_start, comm_end)}
    for lane, per_rank in lanes.items():
        starts, ends = times[lane]
        for r, ops in enumerate(per_rank):
            if r >= min(len(starts), len(ends)) or len(starts[r]) != len(ops) or len(ends[r]) != len(ops):
                given = len(starts[r]) if r < len(starts) else 0
                raise ScheduleError(f"{schedule.name}: rank {r} has {len(ops)} {lane} ops but {given} times")
    return _timeline(problem, schedule, {lane: times[lane] for lane in lanes}, lanes.get("comm", ()))


def _timeline(problem: Problem, schedule: Schedule, times: dict, comm: tuple) -> Timeline:
    """The Timeline of per-lane times (lane -> (start, end), per rank); ``comm`` the
    communication lane's ops."""
    as_tuples = {lane: (tuple(map(tuple, s)), tuple(map(tuple, e))) for lane, (s, e) in times.items()}
    (start, end), (copy_start, copy_end) = as_tuples["compute"], as_tuples.get("copy", ((), ()))
    comm_start, comm_end = as_tuples.get("comm", ((), ()))
    memory, peaks, violations = _memory(problem, schedule, start, end, copy_start, copy_end)
    return Timeline(
        problem=problem,
        schedule=schedule,
        start=start,
        end=end,
        memory=memory,
        peak_activation=peaks,
        violations=violations,
        copy_start=copy_start,
        copy_end=copy_end,
        comm=comm,
        comm_start=comm_start,
        comm_end=comm_end,
    )


def _describe_wait(lanes: list[str], orders, pos, stuck, deps) -> str:
    """Which lane waits on which op, and on which lane that op sits behind what."""
    p = len(orders) // len(lanes)
    lane_of = {op: x for x, ops in enumerate(orders) for op in ops}
    index = {op: k for ops in orders for k, op in enumerate(ops)}

    def name(x: int) -> str:
        return f"rank {x % p}" + (f" ({lanes[x // p]} lane)" if x >= p else "")

    parts = []
    for x in stuck:
        op = orders[x][pos[x]]
        blocker = next(d for d, _ in deps[op] if index[d] >= pos[lane_of[d]])
        bx = lane_of[blocker]
        parts.append(f"{name(x)} waits at {op} for {blocker} ({name(bx)}, behind its {orders[bx][pos[bx]]})")
    return "; ".join(parts)


def static_memory(problem: Problem, schedule: Schedule) -> tuple[float, ...]:
    """Per rank, the static memory ``schedule`` needs: the problem's, and for an asynchronous
    schedule one more copy of its stages' weights (the second version)."""
    if schedule.synchronous:
        return problem.static_memory
    return tuple(s + w for s, w in zip(problem.static_memory, problem.weight_copy))


def _memory(problem: Problem, schedule: Schedule, start, end, copy_start, copy_end):
    """Per rank: the activation level after each compute op, the peak activation (the highest
    level held, plus the rank's working memory) and the first op during which the level passes the
    rank's ``activation_room``. Each op's delta is ``Problem.delta`` under its (stage, microbatch)'s
    policy; an allocation counts from the op's start, a free from its end."""
    static, tol = static_memory(problem, schedule), problem.memory_tol
    room = problem.activation_room
    if room is not None and not schedule.synchronous:
        room = tuple(a - w for a, w in zip(room, problem.weight_copy))
    working, mem = problem.working_memory, problem.mem
    policy = schedule.policies() if problem.policies else {}

    def delta(op: Op) -> float:
        if policy or problem.sequence_chunks is not None:
            return problem.op_delta(op.kind, op.stage, op.mb, policy.get((op.stage, op.mb)))
        return mem[op.kind][op.stage]

    levels, peaks, violations = [], [], []
    by_kind_stage = not policy and problem.sequence_chunks is None and not schedule.copy
    for r, ops in enumerate(schedule.ranks):
        if by_kind_stage:  # one lane, each op's delta by its kind and stage: the levels at C speed
            deltas = {(kind, s): mem[kind][s] for kind in mem for s in problem.rank_stages[r]}
            after = tuple(accumulate(map(deltas.__getitem__, map(_KIND_STAGE, ops))))
            peak = max(0.0, max(after, default=0.0))  # (an op holds the higher of the levels before and after it)
            if room is None or not tol.gt(peak, room[r]):
                levels.append(after)
                peaks.append(peak + working[r])
                continue
        lanes = [(ops, start[r], end[r])] + ([(schedule.copy[r], copy_start[r], copy_end[r])] if schedule.copy else [])
        streams = [  # (when it counts, 0 for a free and 1 for an allocation, delta, op, on the compute lane)
            [(s if d > 0 else e, 1 if d > 0 else 0, d, op, lane == 0)
             for op, s, e in zip(lane_ops, ss, es) for d in (delta(op),)]
            for lane, (lane_ops, ss, es) in enumerate(lanes)
        ]
        # One lane: its order alone. Several: merged by time, a free before an allocation at one instant.
        events = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=lambda ev: ev[:2])
        level = peak = 0.0
        after = []
        first_over = None
        for _, _, d, op, on_compute in events:
            held = max(level, level + d)  # an allocation holds from its op's start, a free until its end
            level += d
            if on_compute:
                after.append(level)
            peak = max(peak, held)
            if room is not None and first_over is None and tol.gt(held, room[r]):
                first_over = op
        peak += working[r]
        levels.append(tuple(after))
        peaks.append(peak)
        if first_over is not None:
            violations.append(MemoryViolation(r, first_over, static[r] + peak, problem.memory_limit[r]))
    return tuple(levels), tuple(peaks), tuple(violations)
