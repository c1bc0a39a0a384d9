"""Train a small GPT with a compiled pipeline schedule: profile -> solve -> train.

    schedc profile examples/train_gpt.py:gpt -p 2 -m 8 -o out/gpt.yaml    # measure this machine
    schedc solve out/gpt.yaml -o out/gpt.json                               # the schedule file
    torchrun --nproc_per_node 2 examples/train_gpt.py out/gpt.json          # train with it

or, with the layer split, chunks and placement chosen too (docs/plan.md):

    schedc profile examples/train_gpt.py:gpt -p 2 -m 8 --layers -o out/gpt-layers.yaml
    schedc plan out/gpt-layers.yaml -o out/gpt-plan.json
    torchrun --nproc_per_node 2 examples/train_gpt.py out/gpt-plan.json

``gpt()`` is the model as the profiler takes it (blocks, a batch, the loss). Under torchrun each
rank builds the same model (same seed), cuts it as the schedule's problem says (``stage_blocks``),
keeps its own stages and trains them with ``PipelineRuntime``: gloo on CPU, NCCL on GPU (one
GPU per rank, ``LOCAL_RANK``), no code change between them. The data is generated: sequences that
count upward from a random start with a random stride (mod the vocabulary), a language the model
learns in a few dozen steps. It prints the loss, and the measured iteration time against the
schedule's simulated one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import schedc
from schedc.runtime import ModelSpec, PipelineRuntime, init_distributed, local_stages
from schedc.runtime.gpt import gpt_blocks, lm_loss, token_batches

CONFIG = dict(vocab=256, d_model=192, n_layers=8, n_heads=4, seq_len=64)
BATCH = 32  # sequences per iteration, split into the schedule's microbatches


def gpt() -> ModelSpec:
    """The model for `schedc profile examples/train_gpt.py:gpt`."""
    (batch,) = token_batches(1, BATCH, seq_len=CONFIG["seq_len"], vocab=CONFIG["vocab"], seed=0)
    return ModelSpec(blocks=gpt_blocks(**CONFIG, seed=0), batch=batch, loss_fn=lm_loss, optimizer_state=2.0)


def iteration_ms(times: list[float], warmup: int, device: torch.device) -> float:
    """The iteration time: the slowest rank's median step after warm-up (every rank calls it)."""
    mine = torch.tensor(statistics.median(times[warmup:] or times), device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return mine.item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("schedule", help="schedule file from `schedc solve` or `schedc compile`")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    ap.add_argument("--trace", help="write the last step's trace here (Perfetto; `schedc show --measured`)")
    ap.add_argument("--json", help="write a summary (losses, times) here")
    args = ap.parse_args()

    rank, world, device = init_distributed()

    compiled = schedc.load(args.schedule)
    problem = compiled.problem
    mine = local_stages(compiled, gpt().blocks, device=device)  # cut as the problem's stage_blocks say
    optimizer = torch.optim.Adam([p for m in mine.values() for p in m.parameters()], lr=args.lr)
    rt = PipelineRuntime(compiled, mine, lm_loss, device=device, trace=bool(args.trace))
    last = any(s % problem.pipeline_stages == problem.pipeline_stages - 1 for s in mine)

    data = token_batches(args.steps, BATCH, seq_len=CONFIG["seq_len"], vocab=CONFIG["vocab"], seed=1)
    losses, times = [], []
    for step, (x, y) in enumerate(data):
        dist.barrier()
        t0 = time.perf_counter()
        loss = rt.step(x, y)
        times.append(1e3 * (time.perf_counter() - t0))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if last:
            losses.append(loss.item())
            if step % 5 == 0 or step == args.steps - 1:
                print(f"step {step:3d}  loss {loss.item():.4f}  {times[-1]:.1f} ms", flush=True)
    if args.trace:
        rt.save_trace(args.trace)

    measured, simulated = iteration_ms(times, args.warmup, device), compiled.timeline.makespan
    if last:
        print(f"{compiled.name}: iteration {measured:.1f} ms measured, {simulated:.1f} ms simulated"
              f" ({100 * (measured / simulated - 1):+.1f}%); loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"schedule": compiled.name, "losses": losses, "measured_ms": measured,
                           "simulated_ms": simulated, "ranks": world, "device": str(device)}, f, indent=1)
    dist.barrier()  # nobody tears down while a peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
