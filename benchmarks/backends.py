"""Which search backend `schedc solve` should default to where memory binds: CBC (the ILP, the
default before "auto") against CP-SAT, each as users run it, on the memory-for-time problems
(examples/problems/memory-time/, written by benchmarks/memory_time.py: the zero-bubble paper's
settings with full and selective recompute and offload declared).

    python benchmarks/backends.py [--write] [--time-limit 60] [--only TEXT]

Per cell, one after the other on the quiet machine (never two at once): `schedc solve FILE
--solver cbc` and `--solver cpsat`, each with --time-limit (the wall time of the whole command),
its file read back with `schedc simulate`; the table gives each span, the larger of the bounds
they report, and each one's gap to it. Default cells: the smallest setting (1.5B, m = 24), loop
and V, at 0.25, 0.5 and 0.75 x 1F1B's activation memory, and two larger ones (14.6B, m = 48, 16
ranks; 28.3B, m = 128, 32 ranks) at 0.5x: 576 to 24576 F, B and W ops, each with its policies.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, os.path.dirname(__file__))

from memory_time import PROBLEM_DIR  # noqa: E402
from zb_paper import run_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("cbc", "cpsat")
CELLS = ([f"mt-1.5B-m24-{limit}x{v}" for limit in ("0.25", "0.5", "0.75") for v in ("", "-v")]
         + [f"mt-{model}-0.5x{v}" for model in ("14.6B-m48", "28.3B-m128") for v in ("", "-v")])


def run(path: Path, backend: str, time_limit: float, out_dir: Path) -> dict:
    """One solve as users run it, its span as the simulator reads its file back."""
    output = out_dir / f"{path.stem}.{backend}.json"
    solved, wall, err = run_json(["solve", str(path), "-o", str(output), "--solver", backend,
                                  "--time-limit", f"{time_limit:g}", "-q"], timeout=10 * time_limit + 120)
    if solved is None:
        return {"error": err, "wall": wall}
    sim, _, err = run_json(["simulate", str(output)], timeout=600)
    if sim is None:
        return {"error": f"simulate: {err}", "wall": wall}
    return {"span": sim["span"], "bound": solved["bound"], "status": solved["status"], "wall": wall}


def main() -> None:
    from _results import commit, machine, refuse_partial_write, write_section

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md (section backends)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve (default 60)")
    ap.add_argument("--only", default="", help="only the default cells whose name contains this")
    ap.add_argument("--out", default="out/backends", help="where the schedules go")
    args = ap.parse_args()
    refuse_partial_write(ap, args)
    out_dir = ROOT / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["| problem | ops | cbc span | cpsat span | bound | cbc gap | cpsat gap |", "|---|---|---|---|---|---|---|"]
    wins = {b: 0 for b in BACKENDS}
    for name in (c for c in CELLS if args.only in c):
        path = PROBLEM_DIR / f"{name}.yaml"
        if not path.exists():
            sys.exit(f"{path} is missing: python benchmarks/memory_time.py --problems writes it")
        got = {b: run(path, b, args.time_limit, out_dir) for b in BACKENDS}
        data = yaml.safe_load(path.read_text())
        ops = 3 * data["ranks"] * data["chunks"] * data["microbatches"]
        bound = max((g["bound"] for g in got.values() if g.get("bound") is not None), default=None)
        spans = [got[b].get("span") for b in BACKENDS]
        for i, s in enumerate(spans):  # shorter than every other backend's (or the others failed)
            if s is not None and all(o is None or s < o - 1e-9 * s for j, o in enumerate(spans) if j != i):
                wins[BACKENDS[i]] += 1

        def cell(b: str, what: str) -> str:
            g = got[b]
            if "span" not in g:
                return g["error"] if what == "span" else ""
            return f"{g['span']:.1f}" if what == "span" else f"{100 * (g['span'] - bound) / g['span']:.2f}%"

        row = (f"| {name} | {ops} | {cell('cbc', 'span')} | {cell('cpsat', 'span')} | "
               f"{'' if bound is None else f'{bound:.1f}'} | {cell('cbc', 'gap')} | {cell('cpsat', 'gap')} |")
        print(row, flush=True)
        lines.append(row)
    summary = f"Shorter span: cbc in {wins['cbc']} cells, cpsat in {wins['cpsat']} (the rest equal or both failed)."
    print(summary)
    if args.write:
        cmd = shlex.join(["python", "benchmarks/backends.py", *sys.argv[1:]])
        write_section("backends", "\n".join([
            "## Search backends where memory binds: CBC against CP-SAT",
            "",
            f"Command: `{cmd}`  ",
            f"Machine: {machine()}. Commit: {commit()}. {time.strftime('%Y-%m-%d')}.",
            "",
            "Each `schedc solve --solver BACKEND --time-limit` one after the other, the span read back with"
            " `schedc simulate`; bound: the larger of the two reported; gap: (span - bound) / span. Why the"
            " default, `auto`, searches problems with recompute or offload with CP-SAT.",
            "",
            *lines,
            "",
            summary,
        ]))


if __name__ == "__main__":
    main()
