"""torch.distributed.pipelining's compute-only CSV format, read and written without torch.

torch writes a schedule as CSV with one row per rank and one cell per action,
``{stage}{action}{microbatch}``: ``3F0`` is the forward of stage 3 on microbatch 0. Actions map as

    schedc  F  B (input gradient)  W (weight gradient)  BW (fused backward)
    torch   F  I                   W                    B

An empty cell is an idle step. Reading and writing CSV is our own code and needs no torch;
torch's own schedules are built in ``schedc.runtime.torch_schedules`` (it imports torch).
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path

from schedc.errors import SchedcError
from schedc.inputs import read_text
from schedc.schedule import Op, Schedule

TO_TORCH = {"F": "F", "B": "I", "W": "W", "BW": "B"}
FROM_TORCH = {t: k for k, t in TO_TORCH.items()}
# torch actions that compute nothing: communication, FSDP unshard/reshard, data-parallel grad reduction.
NO_COMPUTE = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"}
_CELL = re.compile(r"(\d+)([A-Z_]+)(\d*)")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")


# ---- CSV ----


def to_torch_csv(schedule: Schedule) -> str:
    """One row per rank, the rank's ops in order, no idle cells (order is all a Schedule has)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for ops in schedule.ranks:
        writer.writerow(f"{op.stage}{TO_TORCH[op.kind]}{op.mb}" for op in ops)
    return out.getvalue()


def write_torch_csv(schedule: Schedule, path: str | os.PathLike) -> None:
    try:
        Path(path).write_text(to_torch_csv(schedule))
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
