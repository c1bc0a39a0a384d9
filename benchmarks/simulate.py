"""How fast the simulator judges a schedule: p = 32, m = 256, v = 2 must take well under a second.

    python benchmarks/simulate.py [--repeat 5] [--write]

Times building the schedule and simulating it (median of --repeat runs) for large problems;
--write puts the table into benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import schedc.solvers as solvers
from schedc import Problem, simulate

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _results import machine, write_section  # noqa: E402

CASES = [
    # (p, m, v, placement, schedule)
    (32, 256, 2, "loop", "interleaved-1f1b"),
    (32, 256, 2, "loop", "looped-bfs"),
    (32, 256, 2, "v", "looped-bfs"),
    (32, 256, 1, "loop", "1f1b"),
    (32, 256, 1, "loop", "zb-h1"),
    (32, 256, 1, "loop", "zb-h2"),
    (8, 24, 1, "loop", "zb-h1"),
]


def median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()

    rows = []
    for p, m, v, placement, name in CASES:
        problem = Problem.parse(
            dict(ranks=p, microbatches=m, chunks=v, placement=placement, costs=dict(F=1.0, B=1.1, W=0.7), comm=0.05)
        )
        schedule = solvers.build(name, problem)
        t_build = median_seconds(lambda: solvers.build(name, problem), args.repeat)
        t_sim = median_seconds(lambda: simulate(problem, schedule), args.repeat)
        rows.append((p, m, v, placement, name, schedule.n_ops, t_build, t_sim))
        print(f"p={p} m={m} v={v} {placement} {name}: {schedule.n_ops} ops, build {t_build * 1e3:.1f} ms,"
              f" simulate {t_sim * 1e3:.1f} ms", flush=True)

    table = [
        "## Simulator speed",
        "",
        f"Command: `python benchmarks/simulate.py --repeat {args.repeat} --write`  ",
        f"Machine: {machine()}  ",
        "Median wall time of building the schedule and of `simulate()` (costs F=1, B=1.1, W=0.7, comm 0.05).",
        "",
        "| p | m | v | placement | schedule | ops | build (ms) | simulate (ms) | ops/s simulated |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p, m, v, placement, name, n_ops, tb, ts in rows:
        table.append(f"| {p} | {m} | {v} | {placement} | {name} | {n_ops} | {tb * 1e3:.1f} | {ts * 1e3:.1f} | {n_ops / ts:,.0f} |")
    print("\n".join(table))
    if args.write:
        write_section("simulate", "\n".join(table))


if __name__ == "__main__":
    main()
