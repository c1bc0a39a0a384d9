"""Test helper: a schedule with recompute / offload put into a plain one, op by op.

``with_policies(problem, schedule, chosen)`` takes a schedule without policy ops and a mapping
(stage, microbatch) -> R, S or O, and returns the schedule that recomputes (R, S just before the
backward of that (stage, microbatch) on its compute lane) or offloads (O after its forward, L
before its backward, on the rank's copy lane, in the order of what they serve on the compute lane).
The result is complete and free of deadlock whenever the plain schedule is (every copy op waits
only for compute ops earlier in its rank's order, and is listed in that order).
"""

from __future__ import annotations

from schedc.kinds import BACKWARDS, Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule


def with_policies(problem: Problem, schedule: Schedule, chosen: dict[tuple[int, int], Kind | str],
                  name: str | None = None) -> Schedule:
    chosen = {key: Kind(k) for key, k in chosen.items()}
    compute, copy = [], []
    for ops in schedule.ranks:
        lane: list[Op] = []
        copies: list[tuple[float, Op]] = []
        for op in ops:
            policy = chosen.get((op.stage, op.mb))
            if op.kind in BACKWARDS and policy in (Kind.R, Kind.S):
                lane.append(Op(policy, op.stage, op.mb))
            if op.kind in BACKWARDS and policy is Kind.O:
                copies.append((len(lane) - 0.5, Op(Kind.L, op.stage, op.mb)))
            lane.append(op)
            if op.kind is Kind.F and policy is Kind.O:
                copies.append((len(lane) - 0.5, Op(Kind.O, op.stage, op.mb)))
        compute.append(tuple(lane))
        copy.append(tuple(op for _, op in sorted(copies, key=lambda x: x[0])))
    return Schedule(name or schedule.name, tuple(compute), tuple(copy))
