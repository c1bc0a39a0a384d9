"""Train the small GPT of train_gpt.py with a schedc schedule run by torch.distributed.pipelining's
own runtime (``_PipelineScheduleRuntime``) instead of schedc's: profile -> compile -> train.

    schedc profile examples/train_gpt.py:gpt -p 2 -v 2 --placement v -m 8 -o out/gpt-v.yaml
    schedc compile out/gpt-v.yaml -s zb-v -o out/zbv.json
    torchrun --nproc_per_node 2 examples/train_gpt_torch.py out/zbv.json

Each rank builds the stages ``torch_placement`` gives it (here rank 0 stages 0 and 3, rank 1
stages 1 and 2: the V), and ``torch_pipeline`` wraps them in torch's ``PipelineStage`` s and its
runtime, loaded with the schedule's actions: F, I and W (split backward) or B (fused), the
sends and receives (``--comms schedc``: schedc's; ``torch``: torch's own lowering of the compute
order) and REDUCE_GRAD. gloo on CPU, NCCL on GPU. It prints the loss, and the measured iteration
time against the schedule's simulated one.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from train_gpt import BATCH, CONFIG, gpt, iteration_ms  # the model of train_gpt.py, next to this file

import schedc
from schedc.runtime import init_distributed, local_stages, torch_pipeline, torch_placement
from schedc.runtime.gpt import lm_loss, token_batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("schedule", help="schedule file from `schedc solve --torch` or `schedc compile`")
    ap.add_argument("--comms", choices=["schedc", "torch"], default="schedc",
                    help="whose sends and receives torch's runtime runs (default: schedc's)")
    ap.add_argument("--renumber", action="store_true",
                    help="renumber the microbatches in the order the last stage runs their forwards, as torch's runtime"
                         " assumes (the same schedule; for a file `schedc solve` wrote without --torch)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    ap.add_argument("--json", help="write a summary (losses, times) here")
    args = ap.parse_args()

    rank, world, device = init_distributed()

    compiled = schedc.load(args.schedule)
    problem = compiled.problem
    mine = local_stages(compiled, gpt().blocks, device=device)  # the stages torch_placement maps to this rank
    pipe = torch_pipeline(compiled, mine, lm_loss, comms=args.comms, device=device, renumber=args.renumber)
    optimizer = torch.optim.Adam([p for m in mine.values() for p in m.parameters()], lr=args.lr)
    first, last = 0 in mine, problem.n_stages - 1 in mine
    if rank == 0:
        print(f"{compiled.name}: stage -> rank {torch_placement(compiled)}, {problem.microbatches} microbatches;"
              f" rank 0 runs {' '.join(str(a) for a in pipe.pipeline_order_with_comms[0][:8])} ...", flush=True)

    data = token_batches(args.steps, BATCH, seq_len=CONFIG["seq_len"], vocab=CONFIG["vocab"], seed=1)
    losses, times = [], []
    for step, (x, y) in enumerate(data):
        dist.barrier()
        t0 = time.perf_counter()
        mb_losses: list[torch.Tensor] = []
        pipe.step(*([x.to(device)] if first else []), target=y.to(device) if last else None, losses=mb_losses)
        times.append(1e3 * (time.perf_counter() - t0))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if last:
            losses.append(torch.stack(mb_losses).mean().item())  # the mean loss over the microbatches
            if step % 5 == 0 or step == args.steps - 1:
                print(f"step {step:3d}  loss {losses[-1]:.4f}  {times[-1]:.1f} ms", flush=True)

    measured, simulated = iteration_ms(times, args.warmup, device), compiled.timeline.makespan
    if last:
        print(f"{compiled.name} on torch's runtime ({args.comms}'s sends and receives): iteration {measured:.1f} ms"
              f" measured, {simulated:.1f} ms simulated; loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"schedule": compiled.name, "comms": args.comms, "losses": losses, "measured_ms": measured,
                           "simulated_ms": simulated, "ranks": world, "device": str(device)}, f, indent=1)
    dist.barrier()  # nobody tears down while a peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
