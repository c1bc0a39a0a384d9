"""Bringing a model: what ``schedc profile`` takes (``ModelSpec``), how blocks become stages (``cut``,
``stages``), the stages a rank holds under a schedule (``local_stages``) and torchrun's process
group (``init_distributed``). Light on purpose: torch and the core, nothing else of the runtime.

A model is a list of blocks run one after the other: stage s of a pipeline is the next
``sizes[s]`` of them, as an ``nn.Sequential``. A torchtitan or Hugging Face decoder (an embedding,
an ``nn.ModuleList`` of layers, a final norm and an output head) is such a list once the norm and
the head are put in one block: see examples/decoder.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from schedc.errors import SchedcError
from schedc.partition import uniform


@dataclass
class ModelSpec:
    """A model as ``schedc profile`` and the runtime take it (the function that ``schedc profile
    FILE.py:FUNCTION`` names returns one)."""

    blocks: list[nn.Module]
    """The model's blocks in pipeline order: the first takes the batch's inputs, each next one the
    output of the one before (a single tensor), the last returns what ``loss_fn`` takes (the
    logits). Stages are cut between blocks, never inside one: ``cut``, ``stages``."""

    batch: tuple[torch.Tensor, Any]
    """One iteration's ``(inputs, targets)``, whole: the profiler splits it into the problem's
    microbatches along dim 0, as ``PipelineRuntime.step`` splits every batch, so its first
    dimension must be divisible by the microbatch count."""

    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor]
    """``loss_fn(output of the last block, targets)`` -> a scalar, the mean over the microbatch
    (the runtime's loss is the mean of the microbatches' losses). The last stage's F includes it."""

    optimizer_state: float = 2.0
    """Optimizer values kept per parameter, counted in each stage's static memory: 2 for Adam and
    AdamW (two moments), 1 for SGD with momentum, 0 for plain SGD."""

    def __post_init__(self) -> None:
        if isinstance(self.blocks, nn.Module) and not isinstance(self.blocks, (nn.ModuleList, nn.Sequential)):
            raise SchedcError(f"ModelSpec.blocks is one {type(self.blocks).__name__}: give its blocks as a list"
                              " (e.g. [model.embed, *model.layers, nn.Sequential(model.norm, model.head)])")
        self.blocks = list(self.blocks)
        odd = [type(b).__name__ for b in self.blocks if not isinstance(b, nn.Module)]
        if not self.blocks or odd:
            raise SchedcError(f"ModelSpec.blocks must be a non-empty list of nn.Module, got "
                              f"{', '.join(odd) if odd else 'an empty list'}")
        if not (isinstance(self.batch, (tuple, list)) and len(self.batch) == 2):
            raise SchedcError(f"ModelSpec.batch must be (inputs, targets), got {type(self.batch).__name__}")


def cut(blocks: Sequence[nn.Module], sizes: Sequence[int]) -> list[nn.Sequential]:
    """Stage s holds the next ``sizes[s]`` blocks (the problem's ``stage_blocks``), as an
    ``nn.Sequential`` of the blocks themselves (not copies); an empty stage (0) passes its input on."""
    if sum(sizes) != len(blocks) or min(sizes, default=0) < 0:
        raise ValueError(f"cannot cut {len(blocks)} blocks into stages of {list(sizes)} blocks")
    out, i = [], 0
    for k in sizes:
        out.append(nn.Sequential(*blocks[i:i + k]))
        i += k
    return out


def stages(blocks: Sequence[nn.Module], n: int) -> list[nn.Sequential]:
    """``n`` contiguous stages with block counts as equal as possible (the first ones get the extra)."""
    return cut(blocks, uniform(len(blocks), n))


def local_stages(compiled, blocks: Sequence[nn.Module], rank: int | None = None,
                 device: torch.device | str | None = None) -> dict[int, nn.Module]:
    """The stages pipeline rank ``rank`` (default: this process's rank in the default group)
    holds under ``compiled`` (``schedc.load(path)``), by stage id, cut as its problem says
    (``stage_blocks``, which ``schedc profile`` writes; uniform where it has none) and moved to
    ``device``: what ``PipelineRuntime`` takes. Every rank must build the same blocks (same seed).
    With replicas (two pipelines), stage s is model stage s % L: the copies on other ranks are
    the same blocks built there, equal at the start."""
    problem = compiled.problem
    length = problem.pipeline_stages
    if rank is None:
        if not dist.is_initialized():
            raise SchedcError("local_stages: no process group: call init_distributed() first, or pass rank=")
        rank = dist.get_rank()
    if not 0 <= rank < problem.ranks:
        raise SchedcError(f"local_stages: rank {rank}, but the schedule {compiled.name!r} has {problem.ranks}"
                          f" ranks: start {problem.ranks} processes (torchrun --nproc_per_node {problem.ranks}),"
                          " or pass each process's pipeline rank as rank=")
    if problem.stage_blocks is None and len(blocks) < length:  # (a cut may leave a stage empty; uniform does not)
        raise SchedcError(f"local_stages: cannot cut {len(blocks)} blocks into {length} stages: use fewer ranks"
                          " or chunks, or a model with more blocks")
    sizes = problem.stage_blocks or uniform(len(blocks), length)
    if sum(sizes) != len(blocks):
        raise SchedcError(f"local_stages: the schedule {compiled.name!r} cuts {sum(sizes)} blocks (stage_blocks"
                          f" {list(sizes)}) but the model has {len(blocks)}: profile this model again")
    parts = cut(blocks, sizes)  # (a rank holds at most one copy of each model stage: the Problem checks it)
    return {s: parts[s % length] if device is None else parts[s % length].to(device) for s in problem.rank_stages[rank]}


def init_distributed() -> tuple[int, int, torch.device]:
    """torchrun's process group (env://): NCCL with one GPU per rank (``LOCAL_RANK``) where CUDA is,
    else gloo on CPU with the cores shared among the ranks. Returns (rank, world size, device)."""
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    return rank, world, device
