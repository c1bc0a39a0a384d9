"""Schedules of problems with replicas: pipelines running in opposite directions on the same ranks.

With ``replicas: 2`` a rank holds stage r of one direction and stage p - 1 - r of the other
(Chimera, DualPipe), and each pipeline runs the problem's microbatches. ``chimera`` is Chimera's
schedule (Li and Hoefler, SC'21): each direction runs 1F1B (a stage at position j of its chain
keeps at most L - j microbatches in flight, L stages per pipeline), and a rank fills the idle time
of one direction with the other's work. It is built by list scheduling on the problem's costs:
whenever a rank is free it runs, of the ops whose inputs have arrived, a forward the in-flight
limit allows first (the deeper in its pipeline, then the earlier microbatch), else a backward, so
that the limit makes each direction's 1F1B and the two interleave as Chimera's figure shows: on uniform costs with F equal to the
fused backward, D stages and D microbatches in all, each rank idles D - 2 forward times against
1F1B's 2 (D - 1) (tests/test_bidirectional.py checks the published figure). With a split
backward (``bidir-zb``), each W waits until its rank has nothing else ready, as in the
zero-bubble schedules, and a stage keeps at most L - j microbatches between F and W.

``dualpipe`` is DualPipe (DeepSeek-V3): microbatches fed from both ends, the steady state a
forward of one direction beside a full backward of the other, B and W split in the warm-up and
cool-down. Its per-rank order and its pairs follow the reference implementation's eight steps: a
pair (``Schedule.pairs``) starts once both its inputs have arrived and sends both outputs at its
end, as the reference receives both before and sends both after. ``costs.FB`` (a forward
overlapped with an input gradient B) sets only how long a pair takes (plus the W of its full
backward); without it a pair lasts its two ops one after the other (``Problem.pair_time``), as the
reference runs a module that cannot overlap them. DualPipe's README gives each rank's idle as
(PP/2 - 1)(F&B + B - 3W) with ITS B the full backward and F&B a forward overlapped with a full
backward; in schedc's notation (B the input gradient: F&B = FB + W, full backward B + W) that is
(p/2 - 1)(FB + B - W), FB = F + B by default. On costs with F = B >= W the ranks with the most
pairs idle exactly that (every rank without ``costs.FB``), e.g. 6 per rank on its figure's costs
(p = 8, F = B = W = 1), and each rank holds p + 1 microbatches' activations (tested).

``bitpipe`` is BitPipe (Wu et al. 2024): both directions on the V placement (rank r holds stages r
and 2p - 1 - r of each pipeline, so a microbatch turns on the last rank without a transfer), fused
backward, the per-rank order of the reference implementation. With p microbatches in all (one
round) each rank idles 2(p - 2) forward times on the costs of the published figure (backward twice
the forward), whose order it reproduces (tested); with more rounds the reference's order waits
where a rank's next backward's input has not arrived (measured, benchmarks/sync.py).
"""

from __future__ import annotations

from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, producers
from schedc.solvers.registry import any_placement, register


def list_scheduled(problem: Problem, name: str, split: bool) -> Schedule:
    """Both directions' 1F1B, interleaved by list scheduling on the problem's costs (see the module
    notes): forwards first within each stage's 1F1B in-flight limit, then backwards, and
    (``split``) the weight gradients W only where nothing else is ready. Where an overlapped pair is faster
    (``costs.FB``), the op chosen runs as a pair with a backward (or forward) ready at the same
    time, if there is one."""
    depth, m, comm = problem.pipeline_stages, problem.microbatches, problem.comm
    cost, rank_of, tol = problem.cost, problem.stage_rank, problem.time_tol
    back = Kind.B if split else Kind.BW
    last = Kind.W if split else Kind.BW  # what ends a microbatch's stay on a stage (and frees its activation)
    kinds = (Kind.F, back, Kind.W) if split else (Kind.F, back)
    present = {Op(k, s, i) for s in range(problem.n_stages) for i in range(m) for k in kinds}
    deps = {op: producers(op, depth, present) for op in present}  # (present: a BW needs the BW after it, not a B)
    waiting = {op: len(d) for op, d in deps.items()}  # producers not yet run
    users: dict[Op, list[Op]] = {}
    for op, d in deps.items():
        for x in d:
            users.setdefault(x, []).append(op)
    todo = [set() for _ in range(problem.ranks)]  # per rank, the ops whose inputs are all computed
    for op, n in waiting.items():
        if n == 0:
            todo[rank_of[op.stage]].add(op)
    left = len(present)
    end: dict[Op, float] = {}
    in_flight = [0] * problem.n_stages  # per stage: forwarded, weight gradient not yet run
    limit = [depth - s % depth for s in range(problem.n_stages)]  # 1F1B's warm-up plus one
    order: list[list[Op]] = [[] for _ in range(problem.ranks)]
    pairs: list[list[Op]] = [[] for _ in range(problem.ranks)]
    overlap = problem.overlap_cheaper
    free = [0.0] * problem.ranks  # when each rank is free

    def first(ready):
        """Of ``ready`` (entries as below): forwards first, the deeper in its pipeline first, the
        earlier microbatch first."""
        return min(ready, key=lambda x: (x[1], -(x[3] % depth), x[2], x[3]))[-1]

    t = 0.0
    while left:
        upcoming = []  # times after t when something may change: a rank frees, an input arrives
        moved = True
        while moved:  # every rank free at t runs what it can (an op may take no time)
            moved = False
            for r in range(problem.ranks):
                if tol.gt(free[r], t):
                    upcoming.append(free[r])
                    continue
                ready = []  # (ready time, priority, microbatch, stage, op) of the ops whose inputs are computed
                # (times compared up to float noise, so that the order is the same in any unit)
                for op in todo[r]:
                    if op.kind is Kind.F and in_flight[op.stage] >= limit[op.stage]:
                        continue
                    at = max([end[d] + (comm if rank_of[d.stage] != r else 0.0) for d in deps[op]], default=0.0)
                    ready.append((at, 0 if op.kind is Kind.F else (1 if op.kind is back else 2), op.mb, op.stage, op))
                now = [x for x in ready if tol.le(x[0], t)]
                if not now:
                    upcoming += [x[0] for x in ready]
                    continue
                op = first(now)
                run = [op]
                if overlap and op.kind in (Kind.F, back):  # a forward and a backward ready together: a pair
                    other = back if op.kind is Kind.F else Kind.F
                    mates = [x for x in now if x[-1].kind is other and (x[3], x[2]) != (op.stage, op.mb)]
                    if mates:
                        run = sorted([op, first(mates)], key=lambda o: o.kind is not Kind.F)
                        pairs[r].append(run[1])
                took = problem.pair_time(run[0].stage, run[1].kind, run[1].stage) if len(run) == 2 \
                    else cost[op.kind][op.stage]
                for op in run:
                    todo[r].discard(op)
                    left -= 1
                    for user in users.get(op, ()):
                        waiting[user] -= 1
                        if waiting[user] == 0:
                            todo[rank_of[user.stage]].add(user)
                    order[r].append(op)
                    end[op] = free[r] = t + took
                    in_flight[op.stage] += 1 if op.kind is Kind.F else (-1 if op.kind is last else 0)
                moved = True
        later = [u for u in upcoming if tol.gt(u, t)]
        if not later and left:
            raise RuntimeError(f"{name}: ops left that can never start")  # (a bug, not a problem's)
        t = min(later, default=t)
    return Schedule.from_lists(name, order, pairs=pairs)


@register("chimera", "two pipelines in opposite directions, 1F1B each, interleaved (Chimera, fused B+W)",
          split_backward=False, requires=any_placement, bidirectional=True)
def chimera(problem: Problem) -> Schedule:
    return list_scheduled(problem, "chimera", split=False)


@register("bidir-zb", "two pipelines in opposite directions, 1F1B each with B and W split, W in the idle time",
          split_backward=True, requires=any_placement, bidirectional=True)
def bidirectional_zero_bubble(problem: Problem) -> Schedule:
    return list_scheduled(problem, "bidir-zb", split=True)


def _dualpipe_order(problem: Problem, r: int) -> tuple[list[Op], list[Op]]:
    """Rank r's compute order in DualPipe (DeepSeek-V3; the order of the reference implementation's
    step, rewritten from its description): with p ranks and m microbatches per direction (m >= p),
    rank r runs its "phase 0" chunk (pipeline 0's stage r on the first half of the ranks, pipeline
    1's on the second half) and its "phase 1" chunk in eight steps: forwards of phase 0, forwards of
    both, B+W+F of phase 1 (zero bubble), the main loop of forward-and-backward pairs (F of one
    chunk beside a full backward of the other), backwards and pairs, backwards of both (the later
    half split into B and W), W and B of phase 0, and the remaining W. A split B queues its W; a W
    runs the oldest queued one. Returns the order and the backwards paired with the forward
    before them (every pair but the middle ranks' first, which the reference runs apart)."""
    p, m, depth = problem.ranks, problem.microbatches, problem.pipeline_stages
    half, hr, second = p // 2, min(r, p - 1 - r), int(r >= p // 2)
    stage = {0: r, 1: depth + (p - 1 - r)}  # chunk (0: pipeline 0, 1: pipeline 1) -> its stage on rank r
    f_next, b_next = [0, 0], [0, 0]
    queued: list[Op] = []
    ops: list[Op] = []
    pairs: list[Op] = []
    middle = r in (half - 1, half)

    def forward(phase: int) -> None:
        c = phase ^ second
        ops.append(Op(Kind.F, stage[c], f_next[c]))
        f_next[c] += 1

    def backward(phase: int, split: bool) -> None:
        c = phase ^ second
        s, i = stage[c], b_next[c]
        b_next[c] += 1
        if split:
            ops.append(Op(Kind.B, s, i))
            queued.append(Op(Kind.W, s, i))
        else:
            ops.append(Op(Kind.BW, s, i))

    def weight() -> None:
        ops.append(queued.pop(0))

    def pair(phase0: int, phase1: int, paired: bool = True) -> None:
        forward(phase0)
        backward(phase1, split=False)
        if paired:
            pairs.append(ops[-1])

    for _ in range((half - hr - 1) * 2):  # 1: forwards of phase 0
        forward(0)
    for _ in range(hr + 1):  # 2: forwards of both phases
        forward(0)
        forward(1)
    for _ in range(half - hr - 1):  # 3: B, W and F of phase 1
        backward(1, split=True)
        weight()
        forward(1)
    for i in range(m - p + hr + 1):  # 4: the main loop, two forward-and-backward pairs
        pair(0, 1, paired=not (i == 0 and middle))
        pair(1, 0)
    for _ in range(half - hr - 1):  # 5: a backward, then a pair
        backward(1, split=False)
        pair(1, 0)
    split = False
    steps = hr + 1
    for i in range(steps):  # 6: backwards of both, the later ones split
        if i == steps // 2 and hr % 2 == 1:
            split = True
        backward(1, split)
        if i == steps // 2 and hr % 2 == 0:
            split = True
        backward(0, split)
    for _ in range(half - hr - 1):  # 7: W, then B of phase 0
        weight()
        backward(0, split=True)
    while queued:  # 8: the remaining W
        weight()
    return ops, pairs


def _dualpipe_fits(problem: Problem) -> str | None:
    if problem.pipelines != 2 or problem.chunks != 1:
        return f"needs two pipelines of one chunk per rank (replicas 2, chunks 1; this problem has chunks {problem.chunks})"
    if problem.ranks % 2:
        return f"needs an even number of ranks (ranks is {problem.ranks})"
    if problem.microbatches < problem.ranks:
        return f"needs at least as many microbatches per direction as ranks ({problem.microbatches} < {problem.ranks})"
    mirrored = tuple(range(problem.ranks)) + tuple(reversed(range(problem.ranks)))
    if problem.stage_rank != mirrored:
        return "needs the bidirectional placement (rank r holds stage r of one direction and p - 1 - r of the other)"
    return None


@register("dualpipe", "DualPipe (DeepSeek-V3): both directions fed from both ends, forward-and-backward pairs, B and W"
          " split in the warm-up and cool-down", split_backward=True, requires=_dualpipe_fits, bidirectional=True)
def dualpipe(problem: Problem) -> Schedule:
    orders, pairs = zip(*(_dualpipe_order(problem, r) for r in range(problem.ranks)))
    # Always the reference's pairs, each waiting for both its inputs: costs.FB sets only how long a
    # pair takes (without it, its two ops one after the other: Problem.pair_time).
    return Schedule.from_lists("dualpipe", orders, pairs=pairs)


def _bitpipe_order(problem: Problem, r: int) -> list[Op]:
    """Rank r's compute order in BitPipe (Wu et al. 2024; the order of the reference
    implementation, rewritten from its description). Rank r holds four chunks: 0 and 2 the down
    pipeline's stages r and 2p - 1 - r (its V), 1 and 3 the up pipeline's p - 1 - r and p + r.
    The forwards run in one order and the (fused) backwards in another, each a round of 2p ops per
    p/2 microbatches of each direction: a rank starts with the chunk its pipeline enters it
    first, n0 ops of it (n0: the rank's distance from the middle, plus one), then alternates with
    the other direction's chunk. The program: W forwards (W = 3p/2 + the distance from the nearer
    end), then per further round U = 2p - W forward-backward pairs, W - U + 1 backwards, U - 1
    pairs and W - U + 1 forwards; last U pairs and the remaining backwards."""
    p, m, depth = problem.ranks, problem.microbatches, problem.pipeline_stages
    unit = p // 2
    low = int(r >= unit)  # the rank's first chunk: 0 (the down pipeline enters it first) or 1
    n0 = unit - r if r < unit else r - unit + 1
    stage = (r, depth + p - 1 - r, depth - 1 - r, depth + p + r)  # chunk -> its stage on rank r

    def sequence(first: tuple[int, int], second: tuple[int, int]) -> list[tuple[int, int]]:
        """One order over (chunk, microbatch): ``first`` and ``second`` the chunk pairs (this
        direction's, the other's) of the order's two halves, round by round."""
        out = []
        for j in range(2 * m // p):
            base = j * unit
            a, b = first
            out += [(a, base + i) for i in range(n0)]
            for i in range(unit - n0):
                out += [(b, base + i), (a, base + i + n0)]
            c, d = second
            for i in range(n0):
                out += [(b, base + i + unit - n0), (d, base + i)]
            for i in range(unit - n0):
                out += [(c, base + i), (d, base + i + n0)]
            out += [(c, base + i + unit - n0) for i in range(n0)]
        return out

    forwards = [Op(Kind.F, stage[c], i) for c, i in sequence((low, 1 - low), (2 + low, 3 - low))]
    backwards = [Op(Kind.BW, stage[c], i) for c, i in sequence((2 + low, 3 - low), (low, 1 - low))]
    warm = p + unit + (r if r < unit else p - 1 - r)
    pairs_first = 2 * p - warm
    f, b = iter(forwards), iter(backwards)
    ops = [next(f) for _ in range(warm)]
    for _ in range(2 * m // p - 1):
        for _ in range(pairs_first):
            ops += [next(f), next(b)]
        ops += [next(b) for _ in range(warm - pairs_first + 1)]
        for _ in range(pairs_first - 1):
            ops += [next(f), next(b)]
        ops += [next(f) for _ in range(warm - pairs_first + 1)]
    for _ in range(pairs_first):
        ops += [next(f), next(b)]
    return ops + list(b)


def _bitpipe_fits(problem: Problem) -> str | None:
    p, m = problem.ranks, problem.microbatches
    if problem.pipelines != 2 or problem.chunks != 2:
        return f"needs two pipelines of two chunks per rank (replicas 2, chunks 2; this problem has chunks {problem.chunks})"
    if p % 2:
        return f"needs an even number of ranks (ranks is {p})"
    if m % (p // 2):
        return f"needs microbatches per direction a multiple of ranks / 2 ({m} is not a multiple of {p // 2})"
    depth = problem.pipeline_stages
    down = tuple(range(p)) + tuple(reversed(range(p)))
    if problem.stage_rank != down + tuple(p - 1 - r for r in down):
        return "needs the V placement of both pipelines (placement v: rank r holds stages r and 2p - 1 - r of each)"
    return None


@register("bitpipe", "BitPipe: two V-shaped interleaved pipelines in opposite directions (fused B+W)",
          split_backward=False, requires=_bitpipe_fits, bidirectional=True)
def bitpipe(problem: Problem) -> Schedule:
    return Schedule.from_lists("bitpipe", [_bitpipe_order(problem, r) for r in range(problem.ranks)])
