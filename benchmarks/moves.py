"""How fast the local search of `schedc solve` judges a move: from the replay of the order the move
changes, against replaying the moved order from nothing.

    python benchmarks/moves.py [--moves 300] [--repeat 3] [--write]

For each case, the moves the climb tries first from the case's start schedule (its targeted and
reach moves, policy moves and exchanges, `localsearch._candidates`; a policy move over the room
repaired as the climb repairs it), a seeded sample of --moves of them, each judged both ways
(`_Evaluator.replayed` with and without the replay it starts from). The verdicts and times must be
the same (the script exits 1 where one is not); what differs is the time, reported as the median
over --repeat passes and as a ratio within the run, and the share of ops each move replays again.
--write puts the table into benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

import schedc.solvers as solvers
from schedc import Problem, load_problem
from schedc.solvers.search.localsearch import _apply, _candidates, _Evaluator, _policy_rank, _repaired

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import commit, machine, write_section  # noqa: E402
from simulate import median_seconds  # noqa: E402

PROBLEMS = Path(__file__).resolve().parent.parent / "examples" / "problems"


def cases() -> list[tuple[str, Problem, str]]:
    """(label, problem, start schedule): the paper's 2p setting, two memory-time cells (recompute
    policies to choose, loop and V), and a large loop problem."""
    large = Problem.parse(dict(name="p32-m256", ranks=32, microbatches=256, costs=dict(F=1.0, B=1.1, W=0.7),
                               comm=0.05))
    return [
        ("zb-1.5B-m24-2p", load_problem(PROBLEMS / "zb-paper" / "zb-1.5B-m24-2p.yaml"), "zb-greedy"),
        ("mt-1.5B-m24-0.25x", load_problem(PROBLEMS / "memory-time" / "mt-1.5B-m24-0.25x.yaml"), "zb-greedy"),
        ("mt-6.2B-m24-0.75x-v", load_problem(PROBLEMS / "memory-time" / "mt-6.2B-m24-0.75x-v.yaml"), "zb-greedy"),
        ("p32-m256", large, "zb-h1"),
    ]


def measure(problem: Problem, name: str, n_moves: int, repeat: int) -> dict:
    schedule = solvers.build(name, problem)
    ev = _Evaluator(problem, schedule)
    orders = ev.orders(schedule)
    base = ev.replayed(orders)
    if base is None:
        raise SystemExit(f"{problem.name}: {name} does not fit or deadlocks: nothing to move from")
    moves = list(_candidates(ev, orders, *ev.times(base), 3, True))
    trials = []
    for move in random.Random(0).sample(moves, min(n_moves, len(moves))):
        trial = _apply(ev, orders, move)
        if ev.replayed(trial) is None and ev.room is not None and (r := _policy_rank(move)) is not None:
            trial = _repaired(ev, trial, r) or trial
        trials.append(trial)
    replayed_again = []
    for trial in trials:
        fresh, resumed = ev.replayed(trial), ev.replayed(trial, base)
        if (fresh is None) != (resumed is None) or (
                fresh is not None and (fresh.start, fresh.end) != (resumed.start, resumed.end)):
            raise SystemExit(f"{problem.name}: a move judged from the replay differs from the replay from nothing")
        if resumed is not None:
            # (the ops it kept hold the base's own time objects; those it replayed, new ones)
            kept = sum(sum(1 for a, b in zip(x, y) if a is b) for x, y in zip(resumed.start, base.start))
            replayed_again.append(1 - kept / len(ev.ops))

    fresh_s = median_seconds(lambda: [ev.replayed(trial) for trial in trials], repeat) / len(trials)
    resumed_s = median_seconds(lambda: [ev.replayed(trial, base) for trial in trials], repeat) / len(trials)
    return dict(ops=len(ev.ops), moves=len(trials), judged=len(replayed_again), fresh=fresh_s, resumed=resumed_s,
                again=statistics.mean(replayed_again) if replayed_again else float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moves", type=int, default=300, help="moves sampled per case (default 300)")
    ap.add_argument("--repeat", type=int, default=3, help="passes over the moves, the median kept (default 3)")
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()
    rows = []
    for label, problem, name in cases():
        row = measure(problem, name, args.moves, args.repeat)
        rows.append((label, name, row))
        print(f"{label} from {name}: {row['ops']} ops, {row['moves']} moves, {row['fresh'] * 1e3:.3f} ms from nothing,"
              f" {row['resumed'] * 1e3:.3f} ms from the replay", flush=True)
    table = [
        "## Local search: a move judged from the replay it changes",
        "",
        f"Command: `python benchmarks/moves.py --moves {args.moves} --repeat {args.repeat} --write`  ",
        f"Machine: {machine()}. Commit: {commit()}.  ",
        "The climb's first moves from the start schedule (a seeded sample), each judged by replaying the moved",
        "order from nothing and from the replay of the order it moved (`_Evaluator.replayed`); same verdicts and",
        "times, checked. Median of the passes, per move; the speed-up is the ratio of the two within this run.",
        "Replayed again: the mean share of the ops a move that fits replays.",
        "",
        "| problem | start | ops | moves | fit | ms from nothing | ms from the replay | speed-up | replayed again |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, name, r in rows:
        table.append(f"| {label} | {name} | {r['ops']} | {r['moves']} | {r['judged']} | {r['fresh'] * 1e3:.3f}"
                     f" | {r['resumed'] * 1e3:.3f} | {r['fresh'] / r['resumed']:.1f}x | {100 * r['again']:.0f} % |")
    print("\n".join(table))
    if args.write:
        write_section("moves", "\n".join(table))


if __name__ == "__main__":
    main()
