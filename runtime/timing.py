"""Timing schedule files with the runtime on local processes (``schedc ablate``'s ``execute:``)."""

from __future__ import annotations

import statistics
import time

import torch.distributed as dist

from schedc.runtime.interpreter import PipelineRuntime
from schedc.runtime.launch import run_local
from schedc.runtime.model import local_stages
from schedc.runtime.profile import load_model_spec
from schedc.schedfile import load


def time_schedules(ranks: int, model_ref: str, paths: list[str], steps: int, warmup: int,
                   timeout: float = 3600.0) -> list[dict[str, float]]:
    """Train the model ``model_ref`` (FILE.py:FUNCTION) with each schedule file in turn on
    ``ranks`` local gloo processes; per rank, path -> the median step time in ms after ``warmup``."""
    return run_local(_time_on_rank, ranks, model_ref, paths, steps, warmup, timeout=timeout)


def _time_on_rank(rank: int, world: int, model_ref: str, paths: list[str], steps: int, warmup: int) -> dict:
    out = {}
    for path in paths:
        compiled = load(path)
        model = load_model_spec(model_ref)
        mine = local_stages(compiled, model.blocks, rank)
        rt = PipelineRuntime(compiled, mine, model.loss_fn)
        inputs, targets = model.batch
        times = []
        for _ in range(steps):
            dist.barrier()
            t0 = time.perf_counter()
            rt.step(inputs, targets)
            times.append(1e3 * (time.perf_counter() - t0))
            for m in mine.values():
                m.zero_grad(set_to_none=True)
        out[path] = statistics.median(times[warmup:] or times)
    return out
