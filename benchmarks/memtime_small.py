"""Where memory binds, which side is loose: on small problems with recompute and offload, the exact
optimum against `schedc solve` and against schedc's lower bound (issue 39, point 1).

    python benchmarks/memtime_small.py [--write] [--jobs 2] [--solve-limit 20] [--cpsat-limit 60] [--exact 60]

Cells: the zero-bubble paper's 1.5B and 28.3B settings (Qi et al., ICLR 2024, Table 9 costs, the
memory and policy model of benchmarks/memory_time.py: full and selective recompute, offload) cut to
small pipelines: (p, m) in (2, 4), (2, 8), (3, 6), (4, 4), (4, 8), the loop and the V placement,
limits 0.25, 0.5 and 1 x 1F1B's activation memory (p M_B), objective span.

Per cell, each as a user runs it (the CLI, its own process; memory_time.py writes the problems the
same way):

- `schedc solve FILE --time-limit SOLVE` (the default backend, "auto": CP-SAT on these problems, which
  declare recompute and offload, where OR-Tools is installed, else CBC; the table before the
  default became "auto" ran CBC): what users get;
- `schedc solve FILE --solver cpsat --time-limit CPSAT`: CP-SAT models the keep / recompute /
  selective / offload choice per (stage, microbatch) with the order; where it proves optimality
  its span is the optimum, else its search bound is a lower bound of its own;
- schedc's own bound (`solvers.bounds.lower_bound`, what `solve` reports as its bound when no
  search proves more);
- with `--exact SECONDS`, the exhaustive search of tests/exhaustive.py (written apart from schedc,
  its own timing model) over every order with keep / recompute / selective per (stage,
  microbatch), started from the shortest span the two solves found: it proves that span optimal or
  finds a shorter one (replayed by schedc's simulator). It does not offload, so its optimum is the
  optimum only where offloading cannot help: a rank that offloads a microbatch spans at least its
  F, copy out, copy back and B, and where that is not below the span found, nothing offloaded wins.

The optimum lies in [the largest bound, the shortest span found]; it is known where they meet, or
where the exhaustive search finished and offloading cannot help.
"solve above optimum" is (solve - optimum) / optimum (its least where the optimum is not known:
against the shortest span), "optimum above bound" is (optimum - bound) / optimum for schedc's
bound (its least: the largest proven lower bound). --write puts the table into
benchmarks/RESULTS.md (section memtime-small).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.exhaustive

from memory_time import problem_of  # noqa: E402
from zb_paper import run_json  # noqa: E402

from schedc import Problem, Schedule, load_problem, simulate  # noqa: E402
from schedc.kinds import Kind  # noqa: E402
from schedc.errors import ProblemError  # noqa: E402
from schedc.solvers.bounds import lower_bound  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = (("1.5B", 24), ("28.3B", 96))  # the smallest and the largest model (keep, copy time differ)
SIZES = ((2, 4), (2, 8), (3, 6), (4, 4), (4, 8))  # (p, m)
LIMITS = (0.25, 0.5, 1.0)  # x 1F1B's activation memory, p M_B
REL = 1e-6  # spans and bounds this close are equal
RUNS = ("solve", "cpsat")  # per cell: schedc solve as users run it (its default backend), and CP-SAT for longer


def small_problem(model: str, m_paper: int, p: int, m: int, limit: float, v: bool) -> Problem:
    """The paper's setting with its recompute and offload model, on p ranks and m microbatches."""
    big = problem_of(model, m_paper, limit, v)
    memory = {**big.memory.model_dump(exclude_none=True), "limit": round(limit * p, 9)}
    name = f"mts-{model}-p{p}-m{m}-{limit:g}x" + ("-v" if v else "")
    return big.with_changes(name=name, ranks=p, microbatches=m, memory=memory)


def cells() -> tuple[list[tuple], list[str]]:
    """The cells, and the names of those left out: limits below what any schedule needs (one
    microbatch's activation on a rank, as during its recompute: 0.25 x p M_B for p < 4)."""
    out, left_out = [], []
    for v in (False, True):
        for model, mp in SETTINGS:
            for p, m in SIZES:
                for limit in LIMITS:
                    try:
                        small_problem(model, mp, p, m, limit, v)
                    except ProblemError:
                        left_out.append(f"{model} {'V' if v else 'loop'} p={p} m={m} {limit:g}x")
                        continue
                    out.append((model, mp, p, m, limit, v))
    return out, left_out


def exact_run(path: str, below: float | None, seconds: float) -> dict:
    """The exhaustive search with keep / R / S (tests/exhaustive.py) from ``below``, within
    ``seconds``: its span (``below`` where it found nothing shorter), "optimal" or "time limit",
    and whether it found a shorter schedule, which schedc's simulator must replay to its span."""
    from tests.exhaustive import BudgetExceeded, exhaustive_optimum

    problem = load_problem(path)
    began = time.perf_counter()
    policies = tuple(k.value for k in problem.recomputes)
    try:
        (value, orders), status = exhaustive_optimum(problem, policies=policies, time_budget=seconds, below=below), "optimal"
    except BudgetExceeded as e:
        (value, orders), status = e.found or (below, None), "time limit"
    except ValueError:
        return {"error": "nothing fits without offload", "wall": time.perf_counter() - began}
    wall = time.perf_counter() - began
    if value is None:
        return {"error": "nothing found in time", "wall": wall}
    if orders is not None:
        t = simulate(problem, Schedule.from_lists("exact", [orders[r] for r in range(problem.ranks)]))
        if not t.fits or abs(t.objective_value(problem.objective) - value) > REL * value:
            raise RuntimeError(f"{problem.name}: the exhaustive search's schedule replays to"
                               f" {t.objective_value(problem.objective)} (fits: {t.fits}), not {value}")
    return {"span": value, "status": status, "shorter": orders is not None, "wall": wall}


def least_offloaded(problem: Problem) -> float:
    """The least span of a rank that offloads a microbatch: its F, copy out, copy back and B on one
    rank, one after the other (inf without offload)."""
    if Kind.O not in problem.policies:
        return math.inf
    return min(sum(problem.cost[k][s] for k in (Kind.F, Kind.O, Kind.L, Kind.B)) for s in range(problem.n_stages))


def run_cell(cell: tuple, out_dir: Path, solve: float, cpsat: float, shared: bool = False, exact: float = 0) -> dict:
    """Both solves of one cell, the default ("solve") and CP-SAT for longer, then (``exact`` > 0
    seconds) the exhaustive search from their shortest span, in a process of its own; ``shared``:
    other cells run at the same time, so each solve is given one thread (``--threads 1``; no local
    search beside the backend on a second core)."""
    model, mp, p, m, limit, v = cell
    problem = small_problem(model, mp, p, m, limit, v)
    path = out_dir / f"{problem.name}.yaml"
    path.write_text(yaml.safe_dump(problem.model_dump(exclude_none=True), sort_keys=False))
    out = {"name": problem.name, "ops": 3 * problem.n_stages * m, "bound": lower_bound(problem).value}
    for run, backend, limit_s in (("solve", [], solve), ("cpsat", ["--solver", "cpsat"], cpsat)):
        res, wall, err = run_json(["solve", str(path), "-o", str(out_dir / f"{problem.name}.{run}.json"),
                                   *backend, "--time-limit", f"{limit_s:g}", "-q"]
                                  + (["--threads", "1"] if shared else []),
                                  timeout=10 * limit_s + 120)
        out[run] = ({"span": res["span"], "bound": res["bound"], "status": res["status"], "solver": res["solver"],
                     "wall": wall} if res else {"error": err, "wall": wall})
    if exact:
        below = min((out[run]["span"] for run in RUNS if "span" in out[run]), default=None)
        with ProcessPoolExecutor(1) as pool:
            out["exact"] = pool.submit(exact_run, str(path), below, exact).result()
        out["offloaded"] = least_offloaded(problem)
    return out


def summarise(r: dict) -> dict:
    """The optimum's interval and the two gaps of one cell."""
    runs = [s for s in (*RUNS, "exact") if s in r]
    spans = [r[s]["span"] for s in runs if "span" in r[s]]
    bounds = [r["bound"]] + [r[s]["bound"] for s in RUNS if r[s].get("bound") is not None]
    hi, lo = min(spans), max(bounds)
    exact = r.get("exact", {})
    known = hi - lo <= REL * hi or (exact.get("status") == "optimal" and r["offloaded"] >= hi * (1 - REL))
    solve = r["solve"].get("span")
    return {
        "lo": lo, "hi": hi, "known": known,
        "solve_over": (solve - hi) / hi if solve is not None else None,  # the least, exact where known
        "bound_under": (lo - r["bound"]) / lo,  # the least (optimum >= lo), exact where known
    }


def table(results: list[tuple[tuple, dict]], solve: float, cpsat: float, exact: float = 0) -> tuple[str, list[str]]:
    extra = f" exhaustive, keep / R / S, {exact:g} s |" if exact else ""
    lines = [f"| model | placement | p | m | limit | ops | solve ({solve:g} s, its backend) | CP-SAT {cpsat:g} s |{extra}"
             " optimum | schedc's bound | solve above optimum | optimum above bound |",
             "| --- " * (12 + bool(exact)) + "|"]
    summary = []
    for (model, _, p, m, limit, v), r in results:
        errors = [f"{s}: {r[s]['error']}" for s in RUNS if "error" in r[s]]
        if "span" not in r["solve"] and "span" not in r["cpsat"]:
            lines.append(f"| {model} | {'V' if v else 'loop'} | {p} | {m} | {limit:g} | {r['ops']} |"
                         f" {'; '.join(errors)} |" + " |" * (5 + bool(exact)))
            continue
        s = summarise(r)

        def cell_of(run: str) -> str:
            x = r[run]
            note = {"solve": f", {x.get('solver')}", "exact": ", shorter" if x.get("shorter") else ""}.get(run, "")
            return f"{x['span']:.1f} ({x['status']}{note})" if "span" in x else x["error"]

        optimum = f"{s['hi']:.1f}" if s["known"] else f"{s['lo']:.1f}-{s['hi']:.1f}"
        over = "n/a" if s["solve_over"] is None else f"{'' if s['known'] else '>= '}{100 * s['solve_over']:.1f} %"
        under = f"{'' if s['known'] else '>= '}{100 * s['bound_under']:.1f} %"
        lines.append(f"| {model} | {'V' if v else 'loop'} | {p} | {m} | {limit:g} | {r['ops']} | {cell_of('solve')} |"
                     f" {cell_of('cpsat')} |" + (f" {cell_of('exact')} |" if "exact" in r else " |" if exact else "")
                     + f" {optimum} | {r['bound']:.1f} | {over} | {under} |")
        summary.append((limit, v, s))
    notes = []
    for limit in LIMITS:
        for v in (False, True):
            got = [s for lim, vv, s in summary if lim == limit and vv == v]
            if not got:
                continue
            known = [s for s in got if s["known"]]
            overs = [s["solve_over"] for s in got if s["solve_over"] is not None]
            notes.append(
                f"- {limit:g}x, {'V' if v else 'loop'}: optimum known in {len(known)} of {len(got)} cells;"
                f" solve above it by up to {100 * max(overs, default=0):.1f} %"
                f" (in {sum(o > REL for o in overs)} cells); schedc's bound below it by"
                f" {100 * min(s['bound_under'] for s in got):.1f}-{100 * max(s['bound_under'] for s in got):.1f} %")
    return "\n".join(lines), notes


def main() -> None:
    from _results import machine, refuse_partial_write, write_section

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    ap.add_argument("--jobs", type=int, default=1, help="cells run at once (above 1, each solve is given one thread: --threads 1)")
    ap.add_argument("--solve-limit", type=float, default=20.0, help="seconds of `schedc solve` (its default backend) per cell")
    ap.add_argument("--cpsat-limit", type=float, default=60.0, help="seconds of `schedc solve --solver cpsat` per cell")
    ap.add_argument("--exact", type=float, default=0.0, help="seconds of the exhaustive search (keep / R / S, tests/exhaustive.py)"
                    " per cell, from the shortest span the solves found (0: not run)")
    ap.add_argument("--only", default="", help="run the cells whose problem name contains this")
    ap.add_argument("--out", default="out/memtime-small", help="where problems and schedules go")
    args = ap.parse_args()
    refuse_partial_write(ap, args)
    out_dir = ROOT / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    every, left_out = cells()
    chosen = [c for c in every if args.only in small_problem(*c).name]
    began = time.perf_counter()

    def one(cell):
        r = run_cell(cell, out_dir, args.solve_limit, args.cpsat_limit, shared=args.jobs > 1, exact=args.exact)
        print(r["name"], json.dumps({k: v for k, v in r.items() if k != "name"}), flush=True)
        return cell, r

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(one, chosen))
    (out_dir / "results.json").write_text(json.dumps([[list(c), r] for c, r in results], indent=1))
    body, notes = table(results, args.solve_limit, args.cpsat_limit, args.exact)
    print(body)
    print("\n".join(notes))
    print(f"{time.perf_counter() - began:.0f} s")
    if args.write:
        cmd = shlex.join(["python", "benchmarks/memtime_small.py", *sys.argv[1:]])
        write_section("memtime-small", "\n".join([
            "## Memory for time on small problems: the optimum against solve and against the bound",
            "",
            f"`{cmd}`  ",
            f"Machine: {machine()}. Settings: the zero-bubble paper's 1.5B (m = 24 costs) and 28.3B (m = 96)"
            " with benchmarks/memory_time.py's recompute / offload model, cut to p ranks and m microbatches;"
            " objective span. The optimum is CP-SAT's where it proves it"
            + (", or the exhaustive search's (keep / R / S) where it finishes and offloading cannot help" if args.exact else "")
            + ", else the interval between the largest proven bound and the shortest span found (then the gaps are"
            " their least, marked >=).",
            "",
            body,
            "",
            *notes,
            "",
            f"Left out (the limit is below one microbatch's activation, which any schedule holds): {', '.join(left_out)}.",
        ]))


if __name__ == "__main__":
    main()
