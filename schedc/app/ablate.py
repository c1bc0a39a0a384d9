"""Ablation studies: solved vs heuristic schedules over a grid, as ``schedc ablate CONFIG`` runs them
(the config and its grid: ``ablate_config``; the report: ``ablate_report``; this module runs the cells).

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
hold its static and working memory plus x times p microbatches of its own activations (what 1F1B's first
rank holds), so 1.0 is 1F1B's budget and ``null`` is no limit. A limit below 1 is taken wherever the
cell's problem can meet it (``Problem.min_memory``: with recompute or offload declared, far below
1F1B's budget); a cell whose problem cannot is skipped, with the reason in the summary.

The ``policies`` axis chooses which memory-for-time sections each cell's problem declares (none,
recompute, selective, offload, all; see ``ablate_config.POLICY_VALUES``), from the config's
``recompute:`` and ``offload:`` or else the problem's own; the rows then count how many (stage,
microbatch) each schedule recomputes, recomputes selectively and offloads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

import schedc.solvers as solvers
from schedc.app.ablate_config import MAX_CELLS, OWN_LIMIT, AblationConfig, Cell, ProblemEntry, plan
from schedc.app.ablate_report import write_report
from schedc.app.results import ILP, Row, outcome
from schedc.errors import ProblemError, SchedcError
from schedc.kinds import ROWS, Kind
from schedc.problem import Problem, load_problem
from schedc.schedfile import CompiledSchedule
from schedc.simulate import Timeline
from schedc.solvers.families.greedy import reference_limit


# A quiet run (``schedc ablate -q``) still prints a line this often, so a long one is never silent.
PULSE_SECONDS = 60.0


def build_problem(cell: Cell, profiler: Callable[[ProblemEntry, dict], Problem] | None = None) -> Problem:
    """The cell's Problem: the entry's problem with the grid values, heavy ends and memory limit."""
    entry, v = cell.entry, grid_values(cell)
    factor = v.pop("memory")
    policies = v.pop("policies", None)
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
        for kind in (Kind.F, Kind.B, Kind.W):  # the costs every problem gives (a fused BW's is optional)
            costs = data["costs"][kind.value]
            costs = list(costs) if isinstance(costs, list) else [costs] * n
            costs[0] *= entry.heavy_first
            costs[-1] *= entry.heavy_last
            data["costs"][kind.value] = costs
    if factor is not OWN_LIMIT:  # the memory axis replaces the problem's own limit
        data.get("memory", {}).pop("limit", None)
    if policies is not None:  # before the limit: what the cell declares decides the least memory it needs
        _declare(data, policies, cell.sections, cell.id)
    problem = Problem.parse(data, source=cell.id)
    if factor is not None and factor is not OWN_LIMIT:
        limit = reference_limit(problem, factor * problem.ranks)  # static + working + factor x 1F1B's activations
        problem = problem.with_changes(memory={"limit": list(limit)})
    return problem


def grid_values(cell: Cell) -> dict:
    """The cell's grid values, ``microbatches_per_rank`` turned into ``microbatches``."""
    v = dict(cell.values)
    if "microbatches_per_rank" in v:
        ranks = v.get("ranks")
        if ranks is None:
            raise SchedcError("microbatches_per_rank needs the ranks axis")
        v["microbatches"] = v.pop("microbatches_per_rank") * ranks
    return v


def _declare(data: dict, policies: str, sections: dict, cell_id: str) -> None:
    """Set the problem data's recompute / offload sections for the policies axis value ``policies``:
    each from the config (``sections``) or else the problem's own; a recompute section defaults to
    ``{}`` (time = F, keep = 0). A value that needs a section neither gives is a ProblemError."""
    recompute = sections.get("recompute") or data.get("recompute")
    offload = sections.get("offload") or data.get("offload")
    data.pop("recompute", None)
    data.pop("offload", None)
    if policies in ("recompute", "selective", "all"):
        recompute = dict(recompute or {})
        if policies == "recompute":
            recompute.pop("selective", None)
        elif policies == "selective" and recompute.get("selective") is None:
            raise ProblemError(f"{cell_id}: policies 'selective' needs recompute.selective (time, keep): give it in"
                               " the config's recompute: or in the problem")
        data["recompute"] = recompute
    if policies in ("offload", "all"):
        if offload is None:
            raise ProblemError(f"{cell_id}: policies {policies!r} needs an offload section (time): give offload:"
                               " in the config or in the problem")
        data["offload"] = offload


def run(config: AblationConfig, out_dir: str | Path, progress: Callable[[str], None] | None = None,
        *, max_cells: int = MAX_CELLS, pulse: Callable[[str], None] | None = None, pulse_every: float | None = None,
        clock: Callable[[], float] = time.perf_counter) -> list[Row]:
    """Run every cell, write the report folder, return the rows.

    ``progress`` hears the plan (cells, schedules, the solver's worst case, the profiles and
    schedule runs) and a line per cell with the time so far and an estimate of the time left
    (``Estimate``: cells, profiles and executed schedule runs each at its own measured pace).
    ``pulse`` (for a quiet run) hears the plan only when the solver alone may take over
    ``pulse_every`` seconds (default ``PULSE_SECONDS``) or the study profiles or executes, then at
    most one line per ``pulse_every`` seconds: cells done, time so far, time left. ``clock``: the
    seconds the estimate reads. A grid of more than ``max_cells`` cells is refused before any
    cell runs (ConfigError)."""
    pulse_every = PULSE_SECONDS if pulse_every is None else pulse_every
    say = progress or (lambda msg: None)
    beat = pulse or (lambda msg: None)
    cells = plan(config, max_cells)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = config.schedules or [*solvers.REGISTRY, ILP]
    searches = [n for n in names if n in solvers.SEARCHES]
    worst = len(cells) * len(searches) * config.solver.time_limit
    estimate = Estimate.of(config, cells, len(names))
    intro = (f"{config.name}: {len(cells)} cells x {len(names)} schedules"
             + (f"; the solver takes up to {_duration(config.solver.time_limit)} a cell, {_duration(worst)} in all"
                if searches else "") + estimate.work())
    say(intro)
    if worst > pulse_every or estimate.profiles or estimate.executed_cells:
        beat(intro)
    profiler = _Profiler(say, clock)  # (profiles nothing where no cell is profiled)
    rows: list[Row] = []
    timelines: dict[str, dict[str, Timeline]] = {}
    start = last_beat = clock()
    for k, cell in enumerate(cells, 1):
        if k > 1 and (now := clock()) - last_beat >= pulse_every:
            beat(f"{config.name}: {k - 1} of {len(cells)} cells done ({estimate.pace(now - start)})")
            last_beat = now
        began, profiled = clock(), profiler.seconds
        executed = 0.0
        try:
            cell.problem = build_problem(cell, profiler)
        except (ProblemError, ValueError) as e:
            cell.reason = str(e)
            estimate.skipped(cell, config)
            estimate.cell_done(clock() - began - (profiler.seconds - profiled))
            estimate.profiled(profiler.count, profiler.seconds)
            say(f"[{k}/{len(cells)}] {cell.id}: skipped: {e}  ({estimate.pace(clock() - start)})")
            continue
        _write_problem(cell.problem, out / "problems" / f"{cell.id}.yaml")
        cell_rows, named = run_cell(cell, config)
        _save_solved(cell, cell_rows, named, out)
        if _executes(cell, config):
            t0 = clock()
            runs = _execute(cell, config, cell_rows, named, out, say)
            executed = clock() - t0
            estimate.executed(runs, executed)
        estimate.profiled(profiler.count, profiler.seconds)
        estimate.cell_done(clock() - began - executed - (profiler.seconds - profiled))
        rows += cell_rows
        timelines[cell.id] = named
        say(f"[{k}/{len(cells)}] {cell.id}: {_headline(cell_rows)}  ({estimate.pace(clock() - start)})")
    if not rows:
        reasons = sorted({c.reason for c in cells if c.reason})
        raise SchedcError(f"nothing to show: every one of the {len(cells)} cells was skipped ("
                          + "; ".join(reasons[:2]) + (f"; and {len(reasons) - 2} more" if len(reasons) > 2 else "") + ")")
    write_report(config, cells, rows, timelines, out)
    return rows


def _executes(cell: Cell, config: AblationConfig) -> bool:
    """Whether the study runs the cell's schedules with the runtime (a profiled cell of few enough ranks)."""
    if cell.problem is not None:
        ranks = cell.problem.ranks
    else:
        try:
            ranks = grid_values(cell).get("ranks")
        except SchedcError:  # the cell's own run says what is wrong
            return False
    return bool(config.execute and cell.entry.profile and ranks is not None and ranks <= config.execute.max_ranks)


@dataclass
class Estimate:
    """What is left of a study, from its plan and from the time each kind of work has taken so far.

    Three kinds, each at its own pace: the cells' simulation and solving (seconds per cell), the
    model profiles (seconds per profile; ``profiles`` distinct ones in the plan), and the runs of
    schedules with the runtime (seconds per step; each executed cell runs up to ``runs_per_cell``
    schedules of ``steps_per_run`` steps, warm-up included, and once a cell has run, the mean that
    ran). A kind not yet timed is not guessed: ``left`` names it, so the estimate never reads
    "about 21 s left" in front of an hour of profiling. Pure: the caller measures the seconds."""

    cells: int
    profiles: int
    executed_cells: int
    runs_per_cell: int
    steps_per_run: int
    done_cells: int = 0
    cell_seconds: float = 0.0
    done_profiles: int = 0
    profile_seconds: float = 0.0
    done_executed: int = 0
    runs: int = 0
    run_seconds: float = 0.0

    @classmethod
    def of(cls, config: AblationConfig, cells: list[Cell], schedules: int) -> "Estimate":
        profiles = set()
        for cell in cells:
            if cell.entry.profile:
                try:
                    profiles.add(_Profiler.key(cell.entry, grid_values(cell)))
                except SchedcError:  # the cell will be skipped, unprofiled
                    pass
        executed = sum(1 for cell in cells if cell.entry.profile and _executes(cell, config))
        steps = config.execute.steps + config.execute.warmup if config.execute else 0
        return cls(len(cells), len(profiles), executed, schedules, steps)

    def cell_done(self, seconds: float) -> None:
        """A cell simulated and solved in ``seconds`` (its profiling and execution not counted)."""
        self.done_cells += 1
        self.cell_seconds += seconds

    def profiled(self, count: int, seconds: float) -> None:
        """``count`` profiles so far, in ``seconds`` in all."""
        self.done_profiles, self.profile_seconds = count, seconds
        self.profiles = max(self.profiles, count)

    def executed(self, runs: int, seconds: float) -> None:
        """A cell's ``runs`` schedules ran with the runtime in ``seconds``."""
        self.done_executed += 1
        self.runs += runs
        self.run_seconds += seconds

    def skipped(self, cell: Cell, config: AblationConfig) -> None:
        """A cell that will not run: it no longer counts among the executed ones."""
        if cell.entry.profile and _executes(cell, config):
            self.executed_cells -= 1

    def left(self) -> tuple[float, list[str]]:
        """Seconds left for the work whose pace is known, and the work not yet timed, in words."""
        seconds, untimed = 0.0, []
        cells = self.cells - self.done_cells
        if cells and self.done_cells:
            seconds += self.cell_seconds / self.done_cells * cells
        elif cells:
            untimed.append(_count(cells, "cell"))
        profiles = self.profiles - self.done_profiles
        if profiles and self.done_profiles:
            seconds += self.profile_seconds / self.done_profiles * profiles
        elif profiles:
            untimed.append(_count(profiles, "profile"))
        executed = self.executed_cells - self.done_executed
        if executed > 0:
            per_cell = self.runs / self.done_executed if self.done_executed else self.runs_per_cell
            steps = executed * per_cell * self.steps_per_run
            if self.runs:
                seconds += self.run_seconds / (self.runs * self.steps_per_run) * steps
            else:
                untimed.append(f"{_count(round(executed * per_cell), 'schedule run')} of {self.steps_per_run} steps")
        return seconds, untimed

    def pace(self, elapsed: float) -> str:
        """Time so far and the time left, with the work not yet timed named."""
        seconds, untimed = self.left()
        if not seconds and not untimed:
            return _duration(elapsed)
        text = f"{_duration(elapsed)}, about {_duration(seconds)} left"
        return text + (f" plus {' and '.join(untimed)} not yet timed" if untimed else "")

    def work(self) -> str:
        """The profiling and execution the plan holds, for the intro line ("" for none)."""
        parts = []
        if self.profiles:
            parts.append(_count(self.profiles, "model profile"))
        if self.executed_cells:
            parts.append(f"up to {_count(self.executed_cells * self.runs_per_cell, 'schedule run')}"
                         f" of {self.steps_per_run} steps")
        return f"; {' and '.join(parts)}" if parts else ""


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


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
        allowed = {ROWS[k].policy for k in prob.policies}  # a policy the problem does not allow stays empty
        for policy, n in t.schedule.policy_counts().items():
            if policy in allowed:
                setattr(row, policy, n)
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
        factor = None if p.activation_room is None else max(
            room / (p.ranks * a) for room, a in zip(p.activation_room, _per_microbatch(p))
        )
    return Row(cell.id, cell.entry.label, p.ranks, p.microbatches, p.chunks,
               p.placement if isinstance(p.placement, str) else "explicit", p.comm, p.objective,
               factor, limit, name, "", policies=cell.values.get("policies"))


def _per_microbatch(problem: Problem) -> list[float]:
    """Per rank, the activation one microbatch leaves through all its stages (1F1B holds p of them)."""
    return [sum(problem.mem[Kind.F][s] for s in stages) for stages in problem.rank_stages]


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
    """Profiles each model once per (ranks, chunks, placement, microbatches); counts the profiles
    and the seconds they took (``clock``), for the estimate."""

    def __init__(self, say, clock: Callable[[], float] = time.perf_counter):
        self.say, self.cache, self.clock = say, {}, clock
        self.count, self.seconds = 0, 0.0

    @staticmethod
    def key(entry: ProblemEntry, v: dict) -> tuple:
        """What one profile serves: the model and the cell's ranks, chunks, placement and microbatches."""
        return (entry.profile, v.get("ranks"), v.get("chunks", 1), v.get("placement", "loop"), v.get("microbatches"))

    def __call__(self, entry: ProblemEntry, v: dict) -> Problem:
        from schedc.runtime.profile import load_model_spec, profile_model  # torch: only for profiled entries

        key = self.key(entry, v)
        if key not in self.cache:
            if v.get("ranks") is None or v.get("microbatches") is None:
                raise SchedcError(f"{entry.label}: a profiled problem needs the ranks and microbatches axes")
            self.say(f"profiling {entry.profile} for p={key[1]} v={key[2]} {key[3]} m={key[4]}")
            began = self.clock()
            try:
                problem, prof = profile_model(load_model_spec(entry.profile), ranks=key[1], chunks=key[2],
                                              placement=key[3], microbatches=key[4], name=entry.label)
            finally:
                self.count += 1
                self.seconds += self.clock() - began
            if prof.warning:  # the study goes on; its profiled cells say which profile was noisy
                from schedc.runtime.noise import advice  # torch is loaded already (profile_model)

                self.say(f"warning: {entry.label}: {prof.warning} {advice()}")
            self.cache[key] = problem
        return self.cache[key]


def _execute(cell: Cell, config: AblationConfig, rows: list[Row], named: dict, out: Path, say) -> int:
    """Train with every fitting schedule of the cell in local gloo processes; fill measured_ms.
    Returns how many schedules ran."""
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
    return len(paths)
