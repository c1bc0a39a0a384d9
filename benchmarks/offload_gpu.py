"""Offload and recompute on one GPU: measured step time and device memory against the simulator.

    python benchmarks/offload_gpu.py [--json FILE] [--steps N]     # on a machine with CUDA
    python benchmarks/offload_gpu.py --from FILE [--write]         # a run's table (into RESULTS.md)

One rank holds the whole model (one stage, p = 1), so nothing runs beside its compute but its copy
lane, and the question is only whether the runtime's copies (pinned host buffers, a side stream
that waits for the compute op each copy is issued after) overlap the compute as the simulator
says. A GPT is profiled on the GPU (``profile_stages(..., device="cuda")``, with the recompute and
offload sections: ``make_problem(..., policies=True)``); GPipe's order (every forward, then every
backward) over m microbatches holds m activations at its peak. Beside it, the same order with the
offloads its copy lane hides (``memtime.hidden_offloads``: each reload issued just in time for its
backward) and with every microbatch recomputed. Each runs ``--steps`` timed steps (the first warms
up) and one more that measures memory; measured: the median step time (the GPU synchronised
around each step, the runtime untraced) and the device memory peak of the extra step
(``measure_memory``, the CUDA allocator's counters, untraced too: a trace synchronises the GPU
after every instruction); simulated: the makespan and the peak activation for the profiled costs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_section  # noqa: E402

CFG = dict(vocab=256, d_model=1024, n_layers=8, n_heads=4, seq_len=128)
MB_SIZE, MICROBATCHES = 16, 8  # sequences per microbatch, microbatches per step
COMMAND = "python benchmarks/offload_gpu.py --json FILE; python benchmarks/offload_gpu.py --from FILE --write"


def schedules(problem):
    """name -> the compiled schedule of each case."""
    import schedc.solvers as solvers
    from schedc.kinds import Kind
    from schedc.schedfile import CompiledSchedule
    from schedc.solvers.families.memtime import everywhere, hidden_offloads, with_policies

    base = solvers.build("gpipe", problem)
    return {
        "gpipe": CompiledSchedule.build(problem, base),
        "gpipe+offload": CompiledSchedule.build(problem, hidden_offloads(problem, base, "gpipe+offload")),
        "gpipe+recompute": CompiledSchedule.build(
            problem, with_policies(problem, base, everywhere(problem, Kind.R), "gpipe+recompute")),
    }


def rank_main(rank, world, compiled_list, steps):
    """Each schedule for ``steps`` steps on this (only) rank: step times (ms), the last step's peak (MiB)."""
    import torch

    from schedc.runtime import PipelineRuntime
    from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
    from schedc.runtime.profile import MiB

    out = {}
    for compiled in compiled_list:
        mods = stages(gpt_blocks(**CFG, seed=0), 1)
        mine = {0: mods[0].to("cuda")}
        opt = torch.optim.SGD(mine[0].parameters(), lr=1e-4)
        rt = PipelineRuntime(compiled, mine, lm_loss, optimizer=opt, device="cuda", measure_memory=True, timeout=600)
        times = []
        batches = token_batches(steps + 1, MB_SIZE * MICROBATCHES, CFG["seq_len"], CFG["vocab"])
        for i, (x, y) in enumerate(batches):
            # never traced: a trace synchronises the GPU after every instruction, which would stop
            # the copies overlapping compute (and free an offload's memory at its instruction);
            # the timed steps unmeasured, the last step measures (the allocator's counters)
            rt.trace_enabled, rt.measure_memory = False, i == steps
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            rt.step(x, y)
            torch.cuda.synchronize()
            if i < steps:
                times.append((time.perf_counter() - t0) * 1e3)
        peak = max(pk for _, pk in rt.memory) / MiB
        out[compiled.name] = {"step_ms": times, "peak_mib": peak}
        del rt, opt, mine, mods
        torch.cuda.empty_cache()
    return out


def measure(steps: int) -> dict:
    import torch

    from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
    from schedc.runtime.launch import run_local
    from schedc.runtime.profile import make_problem, profile_stages

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device: run this on a machine with a GPU (CI has none)")
    x, y = token_batches(1, MB_SIZE, CFG["seq_len"], CFG["vocab"])[0]
    prof = profile_stages(stages(gpt_blocks(**CFG, seed=0), 1), x, y, lm_loss, warmup=2, repeats=5,
                          optimizer_state=0, device="cuda")
    problem = make_problem(prof, ranks=1, microbatches=MICROBATCHES, name="gpt-1gpu", policies=True)
    compiled = schedules(problem)
    ran = run_local(rank_main, 1, list(compiled.values()), steps, timeout=1200)[0]
    rows = []
    for name, c in compiled.items():
        t = c.timeline
        got = ran[name]
        rows.append({"schedule": name, "policies": c.schedule.policy_counts(), "simulated_ms": t.makespan,
                     "measured_ms": statistics.median(got["step_ms"][1:]), "step_ms": got["step_ms"],
                     "simulated_peak_mib": t.peak_activation[0], "measured_peak_mib": got["peak_mib"]})
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "machine": machine(),
            "python": platform.python_version(), "steps": steps, "problem": problem.model_dump(exclude_none=True),
            "rows": rows}


def table(run: dict) -> str:
    p = run["problem"]
    f, copy = p["costs"]["F"], p["offload"]["time"]
    f, copy = (f[0] if isinstance(f, list) else f), (copy[0] if isinstance(copy, list) else copy)
    lines = [
        f"Command: `{COMMAND}`",
        "",
        f"Machine: {run['gpu']} (torch {run['torch']}), host {run['machine']}; {run['steps']} steps per schedule,"
        " the first a warm-up.",
        "",
        f"A GPT ({CFG['n_layers']} layers, d_model {CFG['d_model']}, {CFG['n_heads']} heads, sequence {CFG['seq_len']},"
        f" fp32) on one GPU as one stage, {MICROBATCHES} microbatches of {MB_SIZE} sequences, GPipe's order. Profiled:"
        f" F {f:.2f} ms, a copy of one microbatch's activation to or from pinned host memory {copy:.2f} ms.",
        "",
        "| schedule | offloaded / recomputed | step ms, simulated | step ms, measured (median) | measured / simulated |"
        " peak MiB, simulated | peak MiB, measured | measured / simulated |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in run["rows"]:
        pol = r["policies"]
        lines.append(
            f"| {r['schedule']} | {pol['offload']} / {pol['recompute']} | {r['simulated_ms']:.1f} | {r['measured_ms']:.1f} |"
            f" {r['measured_ms'] / r['simulated_ms']:.3f} | {r['simulated_peak_mib']:.0f} | {r['measured_peak_mib']:.0f} |"
            f" {r['measured_peak_mib'] / r['simulated_peak_mib']:.3f} |")
    lines += [
        "",
        "How to read the offload row: the step time says whether the copies overlap the compute (the",
        "simulator runs them on the copy lane beside it). The measured peak is the CUDA allocator's count,",
        "which drops an offloaded activation when its O is issued: torch keeps the block from reuse until",
        "the side stream's copy is done (`record_stream`) but counts it free at once, so while copies run",
        "the count is below what the device holds. The simulator holds the activation until its copy",
        "ends, which is what the device can reuse: its peak is the one to plan a memory limit with.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="steps per schedule, the first a warm-up (default 6)")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    ap.add_argument("--from", dest="source", type=Path, help="read the measurements of an earlier run instead")
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first is a warm-up)")
    run = json.loads(args.source.read_text()) if args.source else measure(args.steps)
    if args.json:
        args.json.write_text(json.dumps(run, indent=1))
    text = table(run)
    print(text)
    if args.write:
        write_section("offload-gpu", "## Offload and recompute on one GPU: measured against simulated\n\n" + text)


if __name__ == "__main__":
    main()
