"""A Schedule: per rank, an order per lane (the compute ops, and the copy ops where a schedule
offloads, each with the compute op it is issued after). Nothing else (times come from simulate())."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from itertools import repeat
from operator import itemgetter
from typing import Iterable, NamedTuple

from schedc.errors import ScheduleError
from schedc.kinds import BY_NAME, GRADS, OPTIONAL, PER_STAGE, POLICIES, ROWS, Kind, candidates, plain
from schedc.problem import Problem


class _OpFields(NamedTuple):
    kind: Kind
    stage: int
    mb: int


_PRINTED = re.compile(r"([A-Z]+)(\d+)@s(\d+)")


class Op(_OpFields):
    """One op: ``kind`` is a ``Kind`` (schedc.kinds: F, B input gradient, W weight gradient, BW
    fused, R and S recompute, O and L offload and reload), ``stage`` and microbatch ``mb``. A kind given as its name (``Op("F", 0,
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
        """torch.distributed.pipelining's action: ``{stage}{letter}{mb}`` (``0F1``; B is I, BW is B).
        A kind torch's IR has no action for (recompute, offload) is a ScheduleError."""
        letter = ROWS[self.kind].torch
        if letter is None:
            raise ScheduleError(f"{self}: torch.distributed.pipelining has no action for {ROWS[self.kind].title}:"
                                " a schedule that recomputes or offloads runs on schedc's runtime only")
        return f"{self.stage}{letter}{self.mb}"


@dataclass(frozen=True)
class Schedule:
    """Per rank, the order of its compute lane (``ranks``) and of its copy lane (``copy``: the
    offloads O and reloads L; empty when nothing is offloaded). Ops on different lanes of a rank
    overlap in time; each lane runs one op at a time, in its order.

    ``after``, aligned with ``copy``: per copy op, the compute op of its rank it is issued after
    (None: before the rank's first compute op). A copy starts no earlier than that op's end, as a
    runtime that issues the copy from its instruction stream (a side CUDA stream waiting for the
    compute stream) starts it: that is how a schedule delays a reload until just before the
    backward that needs it, so the memory between offload and reload stays free. Left out, each
    copy is issued as early as its needs allow (an offload after its forward, a reload with the
    copy before it), which adds no wait to the lanes' order and the ops' needs.

    ``pairs``: per rank, the backward ops (B, or a fused BW) that run overlapped with the forward
    just before them in the rank's compute order (DualPipe's forward-and-backward pairs): the pair
    starts when both may, and both end after ``Problem.pair_time`` (``costs.FB``). () when none is.

    ``rounds``: 1 for a synchronous schedule (one iteration of the problem's microbatches, then
    one optimizer step, today's kind). More makes it asynchronous (PipeDream-2BW): its ops cover
    ``rounds`` rounds of the problem's microbatches with no flush between them (microbatch i is in
    round i // m), each stage steps its optimizer after its last weight gradient of each round,
    and a microbatch's forward and backward use the weights its round started with: round r
    uses the version stepped after round r - 2 (double-buffered weights; rounds 0 and 1 the
    initial weights), so a forward of round r comes after every weight gradient of round r - 2
    of its stage on the rank (``check_complete``)."""

    name: str
    ranks: tuple[tuple[Op, ...], ...]
    copy: tuple[tuple[Op, ...], ...] = ()
    after: tuple[tuple[Op | None, ...], ...] = ()
    pairs: tuple[tuple[Op, ...], ...] = ()
    rounds: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, int) or isinstance(self.rounds, bool) or not 1 <= self.rounds <= MAX_ROUNDS:
            raise ScheduleError(f"{self.name}: rounds must be a whole number from 1 to {MAX_ROUNDS}, not {self.rounds!r}")
        if self.pairs and not any(self.pairs):  # no pair: the same schedule as without
            object.__setattr__(self, "pairs", ())
        if self.copy and not any(self.copy):  # no copy op: the same schedule as without a copy lane
            object.__setattr__(self, "copy", ())
        if not self.copy:
            if any(self.after):
                raise ScheduleError(f"{self.name}: issue points ('after') given without a copy lane")
            object.__setattr__(self, "after", ())
        elif not self.after:
            object.__setattr__(self, "after", tuple(_earliest_issue(ops, compute)
                                                      for ops, compute in zip(self.copy, self.ranks)))

    @classmethod
    def from_lists(
        cls,
        name: str,
        per_rank: Iterable[Iterable[Op | tuple[str, int, int]]],
        copy: Iterable[Iterable[Op | tuple[str, int, int]]] = (),
        after: Iterable[Iterable[Op | tuple[str, int, int] | None]] = (),
        pairs: Iterable[Iterable[Op | tuple[str, int, int]]] = (),
        rounds: int = 1,
    ) -> "Schedule":
        return cls(name, tuple(map(_ops, per_rank)), tuple(map(_ops, copy)),
                   tuple(tuple(None if op is None else Op(*op) for op in ops) for ops in after),
                   tuple(tuple(Op(*op) for op in ops) for ops in pairs), rounds)

    @property
    def synchronous(self) -> bool:
        """One optimizer step after the iteration (``rounds`` 1), or weight versions (more)."""
        return self.rounds == 1

    def paired(self) -> dict[Op, Op]:
        """forward -> the backward it runs overlapped with (``pairs``)."""
        out = {}
        for ops, paired in zip(self.ranks, self.pairs):
            at = {op: k for k, op in enumerate(ops)}
            for op in paired:
                out[ops[at[op] - 1]] = op
        return out

    def renamed(self, name: str) -> "Schedule":
        return replace(self, name=name)

    def anchors(self) -> dict[Op, Op]:
        """copy op -> the compute op it is issued after (copies issued before every compute op are absent)."""
        return {op: a for ops, after in zip(self.copy, self.after) for op, a in zip(ops, after) if a is not None}

    @property
    def lanes(self) -> dict[str, tuple[tuple[Op, ...], ...]]:
        """lane -> per rank, its order: "compute", then "copy" where the schedule has copy ops."""
        return {"compute": self.ranks, **({"copy": self.copy} if self.copy else {})}

    def ops(self):
        """Every op, lane by lane, rank by rank, in order."""
        for per_rank in self.lanes.values():
            for ops in per_rank:
                yield from ops

    @property
    def n_ops(self) -> int:
        return sum(len(ops) for per_rank in self.lanes.values() for ops in per_rank)

    @property
    def split_backward(self) -> bool:
        """Whether its backward is split into B and W (it has ops of the split-only kinds)."""
        return any(ROWS[op.kind].split for ops in self.ranks for op in ops)

    def policies(self) -> dict[tuple[int, int], Kind]:
        """(stage, microbatch) -> the policy op it holds (R recompute, S selective recompute, O
        offload); a (stage, microbatch) that keeps its activation is absent."""
        return {(op.stage, op.mb): op.kind for op in self.ops() if op.kind in _POLICY}

    def policy_counts(self) -> dict[str, int]:
        """Policy name ("recompute", "selective", "offload") -> how many (stage, microbatch) use it,
        for every policy (0 where none)."""
        counts = {ROWS[k].policy: 0 for k in POLICIES}
        for kind in self.policies().values():
            counts[ROWS[kind].policy] += 1
        return counts

    def locate(self) -> dict[Op, tuple[int, int]]:
        """op -> (rank, position in its lane's order). Raises on an op listed twice."""
        where: dict[Op, tuple[int, int]] = {}
        for per_rank in self.lanes.values():
            for r, ops in enumerate(per_rank):
                for i, op in enumerate(ops):
                    if op in where:
                        raise ScheduleError(
                            f"{self.name}: {op} is scheduled twice (rank {where[op][0]} and rank {r})"
                        )
                    where[op] = (r, i)
        return where

    def check_complete(self, problem: Problem) -> dict[Op, tuple[int, int]]:
        """Every op exactly once, on its lane of the rank that holds its stage, of a kind the
        problem allows; at most one policy op (R, S, O) per (stage, microbatch) and a reload L
        exactly where there is an offload O. Returns ``locate()``."""
        if len(self.ranks) != problem.ranks:
            raise ScheduleError(f"{self.name}: has {len(self.ranks)} ranks, the problem has {problem.ranks}")
        if self.copy and len(self.copy) != problem.ranks:
            raise ScheduleError(f"{self.name}: has a copy lane for {len(self.copy)} ranks, the problem has {problem.ranks}")
        where = self.locate()
        if self.copy:
            self._check_issue(where)
        if self.pairs:
            self._check_pairs(where, problem)
        n, m = problem.n_stages, problem.units * self.rounds
        if not self.synchronous:
            self._check_versions(where, problem)
        allowed = set(problem.kinds)
        counts: Counter[Kind] = Counter()
        for lane, per_rank in self.lanes.items():
            for r, ops in enumerate(per_rank):
                counts.update(map(itemgetter(0), ops))
                good: set[tuple[Kind, int]] = set()  # (kind, stage) found right on this lane of rank r
                for op in ops:
                    if (op[0], op[1]) in good and 0 <= op[2] < m:
                        continue
                    if ROWS[op.kind].lane != lane:
                        raise ScheduleError(f"{self.name}: {op}: {_off_lane(op.kind, lane)}")
                    if op.kind not in allowed:
                        raise ScheduleError(f"{self.name}: {op}: {_not_declared(op.kind)}")
                    if not (0 <= op.stage < n and 0 <= op.mb < m):
                        raise ScheduleError(f"{self.name}: {op} is outside {n} stages x {m} microbatches")
                    if problem.stage_rank[op.stage] != r:
                        raise ScheduleError(
                            f"{self.name}: {op} is on rank {r} but stage {op.stage} is placed on rank"
                            f" {problem.stage_rank[op.stage]}"
                        )
                    good.add((op[0], op[1]))
        optional = any(counts[k] for k in _OPTIONAL)
        every = n * m  # (no op is listed twice and each is in range: a kind n x m times is there for each)
        if not optional and all(counts[k] == every for k in _ALWAYS) and any(
                all(counts[k] == every for k in have) and not any(counts[k] for k in other)
                for have, other in ((_SPLIT, _FUSED), (_FUSED, _SPLIT))):
            return where
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
                if optional:
                    _check_policy(self.name, where, s, i)
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ScheduleError(f"{self.name}: {len(missing)} ops missing: {shown}")
        return where


    def _check_pairs(self, where: dict[Op, tuple[int, int]], problem: Problem) -> None:
        """Each paired op a backward (B or BW) of the rank's compute lane, listed once, right after a
        forward of another (stage, microbatch) on its rank."""
        if len(self.pairs) != problem.ranks:
            raise ScheduleError(f"{self.name}: has pairs for {len(self.pairs)} ranks, the problem has {problem.ranks}")
        for r, paired in enumerate(self.pairs):
            if len(set(paired)) != len(paired):
                raise ScheduleError(f"{self.name}: rank {r} lists a pair twice")
            for op in paired:
                if op not in where or where[op][0] != r or ROWS[op.kind].lane != "compute":
                    raise ScheduleError(f"{self.name}: pair {op} is not a compute op of rank {r}")
                k = where[op][1]
                before = self.ranks[r][k - 1] if k > 0 else None
                if ROWS[op.kind].carries != "grad" or before is None or before.kind is not Kind.F:
                    raise ScheduleError(f"{self.name}: rank {r}: {op} is paired, but a pair is a backward (B or BW)"
                                        " right after a forward F")
                if (before.stage, before.mb) == (op.stage, op.mb):
                    raise ScheduleError(f"{self.name}: rank {r}: {op} is paired with its own forward {before}")

    def _check_versions(self, where: dict[Op, tuple[int, int]], problem: Problem) -> None:
        """An asynchronous schedule: per-iteration collectives refused (they are not per round yet),
        and each forward of round r >= 2 after every weight gradient of round r - 2 of its stage in
        its rank's compute order (it uses the weights stepped after them; two versions are kept)."""
        for section in ("data_parallel", "replicas", "tied", "sequence_chunks"):
            if getattr(problem, section) is not None:
                why = "" if section == "sequence_chunks" else ": its gradient sums are once per iteration, not per round"
                raise ScheduleError(f"{self.name}: an asynchronous schedule (rounds {self.rounds}) cannot run a problem"
                                    f" with {section} yet{why}")
        m = problem.microbatches
        last: dict[tuple[int, int], int] = {}  # (stage, round) -> position of its last weight gradient
        for op, (_, k) in where.items():
            if op.kind in _GRADS:
                key = (op.stage, op.mb // m)
                last[key] = max(last.get(key, -1), k)
        for r, ops in enumerate(self.ranks):
            for k, op in enumerate(ops):
                if op.kind is Kind.F and op.mb // m >= 2 and last.get((op.stage, op.mb // m - 2), -1) > k:
                    raise ScheduleError(
                        f"{self.name}: rank {r}: {op} (round {op.mb // m}) comes before the last weight gradient of"
                        f" round {op.mb // m - 2} on stage {op.stage}: it needs the weights stepped after that round"
                        " (two weight versions are kept)")

    def _check_issue(self, where: dict[Op, tuple[int, int]]) -> None:
        """Each copy op issued after a compute op of its own rank, the lane's issue points in its
        order, and none before what it needs (an O after its F) or after what needs it (an L before
        its B): an issue point that breaks one of these could only deadlock."""
        for r, (ops, after) in enumerate(zip(self.copy, self.after)):
            if len(after) != len(ops):
                raise ScheduleError(f"{self.name}: rank {r} has {len(ops)} copy ops but {len(after)} issue points")
            at = -1
            for op, anchor in zip(ops, after):
                if anchor is not None and (anchor not in where or ROWS[anchor.kind].lane != "compute"
                                           or where[anchor][0] != r):
                    raise ScheduleError(f"{self.name}: {op} is issued after {anchor}, which is not a compute op of rank {r}")
                here = -1 if anchor is None else where[anchor][1]  # its position in the compute order
                if here < at:
                    raise ScheduleError(f"{self.name}: rank {r}: {op} is issued after {anchor or 'nothing'}, before the"
                                        " copy ahead of it on the lane: issue points follow the lane's order")
                at = here
                for need, offset in ROWS[op.kind].needs:
                    for kind in candidates(need):
                        dep = _new(Op, (kind, op.stage + offset, op.mb))
                        if ROWS[kind].lane == "compute" and dep in where and where[dep][1] > here:
                            raise ScheduleError(f"{self.name}: {op} is issued before {dep}, which it needs")
                for user in _USERS.get(op.kind, ()):
                    dep = _new(Op, (user, op.stage, op.mb))
                    if dep in where and where[dep][1] <= here:
                        raise ScheduleError(f"{self.name}: {op} is issued after {dep}, which waits for it")


def _earliest_issue(ops: tuple[Op, ...], compute: tuple[Op, ...]) -> tuple[Op | None, ...]:
    """One rank's issue points that add no wait: each copy op after the compute op it needs on its
    own stage (an offload after its forward), else with the copy before it on the lane."""
    at = {op: k for k, op in enumerate(compute)}
    out: list[Op | None] = []
    last = -1
    for op in ops:
        for need, offset in ROWS[op.kind].needs:
            for kind in candidates(need):
                dep = _new(Op, (kind, op.stage + offset, op.mb))
                if offset == 0 and dep in at:
                    last = max(last, at[dep])
        out.append(compute[last] if last >= 0 else None)
    return tuple(out)


def _check_policy(name: str, where: dict[Op, tuple[int, int]], s: int, i: int) -> None:
    """At most one policy op for (s, i), and each op that comes with another there exactly with it."""
    held = [k for k in _POLICY if _new(Op, (k, s, i)) in where]
    if len(held) > 1:
        raise ScheduleError(
            f"{name}: stage {s} microbatch {i} has {' and '.join(f'{k}{i}@s{s}' for k in held)}: a (stage,"
            f" microbatch) keeps, recomputes or offloads its activation, one of them"
        )
    for k in _OPTIONAL:
        partner = ROWS[k].comes_with
        if partner is not None and (_new(Op, (k, s, i)) in where) != (_new(Op, (partner, s, i)) in where):
            has, lacks = (k, partner) if _new(Op, (k, s, i)) in where else (partner, k)
            raise ScheduleError(f"{name}: {has}{i}@s{s} has no {lacks}{i}@s{s}: {ROWS[k].title} comes with"
                                f" {ROWS[partner].title}")


# What a complete schedule holds for each (stage, microbatch), from the kinds' rows: the kinds of
# both forms, then either the fused kinds or the split ones.
_OPTIONAL = frozenset(OPTIONAL)  # R, S, O, L: where the schedule chooses a policy
_POLICY = POLICIES  # R, S, O
_ALWAYS = tuple(k for k, row in ROWS.items() if row.split is None and k not in _OPTIONAL and not row.per_stage)  # F
_SPLIT = tuple(k for k, row in ROWS.items() if row.split)  # B, W
_FUSED = tuple(k for k, row in ROWS.items() if row.split is False)  # BW
# kind -> its needs as (the kinds that may meet it, the first the schedule holds; the kind meeting
# it without ``where``; stage offset)
_NEEDS = {k: tuple((candidates(need), plain(need), offset) for need, offset in row.needs) for k, row in ROWS.items()}
# the same for the needs on a neighbouring chunk of the sequence (chunk offset)
_CHUNK_NEEDS = {k: tuple((candidates(need), plain(need), offset) for need, offset in row.chunk_needs)
                for k, row in ROWS.items()}
# copy kind -> the compute kinds of its (stage, microbatch) that wait for it (L: B and BW; O: none)
_USERS = {k: tuple(u for u, row in ROWS.items() if row.lane == "compute"
                  for need, offset in row.needs if offset == 0 and k in candidates(need))
          for k, row in ROWS.items() if row.lane == "copy"}
MAX_ROUNDS = 1000  # rounds an asynchronous schedule may cover
_new = tuple.__new__  # an Op of a Kind without Op.__new__'s check: producers() runs in every simulation
_PER_STAGE = frozenset(PER_STAGE)
_GRADS = candidates(GRADS)  # W, BW: what a stage's reduce waits for, every microbatch's


def comm_lane(problem: Problem, schedule: Schedule) -> tuple[tuple[tuple[Op, Op], ...], ...]:
    """Per rank, its communication lane as the runtime issues it: (op, the compute op it is issued
    after), in the lane's order; empty where the problem has no per-stage sync. Each stage's
    all-reduce AR(s) is issued after the ops it waits for (``sync_waits_for``: the stage's last
    weight gradient, W or BW, in the rank's compute order, or, without ``data_parallel.overlap``,
    the rank's last compute op; the later stage first). A collective (RS: the gradient sum of a
    model stage's copies; TS: of tied weights) is issued after its stage's last weight gradient
    too, but every member
    rank issues the collectives in one order (``comm_ops``), so each also after the one before it
    on its rank (ranks that issued them in different orders would wait for each other forever).
    The lane runs them in issue order, one at a time."""
    if not problem.syncs:
        return ()
    out = []
    for r, ops in enumerate(schedule.ranks):
        items = []  # (issue position, reduces before collectives, then ``comm_ops``'s order; op)
        at = -1  # the collectives': each no earlier than the one before it
        for k, op in enumerate(comm_ops(problem, r)):
            here = max(i for i, other in enumerate(ops) if sync_waits_for(problem, op, other))
            collective = ROWS[op.kind].group is not None
            if collective:
                at = here = max(at, here)
            items.append(((here, collective, k), op))
        items.sort(key=lambda item: item[0])
        out.append(tuple((op, ops[key[0]]) for key, op in items))
    return tuple(out)


def comm_ops(problem: Problem, rank: int) -> tuple[Op, ...]:
    """The communication lane's ops of ``rank``: an AR per stage with ``data_parallel``, the later
    stage first (the order the backward completes them), then the collectives in the one order
    every member issues them in: an RS per stage with ``replicas`` (the model's later stage first),
    a TS per stage of a tied group across ranks."""
    stages = problem.rank_stages[rank]
    out = []
    for kind in problem.kinds:
        row = ROWS[kind]
        if row.group:  # the stages of its groups (``Problem.sync_groups``), in the groups' one order
            out += [_new(Op, (kind, s, 0)) for g in problem.sync_groups[row.group] for s in g if s in stages]
        elif row.per_stage:
            out += [_new(Op, (kind, s, 0)) for s in sorted(stages, reverse=True)]
    return tuple(out)


def fixed_orders(problem: Problem, ops: tuple[Op, ...]) -> list[list[Op]]:
    """The runs of a rank's communication ops (``comm_ops``) whose order ``comm_lane`` fixes: the
    collectives, in their one order, and without ``data_parallel.overlap`` the reduces, the later
    stage first (the ILP's and CP-SAT's chains)."""
    chains = [[op for op in ops if ROWS[op.kind].group]]
    if problem.data_parallel is not None and not problem.data_parallel.overlap:
        chains.append([op for op in ops if op.kind is Kind.AR])
    return chains


def sync_waits_for(problem: Problem, op: Op, other: Op) -> bool:
    """Whether the communication op ``op`` (AR, RS or TS of a stage) is issued no earlier than the end
    of ``other``, an op of its rank: every weight gradient of its stage (W or BW), or for an AR
    without ``data_parallel.overlap`` every compute op of the rank (the one rule of ``comm_lane``,
    the ILP's and CP-SAT's rows)."""
    if ROWS[other.kind].lane != "compute":
        return False
    if op.kind is Kind.AR and not problem.data_parallel.overlap:
        return True
    return other.kind in _GRADS and other.stage == op.stage


def lead(problem: Problem, op: Op) -> Op:
    """The op of a collective that stands for all its members (its lowest stage's: they start
    together, so the ILP and CP-SAT give them one start); ``op`` itself for any other op."""
    return min((op, *members(problem, op)), key=lambda o: o.stage)


def members(problem: Problem, op: Op) -> tuple[Op, ...]:
    """The ops of a collective ``op`` (RS, TS) on the other stages of its group (``Problem.sync_groups``),
    which start with it; () for any other op."""
    group = ROWS[op.kind].group
    if group is None:
        return ()
    return tuple(_new(Op, (op.kind, t, 0)) for g in problem.sync_groups[group] if op.stage in g
                 for t in g if t != op.stage)


def _ops(items: Iterable[Op | tuple[str, int, int]]) -> tuple[Op, ...]:
    """``Op(*item)`` for each of ``items``, field by field at C speed where each has three fields
    and a known kind (a schedule file lists hundreds of thousands), else one by one (which raises,
    naming the first that is wrong)."""
    items = items if isinstance(items, (list, tuple)) else list(items)
    try:
        names, stages, mbs = zip(*items, strict=True)
        kinds = tuple(map(BY_NAME.get, names))  # (a Kind finds itself: a str Enum, equal to its name)
    except (ValueError, TypeError):  # (not three fields each, or none, or a kind that is no name)
        kinds = None
    if kinds is None or None in kinds:
        return tuple(Op(*item) for item in items)
    return tuple(map(_new, repeat(Op), zip(kinds, stages, mbs)))


def _off_lane(kind: Kind, lane: str) -> str:
    """Why a lane's order cannot hold an op of ``kind``: it runs on another lane."""
    on = ", ".join(k.value for k, row in ROWS.items() if row.lane == lane)
    return f"op kind {kind.value!r} runs on the {ROWS[kind].lane} lane, not the {lane} lane (kinds {on})"


def _not_declared(kind: Kind) -> str:
    """Why a problem does not allow an op of ``kind``: the section its cost comes from is missing."""
    section = ROWS[kind].cost.rsplit(".", 1)[0]
    return f"op kind {kind.value!r} ({ROWS[kind].title}) needs the problem's '{section}' section, which it does not give"


def producers(op: Op, depth: int, where: dict[Op, tuple[int, int]] | None = None, chunks: int = 1) -> list[Op]:
    """The ops whose results ``op`` consumes (data dependencies, not rank order): the one rule
    of "which op waits for which" that the simulator, the heuristics, lowering and the checker use.

    Read from the kinds' rows (``KindRow.needs``): F(s, i) needs F(s-1, i); B or BW(s, i) needs
    what brings the activation of (s, i) back (its R, S or L, else its F) and the backward of stage
    s+1 (its B, or its fused BW); W(s, i) needs B(s, i); R, S and O(s, i) need F(s, i), L(s, i) its
    O. Where a need may be met by several kinds, the first that ``where`` (the schedule's ops) holds
    meets it, else the last; without ``where``, what meets it in a split schedule without recompute
    or offload (B, F). A need whose stage is outside the op's pipeline (``depth`` stages each:
    ``Problem.pipeline_stages``; stage s is in pipeline s // depth) has no producer. A per-stage op
    (AR, RS) waits through its issue point instead (``comm_lane``: after its stage's last weight
    gradient), which the schedule's order fixes: it has no producers here.

    With ``chunks`` sequence chunks (``Problem.seq_chunks``; microbatch i is chunk i % chunks of its
    sequence), also the rows' ``chunk_needs`` on the op's own stage: F(s, i) needs F(s, i - 1)
    unless i is its sequence's first chunk, a backward B or BW(s, i) the backward of (s, i + 1)
    unless i is the last.
    """
    kind, s, i = op
    deps = [_met(kinds, usual, t, i, where) for kinds, usual, t in stage_needs(kind, s, depth)]
    if chunks > 1 and kind not in _PER_STAGE:
        deps += chunk_producers(op, where, chunks)
    return deps


def stage_needs(kind: Kind, s: int, depth: int) -> tuple[tuple[tuple[Kind, ...], Kind, int], ...]:
    """``producers``' rule for an op of ``kind`` on stage ``s`` without its microbatch: per need
    met by an op of the same microbatch, (the kinds that may meet it, the usual one, their stage).
    What an op needs depends on its kind and stage alone, so a pass over many ops can look it up
    once per (kind, stage)."""
    if kind in _PER_STAGE:
        return ()
    return tuple((kinds, usual, s + offset) for kinds, usual, offset in _NEEDS[kind]
                 if 0 <= s + offset and (s + offset) // depth == s // depth)


def chunk_producers(op: Op, where, chunks: int) -> list[Op]:
    """``producers``' needs on a neighbouring chunk of the op's own sequence (``chunks`` > 1)."""
    kind, s, i = op
    return [_met(kinds, usual, s, i + offset, where) for kinds, usual, offset in _CHUNK_NEEDS[kind]
            if 0 <= i % chunks + offset < chunks]


def _met(kinds: tuple[Kind, ...], usual: Kind, stage: int, i: int, where) -> Op:
    """The op of (``stage``, ``i``) that meets a need: of ``kinds``, the first ``where`` holds, else
    the last; without ``where``, ``usual``."""
    if len(kinds) > 1 and where is not None:
        for k in kinds[:-1]:
            if _new(Op, (k, stage, i)) in where:
                return _new(Op, (k, stage, i))
        return _new(Op, (kinds[-1], stage, i))
    return _new(Op, (usual, stage, i))
