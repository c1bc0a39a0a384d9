"""Lower bounds on the objective that no schedule fitting the memory limit can beat.

``lower_bound(problem)`` is computed from the Problem alone, independently of any solver, so
that a solver's answer can be certified: ``best found / lower_bound`` is a proven gap. It is
the largest of the terms below, each a lower bound on its own for *every* schedule that fits
the memory limit, split (F, B, W) or fused (F, BW), timed as soon as possible or otherwise.

Notation, per stage s: ``F, B, W`` its costs; ``mF >= 0`` what its forward allocates and
``mW = -memory.W`` what its weight gradient frees (``mF - mW`` is freed by B); ``d(s, t)`` the
latency between stages s and t (``comm`` when they sit on different ranks, else 0). Per rank r:
``lo``/``hi`` its lowest / highest stage, ``work = m * sum(F + B + W)`` over its stages, ``cap =
limit - static`` plus the simulator's tolerance, ``Problem.memory_tol`` (infinite without a limit). Three chains
of one microbatch, true of every schedule because they are data dependencies:

- ``head(s) = sum_{t<s} (F(t) + d(t, t+1))``: F(s, i) cannot start before it (the forward
  chain from stage 0; every rank starts at time 0).
- ``rt(s) = sum_{t>s} (F(t) + B(t)) + 2 * sum_{t>=s} d(t, t+1)`` (``rt(last) = 0``): from the
  end of F(s, i) to the start of B(s, i), the forward goes up through the later stages and the
  input gradient comes back (a fused BW ends even later than its B part would).
- ``down(s) = sum_{t<s} (d(t+1, t) + B(t)) + W(0)``: from the end of B(s, i) to the end of
  W(0, i) (the gradient goes on down to stage 0, then stage 0's weight gradient).

Three facts about the order on one rank r, from the dependencies alone:

1. Its first op is a forward, so it starts at ``head(lo)`` or later.
2. Its first backward is of stage ``hi`` (B(s, i) needs B(t, i) for every t > s, and those on
   rank r would come first); likewise its last forward is of stage ``hi`` (F(t, i) for t < s
   precede F(s, i)), and its last backward is of stage ``lo``.
3. Memory follows the order: at any time the rank holds ``mF`` for every (stage, microbatch)
   whose forward has started and whose B has not ended, plus ``mW`` for every one whose B has
   ended and whose W has not (the simulator checks exactly this level against the limit, at
   every op, so it holds at every instant). So amounts of pending work are bounded by fractional
   knapsacks over ``cap`` (``_knapsack``).

Under ``span`` a rank's window opens at its own first op, which a schedule may delay on
purpose: no term assumes as-soon-as-possible times. What ties one rank's window to another's is
the forward chain: rank q's first op, F(lo(q), i), starts ``head(lo(q)) - head(lo(r))`` or more
after F(lo(r), i) on rank r, so rank r's window holds most of rank q's work and then one
microbatch's way back to rank r (``_pair_bound``). On the zero-bubble paper's 2p settings with
few microbatches per rank, that is the idle no schedule avoids: the last rank must do its F and
B within rank 0's window and can only push its W past it.

Where the problem allows recompute or offload (``Problem.policies``), a limit can be bought with
time, so the terms above that rest on what a microbatch holds are dropped and re-derived
(``_policy_bounds``): the memory-free terms of the plain relaxation; per rank, memory-time weighed
against the recompute and copy work a limit forces (``_forced``), how many microbatches of a stage
may be in flight at once (``_in_flight``; ``_windows`` where the policies keep different amounts),
and the per-rank and two-rank terms above with each knapsack re-derived for what each policy holds
(``_policy_rank``): the warm-up with forwards that owe a recompute or wait for a copy out, the
cool-down, and the W work memory lets a rank defer
past its last backward (``mW`` per microbatch, whatever its policy, beside the whole activation
that last backward holds: ``_deferred_w``), which on the zero-bubble paper's settings below 1F1B's
memory is what binds; and the backward work a rank must still hold at its last forward for the
way back (through another rank's span, for span), weighed against the recompute that holding it
owes on its own lane (``_held_at_last_forward``: the V's middle rank at 1F1B's memory and below).

With ``data_parallel``, nothing waits for a gradient all-reduce but the rank's step, and a rank's
last compute op is the last weight gradient of one of its stages (a W or BW ends each microbatch's
work on a stage, and the rank's other ops precede their own stage's): its step comes at least one
reduce of its stages after its compute ends, all of them when the reduces wait for the end
(``overlap`` off). So each term above, derived without the reduces, rises by that tail of the rank
whose step it bounds (``Bound.rank``; a term of no one rank's by the least tail over the ranks,
``_sync_tail``).

With ``replicas`` (pipelines in opposite directions on the same ranks), the chains run along each
stage's own pipeline, and a rank holds stages of several pipelines, so facts 1 and 2 hold per
pipeline only: the terms are then those that need neither (``_bidirectional_bounds``: work,
memory-time, critical path), weaker than for one pipeline, and one that needs only the earliest
backward over the rank's stages (``_first_backward``: a middle rank waits a round trip of each
direction for it and can only run unpaired forwards until then). The gradient sums RS and TS join
the reduces' tail: the stage whose weight gradient ends last on a rank still has its syncs to run.

With overlapped pairs (``costs.FB``), the terms are those of a relaxation whose F and B are cut so
that a pair saves nothing (``_without_overlap``), and ``_first_backward`` on the problem itself,
which counts the pairs a rank can still form after its first backward.

All bounds are relaxations: they may lie below the best schedule, never above a schedule that
fits. Cost O(p * v * log v), and O(p^2 * v) for the span terms over two ranks; m only multiplies.
Every value is a sum, maximum or ratio of costs, so it scales with the unit of time, and the term
named as binding among equal ones (up to ``Problem.time_tol``) is the same in every unit.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from schedc.kinds import ROWS, Kind, check_supported
from schedc.layers import BIDIRECTIONAL, LayerProblem
from schedc.partition import min_max_cut
from schedc.problem import Problem
from schedc.schedule import Op, comm_ops, producers

BOUNDED = (Kind.F, Kind.B, Kind.W, Kind.BW, Kind.R, Kind.S, Kind.RG, Kind.SG, Kind.O, Kind.L, Kind.AR, Kind.RS, Kind.TS)  # the kinds the terms hold for
POLICY_GRID = 8  # memory for time: the weights of its terms on a grid of this many steps (any weights are valid)
POLICY_REFINE = 16  # memory for time: then steps of a ternary search beside the grid's best
JOINT_POLICIES = 4096  # at most this many policy assignments of one microbatch on a rank are enumerated
WINDOW_EXACT = 16  # _windows: a policy that fits this many times or fewer in a window's room is counted exactly
WINDOW_COMBOS = 256  # _windows: at most this many mixes of those are enumerated (the rest relaxed)
TINY_WEIGHT = 1e-200  # _item_hull: a lighter option counts as weighing nothing (no slope overflows)
KNAP_EXACT = 16  # _most: an option that fits this many times or fewer in the room is counted in whole microbatches
KNAP_COMBOS = 256  # _most: at most this many mixes of those are enumerated (the rest relaxed)
LAST_FORWARD_GRID = 20  # _held_at_last_forward: the weight of the chain against the recompute, on a grid of this many
LAST_FORWARD_REFINE = 20  # _held_at_last_forward: then steps of a ternary search beside the grid's best


@dataclass(frozen=True)
class Bound:
    value: float
    reason: str  # which term binds, in one sentence
    rank: int | None = None  # the rank whose step (its end, or its span) the term bounds; None: some rank's


def lower_bound(problem: Problem, objective: str | None = None) -> Bound:
    """The largest of ``all_bounds``: a lower bound on ``objective`` (default: the problem's)
    for every schedule that fits the memory limit."""
    value, (_, first) = _largest(problem, [(b.value, b) for b in all_bounds(problem, objective)])
    return Bound(value, first.reason)


def _largest(problem: Problem, items: list[tuple]) -> tuple:
    """``(the largest value, the first item whose value equals it up to float noise)`` of
    ``(value, ...)`` items: ties keep the simpler, earlier term, in any unit of time."""
    top = max(item[0] for item in items)
    return top, next(item for item in items if problem.time_tol.ge(item[0], top))


def all_bounds(problem: Problem, objective: str | None = None) -> list[Bound]:
    """Every term separately: per-rank bounds (work, idle, tail, memory-time), then the critical
    path of one microbatch, then (span) per rank the best term over it and another rank."""
    objective = objective or problem.search_objective
    if objective not in ("makespan", "span"):
        raise ValueError(f"objective must be 'makespan' or 'span', got {objective!r}")
    check_supported(problem.cost, "the lower bounds", BOUNDED)
    if problem.overlap_time is not None:  # (the first-backward term counts the pairs themselves)
        return all_bounds(_without_overlap(problem), objective) + _first_backward(problem, objective)
    if any(problem.cost[op.kind][op.stage] for r in range(problem.ranks) for op in comm_ops(problem, r)):
        return _with_sync(problem, objective)
    problem = _relaxed(problem)
    if problem.seq_chunks > 1:
        return _chunked_bounds(problem, objective)
    if problem.replicas is not None:
        return _bidirectional_bounds(problem, objective)
    if problem.policies:
        return _policy_bounds(problem, objective)
    ch = _Chains(problem)
    ranks = [_rank(problem, r) for r in range(problem.ranks)]
    out = [_rank_bound(problem, ch, ranks[r], r, objective) for r in range(problem.ranks)]
    out += [_memory_time_bound(problem, ch, r, objective) for r in range(problem.ranks)]
    out.append(_critical_path(problem, ch, objective))
    if objective == "span":
        out += _pair_bounds(problem, ch, ranks)
    return [b for b in out if b is not None]


def _sync_tail(problem: Problem) -> list[float]:
    """Per rank, the least time from its last compute op's end to its step: the syncs (AR, RS, TS) of
    the stage whose weight gradient ends last (the cheapest stage's), and all the reduces in turn
    where they wait for the end (no ``data_parallel.overlap``); they share the rank's lane."""
    whole = problem.data_parallel is not None and not problem.data_parallel.overlap
    out = []
    for r, stages in enumerate(problem.rank_stages):
        ops = comm_ops(problem, r)
        at_end = sum(problem.cost[op.kind][op.stage] for op in ops if whole and op.kind is Kind.AR)
        per_stage = {s: sum(problem.cost[op.kind][op.stage] for op in ops
                            if op.stage == s and not (whole and op.kind is Kind.AR)) for s in stages}
        out.append(at_end + min(per_stage.values()))
    return out


def _with_sync(problem: Problem, objective: str) -> list[Bound]:
    """The terms of ``problem`` without its syncs, each raised by its rank's tail (a term of no
    one rank's: by the least over the ranks; see the module notes)."""
    tail = _sync_tail(problem)
    least = min(tail)
    inner = problem.with_changes(data_parallel=None, tied=None,
                                 **({"replicas": {"sync": 0.0}} if problem.replicas else {}))
    out = []
    for b in all_bounds(inner, objective):
        more = least if b.rank is None else tail[b.rank]
        out.append(Bound(b.value + more, f"{b.reason}, then at least {more:g} of gradient sync", b.rank))
    return out


def _bidirectional_bounds(problem: Problem, objective: str) -> list[Bound]:
    """With replicas, the terms that need no fact about one chain per rank (a rank holds stages of
    several pipelines, so neither its first backward nor its last forward is known): per rank its
    work, after the earliest its first forward can start (makespan); per rank memory-time (each
    pair holds its activation from its forward to its backward, through its own pipeline's round
    trip); and the critical path of one microbatch, each along its own pipeline's chains. Without
    a memory limit's terms where the problem allows recompute or offload (a limit can be bought
    with time there)."""
    ch = _Chains(problem)
    F, B, W = (problem.cost[k] for k in (Kind.F, Kind.B, Kind.W))
    m = problem.microbatches
    out = []
    for r, stages in enumerate(problem.rank_stages):
        work = m * sum(F[s] + B[s] + W[s] for s in stages)
        start = min(ch.head[s] for s in stages) if objective == "makespan" else 0.0
        lead = f"start no earlier than {start:g} + " if start > 0 else ""
        out.append(Bound(start + work, f"rank {r}: {lead}work {work:g}", r))
        if not problem.policies:
            out.append(_memory_time_bound(problem, ch, r, objective))
    out.append(_critical_path(problem, ch, objective))
    out += _first_backward(problem, objective)
    return [b for b in out if b is not None]


def _first_backward(problem: Problem, objective: str) -> list[Bound]:
    """Per rank r, what its work costs once no backward can have reached it yet: a term for two
    directions (where a middle rank waits a round trip of each for its first backward) and for
    overlapped pairs (``costs.FB``, counted here as pairs, not relaxed away).

    ``first_b`` is the earliest any backward (B or BW) can start on rank r: ``head(s) + F(s) +
    rt(s)`` over its stages s (span: ``F(s) + rt(s)`` after the rank's first op, which precedes
    F(s, i)), along chains timed with each op at its quickest (an F or B in a pair ends after the
    rank's FB; a fused BW ends its input gradient no sooner than BW). Before ``first_b`` the rank
    runs forwards only, unpaired (a pair holds a backward, a W follows its B), so k forwards there
    take x <= the k dearest forwards' time, no more than the window (x <= first_b - head, makespan),
    and, with nothing freed before a backward and no policy to drop an activation, their
    activations fit the rank's room. After it the rank runs the rest of its work, ``total - x``
    less what pairs save: each pair at most ``max F + max B - FB`` of the rank, and at most one per
    forward left (n - k). So an end of ``first_b + total - x - save (n - k)`` or later, at least
    ``total - save (n - k) + max(head, first_b - x_k)``; the least over the k the room allows.
    ``total`` counts each backward at the cheaper of B + W and BW (a pair with BW also runs its W).
    Not for sequence chunks (per-chunk costs): ``_chunked_bounds`` has its own terms."""
    if problem.seq_chunks > 1:
        return []
    c, fb, sr, m = problem.cost, problem.overlap_time, problem.stage_rank, problem.microbatches
    F, B, W = c[Kind.F], c[Kind.B], c[Kind.W]
    stages_all = range(problem.n_stages)
    fused = problem.costs.BW is not None
    back = [min(B[s] + W[s], c[Kind.BW][s]) if fused else B[s] + W[s] for s in stages_all]  # a backward's least work
    gradient = [min(B[s], c[Kind.BW][s]) if fused else B[s] for s in stages_all]  # its input gradient's soonest end

    def quickest(x: float, s: int) -> float:
        return x if fb is None else min(x, fb[sr[s]])

    ch = _Chains(_with_costs(problem, {"F": [quickest(F[s], s) for s in stages_all],
                                       "B": [quickest(gradient[s], s) for s in stages_all], "W": list(W)}))
    makespan = objective == "makespan"
    out = []
    for r, stages in enumerate(problem.rank_stages):
        first_b = min((ch.head[s] if makespan else 0.0) + quickest(F[s], s) + ch.rt[s] for s in stages)
        start = min(ch.head[s] for s in stages) if makespan else 0.0
        total = m * sum(F[s] + back[s] for s in stages)
        n = m * len(stages)
        save = 0.0 if fb is None else max(0.0, max(F[s] for s in stages) + max(B[s] for s in stages) - fb[r])
        held = math.inf if problem.policies else _cap(problem, r)
        dearest = sorted((F[s] for s in stages), reverse=True)
        lightest = sorted(max(0.0, problem.mem[Kind.F][s]) for s in stages)
        x = room = 0.0
        best = (math.inf, 0)
        for k in range(n + 1):  # k forwards before first_b (at least the rank's first op under span)
            if k:
                x += dearest[(k - 1) // m]
                room += lightest[(k - 1) // m]
                if room > held:
                    break
            if k or makespan:
                best = min(best, (total - save * (n - k) + max(start, first_b - x), k))
        value, k = best
        if value < math.inf:
            pairs = f", and overlapped pairs save at most {save:g} each" if save > 0 else ""
            out.append(Bound(value, f"rank {r}: no backward reaches it before {first_b:g}, and its work {total:g}"
                                    f" follows the forwards run by then (least with {k}){pairs}", r))
    return out


def _chunked_bounds(problem: Problem, objective: str) -> list[Bound]:
    """With sequence chunks (``Problem.sequence_chunks``; no policies, replicas, syncs or pairs
    there: Problem refuses them), the terms proven for ops of different costs per chunk position
    (``Problem.op_cost``) and the chunk rule (``producers``' ``chunk_needs``), after ``_relaxed``
    (which scales a stage's B and W by one ratio, so each chunk's B' + W' is at most its BW: every
    fused schedule is a split one of the relaxation or slower). The other terms assume one cost per
    stage and kind, and are not used here.

    - The chains of one sequence: every sequence's ops form the same DAG (costs depend on the chunk
      position only; ``producers``): F(s, c) after F(s-1, c) (+ comm across ranks) and F(s, c-1);
      B(s, c) after F(s, c), B(s+1, c) (+ comm) and B(s, c+1); W(s, c) after B(s, c). Every op starts at 0 or
      later, so the makespan is at least the longest path (its ``es``: each op's earliest start).
      Span: for any two ops a, b of one sequence on rank r with a path from a to b, rank r's window
      holds a's start and b's end: its span is at least that path.
    - Per rank, its work (every op of every unit: F + B' + W'), one op at a time: its span is at
      least that; for the makespan, every op of the rank starts no earlier than the earliest ``es``
      of its forwards (each op has one of its rank's forwards before it: B and W their own F), and
      every B and W no earlier than the earliest ``es`` of its backwards."""
    n, sr, comm, k = problem.n_stages, problem.stage_rank, problem.comm, problem.seq_chunks
    c = problem.op_cost
    split = (Kind.F, Kind.B, Kind.W)
    nodes = [Op(kind, s, u) for u in range(k) for s in range(n) for kind in split]
    dur = {x: c(*x) for x in nodes}
    # What each op of sequence 0 waits for: the one dependency rule (``producers``, with the chunks'),
    # plus the latency across ranks.
    preds = {x: [(d, comm if sr[d.stage] != sr[x.stage] else 0.0) for d in producers(x, problem.pipeline_stages, None, k)]
             for x in nodes}
    # A topological order: forwards by (chunk, stage), then backwards by (chunk, stage) reversed.
    order = ([Op(Kind.F, s, u) for u in range(k) for s in range(n)]
             + [Op(kind, s, u) for u in reversed(range(k)) for s in reversed(range(n)) for kind in (Kind.B, Kind.W)])

    def longest(source: Op | None) -> dict[Op, float]:
        """Each node's latest end on a path from ``source``'s start (None: from time 0, any node)."""
        end: dict[Op, float] = {}
        for x in order:
            ins = [end[a] + lat for a, lat in preds[x] if a in end]
            if x == source or source is None:
                ins.append(0.0)
            if ins:
                end[x] = max(ins) + dur[x]
        return end

    es_end = longest(None)
    es = {x: es_end[x] - dur[x] for x in nodes}
    out = []
    for r, stages in enumerate(problem.rank_stages):
        units = range(problem.units)
        fwd = sum(c(Kind.F, s, u) for s in stages for u in units)
        back = sum(c(Kind.B, s, u) + c(Kind.W, s, u) for s in stages for u in units)
        if objective == "makespan":
            start = min(es[Kind.F, s, u] for s in stages for u in range(k))
            late = min(es[Kind.B, s, u] for s in stages for u in range(k))
            out.append(Bound(start + fwd + back, f"rank {r}: start no earlier than {start:g} + work {fwd + back:g}"
                             " (sequence chunks)", r))
            out.append(Bound(late + back, f"rank {r}: first backward no earlier than {late:g} + backward work"
                                          f" {back:g} (sequence chunks)", r))
        else:
            out.append(Bound(fwd + back, f"rank {r}: work {fwd + back:g} (sequence chunks)", r))
            mine = [x for x in nodes if sr[x.stage] == r]
            best = 0.0
            for a in mine:  # (from one of its forwards: every op of the rank has one before it)
                if a.kind is Kind.F:
                    end = longest(a)
                    best = max([best] + [end[b] for b in mine if b in end])
            out.append(Bound(best, f"rank {r}: one sequence's chain from and back to it: {best:g}", r))
    if objective == "makespan":
        top = max(es_end.values())
        out.append(Bound(top, f"critical path of one sequence ({k} chunks through every stage and back): {top:g}"))
    return out


def _without_overlap(problem: Problem) -> Problem:
    """Where a rank runs a forward and an input gradient faster overlapped (``costs.FB``), scale the
    F and B of its stages down by FB / (the largest F + B of its stages) (a fused backward to at
    most the scaled B plus W): no op gets longer, and a pair's time (FB, plus W for a fused
    backward) is no less than its two ops' relaxed times one after the other, so every schedule of
    the problem, pairs or not, is a schedule of the relaxation or slower."""
    c = problem.cost
    k = [1.0] * problem.n_stages
    for r, stages in enumerate(problem.rank_stages):
        most = max(c[Kind.F][s] for s in stages) + max(c[Kind.B][s] for s in stages)
        for s in stages:
            k[s] = min(1.0, problem.overlap_time[r] / most)
    costs = {"F": [x * y for x, y in zip(c[Kind.F], k)], "B": [x * y for x, y in zip(c[Kind.B], k)], "W": list(c[Kind.W])}
    if problem.costs.BW is not None:
        costs["BW"] = [min(bw, b * y + w) for bw, b, w, y in zip(c[Kind.BW], c[Kind.B], c[Kind.W], k)]
    return _with_costs(problem, costs)


def _relaxed(problem: Problem) -> Problem:
    """Where a fused backward is cheaper than B + W, scale that stage's B and W down by
    BW / (B + W): no op gets longer (B' <= B, W' <= W, B' + W' <= BW, B' <= BW), a list schedule
    is no slower with shorter ops, so bounds of the relaxed problem hold for every schedule, fused
    or split, of the original."""
    if not problem.fused_cheaper:
        return problem
    c = problem.cost
    r = [min(1.0, bw / (b + w)) for b, w, bw in zip(c[Kind.B], c[Kind.W], c[Kind.BW])]
    costs = {Kind.F.value: list(c[Kind.F]), Kind.B.value: [x * k for x, k in zip(c[Kind.B], r)],
             Kind.W.value: [x * k for x, k in zip(c[Kind.W], r)]}
    return _with_costs(problem, costs)


def _with_costs(problem: Problem, costs: dict) -> Problem:
    """``problem`` with ``costs`` (a relaxation's), everything else as it was: a recompute whose
    time defaulted to the stage's F keeps that F."""
    data = problem.model_dump(exclude_none=True)
    data["costs"] = costs
    if problem.recompute is not None and problem.recompute.time is None:  # it defaulted to F: keep it so
        data["recompute"]["time"] = list(problem.cost[Kind.F])
    return Problem.parse(data)


# ---- the chains of one microbatch ----


class _Chains:
    """head, rt and down (the module notes) per stage, each along the stage's own pipeline (with
    replicas, the first stage of each pipeline starts its chains)."""

    def __init__(self, problem: Problem):
        n, sr, comm, depth = problem.n_stages, problem.stage_rank, problem.comm, problem.pipeline_stages
        F, B, W = (problem.cost[k] for k in (Kind.F, Kind.B, Kind.W))
        d = [comm if sr[s] != sr[s + 1] else 0.0 for s in range(n - 1)]  # d[s] = d(s, s+1)
        first = [s % depth == 0 for s in range(n)]  # the first stage of its pipeline
        self.head = [0.0] * n
        for s in range(1, n):
            self.head[s] = 0.0 if first[s] else self.head[s - 1] + F[s - 1] + d[s - 1]
        self.rt = [0.0] * n
        for s in range(n - 2, -1, -1):
            self.rt[s] = 0.0 if first[s + 1] else self.rt[s + 1] + F[s + 1] + B[s + 1] + 2 * d[s]
        self.down = [W[s] if first[s] else 0.0 for s in range(n)]
        for s in range(1, n):
            if not first[s]:
                self.down[s] = self.down[s - 1] + B[s - 1] + d[s - 1]


def _cap(problem: Problem, r: int) -> float:
    room = problem.activation_room
    return math.inf if room is None else room[r] + problem.memory_tol.eps


def _fill(pieces: list[tuple[float, float, int]], room: float) -> float:
    """The value of up to ``count`` of each ``(value, weight)``, taken in the order given (falling
    value per weight) while ``room`` lasts, the last one in part: a fractional knapsack's fill."""
    got = 0.0
    for v, w, c in pieces:
        if room <= 0:
            break
        take = min(c, room / w)
        got += take * v
        room -= take * w
    return got


def _knapsack(items: list[tuple[float, float, int]], cap: float) -> float:
    """An upper bound on the total value of ``count`` copies at most of each ``(value, weight)``
    whose weights sum to ``cap`` or less: the fractional optimum, and no more than the best
    ``floor(cap / lightest weight)`` values (no more items than that fit)."""
    free = sum(v * c for v, w, c in items if c > 0 and v > 0 and (w <= 0 or cap == math.inf))
    rest = sorted(((v / w, v, w, c) for v, w, c in items if c > 0 and v > 0 and w > 0), reverse=True)
    if cap == math.inf or not rest:
        return free
    frac = _fill([(v, w, c) for _, v, w, c in rest], cap)
    fits = cap / min(w for _, _, w, _ in rest) * (1 + 1e-12)  # inf for weights as small as 5e-324
    k = sum(c for *_, c in rest)
    k = k if fits >= k else math.floor(fits)
    top = 0.0
    for v, c in sorted(((v, c) for _, v, _, c in rest), reverse=True):
        n = min(c, k)
        top += n * v
        k -= n
        if k <= 0:
            break
    return free + min(frac, top)


# ---- per-rank terms ----


@dataclass(frozen=True)
class _Rank:
    """What the per-rank terms know of rank r: its stages, work, room and the knapsacks on it."""

    stages: tuple[int, ...]
    lo: int
    hi: int
    cap: float
    work: float
    knap_f: float  # forward work held at once
    knap_pend: float  # backward work held next to F(hi, i)'s activation
    knap_w: float  # W work the rank may run after its last backward (``_deferred_w``)
    knap_back: float  # backward work (B + W, or W alone) held at once
    all_forwards_fit: bool  # every forward of the rank may be held at once (then the windows may overlap)
    owed_all: float = 0.0  # the least extra work holding every forward at once forces (policies only)


def _rank(problem: Problem, r: int) -> _Rank:
    F, B, W = (problem.cost[k] for k in (Kind.F, Kind.B, Kind.W))
    mF = problem.mem[Kind.F]
    mW = [-x for x in problem.mem[Kind.W]]
    m = problem.microbatches
    stages = problem.rank_stages[r]
    lo, hi = stages[0], stages[-1]
    cap = _cap(problem, r)
    pend = [(B[s] + W[s], mF[s], m - (s == hi)) for s in stages] + [(W[s], mW[s], m - (s == hi)) for s in stages]
    back = [(B[s] + W[s], mF[s], m) for s in stages] + [(W[s], mW[s], m) for s in stages]
    return _Rank(
        stages=stages,
        lo=lo,
        hi=hi,
        cap=cap,
        work=m * sum(F[s] + B[s] + W[s] for s in stages),
        knap_f=_knapsack([(F[s], mF[s], m) for s in stages], cap),
        knap_pend=_knapsack(pend, cap - mF[hi]),
        knap_w=_deferred_w(problem, stages, cap),
        knap_back=_knapsack(back, cap),
        all_forwards_fit=m * sum(mF[s] for s in stages) <= cap,
    )


def _deferred_w(problem: Problem, stages: tuple[int, ...], cap: float) -> float:
    """The most W work a rank holding ``stages`` may run after its last backward ends, B(lo, i) (fact
    2; its B part if fused): every F and B of the rank has ended by then, so what follows is W
    work (W(lo, i)'s own among it), each pending W holding mW from its B's end. Just before that
    B ends, the rank holds mF(lo) for microbatch i (kept, recomputed or loaded back, its whole
    activation is there for its B) beside the mW of every other W pending then, so those fit in
    ``cap - mF(lo)``: W(lo) plus a knapsack over that room; and no more than the knapsack of all
    the pending W over ``cap`` (their level once that B has ended)."""
    W, mF = problem.cost[Kind.W], problem.mem[Kind.F]
    mW = [-x for x in problem.mem[Kind.W]]
    m, lo = problem.microbatches, stages[0]
    pending = _knapsack([(W[s], mW[s], m) for s in stages], cap)
    others = _knapsack([(W[s], mW[s], m - (s == lo)) for s in stages], max(0.0, cap - mF[lo]))
    return min(pending, W[lo] + others)


def _first_backward_wait(ch: _Chains, F: list[float], lo: int, hi: int, objective: str) -> float:
    """The earliest start of a rank's first backward, B(hi, i): from time 0 (makespan), or after the
    rank's first op, F(lo, j) (span): F(hi, i) starts head(hi) - head(lo) after F(lo, i), then its
    round trip."""
    return F[hi] + ch.rt[hi] + (ch.head[hi] if objective == "makespan" else ch.head[hi] - ch.head[lo])


def _idle(problem: Problem, ch: _Chains, k: _Rank, objective: str) -> tuple[float, float, list[str]]:
    """Idle rank k cannot avoid (see ``_rank_bound``): ``(before its last backward, before its
    last forward, the parts in words)``. Span: counted from the rank's own first start, and all
    of it before its last backward ends; makespan: from time 0."""
    F = problem.cost[Kind.F]
    lo, hi = k.lo, k.hi
    first_b = _first_backward_wait(ch, F, lo, hi, objective)
    warm = first_b - k.knap_f
    staggered, by = _staggered(problem, ch, k, objective, first_b)
    cool = max(0.0, ch.rt[hi] - k.knap_pend)
    start = ch.head[lo] if objective == "makespan" else 0.0
    after = "" if objective == "makespan" else " after its first op"

    parts = []
    if start >= max(warm, staggered) and start > 0:
        idle_warm = start
        parts.append(f"start no earlier than {start:g}")
    elif staggered > max(warm, 0.0):
        idle_warm = staggered
        parts.append(f"warm-up idle {staggered:g} (by {by:g}{after} only so many of its forwards can have reached it)")
    elif warm > 0:
        idle_warm = warm
        net = " net of the recompute they owe" if problem.policies else ""
        parts.append(
            f"warm-up idle {warm:g} (first B cannot start before {first_b:g}{after};"
            f" memory admits forwards worth {k.knap_f:g}{net})"
        )
    else:
        idle_warm = 0.0
    cool_text = (
        f"cool-down idle {cool:g} (after its last forward the gradient needs {ch.rt[hi]:g};"
        f" memory holds backward work {k.knap_pend:g})"
    )
    if cool > 0:
        parts.append(cool_text)
    if not k.all_forwards_fit:  # some forward starts after the first backward: the windows are apart
        return idle_warm + cool, idle_warm, parts
    # Or every forward starts before the first backward: the larger of the two, and the extra work
    # that holding them all at once forces (none without policies); the smaller of the two cases.
    apart, together = idle_warm + cool, max(idle_warm, cool, k.owed_all)
    if together >= apart:
        return apart, 0.0, parts
    if k.owed_all >= max(idle_warm, cool):
        return together, 0.0, [f"recompute {k.owed_all:g} (to hold every forward at once, else the windows are apart)"]
    return together, 0.0, [cool_text if cool > idle_warm else parts[0]]


def _staggered(problem: Problem, ch: _Chains, k: _Rank, objective: str, first_b: float) -> tuple[float, float]:
    """Idle before the rank's first backward from its forwards' arrivals: F(s, j) starts no sooner
    than ``off(s)`` = head(s) - head(lo) after the rank's first op (span; that op is some F(lo, j),
    and F(s, j) follows it along the forward chain) or head(s) from time 0 (makespan), and before
    ``first_b`` (when the first backward can start) the rank runs only forwards, m per stage, and
    recomputes (work not in ``work``, so not subtracted here). By t <= first_b it has done at most
    ``x(s) = min(m F(s), max(0, t - off(s)))`` of stage s's forward work, and the forwards it has
    started hold their activations (nothing is freed before a backward): at least x(s) / F(s) of
    them, mF(s) each, within the room. So it has idled at least t less the most forward work those
    allow, a fractional knapsack over the stages (work per activation F(s) / mF(s), at most x(s)
    each; with policies a forward may hold less, so only the sum of the x(s)). On the V (and
    interleaved) placements the rank's later stages arrive late: by head(hi) - head(lo) only stage
    lo's forwards can have run, and only as many as the room holds. ``(the largest over t, that
    t)``, at the corners."""
    F, m = problem.cost[Kind.F], problem.microbatches
    mF = problem.mem[Kind.F]
    base = 0.0 if objective == "makespan" else ch.head[k.lo]
    off = {s: ch.head[s] - base for s in k.stages}
    cap = math.inf if problem.policies else k.cap
    best = (0.0, 0.0)
    for t in sorted({first_b, *off.values(), *(off[s] + m * F[s] for s in k.stages)}):
        if t > first_b:
            break
        done = {s: min(m * F[s], max(0.0, t - off[s])) for s in k.stages}  # (x(s); done / F forwards)
        busy = _knapsack([(F[s], mF[s], done[s] / F[s] if F[s] > 0 else m) for s in k.stages], cap)
        if t - busy > best[0]:  # (the earliest t of the largest)
            best = (t - busy, t)
    return best


def _rank_bound(problem: Problem, ch: _Chains, k: _Rank, r: int, objective: str) -> Bound:
    """The rank's work plus idle it cannot avoid, plus (makespan) what must follow its end.

    - warm-up: before the first backward, B(hi, i), the rank runs only forwards (W needs its B),
      holding all their activations: their work is at most ``knap_F``, the most forward work
      ``cap`` admits. B(hi, i) starts >= start F(hi, i) + F(hi) + rt(hi), and F(hi, i) starts
      >= start F(lo, i) + head(hi) - head(lo) (the forward chain from stage lo), where F(lo, i),
      an op of the rank, starts no earlier than the rank's first op, and (makespan) F(hi, i)
      starts >= head(hi) in absolute time. So the idle before it is >= ``head(hi) - head(lo) +
      F(hi) + rt(hi) - knap_F`` after the rank's first start (span), and >= ``head(hi) + F(hi) +
      rt(hi) - knap_F`` and >= ``head(lo)`` from time 0 (makespan). The window ends before the
      rank's last forward ends unless every forward fits in memory at once (else some forward
      must wait for a backward to free memory).
    - cool-down: after the last forward F(hi, i) ends, B(hi, i) starts >= rt(hi) later;
      meanwhile the rank runs only backward work of other pairs already forwarded, each still
      holding memory at that instant next to F(hi, i)'s ``mF(hi)``: at most ``knap_pend`` (pairs
      before their B: B + W for mF; after it: W for mW). Idle >= ``rt(hi) - knap_pend``. Its
      window lies after the warm-up window unless every forward fits in memory at once (then
      only the larger of the two counts), and before the rank's last backward ends.
    - tail (makespan): let e be the end of the rank's last backward (stage lo, its B part if
      fused) and w the W work the rank runs after e. Then makespan >= e + max(w, down(lo)) and
      e >= work - w + idle before e; w <= ``knap_W`` (``_deferred_w``: pending W hold mW each, beside
      the last backward's activation until e). So makespan
      >= work + idle + max(0, down(lo) - knap_W).
    """
    idle, _, idle_parts = _idle(problem, ch, k, objective)
    parts = [f"work {k.work:g}"] + idle_parts

    tail = 0.0
    if objective == "makespan":
        tail = max(0.0, ch.down[k.lo] - k.knap_w)
        if tail > 0:
            parts.append(
                f"tail {tail:g} (after its last B the chain to stage 0's W needs {ch.down[k.lo]:g};"
                f" memory defers W work {k.knap_w:g})"
            )
    # (with a tail the term bounds the makespan through stage 0's rank, not rank r's own end)
    return Bound(k.work + idle + tail, f"rank {r}: " + " + ".join(parts), r if tail == 0 else None)


def _pair_bounds(problem: Problem, ch: _Chains, ranks: list[_Rank]) -> list[Bound]:
    """``_pair_bound`` for every rank (span), each rank's idle worked out once."""
    idle = [_idle(problem, ch, k, "span") for k in ranks]
    return [b for r in range(problem.ranks) if (b := _pair_bound(problem, ch, ranks, idle, r)) is not None]


def _pair_bound(problem: Problem, ch: _Chains, ranks: list[_Rank], idle: list, r: int) -> Bound | None:
    """Span: rank r's own span holds most of another rank q's work (the best q and cut).

    Let S_r and E_r be rank r's first start and last end (T >= E_r - S_r), and sigma_q rank q's
    first start: by fact 1, the start of F(lo(q), i) for some i. If rank r holds a stage a <
    lo(q), F(a, i) is an op of rank r and the forward chain gives sigma_q >= S_r + ``lead =
    head(lo(q)) - head(lo(r))`` (a = lo(r) is the longest). Then rank q reaches a cut point c_q
    after working at least ``work_q - after`` beside the idle it cannot avoid, and from c_q one
    microbatch's chain reaches an op of rank r that ends ``chain`` later at least, so

        T >= E_r - S_r >= lead + (work_q - after + idle) + chain.

    Two cuts (both valid for any timing, ranks started late on purpose included):

    - c_q = the end of rank q's last backward, of stage lo(q) (fact 2; its B part if fused).
      Every F and every B of rank q ends by then (F(s, j) before B(s, j)), so what follows is W
      work only, pending at c_q and holding mW each: ``after = knap_W`` (``_deferred_w``; fused:
      the W part of that one BW). Idle: warm-up and cool-down of ``_rank_bound`` (both end before c_q). The
      same microbatch's input gradient goes down to stage t < lo(q) of rank r, then W(t):
      ``chain = max_t down(lo(q)) - down(t) + W(t)`` (a fused BW of t ends as late).
    - c_q = the end of rank q's last forward, of stage hi(q) (fact 2). What follows is backward
      work of pairs held in memory at c_q (before B: B + W for mF; after: W for mW; the level
      after that forward is within ``cap``): ``after = knap_back``. Idle: the warm-up, unless
      every forward fits in memory at once (else some forward starts after the first backward
      started, or all forwards would be held then, so the warm-up window ends before c_q).
      From the end of F(hi(q), j), the longest chain to the end of an op of rank r: for a stage
      t <= hi(q), ``rt(hi) + B(hi) + down(hi) - down(t) + W(t)`` (back through hi(q) to t); for t
      > hi(q), the forward chain to F(t, j), its round trip, B(t) and W(t).

    With r = q the same holds with lead 0 (the second cut then adds the path of one microbatch
    from its last forward back to stage lo on the rank itself). The rank q and cut that give
    the most are reported, one bound per rank r. Cost O(p * v) per r.
    """
    W = problem.cost[Kind.W]
    mine = problem.rank_stages[r]
    candidates = []
    for q, k in enumerate(ranks):
        lead = _lead(problem, ch, q, r)
        if lead is None:
            continue  # rank q may start before rank r: no lead
        idle_b, idle_f, _ = idle[q]
        # The last backward's chain down to a stage of r below lo(q).
        below = [ch.down[k.lo] - ch.down[t] + W[t] for t in mine if t < k.lo]
        if below:
            value = lead + k.work - k.knap_w + idle_b + max(below)
            candidates.append((value, q, "last backward", lead, idle_b, max(below), k.knap_w, k))
        # The last forward's chain to an op of r.
        chain = _from_last_forward(problem, ch, k.hi, mine)
        value = lead + k.work - k.knap_back + idle_f + chain
        candidates.append((value, q, "last forward", lead, idle_f, chain, k.knap_back, k))
    if not candidates:
        return None
    value, (_, q, cut, lead, idle, chain, after, k) = _largest(problem, candidates)
    held = (
        f"less the W work {after:g} memory lets it defer past its last backward"
        if cut == "last backward"
        else f"less the backward work {after:g} memory holds at its last forward"
    )
    idle_text = ""
    if idle > 0:
        idle_text = f" + {'warm-up and cool-down' if cut == 'last backward' else 'warm-up'} idle {idle:g}"
    onward = "the gradient down, then W" if cut == "last backward" else "that microbatch's round trip and W"
    if q == r:
        text = f"rank {r}: its {cut} ends >= work {k.work:g} {held}{idle_text} after its first op"
    else:
        text = (
            f"rank {r}: its span holds rank {q}'s first op to {cut}: rank {q} starts >= {lead:g} after rank {r}"
            f" (forward chain) + rank {q}'s work {k.work:g} {held}{idle_text}"
        )
    return Bound(value, f"{text} + {chain:g} from there to rank {r}'s last op ({onward})", r)


def _lead(problem: Problem, ch: _Chains, q: int, r: int) -> float | None:
    """How long after rank r's first start rank q's first op starts at the least (span): 0 for q =
    r; ``head(lo(q)) - head(lo(r))`` where r holds a stage below lo(q) (the forward chain from
    F(lo(r), i), fact 1); None where rank q may start first."""
    if q == r:
        return 0.0
    lo_q, lo_r = problem.rank_stages[q][0], problem.rank_stages[r][0]
    return ch.head[lo_q] - ch.head[lo_r] if lo_r < lo_q else None


def _from_last_forward(problem: Problem, ch: _Chains, hi: int, mine: tuple[int, ...]) -> float:
    """From the end of F(hi, j), the longest chain of microbatch j to the end of an op on the rank
    holding ``mine``: for a stage t <= hi, ``rt(hi) + B(hi) + down(hi) - down(t) + W(t)`` (back
    through hi to t); for t > hi, the forward chain to F(t, j), its round trip, B(t) and W(t)."""
    F, B, W = (problem.cost[k] for k in (Kind.F, Kind.B, Kind.W))
    head, rt, down = ch.head, ch.rt, ch.down
    return max(rt[hi] + B[hi] + down[hi] - down[t] + W[t] if t <= hi
               else head[t] - head[hi] - F[hi] + F[t] + rt[t] + B[t] + W[t] for t in mine)


def _held_at_last_forward(problem: Problem, ch: _Chains, q: int, objective: str) -> Bound | None:
    """Where the limit can be bought with time: what rank q must still hold at the end of its last
    forward, weighed against the recompute that holding it owes (``_pair_bound``'s last-forward cut
    with the recompute counted).

    Let t be the end of q's last forward, F(hi, i) (fact 2), S_q its first start, E its recompute
    work (R, S) and ``work`` its F, B and W. No compute op of q runs at t (one lane), so every op of
    q after t starts after t and belongs to a (stage, microbatch) open at t: forward ended, W not.
    Each open one is in one of these states, holding at least (weight) and leaving after t
    (value, for B and W; owed, a recompute; copy, a reload on the copy lane):

    - whole (kept, recomputed or reloaded already, or its copy out not yet ended): mF, B + W;
    - its recompute k still to run: k's keep, B + W, owed R_k;
    - offloaded, its reload not started: nothing, B + W, copy L;
    - its B ended, its W not: mW, W.

    Their weights fit within ``cap`` at t (fact 3). With V the sum of their values, O of what they
    owe and C of their reloads: the work before t is at least ``work + E - V - O``, and E >= O, so
    t - S_q >= work - V. Three terms follow: (P) the chain from the end of F(hi, i) to an op of a
    rank r (``_from_last_forward``) gives T >= lead(q, r) + work - V + chain, as in ``_pair_bound``;
    (Q) q's compute lane runs all its work: T >= work + E >= work + O; (C) the reloads run one at
    a time after t, then the last one's B and W: T >= work - V + C + min(B + W). For makespan,
    q's work starts at head(lo) or later (fact 1) and the chain may end on any rank: each term
    gains head(lo), and P's lead is 0 with the longest chain over every rank. For weights
    lam + mu + nu = 1, T >= work + lam (lead + chain) + mu min(B + W) - sum over the open ones of
    ((lam + mu) value - nu owed - mu copy), whose most is a multiple-choice knapsack over ``cap``
    (``_most``, an upper bound). mu is the least that makes an offloaded one worth nothing (else
    every microbatch could be open at no weight); lam on a grid, then searched beside its best.
    Where a recompute is cheap against the B and W it lets the rank hold (selective recompute on a
    long round trip, the V's middle rank), holding what the chain needs costs that recompute on q's
    own lane."""
    cap = _cap(problem, q)
    stages = problem.rank_stages[q]
    if not math.isfinite(cap) or not problem.recomputes:
        return None
    c, a, m = problem.cost, problem.mem[Kind.F], problem.microbatches
    B, W = c[Kind.B], c[Kind.W]
    makespan = objective == "makespan"
    opens = ch.head[stages[0]] if makespan else 0.0
    leads = [0.0 if makespan else _lead(problem, ch, q, r) for r in range(problem.ranks)]
    reach, r = max((lead + _from_last_forward(problem, ch, stages[-1], problem.rank_stages[r]), r)
                   for r, lead in enumerate(leads) if lead is not None)
    # (weight, value, owed, copy) of each state of an open (stage, microbatch), per stage
    states = {s: [(a[s], B[s] + W[s], 0.0, 0.0), (-problem.mem[Kind.W][s], W[s], 0.0, 0.0)]
                 + [(problem.delta(Kind.F, s, k), B[s] + W[s], c[k][s], 0.0) for k in problem.recomputes]
              for s in stages}
    share = 0.0  # mu per unit of lam that makes an offloaded one worth nothing
    if Kind.O in problem.policies:
        for s in stages:
            if c[Kind.L][s] <= B[s] + W[s]:
                return None  # a reload no dearer than what it brings back: nothing to weigh
            states[s].append((0.0, B[s] + W[s], 0.0, c[Kind.L][s]))
            share = max(share, (B[s] + W[s]) / (c[Kind.L][s] - B[s] - W[s]))
    work = opens + m * sum(c[Kind.F][s] + B[s] + W[s] for s in stages)  # (from time 0 for makespan)
    least = min(B[s] + W[s] for s in stages)

    def weighed(lam: float) -> tuple[float, float, float, float]:  # (the bound, lam, mu, nu)
        mu = lam * share
        nu = 1.0 - lam - mu
        items = [([(w, (lam + mu) * v - nu * o - mu * cp) for w, v, o, cp in states[s]], m) for s in stages]
        return work + lam * reach + mu * least - _most(items, cap), lam, mu, nu

    # The bound is concave in lam (linear, less a most over holdings of linear terms); nu >= 0 caps lam.
    value, lam, mu, nu = _concave_max(weighed, 0.0, 1.0 / (1.0 + share), LAST_FORWARD_GRID, LAST_FORWARD_REFINE)
    holds = f"rank {r}'s span holds it and the way back" if objective == "span" else f"the way back to rank {r}"
    return Bound(value, (
        f"rank {q}: at its last forward it holds what is left of its backward work ({holds}, {reach:g} at"
        f" least), within its room {cap - problem.memory_tol.eps:g}, and the recompute that holding it owes"
        f" runs on its own lane (weighed {lam:g} / {mu:g} / {nu:g})"), None)


def _concave_max(f, lo: float, hi: float, grid: int, refine: int) -> tuple:
    """The largest ``f(x)`` found for x in [lo, hi], where ``f`` returns ``(value, x, ...)`` and the
    value is concave in x: on a grid of ``grid`` steps, then ``refine`` steps of a ternary search
    beside the grid's best. Where every x gives a valid bound, the search only finds a larger one.
    Where f does not rise from lo on (by a millionth of the range), it never does: lo's is the best."""
    first, then = f(lo), f(lo + (hi - lo) * 1e-6)
    if then[0] <= first[0]:
        return first
    step = (hi - lo) / grid
    best = max((f(lo + k * step) for k in range(grid + 1)), key=lambda t: t[0])
    a, b = max(lo, best[1] - step), min(hi, best[1] + step)
    for _ in range(refine):
        left, right = f(a + (b - a) / 3), f(b - (b - a) / 3)
        best = max((best, left, right), key=lambda t: t[0])
        a, b = (a, right[1]) if left[0] >= right[0] else (left[1], b)
    return best


def _memory_time_bound(problem: Problem, ch: _Chains, r: int, objective: str) -> Bound | None:
    """Memory x time: pair (s, i) holds mF(s) from the start of F(s, i) to the end of B(s, i),
    at least F + rt + B later, and its mW part until W(s, i) ends, at least W more. The rank's
    level stays <= cap from its first start to its last end, so that window is >= the total
    area over cap (and starts >= head(lo) for makespan)."""
    cap = _cap(problem, r)
    if cap == math.inf or cap <= 0:  # (no room at all: only activations of zero size fit; no term)
        return None
    F, B, W = (problem.cost[k] for k in (Kind.F, Kind.B, Kind.W))
    mF = problem.mem[Kind.F]
    mW = [-x for x in problem.mem[Kind.W]]
    m = problem.microbatches
    stages = problem.rank_stages[r]
    area = m * sum(mF[s] * (F[s] + ch.rt[s] + B[s]) + mW[s] * W[s] for s in stages)
    if area <= 0:
        return None
    start = min(ch.head[s] for s in stages) if objective == "makespan" else 0.0
    held = area / cap
    lead = f"start no earlier than {start:g} + " if start > 0 else ""
    return Bound(
        start + held,
        f"rank {r}: {lead}memory-time {held:g} (activation held x time {area:g}"
        f" over room {cap - problem.memory_tol.eps:g})",
        r,
    )


def _critical_path(problem: Problem, ch: _Chains, objective: str) -> Bound:
    """One microbatch on stage s: F(s, i) starts (>= head(s)), its round trip rt(s), then B(s, i)
    and W(s, i) on the same rank. For s = 0 this is the whole forward-backward path; a stage
    with a large W can bind instead. Span: the rank of s runs from F(s, i)'s start to W(s, i)'s
    end, so the same length without head(s)."""
    F, B, W = (problem.cost[k] for k in (Kind.F, Kind.B, Kind.W))
    best, (_, arg) = _largest(problem, [
        (F[s] + ch.rt[s] + B[s] + W[s] + (ch.head[s] if objective == "makespan" else 0.0), s)
        for s in range(problem.n_stages)
    ])
    where = "all forwards up, all input gradients back" if arg == 0 else f"through stage {arg} and back"
    return Bound(best, f"critical path of one microbatch ({where}, then W of stage {arg}): {best:g}")


# ---- memory for time: problems that allow recompute or offload ----


def _policy_bounds(problem: Problem, objective: str) -> list[Bound]:
    """The terms for a problem that allows recompute or offload (``Problem.policies``), where a
    memory limit can be bought with time, so no term may assume what a microbatch holds.

    - Every term above that memory does not enter, from the same problem without its limit and
      without the policies: an extra R, S, O or L op only adds work on a lane and lengthens the
      chains (B waits for what brings its activation back, which waits for F), so every schedule
      of this problem, whatever its policies, is a schedule of that relaxation or slower; its
      memory terms are dropped.
    - Per rank, what the limit forces (``_forced``): memory-time (the activation held over time
      fits under the room) against recompute work on the compute lane and copy work on the copy
      lane, weighed together; each microbatch's policies must also let that microbatch alone fit
      through the rank's stages.
    - Per stage, how many microbatches may be in flight: with one keep (``_in_flight``) and with
      the policies' keeps priced against their recompute (``_windows``); per pair of a rank's
      stages, how many may be between the higher one's backward and the lower one's
      (``_round_trips``).
    - Per rank: the last-forward cut of ``_pair_bound`` with the recompute that holding the work
      after it owes charged to the rank's own lane (``_held_at_last_forward``; for makespan from
      time 0, the chain to any rank)."""
    data = problem.model_dump(exclude_none=True)
    data.pop("recompute", None)
    data.pop("offload", None)
    data["memory"].pop("limit", None)
    plain = Problem.parse(data)
    out = all_bounds(plain, objective)
    if problem.activation_room is not None:
        ch = _Chains(plain)
        out += [b for r in range(problem.ranks) if (b := _forced(problem, ch, r, objective)) is not None]
        out += [b for r in range(problem.ranks) if (b := _in_flight(problem, ch, r, objective)) is not None]
        out += [b for r in range(problem.ranks) if (b := _windows(problem, ch, r, objective)) is not None]
        out += [b for r in range(problem.ranks) if (b := _round_trips(problem, ch, r, objective)) is not None]
        ranks = [_policy_rank(problem, ch, r, objective) for r in range(problem.ranks)]
        out += [_rank_bound(problem, ch, k, r, objective) for r, k in enumerate(ranks)]
        out += [b for q in range(problem.ranks)
                if (b := _held_at_last_forward(problem, ch, q, objective)) is not None]
        if objective == "span":
            out += _pair_bounds(problem, ch, ranks)
    return out


def _in_flight(problem: Problem, ch: _Chains, r: int, objective: str) -> Bound | None:
    """How many microbatches of a stage may be in flight at once, when a limit allows few.

    For stage s of rank r, let N be the microbatches not offloaded at s (kept or recomputed) and X
    the offloaded ones. For i in N let I_i run from the start of F(s, i) to the end of B(s, i)
    (>= L = F + rt + B long), and J_i from the start of what brings the activation back (R, S, or
    F when kept) to that end. During J_i the rank holds all of s's activation for i, at least
    ``least_kept`` for each stage t < s of the rank (microbatch i's, fact 2) and at least the least
    a kept or recomputed microbatch keeps, k(s), for every other microbatch of N inside its own I
    (an offloaded one may hold nothing), so at most K = floor((cap - mF(s) - sum_{t<s}
    least_kept(t)) / k(s)) others of N are. Order N by the end of J (their B's, distinct on one
    lane): of the K + 1 after i, one must start its I after J_i ends (else all K + 1 are inside
    theirs when J_i ends), so its J, and every later one, ends >= L after J_i's end. Hence the last
    B of N ends >= (window start) + ceil(|N| / (K + 1)) * L, and its W follows on the rank:
    T >= head(s) (makespan; 0 for span, from the rank's first start) + ceil(|N| / (K + 1)) * L + W(s).
    Each of X copies its activation out and back on the rank's copy lane (O + L), after some F of
    s ended and before the B and W of its own: T >= start + F(s) + |X| (O + L) + B(s) + W(s). A
    schedule picks |X|, so T >= the least over |X| = 0..m of the larger of the two (|X| = 0 where
    the problem does not offload). No term where kept and recomputed microbatches may keep nothing
    (k(s) = 0) or K >= m - 1.

    Where K = 0, the intervals I of N are pairwise disjoint (for i, j in N with F(s, i) first, J_j
    lies outside I_i, so after it, and J_i outside I_j, so before it: I_i ends before I_j starts),
    and each of X holds the whole activation from the start of its F to the end of its copy out
    (>= F + O) and from the start of its copy back to the end of its B (>= L + B): inside those,
    no member of N is inside its I (it would hold k(s) more) nor another of X in its own (2 mF(s)
    > cap too). So all of them lie apart in the window: T >= start + |N| L + |X| (F + O + L + B) + W(s)."""
    c, a = problem.cost, problem.mem[Kind.F]
    cap, m = _cap(problem, r), problem.microbatches
    offload = Kind.O in problem.policies
    best = None
    below = 0.0  # least_kept of the rank's stages under s
    for s in problem.rank_stages[r]:
        least = min([problem.delta(Kind.F, s, k) for k in problem.recomputes] + [a[s]])  # kept or recomputed
        if least > 0:
            k = math.floor(max(0.0, cap - a[s] - below) / least)
            if k < m - 1:
                length = c[Kind.F][s] + ch.rt[s] + c[Kind.B][s]
                start = ch.head[s] if objective == "makespan" else 0.0

                def offloading(x: int) -> float:  # the larger of the rest's rounds and x's copies
                    copies = x * (c[Kind.O][s] + c[Kind.L][s]) if x else 0.0
                    if k == 0:  # (each offloaded one apart from the rest too)
                        whole = x * (c[Kind.F][s] + c[Kind.B][s]) + copies
                        rest = start + (m - x) * length + whole + c[Kind.W][s]
                    else:
                        rest = start + math.ceil((m - x) / (k + 1)) * length + c[Kind.W][s] if x < m else -math.inf
                    if not x:
                        return rest
                    return max(rest, start + c[Kind.F][s] + copies + c[Kind.B][s] + c[Kind.W][s])

                x = min(range(m + 1 if offload else 1), key=offloading)
                value = offloading(x)
                if best is None or value > best[0]:
                    best = (value, s, k, math.ceil((m - x) / (k + 1)), length, start, x)
        below += problem.least_kept(s)
    if best is None:
        return None
    value, s, k, rounds, length, start, x = best
    lead = f"start no earlier than {start:g} + " if start > 0 else ""
    text = (f"rank {r}: {lead}at most {k + 1} microbatches of stage {s} in flight (the room holds one whole and"
            f" {k} kept), so {rounds} rounds of forward, round trip and B ({length:g} each), then W")
    if offload and k == 0:
        text += (f"; each of the {x} offloaded (the best split) holds the whole room from its F to its copy out and"
                 " from its copy back to its B, apart from the rest" if x
                 else "; offloading some costs more than it saves (each holds the whole room from its F to its copy"
                 " out and from its copy back to its B)")
    elif offload:
        text += (f"; offloading more of them costs each its copies on the copy lane (the best split offloads {x})"
                 if x else "; offloading some costs more on the copy lane than it saves")
    return Bound(value, text, r)


def _round_trips(problem: Problem, ch: _Chains, r: int, objective: str) -> Bound | None:
    """How many microbatches may be between a higher stage's backward and a lower stage's, on one
    rank (the V placement's first and last stage, or a loop's chunks): the round trips in groups.

    For stages t < s of rank r, microbatch j's activation at t is held (at least ``least_kept(t)``)
    from the start of F(t, j) to the end of B(t, j), and B(s, j) lies inside, since F(t, j) leads to
    F(s, j) and B(s, j) to B(t, j). From the last allocation that brings s's activation of j whole
    (F, R, S or a reload) to the end of B(s, j), the rank holds it whole; at the latest of that
    allocation and the forwards at t of the microbatches whose activation at t is held when B(s, j)
    starts, all of these are held at once and fit within the room. Besides j's own at every stage
    below s (``least_kept`` each), at most K = floor((cap - mF(s) - sum_{u < s} least_kept(u)) /
    least_kept(t)) others at t are held then. Order the backwards at s by start, j_1, j_2, ...: when
    B(s, j_k) starts, of the K + 1 before it (their F at t started earlier) one has ended its B(t),
    which starts >= ``back`` (B(s) down to B(t) with comm) after its B(s) started, so after B(s,
    j_{k-K-1}) started. Hence B(s, j_m) starts >= B(s, j_1) + floor((m - 1) / (K + 1)) * back, B(s,
    j_1) >= fwd (F(t) up to F(s) with comm) after the start of F(t, j_1) (>= head(t) for makespan;
    for span, >= head(t) - head(t0) after the rank's first start, t0 its lowest stage), and after
    B(s, j_m) come its way back to B(t) and W(t) on the rank: T >= lead + fwd + (floor((m - 1) / (K
    + 1)) + 1) * back + W(t). No term where some policy keeps nothing at t (offload) or K >= m - 1."""
    c, a = problem.cost, problem.mem[Kind.F]
    cap, m = _cap(problem, r), problem.microbatches
    stages = problem.rank_stages[r]
    depth = problem.pipeline_stages
    best = None
    for s in stages:
        below = sum(problem.least_kept(u) for u in stages if u < s and u // depth == s // depth)
        for t in stages:
            least = problem.least_kept(t)
            if t >= s or t // depth != s // depth or least <= 0:
                continue
            k = math.floor(max(0.0, cap - a[s] - below) / least)
            if k >= m - 1:
                continue
            fwd = ch.head[s] - ch.head[t] + c[Kind.F][s]  # F(t) .. F(s), with comm (one pipeline)
            back = ch.down[s] - ch.down[t] + c[Kind.B][s]  # B(s) .. B(t)
            lead = ch.head[t] if objective == "makespan" else ch.head[t] - ch.head[stages[0]]
            rounds = (m - 1) // (k + 1) + 1
            value = lead + fwd + rounds * back + c[Kind.W][t]
            if best is None or value > best[0]:
                best = (value, t, s, k, rounds, fwd, back, lead)
    if best is None:
        return None
    value, t, s, k, rounds, fwd, back, lead = best
    start = f"start no earlier than {lead:g} + " if lead > 0 else ""
    several = f"{k + 1} microbatch{'es' if k else ''}"
    return Bound(value, f"rank {r}: {start}forward from stage {t} to {s} ({fwd:g}), then at most {several} between a"
                        f" backward at {s} and theirs at {t} (the room holds {s}'s whole and {k} kept at {t}), so"
                        f" {rounds} round trips down ({back:g} each), then W", r)


def _windows(problem: Problem, ch: _Chains, r: int, objective: str) -> Bound | None:
    """How many microbatches of a stage fit in flight when each may keep a different amount: the
    backwards of stage s in windows of one round trip, few of the keeps that cost nothing per window.

    For stage s of rank r let ``L = F + rt + B`` (the start of F(s, j) to the end of B(s, j), at
    least) and ``e_1 < e_2 < ...`` the ends of s's backwards (one lane). Just before B(s, i) ends,
    the rank holds all of s's activation for i, at least ``below = sum_{t<s} least_kept(t)`` for
    i's lower stages on the rank (fact 2), and for every j whose backward ends in ``(e_i, e_i +
    L)``: F(s, j) started by ``e_j - L < e_i`` and B(s, j) has not ended, so j holds at least what
    its policy keeps, ``keep(j)``, plus ``below`` (F(t, j) started before, B(t, j) ends after);
    an offloaded j may hold nothing. So ``sum keep(j) + below <= H = cap - mF(s) - below`` over
    the kept or recomputed j of that window. Cut the ends into windows greedily: the first from
    ``e_1``, each next from the first end ``L`` or more after the last window's first. q windows
    end ``>= e_1 + (q - 1) L >= start + q L``, then the W of that last one: ``T >= start + q L + W``.

    A window of n (not offloaded) costs the compute lane at least ``g(n)``: its first free (kept:
    nothing), the other ``n - 1`` the least recompute time whose keeps fit H (exact over the
    policies that keep more than ``H / WINDOW_EXACT``, a fractional knapsack over the rest). With
    ``G`` the convex minorant of g (``G(0) = 0``), the windows cost ``>= q G((m - x) / q)``
    (Jensen) where x are offloaded, so ``T >= head(lo) (makespan) + work + q G((m - x) / q)``; the
    x copy out and back on the copy lane, ``T >= start + F + x (O + L) + B + W``. A schedule has some q and
    x: the bound is the least over them of the largest of the three (the lane terms fall with q and
    x, the others rise, so each least lies where they cross). ``_in_flight`` is the case of one keep."""
    c = problem.cost
    cap, m = _cap(problem, r), problem.microbatches
    stages = problem.rank_stages[r]
    work = m * sum(c[Kind.F][s] + c[Kind.B][s] + c[Kind.W][s] for s in stages)
    copies = Kind.O in problem.policies
    opens = ch.head[stages[0]] if objective == "makespan" else 0.0  # the rank's work starts no sooner
    best, below = None, 0.0
    for s in stages:
        room = cap - problem.mem[Kind.F][s] - below
        if room >= 0:
            options = [(held + below, rc) for _, held, _, rc, cp in _policy_options(problem, ch, s) if not cp]
            minorant = _window_costs(options, room, m)
            start = ch.head[s] if objective == "makespan" else 0.0
            length, tail = c[Kind.F][s] + ch.rt[s] + c[Kind.B][s], c[Kind.W][s]
            copy = c[Kind.O][s] + c[Kind.L][s] if copies else math.inf

            def rounds(x: int) -> tuple[float, int]:  # the least over q of chain and lane, x offloaded
                def lane(q: int) -> float:
                    return opens + work + q * _on_hull(minorant, (m - x) / q)
                q = _first(1, m, lambda q: start + q * length + tail >= lane(q))
                return min((max(start + k * length + tail, lane(k)), k) for k in (q - 1, q) if 1 <= k <= m)

            def copied(x: int) -> float:
                return start + c[Kind.F][s] + x * copy + c[Kind.B][s] + tail if x else -math.inf

            most = m if copies else 0
            x = _first(0, most, lambda x: copied(x) >= rounds(x)[0])
            value, x, q = min((max(least, copied(k)), k, q) for k in (x - 1, x) if 0 <= k <= most
                              for least, q in (rounds(k),))
            if best is None or value > best[0]:
                best = (value, s, q, x, length, room)
        below += problem.least_kept(s)
    if best is None:
        return None
    value, s, q, x, length, room = best
    text = (f"rank {r}: stage {s}'s backwards in windows of one round trip ({length:g}), the microbatches after"
            f" each window's first keeping at most {room:g} together: {q} windows against the recompute the"
            f" keeps cost")
    if x:
        text += f", {x} offloaded (copies on the copy lane)"
    return Bound(value, text, r)


def _window_costs(options: list[tuple[float, float]], room: float, m: int) -> list[tuple[float, float]]:
    """``_windows``' G: the lower convex hull of ``(n, g(n))``, n = 0..m, where g(n) is the least
    cost of n microbatches, the first free, the others each taking an option ``(keep, cost)`` with
    their keeps summing to ``room`` or less (inf where none fit). Options keeping more than ``room /
    WINDOW_EXACT`` are enumerated; the rest are relaxed to their hull (a lower bound on g)."""
    big = sorted((o for o in options if o[0] * WINDOW_EXACT > room), reverse=True)
    while math.prod(int(room / keep) + 1 for keep, _ in big) > WINDOW_COMBOS:
        big.pop()  # the least keep among them goes to the relaxed ones
    small = sorted(o for o in options if o not in big)
    small = _lower_hull([o for i, o in enumerate(small) if all(o[1] < p[1] for p in small[:i])])  # more keep, cheaper
    combos = [(0, 0.0, 0.0)]  # (count, keep, cost) over the big options
    for keep, cost in big:
        combos = [(k + t, held + t * keep, spent + t * cost) for k, held, spent in combos
                  for t in range(int((room - held) / keep) + 1) if held + t * keep <= room]
    free = min(cost for _, cost in options)
    points = [(0.0, 0.0)]
    for n in range(1, m + 1):
        best = math.inf
        for k, held, spent in combos:
            if k == n - 1:
                best = min(best, spent)
            elif k < n - 1 and small:
                each = (room - held) / (n - 1 - k)
                if each >= small[0][0]:
                    best = min(best, spent + (n - 1 - k) * _on_hull(small, each, flat=True))
        if best < math.inf:
            points.append((float(n), free + best))
    return _lower_hull(points)


def _lower_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lower convex hull of ``points`` sorted by x (the convex minorant through them)."""
    hull: list[tuple[float, float]] = []
    for x, y in points:
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (y1 - y0) * (x - x0) < (y - y0) * (x1 - x0):  # (x1, y1) lies below the chord: keep it
                break
            hull.pop()
        if hull and hull[-1][0] == x:
            if y >= hull[-1][1]:
                continue
            hull.pop()
        hull.append((x, y))
    return hull


def _on_hull(hull: list[tuple[float, float]], x: float, flat: bool = False) -> float:
    """The hull's value at x (linear between its points); past its last point inf, or with
    ``flat`` its least value (an average keep above the largest needs no more than that)."""
    xs = [p[0] for p in hull]
    if x > xs[-1]:
        return min(p[1] for p in hull) if flat else math.inf
    i = bisect.bisect_left(xs, x)
    if xs[i] == x or i == 0:
        return hull[i][1]
    (x0, y0), (x1, y1) = hull[i - 1], hull[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _first(lo: int, hi: int, reached) -> int:
    """The least k in lo..hi with ``reached(k)`` (false then true as k rises), else hi + 1."""
    while lo <= hi:
        mid = (lo + hi) // 2
        if reached(mid):
            hi = mid - 1
        else:
            lo = mid + 1
    return lo


def _hull(items: list[tuple[list[tuple[float, float]], int]], forced: bool = False) -> tuple[float, float, list]:
    """The linear relaxation of a multiple-choice knapsack: ``count`` microbatches of each item,
    each holding one of the item's options ``(weight, value)``. Each item starts at its lightest
    option (the best of them) and climbs its upper hull (``_item_hull``); returns ``(value,
    weight)`` of all the starts and the climbs ``(value, weight, count)`` in falling value per
    weight, for ``_climb``. ``forced``: every microbatch must be held; else leaving one out, (0,
    0), is an option too."""
    total, base, steps = 0.0, 0.0, []
    for options, count in items:
        (w0, v0), climbs = _item_hull(options, forced)
        total += count * v0
        base += count * w0
        steps += [(slope, v, w, count) for slope, v, w in climbs]
    return total, base, [(v, w, c) for _, v, w, c in sorted(steps, reverse=True)]


def _item_hull(options: list[tuple[float, float]], forced: bool = False) -> tuple[tuple[float, float], list]:
    """One item of ``_hull``, one microbatch: its start ``(weight, value)`` and its climbs
    ``(value per weight, value, weight)``, steepest first."""
    # Weights too small for their value per weight to be a float count as none: lighter only
    # raises the knapsack's most, which stays an upper bound.
    options = [(0.0 if w < TINY_WEIGHT else w, v) for w, v in options]
    if not forced:
        options = options + [(0.0, 0.0)]
    at = start = min(options, key=lambda o: (o[0], -o[1]))
    climbs = []
    rest = [(w, v) for w, v in options if w > at[0] and v > at[1]]
    while rest:
        slope, nxt = max(((v - at[1]) / (w - at[0]), (w, v)) for w, v in rest)
        climbs.append((slope, nxt[1] - at[1], nxt[0] - at[0]))
        at = nxt
        rest = [(w, v) for w, v in rest if w > at[0] and v > at[1]]
    return start, climbs


def _climb(hull: tuple[float, float, list], room: float, forced: bool = False) -> float:
    """The most value ``room`` admits on ``hull`` (``_hull``); where even the starts overflow, -inf
    when ``forced`` (no such holding), else the starts' value (nothing more fits)."""
    total, base, steps = hull
    if room < base:
        return -math.inf if forced else total
    return total + _fill(steps, room - base)


def _most(items: list[tuple[list[tuple[float, float]], int]], room: float, exact: int = KNAP_EXACT,
          combos: int = KNAP_COMBOS) -> float:
    """An upper bound on the most value of ``_hull``'s multiple-choice knapsack (each microbatch
    may be left out) in ``room``, at most its linear relaxation's: the options that fit no more
    than ``exact`` times are counted in whole microbatches (every mix of them that fits, at
    most ``combos`` mixes: past that the lightest of them join the rest), the rest relaxed as
    ``_climb`` does (options heavier than the room left out). A holding takes some whole number of
    each counted option, one of the mixes, and the rest of it is a holding of the other options in
    what room that mix leaves."""
    big = sorted(((w, v, i) for i, (options, count) in enumerate(items) if count > 0
                  for w, v in options if v > 0 and room / exact < w <= room), reverse=True)
    while math.prod(int(room / w) + 1 for w, _, _ in big) > combos:
        big.pop()
    mixes = [(0.0, 0.0, (0,) * len(items))]  # (weight, value, microbatches of each item taken)
    for w, v, i in big:
        grown = []
        for held, got, used in mixes:
            for t in range(min(int((room - held) / w * (1 + 1e-12)), items[i][1] - used[i]) + 1):
                grown.append((held + t * w, got + t * v, used[:i] + (used[i] + t,) + used[i + 1:]))
        mixes = grown
    counted = set(big)
    slack = 1e-9 * max(1.0, abs(room))  # (weights that float sums lose beside the mix's)
    rest = [_item_hull([o for o in options if (*o, i) not in counted and o[0] <= room + slack])
            for i, (options, _) in enumerate(items)]
    climbs = sorted(((slope, v, w, i) for i, (_, steps) in enumerate(rest) for slope, v, w in steps), reverse=True)
    best = -math.inf
    for held, got, used in mixes:  # the rest of each mix: ``_climb`` over what it leaves of each item
        left = [count - u for (_, count), u in zip(items, used)]
        value = got + sum(n * start[1] for n, (start, _) in zip(left, rest))
        room_left = max(0.0, room - held) + slack - sum(n * start[0] for n, (start, _) in zip(left, rest))
        best = max(best, value + _fill([(v, w, left[i]) for _, v, w, i in climbs], room_left))
    return best


def _least_idle(length: float, held: float, copies: list[tuple[float, float, int]], opens: float) -> float:
    """Idle in a window of ``length`` or more, whose work is ``held`` (what memory admits) plus
    microbatches that hold nothing once their copy ran in it: ``count`` of each ``(value, copy
    time)``, their copies serial on the copy lane after ``opens`` into the window. A longer window
    lets more copies run, so the least of ``window - held - copied(window - opens)`` over every
    window from ``length`` (convex: its minimum lies at ``length`` or where a kind runs out)."""
    pieces = [(v, w, n) for _, v, w, n in sorted(((v / w, v, w, n) for v, w, n in copies if w > 0 and n > 0),
                                                 reverse=True)]
    free = sum(v * n for v, w, n in copies if w <= 0 and n > 0)

    def idle(window: float) -> float:
        return window - held - free - _fill(pieces, window - opens)

    ends, at = [length], opens
    for _, w, n in pieces:
        at += n * w
        if at > length:
            ends.append(at)
    return max(0.0, min(idle(x) for x in ends))


def _policy_rank(problem: Problem, ch: _Chains, r: int, objective: str) -> _Rank:
    """``_rank`` re-derived for a problem that allows recompute or offload, so that ``_idle``,
    ``_rank_bound`` and ``_pair_bound`` hold for it as they stand. What a (stage, microbatch) holds
    depends on its policy: the whole activation ``mF`` when kept (or once its recompute or load
    ran), its policy's keep while a recompute is owed, nothing once offloaded (its copy out ran),
    ``mW`` between its B and W whatever the policy. The rank's work is its F, B and W; a recompute
    adds to it (``E``, all of it before the rank's last backward).

    - knap_f (warm-up, window from the rank's first start to its first backward): the forwards there
      and the recomputes run there are its only work, so idle >= first_b - (their F) - (those
      recomputes); each of those recomputes is also in E, and each recompute still owed is in E
      too, later. So the rank's time >= work + first_b - V where V sums, per forward in the window,
      F less the recompute it still owes: kept (F for mF), recompute owed (F - R for keep),
      offloaded (F for nothing, once its copy out ran: those copies are serial on the copy lane,
      after the rank's first forward ended and before the window closes, ``_least_idle``). When the
      first backward, B(hi, i), starts, microbatch i holds all of stage hi's activation, so its
      forward counts F for mF and the others share ``cap - mF(hi)``.
    - knap_pend (cool-down, from the end of the last forward F(hi, i) to the start of B(hi, i)):
      B, W and recompute work of pairs held at its start, next to the least F(hi, i) holds: kept
      (B + W for mF), recompute owed (B + W + R for keep: a recompute run in the window fills it
      and is in E, so it counts once), W pending (W for mW), offloaded (B + W for nothing, each
      after its copy back, serial in the window). With the warm-up window the two never count
      the same recompute twice: one owed in the warm-up and run in the cool-down counts there only.
    - knap_back (after the last forward ends): the same pairs and recomputes over the whole room,
      offloaded ones without a copy limit; knap_w as without policies (``_deferred_w``: a recomputed
      or offloaded activation is whole again during its B).
    - the three knapsacks count in whole microbatches the options few of which fit the room, the
      rest in fractions (``_most``): a forward that does not fit at all is worth nothing there.
    - every forward held at once (the windows may overlap): possible when the least keeps fit, less
      what copies can take out; then the rank owes the least recompute over its microbatches that
      makes them fit (``owed_all``), or waits for copies out: with n offloaded the first backward
      starts >= its first forward + n copies, and every B and W follows it.
    """
    c, a = problem.cost, problem.mem[Kind.F]
    F, B, W, R = c[Kind.F], c[Kind.B], c[Kind.W], {k: c[k] for k in problem.recomputes}
    mW = [-x for x in problem.mem[Kind.W]]
    m = problem.microbatches
    stages = problem.rank_stages[r]
    lo, hi = stages[0], stages[-1]
    cap = _cap(problem, r)
    offload = Kind.O in problem.policies
    keep = {(s, k): problem.delta(Kind.F, s, k) for s in stages for k in R}
    opens = (ch.head[lo] if objective == "makespan" else 0.0) + min(F[s] for s in stages)

    first_b = _first_backward_wait(ch, F, lo, hi, objective)
    # The first backward's own microbatch holds its whole activation of stage hi when that B starts
    # (recomputed or loaded back before it, in the window), worth its F; the other forwards share
    # the rest of the room.
    warm = [([(a[s], F[s])] + [(keep[s, k], F[s] - R[k][s]) for k in R], m - (s == hi)) for s in stages]
    outs = [(F[s], c[Kind.O][s], m - (s == hi)) for s in stages] if offload else []
    first = F[hi] + _most(warm, cap - a[hi])
    knap_f = first_b - max(_least_idle(first_b, first, outs, opens),
                           _covered(problem, warm, stages, hi, cap - a[hi], first_b, opens))

    def backward(s: int) -> list[tuple[float, float]]:  # a pair held after its forward, and its work
        return [(a[s], B[s] + W[s]), (mW[s], W[s])] + [(keep[s, k], B[s] + W[s] + R[k][s]) for k in R]

    cool = [(backward(s), m - (s == hi)) for s in stages]
    ins = [(B[s] + W[s], c[Kind.L][s], m - (s == hi)) for s in stages] if offload else []
    held = _most(cool, cap - problem.least_kept(hi))
    knap_pend = ch.rt[hi] - _least_idle(ch.rt[hi], held, ins, 0.0)
    knap_back = _most([(backward(s), m) for s in stages], cap)
    if offload:
        knap_back += m * sum(B[s] + W[s] for s in stages)

    # Every forward held at once: the least recompute owed (value -R), n of them offloaded.
    whole = [([(a[s], 0.0)] + [(keep[s, k], -R[k][s]) for k in R], m) for s in stages]
    largest, shortest = max(a[s] for s in stages), min(c[Kind.O][s] for s in stages) if offload else 0.0
    forwards = m * sum(F[s] for s in stages)
    owed_all, hull = math.inf, _hull(whole, forced=True)
    for n in range(m * len(stages) + 1 if offload else 1):
        owed = -_climb(hull, cap + n * largest, forced=True)
        owed_all = min(owed_all, max(owed, opens + n * shortest - forwards))
    return _Rank(
        stages=stages, lo=lo, hi=hi, cap=cap,
        work=m * sum(F[s] + B[s] + W[s] for s in stages),
        knap_f=knap_f, knap_pend=knap_pend,
        knap_w=_deferred_w(problem, stages, cap),
        knap_back=knap_back,
        all_forwards_fit=owed_all < math.inf, owed_all=owed_all,
    )


COVER_GRID = 20  # _covered: the weight of the warm-up's idle against what its forwards owe steps by 1 / this


def _covered(problem: Problem, warm: list, stages: tuple[int, ...], hi: int, room: float, first_b: float,
             opens: float) -> float:
    """The warm-up's idle plus the recompute its forwards still owe, at least, for ``_policy_rank``
    (whose knap_f counts the same forwards' work less what they owe, which is all it can say where
    more forwards fit than the wait needs: here each owes its recompute even then).

    Let t0 be the start of the rank's first backward (>= ``first_b``), W0 the forwards run before
    it, U the recomputes run there, and owed(W0) the recompute W0's forwards still owe at t0. The
    rank's time is >= its work + every recompute + its idle, and idle >= t0 - F(W0) - R(U), so
    what W0 adds to the work is >= owed(W0) + max(0, t0 - F(W0)) (R(U) fills the idle at most one
    for one) >= owed(W0) + lam (t0 - F(W0)) for any lam in [0, 1]. The forwards of W0 not
    offloaded hold their keep at t0 beside the first backward's whole activation, within ``room``:
    ``_most`` over ``warm``'s options valued lam F - owed bounds what they take off. The n
    offloaded hold nothing once their copy out ran, serially on the copy lane after ``opens``, so
    t0 >= opens + n O and they take off at most n lam F. The least over n, the largest over lam
    on a grid and where a recompute starts to pay for its forward (lam = R / F), where the term
    (concave in lam) turns (lam = 1 is knap_f's own term)."""
    c, F = problem.cost, problem.cost[Kind.F]
    most_n = problem.microbatches * len(stages) if Kind.O in problem.policies else 0
    copy, longest = (min(c[Kind.O][s] for s in stages), max(F[s] for s in stages)) if most_n else (math.inf, 0.0)
    tries = {0, most_n}
    if most_n and copy > 0:
        kink = (first_b - opens) / copy
        tries |= {n for n in (math.floor(kink), math.ceil(kink)) if 0 <= n <= most_n}
    wait = min(max(first_b, opens + n * copy if n else first_b) - n * longest for n in tries)
    # lam where a recompute starts to pay for its forward (its term's slope turns there), and a grid
    kinks = {c[k][s] / F[s] for s in stages for k in problem.recomputes if 0 < c[k][s] < F[s]}
    best = 0.0
    for lam in sorted(kinks | {step / COVER_GRID for step in range(COVER_GRID + 1)}):
        valued = [([(w, v - (1 - lam) * F[s]) for w, v in options], count) for (options, count), s in zip(warm, stages)]
        best = max(best, lam * (wait - F[hi]) - _most(valued, room))
    # The same minimum in whole forwards, where few cover the wait: the n offloaded taken off the
    # wait as above (the least over n), the rest searched with their keeps and what they owe.
    return max(best, _covered_exactly(warm, stages, F, room, wait - F[hi]))


WARM_EXACT = 12  # _covered_exactly: at most this many forwards cover the warm-up's wait, else not tried
WARM_NODES = 200_000  # _covered_exactly: a search that would visit more multisets claims nothing (0)


def _covered_exactly(warm: list, stages: tuple[int, ...], F: list[float], room: float, need: float) -> float:
    """``_covered``'s minimum over the forwards W0 not offloaded that run before the first backward,
    in whole forwards (0 where more than ``WARM_EXACT`` may be needed): the least owed(W0) + max(0,
    need - F(W0)) over the W0 whose keeps fit ``room``, ``need`` being the wait less the first
    backward's own forward and what offloaded forwards may fill. ``_covered`` bounds the same
    minimum from below by weighing the two; counted in whole forwards, the last that covers the
    wait costs its keep or its recompute, or the wait stays idle. W0 is searched as a multiset of
    (stage, policy) options, each forward added while F(W0) < need (one more only adds a keep and
    what it owes, never less). A search cut short at ``WARM_NODES`` claims nothing."""
    if need <= 0 or need > WARM_EXACT * min(F[s] for s in stages):
        return 0.0
    tol = 1e-9 * max(1.0, room, need)
    types = [(w, F[s], F[s] - v, j) for j, ((options, _), s) in enumerate(zip(warm, stages)) for w, v in options]
    left = [count for _, count in warm]
    best, nodes = need, 0  # W0 empty: the whole wait idle

    def grow(first: int, held: float, done: float, owed: float) -> bool:
        nonlocal best, nodes
        for t in range(first, len(types)):
            w, f, r, j = types[t]
            if left[j] == 0 or held + w > room + tol or owed + r >= best:
                continue  # (more forwards only add keeps and what they owe)
            nodes += 1
            if nodes > WARM_NODES:
                return False
            best = min(best, owed + r + max(0.0, need - done - f))
            if done + f < need:
                left[j] -= 1
                whole = grow(t, held + w, done + f, owed + r)
                left[j] += 1
                if not whole:
                    return False
        return True

    return best if grow(0, 0.0, 0.0, 0.0) else 0.0


def _policy_options(problem: Problem, ch: _Chains, s: int) -> list[tuple[str, float, float, float, float]]:
    """Per policy of stage s (kept first): ``(name, held, area, recompute, copy)``: what one
    microbatch holds from its forward to what brings its activation back (at the least), the
    least activation x time it holds (``_forced``), its work on the compute lane beyond F, B and W,
    and its work on the copy lane."""
    c, a = problem.cost, problem.mem[Kind.F][s]
    F, B, W = c[Kind.F][s], c[Kind.B][s], c[Kind.W][s]
    mW = -problem.mem[Kind.W][s]
    to_b = F + ch.rt[s] + B  # the start of F(s, i) to the end of B(s, i), at least
    out = [("kept", a, a * to_b + mW * W, 0.0, 0.0)]
    for k in problem.policies:
        row = ROWS[k]
        if row.lightens:  # F keeps ``keep`` to the end of B; the rest from the recompute's start
            keep = problem.delta(Kind.F, s, k)
            out.append((row.policy, keep, keep * to_b + (a - keep) * (c[k][s] + B) + mW * W, c[k][s], 0.0))
        else:  # offload: all of it from F's start to O's end, and from L's start to B's end
            copy = c[k][s] + c[Kind.L][s]
            out.append((row.policy, 0.0, a * (F + copy + B) + mW * W, 0.0, copy))
    return out


def _forced(problem: Problem, ch: _Chains, r: int, objective: str) -> Bound | None:
    """Rank r under its memory limit, when recompute or offload may buy the memory with time.

    For one microbatch i with policies pi (one per stage of the rank), in any schedule:

    - it holds at least ``area(pi)`` (activation x time): kept, mF from the start of F(s, i) to the
      end of B(s, i) (>= F + rt + B) and mW until W(s, i) ends (>= W); recomputed, ``keep`` over
      that span and the rest from the recompute's start (>= its time + B); offloaded, mF from F's
      start to O's end (>= F + O) and from L's start to B's end (>= L + B);
    - it adds ``rc(pi)`` work to the compute lane (R, S) and ``cp(pi)`` to the copy lane (O, L);
    - it fits alone: when what brings the activation of stage s back starts (R, S, L, or F when
      kept), the rank holds all of it and, for every stage t < s of the rank, at least what t's
      policy keeps (F(t, i) started before; B(t, i) ends after), so ``sum_{t<s} held_t + mF(s) <=
      cap`` for every s; an assignment that breaks it is no microbatch's.

    The rank's level stays within ``cap`` over its window (from head(lo) in makespan, its first
    start in span), so T >= start + sum_i area(pi_i) / cap (memory-time); its compute lane runs
    its work and every recompute, T >= start + work + sum_i rc(pi_i); its copy lane runs every
    copy after some forward of the rank ended and before some B and W of it, T >= start + min F +
    sum_i cp(pi_i) + min (B + W). For weights mu >= 0 summing to 1, T >= the weighted sum of the
    three, which is >= its least over the policies, taken microbatch by microbatch (all alike).
    Every mu gives a valid bound; the sum is concave in mu, so the best found by ``_concave_max``
    (the copy lane's weight, and for each the split of the rest) is reported."""
    cap = _cap(problem, r)
    if cap <= 0:  # no room at all: only activations of zero size fit; no term
        return None
    stages = problem.rank_stages[r]
    m = problem.microbatches
    c = problem.cost
    opts = [_policy_options(problem, ch, s) for s in stages]
    a = problem.mem[Kind.F]
    if math.prod(map(len, opts)) <= JOINT_POLICIES:
        joint = []
        for pick in _product(opts):
            level, fits = 0.0, True
            for s, o in zip(stages, pick):
                if level + a[s] > cap:
                    fits = False
                    break
                level += o[1]
            if fits:
                joint.append((sum(o[2] for o in pick), sum(o[3] for o in pick), sum(o[4] for o in pick),
                              tuple(o[0] for o in pick)))
        if not joint:
            return None  # no microbatch fits: no schedule does (min_memory refuses such a limit)
        choices = [joint]
    else:  # too many to enumerate: each stage on its own (weaker, still valid)
        choices = [[(o[2], o[3], o[4], (o[0],)) for o in opt] for opt in opts]
    work = m * sum(c[Kind.F][s] + c[Kind.B][s] + c[Kind.W][s] for s in stages)
    start = ch.head[stages[0]] if objective == "makespan" else 0.0
    copy_start = start + min(c[Kind.F][s] for s in stages)
    copy_end = min(c[Kind.B][s] + c[Kind.W][s] for s in stages)
    terms = [[(o[0] / cap, o[1], o[2]) for o in options] for options in choices]  # (per unit of each weight)

    def copying(nu: float) -> tuple[float, float, float]:  # (the bound, nu, the best weight of memory-time)
        def split(lam: float) -> tuple[float, float]:
            mu = 1.0 - nu - lam
            least = sum(min(lam * x + mu * y + nu * z for x, y, z in options) for options in terms)
            return lam * start + mu * (start + work) + nu * (copy_start + copy_end) + m * least, lam

        value, lam = _concave_max(split, 0.0, 1.0 - nu, POLICY_GRID, POLICY_REFINE)
        return value, nu, lam

    # The bound is concave in the weights (linear, plus a least over linear terms per microbatch), so
    # the best split for each weight of the copy lane is concave in that weight too.
    copies = Kind.O in problem.policies
    value, nu, lam = _concave_max(copying, 0.0, 1.0, POLICY_GRID, POLICY_REFINE) if copies else copying(0.0)
    mu = (lam, 1.0 - nu - lam, nu)
    picked = [min(options, key=lambda o: mu[0] * o[0] / cap + mu[1] * o[1] + mu[2] * o[2]) for options in choices]
    area = m * sum(o[0] for o in picked)
    rc = m * sum(o[1] for o in picked)
    cp = m * sum(o[2] for o in picked)
    policies = ", ".join(sorted({p for o in picked for p in o[3]}))
    return Bound(value, (
        f"rank {r}: memory for time: weighing memory-time (held {area:g} over room"
        f" {cap - problem.memory_tol.eps:g}), work {work:g} plus recompute {rc:g}, and copies {cp:g}"
        f" ({mu[0]:g} / {mu[1]:g} / {mu[2]:g}; policies {policies})"
    ), r)


def _product(options: list[list]) -> list[tuple]:
    """Every choice of one item per list (itertools.product, kept small by the caller)."""
    out: list[tuple] = [()]
    for opt in options:
        out = [x + (o,) for x in out for o in opt]
    return out


# ---- over every partition of a layer-level problem (``schedc plan``) ----

PARTITION_DP_BLOCKS = 1000  # above this many blocks, the one-chunk partition term is not searched (O(n^2 p))


def partition_bound(layers: LayerProblem, chunks: int, placement: str) -> Bound:
    """A lower bound on the objective of every schedule of every stage problem that cuts
    ``layers``' blocks into ``ranks x chunks`` contiguous stages of one block or more on
    ``placement`` (``LayerProblem.stage_problem``). With f, b, w a block's costs, m microbatches
    and c the latency between ranks:

    - the busiest rank: every rank runs m (F + B + W) of its blocks, and some rank holds at least
      1 / p of all blocks' work;
    - the busiest rank holding whole blocks: the least over every way to share the blocks among
      the p ranks (cut or not: a relaxation of every cut and placement) of the most work one
      holds, times m (``whole_blocks``);
    - one microbatch's critical path: F and B through every block, a latency each way between
      consecutive stages on different ranks (the placement fixes how many: partition-independent;
      an empty stage passes the microbatch on all the same), then the W of stage 0, whose first
      block is the model's first (``_critical_path``); where stages may be empty (``empty_stages``)
      that block may sit on a later stage, and its W overlaps the gradient's way down from there to
      stage 0, so only what of it exceeds one latency per hop counts (makespan), or none of it (span:
      stage 0's rank's own span need not hold it);
    - one chunk (v = 1, makespan): the least over contiguous partitions (exact dynamic programming
      over the cut points) of the largest over ranks of ``_rank_bound``'s terms without memory:
      rank r's first op starts at head(r) or later (the blocks before it, F each, and a latency
      per rank), all its work follows, ``head(r) + m (f + b + w)``; and its last backward ends after
      all its F and B, then the gradient runs down the blocks before it and stage 0's W:
      ``head(r) + m (f + b) + (b of the blocks before, a latency per rank) + w(first block)``.
      Span: rank r's own span holds its work, ``m (f + b + w)`` alone, the least largest of which is
      the time-balanced partition (``schedc.partition.balanced``). ``one_chunk_cut`` finds it.

    The bidirectional placement (two pipelines in opposite directions, ``replicas`` 2, m / 2
    microbatches each): the busiest rank as above (all m microbatches' work is shared among the
    ranks); whole blocks counted in one direction's copies, m / 2 times (a rank holds at least its
    blocks of that direction); the critical path is one microbatch's in either direction; no
    one-chunk term (the other direction's first stage starts on the last rank at once)."""
    p, m, c = layers.ranks, layers.microbatches, layers.comm
    blocks = layers.blocks
    n_stages = p * chunks
    work = [m * (x.F + x.B + x.W) for x in blocks]  # (bidirectional: m / 2 microbatches each way)
    busiest = sum(work) / p
    rank_of = layers.stage_ranks(chunks, placement)
    hops = sum(rank_of[s] != rank_of[s + 1] for s in range(n_stages - 1))
    # (the W of the model's first block, after its backward; where stages may be empty, that block
    # may sit on a later stage, whose W overlaps the gradient's way down: at most ``hops`` latencies;
    # and a span, stage 0's rank's own, need not hold it at all)
    if not layers.empty_stages:
        tail = blocks[0].W
    else:
        tail = max(0.0, blocks[0].W - hops * c) if layers.objective == "makespan" else 0.0
    path = sum(x.F + x.B for x in blocks) + 2 * hops * c + tail
    two = placement == BIDIRECTIONAL
    whole = (m / 2 if two else m) * whole_blocks(layers)
    terms = [(busiest, f"the busiest rank: 1/{p} of all blocks' work {sum(work):g}"),
             (whole, "the busiest rank holding whole blocks (the least, over every way to share them among the"
                     " ranks, of the most work one holds)"),
             (path, f"critical path of one microbatch through every block ({hops} hops between ranks each way),"
                    " then stage 0's W")]
    if chunks == 1 and not two and len(blocks) <= PARTITION_DP_BLOCKS:
        value, _ = one_chunk_cut(layers)
        terms.append((value, "over every cut into stages: the least largest of a rank's start (the blocks before it)"
                             " plus its work, and of its F and B, the gradient's way down and stage 0's W"
                      if layers.objective == "makespan" else
                      "over every cut into stages: the least work of the busiest rank (time-balanced cut)"))
    value, reason = max(terms)
    return Bound(value, f"{chunks} chunk(s), {placement}: {reason}: {value:g}")


def one_chunk_cut(layers: LayerProblem) -> tuple[float, list[int]]:
    """``partition_bound``'s one-chunk term and a cut that attains it: the least over contiguous
    cuts into p stages (empty ones too where the problem allows them) of the largest stage cost
    (stage k holds blocks j..i-1, its cost a function of j, i and k only: ``min_max_cut``):
    ``(that least, blocks per stage)``. An empty stage's terms hold as any stage's: its zero-time
    ops still wait for the blocks before it, and the gradient still runs back down them."""
    blocks, p, m, c = layers.blocks, layers.ranks, layers.microbatches, layers.comm
    n = len(blocks)
    pre_f, pre_b, pre_fb, pre_work = [0.0], [0.0], [0.0], [0.0]
    for x in blocks:
        pre_f.append(pre_f[-1] + x.F)
        pre_b.append(pre_b[-1] + x.B)
        pre_fb.append(pre_fb[-1] + x.F + x.B)
        pre_work.append(pre_work[-1] + x.F + x.B + x.W)
    w_first = blocks[0].W
    makespan = layers.objective == "makespan"

    empty = layers.empty_stages

    def cost(j: int, i: int, k: int) -> float:
        if not makespan:
            return m * (pre_work[i] - pre_work[j])
        head = pre_f[j] + k * c
        # (the first block's W: on stage 0, after the gradient reached it; where stage 0 may be
        # empty, on some stage up to k, overlapping the gradient's way down from there)
        last = max(0.0, w_first - k * c) if empty else w_first
        return max(head + m * (pre_work[i] - pre_work[j]),
                   head + m * (pre_fb[i] - pre_fb[j]) + pre_b[j] + k * c + last)

    return min_max_cut(n, p, cost, empty=empty)


WHOLE_SINGLES = 6  # whole_blocks: the blocks of a rarer kind kept as they are (their partitions enumerated)


def whole_blocks(layers: LayerProblem) -> float:
    """A lower bound on the least, over every assignment of the blocks to the p ranks (each block
    whole on one rank), of the largest per-microbatch work (F + B + W) a rank holds. A relaxation
    of every cut into stages and every placement, which assign blocks to ranks too.

    Kinds repeated at least p times are merged into one, every block of it given the least work
    among them (lowering a block's work lowers every assignment's loads: still a lower bound); of
    the rest, the WHOLE_SINGLES heaviest are kept and the others dropped (likewise). Then exactly:
    for each partition of the kept blocks into at most p groups (each group's blocks on one rank),
    the least T with every group's load g <= T and room for the repeated blocks, ``sum over
    ranks of floor((T - g) / w) >= their count``, T being some load plus whole repeated blocks."""
    p = layers.ranks
    kinds: dict[float, int] = {}
    for layer in layers.layers:
        w = layer.F + layer.B + layer.W
        kinds[w] = kinds.get(w, 0) + layer.count
    repeated = {w: c for w, c in kinds.items() if c >= p}
    w_rep, n_rep = (min(repeated), sum(repeated.values())) if repeated else (0.0, 0)
    singles = sorted((w for w, c in kinds.items() if w not in repeated for _ in range(c)), reverse=True)[:WHOLE_SINGLES]
    eps = 1e-12 * max([w_rep, *singles, 1e-300])

    def least(groups: list[float]) -> float:
        top = max(groups, default=0.0)
        if not n_rep:
            return top
        bases = groups + [0.0] * (p - len(groups))

        def room(t: float) -> int:
            return sum(math.floor((t - g) / w_rep + 1e-9) for g in bases)

        candidates = sorted({g + k * w_rep for g in {*bases} for k in range(n_rep + 1) if g + k * w_rep >= top - eps})
        lo, hi = 0, len(candidates) - 1  # (room(the largest) >= n_rep: one base holds them all)
        while lo < hi:
            mid = (lo + hi) // 2
            if room(candidates[mid]) >= n_rep:
                hi = mid
            else:
                lo = mid + 1
        return candidates[lo]

    best = math.inf
    seen: set[tuple[float, ...]] = set()
    for groups in _partitions(singles, p):
        key = tuple(sorted(round(g, 12) for g in groups))
        if key not in seen:
            seen.add(key)
            best = min(best, least(list(key)))
    return best


def _partitions(items: list[float], most: int):
    """The sums of each partition of ``items`` into at most ``most`` groups (each partition once)."""
    def grow(i: int, groups: list[float]):
        if i == len(items):
            yield groups
            return
        for j in range(len(groups)):
            groups[j] += items[i]
            yield from grow(i + 1, groups)
            groups[j] -= items[i]
        if len(groups) < most:
            yield from grow(i + 1, groups + [items[i]])

    yield from (list(g) for g in grow(0, []))
