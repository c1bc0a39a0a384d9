"""Every registry schedule run by torch.distributed.pipelining's runtime, checked against one process.

    python benchmarks/torch_runtime.py            # print the table
    python benchmarks/torch_runtime.py --write    # and write it to benchmarks/RESULTS.md

For p = 2 and 4 gloo ranks on CPU and each placement (loop with 1 and 2 stages per rank, V,
explicit ones), every registry schedule that applies is compiled for m = 2p microbatches and run
for one step of a small GPT (``schedc.runtime.gpt``) three ways: schedc's ``PipelineRuntime``,
and torch's ``_PipelineScheduleRuntime`` through ``schedc.runtime.torch_pipeline`` with schedc's
sends and receives (``comms="schedc"``) and with torch's own lowering of the compute order
(``comms="torch"``, what torch does with the compute-only CSV). Each run's gradients are
compared with single-process training on the same batch (mean loss over the microbatches): the
table gives the largest difference relative to the largest gradient, over all parameters, per
runtime. A schedule torch refuses is listed with torch's reason.
"""

from __future__ import annotations

import argparse
import tempfile
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, write_section  # noqa: E402 - benchmarks/ is not a package

import schedc  # noqa: E402
import schedc.solvers as solvers  # noqa: E402
from schedc import Problem, SchedcError  # noqa: E402
from schedc.runtime import PipelineRuntime, torch_pipeline  # noqa: E402
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches  # noqa: E402
from schedc.runtime.launch import run_local  # noqa: E402

CONFIGS = [  # (p, v, placement, label)
    (2, 1, "loop", "loop v=1"),
    (2, 2, "loop", "loop v=2"),
    (2, 2, "v", "V v=2"),
    (2, 2, [[0, 1], [2, 3]], "explicit [[0,1],[2,3]]"),
    (4, 1, "loop", "loop v=1"),
    (4, 2, "loop", "loop v=2"),
    (4, 2, "v", "V v=2"),
    (4, 2, [[0, 1], [2, 3], [4, 5], [6, 7]], "explicit contiguous"),
    (4, 2, [[0, 5], [1, 4], [2, 7], [3, 6]], "explicit [[0,5],[1,4],[2,7],[3,6]]"),
]
RUNS = ("ours", "torch-schedc", "torch-torch")


def problem(p: int, v: int, placement) -> Problem:
    n = p * v
    costs = dict(F=[1 + 0.25 * (s % 3) for s in range(n)], B=[1.5 + 0.5 * (s == n - 1) for s in range(n)], W=1)
    return Problem.parse(dict(ranks=p, microbatches=2 * p, chunks=v, placement=placement, costs=costs, comm=0.1))


def model(n_stages: int):
    return stages(gpt_blocks(n_layers=max(1, n_stages - 2), seed=1), n_stages)


def batch(m: int):
    return token_batches(1, 2 * m, seed=2)[0]


def grads(mods) -> dict[str, torch.Tensor]:
    return {f"{s}.{k}": q.grad.detach().clone() for s, mod in mods.items() for k, q in mod.named_parameters()}


def rank_main(rank: int, world: int, paths: list[str]) -> dict:
    out = {}
    for path in paths:
        compiled = schedc.load(path)
        prob = compiled.problem
        x, y = batch(prob.microbatches)
        last = prob.n_stages - 1 in prob.rank_stages[rank]
        for run in RUNS:
            mods = {s: mod for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[rank]}
            try:
                if run == "ours":
                    PipelineRuntime(compiled, mods, lm_loss, timeout=120).step(x, y)
                else:
                    pipe = torch_pipeline(compiled, mods, lm_loss, comms=run.removeprefix("torch-"))
                    pipe.step(*([x] if 0 in mods else []), target=y if last else None, losses=[])
            except SchedcError as e:  # torch refused it: the same on every rank, before any transfer
                out[f"{path}/{run}"] = str(e)
                continue
            out[f"{path}/{run}"] = grads(mods)
    return out


def reference(n_stages: int, m: int) -> dict[str, torch.Tensor]:
    parts = model(n_stages)
    x, y = batch(m)
    net = torch.nn.Sequential(*parts)
    torch.stack([lm_loss(net(a), b) for a, b in zip(x.chunk(m), y.chunk(m))]).mean().backward()
    return grads(dict(enumerate(parts)))


def rel_diff(got: dict, ref: dict) -> float:
    assert got.keys() == ref.keys()
    num = max(float((got[k] - ref[k]).abs().max()) for k in ref)
    return num / max(float(t.abs().max()) for t in ref.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write the table to benchmarks/RESULTS.md")
    args = ap.parse_args()

    rows, worst, refused, total = [], 0.0, 0, 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="schedc-torchrt-") as tmp:
        for p, v, placement, label in CONFIGS:
            prob = problem(p, v, placement)
            names = [name for name, spec in solvers.REGISTRY.items() if spec.why_not(prob) is None]
            paths = []
            for name in names:
                path = f"{tmp}/p{p}-{label.replace(' ', '_')}-{name}.json"
                schedc.compile(prob, name).save(path)
                paths.append(path)
            ranks = run_local(rank_main, p, paths, timeout=600, threads=1)
            ref = reference(prob.n_stages, prob.microbatches)
            for name, path in zip(names, paths):
                cells = []
                for run in RUNS:
                    got = [r[f"{path}/{run}"] for r in ranks]
                    if isinstance(got[0], str):
                        cells.append(f"refused: {got[0]}")
                        refused += 1
                        continue
                    d = rel_diff({k: t for g in got for k, t in g.items()}, ref)
                    worst = max(worst, d)
                    cells.append(f"{d:.1e}")
                total += 1
                rows.append(f"| {p} | {label} | {name} | " + " | ".join(cells) + " |")
            print(f"p={p} {label}: {len(names)} schedules", flush=True)
    wall = time.perf_counter() - t0
    body = "\n".join([
        "## torch's runtime runs every registry schedule",
        "",
        "Command: `python benchmarks/torch_runtime.py --write`  ",
        f"Machine: {machine()}, torch {torch.__version__}, gloo, 1 torch thread per rank; {wall:.0f} s in all  ",
        "One step of a small GPT (`schedc.runtime.gpt`, one block per stage plus embedding and head), m = 2p;"
        " each cell: the largest gradient difference against single-process training, relative to the largest"
        " gradient (schedc's runtime; torch's `_PipelineScheduleRuntime` via `schedc.runtime.torch_pipeline` with"
        " schedc's sends and receives, and with torch's own lowering of the compute order).",
        "",
        "| p | placement | schedule | schedc's runtime | torch, schedc's comms | torch, torch's lowering |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"{total} schedules, {3 * total - refused} runs, {refused} refused by torch; largest relative difference"
        f" {worst:.1e}.",
    ])
    print(body)
    if args.write:
        write_section("torch-runtime", body)


if __name__ == "__main__":
    main()
