"""The ILP: the fastest zero-bubble schedule under the memory limit, with a proven bound: the
PuLP model and its search, registered as the search backends "cbc" and "highs" (the solve driver,
the warm start and the status are ``solvers/search/solve.py``'s).

Variables: a start time per op (F, B, W of every stage and microbatch) and, for each pair of
ops on one rank whose order no dependency fixes, a binary "a before b". Constraints:

- data: an op starts after each input's end, plus ``comm`` across ranks;
- one op at a time per rank: each free pair is ordered one way or the other (big-M, each pair's
  from the ops' windows of earliest and latest starts); microbatches are numbered in the order
  they enter stage 0 (no loss: they are interchangeable), which breaks the symmetry between them,
  and the W of a stage run in the order of their B (no loss either, see ``_Model``);
- memory: at every F, static memory plus the deltas of the ops ordered before it, plus its own,
  stays within the limit (a linear function of the same binaries); and the activation held
  integrated over time fits under the limit over the rank's window (a cut in the start times);
- objective: makespan (every W ends by C) or span (every W ends by C plus its rank's first start,
  a variable below every start on the rank);
- gradient syncs: with ``data_parallel``, per stage an all-reduce AR on its rank's communication
  lane, after every W of the stage (with ``overlap`` off, after every op of the rank); with
  ``replicas``, per model stage a gradient sum RS of its copies, one start for all its members,
  after every W of each; the lane's ops one at a time (a binary per pair; the reduces at the end
  later stage first, the collectives in their one order, as ``comm_lane`` issues them), each
  ending by C (plus the rank's first start, for span). The reduces' order among themselves is
  otherwise free in the model; the simulator runs them in issue order, which on one lane with
  release times ends no later.

Memory for time (a problem that declares ``recompute``): a binary z per (stage, microbatch) and
recompute policy (R, and S with ``recompute.selective``; at most one of them per pair). Each R and
S op is always in the model, lasting its time x z; where z = 0 it sits right after its F in the
rank's order (for every other op c of the rank but the pair's other recompute op, c runs before
the F exactly when it runs before the R: -z <= first(c, F) - first(c, R) <= z), so the deltas are
constants (``common.model_deltas``) and the memory rows, at every F, R and S, stay linear. The
schedule read back holds an R or S only where its z is 1. Offload is not modelled here (CP-SAT
does): where the problem declares it the search covers the schedules without offload only, and
its bound is dropped.

Overlapped pairs (``costs.FB`` faster than a forward then a B, on a rank): a binary per forward
and B of another (stage, microbatch) on the rank that no edge orders (``_pair_rows``): at most one
pair per op; a pair's two ops start together, the forward first in the order (so the memory rows
count its allocation before the B's free, as the simulator does), each lasting the pair's time,
their two order rows relaxed. The windows and the sum-of-durations cuts count each such F and B
at its cost scaled so that two that may pair sum to at most the pair's time, and a B's "before"
cut leaves its pair's forward out: every cut holds for a schedule with pairs. A neighbourhood may
pair the ops of its window and keeps the incumbent's pairs outside it (its windows hold both ops
of a pair or neither). Not with recompute (whose ops are placed by position): there the search
makes no pairs and its bound is dropped.

Sequence chunks (``Problem.sequence_chunks``, Seq1F1B): the ops are per unit (a chunk of a
sequence: ``mb = sequence * k + chunk``), each with its own cost and memory (``Problem.op_cost``,
``op_delta``), the chunk rule among the edges (``common.order_edges``); sequences, not units, are
interchangeable, so the symmetry edge orders the sequences' first chunks on stage 0 and the W
follow their B only within one chunk position (units of one position cost and free the same).

The search: the whole model up to FULL_MODEL_OPS ops; above that, a large-neighbourhood search
over windows of the incumbent's order (``_neighbourhoods``). The order found is re-timed by the
simulator (as soon as possible) in the driver, which is never later than the ILP's times.

Units: the model is built with times in units of the power of two nearest the problem's time
scale (its largest op cost) and memory likewise (``_model_units``), an exact change of units, so
the MIP solvers' absolute tolerances mean the same whatever unit the problem is written in; the
comparisons of results are relative (``schedc.tolerance``).
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from schedc.errors import SchedcError
from schedc.kinds import RECOMPUTES, Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, comm_ops, fixed_orders, lead, sync_waits_for
from schedc.simulate import Timeline, simulate
from schedc.solvers.search import cbc
from schedc.solvers.search.common import (
    WINDOW_MIN_SECONDS, Found, Progress, Settings, descendants, longest_paths, model_deltas, model_kinds,
    model_op_deltas, order_edges, register_backend,
)
from schedc.solvers.deadline import END, LATE, Budget, Worker, WorkerDied, in_child
from schedc.tolerance import meets

FULL_MODEL_OPS = 600  # above this many ops (p = 8, m = 24 has 576), search neighbourhoods instead
SOLUTION_SECONDS = 0.5  # kept after the solver's end to read its solution back
WINDOW_OPS = 36  # ops per rank a neighbourhood reorders (about 12 microbatches' F, B, W)
WINDOW_SECONDS = 20.0  # at most per neighbourhood (and at most half the time left)
MIN_WINDOW_MICROBATCHES = 2  # windows are halved down to this many microbatches when they run out of time
GIVE_UP = 1  # windows of the smallest size that run out of time (finding nothing) before the search gives up
POLICY_WINDOW_SHARE = 0.25  # of the time left, at most, for one window where the model chooses recompute
SPLIT = (Kind.F, Kind.B, Kind.W)  # the kinds of the model's ops: the backward split
def augmented(problem: Problem, schedule: Schedule) -> Schedule:
    """``schedule``'s compute lanes with every recompute op the model holds and the schedule does
    not (a policy it did not choose) right after its F: the order the model sees it as."""
    kinds = problem.recomputes
    held = set(schedule.ops())
    per_rank = []
    for ops in schedule.ranks:
        out = []
        for op in ops:
            out.append(op)
            if op.kind == Kind.F:
                out += [x for k in kinds if (x := Op(k, op.stage, op.mb)) not in held]
        per_rank.append(out)
    return Schedule.from_lists(schedule.name, per_rank)

class _Model:
    """The ILP of one problem, built with PuLP.

    With ``keep`` (a schedule) and ``window`` (per rank, a range of positions in keep's order),
    it is a neighbourhood of ``keep``: only the ops in each rank's window may be reordered, among
    themselves; every other pair keeps keep's order (large neighbourhood search).

    What makes it tighter than the plain big-M model, all of it exact:

    - windows: each op starts between its earliest start (longest path from the sources) and the
      horizon minus its tail (longest path to the end), and each pair's big-M is the largest
      amount by which its constraint can be violated within those windows, not the horizon;
      a pair that cannot run one way round within the windows is ordered the other way (and
      the windows recomputed with that edge, until nothing changes);
    - W follow B: on each stage, the W run in the order of their B (one binary for both pairs).
      No optimum is lost: two W of one stage last as long and free as much, and no op consumes a
      W, so handing a schedule's W slots of a stage to its microbatches in B order keeps every
      time and memory level; the k-th W slot is no earlier than k of the B have ended, so each W
      still starts after its own B;
    - memory-time: on a rank, the activation held integrated over time (a microbatch holds its
      F's allocation from the F's start to the B's, then what the B left until the W) is at most
      the room times the rank's window: a linear cut in the start times.
    """

    def __init__(
        self,
        problem: Problem,
        horizon: float,
        lower: float = 0.0,
        keep: Schedule | None = None,
        window: list[range] | None = None,
    ):
        import pulp

        self.problem = problem
        n, m = problem.n_stages, problem.units  # (units: microbatches x sequence chunks)
        self.kinds = model_kinds(problem)
        self.ops = [Op(k, s, i) for s in range(n) for i in range(m) for k in self.kinds]
        self.index = index = {op: k for k, op in enumerate(self.ops)}
        self.cost = [problem.op_cost(op.kind, op.stage, op.mb) for op in self.ops]
        # The shortest each op can last (a recompute not chosen lasts 0; an op that may run in an
        # overlapped pair, its share of the pair: ``_pairable``): windows, cuts and edges.
        self.dur = [0.0 if op.kind in RECOMPUTES else c for op, c in zip(self.ops, self.cost)]
        self.pair_time = _pairable(problem, self.ops, self.dur)
        self.held = set(keep.ops()) if keep is not None else set()  # the incumbent's ops (its policies)
        # (with recompute the model places recompute ops by position and makes no pairs: none kept)
        kept_pairs = keep.paired() if keep is not None and not problem.recomputes else {}
        if keep is not None:
            keep = augmented(problem, keep)

        edges = order_edges(problem, self.ops, index, in_order=keep if keep is not None else False)
        # B waits for every recompute op of its (stage, microbatch) (producers names the first).
        edges += [(index[Op(k, s, i)], index[Op(Kind.B, s, i)], 0.0)
                  for k in self.kinds if k in RECOMPUTES for s in range(n) for i in range(m)]
        self.free = set(range(len(self.ops)))  # ops whose order on their rank is open
        # A neighbourhood keeps the incumbent's pairs outside its window (``fixed``: op -> the pair's
        # time): the two start together (the kept edge from the forward, less the pair's time, and a
        # row back), each lasting the pair's time; the window reaches to both ops of a pair or neither.
        self.fixed: dict[int, float] = {}
        self.fixed_pairs: list[tuple[int, int]] = []
        if keep is not None:
            self.free, kept = _kept_order(index, keep, window)
            for f, b in kept_pairs.items():
                fi, bi = index[f], index[b]
                if (fi in self.free) != (bi in self.free):
                    raise ValueError(f"the window holds one op of the pair {f}, {b} only")
                if fi not in self.free:
                    self.fixed[fi] = self.fixed[bi] = problem.pair_time(f.stage, b.kind, b.stage)
                    self.fixed_pairs.append((fi, bi))
            together = set(self.fixed_pairs)
            edges += [(x, y, -self.fixed[x] if (x, y) in together else lat) for x, y, lat in kept]
        self.on_rank: list[list[int]] = [[] for _ in range(problem.ranks)]
        for k, op in enumerate(self.ops):
            self.on_rank[problem.stage_rank[op.stage]].append(k)
        # (W pair, its B pair) of one stage, both as (lower microbatch, higher): tied in the full
        # model (in a neighbourhood the W outside the window keep their place).
        self.twins = {} if keep is not None else _w_follow_b(self.ops, index, n, m, problem.seq_chunks)
        edges, earliest, latest, self.reach = _windows(
            self.dur, edges, self.on_rank, self.free, horizon, self.twins, fix=keep is None, open_pair=self._may_pair
        )

        self.lp = pulp.LpProblem("schedc", pulp.LpMinimize)
        self.start = [
            self.lp.add_variable(f"s{k}", lowBound=earliest[k], upBound=max(earliest[k], latest[k]))
            for k in range(len(self.ops))
        ]
        # Per recompute op, its binary: 1 when its (stage, microbatch) takes that policy.
        self.chosen: dict[int, pulp.LpVariable] = {}
        for k, op in enumerate(self.ops):
            if op.kind in RECOMPUTES:
                z = self.lp.add_variable(f"z{k}", cat="Binary")
                if keep is not None and k not in self.free:  # outside the window: the incumbent's policy
                    z.lowBound = z.upBound = 1 if op in self.held else 0
                self.chosen[k] = z
        # Per forward and backward of a rank that may run as an overlapped pair, its binary
        # (``_pair_rows``); ``paired[k]``: the sum of op k's, 1 when it runs in a pair.
        self.pairs: dict[tuple[int, int], pulp.LpVariable] = {}
        self.paired: dict[int, list] = {}
        for ks in self.on_rank:
            for f in ks:
                for b in ks:
                    if self._may_pair(f, b) and not (self.reach[f] >> b & 1 or self.reach[b] >> f & 1):
                        z = self.pairs[f, b] = self.lp.add_variable(f"p{f}_{b}", cat="Binary")
                        self.paired.setdefault(f, []).append(z)
                        self.paired.setdefault(b, []).append(z)
        for a, b, lat in edges:
            self.lp += self.start[b] >= self.start[a] + self.length(a) + lat
        for f, b in self.fixed_pairs:
            self.lp += self.start[b] <= self.start[f]
        self.before: dict[tuple[int, int], pulp.LpVariable] = {}  # (a, b) with a < b: 1 if a first
        self._order_pairs(earliest, latest)
        self._pair_rows(earliest, latest)
        self._policy_rows()
        if problem.memory_limit is not None:
            self._memory_rows()
        slack = 1e-6 * max(1.0, abs(lower))  # float noise must not make the model infeasible
        self.C = self.lp.add_variable("C", lowBound=lower - slack, upBound=horizon + slack)
        self.first_start: list = []  # per rank, its first start (a variable; ``_rank_rows``)
        for r, ks in enumerate(self.on_rank):
            self._rank_rows(r, ks, min(earliest[k] for k in ks))
        self.comm_start: dict[Op, pulp.LpVariable] = {}  # communication op -> its start (shared by a collective)
        self.comm_before: dict[tuple[Op, Op], pulp.LpVariable] = {}  # (x, y) of a lane: 1 if x goes first
        if problem.syncs:
            self._comm_rows(2 * horizon + sum(sum(problem.cost[k]) for k in problem.syncs))
        self.lp += self.C

    def length(self, k: int):
        """How long op k lasts: its cost, for a recompute op its cost times its binary, for an op
        that may run in an overlapped pair the pair's time where it does."""
        z = self.chosen.get(k)
        if z is not None:
            return self.cost[k] * z
        if k in self.fixed:
            return self.fixed[k]
        if k in self.paired:
            import pulp

            extra = self.pair_time[self.problem.stage_rank[self.ops[k].stage]] - self.cost[k]
            return self.cost[k] + extra * pulp.lpSum(self.paired[k])
        return self.cost[k]

    def _may_pair(self, f: int, b: int) -> bool:
        """Whether ops f and b (indices) may run as an overlapped pair: a forward and an input
        gradient B of another (stage, microbatch) on a rank where a pair is faster, both open."""
        of, ob = self.ops[f], self.ops[b]
        return (of.kind is Kind.F and ob.kind is Kind.B and (of.stage, of.mb) != (ob.stage, ob.mb)
                and self.pair_time[self.problem.stage_rank[of.stage]] is not None
                and self.problem.stage_rank[of.stage] == self.problem.stage_rank[ob.stage]
                and f in self.free and b in self.free)

    def _pair_rows(self, earliest: list[float], latest: list[float]) -> None:
        """Overlapped pairs (``costs.FB``): an op runs in at most one; a pair's forward and
        backward start together, the forward first in the rank's order (the memory rows count its
        allocation before the backward's free, as the simulator does), and each lasts the pair's
        time (``length``); the two order rows of the pair are relaxed for it (``_order_pairs``)."""
        import pulp

        start = self.start
        for k, zs in self.paired.items():
            if len(zs) > 1:
                self.lp += pulp.lpSum(zs) <= 1
        for (f, b), z in self.pairs.items():
            self.lp += self._first(f, b) >= z
            self.lp += start[b] - start[f] <= max(0.0, max(earliest[b], latest[b]) - earliest[f]) * (1 - z)
            self.lp += start[f] - start[b] <= max(0.0, max(earliest[f], latest[f]) - earliest[b]) * (1 - z)

    def _policy_rows(self) -> None:
        """Per (stage, microbatch): at most one recompute policy; a recompute op not chosen sits
        right after its F (every other op of the rank but the other recompute op is before both or
        after both), so its F's and its deltas, constants, sum to what the chosen policy holds."""
        by_pair: dict[tuple[int, int], dict[Kind, int]] = {}
        for k, op in enumerate(self.ops):
            by_pair.setdefault((op.stage, op.mb), {})[op.kind] = k
        rank_of = self.problem.stage_rank
        for (s, i), ks in by_pair.items():
            zs = [self.chosen[ks[k]] for k in RECOMPUTES if k in ks]
            if len(zs) > 1:
                self.lp += sum(zs) <= 1
            f = ks[Kind.F]
            mine = {ks[k] for k in RECOMPUTES if k in ks}
            for x in mine:
                z = self.chosen[x]
                for c in self.on_rank[rank_of[s]]:
                    if c == f or c in mine:
                        continue
                    diff = self._first(c, f) - self._first(c, x)
                    if isinstance(diff, int):
                        if diff:
                            self.lp += z >= 1  # an edge puts c between F and it: it must be chosen
                        continue
                    self.lp += diff <= z
                    self.lp += diff >= -z

    def _order_pairs(self, earliest: list[float], latest: list[float]) -> None:
        """A binary and two big-M rows for each pair of open ops on a rank that no edge orders."""
        start, length = self.start, self.length
        for ks in self.on_rank:
            open_ks = [k for k in ks if k in self.free]  # other pairs are fixed by keep's order
            for x, a in enumerate(open_ks):
                for b in open_ks[x + 1 :]:
                    if self.reach[a] >> b & 1 or self.reach[b] >> a & 1:
                        continue
                    twin = self.twins.get((a, b))
                    if twin in self.before:  # W pair: the same binary as its B pair (still one at a time)
                        y = self.before[a, b] = self.before[twin]
                    else:
                        y = self.before[a, b] = self.lp.add_variable(f"y{a}_{b}", cat="Binary")
                    # Each big-M: the most start[a] + length(a) - start[b] can be when b goes
                    # first (an op that may run in a pair: the longer of its cost and the pair's).
                    m_ab = max(0.0, max(earliest[a], latest[a]) + self._longest(a) - earliest[b])
                    m_ba = max(0.0, max(earliest[b], latest[b]) + self._longest(b) - earliest[a])
                    # A pair runs its two ops together: neither row holds for it (y is 1 there).
                    z = self.pairs.get((a, b), 0) + self.pairs.get((b, a), 0)
                    self.lp += start[b] >= start[a] + length(a) - m_ab * (1 - y + z)
                    self.lp += start[a] >= start[b] + length(b) - m_ba * (y + z)

    def _longest(self, k: int) -> float:
        """The longest op k can last."""
        if k in self.paired:
            return max(self.cost[k], self.pair_time[self.problem.stage_rank[self.ops[k].stage]])
        return self.cost[k]

    def _first(self, a: int, b: int):
        """1 if op a runs before op b on their rank (a constant when an edge fixes it)."""
        if self.reach[a] >> b & 1:
            return 1
        if self.reach[b] >> a & 1:
            return 0
        return self.before[a, b] if a < b else 1 - self.before[b, a]

    def _memory_rows(self) -> None:
        """At every open op that allocates (F, and R and S): what the rank holds, its own
        allocation included, fits its room (``model_deltas``: constants whatever the policy)."""
        import pulp

        problem = self.problem
        delta = model_op_deltas(problem, self.ops)
        for r, ks in enumerate(self.on_rank):
            room = problem.activation_room[r]
            for o in ks:
                op = self.ops[o]
                if op.kind not in (Kind.F, *RECOMPUTES) or o not in self.free:  # outside the window: keep's level
                    continue
                held = delta[o] + pulp.lpSum(delta[a] * self._first(a, o) for a in ks if a != o)
                self.lp += held <= room

    def _rank_rows(self, r: int, ks: list[int], earliest_start: float) -> None:
        """Rank r's rows of the objective: its first start, its W ending by C (plus the first start
        for span), the sum-of-durations cuts and, under a memory limit, the memory-time cut."""
        import pulp

        problem, start, dur, first = self.problem, self.start, self.dur, self._first
        # The rank's first start, whichever op that is: at most every start on the rank.
        first_start = self.lp.add_variable(f"first{r}", lowBound=earliest_start)
        self.first_start.append(first_start)
        for o in ks:
            self.lp += first_start <= start[o]
        origin = 0 if problem.search_objective == "makespan" else first_start
        for o in ks:
            if self.ops[o].kind == Kind.W:  # every other op feeds one on its rank: W ends last
                self.lp += self.C >= start[o] + dur[o] - origin
            if o not in self.free:
                continue
            # Sum-of-durations cuts (valid for every schedule, they tighten the LP a lot): what
            # runs after o on its rank ends by C; what runs before o fits after the rank's start.
            # (An overlapped pair's forward, first in the order, runs with its backward, not before:
            # the pair's rows keep its own term out of its backward's ``before``.)
            after = pulp.lpSum(dur[b] * first(o, b) for b in ks if b != o)
            before = pulp.lpSum(dur[a] * (first(a, o) - self.pairs.get((a, o), 0)) for a in ks if a != o)
            self.lp += self.C >= start[o] + dur[o] + after - origin
            self.lp += start[o] >= first_start + before
        if problem.memory_limit is None:
            return
        if self.chosen:
            self._policy_memory_time(r, ks, first_start)
            return
        # Memory-time: frees count from their op's start, as in the memory rows above, so
        # the level never exceeds the room between the rank's first start and C (+ it).
        held = []
        for s in problem.rank_stages[r]:
            for i in range(problem.units):  # (a sequence chunk holds its share)
                f, b = (problem.op_delta(kind, s, i) for kind in (Kind.F, Kind.B))
                kf, kb, kw = (self.index[Op(kind, s, i)] for kind in SPLIT)
                held += [f * (start[kb] - start[kf]), (f + b) * (start[kw] - start[kb])]
        window_length = self.C if problem.objective == "span" else self.C - first_start
        self.lp += pulp.lpSum(held) <= problem.activation_room[r] * window_length

    def _comm_rows(self, big: float) -> None:
        """Per rank, its communication lane (``comm_lane``'s ops: AR per stage with
        ``data_parallel``, RS per stage with ``replicas``): each after the ops it waits for on its
        rank (AR: every W of its stage, or with ``overlap`` off every op of the rank; RS: every W of
        its stage), a collective's members at one start (one variable), one op at a time on a lane
        (a binary per pair the lane's rules leave open: the reduces at the end go later stage first,
        the collectives in their one order), each ending by C (from the rank's first start, for
        span). ``big``: more than any start can be, for the pairs' big-M rows."""
        import pulp

        problem, start, dur, first = self.problem, self.start, self.dur, self._first
        for r, ks in enumerate(self.on_rank):
            origin = 0 if problem.search_objective == "makespan" else self.first_start[r]
            lane = list(comm_ops(problem, r))
            for op in lane:
                head = lead(problem, op)  # a collective's members share its start
                if head not in self.comm_start:
                    self.comm_start[head] = self.lp.add_variable(f"c{head.kind}{head.stage}", lowBound=0)
                a = self.comm_start[op] = self.comm_start[head]
                waits = [k for k in ks if sync_waits_for(problem, op, self.ops[k])]
                for o in waits:
                    # What it waits for that runs after o runs before it: a sum-of-durations cut (the
                    # W of a stage share their B's binaries and have no rows of their own).
                    after = pulp.lpSum(dur[b] * first(o, b) for b in waits if b != o) if o in self.free else 0
                    self.lp += a >= start[o] + self.length(o) + after
                self.lp += self.C >= a + problem.cost[op.kind][op.stage] - origin
            chain_of = {}  # op -> its chain: the runs of the lane whose order comm_lane fixes
            for k, ordered in enumerate(fixed_orders(problem, tuple(lane))):
                chain_of.update((op, k) for op in ordered)
                for x, y in zip(ordered, ordered[1:]):
                    self.lp += self.comm_start[y] >= self.comm_start[x] + problem.cost[x.kind][x.stage]
            for i, x in enumerate(lane):
                for y in lane[i + 1:]:
                    if x in chain_of and chain_of.get(y) == chain_of[x]:
                        continue
                    b = self.comm_before[x, y] = self.lp.add_variable(f"cy{x.kind}{x.stage}_{y.kind}{y.stage}",
                                                                      cat="Binary")
                    sx, sy = self.comm_start[x], self.comm_start[y]
                    self.lp += sy >= sx + problem.cost[x.kind][x.stage] - big * (1 - b)
                    self.lp += sx >= sy + problem.cost[y.kind][y.stage] - big * b

    def _policy_memory_time(self, r: int, ks: list[int], first_start) -> None:
        """The memory-time cut where the model holds recompute ops: the rank's level integrated
        over its window, sum over its ops of -delta x the instant it counts (an op's start for F, R
        and S, its end for B and W: the level of every (stage, microbatch) returns to 0), is at most
        the room times the window. With the constant deltas (``model_deltas``), a recompute op not
        chosen counts from its F's end or later, so the model's integral is at most the real one:
        every real schedule keeps the cut."""
        import pulp

        problem, start, cost = self.problem, self.start, self.cost
        deltas = [model_deltas(problem, s) for s in range(problem.n_stages)]
        held = []
        for k in ks:
            op = self.ops[k]
            d = deltas[op.stage][op.kind]
            at = start[k] + cost[k] if op.kind in (Kind.B, Kind.W) else start[k]
            held.append(-d * at)
        window_length = self.C if problem.objective == "span" else self.C - first_start
        self.lp += pulp.lpSum(held) <= problem.activation_room[r] * window_length

    def warm(self, timeline: Timeline) -> None:
        """Start the search from ``timeline``'s order and times (its W of each stage handed to
        the microbatches in B order, as the model has them: same times, same memory; a recompute
        op it does not hold right after its F, lasting 0)."""
        spans = timeline.op_times()
        times = {op: s for op, (_, s, _) in spans.items()}
        tie = {op: 1 for op in times}  # at one instant, an op not held (lasting 0) comes first
        for op in self.ops:
            if op not in times:  # a recompute op the incumbent does not hold: at its F's end
                times[op], tie[op] = spans[Op(Kind.F, op.stage, op.mb)][2], 0
        if self.twins:  # (per chunk position: only those W last as long and free as much)
            k = self.problem.seq_chunks
            for s in range(self.problem.n_stages):
                for c in range(k):
                    units = range(c, self.problem.units, k)
                    slots = sorted(times[Op(Kind.W, s, i)] for i in units)
                    by_b = sorted(units, key=lambda i: times[Op(Kind.B, s, i)])
                    for slot, i in zip(slots, by_b):
                        times[Op(Kind.W, s, i)] = slot
        for k, op in enumerate(self.ops):  # the simulator's sums may pass a window's by rounding
            x = self.start[k]
            x.setInitialValue(min(max(times[op], x.lowBound), x.upBound))
        key = [(times[op], tie[op], self.kinds.index(op.kind)) for op in self.ops]
        for (a, b), y in self.before.items():
            y.setInitialValue(1 if key[a] < key[b] else 0)
        for k, z in self.chosen.items():
            z.setInitialValue(1 if self.ops[k] in spans else 0)
        together = {(self.index[f], self.index[b]) for f, b in timeline.schedule.paired().items()}
        for fb, z in self.pairs.items():
            z.setInitialValue(1 if fb in together else 0)
        for op, a in self.comm_start.items():
            a.setInitialValue(times[op])
        for (x, y), b in self.comm_before.items():
            b.setInitialValue(1 if times[x] < times[y] else 0)
        self.C.setInitialValue(timeline.objective_value())

    def schedule(self, name: str) -> Schedule | None:
        """The order the solution's start times give, holding each recompute op only where its
        policy is chosen."""
        values = [v.value() for v in self.start]
        if any(v is None for v in values):
            return None
        dropped = {k for k, z in self.chosen.items() if z.value() is None or z.value() < 0.5}
        per_rank = [[k for k in sorted(ks, key=lambda k: (values[k], k)) if k not in dropped] for ks in self.on_rank]
        pairs: list[list[Op]] = [[] for _ in per_rank]
        chosen = [fb for fb, z in self.pairs.items() if z.value() is not None and z.value() > 0.5]
        for f, b in chosen + self.fixed_pairs:  # the backward right after its forward
            r = self.problem.stage_rank[self.ops[f].stage]
            ks = per_rank[r]
            ks.remove(b)
            ks.insert(ks.index(f) + 1, b)
            pairs[r].append(self.ops[b])
        return Schedule.from_lists(name, [[self.ops[k] for k in ks] for ks in per_rank], pairs=pairs)


def _w_follow_b(
    ops: list[Op], index: dict[Op, int], n: int, m: int, chunks: int = 1
) -> dict[tuple[int, int], tuple[int, int]]:
    """``(W(s, i), W(s, j)) -> (B(s, i), B(s, j))`` for every stage s and i < j (as op indices) of
    ``m`` units; with sequence ``chunks``, only units of one chunk position (j - i a multiple of
    ``chunks``): W of other positions differ in cost and memory."""
    twins = {}
    for s in range(n):
        for i in range(m):
            for j in range(i + chunks, m, chunks):
                pair = (index[Op(Kind.W, s, i)], index[Op(Kind.W, s, j)])
                twins[pair] = (index[Op(Kind.B, s, i)], index[Op(Kind.B, s, j)])
    return twins


def _kept_order(
    index: dict[Op, int], keep: Schedule, window: list[range]
) -> tuple[set[int], list[tuple[int, int, float]]]:
    """A neighbourhood of ``keep``: the ops in each rank's ``window`` of positions (open to
    reorder among themselves) and the edges that fix every other pair in keep's order."""
    free: set[int] = set()
    edges = []
    for order, w in zip(keep.ranks, window):
        ks = [index[op] for op in order]
        free.update(ks[k] for k in w)
        edges += [(ks[k], ks[k + 1], 0.0) for k in range(len(ks) - 1) if k + 1 < w.start or k >= w.stop]
        if w and w.start > 0:
            edges += [(ks[w.start - 1], ks[k], 0.0) for k in w]
        if w and w.stop < len(ks):
            edges += [(ks[k], ks[w.stop], 0.0) for k in w]
    return free, edges

def _pairable(problem: Problem, ops: list[Op], dur: list[float]) -> list[float | None]:
    """Per rank, the time of an overlapped pair of a forward and a B (``costs.FB``) where the
    model holds pairs (a pair is faster than its two ops; not with recompute, whose ops the model
    places by position), else None. On such a rank each F and B counts, in ``dur`` (the shortest
    an op can last: windows and sum-of-durations cuts), as its cost scaled so that any two that
    may pair sum to at most the pair's time: every cut still holds for a schedule with pairs."""
    if not problem.overlap_cheaper or problem.recomputes:
        return [None] * problem.ranks
    c = problem.cost
    times: list[float | None] = []
    ratio: list[float] = []
    for stages in problem.rank_stages:
        pair = problem.pair_time(stages[0], Kind.B, stages[0])
        widest = max(c[Kind.F][s] for s in stages) + max(c[Kind.B][s] for s in stages)
        times.append(pair if problem.time_tol.lt(pair, widest) else None)
        ratio.append(min(1.0, pair / widest))
    for k, op in enumerate(ops):
        r = problem.stage_rank[op.stage]
        if times[r] is not None and op.kind in (Kind.F, Kind.B):
            dur[k] *= ratio[r]
    return times


def _windows(dur, edges, on_rank, free, horizon, twins, fix=True, open_pair=lambda a, b: False):
    """Earliest and latest starts and the descendants (bit sets) over ``edges``. With ``fix``
    the edges grow: a same-rank pair that cannot run one way round within the windows gets the
    other order as an edge (unless ``open_pair(a, b)``: it may also run as an overlapped pair,
    neither way round), and so does a W pair whose B pair is ordered (or a B pair whose W
    pair is), until nothing changes (a pair that fits neither way is left to the solver, which
    then finds the model infeasible). Returns ``(edges, earliest, latest, reach)``."""
    eps = 1e-9 * max(1.0, abs(horizon))
    while True:
        order, earliest, tail, succ = longest_paths(dur, edges)
        latest = [horizon - t for t in tail]
        reach = descendants(order, succ)
        if not fix:
            return edges, earliest, latest, reach
        added = []
        for ks in on_rank:
            open_ks = [k for k in ks if k in free]
            for x, a in enumerate(open_ks):
                for b in open_ks[x + 1 :]:
                    if reach[a] >> b & 1 or reach[b] >> a & 1 or open_pair(a, b) or open_pair(b, a):
                        continue
                    a_first = earliest[a] + dur[a] <= latest[b] + eps  # a can end by b's latest start
                    b_first = earliest[b] + dur[b] <= latest[a] + eps
                    if a_first != b_first:
                        added.append((a, b) if a_first else (b, a))
        for (wa, wb), (ba, bb) in twins.items():
            for (x, y), (u, v) in (((wa, wb), (ba, bb)), ((ba, bb), (wa, wb))):
                if reach[x] >> y & 1 and not reach[u] >> v & 1:
                    added.append((u, v))
                elif reach[y] >> x & 1 and not reach[v] >> u & 1:
                    added.append((v, u))
        if not added:
            return edges, earliest, latest, reach
        edges = edges + [(a, b, 0.0) for a, b in dict.fromkeys(added)]


# ---- the search ----


@dataclass(frozen=True)
class _Job:
    """One solve of the model: the problem, the incumbent it starts from (its objective bounds the
    horizon), the settings, the PuLP solver ("cbc" or "highs"), and for a neighbourhood the order
    ``keep`` with per rank the ``window`` of positions that may be reordered."""

    problem: Problem
    incumbent: Timeline
    settings: Settings
    solver: str
    keep: Schedule | None = None
    window: list[range] | None = None


@dataclass(frozen=True)
class _Solved:
    """What ``_model_and_search`` yields: the schedule and objective found (None: none read back),
    PuLP's status, HiGHS's bound (None for CBC, whose log says it), why the budget stopped the
    solver ("" if it did not) and the number of binaries."""

    schedule: Schedule | None
    objective: float | None
    status: str
    bound: float | None
    stopped: str
    binaries: int


def _pulp_search(problem: Problem, incumbent: Timeline, settings: Settings, solver: str) -> Found:
    """The search backend of a PuLP solver: the whole ILP up to FULL_MODEL_OPS ops, above that a
    large-neighbourhood search over windows of the incumbent's order (no bound of its own)."""
    if incumbent.schedule.copy:
        return Found(None, None, [], "not searched: the ILP does not model offload (the incumbent offloads)")
    if problem.n_stages * problem.units * len(model_kinds(problem)) > FULL_MODEL_OPS:
        return _neighbourhoods(problem, incumbent, settings, solver)
    found = solve_pulp(problem, incumbent, settings, solver)
    if Kind.O in problem.policies:  # its bound is over the schedules that do not offload only
        return replace(found, bound=None, note=f"{found.note} (bound dropped: the ILP does not model offload)")
    if problem.overlap_cheaper and problem.recomputes:  # pairs not modelled there (``_pairable``)
        return replace(found, bound=None, note=f"{found.note} (bound dropped: no overlapped pairs with recompute)")
    return found


@register_backend("cbc")  # CBC, bundled with PuLP: the default
def search_cbc(problem: Problem, incumbent: Timeline, settings: Settings) -> Found:
    return _pulp_search(problem, incumbent, settings, "cbc")


@register_backend("highs")  # HiGHS through PuLP (pip install highspy)
def search_highs(problem: Problem, incumbent: Timeline, settings: Settings) -> Found:
    return _pulp_search(problem, incumbent, settings, "highs")


def _neighbourhoods(problem: Problem, incumbent: Timeline, settings: Settings, solver: str) -> Found:
    """Large neighbourhood search: sweep a window of microbatches across the schedule; in each,
    the ops of those microbatches (and whatever lies between them on a rank) may be reordered,
    the rest keeps the incumbent's order. A window the solver cannot finish within its time, and
    that finds nothing better, halves the windows (down to MIN_WINDOW_MICROBATCHES microbatches, or
    one sequence with sequence chunks; the sweep starts again); where GIVE_UP of those run out of
    time, the search gives up (its note says so). Stops when the budget runs out (when too little is left for one more
    window), at the lower bound, or after a sweep without improvement. Gives no bound of its own;
    its note is "time limit" when the budget stopped it. With sequence chunks, the windows are of
    sequences (all their chunks)."""
    best, budget = incumbent, settings.budget
    chunks = problem.seq_chunks  # (with sequence chunks a window holds whole sequences: k of them)
    # A sequence is ``chunks`` units (that many times the ops): its windows may shrink to one sequence.
    smallest = 1 if chunks > 1 else MIN_WINDOW_MICROBATCHES
    k = max(smallest, WINDOW_OPS // (len(model_kinds(problem)) * problem.chunks * chunks))
    policies = len(model_kinds(problem)) > len(SPLIT)
    if policies:  # recompute binaries make windows far slower to search: the smallest, and less time
        k = MIN_WINDOW_MICROBATCHES
    history: list[Progress] = []
    binaries = 0
    t_start = time.perf_counter()
    improved = True
    last = 0.0  # wall time of the last window, model building included
    slow = 0  # windows of the smallest size that ran out of time without finding anything
    while improved and not budget.expired():
        improved = False
        starts = list(range(0, max(1, problem.microbatches - k + 1), max(1, k // 2)))
        for w0 in starts:
            if meets(best.objective_value(), settings.lower):
                return Found(best.schedule, None, history, "", binaries)
            if budget.left() <= max(WINDOW_MIN_SECONDS, 1.5 * last):
                return Found(best.schedule, None, history, "time limit", binaries)
            began = time.perf_counter()
            window = []
            paired = set(best.schedule.paired().values())  # (a window holds both ops of a pair or neither)
            for ops in augmented(problem, best.schedule).ranks:  # the order the model sees
                pos = [x for x, op in enumerate(ops) if w0 <= op.mb // chunks < w0 + k]
                if not pos:
                    window.append(range(0))
                    continue
                lo, hi = min(pos), max(pos) + 1
                lo -= lo > 0 and ops[lo] in paired  # (a paired B comes right after its forward)
                hi += hi < len(ops) and ops[hi] in paired
                window.append(range(lo, hi))
            share = POLICY_WINDOW_SHARE if policies else 0.5
            one = replace(settings, budget=budget.share(share).at_most(WINDOW_SECONDS), gap=0.0, progress=None)
            found = solve_pulp(problem, best, one, solver, keep=best.schedule, window=window)
            binaries = max(binaries, found.binaries)
            last = time.perf_counter() - began
            t = simulate(problem, found.schedule) if found.schedule is not None else None
            if t is not None and t.fits and problem.time_tol.lt(t.objective_value(), best.objective_value()):
                best, improved = t, True
                event = Progress(time.perf_counter() - t_start, best.objective_value(), None)
                history.append(event)
                if settings.progress:
                    settings.progress(event)
            elif "time" in found.note.lower() and not budget.expired():  # too large to search in its time
                if k > smallest:
                    k, improved, last = max(smallest, k // 2), True, 0.0
                    break  # the sweep again, with smaller windows
                slow += 1
                if slow >= GIVE_UP:
                    return Found(best.schedule, None, history, "gave up: windows too slow to search", binaries)
    return Found(best.schedule, None, history, "time limit" if budget.expired() else "", binaries)


def _model_units(problem: Problem) -> tuple[float, float]:
    """The units of time and of memory the MIP model is written in: the powers of two nearest
    the problem's time and memory scales, so that its largest op cost and largest activation are
    between 0.71 and 1.41 model units, whatever unit the problem is written in. Dividing by a
    power of two is exact: in these units it is the same model, only the MIP solvers' absolute
    tolerances (feasibility, integrality) no longer depend on the problem's unit."""

    def nearest(x: float) -> float:
        return 2.0 ** round(math.log2(x)) if x > 0 else 1.0

    return nearest(problem.time_scale), nearest(problem.memory_scale)


def solve_pulp(
    problem: Problem,
    incumbent: Timeline,
    settings: Settings,
    solver: str = "cbc",
    *,
    keep: Schedule | None = None,
    window: list[range] | None = None,
) -> Found:
    """Build the ILP (of the whole problem, or of ``window`` with the rest of ``keep``'s order
    fixed), warm-start it from ``incumbent`` and solve it with ``solver``, all within
    ``settings.budget``: CBC runs under its watchdog, and on large problems
    (``deadline.in_child``) everything runs in a child process that is killed when the budget runs
    out (model building included). The model is written in ``_model_units``; the bound and the
    history (and what ``settings.progress`` hears) come back in the problem's units."""
    job = _Job(problem, incumbent, settings, solver, keep, window)
    unit, memory_unit = _model_units(problem)
    if (unit, memory_unit) == (1.0, 1.0):
        return _solve_in_model_units(job)

    def back(event: Progress) -> Progress:
        scale = lambda x: None if x is None else x * unit  # noqa: E731
        return replace(event, incumbent=scale(event.incumbent), bound=scale(event.bound))

    model_problem = problem.scaled(1 / unit, 1 / memory_unit)
    progress = settings.progress
    found = _solve_in_model_units(replace(
        job,
        problem=model_problem,
        incumbent=simulate(model_problem, incumbent.schedule),  # the incumbent's times over unit, exactly
        settings=replace(settings, lower=settings.lower / unit,
                         progress=progress and (lambda event: progress(back(event)))),
    ))
    bound = None if found.bound is None else found.bound * unit
    return replace(found, bound=bound, history=[back(e) for e in found.history])


def _solve_in_model_units(job: _Job) -> Found:
    """``solve_pulp`` on a problem already in model units."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "solver.log"
        done = threading.Event()
        watcher = threading.Thread(target=_watch, args=(log, done, job.settings.progress), daemon=True)
        try:
            with Worker(_model_and_search, (job, log), child=in_child(job.problem)) as worker:
                watcher.start()  # after the fork: the child gets no copy of this thread
                out = worker.next(job.settings.budget)
        except WorkerDied as e:
            out = e
        finally:
            done.set()
            if watcher.ident is not None:
                watcher.join()
        text = log.read_text() if log.exists() else ""
    history = cbc.parse_log(text)[0] if job.solver == "cbc" else []
    if isinstance(out, WorkerDied):
        return Found(None, None, history, f"solver error: {out}")
    if out is LATE or out is END:
        return Found(None, None, history, "time limit (stopped while building or solving the model)")
    bound = out.bound
    if job.solver == "cbc":
        history, bound, result = cbc.parse_log(text)
        if result.startswith("Optimal") and out.objective is not None:
            # Proven optimal, or stopped within the relative gap: best possible >= C (1 - gap).
            proven = out.objective * (1 - job.settings.gap if "gap" in result else 1)
            bound = max(bound if bound is not None else -math.inf, proven)
        result = f"{out.stopped}: {result}" if out.stopped else result
    else:
        result = f"{out.stopped}: {text}" if out.stopped else text
        if out.status == "Optimal" and bound is None:
            bound = out.objective
    return Found(out.schedule, bound, history, result, out.binaries)


def _model_and_search(job: _Job, log: Path):
    """The model of ``solve_pulp``, built and solved within the budget (run by a Worker): yields
    one ``_Solved``."""
    import pulp

    problem, incumbent, settings = job.problem, job.incumbent, job.settings
    budget = settings.budget.less(SOLUTION_SECONDS)
    horizon = incumbent.objective_value(problem.search_objective) if problem.search_objective == "makespan" else _span_horizon(problem, incumbent)
    model = _Model(problem, horizon, settings.lower, keep=job.keep, window=job.window)
    model.warm(incumbent)
    binaries = len(model.before) + len(model.pairs)
    if job.solver == "cbc":
        stopped = cbc.run_cbc(model.lp, cbc.cbc(gapRel=settings.gap, threads=settings.threads), budget, log)
        if model.lp.status != pulp.LpStatusOptimal:  # no solution read (CBC's "stopped with a solution" counts)
            yield _Solved(None, None, pulp.LpStatus[model.lp.status], None, stopped, binaries)
            return
        yield _Solved(model.schedule("ilp"), model.C.value(), "Optimal", None, stopped, binaries)
        return
    yield _solve_highs(model, settings, budget, log)


def _solve_highs(model: _Model, settings: Settings, budget: Budget, log: Path) -> _Solved:
    """The model solved by HiGHS through PuLP (its own time limit: HiGHS stops on it)."""
    import pulp

    binaries = len(model.before) + len(model.pairs)
    left = budget.left()
    if left < cbc.MIN_SECONDS:
        return _Solved(None, None, "Not Solved", None, "time limit (no time left for highs)", binaries)
    backend = pulp.HiGHS(msg=False, timeLimit=0.9 * left, gapRel=settings.gap, threads=settings.threads,
                         log_file=str(log))
    if not backend.available():
        raise SchedcError(
            "--solver highs needs highspy: pip install 'schedc[highs]' (it cannot share a process"
            " with OR-Tools, which bundles its own HiGHS)"
        )
    try:
        model.lp.solve(backend)
    except pulp.PulpSolverError as e:  # the solver died: keep the incumbent, say why
        return _Solved(None, None, "Not Solved", None, f"solver error: {e}", binaries)
    solved = getattr(model.lp, "solverModel", None)
    bound = cbc.number(str(solved.getInfo().mip_dual_bound)) if solved is not None else None
    return _Solved(model.schedule("ilp"), model.C.value(), pulp.LpStatus[model.lp.status], bound, "", binaries)


def _span_horizon(problem: Problem, warm_t: Timeline) -> float:
    """A horizon that keeps every schedule with a span below the warm start's.

    Shift each rank's window of ops as early as its inputs allow: a window then starts no later
    than the end of the window feeding its binding input, plus ``comm``. Windows are at most C
    long and the chain visits each rank once, so everything ends by p (C + comm)."""
    return problem.ranks * (warm_t.span + problem.comm)


def _watch(log: Path, done: threading.Event, progress) -> None:
    """Report CBC's incumbent and bound while it runs (the log is read every half second)."""
    if progress is None:
        return
    seen = 0
    while not done.wait(0.5):
        if not log.exists():
            continue
        history, _, _ = cbc.parse_log(log.read_text())
        for event in history[seen:]:
            progress(event)
        seen = len(history)
