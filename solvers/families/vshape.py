"""V-shape schedules: two chunks per rank folded into a V, rank r holding stages r and 2p-1-r.

The forward runs down the ranks on the first chunk and back up on the second, so the first
and the last stage share rank 0 and every rank holds the same activation. Each schedule here
is written per rank as the phases of its diagram, with chunk 0 for stage r (the way down)
and chunk 1 for stage 2p-1-r (the way back up).

- ``zb-v``: handcrafted ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", section on ZB-V).
- ``v-half``, ``v-min``: the V-shape building blocks of Qi et al., "Pipeline Parallelism with
  Controllable Memory" (NeurIPS 2024), about 1/2 and 1/3 of 1F1B's activation memory.
- ``dualpipev``: DeepSeek's DualPipe cut in half onto a V (deepseek-ai/DualPipe, DualPipeV),
  its overlapped F&B pairs run one after the other.

Activation memory below is counted in chunk activations (one microbatch through one chunk);
1F1B holds p microbatches of a whole rank, that is 2p chunk activations.
"""

from __future__ import annotations

from collections import Counter, deque

from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, producers
from schedc.solvers.registry import register


def _v_placement(problem: Problem) -> str | None:
    p = problem.ranks
    v_shape = tuple(min(s, 2 * p - 1 - s) for s in range(2 * p))
    if problem.chunks != 2 or problem.stage_rank != v_shape:
        return (
            f"needs the V placement with two chunks per rank (rank r holds stages r and 2p-1-r);"
            f" this problem has chunks {problem.chunks} and placement {problem.placement!r}"
        )
    return None


def _dualpipev_applies(problem: Problem) -> str | None:
    if problem.microbatches < 2 * problem.ranks:
        return (
            f"needs at least 2p = {2 * problem.ranks} microbatches, as DualPipeV does"
            f" (microbatches is {problem.microbatches})"
        )
    return _v_placement(problem)


class _Rank:
    """One rank's ops in order. Each call appends the next microbatch of that chunk."""

    def __init__(self, problem: Problem, rank: int):
        self.stages = (rank, problem.n_stages - 1 - rank)
        self.ops: list[Op] = []
        self.done: Counter = Counter()  # (kind, chunk) -> microbatches so far
        self.owed: deque = deque()  # chunks of the B still without their W, oldest first

    def _add(self, kind: Kind, chunk: int) -> None:
        self.ops.append(Op(kind, self.stages[chunk], self.done[kind, chunk]))
        self.done[kind, chunk] += 1

    def F(self, chunk: int) -> None:
        self._add(Kind.F, chunk)

    def B(self, chunk: int) -> None:
        self._add(Kind.B, chunk)
        self.owed.append(chunk)

    def W(self, chunk: int | None = None) -> None:
        """The next W of ``chunk``, or the oldest owed one."""
        if chunk is None:
            chunk = self.owed.popleft()
        else:
            self.owed.remove(chunk)
        self._add(Kind.W, chunk)

    def count(self, kind: Kind, chunk: int) -> int:
        return self.done[kind, chunk]


# ---- ZB-V ----


@register(
    "zb-v",
    "zero bubble V (Qi et al.): 1F1B's peak memory, zero bubble by span when F = B = W",
    split_backward=True,
    requires=_v_placement,
)
def zb_v(problem: Problem) -> Schedule:
    """Handcrafted ZB-V, as in the zero-bubble repository and torch's ScheduleZBVZeroBubble.

    Meets exactly (integer costs, no latency, m >= 2p-1): peak activation 2p chunk activations
    on rank 0, 1F1B's, and no rank above it; zero bubble by span when every pass costs the
    same. With other costs the hand-made order leaves a bubble (the zero-bubble authors use a
    greedy scheduler there); with F <= B and W <= B it is (p-1) max(2(B-W), B-F) in per-chunk
    costs, not a published figure.
    Built for max(m, 2p-1) microbatches; those beyond m are then dropped.
    """
    p, m = problem.ranks, problem.microbatches
    n = max(m, 2 * p - 1)
    per_rank = []
    for r in range(p):
        rank = _Rank(problem, r)
        for _ in range(2 * (p - r) - 1):  # warm-up: forwards down the V
            rank.F(0)
        for _ in range(r):  # warm-up: the way back up reaches this rank
            rank.F(1)
            rank.F(0)
        for _ in range(p - r):  # warm-up: first backwards of the second chunk
            rank.F(1)
            rank.B(1)
            rank.W(1)
        # steady: F B W on the first chunk, then on the second, until every forward is in
        while rank.count(Kind.F, 1) < rank.count(Kind.F, 0) or rank.count(Kind.F, 0) < n:
            if rank.count(Kind.F, 0) < n:
                rank.F(0)
            rank.B(0)
            rank.W(0)
            rank.F(1)
            rank.B(1)
            rank.W(1)
        for _ in range(r):  # cool-down: backwards only, W owed
            rank.B(0)
            rank.B(1)
        for _ in range(p - r):  # cool-down: each chunk-0 backward followed by an owed W
            rank.B(0)
            rank.W(0)
        while rank.count(Kind.W, 1) < rank.count(Kind.B, 1):  # flush: remaining W, second chunk first
            rank.W(1)
        while rank.count(Kind.W, 0) < rank.count(Kind.B, 0):
            rank.W(0)
        per_rank.append([op for op in rank.ops if op.mb < m])
    return Schedule.from_lists("zb-v", per_rank)


# ---- V-Half and V-Min: building blocks with controllable memory ----

_PERIOD = 6  # slots per microbatch and rank: F and B of two chunks, and two W
_UNITS = {Kind.F: 1, Kind.B: 0, Kind.W: -1}  # activation as the paper counts it: freed by W


def _v_half_block(p: int, r: int) -> tuple[int, int, int, int]:
    """Slots of F(chunk 0), F(chunk 1), B(chunk 1), B(chunk 0) of one microbatch on rank r."""
    gap = 3 if p % 2 == 0 else 0  # keeps the four passes on distinct slots mod 6
    return 2 * r, 3 * p - r - 2, 3 * p + gap + 2 * r - 1, 6 * p + gap - r - 2


def _v_min_block(p: int, r: int) -> tuple[int, int, int, int]:
    gap = 2 if p % 3 == 0 else 0
    return r, 2 * p - r - 1, 2 * p + gap + r, 4 * p + gap - r - 1


def _ready(op: Op, slot: dict[Op, int], n_stages: int) -> int:
    """First slot where ``op`` may run: after its producers and its previous microbatch."""
    kind, s, i = op
    before = ([Op(kind, s, i - 1)] if i else []) + producers(op, n_stages)
    return 1 + max((slot[x] for x in before if x in slot), default=-1)


def _fill_w(grid: dict[int, Op]) -> dict[int, Op]:
    """Put every W in the first idle slot after its B, oldest first (any left go at the end)."""
    passes = {t: op for t, op in grid.items() if op.kind is not Kind.W}
    out, owed, t = dict(passes), deque(), 0
    last = max(passes, default=-1)
    while t <= last or owed:
        if t in passes:
            if passes[t].kind is Kind.B:
                owed.append(passes[t]._replace(kind=Kind.W))
        elif owed:
            out[t] = owed.popleft()
        t += 1
    return out


def _move(grid: dict[int, Op], slot: dict[Op, int], op: Op, to: int) -> None:
    del grid[slot[op]]
    grid[to], slot[op] = op, to


def _repeat_block(problem: Problem, block) -> list[dict[int, Op]]:
    """Per rank, slot -> op: microbatch i's passes at the block's slots plus 6i, W in the gaps."""
    p, m, n = problem.ranks, problem.microbatches, problem.n_stages
    grids = []
    for r in range(p):
        first, second = r, n - 1 - r
        passes = ((Kind.F, first), (Kind.F, second), (Kind.B, second), (Kind.B, first))
        slots = list(zip(passes, block(p, r)))
        grids.append({t + _PERIOD * i: Op(k, s, i) for i in range(m) for (k, s), t in slots})
    return [_fill_w(g) for g in grids]


def _squeeze_warmup_and_cooldown(problem: Problem, grids: list[dict[int, Op]], steady: range) -> None:
    """Move each pass outside the steady slots to the earliest free slot its inputs allow,
    as long as its rank stays within the blocks' peak memory."""
    horizon = max(max(g) for g in grids) + 1
    level = [[0] * horizon for _ in grids]  # per rank and slot, activation held
    for g, lv in zip(grids, level):
        for t in range(horizon):
            lv[t] = (lv[t - 1] if t else 0) + (_UNITS[g[t].kind] if t in g else 0)
    peak = max(max(lv) for lv in level)
    slot = {op: t for g in grids for t, op in g.items()}
    for op in sorted(slot, key=lambda op: (slot[op], problem.stage_rank[op.stage])):
        r, t, grow = problem.stage_rank[op.stage], slot[op], _UNITS[op.kind]
        if t in steady:
            continue
        for to in range(_ready(op, slot, problem.n_stages), t):
            if to not in grids[r] and (grow <= 0 or max(level[r][to:t]) + grow <= peak):
                _move(grids[r], slot, op, to)
                for x in range(to, t):
                    level[r][x] += grow
                break


def _backwards_early(problem: Problem, grids: list[dict[int, Op]]) -> list[dict[int, Op]]:
    """After its last forward, a rank runs each backward as early as it can (W set aside)."""
    grids = [{t: op for t, op in g.items() if op.kind is not Kind.W} for g in grids]
    slot = {op: t for g in grids for t, op in g.items()}
    last_forward = [max(t for t, op in g.items() if op.kind is Kind.F) for g in grids]
    for op in sorted(slot, key=lambda op: (slot[op], problem.stage_rank[op.stage])):
        r, t = problem.stage_rank[op.stage], slot[op]
        if op.kind is Kind.B and t > last_forward[r]:
            earliest = max(_ready(op, slot, problem.n_stages), last_forward[r] + 1)
            _move(grids[r], slot, op, next((x for x in range(earliest, t) if x not in grids[r]), t))
    return grids


def _controllable_memory(problem: Problem, name: str, block) -> Schedule:
    """The building block repeated every 6 unit slots, then squeezed as the paper does.

    The steady phase (rank 0's first chunk-0 backward to its last forward) stays as the blocks
    lay it out. Each rank's order is its slots read in time, and every pass sits in a later
    slot than its inputs: no deadlock, whatever the costs and latency.
    """
    grids = _repeat_block(problem, block)
    steady = range(block(problem.ranks, 0)[3], _PERIOD * (problem.microbatches - 1) + 1)
    _squeeze_warmup_and_cooldown(problem, grids, steady)
    grids = [_fill_w(g) for g in _backwards_early(problem, grids)]
    return Schedule.from_lists(name, [[g[t] for t in sorted(g)] for g in grids])


@register(
    "v-half",
    "V-Half (Qi et al. 2024): V-shape building block at half of 1F1B's activation memory",
    split_backward=True,
    requires=_v_placement,
)
def v_half(problem: Problem) -> Schedule:
    """V-Half, "Pipeline Parallelism with Controllable Memory" (Qi et al. 2024).

    Meets exactly (m >= p): peak activation 2 * ((p + 2) // 2) chunk activations, the published
    (p + 2) // 2 microbatches against 1F1B's p, whether B frees part of it or W all. The
    published bubble rate, about p / 2m when F = B = W, is an approximation; here the bubble is
    at most 3p such passes (a rate of at most p / 2m) and stays bounded in m when W + 2F >= 2B
    and W + 2B >= 2F, the paper's condition.
    """
    return _controllable_memory(problem, "v-half", _v_half_block)


@register(
    "v-min",
    "V-Min (Qi et al. 2024): V-shape building block at a third of 1F1B's activation memory",
    split_backward=True,
    requires=_v_placement,
)
def v_min(problem: Problem) -> Schedule:
    """V-Min, "Pipeline Parallelism with Controllable Memory" (Qi et al. 2024).

    Meets exactly (m >= p): peak activation 2 * ((p + 4) // 3) chunk activations, the published
    (p + 4) // 3 microbatches, when W frees the activation as the paper counts it (at most that
    when B already frees part). The published bubble rate, about 2p / 3m when F = B = W, is an
    approximation; here the bubble is at most 4p such passes. With unequal costs the tight
    block leaves a bubble in every repeat, so it grows with m, as the paper says.
    """
    return _controllable_memory(problem, "v-min", _v_min_block)


# ---- DualPipeV ----


@register(
    "dualpipev",
    "DualPipeV (DeepSeek): DualPipe folded onto a V, F&B pairs run in sequence; needs m >= 2p",
    split_backward=True,
    requires=_dualpipev_applies,
)
def dualpipev(problem: Problem) -> Schedule:
    """DualPipeV, the cut-in-half DualPipe (deepseek-ai/DualPipe; torch's ScheduleDualPipeV).

    Its eight steps per rank as in the published code; an overlapped pair "F&B" becomes the
    forward and then the full backward (B and at once its W). Needs m >= 2p.
    Meets exactly (integer costs, no latency): peak activation 2p + 1 chunk activations on
    every rank, the published PP + 1. The published bubble (PP/2 - 1)(F&B + B - 3W) (DualPipe's
    README: its B the full backward, F&B a forward overlapped with one) assumes
    the pair overlapped and a fused full backward; run in sequence with B and W split it does
    not carry over. Here the bubble (span and makespan alike) is (p - 1)(F + B - W) in per-chunk
    costs when W <= B <= F <= B + W, so p - 1 passes when they all cost the same, below the
    published figure read with F&B = F + B + W and a full backward of B + W.
    """
    p, m = problem.ranks, problem.microbatches
    per_rank = []
    for r in range(p):
        rank = _Rank(problem, r)
        for _ in range(2 * (p - r - 1)):  # step 1: nF0, forwards down the V
            rank.F(0)
        for _ in range(r + 1):  # step 2: nF0F1
            rank.F(0)
            rank.F(1)
        for _ in range(p - r - 1):  # step 3: nB1W1F1, zero bubble on the second chunk
            rank.B(1)
            rank.W(1)
            rank.F(1)
        for _ in range(m - 2 * p + r + 1):  # step 4, main: nF0B1F1B0, pairs F0&B1 and F1&B0
            rank.F(0)
            rank.B(1)
            rank.W(1)
            rank.F(1)
            rank.B(0)
            rank.W(0)
        for _ in range(p - r - 1):  # step 5: nB1F1B0
            rank.B(1)
            rank.W(1)
            rank.F(1)
            rank.B(0)
            rank.W(0)
        zero_bubble = False  # from the middle of step 6 on, each B's W is owed
        for i in range(r + 1):  # step 6: nB1B0
            zero_bubble = zero_bubble or (i == (r + 1) // 2 and r % 2 == 1)
            rank.B(1)
            if not zero_bubble:
                rank.W(1)
            zero_bubble = zero_bubble or (i == (r + 1) // 2 and r % 2 == 0)
            rank.B(0)
            if not zero_bubble:
                rank.W(0)
        for _ in range(p - r - 1):  # step 7: nWB0, an owed W then a backward
            rank.W()
            rank.B(0)
        for _ in range(r + 1):  # step 8: nW, the owed weight gradients
            rank.W()
        per_rank.append(rank.ops)
    return Schedule.from_lists("dualpipev", per_rank)
