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
  start on rank r), and C at least each rank's work, on small models (``RECOMPUTE_WORK_OPS``) the
  recompute ops chosen included (without them CP-SAT's bound missed what a memory limit forces);
  C no less than the solve's own proven bound (``Settings.lower``), so that
  CP-SAT's bound starts there and an incumbent that meets it is proven optimal at once (on its
  own, CP-SAT's bound is often little more than a rank's work);
- gradient syncs (``data_parallel``: an all-reduce AR per stage; ``replicas``: a sum RS of each
  model stage's copies, one start for all its members): per rank its communication lane (a
  ``NoOverlap`` of its own; the reduces at the end later stage first, the collectives in their one
  order), each after every W of its stage (an AR with ``overlap`` off: after every compute op of
  the rank), each ending by C (plus the rank's first start, for span); durations rounded down as
  the ops' are.

Overlapped pairs (``costs.FB``, DualPipe's forward-and-backward): per rank, each forward F and
input gradient B of another (stage, microbatch) that run faster together than one after the other
and that no edge orders (``_candidates``) have a pair literal and an optional interval of the pair's
time at the F's start, the B starting with it; each such F and B has an "alone" literal and
optional interval of its own cost instead, and runs alone or in exactly one pair, so all share the
rank's ``NoOverlap``. Its end (a variable) is its start plus its cost or the pair's time: the data
edges, the syncs and the reservoir (its B's free at its end) read it, as the simulator times a pair
(it starts when both may and both end after ``Problem.pair_time``; the F's allocation counts at
the start). A pair that is not faster is never needed: its two ops one after the other end no
later and free no later, so the bound covers every schedule. The schedule read back lists each
chosen B right after its F and in ``Schedule.pairs``.

Memory for time (a problem with ``recompute`` or ``offload``): each (stage, microbatch) and policy
the problem allows has a presence literal (at most one per pair) and optional intervals: R or S on
the compute lane between its F and its B; O and L on the rank's copy lane (a ``NoOverlap`` of its
own), O after F, L after O and before B. The reservoir's events carry the same literals: F
allocates the activation at its start, less what a recompute policy does not keep (an event at
the same instant, active with its literal); R or S allocates the rest at its start; O frees the
activation at its end and L allocates it again at its start. Events at one instant count together,
as the simulator's free-before-allocation at a tie does. The simulator re-times the order found,
each copy op issued after the last compute op that ends by its start in the model's solution
(``Schedule.after``): a reload then starts no earlier than that op's end, though it may still start
before the model's time where that op ends earlier in the re-timing, and so raise a peak; such an
answer is rejected by the driver (it keeps its incumbent).

Times are integers: costs, ``costs.FB`` and ``comm`` are multiplied by the least ``scale`` that makes them all
integers (their decimals as written, e.g. 1000 when they are multiples of 0.001, 1 when they are
integers), so the model is exact. When no scale up to 10**6 does that, they are multiplied by
10**4 over the largest op cost (so that op lasts 10**4 units whatever the unit of the problem;
10 times more while the shortest op would last less than one unit) and rounded *down*: every
real schedule then stays feasible in the model, no later than scaled, so the search bound remains
a lower bound (minus one unit for span, whose two ends round separately). Memory is scaled the
same way (exact up to 10**9; else the largest activation is 10**6 units); otherwise allocations
and frees are rounded towards more memory held and the room down, so every schedule the model
accepts fits, and no bound is reported.

The time budget covers the whole call: building the model (checked as it goes), the search
(``max_time_in_seconds`` with what is left, and ``stop_search`` when the budget runs out should
presolve run over), and simulating incumbents. Reservoirs of more than RESERVOIR_EXPAND events are kept
as reservoirs: CP-SAT's default expands them into a Boolean per pair of events, which at
p = 32, m = 256 takes tens of GB.

The order found is re-timed by the simulator in ``solve.solve`` (so rounding only steers the
search). For span, free start times may give a rank a shorter span than as-soon-as-possible
timing does, so every incumbent is simulated and the best by the simulator is returned.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Collection

from schedc.errors import SchedcError
from schedc.kinds import ROWS, Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, comm_ops, fixed_orders, lead, sync_waits_for
from schedc.simulate import Timeline, simulate
from schedc.solvers.search.common import (
    COPY_LANE, Found, Progress, Settings, descendants, longest_paths, order_edges, register_backend,
)
from schedc.solvers.deadline import Budget

KINDS = (Kind.F, Kind.B, Kind.W)  # the split backward's kinds: the ops every model holds
OPTIONAL = (Kind.R, Kind.S, Kind.O, Kind.L)  # the policy ops, each present with its (stage, mb)'s literal
SEED = 0  # fixed, so that a single-worker run is reproducible
RESERVOIR_EXPAND = 128  # events per rank above which reservoirs are not expanded into pair Booleans
MIN_SEARCH_SECONDS = 0.2  # CP-SAT is not started with less time than this left
OPS_PER_SECOND = 300  # nor where the problem has more F, B and W ops than this times the seconds left:
# from a hint of the warm start, on one worker, its first solution (the hint itself) came after 1.1 s at
# 576 ops, 4.3-6.3 s at 1152, 7.2-10.4 s at 1536, 15.9 s at 3072, and none within 25 s at 3072 (the V)
# and at every size from 4608 to 24576 (benchmarks/memory_time.py's cells at 0.5x, commit 874fba0):
# with fewer seconds than this allows it returns nothing, and the solve's other steps use the time
CHECK_EVERY = 1024  # model building looks at the clock once per this many items
RECOMPUTE_WORK_OPS = 256  # C counts the recompute chosen in each rank's work on models of at most this
# many F, B and W (valid everywhere: there it lets CP-SAT prove optima it missed, benchmarks/memtime_small.py;
# on the larger memory-time cells it only turned the search's path, to longer schedules on 3 of 1.5B
# m = 24's 12 cells and shorter on none: docs/results.md)


class _OutOfTime(Exception):
    """The time budget ran out while the model was being built."""


def _on_time(budget: Budget, k: int = 0) -> None:
    if k % CHECK_EVERY == 0 and budget.expired():
        raise _OutOfTime


def _exact_scale(values, cap: int) -> int | None:
    """The least D making every value * D an integer (values as written in decimal), or None."""
    d = 1
    for x in values:
        # as written (0.992366412: 10**9), as written before a subtraction's last-digit error
        # (1 - 0.459459459 = 0.5405405409999999), or a small fraction a division left (1 / 3): the
        # first of these that is close (relative: the test is the same in any unit) and small enough
        f = next((f for f in (Fraction(repr(float(x))), Fraction(f"{x:.12g}"), Fraction(x).limit_denominator(cap))
                  if f.denominator <= cap and abs(float(f) - x) <= 1e-12 * abs(x)), None)
        if f is None:
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


@register_backend("cpsat")  # OR-Tools CP-SAT (pip install ".[cpsat]")
def solve_cpsat(problem: Problem, warm_t: Timeline, settings: Settings) -> Found:
    """Search with CP-SAT from the warm start ``warm_t``, all within ``settings.budget``
    (building the model included).

    Returns what it found and the lower bound it proved; its ``note`` contains "time" when the
    budget stopped the search (or the model building) and "Optimal" when CP-SAT proved
    optimality (within ``settings.gap``). Not on a sequence-chunked problem (its model takes one
    cost per stage and kind): it returns nothing there, and the solve keeps what the local search
    found, with schedc's own bound."""
    if problem.seq_chunks > 1:
        return Found(None, None, [], "not searched: the CP-SAT model does not handle sequence chunks (use cbc)")
    budget = settings.budget
    ops = 3 * problem.n_stages * problem.microbatches
    if ops > OPS_PER_SECOND * budget.left():
        return Found(None, note=(f"time limit (not searched: {ops} F, B and W ops, more than CP-SAT finds a first"
                                 f" solution for in the {budget.left():.1f} s left)"))
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
        model = _CpModel(problem, warm_t, cp_model, budget, settings.lower)
    except _OutOfTime:
        return Found(None, note="time limit (building the CP-SAT model)")
    left = budget.left()
    if left < MIN_SEARCH_SECONDS:
        return Found(None, note="time limit (no time left for CP-SAT)")
    solver = _cp_solver(cp_model, model, settings, left)
    history: list = []
    callback = _make_callback(cp_model, model, history, settings.progress, Progress, budget)
    stop = threading.Timer(budget.left(), solver.stop_search)
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
            result = "Optimal" if exact else f"Optimal (within relative gap {settings.gap:g})"
        else:  # nothing but the budget stops CP-SAT short of its gap (stop_search only when it runs out)
            result = "time limit"
        final = Progress(solver.wall_time, model.objective_back(solver.objective_value), bound)
        if not history or (history[-1].incumbent, history[-1].bound) != (final.incumbent, final.bound):
            history.append(final)
        found = callback.best_schedule or model.schedule(solver.value)
        return Found(found, bound, history, result)
    if status == cp_model.INFEASIBLE:  # only with memory rounded conservatively (the warm start is feasible)
        return Found(None, None, history, "infeasible (memory rounded conservatively)")
    # UNKNOWN: the budget ran out first (even presolve can take it on a large model)
    return Found(None, None, history, f"time limit, no solution ({solver.status_name(status)})")


@dataclass(frozen=True)
class Relaxed:
    """What ``relaxation`` found: ``bound`` is proven for every schedule of the problem."""

    held: tuple[int, ...]  # the ranks whose lanes and memory the model held
    value: float | None  # the least objective CP-SAT found for the relaxation (None: none found)
    bound: float | None  # CP-SAT's proven bound on it, at least the ``lower`` given (None: not proven)
    optimal: bool  # the relaxation solved: ``bound`` is its optimum (or the ``lower`` given, if above it)


def relaxation(problem: Problem, warm_t: Timeline, held: Collection[int], seconds: float,
               lower: float = 0.0, threads: int | None = None) -> Relaxed:
    """The CP-SAT model of ``problem`` holding only the ranks ``held`` to one op at a time and to
    their memory limits, solved within ``seconds`` from ``warm_t``: a measurement of where a
    bound can still gain (``benchmarks/relaxed.py``), not a search.

    Every schedule of the problem is a solution of this model (it drops constraints only), so the
    model's optimum, and CP-SAT's bound on it, are lower bounds on the problem's objective. With
    ``lower`` (a bound already proven, such as schedc's own) the model starts from it: ``optimal``
    with ``bound == lower`` then says the ranks held prove nothing more. ``bound`` is None where the
    memory scale is not exact (the model then rounds towards more memory held, which may refuse a
    real schedule)."""
    from ortools.sat.python import cp_model

    budget = Budget.seconds(seconds)
    try:
        model = _CpModel(problem, warm_t, cp_model, budget, lower, held=held)
    except _OutOfTime:
        return Relaxed(tuple(sorted(held)), None, None, False)
    solver = _cp_solver(cp_model, model, Settings(budget, 0.0, threads, lower), max(MIN_SEARCH_SECONDS, budget.left()))
    status = solver.solve(model.cp)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    value = model.objective_back(solver.objective_value) if found else None
    bound = model.bound_back(solver.best_objective_bound) if found else None
    return Relaxed(tuple(sorted(held)), value, bound, status == cp_model.OPTIMAL and bound is not None)


COPY_LANE.add("cpsat")  # its model holds the copy lane


def _cp_solver(cp_model, model: _CpModel, settings: Settings, left: float):
    """A CP-SAT solver set up for ``settings`` with ``left`` seconds to search."""
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(0.05, left - min(0.5, 0.1 * left))  # CP-SAT's own stop, a little early
    prm.relative_gap_limit = float(settings.gap)
    prm.random_seed = SEED
    if settings.threads:
        prm.num_workers = int(settings.threads)
    prm.log_search_progress = False
    prm.expand_reservoir_constraints = max(map(len, model.on_rank)) <= RESERVOIR_EXPAND
    return solver


def _time_scale(problem: Problem) -> _Scale:
    """Op costs and ``comm`` to integers: exact where a scale up to 10**6 makes them so, else the
    largest op lasts 10**4 units (10 times more while the shortest would last less than one)."""
    cost, n = problem.cost, problem.n_stages
    kinds = [k for k in (*KINDS, *OPTIONAL) if k in problem.kinds]
    raw = [cost[k][s] for k in kinds for s in range(n)] + [problem.comm]
    raw += [x for k in problem.syncs for x in cost[k]]  # (a sync may take 0: not the shortest)
    raw += list(problem.overlap_time or ())  # costs.FB: an overlapped pair's time
    shortest = min(cost[k][s] for k in kinds for s in range(n))
    fallback = 10**4 / problem.time_scale  # relative to the problem's scale: the same model in any unit
    while shortest * fallback < 1:
        fallback *= 10
    return _Scale(raw, 10**6, fallback)


class _CpModel:
    """The CP-SAT model of one problem, hinted with the warm start."""

    def __init__(self, problem: Problem, warm_t: Timeline, cp_model, budget: Budget | None = None,
                 lower: float = 0.0, held: Collection[int] | None = None):
        """``lower``: a proven lower bound on the objective (schedc's own), C's least value, so that
        CP-SAT's bound starts there rather than at a rank's work. ``held``: the ranks whose lanes
        (one op at a time) and memory the model holds (None: every rank); on the others the ops
        keep their costs and precedences but may overlap and hold any memory (``relaxation``).
        Raises _OutOfTime when ``budget`` (None: no limit) runs out first."""
        budget = budget or Budget.unlimited()
        self.problem = problem
        self.held = set(range(problem.ranks) if held is None else held)
        n, m = problem.n_stages, problem.microbatches
        self.span = problem.objective == "span"
        self.time = _time_scale(problem)
        comm = self.time.down(problem.comm)
        self.ops = [Op(k, s, i) for s in range(n) for i in range(m) for k in KINDS]
        mandatory = self.mandatory = len(self.ops)
        self.index = {op: k for k, op in enumerate(self.ops)}
        # Precedences: data dependencies (with latency) and stage 0's microbatch numbering, among
        # the ops every schedule holds (each policy op's are conditional, ``_policies``).
        edges = [(a, b, comm if lat else 0) for a, b, lat in order_edges(problem, self.ops, self.index)]
        self.optional = [k for k in OPTIONAL if k in problem.kinds]
        self.ops += [Op(k, s, i) for s in range(n) for i in range(m) for k in self.optional]
        self.index = {op: k for k, op in enumerate(self.ops)}
        self.dur = [max(1, self.time.down(problem.cost[op.kind][op.stage])) for op in self.ops]
        # Overlapped pairs: per rank the pair's time (None: no pair is faster there); the shortest
        # each F and B may last (its cost, or the pair's) for the windows.
        self.pair_dur = [None if t is None else max(1, self.time.down(t)) for t in _pair_times(problem)]
        shortest = [min(d, self.pair_dur_of(k) or d) for k, d in enumerate(self.dur[:mandatory])]
        order, earliest, tail, succ = longest_paths(shortest, edges)
        # A policy op: anywhere up to the horizon (the chains above only grow with it).
        earliest += [0] * (len(self.ops) - mandatory)
        tail += [self.dur[k] for k in range(mandatory, len(self.ops))]
        _on_time(budget)
        self.on_rank: list[list[int]] = [[] for _ in range(problem.ranks)]
        for k, op in enumerate(self.ops):
            self.on_rank[problem.stage_rank[op.stage]].append(k)
        # the communication lanes' ops (AR, RS) and their durations
        self.comm = [comm_ops(problem, r) for r in range(problem.ranks)]
        self.comm_dur = {op: self.time.down(problem.cost[op.kind][op.stage]) for ops in self.comm for op in ops}
        self.comm_start: dict[Op, object] = {}  # -> its start (a collective's members share one)
        hint, hint_obj, horizon = self._hint(warm_t, comm)
        latest = [horizon - t for t in tail]
        self.candidates = self._candidates(budget, order, succ, earliest, latest)

        self.cp = cp_model.CpModel()
        self.present: dict[int, object] = {}  # policy op -> its presence literal
        self.alone: dict[int, object] = {}  # an F or B that may pair -> its literal: 1 when it runs alone
        self.pairs: dict[tuple[int, int], object] = {}  # (F, B) -> its literal: 1 when they run as a pair
        self.end: dict[int, object] = {}  # an F or B that may pair -> its end (a variable)
        self._intervals(budget, edges, earliest, latest)
        self.memory = self._reservoirs(budget) if problem.memory_limit is not None else None
        self.C = self._objective(budget, hint_obj, horizon, lower)
        for k, x in enumerate(self.start):
            _on_time(budget, k)
            self.cp.add_hint(x, hint[k])
        held = set(times_of(warm_t))
        hinted = set()  # an L shares its O's literal: CP-SAT refuses a hint given twice (MODEL_INVALID)
        for k, lit in self.present.items():
            if lit.Index() not in hinted:
                hinted.add(lit.Index())
                self.cp.add_hint(lit, self.ops[k] in held)
        together = {(self.index[f], self.index[Op(Kind.B, b.stage, b.mb)])  # a fused BW: its B
                    for f, b in warm_t.schedule.paired().items()}
        paired = {k for fb in together for k in fb}
        for fb, lit in self.pairs.items():
            self.cp.add_hint(lit, fb in together)
        for k, lit in self.alone.items():
            self.cp.add_hint(lit, k not in paired)
            self.cp.add_hint(self.end[k], hint[k] + (self.dur[k] if k not in paired else self.pair_dur_of(k)))
        self.cp.add_hint(self.C, hint_obj)

    def pair_dur_of(self, k: int) -> int | None:
        """How long op k lasts in an overlapped pair: its rank's pair time where it is an F or B
        on a rank where pairs are faster, else None."""
        op = self.ops[k]
        if op.kind not in (Kind.F, Kind.B):
            return None
        return self.pair_dur[self.problem.stage_rank[op.stage]]

    def _candidates(self, budget: Budget, order, succ, earliest: list[int], latest: list[int]) -> list[tuple[int, int]]:
        """The (F, B) that may run as an overlapped pair: on one rank, of two (stage, microbatch),
        faster together than one after the other (a pair that is not is never better than its two
        ops in a row: every end no later, the B's free earlier), neither reaching the other by
        edges, and windows that meet."""
        problem, ops = self.problem, self.ops
        if not any(t is not None for t in self.pair_dur):
            return []
        reach = descendants(order, succ)
        c, out = problem.cost, []
        for r, ks in enumerate(self.on_rank):
            if self.pair_dur[r] is None:
                continue
            fs = [k for k in ks if ops[k].kind == Kind.F and k < len(succ)]
            bs = [k for k in ks if ops[k].kind == Kind.B and k < len(succ)]
            for n, f in enumerate(fs):
                _on_time(budget, n)
                of = ops[f]
                for b in bs:
                    ob = ops[b]
                    if (of.stage, of.mb) == (ob.stage, ob.mb) or reach[f] >> b & 1 or reach[b] >> f & 1:
                        continue
                    if not problem.time_tol.lt(problem.pair_time(of.stage, Kind.B, ob.stage),
                                               c[Kind.F][of.stage] + c[Kind.B][ob.stage]):
                        continue
                    if earliest[f] <= latest[b] and earliest[b] <= latest[f]:
                        out.append((f, b))
        return out

    def end_of(self, k: int):
        """Op k's end: its start plus its cost, or the variable of an op that may run in a pair."""
        return self.end[k] if k in self.end else self.start[k] + self.dur[k]

    def _hint(self, warm_t: Timeline, comm: int) -> tuple[list[int], int, int]:
        """The warm start in model units (rounded down when the scale is not exact): each op's
        start, the objective, and the horizon (``ilp._span_horizon`` for span)."""
        times = times_of(warm_t)
        for op, (r, a, e) in list(times.items()):  # a fused backward: its B at its start, its W at its end
            if op.kind == Kind.BW:
                w = self.problem.cost[Kind.W][op.stage]
                times[Op(Kind.B, op.stage, op.mb)] = (r, a, e - w)
                times[Op(Kind.W, op.stage, op.mb)] = (r, e - w, e)
        # A policy op the warm start does not hold: at its F's end (absent, it constrains nothing).
        hint = [self.time.down(times[op][1] if op in times else times[Op(Kind.F, op.stage, op.mb)][2])
                for op in self.ops]
        dur, rank_of = self.dur, self.problem.stage_rank
        sinks = [k for k, op in enumerate(self.ops) if op.kind == Kind.W]  # every other op feeds one on its rank
        # (rank, end) of the last ops: each W, and each gradient sync (``_syncs``)
        ends = [(rank_of[self.ops[k].stage], hint[k] + dur[k]) for k in sinks]
        self.comm_hint = {op: self.time.down(times[op][1]) for op in self.comm_dur}
        ends += [(rank_of[op.stage], x + self.comm_dur[op]) for op, x in self.comm_hint.items()]
        if not self.span:
            hint_obj = max(end for _, end in ends)
            return hint, hint_obj, hint_obj
        first_hint = [min(hint[k] for k in ks) for ks in self.on_rank]
        hint_obj = max(end - first_hint[r] for r, end in ends)
        horizon = max(self.problem.ranks * (hint_obj + comm), max(end for _, end in ends))
        return hint, hint_obj, horizon

    def _intervals(self, budget: Budget, edges, earliest: list[int], latest: list[int]) -> None:
        """A start and a fixed-size interval per op, the precedences, one op at a time per rank."""
        cp, dur = self.cp, self.dur
        self.start, intervals = [], []
        may_pair = {k for fb in self.candidates for k in fb}
        first = self.index[Op(Kind.F, 0, 0)]  # microbatches are numbered as they enter stage 0: the first op
        literal = {}  # (stage, mb, policy kind) -> its presence literal
        for k, op in enumerate(self.ops):
            _on_time(budget, k)
            lo, hi = earliest[k], latest[k]
            if k == first:
                hi = lo
            x = cp.new_int_var(lo, max(lo, hi), f"s_{op.kind}{op.stage}_{op.mb}")
            self.start.append(x)
            name = f"i_{op.kind}{op.stage}_{op.mb}"
            if op.kind in self.optional:
                policy = ROWS[op.kind].comes_with or op.kind  # L comes with its O: the same literal
                key = (op.stage, op.mb, policy)
                if key not in literal:
                    literal[key] = cp.new_bool_var(f"z_{policy}{op.stage}_{op.mb}")
                self.present[k] = literal[key]
                intervals.append(cp.new_optional_fixed_size_interval_var(x, dur[k], literal[key], name))
            elif k in may_pair:  # alone (its cost) or in one of its pairs (the pair's interval)
                alone = self.alone[k] = cp.new_bool_var(f"a_{op.kind}{op.stage}_{op.mb}")
                intervals.append(cp.new_optional_fixed_size_interval_var(x, dur[k], alone, name))
                pair = self.pair_dur_of(k)
                self.end[k] = cp.new_int_var(lo + min(dur[k], pair), max(lo, hi) + max(dur[k], pair),
                                             f"e_{op.kind}{op.stage}_{op.mb}")
                cp.add(self.end[k] == x + pair + (dur[k] - pair) * alone)
            else:
                intervals.append(cp.new_fixed_size_interval_var(x, dur[k], name))
        intervals += self._pairs()
        for k, (a, b, lat) in enumerate(edges):
            _on_time(budget, k)
            cp.add(self.start[b] >= self.end_of(a) + lat)
        self._policies(literal)
        for r, ks in enumerate(self.on_rank):
            if r not in self.held:
                continue
            lanes = {"compute": [], "copy": []}
            for k in ks:
                lanes[ROWS[self.ops[k].kind].lane].append(intervals[k])
            lanes["compute"] += [intervals[len(self.ops) + x] for x, (f, _) in enumerate(self.candidates)
                                 if self.problem.stage_rank[self.ops[f].stage] == r]
            for lane in lanes.values():
                if lane:
                    cp.add_no_overlap(lane)
        _on_time(budget)

    def _pairs(self) -> list:
        """Per candidate pair (``_candidates``) its literal and its interval, at the F's start and
        as long as the pair's time; its B starts with its F; each F and B alone or in one pair.
        Returns the pairs' intervals, in the candidates' order."""
        cp, start = self.cp, self.start
        intervals, chosen = [], {}
        for f, b in self.candidates:
            z = self.pairs[f, b] = cp.new_bool_var(f"p_{f}_{b}")
            chosen.setdefault(f, []).append(z)
            chosen.setdefault(b, []).append(z)
            cp.add(start[b] == start[f]).only_enforce_if(z)
            intervals.append(cp.new_optional_fixed_size_interval_var(start[f], self.pair_dur_of(f), z, f"i_p{f}_{b}"))
        for k, zs in chosen.items():
            cp.add_exactly_one([self.alone[k], *zs])
        return intervals

    def _policies(self, literal: dict) -> None:
        """At most one policy per (stage, microbatch); each policy op, where present, after what
        it needs and (R, S, L) before the B it brings the activation back for."""
        cp, dur, start, index = self.cp, self.dur, self.start, self.index
        per_pair: dict[tuple[int, int], list] = {}
        for (s, i, _), lit in literal.items():
            per_pair.setdefault((s, i), []).append(lit)
        for lits in per_pair.values():
            if len(lits) > 1:
                cp.add_at_most_one(lits)
        for k, lit in self.present.items():
            op = self.ops[k]
            for need, _ in ROWS[op.kind].needs:  # F for R, S and O; O for L
                d = index[Op(need, op.stage, op.mb)]
                cp.add(start[k] >= self.end_of(d)).only_enforce_if(lit)
            if op.kind != Kind.O:  # what brings the activation back ends before its B starts
                b = index[Op(Kind.B, op.stage, op.mb)]
                cp.add(start[b] >= start[k] + dur[k]).only_enforce_if(lit)

    def _reservoirs(self, budget: Budget) -> _Scale:
        """Per rank, a reservoir of the activation memory within the room; returns the memory scale.

        Where the scale is not exact, each (stage, microbatch)'s levels are rounded up, not each
        op's delta: after F, up(F's allocation) (a recompute policy's F: up(what it keeps)); after
        R or S, and after L, up(F's) again; after O, 0; after B, up(F + B); after W, up(F + B + W).
        Every level is at least the real one and a finished microbatch leaves exactly nothing, where
        deltas rounded one by one (allocations up, frees down) left a unit or two each, which added
        up over the microbatches to refuse schedules that fit."""
        problem, mem, start = self.problem, self.problem.mem, self.start
        values = [mem[k][s] for k in (*KINDS, *self.optional) for s in range(problem.n_stages)]
        values += list(problem.memory_limit) + list(problem.static_memory) + list(problem.stage_working)
        memory = _Scale(values, 10**9, 10**6 / (problem.memory_scale or 1.0))
        up = memory.up
        step: dict[tuple[Kind, int], int] = {}  # (kind, stage) -> its rounded change of the level
        for s in range(problem.n_stages):
            a = mem[Kind.F][s]
            step[Kind.F, s] = up(a)
            step[Kind.B, s] = up(a + mem[Kind.B][s]) - up(a)
            step[Kind.W, s] = up(a + mem[Kind.B][s] + mem[Kind.W][s]) - up(a + mem[Kind.B][s])
            for x in self.optional:
                if ROWS[x].lightens:  # brings back what its F did not keep
                    step[x, s] = up(a) - up(a - mem[x][s])
                else:  # O frees it all, L allocates it again
                    step[x, s] = up(a) if mem[x][s] > 0 else -up(a)
        for r, ks in enumerate(self.on_rank):
            _on_time(budget)
            if r not in self.held:
                continue
            room = memory.down(problem.activation_room[r])
            when, change, active = [], [], []
            true = self.cp.new_constant(1)
            for k in ks:
                op = self.ops[k]
                events = [(step[op.kind, op.stage], self.present.get(k, true))]
                if op.kind == Kind.F:  # a recompute policy's F keeps only its keep: less at the same instant
                    events += [(-step[x, op.stage], self.present[self.index[Op(x, op.stage, op.mb)]])
                               for x in self.optional if ROWS[x].lightens]
                for delta, lit in events:
                    if delta > 0:  # an allocation counts from the op's start
                        when.append(start[k])
                    elif delta < 0:  # a free from its end (a lighter F: from its start, as its allocation)
                        when.append(start[k] if op.kind == Kind.F else self.end_of(k))
                    else:
                        continue
                    change.append(delta)
                    active.append(lit)
            if change:
                low = min(0, sum(c for c in change if c < 0))  # never binding: frees follow allocations
                if self.present:
                    self.cp.add_reservoir_constraint_with_active(when, change, active, low, room)
                else:
                    self.cp.add_reservoir_constraint(when, change, low, room)
        return memory

    def _objective(self, budget: Budget, hint_obj: int, horizon: int, lower: float):
        """C, minimised: every rank's work (on a small model with the recompute ops chosen) fits
        before it, and every W ends by it (for span, by it plus the rank's first start); and no less
        than ``lower`` scaled (rounded down, less the unit ``bound_back`` allows where span's two ends
        round separately), which every real schedule's C meets."""
        cp, start, dur, span = self.cp, self.start, self.dur, self.span
        rank_of = self.problem.stage_rank
        least = self.time.down(lower) - (0 if self.time.exact or not span else 1)
        C = cp.new_int_var(min(max(0, least), hint_obj), hint_obj, "C")
        for r, ks in enumerate(self.on_rank):
            _on_time(budget)
            # policy ops: not always there; an F or B that may pair: its cost alone, once per pair in one
            work = sum(dur[k] for k in ks if k not in self.present and k not in self.alone)
            work += sum(dur[k] * self.alone[k] for k in ks if k in self.alone)
            work += sum(self.pair_dur_of(f) * z for (f, _), z in self.pairs.items() if rank_of[self.ops[f].stage] == r)
            if self.mandatory <= RECOMPUTE_WORK_OPS:  # (a recompute chosen runs on the compute lane too)
                work += sum(dur[k] * self.present[k] for k in ks
                            if k in self.present and ROWS[self.ops[k].kind].lane == "compute")
            base = cp.new_int_var(0, horizon, f"first_{r}")  # the rank's first start, whichever op it is
            cp.add_min_equality(base, [start[k] for k in ks if k not in self.present])  # the compute lane's
            if span:
                cp.add(C >= work)
            else:
                cp.add(C >= base + work)
            for k in ks:
                if self.ops[k].kind == Kind.W:
                    cp.add(C >= start[k] + dur[k] - (base if span else 0))
            if self.comm[r]:
                self._syncs(r, ks, C, base, horizon)
        cp.minimize(C)
        return C

    def _syncs(self, r: int, ks: list[int], C, base, horizon: int) -> None:
        """Rank r's communication lane (``comm_ops``: its gradient all-reduces AR and replica sums
        RS): each after the ops it waits for on the rank (``sync_waits_for``: every W of its stage;
        an AR with ``overlap`` off, every compute op of the rank), a collective's members at one
        start, one at a time (the reduces at the end later stage first, the collectives in their one
        order, as ``comm_lane`` issues them), each ending by C (from the rank's first start, for
        span)."""
        cp, start, dur, problem = self.cp, self.start, self.dur, self.problem
        lane = []
        for op in self.comm[r]:
            head = lead(problem, op)  # a collective's members share its start
            if head not in self.comm_start:
                self.comm_start[head] = cp.new_int_var(0, horizon, f"c{head.kind}{head.stage}")
                cp.add_hint(self.comm_start[head], self.comm_hint[head])
            a = self.comm_start[op] = self.comm_start[head]
            for k in ks:
                if not sync_waits_for(problem, op, self.ops[k]):
                    continue
                row = cp.add(a >= self.end_of(k))
                if k in self.present:
                    row.only_enforce_if(self.present[k])
            lane.append(cp.new_fixed_size_interval_var(a, self.comm_dur[op], f"i_{op.kind}{op.stage}"))
            cp.add(C >= a + self.comm_dur[op] - (base if self.span else 0))
        if r in self.held:
            cp.add_no_overlap(lane)
        for ordered in fixed_orders(problem, self.comm[r]):  # the collectives' one order; the reduces at the end
            for x, y in zip(ordered, ordered[1:]):
                cp.add(self.comm_start[y] >= self.comm_start[x] + self.comm_dur[x])

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
        """Each lane's ops in the order of their start times (distinct: every op lasts >= 1), the
        policy ops only where present; each copy op issued after the last compute op of its rank
        that ends by its start (``Schedule.after``), so the simulator starts it no earlier than
        that op's end, as the model had it wait."""
        starts = [value(x) for x in self.start]
        ends = [value(self.end[k]) if k in self.end else x + self.dur[k] for k, x in enumerate(starts)]
        paired = {b for (_, b), z in self.pairs.items() if value(z)}  # each right after its F (same start)
        lanes = {"compute": [[] for _ in self.on_rank], "copy": [[] for _ in self.on_rank]}
        after: list[list[Op | None]] = [[] for _ in self.on_rank]
        pairs: list[list[Op]] = [[] for _ in self.on_rank]
        for r, ks in enumerate(self.on_rank):
            last: Op | None = None  # the last compute op so far that has ended
            ended = []  # (end, op) of the rank's compute ops so far, by start
            for k in sorted(ks, key=lambda k: (starts[k], k in paired, k)):
                if k in self.present and not value(self.present[k]):
                    continue
                op = self.ops[k]
                lane = ROWS[op.kind].lane
                lanes[lane][r].append(op)
                if lane == "compute":
                    ended.append((ends[k], op))
                    if k in paired:
                        pairs[r].append(op)
                    continue
                while ended and ended[0][0] <= starts[k]:
                    last = ended.pop(0)[1]
                after[r].append(last)
        return Schedule.from_lists("cpsat", lanes["compute"], lanes["copy"], after, pairs=pairs)


def times_of(timeline: Timeline) -> dict[Op, tuple[int, float, float]]:
    """op -> (rank, start, end) of every lane's ops (``Timeline.op_times``)."""
    return timeline.op_times()


def _make_callback(cp_model, model: _CpModel, history: list, progress, progress_type, budget: Budget):
    """A solution callback (its base class comes from OR-Tools, imported lazily)."""

    class Callback(cp_model.CpSolverSolutionCallback):
        """Reports each incumbent; for span, keeps the best order as the simulator times it
        (while a simulation still ends before ``budget`` runs out)."""

        def __init__(self):
            super().__init__()
            self.best_schedule: Schedule | None = None
            self.best_value = math.inf
            self.simulate_seconds = 0.0

        def on_solution_callback(self):
            incumbent = model.objective_back(self.objective_value)
            event = progress_type(self.wall_time, incumbent, model.bound_back(self.best_objective_bound))
            if model.span and not budget.less(self.simulate_seconds).expired():
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



def _pair_times(problem: Problem) -> list[float | None]:
    """Per rank, the time of an overlapped pair of a forward and a B (``costs.FB``) where some
    forward and B of its stages run faster so than one after the other, else None."""
    if problem.overlap_time is None:
        return [None] * problem.ranks
    c, tol = problem.cost, problem.time_tol
    return [t if any(tol.lt(t, c[Kind.F][s] + c[Kind.B][u]) for s in stages for u in stages) else None
            for t, stages in zip(problem.overlap_time, problem.rank_stages)]
