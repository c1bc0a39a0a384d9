"""A Schedule: per rank, the ordered compute ops. Nothing else (times come from simulate())."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, NamedTuple

from schedc.errors import ScheduleError
from schedc.problem import KINDS, Problem


class Op(NamedTuple):
    """One compute op: ``kind`` is F, B (input gradient), W (weight gradient) or BW (fused)."""

    kind: str
    stage: int
    mb: int

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}@s{self.stage}"


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
        return any(op.kind == "W" for ops in self.ranks for op in ops)

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
            if op.kind not in KINDS:
                raise ScheduleError(f"{self.name}: unknown op kind {op.kind!r} in {op} (expected F, B, W or BW)")
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
                if Op("F", s, i) not in where:
                    missing.append(Op("F", s, i))
                fused, split_b, split_w = (Op(k, s, i) in where for k in ("BW", "B", "W"))
                if fused and (split_b or split_w):
                    raise ScheduleError(f"{self.name}: stage {s} microbatch {i} has both BW and B/W")
                if not fused:
                    missing += [Op(k, s, i) for k, there in (("B", split_b), ("W", split_w)) if not there]
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ScheduleError(f"{self.name}: {len(missing)} ops missing: {shown}")
        return where


def producers(op: Op, n_stages: int, where: dict[Op, tuple[int, int]] | None = None) -> list[Op]:
    """The ops whose results ``op`` consumes (data dependencies, not rank order): the one rule
    of "which op waits for which" that the simulator, the heuristics, lowering and the checker use.

    F(s, i) needs F(s-1, i); B or BW(s, i) needs F(s, i) and the backward of stage s+1 (its B, or
    its fused BW where ``where``, the schedule's ops, holds no B; without ``where``, its B);
    W(s, i) needs B(s, i).
    """
    kind, s, i = op
    if kind == "F":
        return [Op("F", s - 1, i)] if s > 0 else []
    if kind == "W":
        return [Op("B", s, i)]
    deps = [Op("F", s, i)]
    if s + 1 < n_stages:
        nxt = Op("B", s + 1, i)
        deps.append(nxt if where is None or nxt in where else Op("BW", s + 1, i))
    return deps
