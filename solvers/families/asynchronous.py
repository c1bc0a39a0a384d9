"""Asynchronous schedules: optimizer steps without a pipeline flush, on weight versions (issue 27).

PipeDream-2BW (Narayanan et al., ICML'21) runs 1F1B's steady state for ever: the forwards of the
next batch fill the time the last backwards of this one would leave idle, so the pipeline fills
once, not every step. Each stage keeps two versions of its weights (double buffering): a
microbatch's forward and backward use the version its batch started with, and the step after
batch r (on each stage, after its last weight gradient of r) makes the version batch r + 2 uses,
so gradients are applied one step stale: w(t+1) = w(t) - lr * g(w(t-1)).

A schedule here covers ``rounds`` batches of the problem's microbatches (``Schedule.rounds``); its
time per microbatch in the steady state (``Timeline.per_microbatch``, the ``steady`` objective) is
measured between the end of the first round and the end of the last but one. The runtime runs
the rounds in one call, so it flushes once per call: the more rounds, the less that costs.
"""

from __future__ import annotations

import math

from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule
from schedc.solvers.families.heuristics import one_f_one_b
from schedc.solvers.registry import one_chunk, register

MIN_ROUNDS = 8  # the first round, six rounds measured in the steady state, the last round


def default_rounds(problem: Problem) -> int:
    """Rounds enough that the steady state measured between the first round's end and the last
    but one's spans at least six rounds and twice the pipeline's depth in microbatches: with
    latency the pattern may repeat only every few rounds (e.g. every five), and the measure is
    their mean."""
    return max(MIN_ROUNDS, 2 + math.ceil(2 * problem.n_stages / problem.microbatches))


def _two_bw_applies(problem: Problem) -> str | None:
    reason = one_chunk(problem)
    if reason:
        return reason
    for section in ("data_parallel", "tied"):
        if getattr(problem, section) is not None:
            return f"asynchronous: its gradient sums would be per round, and {section} gives one per iteration"
    if problem.microbatches < problem.n_stages - 1:
        return (f"needs at least p - 1 = {problem.n_stages - 1} microbatches per step (has {problem.microbatches}):"
                " the first stage's forwards of round r + 2 come after its backwards of round r")
    return None


@register(
    "2bw",
    "PipeDream-2BW: 1F1B without a flush, two weight versions, gradients one step stale (asynchronous)",
    split_backward=False,
    requires=_two_bw_applies,
    synchronous=False,
)
def two_bw(problem: Problem, rounds: int | None = None) -> Schedule:
    rounds = rounds or default_rounds(problem)
    units = range(rounds * problem.microbatches)
    per_rank = []
    for r in range(problem.ranks):
        (s,) = problem.rank_stages[r]
        per_rank.append(one_f_one_b([Op(Kind.F, s, i) for i in units], [Op(Kind.BW, s, i) for i in units],
                                    warmup=problem.n_stages - 1 - s))
    return Schedule.from_lists("2bw", per_rank, rounds=rounds)
