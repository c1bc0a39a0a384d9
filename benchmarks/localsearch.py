"""How good the local search of `schedc solve` is within a fixed time: a check of solution quality,
so it lives here rather than in the test suite (a test must not depend on how fast the machine is).

    python benchmarks/localsearch.py [--seconds 60] [--write]

On the zero-bubble paper's hardest 2p setting (1.5B, m = 24, examples/problems/zb-paper/), the
memory-aware heuristic's timed warm-up policy gives a bubble of 4.46 % and the paper's ZB-2p 4.33 %
(zb-2p's own search over policies now reaches 4.33 % by itself). The local search
(`schedc.solvers.search.localsearch.improve`), started from that policy's schedule with --seconds of
time, must reach the paper. It stops at the deadline or by patience (200 kicks without improvement),
whichever comes first, and keeps the best it found. Exits 1 if it does not reach the paper.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_section  # noqa: E402

from schedc import load_problem, simulate  # noqa: E402
from schedc.solvers.deadline import Budget  # noqa: E402
from schedc.solvers.families.greedy import Policy, greedy_schedule  # noqa: E402
from schedc.solvers.search.localsearch import improve  # noqa: E402

SETTING = Path(__file__).resolve().parent.parent / "examples" / "problems" / "zb-paper" / "zb-1.5B-m24-2p.yaml"
PAPER = 0.0433  # the paper's ZB-2p bubble on this setting (Qi et al. 2024, Table 5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the local search's time (default 60)")
    parser.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    args = parser.parse_args()

    problem = load_problem(SETTING)
    start = simulate(problem, greedy_schedule(problem, Policy(timed_warmup=True), "zb-2p"))
    began = time.perf_counter()
    best = improve(problem, start, Budget.seconds(args.seconds, since=began))
    took = time.perf_counter() - began
    reached = round(best.bubble_rate(), 4) <= PAPER
    rows = [
        "| setting | timed warm-up (start) | local search | paper ZB-2p | reached | time |",
        "|---|---|---|---|---|---|",
        f"| {SETTING.stem} | {start.bubble_rate():.4f} | {best.bubble_rate():.4f} | {PAPER:.4f} | "
        f"{'yes' if reached else 'NO'} | {took:.1f} s of {args.seconds:g} |",
    ]
    print("\n".join(rows))
    if args.write:
        body = (
            "## Local search quality\n\n"
            f"`python benchmarks/localsearch.py --seconds {args.seconds:g} --write` on {machine()}: the local\n"
            "search of `schedc solve`, started from the heuristic's timed warm-up policy, against the paper's ZB-2p bubble (span).\n\n"
            + "\n".join(rows)
        )
        write_section("localsearch", body)
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
