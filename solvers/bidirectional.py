"""Schedules of problems with replicas: pipelines running in opposite directions on the same ranks.

With ``replicas: 2`` a rank holds stage r of one direction and stage p - 1 - r of the other
(Chimera, DualPipe), and each pipeline runs the problem's microbatches. ``chimera`` is Chimera's
schedule (Li and Hoefler, SC'21): each direction runs 1F1B (a stage at position j of its chain
keeps at most L - j microbatches in flight, L stages per pipeline), and a rank fills the idle time
of one direction with the other's work. It is built by list scheduling on the problem's costs:
whenever a rank is free it runs, of the ops whose inputs have arrived, a backward first (the one
whose input came first), else a forward the in-flight limit allows (the earliest ready), so the
two 1F1B pipelines interleave as Chimera's figure shows: on uniform costs with F equal to the
fused backward, D stages and D microbatches in all, each rank idles D - 2 forward times against
1F1B's 2 (D - 1) (tests/test_bidirectional.py checks the published figure). With a split
backward (``bidir-zb``), each W waits until its rank has nothing else ready, as in the
zero-bubble schedules.
"""

from __future__ import annotations

from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, producers
from schedc.solvers.registry import any_placement, register


def list_scheduled(problem: Problem, name: str, split: bool) -> Schedule:
    """Both directions' 1F1B, interleaved by list scheduling on the problem's costs (see the module
    notes): backwards first, forwards within each stage's 1F1B in-flight limit, and (``split``)
    the weight gradients W only where nothing else is ready."""
    depth, m, comm = problem.pipeline_stages, problem.microbatches, problem.comm
    cost, rank_of, tol = problem.cost, problem.stage_rank, problem.time_tol
    back = Kind.B if split else Kind.BW
    last = Kind.W if split else Kind.BW  # what ends a microbatch's stay on a stage (and frees its activation)
    kinds = (Kind.F, back, Kind.W) if split else (Kind.F, back)
    todo = {r: {Op(k, s, i) for s in stages for i in range(m) for k in kinds} for r, stages in enumerate(problem.rank_stages)}
    present = {op for ops in todo.values() for op in ops}  # (so that a BW needs the BW after it, not a B)
    end: dict[Op, float] = {}
    in_flight = [0] * problem.n_stages  # per stage: forwarded, weight gradient not yet run
    limit = [depth - s % depth for s in range(problem.n_stages)]  # 1F1B's warm-up plus one
    order: list[list[Op]] = [[] for _ in range(problem.ranks)]
    free = [0.0] * problem.ranks  # when each rank is free
    t = 0.0
    while any(todo.values()):
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
                    deps = producers(op, depth, present)
                    if any(d not in end for d in deps):
                        continue
                    if op.kind is Kind.F and in_flight[op.stage] >= limit[op.stage]:
                        continue
                    at = max([end[d] + (comm if rank_of[d.stage] != r else 0.0) for d in deps], default=0.0)
                    ready.append((at, 0 if op.kind is Kind.F else (1 if op.kind is back else 2), op.mb, op.stage, op))
                now = [x for x in ready if tol.le(x[0], t)]
                if not now:
                    upcoming += [x[0] for x in ready]
                    continue
                # forwards first, the deeper in its pipeline first, the earlier microbatch first
                op = min(now, key=lambda x: (x[1], -(x[3] % depth), x[2], x[3]))[-1]
                todo[r].discard(op)
                order[r].append(op)
                end[op] = free[r] = t + cost[op.kind][op.stage]
                in_flight[op.stage] += 1 if op.kind is Kind.F else (-1 if op.kind is last else 0)
                moved = True
        later = [u for u in upcoming if tol.gt(u, t)]
        if not later and any(todo.values()):
            raise RuntimeError(f"{name}: ops left that can never start")  # (a bug, not a problem's)
        t = min(later, default=t)
    return Schedule.from_lists(name, order)


@register("chimera", "two pipelines in opposite directions, 1F1B each, interleaved (Chimera, fused B+W)",
          split_backward=False, requires=any_placement, bidirectional=True)
def chimera(problem: Problem) -> Schedule:
    return list_scheduled(problem, "chimera", split=False)


@register("bidir-zb", "two pipelines in opposite directions, 1F1B each with B and W split, W in the idle time",
          split_backward=True, requires=any_placement, bidirectional=True)
def bidirectional_zero_bubble(problem: Problem) -> Schedule:
    return list_scheduled(problem, "bidir-zb", split=True)
