"""Does the default solver reach the true optimum on small problems? CBC (the default) and CP-SAT
against the optimum, on seeded random problems of at most 100 ops.

    python benchmarks/solve_small.py [--seeds 100] [--time-limit 30] [--write]

Problems (seed k is problem k, drawn with ``random.Random(k)``): v in {1, 2}, p in 1..4 (more
often 2..4), with v = 2 the placement loop or V (even odds); m drawn between half and all of the
largest count that keeps F + B + W ops = 3 p v m <= 100 (and m <= 16); integer costs 1..4 per
stage and kind; comm in {0, 0.5, 1, 2, 3}; activation memory F 1..3 per stage, B freeing 30 % or
50 % of it (per problem); the memory limit per rank none (1 in 5), the least any schedule needs
(``min_memory``, 2 in 5), or a quarter or half of the way from there to holding every microbatch
(1 in 5 each), raised where no registry schedule fits (solve() needs one to start from) to the
peaks of the one that needs the least raising; objective makespan or span (even odds).

The optimum is the exhaustive search of tests/exhaustive.py where it finishes within
``--exhaustive-budget`` seconds, else CP-SAT's proven optimum (``solve(solver="cpsat")``, its run
below if that proved it, else one of ``--proof-limit`` seconds); a problem where neither proves
one is reported unknown and left out of the counts. Objectives are the simulator's (for span: as
soon as possible, as in the exhaustive search; the ILP's own span may start a rank late, so it is
only a lower bound). A solver "reaches the optimum" when its schedule's objective equals it (up to
1e-6 relative); its time is the wall time of ``solve(problem, solver=..., time_limit=--time-limit)``,
warm start, local search and exact search included. "Warm start optimal" counts the problems
where the best registry schedule is already optimal: there a solver only has to keep it.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import schedc.solvers as solvers
from schedc import Problem, simulate
from schedc.solvers.registry import unfuse
from schedc.solvers.search.solve import fitting_registry_schedules, solve

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _results import machine, write_section  # noqa: E402

MAX_OPS = 100


def make_problem(seed: int) -> Problem:
    """The seeded random problem number ``seed``."""
    rng = random.Random(seed)
    v = rng.choice([1, 2])
    p = rng.choice([1, 2, 2, 3, 3, 4, 4]) if v == 1 else rng.choice([1, 2, 2, 3, 3, 4])
    n = p * v
    top = min(16, MAX_OPS // (3 * n))
    m = rng.randint(max(1, top // 2), top)
    placement = rng.choice(["loop", "v"]) if v == 2 else "loop"

    def costs():
        return [rng.randint(1, 4) for _ in range(n)]

    f = [rng.randint(1, 3) for _ in range(n)]
    share = rng.choice([0.3, 0.5])
    problem = Problem.parse(
        dict(
            name=f"seed{seed}",
            ranks=p, microbatches=m, chunks=v, placement=placement,
            costs=dict(F=costs(), B=costs(), W=costs()),
            comm=rng.choice([0, 0.5, 1, 2, 3]),
            memory=dict(F=f, B=[-round(share * x, 6) for x in f]),
            objective=rng.choice(["makespan", "span"]),
        )
    )
    where = rng.choice([None, 0.0, 0.0, 0.25, 0.5])  # None: no limit; else from tightest to all held
    if where is None:
        return problem
    need = [problem.min_memory(r) for r in range(p)]
    everything = [m * sum(f[s] for s in problem.rank_stages[r]) for r in range(p)]
    limited = problem.with_changes(memory={"limit": [round(a + where * (b - a), 6) for a, b in zip(need, everything)]})
    if fitting_registry_schedules(limited):
        return limited
    # solve() needs a registry schedule that fits to start from: raise the limit where needed to
    # the peaks of the one (built for this limit) that needs the least raising.
    peaks = []
    for spec in solvers.REGISTRY.values():
        if spec.why_not(limited) is None:
            peaks.append(simulate(limited, unfuse(spec.build(limited))).peak_memory)
    least = min(peaks, key=lambda pk: max(x - y for x, y in zip(pk, limited.memory_limit)))
    return limited.with_changes(memory={"limit": [round(max(x, y), 6) for x, y in zip(limited.memory_limit, least)]})


def optimum(problem: Problem, exhaustive_budget: float, proof_limit: float, cpsat_run=None) -> tuple[float | None, str]:
    """The optimum and what proves it: ``(value, "exhaustive" | "cp-sat")``, or ``(None, "unknown")``."""
    from tests.exhaustive import BudgetExceeded, exhaustive_optimum

    try:
        value, _ = exhaustive_optimum(problem, time_budget=exhaustive_budget)
        return value, "exhaustive"
    except BudgetExceeded:
        pass
    if cpsat_run is None or cpsat_run.status != "optimal":
        cpsat_run = solve(problem, solver="cpsat", time_limit=proof_limit)
    if cpsat_run.status == "optimal":  # the simulated objective meets CP-SAT's proven bound
        return cpsat_run.objective, "cp-sat"
    return None, "unknown"


def reached(value: float, best: float | None) -> bool:
    return best is not None and value <= best + 1e-6 * max(1.0, abs(best))


def run_solver(problem: Problem, solver: str, time_limit: float):
    began = time.perf_counter()
    result = solve(problem, solver=solver, time_limit=time_limit)
    return result, time.perf_counter() - began


def describe_limit(problem: Problem) -> str:
    limits = problem.memory_limit
    if limits is None:
        return "none"
    need = [problem.min_memory(r) for r in range(problem.ranks)]
    if all(abs(a - b) <= 1e-9 for a, b in zip(limits, need)):
        return "tightest"
    return " ".join(f"{x:g}" for x in limits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=100, help="problems 0 .. SEEDS-1")
    ap.add_argument("--first", type=int, default=0, help="first seed")
    ap.add_argument("--time-limit", type=float, default=30.0, help="solve()'s time limit for CBC and CP-SAT")
    ap.add_argument("--exhaustive-budget", type=float, default=30.0)
    ap.add_argument("--proof-limit", type=float, default=120.0, help="CP-SAT's time to prove the optimum")
    ap.add_argument("--write", action="store_true", help="write the tables into benchmarks/RESULTS.md")
    args = ap.parse_args()

    rows = []
    began = time.perf_counter()
    for seed in range(args.first, args.first + args.seeds):
        problem = make_problem(seed)
        cbc, cbc_s = run_solver(problem, "cbc", args.time_limit)
        cpsat, cpsat_s = run_solver(problem, "cpsat", args.time_limit)
        best, source = optimum(problem, args.exhaustive_budget, args.proof_limit, cpsat)
        row = dict(seed=seed, problem=problem, best=best, source=source, warm=cbc.warm_objective,
                   cbc=cbc, cbc_s=cbc_s, cpsat=cpsat, cpsat_s=cpsat_s)
        rows.append(row)
        print(
            f"seed {seed}: p={problem.ranks} v={problem.chunks} m={problem.microbatches} {problem.placement}"
            f" {problem.objective}, optimum {best if best is not None else '?'} ({source}), warm {cbc.warm_objective:g};"
            f" cbc {cbc.objective:g} {cbc.status} {cbc_s:.1f} s{'' if reached(cbc.objective, best) else ' MISSED'};"
            f" cp-sat {cpsat.objective:g} {cpsat.status} {cpsat_s:.1f} s{'' if reached(cpsat.objective, best) else ' MISSED'}",
            flush=True,
        )
    total = time.perf_counter() - began

    def summary(group: list[dict], label: str) -> str:
        known = [r for r in group if r["best"] is not None]
        warm_ok = sum(reached(r["warm"], r["best"]) for r in known)
        cells = [label, str(len(group)), str(len(known)), str(warm_ok)]
        for name in ("cbc", "cpsat"):
            ok = [r for r in known if reached(r[name].objective, r["best"])]
            proven = sum(r[name].status == "optimal" for r in known)
            hard = [r for r in known if not reached(r["warm"], r["best"])]
            ok_hard = sum(reached(r[name].objective, r["best"]) for r in hard)
            times = sorted(r[f"{name}_s"] for r in known)
            median = times[len(times) // 2] if times else 0.0
            pct = 100 * len(ok) / len(known) if known else 0.0
            cells += [f"{len(ok)} ({pct:.0f}%)", f"{ok_hard} of {len(hard)}", str(proven), f"{median:.1f}"]
        return "| " + " | ".join(cells) + " |"

    groups = []
    for v in (1, 2):
        for objective in ("makespan", "span"):
            groups.append((f"v={v} {objective}", [r for r in rows if r["problem"].chunks == v and r["problem"].objective == objective]))
    groups.append(("all", rows))
    sources = {s: sum(r["source"] == s for r in rows) for s in ("exhaustive", "cp-sat", "unknown")}
    missed = {
        name: [r["seed"] for r in rows if r["best"] is not None and not reached(r[name].objective, r["best"])]
        for name in ("cbc", "cpsat")
    }
    lines = [
        "## Small problems: does the default solver reach the optimum?",
        "",
        f"Command: `python benchmarks/solve_small.py --seeds {args.seeds}"
        f"{f' --first {args.first}' if args.first else ''} --time-limit {args.time_limit:g}"
        f" --exhaustive-budget {args.exhaustive_budget:g} --proof-limit {args.proof_limit:g} --write`  ",
        f"Machine: {machine()}  ",
        f"{len(rows)} seeded random problems of at most {MAX_OPS} ops (generator in the script's docstring);"
        f" total {total:.0f} s. Optimum: exhaustive search {sources['exhaustive']}, CP-SAT's proven optimum"
        f" {sources['cp-sat']}, unknown {sources['unknown']} (left out below). Each solver:"
        f" `solve(problem, solver=..., time_limit={args.time_limit:g})`, its simulated objective.",
        "Columns per solver: reached the optimum (of those with a known one); reached where the best registry"
        " schedule (the warm start) is not optimal; proven optimal (status); median wall seconds.",
        "",
        "| problems | n | optimum known | warm start optimal | CBC reached | CBC reached, warm not optimal"
        " | CBC proven | CBC median s | CP-SAT reached | CP-SAT reached, warm not optimal | CP-SAT proven | CP-SAT median s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [summary(group, label) for label, group in groups if group]
    lines += [
        "",
        f"Missed (seeds): CBC {', '.join(map(str, missed['cbc'])) or 'none'};"
        f" CP-SAT {', '.join(map(str, missed['cpsat'])) or 'none'}.",
        "",
        "| seed | p | v | m | placement | comm | limit | objective | optimum | by | warm start | CBC | status | s | CP-SAT | status | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pr = r["problem"]
        mark = lambda x: f"{x:g}" + ("" if reached(x, r["best"]) or r["best"] is None else " (missed)")  # noqa: E731
        lines.append(
            f"| {r['seed']} | {pr.ranks} | {pr.chunks} | {pr.microbatches} | {pr.placement} | {pr.comm:g}"
            f" | {describe_limit(pr)} | {pr.objective} | {r['best'] if r['best'] is not None else '?'} | {r['source']}"
            f" | {r['warm']:g} | {mark(r['cbc'].objective)} | {r['cbc'].status} | {r['cbc_s']:.1f}"
            f" | {mark(r['cpsat'].objective)} | {r['cpsat'].status} | {r['cpsat_s']:.1f} |"
        )
    print("\n".join(lines))
    if args.write:
        write_section("solve-small", "\n".join(lines))


if __name__ == "__main__":
    main()
