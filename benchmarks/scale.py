"""Solve at the sizes people train at: wall time, CPU per op and gap of each command, from a few
thousand to 400 000 ops.

    python benchmarks/scale.py [--write] [--time-limit S] [--only TEXT[,TEXT...]] [--jobs N] [--max-ops N] [--out DIR]
    python benchmarks/scale.py --report [--write] [--out DIR]   # the table again from a run's cells
    python benchmarks/scale.py --resolve [--write]   # only the re-solve figure (point 6)
    python benchmarks/scale.py --per-op [--write]    # only the constants per op (point 4)

Cells (issue 40):

- the grid p in {8, 16, 32, 64}, v in {1, 2} (loop placement, V placement), m in {4p, 8p, 16p};
  each stage's F, B, W drawn uniformly within +-30 % of 1, 1.1 and 0.9 (seeded by p, v, m), the
  last stage's times 1.5x (the LM head and loss), comm 0.05, each chunk's activation 1/v, B frees
  half of it; the memory limit 1.0x and 1.5x of 1F1B's activation memory (p microbatches through
  each rank's stages: ``greedy.reference_limit``), objective makespan;
- the zero-bubble paper's 28.3B setting (benchmarks/zb_paper.py) at m = 96, 128, 256, loop and V,
  at 1x and 2x of its memory (the paper's ZB-1p and ZB-2p limits).

Per cell, each command runs as a subprocess (so the figures are the command's: interpreter
start-up, imports, reading, writing):

- `schedc compare PROBLEM --json`: the best registry schedule that fits, as compare judges it;
- `schedc solve PROBLEM --time-limit S --json` (``--threads 1`` when cells run at once): wall
  time, the result, the proven bound, the gap, and whether the search ran (its log says
  "search:") where the warm start was not already proven optimal;
- `schedc compile PROBLEM -s zb-h1|zb-v`, `schedc simulate FILE --json` and `schedc check FILE
  --json` on the solved file: CPU time per op, the start-up (`schedc --version`, measured once)
  taken off.

CPU time is user + system of the command and every process it started. The machine may be shared:
the load average is printed with the table.

The re-solve (``--resolve``): the grid's p = 8, v = 2, m = 32 cell at 1x memory, solved in 60 s;
then RESOLVES copies with every stage's F, B and W scaled by a factor drawn within +-5 % (seeded),
each solved in 1 s (``solve(problem, time_limit=1)``) from scratch and with the first schedule as
its start (``start=``): the gap to each copy's proven bound and the solver's seconds.

The constants per op (``--per-op``): at the ceiling, the p = 64, v = 2, m = 1024 cell at 1.5x
(393 216 ops), `schedc check`'s CPU and peak resident memory on its `zb-v` schedule file against
`schedc --version`'s; there and at p = 32, v = 2, m = 256 (49 152 ops), in one process, the CPU of
loading against saving the file and of the critical path against the simulation (best of three
each).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(__file__))

from _results import commit, machine, write_section  # noqa: E402
from solve_time import schedc_command  # noqa: E402
from zb_paper import paper_problem  # noqa: E402

from schedc import Problem  # noqa: E402
from schedc.solvers.families.greedy import reference_limit  # noqa: E402

GRID_P = (8, 16, 32, 64)
GRID_V = (1, 2)
GRID_M = (4, 8, 16)  # x p
LIMITS = (1.0, 1.5)  # x 1F1B's activation memory
PAPER_M = (96, 128, 256)
PAPER_K = (1, 2)  # the paper's ZB-1p and ZB-2p memory
MEANS = {"F": 1.0, "B": 1.1, "W": 0.9}


def grid_problem(p: int, v: int, m: int, limit: float) -> Problem:
    n = p * v
    rng = random.Random(f"scale-{p}-{v}-{m}")
    costs = {kind: [round(mean / v * rng.uniform(0.7, 1.3) * (1.5 if s == n - 1 else 1.0), 6) for s in range(n)]
             for kind, mean in MEANS.items()}
    problem = Problem.parse(dict(
        name=f"scale-p{p}-v{v}-m{m}-{limit:g}x", ranks=p, microbatches=m, chunks=v,
        placement="v" if v == 2 else "loop", costs=costs, comm=0.05, memory=dict(F=1.0 / v, B=-0.5 / v),
        objective="makespan",
    ))
    room = reference_limit(problem, p)
    return problem.with_changes(memory={"limit": [round(max(limit * x, problem.min_memory(r)), 9)
                                                  for r, x in enumerate(room)]})


def cells() -> list[Problem]:
    out = [grid_problem(p, v, k * p, limit) for p in GRID_P for v in GRID_V for k in GRID_M for limit in LIMITS]
    for v_shape in (False, True):
        for m in PAPER_M:
            for k in PAPER_K:
                problem = paper_problem("28.3B", m, k, v_shape=v_shape)
                out.append(problem.with_changes(name=f"zb-28.3B-m{m}-{k}p" + ("-v" if v_shape else "")))
    return out


def ops(problem: Problem) -> int:
    return 3 * problem.n_stages * problem.microbatches


class Run(NamedTuple):
    wall: float  # seconds
    cpu: float  # user + system seconds of the command and every process it started
    peak_kib: int  # the largest resident set of it or of any one of its children (KiB)
    out: str
    err: str


def timed(args: list[str], cwd: Path) -> Run:
    """A `schedc` command run to its end (a failure raises, with its last words)."""
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        began = time.perf_counter()
        proc = subprocess.Popen([*schedc_command(), *args], cwd=cwd, stdout=out_file, stderr=err_file)
        _, status, usage = os.wait4(proc.pid, 0)  # (this child's CPU and its children's, not other cells')
        wall = time.perf_counter() - began
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    if code != 0:
        raise RuntimeError(f"schedc {' '.join(args)} failed ({code}): {err[-2000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, out, err)


def run_cell(problem: Problem, time_limit: float, threads: int | None, out_dir: Path) -> dict:
    here = out_dir / problem.name
    here.mkdir(parents=True, exist_ok=True)
    path = here / "problem.json"
    path.write_text(problem.model_dump_json(exclude_none=True))
    _, compare_cpu, _, out, _ = timed(["compare", str(path), "--json"], here)
    fitting = [r[problem.objective] for r in json.loads(out)["results"] if r.get("applies") and r.get("fits")]
    best = min(fitting) if fitting else None
    solve = ["solve", str(path), "-o", "solved.json", "--time-limit", f"{time_limit:g}", "--json"]
    wall, solve_cpu, _, out, err = timed(solve + (["--threads", str(threads)] if threads else []), here)
    result = json.loads(out)
    named = "zb-v" if problem.chunks == 2 else "zb-h1"
    compile_cpu = timed(["compile", str(path), "-s", named, "-o", "compiled.json"], here).cpu
    simulate_cpu = timed(["simulate", "solved.json", "--json"], here).cpu
    check_cpu = timed(["check", "solved.json", "--json"], here).cpu
    proven = result["status"] == "optimal" and result["warm_objective"] <= result["objective"] + 1e-9
    return dict(
        name=problem.name, ops=ops(problem), time_limit=time_limit, wall=wall, best_registry=best,
        objective=result["objective"], bound=result["bound"], gap=result["gap"], status=result["status"],
        warm_start=result["warm_start"], not_evaluated=result["not_evaluated"],
        # (the search ran: the backend's log line, or a result better than the warm start, found by the local search)
        searched="search:" in err or result["objective"] < result["warm_objective"] - 1e-9, warm_optimal=proven,
        cpu={"compare": compare_cpu, "solve": solve_cpu, "compile": compile_cpu, "simulate": simulate_cpu,
             "check": check_cpu},
    )


def startup(cwd: Path) -> float:
    """CPU seconds of `schedc --version`: the interpreter and the CLI's imports (best of three)."""
    return min(timed(["--version"], cwd).cpu for _ in range(3))


def report(rows: list[dict], start_cpu: float, command: str, loads: tuple[float, float], head: str) -> str:
    startup = lambda r: r.get("run", {}).get("startup", start_cpu)  # noqa: E731  (each run measured its own)
    per_op = lambda r, c: 1e6 * max(0.0, r["cpu"][c] - startup(r)) / r["ops"]  # noqa: E731
    low, high = min(map(startup, rows), default=start_cpu), max(map(startup, rows), default=start_cpu)
    lines = [
        "## Scale: solve and the other commands from thousands to hundreds of thousands of ops",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}; load average {loads[0]:.1f} at the start, {loads[1]:.1f} at the end. Commit: {head}  ",
        f"Start-up (`schedc --version`, CPU): {low:.2f}" + (f"-{high:.2f}" if high > low else "")
        + " s, taken off each command's CPU before dividing by"
        " the ops. Gap: (solve - its proven bound) / solve. Best registry: the best schedule `schedc compare`"
        " finds that fits. Search: the log shows the search ran (\"-\" where the warm start was already proven"
        " optimal).",
        "",
        "| cell | ops | solve wall (s) | best registry | solve | bound | gap | status | search | ≤ registry"
        " | compare µs/op | compile µs/op | simulate µs/op | check µs/op |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        within = "-" if r["best_registry"] is None else ("yes" if r["objective"] <= r["best_registry"] * (1 + 1e-9) else "NO")
        lines.append(
            f"| {r['name']} | {r['ops']} | {r['wall']:.1f} | "
            + (f"{r['best_registry']:.6g}" if r["best_registry"] is not None else "-")
            + f" | {r['objective']:.6g} | {r['bound']:.6g} | {100 * r['gap']:.2f} % | {r['status']} | "
            + ("-" if r["warm_optimal"] else ("yes" if _searched(r) else "no"))
            + f" | {within} | {per_op(r, 'compare'):.0f} | {per_op(r, 'compile'):.0f} | {per_op(r, 'simulate'):.0f}"
            f" | {per_op(r, 'check'):.0f} |"
        )
    return "\n".join(lines) + "\n"


def _searched(row: dict) -> bool:
    """The search ran: its log says so, or the result beats the best registry schedule (rows of an
    earlier run recorded only the log line)."""
    best = row["best_registry"]
    return row["searched"] or (best is not None and row["objective"] < best * (1 - 1e-9))


def _chunks(name: str) -> int:
    """v of a cell, from its name (``cells``: "-v2-" in the grid's, "-v" at the end of the paper's V cells)."""
    return 2 if "-v2-" in name or name.endswith("-v") else 1


def plot(rows: list[dict], start_cpu: float, path: Path) -> None:
    """Left: each command's time against the ops (log-log; CPU less start-up, solve's wall), a marker
    per cell. Right: solve's gap against the ops (ops on a log scale; 0 where proven optimal)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = [r["ops"] for r in rows]
    for command, marker in (("compare", "o"), ("compile", "v"), ("simulate", "s"), ("check", "D")):
        left.scatter(x, [max(1e-3, r["cpu"][command] - start_cpu) for r in rows], marker=marker, s=18, label=command)
    left.scatter(x, [r["wall"] for r in rows], marker="^", color="k", s=22, label="solve (wall)")
    left.set(xscale="log", yscale="log", xlabel="ops", ylabel="seconds (CPU less start-up; solve: wall)",
             title="time against size")
    left.legend(fontsize=8)
    for v, marker in ((1, "o"), (2, "s")):
        mine = [r for r in rows if _chunks(r["name"]) == v]
        right.scatter([r["ops"] for r in mine], [100 * r["gap"] for r in mine], marker=marker, label=f"v = {v}")
    right.set(xscale="log", xlabel="ops", ylabel="gap to the proven bound (%)", title="solve's gap (0: proven optimal)")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


RESOLVES = 5


def resolve_figure(command: str) -> str:
    """The re-solve rows (see the module notes) as a RESULTS.md section."""
    from schedc.solvers.search.solve import solve

    base = grid_problem(8, 2, 32, 1.0)
    first = solve(base, time_limit=60.0)
    rows = []
    for seed in range(RESOLVES):
        rng = random.Random(f"resolve-{seed}")
        costs = {k: [round(x * rng.uniform(0.95, 1.05), 6) for x in base.cost[k]] for k in MEANS}
        problem = base.with_changes(name=f"{base.name}-perturbed-{seed}", costs=costs)
        plain = solve(problem, time_limit=1.0)
        again = solve(problem, time_limit=1.0, start=first.schedule)
        rows.append((seed, plain, again))
        print(f"perturbed {seed}: from scratch gap {100 * plain.gap:.2f} % in {plain.seconds:.2f} s, from the"
              f" start {100 * again.gap:.2f} % in {again.seconds:.2f} s", flush=True)
    lines = [
        "## Re-solve: from the schedule solved before the costs changed",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}. Commit: {commit()}  ",
        f"{base.name} ({ops(base)} ops) solved in 60 s: {first.objective:.6g}, {first.status}, gap"
        f" {100 * first.gap:.2f} %. Each row: the same problem with every stage's F, B and W within +-5 %,"
        " solved in 1 s from scratch and with that schedule as its start (`solve(problem, start=...)`,"
        " `schedc solve --start OLD.json`); gap to the row's proven bound, and the solver's seconds.",
        "",
        "| perturbation | from scratch: gap | seconds | from the start: gap | seconds | started from |",
        "|---|---|---|---|---|---|",
        *(f"| {seed} | {100 * plain.gap:.2f} % | {plain.seconds:.2f} | {100 * again.gap:.2f} % | {again.seconds:.2f}"
          f" | {again.warm_start} |" for seed, plain, again in rows),
    ]
    return "\n".join(lines) + "\n"


# One process: each pass on the file, best of three (CPU seconds), as JSON.
PASSES = """
import json, sys, time
from schedc import schedfile
from schedc.critical import critical_path
from schedc.simulate import simulate
def best(work):
    times = []
    for _ in range(3):
        began = time.process_time()
        work()
        times.append(time.process_time() - began)
    return min(times)
path, again = sys.argv[1], sys.argv[2]
compiled = schedfile.load(path)
print(json.dumps({
    "load": best(lambda: schedfile.load(path)),
    "save": best(lambda: schedfile.save(compiled, again)),
    "simulate": best(lambda: simulate(compiled.problem, compiled.schedule)),
    "critical path": best(lambda: critical_path(compiled.timeline)),
}))
"""


def per_op_figure(out_dir: Path, command: str) -> str:
    """Issue 40's point 4: at the ceiling (the p = 64, v = 2, m = 1024 cell at 1.5x, 393 216 ops),
    `schedc check` on its ZB-V schedule file, CPU and peak memory above the start-up's (best of
    three); there and at p = 32, v = 2, m = 256 (49 152 ops), in one process, loading the file
    against saving it and the critical path against the simulation."""
    start, passes, sizes = None, {}, []
    for problem in (grid_problem(32, 2, 256, 1.5), grid_problem(64, 2, 1024, 1.5)):
        here = out_dir / "per-op" / problem.name
        here.mkdir(parents=True, exist_ok=True)
        (here / "problem.json").write_text(problem.model_dump_json(exclude_none=True))
        timed(["compile", "problem.json", "-s", "zb-v", "-o", "zb-v.json"], here)
        passes[problem.name] = json.loads(subprocess.run(
            [sys.executable, "-c", PASSES, "zb-v.json", "again.json"], cwd=here, check=True, capture_output=True,
            text=True).stdout)
        start = start or min((timed(["--version"], here) for _ in range(3)), key=lambda run: run.cpu)
        sizes.append(f"{problem.name}, {ops(problem)} ops: {(here / 'zb-v.json').stat().st_size / 2**20:.0f} MiB")
    check = min((timed(["check", "zb-v.json", "--json"], here) for _ in range(3)), key=lambda run: run.cpu)
    n = ops(problem)
    above = check.peak_kib - start.peak_kib
    lines = [
        "## Scale: the constants per op",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}; load average {os.getloadavg()[0]:.1f}. Commit: {commit()}  ",
        f"Each cell's `zb-v` schedule file ({'; '.join(sizes)}); CPU is user + system, best of three.",
        "",
        "| figure | measured | target |",
        "|---|---|---|",
        f"| `schedc check` CPU, {problem.name} ({n} ops) | {check.cpu:.1f} s ({check.cpu - start.cpu:.1f} s above the"
        f" start-up's {start.cpu:.2f} s) | at most 15 s |",
        f"| `schedc check` peak memory above the start-up's, {problem.name} | {above / 1024:.0f} MiB,"
        f" {above / n:.2f} KiB per op ({check.peak_kib / 1024:.0f} MiB in all, start-up {start.peak_kib / 1024:.0f}"
        " MiB) | at most 1 KiB per op |",
    ]
    for name, got in passes.items():
        lines += [
            f"| loading the file against saving it, {name} | {got['load']:.2f} s against {got['save']:.2f} s:"
            f" {got['load'] / got['save']:.2f}x | at most 3x |",
            f"| the critical path against the simulation, {name} | {got['critical path']:.2f} s against"
            f" {got['simulate']:.2f} s: {got['critical path'] / got['simulate']:.2f}x | at most 1x |",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-limit", type=float, default=60.0, help="solve's --time-limit per cell (60)")
    ap.add_argument("--only", default="", help="cells whose name contains this text (comma-separated: any of them)")
    ap.add_argument("--max-ops", type=int, default=None, help="skip cells of more ops than this")
    ap.add_argument("--jobs", type=int, default=1, help="cells at once (each solve then gets --threads 1)")
    ap.add_argument("--out", default="out/scale", help="where the problem and schedule files go")
    ap.add_argument("--write", action="store_true", help="write RESULTS.md's section and benchmarks/scale.png")
    ap.add_argument("--report", action="store_true", help="only the table, from the cells a run left in --out")
    ap.add_argument("--resolve", action="store_true", help="only the re-solve figure (see the notes above)")
    ap.add_argument("--per-op", action="store_true", help="only the constants per op (see the notes above)")
    args = ap.parse_args()
    if args.per_op:
        text = per_op_figure(Path(args.out), ("python benchmarks/scale.py " + " ".join(sys.argv[1:])).strip())
        print(text)
        if args.write:
            write_section("per-op", text)
        return
    if args.resolve:
        text = resolve_figure(("python benchmarks/scale.py " + " ".join(sys.argv[1:])).strip())
        print(text)
        if args.write:
            write_section("resolve", text)
        return
    if args.report:
        saved = [json.loads(f.read_text()) for f in sorted(Path(args.out).glob("*/row.json"))]
        rows = sorted((r for r in saved if r.get("run")), key=lambda r: r["ops"])
        if not rows:
            raise SystemExit(f"no finished cells in {args.out}")
        runs = list({r["run"]["command"]: r["run"] for r in rows}.values())  # (cells of several runs: each named)
        loaded = [run["loads"] for run in runs if "loads" in run]  # (a run stopped before its end has none)
        finish(rows, runs[0]["startup"], "`, then `".join(run["command"] for run in runs),
               (min(x[0] for x in loaded), max(x[-1] for x in loaded)),
               ", ".join(dict.fromkeys(run.get("commit", "unknown") for run in runs)), args.write)
        return
    wanted = [text for text in args.only.split(",") if text] or [""]
    chosen = [c for c in cells()
              if any(text in c.name for text in wanted) and (args.max_ops is None or ops(c) <= args.max_ops)]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        start_cpu = startup(Path(tmp))
    loads = [os.getloadavg()[0]]
    threads = 1 if args.jobs > 1 else None

    command = ("python benchmarks/scale.py " + " ".join(sys.argv[1:])).strip()
    head = commit()

    def one(problem: Problem) -> dict:
        row = run_cell(problem, args.time_limit, threads, out_dir)
        # (the run's own figures, written with each cell, so that a run stopped half way still reports them)
        row["run"] = {"startup": start_cpu, "command": command, "loads": loads[:1], "commit": head}
        print(f"{row['name']}: {row['ops']} ops, solve {row['objective']:.6g} ({row['status']}, gap"
              f" {100 * row['gap']:.2f} %, wall {row['wall']:.1f} s), best registry {row['best_registry']}", flush=True)
        (out_dir / problem.name / "row.json").write_text(json.dumps(row, indent=1))
        return row

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(one, chosen))
    loads.append(os.getloadavg()[0])
    for row in rows:  # (the load at the end too, for --report)
        row["run"]["loads"] = loads
        (out_dir / row["name"] / "row.json").write_text(json.dumps(row, indent=1))
    finish(rows, start_cpu, command, tuple(loads), head, args.write)


def finish(rows: list[dict], start_cpu: float, command: str, loads: tuple[float, float], head: str,
           write: bool) -> None:
    text = report(rows, start_cpu, command, loads, head)
    print(text)
    if write:
        write_section("scale", text)
        plot(rows, start_cpu, Path(__file__).with_name("scale.png"))


if __name__ == "__main__":
    main()
