"""Tensors of torch's tensor parallelism as the runtime and the profiler meet them, without importing
torch.distributed.tensor (a second's import): they are looked up in ``sys.modules``, and where torch's
tensor parallelism was never imported no such tensor exists.

- ``is_dtensor``: a DTensor (a tensor-parallel parameter, its gradient, an intermediate tensor).
- ``local``: what this rank holds of a tensor: a DTensor's local shard, the values an
  ``AsyncCollectiveTensor`` wraps, any other tensor itself. A DTensor's own ``numel`` and
  ``untyped_storage`` describe the whole (global) tensor, which no rank holds.
- ``waited``: a stage's output with its collective waited for (torch's ``RowwiseParallel`` returns an
  ``AsyncCollectiveTensor`` whose all-reduce may still be in flight), as a plain tensor;
  ``refused_output``: the line that refuses a stage returning a DTensor.
"""

from __future__ import annotations

import sys

import torch


def is_dtensor(t) -> bool:
    """Is ``t`` a torch DTensor? Without torch.distributed.tensor imported there is none."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def _async_collective(t) -> bool:
    collectives = sys.modules.get("torch.distributed._functional_collectives")
    return collectives is not None and isinstance(t, collectives.AsyncCollectiveTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``t``: a DTensor's local shard (a view: writing into it writes into the
    DTensor), an ``AsyncCollectiveTensor``'s inner tensor, else ``t``."""
    if is_dtensor(t):
        return t.to_local()
    if _async_collective(t):
        return t.elem
    return t


def local_bytes(t: torch.Tensor) -> int:
    """Bytes of what this rank holds of ``t`` (its elements, not its storage)."""
    t = local(t)
    return t.numel() * t.element_size()


def waited(y):
    """``y`` with its pending collective waited for, where it is an ``AsyncCollectiveTensor`` (a plain
    tensor, differentiable: its gradient passes through unchanged); anything else as it is."""
    if _async_collective(y):
        return sys.modules["torch.distributed._functional_collectives"].wait_tensor(y)
    return y


def refused_output(s: int, y) -> str:
    """Why stage ``s``'s DTensor output ``y`` is refused, and what to do: its local shard is not the
    activation the next stage expects (the runtime and the profiler say the same)."""
    return (f"stage {s} returned a DTensor ({y.placements}); a stage must return a plain tensor: keep"
            " use_local_output=True on its last tensor-parallel layer (torch's default), or return"
            " y.full_tensor()")
