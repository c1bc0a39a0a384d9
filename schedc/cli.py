"""The ``schedc`` command line. Mistakes in input exit with status 2 and one line on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from schedc.errors import SchedcError, ScheduleError
from schedc.problem import Problem, load_problem
from schedc.simulate import Timeline, simulate


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SchedcError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="schedc")
def main() -> None:
    """schedc: compile pipeline-parallel training schedules.

    A PROBLEM file (YAML or JSON) gives ranks, microbatches, chunks, placement, per-stage
    F/B/W costs, communication latency and memory; see examples/problems/. Schedules are
    judged by one simulator; `schedc schedules` lists the named ones.
    """


def _registry():
    import schedc.solvers as solvers

    return solvers


def _problem(path: str, memory_limit: float | None, objective: str | None) -> Problem:
    problem = load_problem(path)
    changes: dict[str, Any] = {}
    if memory_limit is not None:
        changes["memory"] = {"limit": memory_limit}
    if objective is not None:
        changes["objective"] = objective
    return problem.with_changes(**changes) if changes else problem


def _problem_options(fn):
    fn = click.option(
        "--objective", type=click.Choice(["makespan", "span"]), help="Override the problem's objective."
    )(fn)
    fn = click.option(
        "--memory-limit", type=float, help="Override the memory limit (every rank), same unit as the problem."
    )(fn)
    return click.argument("problem", metavar="PROBLEM")(fn)


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    click.echo(line(headers))
    click.echo(line(["-" * w for w in widths]))
    for r in rows:
        click.echo(line(r))


def _peaks(values: list[float] | tuple[float, ...]) -> str:
    if len(values) <= 8:
        return " ".join(_fmt(x) for x in values)
    top = max(range(len(values)), key=values.__getitem__)
    return f"max {_fmt(values[top])} (rank {top})"


def _fits(t: Timeline) -> str:
    if t.problem.memory_limit is None:
        return "-"
    if t.fits:
        return "yes"
    worst = max(t.violations, key=lambda v: v.over)
    return f"no (rank {worst.rank} +{_fmt(worst.over)})"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def schedules(as_json: bool) -> None:
    """List the named schedules of the registry."""
    reg = _registry().REGISTRY
    rows = [
        {"name": s.name, "backward": "split B/W" if s.split_backward else "fused BW", "summary": s.summary}
        for s in reg.values()
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    _print_table(["name", "backward", "summary"], [[r["name"], r["backward"], r["summary"]] for r in rows])


@main.command(name="simulate")
@_problem_options
@click.option("-s", "--schedule", "name", required=True, help="A registry schedule (see `schedc schedules`).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, with per-op start and end times.")
def simulate_cmd(problem: str, memory_limit, objective, name: str, as_json: bool) -> None:
    """Simulate one schedule on PROBLEM: times, bubble, memory per rank."""
    prob = _problem(problem, memory_limit, objective)
    _report(simulate(prob, _registry().build(name, prob)), prob.name or problem, as_json)


def _report(t: Timeline, where: str, as_json: bool) -> None:
    """What `simulate` and `import` print: a summary table, or JSON with every op's times."""
    prob = t.problem
    if as_json:
        out = t.summary()
        out["ops"] = [
            {"rank": r, "kind": op.kind, "stage": op.stage, "mb": op.mb, "start": s, "end": e}
            for op, (r, s, e) in t.op_times().items()
        ]
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(
        f"{t.schedule.name} on {where}: p={prob.ranks} m={prob.microbatches} v={prob.chunks}"
        f" objective={prob.objective}"
    )
    click.echo(
        f"makespan {_fmt(t.makespan)}  span {_fmt(t.span)}  bubble {100 * t.bubble_rate('makespan'):.2f}%"
        f" (makespan) / {100 * t.bubble_rate('span'):.2f}% (span)"
    )
    limits = prob.memory_limit
    rows = [
        [
            str(r),
            _fmt(t.busy[r]),
            _fmt(t.idle()[r]),
            _fmt(t.rank_span[r]),
            _fmt(t.peak_memory[r]),
            _fmt(limits[r]) if limits else "-",
        ]
        for r in range(prob.ranks)
    ]
    _print_table(["rank", "busy", "idle", "span", "peak mem", "limit"], rows)
    for v in t.violations:
        click.echo(f"memory limit exceeded: {v}")


@main.command()
@_problem_options
@click.option("--schedules", "names", help="Comma-separated schedule names (default: the whole registry).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Also draw every schedule's Gantt chart (.png/.svg).")
@click.option("--torch", "with_torch", is_flag=True,
              help="Also compare torch.distributed.pipelining's own schedules (needs torch).")
def compare(
    problem: str, memory_limit, objective, names: str | None, as_json: bool, plot: str | None, with_torch: bool
) -> None:
    """Compare schedules on PROBLEM: makespan, span, bubble, peak memory, fit."""
    solvers = _registry()
    prob = _problem(problem, memory_limit, objective)
    wanted = [n.strip() for n in names.split(",") if n.strip()] if names else list(solvers.REGISTRY)
    # (name, why it does not apply, timeline): one entry per schedule, in the order asked.
    entries: list[tuple[str, str | None, Timeline | None]] = []
    for spec in (solvers.get(n) for n in wanted):
        reason = spec.why_not(prob)
        entries.append((spec.name, reason, None if reason else simulate(prob, spec.build(prob))))
    if with_torch:
        from schedc.interop import torch_schedules

        for name, schedule, reason in torch_schedules(prob):
            try:  # torch's order is judged like ours: an incomplete or deadlocking one is n/a
                entries.append((name, reason, None if reason else simulate(prob, schedule)))
            except ScheduleError as e:
                entries.append((name, str(e).removeprefix(f"{name}: "), None))
    timelines = [t for _, _, t in entries if t is not None]
    if plot:
        from schedc.plot import draw_gantt

        if not timelines:
            raise SchedcError("no schedule applies to this problem, nothing to plot")
        draw_gantt(timelines, plot, title=f"{prob.name}: p={prob.ranks} m={prob.microbatches} v={prob.chunks}")
    if as_json:
        results = [
            {"schedule": name, "applies": False, "reason": reason} if t is None else {"applies": True, **t.summary()}
            for name, reason, t in entries
        ]
        click.echo(json.dumps({"problem": prob.name, "objective": prob.objective, "results": results}, indent=2))
        return
    click.echo(
        f"{prob.name or problem}: p={prob.ranks} m={prob.microbatches} v={prob.chunks} placement={_placement(prob)}"
        f" comm={_fmt(prob.comm)} objective={prob.objective}"
    )
    _timeline_table(prob, [(name, t) for name, _, t in entries if t is not None])
    for name, reason, t in entries:
        if t is None:
            click.echo(f"n/a {name}: {reason}")
    if plot:
        click.echo(f"wrote {plot}")


def _timeline_table(prob: Problem, named: list[tuple[str, Timeline]]) -> None:
    """The comparison table of `compare` and `solve`: one row per schedule."""
    rows = [
        [name, _fmt(t.makespan), _fmt(t.span), f"{100 * t.bubble_rate():.2f}", _peaks(t.peak_memory), _fits(t)]
        for name, t in named
    ]
    _print_table(["schedule", "makespan", "span", f"bubble% ({prob.objective})", "peak memory per rank", "fits"], rows)


@main.command()
@_problem_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Schedule file to write (.json).")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds the solver may search.")
@click.option("--gap", type=click.FloatRange(min=0, max=1), default=1e-4, show_default=True,
              help="Stop when (objective - bound) / objective is below this.")
@click.option("--solver", type=click.Choice(["cbc", "highs", "cpsat"]), default="cbc", show_default=True,
              help="cbc (bundled with PuLP), highs (needs highspy), cpsat (needs ortools).")
@click.option("--threads", type=click.IntRange(min=1), help="Solver threads (default: the solver's).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of tables.")
@click.option("-q", "--quiet", is_flag=True, help="No live progress on stderr.")
def solve(problem: str, memory_limit, objective, output: str, time_limit: float, gap: float, solver: str,
          threads: int | None, as_json: bool, quiet: bool) -> None:
    """Find the fastest zero-bubble schedule for PROBLEM under its memory limit (ILP), with a
    proven lower bound, and write it to a schedule file.

    The search starts from the best registry schedule that fits, so the result is never worse.
    A memory limit no schedule can meet exits with status 2 and the smallest feasible limit.
    """
    from schedc.solvers.ilp import solve as solve_ilp

    prob = _problem(problem, memory_limit, objective)

    def show_progress(event) -> None:
        if quiet:
            return
        parts = [f"{event.seconds:7.1f}s"]
        if event.incumbent is not None:
            parts.append(f"incumbent {_fmt(event.incumbent)}")
        if event.bound is not None:
            parts.append(f"bound {_fmt(event.bound)}")
        if event.incumbent and event.bound is not None:
            parts.append(f"gap {100 * (event.incumbent - event.bound) / event.incumbent:.2f}%")
        click.echo("  ".join(parts), err=True)

    if not quiet:
        click.echo(f"solving {prob.name or problem} with {solver} (time limit {_fmt(time_limit)} s) ...", err=True)
    result = solve_ilp(prob, solver=solver, time_limit=time_limit, gap=gap, threads=threads, progress=show_progress)
    _write_schedule_file(output, prob, result)
    if as_json:
        click.echo(json.dumps({"problem": prob.name, "output": output, **result.summary()}, indent=2))
        return
    click.echo(
        f"{result.status}: {prob.objective} {_fmt(result.objective)}, bound {_fmt(result.bound)}"
        f" (gap {100 * result.gap:.2f}%), bubble {100 * result.timeline.bubble_rate():.2f}%,"
        f" {result.seconds:.1f} s; started from {result.warm_start} ({_fmt(result.warm_objective)})"
    )
    click.echo(f"bound: {result.bound_reason}")
    _timeline_table(prob, [("ilp", result.timeline), *result.registry])
    click.echo(f"wrote {output}")


def _write_schedule_file(path: str, prob: Problem, result) -> None:
    """The solved schedule with its problem and solver figures. (The versioned file format with
    the lowered per-rank program comes with the lowering issue.)"""
    data = {
        "schedc": __import__("schedc").__version__,
        "command": " ".join(["schedc", *sys.argv[1:]]),
        "problem": prob.model_dump(exclude_none=True),
        "schedule": {"name": result.schedule.name, "ranks": [[list(op) for op in ops] for ops in result.schedule.ranks]},
        "solver": result.summary(),
    }
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1))
    except OSError as e:
        raise SchedcError(f"{path}: cannot write: {e.strerror or e}") from None


def _placement(prob: Problem) -> str:
    return prob.placement if isinstance(prob.placement, str) else "explicit"


@main.command()
@click.option("-p", "--ranks", "p", type=click.IntRange(min=1), required=True, help="Pipeline ranks.")
@click.option("-m", "--microbatches", "m", type=click.IntRange(min=1), required=True, help="Microbatches.")
@click.option("-v", "--chunks", "v", type=click.IntRange(min=1), default=1, show_default=True, help="Chunks per rank.")
@click.option("-F", "F", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Forward time of one microbatch through a whole rank.")
@click.option("-B", "B", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Input-gradient time, whole rank.")
@click.option("-W", "W", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Weight-gradient time, whole rank.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bubble(p: int, m: int, v: int, F: float, B: float, W: float, as_json: bool) -> None:
    """The published bubble and memory formulas side by side (no problem file needed).

    Bubble is the idle time of the busiest rank per iteration; peak activation is on rank 0
    in microbatches of one rank's activations.
    """
    from schedc.analytic import bubble_table

    rows = bubble_table(p, m, v, F, B, W)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"p={p} m={m} v={v} F={_fmt(F)} B={_fmt(B)} W={_fmt(W)}: work per rank {_fmt(m * (F + B + W))}")
    _print_table(
        ["schedule", "bubble", "bubble%", "peak act (mb)", "exact when", "source"],
        [
            [r["schedule"], _fmt(r["bubble"]), f"{100 * r['bubble_rate']:.2f}", _fmt(r["peak_activation"]),
             r["holds"], r["source"]]
            for r in rows
        ],
    )


@main.command()
@_problem_options
@click.option("-s", "--schedule", "name", required=True, help="A registry schedule (see `schedc schedules`).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Figure file: .png, .svg or .pdf.")
@click.option("--trace", type=click.Path(dir_okay=False), help="Also write a Chrome/Perfetto trace JSON here.")
def show(problem: str, memory_limit, objective, name: str, output: str, trace: str | None) -> None:
    """Draw the Gantt chart (and memory per rank) of a schedule on PROBLEM."""
    from schedc.plot import draw_gantt, write_trace

    prob = _problem(problem, memory_limit, objective)
    t = simulate(prob, _registry().build(name, prob))
    draw_gantt([t], output)
    click.echo(f"wrote {output}")
    if trace:
        write_trace(t, trace)
        click.echo(f"wrote {trace} (open in https://ui.perfetto.dev or chrome://tracing)")


@main.command()
@_problem_options
@click.option("-s", "--schedule", "name", required=True, help="A registry schedule (see `schedc schedules`).")
@click.option("--format", "fmt", type=click.Choice(["torch-csv"]), default="torch-csv", show_default=True,
              help="torch-csv: torch.distributed.pipelining's compute-only CSV, one row per rank.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="File to write, e.g. FILE.csv.")
def export(problem: str, memory_limit, objective, name: str, fmt: str, output: str) -> None:
    """Write a registry schedule for PROBLEM in another tool's format."""
    from schedc.interop import write_torch_csv

    schedule = _registry().build(name, _problem(problem, memory_limit, objective))
    write_torch_csv(schedule, output)
    click.echo(f"wrote {output} ({name}: {len(schedule.ranks)} ranks, {schedule.n_ops} ops)")


@main.command(name="import")
@click.argument("csv_file", metavar="FILE.csv", type=click.Path(dir_okay=False))
@_problem_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON, with per-op start and end times.")
def import_cmd(csv_file: str, problem: str, memory_limit, objective, as_json: bool) -> None:
    """Read a torch.distributed.pipelining CSV schedule, check it on PROBLEM and simulate it."""
    from schedc.interop import from_torch_csv

    prob = _problem(problem, memory_limit, objective)
    _report(simulate(prob, from_torch_csv(Path(csv_file))), prob.name or problem, as_json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
