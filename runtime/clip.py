"""Gradient-norm clipping and the non-finite check across a pipeline's ranks
(``PipelineRuntime(..., clip_grad_norm=max_norm, clip_mode="sync" | "post")``).

The reference is single-process training with ``torch.nn.utils.clip_grad_norm_`` over every
parameter of the whole model: norm = the 2-norm of all gradients; coef = max_norm / (norm + 1e-6);
if coef < 1 every gradient is multiplied by it; then, if the norm is not finite and
``skip_nonfinite``, the optimizer step is skipped (gradients dropped, parameters and optimizer
state unchanged), else ``optimizer.step()``.

Across ranks: each rank sums the squared norms of its own stages' gradients and an all-reduce
(SUM) over the pipeline's ranks gives the square of the global norm. The all-reduce runs on a
process group of its own (made once, at construction, over the same ranks and backend), so it
never interleaves with the pipeline's point-to-point traffic; with NCCL its tensor stays on the
device, with gloo on the host.

- ``sync``: at STEP (after the sends are flushed) wait for the norm, clip or skip, step. Every
  rank waits for the slowest rank's last gradient: a global barrier before each optimizer step.
- ``post`` (post-validation, as in the zero-bubble paper): at STEP start the all-reduce, keep a
  snapshot of what the step changes, and step at once without waiting. ``check()``, at the start
  of the next ``step()`` and in ``PipelineRuntime.synchronize()``, waits for the norm: if it is
  finite and needs no clipping the snapshot is dropped; otherwise parameters and optimizer state
  are restored and the step is skipped (non-finite) or done again with the saved gradients times
  coef. The result is exactly that of ``sync``. The snapshot costs, from STEP to the check, one
  extra copy of the optimizer's parameters, of their gradients and of the optimizer state
  (Adam: about 4x the parameters' memory in all).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.distributed as dist

MODES = ("sync", "post")


def clip_args_error(max_norm: Any, mode: Any, optimizer: Any) -> str | None:
    """What is wrong with the clipping arguments of ``PipelineRuntime``, in one line, or None."""
    if mode not in MODES:
        return f"clip_mode must be 'sync' or 'post', got {mode!r}"
    if max_norm is None:
        return None
    try:
        value = float(max_norm)
    except (TypeError, ValueError):
        value = None
    if isinstance(max_norm, bool) or value is None or not math.isfinite(value) or value <= 0:
        return f"clip_grad_norm must be a positive finite number (the max norm of all gradients), got {max_norm!r}"
    if optimizer is None:
        return "clip_grad_norm needs the optimizer: pass PipelineRuntime(..., optimizer=opt) so that it clips before it steps"
    return None


class GradClip:
    """One rank's part of global-norm clipping. ``params``: this rank's stage parameters (each
    once); ``device``: where the all-reduce's tensor lives; ``comm``: the runtime's transport,
    which posts the all-reduce and waits for it (``all_reduce(tensor, group, where, what)``,
    ``wait(pending, where)``: deadline, failure polling, errors naming the failed rank)."""

    def __init__(self, params: list[torch.Tensor], optimizer: torch.optim.Optimizer, max_norm: float, mode: str,
                 skip_nonfinite: bool, group: dist.ProcessGroup | None, device: torch.device, comm: Any):
        self.params, self.optimizer = params, optimizer
        self.max_norm, self.mode, self.skip_nonfinite = float(max_norm), mode, bool(skip_nonfinite)
        self.device, self.comm = device, comm
        self.group = _group_like(group)  # collective: every rank of the pipeline constructs one
        self.pending: tuple | None = None  # post: (work, squared norm, snapshot, where) until checked
        self.norm: float | None = None  # of the last checked step
        self.clipped = self.skipped = False

    def step(self, where: Any) -> None:
        """At STEP: reduce the norm and clip or skip then step (sync), or step now and check later (post)."""
        squares = self._local_squares()
        work = self.comm.all_reduce(squares, self.group, where, "the gradient-norm all-reduce")
        if self.mode == "sync":
            self.comm.wait(work, where)
            skip, coef = self._decide(squares)
            if not skip:
                if self.clipped:
                    for p in self.params:
                        if p.grad is not None:
                            p.grad.mul_(coef)
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return
        opt_params = [p for group in self.optimizer.param_groups for p in group["params"]]
        snapshot = (
            opt_params,
            [p.detach().clone() for p in opt_params],
            [None if p.grad is None else p.grad.detach().clone() for p in opt_params],
            copy.deepcopy(self.optimizer.state_dict()),
        )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.pending = (work, squares, snapshot, where)

    def check(self) -> None:
        """post: wait for the last step's norm; roll the step back and skip it or redo it clipped
        if it should have been. Nothing to do in sync mode or when already checked."""
        if self.pending is None:
            return
        work, squares, (opt_params, data, grads, state), where = self.pending
        self.pending = None
        self.comm.wait(work, where)
        skip, coef = self._decide(squares)
        if not (skip or self.clipped):
            return  # the step taken was the right one
        current = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        with torch.no_grad():
            for p, saved in zip(opt_params, data):
                p.copy_(saved)
        self.optimizer.load_state_dict(state)  # the hyper-parameters of that step, too
        if not skip:
            clipped = {id(p) for p in self.params}
            for p, g in zip(opt_params, grads):
                p.grad = g.mul_(coef) if g is not None and id(p) in clipped else g
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for g, hyper in zip(self.optimizer.param_groups, current):  # e.g. a learning rate set since
            g.update(hyper)

    def _local_squares(self) -> torch.Tensor:
        """The sum of this rank's squared gradient norms (float64, on the all-reduce's device)."""
        norms = [torch.linalg.vector_norm(p.grad.detach(), 2) for p in self.params if p.grad is not None]
        if not norms:
            return torch.zeros((), dtype=torch.float64, device=self.device)
        return sum(n.to(device=self.device, dtype=torch.float64) ** 2 for n in norms)

    def _decide(self, squares: torch.Tensor) -> tuple[bool, float]:
        """(skip the step?, clip coefficient at most 1) from the reduced sum of squares, as torch:
        the norm in float32 (inf past its range), coef = max_norm / (norm + 1e-6)."""
        self.norm = float(squares.sqrt().float())
        coef = min(self.max_norm / (self.norm + 1e-6), 1.0)  # 0 for inf, nan for nan, as torch.clamp
        skip = self.skip_nonfinite and not math.isfinite(self.norm)
        self.skipped, self.clipped = skip, not skip and not coef >= 1
        return skip, coef


def _group_like(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """A new process group over the ranks of ``group`` (None: the world), with its backend."""
    backend = dist.get_backend(group)
    if group is None:
        return dist.new_group(backend=backend)
    # Only this pipeline's ranks make it (other pipelines may make theirs at the same time).
    return dist.new_group(dist.get_process_group_ranks(group), backend=backend, use_local_synchronization=True)
