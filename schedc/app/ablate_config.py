"""An ablation study's config (YAML, see examples/ablation.yaml) and the grid cells it expands to."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

import schedc.solvers as solvers
from schedc.errors import SchedcError
from schedc.inputs import read_data, refuse_unsafe_name, safe_filename, shorten
from schedc.problem import Problem, format_validation_error
from schedc.solvers.common import BACKENDS

OWN_LIMIT = "own"  # memory-axis value of a grid without one: each problem keeps its own limit
SafeName = Annotated[str, AfterValidator(refuse_unsafe_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Grid(_Strict):
    """Axes; each given axis replaces that field of every problem. Unset axes keep the problem's."""

    ranks: Optional[list[int]] = None
    microbatches: Optional[list[int]] = None
    microbatches_per_rank: Optional[list[int]] = Field(default=None, description="m = this x ranks")
    chunks: Optional[list[int]] = None
    placement: Optional[list[Literal["loop", "v"]]] = None
    comm: Optional[list[float]] = None
    memory: Optional[list[Optional[float]]] = Field(
        default=None,
        description="x 1F1B's activation memory; null: no limit (without this axis: each problem's own limit)",
    )
    objective: Optional[list[Literal["makespan", "span"]]] = None

    @model_validator(mode="after")
    def _one_m(self) -> "Grid":
        if self.microbatches is not None and self.microbatches_per_rank is not None:
            raise ValueError("give microbatches or microbatches_per_rank, not both")
        return self


class ProblemEntry(_Strict):
    """One of: ``file`` (a problem file), ``problem`` (inline fields), ``profile`` (a model,
    FILE.py:FUNCTION, profiled at each cell's ranks, chunks and microbatches)."""

    name: Optional[SafeName] = None
    file: Optional[str] = None
    problem: Optional[dict[str, Any]] = None
    profile: Optional[str] = None
    heavy_first: float = Field(default=1.0, gt=0, description="multiply stage 0's F, B, W by this")
    heavy_last: float = Field(default=1.0, gt=0, description="multiply the last stage's F, B, W by this")
    grid: Optional[Grid] = Field(default=None, description="this problem's own grid instead of the config's")

    @model_validator(mode="after")
    def _one_source(self) -> "ProblemEntry":
        given = [k for k in ("file", "problem", "profile") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of file, problem, profile (got {', '.join(given) or 'none'})")
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
    time_limit: float = Field(default=30.0, gt=0)
    gap: float = Field(default=1e-4, ge=0, le=1)
    solver: str = Field(default="cbc", description="a search backend: cbc, highs, cpsat")
    threads: Optional[int] = Field(default=None, ge=1)


class Execute(_Strict):
    """Run profiled cells with the runtime (gloo, local processes): the measured iteration time."""

    steps: int = Field(default=6, ge=1)
    warmup: int = Field(default=2, ge=0)
    max_ranks: int = Field(default=4, ge=1, description="cells with more ranks are only simulated")


class AblationConfig(_Strict):
    name: SafeName = "ablation"
    problems: list[ProblemEntry] = Field(min_length=1)
    grid: Grid = Grid()
    schedules: Optional[list[str]] = Field(default=None, description="registry names and 'ilp' (default: all)")
    solver: SolverSettings = SolverSettings()
    execute: Optional[Execute] = None
    gantt: Optional[list[str]] = Field(default=None, description="cell ids to draw (default: the largest speed-up)")


def load_config(path: str | Path) -> AblationConfig:
    path = Path(path)
    data = read_data(path, what="ablation config", fmt="yaml")
    if not isinstance(data, dict):
        raise SchedcError(f"{path}: expected a mapping of fields")
    try:
        config = AblationConfig.model_validate(data)
    except ValidationError as e:
        raise SchedcError(f"{path}: {format_validation_error(e, AblationConfig)}") from None
    if config.solver.solver not in BACKENDS:
        raise SchedcError(f"{path}: solver.solver: unknown solver {shorten(config.solver.solver)}; known: {', '.join(BACKENDS)}")
    for name in config.schedules or []:
        if name not in solvers.SEARCHES and name not in solvers.REGISTRY:
            raise SchedcError(f"{path}: schedules: unknown schedule {shorten(name)};"
                              f" known: {', '.join([*solvers.SEARCHES, *solvers.REGISTRY])}")
    base = path.parent
    for entry in config.problems:  # files are relative to the config (or to the working directory)
        if entry.file and not Path(entry.file).exists():
            entry.file = str(base / entry.file)
        if entry.profile:
            where, _, func = entry.profile.rpartition(":")
            if where.endswith(".py") and not Path(where).exists() and (base / where).exists():
                entry.profile = f"{base / where}:{func}"
    return config


@dataclass
class Cell:
    id: str
    entry: ProblemEntry
    values: dict[str, Any]  # the grid values of this cell
    problem: Problem | None = None  # None: skipped (see reason)
    reason: str = ""


def expand(config: AblationConfig) -> list[Cell]:
    """The grid's cells, in config order: problems outermost, then the axes as listed in Grid."""
    cells = []
    for entry in config.problems:
        g = entry.grid or config.grid
        axes = {k: v for k, v in (
            ("ranks", g.ranks), ("microbatches", g.microbatches), ("microbatches_per_rank", g.microbatches_per_rank),
            ("chunks", g.chunks), ("placement", g.placement), ("comm", g.comm), ("objective", g.objective),
        ) if v is not None}
        axes["memory"] = g.memory if g.memory is not None else [OWN_LIMIT]
        for combo in itertools.product(*axes.values()):
            values = dict(zip(axes, combo))
            cells.append(Cell(_cell_id(entry.label, values), entry, values))
    return cells


def _cell_id(label: str, v: dict) -> str:
    parts = [label]
    for key, short in (("ranks", "p"), ("microbatches", "m"), ("microbatches_per_rank", "mr"), ("chunks", "v"),
                       ("placement", ""), ("comm", "comm"), ("objective", "")):
        if key in v:
            parts.append(f"{short}{v[key]}")
    if v["memory"] is not OWN_LIMIT:
        parts.append("mem-" if v["memory"] is None else f"mem{v['memory']:g}")
    return safe_filename("-".join(parts))
