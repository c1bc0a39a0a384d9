"""The memory-aware zero-bubble heuristic (in the spirit of ZB-1p / ZB-2p, Qi et al. 2024).

A list scheduler over all ranks at once, in time order: whenever a rank is free it runs

1. a B whose inputs have arrived (B is on the critical path), or an F whose input has arrived
   if the memory limit admits it (which of the two first is a policy choice, below),
2. else a pending W: W fills the gaps and frees memory,
3. else it waits for the next arrival.

Warm-up thus runs as many F as memory allows before the first B arrives, the steady state
alternates F and B, and W go into the bubbles. Memory is admitted per microbatch: its first
forward on a rank reserves what its later local stages will allocate, so that a microbatch once
started can always finish its forwards (no deadlock on memory, with any placement).

Warm-up depth matters most when memory is plentiful (the 2p limit of ZB-2p): a rank that fills
its memory with forwards before its first B arrives makes that B wait behind a forward, and the
delay adds up down the pipeline. With the timed warm-up a rank starts a new microbatch before its
first B only if the forward ends by the earliest time that B can arrive (the end of the rank's
first forward of its last stage plus the round trip through the later stages); the overrun variant
lets one forward start until then. This is what the zero-bubble paper's own scheduler does, and
on its settings it gives its published ZB-2p bubble.

Where communication is slow against F and memory lies between 1p and 2p, three more switches
matter (the zero-bubble paper's steady state, and what its own scheduler does): a W may go into a
bubble it does not fill when waiting would make this rank's idle time the largest so far (the
bubble is then spread over the ranks instead of piling up on one); the warm-up depths fall by at
least one per rank down the pipeline (a staircase, each step capped by memory and by the first
B's arrival), so that no rank holds more microbatches than the rank before can feed back; and
after the warm-up a rank never runs two B in a row while forwards remain, freeing memory with a
W for the next F instead. Without them these slow links cost up to 6.7 % against that scheduler
(``benchmarks/zb_comm.py``).

Small choices (B or F first when both are ready, W eagerly or only where it fits the gap,
strict F/B alternation after warm-up, warm-up depth, which stage first on a rank holding several,
how much room to reserve, the timed warm-up, the three above) change the result from problem to
problem, so a coordinate search over these switches builds variants and the simulator, the one
judge, keeps the best that fits. Coordinate search stops at local optima, so it runs from three
starts (the default, a 1F1B-like and a paper-like policy), and the first descent flips the older
switches alone before the newer ones: the result is never worse than the search without them.

Where the problem declares recompute, the scheduler also recomputes rather than stalls: when
memory alone keeps a rank from starting a ready forward (no B ready; a pending W first, as it frees
memory, unless a switch says otherwise), it starts the microbatch as recomputed on that rank (its
forwards keep only ``keep``; the cheapest declared recompute in time, selective S or full R, that
fits) and runs that microbatch's recompute before its backward: as soon as the backward's inputs
have arrived, or earlier, in a gap where the rank would wait, when memory holds what it brings back
(Mario's idea: recompute in the bubbles). A kept microbatch is admitted only while room remains for
the rest of the rank's warm-up depth as recomputed microbatches plus one recompute's bring-back, so
memory goes to depth first. Four switches (recompute at all, recompute in gaps, recompute before a
pending W, and which recompute the depth is counted in) join the search for such problems only: a
problem without recompute gets the same schedules as before.

Every comparison of times (an input arrived, a forward ends in time, ranks free at once, one
variant faster than another) and of memory (a forward fits) is up to float noise relative to the
problem's scale (``Problem.time_tol``, ``Problem.memory_tol``): in any unit of time or memory the
same problem gives the same schedule.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Iterator

from schedc.errors import ProblemError
from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.bulk import bulk
from schedc.schedule import Op, Schedule, stage_needs
from schedc.simulate import simulate
from schedc.solvers.bounds import lower_bound
from schedc.solvers.registry import any_placement, register
from schedc.tolerance import Tolerance, meets

# The kinds the list scheduler makes, as module globals: looking a member up on the enum class
# costs several times a global's lookup, and the scheduler's loop does it per op and per step.
F_, B_, W_ = Kind.F, Kind.B, Kind.W
_new = tuple.__new__  # an Op of a Kind, without Op.__new__'s check of the name (the scheduler makes one per op and step)


@dataclass(frozen=True)
class Policy:
    b_first: bool = True  # when a B and an admitted F are both ready, run the B (else the F, as 1F1B does)
    eager_w: bool = True  # with nothing ready, run a W even if an arrival is due before it would end
    alternate: bool = False  # after a rank's first B, strictly alternate F and B (1F1B's steady state)
    late_stage_first: bool = True  # among ready ops of several local stages, prefer the later stage
    shallow_warmup: bool = False  # before its first B, a rank starts at most as many microbatches as
    # there are stages from its first to the last (1F1B's warm-up for one chunk)
    lean: bool = False  # keep room for one microbatch's later local forwards, not for every started
    # one's (they run in microbatch order, one at a time; safe with up to two chunks per rank)
    timed_warmup: bool = False  # before its first B, a rank starts a new microbatch only if that
    # forward ends by the time its first B can arrive (so warm-up forwards never delay that B)
    overrun_warmup: bool = False  # with timed_warmup: a forward may start until that B arrives
    # (one last forward may delay it, rather than leave the rank idle)
    balance_w: bool = False  # with eager_w off: run a W that would not fit before the next arrival
    # anyway when waiting would make this rank's idle time so far the largest of all ranks
    staircase: bool = False  # one chunk per rank: before its first B, a rank starts at most one
    # microbatch fewer than the rank of the stage before it, each at most what memory holds (and,
    # with timed_warmup, what ends by its first B): warm-up depths fall by one or more per rank
    strict: bool = False  # one chunk per rank: after its first B, no B straight after a B while
    # forwards remain (a W that frees memory for the next F, or a wait, instead)
    recompute: bool = True  # problems that declare recompute: start a microbatch as recomputed when
    # memory alone keeps a ready forward waiting (else wait, as without recompute)
    early_recompute: bool = True  # run a recompute in a gap where the rank would wait, if memory holds it
    # (else only once its backward's inputs have arrived)
    cheap_target: bool = False  # room for the warm-up depth counted in the recompute that costs least
    # time (selective, where declared) rather than in the one that keeps least (full)
    recompute_before_w: bool = False  # a recompute in a gap (early_recompute), or starting a microbatch
    # as recomputed, before a pending W (else the W first: it frees memory, a kept microbatch may then fit)


FLAGS = (
    "b_first", "eager_w", "alternate", "late_stage_first", "shallow_warmup", "lean", "timed_warmup", "overrun_warmup",
    "balance_w",
)
ONE_CHUNK_FLAGS = (
    "b_first", "eager_w", "alternate", "shallow_warmup", "timed_warmup", "overrun_warmup", "balance_w", "staircase",
    "strict",
)


RECOMPUTE_FLAGS = ("recompute", "early_recompute", "recompute_before_w", "cheap_target")  # only where recompute is declared


def flags_for(problem: Problem) -> tuple[str, ...]:
    """The switches that can matter: stage order and lean reservations need several local stages;
    the staircase and strict turns are written for one stage per rank; the recompute switches
    need a problem that declares recompute."""
    if problem.chunks == 1:
        flags = ONE_CHUNK_FLAGS
    else:
        flags = FLAGS if problem.chunks == 2 else tuple(f for f in FLAGS if f != "lean")
    return flags + RECOMPUTE_FLAGS if problem.recomputes else flags


def policies(problem: Problem) -> list[Policy]:
    """Every combination of the switches that matter (used by the tests)."""
    names = flags_for(problem)
    out = []
    for bits in range(2 ** len(names)):
        out.append(Policy(**{f: bool(bits >> k & 1) for k, f in enumerate(names)}))
    return out


def greedy_schedule(problem: Problem, policy: Policy, name: str) -> Schedule:
    """One greedy pass of ``policy`` under the problem's own memory limit (static memory
    included; none = no limit). For another limit pass
    ``problem.with_changes(memory={"limit": ...})``."""
    return ListScheduler(problem, policy).build(name)


@dataclass
class RankState:
    """One rank during a greedy pass: what it holds, what it has done, what it waits to do."""

    stages: list[int]  # its stages, in the order the policy tries them
    first: int  # its first stage: a microbatch's forward there starts the microbatch on the rank
    last: int  # its last stage: the forward there precedes the rank's first B of that microbatch
    room: float  # how high its activation level may go (inf without a limit)
    need: float  # what one microbatch allocates at most through its stages
    remaining: int  # ops still to run
    depth: int  # warm-up depth of the shallow warm-up: the stages from its first to the last
    stair: int  # warm-up depth of the staircase (the microbatches otherwise)
    ops: list[Op] = field(default_factory=list)  # what it ran, in order
    pending_w: list[Op] = field(default_factory=list)  # W whose B ran, in the order they did
    level: float = 0.0  # activation memory held, in schedule order
    peak: float = 0.0  # the highest level so far (as the simulator counts it: 0 before any op)
    reserved: float = 0.0  # promised to the later local forwards of started microbatches
    clock: float = 0.0  # when it next looks for work: its last op's end, or the arrival it waits for
    last_end: float = 0.0  # when its last op ended
    idle: float = 0.0  # the time it waited between its ops so far
    last_fb: Kind | None = None  # the kind of its last F or B (None before any)
    least: Kind | None = None  # the recompute kind that keeps least on this rank
    needs: dict[Kind, float] = field(default_factory=dict)  # recompute kind -> what one microbatch
    # recomputed on all the rank's stages allocates at most through them (``need`` for a kept one)
    keep_pass: float = 0.0  # what one recomputed microbatch's forwards keep through its stages (with
    # the recompute that keeps least, or with cheap_target the one that costs least time)
    keep_most: float = 0.0  # the larger of the two (the strictest reservation any recompute switch makes)
    slot: float = 0.0  # above what its forwards keep, the most one recomputed microbatch's recomputes
    # bring back (the room one of them needs; one at a time is kept free)
    kept: dict[Kind, float] = field(default_factory=dict)  # recompute kind -> what one microbatch's
    # forwards keep through the rank's stages, recomputed with it
    target: int = 0  # microbatches in flight the warm-up aims at (with recompute: room is kept for them)
    unrecomputed: int = 0  # recomputed (stage, microbatch) of the rank whose recompute has not run
    started: int = 0  # microbatches whose first local forward ran
    finished: int = 0  # microbatches whose W of its first local stage ran
    seen_b: bool = False  # its first B ran: the warm-up is over


class Worse(Exception):
    """A pass stopped early (``ListScheduler.stop_above``): the simulator would time its schedule
    at ``least`` or more, which is above the objective it had to beat."""

    def __init__(self, least: float) -> None:
        super().__init__(f"the pass's objective is at least {least:g}")
        self.least = least


STOP_CHECK = 1024  # ``stop_above``: the ops run between two looks at the least objective left


class ListScheduler:
    """The list scheduler of one policy under the problem's memory limit: all ranks at once, in
    time order, the earliest free rank advancing first (``build``).

    ``stop_above``: a pass that cannot beat an objective stops early. Beside its own clock (which
    decides what runs) the pass keeps the times the simulator will give each op run so far: the
    simulator replays the same order with each op as early as its rank and inputs allow, and the
    ops run so far are all that decide their own times (``sim_end``). A rank's remaining F, B and W
    run after its last op so far, one after another, so its objective is at least that op's end
    plus their cost (less its first op's start, for span; compute ops only: a reduce lane can only
    add). When that exceeds ``stop_above`` beyond float noise on some rank, ``build`` raises
    ``Worse``; the ``steady`` objective is never stopped. ``timed`` keeps those times without a
    limit, for ``judged``."""

    def __init__(self, problem: Problem, policy: Policy, deps: dict[Op, list[Op]] | None = None,
                 stop_above: float | None = None, timed: bool = False) -> None:
        """``deps``: each op's producers, filled as asked (``producers_of``); the passes of one
        search share it, so the rule is applied once per op, not once per op and pass."""
        self.problem, self.policy = problem, policy
        self.stop_above = stop_above if problem.objective in ("span", "makespan") else None
        self.timed = timed or self.stop_above is not None
        self.deps = {} if deps is None else deps
        self.needs: dict[tuple[Kind, int], tuple[tuple[Kind, int], ...]] = {}  # (kind, stage) -> ``stage_needs``
        self.tol, self.mtol = problem.time_tol, problem.memory_tol
        self.n, self.m = problem.n_stages, problem.microbatches
        self.depth = problem.pipeline_stages
        self.comm, self.stage_rank = problem.comm, problem.stage_rank
        self.cost, self.mem = problem.cost, problem.mem
        self.f_cost, self.w_cost, self.f_mem = problem.cost[Kind.F], problem.cost[Kind.W], problem.mem[Kind.F]
        self.round_trip, self.head = _round_trips(problem), _forward_heads(problem)
        room = problem.activation_room or (math.inf,) * problem.ranks
        # Recompute (problems that declare it, policy permitting): the kinds, cheapest first on each rank.
        self.lighten = problem.recomputes if policy.recompute else ()
        self.recomputed: dict[tuple[int, int], Kind] = {}  # (stage, microbatch) -> R or S, as started
        self.memory_gated = False  # some memory gate would have kept a microbatch out under the strictest
        # recompute switches (``admits``); while False, no recompute switch changes a decision of the pass
        self.lean_matters = False  # some memory gate decided otherwise than it would with ``lean`` flipped
        kinds = problem.recomputes
        self.ranks = [
            RankState(
                stages=sorted(stages, reverse=policy.late_stage_first), first=min(stages), last=max(stages),
                room=room[r], need=self._kept_need(r),
                remaining=len(stages) * self.m * 3, depth=self.n - min(stages), stair=self.m,
                needs={k: _pass_peak(problem, stages, k) for k in kinds},
            )
            for r, stages in enumerate(problem.rank_stages)
        ]
        for rank, stages in zip(self.ranks, problem.rank_stages):
            if kinds:  # (with the switch off too: ``admits`` tells whether it could have mattered)
                rank.least = min(kinds, key=lambda k: sum(problem.delta(F_, s, k) for s in stages))
                cheapest = min(kinds, key=lambda k: sum(problem.cost[k][s] for s in stages))
                basis = cheapest if policy.cheap_target else rank.least
                rank.kept = {k: sum(problem.delta(F_, s, k) for s in stages) for k in kinds}
                rank.keep_pass = rank.kept[basis]
                rank.keep_most = max(rank.kept[cheapest], rank.kept[rank.least])
                rank.slot = max(rank.needs[k] - rank.kept[k] for k in kinds)
                rank.target = rank.depth if problem.chunks == 1 else problem.ranks
        if policy.staircase and problem.chunks == 1:
            self._staircase()
        self.finish: dict[Op, float] = {}  # op -> its end, for every op run so far
        self.arrived: dict[Op, float] = {}  # op -> when its inputs are on its rank, once they all are
        self.next_f = [0] * self.n  # per stage, the next microbatch to forward (F and B run in microbatch order)
        self.next_b = [0] * self.n
        self.f_op = [_new(Op, (F_, s, 0)) for s in range(self.n)]  # per stage, its next F and B as ops
        self.b_op = [_new(Op, (B_, s, 0)) for s in range(self.n)]
        self.eps = self.tol.eps  # (``tol.le(a, t)`` is ``a <= t + eps``: written out in the loop)
        # Per rank, what a kept microbatch's later local forwards allocate (its reservation when it starts).
        self.later_f = [sum(self.f_mem[x] for x in stages if x != min(stages)) for stages in problem.rank_stages]
        self.heap = [(0.0, r) for r in range(problem.ranks)]  # (clock, rank): always advance the earliest rank
        self.waiters: dict[Op, list[int]] = {}  # unscheduled op -> ranks that wait for it to be scheduled
        # The simulator's times of the ops run so far, for ``stop_above``: per op its end, per rank
        # its first op's start and last op's end, and the F, B and W work it has left.
        self.sim_end: dict[Op, float] = {}
        self.sim_first = [math.nan] * problem.ranks
        self.sim_last = [0.0] * problem.ranks
        self.work_left = [self.m * sum(self.cost[k][s] for s in stages for k in (F_, B_, W_))
                          for stages in problem.rank_stages]
        self.until_check = STOP_CHECK

    def _kept_need(self, r: int) -> float:
        """What one kept microbatch allocates at most through rank r's stages (``min_memory`` without
        the policies, which it counts where the problem declares them)."""
        problem = self.problem
        if not problem.policies:
            return problem.min_memory(r) - problem.static_memory[r] - problem.working_memory[r]
        return _pass_peak(problem, problem.rank_stages[r], None)

    def _delta(self, kind: Kind, s: int, mb: int) -> float:
        """The memory delta of op (kind, s, mb) under the policy its microbatch was started with."""
        policy = self.recomputed.get((s, mb)) if self.recomputed else None
        return self.mem[kind][s] if policy is None else self.problem.delta(kind, s, policy)

    def _staircase(self) -> None:
        """Staircase warm-up depths, along the stages (one per rank): what memory holds, what ends
        by the first B's earliest arrival (timed), and one fewer than the stage before."""
        policy, f = self.policy, self.f_cost
        before = self.m + 1
        for s in range(self.n):
            rank = self.ranks[self.stage_rank[s]]
            if rank.room == math.inf or rank.need <= 0:
                cap = self.m
            else:
                held = (rank.room + self.mtol.eps) // rank.need  # inf for a need as small as 5e-324
                cap = self.m if held >= self.m else int(held)
            if policy.timed_warmup:
                window = f[s] + self.round_trip[s] + (f[s] if policy.overrun_warmup else 0.0)
                cap = min(cap, int((window + self.tol.eps) // f[s])) if f[s] > 0 else cap
            rank.stair = before = max(1, min(cap, before - 1))

    @bulk
    def build(self, name: str) -> Schedule:
        """Run the pass to its end (once): the schedule, or RuntimeError if ranks wait forever (a bug)."""
        while self.heap:
            t, r = _pop_earliest(self.heap, self.tol)
            rank = self.ranks[r]
            if t != rank.clock or not rank.remaining:
                continue  # stale entry
            self.advance(r, t)
            if self.stop_above is not None and self.until_check <= 0:
                self.until_check = STOP_CHECK
                least = self.least_objective()
                if self.tol.gt(least, self.stop_above):
                    raise Worse(least)
        if any(rank.remaining for rank in self.ranks):
            stuck = sorted({w for ws in self.waiters.values() for w in ws})
            raise RuntimeError(f"{name}: greedy scheduler stalled (a bug): ranks {stuck} wait forever")
        return Schedule.from_lists(name, [rank.ops for rank in self.ranks])

    def judged(self) -> tuple[bool, float, float] | None:
        """What ``simulate`` says of the finished pass's schedule, from the pass's own record: (over
        the memory limit, objective, makespan). The simulator's rule, applied as it applies it:
        each op as early as its rank and inputs allow (``sim_end``), the level the running sum of
        the deltas in the rank's order and its peak against the room, the objective from the ranks'
        first starts and last ends. None where more than the compute lane decides (a gradient sync's
        communication lane, sequence chunks) or the objective is ``steady``, or the pass was not
        ``timed``: then only ``simulate`` can say."""
        problem = self.problem
        if (not self.timed or problem.objective not in ("span", "makespan") or problem.sequence_chunks is not None
                or problem.syncs):
            return None
        room = problem.activation_room
        over = room is not None and any(self.mtol.gt(rank.peak, limit) for rank, limit in zip(self.ranks, room))
        ran = [(first, last) for first, last in zip(self.sim_first, self.sim_last) if not math.isnan(first)]
        makespan = max((last for _, last in ran), default=0.0)
        if problem.objective == "span":
            return over, max((last - first for first, last in ran), default=0.0), makespan
        return over, makespan, makespan

    def least_objective(self) -> float:
        """The least objective the simulator can give the pass's schedule, from the ops run so far
        (see the class's docstring)."""
        span = self.problem.objective == "span"
        return max(work if math.isnan(first) else last + work - (first if span else 0.0)
                   for first, last, work in zip(self.sim_first, self.sim_last, self.work_left))

    def advance(self, r: int, t: float) -> None:
        """Rank r is free at t: run what it may, else wait for the next arrival that can end the wait."""
        bs, fs = self.candidates(r)
        choice = self.choose(r, t, bs, fs)
        if choice is None:
            self.wait(r, t, self.wakers(r, bs, fs))
            return
        self.run(choice, r, t)
        heapq.heappush(self.heap, (self.ranks[r].clock, r))
        for w in self.waiters.pop(choice, ()):
            heapq.heappush(self.heap, (self.ranks[w].clock, w))

    def candidates(self, r: int) -> tuple[list[Op], list[Op]]:
        """Rank r's next B and next F of each local stage (in the policy's stage order), whether
        their inputs arrived or not; with the strict switch, no B straight after a B while another
        op can free memory for the forwards left."""
        rank, next_f, next_b, m = self.ranks[r], self.next_f, self.next_b, self.m
        bs = [self.b_op[s] for s in rank.stages if next_b[s] < next_f[s]]
        fs = [self.f_op[s] for s in rank.stages if next_f[s] < m]
        if self.policy.strict and self.problem.chunks == 1 and rank.seen_b and rank.last_fb == B_ and fs:
            if rank.pending_w or any(self.admits(f, r) for f in fs):  # else only a B can free memory
                bs = []
        return bs, fs

    def choose(self, r: int, t: float, bs: list[Op], fs: list[Op]) -> Op | None:
        """What rank r runs at t (None: nothing now): a ready B (its recompute first, where due) or an
        admitted ready F (B first by default), else a pending W where the policy lets it fill the
        wait; with recompute, a forward started recomputed or a recompute ahead of its backward
        (before or after that W, as the policy says)."""
        policy, rank, arrival, until = self.policy, self.ranks[r], self.arrival, t + self.eps
        known = self.arrived.get  # (``arrival``'s own cache, asked here first: the usual case)
        ready_b = [op for op in bs if (known(op) or arrival(op, r)) <= until]
        ready_f = [op for op in fs if (known(op) or arrival(op, r)) <= until]
        admitted_f = [op for op in ready_f if self.admits(op, r)] if ready_f else ready_f
        if ready_b and (policy.b_first or not admitted_f):
            if not self.recomputed:
                return ready_b[0]
            for b in ready_b:  # the first B whose recompute ran (or needs none) or fits now, beside
                due = self.recompute_due(b)  # the room promised to started microbatches' later forwards
                if due is None or self.mtol.le(rank.level + rank.reserved + self._delta(due.kind, due.stage, due.mb),
                                               rank.room):
                    return due or b
            if rank.pending_w:
                return rank.pending_w.pop(0)  # a W frees memory for what the recompute brings back
            return self.recompute_due(ready_b[0])
        if admitted_f:
            return admitted_f[0]
        if self.lighten:
            early = self.start_recomputed(r, ready_f) or (self.early_recompute(r, bs) if policy.early_recompute else None)
            if early is not None and policy.recompute_before_w:
                return self.chosen(early, r)
        else:
            early = None
        if rank.pending_w and (
            policy.eager_w or ready_f or self.fits_gap(r, t, rank.pending_w[0], self.wakers(r, bs, fs))
            or (policy.balance_w and self.gap_exceeds(r, t, self.wakers(r, bs, fs)))
        ):
            return rank.pending_w.pop(0)  # (ready_f here means F waits on memory: W frees it)
        return None if early is None else self.chosen(early, r)

    def start_recomputed(self, r: int, ready_f: list[Op]) -> Op | None:
        """A ready forward that memory keeps from starting its microbatch kept, which may start it
        recomputed (``admits_recomputed``); None if none."""
        return next((op for op in ready_f if self.admits_recomputed(op, r) is not None), None)

    def chosen(self, op: Op, r: int) -> Op:
        """``op`` as rank r runs it: a forward that starts its microbatch recomputed marks the
        microbatch recomputed on every stage of the rank (with the kind ``admits_recomputed`` picks)."""
        if op.kind is F_:
            kind = self.admits_recomputed(op, r)
            stages = self.problem.rank_stages[r]
            self.recomputed.update(((s, op.mb), kind) for s in stages)
            self.ranks[r].remaining += len(stages)
            self.ranks[r].unrecomputed += len(stages)
        return op

    def recompute_due(self, b: Op) -> Op | None:
        """The recompute that must run before backward ``b``, if its microbatch recomputes and that
        has not run yet."""
        kind = self.recomputed.get((b.stage, b.mb)) if self.recomputed else None
        if kind is None:
            return None
        op = Op(kind, b.stage, b.mb)
        return None if op in self.finish else op

    def early_recompute(self, r: int, bs: list[Op]) -> Op | None:
        """A recompute rank r may run now, ahead of its backward's inputs: the one due before the
        next B of a local stage, if memory holds what it brings back."""
        rank = self.ranks[r]
        for b in bs:
            op = self.recompute_due(b)
            # what it brings back fits, leaving room for a recompute of another local stage still to
            # come (one stage's recomputes run in turn, each after the last one's backward)
            other = rank.slot if len(rank.stages) > 1 and rank.unrecomputed > 1 else 0.0
            if op is not None and self.mtol.le(rank.level + rank.reserved + self._delta(op.kind, op.stage, op.mb)
                                               + other, rank.room):
                return op
        return None

    def admits_recomputed(self, op: Op, r: int) -> Kind | None:
        """The recompute kind (cheapest in time over the rank's stages first) with which ``op``, a
        ready forward that memory keeps waiting, may start its microbatch on rank r: its first local
        forward, every gate of ``admits`` but memory passed, and one microbatch recomputed through
        the rank's stages fits beside what the rank holds and has promised. None: none fits."""
        rank, problem = self.ranks[r], self.problem
        if op.stage != rank.first or not self.admits(op, r, memory=False):
            return None
        stages, more = problem.rank_stages[r], self.more(rank)
        for kind in sorted(self.lighten, key=lambda k: sum(problem.cost[k][s] for s in stages)):
            if self.room_for(rank, rank.kept[kind] + rank.slot + more * rank.keep_pass):
                return kind
        # Short of the warm-up depth anyway: the kind that keeps least, if one microbatch fits.
        return rank.least if self.room_for(rank, rank.needs[rank.least]) else None

    def room_for(self, rank: RankState, need: float, decides: bool = True) -> bool:
        """Whether ``need`` fits on the rank beside what it holds (and, unless lean, has promised);
        ``decides``: the pass acts on the answer (else a what-if: ``lean_matters`` is left alone)."""
        lean = self.mtol.le(rank.level + need, rank.room)
        full = self.mtol.le(rank.level + rank.reserved + need, rank.room)
        if lean != full and decides:
            self.lean_matters = True
        return lean if self.policy.lean else full

    def to_come(self, rank: RankState, keep: float | None = None) -> float:
        """With recompute: the room a new microbatch leaves for the rest of the warm-up depth
        (``target``), recomputed: their forwards' keep (``keep`` each, default the policy's) and one
        recompute's bring-back."""
        more = self.more(rank)
        if more > 0:
            return more * (rank.keep_pass if keep is None else keep) + rank.slot
        return rank.slot if rank.unrecomputed else 0.0  # room for the recompute still to come

    def more(self, rank: RankState) -> int:
        """How many microbatches short of the warm-up depth the rank is once it starts one more."""
        return max(0, rank.target - (rank.started - rank.finished) - 1)

    def wakers(self, r: int, bs: list[Op], fs: list[Op]) -> list[Op]:
        """The candidates whose arrival can end rank r's wait: a B, or an F that memory admits,
        kept or (with recompute) recomputed (memory frees only by B and W here)."""
        if self.lighten:
            return bs + [f for f in fs if self.admits(f, r) or self.admits_recomputed(f, r) is not None]
        return bs + [f for f in fs if self.admits(f, r)]

    def wait(self, r: int, t: float, wakers: list[Op]) -> None:
        """Rank r idles from t: until the first of ``wakers`` arrives, or, when each waits on a
        producer not yet scheduled, until one of those is."""
        arrivals = (self.arrival(op, r) for op in wakers)
        upcoming = [a for a in arrivals if self.tol.gt(a, t) and a < math.inf]
        if upcoming:
            self.ranks[r].clock = min(upcoming)
            heapq.heappush(self.heap, (self.ranks[r].clock, r))
            return
        for op in wakers:
            for d in self.producers_of(op):
                if d not in self.finish:
                    self.waiters.setdefault(d, []).append(r)

    def producers_of(self, op: Op) -> list[Op]:
        deps = self.deps.get(op)
        if deps is None:
            kind, s, mb = op
            needs = self.needs.get((kind, s))
            if needs is None:  # (what an op needs depends on its kind and stage alone)
                needs = self.needs[kind, s] = tuple((usual, t) for _, usual, t in stage_needs(kind, s, self.depth))
            deps = self.deps[op] = [_new(Op, (usual, t, mb)) for usual, t in needs]
        return deps

    def arrival(self, op: Op, r: int) -> float:
        """When ``op``'s inputs are all on rank r, its own (inf while a producer is unscheduled)."""
        t = self.arrived.get(op)
        if t is not None:
            return t
        t, finish, comm, stage_rank = 0.0, self.finish, self.comm, self.stage_rank
        for d in self.deps.get(op) or self.producers_of(op):
            done = finish.get(d)
            if done is None:
                return math.inf
            t = max(t, done + (comm if stage_rank[d[1]] != r else 0.0))
        self.arrived[op] = t  # (final once every producer ran)
        return t

    def first_arrivals(self, r: int) -> list[float]:
        """When the first microbatch's next pieces of work can reach rank r at the earliest: the
        forward of each later local stage, and the rank's first B (once its last stage's forward
        ran), counted from what the rank has done of microbatch 0 so far."""
        rank, finish, head = self.ranks[r], self.finish, self.head
        lo, hi = rank.first, rank.last
        out = []
        f_lo = finish.get(Op(F_, lo, 0))
        if f_lo is not None:
            out += [f_lo - self.f_cost[lo] + head[s] - head[lo] for s in self.problem.rank_stages[r]
                    if s != lo and Op(F_, s, 0) not in finish]
        f_hi = finish.get(Op(F_, hi, 0))
        if f_hi is not None:
            out.append(f_hi + self.round_trip[hi])
        return out

    def admits(self, op: Op, r: int, memory: bool = True) -> bool:
        """May ``op`` (an F) run on rank r now? Only a microbatch's first forward on the rank is
        gated: its later local forwards were reserved and must stay free to run (or it deadlocks).
        ``memory`` False: every gate but memory (a kept microbatch's)."""
        policy, rank, mtol = self.policy, self.ranks[r], self.mtol
        if op.stage != rank.first:
            if mtol.le(rank.level + self._delta(F_, op.stage, op.mb), rank.room):
                return True
            self.lean_matters = True  # (only a lean pass gates these)
            return not policy.lean
        if policy.alternate and rank.seen_b and rank.last_fb == F_:
            return False  # steady state: a B between two new microbatches
        if policy.shallow_warmup and not rank.seen_b and rank.started >= rank.depth:
            return False
        if policy.staircase and not rank.seen_b and rank.started >= rank.stair:
            return False
        if policy.timed_warmup and not rank.seen_b:
            end = rank.clock + (0.0 if policy.overrun_warmup else self.f_cost[op.stage])
            if any(self.tol.gt(end, due) for due in self.first_arrivals(r)):
                return False
        if not memory:
            return True
        if rank.kept and not self.memory_gated:  # (the strictest gate passes: every gate passes)
            self.memory_gated = not self.room_for(rank, rank.need + self.to_come(rank, rank.keep_most), decides=False)
        if self.lighten:  # a kept microbatch leaves room to reach the warm-up depth with recomputed ones
            return self.room_for(rank, rank.need + self.to_come(rank))
        return self.room_for(rank, rank.need)

    def fits_gap(self, r: int, t: float, w: Op, wakers: list[Op]) -> bool:
        """True when nothing useful (``wakers``) can arrive on rank r before W would end."""
        soon = min((self.arrival(op, r) for op in wakers), default=math.inf)
        return self.tol.ge(soon, t + self.w_cost[w.stage])

    def gap_exceeds(self, r: int, t: float, wakers: list[Op]) -> bool:
        """True when waiting on rank r for the next of ``wakers`` would make its idle time so far the
        largest of all ranks (then a W that overruns the arrival is the smaller loss)."""
        gap = min((self.arrival(op, r) for op in wakers), default=math.inf) - t
        return gap < math.inf and self.tol.gt(self.ranks[r].idle + gap, max(rank.idle for rank in self.ranks))

    def run(self, op: Op, r: int, t: float) -> None:
        """Run ``op`` on rank r from t: its end, the rank's memory and reservations, what comes next."""
        kind, s, mb = op
        rank, cost = self.ranks[r], self.cost[kind][s]
        end = t + cost
        if rank.ops:
            rank.idle += max(0.0, t - rank.last_end)
        rank.last_end = rank.clock = self.finish[op] = end
        rank.ops.append(op)
        rank.remaining -= 1
        if self.timed:  # (the simulator's time of the op: after its rank's last op and its inputs)
            self.until_check -= 1
            sim_end, comm, stage_rank = self.sim_end, self.comm, self.stage_rank
            begin = self.sim_last[r]
            for d in self.deps.get(op) or self.producers_of(op):
                done = sim_end[d] + (comm if stage_rank[d[1]] != r else 0.0)
                if done > begin:
                    begin = done
            if len(rank.ops) == 1:
                self.sim_first[r] = begin
            self.sim_last[r] = sim_end[op] = begin + cost
            if kind is F_ or kind is B_ or kind is W_:
                self.work_left[r] -= cost
        plain = not self.recomputed
        rank.level += self.mem[kind][s] if plain else self._delta(kind, s, mb)
        if rank.level > rank.peak:
            rank.peak = rank.level
        if kind is F_:
            rank.last_fb = kind
            if s == rank.first:
                rank.started += 1
                rank.reserved += self.later_f[r] if plain else sum(
                    self._delta(F_, x, mb) for x in self.problem.rank_stages[r] if x != s)
            else:
                rank.reserved -= self.f_mem[s] if plain else self._delta(F_, s, mb)
            self.next_f[s] += 1
            self.f_op[s] = _new(Op, (F_, s, self.next_f[s]))
        elif kind is B_:
            rank.last_fb = kind
            rank.seen_b = True
            self.next_b[s] += 1
            self.b_op[s] = _new(Op, (B_, s, self.next_b[s]))
            rank.pending_w.append(_new(Op, (W_, s, mb)))
        elif kind is W_:
            if s == rank.first:
                rank.finished += 1
        else:  # a recompute
            rank.unrecomputed -= 1


def _pass_peak(problem: Problem, stages, kind: Kind | None) -> float:
    """The highest activation level one microbatch reaches through ``stages`` (one rank's),
    forwards ascending, then backward and weight gradient descending, each (stage, microbatch)
    kept (``kind`` None) or recomputed with ``kind`` (R or S, brought back before its backward)."""
    f, b, w = problem.mem_deltas
    level = peak = 0.0
    for s in stages:
        level += problem.delta(F_, s, kind)
        peak = max(peak, level)
    for s in reversed(stages):
        if kind is not None:
            level += problem.delta(kind, s, kind)
            peak = max(peak, level)
        level += b[s]
        peak = max(peak, level)
        level += w[s]
    return peak


def _round_trips(problem: Problem) -> list[float]:
    """Per stage s, from the end of F(s, i) to the earliest start of B(s, i): up through the later
    stages of its pipeline and back."""
    f, b, stage_rank = problem.cost[Kind.F], problem.cost[Kind.B], problem.stage_rank
    round_trip = [0.0] * problem.n_stages
    for s in range(problem.n_stages - 2, -1, -1):
        if (s + 1) % problem.pipeline_stages == 0:  # the last stage of its pipeline
            continue
        hop = problem.comm if stage_rank[s] != stage_rank[s + 1] else 0.0
        round_trip[s] = round_trip[s + 1] + f[s + 1] + b[s + 1] + 2 * hop
    return round_trip


def _forward_heads(problem: Problem) -> list[float]:
    """Per stage, the earliest start of F(s, 0) if the forward chain runs without a wait (the last
    stage's included), along its own pipeline."""
    f, stage_rank = problem.cost[Kind.F], problem.stage_rank
    head = [0.0] * problem.n_stages
    for s in range(1, problem.n_stages):
        if s % problem.pipeline_stages == 0:  # the first stage of its pipeline
            continue
        head[s] = head[s - 1] + f[s - 1] + (problem.comm if stage_rank[s - 1] != stage_rank[s] else 0.0)
    return head


def _pop_earliest(heap: list[tuple[float, int]], tol: Tolerance) -> tuple[float, int]:
    """Pop the next (clock, rank) to advance: the earliest; ranks free at the same time up to
    float noise go in rank order, as exact ties do."""
    first = heapq.heappop(heap)
    if not heap or tol.gt(heap[0][0], first[0]):
        return first
    tied = [first]
    while heap and tol.le(heap[0][0], first[0]):
        tied.append(heapq.heappop(heap))
    pick = min(tied, key=lambda entry: entry[1])
    for entry in tied:
        if entry is not pick:
            heapq.heappush(heap, entry)
    return pick


NEWER = ("balance_w", "staircase", "strict")  # the switches added for comm-heavy problems
PAPER_LIKE = Policy(b_first=False, eager_w=False, alternate=True, timed_warmup=True, balance_w=True)


_SEARCHED: dict[str, Schedule] = {}  # a problem (as JSON) -> best_greedy's schedule, the last few
_SEARCHED_KEPT = 4


def best_greedy(problem: Problem, name: str) -> Schedule:
    """Search the policy switches one at a time (keep a flip when the simulator says it is better,
    until no flip helps), so the cost grows with the number of switches, not 2 ** switches; from
    two starts, and on its own from a third (coordinate search stops at local optima). Every
    variant is built and judged under the problem's own memory limit. The search of a problem is
    kept for the next call (zb-1p and zb-2p search the problem itself where its limit is below
    their cap: one search, not three, in a comparison)."""
    key = problem.model_dump_json()
    if key not in _SEARCHED:
        if len(_SEARCHED) >= _SEARCHED_KEPT:
            del _SEARCHED[next(iter(_SEARCHED))]
        *_, (_SEARCHED[key], _) = greedy_search(problem, name)
    return _SEARCHED[key].renamed(name)


FORECAST_RANKS = 4  # the forecast's smaller problem: this many microbatches per rank (``_forecast``)
FORECAST_FROM = 4  # a forecast where the problem has at least this many times its microbatches
FORECAST_OPS = 100_000  # and at least this many F, B and W (below, the whole search takes seconds)


def greedy_search(problem: Problem, name: str, stop_early: bool = True) -> Iterator[tuple[Schedule, bool]]:
    """``best_greedy``'s search, as it goes: yields (schedule, whether it fits) for each schedule
    that beats every one before it (fitting before not fitting, then by objective and makespan),
    the last being ``best_greedy``'s result. A caller short of time (the solver's warm start on a
    large problem, where each variant takes seconds to build) keeps the last it got.

    ``stop_early``: a variant's pass stops as soon as it cannot beat the one it is judged against
    (``ListScheduler.stop_above``); the search decides the same and yields the same schedules
    (tested), faster. False builds every pass whole.

    On a large problem the search first builds its forecast (``_forecast``): the policy the same
    search ends at with fewer microbatches. Where that schedule meets the lower bound, the search
    ends there; else it goes on as without it and ends at the better of the two."""
    for schedule, fits, _ in _search(problem, name, stop_early):
        yield schedule, fits


def _forecast(problem: Problem, name: str, stop_early: bool) -> Policy | None:
    """The policy that the search ends at on ``problem`` cut to ``FORECAST_RANKS`` microbatches per
    rank, where the problem is large (``FORECAST_FROM``, ``FORECAST_OPS``); None elsewhere, or where
    that schedule does not fit. With identical microbatches, the schedules of one policy differ
    between two counts of microbatches mostly by the length of their steady state, so the best
    policy of the smaller problem is often the best, or near it, of the larger: measured at p 64,
    v 2, m 1024 (393k ops), the forecast from m 256 builds the search's own result, which meets the
    bound, in 22 s of CPU against the whole search's 61-67 s (benchmarks/RESULTS.md, "the four cells
    at m = 1024"). A heuristic: the search goes on after it unless it is proven optimal."""
    few = FORECAST_RANKS * problem.ranks
    m = problem.microbatches
    if m <= few or m < FORECAST_FROM * few or 3 * problem.n_stages * m < FORECAST_OPS:
        return None
    try:
        smaller = problem.with_changes(microbatches=few)
    except ProblemError:  # (a problem whose fields tie them to its microbatches)
        return None
    *_, (_, fits, policy) = _search(smaller, name, stop_early)
    return policy if fits else None


def _search(problem: Problem, name: str, stop_early: bool) -> Iterator[tuple[Schedule, bool, Policy]]:
    """``greedy_search``, with the policy of each schedule it yields."""
    seen: dict[Policy, tuple] = {}  # policy -> (over the limit, objective, makespan, schedule)
    cut: dict[Policy, float] = {}  # policy -> the least objective of its pass, stopped early (``Worse``)
    judged: dict[tuple, tuple] = {}  # a schedule's ops -> its (over, objective, makespan)
    inert: dict[Policy, frozenset[str]] = {}  # policy -> the switches whose flip builds the same pass
    deps: dict[Op, list[Op]] = {}  # each op's producers, for every pass
    tol = problem.time_tol

    def score(policy: Policy, above: float | None = None) -> tuple | None:
        """(over the limit, objective, makespan) of ``policy``'s pass; None when the pass cannot
        reach ``above`` or less (the objective of a fitting schedule it would have to beat), so
        that it was stopped early (then it is built whole only if asked again against more)."""
        if policy not in seen:
            if policy in cut and (above is not None and tol.gt(cut[policy], above)):
                return None
            scheduler = ListScheduler(problem, policy, deps, stop_above=above if stop_early else None, timed=True)
            try:
                schedule = scheduler.build(name)
            except Worse as e:
                cut[policy] = e.least
                return None
            except RuntimeError:  # a variant stalled (as lean reservations can): not a candidate
                seen[policy] = (True, math.inf, math.inf, None)
            else:
                if schedule.ranks not in judged:  # (variants often build the same schedule)
                    judged[schedule.ranks] = scheduler.judged() or _simulated(problem, schedule)
                seen[policy] = (*judged[schedule.ranks], schedule)
                inert[policy] = same_pass(policy, scheduler)
        return seen[policy][:3]

    def better(a: Policy, b: Policy) -> bool:
        """a's schedule beats b's: it fits and b's does not, or it is faster by (objective,
        makespan) beyond float noise. b's pass is built whole; a's stops as soon as it cannot beat
        b's objective (where b's fits), as it then cannot beat b."""
        b_over, b_obj, b_make = score(b)
        a_score = score(a, None if b_over else b_obj)
        if a_score is None:
            return False
        a_over, a_obj, a_make = a_score
        if a_over != b_over:
            return b_over
        if not tol.eq(a_obj, b_obj):
            return a_obj < b_obj
        return tol.lt(a_make, b_make)

    top: Policy | None = None  # the best so far, over every start

    def news(policy: Policy) -> Iterator[tuple[Schedule, bool, Policy]]:
        """``policy``'s schedule if it beats every one before it."""
        nonlocal top
        score(policy)
        if seen[policy][3] is not None and (top is None or better(policy, top)):
            top = policy
            yield seen[policy][3], not seen[policy][0], policy

    def descend(best: Policy, flags: tuple[str, ...]):
        """Flip one of ``flags`` at a time from ``best``, keeping a flip that helps, until none
        does (a generator: yields the news, returns the policy it ends at)."""
        improved = True
        while improved and not optimal(best):
            improved = False
            for flag in flags:
                if flag in inert.get(best, ()):
                    continue  # (the flip builds the same schedule)
                other = replace(best, **{flag: not getattr(best, flag)})
                if better(other, best):
                    best, improved = other, True
                    yield from news(best)
        return best

    def optimal(policy: Policy) -> bool:
        """Its schedule fits and meets the lower bound: no switch can do better."""
        over, objective, _ = score(policy)
        return not over and meets(objective, bound)

    try:
        bound = lower_bound(problem).value
    except ValueError:  # the bounds refuse a kind (recompute, offload): no bound, so no early stop
        bound = -math.inf
    flags = flags_for(problem)
    forecast = _forecast(problem, name, stop_early)
    if forecast is not None:
        yield from news(forecast)
        if optimal(forecast):
            return
    best, other = Policy(), Policy(b_first=False, alternate=True, shallow_warmup=True)  # two starts
    yield from news(best)
    if better(other, best):
        best = other
        yield from news(best)
    # First the older switches alone, then all of them from there: never worse than the older search.
    best = yield from descend(best, tuple(f for f in flags if f not in NEWER))
    best = yield from descend(best, flags)
    # A third start, searched on its own: the paper's steady state (F and B in turn, W into the
    # bubbles they fill or to balance them, a timed warm-up) sits apart from the first two.
    if not optimal(best):
        third = yield from descend(replace(PAPER_LIKE, staircase="staircase" in flags, strict="strict" in flags), flags)
        if better(third, best):
            best = third
    if forecast is not None and better(forecast, best):
        best = forecast
    if seen[best][3] is None:  # every variant stalled: memory only offload can buy (the list scheduler
        # never offloads); the schedule without the limit, which the judge then finds over it
        unlimited = problem.with_changes(memory={"limit": None})
        yield greedy_schedule(unlimited, best, name), False, best
    elif best != top:  # (the news already said it otherwise)
        yield seen[best][3], not seen[best][0], best


def _simulated(problem: Problem, schedule: Schedule) -> tuple[bool, float, float]:
    """(over the memory limit, objective, makespan), as ``simulate`` times ``schedule``."""
    t = simulate(problem, schedule)
    return not t.fits, t.objective_value(), t.makespan


def same_pass(policy: Policy, scheduler: ListScheduler) -> frozenset[str]:
    """The switches whose flip would build the same schedule as ``scheduler``'s pass of ``policy``
    (every decision of the pass the same): the recompute switches where no memory gate would have
    held a microbatch back under the strictest of them (``memory_gated``), ``lean`` where no memory
    gate decided otherwise than with it flipped, ``overrun_warmup`` without ``timed_warmup`` and
    ``balance_w`` with ``eager_w`` (each read only under the other)."""
    out = set() if scheduler.memory_gated else set(RECOMPUTE_FLAGS)
    if not scheduler.lean_matters:
        out.add("lean")
    if not policy.timed_warmup:
        out.add("overrun_warmup")
    if policy.eager_w:
        out.add("balance_w")
    return frozenset(out)


def reference_limit(problem: Problem, microbatches_per_rank: float) -> tuple[float, ...]:
    """Static and working memory plus ``k`` microbatches through each rank's stages (k = p: 1F1B's
    rank 0)."""
    f = problem.mem[Kind.F]
    return tuple(
        problem.static_memory[r] + problem.working_memory[r]
        + microbatches_per_rank * sum(f[s] for s in problem.rank_stages[r])
        for r in range(problem.ranks)
    )


def _capped(problem: Problem, k: float) -> Problem:
    """``problem`` with its memory limit capped at k p microbatches through each rank's stages
    (never below what one microbatch needs)."""
    ref = reference_limit(problem, k * problem.ranks)
    ref = tuple(max(x, problem.min_memory(r)) for r, x in enumerate(ref))
    own = problem.memory_limit
    if own is not None and all(a <= b for a, b in zip(own, ref)):
        return problem  # the cap changes nothing: the same problem (and best_greedy's kept search)
    limit = ref if own is None else tuple(min(a, b) for a, b in zip(own, ref))
    return problem.with_changes(memory={"limit": list(limit)})


CAPS = {"zb-greedy": None, "zb-1p": 1, "zb-2p": 2}  # the greedy registry schedules: cap in p microbatches per rank


def capped_for(problem: Problem, name: str) -> Problem:
    """The problem the greedy registry schedule ``name`` searches (``problem`` itself where its
    cap changes nothing)."""
    k = CAPS[name]
    return problem if k is None else _capped(problem, k)


@register(
    "zb-greedy",
    "memory-aware zero bubble: F as memory allows, B first, W into gaps, under the problem's limit",
    split_backward=True,
    requires=any_placement,
)
def zb_greedy(problem: Problem) -> Schedule:
    return best_greedy(problem, "zb-greedy")


@register(
    "zb-1p",
    "memory-aware zero bubble capped at 1F1B's activation memory (p microbatches per rank)",
    split_backward=True,
    requires=any_placement,
)
def zb_1p(problem: Problem) -> Schedule:
    return best_greedy(capped_for(problem, "zb-1p"), "zb-1p")


@register(
    "zb-2p",
    "memory-aware zero bubble capped at twice 1F1B's activation memory (2p microbatches per rank)",
    split_backward=True,
    requires=any_placement,
)
def zb_2p(problem: Problem) -> Schedule:
    return best_greedy(capped_for(problem, "zb-2p"), "zb-2p")
