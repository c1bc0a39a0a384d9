"""Does `schedc solve --time-limit S` keep to S? The wall time of the whole command.

    python benchmarks/solve_time.py [--solvers cbc,cpsat] [--limit 5] [--write]

Each case runs `schedc solve PROBLEM --time-limit S --json` as a subprocess, so the time is the
whole command: interpreter start and imports, the warm start (building and simulating the
registry schedules), the search, and writing the schedule file. Cases: p = 32, m = 256 with
heterogeneous costs (first and last stage heavier, comm 3%, as in benchmarks/solve.py) and the
memory limit of 1F1B's activation memory, v = 1 (loop) and v = 2 (V placement), objectives
makespan and span, each solver, limit --limit (5 s); and p = 8, m = 24 problems of the zero
bubble paper (examples/problems/zb-paper/): the 1.5B model's ZB-2p setting with limit 60 s
(CBC), and the 6.2B model's, where the search runs to the limit, with 60 s (CBC) and with
--limit (both solvers).

Columns: wall time; overrun = wall - limit (the target: at most 10% of the limit + 2 s); first
progress = when the first progress line (the warm start's) reached stderr; the status and where
the result came from.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_section  # noqa: E402
from solve import make_problem  # noqa: E402

ZB_PAPER = Path(__file__).resolve().parent.parent / "examples" / "problems" / "zb-paper"


def problems(tmp: Path, limit: float, solvers: list[str]):
    """(label, problem file, time limit, solvers) per case."""
    for v in (1, 2):
        base = make_problem(32, 256, v, "heterogeneous", 1.0)
        for objective in ("makespan", "span"):
            problem = base.with_changes(objective=objective, name=f"heterogeneous-p32-m256-v{v}-{objective}")
            path = tmp / f"{problem.name}.json"
            path.write_text(problem.model_dump_json())
            yield problem.name, path, limit, solvers
    one_and_a_half, six = ZB_PAPER / "zb-1.5B-m24-2p.yaml", ZB_PAPER / "zb-6.2B-m24-2p.yaml"
    yield one_and_a_half.stem, one_and_a_half, 60.0, ["cbc"]
    yield six.stem, six, 60.0, ["cbc"]
    yield six.stem, six, limit, solvers


def schedc_command() -> list[str]:
    script = Path(sys.executable).with_name("schedc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "schedc.app.cli"]


def run(path: Path, limit: float, solver: str, out: Path) -> dict:
    """Run one solve; its wall time, when its first progress line came, and its JSON result."""
    cmd = [*schedc_command(), "solve", str(path), "-o", str(out), "--time-limit", f"{limit:g}", "--solver", solver,
           "--json"]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first: list[float] = []
    lines: list[str] = []

    def read_stderr():
        for line in proc.stderr:
            lines.append(line)
            if not first and line[:1] == " ":  # progress lines start with the right-aligned seconds
                first.append(time.perf_counter() - began)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    stdout = proc.stdout.read()
    proc.wait()
    wall = time.perf_counter() - began
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(cpu_after, f) - getattr(cpu_before, f) for f in ("ru_utime", "ru_stime"))
    reader.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{''.join(lines)}{stdout}")
    return dict(wall=wall, cpu=cpu, first=first[0] if first else None, result=json.loads(stdout),
                stderr="".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--solvers", default="cbc,cpsat", help="comma-separated, for the p = 32 cases")
    ap.add_argument("--limit", type=float, default=5.0, help="time limit of the p = 32 cases")
    ap.add_argument("--verbose", action="store_true", help="print each run's progress lines")
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()
    names = [s.strip() for s in args.solvers.split(",") if s.strip()]

    rows = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for label, path, limit, solvers in problems(tmp, args.limit, names):
            for solver in solvers:
                r = run(path, limit, solver, tmp / "out.json")
                res = r["result"]
                overrun = r["wall"] - limit
                ok = overrun <= 0.1 * limit + 2.0
                source = "registry" if res["objective"] >= res["warm_objective"] - 1e-9 else "search"
                rows.append((label, solver, limit, r["wall"], overrun, ok, r["cpu"], r["first"], res, source))
                print(
                    f"{label} {solver} limit {limit:g} s: wall {r['wall']:.1f} s (overrun {overrun:+.1f} s,"
                    f" cpu {r['cpu']:.1f} s,"
                    f" {'ok' if ok else 'OVER'}), first progress {r['first']:.1f} s, {res['status']},"
                    f" {res['objective_kind']} {res['objective']:.6g} ({source}; warm start {res['warm_start']}"
                    f"{', not evaluated: ' + ' '.join(res['not_evaluated']) if res['not_evaluated'] else ''})",
                    flush=True,
                )
                if args.verbose:
                    print(r["stderr"], flush=True)

    load_after = os.getloadavg()[0]
    lines = [
        "## schedc solve: wall time against --time-limit",
        "",
        f"Command: `python benchmarks/solve_time.py --solvers {','.join(names)} --limit {args.limit:g} --write`  ",
        f"Machine: {machine()}; load average {load_before:.1f} at the start, {load_after:.1f} at the end"
        " (other jobs shared the machine)  ",
        "Wall: the whole `schedc solve` command as a subprocess (interpreter start, imports, warm start, search,"
        " writing the schedule file). Overrun: wall - limit; the target is at most 10% of the limit + 2 s."
        " CPU: user + system time of the command and the processes it started (CBC, workers): on a machine"
        " shared with other jobs, the wall time it would take alone is about this or less (CBC and CP-SAT may use"
        " more than one core)."
        " First progress: when the first progress line reached stderr. Result: from the registry (warm start)"
        " or the search; not evaluated: registry schedules the time limit left out.",
        "",
        "| problem | solver | limit (s) | wall (s) | overrun (s) | within 10% + 2 s | CPU (s) | first progress (s)"
        " | status | result | not evaluated |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, solver, limit, wall, overrun, ok, cpu, first, res, source in rows:
        lines.append(
            f"| {label} | {solver} | {limit:g} | {wall:.1f} | {overrun:+.1f} | {'yes' if ok else 'no'} | {cpu:.1f} |"
            f" {first:.1f} | {res['status']} | {source} ({res['warm_start']}) |"
            f" {', '.join(res['not_evaluated']) or '-'} |"
        )
    print("\n".join(lines))
    if args.write:
        write_section("solve-time", "\n".join(lines))


if __name__ == "__main__":
    main()
