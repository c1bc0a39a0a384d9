"""The schedule file and its in-memory form, CompiledSchedule: one JSON document with everything
the runtime needs, never pickled.

    {"format": "schedc.schedule", "version": 1,
     "provenance": {"schedc": ..., "command": ..., "created": ...},
     "problem": {...}, "schedule": {"name": ..., "ranks": [[["F", stage, mb], ...], ...]},
     "program": [[{"op": "F", "stage": 0, "mb": 0}, {"op": "SEND", ...}, ...], ...],
     "timeline": {makespan, span, bubble, peak memory, ...}, "solver": {...} or null}

Versions. Version 1 holds the ops F, B, W and BW on one compute lane per rank. Version 2 (issue 25,
memory for time) adds the recompute ops R and S to the compute lane, the copy lane of the
offloads O and reloads L (``"schedule": {..., "copy": [[["O", stage, mb], ...], ...]}``, one list
per rank) and, in ``timeline``, ``"policies"``: how many (stage, microbatch) recompute, recompute
selectively and offload (``Schedule.policy_counts``). Version 3 adds, beside the copy lane, the
compute op each copy op is issued after (``"after": [[["F", stage, mb] or null, ...], ...]``,
``Schedule.after``): a reload can then wait until just before its backward. Version 4 (issue 26)
adds the problem's ``data_parallel`` section and the program's gradient all-reduces ``AR``,
issued where ``schedule.comm_lane`` issues them (the schedule itself lists no reduce). Version 5
(issue 26) adds the problem's ``replicas`` section (bidirectional pipelines: stages of every
pipeline, microbatches per pipeline) and the program's replica gradient sums ``RS``, the
problem's ``tied`` section and the program's tied-weight gradient sums ``TS``, the
problem's ``costs.FB`` and the schedule's overlapped pairs (``"pairs"``: per rank, the backwards
run overlapped with the forward before them). A schedule
is written in the oldest version that holds it, byte for byte as before: without recompute or
offload as version 1, so that a schedc from before version 2 still reads it; with recompute only
as version 2; with a copy lane as version 3; with data parallelism as version 4; with replicas as
version 5; asynchronous (``"rounds"`` above 1 and ``"synchronous": false`` in "schedule": weight
versions, PipeDream-2BW, issue 27; its program steps each stage per round, ``UPDATE``), or with the
problem's ``objective: steady``, ``memory.weights`` or ``sequence_chunks`` (Seq1F1B: an op's
microbatch is a chunk of a sequence), as version 6. An older schedc
refuses a newer version with "written by a newer schedc". Reading takes every version; a file that
holds what its version cannot is refused. A version 2 file's copy lane is read as it was written: each copy issued as early as it can be (the
rule then), its program as it was lowered then.

Reading checks more than the shape: the schedule must be complete for the problem, the program
must be the one this schedc lowers from the schedule (which cannot deadlock: ``schedc.program``'s
notes) or else pass ``check`` (pairing, data flow, no deadlock) with the schedule's compute order, and the
timeline must be what the schedule simulates to. A file edited into an inconsistent state, a
truncated one and one from a newer schedc each fail with one line saying which.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from typing_extensions import NotRequired, TypedDict

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError

from schedc.bulk import bulk
from schedc.errors import ProgramError, SchedcError, ScheduleError, ScheduleFileError
from schedc.check import CheckReport, check
from schedc.inputs import MAX_DATA_BYTES, one_line, parse_json, read_text, shorten
from schedc.kinds import POLICIES, ROWS, Kind
from schedc.problem import Boundary, Problem, load_problem
from schedc.program import OPCODES, Header, Instr, Program, columns_of, from_columns, lower, ops_of, rank_from_data
from schedc.schedule import MAX_ROUNDS, Schedule
from schedc.simulate import Timeline, simulate
from schedc.tolerance import meets
from schedc.version import __version__

FORMAT = "schedc.schedule"
VERSION = 6  # the newest version this schedc reads and writes (see the module notes)
V1_KINDS = frozenset({Kind.F, Kind.B, Kind.W, Kind.BW})  # what a version 1 file may hold


@dataclass(frozen=True)
class CompiledSchedule:
    """What the runtime needs without solving again: the Problem (placement of stages on ranks,
    costs), the Schedule, the lowered Program (``program.for_rank(r)``), the simulated Timeline,
    solver statistics and provenance. ``schedc.compile`` makes one, ``schedc.load`` reads one."""

    problem: Problem
    schedule: Schedule
    program: Program
    timeline: Timeline
    solver: dict[str, Any] | None  # the ILP's statistics; None for a named schedule
    provenance: dict[str, str]  # schedc version, command, created (UTC, ISO 8601)
    # What ``check`` found when the file was read (None: made here, or read with the very program this
    # schedc lowers from its schedule, which is not checked again; ``load(verify=True)`` always checks)
    report: CheckReport | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return self.schedule.name

    def save(self, path: str | Path) -> None:
        save(self, path)

    @classmethod
    def build(
        cls, problem: Problem, schedule: Schedule, solver: dict | None = None, command: str | None = None,
        timeline: Timeline | None = None,
    ) -> "CompiledSchedule":
        """Lower ``schedule`` (checked complete and deadlock-free by the simulator first)."""
        timeline = timeline or simulate(problem, schedule)
        provenance = {
            "schedc": __version__,
            "command": command if command is not None else _command(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        return cls(problem, schedule, lower(problem, schedule, timeline), timeline, solver, provenance)


def _command() -> str:
    """How this process was started: the schedc command line, or the Python program."""
    argv = [Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]
    return one_line(" ".join(argv), 2000)  # the file's provenance is plain text on one line


class _Strict(Boundary):
    """The file's models: bad data raises ScheduleFileError with one line (see Boundary)."""

    _error = ScheduleFileError
    _source = "schedule file"


# The names a file writes: the op kinds of schedc.kinds (a schedule's ops, compute instructions)
# and the other opcodes; loading turns them into Kind and Opcode members (Op, Instr).
KIND_NAMES = tuple(k.value for k in Kind)  # F, B, W, BW, R, S, O, L, AR
OPCODE_NAMES = tuple(o.value for o in OPCODES)  # the kinds, then SEND, RECV, LOCAL, STEP
_OPCODE_SET = frozenset(OPCODE_NAMES)
POLICY_NAMES = tuple(ROWS[k].policy for k in POLICIES)  # recompute, selective, offload


# A program's instructions are read into plain dicts that pydantic checks (a TypedDict), not a
# model object each: a file holds about 2.3 instructions per op, and model objects would hold
# several times the memory and take several times as long to build.
class InstrData(TypedDict):
    """One instruction of a rank's program: ``op`` (a compute kind, or SEND, RECV, LOCAL, STEP,
    UPDATE) and the fields it uses (stage, microbatch, tensor, peer rank, peer stage); a field
    left out is -1 ("" for tensor)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    op: Literal[OPCODE_NAMES]  # type: ignore[valid-type]
    stage: NotRequired[Annotated[int, Field(ge=-1)]]
    mb: NotRequired[Annotated[int, Field(ge=-1)]]
    tensor: NotRequired[Literal["", "act", "grad"]]
    peer: NotRequired[Annotated[int, Field(ge=-1)]]
    peer_stage: NotRequired[Annotated[int, Field(ge=-1)]]


class ScheduleModel(_Strict):
    name: str
    ranks: list[list[tuple[Literal[KIND_NAMES], int, int]]]  # type: ignore[valid-type]
    copy_lane: list[list[tuple[Literal[KIND_NAMES], int, int]]] = Field(  # type: ignore[valid-type]
        default_factory=list, alias="copy", description="version 2: per rank, the copy lane's order (offloads O, reloads L)")
    after: list[list[Optional[tuple[Literal[KIND_NAMES], int, int]]]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="version 3: per rank, aligned with copy, the compute op each copy op is"
                                          " issued after (null: before the first); left out, each as early as it can")
    pairs: list[list[tuple[Literal[KIND_NAMES], int, int]]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="version 5: per rank, the backwards run overlapped with the forward"
                                          " before them (costs.FB)")
    rounds: int = Field(default=1, ge=1, le=MAX_ROUNDS, strict=True,
                        description="version 6: rounds of the problem's microbatches the ops cover (more than 1:"
                                    " asynchronous, weight versions)")
    synchronous: bool = Field(default=True, strict=True, description="version 6: false for an asynchronous schedule")


def _plain_text(v: str) -> str:
    if not v.isprintable():
        raise ValueError(f"must be printable text on one line, got {shorten(v)}")
    return v


PlainText = Annotated[str, Field(max_length=2000), AfterValidator(_plain_text)]
Amount = Annotated[float, Field(allow_inf_nan=False)]


class Provenance(_Strict):
    schedc: PlainText
    command: PlainText
    created: PlainText


class SolverStats(_Strict):
    """The solver's statistics as ``schedc.solvers.search.solve.SolveResult.summary`` writes them; the
    figures a simulation can confirm are checked against it when the file is read."""

    status: Literal["optimal", "feasible", "time limit", "warm start"]
    objective: Amount
    objective_kind: Literal["makespan", "span", "steady"]
    bound: Amount
    bound_reason: PlainText
    gap: Amount = Field(ge=0, le=1)
    makespan: Amount
    span: Amount
    bubble: Amount
    peak_memory: list[Amount]
    fits: bool
    warm_start: PlainText
    warm_objective: Amount
    solver: PlainText
    seconds: Amount = Field(ge=0)
    binaries: int = Field(ge=0, strict=True)
    not_evaluated: list[PlainText]
    policies: Optional[dict[Literal[POLICY_NAMES], Annotated[int, Field(ge=0, strict=True)]]] = Field(  # type: ignore[valid-type]
        default=None, description="where the problem allows recompute or offload: (stage, microbatch)s per policy")


_RANK = TypeAdapter(list[InstrData])  # one rank of the file's program (``_validated``)


class ScheduleFile(_Strict):
    """The schedule file (``schedc schema`` prints this model's JSON Schema)."""

    format: Literal["schedc.schedule"]
    version: Literal[1, 2, 3, 4, 5, 6]
    provenance: Provenance
    problem: Problem
    schedule: ScheduleModel
    program: list[list[InstrData]]
    timeline: dict[str, Any] = Field(description="simulate(problem, schedule).summary() when written")
    solver: Optional[SolverStats] = Field(default=None, description="solver statistics; null for a named schedule")


def schema() -> dict:
    return ScheduleFile.model_json_schema()


@bulk
def dump(compiled) -> str:
    """The file's text: JSON, one op or instruction per line so that a person can read it."""
    compact = json.JSONEncoder(separators=(",", ":")).encode
    plain = lambda key, value: f" {json.dumps(key)}: " + json.dumps(value, indent=1).replace("\n", "\n ")  # noqa: E731

    def lines(items: list) -> list[str]:
        """Each item's compact JSON. Encoding the whole list in one call and cutting it between
        items is several times faster than one call per item (most of a large file's time); the
        cut is used only if it gives exactly one piece per item."""
        if not items:
            return []
        whole = compact(items)[1:-1]
        close, open_ = ("}", "{") if isinstance(items[0], dict) else ("]", "[")
        pieces = whole.split(f"{close},{open_}")
        if len(pieces) != len(items):
            return [compact(x) for x in items]
        if len(pieces) > 1:
            pieces = [pieces[0] + close, *(open_ + x + close for x in pieces[1:-1]), open_ + pieces[-1]]
        return pieces

    def per_rank(rows: list[list], indent: str) -> str:
        ranks = [f"{indent} [\n" + ",\n".join(f"{indent}  {x}" for x in lines(items)) + f"\n{indent} ]" for items in rows]
        return "[\n" + ",\n".join(ranks) + f"\n{indent}]"

    schedule = compiled.schedule
    version = version_of(schedule, compiled.problem)
    schedule_ranks = per_rank([[list(op) for op in ops] for ops in schedule.ranks], "  ")
    copy = ""
    if schedule.copy:
        after = [[a and list(a) for a in ops] for ops in schedule.after]
        copy = (f', "copy": {per_rank([[list(op) for op in ops] for ops in schedule.copy], "  ")},'
                f' "after": {per_rank(after, "  ")}')
    if schedule.pairs:
        copy += f', "pairs": {per_rank([[list(op) for op in ops] for ops in schedule.pairs], "  ")}'
    if not schedule.synchronous:
        copy += f', "rounds": {schedule.rounds}, "synchronous": false'
    fields = [
        plain("format", FORMAT),
        plain("version", version),
        plain("provenance", compiled.provenance),
        plain("problem", compiled.problem.model_dump(exclude_none=True)),
        f' "schedule": {{"name": {json.dumps(schedule.name)}, "ranks": {schedule_ranks}{copy}}}',
        f' "program": {per_rank(compiled.program.to_data(), " ")}',
        plain("timeline", timeline_summary(compiled.timeline, version)),
        plain("solver", compiled.solver),
    ]
    return "{\n" + ",\n".join(fields) + "\n}"


def version_of(schedule: Schedule, problem: Problem | None = None) -> int:
    """The version a file of ``schedule`` (of ``problem``) is written as: 1 without recompute or
    offload (readable by every schedc), 2 with recompute only, 3 with a copy lane (offload), 4 where
    the problem has data parallelism, 5 where it has replicas, tied weights or overlapped pairs
    (``costs.FB``), 6 for an asynchronous schedule or a problem with what version 6 adds."""
    if not schedule.synchronous or (problem is not None and _needs_six(problem)):
        return 6
    if schedule.pairs or (problem is not None and (problem.replicas is not None or problem.tied is not None
                                                   or problem.costs.FB is not None)):
        return 5
    if problem is not None and problem.data_parallel is not None:
        return 4
    if schedule.copy:
        return 3
    return 1 if all(op.kind in V1_KINDS for ops in schedule.ranks for op in ops) else 2


def _needs_six(problem: Problem) -> bool:
    """What version 6 adds to the problem: the steady objective, the weights' memory, sequence chunks."""
    return problem.objective == "steady" or problem.memory.weights is not None or problem.sequence_chunks is not None


def timeline_summary(timeline: Timeline, version: int) -> dict:
    """The file's ``timeline``: ``Timeline.summary()``, and from version 2 the schedule's policy
    counts (``Schedule.policy_counts``) under ``"policies"``."""
    summary = timeline.summary()
    return summary if version < 2 else {**summary, "policies": timeline.schedule.policy_counts()}


@bulk
def save(compiled, path: str | Path) -> None:
    """Write the schedule file whole or not at all: into a temporary file beside it, then renamed
    over it (a run stopped mid-write leaves the old file, or none); a path that is not a plain file
    (a pipe, /dev/stdout) or is a link is written directly (through the link)."""
    path = Path(path)
    text = dump(compiled) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            path.write_text(text)
            return
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        try:
            part.write_text(text)
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)
    except OSError as e:
        raise ScheduleFileError(f"{path}: cannot write: {e.strerror or e}") from None


def load_any(path: str | Path):
    """A schedule file (a JSON object with a "format" field) as a CompiledSchedule, anything else
    as a problem file (a Problem), so that commands can take either."""
    if Path(path).suffix == ".json":
        data = _read_json(Path(path))
        if isinstance(data, dict) and "format" in data:
            return from_data(data, path)
    return load_problem(path)


@bulk
def load(path: str | Path, *, verify: bool = False):
    """Read, validate and verify a schedule file; return a CompiledSchedule. Its program is
    checked in full (``check``) unless it is the one this schedc lowers from the file's schedule;
    ``verify`` checks it in full always (``schedc check``)."""
    return from_data(_read_json(Path(path)), path, verify=verify, consume=True)


def _read_json(path: Path) -> Any:
    text = read_text(path, error=ScheduleFileError, what="schedule file", max_bytes=MAX_DATA_BYTES)
    return parse_json(text, source=str(path), error=ScheduleFileError)


@bulk
def from_data(data: Any, path: str | Path = "schedule file", *, verify: bool = False, consume: bool = False):
    """Validate and verify parsed JSON; return a CompiledSchedule (``verify``: as ``load``;
    ``consume``: ``data`` may be taken apart as it is read, as ``load`` lets it, nothing else
    holding it)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ScheduleFileError(f"{path}: not a schedc schedule file (no \"format\": \"{FORMAT}\")")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ScheduleFileError(f"{path}: version must be a positive integer, got {version!r}")
    if version > VERSION:
        raise ScheduleFileError(
            f"{path}: written by a newer schedc (schedule format version {version}; this schedc"
            f" {__version__} reads version {VERSION}): upgrade schedc or write the file again"
        )
    model, stored = _validated(data, str(path), consume, columns=not verify)
    if consume:  # (the model holds its own copy: let the parsed JSON go, the caller's reference too)
        data.clear()
    del data  # (a large file's parsed JSON is most of the memory)

    problem = model.problem
    try:
        if model.schedule.after and version < 3:
            raise ScheduleError(f"schedule format version {version} cannot hold 'after' (version 3 does)")
        if model.schedule.pairs and version < 5:
            raise ScheduleError(f"schedule format version {version} cannot hold 'pairs' (version 5 does)")
        rounds, synchronous = model.schedule.rounds, model.schedule.synchronous
        if (rounds > 1 or not synchronous or _needs_six(problem)) and version < 6:
            raise ScheduleError(f"schedule format version {version} cannot hold an asynchronous schedule, the steady"
                                " objective, memory.weights or sequence_chunks (version 6 does)")
        if synchronous != (rounds == 1):
            raise ScheduleError(f"the schedule says synchronous: {str(synchronous).lower()} but runs {rounds} round(s):"
                                " a synchronous schedule runs one, an asynchronous one more; the two do not mix")
        schedule = Schedule.from_lists(model.schedule.name, model.schedule.ranks, model.schedule.copy_lane,
                                       model.schedule.after, model.schedule.pairs, rounds)
    except ScheduleError as e:
        raise ScheduleFileError(f"{path}: inconsistent: {e}") from None
    for section, needs in (("data_parallel", 4), ("replicas", 5)):
        if getattr(problem, section) is not None and version < needs:
            raise ScheduleFileError(f"{path}: inconsistent: schedule format version {version} cannot hold a problem"
                                    f" with {section} (version {needs} does): write the file again with this schedc")
    if version_of(schedule) > version and not (version == 2 and schedule.copy):  # (2: a copy lane as it was)
        newer = next((op for op in schedule.ops() if op.kind not in V1_KINDS), None)
        what = f"op {newer}" if newer is not None else "a copy lane"
        raise ScheduleFileError(
            f"{path}: inconsistent: schedule format version {version} cannot hold {what} (recompute and offload"
            f" need version {version_of(schedule)}): write the file again with this schedc"
        )
    stored_timeline = model.timeline
    solver = None if model.solver is None else model.solver.model_dump(exclude_none=True)  # (policies only where given)
    provenance = model.provenance.model_dump()
    del model  # (its program's instructions, once read, are the next largest part)
    try:
        timeline = simulate(problem, schedule)
        program, report = None if verify else _lowered(problem, schedule, timeline, stored), None
        if program is None:
            program = Program(tuple(map(_instrs, stored)), Header.of(problem, schedule))
            del stored
            report = check(problem, program, schedule, issue=version >= 3)
    except (ScheduleError, ProgramError) as e:
        raise ScheduleFileError(f"{path}: inconsistent: {e}") from None
    summary = timeline_summary(timeline, version)
    _same(path, "timeline", stored_timeline, summary, keys=summary)
    if solver is not None:
        _same_solver(path, solver, timeline)
    return CompiledSchedule(problem, schedule, program, timeline, solver, provenance, report)


def _validated(data: dict, path: str, consume: bool, columns: bool) -> tuple[ScheduleFile, tuple[Stored, ...]]:
    """The file's model and its program's ranks, validated (``Stored``: with ``columns``, those
    as written kept as columns, to compare with the lowered program; else all as instructions). The
    program, most of a large file, is validated a rank at a time after the rest, and with
    ``consume`` each rank's parsed dicts go once read, so that the parsed file, its validated copy
    and the instructions are never all held whole (an error is located in the file as the model's
    own would be)."""
    program = data.get("program")
    if not (isinstance(program, list) and all(isinstance(rank, list) for rank in program)):
        model = ScheduleFile.validated(data, path)
        return model, tuple(map(rank_from_data, model.program))
    model = ScheduleFile.validated({**data, "program": []}, path)
    ranks = []
    for r in range(len(program)):
        try:
            rank = _as_written(program[r])
            if rank is None:
                rank = rank_from_data(_RANK.validate_python(program[r]))
            ranks.append(rank if columns else _instrs(rank))
        except ValidationError as e:  # (located as in the whole file)
            raise ScheduleFile._one_line(ValidationError.from_exception_data(e.title, [
                {"type": err["type"], "loc": ("program", r, *err["loc"]), "input": err["input"],
                 **({"ctx": err["ctx"]} if "ctx" in err else {})} for err in e.errors()]), path) from None
        if consume:
            program[r] = None
    return model, tuple(ranks)


_FIELDS = frozenset(InstrData.__annotations__)
_TENSORS = frozenset({"", "act", "grad"})


# One rank of a file's program as read: its instructions, or where they are as ``Program.to_data``
# writes them, their columns (``program.columns_of``), turned into instructions only where the
# program is not the one this schedc lowers (``_lowered`` compares columns).
Stored = tuple[Instr, ...] | list[list]


def _as_written(instrs: Any) -> list[list] | None:
    """One rank of the file's program, read field by field at C speed where every instruction is
    as ``Program.to_data`` writes one (a dict of InstrData's fields with "op", names it knows, ints
    from -1, a tensor it knows): its columns; None for anything else, which the model then
    validates (and refuses, or reads as it reads any input). A large file's program is a million
    such dicts."""
    if not isinstance(instrs, list) or not set(map(type, instrs)) <= {dict} or not set().union(*instrs) <= _FIELDS:
        return None
    try:
        columns = columns_of(instrs)
        names, stage, mb, tensor, peer, peer_stage = columns
        if not (set(names) <= _OPCODE_SET and set(tensor) <= _TENSORS):
            return None
    except (KeyError, TypeError):  # (an instruction without "op", or a value that is no name)
        return None
    for numbers in (stage, mb, peer, peer_stage):
        if not set(map(type, numbers)) <= {int} or min(numbers, default=0) < -1:
            return None
    return columns


def _instrs(rank: Stored) -> tuple[Instr, ...]:
    """A stored rank's instructions (built from its columns where it holds those)."""
    return rank if isinstance(rank, tuple) else from_columns(rank)


def _same_rank(lowered: tuple[Instr, ...], rank: Stored) -> bool:
    """Whether a lowered rank's instructions are the file's (compared column by column where the
    file's are columns: the instructions are not built)."""
    if isinstance(rank, tuple):
        return lowered == rank
    names, *fields = rank
    if not names or len(lowered) != len(names):  # (an empty rank has no columns to unzip)
        return len(lowered) == len(names)
    ops, *mine = zip(*lowered)
    return list(ops) == ops_of(names) and all(map(_same_column, mine, fields))


def _same_column(mine: tuple, theirs: list) -> bool:
    return list(mine) == theirs


def _lowered(problem: Problem, schedule: Schedule, timeline: Timeline, stored: tuple[Stored, ...]) -> Program | None:
    """The program this schedc lowers ``schedule`` to, if the file's program (``stored``) is
    exactly that one, else None. Such a program needs no check: a lowered program cannot deadlock
    for any schedule that simulates (the argument in ``schedc.program``'s notes; the property tests
    check lowered programs of every registry schedule and of random policies). Any other program
    (edited, or lowered by another version of schedc) is checked in full."""
    try:
        program = lower(problem, schedule, timeline)
    except SchedcError:  # (a schedule compile would not lower: the check names what is wrong)
        return None
    same = len(program.ranks) == len(stored) and all(map(_same_rank, program.ranks, stored))
    return program if same else None


def _same(path, field: str, stored: dict, actual: dict, keys) -> None:
    """Each of ``keys`` in ``stored`` must be what the schedule simulates to (edited by hand?),
    and ``stored`` may hold no other keys where ``keys`` is the whole summary."""
    if keys is actual:
        extra = sorted(set(stored) - set(actual))
        if extra:
            raise ScheduleFileError(f"{path}: {field} has unknown fields {shorten(extra)}")
    for key in keys:
        want, got = actual[key], stored.get(key)
        if not _close(got, want):
            raise ScheduleFileError(
                f"{path}: inconsistent: {field}.{key} is {shorten(got)} but the schedule simulates to"
                f" {shorten(want)} on the file's problem (was the file edited?)"
            )


def _same_solver(path, stats: dict, timeline) -> None:
    """The solver's statistics against the simulation: its figures are the schedule's, its
    objective is the problem's, its bound and gap agree with each other and the objective."""
    problem = timeline.problem
    if stats["objective_kind"] != problem.objective:
        raise ScheduleFileError(
            f"{path}: inconsistent: solver.objective_kind is {stats['objective_kind']!r} but the problem's"
            f" objective is {problem.objective!r}"
        )
    actual = {"objective": timeline.objective_value(),
              "makespan": timeline.makespan, "span": timeline.span, "bubble": timeline.bubble_rate(),
              "peak_memory": list(timeline.peak_memory), "fits": timeline.fits}
    if "policies" in stats:  # the counts the solver reported, for the policies it names
        counts = timeline.schedule.policy_counts()
        actual["policies"] = {policy: counts[policy] for policy in stats["policies"]}
    _same(path, "solver", stats, actual, keys=list(actual))
    objective, bound = stats["objective"], stats["bound"]
    tol = problem.time_tol
    if tol.lt(objective, bound):
        raise ScheduleFileError(f"{path}: inconsistent: solver.bound {bound:g} is above the objective {objective:g}")
    if tol.lt(stats["warm_objective"], objective):
        raise ScheduleFileError(
            f"{path}: inconsistent: solver.objective {objective:g} is worse than its warm start's"
            f" {stats['warm_objective']:g} (the solver never returns worse)"
        )
    gap = (objective - bound) / objective if objective > 0 else 0.0
    if not math.isclose(stats["gap"], gap, rel_tol=1e-6, abs_tol=1e-9):
        raise ScheduleFileError(f"{path}: inconsistent: solver.gap is {stats['gap']:g}, but its objective and bound give {gap:g}")
    if stats["status"] == "optimal" and not meets(objective, bound):
        raise ScheduleFileError(f"{path}: inconsistent: solver.status is optimal with a gap of {gap:.2%}")


def _close(a: Any, b: Any) -> bool:
    if isinstance(b, bool) or isinstance(a, bool):
        return a is b
    if b is None or a is None:
        return a is b
    if isinstance(b, str):
        return a == b
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in b)
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
