"""The memory-aware zero-bubble heuristic against each handcrafted zero-bubble schedule, at that
schedule's own memory, on seeded random heterogeneous problems; and its build time at scale.

    python benchmarks/heuristic.py [--problems 50] [--seed 7] [--write]

For every problem and rival (ZB-H1, ZB-H2 with one chunk; ZB-V, V-Half, V-Min, DualPipeV on the
V placement), every rank is limited to the rival's largest activation peak (plus static memory)
and both are simulated; the table gives how often zb-greedy is no worse and its worst ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import defaultdict

import schedc.solvers as solvers
from schedc import Problem, simulate

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_section  # noqa: E402


def random_problem(rng: random.Random, v_shape: bool) -> Problem:
    p = rng.randint(2, 6)
    m = rng.randint(2 * p, 4 * p) if v_shape else rng.randint(p, 3 * p)
    n = p * (2 if v_shape else 1)
    cost = lambda: [round(rng.uniform(0.5, 3), 1) for _ in range(n)]  # noqa: E731
    return Problem.parse(
        dict(
            ranks=p, microbatches=m, chunks=2 if v_shape else 1, placement="v" if v_shape else "loop",
            costs=dict(F=cost(), B=cost(), W=cost()), comm=rng.choice([0, 0.1, 0.5]),
            memory=dict(F=2, B=-1, static=5),
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=50)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--write", action="store_true", help="write the tables into benchmarks/RESULTS.md")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    ratios: dict[str, list[float]] = defaultdict(list)
    for k in range(args.problems):
        problem = random_problem(rng, v_shape=k % 2 == 1)
        rivals = ["zb-v", "v-half", "v-min", "dualpipev"] if problem.chunks == 2 else ["zb-h1", "zb-h2"]
        for rival in rivals:
            if solvers.get(rival).why_not(problem):
                continue
            peak = max(simulate(problem, solvers.build(rival, problem)).peak_activation)
            limited = problem.with_changes(memory={"limit": [s + peak for s in problem.static_memory]})
            theirs = simulate(limited, solvers.build(rival, limited)).objective_value()
            ours = simulate(limited, solvers.build("zb-greedy", limited))
            assert ours.fits
            ratios[rival].append(ours.objective_value() / theirs)
        print(f"problem {k + 1}/{args.problems} done", file=sys.stderr, flush=True)

    lines = [
        "## Memory-aware heuristic vs handcrafted zero-bubble schedules",
        "",
        f"Command: `python benchmarks/heuristic.py --problems {args.problems} --seed {args.seed} --write`  ",
        f"Machine: {machine()}  ",
        "Random problems: p in 2..6, per-stage F, B, W uniform in 0.5..3, comm 0 / 0.1 / 0.5; every rank",
        "limited to the rival's largest activation peak. Ratio = zb-greedy's objective / the rival's.",
        "",
        "| rival | problems | zb-greedy no worse | better | median ratio | worst ratio |",
        "|---|---|---|---|---|---|",
    ]
    for rival, rs in ratios.items():
        rs = sorted(rs)
        lines.append(
            f"| {rival} | {len(rs)} | {sum(r <= 1 + 1e-9 for r in rs)} | {sum(r < 1 - 1e-9 for r in rs)}"
            f" | {rs[len(rs) // 2]:.4f} | {rs[-1]:.4f} |"
        )
    lines += ["", "| build time of zb-greedy | seconds |", "|---|---|"]
    for v, placement in ((1, "loop"), (2, "v")):
        problem = Problem.parse(
            dict(ranks=32, microbatches=256, chunks=v, placement=placement, costs=dict(F=1, B=1.1, W=0.7), comm=0.05)
        )
        t0 = time.perf_counter()
        solvers.build("zb-greedy", problem)
        lines.append(f"| p=32 m=256 v={v} {placement} | {time.perf_counter() - t0:.1f} |")
    print("\n".join(lines))
    if args.write:
        write_section("heuristic", "\n".join(lines))


if __name__ == "__main__":
    main()
