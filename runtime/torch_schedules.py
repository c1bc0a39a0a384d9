"""torch.distributed.pipelining's own schedules as schedc Schedules, judged by our simulator.

In the runtime layer because it imports torch (its private schedule visualizer); the CSV format
is in ``schedc.interop``, without torch.
"""

from __future__ import annotations

from schedc.errors import SchedcError
from schedc.interop import FROM_TORCH, NO_COMPUTE
from schedc.problem import Problem
from schedc.schedule import Op, Schedule

TORCH_SCHEDULES = {
    "GPipe": "loop",
    "1F1B": "loop",
    "Interleaved1F1B": "loop",
    "LoopedBFS": "loop",
    "InterleavedZeroBubble": "loop",
    "ZBVZeroBubble": "v",
    "DualPipeV": "v",
}
_STYLE = {"loop": "loop-style (stage s on rank s mod p)", "v": "in a V (rank r holds stages r and 2p-1-r)"}


def torch_schedules(problem: Problem) -> list[tuple[str, Schedule | None, str | None]]:
    """torch's schedules for this problem's p, m and v: ``(name, schedule, None)`` where one applies,
    ``(name, None, why not)`` where not. Names are "torch:" plus torch's name.

    torch has no public call that gives a schedule's order without a process group; its own
    schedule visualizer builds each schedule class on mocked stages (``get_schedule_ops``) and we
    use that. It builds GPipe and 1F1B with one stage per rank, the others with two or more.
    torch's own constraints (e.g. DualPipeV needs m >= 2p) become the reason, as does a placement
    other than torch's. The orders are torch's as they are; what we found in torch 2.13, p=4 m=8:
    GPipe and Interleaved1F1B (m a multiple of p) are ours op for op; LoopedBFS runs each stage's
    backwards from the last microbatch down (ours ascend); 1F1B's order (not the one its runtime
    runs) numbers the last rank's forwards 1..m, so our simulator rejects it as incomplete.
    """
    try:  # torch's private module, imported when asked for: an install without it says so
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
        from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    except ImportError:
        raise SchedcError("--torch needs torch installed (pip install torch==2.13.0)") from None
    out: list[tuple[str, Schedule | None, str | None]] = []
    for name, style in TORCH_SCHEDULES.items():
        label, schedule, reason = f"torch:{name}", None, None
        single = issubclass(get_schedule_class(name), PipelineScheduleSingle)
        if single and problem.chunks != 1:
            reason = f"torch's {name} runs one stage per rank (chunks is {problem.chunks})"
        elif not single and problem.chunks < 2:
            reason = f"torch builds {name} only with 2 or more chunks per rank"
        else:
            try:
                order = get_schedule_ops(name, problem.ranks, problem.microbatches, problem.chunks)
            except (ValueError, AssertionError, RuntimeError) as e:  # torch's own constraints
                reason = f"torch: {str(e).strip().splitlines()[0]}"
            else:
                schedule = Schedule.from_lists(label, ([op for a in row for op in _compute_ops(a)] for row in order))
                placed = {op.stage: r for r, ops in enumerate(schedule.ranks) for op in ops}
                if tuple(placed.get(s) for s in range(problem.n_stages)) != problem.stage_rank:
                    schedule, reason = None, f"torch places stages {_STYLE[style]}, unlike this problem"
        out.append((label, schedule, reason))
    return out


def _compute_ops(action) -> list[Op]:
    """A torch ``_Action`` (or None, an idle step) as our ops: see from_torch_csv for the rules."""
    if action is None:
        return []
    if action.sub_actions:  # OVERLAP_F_B
        return [op for sub in action.sub_actions for op in _compute_ops(sub)]
    kind = action.computation_type.value
    if kind in NO_COMPUTE:
        return []
    if kind not in FROM_TORCH:
        raise SchedcError(f"torch action {action} is unknown to schedc")
    return [Op(FROM_TORCH[kind], action.stage_index, action.microbatch_index)]
