"""An ablation study's config (YAML, see examples/ablation.yaml) and the grid cells it expands to.

Every mistake in a config is one line (ConfigError): a list that must not be empty is refused
when it is, a value given twice in a list is refused, and every name that refers to something
else (a schedule, a solver, a problem file, a model file, a cell in ``gantt``) must exist. A grid
of more than ``MAX_CELLS`` cells is refused unless the ceiling is raised (``max_cells``)."""

from __future__ import annotations

import difflib
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, Field, StrictInt, field_validator, model_validator

import schedc.solvers as solvers
from schedc.errors import ConfigError
from schedc.inputs import read_data, refuse_unsafe_name, safe_filename, shorten
from schedc.problem import LARGEST, Boundary, Offload, Problem, Recompute
from schedc.solvers.search.common import BACKENDS

OWN_LIMIT = "own"  # memory-axis value of a grid without one: each problem keeps its own limit
# The policies axis (issue 25, memory for time): which of the problem's recompute / offload sections
# a cell declares. none: neither; recompute: full recompute (R) only; selective: recompute with its
# selective part (R and S); offload: offload only (O, L); all: every section there is.
POLICY_VALUES = ("none", "recompute", "selective", "offload", "all")
# The most cells a study runs unless asked for more (``schedc ablate --max-cells``, ``run(max_cells=)``):
# each cell simulates every schedule and, with ``ilp``, solves for up to the time limit.
MAX_CELLS = 1000
SafeName = Annotated[str, AfterValidator(refuse_unsafe_name)]


def _each_once(values: list) -> list:
    """A list of names or axis values: not empty, nothing twice."""
    if not values:
        raise ValueError("empty: give at least one value, or leave the field out")
    seen: list = []
    for v in values:
        if v in seen:
            raise ValueError(f"{shorten(v)} is given twice: give each value once")
        seen.append(v)
    return values


def _each_once_or_none(values: list) -> list:
    """``gantt``: nothing twice; [] is allowed (no chart)."""
    return _each_once(values) if values else values


def _some_problem(entries: list) -> list:
    if not entries:
        raise ValueError("empty: give at least one problem (file:, problem: or profile:)")
    return entries


def _did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _axis(kind: Any) -> Any:
    """An optional axis of the grid: a list of ``kind``, not empty, each value once."""
    return Optional[Annotated[list[kind], AfterValidator(_each_once)]]


Count = Annotated[StrictInt, Field(ge=1)]
Amount = Annotated[float, Field(ge=0, le=LARGEST, allow_inf_nan=False)]
Factor = Annotated[float, Field(gt=0, le=LARGEST, allow_inf_nan=False)]


class _Strict(Boundary):
    """The config's models: bad data raises ConfigError with one line (see Boundary)."""

    _error = ConfigError
    _source = "ablation config"


class Grid(_Strict):
    """Axes; each given axis replaces that field of every problem. Unset axes keep the problem's."""

    ranks: _axis(Annotated[StrictInt, Field(ge=1, le=4096)]) = None
    microbatches: _axis(Count) = None
    microbatches_per_rank: _axis(Count) = Field(default=None, description="m = this x ranks (needs the ranks axis)")
    chunks: _axis(Annotated[StrictInt, Field(ge=1, le=64)]) = None
    placement: _axis(Literal["loop", "v"]) = None
    comm: _axis(Amount) = None
    memory: _axis(Optional[Factor]) = Field(
        default=None,
        description="x 1F1B's activation memory; null: no limit (without this axis: each problem's own limit)",
    )
    objective: _axis(Literal["makespan", "span", "steady"]) = None
    policies: _axis(Literal[POLICY_VALUES]) = Field(  # type: ignore[valid-type]
        default=None,
        description="which recompute / offload sections each cell declares: none, recompute (full), selective"
        " (full and selective), offload, all (the config's recompute: and offload:, else the problem's own)",
    )

    @model_validator(mode="after")
    def _one_m(self) -> "Grid":
        if self.microbatches is not None and self.microbatches_per_rank is not None:
            raise ValueError("give microbatches or microbatches_per_rank, not both")
        if self.microbatches_per_rank is not None and self.ranks is None:
            raise ValueError("microbatches_per_rank needs the ranks axis (m = microbatches_per_rank x ranks)")
        return self

    def axes(self) -> dict[str, list]:
        """The given axes in cell order; memory always (``[OWN_LIMIT]`` without the axis)."""
        axes = {k: v for k, v in (
            ("ranks", self.ranks), ("microbatches", self.microbatches),
            ("microbatches_per_rank", self.microbatches_per_rank), ("chunks", self.chunks),
            ("placement", self.placement), ("comm", self.comm), ("objective", self.objective),
            ("policies", self.policies),
        ) if v is not None}
        axes["memory"] = self.memory if self.memory is not None else [OWN_LIMIT]
        return axes


class ProblemEntry(_Strict):
    """One of: ``file`` (a problem file), ``problem`` (inline fields), ``profile`` (a model,
    FILE.py:FUNCTION, profiled at each cell's ranks, chunks and microbatches)."""

    name: Optional[SafeName] = None
    file: Optional[str] = None
    problem: Optional[dict[str, Any]] = None
    profile: Optional[str] = None
    heavy_first: Factor = Field(default=1.0, description="multiply stage 0's F, B, W by this")
    heavy_last: Factor = Field(default=1.0, description="multiply the last stage's F, B, W by this")
    grid: Optional[Grid] = Field(default=None, description="this problem's own grid instead of the config's")

    @model_validator(mode="after")
    def _one_source(self) -> "ProblemEntry":
        given = [k for k in ("file", "problem", "profile") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of file, problem, profile (got {', '.join(given) or 'none'})")
        if self.profile is not None:
            where, colon, func = self.profile.rpartition(":")
            if not (colon and where and func.isidentifier()):
                raise ValueError(f"profile: expected FILE.py:FUNCTION or MODULE:FUNCTION, got {shorten(self.profile)}")
        return self

    @property
    def label(self) -> str:
        """The entry's name in cell ids and file names (a safe file name)."""
        if self.name:
            return self.name
        if self.file:
            return safe_filename(Path(self.file).stem)
        if self.profile:
            return safe_filename(Path(self.profile.split(":")[0]).stem)
        return safe_filename(str(self.problem.get("name") or "inline"))


class SolverSettings(_Strict):
    time_limit: float = Field(default=30.0, gt=0, le=LARGEST, allow_inf_nan=False)
    gap: float = Field(default=1e-4, ge=0, le=1, allow_inf_nan=False)
    solver: str = Field(default="auto", description="a search backend: cbc, highs, cpsat, or auto (cpsat where the"
                        " problem has policies and OR-Tools is installed, else cbc)")
    threads: Optional[StrictInt] = Field(default=None, ge=1)

    @field_validator("solver")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in BACKENDS:
            raise ValueError(f"unknown solver {shorten(name)}{_did_you_mean(name, list(BACKENDS))};"
                             f" known: {', '.join(BACKENDS)}")
        return name


class Execute(_Strict):
    """Run profiled cells with the runtime (gloo, local processes): the measured iteration time."""

    steps: StrictInt = Field(default=6, ge=1)
    warmup: StrictInt = Field(default=2, ge=0)
    max_ranks: StrictInt = Field(default=4, ge=1, description="cells with more ranks are only simulated")


class AblationConfig(_Strict):
    name: SafeName = "ablation"
    problems: Annotated[list[ProblemEntry], AfterValidator(_some_problem)]
    grid: Grid = Grid()
    schedules: Optional[Annotated[list[str], AfterValidator(_each_once)]] = Field(
        default=None, description="registry names and 'ilp', each once (default: all)")
    solver: SolverSettings = SolverSettings()
    execute: Optional[Execute] = Field(default=None, description="run the profiled cells (needs a profile: entry)")
    gantt: Optional[Annotated[list[str], AfterValidator(_each_once_or_none)]] = Field(
        default=None, description="cell ids to draw, each once; [] draws none (default: the largest speed-up)")
    recompute: Optional[Recompute] = Field(
        default=None, description="the recompute section (as in a problem file) the policies axis declares;"
        " default the problem's own, else time = F and keep = 0")
    offload: Optional[Offload] = Field(
        default=None, description="the offload section (as in a problem file) the policies axis declares;"
        " default the problem's own")

    @model_validator(mode="after")
    def _references(self) -> "AblationConfig":
        known = [*solvers.SEARCHES, *solvers.REGISTRY]
        for name in self.schedules or []:
            if name not in known:
                raise ValueError(f"schedules: unknown schedule {shorten(name)}{_did_you_mean(name, known)};"
                                 f" known: {', '.join(known)}")
        if self.execute is not None and not any(e.profile for e in self.problems):
            raise ValueError("execute: no problem has a profile: entry, and only profiled cells are run:"
                             " add one, or remove execute")
        for i, entry in enumerate(self.problems):  # what an inline problem lacks is known now
            values = (entry.grid or self.grid).policies or []
            own = entry.problem or {}
            if entry.problem is None:
                continue
            if {"offload", "all"} & set(values) and self.offload is None and own.get("offload") is None:
                raise ValueError(f"problems[{i}]: the policies axis has offload, but neither the config nor the"
                                 " problem gives an offload section: add offload: {time: ...} to the config")
            recompute = self.sections().get("recompute") or own.get("recompute") or {}
            if "selective" in values and not (isinstance(recompute, dict) and recompute.get("selective") is not None):
                raise ValueError(f"problems[{i}]: the policies axis has selective, but neither the config nor the"
                                 " problem gives recompute.selective: add recompute: {selective: {time: ..., keep:"
                                 " ...}} to the config")
        return self

    def sections(self) -> dict[str, dict]:
        """The config's recompute / offload sections as problem-file data (those it gives)."""
        return {name: section.model_dump(exclude_none=True) for name in ("recompute", "offload")
                if (section := getattr(self, name)) is not None}


def load_config(path: str | Path, max_cells: int = MAX_CELLS) -> AblationConfig:
    """Read and check a config: its fields, every file and cell it names, and its size (``plan``)."""
    path = Path(path)
    data = read_data(path, what="ablation config", fmt="yaml", error=ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields")
    config = AblationConfig.validated(data, str(path))
    base = path.parent
    for i, entry in enumerate(config.problems):  # files are relative to the config (or to the working directory)
        if entry.file:
            if not Path(entry.file).exists() and (base / entry.file).exists():
                entry.file = str(base / entry.file)
            if not Path(entry.file).is_file():
                raise ConfigError(f"{path}: problems[{i}].file: no file {shorten(entry.file)} (a relative path is"
                                  " read from the config's folder or the working directory)")
        if entry.profile:
            where, _, func = entry.profile.rpartition(":")
            if where.endswith(".py"):
                if not Path(where).exists() and (base / where).exists():
                    where = str(base / where)
                    entry.profile = f"{where}:{func}"
                if not Path(where).is_file():
                    raise ConfigError(f"{path}: problems[{i}].profile: no file {shorten(where)} (a relative path is"
                                      " read from the config's folder or the working directory)")
    try:
        plan(config, max_cells)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return config


@dataclass
class Cell:
    id: str
    entry: ProblemEntry
    values: dict[str, Any]  # the grid values of this cell
    problem: Problem | None = None  # None: skipped (see reason)
    reason: str = ""
    sections: dict[str, dict] = field(default_factory=dict)  # the config's recompute / offload, for the policies axis


def count_cells(config: AblationConfig) -> int:
    """How many cells the grid has, without expanding it."""
    return sum(math.prod(len(v) for v in (entry.grid or config.grid).axes().values()) for entry in config.problems)


def plan(config: AblationConfig, max_cells: int = MAX_CELLS) -> list[Cell]:
    """The cells to run (``expand``). Refused (ConfigError): more than ``max_cells`` cells (before
    any is expanded), two cells with one id (they would write the same files), and a ``gantt``
    entry that names no cell."""
    n = count_cells(config)
    if n > max_cells:
        shape = "; ".join(
            f"{entry.label}: " + " x ".join(f"{len(v)} {k}" for k, v in (entry.grid or config.grid).axes().items()
                                            if v != [OWN_LIMIT])
            for entry in config.problems[:2]) + ("; ..." if len(config.problems) > 2 else "")
        raise ConfigError(
            f"the grid has {n} cells ({shape[:100]}), above the ceiling of {max_cells}:"
            f" remove axis values, or raise the ceiling (schedc ablate --max-cells {n}; run(..., max_cells={n}))"
        )
    cells = expand(config)
    owner: dict[str, int] = {}  # cell id -> the index of its problem entry
    for cell in cells:
        i = next(k for k, e in enumerate(config.problems) if e is cell.entry)
        if cell.id in owner:
            j = owner[cell.id]
            if i != j:
                raise ConfigError(f"two cells have the id {shorten(cell.id)} (problems[{j}] and problems[{i}]):"
                                  " give each problem its own name")
            raise ConfigError(f"two cells of problems[{i}] have the id {shorten(cell.id)}: two of its grid values"
                              " are written the same in cell ids; make them differ more")
        owner[cell.id] = i
    for name in config.gantt or []:
        if name not in owner:
            ids = list(owner)
            shown = ", ".join(ids[:5]) + (f", ... ({len(ids)} cells)" if len(ids) > 5 else "")
            raise ConfigError(f"gantt: no cell {shorten(name)}{_did_you_mean(name, ids)}; the cells are {shown}")
    return cells


def expand(config: AblationConfig) -> list[Cell]:
    """The grid's cells, in config order: problems outermost, then the axes as listed in Grid."""
    cells = []
    for entry in config.problems:
        axes = (entry.grid or config.grid).axes()
        for combo in itertools.product(*axes.values()):
            values = dict(zip(axes, combo))
            cells.append(Cell(_cell_id(entry.label, values), entry, values, sections=config.sections()))
    return cells


def _cell_id(label: str, v: dict) -> str:
    parts = [label]
    for key, short in (("ranks", "p"), ("microbatches", "m"), ("microbatches_per_rank", "mr"), ("chunks", "v"),
                       ("placement", ""), ("comm", "comm"), ("objective", ""), ("policies", "")):
        if key in v:
            parts.append(f"{short}{v[key]}")
    if v["memory"] is not OWN_LIMIT:
        parts.append("mem-" if v["memory"] is None else f"mem{v['memory']:g}")
    return safe_filename("-".join(parts))
