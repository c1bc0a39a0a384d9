"""check(problem, program): an interpretation of a Program that is independent of lowering.

It checks that the instructions are well formed and on the right ranks, that every op of the
problem runs exactly once (the compute lane's, and the copy lane's offloads O and reloads L where
the program offloads), that each op comes after the ops of its own stage it needs, as the program
holds them (a recompute R or S and an offload O after its F, a reload L after its O, and a B or BW
after what brings its activation back: its R, S or L where the program holds one, else its F),
that each tensor a compute op needs reaches it (by a RECV or a
LOCAL earlier on its rank) from a producer that ran before the SEND or LOCAL, that the sends of
one rank and the receives of the other pair one to one in the same order, and then runs the
ranks under strict rules until all finish or none can move:

- RECV posts a receive and never waits;
- SEND waits until the peer has posted the matching RECV;
- a compute op waits until the SEND of each tensor it received has happened;
- an offload or reload is issued and never waits (it waits only for ops earlier on its own rank:
  the compute op listed before it, what it needs, the copy before it; the order above already puts
  them before it, and ``Schedule.check_complete`` refuses a reload listed after its backward);
- a gradient all-reduce AR (with ``data_parallel``: one per stage, on its rank, after every weight
  gradient of its stage) is issued and never waits for another pipeline rank: its partners are the
  stage's replicas, which run the same program; the STEP after it waits for it;
- a collective RS (with ``replicas``: the gradient sum of a model stage's copies, one per stage,
  after every weight gradient of its stage) is issued and never holds up compute; the
  communication lanes run on their own, and every member of a collective must come to it with
  nothing before it that waits for a member at another collective (``_check_collectives``);
- an UPDATE (asynchronous programs: ``Header.rounds`` above 1) is a stage's own optimizer step and
  never waits; there is one per stage of the rank and round, after every weight gradient of that
  stage and round and before every forward of that stage two rounds later (``_check_updates``),
  and a synchronous program has none.

If the ranks stop short, the wait-for graph has a cycle, which the error names.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from typing import NamedTuple

from schedc.bulk import bulk
from schedc.errors import ProgramError, ScheduleError
from schedc.kinds import GRADS, ROWS, Kind, candidates, in_order, unsupported
from schedc.problem import Problem
from schedc.program import DIRECTION, TENSORS, Instr, Message, Opcode, Program, consumed, produced
from schedc.schedule import Op, Schedule, comm_lane, comm_ops, members

# the op kinds the checker handles: the compute lane's and the copy lane's (a new kind is refused by
# name until its rules are here)
CHECKED = frozenset({Kind.F, Kind.B, Kind.W, Kind.BW, Kind.R, Kind.S, Kind.RG, Kind.SG, Kind.O, Kind.L, Kind.AR, Kind.RS, Kind.TS})

# kind -> per need on its own stage, the kinds that may meet it (W: B; B and BW: F), from the rows
_SAME_STAGE = {k: tuple((candidates(need), 0) for need, offset in row.needs if offset == 0) for k, row in ROWS.items()}
# kind -> per need on a neighbouring chunk of its sequence (sequence chunks), the kinds and the chunk offset
_CHUNK = {k: tuple((candidates(need), offset) for need, offset in row.chunk_needs) for k, row in ROWS.items()}
_MOVES = frozenset({Opcode.SEND, Opcode.RECV, Opcode.LOCAL})  # the instructions that move a message
# the instructions whose microbatch field has a rule of its own (``_check_fields``)
_MB_RULED = frozenset({Opcode.STEP, Opcode.UPDATE, *(k for k, row in ROWS.items() if row.per_stage)})
_LANE = {k: row.lane for k, row in ROWS.items()}
_new = tuple.__new__
# tensor -> the kinds whose output carries it, in the table's order (act: F; grad: B, BW)
_MAKERS = {tensor: tuple(k for k, row in ROWS.items() if row.carries == tensor) for tensor in TENSORS}


@dataclass(frozen=True)
class CheckReport:
    instructions: tuple[int, ...]  # per rank
    sends: tuple[int, ...]
    receives: tuple[int, ...]
    local: tuple[int, ...]
    receive_buffers: tuple[int, ...]  # per rank, most receives posted and not yet used at once

    def summary(self) -> dict:
        return {
            "instructions": list(self.instructions),
            "sends": list(self.sends),
            "receives": list(self.receives),
            "local_handoffs": list(self.local),
            "max_receive_buffers": list(self.receive_buffers),
        }


@bulk
def check(problem: Problem, program: Program, schedule: Schedule | None = None, issue: bool = True) -> CheckReport:
    """Raise ProgramError naming the first thing wrong; with ``schedule``, the compute order of
    every rank must also equal it, and its copy lane's order and (with ``issue``) the compute op
    each copy op is issued after. Returns per-rank counts."""
    p = problem.ranks
    if len(program.ranks) != p:
        raise ProgramError(f"the program has {len(program.ranks)} ranks, the problem has {p}")
    rounds = 1 if program.header is None else program.header.rounds
    if schedule is not None and schedule.rounds != rounds:
        raise ProgramError(f"the program runs {rounds} round(s) of the microbatches but the schedule"
                           f" {schedule.name!r} has {schedule.rounds}: a synchronous and an asynchronous one do not mix")
    shape = _Shape(problem.n_stages, problem.units * rounds, rounds, problem.stage_rank, problem.pipeline_stages)
    scans = [_scan(shape, r, instrs) for r, instrs in enumerate(program.ranks)]
    copied = any(scan.lanes["copy"] for scan in scans)
    order = Schedule("program", tuple(tuple(scan.lanes["compute"]) for scan in scans),  # (Ops already: no copies)
                     tuple(tuple(scan.lanes["copy"]) for scan in scans) if copied else (),
                     tuple(tuple(scan.after) for scan in scans) if copied else (), rounds=rounds)
    try:
        order.check_complete(problem)
    except ScheduleError as e:
        raise ProgramError(str(e).replace("program: ", "compute ops: ", 1)) from None
    if schedule is not None:
        for r, (mine, theirs) in enumerate(zip(order.ranks, schedule.ranks)):
            if mine != theirs:
                k = next((k for k, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
                got = str(mine[k]) if k < len(mine) else "nothing"
                want = str(theirs[k]) if k < len(theirs) else "nothing"
                raise ProgramError(
                    f"rank {r}: compute op {k} is {got} but the schedule {schedule.name!r} has {want}"
                )
        for r, (mine, theirs) in enumerate(zip(order.copy or ((),) * p, schedule.copy or ((),) * p)):
            if mine != theirs:
                k = next((k for k, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
                got = str(mine[k]) if k < len(mine) else "nothing"
                want = str(theirs[k]) if k < len(theirs) else "nothing"
                raise ProgramError(f"rank {r}: copy op {k} is {got} but the schedule {schedule.name!r} has {want}")
        for r, (mine, theirs, ops) in enumerate(zip(order.after, schedule.after, order.copy) if issue else ()):
            for op, a, b in zip(ops, mine, theirs):
                if a != b:
                    raise ProgramError(f"rank {r}: copy op {op} is issued after {a or 'nothing'} but the schedule"
                                       f" {schedule.name!r} issues it after {b or 'nothing'}")

    _check_reduces(problem, program, schedule if issue else None)
    _check_updates(problem, program, rounds)
    feeds = _check_dataflow(problem, program, scans)
    buffers = _run(program, _pair(program, scans, feeds), feeds)
    return CheckReport(
        instructions=tuple(len(instrs) for instrs in program.ranks),
        sends=tuple(scan.count[Opcode.SEND] for scan in scans),
        receives=tuple(scan.count[Opcode.RECV] for scan in scans),
        local=tuple(scan.count[Opcode.LOCAL] for scan in scans),
        receive_buffers=buffers,
    )


class _Scan(NamedTuple):
    """One rank's instructions read once (``_scan``), each list aligned with them where it says."""

    messages: list[Message | None]  # aligned: the message a SEND, RECV or LOCAL moves
    ops: list[Op | None]  # aligned: the op a compute instruction runs
    lanes: dict[str, list[Op]]  # lane -> its ops in program order
    after: list[Op | None]  # per copy op, the compute op listed last before it
    count: dict[Opcode, int]  # SEND, RECV, LOCAL, STEP


class _Shape(NamedTuple):
    """What ``_check_fields`` reads of the problem, looked up once: stages, microbatch ids (units
    times rounds), rounds, each stage's rank, stages per pipeline."""

    n: int
    m: int
    rounds: int
    stage_rank: tuple[int, ...]
    depth: int


def _scan(shape: _Shape, r: int, instrs: tuple[Instr, ...]) -> _Scan:
    """Rank r's instructions in one pass: each one's fields checked (``_check_fields``; fields
    found good once, for a microbatch in range, are good for every microbatch in range, unless the
    op rules its microbatch: STEP, UPDATE, a per-stage op), the program ending in its one STEP, and
    what the other checks read (``_Scan``)."""
    messages: list[Message | None] = []
    ops: list[Op | None] = []
    lanes: dict[str, list[Op]] = {"compute": [], "copy": [], "comm": []}
    after: list[Op | None] = []
    count = dict.fromkeys(Opcode, 0)
    good: set[tuple] = set()
    m, last = shape.m, None
    for k, instr in enumerate(instrs):
        op, stage, mb, tensor, peer, peer_stage = instr
        msg = None
        if op in _MOVES:  # (Instr.message, without a call per instruction)
            msg = _new(Message, (tensor, mb, peer_stage, stage) if op is Opcode.RECV else (tensor, mb, stage, peer_stage))
        key = (op, stage, tensor, peer, peer_stage)
        if key not in good or not 0 <= mb < m:
            _check_fields(shape, r, k, instr, msg)
            if 0 <= mb < m and op not in _MB_RULED:
                good.add(key)
        messages.append(msg)
        if op.__class__ is Kind:
            run = _new(Op, (op, stage, mb))
            ops.append(run)
            lane = _LANE[op]
            lanes[lane].append(run)
            if lane == "compute":
                last = run
            elif lane == "copy":
                after.append(last)
        else:
            ops.append(None)
            count[op] += 1
    if count[Opcode.STEP] != 1 or instrs[-1].op is not Opcode.STEP:
        raise ProgramError(f"rank {r}: the program must end with exactly one STEP (found {count[Opcode.STEP]})")
    return _Scan(messages, ops, lanes, after, count)


def _check_fields(shape: _Shape, r: int, k: int, instr: Instr, msg: Message | None) -> None:
    """One instruction's fields against the problem; ``msg`` is its message (SEND, RECV, LOCAL)."""
    where = lambda: f"rank {r} instruction {k} ({instr})"  # noqa: E731  (written out only for an error)
    n, m, rounds, stage_rank, depth = shape
    op, stage, mb, tensor, peer, peer_stage = instr
    if isinstance(op, Kind) and op not in CHECKED:
        raise ProgramError(f"rank {r} instruction {k}: {unsupported(op, 'the checker', in_order(CHECKED))}")
    if op is Opcode.STEP:
        if (stage, mb, tensor, peer, peer_stage) != (-1, -1, "", -1, -1):
            raise ProgramError(f"{where()}: STEP takes no stage, microbatch, tensor or peer")
        return
    if op is Opcode.UPDATE:
        if rounds == 1:
            raise ProgramError(f"{where()}: UPDATE is the step of an asynchronous program, and this one is synchronous"
                               " (one round): the two do not mix")
        if not (0 <= stage < n and 0 <= mb < rounds) or (tensor, peer, peer_stage) != ("", -1, -1):
            raise ProgramError(f"{where()}: UPDATE takes a stage and a round (of {rounds}), no tensor or peer")
        if stage_rank[stage] != r:
            raise ProgramError(f"{where()}: stage {stage} is placed on rank {stage_rank[stage]}, not {r}")
        return
    if not (0 <= stage < n and 0 <= mb < m):
        raise ProgramError(f"{where()}: stage or microbatch outside {n} stages x {m} microbatches")
    if stage_rank[stage] != r:
        raise ProgramError(f"{where()}: stage {stage} is placed on rank {stage_rank[stage]}, not {r}")
    if isinstance(op, Kind):
        if (tensor, peer, peer_stage) != ("", -1, -1):
            raise ProgramError(f"{where()}: a compute instruction has no tensor or peer")
        if ROWS[op].per_stage and mb != 0:
            raise ProgramError(f"{where()}: {ROWS[op].title} is one op per stage, written with microbatch 0")
        return
    if tensor not in TENSORS:
        raise ProgramError(f"{where()}: tensor must be 'act' or 'grad', got {tensor!r}")
    if not 0 <= peer_stage < n or msg.dst != msg.src + DIRECTION[msg.tensor] or msg.dst // depth != msg.src // depth:
        raise ProgramError(f"{where()}: {msg.tensor} goes from stage s to s{DIRECTION[msg.tensor]:+d} of its pipeline")
    peer_rank = stage_rank[peer_stage]
    if op is Opcode.LOCAL:
        if peer_rank != r or peer != -1:
            raise ProgramError(f"{where()}: stage {peer_stage} is on rank {peer_rank}; LOCAL stays on one rank"
                               " (peer -1)")
    elif peer != peer_rank or peer == r:
        raise ProgramError(f"{where()}: stage {peer_stage} is on rank {peer_rank}, so the peer must be {peer_rank}")


def _check_reduces(problem: Problem, program: Program, schedule: Schedule | None) -> None:
    """Each per-stage op the problem has (AR with ``data_parallel``, RS with ``replicas``) listed
    once per stage on its rank, after every weight gradient of its stage (and, given ``schedule``,
    in ``comm_lane``'s order and issue points); none the problem does not have; and the
    collectives (RS) issued in an order that lets every group meet (``_check_collectives``)."""
    comm = program.comm_order()
    kinds = [k for k in problem.kinds if ROWS[k].per_stage]
    for r, ops in enumerate(comm):
        for op in ops:
            if op.kind not in kinds:
                section = ROWS[op.kind].cost.split(".", 1)[0]
                raise ProgramError(f"rank {r}: {op} ({ROWS[op.kind].title}) needs the problem's {section} section,"
                                   " which it does not give")
    if not kinds:
        return
    grads = candidates(GRADS)
    for r, instrs in enumerate(program.ranks):
        expected = comm_ops(problem, r)
        pending = {s: problem.microbatches for s in problem.rank_stages[r]}  # weight gradients still to run
        done: set[Op] = set()
        for instr in instrs:
            if instr.op in grads:
                pending[instr.stage] -= 1
            elif instr.op in kinds:
                op = instr.compute
                if op in done:
                    raise ProgramError(f"rank {r}: {op} is listed twice")
                if op not in expected:
                    raise ProgramError(f"rank {r}: {op}: stage {op.stage} has no {ROWS[op.kind].title} here (its"
                                       " weights are shared with no stage on another rank)")
                if pending[instr.stage]:
                    raise ProgramError(f"rank {r}: {op} is issued before the last weight gradient of"
                                       f" stage {instr.stage} ({pending[instr.stage]} still to run)")
                done.add(op)
        missing = [op for op in expected if op not in done]
        if missing:
            op = missing[0]
            raise ProgramError(f"rank {r}: no {ROWS[op.kind].title} of stage {op.stage} (the problem's"
                               f" {ROWS[op.kind].cost.split('.', 1)[0]} needs one)")
    _check_collectives(problem, comm)
    if schedule is not None:
        want = comm_lane(problem, schedule)
        mine = tuple(zip(comm, program.issued_after("comm")))
        for r, (ops, after) in enumerate(mine):
            if tuple(zip(ops, after)) != want[r]:
                raise ProgramError(f"rank {r}: the gradient syncs are issued as {_issued(ops, after)}, but the"
                                   f" schedule {schedule.name!r} issues them as {_issued(*zip(*want[r]))}")


def _check_updates(problem: Problem, program: Program, rounds: int) -> None:
    """An asynchronous program: per rank, one UPDATE per stage and round, after every weight
    gradient of that stage and round, before every forward of that stage two rounds later."""
    if rounds == 1:
        return
    m, grads = problem.microbatches, candidates(GRADS)
    for r, instrs in enumerate(program.ranks):
        pending = {(s, k): m for s in problem.rank_stages[r] for k in range(rounds)}  # weight gradients to run
        done: set[tuple[int, int]] = set()
        for instr in instrs:
            if instr.op is Opcode.UPDATE:
                key = (instr.stage, instr.mb)
                if key in done:
                    raise ProgramError(f"rank {r}: {instr} is listed twice")
                if pending[key]:
                    raise ProgramError(f"rank {r}: {instr} comes before {pending[key]} weight gradient(s) of its round")
                done.add(key)
            elif isinstance(instr.op, Kind) and instr.op in grads:
                pending[instr.stage, instr.mb // m] -= 1
            elif instr.op is Kind.F and instr.mb // m >= 2 and (instr.stage, instr.mb // m - 2) not in done:
                raise ProgramError(f"rank {r}: {instr.compute} (round {instr.mb // m}) comes before UPDATE s{instr.stage}"
                                   f" round {instr.mb // m - 2}, whose weights it uses")
        missing = sorted(pending.keys() - done)
        if missing:
            raise ProgramError(f"rank {r}: no UPDATE for stage {missing[0][0]} round {missing[0][1]}")


def _check_collectives(problem: Problem, comm: tuple[tuple[Op, ...], ...]) -> None:
    """Run the communication lanes alone (nothing on a compute lane waits for them): each rank's in
    program order, an AR as soon as it comes (its partners are the stage's data-parallel replicas,
    which run the same program), a collective once every member of its group, on whichever rank,
    has come to it. Raise ProgramError naming the ranks that wait for each other if the lanes stop
    short: ranks that list two collectives in different orders."""
    pc = [0] * len(comm)
    rank_of = problem.stage_rank

    def ready(r: int) -> bool:
        op = comm[r][pc[r]]
        return all(pc[q := rank_of[m.stage]] < len(comm[q]) and comm[q][pc[q]] == m for m in members(problem, op))

    moved = True
    while moved:
        moved = False
        for r in range(len(comm)):
            while pc[r] < len(comm[r]) and ready(r):
                op = comm[r][pc[r]]
                for m in members(problem, op):  # its members (on other ranks: Problem) go with it
                    pc[rank_of[m.stage]] += 1
                pc[r] += 1
                moved = True
    stuck = [r for r in range(len(comm)) if pc[r] < len(comm[r])]
    if stuck:
        parts = [f"rank {r} at {comm[r][pc[r]]}" for r in stuck]
        raise ProgramError(f"deadlock on the communication lanes: {', '.join(parts)} wait for members of their"
                           " collectives that are at another one (every member must issue its collectives in one order)")


def _issued(ops, after) -> str:
    return ", ".join(f"{op} after {a or 'nothing'}" for op, a in zip(ops, after))


def _check_dataflow(problem: Problem, program: Program, scans: list[_Scan]) -> list[dict[int, int]]:
    """Every message moves exactly once, after its producer ran, and reaches its consumer first.
    Returns, per rank, compute index -> index of the RECV that brings its input."""
    n, chunks = problem.pipeline_stages, problem.seq_chunks
    # the ops it runs of the kinds that meet a need ahead of another (B's activation: R, S or L
    # ahead of F): the others need not be looked up
    ahead = {kind for rows in (_SAME_STAGE, _CHUNK) for needs in rows.values() for kinds, _ in needs
             for kind in kinds[:-1]}
    held = {op for scan in scans for op in scan.ops if op is not None and op[0] in ahead}
    needs = {k: _SAME_STAGE[k] + (_CHUNK[k] if chunks > 1 else ()) for k in ROWS}
    brings: dict[tuple[Kind, int], tuple[str, int] | None] = {}  # (kind, stage) -> what it receives
    makes: dict[tuple[Kind, int], bool] = {}  # (kind, stage) -> whether it sends a message on
    expected = 0  # messages the ops it runs send on
    moved: dict[Message, Instr] = {}
    feeds: list[dict[int, int]] = []
    for r, (instrs, scan) in enumerate(zip(program.ranks, scans)):
        done: set[Op] = set()
        arrived: dict[Message, int] = {}  # -> index of its RECV, or -1 for a LOCAL
        fed: dict[int, int] = {}
        feeds.append(fed)
        for k, (instr, op, msg) in enumerate(zip(instrs, scan.ops, scan.messages)):
            if op is not None:
                kind, stage, mb = op
                if (kind, stage) not in brings:  # (what an op receives and sends depends on its kind and stage alone)
                    need = consumed(op, n)
                    brings[kind, stage] = None if need is None else (need.tensor, need.src)
                    makes[kind, stage] = produced(op, n) is not None
                expected += makes[kind, stage]
                if (got := brings[kind, stage]) is not None:
                    need = Message(got[0], mb, got[1], stage)
                    at = arrived.get(need)
                    if at is None:
                        raise ProgramError(f"rank {r}: {op} needs {need}, which no earlier RECV or LOCAL on rank {r}"
                                           " brings")
                    if at >= 0:
                        fed[k] = at
                for kinds, offset in needs[kind]:
                    # the op the program holds for this need: the first of its candidates it runs
                    # (B's activation: its R, S or L, else its F), never just any candidate; with
                    # sequence chunks also the neighbouring chunk's (``KindRow.chunk_needs``)
                    if offset and not 0 <= mb % chunks + offset < chunks:
                        continue
                    # (plain tuples: they find the Ops in held and done, same hash and equal)
                    need_op = (kinds[-1], stage, mb + offset)
                    for candidate in kinds[:-1]:
                        if (candidate, stage, mb + offset) in held:
                            need_op = (candidate, stage, mb + offset)
                            break
                    if need_op not in done:
                        raise ProgramError(f"rank {r}: {op} runs before {Op(*need_op)}")
                done.add(op)
            elif msg is None:
                continue
            elif instr.op is Opcode.RECV:
                arrived[msg] = k
            else:  # SEND, LOCAL
                if msg in moved:
                    raise ProgramError(f"rank {r}: {msg} is moved twice ({moved[msg]} and {instr})")
                moved[msg] = instr
                if not any((kind, msg.src, msg.mb) in done for kind in _MAKERS[msg.tensor]):
                    raise ProgramError(f"rank {r}: {instr} comes before the op that computes it")
                if instr.op is Opcode.LOCAL:
                    arrived[msg] = -1
    # Each message moved is one an op it runs sends on (made before, by its maker's kind, along
    # the direction its tensor goes): as many moved as expected is every one of them.
    if len(moved) != expected:
        missing = {msg for scan in scans for op in scan.ops if op is not None and (msg := produced(op, n)) is not None}
        missing -= moved.keys()
        if missing:
            raise ProgramError(f"{min(missing)} is computed but never sent or handed off")
    return feeds


def _pair(program: Program, scans: list[_Scan], feeds: list[dict[int, int]]) -> list[tuple[list[int], list[int]]]:
    """Per rank, two lists aligned with its instructions: the rank and the instruction of it that
    each waits for under the strict rules (a SEND: its partner RECV's posting; a compute op fed by a
    RECV: that RECV's partner SEND), rank p where it waits for nothing; after checking that each
    channel's sends and receives list the same messages in the same order. (``feeds``:
    ``_check_dataflow``'s. Two lists of shared ints, not a tuple per instruction: a large program's
    check holds them all at once.)"""
    p = len(program.ranks)
    sends: dict[tuple[int, int], tuple[list[int], list[Message]]] = {}  # (from, to) -> indices, messages
    recvs: dict[tuple[int, int], tuple[list[int], list[Message]]] = {}
    for r, (instrs, scan) in enumerate(zip(program.ranks, scans)):
        for k, (instr, msg) in enumerate(zip(instrs, scan.messages)):
            if instr.op is Opcode.SEND or instr.op is Opcode.RECV:
                at, got = (sends.setdefault((r, instr.peer), ([], [])) if instr.op is Opcode.SEND
                           else recvs.setdefault((instr.peer, r), ([], [])))
                at.append(k)
                got.append(msg)
    waits = [([p] * len(instrs), [-1] * len(instrs)) for instrs in program.ranks]
    sender: list[dict[int, int]] = [{} for _ in program.ranks]  # RECV index -> its SEND's, on the RECV's peer
    for src, dst in sorted(sends.keys() | recvs.keys()):
        (out, sent), (into, got) = sends.pop((src, dst), ([], [])), recvs.pop((src, dst), ([], []))
        if sent != got:
            j = next(j for j, (a, b) in enumerate(zip_longest(sent, got)) if a != b)
            raise ProgramError(
                f"rank {src}'s send #{j} to rank {dst} is {_nth(sent, j) or 'missing'} but rank {dst}'s receive #{j}"
                f" from rank {src} is {_nth(got, j) or 'missing'}: sends and receives must pair in the same order"
            )
        on, at = waits[src]
        for k, j in zip(out, into):
            on[k], at[k] = dst, j
        sender[dst].update(zip(into, out))
    for instrs, (on, at), fed, by in zip(program.ranks, waits, feeds, sender):
        for k, j in fed.items():
            on[k], at[k] = instrs[j].peer, by[j]
    return waits


def _nth(items: list, j: int):
    return items[j] if j < len(items) else None


def _run(program: Program, waits: list[tuple[list[int], list[int]]], feeds: list[dict[int, int]]):
    """Interpret all ranks under the strict rules (``waits``: ``_pair``'s); raise ProgramError on
    deadlock. Returns each rank's largest number of posted, not yet used receives."""
    ranks = program.ranks
    p = len(ranks)
    pc = [0] * (p + 1)  # (rank p: what waits for nothing waits for its instruction -1)
    progress = True
    while progress:
        progress = False
        for r in range(p):
            (on, at), k, end = waits[r], pc[r], len(ranks[r])
            while k < end and pc[on[k]] > at[k]:
                k += 1
            if k > pc[r]:
                pc[r], progress = k, True
    stuck = [r for r in range(p) if pc[r] < len(ranks[r])]
    if stuck:
        raise ProgramError(f"deadlock: {_cycle(ranks, pc, waits, stuck[0])}")
    return tuple(_buffers(instrs, fed) for instrs, fed in zip(ranks, feeds))


def _blocker(ranks, pc, waits, r) -> tuple[int, str]:
    """(rank, what it has not done yet) that rank r, stopped, waits for at its current instruction."""
    on, at = waits[r]
    peer, j = on[pc[r]], at[pc[r]]
    return peer, f"{'post' if ranks[r][pc[r]].op is Opcode.SEND else 'run'} {ranks[peer][j]}"


def _cycle(ranks, pc, waits, r) -> str:
    """Follow who waits for whom from rank r until a rank repeats; describe that cycle."""
    seen: list[int] = []
    while r not in seen:
        seen.append(r)
        r = _blocker(ranks, pc, waits, r)[0]
    cycle = seen[seen.index(r):]
    parts = []
    for q in cycle:
        peer, what = _blocker(ranks, pc, waits, q)
        parts.append(f"rank {q} at instruction {pc[q]} ({ranks[q][pc[q]]}) waits for rank {peer} to {what}")
    return "; ".join(parts) + f" (a cycle of {len(cycle)} ranks)"


def _buffers(instrs: tuple[Instr, ...], fed: dict[int, int]) -> int:
    held = most = 0
    for k, instr in enumerate(instrs):
        if instr.op is Opcode.RECV:
            held += 1
            most = max(most, held)
        elif k in fed:
            held -= 1
    return most
