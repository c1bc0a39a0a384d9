"""The solve driver: the fastest split-backward schedule under the memory limit, whatever the
search backend, with a proven bound. ``schedc solve``, ``schedc.compile(problem, "ilp")`` and the
ablation study call ``solve`` (registered as the search "ilp").

The steps, all within one time ``Budget`` (``schedc.solvers.deadline``):

1. warm start: a re-solve's ``start`` first, then the registry's schedules judged with the
   backward split (``registry.evaluate``, those best on most problems first: ``WARM_FIRST``),
   plus any candidates the caller gives, plus (where the problem allows recompute or offload)
   every registry order with the fewest recomputes that fit, or everything offloaded
   (``recomputed_candidates``), and on small problems a periodic pattern unrolled
   (``periodic_candidates``); the best that fits is the incumbent;
2. local search (``localsearch.improve``), at most LOCAL_SEARCH_SHARE of the budget;
3. the search backend named by ``solver`` (``BACKENDS``, ``solvers/search/common.py``: CBC and HiGHS in
   ``solvers/search/ilp.py``, CP-SAT in ``solvers/search/cpsat.py``; the default, "auto", is the one
   ``auto.backend_for`` picks for the problem), given ``Settings`` and returning
   ``Found``; what it found is judged by the simulator, the one judge; beside it, on a core to
   spare, the registry's greedy searches that the warm start cut short (which go on there from
   the end of their share, ``_GreedyBeside``), or else the local search, in a child process
   (``_beside``);
4. the status, from the objective against the larger of the backend's bound and schedc's own
   independent one (``solvers/bounds.py``): "optimal" only when the objective meets it.

For torch's runtime (``torch=True``, ``schedc solve --torch``), which assumes the last stage's
forwards run in microbatch order (``schedc.interop``'s notes), the best schedule is returned with
its microbatches renumbered in that order (``in_torch_order``). No search is constrained for it:
microbatches are interchangeable, so the renumbered schedule is the same schedule (the simulator
judges it again and must find the same objective), and every search's result, the warm start's
included, passes through that one step, losing nothing.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

from schedc.errors import SchedcError, ScheduleError
from schedc.interop import in_torch_order, refuse_torch_shape
from schedc.kinds import ROWS, Kind
from schedc.problem import Problem
from schedc.schedule import Schedule
from schedc.simulate import Timeline, simulate
from schedc.solvers.bounds import Bound, lower_bound
from schedc.solvers.search.auto import AUTO, backend_for
from schedc.solvers.search.common import BACKENDS, COPY_LANE, WINDOW_MIN_SECONDS, Found, Progress, Settings
from schedc.solvers.deadline import END, LATE, Budget, Worker, WorkerDied, can_fork, in_child
from schedc.solvers.families import greedy
from schedc.solvers.search import periodic
from schedc.solvers.search.localsearch import improve
from schedc.solvers.families.memtime import everywhere, least_memory, with_policies
from schedc.solvers.search.mixed import (
    AsIfSearch, as_if_searches, fit_mixed, fitted_orders, held_back_search, policy_orders, polished,
)
from schedc.solvers.registry import NO_FIT, NOT_EVALUATED, REGISTRY, SEARCHES, evaluate, shown_name, split_named
from schedc.tolerance import Tolerance, meets

WARM_SHARE = 0.5  # of the budget, at most, for the warm start once a schedule fits (see solve)
REGISTRY_SHARE = 0.4  # of the warm start, at most, for the registry's schedules but the greedy's searches
GREEDY_SHARE = 0.5  # of what the warm start has left then, at most, for the greedy's searches
PERIODIC_SHARE = 0.25  # of the budget left then, at most, for the periodic start (``periodic_candidates``)
PERIODIC_SECONDS = 5.0  # and at most this (``periodic.start`` finds its pattern in about 2.5 s where it applies)
PERIODIC_MIN_SECONDS = 1.0  # no periodic start with less than this
POLICY_SHARE = 0.75  # of what the warm start has left then, at most, for the candidates with policies
# (the rest for polishing the best schedules found: on 28.3B m = 96 V at 0.75x, ZB-V's order with
# mixed policies and its W re-placed, 2830.4 against 2884.8, which a 60 s solve never reached)
POLISH_SHARE = 0.15  # of the budget left then, at least, for polishing (``polished_candidates``), however
# much of the warm start the steps before took: on 28.3B m = 128 V at 0.75x the registry's greedy took
# 14 of its 30 s, the polish had 2.6 s, 0.3 s short of ZB-V's order with mixed policies and its W
# re-placed (3742.9 against 3792.9), and CP-SAT then found no schedule in the 22 s left
LOCAL_SEARCH_SHARE = 0.25  # of the budget, at most, for the local search before the backend's
SEARCH_MIN_SECONDS = 0.5  # no backend is started with less time than this left
AGAIN_MIN_SECONDS = 1.0  # the local search runs again after the backend when this much is left
BESIDE_MIN_SECONDS = 2.0  # the local search runs beside the backend (on another core) when this much is left
BESIDE_TURN = 2.0  # seconds: that search restarts from its best with a new seed this often
GREEDY_BESIDE_TURN = 0.5  # seconds: the greedy's searches going on beside (``_GreedyBeside``) are read in turns this long
RESUME_TURN = 5.0  # seconds, at most, that each paused search runs in its turn after the backend (``_resume``)


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
    registry: list[tuple[str, Timeline]] = field(default_factory=list)  # the fitting registry schedules (and the warm start)
    not_evaluated: list[str] = field(default_factory=list)  # registry schedules the time limit left out

    @property
    def gap(self) -> float:
        return (self.objective - self.bound) / self.objective if self.objective > 0 else 0.0

    @property
    def policies(self) -> dict[str, int]:
        """Policy name -> how many (stage, microbatch) of the schedule use it."""
        return self.schedule.policy_counts()

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
            **({"policies": self.policies} if self.timeline.problem.policies else {}),
        }


# ---- the warm start: the registry's schedules ----


@dataclass
class RegistryRun:
    """The registry schedules judged for a warm start (``registry.evaluate(warm_start=True)``):
    those that fit (backward split, in registry order), the fused ones that fit as built (only
    when a fused backward is cheaper than B + W), the names the budget left out, and the
    longest simulation (what judging one more schedule costs on this problem)."""

    fitting: list[tuple[str, Timeline]]
    fused: list[tuple[str, Timeline]]
    not_evaluated: list[str]
    simulate_seconds: float
    built: list[tuple[str, Schedule]] = field(default_factory=list)  # every one built (backward split), fitting or not
    derived: set[str] = field(default_factory=set)  # the names in ``fitting`` that are no registry schedule's
    # nor a caller's candidate (mixed policies, W re-placed, a search cut short): the result's table leaves them out
    paused: list[Paused | Polish] = field(default_factory=list)  # searches the budget paused, for ``_resume``
    beside: _GreedyBeside | None = None  # the greedy's searches going on on a spare core (one of ``paused``)


def evaluate_registry(
    problem: Problem, budget: Budget | None = None, say: Callable[[str], None] | None = None,
    greedy_budget: Callable[[], Budget] | None = None, later_budget: Callable[[], Budget] | None = None,
    found: bool = False, beside: Budget | None = None,
) -> RegistryRun:
    """The registry's schedules judged for a warm start within ``budget`` (see
    ``registry.evaluate``); built in a child process on large problems (``deadline.in_child``).
    With ``greedy_budget`` (which makes a budget once the schedules before are judged), the greedy
    scheduler's searches (``ANYTIME``) come after the schedules that need no policy section, and as
    they go (``_anytime_greedy``): on a large problem, where the search outlasts its budget, the best
    variant found by then is a candidate (named NAME+partial; NAME is not evaluated); those that
    recompute or offload come last, within ``later_budget`` (made then; default ``budget``).
    ``found``: a schedule from elsewhere fits already (a re-solve's start), so every budget stops
    its step from the start, not only once a registry schedule fits. ``beside``: where the
    machine has a core to spare, the greedy's searches cut short go on there within this budget
    (``run.beside``) rather than pausing."""
    say = say or (lambda note: None)
    if greedy_budget is None:
        return _in_registry_order(_registry_run(evaluate(problem, sorted(REGISTRY, key=_warm_rank), warm_start=True,
                                                         budget=budget, child=in_child(problem), say=say)))
    # The schedules that need no policy section first, then the greedy's searches, then those that
    # recompute or offload (their budget stops them once anything fits: on a large problem where no
    # plain schedule fits, ZB-V's offloads alone can take minutes to place).
    plain = problem.with_changes(recompute=None, offload=None, memory={"limit": None}) if problem.policies else problem
    needs = {name for name in REGISTRY if REGISTRY[name].why_not(problem) is None
             and REGISTRY[name].why_not(plain) is not None}
    first = sorted((name for name in REGISTRY if name not in ANYTIME and name not in needs), key=_warm_rank)
    # Where a core is spare, the greedy's searches start at once beside the others (they are the
    # slowest to build), and are read on from there.
    early = _GreedyBeside.early(problem, beside) if beside is not None and problem.seq_chunks == 1 else None
    try:
        run = _registry_run(evaluate(problem, first, warm_start=True, budget=budget, child=in_child(problem),
                                     say=say, found=found))
    except BaseException:
        if early is not None:
            try:
                early.halt()
            finally:
                early.search.stop()
        raise
    _anytime_greedy(problem, run, greedy_budget(), say, found, beside, early)
    if needs:
        later = _registry_run(evaluate(problem, [name for name in REGISTRY if name in needs], warm_start=True,
                                       budget=later_budget() if later_budget else budget,
                                       child=in_child(problem), say=say,
                                       found=found or bool(run.fitting)))
        run.fitting += later.fitting
        run.fused += later.fused
        run.not_evaluated += later.not_evaluated
        run.built += later.built
        run.simulate_seconds = max(run.simulate_seconds, later.simulate_seconds)
    return _in_registry_order(run)


def _in_registry_order(run: RegistryRun) -> RegistryRun:
    """``run``'s lists in the registry's order, however they were judged (the first of equals wins)."""
    order = {name: k for k, name in enumerate(REGISTRY)}
    for items in (run.fitting, run.fused, run.built):
        items.sort(key=lambda nt: order.get(nt[0], len(order)))
    run.not_evaluated.sort(key=order.__getitem__)
    return run


# Judged first in a warm start, in this order: the registry's schedules that are best on most
# problems and cheap to build (the zero-bubble ones, then 1F1B's), so that a budget that leaves
# time for few schedules (a large problem, a loaded machine) has judged these; the rest follow in
# the registry's order (gpipe, which holds every microbatch, last of all).
WARM_FIRST = ("zb-h1", "zb-v", "dualpipev", "zb-h2", "v-half", "v-min", "1f1b", "interleaved-1f1b")


def _warm_rank(name: str) -> int:
    return WARM_FIRST.index(name) if name in WARM_FIRST else len(WARM_FIRST)


def _registry_run(judged: list) -> RegistryRun:
    return RegistryRun(
        fitting=[(e.name, e.timeline) for e in judged if e.fits],
        fused=[(e.name, e.as_built) for e in judged if e.as_built is not None],
        not_evaluated=[e.name for e in judged if e.reason == NOT_EVALUATED],
        simulate_seconds=max((e.simulate_seconds for e in judged), default=0.0),
        built=[(e.name, e.schedule) for e in judged if e.schedule is not None],
    )


ANYTIME = ("zb-greedy", "zb-1p", "zb-2p")  # searched by greedy.greedy_search, as it goes, in a solve's warm start


def _anytime_greedy(problem: Problem, run: RegistryRun, budget: Budget, say: Callable[[str], None],
                    found: bool = False, beside: Budget | None = None, early: _GreedyBeside | None = None) -> None:
    """The greedy scheduler's registry schedules (``ANYTIME``) into ``run``: each search's best so
    far until ``budget`` runs out once a schedule fits (as ``registry.evaluate`` judges the others);
    one cut short joins as NAME+partial, and NAME as not evaluated, and the searches are left paused
    in ``run.paused``, or, given ``beside`` and a core to spare, go on there (``_GreedyBeside``,
    ``run.beside``). ``early``: the searches, already going on beside since the warm start began
    (``_GreedyBeside.early``), are read on from where they are. None on a sequence-chunked problem:
    the greedy scheduler runs whole sequences (its schedules are n/a there)."""
    if problem.seq_chunks > 1:
        return
    if early is not None:
        early.halt()
        searches = early.search
        searches.fitted = searches.fitted or found or bool(run.fitting)
    else:
        searches = GreedySearches(problem, fitted=found or bool(run.fitting))
    searches.read(budget)
    for name in ANYTIME:
        if name not in searches.latest:
            run.not_evaluated.append(name)
        else:
            searches.judge(problem, run, name, say)
    if not searches.over:
        run.paused.append(searches)
        if beside is not None:
            run.beside = _GreedyBeside.start(searches, beside)


class Paused:
    """A search in a Worker (a generator), read as it goes: a budget that runs out pauses it
    (``Worker.next(pause=True)``), the next read goes on where it stopped, ``stop`` ends it. A
    solve resumes those its warm start paused once the backend is done (``_resume``)."""

    def __init__(self, fn: Callable[..., Iterator], args: tuple, child: bool):
        self.worker = Worker(fn, args, child=child)
        self.over = False  # it ended, failed or was stopped
        self.best = math.inf  # the shortest objective among what it found that fits
        self.stale = False  # its last turn (``_resume``) found nothing shorter

    def items(self, budget: Budget, waiting: Callable[[], bool]) -> Iterator:
        """Its items until ``budget`` runs out (not while ``waiting()``: until a schedule fits,
        the search needs no limit to end) or it ends; an error ends it and is raised."""
        while not self.over and (waiting() or not budget.expired()):  # (run here, ``next`` cannot stop an item)
            try:
                item = self.worker.next(None if waiting() else budget, pause=True)
            except BaseException:
                self.stop()
                raise
            if item is LATE:
                return
            if item is END:
                self.over = True
                return
            yield item

    def resume(self, call: _Call, budget: Budget) -> list[tuple[str, Timeline]]:
        """Go on within ``budget``: what it found since, judged, that fits."""
        raise NotImplementedError

    def stop(self) -> None:
        self.worker.stop()
        self.over = True


class GreedySearches(Paused):
    """The greedy scheduler's searches (``_greedy_searches``): the latest schedule of each, and the
    names whose search is done; ``fitted``: a schedule fits already (until then the searches run
    without a limit)."""

    def __init__(self, problem: Problem, fitted: bool):
        super().__init__(_greedy_searches, (problem,), in_child(problem))
        self.latest: dict[str, Schedule] = {}
        self.done: set[str] = set()
        self.fitted = fitted
        self._last: Timeline | None = None  # the last judged (a capped search whose cap changes nothing repeats it)

    def read(self, budget: Budget, wait: bool = True) -> None:
        """What the searches find until ``budget`` runs out (``wait``: not before a schedule fits)."""
        for name, schedule, fits in self.items(budget, (lambda: not self.fitted) if wait else (lambda: False)):
            if schedule is None:
                self.done.add(name)
            else:
                self.latest[name], self.fitted = schedule, self.fitted or fits

    def judge(self, problem: Problem, run: RegistryRun, name: str, say: Callable[[str], None],
              step: str = "warm start") -> Timeline:
        """The latest schedule of ``name``'s search judged into ``run``: as NAME once the search is
        done, else as NAME+partial (NAME is then not evaluated)."""
        began = time.perf_counter()
        schedule = self.latest[name]
        if name not in self.done:
            if name not in run.not_evaluated:
                run.not_evaluated.append(name)
            schedule = schedule.renamed(f"{name}+partial")
            run.derived.add(schedule.name)
        elif name in run.not_evaluated:
            run.not_evaluated.remove(name)
        last = self._last
        if last is not None and last.schedule.ranks == schedule.ranks and last.schedule.copy == schedule.copy:
            t = replace(last, schedule=schedule)  # (the same order: no second simulation)
        else:
            t = simulate(problem, schedule)
            run.simulate_seconds = max(run.simulate_seconds, time.perf_counter() - began)
        self._last = t
        say(f"{step}: {schedule.name} " + (f"{problem.objective} {t.objective_value():.6g}" if t.fits else NO_FIT))
        run.built.append((schedule.name, schedule))
        if t.fits:
            run.fitting.append((schedule.name, t))
            self.best = min(self.best, t.objective_value())
        return t

    def resume(self, call: _Call, budget: Budget) -> list[tuple[str, Timeline]]:
        """Each search that found more, or ended, judged again (one that ends, under its registry name)."""
        before = dict(self.latest)
        self.read(budget.less(len(ANYTIME) * call.run.simulate_seconds))  # (time kept to judge what they found)
        return self.news(call.problem, call.run, call.clock.say, before)

    def news(self, problem: Problem, run: RegistryRun, say: Callable[[str], None], before: dict[str, Schedule],
             step: str = "resumed") -> list[tuple[str, Timeline]]:
        """What the searches found since ``before`` (their ``latest`` then), judged: each that found
        more or ended; those that fit."""
        out = []
        for name in ANYTIME:
            ended = name in self.done and name in run.not_evaluated
            if name in self.latest and (ended or self.latest[name] is not before.get(name)):
                t = self.judge(problem, run, name, say, step)
                if t.fits:
                    out.append((t.schedule.name, t))
        return out


def _greedy_searches(problem: Problem) -> Iterator[tuple[str, Schedule | None, bool]]:
    """(name, schedule, whether it fits) for each better schedule of each ``ANYTIME`` search, then
    (name, None, False) when that search is done; a capped search whose cap changes nothing is
    zb-greedy's (run in a Worker)."""
    searched: dict[int, tuple[Schedule, bool]] = {}
    for name in ANYTIME:
        q = greedy.capped_for(problem, name)
        if id(q) in searched:
            schedule, fits = searched[id(q)]
            yield name, schedule.renamed(name), fits
        else:
            for schedule, fits in greedy.greedy_search(q, name):
                searched[id(q)] = schedule, fits
                yield name, schedule, fits
        yield name, None, False


def recomputed_candidates(
    problem: Problem, run: RegistryRun, budget: Budget, say: Callable[[str], None]
) -> list[tuple[str, Timeline]]:
    """Where the problem allows recompute or offload: more orders that fit, judged, until
    ``budget`` runs out once one does. Each registry schedule built without policies, with per
    rank the fewest microbatches recomputed that bring it within the limit (as ``memtime.
    fit_recompute`` does, for each recompute policy the problem allows), or with everything offloaded;
    each registry order with mixed policies (``mixed.fitted_orders``: per microbatch the cheapest
    memory where the limit is passed, then relaxed); and the greedy scheduler's orders built as if
    every microbatch took one recompute policy (``mixed.policy_orders``). So a limit only recompute
    can meet starts from the best order any registry schedule gives, not only from those the
    registry recomputes itself."""
    kinds = problem.recomputes
    offload = Kind.O in problem.policies
    if not (kinds or offload) or problem.activation_room is None:
        return []
    search = PolicyCandidates(problem, run, child=in_child(problem) and budget.limited)
    out = search.read(budget, say, waiting=True)
    if not search.over:
        run.paused.append(search)
    return out


def periodic_candidates(
    problem: Problem, run: RegistryRun, budget: Budget, say: Callable[[str], None]
) -> list[tuple[str, Timeline]]:
    """Where the memory limit forces recompute into a steady state that is most of the schedule:
    a periodic pattern unrolled (``periodic.start``, within ``budget`` and PERIODIC_SECONDS),
    judged. Its orders hold fewer microbatches than the warm start's and recompute selectively
    where those recompute in full (docs/results.md, "Which side is loose")."""
    seconds = min(PERIODIC_SECONDS, budget.left())
    if seconds < PERIODIC_MIN_SECONDS:
        return []
    t = periodic.start(problem, seconds)  # (simulated, and fits)
    if t is None:
        return []
    say(f"warm start: {t.schedule.name} {problem.objective} {t.objective_value():.6g}")
    return [(t.schedule.name, t)]


class PolicyCandidates(Paused):
    """``recomputed_candidates``' search: the orders ``_policy_candidates`` builds, each judged
    (simulated) as it comes; those alike in order and policies judged once."""

    def __init__(self, problem: Problem, run: RegistryRun, child: bool):
        super().__init__(_policy_candidates, (problem, run.built, {name for name, _ in run.fitting}), child)
        self.problem = problem
        self.seen: set = set()

    def read(self, budget: Budget, say: Callable[[str], None], waiting: bool = False,
             step: str = "warm start") -> list[tuple[str, Timeline]]:
        """What it finds within ``budget`` that fits (``waiting``: until one does, without a limit)."""
        out: list[tuple[str, Timeline]] = []
        try:
            for schedule in self.items(budget, lambda: waiting and not out):
                if (schedule.ranks, schedule.copy) in self.seen:  # (several registry orders are one order here)
                    continue
                self.seen.add((schedule.ranks, schedule.copy))
                try:
                    t = simulate(self.problem, schedule)
                except SchedcError:
                    continue
                if t.fits:
                    say(f"{step}: {t.schedule.name} {self.problem.objective} {t.objective_value():.6g}")
                    out.append((t.schedule.name, t))
                    self.best = min(self.best, t.objective_value())
        except (SchedcError, WorkerDied):  # (the orders found before are kept)
            pass
        return out

    def resume(self, call: _Call, budget: Budget) -> list[tuple[str, Timeline]]:
        found = self.read(budget, call.clock.say, step="resumed")
        call.run.fitting.extend(found)
        call.run.derived.update(name for name, _ in found)
        return found


def _policy_candidates(problem: Problem, built: list[tuple[str, Schedule]], fits: set[str]) -> Iterator[Schedule]:
    """``recomputed_candidates``' schedules, built one after another (in a Worker), the likeliest
    to be best first, so that a budget that ends early (a large problem) has judged those:

    1. each registry order that holds no policy, with mixed policies fitted (``mixed.fitted_orders``,
       one pass over each; on a large problem seconds in all);
    2. the greedy scheduler's orders as if every microbatch took one recompute, the likeliest first
       (``mixed.likely_kinds``), each better order its search finds yielded as it goes (one search
       takes tens of seconds on the largest problems; its first orders come in about one
       scheduling pass, so a budget that ends mid-search still judges the best so far);
    3. the registry's schedules that recompute already, refitted from their policies;
    4. each plain order with one policy (``memtime.fit_recompute``'s) or with everything offloaded.

    Measured: on 28.3B, m = 256, 0.75x (benchmarks/memory_time.py), 2 before 3 is the difference
    between 7571.6 (the greedy's order as if all were selective) and 7750.2 in a 60 s solve, whose
    warm start ran out among 3 (1F1B's order again, there 7926.3-9261.5 against 7925.8 from 1)."""
    kinds = problem.recomputes
    # The orders without a copy lane: those that hold no policy (less any that fits as it is: it
    # needs none) apart from those that recompute already; each schedule's policies read once.
    plain, recomputing = [], []
    for name, schedule in built:
        if schedule.copy:
            continue
        if schedule.policies():
            recomputing.append(schedule)
        elif name not in fits:
            plain.append(schedule)
    if kinds:
        for schedule in plain:
            yield from (s for _, s in fitted_orders(problem, schedule, schedule.name))  # (NAME or NAME+split)
        yield from (s for _, s in policy_orders(problem, _greedy_orders))
        for schedule in recomputing:
            yield from (s for _, s in fitted_orders(problem, schedule, schedule.name))
    for schedule in plain:
        for kind in kinds:  # the fewest recomputed with one policy (``memtime.fit_recompute``'s, in one pass)
            fitted = fit_mixed(problem, schedule, f"{schedule.name}+fit-{kind.value}", kinds=(kind,))
            if fitted is not None:
                yield fitted
        if Kind.O in problem.policies:  # every activation offloaded: the least held
            try:
                yield with_policies(problem, schedule, everywhere(problem, Kind.O), f"{schedule.name}+offload")
            except SchedcError:
                continue


def _greedy_orders(problem: Problem) -> Iterator[Schedule]:
    """The memory-aware greedy scheduler's orders on ``problem``, each better one as its search finds it."""
    return (schedule for schedule, _ in greedy.greedy_search(problem, "zb-greedy"))


POLISHED = 3  # the best this many distinct schedules that fit get ``mixed.polished``'s variants
STEP_MIN_SECONDS = 1.0  # a step of the polish (``Polish``) is not started with less time than this left
AS_IF_SHARE = 0.25  # of the polish's budget, at most, for judging orders on the as-if problem (``mixed.as_if_searches``)


def polished_candidates(
    problem: Problem, run: RegistryRun, budget: Budget, say: Callable[[str], None], step: str = "warm start"
) -> list[tuple[str, Timeline]]:
    """The best ``POLISHED`` schedules that fit, and the best registry schedule that fits where it is
    not among them (14.6B m = 64 V at 1x of benchmarks/memory_time.py: ZB-V's order polished is
    1990.7, where the best three, all derived orders, gave 2013.3), each with its W re-placed into
    the gaps and (with recompute) every kept microbatch first recomputed the quickest way and then
    relaxed (``mixed.polished``); then, with what is left of ``budget``, each with W held past each
    rank's last backward (``mixed.held_back_search``) and polished again. Where the problem chooses
    recompute under a limit, also the ``POLISHED`` shortest orders on the problem as if every
    microbatch took the quickest recompute, among the starts' and every registry schedule built
    (fitting or not), each with W held back there and mapped back (``mixed.AsIfSearch.held_back``),
    then polished. Those that fit and beat their schedule (the latter: all), judged. What
    ``budget`` leaves undone goes on after the backend (``Polish``, in ``run.paused``)."""
    polish = Polish(problem, run)
    out = polish.go(budget, say, step)
    if not polish.over:
        run.paused.append(polish)
    return out


class Polish:
    """``polished_candidates``' steps in order, each call (``go``) from where the one before
    stopped: every start's polished variants; the as-if searches built; a share of the time for
    each one's descent of W held back; each start's own held-back descent; then the as-if descents
    that their share cut short, the shortest first, until each settles. In ``run.paused`` beside the
    ``Paused`` searches (the same ``over``, ``best``, ``stale``, ``resume`` and ``stop``), so that
    ``_resume`` gives what the warm start left undone turns after the backend: on the largest
    problems, where the backend finds nothing in its time, that is where the time goes (28.3B m = 96
    V at 0.75x of benchmarks/memory_time.py: docs/results.md)."""

    def __init__(self, problem: Problem, run: RegistryRun):
        ranked = sorted((nt for nt in run.fitting if not nt[1].schedule.copy), key=lambda nt: nt[1].objective_value())
        bases: dict = {}  # by order: the first of equal orders
        for _, t in ranked:
            if len(bases) == POLISHED:
                break
            bases.setdefault(t.schedule.ranks, t)
        registry = next((t for name, t in ranked if name not in run.derived), None)
        if registry is not None:
            bases.setdefault(registry.schedule.ranks, registry)
        self.problem, self.built = problem, [s for _, s in run.built]
        self.starts = list(bases.values())
        self.critical = [t.objective_rank() for t in self.starts]
        self.found = list(self.starts)  # each start's best so far
        self.as_if: list[AsIfSearch] | None = None  # (built at their step)
        self.done = 0  # the steps of the list below done
        self.over = not self.starts  # (as ``Paused``'s)
        self.best = min((t.objective_value() for t in self.starts), default=math.inf)  # (its starts' too)

    @property
    def stale(self) -> bool:
        """Never: its steps are few and start from the shortest schedules, so ``_resume`` gives it
        every turn until it is over."""
        return False

    @stale.setter
    def stale(self, value: bool) -> None:
        pass

    def go(self, budget: Budget, say: Callable[[str], None], step: str) -> list[tuple[str, Timeline]]:
        """On within ``budget``: what it found that fits and beats its schedule, said."""
        problem, n = self.problem, len(self.starts)
        out = []

        def keep(best: Timeline) -> None:
            say(f"{step}: {best.schedule.name} {problem.objective} {best.objective_value():.6g}")
            out.append((best.schedule.name, best))
            self.best = min(self.best, best.objective_value())

        def descend(search: AsIfSearch, within: Budget) -> None:
            held = search.held_back(within)
            if held is not None:
                keep(_best_polished(problem, held, budget))

        while not self.over and budget.left() >= STEP_MIN_SECONDS:  # (a step with less waits for the next call)
            i = self.done
            if i < n:  # every start's polished variants (quick)
                self.found[i] = _best_polished(problem, self.starts[i], budget, self.critical[i])
                if self.found[i] is not self.starts[i]:
                    keep(self.found[i])
            elif i == n:
                self.as_if = as_if_searches(problem, [*(t.schedule for t in self.starts), *self.built], POLISHED,
                                            budget.share(AS_IF_SHARE))
            elif i <= n + len(self.as_if):  # each as-if descent a share (each count judged without a fit)
                k = i - n - 1
                descend(self.as_if[k], budget.share(1 / (len(self.as_if) + 1 - k)))
            elif i <= 2 * n + len(self.as_if):  # each start's own, a share
                k = i - n - 1 - len(self.as_if)
                held = held_back_search(problem, self.starts[k].schedule, budget.share(1 / (n - k)))
                if held is not None:
                    best = _best_polished(problem, held, budget, self.critical[k], held)
                    if problem.time_tol.lt(best.objective_value(), self.found[k].objective_value()):
                        self.found[k] = best
                        keep(best)
            else:  # the as-if descents cut short, the shortest first, until each settles
                unsettled = [search for search in self.as_if if not search.settled]
                if not unsettled:
                    self.over = True
                    break
                descend(min(unsettled, key=lambda search: search.best.objective_value()), budget)
                continue
            self.done += 1
        return out

    def resume(self, call: _Call, budget: Budget) -> list[tuple[str, Timeline]]:
        found = self.go(budget, call.clock.say, "resumed")
        call.run.fitting.extend(found)
        call.run.derived.update(name for name, _ in found)
        return found

    def stop(self) -> None:
        self.over = True


def _best_polished(problem: Problem, t: Timeline, budget: Budget, critical: int | None = None,
                   best: Timeline | None = None) -> Timeline:
    """The shortest that fits of ``best`` (default ``t``) and ``mixed.polished``'s variants of
    ``t`` (its critical rank ``critical``, default its own), judged until ``budget`` runs out."""
    best = t if best is None else best
    for schedule in polished(problem, t.schedule, critical=t.objective_rank() if critical is None else critical):
        if budget.expired():
            break
        try:
            v = simulate(problem, schedule)
        except SchedcError:
            continue
        if v.fits and problem.time_tol.lt(v.objective_value(), best.objective_value()):
            best = v
    return best


def fitting_registry_schedules(problem: Problem) -> list[tuple[str, Timeline]]:
    """Every registry schedule that applies and fits the memory limit, judged (backward split)."""
    return evaluate_registry(problem).fitting


def _least_memory_start(problem: Problem, run: RegistryRun, say: Callable[[str], None]) -> tuple[str, Timeline]:
    """Where nothing else fits: the order that holds least (``memtime.least_memory``: one
    microbatch at a time, each stage under its lightest policy) as the warm start, joined to
    ``run``'s fitting ones; if even that does not fit, a SchedcError saying what it needs."""
    least = least_memory(problem)
    t = simulate(problem, least)
    if not t.fits:
        limit = ", ".join(f"{x:g}" for x in problem.memory_limit)
        raise SchedcError(
            f"no schedule fits the memory limit ({limit}) to start from: the one that holds least, {least.name} (one"
            f" microbatch at a time{_lightest(problem)}), peaks at {', '.join(f'{x:g}' for x in t.peak_memory)};"
            f" raise the limit to that{_more_policies(problem)} (no schedule needs less than"
            f" {', '.join(f'{problem.min_memory(r):g}' for r in range(problem.ranks))})")
    say(f"warm start: {least.name} {problem.objective} {t.objective_value():.6g}")
    run.fitting.append((least.name, t))
    run.derived.add(least.name)
    return least.name, t


def _lightest(problem: Problem) -> str:
    """How ``memtime.least_memory`` lightens its stages, for a message."""
    if Kind.O in problem.policies:
        return ", every activation offloaded or recomputed, whichever keeps less" if problem.recomputes \
            else ", every activation offloaded"
    return ", every activation recomputed" if problem.recomputes else ""


def _more_policies(problem: Problem) -> str:
    """What a problem could declare to need less memory, for a message."""
    missing = [name for name, kinds in (("recompute:", problem.recomputes), ("offload:", Kind.O in problem.policies))
               if not kinds]
    return f", or declare {' or '.join(missing)}" if missing else ""


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


def _refuse_foreign_start(problem: Problem, start: Schedule) -> Schedule:
    """``start`` if it is a schedule of ``problem`` (its ops, on its ranks), else a SchedcError
    that says what differs."""
    try:
        start.check_complete(problem)
    except ScheduleError as e:
        raise SchedcError(f"the start schedule {start.name!r} is not a schedule of this problem ({e}): a re-solve"
                          " starts from a schedule of a problem with the same ranks, chunks, placement and"
                          " microbatches") from None
    return start


def _judge_candidates(
    problem: Problem, candidates: Sequence[tuple[str, Schedule]], say: Callable[[str], None]
) -> list[tuple[str, Timeline]]:
    """The caller's candidate schedules that are complete and fit, judged (backward split)."""
    fitting = []
    for name, schedule in candidates:
        try:
            t = simulate(problem, split_named(schedule, name))
        except SchedcError as e:  # incomplete or deadlocking: not a candidate
            say(f"warm start: {name} is not a schedule of this problem ({e})")
            continue
        say(f"warm start: {t.schedule.name} " + (f"{problem.objective} {t.objective_value():.6g}" if t.fits else "does not fit"))
        if t.fits:
            fitting.append((name, t))
    return fitting


def _start_candidates(problem: Problem, start: Schedule, say: Callable[[str], None]) -> list[tuple[str, Timeline]]:
    """A re-solve's start, judged as "start"; where it does not fit (the limit is lower, or the
    activations larger, than those it was solved for) and the problem allows recompute, its order
    with mixed policies fitted instead (``mixed.fitted_orders``: "start+mix", "start+mix-w")."""
    judged = _judge_candidates(problem, [("start", start)], say)
    if judged or not problem.recomputes or problem.activation_room is None:
        return judged
    return _judge_candidates(problem, list(fitted_orders(problem, start, "start")), say)


# ---- the driver ----


def check_settings(time_limit: float | Budget, gap: float, threads: int | None) -> None:
    """ValueError for settings no search can honour (nan and infinities included)."""
    if not isinstance(time_limit, Budget) and (
        isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not 0 < time_limit < math.inf
    ):
        raise ValueError(f"time_limit must be a finite number of seconds > 0, got {time_limit!r}")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 <= gap <= 1:
        raise ValueError(f"gap must be a number in [0, 1], got {gap!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a whole number >= 1 or None, got {threads!r}")


class _Clock:
    """The call's own clock: ``progress`` hears every step in seconds since ``solve`` began."""

    def __init__(self, progress: Callable[[Progress], None] | None):
        self.began = time.perf_counter()
        self.progress = progress

    def seconds(self) -> float:
        return time.perf_counter() - self.began

    def say(self, note: str) -> None:
        if self.progress:
            self.progress(Progress(self.seconds(), None, None, note))

    def relay(self, event: Progress) -> None:
        """A backend's event, whose seconds run on the backend's own clock."""
        if self.progress:
            self.progress(replace(event, seconds=self.seconds()))

    def objective(self, value: float) -> None:
        """The local search's better objective."""
        if self.progress:
            self.progress(Progress(self.seconds(), value, None))


@dataclass(frozen=True)
class _Call:
    """What one call of ``solve`` works on: the problem, the backend's name, the registry schedules
    judged for the warm start, and the call's clock."""

    problem: Problem
    solver: str
    run: RegistryRun
    clock: _Clock
    torch: bool = False  # the result renumbered for torch's runtime (``in_torch_order``)


@dataclass
class _Outcome:
    """Where a solve stands: its best schedule, the registry schedule it started from, whether the
    best is a registry schedule, and what the backend found (``Found(None)`` when it did not run)."""

    best: Timeline
    warm: tuple[str, Timeline]
    from_registry: bool = True
    found: Found = field(default_factory=lambda: Found(None))


def solve(
    problem: Problem,
    *,
    solver: str = AUTO,
    time_limit: float | Budget = 60.0,
    gap: float = 1e-4,
    threads: int | None = None,
    progress: Callable[[Progress], None] | None = None,
    candidates: Sequence[tuple[str, Schedule]] = (),
    torch: bool = False,
    start: Schedule | None = None,
) -> SolveResult:
    """Search the fastest split-backward schedule that fits ``problem``'s memory limit.

    ``time_limit`` is wall-clock seconds for the whole call, or a ``Budget`` (the CLI's counts
    from the process's start and keeps simulations' time for writing the file): judging the
    registry schedules for the warm start (at most WARM_SHARE of it once one fits; the rest are
    then left out and listed in ``not_evaluated``), the local search, building the model, the
    search, and judging what it found. ``progress`` hears of each step from the first one on,
    with seconds since the call began. ``candidates`` are more schedules to start from (e.g.
    torch.distributed.pipelining's, which the CLI adds with ``--torch``): each that is complete
    and fits joins the registry's for the warm start, so the result is never worse than any of
    them either. ``torch``: the result is for torch.distributed.pipelining's runtime, its
    microbatches numbered in the order its last stage runs their forwards (see the module notes);
    a problem torch cannot run (replicas, sequence chunks, recompute or offload) is refused first.
    ``start``: a re-solve's head start, a schedule of this problem (e.g. the one solved before the
    costs changed): judged first, as the candidate "start" (where it does not fit and the problem
    allows recompute, its order with mixed policies fitted: ``_start_candidates``); where one fits,
    each step of the warm start keeps to its share of the budget from the outset, leaving the search
    more time."""
    if solver not in BACKENDS:
        raise SchedcError(f"unknown solver {solver!r}; choose one of {', '.join(BACKENDS)}")
    check_settings(time_limit, gap, threads)
    if solver == AUTO:  # the backend it runs, named as such in the progress and the result
        solver = backend_for(problem)
    if torch:
        _refuse_untorchable_problem(problem)
    if problem.objective == "steady":  # the makespan over the microbatches: the same search, rescaled
        found = solve(problem.with_changes(objective="makespan"), solver=solver, time_limit=time_limit, gap=gap,
                      threads=threads, progress=progress, candidates=candidates, torch=torch, start=start)
        return per_microbatch(found, problem)
    clock = _Clock(progress)
    budget = time_limit if isinstance(time_limit, Budget) else Budget.seconds(time_limit)
    # The registry may take the whole budget when the rest would be too short for a neighbourhood
    # anyway (large problems, where its schedules are slow to build and judge, are searched so).
    warm_share = WARM_SHARE if (1 - WARM_SHARE) * budget.left() >= WINDOW_MIN_SECONDS else 1.0
    warm_budget = budget.share(warm_share)
    # The registry's schedules (the greedy scheduler's searches as they go, with half of what is left,
    # before those that need a policy section), then the candidates with mixed policies: each step
    # stops at its share once a schedule fits.
    started = [] if start is None else _start_candidates(problem, _refuse_foreign_start(problem, start), clock.say)
    run = evaluate_registry(problem, warm_budget.share(REGISTRY_SHARE), clock.say,
                            greedy_budget=lambda: warm_budget.share(GREEDY_SHARE),
                            later_budget=lambda: warm_budget.share(REGISTRY_SHARE), found=bool(started),
                            beside=budget)
    try:
        run.fitting.extend(started + _judge_candidates(problem, candidates, clock.say))
        # The candidates with policies leave the polish a share of what the warm start has left
        # (where their stream does not end in time, as on large problems, the polish had none), and
        # the polish has at least POLISH_SHARE of the budget left, however long the steps before took.
        for step, within in ((recomputed_candidates, lambda: warm_budget.share(POLICY_SHARE)),
                             (periodic_candidates, lambda: budget.share(PERIODIC_SHARE)),
                             (polished_candidates,
                              lambda: warm_budget.share(1.0).at_least(POLISH_SHARE * budget.left()))):
            derived = step(problem, run, within(), clock.say)
            run.fitting.extend(derived)
            run.derived.update(name for name, _ in derived)
        if run.beside is not None:  # (what the greedy found beside the warm start so far)
            run.beside.collect(problem, run, clock.say, "warm start")
        warm = best_registry_schedule(problem, run.fitting)
        if warm is None and not run.built and not candidates:
            raise SchedcError(
                "no registry schedule applies to this problem, so solve has nothing to start from"
                + (" (on a sequence-chunked problem only seq1f1b and seq1f1b-zb apply, and they need one chunk per"
                   f" rank: chunks is {problem.chunks})" if problem.seq_chunks > 1 else "")
            )
        if warm is None:
            warm = _least_memory_start(problem, run, clock.say)
        own = lower_bound(problem)
        # What is left for the search: the budget less what the caller keeps and one simulation, to
        # judge what the search found.
        usable = budget.usable(run.simulate_seconds).less(run.simulate_seconds)
        call = _Call(problem, solver, run, clock, torch)
        local = budget.share(LOCAL_SEARCH_SHARE)  # of what the warm start left
        out = _search(call, Settings(usable, gap, threads, own.value, clock.relay), local, _Outcome(warm[1], warm))
        if run.beside is not None:  # (the search ended before its backend ran: what the greedy found since)
            run.beside.finish(call, out)
        if problem.fused_cheaper:
            _prefer_fused(call, out)
        return _result(call, out, own)
    finally:
        if run.beside is not None:  # (the solve ended before the backend: its thread first)
            run.beside.halt()
        for search in run.paused:  # (never left behind)
            search.stop()


def _search(call: _Call, settings: Settings, local: Budget, out: _Outcome) -> _Outcome:
    """The local search (within ``local`` too), then the backend, from ``out``'s warm start."""
    problem, run, clock = call.problem, call.run, call.clock
    tol = problem.time_tol
    warm_t = out.best
    if meets(warm_t.objective_value(), settings.lower):  # the warm start is already proven optimal
        return out
    # Local search first (cheap, any size): a better incumbent for the exact search to start from.
    polished = improve(
        problem, warm_t, settings.budget.earlier(local), others=[t for _, t in run.fitting if t is not warm_t],
        enough=settings.lower, progress=clock.progress and clock.objective,
    )
    if tol.lt(polished.objective_value(), warm_t.objective_value()):
        out.best, out.from_registry = polished, False
    left = settings.budget.left()
    if meets(out.best.objective_value(), settings.lower):
        return out  # the local search reached the bound: nothing left to search for
    if left < SEARCH_MIN_SECONDS:
        out.found = Found(None, note="time limit (no time left to search)")
        clock.say("search: time limit, no time left to search")
        return out
    clock.say(f"search: {call.solver}, {left:.1f} s left")
    start = out.best
    if not _modelled(start.schedule, call.solver):  # the best that the backend's model holds
        plain = [t for t in (polished, *(t for _, t in run.fitting)) if t.fits and _modelled(t.schedule, call.solver)]
        if not plain:
            out.found = Found(None, note=f"not searched: {call.solver}'s model holds none of the schedules that fit")
            clock.say(f"search: {out.found.note}")
            return out
        start = min(plain, key=lambda t: t.objective_value())
    greedy_beside = call.run.beside
    beside = None if greedy_beside is not None else _beside(call, settings, out.best)
    try:
        out.found = BACKENDS[call.solver](problem, start, settings)
    finally:
        found_beside = _collected(beside)
        if greedy_beside is not None:
            greedy_beside.finish(call, out)
    if found_beside is not None:
        t = simulate(problem, found_beside)
        if t.fits and tol.lt(t.objective_value(), out.best.objective_value()):
            out.best, out.from_registry = t, False
            clock.say(f"local search beside {call.solver}: {problem.search_objective} {t.objective_value():g}")
    if out.found.note:
        clock.say(f"search: {call.solver}: {' '.join(out.found.note.split())[:120]}")
    if out.found.schedule is not None:
        t = simulate(problem, out.found.schedule.renamed("ilp"))
        if t.fits and tol.lt(t.objective_value(), out.best.objective_value()):
            out.best, out.from_registry = t, False
    # What the backend left (its search ended, or gave up on a problem too large for it): the
    # searches the warm start paused, on to their end (``_resume``); then the best
    # polished again (``mixed.polished``), and the local search again from there (a new seed), until
    # the budget runs out or PATIENCE kicks find nothing.
    _resume(call, settings.budget, settings.lower, out)
    if settings.budget.left() >= AGAIN_MIN_SECONDS and not meets(out.best.objective_value(), settings.lower):
        if out.best is not warm_t:
            for name, t in polished_candidates(problem, RegistryRun([("", out.best)], [], [], 0.0),
                                               settings.budget, clock.say, "polished"):
                if tol.lt(t.objective_value(), out.best.objective_value()):
                    out.best, out.from_registry = t, False
        clock.say(f"local search: {settings.budget.left():.1f} s left")
        again = improve(problem, out.best, settings.budget, enough=settings.lower, seed=1,
                        progress=clock.progress and clock.objective)
        if tol.lt(again.objective_value(), out.best.objective_value()):
            out.best, out.from_registry = again, False
    return out


class _GreedyBeside:
    """The registry's greedy searches that the warm start cut short, going on in their child
    process on the spare core (rather than paused) from the end of their share of the warm start
    through the backend's search, read by a thread here. They are the registry's own (``schedc
    compare`` runs them to their end): on a problem where the warm start cannot wait for them, this
    is what keeps the result at or below the best registry schedule where the backend cannot get
    there first. What they found is judged before the warm start is chosen (``collect``) and once
    the backend is done (``finish``); then ``_resume`` goes on with them in turns, as paused."""

    def __init__(self, search: GreedySearches, budget: Budget, wait: bool = True):
        self.search, self.judged, self.wait = search, dict(search.latest), wait
        self.halted = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._drive, args=(budget,), name="greedy beside", daemon=True)
        self.thread.start()

    @classmethod
    def early(cls, problem: Problem, budget: Budget) -> _GreedyBeside | None:
        """The searches started at once, beside the warm start's other schedules, where the machine
        has a core to spare and the problem is large enough for a child process; read in turns that
        never wait for a schedule that fits (none may have been judged yet); ``halt`` before the
        warm start reads them itself."""
        if not in_child(problem) or not can_fork() or _cores() < 2 or budget.left() < BESIDE_MIN_SECONDS:
            return None
        return cls(GreedySearches(problem, fitted=False), budget, wait=False)

    @classmethod
    def start(cls, search: GreedySearches, budget: Budget) -> _GreedyBeside | None:
        """Where the machine has a core to spare (as ``_beside`` asks) and the search runs in a
        child process, once a schedule fits (before, its turns would have no end)."""
        if (not search.fitted or search.over or not search.worker.in_child or _cores() < 2
                or budget.left() < BESIDE_MIN_SECONDS):
            return None
        return cls(search, budget)

    def _drive(self, budget: Budget) -> None:
        try:  # in turns, so that ``halt`` is heard within one (the child pauses at each turn's end)
            while not self.halted.is_set() and not self.search.over and not budget.expired():
                self.search.read(budget.at_most(GREEDY_BESIDE_TURN), self.wait)
        except BaseException as e:  # (raised again by ``halt``, on the solve's own thread)
            self.error = e

    def collect(self, problem: Problem, run: RegistryRun, say: Callable[[str], None],
                step: str = "beside") -> list[tuple[str, Timeline]]:
        """What the searches found since the last collect, judged into ``run`` (they go on)."""
        now = dict(self.search.latest)
        out = self.search.news(problem, run, say, self.judged, step)
        self.judged = now
        return out

    def halt(self) -> None:
        """Stop reading: the search is left paused where its last turn ended (for ``_resume``)."""
        self.halted.set()
        self.thread.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def finish(self, call: _Call, out: _Outcome) -> None:
        """Halt, and take the best of what the searches found where it beats ``out.best``."""
        self.halt()
        tol = call.problem.time_tol
        for name, t in self.collect(call.problem, call.run, call.clock.say, "beside the search"):
            if tol.lt(t.objective_value(), out.best.objective_value()):
                out.best, out.from_registry = t, name in REGISTRY
        if self.search.over and self.search in call.run.paused:
            call.run.paused.remove(self.search)
        call.run.beside = None


def _beside(call: _Call, settings: Settings, best: Timeline) -> Worker | None:
    """The local search again (``_searching_beside``) in a child process on another core while
    the backend runs, where the machine has one to spare: two or more cores this process may run
    on, and ``threads`` left to the backend's default (one thread for CBC; a caller who names a
    number of threads has said what the solve may use). None where it does not run."""
    if (settings.threads is not None or _cores() < 2 or not can_fork() or best.schedule.copy
            or settings.budget.left() < BESIDE_MIN_SECONDS):
        return None
    return Worker(_searching_beside, (call.problem, best.schedule, settings.budget, settings.lower), child=True)


def _searching_beside(problem: Problem, start: Schedule, budget: Budget, lower: float) -> Iterator[Schedule]:
    """The local search from ``start`` in turns of BESIDE_TURN seconds, each from the best so far
    with a new seed, until ``budget`` runs out or the bound is met: yields each better schedule.
    Where the problem chooses recompute policies under a limit, every other turn goes to the
    search on the problem as if every microbatch took the quickest recompute (``mixed.AsIfSearch``,
    from ``start``'s order, on from its own best each turn), whose orders come back mapped."""
    best = simulate(problem, start)
    as_if_search = AsIfSearch.of(problem, start)
    seed = 2  # (the local searches before and after the backend take seeds 0 and 1)
    while not budget.expired() and not meets(best.objective_value(), lower):
        if as_if_search is not None and seed % 2:
            found = as_if_search.turn(budget.at_most(BESIDE_TURN), seed)
            t = best if found is None else found
        else:
            t = improve(problem, best, budget.at_most(BESIDE_TURN), enough=lower, seed=seed, patience=None)
        seed += 1
        if problem.time_tol.lt(t.objective_value(), best.objective_value()):
            best = t
            yield t.schedule


def _collected(worker: Worker | None) -> Schedule | None:
    """The last schedule the search beside the backend sent (None: none), the search stopped."""
    if worker is None:
        return None
    last = None
    with worker:
        try:
            while (item := worker.next(Budget.seconds(0.0))) not in (END, LATE):
                last = item
        except WorkerDied:  # (killed from outside: what it sent before still counts)
            pass
    return last


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        return os.cpu_count() or 1


def _resume(call: _Call, budget: Budget, lower: float, out: _Outcome) -> None:
    """The searches the warm start paused (``run.paused``: the greedy's, the policy orders'), on
    where they stopped, a turn of at most RESUME_TURN seconds at a time until they end, ``budget``
    runs out or ``out.best`` meets ``lower``; the best that fits of what they find replaces
    ``out.best`` where shorter. Each turn goes to the search with the shortest schedule so far
    among those whose last turn found a shorter one (when none did, among all). The greedy's are
    the registry's own (``schedc compare`` runs them to their end), and on a large problem both go
    on improving where the backend gives up."""
    run, tol = call.run, call.problem.time_tol
    if run.paused and budget.left() >= AGAIN_MIN_SECONDS:
        call.clock.say(f"searches cut short: resumed, {budget.left():.1f} s left")
    while run.paused and budget.left() >= AGAIN_MIN_SECONDS and not meets(out.best.objective_value(), lower):
        if all(search.stale for search in run.paused):
            for search in run.paused:
                search.stale = False
        search = min(run.paused, key=lambda s: (s.stale, s.best))
        before = search.best
        for name, t in search.resume(call, budget.at_most(RESUME_TURN)):
            if tol.lt(t.objective_value(), out.best.objective_value()):
                out.best, out.from_registry = t, name in REGISTRY
        search.stale = not tol.lt(search.best, before)
        if search.over:
            run.paused.remove(search)


def _modelled(schedule: Schedule, solver: str) -> bool:
    """Whether ``solver``'s model holds every op of ``schedule``: no copy lane unless it models one
    (COPY_LANE), and only the policies the searches choose (not Megatron's RG and SG)."""
    if schedule.copy and solver not in COPY_LANE:
        return False
    return all(ROWS[op.kind].searched for op in schedule.ops())


def _prefer_fused(call: _Call, out: _Outcome) -> None:
    """A fused backward is cheaper than B + W here: a fused registry schedule may beat every split
    one, and the backend's bound covers split schedules only (it is dropped)."""
    out.found = replace(out.found, bound=None)
    for name, t in call.run.fused:
        if call.problem.time_tol.lt(t.objective_value(), out.best.objective_value()):
            out.best, out.from_registry = t, True
            out.warm = (name, t)  # reported as the registry schedule it returns


def _result(call: _Call, out: _Outcome, own: Bound) -> SolveResult:
    """The result: the best schedule, the larger of the two bounds and the status."""
    solver, run = call.solver, call.run
    objective = out.best.objective_value()
    solver_bound = out.found.bound
    bound = max(own.value, solver_bound if solver_bound is not None else -math.inf)
    # The independent bound's reason when it is as good as the solver's (up to the solver's noise).
    reason = own.reason if solver_bound is None or meets(solver_bound, own.value) else f"{solver} search bound"
    if Tolerance.of(objective, 1e-6).gt(bound, objective):
        raise RuntimeError(f"bug: lower bound {bound} ({reason}) above a found schedule's {objective}")
    bound = min(bound, objective)  # solver tolerance
    if meets(objective, bound):
        status = "optimal"
    elif "time" in out.found.note.lower() or (out.from_registry and run.not_evaluated):
        status = "time limit"  # even when the warm start is returned: the search was cut short
    elif out.from_registry:
        status = "warm start"  # the search ended on its own and found nothing better
    else:
        status = "feasible"
    named = out.best.schedule.renamed("ilp")
    timeline = replace(out.best, schedule=named)
    if call.torch and (renumbered := in_torch_order(call.problem, named)) is not named:
        timeline = simulate(call.problem, renumbered)
        if not meets(timeline.objective_value(), objective) or timeline.fits != out.best.fits:
            raise RuntimeError(f"bug: renumbering the microbatches for torch changed the schedule's objective"
                               f" {objective} to {timeline.objective_value()}")
        named = renumbered
    warm_name, warm_t = out.warm
    return SolveResult(
        schedule=named,
        timeline=timeline,
        status=status,
        objective=objective,
        bound=bound,
        bound_reason=reason,
        warm_start=shown_name(warm_name, warm_t),
        warm_objective=warm_t.objective_value(),
        solver=solver,
        seconds=call.clock.seconds(),
        binaries=out.found.binaries,
        history=out.found.history,
        registry=[(shown_name(name, t), t) for name, t in run.fitting if name not in run.derived or name == warm_name],
        not_evaluated=run.not_evaluated,
    )


def _refuse_untorchable_problem(problem: Problem) -> None:
    """A one-line ScheduleError for a problem whose schedules torch's runtime cannot run (before
    searching): several pipelines, sequence chunks, or recompute or offload declared."""
    name = problem.name or "the problem"
    refuse_torch_shape(name, pipelines=problem.pipelines, chunks=problem.seq_chunks)
    if problem.policies:
        held = " and ".join(dict.fromkeys(ROWS[k].policy for k in problem.policies))
        raise ScheduleError(f"{name} allows {held}, for which torch's IR has no action: drop that section to solve"
                            " for torch's runtime, or solve without --torch and run the schedule with schedc's runtime")


def per_microbatch(found: SolveResult, problem: Problem) -> SolveResult:
    """``found`` (a search on ``problem``'s makespan) for ``problem``, whose objective is the time
    per microbatch (``steady``): a synchronous schedule's is its makespan over the microbatches, so
    the objective, the bound and the history divide by them, and the timelines judge ``problem``."""
    units = problem.microbatches * problem.pipelines

    def judged(t: Timeline) -> Timeline:
        return replace(t, problem=problem)

    def scaled(x: float | None) -> float | None:
        return None if x is None else x / units

    return replace(found, timeline=judged(found.timeline), objective=found.objective / units,
                   bound=found.bound / units, warm_objective=found.warm_objective / units,
                   history=[replace(h, incumbent=scaled(h.incumbent), bound=scaled(h.bound)) for h in found.history],
                   registry=[(name, judged(t)) for name, t in found.registry])


SEARCHES["ilp"] = solve  # the exact search, by the name schedules go by
