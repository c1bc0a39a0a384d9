"""The optimal schedule of a small Problem by exhaustive search: the oracle the ILP is tested against.

Written independently of schedc: it reads only the Problem's plain data (ranks, stages and their
placement, costs, memory deltas, static and working memory and limits, comm, objective) and has its own timing
model, so a bug shared with the simulator or the ILP cannot hide here. The model:

- ops F(s, i), B(s, i), W(s, i) for every stage s and microbatch i, on rank ``stage_rank[s]``;
- F(s, i) needs F(s-1, i); B(s, i) needs F(s, i) and B(s+1, i); W(s, i) needs B(s, i), where
  s-1 and s+1 are in the same pipeline (with replicas, stages k*L .. k*L + L - 1); a result
  reaches another rank ``comm`` after its producer ends, its own rank at once;
- a schedule is one total order per rank; every op starts as soon as possible: at the latest of
  the end of the op before it on its rank and the arrival of each input (cyclic waits: infeasible);
- memory: per rank, walking its order from ``static_memory[r]`` plus ``working_memory[r]`` (what
  an op needs while it runs, held on top of the level), each op adds its delta; the level after
  every F must stay within ``memory_limit[r]``;
- data parallelism (``data_parallel``): each stage's gradient all-reduce, on its rank's own lane,
  starts once that lane is free and the stage's last W has ended (without ``overlap``, the rank's
  last op), the reduces of a rank in that order (ties: the later stage first); a rank ends with its
  last op or its last reduce, whichever is later;
- replicas: each model stage's copies sum their gradients (one op on every rank holding a copy,
  starting together when all have come to it), each released at its stage's last W, every rank
  taking them in one order (the model's later stage first) on the same lane as its reduces; tied
  stages on different ranks sum their shared weights' gradients the same way, after the copies'
  (with replicas, each pipeline's copy of a tied group of model stages);
- sequence chunks (``sequence_chunks``, count k and per chunk position its shares of F, B, W and
  memory, 1/k each by default): an op's microbatch is a unit (sequence * k + chunk) whose cost and
  memory delta are its position's share of the stage's; on its own stage F(s, i) also needs
  F(s, i - 1) unless i is its sequence's first chunk, and B(s, i) needs B(s, i + 1) unless i is its
  last; sequences (not units) are interchangeable, and two W of one stage only of one position;
- objective: makespan (the last end) or span (max over ranks of own last end - own first start),
  both of the as-soon-as-possible times, as schedc's simulator runs schedules. Under span a rank
  may do better starting late on purpose (see ``span_with_delays``, the least span of given
  orders over every timing); the optimum here is over as-soon-as-possible timings only, so a
  lower bound that holds for every timing must lie below it too.

The search: depth-first branch and bound over all per-rank orders
-----------------------------------------------------------------
A node fixes a prefix of every rank's order. Every op in a prefix is *timed* (its start is known)
except possibly the last op of a rank, which may be *pending*: committed as the rank's next op but
waiting for an input that is not timed yet. At each node the rank to extend is a function of the
node alone -- the rank with no pending op that is free earliest (ties: lowest rank) -- and the
node branches over every op that rank could run next, whether its inputs are timed or not (so a
rank may wait for a later input while another op is ready). Each full set of orders is thus
reached along exactly one path, and every one is reached: nothing is assumed about the order of
ops of one kind. Timing a pending op's last input times the op (cascading).

Pruning never loses the optimum: it drops only orders that cannot complete, or orders for which
another order that is searched is at least as good.

- Deadlock and memory: an op is not chosen while one of its ancestors on the same rank is
  unplaced (it would come later), nor when pending ops would wait on each other in a cycle, nor
  (an F) when it would lift the rank's memory over its limit.
- Symmetry: microbatches are interchangeable (all data is per stage), so orders are searched
  only with F(0, i) after F(0, i - 1); and of two W of one stage that could run next (no op
  consumes a W), only the lower microbatch is tried.
- Gap filling: o is not tried next if some ready op x would end before o can start and x frees
  memory (or there is no limit): moving x from later into that gap delays nothing, as
  as-soon-as-possible times are monotone. For span, only once every rank has started (moving x
  could otherwise start a rank sooner).
- Bound: a node is dropped when a lower bound on all its completions is no better than the best
  schedule found. Earliest starts ("heads") of the untimed ops propagate timed ends, rank free
  times and comm through the dependencies, with two floors: a rank's other ops follow its pending
  op, and an F that does not fit in memory waits until enough of the rank's B and W (of forwards
  already placed) can have ended. Then per rank r, its last end is at least (a) the one-machine
  bound (the rank's ops in order of heads) and (b) for any rank q and any set S of q's untimed
  ops: min head(S) + work(S) + the shortest of their longest paths onward to an op on r (S
  taken as the ops whose onward path is at least tau, for each tau). Makespan: max over r;
  span: over started ranks, that end minus the first start (else the rank's own work or path).
- Dominance (not with data parallelism, where a W's end counts even though no op consumes it):
  nodes with the same placed ops (per rank, as sets) and the same pending ops have
  the same memory levels and the same completions; for makespan a node whose relevant times
  (rank free times, ends of timed ops that feed untimed ones) are all >= those of a node already
  visited is dropped. For span the first starts must match and every rank must have started
  (else only equal times count).

Recompute policies (``policies``: R and S, the kinds the problem declares; not offload, whose copy
lane would make memory depend on two lanes' times, not on the order alone)
----------------------------------------------------------------------------------------------
Each (stage, microbatch) keeps its activation or takes a policy, chosen when its F is placed (one
branch per choice that fits): F then allocates what the policy keeps (the F's memory less the
policy's), and an op X(s, i) of the policy's cost, allocating the rest, runs on the rank after F(s,
i) and before B(s, i), which waits for it. Kept, X is done at once (cost 0, on no order). Until F is
placed, the bounds count its least allocation and X as free, so they stay lower bounds; once X is
placed the policy leaves no trace on what follows (the level is the same), so dominance compares
only the policies whose X is still to come. Gap filling never moves an F with a choice (its
allocation depends on the choice). Microbatches stay interchangeable, policies included.
``below`` starts the search at a known value, to prove it optimal or improve on it.

Costs and comm are scaled to integers when they are simple fractions (0.1, 1/3), so all times are
exact; otherwise floats with a 1e-9 tolerance are used. Memory is compared with a 1e-9 tolerance.
``in_order=True`` restricts the search to orders that run each stage's ops of one kind by
increasing microbatch, e.g. to check an ILP that makes that assumption.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction

KINDS = ("F", "B", "W")
NEG = -(10**18)  # "no path"


class BudgetExceeded(RuntimeError):
    """The search did not finish within its time budget: no optimum is claimed. ``found`` is the best
    it had, as ``exhaustive_optimum`` returns it, or None (nothing, or nothing better than ``below``)."""

    found = None


def exhaustive_optimum(problem, *, objective=None, time_budget=60.0, in_order=False, whole_sequences=False,
                       policies=(), below=None):
    """The minimum objective over all deadlock-free per-rank orders that fit, and one optimal order.

    Returns ``(value, orders)`` with ``orders[rank]`` a list of ``(kind, stage, mb)``. ``objective``
    overrides the problem's. ``in_order=True`` searches only orders that run each stage's ops of
    one kind by increasing microbatch (what an ILP may assume; by default nothing is assumed).
    ``whole_sequences=True`` (sequence chunks) searches only orders whose stage 0 runs every chunk's
    forward of a sequence before the next sequence's first (a restriction: the optimum may interleave).
    ``policies`` (a subset of "R", "S" the problem declares): each (stage, microbatch) keeps its
    activation or takes one of them (see "Recompute policies" above); the orders then hold the R and
    S ops chosen. ``below``: a value some schedule is known to reach; only better ones are searched,
    and ``(below, None)`` is returned when there is none. Raises BudgetExceeded after
    ``time_budget`` seconds (with the best found), ValueError when no order fits.
    """
    objective = objective or problem.objective
    if objective not in ("makespan", "span"):
        raise ValueError(f"objective must be 'makespan' or 'span', got {objective!r}")
    search = _Search(problem, objective, time.monotonic() + time_budget, time_budget, in_order, whole_sequences,
                     tuple(policies))
    if below is not None:
        search.best = below * search.scale
    try:
        search.dfs()
    except BudgetExceeded as e:
        e.found = search.result()
        raise
    if search.best_orders is None and below is not None:
        return below, None
    if search.best_orders is None:
        raise ValueError("no order of the ops is deadlock-free and fits the memory limit")
    return search.result()


def _integer_scale(values):
    """The least D that makes every value times D an integer (for values such as 0.1 or 1/3), or None."""
    d = 1
    for x in values:
        f = Fraction(x).limit_denominator(10**6)
        if float(f) != x:
            return None
        d = d * f.denominator // math.gcd(d, f.denominator)
    return d if d <= 10**9 else None


class _Search:
    def __init__(self, problem, objective, deadline, budget, in_order=False, whole_sequences=False, policies=()):
        p, n = problem.ranks, problem.n_stages
        depth = problem.pipeline_stages  # with replicas, stage s is in pipeline s // depth
        stage_rank = problem.stage_rank
        comm = problem.comm
        dp = problem.data_parallel
        # Sequence chunks: each sequence is k units (mb = sequence * k + chunk), each chunk position
        # with its share of the stage's costs and memory (1/k when the file gives none).
        seq = problem.sequence_chunks
        k_chunks = 1 if seq is None else seq.count
        share = {key: [1.0] if seq is None else (list(getattr(seq, key)) if getattr(seq, key) is not None
                                                  else [1.0 / k_chunks] * k_chunks)
                 for key in (*KINDS, "memory")}
        m = problem.microbatches * k_chunks
        raw = [problem.cost[k][s] * share[k][c] for k in KINDS for s in range(n) for c in range(k_chunks)] + [comm]
        raw += list(problem.cost["AR"]) if dp is not None else []
        raw += list(problem.cost["RS"]) if problem.replicas is not None else []
        raw += list(problem.cost["TS"]) if problem.tied is not None else []
        if policies and (seq is not None or dp is not None or problem.replicas is not None or problem.tied is not None):
            raise ValueError("policies: only without sequence chunks, data parallelism, replicas or tied weights")
        raw += [problem.cost[k][s] for k in policies for s in range(n)]
        scale = _integer_scale(raw)
        if scale is None:
            self.scale, conv, self.eps = 1, float, 1e-9
        else:
            self.scale, conv, self.eps = scale, (lambda x: round(x * scale)), 0
        self.objective, self.deadline, self.budget = objective, deadline, budget
        self.p = p
        # Data parallelism: per stage its reduce's duration, whether it waits only for its own W.
        self.reduce = None if dp is None else [conv(x) for x in problem.cost["AR"]]
        self.overlap = dp is not None and dp.overlap
        # Replicas: per stage, the gradient sum of its model stage's copies (stages j, j + depth, ...).
        self.depth = depth
        self.sync = None if problem.replicas is None else [conv(x) for x in problem.cost["RS"]]
        # Tied weights: groups of stages on different ranks, their gradient sums' time per stage
        # (with replicas the file's groups name model stages: each pipeline's copy of a group).
        self.rank_of_stage = list(stage_rank)
        copies = [] if problem.tied is None else [
            tuple(k * depth + s for s in sorted(g)) for g in problem.tied.groups for k in range(n // depth)]
        self.tied_groups = [g for g in copies if len({stage_rank[s] for s in g}) == len(g)]
        self.tied_sync = None if problem.tied is None else [conv(x) for x in problem.cost["TS"]]
        self.rank_stage_list = [[s for s in range(n) if stage_rank[s] == r] for r in range(p)]
        self.n, self.m = n, m

        # Ops are numbered o = (kind * n + stage) * m + mb; with policies, kind 3 is X(s, i), the
        # recompute op of (s, i), which B(s, i) waits for: free (cost 0) until F(s, i) is placed
        # with a policy, done at once (timed at 0, on no rank's order) when F is placed keeping.
        def op(k, s, i):
            return (k * n + s) * m + i

        kinds = KINDS + (("X",) if policies else ())
        N = len(kinds) * n * m
        self.x_of = 3 * n * m  # X(s, i) = F(s, i) + x_of
        self.N = N
        self.names = [None] * N
        self.rank_of, self.cost, self.mem = [0] * N, [0] * N, [0.0] * N
        self.deps = [[] for _ in range(N)]  # (producer, latency)
        self.succs = [[] for _ in range(N)]
        for k, kind in enumerate(kinds):
            for s in range(n):
                for i in range(m):
                    o = op(k, s, i)
                    self.names[o] = (kind, s, i)
                    self.rank_of[o] = stage_rank[s]
                    c = i % k_chunks
                    if kind != "X":  # (X's cost and memory: those of the policy F(s, i) is placed with)
                        self.cost[o] = conv(problem.cost[kind][s] * share[kind][c])
                        self.mem[o] = problem.mem[kind][s] * share["memory"][c]
                    if kind == "F":  # (and, with chunks, the same stage's earlier chunk)
                        producers = [op(0, s - 1, i)] if s % depth > 0 else []
                        producers += [op(0, s, i - 1)] if c > 0 else []
                    elif kind == "B":  # (and, with chunks, the same stage's later chunk)
                        producers = [op(0, s, i)] + ([op(1, s + 1, i)] if (s + 1) % depth > 0 else [])
                        producers += [op(1, s, i + 1)] if c < k_chunks - 1 else []
                        producers += [op(3, s, i)] if policies else []  # (its X)
                    elif kind == "W":
                        producers = [op(1, s, i)]
                    else:  # X
                        producers = [op(0, s, i)]
                    for d in producers:
                        lat = 0 if stage_rank[d // m % n] == stage_rank[s] else conv(comm)
                        self.deps[o].append((d, lat))
                        self.succs[d].append((o, lat))
        # A topological order: forwards by stage, the recompute ops, backwards by stage descending
        # (later units first: a chunk's backward needs the next chunk's), then weights.
        self.topo = [op(0, s, i) for s in range(n) for i in range(m)]
        self.topo += [op(3, s, i) for s in range(n) for i in range(m)] if policies else []
        self.topo += [op(1, s, i) for s in reversed(range(n)) for i in reversed(range(m))]
        self.topo += [op(2, s, i) for s in range(n) for i in range(m)]
        self.rank_ops = [[o for o in range(N) if self.rank_of[o] == r] for r in range(p)]

        # Ancestors (bitmasks); those on the op's own rank must precede it in the rank's order.
        anc = [0] * N
        for o in self.topo:
            for d, _ in self.deps[o]:
                anc[o] |= anc[d] | (1 << d)
        self.anc = anc
        self.forward_of = [o % (n * m) for o in range(N)]  # F(s, i) of B(s, i) and W(s, i)
        rank_mask = [sum(1 << o for o in ops) for ops in self.rank_ops]
        self.anc_same = [anc[o] & rank_mask[self.rank_of[o]] for o in range(N)]
        self.succ_mask = [sum(1 << t for t, _ in self.succs[o]) for o in range(N)]
        # Symmetry breaking: F(0, i) only after F(0, i - 1); with in_order, every op after the
        # same kind and stage of the microbatch before. With sequence chunks, sequences are
        # interchangeable, not units: the first chunk of a sequence on stage 0 only after the
        # first chunk of the sequence before; in_order, by chunk position.
        self.k_chunks = k_chunks
        self.prev = [o - k_chunks if o % m >= k_chunks and o < self.x_of and (in_order or (o < m and o % k_chunks == 0))
                     else -1 for o in range(N)]
        if whole_sequences:  # (a restriction) the first chunk after the whole sequence before
            for o in range(k_chunks, m, k_chunks):
                self.prev[o] = o - 1

        # tail_to[r][o]: longest path from the start of o to the end of an op on rank r it leads to.
        self.tail_to = [[NEG] * N for _ in range(p)]
        for o in reversed(self.topo):
            for r in range(p):
                best = self.cost[o] if self.rank_of[o] == r else NEG
                for t, lat in self.succs[o]:
                    if self.tail_to[r][t] > NEG:
                        best = max(best, self.cost[o] + lat + self.tail_to[r][t])
                self.tail_to[r][o] = best
        # For bound (b): per target and rank, the rank's ops with a path to the target, by the
        # length of that path after the op's own end, longest first (target 0 of makespan: any rank).
        tails = [[max(t[o] for t in self.tail_to) for o in range(N)]] if objective == "makespan" else self.tail_to
        self.by_after = [
            [sorted(((o, tail[o] - self.cost[o]) for o in ops if tail[o] > NEG), key=lambda x: -x[1]) for ops in self.rank_ops]
            for tail in tails
        ]
        # Span of a rank that has not started yet: at least its work and its longest own path.
        self.unstarted_span = [
            max(sum(self.cost[o] for o in self.rank_ops[r]), max(self.tail_to[r][o] for o in self.rank_ops[r]))
            for r in range(p)
        ]
        self.limit = problem.memory_limit
        self.level = [s + w for s, w in zip(problem.static_memory, problem.working_memory)]
        # Policies: per stage, the options of an F: (policy or None, F's allocation, X's cost, X's
        # allocation), keeping first. An F not placed yet counts its least allocation (the bounds).
        self.options = None if not policies else [
            [(None, problem.mem["F"][s], 0, 0.0)]
            + [(k, problem.mem["F"][s] - problem.mem[k][s], conv(problem.cost[k][s]), problem.mem[k][s]) for k in policies]
            for s in range(n)]
        self.least = {o: min(x[1] for x in self.options[s]) for o, s in
                      ((op(0, s, i), s) for s in range(n) for i in range(m))} if policies else {}
        for o, least in self.least.items():
            self.mem[o] = least
        self.policy = {}  # placed F -> its option
        self.best_names = {}  # the best orders' X ops -> (policy, stage, mb)

        # Search state.
        self.end = [None] * N
        self.start = [None] * N
        self.placed = 0  # committed ops (timed or pending)
        self.timed = 0
        self.free = [0] * p
        self.first = [None] * p
        self.pending = [-1] * p
        self.orders = [[] for _ in range(p)]
        self.left = [len(ops) for ops in self.rank_ops]  # ops not yet timed, per rank
        self.heads = [0] * N
        self.best = math.inf
        self.best_orders = None
        self.memo = {}
        self.nodes = 0

    def result(self):
        """(value, orders) of the best schedule found, or None."""
        if self.best_orders is None:
            return None
        return self.best / self.scale, {r: [self.best_names.get(o, self.names[o]) for o in ops]
                                        for r, ops in enumerate(self.best_orders)}

    # ---- state changes (undone in reverse) ----

    def _time(self, o, log):
        """Time op o (all inputs timed) and then every pending op that this completes."""
        stack = [o]
        while stack:
            o = stack.pop()
            r = self.rank_of[o]
            t = self.free[r]
            for d, lat in self.deps[o]:
                t = max(t, self.end[d] + lat)
            log.append((o, self.free[r], self.first[r], self.pending[r]))
            self.start[o], self.end[o] = t, t + self.cost[o]
            self.free[r] = self.end[o]
            if self.first[r] is None:
                self.first[r] = t
            self.pending[r] = -1
            self.timed |= 1 << o
            self.left[r] -= 1
            for s, _ in self.succs[o]:
                rs = self.rank_of[s]
                if self.pending[rs] == s and all(self.end[d] is not None for d, _ in self.deps[s]):
                    stack.append(s)

    def _untime(self, log):
        for o, free, first, pending in reversed(log):
            r = self.rank_of[o]
            self.start[o] = self.end[o] = None
            self.free[r], self.first[r], self.pending[r] = free, first, pending
            self.timed &= ~(1 << o)
            self.left[r] += 1

    def _waits_in_cycle(self, r):
        """Would rank r's pending op and the other pending ops wait on each other in a cycle?"""
        seen, frontier = set(), [r]
        while frontier:
            q = self.pending[frontier.pop()]
            blocking = self.anc[q] & ~self.timed  # untimed ancestors: q waits for their ranks
            for r2 in range(self.p):
                if self.pending[r2] >= 0 and any(blocking >> o & 1 for o in self.rank_ops[r2]):
                    if r2 == r:
                        return True
                    if r2 not in seen:
                        seen.add(r2)
                        frontier.append(r2)
        return False

    # ---- bounds ----

    def _heads(self, floor):
        """Earliest starts of the untimed ops (in self.heads); returns them per rank."""
        end, heads, cost, free, deps, rank_of = self.end, self.heads, self.cost, self.free, self.deps, self.rank_of
        by_rank = [[] for _ in range(self.p)]
        for o in self.topo:
            if end[o] is not None:
                continue
            h = max(free[rank_of[o]], floor.get(o, 0))
            for d, lat in deps[o]:
                e = end[d]
                a = (heads[d] + cost[d] if e is None else e) + lat
                if a > h:
                    h = a
            heads[o] = h
            by_rank[rank_of[o]].append(o)
        return by_rank

    def _bound(self):
        """A lower bound on the objective of every completion of this node (inf: none completes)."""
        end, heads, cost, free, p, pending = self.end, self.heads, self.cost, self.free, self.p, self.pending
        by_rank = self._heads({})
        # Floors, then heads again: a rank's other ops wait for its pending op; an F that does
        # not fit waits until enough of the rank's B and W (of forwards already placed) can end.
        floor = {}
        for q in range(p):
            if pending[q] >= 0:
                after = heads[pending[q]] + cost[pending[q]]
                for o in by_rank[q]:
                    if o != pending[q]:
                        floor[o] = after
            if self.limit is None:
                continue
            over = self.level[q] - self.limit[q] - 1e-9
            forwards = [o for o in by_rank[q] if self.mem[o] > 0 and not self.placed >> o & 1]
            if not forwards or over + max(self.mem[o] for o in forwards) <= 0:
                continue
            frees = sorted(
                (heads[o] + cost[o], -self.mem[o])
                for o in by_rank[q]
                if self.mem[o] < 0 and self.placed >> self.forward_of[o] & 1
            )
            for o in forwards:
                need, t = over + self.mem[o], 0
                for ends, freed in frees:
                    if need <= 0:
                        break
                    need, t = need - freed, ends
                if need > 0:
                    return math.inf  # this F can never fit: the node deadlocks on memory
                floor[o] = max(floor.get(o, 0), t)
        if floor:
            by_rank = self._heads(floor)
        # Targets whose last end is bounded: makespan, any rank (index 0); span, each started rank.
        if self.objective == "makespan":
            last_end, targets = [max(free)], [0]
        else:
            last_end, targets = list(free), [r for r in range(p) if self.first[r] is not None]
        for q in range(p):
            ops = by_rank[q]
            if not ops:
                continue
            # (a) rank q alone: its ops one after the other, each no earlier than its head.
            t = free[q]
            for o in sorted(ops, key=heads.__getitem__):
                t = max(t, heads[o]) + cost[o]
            r = 0 if self.objective == "makespan" else q
            last_end[r] = max(last_end[r], t)
            # (b) any set S of rank q's ops runs on q after min head(S), and after the last of S
            # ends, the longest path from it to the target follows: S = the ops whose path
            # after their own end is >= tau, for each tau (ops pre-sorted by that path).
            for r in targets:
                acc, low, best = 0, math.inf, last_end[r]
                for o, after in self.by_after[r][q]:
                    if end[o] is None:
                        h, c = heads[o], cost[o]
                        acc += c
                        if h < low:
                            low = h
                        if low + acc + after > best:
                            best = low + acc + after
                        if h + c + after > best:
                            best = h + c + after
                last_end[r] = best
        if self.objective == "makespan":
            return last_end[0]
        return max(
            self.unstarted_span[r] if self.first[r] is None else last_end[r] - self.first[r] for r in range(p)
        )

    def _dominated(self):
        if self.reduce is not None or self.sync is not None or self.tied_groups:
            return False
        timed, end, succ_mask = self.timed, self.end, self.succ_mask
        untimed = ~timed
        times = tuple(self.free) + tuple([e for o, e in enumerate(end) if e is not None and succ_mask[o] & untimed])
        # (a policy leaves no trace on what is to come once its X is placed: the level is then the
        # same, and its times are among those compared)
        key = (self.placed, tuple(self.pending),
               tuple(sorted((f, c) for f, c in self.policy.items() if not self.placed >> (f + self.x_of) & 1)))
        if self.objective == "span":
            key += (tuple(self.first),)
            if None in self.first:
                key += (times,)  # equality only
        seen = self.memo.setdefault(key, [])
        for old in seen:
            if all(a <= b for a, b in zip(old, times)):
                return True
        seen[:] = [old for old in seen if not all(b <= a for a, b in zip(old, times))]
        seen.append(times)
        return False

    # ---- the search ----

    def dfs(self):
        self.nodes += 1
        if self.nodes % 1024 == 1 and time.monotonic() > self.deadline:
            raise BudgetExceeded(
                f"exhaustive search ran out of its {self.budget:g} s budget after {self.nodes} nodes"
                f" (best so far {self.best / self.scale:g}, not proven optimal): use a smaller problem"
                " or a larger time_budget"
            )
        if self.timed == (1 << self.N) - 1:
            value = self._value()
            if value < self.best:
                self.best, self.best_orders = value, [list(x) for x in self.orders]
                self.best_names = {f + self.x_of: (self.options[self.names[f][1]][c][0], *self.names[f][1:])
                                   for f, c in self.policy.items() if c}
            return
        if self._dominated() or self._bound() >= self.best - self.eps:
            return
        # The rank to extend: no pending op, ops left, free earliest.
        choices = [(self.free[r], r) for r in range(self.p) if self.pending[r] < 0 and self.left[r] > 0]
        if not choices:
            return  # every rank waits on an op that cannot run: deadlock
        r = min(choices)[1]
        for o, ready, choice in self._candidates(r):
            if choice is not None:
                self._choose(o, choice)
            self.placed |= 1 << o
            self.orders[r].append(o)
            level = self.level[r]
            self.level[r] += self.mem[o]
            log = []
            if ready:
                self._time(o, log)
                self.dfs()
                self._untime(log)
            else:
                self.pending[r] = o
                if not self._waits_in_cycle(r):
                    self.dfs()
                self.pending[r] = -1
            self.level[r] = level
            self.orders[r].pop()
            self.placed &= ~(1 << o)
            if choice is not None:
                self._unchoose(o)

    def _choose(self, f, c):
        """Place F ``f`` with option ``c``: its allocation, and its X's cost and allocation (kept:
        X done at once, at time 0, on no rank's order)."""
        policy, alloc, cost, mem = self.options[self.names[f][1]][c]
        x = f + self.x_of
        self.mem[f], self.policy[f] = alloc, c
        if policy is None:
            self.placed |= 1 << x
            self.timed |= 1 << x
            self.start[x] = self.end[x] = 0
            self.left[self.rank_of[x]] -= 1
        else:
            self.cost[x], self.mem[x] = cost, mem

    def _unchoose(self, f):
        x = f + self.x_of
        if self.options[self.names[f][1]][self.policy.pop(f)][0] is None:
            self.placed &= ~(1 << x)
            self.timed &= ~(1 << x)
            self.start[x] = self.end[x] = None
            self.left[self.rank_of[x]] += 1
        self.mem[f], self.cost[x], self.mem[x] = self.least[f], 0, 0.0

    def _candidates(self, r):
        """Every op rank r may run next with its option (an F with policies: one per option that
        fits, else None), ready ones first by start time (B, F, W, X on ties)."""
        placed, end, limit = self.placed, self.end, self.limit
        out, w_stages = [], set()
        for o in self.rank_ops[r]:
            if placed >> o & 1 or self.anc_same[o] & ~placed:
                continue
            kind, stage, _ = self.names[o]
            if kind == "W":  # interchangeable: only the lowest microbatch of each stage (and chunk position)
                key = (stage, self.names[o][2] % self.k_chunks)
                if key in w_stages:
                    continue
                w_stages.add(key)
            prev = self.prev[o]
            if prev >= 0 and not placed >> prev & 1:
                continue
            ready = all(end[d] is not None for d, _ in self.deps[o])
            if ready:
                start = max([self.free[r]] + [end[d] + lat for d, lat in self.deps[o]])
            else:
                start = self.heads[o]  # a lower bound on its start (computed by _bound)
            choices = range(len(self.options[stage])) if kind == "F" and self.options else [None]
            for c in choices:
                mem = self.mem[o] if c is None else self.options[stage][c][1]
                if limit is None or mem <= 0 or self.level[r] + mem <= limit[r] + 1e-9:
                    out.append((not ready, start, "BFWX".index(kind), o, c))
        out.sort(key=lambda x: x[:4])
        # Gap filling: if a ready op x that frees memory (or any, without a limit) would end before
        # o can start, running x first delays nothing (as-soon-as-possible times are monotone), so
        # o is not tried next. Not for span while a rank has not started (x may start one sooner).
        if self.objective == "makespan" or None not in self.first:
            fillers = sorted(
                (start + self.cost[o], o) for notready, start, _, o, c in out
                if not notready and c is None and (limit is None or self.mem[o] <= 0)
            )[:2]
            out = [c for c in out if not any(e <= c[1] and x != c[3] for e, x in fillers)]
        return [(o, not notready, c) for notready, _, _, o, c in out]

    def _value(self):
        if self.sync is not None or self.tied_groups:
            ends = self._lane_ends()
        else:
            ends = self.free if self.reduce is None else [self._rank_end(r) for r in range(self.p)]
        if self.objective == "makespan":
            return max(ends)
        return max(ends[r] - self.first[r] for r in range(self.p))

    def _rank_end(self, r):
        """Rank r's end with its reduces: each issued at its stage's last W's end (or the rank's
        end), run one at a time in issue order."""
        n, m = self.n, self.m
        issued = []
        for s in self.rank_stage_list[r]:
            last_w = max(self.end[(2 * n + s) * m + i] for i in range(m))
            issued.append((last_w if self.overlap else self.free[r], -s))
        lane = 0
        for t, minus_s in sorted(issued):
            lane = max(lane, t) + self.reduce[-minus_s]
        return max(self.free[r], lane)


    def _lane_ends(self):
        """Every rank's end with its communication lane, where replicas sum each model stage's
        copies or tied stages on different ranks sum their shared weights' gradients: per rank, its
        reduces (as ``_rank_end``) and its sums, each sum released at its stage's last W's end and no
        earlier than the rank's sum before it (every rank takes the sums in one order: the copies'
        by the model's later stage first, then the tied groups in the file's order), in release
        order (ties: a reduce before a sum, then that order); a sum starts when every rank holding a
        stage of its group has come to it."""
        n, m, depth = self.n, self.m, self.depth
        groups = []  # (the stages summed together, their time per stage) in the one order
        if self.sync is not None:
            groups += [(tuple(range(j, n, depth)), self.sync) for j in reversed(range(depth))]
        groups += [(g, self.tied_sync) for g in self.tied_groups]
        lanes = []
        for r in range(self.p):
            stages = self.rank_stage_list[r]
            last_w = {s: max(self.end[(2 * n + s) * m + i] for i in range(m)) for s in stages}
            items = []
            if self.reduce is not None:
                items += [((last_w[s] if self.overlap else self.free[r], 0, -s), ("AR", s)) for s in stages]
            at = 0
            for k, (group, _) in enumerate(groups):
                for s in group:
                    if s in last_w:
                        at = max(at, last_w[s])
                        items.append(((at, 1, k), ("sum", k)))
            items.sort()
            lanes.append([(key[0], item) for key, item in items])
        holders = [sorted({self.rank_of_stage[s] for s in group}) for group, _ in groups]
        pos, lane_free = [0] * self.p, [0] * self.p
        moved = True
        while moved:
            moved = False
            for r in range(self.p):
                while pos[r] < len(lanes[r]):
                    release, (kind, x) = lanes[r][pos[r]]
                    if kind == "AR":
                        lane_free[r] = max(lane_free[r], release) + self.reduce[x]
                        pos[r] += 1
                        moved = True
                        continue
                    heads = [lanes[q][pos[q]] if pos[q] < len(lanes[q]) else None for q in holders[x]]
                    if any(h is None or h[1] != ("sum", x) for h in heads):
                        break
                    begin = max(max(lane_free[q], h[0]) for q, h in zip(holders[x], heads))
                    group, times = groups[x]
                    for q in holders[x]:
                        mine = next(s for s in group if self.rank_of_stage[s] == q)
                        lane_free[q] = begin + times[mine]
                        pos[q] += 1
                    moved = True
        assert all(pos[r] == len(lanes[r]) for r in range(self.p)), "the sums deadlocked"
        return [max(self.free[r], lane_free[r]) for r in range(self.p)]


# ---- span when ranks may start late on purpose ----


def span_with_delays(problem, orders):
    """The least span of the per-rank ``orders`` over *every* timing, not only as soon as possible.

    ``orders[rank]`` lists ``(kind, stage, mb)`` with kind F, B, W or BW (fused; cost
    ``problem.cost["BW"]``). A timing must keep each rank's order, start an op only after each
    input arrived (its producer's end, plus ``comm`` across ranks), and memory follows the order
    alone, so only the times change. Returns None if the orders wait on each other in a cycle.

    The span of rank r is ``x(last_r) + dur(last_r) - x(first_r)``. With ``L[r][q]`` the longest
    path (durations and latencies) from the start of rank r's first op to the end of rank q's
    last op, a timing with span T exists iff no cycle through the ranks has ``sum L > k * T``
    (k edges; longest paths as difference constraints). So the least T is the maximum mean cycle
    of the graph on ranks with weights L (Karp), and no larger than the as-soon-as-possible span.
    Why it can be smaller: as soon as possible, a rank starts as soon as its first input
    arrives, and then may wait for later ones; it could have started later and ended no later.
    """
    p, n, comm, rank_of = problem.ranks, problem.n_stages, problem.comm, problem.stage_rank
    orders = [list(orders[r]) for r in range(p)]
    present = {op for ops in orders for op in ops}
    back = {}
    for k, s, i in present:
        if k in ("B", "BW"):
            back[(s, i)] = (k, s, i)

    def inputs(op):
        k, s, i = op
        if k == "F":
            return [("F", s - 1, i)] if s else []
        if k == "W":
            return [("B", s, i)]
        return [("F", s, i)] + ([back[(s + 1, i)]] if s + 1 < n else [])

    dur = {op: problem.cost[op[0]][op[1]] for op in present}
    succ = {op: [] for op in present}
    indeg = {op: 0 for op in present}
    for ops in orders:
        for a, b in zip(ops, ops[1:]):
            succ[a].append((b, 0.0))
            indeg[b] += 1
    for op in present:
        for d in inputs(op):
            succ[d].append((op, 0.0 if rank_of[d[1]] == rank_of[op[1]] else comm))
            indeg[op] += 1
    topo, ready = [], [op for op in present if indeg[op] == 0]
    while ready:
        a = ready.pop()
        topo.append(a)
        for b, _ in succ[a]:
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    if len(topo) < len(present):
        return None  # the orders wait on each other

    NONE = -math.inf
    L = [[NONE] * p for _ in range(p)]
    for r in range(p):
        if not orders[r]:
            continue
        dist = dict.fromkeys(present, NONE)
        dist[orders[r][0]] = 0.0
        for a in topo:
            if dist[a] > NONE:
                for b, lat in succ[a]:
                    dist[b] = max(dist[b], dist[a] + dur[a] + lat)
        for q in range(p):
            if orders[q] and dist[orders[q][-1]] > NONE:
                L[r][q] = dist[orders[q][-1]] + dur[orders[q][-1]]
    # Karp: D[k][v] = the heaviest walk of exactly k edges ending at v.
    D = [[0.0] * p] + [[NONE] * p for _ in range(p)]
    for k in range(1, p + 1):
        for u in range(p):
            if D[k - 1][u] > NONE:
                for v in range(p):
                    if L[u][v] > NONE:
                        D[k][v] = max(D[k][v], D[k - 1][u] + L[u][v])
    best = 0.0
    for v in range(p):
        if D[p][v] > NONE:
            best = max(best, min((D[p][v] - D[k][v]) / (p - k) for k in range(p) if D[k][v] > NONE))
    return best


# ---- recompute: every policy and every order (tiny problems only) ----


def policy_optimum(problem, objective=None):
    """The best objective over every split schedule of ``problem`` with any recompute policy (R, S
    where the problem allows them; not offload) per (stage, microbatch) and any per-rank order that
    respects the dependencies among the rank's ops, judged by schedc's simulator; returns
    ``(value, schedule)``. Microbatches enter stage 0 in order (they are interchangeable, policies
    included). Tiny problems only: it enumerates."""
    import itertools

    from schedc import Op, Schedule, ScheduleError, simulate
    from schedc.kinds import Kind

    objective = objective or problem.objective
    n, m = problem.n_stages, problem.microbatches
    choices = [None] + [k for k in (Kind.R, Kind.S) if k in problem.policies]
    pairs = [(s, i) for s in range(n) for i in range(m)]
    room = problem.activation_room
    best, best_schedule = math.inf, None
    for policy in itertools.product(choices, repeat=len(pairs)):
        pol = dict(zip(pairs, policy))
        per_rank = []
        for r in range(problem.ranks):
            orders = [o for o in _rank_orders(problem, r, pol)
                      if room is None or _fits(problem, o, pol, room[r] + problem.memory_tol.eps)]
            per_rank.append(orders)
        for ranks in itertools.product(*per_rank):
            try:
                t = simulate(problem, Schedule("any", tuple(tuple(Op(*op) for op in ops) for ops in ranks)))
            except ScheduleError:
                continue
            if t.fits and t.objective_value(objective) < best:
                best, best_schedule = t.objective_value(objective), t.schedule
    return best, best_schedule


def _rank_orders(problem, r, pol):
    """Every order of rank r's ops under policies ``pol`` that respects the dependencies among them."""
    stages, m, depth = problem.rank_stages[r], problem.microbatches, problem.pipeline_stages
    before = {}
    for s in stages:
        own = [t for t in stages if t // depth == s // depth]  # (with replicas: the stages of s's pipeline)
        for i in range(m):
            k = pol[(s, i)]
            before[("F", s, i)] = {("F", t, i) for t in own if t < s} | (
                {("F", s, i - 1)} if s == 0 and i > 0 else set())
            bring = {("F", s, i)}
            if k is not None:
                before[(k.value, s, i)] = {("F", s, i)}
                bring = {(k.value, s, i)}
            before[("B", s, i)] = bring | {("B", t, i) for t in own if t > s}
            before[("W", s, i)] = {("B", s, i)}
    return linear_extensions(before)


def linear_extensions(before: dict) -> list[tuple]:
    """Every order of the keys of ``before`` (op -> the ops that must come earlier) that puts each
    op after all of its ``before``."""
    out = []

    def extend(prefix, done):
        if len(prefix) == len(before):
            out.append(tuple(prefix))
        for op, needs in before.items():
            if op not in done and needs <= done:
                extend(prefix + [op], done | {op})

    extend([], frozenset())
    return out


def _fits(problem, order, pol, room):
    """Whether one rank's order stays within ``room`` (one lane: the order alone decides)."""
    from schedc.kinds import Kind

    level = 0.0
    for kind, s, i in order:
        d = problem.delta(Kind(kind), s, pol[(s, i)])
        if level + max(d, 0.0) > room:
            return False
        level += d
    return True


def pair_optimum(problem, objective=None):
    """The best objective over every split schedule of ``problem`` (no recompute; with replicas, sync 0)
    with any per-rank order that respects the dependencies among the rank's ops and any choice of
    overlapped pairs (``Schedule.pairs``: a forward and the backward B of another (stage,
    microbatch) right after it), judged by schedc's simulator; returns ``(value, schedule)``.
    Tiny problems only: it enumerates."""
    import itertools

    from schedc import Op, Schedule, ScheduleError, simulate

    objective = objective or problem.objective
    pol = {(s, i): None for s in range(problem.n_stages) for i in range(problem.microbatches)}
    room = problem.activation_room
    per_rank = []
    for r in range(problem.ranks):
        choices = []
        for order in _rank_orders(problem, r, pol):
            if room is not None and not _fits(problem, order, pol, room[r] + problem.memory_tol.eps):
                continue
            spots = [x for x in range(len(order) - 1) if order[x][0] == "F" and order[x + 1][0] == "B"
                     and order[x][1:] != order[x + 1][1:]]
            for chosen in itertools.chain.from_iterable(itertools.combinations(spots, k) for k in range(len(spots) + 1)):
                choices.append((order, tuple(Op(*order[x + 1]) for x in chosen)))
        per_rank.append(choices)
    best, best_schedule = math.inf, None
    for ranks in itertools.product(*per_rank):
        schedule = Schedule("any", tuple(tuple(Op(*op) for op in ops) for ops, _ in ranks),
                            pairs=tuple(pairs for _, pairs in ranks))
        try:
            t = simulate(problem, schedule)
        except ScheduleError:
            continue
        if t.fits and t.objective_value(objective) < best:
            best, best_schedule = t.objective_value(objective), t.schedule
    return best, best_schedule
