"""The one registry of named schedules: the CLI, the ablation study and the tests all read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from schedc.errors import ScheduleError
from schedc.problem import Problem
from schedc.schedule import Schedule

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


# ---- common requirements ----

def one_chunk(problem: Problem) -> str | None:
    return None if problem.chunks == 1 else f"needs one chunk per rank (chunks is {problem.chunks})"


def any_placement(problem: Problem) -> str | None:
    return None


def loop_placement(problem: Problem) -> str | None:
    if problem.chunks > 1 and problem.stage_rank != tuple(s % problem.ranks for s in range(problem.n_stages)):
        return "needs the loop placement (stage s on rank s mod p)"
    return None
