"""torch.distributed.pipelining's compute-only CSV format, read and written without torch.

torch writes a schedule as CSV with one row per rank and one cell per action,
``{stage}{action}{microbatch}``: ``3F0`` is the forward of stage 3 on microbatch 0. Actions map as
the kinds' rows say (``KindRow.torch``, ``Op.to_torch``):

    schedc  F  B (input gradient)  W (weight gradient)  BW (fused backward)
    torch   F  I                   W                    B

An empty cell is an idle step. torch's IR has no action for recompute (R, S) or for an offload
and its reload (O, L): every writer refuses a schedule with one of them (``refuse_untorchable``),
with one line naming what the schedule recomputes or offloads; such a schedule runs on schedc's
own runtime. Reading and writing CSV is our own code and needs no torch;
torch's own schedules are built in ``schedc.runtime.torch_schedules`` (it imports torch).

What torch's ``_PipelineScheduleRuntime`` (torch 2.13) assumes of a schedule, and what schedc does
about each (``torch_ready`` runs every check; each refusal is one line):

- the last stage's forwards run in microbatch order: the runtime appends each loss to a list as
  the last stage's forward computes it and reads it back by microbatch number at the backward
  (``_maybe_compute_loss``, ``_maybe_get_loss``), and returns the losses and the merged outputs
  in that list's order. Out of order it fails mid-step ("Loss for microbatch 5 is not available",
  also from a backward of another stage on that rank) or, where the index exists, hands the
  backward another microbatch's loss. Refused (``refuse_out_of_order``); ``in_torch_order`` renumbers the
  microbatches by that order, the same schedule (microbatches are interchangeable), which
  ``schedc solve --torch`` does to what it finds and ``renumber=True`` to what is exported;
- every action of its IR is F, I, W, B (fused) or communication: no recompute or offload
  (``refuse_untorchable``), one pipeline (``refuse_pipelines``), one synchronous step
  (``refuse_asynchronous``), whole microbatches (``refuse_sequence_chunks``: a chunk would be read
  as a microbatch);
- checked by torch itself when it loads the actions (``_validate_schedule``): every forward once
  per stage, each I or B after its forward, each W after its I, each stage on one rank;
- sends and receives between two ranks match in the order each posts them (one tag): schedc's
  Program pairs them so (``schedc.check``), torch's own lowering likewise;
- nothing else is read by order: the first stage takes microbatch i of the split inputs by
  number, the receive buffers, the saved activations and the weight-gradient closures are kept
  per microbatch, a backward on the last stage may run in any order once the forwards are in
  order, a rank's W in any order after their I, and REDUCE_GRAD (the 1/m scaling) after the
  stage's last backward, counted, not numbered.

``torch_comms_rows(program)`` writes a lowered Program in torch's other format, "compute_comms":
the compute cells plus schedc's own sends and receives (``0SEND_F3``, ``1RECV_F3``, ``1SEND_B3``,
``0RECV_B3``) in the Program's order, and ``0REDUCE_GRAD`` after each stage's last backward (where
the problem has ``data_parallel``: where the Program lists the stage's all-reduce ``AR``). torch
infers the stage-to-rank mapping from where each stage's actions are, so the placement (V or
explicit) travels with the file; ``schedc.runtime.torch_export`` runs it with torch's runtime.
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from schedc.errors import SchedcError, ScheduleError
from schedc.inputs import read_text
from schedc.kinds import BY_TORCH, ROWS, Kind, in_order
from schedc.problem import Problem
from schedc.program import Opcode, Program
from schedc.schedule import Op, Schedule

TO_TORCH = {k: row.torch for k, row in ROWS.items()}  # kind -> torch's action letter
FROM_TORCH = BY_TORCH  # torch's action letter -> kind
_LAST_OF_STAGE = frozenset(k for k, row in ROWS.items() if row.frees)  # W, BW: a stage's last backward is one
# torch actions that compute nothing: communication, FSDP unshard/reshard, data-parallel grad reduction.
NO_COMPUTE = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"}
_CELL = re.compile(r"(\d+)([A-Z_]+)(\d*)")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")


# ---- CSV ----


def refuse_untorchable(ops: Iterable[Op], name: str) -> None:
    """Raise a one-line ScheduleError if ``ops`` (a schedule's, or a Program's compute ops) hold a
    kind torch's IR has no action for (``KindRow.torch`` None: recompute, offload, reload), saying
    how many of each the schedule ``name`` holds."""
    counts = Counter(op.kind for op in ops if ROWS[op.kind].torch is None and not ROWS[op.kind].per_stage)
    if not counts:
        return
    kinds = in_order(counts)
    held = ", ".join(f"{counts[k]} {k.value}" for k in kinds)
    # what torch lacks, as the policies are named: recompute (R, S: they lighten the forward) or offload (O, L)
    what = " or ".join(dict.fromkeys("recompute" if ROWS[k].lightens else "offload" for k in kinds))
    raise ScheduleError(f"{name}: torch's IR has no {what} action (the schedule has {held}): export a"
                        " schedule without recompute or offload, or run this one with schedc's runtime")


def refuse_pipelines(pipelines: int, name: str) -> None:
    """Raise a one-line ScheduleError for a schedule of several pipelines (``Problem.replicas``):
    torch's pipelining runs one, and would read the second pipeline's stages as more stages of it."""
    if pipelines > 1:
        raise ScheduleError(f"{name}: torch.distributed.pipelining runs one pipeline, and this schedule runs"
                            f" {pipelines} (replicas): run it with schedc's runtime")


def refuse_asynchronous(rounds: int, name: str) -> None:
    """Raise a one-line ScheduleError for an asynchronous schedule (``Schedule.rounds`` above 1):
    torch's pipelining steps once after every microbatch of the step, and keeps no weight versions."""
    if rounds > 1:
        raise ScheduleError(f"{name}: asynchronous ({rounds} rounds on weight versions), and"
                            " torch.distributed.pipelining runs synchronous schedules only: run it with schedc's runtime")


def refuse_sequence_chunks(chunks: int, name: str) -> None:
    """Raise a one-line ScheduleError for a schedule of sequence chunks (``Problem.sequence_chunks``):
    torch's pipelining has none, and would run each chunk as a microbatch of its own."""
    if chunks > 1:
        raise ScheduleError(f"{name}: torch.distributed.pipelining has no sequence chunks, and this schedule cuts each"
                            f" microbatch into {chunks}: run it with schedc's runtime")


def refuse_torch_shape(name: str, pipelines: int = 1, rounds: int = 1, chunks: int = 1) -> None:
    """What torch's runtime needs of any schedule's shape, each refusal one line: one pipeline
    (``refuse_pipelines``), one synchronous step (``refuse_asynchronous``), whole microbatches
    (``refuse_sequence_chunks``); also where its microbatches are interchangeable (``in_torch_order``)."""
    refuse_pipelines(pipelines, name)
    refuse_asynchronous(rounds, name)
    refuse_sequence_chunks(chunks, name)


def _last_forwards(ranks: Sequence[Sequence[Op]]) -> tuple[int, int, list[int]]:
    """The last stage (the highest in the ops), its rank and the microbatches of its forwards, in
    the order they run."""
    last = max((op.stage for ops in ranks for op in ops), default=0)
    for r, ops in enumerate(ranks):
        mbs = [op.mb for op in ops if op.kind is Kind.F and op.stage == last]
        if mbs:
            return last, r, mbs
    return last, 0, []


def refuse_out_of_order(ranks: Sequence[Sequence[Op]], name: str) -> None:
    """Raise a one-line ScheduleError where the last stage's forwards (``ranks``: per rank, the
    compute order) do not run in microbatch order, which torch's runtime assumes (see the module
    notes), naming the first two that do not and what to do."""
    last, r, mbs = _last_forwards(ranks)
    want = sorted(mbs)
    k = next((k for k, (a, b) in enumerate(zip(mbs, want)) if a != b), None)
    if k is None:
        return
    raise ScheduleError(
        f"{name}: torch's runtime keeps the last stage's losses in the order its forwards run and reads them by"
        f" microbatch, but rank {r} runs {last}F{mbs[k]} before {last}F{want[k]}: renumber the microbatches (solve"
        " --torch, export --renumber, renumber=True) or use schedc's runtime"
    )


def torch_ready(problem: Problem, schedule: Schedule, renumber: bool = False) -> Schedule:
    """``schedule`` as torch's runtime is to run it on ``problem``, checked for every assumption of
    the module notes (a one-line ScheduleError for the first it fails); with ``renumber``, its
    microbatches renumbered in its last stage's forward order first (``in_torch_order``: the
    same schedule), so that order passes."""
    name = schedule.name
    refuse_untorchable(schedule.ops(), name)
    if renumber:
        schedule = in_torch_order(problem, schedule)  # (its shape checked there)
    else:
        refuse_torch_shape(name, problem.pipelines, schedule.rounds, problem.seq_chunks)
    refuse_out_of_order(schedule.ranks, name)
    return schedule


def in_torch_order(problem: Problem, schedule: Schedule) -> Schedule:
    """``schedule`` with its microbatches renumbered in the order its last stage runs their
    forwards, the order torch's runtime assumes (``refuse_out_of_order``); itself when already so.

    The same schedule: on a problem of one pipeline, whole microbatches and one synchronous step,
    microbatches are interchangeable (each costs, allocates and waits for the same as any other
    on each stage), and the renumbering is one permutation applied to every op of every lane and
    rank (the copy lane, its issue points and the overlapped pairs too), so each op waits for
    the renumbered ops it waited for before, in the same positions: the simulator's timeline is
    the same op for op, renumbered (tests/test_torch_order.py checks it). Where microbatches are not
    interchangeable (replicas, rounds, sequence chunks) a one-line ScheduleError: torch runs none
    of those."""
    name = schedule.name
    refuse_torch_shape(name, problem.pipelines, schedule.rounds, problem.seq_chunks)
    last, _, mbs = _last_forwards(schedule.ranks)
    if sorted(mbs) != list(range(problem.microbatches)) or last != problem.n_stages - 1:
        raise ScheduleError(f"{name}: stage {problem.n_stages - 1} does not run the forward of each of the"
                            f" {problem.microbatches} microbatches once: not a schedule of this problem")
    if mbs == sorted(mbs):
        return schedule
    new = {mb: k for k, mb in enumerate(mbs)}

    def lane(per_rank):
        return tuple(tuple(None if op is None else op._replace(mb=new[op.mb]) for op in ops) for ops in per_rank)

    return replace(schedule, ranks=lane(schedule.ranks), copy=lane(schedule.copy), after=lane(schedule.after),
                   pairs=lane(schedule.pairs))


def to_torch_csv(schedule: Schedule) -> str:
    """One row per rank, the rank's ops in order, no idle cells (order is all a Schedule has)."""
    refuse_asynchronous(schedule.rounds, schedule.name)
    refuse_untorchable(schedule.ops(), schedule.name)
    refuse_out_of_order(schedule.ranks, schedule.name)
    if schedule.pairs:
        raise ScheduleError(f"{schedule.name}: the schedule overlaps forward-and-backward pairs, which this export"
                            " does not write yet (torch's OVERLAP_F_B): run it with schedc's runtime")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for ops in schedule.ranks:
        writer.writerow(op.to_torch() for op in ops)
    return out.getvalue()


def torch_comms_rows(program: Program) -> list[list[str]]:
    """Per rank, the cells torch's ``_PipelineScheduleRuntime`` executes for this Program (its
    "compute_comms" format): each compute op as in ``to_torch_csv``; a SEND of an activation
    ``{s}SEND_F{mb}`` (of a gradient ``{s}SEND_B{mb}``) where the Program sends, ``s`` the sending
    stage; a RECV ``{s}RECV_F{mb}`` / ``{s}RECV_B{mb}`` where the Program posts it, ``s`` the
    receiving stage; ``{s}REDUCE_GRAD`` after stage s's last backward (W or BW) and the send that
    follows it (torch scales, and data-parallel reduces, the gradients there, as its own lowering
    does), or, where the Program holds gradient all-reduces (``AR``, data parallelism), in their
    place. Hand-offs between stages on one rank and the optimizer step have no cell: torch's
    runtime hands off inside F and B, and the caller steps."""
    name = program.header.schedule if program.header is not None else "program"
    head = program.header
    if head is not None:
        refuse_torch_shape(name, head.pipelines, head.rounds, head.sequence_chunks)
    refuse_untorchable((i.compute for instrs in program.ranks for i in instrs if isinstance(i.op, Kind)), name)
    refuse_out_of_order([[i.compute for i in instrs if isinstance(i.op, Kind)] for instrs in program.ranks], name)
    rows = []
    reduces = any(i.op is Kind.AR for instrs in program.ranks for i in instrs)
    for instrs in program.ranks:
        last_backward = {} if reduces else {i.stage: k for k, i in enumerate(instrs) if i.op in _LAST_OF_STAGE}
        row: list[str] = []
        pending: int | None = None  # a stage whose REDUCE_GRAD waits for its last backward's send
        for k, instr in enumerate(instrs):
            if pending is not None and not (instr.op is Opcode.SEND and instr.stage == pending):
                row.append(f"{pending}REDUCE_GRAD")
                pending = None
            if instr.op is Kind.AR:
                row.append(f"{instr.stage}REDUCE_GRAD")
            elif isinstance(instr.op, Kind):
                row.append(instr.compute.to_torch())
                if last_backward.get(instr.stage) == k:
                    pending = instr.stage
            elif instr.op is Opcode.SEND or instr.op is Opcode.RECV:
                row.append(f"{instr.stage}{instr.op}_{'F' if instr.tensor == 'act' else 'B'}{instr.mb}")
        if pending is not None:
            row.append(f"{pending}REDUCE_GRAD")
        rows.append(row)
    return rows


def to_torch_comms_csv(program: Program) -> str:
    """``torch_comms_rows`` as CSV: one row per rank; torch loads it with
    ``_load_csv(path, format="compute_comms")``."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(torch_comms_rows(program))
    return out.getvalue()


def write_torch_csv(schedule: Schedule | Program, path: str | os.PathLike) -> None:
    """A Schedule as the compute-only CSV, a lowered Program as the compute_comms one."""
    text = to_torch_comms_csv(schedule) if isinstance(schedule, Program) else to_torch_csv(schedule)
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise SchedcError(f"{path}: cannot write: {e.strerror or e}") from None


def from_torch_csv(text_or_path: str | os.PathLike, name: str | None = None) -> Schedule:
    """Read torch's CSV: a ``Path`` (or other path-like) is read from disk, a ``str`` is the CSV text.

    Row r is rank r. Empty cells (idle steps) are dropped. Cells that compute nothing (SEND_F,
    RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD) are skipped, so torch's lowered
    compute+comms CSV imports as its compute order. An overlapped ``(0F1;7B0)OVERLAP_F_B`` becomes
    its sub-actions in order, as torch's runtime runs them by default. Anything else (a malformed
    cell, an unknown action, a compute action without microbatch) raises SchedcError naming row,
    column and cell. The name defaults to the file's stem, or "torch-csv" for text.
    """
    if isinstance(text_or_path, os.PathLike):
        path = Path(text_or_path)
        source, name = str(path), name or path.stem
        text = read_text(path, what="torch CSV")
    else:
        text, source, name = text_or_path, "torch CSV", name or "torch-csv"
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        raise SchedcError(f"{source}: empty, expected one row of actions per rank")
    per_rank = []
    for r, row in enumerate(rows):
        ops = []
        for c, cell in enumerate(row):
            try:
                ops += _parse_cell(cell.strip())
            except ValueError as e:
                raise SchedcError(
                    f"{source}: row {r + 1} (rank {r}), column {c + 1}: {e} in cell {cell!r};"
                    f" a cell is stage, action, microbatch, e.g. 3F0 (actions F, I, W, B)"
                ) from None
        per_rank.append(ops)
    return Schedule.from_lists(name, per_rank)


def _parse_cell(cell: str) -> list[Op]:
    if not cell:
        return []
    if overlap := _OVERLAP.fullmatch(cell):
        return [op for sub in overlap.group(1).split(";") for op in _parse_cell(sub.strip())]
    match = _CELL.fullmatch(cell)
    if not match:
        raise ValueError("malformed action")
    stage, action, mb = match.groups()
    if action in NO_COMPUTE:
        return []
    if action not in FROM_TORCH:
        raise ValueError(f"unknown action {action!r}")
    if not mb:
        raise ValueError(f"action {action} needs a microbatch")
    return [Op(FROM_TORCH[action], int(stage), int(mb))]


# ---- torch's own schedules ----

# torch's name -> where torch puts stage s (its placement "style").
