"""schedc schedules run by torch.distributed.pipelining's own runtime, ``_PipelineScheduleRuntime``.

For code built on torch's pipelining (torchtitan, or your own ``PipelineStage`` s): a compiled
schedule (``schedc.load`` / ``schedc.compile``, or a Problem and a Schedule) becomes

- ``torch_actions(compiled)``: per rank, torch's ``_Action`` list that its runtime executes:
  compute (F; I and W for a split backward; B for a fused one), the sends and receives
  (SEND_F / RECV_F / SEND_B / RECV_B) and REDUCE_GRAD;
- ``torch_placement(compiled)``: the stage -> rank map (torch's ``stage_index_to_group_rank``),
  loop, V or explicit, which decides which stages each rank must build;
- ``torch_pipeline(compiled, modules, loss_fn)``: this rank's ``_PipelineScheduleRuntime``, ready
  for ``step(inputs, target=..., losses=...)``.

Where the sends and receives come from (``comms=``):

- ``"schedc"`` (default): schedc's own lowered Program (``schedc.lower``): every send right after
  its producer, every receive posted where the Program posts it, an order ``schedc.check`` proves
  free of deadlock (``schedc.interop.torch_comms_rows``; the file form is ``schedc export --format
  torch-comms-csv``, which torch loads with ``_load_csv(path, format="compute_comms")``);
- ``"torch"``: the compute order only, lowered by torch's own passes (``_add_unshard_reshard``,
  ``_add_reduce_grad``, ``_add_send_recv``), what torch does with the compute-only CSV
  (``schedc export --format torch-csv``; ``_load_csv(path)``).

What torch's runtime assumes of a schedule is checked before anything is built
(``schedc.interop.torch_ready``, whose module notes list each assumption), each refusal one line:
no recompute or offload (ops R, S, O, L: torch's IR has no such action), one pipeline, one
synchronous step, whole microbatches, and the last stage's forwards in microbatch order (torch
keeps the losses in the order those run and reads them back by microbatch). Out of that order,
``renumber=True`` runs the same schedule with its microbatches renumbered by it
(``schedc.interop.in_torch_order``), or ``schedc solve --torch`` writes it so; schedc's own
runtime runs any of them.

Either way torch infers the stage -> rank map from the actions; ``torch_pipeline`` checks that it
is the problem's. torch's names used here are private (underscored) and may change between
versions; written against torch 2.13, where a missing one or a schedule torch rejects is a
one-line ``SchedcError`` naming the torch version and the reason.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import schedules as _schedules
from torch.distributed.pipelining import stage as _stage

from schedc.errors import SchedcError
from schedc.interop import torch_comms_rows, torch_ready
from schedc.problem import Problem
from schedc.schedfile import CompiledSchedule
from schedc.schedule import Schedule

COMMS = ("schedc", "torch", "none")


def _torch_names() -> dict[str, Any]:
    """torch's private pipelining names this module uses, or a one-line SchedcError naming the missing one."""
    names = {}
    for module, name in ((_schedules, "_PipelineScheduleRuntime"), (_schedules, "_Action"),
                         (_schedules, "_add_unshard_reshard"), (_schedules, "_add_reduce_grad"),
                         (_schedules, "_add_send_recv"), (_stage, "PipelineStage"), (_stage, "_PipelineStageBase")):
        if not hasattr(module, name):
            raise SchedcError(f"torch {torch.__version__} has no {module.__name__}.{name}: running schedc schedules"
                              " with torch's runtime needs torch 2.13 (pip install torch==2.13.0)")
        names[name] = getattr(module, name)
    return names


def _compiled(compiled: CompiledSchedule | Problem, schedule: Schedule | None, renumber: bool = False) -> CompiledSchedule:
    """The compiled schedule torch's runtime is to run, checked before lowering (``torch_ready``:
    one line, whatever lowering says), its microbatches renumbered with ``renumber``."""
    if isinstance(compiled, Problem):
        if schedule is None:
            raise SchedcError("a Problem needs its Schedule: torch_actions(problem, schedule) or torch_actions(compiled)")
        problem = compiled
    elif schedule is not None:
        raise SchedcError("pass a CompiledSchedule alone, or a Problem and a Schedule")
    elif not isinstance(compiled, CompiledSchedule):
        raise SchedcError(f"expected a CompiledSchedule (schedc.load or schedc.compile), got {type(compiled).__name__}")
    else:
        problem, schedule = compiled.problem, compiled.schedule
    schedule = torch_ready(problem, schedule, renumber)
    if isinstance(compiled, CompiledSchedule) and schedule is compiled.schedule:
        return compiled
    return CompiledSchedule.build(problem, schedule)  # simulated (complete, no deadlock) and lowered


def torch_placement(compiled: CompiledSchedule | Problem) -> dict[int, int]:
    """Stage -> rank, as torch's ``stage_index_to_group_rank``: rank r builds the stages mapped to r."""
    problem = compiled if isinstance(compiled, Problem) else compiled.problem
    return dict(enumerate(problem.stage_rank))


def torch_actions(compiled: CompiledSchedule | Problem, schedule: Schedule | None = None, *,
                  comms: str = "schedc", renumber: bool = False) -> dict[int, list]:
    """Per rank, the ``_Action`` s torch's ``_PipelineScheduleRuntime`` executes for this schedule.

    ``comms="schedc"``: schedc's sends, receives and REDUCE_GRAD (see the module notes);
    ``"torch"``: torch's own lowering of the compute order; ``"none"``: the compute order only
    (the compute-only CSV). A split backward is torch's I then W, a fused one torch's B.
    ``renumber``: see the module notes.
    """
    compiled = _compiled(compiled, schedule, renumber)
    if comms not in COMMS:
        raise SchedcError(f"comms={comms!r} is not one of {', '.join(COMMS)}")
    names = _torch_names()
    action = names["_Action"].from_str
    if comms == "schedc":
        return {r: [action(cell) for cell in row] for r, row in enumerate(torch_comms_rows(compiled.program))}
    compute = {r: [action(op.to_torch()) for op in ops]
               for r, ops in enumerate(compiled.schedule.ranks)}
    if comms == "none":
        return compute
    # torch's lowering of a compute-only order, the passes _prepare_schedule_with_comms runs, in its order
    stage_rank = compiled.problem.stage_rank
    lowered = {r: names["_add_reduce_grad"](names["_add_unshard_reshard"](acts), compiled.problem.microbatches)
               for r, acts in compute.items()}
    try:
        return names["_add_send_recv"](lowered, stage_to_rank=lambda s: stage_rank[s],
                                       num_stages=compiled.problem.n_stages)
    except AssertionError as e:
        raise _rejected(compiled, e) from None


def _rejected(compiled: CompiledSchedule, e: Exception) -> SchedcError:
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    return SchedcError(f"torch {torch.__version__}'s _PipelineScheduleRuntime rejects schedule {compiled.name!r}"
                       f" (placement {compiled.problem.placement}): {first}")


def torch_pipeline(compiled: CompiledSchedule | Problem, modules: Mapping[int, nn.Module], loss_fn: Callable | None = None,
                   *, schedule: Schedule | None = None, comms: str = "schedc", group: dist.ProcessGroup | None = None,
                   device: torch.device | str | None = None, scale_grads: bool = True, renumber: bool = False,
                   **kwargs: Any):
    """This rank's ``torch.distributed.pipelining`` schedule running ``compiled``.

    ``modules`` maps each stage this rank holds (``compiled.problem.rank_stages[rank]``, see
    ``torch_placement``) to its ``nn.Module``, or to a ``PipelineStage`` you built (its stage index
    and number of stages must match); ``device`` defaults to where the modules' parameters are
    (one ``PipelineStage`` per module is built there). The process group (``group``, default the world) must have
    the schedule's ranks. ``loss_fn(output, target)`` is the last stage's loss per microbatch; with
    ``scale_grads`` (default) torch divides the summed gradients by m, which gives the gradients
    of the mean loss over the microbatches, as single-process training on the whole batch with a
    mean loss. ``comms``: see ``torch_actions``; ``renumber``: see the module notes (the losses
    and outputs come back in the inputs' microbatch order either way). Other keyword arguments go to
    ``_PipelineScheduleRuntime`` (e.g. ``args_chunk_spec``). Returns the schedule: call
    ``step(*inputs, target=..., losses=[])`` on every rank (inputs on the first stage's rank, the
    target on the last's), then your optimizer.
    """
    compiled = _compiled(compiled, schedule, renumber)
    problem = compiled.problem
    names = _torch_names()
    if comms not in COMMS or comms == "none":
        raise SchedcError(f"comms={comms!r}: torch's runtime needs sends and receives, use 'schedc' or 'torch'")
    if not dist.is_initialized():
        raise SchedcError("torch_pipeline needs an initialised process group (torchrun, dist.init_process_group)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world != problem.ranks:
        raise SchedcError(f"schedule {compiled.name!r} is for {problem.ranks} ranks, the process group has {world}:"
                          " compile it for this group's size")
    mine = problem.rank_stages[rank]
    if sorted(modules) != list(mine):
        raise SchedcError(f"rank {rank} holds stages {list(mine)} of {compiled.name!r} (placement"
                          f" {problem.placement}), but modules has stages {sorted(modules)}: pass exactly this rank's")
    if device is None:  # where the modules' parameters are (CPU for none)
        params = (q for m in modules.values() if not isinstance(m, names["_PipelineStageBase"]) for q in m.parameters())
        device = next((q.device for q in params), "cpu")
    device = torch.device(device)
    stages = []
    for s in mine:  # ascending: torch's set-up passes metadata between a rank's stages in list order
        mod = modules[s]
        if isinstance(mod, names["_PipelineStageBase"]):
            if (mod.stage_index, mod.num_stages) != (s, problem.n_stages):
                raise SchedcError(f"the PipelineStage given for stage {s} is stage {mod.stage_index} of"
                                  f" {mod.num_stages}; schedule {compiled.name!r} has {problem.n_stages} stages")
            stages.append(mod)
        else:
            stages.append(names["PipelineStage"](mod, s, problem.n_stages, device, group=group))
    runtime = names["_PipelineScheduleRuntime"](stages, n_microbatches=problem.microbatches, loss_fn=loss_fn,
                                                scale_grads=scale_grads, **kwargs)
    runtime.pipeline_order = torch_actions(compiled, comms="none")  # the compute order, as _load_csv keeps it
    try:
        if comms == "torch":
            runtime._prepare_schedule_with_comms(runtime.pipeline_order)
        else:
            runtime._prepare_schedule_with_comms(torch_actions(compiled, comms="schedc"), format="compute_comms")
    except (AssertionError, ValueError, RuntimeError) as e:  # torch's own checks of the actions
        raise _rejected(compiled, e) from None
    if runtime.stage_index_to_group_rank != torch_placement(compiled):
        raise SchedcError(f"torch inferred the stage -> rank map {runtime.stage_index_to_group_rank} from schedule"
                          f" {compiled.name!r}, not its placement {torch_placement(compiled)}")
    return runtime
