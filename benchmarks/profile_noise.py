"""Does the profiler know when it is wrong? The example GPT profiled N times in a row, without and
with a CPU hog beside it.

    python benchmarks/profile_noise.py [--write] [--runs 5] [--cases reference,quiet,hog] [-p 2] [-m 8]

Each run is ``schedc profile examples/train_gpt.py:gpt -p P -m M`` as the CLI runs it
(``profile_model``, the time-balanced partition, the load copies of the other ranks, the torch
threads ``choose_device`` gives each rank; the transfer is not measured: ``comm`` 0.1 ms, it is not
what this measures). The hog is one busy-looping Python process per core, started before the run
and killed after it (each bounded by ``--hog-seconds`` in any case).

Per case: how many runs warned and which stages (and blocks, in the per-block profile that
``--partition time`` cuts the model from) they named; the largest spread (p75 - p25) /
median of one stage's repeats over the runs; and across the N runs, for each stage's F, B and W,
(max - min) / median of the N medians: how far profiles in a row agree (issue 38 asks 3 % on a quiet
machine). --write puts the table into benchmarks/RESULTS.md with the command and the machine.

The ``reference`` case is the machine itself: no model, one fixed kernel (single-thread 512 x 512
matmuls, about 30 ms a repeat, the size of the example GPT's stage ops) measured by the profiler's
own protocol (``schedc.runtime.noise.measure``: warm-up, 7 repeats, the median, measured again
when spread) N times in a row. Where its runs' medians disagree by more than the model's target,
no profiler on that machine can meet the target: the machine's speed, not the model, moves.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

from _results import machine, write_section  # noqa: E402
from schedc.runtime.device import choose_device  # noqa: E402
from schedc.runtime.noise import measure  # noqa: E402
from schedc.runtime.profile import load_model_spec, profile_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = f"{ROOT}/examples/train_gpt.py:gpt"
HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def named(warning: str) -> tuple[list[int], list[int]]:
    """(the stages, the blocks) a warning names: its own part names stages, the part of the
    partition's per-block profile blocks."""
    own, _, blocks = warning.partition("the partition's per-block profile:")

    def numbers(text: str, label: str) -> list[int]:
        found = set()
        for group in re.findall(rf"\b{label}s? (\d+(?:, \d+)*)", text):
            found.update(int(s) for s in group.split(", "))
        return sorted(found)

    return numbers(own, "stage"), numbers(blocks, "block")


def one_profile(ranks: int, microbatches: int, hog: bool, hog_seconds: float) -> dict:
    hogs = []
    if hog:
        hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(seconds=hog_seconds)])
                for _ in range(os.cpu_count() or 1)]
        time.sleep(0.5)  # the hogs are running before the profile starts
    try:
        device, threads = choose_device(None, ranks, None)
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        _, prof = profile_model(load_model_spec(MODEL), ranks=ranks, microbatches=microbatches, comm=0.1,
                                device=device)
        took = time.perf_counter() - t0
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return {"F": prof.F, "B": prof.B, "W": prof.W, "spread": prof.spread, "measurements": prof.measurements,
            "warning": prof.warning, "named": named(prof.warning), "seconds": took}


def reference_profile() -> dict:
    """One run of the reference case: the fixed kernel as the profiler's one stage, F only."""
    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)

    def sample(s: int) -> dict[str, float]:
        t0 = time.perf_counter()
        for _ in range(8):
            a @ b
        return {"F": 1000 * (time.perf_counter() - t0)}

    t0 = time.perf_counter()
    judged = measure(sample, 1, 2, 7)
    return {"F": judged.median["F"], "B": [0.0], "W": [0.0], "spread": judged.spread,
            "measurements": judged.measurements, "warning": judged.warning(), "named": ([], []),
            "seconds": time.perf_counter() - t0}


def agreement(runs: list[dict], kind: str) -> list[float]:
    """Per stage, (max - min) / median of the runs' medians."""
    out = []
    for s in range(len(runs[0][kind])):
        values = [r[kind][s] for r in runs]
        mid = statistics.median(values)
        out.append((max(values) - min(values)) / mid if mid > 0 else 0.0)
    return out


def row(case: str, runs: list[dict]) -> str:
    warned = sum(bool(r["warning"]) for r in runs)
    stages = sorted({s for r in runs for s in r["named"][0]})
    blocks = sorted({b for r in runs for b in r["named"][1]})
    names = f"{', '.join(map(str, stages)) or '-'} / {', '.join(map(str, blocks)) or '-'}"
    spread = max(max(r["spread"][k]) for r in runs for k in r["spread"])
    agree = {k: max(agreement(runs, k)) for k in "FBW"}
    measured = statistics.mean(r["measurements"] for r in runs)
    took = statistics.mean(r["seconds"] for r in runs)
    return (f"| {case} | {len(runs)} | {warned} | {names} | {100 * spread:.0f} % |"
            f" {100 * agree['F']:.1f} / {100 * agree['B']:.1f} / {100 * agree['W']:.1f} % | {measured:.1f} |"
            f" {took:.0f} s |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="profiles in a row per case")
    ap.add_argument("--cases", default="reference,quiet,hog",
                    help="comma-separated: reference (a fixed kernel: the machine's own drift), quiet, hog")
    ap.add_argument("-p", "--ranks", type=int, default=2)
    ap.add_argument("-m", "--microbatches", type=int, default=8)
    ap.add_argument("--hog-seconds", type=float, default=600.0, help="each hog process ends by itself after this")
    ap.add_argument("--note", default="", help="a line said under the table (e.g. that the machine was loaded)")
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()
    lines = ["| case | runs | warned | named: stages / blocks (the partition's per-block profile) | largest spread of a stage's repeats |"
             " F / B / W: runs' medians (max - min) / median, worst stage | measurements per run | s per run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    detail = []
    for case in args.cases.split(","):
        runs = []
        for i in range(args.runs):
            r = (reference_profile() if case == "reference"
                 else one_profile(args.ranks, args.microbatches, case == "hog", args.hog_seconds))
            runs.append(r)
            print(f"{case} {i + 1}/{args.runs}: F {[round(x, 2) for x in r['F']]} B {[round(x, 2) for x in r['B']]}"
                  f" W {[round(x, 2) for x in r['W']]} measurements {r['measurements']}"
                  f" {'warned: ' + r['warning'] if r['warning'] else 'no warning'}", flush=True)
            detail.append(f"{case} {i + 1}: " + (r["warning"] or "no warning"))
        lines.append(row(case, runs))
    table = "\n".join(lines)
    print(table)
    if args.write:
        cmd = shlex.join(["python", "benchmarks/profile_noise.py", *sys.argv[1:]])
        body = "\n".join([
            "### Profile noise: does the profiler know when it is wrong?",
            "",
            f"`{cmd}`  ",
            f"Machine: {machine()}, torch {torch.__version__}; the example GPT (examples/train_gpt.py:gpt),"
            f" p = {args.ranks}, m = {args.microbatches}, each run `schedc profile`'s profile_model (comm not"
            " measured); hog: one busy-looping process per core beside the profiler; reference: no model, a fixed"
            " single-thread matmul kernel timed by the profiler's own protocol (the machine's own drift; F column only).",
            "",
            table,
            "",
            *([args.note, ""] if args.note else []),
            "Warnings, run by run:",
            "",
            *(f"- {d}" for d in detail),
        ])
        write_section("profile-noise", body)


if __name__ == "__main__":
    main()
