"""The optional CP-SAT backend of ``schedc solve --solver cpsat`` (``pip install 'schedc[cpsat]'``).

The same schedules as the ILP of ``ilp.py``, written for OR-Tools CP-SAT, which reasons about
disjunctive scheduling directly instead of through big-M binaries:

- one fixed-size interval per op F(s, i), B(s, i), W(s, i) on rank ``stage_rank[s]``;
- data: an op starts after each input's end, plus ``comm`` across ranks; microbatches are
  numbered in the order they enter stage 0 (as in the ILP; no schedule is lost);
- one op at a time per rank: ``NoOverlap`` of the rank's intervals;
- memory: per rank a reservoir whose level rises by an F's allocation at its start and falls by a
  B's or W's free at its end, within ``limit - static``. Ops of one rank never overlap, so time
  order is the rank's order and this is exactly the simulator's check (frees that end when an F
  starts come before it in the order and count before it, as in the simulator);
- objective: makespan (every W ends by C) or span (every W on rank r ends by C plus the earliest
  start on rank r).

Times are integers: costs and ``comm`` are multiplied by the least ``scale`` that makes them all
integers (their decimals as written, e.g. 1000 when they are multiples of 0.001, 1 when they are
integers), so the model is exact. When no scale up to 10**6 does that, they are multiplied by
10**4 over the largest op cost (so that op lasts 10**4 units whatever the unit of the problem;
10 times more while the shortest op would last less than one unit) and rounded *down*: every
real schedule then stays feasible in the model, no later than scaled, so the search bound remains
a lower bound (minus one unit for span, whose two ends round separately). Memory is scaled the
same way (exact up to 10**9; else the largest activation is 10**6 units); otherwise allocations
and frees are rounded towards more memory held and the room down, so every schedule the model
accepts fits, and no bound is reported.

The time limit covers the whole call: building the model (checked as it goes), the search
(``max_time_in_seconds`` with what is left, and ``stop_search`` at the deadline should presolve
run over), and simulating incumbents. Reservoirs of more than RESERVOIR_EXPAND events are kept
as reservoirs: CP-SAT's default expands them into a Boolean per pair of events, which at
p = 32, m = 256 takes tens of GB.

The order found is re-timed by the simulator in ``ilp.solve`` (so rounding only steers the
search). For span, free start times may give a rank a shorter span than as-soon-as-possible
timing does, so every incumbent is simulated and the best by the simulator is returned.
"""

from __future__ import annotations

import math
import threading
import time
from fractions import Fraction
from typing import Callable

from schedc.errors import SchedcError
from schedc.problem import Problem
from schedc.schedule import Op, Schedule
from schedc.simulate import Timeline, simulate
from schedc.solvers.common import BACKENDS, Found, Progress, Settings, longest_paths, order_edges

KINDS = ("F", "B", "W")
SEED = 0  # fixed, so that a single-worker run is reproducible
RESERVOIR_EXPAND = 128  # events per rank above which reservoirs are not expanded into pair Booleans
MIN_SEARCH_SECONDS = 0.2  # CP-SAT is not started with less time than this left
CHECK_EVERY = 1024  # model building looks at the clock once per this many items


class _OutOfTime(Exception):
    """The deadline passed while the model was being built."""


def _on_time(deadline: float, k: int = 0) -> None:
    if k % CHECK_EVERY == 0 and time.perf_counter() > deadline:
        raise _OutOfTime


def _exact_scale(values, cap: int) -> int | None:
    """The least D making every value * D an integer (values as written in decimal), or None."""
    d = 1
    for x in values:
        f = Fraction(x).limit_denominator(10**6)
        if abs(float(f) - x) > 1e-12 * abs(x):  # relative: the test is the same in any unit
            return None
        d = d * f.denominator // math.gcd(d, f.denominator)
        if d > cap:
            return None
    return d


class _Scale:
    """Float times or memory to integers and back."""

    def __init__(self, values, cap: int, fallback: int):
        exact = _exact_scale(values, cap)
        self.exact = exact is not None
        self.factor = exact if exact is not None else fallback

    def down(self, x: float) -> int:
        """x * factor, exact when the scale is; else rounded down."""
        y = x * self.factor
        return round(y) if self.exact else math.floor(y + 1e-9)

    def up(self, x: float) -> int:
        y = x * self.factor
        return round(y) if self.exact else math.ceil(y - 1e-9)


def solve_cpsat(
    problem: Problem,
    warm_t: Timeline,
    time_limit: float,
    gap: float,
    threads: int | None,
    progress: Callable | None,
):
    """Search with CP-SAT from the warm start ``warm_t``, all within ``time_limit`` seconds of
    wall-clock time (building the model included).

    Returns ``(schedule or None, proven lower bound or None, history, result)`` as ``ilp.solve``
    expects; ``result`` contains "time" when the time limit stopped the search (or the model
    building) and "Optimal" when CP-SAT proved optimality (within ``gap``)."""
    deadline = time.perf_counter() + time_limit
    try:
        from ortools.sat.python import cp_model
    except ImportError as e:
        if "undefined symbol" in str(e):  # highspy's HiGHS loaded first (PuLP imports it)
            raise SchedcError(
                "OR-Tools cannot load in a process that already loaded highspy (both bundle HiGHS):"
                " run --solver cpsat in a fresh process, or uninstall highspy"
            ) from None
        raise SchedcError("--solver cpsat needs OR-Tools: pip install 'schedc[cpsat]'") from None
    try:
        model = _CpModel(problem, warm_t, cp_model, deadline)
    except _OutOfTime:
        return None, None, [], "time limit (building the CP-SAT model)"
    left = deadline - time.perf_counter()
    if left < MIN_SEARCH_SECONDS:
        return None, None, [], "time limit (no time left for CP-SAT)"
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(0.05, left - min(0.5, 0.1 * left))  # CP-SAT's own stop, a little early
    prm.relative_gap_limit = float(gap)
    prm.random_seed = SEED
    if threads:
        prm.num_workers = int(threads)
    prm.log_search_progress = False
    prm.expand_reservoir_constraints = max(map(len, model.on_rank)) <= RESERVOIR_EXPAND

    history: list = []
    callback = _make_callback(cp_model, model, history, progress, Progress, deadline)
    stop = threading.Timer(max(0.0, deadline - time.perf_counter()), solver.stop_search)
    stop.daemon = True
    stop.start()
    try:
        status = solver.solve(model.cp, callback)
    finally:
        stop.cancel()

    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = model.bound_back(solver.best_objective_bound)
        if status == cp_model.OPTIMAL:
            exact = solver.objective_value <= solver.best_objective_bound + 0.5
            result = "Optimal" if exact else f"Optimal (within relative gap {gap:g})"
        else:  # nothing but the time limit stops CP-SAT short of its gap (stop_search only at the deadline)
            result = "time limit"
        final = Progress(solver.wall_time, model.objective_back(solver.objective_value), bound)
        if not history or (history[-1].incumbent, history[-1].bound) != (final.incumbent, final.bound):
            history.append(final)
        found = callback.best_schedule or model.schedule(solver.value)
        return found, bound, history, result
    if status == cp_model.INFEASIBLE:  # only with memory rounded conservatively (the warm start is feasible)
        return None, None, history, "infeasible (memory rounded conservatively)"
    # UNKNOWN: the time limit came first (even presolve can take it on a large model)
    return None, None, history, f"time limit, no solution ({solver.status_name(status)})"


class _CpModel:
    """The CP-SAT model of one problem, hinted with the warm start."""

    def __init__(self, problem: Problem, warm_t: Timeline, cp_model, deadline: float = math.inf):
        """Raises _OutOfTime when ``deadline`` (a ``time.perf_counter()`` value) passes first."""
        self.problem = problem
        p, m, n = problem.ranks, problem.microbatches, problem.n_stages
        cost, mem, rank_of = problem.cost, problem.mem, problem.stage_rank
        span = problem.objective == "span"

        # ---- integer times ----
        raw = [cost[k][s] for k in KINDS for s in range(n)] + [problem.comm]
        shortest = min(cost[k][s] for k in KINDS for s in range(n))
        fallback = 10**4 / problem.time_scale  # relative to the problem's scale: the same model in any unit
        while shortest * fallback < 1:
            fallback *= 10
        self.time = _Scale(raw, 10**6, fallback)
        comm = self.time.down(problem.comm)

        self.ops = [Op(k, s, i) for s in range(n) for i in range(m) for k in KINDS]
        index = {op: k for k, op in enumerate(self.ops)}
        self.index = index
        dur = [max(1, self.time.down(cost[op.kind][op.stage])) for op in self.ops]

        # Precedences: data dependencies (with latency) and stage 0's microbatch numbering.
        edges = [(a, b, comm if lat else 0) for a, b, lat in order_edges(problem, self.ops, index)]
        _, earliest, tail, _ = longest_paths(dur, edges)
        _on_time(deadline)

        # ---- the warm start, in model units (rounded down when the scale is not exact) ----
        times = warm_t.op_times()
        hint = [self.time.down(times[op][1]) for op in self.ops]
        on_rank: list[list[int]] = [[] for _ in range(p)]
        for k, op in enumerate(self.ops):
            on_rank[rank_of[op.stage]].append(k)
        sinks = [k for k, op in enumerate(self.ops) if op.kind == "W"]  # every other op feeds one on its rank
        if span:
            first_hint = [min(hint[k] for k in ks) for ks in on_rank]
            hint_obj = max(hint[k] + dur[k] - first_hint[rank_of[self.ops[k].stage]] for k in sinks)
            horizon = max(p * (hint_obj + comm), max(hint[k] + dur[k] for k in sinks))  # ilp._span_horizon
        else:
            hint_obj = max(hint[k] + dur[k] for k in sinks)
            horizon = hint_obj

        # ---- variables and constraints ----
        cp = cp_model.CpModel()
        start, intervals = [], []
        for k, op in enumerate(self.ops):
            _on_time(deadline, k)
            lo, hi = earliest[k], horizon - tail[k]
            if k == index[Op("F", 0, 0)]:  # microbatches are numbered as they enter stage 0: the first op
                hi = lo
            x = cp.new_int_var(lo, max(lo, hi), f"s_{op.kind}{op.stage}_{op.mb}")
            start.append(x)
            intervals.append(cp.new_fixed_size_interval_var(x, dur[k], f"i_{op.kind}{op.stage}_{op.mb}"))
        for k, (a, b, lat) in enumerate(edges):
            _on_time(deadline, k)
            cp.add(start[b] >= start[a] + dur[a] + lat)
        for ks in on_rank:
            cp.add_no_overlap([intervals[k] for k in ks])
        _on_time(deadline)

        limits = problem.memory_limit
        if limits is not None:
            values = [mem[k][s] for k in KINDS for s in range(n)]
            values += list(limits) + list(problem.static_memory) + list(problem.stage_working)
            self.memory = _Scale(values, 10**9, 10**6 / (problem.memory_scale or 1.0))
            for r, ks in enumerate(on_rank):
                _on_time(deadline)
                room = self.memory.down(problem.activation_room[r])
                when, change = [], []
                for k in ks:
                    op = self.ops[k]
                    delta = self.memory.up(mem[op.kind][op.stage])  # conservative when not exact
                    if delta > 0:  # an allocation counts from the op's start
                        when.append(start[k])
                    elif delta < 0:  # a free from its end
                        when.append(start[k] + dur[k])
                    else:
                        continue
                    change.append(delta)
                if change:
                    low = min(0, sum(c for c in change if c < 0))  # never binding: frees follow allocations
                    cp.add_reservoir_constraint(when, change, low, room)
        else:
            self.memory = None

        C = cp.new_int_var(0, hint_obj, "C")
        for r, ks in enumerate(on_rank):
            _on_time(deadline)
            work = sum(dur[k] for k in ks)
            base = cp.new_int_var(0, horizon, f"first_{r}")  # the rank's first start, whichever op it is
            cp.add_min_equality(base, [start[k] for k in ks])
            if span:
                cp.add(C >= work)
            else:
                cp.add(C >= base + work)
            for k in ks:
                if self.ops[k].kind == "W":
                    cp.add(C >= start[k] + dur[k] - (base if span else 0))
        cp.minimize(C)

        for k, x in enumerate(start):
            _on_time(deadline, k)
            cp.add_hint(x, hint[k])
        cp.add_hint(C, hint_obj)

        self.cp, self.start, self.C, self.dur = cp, start, C, dur
        self.on_rank, self.span = on_rank, span

    # ---- back to schedc's units ----

    def objective_back(self, value: float) -> float:
        return value / self.time.factor

    def bound_back(self, value: float) -> float | None:
        """The search bound in schedc's units, valid for every real schedule (see the docstring)."""
        if value is None or not math.isfinite(value):
            return None
        if self.memory is not None and not self.memory.exact:
            return None  # memory rounded towards more held: the model may exclude real schedules
        slack = 0 if self.time.exact or not self.span else 1
        return max(0.0, (math.ceil(value - 1e-9) - slack) / self.time.factor)

    def schedule(self, value: Callable) -> Schedule:
        """Each rank's ops in the order of their start times (distinct: every op lasts >= 1)."""
        starts = [value(x) for x in self.start]
        per_rank = [[self.ops[k] for k in sorted(ks, key=lambda k: (starts[k], k))] for ks in self.on_rank]
        return Schedule.from_lists("cpsat", per_rank)


def _make_callback(cp_model, model: _CpModel, history: list, progress, progress_type, deadline: float = math.inf):
    """A solution callback (its base class comes from OR-Tools, imported lazily)."""

    class Callback(cp_model.CpSolverSolutionCallback):
        """Reports each incumbent; for span, keeps the best order as the simulator times it
        (while a simulation still ends before ``deadline``)."""

        def __init__(self):
            super().__init__()
            self.best_schedule: Schedule | None = None
            self.best_value = math.inf
            self.simulate_seconds = 0.0

        def on_solution_callback(self):
            incumbent = model.objective_back(self.objective_value)
            event = progress_type(self.wall_time, incumbent, model.bound_back(self.best_objective_bound))
            if model.span and time.perf_counter() + self.simulate_seconds < deadline:
                began = time.perf_counter()
                schedule = model.schedule(self.value)
                t = simulate(model.problem, schedule)
                self.simulate_seconds = max(self.simulate_seconds, time.perf_counter() - began)
                if t.fits and t.span < self.best_value:
                    self.best_schedule, self.best_value = schedule, t.span
            history.append(event)
            if progress is not None:
                progress(event)

    return Callback()


def _search(problem: Problem, incumbent: Timeline, s: Settings) -> Found:
    found, bound, history, note = solve_cpsat(problem, incumbent, s.deadline - time.perf_counter(), s.gap, s.threads,
                                              s.progress)
    return Found(found, bound, history, note)


BACKENDS["cpsat"] = _search  # OR-Tools CP-SAT (pip install ".[cpsat]")
