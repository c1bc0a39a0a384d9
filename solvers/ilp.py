"""The ILP: the fastest zero-bubble schedule under the memory limit, with a proven bound.

Variables: a start time per op (F, B, W of every stage and microbatch) and, for each pair of
ops on one rank whose order no dependency fixes, a binary "a before b". Constraints:

- data: an op starts after each input's end, plus ``comm`` across ranks;
- one op at a time per rank: each free pair is ordered one way or the other (big-M, each pair's
  from the ops' windows of earliest and latest starts); microbatches are numbered in the order
  they enter stage 0 (no loss: they are interchangeable), which breaks the symmetry between them,
  and the W of a stage run in the order of their B (no loss either, see ``_Model``);
- memory: at every F, static memory plus the deltas of the ops ordered before it, plus its own,
  stays within the limit (a linear function of the same binaries); and the activation held
  integrated over time fits under the limit over the rank's window (a cut in the start times);
- objective: makespan (every W ends by C) or span (every W ends by C plus its rank's first start,
  a variable below every start on the rank).

The order found is re-timed by the simulator (as soon as possible), which is never later than
the ILP's times, so the reported objective is the simulator's, the one judge. The bound is the
larger of the solver's and schedc's own independent lower bound; "optimal" is said only when
the schedule's objective meets it.

Units: the model is built with times in units of the power of two nearest the problem's time
scale (its largest op cost) and memory likewise (``_model_units``), an exact change of units, so
the MIP solvers' absolute tolerances mean the same whatever unit the problem is written in; the
comparisons of results are relative (``schedc.tolerance``).
"""

from __future__ import annotations

import math
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from schedc.errors import SchedcError
from schedc.problem import Problem
from schedc.schedule import Op, Schedule
from schedc.simulate import Timeline, simulate
from schedc.solvers.bounds import lower_bound
from schedc.solvers.common import BACKENDS, Found, Progress, Settings, longest_paths, order_edges
from schedc.solvers import cpsat  # noqa: F401  (registers the cpsat backend)
from schedc.solvers.deadline import END, LATE, MIN_SECONDS, Worker, WorkerDied, run_cbc
from schedc.solvers.localsearch import improve
from schedc.solvers.registry import NOT_EVALUATED, SEARCHES, evaluate, split_backward
from schedc.tolerance import Tolerance, meets

FULL_MODEL_OPS = 600  # above this many ops (p = 8, m = 24 has 576), search neighbourhoods instead
WORKER_OPS = 300  # above this many ops, schedules and models are built in a child process the deadline can stop
WARM_SHARE = 0.5  # of the time limit, at most, for judging registry schedules once one fits (see solve)
WINDOW_MIN_SECONDS = 5.0  # the neighbourhood search starts no window with less time left
SOLUTION_SECONDS = 0.5  # kept after the solver's end to read its solution back
WINDOW_OPS = 36  # ops per rank a neighbourhood reorders (about 12 microbatches' F, B, W)
LOCAL_SEARCH_SHARE = 0.25  # of the time limit, at most, for the local search before the exact one


@dataclass
class SolveResult:
    schedule: Schedule
    timeline: Timeline
    status: str  # "optimal", "feasible" (gap left), "time limit", or "warm start" (solver found nothing better)
    objective: float
    bound: float
    bound_reason: str
    warm_start: str
    warm_objective: float
    solver: str
    seconds: float
    binaries: int
    history: list[Progress] = field(default_factory=list)  # the search's events, seconds on its own clock
    registry: list[tuple[str, Timeline]] = field(default_factory=list)  # the fitting registry schedules
    not_evaluated: list[str] = field(default_factory=list)  # registry schedules the time limit left out

    @property
    def gap(self) -> float:
        return (self.objective - self.bound) / self.objective if self.objective > 0 else 0.0

    def summary(self) -> dict:
        t = self.timeline
        return {
            "status": self.status,
            "objective": self.objective,
            "objective_kind": self.timeline.problem.objective,
            "bound": self.bound,
            "bound_reason": self.bound_reason,
            "gap": self.gap,
            "makespan": t.makespan,
            "span": t.span,
            "bubble": t.bubble_rate(),
            "peak_memory": list(t.peak_memory),
            "fits": t.fits,
            "warm_start": self.warm_start,
            "warm_objective": self.warm_objective,
            "solver": self.solver,
            "seconds": self.seconds,
            "binaries": self.binaries,
            "not_evaluated": list(self.not_evaluated),
        }


def fitting_registry_schedules(problem: Problem) -> list[tuple[str, Timeline]]:
    """Every registry schedule that applies and fits the memory limit, judged (backward split)."""
    return evaluate_registry(problem).fitting


@dataclass
class RegistryRun:
    """The registry schedules judged for a warm start (``registry.evaluate(warm_start=True)``):
    those that fit (backward split, in registry order), the fused ones that fit as built (only
    when a fused backward is cheaper than B + W), the names the deadline left out, and the
    longest simulation (what judging one more schedule costs on this problem)."""

    fitting: list[tuple[str, Timeline]]
    fused: list[tuple[str, Timeline]]
    not_evaluated: list[str]
    simulate_seconds: float


def evaluate_registry(
    problem: Problem,
    deadline: float = math.inf,
    say: Callable[[str], None] | None = None,
    *,
    end: float = math.inf,
    keep: float = 0.0,
) -> RegistryRun:
    """The registry's schedules judged for a warm start under ``deadline`` (see
    ``registry.evaluate``); built in a child process on problems of more than WORKER_OPS ops."""
    child = problem.n_stages * problem.microbatches * 3 > WORKER_OPS
    judged = evaluate(problem, warm_start=True, deadline=deadline, end=end, keep=keep, child=child, say=say)
    return RegistryRun(
        fitting=[(e.name, e.timeline) for e in judged if e.fits],
        fused=[(e.name, e.as_built) for e in judged if e.as_built is not None],
        not_evaluated=[e.name for e in judged if e.reason == NOT_EVALUATED],
        simulate_seconds=max((e.simulate_seconds for e in judged), default=0.0),
    )


def best_registry_schedule(
    problem: Problem, fitting: list[tuple[str, Timeline]] | None = None
) -> tuple[str, Timeline] | None:
    """The registry schedule with the best objective among those that fit the memory limit
    (the first of equals, in registry order)."""
    best = None
    for name, t in fitting_registry_schedules(problem) if fitting is None else fitting:
        if best is None or problem.time_tol.lt(t.objective_value(), best[1].objective_value()):
            best = (name, t)
    return best


class _Model:
    """The ILP of one problem, built with PuLP.

    With ``keep`` (a schedule) and ``window`` (per rank, a range of positions in keep's order),
    it is a neighbourhood of ``keep``: only the ops in each rank's window may be reordered, among
    themselves; every other pair keeps keep's order (large neighbourhood search).

    What makes it tighter than the plain big-M model, all of it exact:

    - windows: each op starts between its earliest start (longest path from the sources) and the
      horizon minus its tail (longest path to the end), and each pair's big-M is the largest
      amount by which its constraint can be violated within those windows, not the horizon;
      a pair that cannot run one way round within the windows is ordered the other way (and
      the windows recomputed with that edge, until nothing changes);
    - W follow B: on each stage, the W run in the order of their B (one binary for both pairs).
      No optimum is lost: two W of one stage last as long and free as much, and no op consumes a
      W, so handing a schedule's W slots of a stage to its microbatches in B order keeps every
      time and memory level; the k-th W slot is no earlier than k of the B have ended, so each W
      still starts after its own B;
    - memory-time: on a rank, the activation held integrated over time (a microbatch holds its
      F's allocation from the F's start to the B's, then what the B left until the W) is at most
      the room times the rank's window: a linear cut in the start times.
    """

    def __init__(
        self,
        problem: Problem,
        horizon: float,
        lower: float = 0.0,
        keep: Schedule | None = None,
        window: list[range] | None = None,
    ):
        import pulp

        self.problem = problem
        p, m, n = problem.ranks, problem.microbatches, problem.n_stages
        cost, mem, rank_of = problem.cost, problem.mem, problem.stage_rank
        self.ops = [Op(k, s, i) for s in range(n) for i in range(m) for k in ("F", "B", "W")]
        index = {op: k for k, op in enumerate(self.ops)}
        dur = [cost[op.kind][op.stage] for op in self.ops]

        edges = order_edges(problem, self.ops, index, in_order=keep if keep is not None else False)
        free = set(range(len(self.ops)))  # ops whose order on their rank is open
        if keep is not None:
            free = set()
            for order, w in zip(keep.ranks, window):
                ks = [index[op] for op in order]
                free.update(ks[k] for k in w)
                edges += [(ks[k], ks[k + 1], 0.0) for k in range(len(ks) - 1) if k + 1 < w.start or k >= w.stop]
                if w and w.start > 0:
                    edges += [(ks[w.start - 1], ks[k], 0.0) for k in w]
                if w and w.stop < len(ks):
                    edges += [(ks[k], ks[w.stop], 0.0) for k in w]
        on_rank: list[list[int]] = [[] for _ in range(p)]
        for k, op in enumerate(self.ops):
            on_rank[rank_of[op.stage]].append(k)
        # (W pair, its B pair) of one stage, both as (lower microbatch, higher): tied in the full
        # model (in a neighbourhood the W outside the window keep their place).
        self.twins = {} if keep is not None else _w_follow_b(self.ops, index, n, m)
        edges, earliest, latest, reach = _windows(dur, edges, on_rank, free, horizon, self.twins, fix=keep is None)

        lp = pulp.LpProblem("schedc", pulp.LpMinimize)
        start = [
            lp.add_variable(f"s{k}", lowBound=earliest[k], upBound=max(earliest[k], latest[k]))
            for k in range(len(self.ops))
        ]
        for a, b, lat in edges:
            lp += start[b] >= start[a] + dur[a] + lat
        self.before: dict[tuple[int, int], pulp.LpVariable] = {}  # (a, b) with a < b: 1 if a first
        for ks in on_rank:
            open_ks = [k for k in ks if k in free]  # other pairs are fixed by keep's order
            for x, a in enumerate(open_ks):
                for b in open_ks[x + 1 :]:
                    if reach[a] >> b & 1 or reach[b] >> a & 1:
                        continue
                    twin = self.twins.get((a, b))
                    if twin in self.before:  # W pair: the same binary as its B pair
                        self.before[a, b] = self.before[twin]
                        continue
                    y = lp.add_variable(f"y{a}_{b}", cat="Binary")
                    self.before[a, b] = y
                    # Each big-M: the most start[a] + dur[a] - start[b] can be when b goes first.
                    m_ab = max(0.0, max(earliest[a], latest[a]) + dur[a] - earliest[b])
                    m_ba = max(0.0, max(earliest[b], latest[b]) + dur[b] - earliest[a])
                    lp += start[b] >= start[a] + dur[a] - m_ab * (1 - y)
                    lp += start[a] >= start[b] + dur[b] - m_ba * y

        def first(a: int, b: int):
            """1 if op a runs before op b on their rank (a constant when an edge fixes it)."""
            if reach[a] >> b & 1:
                return 1
            if reach[b] >> a & 1:
                return 0
            return self.before[a, b] if a < b else 1 - self.before[b, a]

        limits = problem.memory_limit
        if limits is not None:
            for r, ks in enumerate(on_rank):
                room = problem.activation_room[r]
                for o in ks:
                    op = self.ops[o]
                    if op.kind != "F" or o not in free:  # outside the window its level is keep's
                        continue
                    held = mem["F"][op.stage] + pulp.lpSum(
                        mem[self.ops[a].kind][self.ops[a].stage] * first(a, o) for a in ks if a != o
                    )
                    lp += held <= room

        slack = 1e-6 * max(1.0, abs(lower))  # float noise must not make the model infeasible
        self.C = lp.add_variable("C", lowBound=lower - slack, upBound=horizon + slack)
        for r, ks in enumerate(on_rank):
            # The rank's first start, whichever op that is: at most every start on the rank.
            first_start = lp.add_variable(f"first{r}", lowBound=min(earliest[k] for k in ks))
            for o in ks:
                lp += first_start <= start[o]
            origin = 0 if problem.objective == "makespan" else first_start
            for o in ks:
                if self.ops[o].kind == "W":  # every other op feeds one on its rank: W ends last
                    lp += self.C >= start[o] + dur[o] - origin
                if o not in free:
                    continue
                # Sum-of-durations cuts (valid for every schedule, they tighten the LP a lot): what
                # runs after o on its rank ends by C; what runs before o fits after the rank's start.
                after = pulp.lpSum(dur[b] * first(o, b) for b in ks if b != o)
                before = pulp.lpSum(dur[a] * first(a, o) for a in ks if a != o)
                lp += self.C >= start[o] + dur[o] + after - origin
                lp += start[o] >= first_start + before
            if limits is not None:
                # Memory-time: frees count from their op's start, as in the memory rows above, so
                # the level never exceeds the room between the rank's first start and C (+ it).
                held = []
                for s in problem.rank_stages[r]:
                    f, b = mem["F"][s], mem["B"][s]
                    for i in range(m):
                        kf, kb, kw = (index[Op(kind, s, i)] for kind in ("F", "B", "W"))
                        held += [f * (start[kb] - start[kf]), (f + b) * (start[kw] - start[kb])]
                room = problem.activation_room[r]
                window_length = self.C if problem.objective == "span" else self.C - first_start
                lp += pulp.lpSum(held) <= room * window_length
        lp += self.C
        self.lp, self.start, self.on_rank, self.index = lp, start, on_rank, index

    def warm(self, timeline: Timeline) -> None:
        """Start the search from ``timeline``'s order and times (its W of each stage handed to
        the microbatches in B order, as the model has them: same times, same memory)."""
        times = {op: s for op, (_, s, _) in timeline.op_times().items()}
        if self.twins:
            for s in range(self.problem.n_stages):
                slots = sorted(times[Op("W", s, i)] for i in range(self.problem.microbatches))
                by_b = sorted(range(self.problem.microbatches), key=lambda i: times[Op("B", s, i)])
                for slot, i in zip(slots, by_b):
                    times[Op("W", s, i)] = slot
        for k, op in enumerate(self.ops):  # the simulator's sums may pass a window's by rounding
            x = self.start[k]
            x.setInitialValue(min(max(times[op], x.lowBound), x.upBound))
        for (a, b), y in self.before.items():
            y.setInitialValue(1 if times[self.ops[a]] < times[self.ops[b]] else 0)
        self.C.setInitialValue(timeline.objective_value())

    def schedule(self, name: str) -> Schedule | None:
        values = [v.value() for v in self.start]
        if any(v is None for v in values):
            return None
        per_rank = [[self.ops[k] for k in sorted(ks, key=lambda k: (values[k], k))] for ks in self.on_rank]
        return Schedule.from_lists(name, per_rank)


def _w_follow_b(ops: list[Op], index: dict[Op, int], n: int, m: int) -> dict[tuple[int, int], tuple[int, int]]:
    """``(W(s, i), W(s, j)) -> (B(s, i), B(s, j))`` for every stage s and i < j (as op indices)."""
    twins = {}
    for s in range(n):
        for i in range(m):
            for j in range(i + 1, m):
                pair = (index[Op("W", s, i)], index[Op("W", s, j)])
                twins[pair] = (index[Op("B", s, i)], index[Op("B", s, j)])
    return twins


def _windows(dur, edges, on_rank, free, horizon, twins, fix=True):
    """Earliest and latest starts and the descendants (bit sets) over ``edges``. With ``fix``
    the edges grow: a same-rank pair that cannot run one way round within the windows gets the
    other order as an edge, and so does a W pair whose B pair is ordered (or a B pair whose W
    pair is), until nothing changes (a pair that fits neither way is left to the solver, which
    then finds the model infeasible). Returns ``(edges, earliest, latest, reach)``."""
    eps = 1e-9 * max(1.0, abs(horizon))
    while True:
        order, earliest, tail, succ = longest_paths(dur, edges)
        latest = [horizon - t for t in tail]
        reach = [0] * len(dur)
        for a in reversed(order):
            bits = 0
            for b, _ in succ[a]:
                bits |= reach[b] | (1 << b)
            reach[a] = bits
        if not fix:
            return edges, earliest, latest, reach
        added = []
        for ks in on_rank:
            open_ks = [k for k in ks if k in free]
            for x, a in enumerate(open_ks):
                for b in open_ks[x + 1 :]:
                    if reach[a] >> b & 1 or reach[b] >> a & 1:
                        continue
                    a_first = earliest[a] + dur[a] <= latest[b] + eps  # a can end by b's latest start
                    b_first = earliest[b] + dur[b] <= latest[a] + eps
                    if a_first != b_first:
                        added.append((a, b) if a_first else (b, a))
        for (wa, wb), (ba, bb) in twins.items():
            for (x, y), (u, v) in (((wa, wb), (ba, bb)), ((ba, bb), (wa, wb))):
                if reach[x] >> y & 1 and not reach[u] >> v & 1:
                    added.append((u, v))
                elif reach[y] >> x & 1 and not reach[v] >> u & 1:
                    added.append((v, u))
        if not added:
            return edges, earliest, latest, reach
        edges = edges + [(a, b, 0.0) for a, b in dict.fromkeys(added)]


# CBC's log: incumbents and the bound as it goes, and the final bound.
_CBC_SOLUTION = re.compile(r"Integer solution of (\S+) found .*\((\S+) seconds\)")
_CBC_NODES = re.compile(r"After \d+ nodes, \d+ on tree, (\S+) best solution, best possible (\S+) \((\S+) seconds\)")
_CBC_FINAL_BOUND = re.compile(r"^Lower bound:\s+(\S+)", re.M)
_CBC_RESULT = re.compile(r"^Result - (.*)$", re.M)


def _parse_cbc(text: str) -> tuple[list[Progress], float | None, str]:
    history = []
    for line in text.splitlines():
        if mt := _CBC_NODES.search(line):
            inc, bound, sec = mt.groups()
            history.append(Progress(float(sec), _num(inc), _num(bound)))
        elif mt := _CBC_SOLUTION.search(line):
            history.append(Progress(float(mt.group(2)), _num(mt.group(1)), None))
    bound = _CBC_FINAL_BOUND.search(text)
    result = _CBC_RESULT.search(text)
    return history, (float(bound.group(1)) if bound else None), (result.group(1) if result else "")


def _num(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) and abs(x) < 1e50 else None


def check_settings(time_limit: float, gap: float, threads: int | None) -> None:
    """ValueError for settings no search can honour (nan and infinities included)."""
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not 0 < time_limit < math.inf:
        raise ValueError(f"time_limit must be a finite number of seconds > 0, got {time_limit!r}")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 <= gap <= 1:
        raise ValueError(f"gap must be a number in [0, 1], got {gap!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a whole number >= 1 or None, got {threads!r}")


def solve(
    problem: Problem,
    *,
    solver: str = "cbc",
    time_limit: float = 60.0,
    gap: float = 1e-4,
    threads: int | None = None,
    progress: Callable[[Progress], None] | None = None,
    reserve: float = 0.0,
    candidates: Sequence[tuple[str, Schedule]] = (),
) -> SolveResult:
    """Search the fastest split-backward schedule that fits ``problem``'s memory limit.

    ``time_limit`` is wall-clock seconds for the whole call: judging the registry schedules for
    the warm start (at most WARM_SHARE of it once one fits; the rest are then left out and
    listed in ``not_evaluated``), the local search, building the model, the search, and judging
    what it found. ``reserve`` leaves time unused at the end of the limit for the caller, in
    simulations of ``problem``, timed while judging the registry schedules (so it scales with the
    problem and the machine's speed now): ``schedc solve`` keeps time to write the schedule file.
    ``progress`` hears of each step from the first one on, with seconds since the call began.
    ``candidates`` are more schedules to start from (e.g. torch.distributed.pipelining's, which
    the CLI adds with ``--torch``): each that is complete and fits joins the registry's for the
    warm start, so the result is never worse than any of them either."""
    if solver not in BACKENDS:
        raise SchedcError(f"unknown solver {solver!r}; choose one of {', '.join(BACKENDS)}")
    check_settings(time_limit, gap, threads)
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    tol = problem.time_tol

    def say(note: str) -> None:
        if progress:
            progress(Progress(time.perf_counter() - t0, None, None, note))

    def relay(event: Progress) -> None:  # the solvers' seconds run on their own clocks
        if progress:
            progress(replace(event, seconds=time.perf_counter() - t0))

    # The registry may take the whole limit when the rest would be too short for a neighbourhood
    # anyway (large problems, where its schedules are slow to build and judge, are searched so).
    share = WARM_SHARE if (1 - WARM_SHARE) * time_limit >= WINDOW_MIN_SECONDS else 1.0
    run = evaluate_registry(problem, t0 + share * time_limit, say, end=deadline, keep=reserve)
    for name, schedule in candidates:
        try:
            t = simulate(problem, split_backward(schedule))
        except SchedcError as e:  # incomplete or deadlocking: not a candidate
            say(f"warm start: {name} is not a schedule of this problem ({e})")
            continue
        say(f"warm start: {name} " + (f"{problem.objective} {t.objective_value():.6g}" if t.fits else "does not fit"))
        if t.fits:
            run.fitting.append((name, t))
    warm = best_registry_schedule(problem, run.fitting)
    if warm is None:
        raise SchedcError(
            "no registry schedule fits the memory limit to start from; raise the limit"
            f" (each rank needs at least {', '.join(f'{problem.min_memory(r):g}' for r in range(problem.ranks))})"
        )
    warm_name, warm_t = warm
    own = lower_bound(problem)
    best_schedule, best_t, from_registry = warm_t.schedule, warm_t, True
    history: list[Progress] = []
    solver_bound, result = None, ""
    binaries = 0
    finish = deadline - (1 + reserve) * run.simulate_seconds  # judging what the search found: one simulation
    if not meets(warm_t.objective_value(), own.value):  # else the warm start is already proven optimal
        # Local search first (cheap, any size): a better incumbent for the exact search to start from.
        polished = improve(
            problem, warm_t, min(finish, t0 + LOCAL_SEARCH_SHARE * time_limit),
            others=[t for _, t in run.fitting if t is not warm_t], enough=own.value,
            progress=progress and (lambda value: progress(Progress(time.perf_counter() - t0, value, None))),
        )
        if tol.lt(polished.objective_value(), warm_t.objective_value()):
            best_schedule, best_t, from_registry = polished.schedule, polished, False
        found = None
        left = finish - time.perf_counter()
        if meets(best_t.objective_value(), own.value):
            pass  # the local search reached the bound: nothing left to search for
        elif left < MIN_SECONDS:
            result = "time limit (no time left to search)"
            say("search: time limit, no time left to search")
        else:
            say(f"search: {solver}, {left:.1f} s left")
            out = BACKENDS[solver](problem, best_t, Settings(finish, gap, threads, own.value, relay))
            found, solver_bound, history, result, binaries = out.schedule, out.bound, out.history, out.note, out.binaries
        if found is not None:
            t = simulate(problem, found.renamed("ilp"))
            if t.fits and tol.lt(t.objective_value(), best_t.objective_value()):
                best_schedule, best_t, from_registry = t.schedule, t, False
    if problem.fused_cheaper:
        # A fused backward is cheaper than B + W here: a fused registry schedule may beat every
        # split one, and the solver's bound covers split schedules only.
        solver_bound = None
        for name, t in run.fused:
            if tol.lt(t.objective_value(), best_t.objective_value()):
                best_schedule, best_t, from_registry = t.schedule, t, True
                warm_name, warm_t = name, t  # reported as the registry schedule it returns
    objective = best_t.objective_value()
    bound = max(own.value, solver_bound if solver_bound is not None else -math.inf)
    # The independent bound's reason when it is as good as the solver's (up to the solver's noise).
    reason = own.reason if solver_bound is None or meets(solver_bound, own.value) else f"{solver} search bound"
    if Tolerance.of(objective, 1e-6).gt(bound, objective):
        raise RuntimeError(f"bug: lower bound {bound} ({reason}) above a found schedule's {objective}")
    bound = min(bound, objective)  # solver tolerance
    if meets(objective, bound):
        status = "optimal"
    elif "time" in result.lower() or (from_registry and run.not_evaluated):
        status = "time limit"  # even when the warm start is returned: the search was cut short
    elif from_registry:
        status = "warm start"  # the search ended on its own and found nothing better
    else:
        status = "feasible"
    named = best_schedule.renamed("ilp")
    return SolveResult(
        schedule=named,
        timeline=replace(best_t, schedule=named),
        status=status,
        objective=objective,
        bound=bound,
        bound_reason=reason,
        warm_start=warm_name,
        warm_objective=warm_t.objective_value(),
        solver=solver,
        seconds=time.perf_counter() - t0,
        binaries=binaries,
        history=history,
        registry=run.fitting,
        not_evaluated=run.not_evaluated,
    )


def _pulp_search(solver: str):
    """The search backend of a PuLP solver: the whole ILP up to FULL_MODEL_OPS ops, above that a
    large-neighbourhood search over windows of the incumbent's order (no bound of its own)."""

    def search(problem: Problem, incumbent: Timeline, s: Settings) -> Found:
        if problem.n_stages * problem.microbatches * 3 <= FULL_MODEL_OPS:
            found, bound, history, note, binaries = _solve_pulp(
                problem, incumbent, s.lower, solver, s.deadline, s.gap, s.threads, s.progress)
            return Found(found, bound, history, note, binaries)
        found, history, binaries, note = _neighbourhoods(problem, incumbent, s.lower, solver, s.deadline, s.threads,
                                                         s.progress)
        return Found(found, None, history, note, binaries)

    return search


SEARCHES["ilp"] = solve  # the exact search, by the name schedules go by
BACKENDS["cbc"] = _pulp_search("cbc")  # CBC, bundled with PuLP: the default
BACKENDS["highs"] = _pulp_search("highs")  # HiGHS through PuLP (pip install highspy)


def _neighbourhoods(problem, warm_t, lower, solver, deadline, threads, progress):
    """Large neighbourhood search: sweep a window of microbatches across the schedule; in each,
    the ops of those microbatches (and whatever lies between them on a rank) may be reordered,
    the rest keeps the incumbent's order. Stops at the deadline (when too little is left for one
    more window), at the lower bound, or after a sweep without improvement. Gives no bound of its
    own. Returns ``(schedule, history, binaries, result)``, ``result`` "time limit" or ""."""
    best = warm_t
    k = max(2, WINDOW_OPS // (3 * problem.chunks))
    starts = list(range(0, max(1, problem.microbatches - k + 1), max(1, k // 2)))
    history: list[Progress] = []
    binaries = 0
    t_start = time.perf_counter()
    improved = True
    last = 0.0  # wall time of the last window, model building included
    while improved and time.perf_counter() < deadline:
        improved = False
        for w0 in starts:
            left = deadline - time.perf_counter()
            if meets(best.objective_value(), lower):
                return best.schedule, history, binaries, ""
            if left <= max(WINDOW_MIN_SECONDS, 1.5 * last):
                return best.schedule, history, binaries, "time limit"
            began = time.perf_counter()
            window = []
            for ops in best.schedule.ranks:
                pos = [x for x, op in enumerate(ops) if w0 <= op.mb < w0 + k]
                window.append(range(min(pos), max(pos) + 1) if pos else range(0))
            found, _, _, _, n_bin = _solve_pulp(
                problem, best, lower, solver, began + min(left / 2, 20.0), 0.0, threads, None,
                keep=best.schedule, window=window,
            )
            binaries = max(binaries, n_bin)
            last = time.perf_counter() - began
            t = simulate(problem, found) if found is not None else None
            if t is not None and t.fits and problem.time_tol.lt(t.objective_value(), best.objective_value()):
                best, improved = t, True
                event = Progress(time.perf_counter() - t_start, best.objective_value(), None)
                history.append(event)
                if progress:
                    progress(event)
    return best.schedule, history, binaries, "time limit" if time.perf_counter() >= deadline else ""


def _model_units(problem: Problem) -> tuple[float, float]:
    """The units of time and of memory the MIP model is written in: the powers of two nearest
    the problem's time and memory scales, so that its largest op cost and largest activation are
    between 0.71 and 1.41 model units, whatever unit the problem is written in. Dividing by a
    power of two is exact: in these units it is the same model, only the MIP solvers' absolute
    tolerances (feasibility, integrality) no longer depend on the problem's unit."""

    def nearest(x: float) -> float:
        return 2.0 ** round(math.log2(x)) if x > 0 else 1.0

    return nearest(problem.time_scale), nearest(problem.memory_scale)


def _solve_pulp(problem, warm_t, lower, solver, deadline, gap, threads, progress, keep=None, window=None):
    """Build the ILP (of the whole problem, or of ``window`` with the rest of ``keep``'s order
    fixed), warm-start it from ``warm_t`` and solve it, all by ``deadline``: CBC runs under its
    watchdog, and on problems of more than WORKER_OPS ops everything runs in a child process
    that is killed at the deadline (model building included). The model is written in
    ``_model_units``; the bound and the history (and what ``progress`` hears) come back in the
    problem's units. Returns ``(schedule or None, bound or None, history, result, binaries)``."""
    unit, memory_unit = _model_units(problem)
    if (unit, memory_unit) == (1.0, 1.0):
        args = (problem, warm_t, lower, solver, deadline, gap, threads, progress, keep, window)
        return _solve_pulp_in_model_units(*args)

    def back(event: Progress) -> Progress:
        scale = lambda x: None if x is None else x * unit  # noqa: E731
        return replace(event, incumbent=scale(event.incumbent), bound=scale(event.bound))

    model_problem = problem.scaled(1 / unit, 1 / memory_unit)
    model_warm = simulate(model_problem, warm_t.schedule)  # warm_t's times over unit, exactly
    schedule, bound, history, result, binaries = _solve_pulp_in_model_units(
        model_problem, model_warm, lower / unit, solver, deadline, gap, threads,
        progress and (lambda event: progress(back(event))), keep, window,
    )
    return schedule, None if bound is None else bound * unit, [back(e) for e in history], result, binaries


def _solve_pulp_in_model_units(problem, warm_t, lower, solver, deadline, gap, threads, progress, keep, window):
    """``_solve_pulp`` on a problem already in model units."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "solver.log"
        args = (problem, warm_t, lower, solver, deadline - SOLUTION_SECONDS, gap, threads, log, keep, window)
        done = threading.Event()
        watcher = threading.Thread(target=_watch, args=(log, done, progress), daemon=True)
        try:
            child = problem.n_stages * problem.microbatches * 3 > WORKER_OPS
            with Worker(_model_and_search, args, child=child) as worker:
                watcher.start()  # after the fork: the child gets no copy of this thread
                out = worker.next(deadline)
        except WorkerDied as e:
            out = e
        finally:
            done.set()
            if watcher.ident is not None:
                watcher.join()
        text = log.read_text() if log.exists() else ""
    history = _parse_cbc(text)[0] if solver == "cbc" else []
    if isinstance(out, WorkerDied):
        return None, None, history, f"solver error: {out}", 0
    if out is LATE or out is END:
        return None, None, history, "time limit (stopped while building or solving the model)", 0
    schedule, value, status, bound, stopped, binaries = out
    if solver == "cbc":
        history, bound, result = _parse_cbc(text)
        if result.startswith("Optimal") and value is not None:
            # Proven optimal, or stopped within the relative gap: best possible >= C (1 - gap).
            proven = value * (1 - gap if "gap" in result else 1)
            bound = max(bound if bound is not None else -math.inf, proven)
        result = f"{stopped}: {result}" if stopped else result
    else:
        result = f"{stopped}: {text}" if stopped else text
        if status == "Optimal" and bound is None:
            bound = value
    return schedule, bound, history, result, binaries


def _model_and_search(problem, warm_t, lower, solver, deadline, gap, threads, log, keep, window):
    """The model of ``_solve_pulp``, built and solved by ``deadline`` (run by a Worker): yields
    ``(schedule or None, objective or None, PuLP status, HiGHS bound or None, why the time limit
    stopped the solver or "", binaries)``."""
    import pulp

    horizon = warm_t.objective_value() if problem.objective == "makespan" else _span_horizon(problem, warm_t)
    model = _Model(problem, horizon, lower, keep=keep, window=window)
    model.warm(warm_t)
    binaries = len(model.before)
    if solver == "cbc":
        stopped = run_cbc(model.lp, cbc(gapRel=gap, threads=threads), deadline, log)
        if model.lp.status != pulp.LpStatusOptimal:  # no solution read (CBC's "stopped with a solution" counts)
            yield None, None, pulp.LpStatus[model.lp.status], None, stopped, binaries
            return
        yield model.schedule("ilp"), model.C.value(), "Optimal", None, stopped, binaries
        return
    left = deadline - time.perf_counter()
    if left < MIN_SECONDS:
        yield None, None, "Not Solved", None, "time limit (no time left for highs)", binaries
        return
    backend = pulp.HiGHS(msg=False, timeLimit=0.9 * left, gapRel=gap, threads=threads, log_file=str(log))
    if not backend.available():
        raise SchedcError(
            "--solver highs needs highspy: pip install 'schedc[highs]' (it cannot share a process"
            " with OR-Tools, which bundles its own HiGHS)"
        )
    try:
        model.lp.solve(backend)
    except pulp.PulpSolverError as e:  # the solver died: keep the incumbent, say why
        yield None, None, "Not Solved", None, f"solver error: {e}", binaries
        return
    solved = getattr(model.lp, "solverModel", None)
    bound = _num(str(solved.getInfo().mip_dual_bound)) if solved is not None else None
    yield model.schedule("ilp"), model.C.value(), pulp.LpStatus[model.lp.status], bound, "", binaries


def cbc(**options):
    """The CBC bundled with PuLP. PuLP 3.3 marks this command deprecated for 4.0 (where CBC
    becomes a separate install); it is still the bundled solver here, so the warning is muted."""
    import warnings

    import pulp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, **options)


def _span_horizon(problem: Problem, warm_t: Timeline) -> float:
    """A horizon that keeps every schedule with a span below the warm start's.

    Shift each rank's window of ops as early as its inputs allow: a window then starts no later
    than the end of the window feeding its binding input, plus ``comm``. Windows are at most C
    long and the chain visits each rank once, so everything ends by p (C + comm)."""
    return problem.ranks * (warm_t.span + problem.comm)


def _watch(log: Path, done: threading.Event, progress) -> None:
    """Report CBC's incumbent and bound while it runs (the log is read every half second)."""
    if progress is None:
        return
    seen = 0
    while not done.wait(0.5):
        if not log.exists():
            continue
        history, _, _ = _parse_cbc(log.read_text())
        for event in history[seen:]:
            progress(event)
        seen = len(history)
