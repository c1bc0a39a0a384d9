"""Sequence-level pipelining (Seq1F1B, Sun et al. 2024; issue 27): each microbatch's sequence cut
into k chunks (``Problem.sequence_chunks``) that flow through the pipeline one after another.

A chunk's forward on a stage needs the earlier chunks' keys and values there, and its backward
gives the earlier chunks the gradient of theirs, so on each stage the forwards of a sequence run
in chunk order and the backwards in reverse (the dependency rule, ``KindRow.chunk_needs``). An
op's microbatch is ``sequence * k + chunk``.

``seq1f1b`` is 1F1B over chunks: stage s runs p - 1 - s + (k - 1) warm-up chunk forwards (the
last stage must run a sequence's every chunk forward before its last chunk's backward, the first
backward the sequence allows), then one chunk forward and one chunk backward, forwards in chunk
order and backwards sequence by sequence, last chunk first. A stage then holds about
(p - 1 - s + k) chunks' activations against 1F1B's p - s sequences', and the pipeline fills with
pieces 1/k the size. ``seq1f1b-zb`` splits each backward into B and W and defers W as ZB-H1 does,
into the cool-down.
"""

from __future__ import annotations

from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule
from schedc.solvers.families.heuristics import defer_w, one_f_one_b
from schedc.solvers.registry import one_chunk, register


def _backward_order(problem: Problem) -> list[int]:
    """The chunks' units in backward order: sequence by sequence, each last chunk first."""
    k = problem.seq_chunks
    return [i * k + c for i in range(problem.microbatches) for c in reversed(range(k))]


def _seq1f1b(problem: Problem, name: str, backward: Kind) -> Schedule:
    k, last = problem.seq_chunks, problem.n_stages - 1
    per_rank = []
    for r in range(problem.ranks):
        (s,) = problem.rank_stages[r]
        forwards = [Op(Kind.F, s, u) for u in range(problem.units)]
        backwards = [Op(backward, s, u) for u in _backward_order(problem)]
        ops = one_f_one_b(forwards, backwards, warmup=last - s + k - 1)
        per_rank.append(defer_w(ops, delay=s) if backward is Kind.B else ops)
    return Schedule.from_lists(name, per_rank)


@register(
    "seq1f1b",
    "Seq1F1B: 1F1B over sequence chunks (forwards in chunk order, backwards in reverse); about (p-s-1+k)/k"
    " sequences' activations",
    split_backward=False,
    requires=one_chunk,
    sequence=True,
)
def seq1f1b(problem: Problem) -> Schedule:
    return _seq1f1b(problem, "seq1f1b", Kind.BW)


@register(
    "seq1f1b-zb",
    "Seq1F1B with B and W split, W deferred into the cool-down as ZB-H1 does",
    split_backward=True,
    requires=one_chunk,
    sequence=True,
)
def seq1f1b_zb(problem: Problem) -> Schedule:
    return _seq1f1b(problem, "seq1f1b-zb", Kind.B)
