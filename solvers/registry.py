"""The one registry of named schedules: the CLI, the ablation study and the tests all read it."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable

from schedc.errors import ScheduleError
from schedc.problem import Problem
from schedc.schedule import Schedule
from schedc.simulate import Timeline, simulate

Builder = Callable[[Problem], Schedule]


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    build: Builder
    summary: str
    split_backward: bool  # True: separate B and W ops; False: fused BW
    requires: Callable[[Problem], str | None]  # why it does not apply, or None

    def why_not(self, problem: Problem) -> str | None:
        return self.requires(problem)


REGISTRY: dict[str, ScheduleSpec] = {}
# name -> a search: ``search(problem, *, solver, time_limit, gap, threads, progress)`` returning a
# result with ``schedule``, ``timeline`` and ``summary()`` (``schedc.solvers.ilp.solve`` is "ilp").
# Named like a schedule wherever one is taken (schedc.compile, ablation configs); not built by
# ``evaluate``, as a search needs a time limit.
SEARCHES: dict[str, Callable[..., Any]] = {}


def register(name: str, summary: str, *, split_backward: bool, requires: Callable[[Problem], str | None]):
    def wrap(fn: Builder) -> Builder:
        if name in REGISTRY:
            raise ValueError(f"schedule {name!r} registered twice")
        REGISTRY[name] = ScheduleSpec(name, fn, summary, split_backward, requires)
        return fn

    return wrap


def get(name: str) -> ScheduleSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(REGISTRY)}") from None


def build(name: str, problem: Problem) -> Schedule:
    spec = get(name)
    reason = spec.why_not(problem)
    if reason:
        raise ScheduleError(f"schedule {name!r} does not apply to this problem: {reason}")
    return spec.build(problem)


@dataclass(frozen=True)
class Evaluated:
    """One registry schedule judged on a problem: built and simulated where it applies (else
    ``reason`` says why not, and ``schedule`` and ``timeline`` are None)."""

    name: str
    reason: str | None
    schedule: Schedule | None
    timeline: Timeline | None
    seconds: float  # building and simulating it

    @property
    def fits(self) -> bool:
        return self.timeline is not None and self.timeline.fits


def evaluate(problem: Problem, names: Iterable[str] | None = None) -> list[Evaluated]:
    """Every registry schedule (or each of ``names``, in that order) on ``problem``, as the CLI's
    compare and the ablation study judge them. (The solver's warm start, ``ilp.evaluate_registry``,
    judges them under its deadline, in a child process on large problems, with the backward
    split: a pass of its own.)"""
    out = []
    for spec in (get(n) for n in (REGISTRY if names is None else names)):
        reason = spec.why_not(problem)
        if reason:
            out.append(Evaluated(spec.name, reason, None, None, 0.0))
            continue
        began = time.perf_counter()
        schedule = spec.build(problem)
        timeline = simulate(problem, schedule)
        out.append(Evaluated(spec.name, None, schedule, timeline, time.perf_counter() - began))
    return out


# ---- common requirements ----

def one_chunk(problem: Problem) -> str | None:
    return None if problem.chunks == 1 else f"needs one chunk per rank (chunks is {problem.chunks})"


def any_placement(problem: Problem) -> str | None:
    return None


def loop_placement(problem: Problem) -> str | None:
    if problem.chunks > 1 and problem.stage_rank != tuple(s % problem.ranks for s in range(problem.n_stages)):
        return "needs the loop placement (stage s on rank s mod p)"
    return None
