"""The one registry of named schedules: the CLI, the ablation study and the tests all read it."""

from __future__ import annotations

import difflib

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable

from schedc.errors import ScheduleError
from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule
from schedc.simulate import Timeline, simulate
from schedc.solvers.deadline import END, LATE, Budget, Worker
from schedc.tolerance import Tolerance

Builder = Callable[[Problem], Schedule]


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    build: Builder
    summary: str
    split_backward: bool  # True: separate B and W ops; False: fused BW
    requires: Callable[[Problem], str | None]  # why it does not apply, or None
    bidirectional: bool = False  # runs the pipelines of a problem with replicas (else one pipeline)
    synchronous: bool = True  # False: weight versions (Schedule.rounds > 1), outside the synchronous search
    sequence: bool = False  # runs the chunks of a sequence in their order (Problem.sequence_chunks)
    # Every forward of a rank before its first backward: at that point it holds every microbatch
    # of each of its stages (so ``evaluate`` can tell, unbuilt, where that cannot fit: ``_holds_too_much``).
    holds_every_microbatch: bool = False

    def why_not(self, problem: Problem) -> str | None:
        if problem.seq_chunks > 1 and not self.sequence:
            return (f"runs whole sequences, and the problem cuts each into {problem.seq_chunks} chunks"
                    " (sequence_chunks): seq1f1b and seq1f1b-zb run them")
        if self.bidirectional and problem.replicas is None:
            return "runs two pipelines in opposite directions: needs replicas (replicas: 2)"
        if not self.bidirectional and problem.replicas is not None:
            return f"runs one pipeline, and the problem has {problem.pipelines} (replicas)"
        return self.requires(problem)


REGISTRY: dict[str, ScheduleSpec] = {}
# name -> a search: ``search(problem, *, solver, time_limit, gap, threads, progress)`` returning a
# result with ``schedule``, ``timeline`` and ``summary()`` (``schedc.solvers.search.solve.solve`` is "ilp").
# Named like a schedule wherever one is taken (schedc.compile, ablation configs); not built by
# ``evaluate``, as a search needs a time limit.
SEARCHES: dict[str, Callable[..., Any]] = {}


def register(name: str, summary: str, *, split_backward: bool, requires: Callable[[Problem], str | None],
             bidirectional: bool = False, synchronous: bool = True, sequence: bool = False,
             holds_every_microbatch: bool = False):
    def wrap(fn: Builder) -> Builder:
        if name in REGISTRY:
            raise ValueError(f"schedule {name!r} registered twice")
        REGISTRY[name] = ScheduleSpec(name, fn, summary, split_backward, requires, bidirectional, synchronous,
                                      sequence, holds_every_microbatch)
        return fn

    return wrap


def get(name: str) -> ScheduleSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(REGISTRY), n=3)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise ScheduleError(f"unknown schedule {name!r}; {hint}`schedc schedules` lists the {len(REGISTRY)} known"
                            f" (from {', '.join(list(REGISTRY)[:6])}, ...)") from None


def build(name: str, problem: Problem) -> Schedule:
    spec = get(name)
    reason = spec.why_not(problem)
    if reason:
        raise ScheduleError(f"schedule {name!r} does not apply to this problem: {reason}")
    return spec.build(problem)


NOT_EVALUATED = "not evaluated (time limit)"  # Evaluated.reason of a schedule the time budget left out
ASYNCHRONOUS = "asynchronous (weight versions): not a start for the synchronous search"  # Evaluated.reason
NO_FIT = "does not fit the memory limit"  # Evaluated.reason, with ``warm_start``, of one not simulated


@dataclass(frozen=True)
class Evaluated:
    """One registry schedule judged on a problem: built and simulated where it applies (else
    ``reason`` says why not, and ``schedule`` and ``timeline`` are None)."""

    name: str
    reason: str | None
    schedule: Schedule | None
    timeline: Timeline | None
    seconds: float  # building and simulating it
    simulate_seconds: float = 0.0  # of which simulating (the longest is what judging one more costs)
    as_built: Timeline | None = None  # warm_start: a fused schedule that fits as built, where fused is cheaper

    @property
    def fits(self) -> bool:
        return self.timeline is not None and self.timeline.fits


def evaluate(
    problem: Problem,
    names: Iterable[str] | None = None,
    *,
    warm_start: bool = False,
    budget: Budget | None = None,
    child: bool = False,
    say: Callable[[str], None] | None = None,
    found: bool = False,
) -> list[Evaluated]:
    """Every registry schedule (or each of ``names``, in that order) on ``problem``: the one pass
    that the CLI's compare, the ablation study and the solver's warm start judge them with.

    ``warm_start`` judges them as the solver starts from them: with the backward split (a fused
    BW as B then W), each fused one also as built where a fused backward is cheaper than B + W
    (``as_built``, kept when it fits), and one that clearly cannot fit is not simulated (reason
    NO_FIT), nor built where that is clear beforehand (``_holds_too_much``). ``budget`` (None: no
    limit) stops the pass: once one schedule fits, no further one
    is judged unless judging it (one more simulation, the longest so far) ends within what the
    budget leaves usable (``Budget.usable``: less the simulations it keeps for the caller); those
    left out come back with reason NOT_EVALUATED. Once the budget has run out the pass goes on
    while nothing fits yet (``found``: a schedule from elsewhere fits already, so the budget stops
    the pass from the start). ``child`` builds the schedules in a child process that the budget can
    stop mid-build (for large problems). ``say`` hears a line per schedule."""
    say = say or (lambda note: None)
    specs = [get(n) for n in (REGISTRY if names is None else names)]
    reasons = {spec.name: ASYNCHRONOUS if warm_start and not spec.synchronous else spec.why_not(problem)
               for spec in specs}
    if warm_start:
        reasons.update((spec.name, NO_FIT) for spec in specs
                       if reasons[spec.name] is None and spec.holds_every_microbatch and _holds_too_much(problem))
    applies = [name for name, reason in reasons.items() if reason is None]
    out = {name: Evaluated(name, reason, None, None, 0.0) for name, reason in reasons.items() if reason}
    if warm_start:
        unbuilt = [name for name, reason in reasons.items() if reason == NO_FIT]
        say(f"warm start: evaluating {len(applies)} registry schedules"
            + (f" ({', '.join(unbuilt)} not built: every microbatch in flight passes the limit)" if unbuilt else ""))
    budget = budget or Budget.unlimited()
    sim = 0.0  # the longest simulation so far
    with Worker(_build, (problem, applies), child=child and budget.limited) as worker:
        for name in applies:
            judging = budget.usable(sim).less(sim)  # once one fits, judge another only if it ends in time
            fitted = found or any(e.fits for e in out.values())
            if fitted and judging.expired():
                break
            began = time.perf_counter()
            item = worker.next(judging if fitted else None)
            if item is LATE or item is END:
                break
            out[name] = e = _judge(problem, name, item[1], warm_start, began)
            sim = max(sim, e.simulate_seconds)
            if warm_start:
                say(f"warm start: {e.schedule.name} "
                    + (f"{problem.objective} {e.timeline.objective_value():.6g}" if e.fits else NO_FIT))
    left_out = [name for name in applies if name not in out]
    if left_out and warm_start:
        say(f"warm start: time limit, not evaluated: {', '.join(left_out)}")
    out.update((name, Evaluated(name, NOT_EVALUATED, None, None, 0.0)) for name in left_out)
    return [out[spec.name] for spec in specs]


def _build(problem: Problem, names: list[str]):
    """The named registry schedules, built one after another (in a Worker)."""
    for name in names:
        yield name, REGISTRY[name].build(problem)


def _judge(problem: Problem, name: str, schedule: Schedule, warm_start: bool, began: float) -> Evaluated:
    if not warm_start:
        simulating = time.perf_counter()
        t = simulate(problem, schedule)
        now = time.perf_counter()
        return Evaluated(name, None, schedule, t, now - began, now - simulating)
    split = split_named(schedule, name)
    fused_too = problem.fused_cheaper and not REGISTRY[name].split_backward
    if not fused_too and _cannot_fit(problem, split):  # spare the simulation
        return Evaluated(name, NO_FIT, split, None, time.perf_counter() - began)
    simulating = time.perf_counter()
    t = simulate(problem, split)
    as_built = simulate(problem, schedule) if fused_too else None
    now = time.perf_counter()
    return Evaluated(name, None, split, t, now - began, now - simulating,
                     as_built if as_built is not None and as_built.fits else None)


def unfuse(schedule: Schedule) -> Schedule:
    """The same schedule with every fused BW as B then W (identical times, memory and order; the
    copy lane as it was, a copy issued after a BW now issued after its W; a BW in an overlapped pair
    now its B, the W right after the pair: its gradient then leaves the pair before the W, no later)."""
    per_rank = []
    for ops in schedule.ranks:
        out = []
        for op in ops:
            out += [Op(Kind.B, op.stage, op.mb), Op(Kind.W, op.stage, op.mb)] if op.kind == Kind.BW else [op]
        per_rank.append(out)
    after = [[a if a is None or a.kind != Kind.BW else Op(Kind.W, a.stage, a.mb) for a in ops] for ops in schedule.after]
    pairs = [[Op(Kind.B, op.stage, op.mb) if op.kind == Kind.BW else op for op in ops] for ops in schedule.pairs]
    return Schedule.from_lists(schedule.name, per_rank, schedule.copy, after, pairs, schedule.rounds)


SPLIT = "+split"  # what a schedule's name gains when its fused backwards are split (``split_named``)


def split_named(schedule: Schedule, name: str) -> Schedule:
    """``unfuse(schedule)``, named ``name`` where it had no fused backward to split, else
    ``name+split``: a different schedule (its W may leave a pair, its B's gradient leave sooner),
    whose times are not the named schedule's and must not be shown under its name."""
    split = unfuse(schedule)
    return split.renamed(name if split.ranks == schedule.ranks else name + SPLIT)


def shown_name(name: str, timeline: Timeline) -> str:
    """How a schedule judged for a warm start under ``name`` is shown: ``name+split`` where
    ``split_named`` split its fused backwards, else ``name``."""
    return timeline.schedule.name if timeline.schedule.name == name + SPLIT else name


def _holds_too_much(problem: Problem) -> bool:
    """Some rank cannot hold every microbatch of each of its stages at once, even each keeping the
    least any policy keeps (``Problem.least_kept``; nothing where offload is allowed): a schedule
    that runs every forward of a rank before its first backward (``holds_every_microbatch``)
    passes the limit there, whatever else it does."""
    rooms = problem.activation_room
    if rooms is None:
        return False
    clearly = Tolerance.of(problem.memory_scale, 1e-6)
    return any(problem.microbatches * sum(problem.least_kept(s) for s in stages) > room + clearly.eps
               for stages, room in zip(problem.rank_stages, rooms))


def _cannot_fit(problem: Problem, schedule: Schedule) -> bool:
    """Some rank holds more than its limit (clearly: beyond rounding) once the allocations and
    frees of its ops so far, in order, are counted, each op's delta under its (stage, microbatch)'s
    policy (``Problem.delta``): the simulator, which holds a free's memory until its op ends, then
    finds the rank over its limit too. A quick test, in one pass over the ops, that spares
    simulating a schedule that cannot fit. A schedule with a copy lane is never ruled out here:
    its memory depends on when the lanes' ops run, which only the simulator knows."""
    rooms = problem.activation_room
    if rooms is None or schedule.copy:
        return False
    policy = schedule.policies() if problem.policies else {}
    clearly = Tolerance.of(problem.memory_scale, 1e-6)  # looser than the simulator's memory_tol
    for r, ops in enumerate(schedule.ranks):
        room = rooms[r] + clearly.eps
        level = 0.0
        for op in ops:  # (a sequence chunk's delta is its share: ``Problem.op_delta``)
            level += problem.op_delta(op.kind, op.stage, op.mb, policy.get((op.stage, op.mb)))
            if level > room:
                return True
    return False


# ---- common requirements ----

def one_chunk(problem: Problem) -> str | None:
    return None if problem.chunks == 1 else f"needs one chunk per rank (chunks is {problem.chunks})"


def any_placement(problem: Problem) -> str | None:
    return None


def loop_placement(problem: Problem) -> str | None:
    if problem.chunks > 1 and problem.stage_rank != tuple(s % problem.ranks for s in range(problem.n_stages)):
        return "needs the loop placement (stage s on rank s mod p)"
    return None
