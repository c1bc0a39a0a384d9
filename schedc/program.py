"""The Program: per rank, the instructions the runtime executes. ``lower(problem, schedule)``.

Instructions:

- ``F``, ``B``, ``W``, ``BW``, and the recomputes ``R`` (full) and ``S`` (selective) on (stage,
  microbatch): compute, in the Schedule's compute-lane order.
- ``O`` (offload) and ``L`` (reload) on (stage, microbatch): the copy lane's ops, in its order. The
  runtime *issues* a copy where the Program lists it and does not wait; the copy starts once the
  compute listed before it has run (CUDA: the side stream waits for the compute stream), the copy
  lane runs one copy at a time in issue order, and the B (or BW) of a reloaded (stage,
  microbatch) waits for its ``L`` to complete. A copy is listed right before the compute op that
  follows the one it is issued after (``Schedule.after``), as the simulator times it.
- ``AR`` on (stage, 0), with ``data_parallel``: the stage's gradient all-reduce over the replicas,
  issued (not waited for) where the Program lists it, as a copy is: right before the compute op
  that follows the one it is issued after (``schedule.comm_lane``: the stage's last weight
  gradient), or before ``STEP``; it runs on the rank's communication lane in issue order, and
  ``STEP`` waits for every one. The replicas of a stage run the same Program, so they issue the
  same collectives in the same order, and a reduce waits for no other rank of the pipeline.
- ``RS`` and ``TS`` on (stage, 0), with ``replicas`` or ``tied``: the sum of a stage's gradients
  with its copies' (or of its tied weights' with the stages sharing them), a collective of other
  ranks of the pipeline, issued as an ``AR`` is; every rank lists the collectives in one order
  (``schedule.comm_lane``), so the communication lanes cannot wait on each other in a cycle, and
  nothing on a compute lane waits for them (``check`` runs the lanes to verify it).
- ``SEND`` / ``RECV`` of a stage's forward activation (``act``, stage s to s+1) or of the gradient
  of it (``grad``, stage s+1 to s) between two ranks. ``RECV`` *posts* a receive and does not
  wait; the compute that uses the tensor waits for it. ``SEND`` may block until the peer has
  posted the matching ``RECV`` (NCCL does for large messages).
- ``LOCAL``: a hand-off between two stages on the same rank (V placement), no communication.
- ``STEP``: the optimizer step, last on every rank. In an asynchronous program (``Header.rounds``
  above 1: PipeDream-2BW, ``Schedule.rounds``) the steps are the ``UPDATE``s and ``STEP`` only ends
  the program (sends completed, nothing left over).
- ``UPDATE`` on (stage, round), asynchronous programs only: the optimizer step of one stage after
  its last weight gradient of the round (the gradients of the round's microbatches, computed on the
  weights the round started with), applied to the stage's newest weights; the result is the
  version round + 2 runs on. Listed right before the compute op that follows that weight
  gradient (or before ``STEP``), on every rank for each of its stages and rounds.

Between two ranks, the sends of one and the receives of the other list the same messages in the
same order (NCCL and gloo match point-to-point messages in posting order).

Why a lowered Program cannot deadlock: every instruction gets a key from the simulated Timeline:
a compute ``(its start, 2, its place on the rank)``, a send or hand-off ``(its producer's end, 1)``
(where the producer takes no time, an empty stage's op, ``(its end, 2, its place + 1/2)``: right
after it), a receive ``(t, 0)`` with ``t`` no later than the matching send's time, and each rank's
list is sorted by key. A send then never waits for a receive with a larger key, and a compute never waits for a
send with a larger key (the consumer starts after its producer ends), so every wait points to a
smaller key: the wait-for relation has no cycle, whatever the real durations turn out to be.
Copies (O, L) change nothing in it: a copy waits only for ops listed before it on its own rank (the
compute op it is issued after, its F, the copy before it), and the B that waits for an L comes
after it (``Schedule.check_complete`` refuses issue points that break this).
``check`` (schedc/check.py) verifies this independently of the argument.

Receives are posted early so that transfers overlap compute: at the latest one compute op before
the consumer, and no later than the simulated send, so the sender does not block when the
timeline holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from schedc.bulk import bulk
from schedc.errors import ProgramError
from schedc.kinds import BY_NAME, GRADS, ROWS, Kind, candidates, check_supported
from schedc.problem import Problem
from schedc.schedule import Op, Schedule, comm_lane, producers
from schedc.simulate import simulate


class Opcode(str, Enum):
    """The instructions that are not compute ops (those are the op kinds, ``schedc.kinds.Kind``).
    A ``str`` enum as Kind is: ``Opcode.SEND == "SEND"``, and files keep the name."""

    SEND = "SEND"
    RECV = "RECV"
    LOCAL = "LOCAL"
    STEP = "STEP"
    UPDATE = "UPDATE"

    __str__ = str.__str__
    __format__ = str.__format__


COMPUTE = tuple(k for k, row in ROWS.items() if row.lane == "compute")  # F, B, W, BW, R, S
COPY = tuple(k for k, row in ROWS.items() if row.lane == "copy")  # O, L: issued, completed on the copy lane
COMM = (Opcode.SEND, Opcode.RECV)
OPCODES = (*Kind, *Opcode)  # F, B, W, BW, R, S, O, L, AR, RS, TS, SEND, RECV, LOCAL, STEP, UPDATE
_OPCODE_OF: dict[str, Kind | Opcode] = {**BY_NAME, **{o.value: o for o in Opcode}}
TENSORS = ("act", "grad")  # what a row's ``carries`` names
DIRECTION = {"act": 1, "grad": -1}  # a tensor goes from stage s to s + its direction
LOWERED = frozenset(k for k, row in ROWS.items() if row.lane in ("compute", "copy"))  # the kinds a Schedule
# given to lower() may hold (the communication lane's reduces it adds itself, from the problem)


def _consumers() -> dict[tuple[str, int], tuple[Kind, ...]]:
    """(tensor, the producer's stage minus the consumer's) -> the kinds that consume it, in the
    table's order, read from the rows' needs: ("act", -1) -> F; ("grad", 1) -> B, BW."""
    out: dict[tuple[str, int], tuple[Kind, ...]] = {}
    for kind, row in ROWS.items():
        for need, offset in row.needs:
            for tensor in sorted({ROWS[k].carries for k in candidates(need)} - {None}):
                if offset != 0 and kind not in out.get((tensor, offset), ()):
                    out[tensor, offset] = (*out.get((tensor, offset), ()), kind)
    return out


_CONSUMERS = _consumers()
_GRADS = candidates(GRADS)  # W, BW: the weight gradients an UPDATE follows


class Message(NamedTuple):
    """A tensor that moves from stage ``src`` to stage ``dst`` for microbatch ``mb``."""

    tensor: str  # "act": F(src) output, consumed by F(dst = src + 1); "grad": B(src) output, for B(dst = src - 1)
    mb: int
    src: int
    dst: int

    def __str__(self) -> str:
        return f"{self.tensor}{self.mb} s{self.src}->s{self.dst}"


_new = tuple.__new__  # an Instr or Message of fields already checked (``lower`` makes one per op)


class _InstrFields(NamedTuple):
    op: Kind | Opcode
    stage: int = -1  # the stage on this rank: computed, sending, receiving, or handing off
    mb: int = -1
    tensor: str = ""  # SEND / RECV / LOCAL: "act" or "grad"
    peer: int = -1  # SEND / RECV: the other rank
    peer_stage: int = -1  # SEND / RECV / LOCAL: the stage at the other end


_DEFAULTS = tuple((name, _InstrFields._field_defaults[name]) for name in _InstrFields._fields[1:])


class Instr(_InstrFields):
    """One instruction: ``op`` is a compute kind (Kind) or an Opcode; given by its name
    (``Instr("SEND", ...)``, as files write it) it becomes that member here, and an unknown name
    is a ProgramError. Unused fields are -1 (numbers) or "" (tensor)."""

    __slots__ = ()

    def __new__(cls, op: Kind | Opcode | str, stage: int = -1, mb: int = -1, tensor: str = "", peer: int = -1,
                peer_stage: int = -1) -> "Instr":
        if not isinstance(op, (Kind, Opcode)):
            known = _OPCODE_OF.get(op) if isinstance(op, str) else None
            if known is None:
                raise ProgramError(f"unknown op {op!r} (expected one of {', '.join(OPCODES)})")
            op = known
        return tuple.__new__(cls, (op, stage, mb, tensor, peer, peer_stage))

    @classmethod
    def _make(cls, iterable) -> "Instr":  # _replace() goes through here: keep the coercion
        return cls(*iterable)

    @property
    def message(self) -> Message:
        """SEND and LOCAL move ``stage -> peer_stage``; RECV brings ``peer_stage -> stage``."""
        if self.op is Opcode.RECV:
            return Message(self.tensor, self.mb, self.peer_stage, self.stage)
        return Message(self.tensor, self.mb, self.stage, self.peer_stage)

    @property
    def compute(self) -> Op:
        op = self.op
        if op.__class__ is Kind:  # (a Kind already: Op's own check of the name is not needed)
            return tuple.__new__(Op, (op, self.stage, self.mb))
        return Op(op, self.stage, self.mb)

    def __str__(self) -> str:
        if isinstance(self.op, Kind):
            return str(self.compute)
        if self.op is Opcode.SEND:
            return f"SEND {self.message} to rank {self.peer}"
        if self.op is Opcode.RECV:
            return f"RECV {self.message} from rank {self.peer}"
        if self.op is Opcode.LOCAL:
            return f"LOCAL {self.message}"
        if self.op is Opcode.UPDATE:
            return f"UPDATE s{self.stage} round {self.mb}"
        return str(self.op)

    def to_data(self) -> dict:
        """JSON form: only the fields the opcode uses (those not -1, or "" for tensor)."""
        op, stage, mb, tensor, peer, peer_stage = self
        out: dict = {"op": op}
        if stage != -1:
            out["stage"] = stage
        if mb != -1:
            out["mb"] = mb
        if tensor:
            out["tensor"] = tensor
        if peer != -1:
            out["peer"] = peer
        if peer_stage != -1:
            out["peer_stage"] = peer_stage
        return out


def produced(op: Op, depth: int) -> Message | None:
    """What a compute op sends on, its row's ``carries``: F's activation forward, B's (or BW's)
    gradient backward; nothing from the stage at that end of its pipeline (``depth`` stages each),
    or for W."""
    tensor = ROWS[op.kind].carries
    if tensor is None:
        return None
    dst = op.stage + DIRECTION[tensor]
    return Message(tensor, op.mb, op.stage, dst) if 0 <= dst and dst // depth == op.stage // depth else None


def consumed(op: Op, depth: int) -> Message | None:
    """What a compute op receives: the result of its producer on another stage, the tensor that
    producer's row carries (F(s): the activation of s-1; B/BW(s): the gradient from s+1)."""
    for d in producers(op, depth):
        if d.stage != op.stage:
            return Message(ROWS[d.kind].carries, op.mb, d.stage, op.stage)
    return None


@dataclass(frozen=True)
class Header:
    """What a Program runs on, so that the runtime needs only the Program: the schedule's name,
    the microbatches a step splits its batch into (per pipeline), the stage -> rank map, whether
    the backward is split into B and W, over how many data-parallel replicas each stage's gradient
    is all-reduced (1: none), how many copies of the pipeline run on the ranks (``pipelines``:
    2 in a bidirectional schedule; stage s is stage s % (n_stages / pipelines) of the model), and
    which stages on different ranks share weights (``tied``), how many rounds of the
    microbatches it runs (``rounds``: 1 synchronous, more asynchronous: ``Schedule.rounds``), and
    into how many chunks each sequence is cut (``sequence_chunks``, Seq1F1B)."""

    schedule: str
    microbatches: int
    stage_rank: tuple[int, ...]
    split_backward: bool
    data_parallel: int = 1
    pipelines: int = 1
    tied: tuple[tuple[int, ...], ...] = ()  # the groups of stages on different ranks that share weights
    rounds: int = 1
    sequence_chunks: int = 1  # chunks per sequence (an op's mb is microbatch * sequence_chunks + chunk)

    @classmethod
    def of(cls, problem: Problem, schedule: Schedule) -> "Header":
        degree = 1 if problem.data_parallel is None else problem.data_parallel.degree
        return cls(schedule.name, problem.microbatches, tuple(problem.stage_rank), schedule.split_backward, degree,
                   problem.pipelines, problem.sync_groups["tied"], schedule.rounds, problem.seq_chunks)

    @property
    def synchronous(self) -> bool:
        return self.rounds == 1

    @property
    def pipeline_stages(self) -> int:
        """The stages of one pipeline: the model's."""
        return self.n_stages // self.pipelines

    @property
    def n_ranks(self) -> int:
        return max(self.stage_rank) + 1

    @property
    def n_stages(self) -> int:
        return len(self.stage_rank)

    @property
    def rank_stages(self) -> tuple[tuple[int, ...], ...]:
        """rank -> its stages, ascending."""
        return tuple(tuple(s for s, r in enumerate(self.stage_rank) if r == rank) for rank in range(self.n_ranks))


@dataclass(frozen=True)
class Program:
    ranks: tuple[tuple[Instr, ...], ...]
    header: Header | None = None  # set by lower() and by loading a schedule file

    def for_rank(self, rank: int) -> tuple[Instr, ...]:
        if not 0 <= rank < len(self.ranks):
            raise IndexError(f"rank {rank} is outside this program's {len(self.ranks)} ranks")
        return self.ranks[rank]

    @property
    def n_instructions(self) -> int:
        return sum(len(instrs) for instrs in self.ranks)

    def compute_order(self) -> tuple[tuple[Op, ...], ...]:
        """Per rank, the compute-lane ops in program order (a lowered Program's equals its
        Schedule's ``ranks``)."""
        return tuple(tuple(i.compute for i in instrs if isinstance(i.op, Kind) and ROWS[i.op].lane == "compute")
                     for instrs in self.ranks)

    def copy_order(self) -> tuple[tuple[Op, ...], ...]:
        """Per rank, the copy-lane ops (offload O, reload L) in program order (a lowered Program's
        equals its Schedule's ``copy``); () when the program has none."""
        out = tuple(tuple(i.compute for i in instrs if isinstance(i.op, Kind) and ROWS[i.op].lane == "copy")
                    for instrs in self.ranks)
        return out if any(out) else ()

    def issued_after(self, lane: str = "copy") -> tuple[tuple[Op | None, ...], ...]:
        """Per rank, aligned with the ops of ``lane`` (copy: ``copy_order()``) in program order: the
        compute op listed last before each (None: none), the op it is issued after (a lowered
        Program's equals its Schedule's ``after``, and for "comm" ``schedule.comm_lane``'s)."""
        out = []
        for instrs in self.ranks:
            last, mine = None, []
            for i in instrs:
                if isinstance(i.op, Kind):
                    if ROWS[i.op].lane == lane:
                        mine.append(last)
                    elif ROWS[i.op].lane == "compute":
                        last = i.compute
            out.append(tuple(mine))
        return tuple(out) if any(out) else ()

    def comm_order(self) -> tuple[tuple[Op, ...], ...]:
        """Per rank, the communication lane's ops (gradient all-reduces AR) in program order; ()
        when the program has none."""
        out = tuple(tuple(i.compute for i in instrs if isinstance(i.op, Kind) and ROWS[i.op].lane == "comm")
                    for instrs in self.ranks)
        return out if any(out) else ()

    def listing(self, rank: int | None = None) -> str:
        """The program as text, one instruction per line."""
        ranks = range(len(self.ranks)) if rank is None else [rank]
        lines = []
        for r in ranks:
            lines.append(f"rank {r}:")
            lines += [f"  {k:4d}  {instr}" for k, instr in enumerate(self.for_rank(r))]
        return "\n".join(lines)

    def to_data(self) -> list[list[dict]]:
        return [[i.to_data() for i in instrs] for instrs in self.ranks]

    @classmethod
    def from_lists(cls, per_rank, header: Header | None = None) -> "Program":
        """From per-rank lists of Instr or plain tuples in Instr's field order."""
        return cls(tuple(tuple(Instr(*i) for i in instrs) for instrs in per_rank), header)

    @classmethod
    def from_data(cls, per_rank: list[list[dict]], header: Header | None = None) -> "Program":
        """From ``to_data``'s form: per rank, dicts with "op" and the fields it uses (an unknown
        op is a ProgramError, as ``Instr`` says)."""
        return cls(tuple(map(rank_from_data, per_rank)), header)


def rank_from_data(instrs: list[dict]) -> tuple[Instr, ...]:
    """One rank's instructions from ``Program.to_data``'s dicts (``Program.from_data``), field by
    field over the whole rank (a schedule file's program is most of it, read at C speed)."""
    return from_columns(columns_of(instrs))


def columns_of(instrs: list[dict]) -> list[list]:
    """Per field of an Instr, in its order, the field's values over ``instrs`` (``to_data``'s
    dicts; the op as its name, a field left out as its default)."""
    return [list(map(itemgetter("op"), instrs)),
            *(list(map(dict.get, instrs, repeat(name), repeat(default))) for name, default in _DEFAULTS)]


def from_columns(columns: list[list]) -> tuple[Instr, ...]:
    """The instructions whose fields ``columns`` holds (``columns_of``); an unknown op is a
    ProgramError, as ``Instr`` says."""
    names, *fields = columns
    ops = ops_of(names)
    if None in ops:
        Instr(names[ops.index(None)])  # (raises, naming it)
    return tuple(map(_new, repeat(Instr), zip(ops, *fields)))


def ops_of(names: list[str]) -> list[Kind | Opcode | None]:
    """The op each name names (None for a name that names none)."""
    return list(map(_OPCODE_OF.get, names))


@bulk
def lower(problem: Problem, schedule: Schedule, timeline=None) -> Program:
    """The Program for ``schedule`` on ``problem``: compute in the Schedule's order, a SEND (or a
    LOCAL hand-off) right after each producing op, each RECV posted early, the copy lane's
    offloads and reloads where the schedule issues them and the gradient all-reduces where
    ``comm_lane`` issues them (see the module notes), then the optimizer step. ``timeline`` is
    ``simulate(problem, schedule)``, computed if omitted."""
    present = {op.kind for op in schedule.ops()}
    check_supported(present, "lowering", LOWERED)
    timeline = timeline or simulate(problem, schedule)
    depth, stage_rank = problem.pipeline_stages, problem.stage_rank
    where = schedule.locate()
    keyed: list[list[tuple[tuple, Instr]]] = [[] for _ in schedule.ranks]

    # Per consumer rank, when the compute op before each position starts (-inf for the first).
    before = [[float("-inf"), *starts[:-1]] for starts in timeline.start]
    channels: dict[tuple[int, int], list[tuple[float, float, Message]]] = {}  # (send time, post time, msg)
    # (kind, stage) -> (tensor, to stage, the kinds of the schedule that may use it first) or None
    sends_on: dict[tuple[Kind, int], tuple[str, int, tuple[Kind, ...]] | None] = {}
    for r, (ops, starts, ends) in enumerate(zip(schedule.ranks, timeline.start, timeline.end)):
        mine = keyed[r]
        for i, (op, start, end) in enumerate(zip(ops, starts, ends)):
            kind, stage, mb = op
            mine.append(((start, 2, i), _new(Instr, (kind, stage, mb, "", -1, -1))))
            # (what it sends goes right after it; after its end where it takes time, else, where it
            # takes none (an empty stage's), before the next compute op of the rank)
            after = (end, 1) if end > start else (end, 2, i + 0.5)
            if (kind, stage) not in sends_on:  # (what an op sends on depends on its kind and stage alone)
                msg = produced(op, depth)
                sends_on[kind, stage] = None if msg is None else (msg.tensor, msg.dst, tuple(
                    k for k in _CONSUMERS[msg.tensor, msg.src - msg.dst] if k in present))
            if (sent := sends_on[kind, stage]) is None:
                continue
            tensor, dst, users = sent
            dst_rank = stage_rank[dst]
            if dst_rank == r:
                mine.append((after, _new(Instr, (Opcode.LOCAL, stage, mb, tensor, -1, dst))))
                continue
            mine.append((after, _new(Instr, (Opcode.SEND, stage, mb, tensor, dst_rank, dst))))
            msg = _new(Message, (tensor, mb, stage, dst))
            post = min(end, before[dst_rank][_first_use(users, dst, mb, where)])
            channels.setdefault((r, dst_rank), []).append((end, post, msg))

    # On each channel the receives go in send order: a receive is posted no later than any
    # receive that follows it (a suffix minimum keeps every post time <= its send time).
    for (src_rank, dst_rank), msgs in channels.items():
        msgs.sort(key=itemgetter(0))
        latest = float("inf")
        for seq in range(len(msgs) - 1, -1, -1):
            _, post, msg = msgs[seq]
            latest = min(latest, post)
            recv = _new(Instr, (Opcode.RECV, msg.dst, msg.mb, msg.tensor, src_rank, msg.src))
            keyed[dst_rank].append(((latest, 0, src_rank, seq), recv))

    ranks = []
    reduces = comm_lane(problem, schedule)
    for r, items in enumerate(keyed):
        items.sort(key=itemgetter(0))
        instrs = [instr for _, instr in items]
        if schedule.copy and schedule.copy[r]:
            instrs = _with_issued(instrs, schedule.copy[r], schedule.after[r])
        if reduces and reduces[r]:
            instrs = _with_issued(instrs, *zip(*reduces[r]))
        if not schedule.synchronous:
            instrs = _with_updates(instrs, schedule.ranks[r], problem.microbatches)
        ranks.append((*instrs, Instr(Opcode.STEP)))
    return Program(tuple(ranks), Header.of(problem, schedule))


def _with_issued(instrs: list[Instr], issued: tuple[Op, ...], after: tuple[Op | None, ...]) -> list[Instr]:
    """One rank's instructions with the ops of a lane beside compute, ``issued`` (copies or
    reduces, in the lane's order), each listed right before the compute op that follows the one it
    is issued after (``after``), or last."""
    placed: dict[Op | None, list[Instr]] = {}  # the compute op an op is issued after -> those ops
    for op, anchor in zip(issued, after):
        placed.setdefault(anchor, []).append(Instr(op.kind, op.stage, op.mb))
    return _listed_after(instrs, placed)


def updates(compute: tuple[Op, ...], m: int) -> dict[Op, list[tuple[int, int]]]:
    """One rank of an asynchronous schedule: its last weight gradient (W or BW) of each (stage,
    round) in its compute order ``compute`` -> the (stage, round) updates it is the last of."""
    last: dict[tuple[int, int], Op] = {}
    for op in compute:
        if op.kind in _GRADS:
            last[op.stage, op.mb // m] = op
    out: dict[Op, list[tuple[int, int]]] = {}
    for key, op in last.items():
        out.setdefault(op, []).append(key)
    return out


def _with_updates(instrs: list[Instr], compute: tuple[Op, ...], m: int) -> list[Instr]:
    """One rank's instructions with an UPDATE per (stage, round), each listed right before the
    compute op that follows the round's last weight gradient of the stage, or last."""
    return _listed_after(instrs, {op: [Instr(Opcode.UPDATE, s, r) for s, r in keys]
                                  for op, keys in updates(compute, m).items()})


def _listed_after(instrs: list[Instr], placed: dict[Op | None, list[Instr]]) -> list[Instr]:
    """``instrs`` with ``placed[a]`` listed right before the compute op that follows compute op
    ``a`` (None: before the first), or last."""
    out: list[Instr] = []
    pending = placed.get(None, [])
    for instr in instrs:
        if isinstance(instr.op, Kind) and ROWS[instr.op].lane == "compute":
            out += pending
            pending = placed.get(instr.compute, [])
        out.append(instr)
    return out + pending


def _first_use(users: tuple[Kind, ...], stage: int, mb: int, where: dict[Op, tuple[int, int]]) -> int:
    """Where, in its rank's compute order, the schedule first uses what stage ``stage`` receives
    for microbatch ``mb``: of the ops of kinds ``users`` it holds there, the one its rank runs first
    (an activation: F; a gradient: B or BW, or the RG / SG before it, for Megatron's recompute waits
    for the gradient too)."""
    first = None
    for k in users:
        at = where.get((k, stage, mb))  # (a plain tuple finds the Op: same hash, equal)
        if at is not None and (first is None or at[1] < first):
            first = at[1]
    if first is None:
        raise ProgramError(f"no op of the schedule on stage {stage} uses what microbatch {mb} brings it")
    return first
