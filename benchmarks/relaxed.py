"""Where memory binds, which side is loose, past the small exact cases: the problem with only some
ranks held to one op at a time and to their memory, solved by CP-SAT (issue 39, point 1).

    python benchmarks/relaxed.py [--write] [--solve-limit 20] [--relax-limit 60] [--only NAME]
    python benchmarks/relaxed.py --problem FILE [--held 0,7 --held all ...] [--solve-limit 20] [--relax-limit 60]

A schedule of the problem is a solution of the relaxation, which drops the other ranks' lanes and
memory (their ops keep their costs and data edges: ``solvers.search.cpsat.relaxation``). So what
CP-SAT proves of the relaxation bounds the problem, and where it solves the relaxation with one
rank held and that optimum is no more than schedc's bound, no argument about that rank alone (what
its own lane and memory force, the other ranks free) can raise the bound: what is left of the gap
comes from the ranks together, or from the search.

Cells, objective span (the model of benchmarks/memory_time.py: full and selective recompute,
offload):

- the zero-bubble paper's 1.5B (m = 24 costs) cut to p = 8 and m = 8, 12, 16 at 0.25x of 1F1B's
  activation memory, loop placement, where the gap grows with m (docs/results.md, "Which side is
  loose");
- the same cut to p = 4, m = 4 on the V placement at 0.5x and 1x, where CP-SAT proves the optimum
  and schedc's bound stays 1.2 % and 1.1 % below it (benchmarks/RESULTS.md, "Memory for time on
  small problems");
- the table's 1.5B m = 24 V at 0.75x (examples/problems/memory-time): rank 0 alone, rank 7 (the V's
  middle rank, on most of rank 0's critical path) alone, ranks 6 and 7, and every rank.

Per cell: `solve` (in this process, --solve-limit seconds; its schedule is every relaxation's hint),
schedc's bound (`lower_bound`), and per set of ranks held CP-SAT for --relax-limit seconds from
schedc's bound: "proves" is its bound, never below schedc's (marked optimal where it solved the
relaxation: its optimum, or schedc's bound if the optimum lies below), "found" the least objective of
the relaxation it found (the optimum lies at or below it). --write puts the table into
benchmarks/RESULTS.md (section relaxed).

``--problem FILE`` (repeatable) runs those problem files instead of the cells above, printed and
never written, holding the ranks of each ``--held`` (repeatable: ranks separated by commas, or
``all``; by default each rank alone, ranks 0 and 1, and all).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from memtime_small import small_problem  # noqa: E402

from schedc import load_problem  # noqa: E402
from schedc.errors import SchedcError  # noqa: E402
from schedc.solvers.bounds import lower_bound  # noqa: E402
from schedc.solvers.search.cpsat import relaxation  # noqa: E402
from schedc.solvers.search.solve import solve  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REL = 1e-6  # bounds this close are equal


def cells() -> list[tuple]:
    """(problem, the sets of ranks to hold): each rank alone, the first two, and all, unless named."""
    out = []
    for m in (8, 12, 16):
        out.append((small_problem("1.5B", 24, 8, m, 0.25, False), None))
    for limit in (0.5, 1.0):
        out.append((small_problem("1.5B", 24, 4, 4, limit, True), None))
    table_cell = load_problem(ROOT / "examples/problems/memory-time/mt-1.5B-m24-0.75x-v.yaml")
    out.append((table_cell, [(0,), (7,), (6, 7), tuple(range(8))]))
    return out


def rank_sets(problem, named) -> list[tuple[int, ...]]:
    if named is not None:
        return named
    p = problem.ranks
    return list(dict.fromkeys([(r,) for r in range(p)] + [(0, 1)[:p], tuple(range(p))]))  # (each once on small p)


def parse_held(text: str, p: int) -> tuple[int, ...]:
    """``--held``'s ranks: numbers separated by commas, or ``all``; ValueError (its message the
    reason) for anything else or a rank the problem does not have."""
    if text.strip() == "all":
        return tuple(range(p))
    try:
        ranks = tuple(sorted({int(x) for x in text.split(",")}))
    except ValueError:
        raise ValueError(f"--held takes ranks separated by commas, or all, not {text!r}") from None
    if not all(0 <= r < p for r in ranks):
        raise ValueError(f"--held {text}: this problem's ranks are 0-{p - 1}")
    return ranks


def held_text(held: tuple[int, ...], p: int) -> str:
    if len(held) == p:
        return "all"
    return ", ".join(map(str, held))


def run_cell(problem, sets, solve_limit: float, relax_limit: float) -> list[dict]:
    bound = lower_bound(problem).value
    result = solve(problem, time_limit=solve_limit)
    rows = []
    for held in sets:
        began = time.perf_counter()
        r = relaxation(problem, result.timeline, held, relax_limit, lower=bound)
        rows.append({"held": held, "proves": r.bound, "found": r.value, "optimal": r.optimal,
                     "wall": time.perf_counter() - began})
        print(problem.name, held, rows[-1], flush=True)
    return [{"name": problem.name, "ranks": problem.ranks, "ops": sum(map(len, result.timeline.schedule.ranks)),
             "solve": result.objective, "bound": bound, **row} for row in rows]


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(rows: list[dict]) -> tuple[str, list[str]]:
    lines = ["| problem | ops (solve's) | solve | schedc's bound | ranks held | relaxation proves | relaxation found | s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        proves = fmt(r["proves"]) + (" (optimal)" if r["optimal"] else "")
        lines.append(f"| {r['name']} | {r['ops']} | {fmt(r['solve'])} | {fmt(r['bound'])} | {held_text(r['held'], r['ranks'])}"
                     f" | {proves} | {fmt(r['found'])} | {r['wall']:.0f} |")
    notes = []
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = [r for r in rows if r["name"] == name]
        base, span, p = mine[0]["bound"], mine[0]["solve"], mine[0]["ranks"]
        parts = [f"solve {span:.1f}, schedc's bound {base:.1f}"]
        part = [r for r in mine if len(r["held"]) < p]
        solved = sum(r["optimal"] for r in part)
        above = [r for r in part if r["proves"] is not None and r["proves"] > base * (1 + REL)]
        parts.append(f"{solved} of {len(part)} relaxations solved, "
                     + ("; ".join(f"holding {held_text(r['held'], p)} proves {r['proves']:.1f}" for r in above)
                        if above else "none proves more than schedc's bound"))
        for r in mine:
            if len(r["held"]) == p:  # every rank held: the problem itself
                parts.append(f"the problem itself {'solved' if r['optimal'] else 'not solved'}: proves {fmt(r['proves'])},"
                             f" found {fmt(r['found'])}")
        notes.append(f"- {name}: " + "; ".join(parts))
    return "\n".join(lines), notes


def main() -> None:
    from _results import commit, machine, refuse_partial_write, write_section

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    ap.add_argument("--solve-limit", type=float, default=20.0, help="seconds of solve per cell (the relaxations' hint)")
    ap.add_argument("--relax-limit", type=float, default=60.0, help="seconds of CP-SAT per relaxation")
    ap.add_argument("--only", default="", help="run the cells whose problem name contains this")
    ap.add_argument("--problem", action="append", default=[], metavar="FILE",
                    help="run this problem file instead of the table's cells (repeatable; printed, never written)")
    ap.add_argument("--held", action="append", default=[], metavar="RANKS",
                    help="with --problem: the ranks to hold, separated by commas, or all (repeatable; default: each"
                    " rank alone, ranks 0 and 1, and all)")
    args = ap.parse_args()
    refuse_partial_write(ap, args)
    if args.write and args.problem:
        ap.error("--write publishes the table's own cells: not with --problem (printed, never written)")
    if args.held and not args.problem:
        ap.error("--held goes with --problem (the table's cells hold their own ranks)")
    chosen = []
    for path in args.problem:
        try:
            problem = load_problem(path)
            named = [parse_held(text, problem.ranks) for text in args.held] or None
        except (SchedcError, OSError, ValueError) as e:
            ap.error(f"--problem {path}: {e}")
        chosen.append((problem, named))
    began = time.perf_counter()
    rows = []
    for problem, named in chosen or cells():
        if args.only in problem.name:
            rows += run_cell(problem, rank_sets(problem, named), args.solve_limit, args.relax_limit)
    body, notes = table(rows)
    print(body)
    print("\n".join(notes))
    print(f"{time.perf_counter() - began:.0f} s")
    if args.write:
        cmd = shlex.join(["python", "benchmarks/relaxed.py", *sys.argv[1:]])
        write_section("relaxed", "\n".join([
            "## Memory for time: the bound against relaxations that hold some ranks",
            "",
            f"`{cmd}`  ",
            f"Machine: {machine()}. Commit: {commit()}. CP-SAT on the problem with only the ranks held kept to one op at"
            " a time and to their memory (the others' ops keep costs and data edges), from schedc's bound: what it"
            " proves bounds the problem; \"optimal\" marks a relaxation solved. Settings as in benchmarks/memtime_small.py"
            " (the zero-bubble paper's 1.5B, cut), and the table's 1.5B m = 24 V at 0.75x; objective span.",
            "",
            body,
            "",
            *notes,
        ]))


if __name__ == "__main__":
    main()
