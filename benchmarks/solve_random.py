"""Is the solved schedule ever worse than a named one? ``solve()`` against every registry schedule
and every torch.distributed.pipelining schedule that fits, on seeded random heterogeneous problems.

    python benchmarks/solve_random.py [--seeds 50] [--time-limit 20] [--write]

Problems (seed k is problem k, drawn with ``random.Random(k)``):

- p in {2, 4, 8}; v in {1, 2}; with v = 2 the placement is loop or V (even odds);
- m in {p, 2p, 3p}; when that makes more than MAX_OPS = 600 ops (3 p v m), m is drawn again
  among the sizes that keep within it, except with probability 1/5 (a few larger problems, which
  solve() improves by its neighbourhood search);
- costs: per problem a base F = 1, B uniform in [1, 1.2], W uniform in [0.4, 1]; per stage a
  factor uniform in [0.7, 1.3] on all three, the last stage (LM head and loss) a further factor
  uniform in [1.3, 1.6]; divided by v (chunks split a rank's layers); rounded to 3 decimals;
  costs.BW unset (a fused backward costs B + W);
- comm uniform in [0, 0.2 x mean F] (3 decimals);
- activation memory: memory.F per stage proportional to the stage's F or uniform (1 / v), even
  odds; memory.B the default -F/2 or -f F with f uniform in [0.3, 0.7] per problem, even odds;
- memory limit per rank: ``reference_limit(problem, k p)`` (static plus k p microbatches through
  the rank's stages; k = 1 is 1F1B's rank-0 peak) with k in {0.5, 1, 1.5, 2}, raised to
  ``problem.min_memory(r)`` where below it. Where no registry or torch schedule then fits (solve()
  needs one to start from), the limit is raised to the peaks of the registry schedule that needs
  the least raising (the "limit" column then says "raised");
- objective: makespan for even seeds, span for odd ones.

Rivals: every registry schedule that fits (``fitting_registry_schedules``: backward split), the
registry schedules with a fused backward as built too (``<name> (fused)``) where they fit, and
every torch schedule that applies (``torch_schedules``), split and (where it has fused backwards)
as built, where it fits and our simulator accepts its order. Each is judged by ``simulate`` on
the problem's objective. The solved value is ``solve(problem, solver="cbc",
time_limit=--time-limit, candidates=torch's)`` and its ``timeline.objective_value()`` (the
simulator's). "Worse" means the solved value exceeds the best rival's by more than float noise
(1e-7 relative): a bug. Improvement = (best rival - solved) / best rival. Wall: solve() alone.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import traceback

import schedc.solvers as solvers
from schedc import Problem, simulate
from schedc.errors import SchedcError
from schedc.kinds import FUSED
from schedc.runtime.torch_schedules import torch_schedules
from schedc.solvers.families.greedy import reference_limit
from schedc.solvers.registry import unfuse
from schedc.solvers.search.solve import fitting_registry_schedules, solve

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_section  # noqa: E402

MAX_OPS = 600
LIMIT_FACTORS = (0.5, 1.0, 1.5, 2.0)
NOISE = 1e-7  # relative: sums of many float costs


def make_problem(seed: int) -> tuple[Problem, str]:
    """The seeded random problem number ``seed`` and its limit kind (see the module docstring)."""
    rng = random.Random(seed)
    p = rng.choice([2, 4, 8])
    v = rng.choice([1, 2])
    placement = rng.choice(["loop", "v"]) if v == 2 else "loop"
    sizes = [p, 2 * p, 3 * p]
    m = rng.choice(sizes)
    if 3 * p * v * m > MAX_OPS and rng.random() >= 0.2:
        m = rng.choice([x for x in sizes if 3 * p * v * x <= MAX_OPS])
    n = p * v

    base_b, base_w = rng.uniform(1.0, 1.2), rng.uniform(0.4, 1.0)
    factor = [rng.uniform(0.7, 1.3) for _ in range(n)]
    factor[-1] *= rng.uniform(1.3, 1.6)  # LM head and loss
    f = [round(x / v, 3) for x in factor]
    b = [round(base_b * x / v, 3) for x in factor]
    w = [round(base_w * x / v, 3) for x in factor]
    comm = round(rng.uniform(0.0, 0.2 * sum(f) / n), 3)
    mem_f = list(f) if rng.random() < 0.5 else [round(1.0 / v, 3)] * n
    share = None if rng.random() < 0.5 else round(rng.uniform(0.3, 0.7), 3)
    memory = dict(F=mem_f)
    if share is not None:
        memory["B"] = [-round(share * x, 6) for x in mem_f]
    k = rng.choice(LIMIT_FACTORS)
    problem = Problem.parse(
        dict(
            name=f"random-{seed}",
            ranks=p, microbatches=m, chunks=v, placement=placement,
            costs=dict(F=f, B=b, W=w), comm=comm, memory=memory,
            objective="makespan" if seed % 2 == 0 else "span",
        )
    )
    limit = [round(max(x, problem.min_memory(r)), 6) for r, x in enumerate(reference_limit(problem, k * p))]
    return problem.with_changes(memory={"limit": limit}), f"{k:g}x 1F1B"


def _fits(problem: Problem, schedule) -> object | None:
    """The schedule's timeline where the simulator accepts it and it fits, else None."""
    try:
        t = simulate(problem, schedule)
    except SchedcError:
        return None
    return t if t.fits else None


def rivals(problem: Problem, torch_candidates) -> list[tuple[str, object]]:
    """(name, Timeline) of every registry and torch schedule that fits, split and fused as built."""
    out = list(fitting_registry_schedules(problem))
    for name, spec in solvers.REGISTRY.items():
        if spec.split_backward or spec.why_not(problem) is not None:
            continue
        t = _fits(problem, spec.build(problem))
        if t is not None:
            out.append((f"{name} (fused)", t))
    for name, schedule in torch_candidates:
        t = _fits(problem, unfuse(schedule))
        if t is not None:
            out.append((name, t))
        if any(op.kind in FUSED for ops in schedule.ranks for op in ops):
            t = _fits(problem, schedule)
            if t is not None:
                out.append((f"{name} (fused)", t))
    return out


def raise_limit(problem: Problem) -> Problem:
    """Raise the limit to the peaks of the registry schedule that needs the least raising."""
    unlimited = problem.with_changes(memory={"limit": None})
    best = None
    for _, t in fitting_registry_schedules(unlimited):
        raise_by = max(peak - x for peak, x in zip(t.peak_memory, problem.memory_limit))
        if best is None or raise_by < best[0]:
            best = (raise_by, t.peak_memory)
    limit = [round(max(x, peak) + 1e-6, 6) for x, peak in zip(problem.memory_limit, best[1])]
    return problem.with_changes(memory={"limit": limit})


def run_one(seed: int, time_limit: float) -> dict:
    problem, limit_kind = make_problem(seed)
    torch_candidates = [(n, s) for n, s, _ in torch_schedules(problem) if s is not None]
    found = rivals(problem, torch_candidates)
    if not found:
        problem, limit_kind = raise_limit(problem), limit_kind + ", raised"
        found = rivals(problem, torch_candidates)
    row = dict(
        seed=seed, p=problem.ranks, m=problem.microbatches, v=problem.chunks,
        placement=problem.placement, objective=problem.objective, limit=limit_kind,
        ops=3 * problem.n_stages * problem.microbatches, n_rivals=len(found),
    )
    best_name, best_t = min(found, key=lambda x: x[1].objective_value())
    row.update(rival=best_name, rival_value=best_t.objective_value())
    t0 = time.perf_counter()
    try:
        r = solve(problem, solver="cbc", time_limit=time_limit, candidates=torch_candidates)
    except Exception as e:  # a crash is a bug: keep going, report it
        row.update(wall=time.perf_counter() - t0, crash=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
        return row
    wall = time.perf_counter() - t0
    solved = r.timeline.objective_value()
    rival = row["rival_value"]
    row.update(
        solved=solved, status=r.status, gap=r.gap, wall=wall, fits=r.timeline.fits,
        worse=not r.timeline.fits or solved > rival + NOISE * max(1.0, abs(rival)),
        better=solved < rival - NOISE * max(1.0, abs(rival)),
        improvement=(rival - solved) / rival if rival > 0 else 0.0,
        worse_than=[(n, t.objective_value()) for n, t in found
                    if solved > t.objective_value() + NOISE * max(1.0, abs(t.objective_value()))],
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=50, help="problems 0 .. N-1")
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve() call")
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()

    rows = []
    began = time.perf_counter()
    for seed in range(args.seeds):
        row = run_one(seed, args.time_limit)
        rows.append(row)
        head = (f"[{seed + 1}/{args.seeds}] seed {seed}: p={row['p']} m={row['m']} v={row['v']} {row['placement']}"
                f" {row['objective']} limit {row['limit']}: best rival {row['rival']} {row['rival_value']:.4f}")
        if "crash" in row:
            print(f"{head}; solve CRASHED: {row['crash']}\n{row['trace']}", flush=True)
        else:
            flag = " WORSE" if row["worse"] else (" better" if row["better"] else "")
            print(f"{head}; solved {row['solved']:.4f} ({row['status']}, gap {100 * row['gap']:.2f}%,"
                  f" {row['wall']:.1f} s){flag}", flush=True)

    done = [r for r in rows if "crash" not in r]
    crashed = [r for r in rows if "crash" in r]
    worse = [r for r in done if r["worse"]]
    better = [r for r in done if r["better"]]
    gains = [100 * r["improvement"] for r in better]
    optimal = sum(r["status"] == "optimal" for r in done)
    statuses = {}
    for r in done:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1

    cmd = f"python benchmarks/solve_random.py --seeds {args.seeds} --time-limit {args.time_limit:g} --write"
    lines = [
        "## Solved vs every registry and torch schedule, random heterogeneous problems",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {machine()}  ",
        f"{len(rows)} seeded problems (generator in the script's docstring), `solve(solver=\"cbc\","
        f" time_limit={args.time_limit:g}, candidates=torch's schedules)`; total {time.perf_counter() - began:.0f} s.",
        "Best rival: the best by the problem's objective among the registry schedules that fit (backward split,"
        " and fused ones as built) and torch.distributed.pipelining's that apply and fit (split and as built).",
        "Improvement: (best rival - solved) / best rival. Gap: (solved - proven bound) / solved. Wall: solve() alone.",
        "",
        f"- never worse than the best rival: {len(done) - len(worse)} of {len(rows)}"
        f" (worse: {len(worse)}, crashed: {len(crashed)})",
        f"- strictly better: {len(better)} of {len(done)}"
        + (f"; their improvement: median {statistics.median(gains):.2f}%, max {max(gains):.2f}%" if gains else ""),
        f"- proven optimal: {optimal} of {len(done)}"
        f" (statuses: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))})",
        "",
        "| seed | p | m | v | placement | objective | limit | best rival | its value | solved | status | gap | improvement | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "crash" in r:
            tail = f"crashed: {r['crash'][:80]} | | | | {r['wall']:.1f} |"
        else:
            gain = 100 * r["improvement"] if r["better"] else 0.0  # within float noise: none
            tail = (f"{r['solved']:.4f} | {r['status']} | {100 * r['gap']:.2f}% | {gain:.2f}%"
                    f"{' (WORSE)' if r['worse'] else ''} | {r['wall']:.1f} |")
        lines.append(
            f"| {r['seed']} | {r['p']} | {r['m']} | {r['v']} | {r['placement']} | {r['objective']} | {r['limit']}"
            f" | {r['rival']} | {r['rival_value']:.4f} | {tail}"
        )
    if worse or crashed:
        lines += ["", "Problems where solve() was worse or crashed (bugs):", ""]
        for r in worse:
            lines.append(f"- seed {r['seed']}: solved {r['solved']:.6g} (fits {r['fits']}), worse than"
                         f" {', '.join(f'{n} {x:.6g}' for n, x in r['worse_than'])}")
        for r in crashed:
            lines.append(f"- seed {r['seed']}: {r['crash']}")
    print("\n".join(lines))
    if args.write:
        write_section("solve-random", "\n".join(lines))


if __name__ == "__main__":
    main()
