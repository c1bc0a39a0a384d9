"""The Program: per rank, the instructions the runtime executes. ``lower(problem, schedule)``.

Instructions:

- ``F``, ``B``, ``W``, ``BW`` on (stage, microbatch): compute, as in the Schedule.
- ``SEND`` / ``RECV`` of a stage's forward activation (``act``, stage s to s+1) or of the gradient
  of it (``grad``, stage s+1 to s) between two ranks. ``RECV`` *posts* a receive and does not
  wait; the compute that uses the tensor waits for it. ``SEND`` may block until the peer has
  posted the matching ``RECV`` (NCCL does for large messages).
- ``LOCAL``: a hand-off between two stages on the same rank (V placement), no communication.
- ``STEP``: the optimizer step, last on every rank.

Between two ranks, the sends of one and the receives of the other list the same messages in the
same order (NCCL and gloo match point-to-point messages in posting order).

Why a lowered Program cannot deadlock: every instruction gets a key from the simulated Timeline:
a compute ``(its start, 2)``, a send or hand-off ``(its producer's end, 1)``, a receive
``(t, 0)`` with ``t`` no later than the matching send's time, and each rank's list is sorted by
key. A send then never waits for a receive with a larger key, and a compute never waits for a
send with a larger key (the consumer starts after its producer ends), so every wait points to a
smaller key: the wait-for relation has no cycle, whatever the real durations turn out to be.
``check`` (schedc/check.py) verifies this independently of the argument.

Receives are posted early so that transfers overlap compute: at the latest one compute op before
the consumer, and no later than the simulated send, so the sender does not block when the
timeline holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from schedc.problem import Problem
from schedc.schedule import Op, Schedule, producers
from schedc.simulate import simulate

COMPUTE = ("F", "B", "W", "BW")
COMM = ("SEND", "RECV")
OPCODES = (*COMPUTE, *COMM, "LOCAL", "STEP")
TENSORS = ("act", "grad")


class Message(NamedTuple):
    """A tensor that moves from stage ``src`` to stage ``dst`` for microbatch ``mb``."""

    tensor: str  # "act": F(src) output, consumed by F(dst = src + 1); "grad": B(src) output, for B(dst = src - 1)
    mb: int
    src: int
    dst: int

    def __str__(self) -> str:
        return f"{self.tensor}{self.mb} s{self.src}->s{self.dst}"


class Instr(NamedTuple):
    """One instruction. Unused fields are -1 (numbers) or "" (tensor)."""

    op: str
    stage: int = -1  # the stage on this rank: computed, sending, receiving, or handing off
    mb: int = -1
    tensor: str = ""  # SEND / RECV / LOCAL: "act" or "grad"
    peer: int = -1  # SEND / RECV: the other rank
    peer_stage: int = -1  # SEND / RECV / LOCAL: the stage at the other end

    @property
    def message(self) -> Message:
        """SEND and LOCAL move ``stage -> peer_stage``; RECV brings ``peer_stage -> stage``."""
        if self.op == "RECV":
            return Message(self.tensor, self.mb, self.peer_stage, self.stage)
        return Message(self.tensor, self.mb, self.stage, self.peer_stage)

    @property
    def compute(self) -> Op:
        return Op(self.op, self.stage, self.mb)

    def __str__(self) -> str:
        if self.op in COMPUTE:
            return str(self.compute)
        if self.op == "SEND":
            return f"SEND {self.message} to rank {self.peer}"
        if self.op == "RECV":
            return f"RECV {self.message} from rank {self.peer}"
        if self.op == "LOCAL":
            return f"LOCAL {self.message}"
        return self.op

    def to_data(self) -> dict:
        """JSON form: only the fields the opcode uses."""
        out: dict = {"op": self.op}
        for name, unset in (("stage", -1), ("mb", -1), ("tensor", ""), ("peer", -1), ("peer_stage", -1)):
            value = getattr(self, name)
            if value != unset:
                out[name] = value
        return out


def produced(op: Op, n_stages: int) -> Message | None:
    """What a compute op sends on: F's activation forward, B's (or BW's) gradient backward."""
    if op.kind == "F" and op.stage + 1 < n_stages:
        return Message("act", op.mb, op.stage, op.stage + 1)
    if op.kind in ("B", "BW") and op.stage > 0:
        return Message("grad", op.mb, op.stage, op.stage - 1)
    return None


def consumed(op: Op, n_stages: int) -> Message | None:
    """What a compute op receives: the result of its producer on another stage (F(s): the
    activation of s-1; B/BW(s): the gradient from s+1)."""
    for d in producers(op, n_stages):
        if d.stage != op.stage:
            return Message("act" if op.kind == "F" else "grad", op.mb, d.stage, op.stage)
    return None


@dataclass(frozen=True)
class Header:
    """What a Program runs on, so that the runtime needs only the Program: the schedule's name,
    the microbatches a step splits its batch into, the stage -> rank map and whether the
    backward is split into B and W."""

    schedule: str
    microbatches: int
    stage_rank: tuple[int, ...]
    split_backward: bool

    @classmethod
    def of(cls, problem: Problem, schedule: Schedule) -> "Header":
        return cls(schedule.name, problem.microbatches, tuple(problem.stage_rank), schedule.split_backward)

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
        """Per rank, the compute ops in program order (a lowered Program's equals its Schedule)."""
        return tuple(tuple(i.compute for i in instrs if i.op in COMPUTE) for instrs in self.ranks)

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


def lower(problem: Problem, schedule: Schedule, timeline=None) -> Program:
    """The Program for ``schedule`` on ``problem``: compute in the Schedule's order, a SEND (or a
    LOCAL hand-off) right after each producing op, each RECV posted early (see the module notes),
    then the optimizer step. ``timeline`` is ``simulate(problem, schedule)``, computed if omitted."""
    timeline = timeline or simulate(problem, schedule)
    n_stages, stage_rank = problem.n_stages, problem.stage_rank
    times = timeline.op_times()
    where = schedule.locate()
    keyed: list[list[tuple[tuple, Instr]]] = [[] for _ in schedule.ranks]

    # Per consumer rank, when the compute op before each position starts (-inf for the first).
    before = [[float("-inf"), *starts[:-1]] for starts in timeline.start]
    channels: dict[tuple[int, int], list[tuple[float, float, Message]]] = {}  # (send time, post time, msg)
    for r, ops in enumerate(schedule.ranks):
        for i, op in enumerate(ops):
            _, start, end = times[op]
            keyed[r].append(((start, 2), Instr(op.kind, op.stage, op.mb)))
            msg = produced(op, n_stages)
            if msg is None:
                continue
            dst_rank = stage_rank[msg.dst]
            if dst_rank == r:
                keyed[r].append(((end, 1), Instr("LOCAL", msg.src, msg.mb, msg.tensor, -1, msg.dst)))
                continue
            keyed[r].append(((end, 1), Instr("SEND", msg.src, msg.mb, msg.tensor, dst_rank, msg.dst)))
            user = _consumer(msg, where)
            post = min(end, before[dst_rank][where[user][1]])
            channels.setdefault((r, dst_rank), []).append((end, post, msg))

    # On each channel the receives go in send order: a receive is posted no later than any
    # receive that follows it (a suffix minimum keeps every post time <= its send time).
    for (src_rank, dst_rank), msgs in channels.items():
        msgs.sort(key=lambda x: x[0])
        latest = float("inf")
        for seq in range(len(msgs) - 1, -1, -1):
            _, post, msg = msgs[seq]
            latest = min(latest, post)
            recv = Instr("RECV", msg.dst, msg.mb, msg.tensor, src_rank, msg.src)
            keyed[dst_rank].append(((latest, 0, src_rank, seq), recv))

    ranks = []
    for items in keyed:
        items.sort(key=lambda x: x[0])
        ranks.append(tuple(instr for _, instr in items) + (Instr("STEP"),))
    return Program(tuple(ranks), Header.of(problem, schedule))


def _consumer(msg: Message, where: dict[Op, tuple[int, int]]) -> Op:
    if msg.tensor == "act":
        return Op("F", msg.dst, msg.mb)
    b = Op("B", msg.dst, msg.mb)
    return b if b in where else Op("BW", msg.dst, msg.mb)
