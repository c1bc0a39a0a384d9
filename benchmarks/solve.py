"""What the ILP buys: solved bubble vs the best registry schedule and vs 1F1B, proven gap, time.

    python benchmarks/solve.py [--grid targets|full] [--solvers cbc,cpsat] [--write]

Cost profiles: uniform (F = B = W), transformer (F = B = 2W per stage, comm 3% of F),
heterogeneous (first and last stage 1.5x and 2x heavier, comm 3%). Memory limits: 1F1B's
activation memory (p microbatches through each rank's stages) plus static, 1.5x and 2x that.
v = 2 uses the V placement. The 1F1B column is plain 1F1B on the same layers with one chunk per
rank (the schedule most users start from). Objective: makespan.

--grid targets (default) runs the issue's target sizes (p=4 m=8; p=8 m=24; p=16 m=64 and
p=32 m=128 with v = 1 and 2) over profiles and limits; --grid full runs p in {4, 8, 16, 32},
m in {p, 2p, 4p, 8p}, v in {1, 2}, all limits and profiles (288 cells; hours).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import schedc.solvers as solvers
from schedc import Problem, simulate
from schedc.solvers.families.greedy import reference_limit
from schedc.solvers import solve

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_section  # noqa: E402

PROFILES = ("uniform", "transformer", "heterogeneous")
LIMITS = (1.0, 1.5, 2.0)


def make_problem(p: int, m: int, v: int, profile: str, limit_factor: float) -> Problem:
    n = p * v
    if profile == "uniform":
        f, b, w, comm = [1.0] * n, [1.0] * n, [1.0] * n, 0.0
    else:
        f, b, w, comm = [1.0] * n, [1.0] * n, [0.5] * n, 0.03
        if profile == "heterogeneous":  # embedding on the first stage, LM head + loss on the last
            f[0], b[0], w[0] = 1.5, 1.5, 0.75
            f[-1], b[-1], w[-1] = 2.0, 2.0, 1.0
    scale = 1.0 / v  # v chunks split a rank's layers
    problem = Problem.parse(
        dict(
            name=f"{profile}-p{p}-m{m}-v{v}",
            ranks=p, microbatches=m, chunks=v, placement="v" if v == 2 else "loop",
            costs=dict(F=[x * scale for x in f], B=[x * scale for x in b], W=[x * scale for x in w]),
            comm=comm, memory=dict(F=scale, B=-scale / 2, static=0.0),
        )
    )
    limit = [x * limit_factor for x in reference_limit(problem, p)]
    return problem.with_changes(memory={"limit": [max(x, problem.min_memory(r)) for r, x in enumerate(limit)]})


def one_f_one_b_bubble(problem: Problem) -> float:
    """Plain 1F1B on the same layers, one chunk per rank (chunks merged)."""
    if problem.chunks > 1:
        merged = {k: [sum(problem.cost[k][s] for s in problem.rank_stages[r]) for r in range(problem.ranks)] for k in "FBW"}
        problem = Problem.parse(
            dict(ranks=problem.ranks, microbatches=problem.microbatches, costs=merged, comm=problem.comm,
                 objective=problem.objective)
        )
    return simulate(problem, solvers.build("1f1b", problem)).bubble_rate()


def cells(grid: str):
    if grid == "full":
        for p in (4, 8, 16, 32):
            for m, v, profile, limit in itertools.product((p, 2 * p, 4 * p, 8 * p), (1, 2), PROFILES, LIMITS):
                yield p, m, v, profile, limit
        return
    for p, m, vs in ((4, 8, (1, 2)), (8, 24, (1, 2))):
        for v, profile, limit in itertools.product(vs, PROFILES, (1.0, 2.0)):
            yield p, m, v, profile, limit
    for p, m in ((16, 64), (32, 128)):
        for v in (1, 2):
            yield p, m, v, "heterogeneous", 1.0


def time_limit_for(p: int) -> float:
    return {4: 30.0, 8: 60.0}.get(p, 100.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", choices=("targets", "full"), default="targets")
    ap.add_argument("--solvers", default="cbc", help="comma-separated: cbc, highs, cpsat")
    ap.add_argument("--max-ranks", type=int, default=32, help="skip cells with more ranks")
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()
    names = [s.strip() for s in args.solvers.split(",") if s.strip()]

    rows = []
    for p, m, v, profile, limit in cells(args.grid):
        if p > args.max_ranks:
            continue
        problem = make_problem(p, m, v, profile, limit)
        ref = one_f_one_b_bubble(problem)
        for solver in names:
            t0 = time.perf_counter()
            r = solve(problem, solver=solver, time_limit=time_limit_for(p))
            seconds = time.perf_counter() - t0
            warm_bubble = dict(r.registry)[r.warm_start].bubble_rate()
            rows.append((p, m, v, profile, limit, solver, r, warm_bubble, ref, seconds))
            print(
                f"p={p} m={m} v={v} {profile} limit {limit}x {solver}: {r.status}, bubble"
                f" {100 * r.timeline.bubble_rate():.2f}% (best heuristic {r.warm_start} {100 * warm_bubble:.2f}%,"
                f" 1F1B {100 * ref:.2f}%), gap {100 * r.gap:.2f}%, {seconds:.1f} s",
                flush=True,
            )

    lines = [
        "## ILP solver: solved vs best heuristic vs 1F1B",
        "",
        f"Command: `python benchmarks/solve.py --grid {args.grid} --solvers {','.join(names)}"
        f"{f' --max-ranks {args.max_ranks}' if args.max_ranks < 32 else ''} --write`  ",
        f"Machine: {machine()}  ",
        "Bubble = 1 - busy / (p x makespan). Limit: multiple of 1F1B's activation memory. Gap: (objective -"
        " proven bound) / objective. Time limit 30 s (p=4), 60 s (p=8), 100 s (p>=16), plus building the warm start.",
        "",
        "| p | m | v | profile | limit | solver | status | solved bubble | best heuristic | its bubble | 1F1B bubble | gap | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p, m, v, profile, limit, solver, r, warm_bubble, ref, seconds in rows:
        lines.append(
            f"| {p} | {m} | {v} | {profile} | {limit:g}x | {solver} | {r.status} | {100 * r.timeline.bubble_rate():.2f}%"
            f" | {r.warm_start} | {100 * warm_bubble:.2f}% | {100 * ref:.2f}% | {100 * r.gap:.2f}% | {seconds:.1f} |"
        )
    print("\n".join(lines))
    if args.write:
        write_section(f"solve-{args.grid}-{'-'.join(names)}-p{args.max_ranks}", "\n".join(lines))


if __name__ == "__main__":
    main()
