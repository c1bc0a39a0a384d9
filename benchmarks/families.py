"""The remaining schedule families (issue 27): asynchronous PipeDream-2BW against the flushed
schedules, in the steady state.

    python benchmarks/families.py [--write] [--parts 2bw]

Part ``2bw``: on the zero-bubble paper's settings (``examples/problems/zb-paper``, the 2p files:
the paper's measured F, B, W and latency per stage, memory in units of one microbatch's
activation per stage, M_B), the time per microbatch in the steady state (``Timeline.per_microbatch``,
objective ``steady``): 1F1B, ZB-H1 and ZB-V (on the same model cut into 2p stages, V placement)
with a flush every iteration of m microbatches (their makespan over m), against 2BW (1F1B without
a flush: ``schedc.solvers.asynchronous``, the mean over its middle rounds). Memory beside: each
schedule's peak activation in M_B against the 1p and 2p limits (p M_B and 2p M_B), and the weight
copies each keeps: 2BW one more than the others (the settings give activation memory only, so the
second copy is named, not added). No search: every figure is a simulation, exact, machine-free.

Sequence-level Seq1F1B (the issue's second family) is not built yet, so this script has no part
for it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from _results import v_twin, write_section  # noqa: E402

import schedc  # noqa: E402
import schedc.solvers  # noqa: E402,F401  (registers the schedules)
from schedc.simulate import simulate  # noqa: E402
from schedc.solvers.registry import build  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = sorted((ROOT / "examples/problems/zb-paper").glob("zb-*-2p.yaml"))
FLUSHED = ("1f1b", "zb-h1", "zb-v")


def two_bw_rows() -> list[dict]:
    rows = []
    for path in SETTINGS:
        base = schedc.load_problem(path).with_changes(objective="steady", memory={"limit": None})
        p = base.ranks
        problems = {"1f1b": base, "zb-h1": base, "zb-v": v_twin(base), "2bw": base}
        row = {"setting": path.stem.removesuffix("-2p"), "p": p, "m": base.microbatches}
        for name, problem in problems.items():
            t = simulate(problem, build(name, problem))
            row[name] = (t.per_microbatch, max(t.peak_activation))
            print(f"{row['setting']}: {name} {t.per_microbatch:.4g} per microbatch, peak {max(t.peak_activation):g} M_B",
                  flush=True)
        rows.append(row)
    return rows


def two_bw_table(rows: list[dict]) -> str:
    lines = ["| setting | p | m | 1F1B | ZB-H1 | ZB-V | 2BW | 2BW vs best flushed |"
             " peak activation (M_B): 1F1B / ZB-H1 / ZB-V / 2BW | 2BW within 1p / 2p |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        best = min(row[name][0] for name in FLUSHED)
        peaks = " / ".join(f"{row[name][1]:g}" for name in (*FLUSHED, "2bw"))
        fits = " / ".join("yes" if row["2bw"][1] <= k * row["p"] + 1e-9 else "no" for k in (1, 2))
        lines.append(f"| {row['setting']} | {row['p']} | {row['m']} | "
                     + " | ".join(f"{row[name][0]:.2f}" for name in (*FLUSHED, "2bw"))
                     + f" | x{best / row['2bw'][0]:.3f} | {peaks} | {fits} |")
    return "\n".join(lines)


NOTE = ("Time per microbatch in ms (the paper's stage costs): a flushed schedule's makespan over its m"
        " microbatches, 2BW's steady state (the mean over its rounds between the first and the last). 2BW keeps"
        " two versions of every stage's weights, the flushed schedules one: that copy is not in the activation"
        " figures (the settings give activation memory only). 2BW's gradients are one step stale"
        " (w(t+1) = w(t) - lr g(w(t-1))): the comparison is of speed and memory, not of the training run.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the sections of benchmarks/RESULTS.md")
    ap.add_argument("--parts", default="2bw", help="comma-separated: 2bw")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"2bw"}
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}; the parts are: 2bw")
    if "2bw" in parts:
        table = two_bw_table(two_bw_rows())
        print(table)
        if args.write:
            write_section("families-2bw", "## Asynchronous PipeDream-2BW against flushed schedules (issue 27)\n\n"
                          "`python benchmarks/families.py --write --parts 2bw` (simulated: no search, exact on any"
                          " machine).\n\n" + table + "\n\n" + NOTE)


if __name__ == "__main__":
    main()
