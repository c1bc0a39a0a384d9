"""simulate(problem, schedule) -> Timeline: the one judge of every schedule.

Each rank runs its ops in the schedule's order. An op starts when its rank is free and every
op it consumes has finished, plus ``problem.comm`` when the producer is on another rank (a list
schedule: as soon as possible, never reordered). Memory follows the order alone: F allocates its
stage's activation, B and W free it; a rank's memory is static memory plus the running sum plus
its working memory (``Problem.working_memory``: what an op needs while it runs), over the limit
when beyond float noise (``Problem.memory_tol``, relative to the problem's memory
scale, so the verdict does not depend on the unit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schedc.errors import ScheduleError
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, producers


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
class Timeline:
    problem: Problem
    schedule: Schedule
    start: tuple[tuple[float, ...], ...]  # per rank, aligned with schedule.ranks
    end: tuple[tuple[float, ...], ...]
    memory: tuple[tuple[float, ...], ...]  # per rank: activation memory after each op
    peak_activation: tuple[float, ...]  # per rank: the highest level plus working memory; static excluded
    violations: tuple[MemoryViolation, ...] = field(default=())

    # ---- times ----
    @property
    def busy(self) -> tuple[float, ...]:
        return tuple(sum(e - s for s, e in zip(ss, es)) for ss, es in zip(self.start, self.end))

    @property
    def makespan(self) -> float:
        return max((es[-1] for es in self.end if es), default=0.0)

    @property
    def rank_span(self) -> tuple[float, ...]:
        """Per rank, its own first op's start to last op's end."""
        return tuple(es[-1] - ss[0] if ss else 0.0 for ss, es in zip(self.start, self.end))

    @property
    def span(self) -> float:
        return max(self.rank_span, default=0.0)

    def objective_value(self, objective: str | None = None) -> float:
        objective = objective or self.problem.objective
        return self.makespan if objective == "makespan" else self.span

    def idle(self, objective: str | None = None) -> tuple[float, ...]:
        """Per rank idle time within the objective's window (the makespan, or its own span)."""
        if (objective or self.problem.objective) == "makespan":
            return tuple(self.makespan - b for b in self.busy)
        return tuple(sp - b for sp, b in zip(self.rank_span, self.busy))

    def bubble_rate(self, objective: str | None = None) -> float:
        """Idle fraction of the rank-time the objective measures: 1 - busy / (p * T)."""
        total = self.objective_value(objective) * self.problem.ranks
        return 1.0 - sum(self.busy) / total if total > 0 else 0.0

    # ---- memory ----
    @property
    def peak_memory(self) -> tuple[float, ...]:
        return tuple(s + a for s, a in zip(self.problem.static_memory, self.peak_activation))

    @property
    def fits(self) -> bool:
        return not self.violations

    def op_times(self) -> dict[Op, tuple[int, float, float]]:
        """op -> (rank, start, end)."""
        return {
            op: (r, s, e)
            for r, ops in enumerate(self.schedule.ranks)
            for op, s, e in zip(ops, self.start[r], self.end[r])
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
        }


def simulate(problem: Problem, schedule: Schedule) -> Timeline:
    """Replay ``schedule`` on ``problem``. Raises ScheduleError for missing or duplicated ops
    and for deadlock; memory-limit violations are reported in the Timeline."""
    if not isinstance(problem, Problem) or not isinstance(schedule, Schedule):
        raise TypeError(f"simulate(problem, schedule) takes a Problem and a Schedule, got"
                        f" {type(problem).__name__} and {type(schedule).__name__}")
    where = schedule.check_complete(problem)
    ops = [op for rank_ops in schedule.ranks for op in rank_ops]
    index = {op: k for k, op in enumerate(ops)}
    start, end, pos = replay(
        [[index[op] for op in rank_ops] for rank_ops in schedule.ranks],
        dependencies(problem, ops, index, where),
        [problem.cost[op.kind][op.stage] for op in ops],
    )
    stuck = [r for r, ops_r in enumerate(schedule.ranks) if pos[r] < len(ops_r)]
    if stuck:
        deps = {op: [(d, 0.0) for d in producers(op, problem.n_stages, where)] for op in ops}
        raise ScheduleError(
            f"{schedule.name}: deadlock: {_describe_wait(schedule.ranks, pos, stuck, deps, where)}"
        )
    return _timeline(problem, schedule, start, end)


def dependencies(problem: Problem, ops: list[Op], index: dict[Op, int], where) -> list[list[tuple[int, float]]]:
    """Per op (by its index in ``ops``), its producers' indices and the latency added after each
    producer's end (``comm`` across ranks)."""
    rank_of = problem.stage_rank
    return [
        [(index[d], 0.0 if rank_of[d.stage] == rank_of[op.stage] else problem.comm)
         for d in producers(op, problem.n_stages, where)]
        for op in ops
    ]


def replay(
    orders: list[list[int]], deps: list[list[tuple[int, float]]], dur: list[float]
) -> tuple[list[list[float]], list[list[float]], list[int]]:
    """The list scheduling every schedule is judged by, over integer op ids: rank r runs the ops
    ``orders[r]`` in that order, each as soon as its rank is free and every producer ``(id,
    latency)`` in ``deps[op]`` has ended, plus the latency. Returns per rank the start and end
    times of the ops that ran and how many ran (fewer than the rank's list: a deadlock)."""
    p = len(orders)
    finish = [-1.0] * len(dur)
    start: list[list[float]] = [[] for _ in range(p)]
    end: list[list[float]] = [[] for _ in range(p)]
    free = [0.0] * p
    pos = [0] * p
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
    for k = 1 .. ``steps``. Steps are copies of ``schedule``: a rank runs its ops of every step in
    order, each op as ``simulate`` would. The steady-state time per step is the limit of the
    differences; it lies between the span and the makespan of one step."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    where = schedule.check_complete(problem)
    ops = [op for rank_ops in schedule.ranks for op in rank_ops]
    n = len(ops)
    index = {op: k for k, op in enumerate(ops)}
    one = dependencies(problem, ops, index, where)
    deps = [[(d + j * n, lat) for d, lat in one[k]] for j in range(steps) for k in range(n)]
    orders = [[index[op] + j * n for j in range(steps) for op in rank_ops] for rank_ops in schedule.ranks]
    dur = [problem.cost[op.kind][op.stage] for op in ops] * steps
    start, end, pos = replay(orders, deps, dur)
    if any(pos[r] < len(ks) for r, ks in enumerate(orders)):
        simulate(problem, schedule)  # raises the deadlock, described
    per = [len(rank_ops) for rank_ops in schedule.ranks]
    return [max(end[r][(j + 1) * per[r] - 1] for r in range(problem.ranks) if per[r]) for j in range(steps)]


def with_times(problem: Problem, schedule: Schedule, start, end) -> Timeline:
    """A Timeline of ``schedule`` with given (e.g. measured) op times, aligned with
    ``schedule.ranks``; memory follows the order, as in ``simulate``."""
    schedule.check_complete(problem)
    for r, ops in enumerate(schedule.ranks):
        if len(start[r]) != len(ops) or len(end[r]) != len(ops):
            raise ScheduleError(f"{schedule.name}: rank {r} has {len(ops)} ops but {len(start[r])} times")
    return _timeline(problem, schedule, start, end)


def _timeline(problem: Problem, schedule: Schedule, start, end) -> Timeline:
    memory, peaks, violations = _memory(problem, schedule)
    return Timeline(
        problem=problem,
        schedule=schedule,
        start=tuple(map(tuple, start)),
        end=tuple(map(tuple, end)),
        memory=memory,
        peak_activation=peaks,
        violations=violations,
    )


def _describe_wait(ranks, pos, stuck, deps, where) -> str:
    """Which rank waits on which op, and on which rank that op sits behind what."""
    parts = []
    for r in stuck:
        op = ranks[r][pos[r]]
        blocker = next(d for d, _ in deps[op] if where[d][1] >= pos[where[d][0]])
        br, bi = where[blocker]
        parts.append(f"rank {r} waits at {op} for {blocker} (rank {br}, behind its {ranks[br][pos[br]]})")
    return "; ".join(parts)


def _memory(problem: Problem, schedule: Schedule):
    """Per rank: the activation level after each op, the peak activation (the highest level held,
    plus the rank's working memory) and the first op during which the level passes the rank's
    ``activation_room``."""
    mem, static, room, tol = problem.mem, problem.static_memory, problem.activation_room, problem.memory_tol
    working = problem.working_memory
    levels, peaks, violations = [], [], []
    for r, ops in enumerate(schedule.ranks):
        level = peak = 0.0
        after = []
        first_over = None
        for op in ops:
            held = max(level, level + mem[op.kind][op.stage])  # frees land at the op's end
            level += mem[op.kind][op.stage]
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
