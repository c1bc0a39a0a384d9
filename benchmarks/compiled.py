"""B and W of stages under torch.compile against the same stages uncompiled (docs/runtime.md, "B/W split").

    python benchmarks/compiled.py [--backend inductor] [--d-model 256] [--steps 6]

On CPU, 2 spawned gloo ranks (one stage each), zb-h1 with 4 microbatches, a 2-block GPT from
``schedc.runtime.gpt``. Each rank runs the steps uncompiled, then on a fresh copy of its stage
wrapped in ``torch.compile``; the first two steps of each are warm-up (compilation). Printed:
per rank, the median duration of its B and W instructions over the other steps, from the
runtime's own trace (``trace=True``). A compiled stage whose W does its weight work takes about
as long at W as the uncompiled one; one whose weight gradients were computed in B takes almost
nothing at W. Inductor compiles C++ on first use: expect a minute or two. The machine may be
shared, so durations vary between runs; compare the two columns of one run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

import schedc
from schedc import Problem
from schedc.kinds import Kind
from schedc.runtime import PipelineRuntime
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from schedc.runtime.launch import run_local

WARMUP = 2


def rank_times(rank, world, path, backend, d_model, steps):
    compiled = schedc.load(path)
    (s,) = compiled.problem.rank_stages[rank]
    out = {}
    for how in ("uncompiled", "compiled"):
        stage = stages(gpt_blocks(n_layers=2, d_model=d_model, n_heads=4, seed=1), 2)[s]
        if how == "compiled":
            stage = torch.compile(stage, backend=backend)
        rt = PipelineRuntime(compiled, {s: stage}, lm_loss, trace=True, timeout=600)
        durations = {"B": [], "W": []}
        for i, (x, y) in enumerate(token_batches(steps, 32, seed=2)):
            rt.step(x, y)
            if i >= WARMUP:
                for e in rt.trace_events():
                    if e["op"] in durations:
                        durations[e["op"]].append((e["end"] - e["start"]) * 1e3)
            stage.zero_grad(set_to_none=True)
        out[how] = {op: statistics.median(ms) for op, ms in durations.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    if args.steps <= WARMUP:
        ap.error(f"--steps must be above the {WARMUP} warm-up steps")
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/zb-h1.json"
        schedc.compile(Problem.parse(dict(ranks=2, microbatches=4, costs=dict(F=1, B=1, W=1))), "zb-h1").save(path)
        ranks = run_local(rank_times, 2, path, args.backend, args.d_model, args.steps, timeout=1800)
    print(f"zb-h1, 2 gloo ranks, d_model {args.d_model}, backend {args.backend}: median ms per instruction")
    print("rank  op  uncompiled  compiled")
    for r, times in enumerate(ranks):
        for op in (Kind.B, Kind.W):
            print(f"{r:>4}  {op:>2}  {times['uncompiled'][op]:>10.2f}  {times['compiled'][op]:>8.2f}")


if __name__ == "__main__":
    main()
