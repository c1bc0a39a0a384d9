"""Ablation studies: solved vs heuristic schedules over a grid, as ``schedc ablate CONFIG`` runs them.

A config (YAML) names problems (problem files, inline problems, or models to profile), a grid of
ranks / microbatches / chunks / placement / latency / memory limits / objective, the schedules
to compare (registry names and ``ilp``), the solver settings, and optionally execution with the
runtime. Every cell is simulated; profiled cells can also be run. The report folder gets:

- ``results.csv``: one row per (cell, schedule);
- ``summary.md``: per cell, the solved schedule against the best heuristic that fits and 1F1B;
- ``frontier.png``: bubble against memory limit per schedule (the memory / throughput frontier);
- ``speedup.png``: the solved schedule's speed-up over the best heuristic across the grid;
- ``gantt-CELL.png``: the solved and the best heuristic schedule of chosen cells;
- ``problems/CELL.yaml`` and ``schedules/CELL-ilp.json``: each cell's problem and solved schedule,
  so that any row can be checked with ``schedc simulate``.

Memory limits are given as multiples of 1F1B's activation memory: ``x`` means every rank may
hold its static memory plus x times p microbatches of its own activations (what 1F1B's first
rank holds), so 1.0 is 1F1B's budget and ``null`` is no limit.
"""

from __future__ import annotations

import csv
import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

import schedc.solvers as solvers
from schedc.app.plot import draw_frontier, draw_gantt, draw_speedup
from schedc.app.results import ILP, Row, best_heuristic, outcome
from schedc.errors import ProblemError, SchedcError
from schedc.inputs import read_data, refuse_unsafe_name, safe_filename, shorten
from schedc.problem import Problem, format_validation_error, load_problem
from schedc.schedfile import CompiledSchedule
from schedc.simulate import Timeline
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


def build_problem(cell: Cell, profiler: Callable[[ProblemEntry, dict], Problem] | None = None) -> Problem:
    """The cell's Problem: the entry's problem with the grid values, heavy ends and memory limit."""
    entry, v = cell.entry, dict(cell.values)
    if "microbatches_per_rank" in v:
        ranks = v.get("ranks")
        if ranks is None:
            raise SchedcError("microbatches_per_rank needs the ranks axis")
        v["microbatches"] = v.pop("microbatches_per_rank") * ranks
    factor = v.pop("memory")
    if entry.profile:
        if profiler is None:
            raise SchedcError(f"{cell.id}: profiled problems need a profiler")
        base = profiler(entry, v)
    else:
        base = load_problem(entry.file) if entry.file else Problem.parse(entry.problem, source=entry.label)
    data = base.model_dump(exclude_none=True)
    data.update(v)
    data["name"] = cell.id
    n = data.get("ranks", base.ranks) * data.get("chunks", base.chunks)
    if entry.heavy_first != 1 or entry.heavy_last != 1:
        for kind in ("F", "B", "W"):
            costs = data["costs"][kind]
            costs = list(costs) if isinstance(costs, list) else [costs] * n
            costs[0] *= entry.heavy_first
            costs[-1] *= entry.heavy_last
            data["costs"][kind] = costs
    if factor is not OWN_LIMIT:  # the memory axis replaces the problem's own limit
        data.get("memory", {}).pop("limit", None)
    problem = Problem.parse(data, source=cell.id)
    if factor is not None and factor is not OWN_LIMIT:
        limit = [st + factor * problem.ranks * a for st, a in zip(problem.static_memory, _per_microbatch(problem))]
        problem = problem.with_changes(memory={"limit": limit})
    return problem


def run(config: AblationConfig, out_dir: str | Path, progress: Callable[[str], None] | None = None) -> list[Row]:
    """Run every cell, write the report folder, return the rows."""
    say = progress or (lambda msg: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = expand(config)
    profiler = _Profiler(say) if any(c.entry.profile for c in cells) else None
    rows: list[Row] = []
    timelines: dict[str, dict[str, Timeline]] = {}
    start = time.perf_counter()
    for k, cell in enumerate(cells, 1):
        try:
            cell.problem = build_problem(cell, profiler)
        except (ProblemError, ValueError) as e:
            cell.reason = str(e)
            say(f"[{k}/{len(cells)}] {cell.id}: skipped: {e}")
            continue
        _write_problem(cell.problem, out / "problems" / f"{cell.id}.yaml")
        cell_rows, named = run_cell(cell, config)
        _save_solved(cell, cell_rows, named, out)
        if config.execute and cell.entry.profile and cell.problem.ranks <= config.execute.max_ranks:
            _execute(cell, config, cell_rows, named, out, say)
        rows += cell_rows
        timelines[cell.id] = named
        say(f"[{k}/{len(cells)}] {cell.id}: {_headline(cell_rows)}  ({time.perf_counter() - start:.0f} s)")
    if not rows:
        reasons = sorted({c.reason for c in cells if c.reason})
        raise SchedcError(f"nothing to show: every one of the {len(cells)} cells was skipped ("
                          + "; ".join(reasons[:2]) + (f"; and {len(reasons) - 2} more" if len(reasons) > 2 else "") + ")")
    write_report(config, cells, rows, timelines, out)
    return rows


def run_cell(cell: Cell, config: AblationConfig) -> tuple[list[Row], dict[str, Timeline]]:
    """Simulate every schedule of the cell (and solve, if asked); rows and the fitting timelines."""

    prob = cell.problem
    names = config.schedules or [*solvers.REGISTRY, ILP]
    judged = {e.name: e for e in solvers.evaluate(prob, [n for n in names if n not in solvers.SEARCHES])}
    rows, named = [], {}
    for name in names:
        row = _row(cell, name)
        if name in solvers.SEARCHES:
            s = config.solver
            try:
                result = solvers.SEARCHES[name](prob, solver=s.solver, time_limit=s.time_limit, gap=s.gap,
                                                threads=s.threads)
            except SchedcError as e:
                row.status = f"n/a: {e}"
                rows.append(row)
                continue
            t = result.timeline
            row.bound, row.gap, row.seconds, row.status = result.bound, result.gap, result.seconds, result.status
            row.extra["solver"] = result.summary()
            row.extra["schedule"] = result.schedule
        else:
            e = judged[name]
            if e.reason:
                row.status = f"n/a: {e.reason}"
                rows.append(row)
                continue
            t = e.timeline
            row.seconds = e.seconds
            row.status = "fits" if t.fits else "over memory"
            row.extra["schedule"] = e.schedule
        row.makespan, row.span, row.objective_value = t.makespan, t.span, t.objective_value()
        row.bubble, row.peak_memory = t.bubble_rate(), max(t.peak_memory)
        if t.fits:
            named[name] = t
        rows.append(row)
    return rows, named


def _write_problem(problem: Problem, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(problem.model_dump(exclude_none=True), sort_keys=False, default_flow_style=None))


def _save_solved(cell: Cell, rows: list[Row], named: dict[str, Timeline], out: Path) -> None:

    for row in rows:
        if row.schedule == ILP and ILP in named:
            CompiledSchedule.build(cell.problem, row.extra["schedule"], row.extra["solver"],
                                   timeline=named[ILP]).save(out / "schedules" / f"{cell.id}-ilp.json")


def _row(cell: Cell, name: str) -> Row:
    p = cell.problem
    limit = max(p.memory_limit) if p.memory_limit else None
    factor = cell.values["memory"]
    if factor is OWN_LIMIT:  # the problem's own limit, as a multiple of 1F1B's activation memory
        factor = None if p.memory_limit is None else max(
            (lim - st) / (p.ranks * a) for lim, st, a in zip(p.memory_limit, p.static_memory, _per_microbatch(p))
        )
    return Row(cell.id, cell.entry.label, p.ranks, p.microbatches, p.chunks,
               p.placement if isinstance(p.placement, str) else "explicit", p.comm, p.objective,
               factor, limit, name, "")


def _per_microbatch(problem: Problem) -> list[float]:
    """Per rank, the activation one microbatch leaves through all its stages (1F1B holds p of them)."""
    return [sum(problem.mem["F"][s] for s in stages) for stages in problem.rank_stages]


def _headline(rows: list[Row]) -> str:
    o = outcome(rows)
    parts = []
    if o.best:
        parts.append(f"best heuristic {o.best.schedule} bubble {100 * o.best.bubble:.2f}%")
    if o.ilp:
        parts.append(f"ilp {100 * o.ilp.bubble:.2f}% ({o.ilp.status}, gap {100 * o.ilp.gap:.2f}%)")
    if o.vs_best is not None:
        parts.append(f"speed-up x{o.vs_best:.3f}")
    if o.vs_1f1b is not None:
        parts.append(f"vs 1f1b x{o.vs_1f1b:.3f}")
    return ", ".join(parts) or "no schedule fits"


# ---- execution ----


class _Profiler:
    """Profiles each model once per (ranks, chunks, placement, microbatches)."""

    def __init__(self, say):
        self.say, self.cache = say, {}

    def __call__(self, entry: ProblemEntry, v: dict) -> Problem:
        from schedc.runtime.profile import load_model_spec, profile_model  # torch: only for profiled entries

        key = (entry.profile, v.get("ranks"), v.get("chunks", 1), v.get("placement", "loop"), v.get("microbatches"))
        if key not in self.cache:
            if v.get("ranks") is None or v.get("microbatches") is None:
                raise SchedcError(f"{entry.label}: a profiled problem needs the ranks and microbatches axes")
            self.say(f"profiling {entry.profile} for p={key[1]} v={key[2]} {key[3]} m={key[4]}")
            problem, _ = profile_model(load_model_spec(entry.profile), ranks=key[1], chunks=key[2],
                                       placement=key[3], microbatches=key[4], name=entry.label)
            self.cache[key] = problem
        return self.cache[key]


def _execute(cell: Cell, config: AblationConfig, rows: list[Row], named: dict, out: Path, say) -> None:
    """Train with every fitting schedule of the cell in local gloo processes; fill measured_ms."""
    from schedc.runtime.timing import time_schedules  # torch: only for studies that execute

    paths = {}
    for row in rows:
        if row.schedule in named:
            path = out / "schedules" / f"{cell.id}-{row.schedule}.json"
            if row.schedule != ILP:  # the solved one is saved already
                CompiledSchedule.build(cell.problem, row.extra["schedule"], timeline=named[row.schedule]).save(path)
            paths[row.schedule] = str(path)
    say(f"  running {len(paths)} schedules with the runtime on {cell.problem.ranks} local processes")
    ex = config.execute
    measured = time_schedules(cell.problem.ranks, cell.entry.profile, list(paths.values()), ex.steps, ex.warmup)
    for row in rows:
        if row.schedule in paths:
            row.measured_ms = max(m[paths[row.schedule]] for m in measured)


# ---- the report ----

COLUMNS = ["cell", "problem", "ranks", "microbatches", "chunks", "placement", "comm", "objective", "memory_factor",
           "memory_limit", "schedule", "status", "makespan", "span", "objective_value", "bubble", "peak_memory",
           "bound", "gap", "seconds", "measured_ms"]


def write_report(config: AblationConfig, cells: list[Cell], rows: list[Row], timelines: dict, out: Path) -> None:
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in COLUMNS])
    by_cell = {c.id: [r for r in rows if r.cell == c.id] for c in cells if c.problem is not None}
    (out / "summary.md").write_text(summary_markdown(config, cells, by_cell))
    if rows:
        draw_frontier(rows, out / "frontier.png", title=f"{config.name}: bubble vs memory limit")
        draw_speedup(by_cell, out / "speedup.png", title=f"{config.name}: solved over the best heuristic")
    for cell_id in config.gantt if config.gantt is not None else _largest_speedup(by_cell):
        named = timelines.get(cell_id)
        if named is None:
            continue
        best = best_heuristic(by_cell[cell_id])
        chosen = [named[n] for n in (ILP, best.schedule if best else None) if n in named]
        if chosen:
            draw_gantt(chosen, out / f"gantt-{cell_id}.png", title=cell_id)


def _largest_speedup(by_cell: dict[str, list[Row]]) -> list[str]:
    best_id, best_gain = None, 1.0 + 1e-9
    for cell_id, rows in by_cell.items():
        gain = outcome(rows).vs_best
        if gain is not None and gain > best_gain:
            best_id, best_gain = cell_id, gain
    return [best_id] if best_id else []


def headline_table(by_cell: dict[str, list[Row]]) -> list[str]:
    """One line per cell: best heuristic vs solved vs 1F1B (Markdown)."""
    lines = ["| cell | best heuristic | its bubble | solved bubble | speed-up vs best | vs 1F1B | gap | solver |",
             "|---|---|---|---|---|---|---|---|"]
    for cell_id, rows in by_cell.items():
        o = outcome(rows)
        h, ilp = o.best, o.ilp
        ratio = lambda x: "-" if x is None else f"x{x:.3f}"  # noqa: E731
        cols = [cell_id, h.schedule if h else "none fits", f"{100 * h.bubble:.2f}%" if h else "-"]
        if ilp:
            cols += [f"{100 * ilp.bubble:.2f}%", ratio(o.vs_best), ratio(o.vs_1f1b),
                     f"{100 * ilp.gap:.2f}%", f"{ilp.status}, {ilp.seconds:.1f} s"]
        else:
            cols += ["-"] * 5
        lines.append("| " + " | ".join(cols) + " |")
    return lines


def summary_markdown(config: AblationConfig, cells: list[Cell], by_cell: dict[str, list[Row]]) -> str:
    out = [f"# {config.name}", "", "Objective values are in the problems' time unit; bubble = 1 - busy / (p x T).",
           "Speed-up = the best heuristic's objective / the solved one's (>1: the solver is faster).", "",
           "## Solved vs heuristics", "", *headline_table(by_cell), ""]
    skipped = [c for c in cells if c.problem is None]
    if skipped:
        out += ["Skipped cells:", ""] + [f"- {c.id}: {c.reason}" for c in skipped] + [""]
    out += ["## Cells", ""]
    for cell_id, rows in by_cell.items():
        out += [f"### {cell_id}", "", "| schedule | status | objective | bubble | peak memory | measured ms |",
                "|---|---|---|---|---|---|"]
        for r in rows:
            if r.objective_value is None:
                out.append(f"| {r.schedule} | {r.status} | - | - | - | - |")
                continue
            out.append(f"| {r.schedule} | {r.status} | {r.objective_value:.6g} | {100 * r.bubble:.2f}% |"
                       f" {r.peak_memory:.6g} | {'-' if r.measured_ms is None else f'{r.measured_ms:.1f}'} |")
        out.append("")
    return "\n".join(out)


def read_csv(path: str | Path) -> list[dict]:
    with Path(path).open() as f:
        return list(csv.DictReader(f))

