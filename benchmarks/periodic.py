"""Where memory binds in the steady state: the least period a periodic schedule reaches under the
memory limit, against solve's and the bound's time per microbatch (issue 39, point 1).

    python benchmarks/periodic.py PROBLEM --periods 46.6,46.9 [--slots 1] [--seconds 60] [--workers 8]
                                  [--depth-of SCHEDULE [--slack 25]] [--most-hold STAGE=TIME ...]
                                  [--w-after-b STAGE ...] [--no-limit] [--unrolled FILE.json] [--first-fit]

A periodic schedule with period P and k slots runs op (kind, stage) of microbatch i = q k + j at
``offset(j, kind, stage) + q P``, each (slot, stage) with one policy; CP-SAT searches the offsets
and policies for one period at a time, the memory limit exact over the period. The model, its
rounding and its objective (the least overflow of the room, then the recompute time, then one
microbatch's life) are ``schedc.solvers.search.periodic``'s (its docstring); ``check`` verifies a
plan without CP-SAT. ``--depth-of`` holds each stage as long as a given schedule's middle
microbatches do (within ``--slack``): a pattern as deep as that schedule, whose steady state can be
spliced into it without changing how much is in flight. ``--most-hold`` caps one stage's hold and
``--no-limit`` drops the memory limit: together they ask whether the lanes and edges alone allow a
pattern that shallow ("no pattern exists" where CP-SAT proves there is none). ``--w-after-b`` runs
a stage's W as its B ends, so that none is pending at its next backward.

On the loop one slot runs at 1F1B's depth: where P is less than F + B of two neighbouring
stages plus two links, each rank's B falls in the part of the period its F leaves free, on both
ranks, so each rank down the pipeline adds a whole period to the hold: stage s holds each
microbatch at least (p - 1 - s) P + F_s from its F's start to its B's start. A shallower steady
state needs several slots (``--slots``, searched from the one-slot pattern repeated).

A periodic schedule unrolled for m microbatches (``unrolled``) pays the fill and drain the pattern
leaves idle; what it measures is the steady state: if a pattern of period P fits, the time per
microbatch need not exceed P there. ``--unrolled FILE.json`` writes the shortest unrolled pattern
that fits (``seed``: relaxed, its W re-placed) as a schedule file, a start for ``schedc solve
PROBLEM --start FILE.json`` (``solve``'s warm start makes such a start itself where the pattern
holds at most four stages: ``schedc.solvers.search.periodic.start``). Prints, per period: CP-SAT's
status, the policies, stage 0's hold, the overflow, ``check``'s verdict, and the unrolled
schedule's span and fit; then schedc's bound and the work per microbatch of the busiest rank.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter

from schedc import load_problem
from schedc.kinds import Kind
from schedc.solvers.search.periodic import (  # noqa: F401 - the model, for the tests and for scratch runs
    NoPattern, Plan, busiest_work, check, holds_of, plan, repeated, search, seed, unrolled,
)


def main() -> int:
    from schedc.errors import SchedcError
    from schedc.schedfile import CompiledSchedule, load
    from schedc.simulate import simulate
    from schedc.solvers.bounds import lower_bound

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem", help="a problem file")
    ap.add_argument("--periods", required=True, help="comma-separated periods to try (time units per microbatch)")
    ap.add_argument("--slots", type=int, default=1, help="microbatches per pattern (each with its own policies)")
    ap.add_argument("--seconds", type=float, default=60.0, help="CP-SAT's seconds per period")
    ap.add_argument("--workers", type=int, default=8, help="CP-SAT's workers")
    ap.add_argument("--depth-of", metavar="SCHEDULE", help="a schedule file of the problem: the pattern holds each"
                    " stage as long as its middle microbatches do (from F's start to B's start), within --slack")
    ap.add_argument("--slack", type=float, default=25.0, help="with --depth-of: how far the holds may differ")
    ap.add_argument("--most-hold", metavar="STAGE=TIME", action="append", default=[],
                    help="hold that stage at most TIME from its F's start to its B's start (repeatable; over"
                    " --depth-of's upper end): is a pattern that shallow possible at all?")
    ap.add_argument("--w-after-b", metavar="STAGE", type=int, action="append", default=[],
                    help="that stage runs each W as its B ends, so none of its W is pending at a later backward"
                    " (repeatable)")
    ap.add_argument("--first-fit", action="store_true",
                    help="stop each period's search at its first pattern that fits (its recompute and holds are"
                    " not minimised then): a quick start for --unrolled")
    ap.add_argument("--no-limit", action="store_true",
                    help="the problem without its memory limit: what the lanes and edges alone allow")
    ap.add_argument("--unrolled", metavar="FILE.json",
                    help="write the shortest unrolled pattern that fits (over the periods tried; relaxed, its W"
                    " re-placed) as a schedule file, a start for `schedc solve PROBLEM --start FILE.json`")
    args = ap.parse_args()
    try:
        periods = [float(x) for x in args.periods.split(",")]
    except ValueError:
        ap.error(f"--periods takes numbers separated by commas, got {args.periods!r}")
    if any(x <= 0 for x in periods) or args.slots < 1 or args.seconds <= 0 or args.workers < 1:
        ap.error("--periods, --slots, --seconds and --workers must be positive")
    problem = load_problem(args.problem)
    if problem.replicas is not None or problem.seq_chunks > 1:
        ap.error("the periodic pattern is one pipeline of whole microbatches: no replicas, no sequence chunks")
    if args.unrolled and args.no_limit:
        ap.error("--unrolled writes a schedule of the problem as it is: not with --no-limit")
    if args.no_limit:
        problem = problem.with_changes(memory={"limit": None})
    holds = None
    if args.depth_of:
        try:
            holds = holds_of(simulate(problem, load(args.depth_of).schedule), args.slack)
        except (SchedcError, OSError, KeyError) as e:
            ap.error(f"--depth-of {args.depth_of}: not a schedule of this problem's stages and microbatches ({e})")
    for item in args.most_hold:
        try:
            stage, most = item.split("=")
            s, most = int(stage), float(most)
        except ValueError:
            ap.error(f"--most-hold takes STAGE=TIME, got {item!r}")
        if not 0 <= s < problem.n_stages or not 0 < most < math.inf:
            ap.error(f"--most-hold {item}: stages are 0-{problem.n_stages - 1} and the time must be positive"
                     " and finite")
        holds = dict(holds or {})
        holds[s] = (min(holds.get(s, (0.0,))[0], most), most)
    if any(not 0 <= s < problem.n_stages for s in args.w_after_b):
        ap.error(f"--w-after-b: stages are 0-{problem.n_stages - 1}")
    best = None  # (timeline, period) of the shortest start for --unrolled
    for per in periods:
        began = time.perf_counter()
        try:
            found = search(problem, per * args.slots, args.slots, args.seconds, args.workers, holds,
                           tuple(args.w_after_b), args.first_fit)
        except NoPattern:
            print(f"period {per:g}: no pattern exists (CP-SAT proves it, {time.perf_counter() - began:.0f} s)",
                  flush=True)
            continue
        wall = time.perf_counter() - began
        if found is None:
            print(f"period {per:g}: none found ({wall:.0f} s)")
            continue
        pols = Counter("kept" if k is None else k.value for k in found.policy.values())
        hold = found.start[0, Kind.B, 0] - found.start[0, Kind.F, 0]
        t = simulate(problem, unrolled(problem, found))
        broken = check(problem, found)
        print(f"period {per:g}: {found.status}, overflow {found.overflow:g}, policies {dict(pols)}, stage 0 held"
              f" {hold:.1f}, check {'ok' if not broken else broken[:3]}, unrolled span {t.span:.1f}"
              f" ({'fits' if t.fits else 'does not fit'}), {wall:.0f} s", flush=True)
        start = seed(problem, found) if args.unrolled and not broken else None
        if start is not None and (best is None or start.objective_value() < best[0].objective_value()):
            best = start, per
    print(f"bound {lower_bound(problem).value:.1f}; work per microbatch on the busiest rank {busiest_work(problem):g}")
    if args.unrolled:
        if best is None:
            print(f"no pattern that fits was found: {args.unrolled} not written", file=sys.stderr)
            return 1
        timeline, per = best
        CompiledSchedule.build(problem, timeline.schedule, timeline=timeline).save(args.unrolled)
        print(f"wrote {args.unrolled}: the pattern of period {per:g} unrolled, {problem.objective}"
              f" {timeline.objective_value():.1f}; start a solve from it: schedc solve {args.problem}"
              f" --start {args.unrolled}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
