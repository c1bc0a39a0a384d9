"""Re-place the weight gradients of a schedule: each rank keeps the order of its other compute ops
and runs a W only when it would otherwise wait, or when memory needs what the W frees (the
zero-bubble idea: W has no consumer, so it fills the bubbles).

``lazy_w`` replays the schedule in time order, all ranks at once, as the simulator does: a free
rank runs its next non-W op as soon as that op's inputs have arrived and memory admits it; else it
runs its oldest pending W (one whose B has run): always where memory is short (the W frees what the
op needs), and while it waits for an input either always (``fill``) or only where the W ends by the
time the input may arrive (else: an input not yet sent may come no sooner than its producer's rank
is free plus the producer's time), so that a W never holds up work that comes back down the
pipeline, as in the zero-bubble cool-down. Whatever W are left run at the end. A non-W op never runs later
for a W it did not need: what runs earlier is never later than in the given order, since W feed
nothing.

No memory deadlock: when the next op is ready but memory does not admit it and no W is pending,
every W whose B has run has run, at least those the given order ran before that op, so the level
is at most the given order's there (which fit). The result is a candidate: the simulator judges it.
Sequence chunks: each op's own cost and memory (``Problem.op_cost``, ``op_delta``) and the chunk rule
(``producers`` with ``Problem.seq_chunks``), as the simulator has them.
"""

from __future__ import annotations

import heapq
import math

from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, producers


def lazy_w(
    problem: Problem, schedule: Schedule, name: str | None = None, fill: bool = True, ranks: set[int] | None = None,
) -> Schedule | None:
    """``schedule`` with its W re-placed (see the module's docstring) on ``ranks`` (None: every
    rank; the others keep their order); None for a schedule with a copy lane or a fused backward
    (nothing to re-place), or one that deadlocks."""
    if schedule.copy or any(op.kind is Kind.BW for ops in schedule.ranks for op in ops):
        return None
    tol, mtol = problem.time_tol, problem.memory_tol
    n, comm, rank_of, cost = problem.pipeline_stages, problem.comm, problem.stage_rank, problem.op_cost
    rooms = problem.activation_room or (math.inf,) * problem.ranks
    where = set(schedule.ops())
    policy = schedule.policies()
    deps = {op: producers(op, n, where, problem.seq_chunks) for op in where}
    plan = [[op for op in ops if op.kind is not Kind.W] if ranks is None or r in ranks else list(ops)
            for r, ops in enumerate(schedule.ranks)]
    pos = [0] * problem.ranks
    pending: list[list[Op]] = [[] for _ in range(problem.ranks)]
    left = [len(ops) for ops in schedule.ranks]
    level = [0.0] * problem.ranks
    out: list[list[Op]] = [[] for _ in range(problem.ranks)]
    finish: dict[Op, float] = {}
    waiters: dict[Op, list[int]] = {}
    clock = [0.0] * problem.ranks
    heap = [(0.0, r) for r in range(problem.ranks)]

    def arrival(op: Op, r: int) -> float:
        t = 0.0
        for d in deps[op]:
            done = finish.get(d)
            if done is None:
                return math.inf
            t = max(t, done + (comm if rank_of[d.stage] != r else 0.0))
        return t

    def soonest(op: Op, r: int, now: float) -> float:
        """When ``op``'s inputs may arrive at the earliest: a producer not yet run ends no earlier
        than its rank is free (or now) plus its own time."""
        t = 0.0
        for d in deps[op]:
            done = finish.get(d)
            if done is None:
                done = max(now, clock[rank_of[d.stage]]) + cost(d.kind, d.stage, d.mb)
            t = max(t, done + (comm if rank_of[d.stage] != r else 0.0))
        return t

    def run(op: Op, r: int, t: float) -> None:
        end = t + cost(op.kind, op.stage, op.mb)
        finish[op] = clock[r] = end
        out[r].append(op)
        left[r] -= 1
        level[r] += problem.op_delta(op.kind, op.stage, op.mb, policy.get((op.stage, op.mb)))
        if op.kind is Kind.B and (ranks is None or r in ranks):
            pending[r].append(Op(Kind.W, op.stage, op.mb))
        heapq.heappush(heap, (end, r))
        for w in waiters.pop(op, ()):
            heapq.heappush(heap, (clock[w], w))

    while heap:
        t, r = heapq.heappop(heap)
        if t != clock[r] or not left[r]:
            continue
        if pos[r] == len(plan[r]):  # only W left
            run(pending[r].pop(0), r, t)
            continue
        op = plan[r][pos[r]]
        due = arrival(op, r)
        d = problem.op_delta(op.kind, op.stage, op.mb, policy.get((op.stage, op.mb)))
        admits = mtol.le(level[r] + max(d, 0.0), rooms[r])
        if tol.le(due, t) and (admits or not pending[r]):
            pos[r] += 1
            run(op, r, t)
        elif pending[r] and (not admits or fill or tol.le(t + cost(*pending[r][0]), soonest(op, r, t))):
            run(pending[r].pop(0), r, t)
        elif due < math.inf:
            clock[r] = due
            heapq.heappush(heap, (due, r))
        else:
            for p in deps[op]:
                if p not in finish:
                    waiters.setdefault(p, []).append(r)
    if any(left):
        return None
    return Schedule.from_lists(name or schedule.name, out)


def held_back(schedule: Schedule, counts: list[int], name: str | None = None) -> Schedule:
    """``schedule`` with, on each rank r, the last ``counts[r]`` W its order runs before its last
    backward moved past that backward (in their order, before what the order ran after it). Where
    a rank's last backward ends a chain that runs down to another rank's last op (rank 0's span
    on the V holds rank p - 1's work up to its last backward and the gradient's way back), each W
    moved past it shortens that chain by its time and holds its memory longer: the memory-aware
    fit decides whether that is affordable (``mixed.held_back_search``). A count above the W
    there moves all of them; a rank without a backward keeps its order."""
    ranks = []
    for r, ops in enumerate(schedule.ranks):
        k = counts[r]
        last = next((x for x in range(len(ops) - 1, -1, -1) if ops[x].kind in (Kind.B, Kind.BW)), None) if k else None
        if last is None:
            ranks.append(ops)
            continue
        ws = [x for x in range(last) if ops[x].kind is Kind.W]
        moved = set(ws[-k:])
        ranks.append((*(op for x, op in enumerate(ops[:last + 1]) if x not in moved),
                      *(ops[x] for x in sorted(moved)), *ops[last + 1:]))
    return Schedule(name or schedule.name, tuple(ranks))  # (the ops as given: Op already)
