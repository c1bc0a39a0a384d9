"""Named heuristic schedules, each a function Problem -> Schedule, registered by name.

Every schedule is built from the same three steps, so that each reads like its diagram:
the order of a rank's forwards, the order of its backwards, and how they interleave
(all forwards first, or a warm-up of forwards then one forward / one backward). Zero-bubble
schedules then defer each weight gradient W a fixed number of backwards behind its B.
"""

from __future__ import annotations

from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule
from schedc.solvers.registry import any_placement, loop_placement, one_chunk, register


def _interleavable(problem: Problem) -> str | None:
    if problem.chunks > 1 and problem.microbatches % problem.ranks:
        # As in Megatron-LM: with a short last group, its warm-up order deadlocks (found by the
        # property tests, e.g. p = 6, m = 14, v = 2).
        return f"needs microbatches ({problem.microbatches}) a multiple of ranks ({problem.ranks}) with chunks > 1"
    return loop_placement(problem)


def one_f_one_b(forwards: list[Op], backwards: list[Op], warmup: int) -> list[Op]:
    """``warmup`` forwards, then alternate one forward and one backward, then the remaining backwards."""
    warmup = min(warmup, len(forwards))
    ops = forwards[:warmup]
    for k, f in enumerate(forwards[warmup:]):
        ops += [f, backwards[k]]
    return ops + backwards[len(forwards) - warmup :]


def defer_w(ops: list[Op], delay: int) -> list[Op]:
    """Give every B its W, placed right after the B that comes ``delay`` backwards later
    (or at the end): W fills the idle time the next backwards would otherwise leave."""
    out: list[Op] = []
    pending: list[Op] = []
    for op in ops:
        out.append(op)
        if op.kind is Kind.B:
            pending.append(Op(Kind.W, op.stage, op.mb))
            if len(pending) > delay:
                out.append(pending.pop(0))
    return out + pending


def _mbs(problem: Problem) -> range:
    return range(problem.microbatches)


def _single_stage(problem: Problem, rank: int) -> int:
    (stage,) = problem.rank_stages[rank]
    return stage


# ---- fused backward ----


@register("gpipe", "all forwards, then all backwards (fused B+W)", split_backward=False, requires=one_chunk,
          holds_every_microbatch=True)
def gpipe(problem: Problem) -> Schedule:
    return looped_bfs(problem).renamed("gpipe")


@register(
    "1f1b",
    "one forward one backward after p-1-s warm-up forwards (PipeDream-flush / Megatron)",
    split_backward=False,
    requires=one_chunk,
)
def one_f_one_b_schedule(problem: Problem) -> Schedule:
    per_rank = []
    for r in range(problem.ranks):
        s = _single_stage(problem, r)
        fwd = [Op(Kind.F, s, i) for i in _mbs(problem)]
        bwd = [Op(Kind.BW, s, i) for i in _mbs(problem)]
        per_rank.append(one_f_one_b(fwd, bwd, warmup=problem.n_stages - 1 - s))
    return Schedule.from_lists("1f1b", per_rank)


@register(
    "interleaved-1f1b",
    "Megatron-LM interleaved 1F1B: v chunks per rank, depth-first in groups of p microbatches",
    split_backward=False,
    requires=_interleavable,
)
def interleaved_1f1b(problem: Problem) -> Schedule:
    p, v, m = problem.ranks, problem.chunks, problem.microbatches
    if v == 1:
        return one_f_one_b_schedule(problem).renamed("interleaved-1f1b")
    per_rank = []
    for r in range(p):
        stages = problem.rank_stages[r]  # chunk c is stage c * p + r
        fwd, bwd = [], []
        for g0 in range(0, m, p):  # groups of p microbatches
            group = range(g0, g0 + p)
            fwd += [Op(Kind.F, stages[c], i) for c in range(v) for i in group]
            bwd += [Op(Kind.BW, stages[c], i) for c in reversed(range(v)) for i in group]
        warmup = 2 * (p - r - 1) + (v - 1) * p  # Megatron-LM's warm-up for interleaving
        per_rank.append(one_f_one_b(fwd, bwd, warmup=warmup))
    return Schedule.from_lists("interleaved-1f1b", per_rank)


@register(
    "looped-bfs",
    "breadth-first: every chunk's forwards for all microbatches, then backwards in reverse chunk order",
    split_backward=False,
    requires=any_placement,
    holds_every_microbatch=True,
)
def looped_bfs(problem: Problem) -> Schedule:
    per_rank = []
    for r in range(problem.ranks):
        stages = problem.rank_stages[r]
        fwd = [Op(Kind.F, s, i) for s in stages for i in _mbs(problem)]
        bwd = [Op(Kind.BW, s, i) for s in reversed(stages) for i in _mbs(problem)]
        per_rank.append(fwd + bwd)
    return Schedule.from_lists("looped-bfs", per_rank)


# ---- split backward (zero bubble, Qi et al. 2024) ----


def _zero_bubble(problem: Problem, name: str, warmup_per_stage: int) -> Schedule:
    """1F1B with B and W split; stage s runs ``warmup_per_stage * (S-1-s)`` warm-up forwards and
    defers each W by ``warmup_per_stage * s`` backwards, so the W fill the cool-down idle."""
    per_rank = []
    last = problem.n_stages - 1
    for r in range(problem.ranks):
        s = _single_stage(problem, r)
        fwd = [Op(Kind.F, s, i) for i in _mbs(problem)]
        bwd = [Op(Kind.B, s, i) for i in _mbs(problem)]
        ops = one_f_one_b(fwd, bwd, warmup=warmup_per_stage * (last - s))
        per_rank.append(defer_w(ops, delay=warmup_per_stage * s))
    return Schedule.from_lists(name, per_rank)


@register(
    "zb-h1",
    "zero bubble H1: 1F1B's warm-up and peak memory, W deferred to fill the cool-down; bubble (p-1)(F+B-W)",
    split_backward=True,
    requires=one_chunk,
)
def zb_h1(problem: Problem) -> Schedule:
    return _zero_bubble(problem, "zb-h1", warmup_per_stage=1)


@register(
    "zb-h2",
    "zero bubble H2: twice the warm-up forwards (about 2x 1F1B's memory); bubble (p-1)(F+B-2W)",
    split_backward=True,
    requires=one_chunk,
)
def zb_h2(problem: Problem) -> Schedule:
    return _zero_bubble(problem, "zb-h2", warmup_per_stage=2)
