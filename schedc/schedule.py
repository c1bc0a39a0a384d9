"""A Schedule: per rank, the ordered compute ops. Nothing else (times come from simulate())."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, NamedTuple

from schedc.errors import ScheduleError
from schedc.kinds import BY_NAME, ROWS, Kind, candidates, in_order
from schedc.problem import Problem


class _OpFields(NamedTuple):
    kind: Kind
    stage: int
    mb: int


_PRINTED = re.compile(r"([A-Z]+)(\d+)@s(\d+)")


class Op(_OpFields):
    """One compute op: ``kind`` is a ``Kind`` (schedc.kinds: F, B input gradient, W weight
    gradient, BW fused), ``stage`` and microbatch ``mb``. A kind given as its name (``Op("F", 0,
    1)``, as files and tests write it) becomes the Kind here; an unknown one is a ScheduleError.
    Prints as ``F1@s0`` (kind, microbatch, stage), which ``Op.parse`` reads back."""

    __slots__ = ()

    def __new__(cls, kind: Kind | str, stage: int, mb: int) -> "Op":
        if kind.__class__ is not Kind:
            known = BY_NAME.get(kind) if isinstance(kind, str) else None
            if known is None:
                raise ScheduleError(
                    f"unknown op kind {kind!r} in {kind}{mb}@s{stage} (expected {', '.join(BY_NAME)})"
                )
            kind = known
        return tuple.__new__(cls, (kind, stage, mb))

    @classmethod
    def _make(cls, iterable) -> "Op":  # _replace() goes through here: keep the coercion
        return cls(*iterable)

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}@s{self.stage}"

    @classmethod
    def parse(cls, text: str) -> "Op":
        """The op that prints as ``text`` (``F1@s0``, ``BW3@s2``)."""
        match = _PRINTED.fullmatch(text.strip())
        if not match:
            raise ScheduleError(f"cannot read {text!r} as an op: expected kind, microbatch, @s, stage, e.g. F1@s0")
        kind, mb, stage = match.groups()
        return cls(kind, int(stage), int(mb))

    def to_torch(self) -> str:
        """torch.distributed.pipelining's action: ``{stage}{letter}{mb}`` (``0F1``; B is I, BW is B)."""
        return f"{self.stage}{ROWS[self.kind].torch}{self.mb}"


@dataclass(frozen=True)
class Schedule:
    name: str
    ranks: tuple[tuple[Op, ...], ...]

    @classmethod
    def from_lists(cls, name: str, per_rank: Iterable[Iterable[Op | tuple[str, int, int]]]) -> "Schedule":
        return cls(name, tuple(tuple(Op(*op) for op in ops) for ops in per_rank))

    def renamed(self, name: str) -> "Schedule":
        return replace(self, name=name)

    @property
    def n_ops(self) -> int:
        return sum(len(ops) for ops in self.ranks)

    @property
    def split_backward(self) -> bool:
        """Whether its backward is split into B and W (it has ops of the split-only kinds)."""
        return any(ROWS[op.kind].split for ops in self.ranks for op in ops)

    def locate(self) -> dict[Op, tuple[int, int]]:
        """op -> (rank, position). Raises on an op listed twice."""
        where: dict[Op, tuple[int, int]] = {}
        for r, ops in enumerate(self.ranks):
            for i, op in enumerate(ops):
                if op in where:
                    raise ScheduleError(
                        f"{self.name}: {op} is scheduled twice (rank {where[op][0]} and rank {r})"
                    )
                where[op] = (r, i)
        return where

    def check_complete(self, problem: Problem) -> dict[Op, tuple[int, int]]:
        """Every op exactly once, on the rank that holds its stage; returns ``locate()``."""
        if len(self.ranks) != problem.ranks:
            raise ScheduleError(f"{self.name}: has {len(self.ranks)} ranks, the problem has {problem.ranks}")
        where = self.locate()
        n, m = problem.n_stages, problem.microbatches
        for op, (r, _) in where.items():
            if op.kind not in _ON_COMPUTE:
                raise ScheduleError(f"{self.name}: {op}: {_off_lane(op.kind)}")
            if not (0 <= op.stage < n and 0 <= op.mb < m):
                raise ScheduleError(f"{self.name}: {op} is outside {n} stages x {m} microbatches")
            if problem.stage_rank[op.stage] != r:
                raise ScheduleError(
                    f"{self.name}: {op} is on rank {r} but stage {op.stage} is placed on rank"
                    f" {problem.stage_rank[op.stage]}"
                )
        missing = []
        for s in range(n):
            for i in range(m):
                missing += [op for k in _ALWAYS if (op := _new(Op, (k, s, i))) not in where]
                fused = False
                for k in _FUSED:
                    if _new(Op, (k, s, i)) in where:
                        fused = True
                        break
                if fused and any(_new(Op, (k, s, i)) in where for k in _SPLIT):
                    raise ScheduleError(
                        f"{self.name}: stage {s} microbatch {i} has both {'/'.join(_FUSED)} and {'/'.join(_SPLIT)}"
                    )
                missing += [op for k in (_FUSED if fused else _SPLIT) if (op := _new(Op, (k, s, i))) not in where]
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ScheduleError(f"{self.name}: {len(missing)} ops missing: {shown}")
        return where


# What a complete schedule holds for each (stage, microbatch), from the kinds' rows: the kinds of
# both forms, then either the fused kinds or the split ones.
_ALWAYS = tuple(k for k, row in ROWS.items() if row.split is None)  # F
_SPLIT = tuple(k for k, row in ROWS.items() if row.split)  # B, W
_FUSED = tuple(k for k, row in ROWS.items() if row.split is False)  # BW
_ON_COMPUTE = frozenset(k for k, row in ROWS.items() if row.lane == "compute")  # what a Schedule's ranks hold
# kind -> its needs as (the first kind that may meet it, the others in the table's order, stage offset)
_NEEDS = {k: tuple((candidates(need)[0], candidates(need)[1:], offset) for need, offset in row.needs)
          for k, row in ROWS.items()}
_new = tuple.__new__  # an Op of a Kind without Op.__new__'s check: producers() runs in every simulation


def _off_lane(kind: Kind) -> str:
    """Why a Schedule cannot hold an op of ``kind``: its ranks are the compute lane's orders."""
    return (f"op kind {kind.value!r} runs on the {ROWS[kind].lane} lane; a Schedule orders the compute lane"
            f" (kinds {', '.join(in_order(_ON_COMPUTE))})")


def producers(op: Op, n_stages: int, where: dict[Op, tuple[int, int]] | None = None) -> list[Op]:
    """The ops whose results ``op`` consumes (data dependencies, not rank order): the one rule
    of "which op waits for which" that the simulator, the heuristics, lowering and the checker use.

    Read from the kinds' rows (``KindRow.needs``): F(s, i) needs F(s-1, i); B or BW(s, i) needs
    F(s, i) and the backward of stage s+1 (its B, or its fused BW where ``where``, the schedule's
    ops, holds no B; without ``where``, its B); W(s, i) needs B(s, i). A need whose stage is
    outside the pipeline has no producer.
    """
    kind, s, i = op
    deps = []
    for first, others, offset in _NEEDS[kind]:
        t = s + offset
        if 0 <= t < n_stages:
            if others and where is not None:  # the first kind that the schedule holds, else the last
                for k in (first, *others[:-1]):
                    if _new(Op, (k, t, i)) in where:
                        deps.append(_new(Op, (k, t, i)))
                        break
                else:
                    deps.append(_new(Op, (others[-1], t, i)))
            else:
                deps.append(_new(Op, (first, t, i)))
    return deps
