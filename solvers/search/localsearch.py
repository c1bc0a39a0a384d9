"""Local search on a schedule's order, used by ``schedc solve`` before the exact search, on
problems of any size: move single ops on a rank, keep what the simulator's replay says is better.

1. **Climb** (first improvement, to a local optimum) from the warm start. The moves aim at the
   idle time of the ranks that set the objective (the latest-ending rank for makespan, the
   longest-span rank for span), critical ranks first:

   - fill a gap: an op that runs after an idle gap moves in front of the op that waited there
     (so work that was ready fills the wait);
   - hurry the input: the op whose result arrived last (on another rank, or on the same rank for
     a rank's own chain) moves a few places earlier on its own rank;
   - then, when no targeted move helps, each op moves one to ``reach`` places either way.

2. **Other starts**: climb from each other schedule given (the registry's that fit), best first;
   a worse start often climbs to a different and better local optimum than the best one does.
3. **Kicks** (iterated local search) until the time budget runs out or ``PATIENCE`` kicks in a
   row without a better schedule: a few random moves that keep the order deadlock-free and within the memory
   limit, then a climb with the targeted moves. A result no worse than the current schedule
   becomes the current one (so the search walks plateaus), else it goes back to the best. The
   random generator is seeded: with time to spare, the same problem gives the same schedule.

Where the problem allows recompute (R, S), a move may also change one (stage, microbatch)'s
policy: drop its recompute op, swap it for the other (R for S), or (in kicks) recompute it, the
op placed right before its B; or exchange two policies of one stage on a rank: one of the
``EXCHANGE_TAIL`` last dear recompute ops (R) takes the cheap policy (S) of a microbatch before it,
which takes the dear one. The rank holds about as much as before, and the cheap recompute moves
to the end of the step, where a recompute lies on the chain of the last backwards through every
rank. The climb tries exchanges after every other move (tried first, they can lead it away from
what the others reach). A policy move that keeps more and passes the room is repaired on its
rank (``_repaired``): a pending W pulled earlier, or the forward held there moved after the next
backward. The evaluator holds every recompute op the problem allows; one that is not chosen
lasts 0 right after its F, so every op's memory delta is a constant (``common.model_deltas``, as
in the ILP). A schedule that offloads (a copy lane) is returned as
given: the search does not model the copy lane.

Where an overlapped pair of a forward and a backward is faster than the two one after the other
(``costs.FB``, ``Problem.overlap_cheaper``), a move may also make a pair (a forward and a backward
up to ``reach`` places after it, the backward moved right after it) or break one; pairs a schedule
already has (DualPipe's) are kept as long as their two ops stay next to each other.

A move is kept when the order still fits the memory limit and is strictly better by (objective,
sum over ranks of their span or end): the second key lets the search cross plateaus where only a
non-critical rank gets shorter. Orders are judged by ``schedc.simulate.replay`` (the simulator's
own list scheduling) and the simulator's memory rule over integer op ids, a move from the replay of
the order it changes (``_Evaluator.replayed``: what started before the first op it moved keeps its
times, so only the rest is replayed, with the times a replay from nothing gives); the result is then
simulated once, so what it reports is exactly what the simulator (the one judge) says. It
proves nothing: the bound comes from elsewhere. Times and memory are compared up to float noise
relative to the problem's scale (``Problem.time_tol``, ``Problem.memory_tol``), so the search
takes the same steps in any unit.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from schedc.kinds import BACKWARDS, RECOMPUTES, Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule
from schedc.simulate import Timeline, dependencies, replay, resume, simulate
from schedc.solvers.search.common import model_kinds, model_op_deltas
from schedc.solvers.deadline import Budget
from schedc.tolerance import Tolerance, meets

PATIENCE = 200  # kicks in a row without a better schedule before the search stops
KICK_MOVES = 4  # at most this many random moves per kick
KICK_REACH = 6  # each by at most this many places
KICK_POLICY = 0.3  # the chance that a kick's move changes a policy (where the problem allows recompute)
KICK_PAIR = 0.3  # the chance that a kick's move makes or breaks an overlapped pair (where a pair is faster)
REPAIR_STEPS = 3  # a policy move over the room may pull this many W earlier or push this many F later to fit
EXCHANGE_TAIL = 2  # per stage on a rank, the last this many dear recompute ops may exchange policies

Orders = list[list[int]]  # per rank, op ids in order
Score = tuple[float, float]


@dataclass
class _Replayed:
    """Orders as ``_Evaluator.replayed`` replayed them: per rank every op of the evaluator in the
    order it ran (``full``: the recompute ops not held right after their F), its times, every op's
    end by id, the durations and the score; what a neighbouring order is replayed from."""

    orders: Orders
    full: Orders
    start: list[list[float]]
    end: list[list[float]]
    finish: list[float]
    dur: list[float]
    score: Score


class _Evaluator:
    """The simulator's replay and memory check over integer op ids (``schedc.simulate.replay``,
    without building a Timeline), to judge many candidate orders quickly."""

    def __init__(self, problem: Problem, schedule: Schedule):
        where = schedule.check_complete(problem)
        kinds = model_kinds(problem)
        if any(op.kind not in kinds for op in where):  # a fused backward, or a copy lane: the ops given
            self.ops = list(where)
            # Each forward allocates what its own policy keeps, as the simulator has it (a policy op
            # not held sits right after its forward: with it, the whole activation).
            policy = schedule.policies()
            self.mem = [problem.delta(op.kind, op.stage, policy.get((op.stage, op.mb))) * problem.memory_share(op.mb)
                        for op in self.ops]
        else:  # every op the problem allows, each recompute op whether chosen or not
            self.ops = [Op(k, s, i) for s in range(problem.n_stages) for i in range(problem.units)
                        for k in kinds]
            self.mem = model_op_deltas(problem, self.ops)
        self.index = index = {op: k for k, op in enumerate(self.ops)}
        self.cost = [problem.op_cost(op.kind, op.stage, op.mb) for op in self.ops]  # (a sequence chunk's share)
        self.dur = list(self.cost)
        self.deps = dependencies(problem, self.ops, index, index, schedule.anchors())
        # Per op, its (stage, microbatch)'s backward (B, or BW where the schedule fuses them).
        self.b_of = {k: index[back] for k, op in enumerate(self.ops)
                     for back in (Op(Kind.B, op.stage, op.mb), Op(Kind.BW, op.stage, op.mb)) if back in index}
        # Recompute ops: the backward waits for each (producers names the first); per F, those of its pair.
        self.recompute = {k for k, op in enumerate(self.ops) if op.kind in RECOMPUTES}
        self.after_f: dict[int, list[int]] = {}
        self.partner: dict[int, int] = {}  # a recompute op -> the other one of its pair (R <-> S)
        for k in self.recompute:
            op = self.ops[k]
            f = index[Op(Kind.F, op.stage, op.mb)]
            self.after_f.setdefault(f, []).append(k)
            self.deps[self.b_of[k]].append((k, 0.0))
        for ks in self.after_f.values():
            ks.sort()
            if len(ks) == 2:
                self.partner[ks[0]], self.partner[ks[1]] = ks[1], ks[0]
        rooms, mtol = problem.activation_room, problem.memory_tol
        self.room = None if rooms is None else [room + mtol.eps for room in rooms]
        self.makespan = problem.search_objective == "makespan"
        self.tol = problem.time_tol
        # Overlapped pairs (``Schedule.pairs``): a forward written as its id + n in an order runs
        # overlapped with the backward right after it, when that is a B or BW of another (stage,
        # microbatch) (``_paired``); an id + n anywhere else is the plain forward. The search makes
        # and breaks pairs (``_pair_moves``) where a pair is faster than its two ops
        # (``Problem.overlap_cheaper``). Not with recompute ops (their ids are positional too), and
        # not where no pair can be (no costs.FB, none in the schedule): no cost to the others.
        self.n = n = len(self.ops)
        self.problem = problem
        self.pairable = not self.recompute and (problem.overlap_time is not None or any(schedule.pairs))
        self.pair_moves = self.pairable and problem.overlap_cheaper
        self.is_f = [op.kind is Kind.F for op in self.ops]
        self.is_w = [op.kind is Kind.W for op in self.ops]
        self.is_back = [op.kind in BACKWARDS for op in self.ops]
        self.mem += self.mem  # an id + n: its forward's
        self.deps += self.deps
        self._pair_time: dict[tuple[int, int], float] = {}

    def orders(self, schedule: Schedule) -> Orders | None:
        """``schedule``'s order as op ids (the recompute ops it holds: its policies; the forward of
        each overlapped pair as its id + n), or None when it holds other ops (a copy lane) or
        pairs the evaluator cannot write."""
        if schedule.copy or (schedule.pairs and not self.pairable):
            return None
        try:
            orders = [[self.index[op] for op in ops] for ops in schedule.ranks]
        except KeyError:
            return None
        for ks, paired in zip(orders, schedule.pairs):
            for b in paired:
                ks[ks.index(self.index[b]) - 1] += self.n
        return orders if sum(map(len, orders)) == len(self.ops) - len(self.recompute) + sum(
            k in self.recompute for ks in orders for k in ks) else None

    def pairs_with(self, f: int, b: int) -> bool:
        """Whether forward id ``f`` (< n) may run overlapped with op id ``b`` (a backward of
        another stage or microbatch)."""
        return b < self.n and self.is_back[b] and (self.ops[f].stage, self.ops[f].mb) != (self.ops[b].stage, self.ops[b].mb)

    def _pairs(self, orders: Orders) -> Iterator[tuple[int, int, int]]:
        """(rank, position, backward id) of each overlapped pair the orders write."""
        n = self.n
        for r, ks in enumerate(orders):
            for x in range(len(ks) - 1):
                if ks[x] >= n and self.pairs_with(ks[x] - n, ks[x + 1]):
                    yield r, x, ks[x + 1]

    def schedule(self, name: str, orders: Orders) -> Schedule:
        pairs: list[list[Op]] = [[] for _ in orders]
        for r, _, b in self._pairs(orders):
            pairs[r].append(self.ops[b])
        return Schedule.from_lists(name, [[self.ops[k % self.n] for k in ks] for ks in orders], pairs=pairs)

    def _paired(self, orders: Orders, dur: list[float]) -> tuple[Orders, list[list[tuple[int, float]]], list[float]]:
        """The orders over op ids (< n), and the dependencies and durations with their pairs: the
        forward waits for its backward's producers too and takes the pair's time, the backward
        none (``schedc.simulate.dependencies``, ``durations``)."""
        n = self.n
        deps, dur = self.deps, list(dur)
        changed = False
        for r, x, b in self._pairs(orders):
            f = orders[r][x] - n
            if not changed:
                deps, changed = list(deps), True
            deps[f] = deps[f] + deps[b]
            if (f, b) not in self._pair_time:
                fo, bo = self.ops[f], self.ops[b]
                self._pair_time[f, b] = self.problem.pair_time(fo.stage, bo.kind, bo.stage)
            dur[f], dur[b] = self._pair_time[f, b], 0.0
        return [[k % n for k in ks] for ks in orders], deps, dur

    def expanded(self, orders: Orders) -> Orders:
        """Every op of the evaluator: the recompute ops ``orders`` does not hold right after their F."""
        if not self.recompute:
            return orders
        held = {k for ks in orders for k in ks if k in self.recompute}
        out = []
        for ks in orders:
            new = []
            for k in ks:
                new.append(k)
                for x in self.after_f.get(k, ()):
                    if x not in held:
                        new.append(x)
            out.append(new)
        return out

    def fits(self, orders: Orders) -> bool:
        """Whether the (expanded) orders keep every rank within its room."""
        return self.room is None or all(self.over(ks, r) is None for r, ks in enumerate(orders))

    def over(self, ks: list[int], r: int) -> int | None:
        """Where rank r's (expanded) order ``ks`` first passes its room (None: it never does)."""
        level, room = 0.0, self.room[r]
        for i, k in enumerate(ks):
            delta = self.mem[k]
            if level + max(delta, 0.0) > room:
                return i
            level += delta
        return None

    def replayed(self, orders: Orders, base: _Replayed | None = None) -> _Replayed | None:
        """``orders`` replayed, or None when they deadlock or break the memory limit. From ``base``
        (the replay of orders whose ranks' lists ``orders`` shares, where it shares them: a move
        copies only the lists it changes), only what a changed list can change is replayed again:
        every op that started before the first op the change moved on any rank (``base``'s times)
        keeps its times, as do the ops before it on its own rank, so the replay resumes from there
        (``schedc.simulate.resume``) with the same times as from nothing. Memory is checked on the
        changed ranks only. Not with overlapped pairs, whose order changes their dependencies."""
        if base is None or self.pairable:
            return self._replayed(orders)
        full, dur = base.full[:], base.dur
        t0, lo = math.inf, {}
        for q, ks in enumerate(orders):
            if ks is base.orders[q]:
                continue
            fq = self.expanded([ks])[0]  # (a rank's recompute ops are its own: its order alone expands it)
            if self.room is not None and self.over(fq, q) is not None:
                return None
            old = base.full[q]
            i = next((x for x, (a, b) in enumerate(zip(fq, old)) if a != b), len(old))  # (expanded: same length)
            if self.recompute:  # the rank's recompute ops last their cost where held, else 0 (held or not, in
                held = {k for k in ks if k in self.recompute}  # the same place: the same order, another time)
                for x, k in enumerate(fq):
                    if k in self.recompute and dur[k] != (d := self.cost[k] if k in held else 0.0):
                        dur = dur if dur is not base.dur else dur[:]
                        dur[k], i = d, min(i, x)
            if i == len(old):
                continue
            full[q], lo[q], t0 = fq, i, min(t0, base.start[q][i])
        if not lo:
            return _Replayed(orders, base.full, base.start, base.end, base.finish, base.dur, base.score)
        pos = [min(lo.get(q, len(ks)), bisect_left(base.start[q], t0)) for q, ks in enumerate(base.full)]
        finish = base.finish[:]
        for ks, x in zip(base.full, pos):
            for k in ks[x:]:
                finish[k] = -1.0
        start, end, pos = resume(full, self.deps, dur, finish, [ss[:x] for ss, x in zip(base.start, pos)],
                                 [es[:x] for es, x in zip(base.end, pos)], pos)
        if any(x < len(ks) for x, ks in zip(pos, full)):
            return None
        return _Replayed(orders, full, start, end, finish, dur, _score(start, end, self.makespan))

    def _replayed(self, orders: Orders) -> _Replayed | None:
        full = self.expanded(orders)
        if not self.fits(full):
            return None
        dur, deps = self.dur, self.deps
        if self.recompute:
            held = {k for ks in orders for k in ks if k in self.recompute}
            dur = [0.0 if k in self.recompute and k not in held else c for k, c in enumerate(self.cost)]
        elif self.pairable:
            full, deps, dur = self._paired(full, dur)
        finish = [-1.0] * len(dur)
        start, end, pos = replay(full, deps, dur, finish)
        if any(x < len(ks) for x, ks in zip(pos, full)):
            return None
        return _Replayed(orders, full, start, end, finish, dur, _score(start, end, self.makespan))

    def times(self, rp: _Replayed) -> tuple[list[list[float]], list[list[float]]]:
        """The start and end times of a replay, aligned with its ``orders`` (without the recompute
        ops they do not hold)."""
        if not self.recompute:
            return rp.start, rp.end
        held = {k for ks in rp.orders for k in ks if k in self.recompute}
        keep = [[x for x, k in enumerate(ks) if k not in self.recompute or k in held] for ks in rp.full]
        return ([[ss[x] for x in kx] for ss, kx in zip(rp.start, keep)],
                [[es[x] for x in kx] for es, kx in zip(rp.end, keep)])

    def run(self, orders: Orders):
        """``(score, start, end)`` of the replayed orders (times aligned with ``orders``), or None
        when they deadlock or break the memory limit."""
        rp = self._replayed(orders)
        return None if rp is None else (rp.score, *self.times(rp))

    def score(self, orders: Orders) -> Score | None:
        """``score()`` of the simulated orders, or None when they deadlock or break the limit."""
        out = self.run(orders)
        return None if out is None else out[0]


class ReplayFilter:
    """Whether a schedule of the same ops beats a base by the search objective, judged by the
    evaluator's replay resumed from the base's (only what follows the first op that a rank's
    changed order moved is replayed again): a quick first judge for a descent whose trials each
    change one rank's order, before the simulator judges the few that pass (``mixed.
    held_back_search``). Where the evaluator cannot write the base (a copy lane, pairs it cannot
    write) or the problem has syncs, every schedule passes."""

    def __init__(self, problem: Problem, base: Timeline):
        self.ev = None if problem.syncs else _Evaluator(problem, base.schedule)
        self.rebase(base)

    def rebase(self, base: Timeline) -> None:
        orders = None if self.ev is None else self.ev.orders(base.schedule)
        self.base = None if orders is None else self.ev.replayed(orders)
        self.value = score(base)[0]

    def beats(self, schedule: Schedule) -> bool:
        orders = None if self.base is None else self.ev.orders(schedule)
        if orders is None:
            return True
        shared = [old if ks == old else ks for ks, old in zip(orders, self.base.orders)]  # (resumed past these)
        rp = self.ev.replayed(shared, self.base)
        return rp is not None and self.ev.tol.lt(rp.score[0], self.value)


def score(t: Timeline) -> Score:
    """(objective, sum over ranks of their own end or span): lower is better; the second key
    breaks plateaus."""
    return _score(t.start, t.end, t.problem.search_objective == "makespan")


def _score(start, end, makespan: bool) -> Score:
    per_rank = [es[-1] if makespan else es[-1] - ss[0] for ss, es in zip(start, end) if es]
    return (max(per_rank), sum(per_rank))


def _better(a: Score, b: Score, tol: Tolerance) -> bool:
    """a is better than b: a shorter objective, or the same (up to float noise) and a shorter
    sum, each beyond noise."""
    if tol.lt(a[0], b[0]):
        return True
    return tol.le(a[0], b[0]) and tol.lt(a[1], b[1])


def _moved(orders: Orders, r: int, i: int, j: int) -> Orders:
    out = orders[:]
    out[r] = new = orders[r][:]
    new.insert(j, new.pop(i))
    return out


Move = tuple  # (rank, from, to): move an op; (rank, at, None, op): a policy move; ("exchange", rank, at, at)


def _apply(ev: _Evaluator, orders: Orders, move: Move) -> Orders:
    """``orders`` after ``move``: (r, i, j) moves rank r's op at i to j; (r, i, None, k) puts
    recompute op k in place of the op at i (None: drops it; a recompute op: swaps it for k) or,
    with i None, adds k right before its B."""
    if move[0] == "pair":
        _, r, i, j = move
        out = orders[:]
        out[r] = new = orders[r][:]
        if j is None:  # break the pair
            new[i] -= ev.n
        else:  # the backward at j moves right after the forward at i, and runs overlapped with it
            new.insert(i + 1, new.pop(j))
            new[i] += ev.n
        return out
    if move[0] == "exchange":  # two recompute ops of one stage swap policies
        _, r, i, j = move
        out = orders[:]
        out[r] = new = orders[r][:]
        new[i], new[j] = ev.partner[new[i]], ev.partner[new[j]]
        return out
    if move[2] is not None:
        return _moved(orders, *move)
    r, i, _, k = move
    out = orders[:]
    out[r] = new = orders[r][:]
    if i is None:
        new.insert(new.index(ev.b_of[k]), k)
    elif k is None:
        del new[i]
    else:
        new[i] = k
    return out


def _policy_moves(ev: _Evaluator, orders: Orders, ranks) -> Iterator[Move]:
    """On ``ranks``: drop each recompute op (its pair keeps its activation), or swap it for the
    other policy's."""
    for r in ranks:
        for i, k in enumerate(orders[r]):
            if k in ev.recompute:
                yield r, i, None, None
                if k in ev.partner:
                    yield r, i, None, ev.partner[k]


def _exchange_moves(ev: _Evaluator, orders: Orders, ranks) -> Iterator[Move]:
    """On ``ranks``: each of a stage's last ``EXCHANGE_TAIL`` dear recompute ops exchanges
    policies with each cheap one before it (the nearest first)."""
    for r in ranks:
        ks = orders[r]
        by_stage: dict[int, list[int]] = {}  # stage -> positions of its recompute ops that have a partner
        for i, k in enumerate(ks):
            if k in ev.partner:
                by_stage.setdefault(ev.ops[k].stage, []).append(i)
        for at in by_stage.values():
            dearer = [ev.cost[ks[i]] - ev.cost[ev.partner[ks[i]]] for i in at]  # than its partner
            dear = [x for x in range(len(at)) if dearer[x] > 0]
            for x in reversed(dear[max(0, len(dear) - EXCHANGE_TAIL):]):
                yield from (("exchange", r, at[x], at[y]) for y in range(x - 1, -1, -1) if dearer[y] < 0)


def _repaired(ev: _Evaluator, orders: Orders, r: int) -> Orders | None:
    """Rank r's order brought within its room, up to ``REPAIR_STEPS`` steps, each where the level
    first passes the room: the first W after that point whose B comes before it moves there (it
    frees its share sooner) or, where no such W is pending, the last forward held at that point
    moves right after the first backward after it (one microbatch fewer in flight there); None
    when that does not do it. What lets a policy move that keeps more (a recompute dropped, R for
    S) fit where a W runs late or where the rank runs one forward ahead of what its room holds."""
    ks = orders[r]
    for _ in range(REPAIR_STEPS + 1):
        full = ev.expanded([ks])[0]  # (a rank's recompute ops are its own: its order alone expands it)
        j = ev.over(full, r)
        if j is None:
            return orders
        own = set(ks)
        over = sum(x in own for x in full[:j + 1]) - 1  # the op of ks at that point, or whose F it follows
        before = set(ks[:over])
        pull = next((x for x in range(over + 1, len(ks)) if ev.is_w[ks[x]] and ev.b_of[ks[x]] in before), None)
        if pull is not None:
            orders = _moved(orders, r, pull, over)
        else:
            after = set(ks[over + 1:])
            f = next((x for x in range(over, -1, -1) if ev.is_f[ks[x]] and ev.b_of[ks[x]] in after), None)
            b = next((x for x in range(over + 1, len(ks)) if ev.is_back[ks[x]]), None)
            if f is None or b is None:
                return None
            orders = _moved(orders, r, f, b)  # (a deadlock it makes: the evaluator rejects the order)
        ks = orders[r]
    return None


def _pair_moves(ev: _Evaluator, orders: Orders, ranks, reach: int) -> Iterator[Move]:
    """On ``ranks``: break each overlapped pair; pair each other forward with a backward after it,
    within ``reach`` places (that backward moved right after it)."""
    n = ev.n
    for r in ranks:
        ks = orders[r]
        for i, k in enumerate(ks):
            if k >= n:
                yield "pair", r, i, None
            elif ev.is_f[k]:
                for j in range(i + 1, min(len(ks), i + 2 + reach)):
                    if ev.pairs_with(k, ks[j]):
                        yield "pair", r, i, j


def _candidates(ev: _Evaluator, orders: Orders, start, end, reach: int, full: bool) -> Iterator[Move]:
    """(rank, from, to) moves, targeted ones first; the reach-neighbourhood (and the policy and
    pair moves) only when ``full``, and the exchanges of policies last."""
    where = {k % ev.n: (r, i) for r, ks in enumerate(orders) for i, k in enumerate(ks)}
    key = [(es[-1] if ev.makespan else es[-1] - ss[0]) if es else 0.0 for ss, es in zip(start, end)]
    critical = sorted(range(len(orders)), key=lambda r: -key[r])
    seen = set()

    def new(r, i, j):
        if 0 <= j < len(orders[r]) and i != j and (r, i, j) not in seen:
            seen.add((r, i, j))
            return True
        return False

    for r in critical:
        ks, starts, ends = orders[r], start[r], end[r]
        for i in range(1, len(ks)):
            if ev.tol.le(starts[i], ends[i - 1]):  # no gap before op i
                continue
            # fill the gap with a later op of this rank
            for k in range(i + 1, min(len(ks), i + 1 + reach)):
                if new(r, k, i):
                    yield r, k, i
            # hurry the input that arrived last
            deps = [d for d in ev.deps[ks[i]] if d[0] in where]  # (a recompute op not held: not an input)
            if deps:
                last = max(deps, key=lambda d: end[where[d[0]][0]][where[d[0]][1]] + d[1])[0]
                rd, id_ = where[last]
                for k in range(1, reach + 1):
                    if new(rd, id_, id_ - k):
                        yield rd, id_, id_ - k
    if not full:
        return
    yield from _policy_moves(ev, orders, critical)
    if ev.pair_moves:
        yield from _pair_moves(ev, orders, critical, reach)
    for r in critical:
        for i in range(len(orders[r])):
            for d in range(1, reach + 1):
                for j in (i - d, i + d):
                    if new(r, i, j):
                        yield r, i, j
    yield from _exchange_moves(ev, orders, critical)  # last: the climb reaches them at the others' optimum


def _climb(ev: _Evaluator, orders: Orders, budget: Budget, reach: int, full: bool, found=None):
    """First-improvement hill climb from ``orders`` (which must be feasible) to a local optimum
    or the end of ``budget``: ``(orders, score)``. ``found(score)`` hears of each improvement."""
    now = ev.replayed(orders)
    improved = True
    while improved and not budget.expired():
        improved = False
        for move in _candidates(ev, orders, *ev.times(now), reach, full):
            if budget.expired():
                break
            trial = _apply(ev, orders, move)
            out = ev.replayed(trial, now)
            if out is None and ev.room is not None and (r := _policy_rank(move)) is not None:
                trial = _repaired(ev, trial, r)  # a policy move that keeps more: make room for it
                out = None if trial is None else ev.replayed(trial, now)
            if out is not None and _better(out.score, now.score, ev.tol):
                orders, now, improved = trial, out, True
                if found:
                    found(now.score)
                break
    return orders, now.score


def _policy_rank(move: Move) -> int | None:
    """The rank of a policy move (one that may keep more there and pass the room), else None."""
    if move[0] == "exchange":
        return move[1]
    return move[0] if move[0] != "pair" and move[2] is None else None


def _kick(ev: _Evaluator, orders: Orders, rng: random.Random) -> Orders:
    """A few random single-op moves, each kept only when the order stays feasible; where the
    problem allows recompute, some of them change a (stage, microbatch)'s policy."""
    now = ev.replayed(orders)
    for _ in range(rng.randint(1, KICK_MOVES)):
        for _ in range(20):  # tries for one feasible move
            if ev.pair_moves and rng.random() < KICK_PAIR:
                r = rng.randrange(len(orders))
                moves = list(_pair_moves(ev, orders, (r,), KICK_REACH))
                if moves:
                    trial = _apply(ev, orders, rng.choice(moves))
                    if (out := ev.replayed(trial, now)) is not None:
                        orders, now = trial, out
                        break
                continue
            if ev.recompute and rng.random() < KICK_POLICY:
                held = {k for ks in orders for k in ks if k in ev.recompute}
                k = rng.choice(sorted(ev.recompute))
                r = next(r for r, ks in enumerate(orders) if ev.b_of[k] in ks)
                if k in held:
                    move = (r, orders[r].index(k), None, None)
                elif k in ev.partner and ev.partner[k] in held:
                    move = (r, orders[r].index(ev.partner[k]), None, k)
                else:
                    move = (r, None, None, k)
                trial = _apply(ev, orders, move)
                if (out := ev.replayed(trial, now)) is not None:
                    orders, now = trial, out
                    break
                continue
            r = rng.randrange(len(orders))
            n = len(orders[r])
            if n < 2:
                continue
            i = rng.randrange(n)
            j = min(max(0, i + rng.choice((-1, 1)) * rng.randint(1, KICK_REACH)), n - 1)
            if i == j:
                continue
            trial = _moved(orders, r, i, j)
            if (out := ev.replayed(trial, now)) is not None:
                orders, now = trial, out
                break
    return orders


def improve(
    problem: Problem,
    start: Timeline,
    budget: Budget,
    *,
    others: Sequence[Timeline] = (),
    reach: int = 3,
    seed: int = 0,
    enough: float | None = None,
    progress: Callable[[float], None] | None = None,
    patience: int | None = PATIENCE,
) -> Timeline:
    """Search from ``start`` (a Timeline of ``problem`` that fits), and from ``others`` (more
    Timelines that fit; those of other ops, e.g. a fused backward, are skipped), until ``budget``
    runs out or the search ends; returns the best Timeline found (``start`` itself when nothing
    beats it). ``progress(objective)`` hears of each better schedule. It stops early once the
    objective is at most ``enough`` (a proven lower bound). ``patience``: kicks in a row without a
    better schedule before it stops (None: it kicks on until the budget runs out)."""
    if start.schedule.copy:  # the copy lane is not modelled: nothing to search
        return start
    ev = _Evaluator(problem, start.schedule)
    best_s = score(start)
    best = ev.orders(start.schedule)
    if best is None:  # pairs with recompute ops: not written by the evaluator
        return start

    def done() -> bool:
        return budget.expired() or (enough is not None and meets(best_s[0], enough))

    def found(s: Score) -> None:
        nonlocal best_s
        if _better(s, best_s, ev.tol):
            best_s = s
            if progress:
                progress(s[0])

    def climb(orders: Orders, full: bool = True) -> tuple[Orders, Score]:
        nonlocal best
        orders, s = _climb(ev, orders, budget, reach, full, found)
        if s == best_s:
            best = orders
        return orders, s

    if not done():
        climb(best)
    for t in sorted(others, key=lambda t: score(t)):
        orders = ev.orders(t.schedule)
        if done():
            break
        if orders is not None and t.fits:
            climb(orders)
    rng = random.Random(seed)
    current, current_s = best, best_s
    misses = 0
    while (patience is None or misses < patience) and not done():
        before = best_s
        orders, s = climb(_kick(ev, current, rng), full=False)
        if best_s != before:  # a new best: make it a local optimum of the full neighbourhood
            orders, s = climb(orders)
            misses = 0
        else:
            misses += 1
        current, current_s = (orders, s) if ev.tol.le(s[0], current_s[0]) else (best, best_s)
    if best_s == score(start):
        return start
    t = simulate(problem, renumbered(ev.schedule(start.schedule.name, best), problem.seq_chunks))
    if not t.fits or _better(score(start), score(t), ev.tol):  # the replay is the simulator's: never happens
        raise RuntimeError(f"bug: local search result {score(t)} judged {best_s} by its evaluator")
    return t


def renumbered(schedule: Schedule, chunks: int = 1) -> Schedule:
    """The same schedule with microbatches numbered in the order they enter stage 0 (the exact
    models number them so). Microbatches are interchangeable, so times and memory do not change.
    With ``chunks`` sequence chunks (``Problem.seq_chunks``), whole sequences are: each is numbered
    by when its first chunk enters stage 0, and its chunks keep their positions (their costs and
    memory differ)."""
    k = chunks
    entry = [op.mb // k for ops in schedule.ranks for op in ops
             if op.kind == Kind.F and op.stage == 0 and op.mb % k == 0]
    new = {old: x for x, old in enumerate(entry)}

    def renamed(ops):
        return [Op(op.kind, op.stage, new[op.mb // k] * k + op.mb % k) for op in ops]

    return Schedule.from_lists(schedule.name, [renamed(ops) for ops in schedule.ranks],
                               pairs=[renamed(ops) for ops in schedule.pairs])
