"""Local search on a schedule's order: move single ops on a rank, keep what the simulator says is
better. Used by ``schedc solve`` after the exact search, on problems of any size.

The moves aim at the idle time of the ranks that set the objective (the latest-ending rank for
makespan, the longest-span rank for span):

- fill a gap: an op that runs after an idle gap on the critical rank moves in front of the op
  that waited there (so work that was ready fills the wait);
- hurry the input: the op whose result arrived last (on another rank, or on the same rank for
  a rank's own chain) moves a few places earlier on its own rank;
- then, when no targeted move helps, each op of the critical rank moves one to ``reach``
  places either way.

A move is kept when the schedule still fits the memory limit and is strictly better by
(objective, sum over ranks of their span or end): the second key lets the search cross plateaus
where only a non-critical rank gets shorter. Every candidate is judged by ``simulate``, so the
result is exactly what the simulator (the one judge) reports. It proves nothing: the bound comes
from elsewhere. First improvement, until the deadline or a full round without one.
"""

from __future__ import annotations

import time
from typing import Callable

from schedc.errors import ScheduleError
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, producers
from schedc.simulate import Timeline, dependencies, replay, simulate

_EPS = 1e-9


class _Evaluator:
    """The simulator's replay and memory check over integer op ids (``schedc.simulate.replay``,
    without building a Timeline), to screen many candidate orders quickly. A candidate it accepts
    is then judged by ``simulate`` itself."""

    def __init__(self, problem: Problem, schedule: Schedule):
        where = schedule.check_complete(problem)
        self.ops = list(where)
        self.index = {op: k for k, op in enumerate(self.ops)}
        self.dur = [problem.cost[op.kind][op.stage] for op in self.ops]
        self.mem = [problem.mem[op.kind][op.stage] for op in self.ops]
        self.deps = dependencies(problem, self.ops, self.index, where)
        limits = problem.memory_limit
        self.room = (
            None if limits is None else [limits[r] - problem.static_memory[r] + _EPS for r in range(problem.ranks)]
        )
        self.makespan = problem.objective == "makespan"

    def orders(self, schedule: Schedule) -> list[list[int]]:
        return [[self.index[op] for op in ops] for ops in schedule.ranks]

    def score(self, orders: list[list[int]]) -> tuple[float, float] | None:
        """``score()`` of the simulated orders, or None when they deadlock or break the limit."""
        if self.room is not None:
            for r, ks in enumerate(orders):
                level, room = 0.0, self.room[r]
                for k in ks:
                    delta = self.mem[k]
                    if level + max(delta, 0.0) > room:
                        return None
                    level += delta
        start, end, pos = replay(orders, self.deps, self.dur)
        if any(pos[r] < len(ks) for r, ks in enumerate(orders)):
            return None
        return _score(start, end, self.makespan)


def score(t: Timeline) -> tuple[float, float]:
    """(objective, sum over ranks of their own end or span): lower is better; the second key
    breaks plateaus."""
    return _score(t.start, t.end, t.problem.objective == "makespan")


def _score(start, end, makespan: bool) -> tuple[float, float]:
    per_rank = [es[-1] if makespan else es[-1] - ss[0] for ss, es in zip(start, end) if es]
    return (max(per_rank), sum(per_rank))


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    tol = 1e-9 * max(1.0, abs(b[0]))
    if a[0] < b[0] - tol:
        return True
    return a[0] <= b[0] and a[1] < b[1] - 1e-9 * max(1.0, abs(b[1]))  # never a hair worse


def _critical_ranks(t: Timeline) -> list[int]:
    """Ranks in order of how much they set the objective (latest end, or longest span)."""
    key = [es[-1] if es else 0.0 for es in t.end] if t.problem.objective == "makespan" else list(t.rank_span)
    return sorted(range(len(key)), key=lambda r: -key[r])


def _moved(ranks: list[list[Op]], r: int, i: int, j: int) -> list[list[Op]]:
    new = ranks[r][:]
    op = new.pop(i)
    new.insert(j, op)
    out = ranks[:]
    out[r] = new
    return out


def _candidates(t: Timeline, reach: int, critical: int):
    """(rank, from, to) moves, targeted ones first."""
    problem, schedule = t.problem, t.schedule
    ranks = schedule.ranks
    where = {op: (r, i) for r, ops in enumerate(ranks) for i, op in enumerate(ops)}
    finish = {op: t.end[r][i] for op, (r, i) in where.items()}
    seen = set()

    def emit(r, i, j):
        if 0 <= j < len(ranks[r]) and i != j and (r, i, j) not in seen:
            seen.add((r, i, j))
            return True
        return False

    for r in _critical_ranks(t)[:critical]:
        starts, ends = t.start[r], t.end[r]
        for i in range(1, len(ranks[r])):
            if starts[i] - ends[i - 1] <= _EPS * max(1.0, starts[i]):
                continue
            op = ranks[r][i]
            # fill the gap with a later op of this rank
            for k in range(i + 1, min(len(ranks[r]), i + 1 + reach)):
                if emit(r, k, i):
                    yield r, k, i
            # hurry the input that arrived last
            deps = producers(op, problem.n_stages, where)
            if deps:
                last = max(deps, key=lambda d: finish[d])
                rd, id_ = where[last]
                for k in range(1, reach + 1):
                    if emit(rd, id_, id_ - k):
                        yield rd, id_, id_ - k
    for r in _critical_ranks(t)[:critical]:
        for i in range(len(ranks[r])):
            for d in range(1, reach + 1):
                for j in (i - d, i + d):
                    if emit(r, i, j):
                        yield r, i, j


def improve(
    problem: Problem,
    start: Timeline,
    deadline: float,
    *,
    reach: int = 3,
    critical: int | None = None,
    progress: Callable[[Timeline], None] | None = None,
) -> Timeline:
    """Hill-climb from ``start`` (a Timeline of ``problem`` that fits) until ``deadline``
    (a ``time.perf_counter()`` value) or a local optimum; returns the best Timeline found."""
    critical = critical or problem.ranks
    best = start
    best_score = score(best)
    ev = _Evaluator(problem, best.schedule)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        ranks = [list(ops) for ops in best.schedule.ranks]
        orders = ev.orders(best.schedule)
        for r, i, j in _candidates(best, reach, critical):
            if time.perf_counter() >= deadline:
                break
            trial = orders[:]
            trial[r] = moved = orders[r][:]
            moved.insert(j, moved.pop(i))
            quick = ev.score(trial)
            if quick is None or not _better(quick, best_score):
                continue
            t = simulate(problem, Schedule(best.schedule.name, tuple(map(tuple, _moved(ranks, r, i, j)))))
            if t.fits and _better(s := score(t), best_score):
                best, best_score, improved = t, s, True
                if progress:
                    progress(best)
                break
    if best is start:
        return start
    return simulate(problem, renumbered(best.schedule))


def renumbered(schedule: Schedule) -> Schedule:
    """The same schedule with microbatches numbered in the order they enter stage 0 (the exact
    models number them so). Microbatches are interchangeable, so times and memory do not change."""
    entry = [op.mb for ops in schedule.ranks for op in ops if op.kind == "F" and op.stage == 0]
    new = {old: k for k, old in enumerate(entry)}
    return Schedule.from_lists(
        schedule.name, [[Op(op.kind, op.stage, new[op.mb]) for op in ops] for ops in schedule.ranks]
    )
