"""The ``schedc`` command line. Mistakes in input exit with status 2 and one line on stderr."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from schedc.compiler import CompiledSchedule
from schedc.errors import SchedcError, ScheduleError
from schedc.inputs import one_line
from schedc.problem import Problem, load_problem
from schedc.schedule import Schedule
from schedc.simulate import Timeline, simulate


class _Group(click.Group):
    """Every mistake in input, in a file or on the command line, and a file the system will not
    read or write: one line on stderr, exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SchedcError as e:
            message = str(e)
        except click.UsageError as e:  # click prints usage and a hint on three lines
            where = f"{e.ctx.command_path} " if e.ctx is not None else ""
            message = f"{e.format_message()} (see '{where}--help')"
        except OSError as e:
            message = f"{e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}"
        click.echo(f"error: {one_line(message)}", err=True)
        ctx.exit(2)


class _Finite(click.FloatRange):
    """A FloatRange that also refuses nan and infinities (click's lets them through)."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


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
    return _override(load_problem(path), memory_limit, objective)


def _override(problem: Problem, memory_limit: float | None, objective: str | None) -> Problem:
    changes: dict[str, Any] = {}
    if memory_limit is not None:
        changes["memory"] = {"limit": memory_limit}
    if objective is not None:
        changes["objective"] = objective
    return problem.with_changes(**changes) if changes else problem


def _schedule_input(path: str, name: str | None, memory_limit, objective) -> tuple[Problem, Schedule]:
    """INPUT is a schedule file (its problem and schedule) or a problem file with ``-s NAME``."""
    from schedc.schedfile import load_any

    loaded = load_any(path)
    if isinstance(loaded, Problem):
        if name is None:
            raise click.UsageError(f"{path} is a problem file: name a schedule with -s/--schedule")
        problem = _override(loaded, memory_limit, objective)
        return problem, _registry().build(name, problem)
    if name is not None:
        raise click.UsageError(f"{path} is a schedule file (it holds {loaded.name!r}); -s applies to problem files")
    return _override(loaded.problem, memory_limit, objective), loaded.schedule


_INPUT_HELP = "A registry schedule (see `schedc schedules`); needed when INPUT is a problem file."


def _input_options(fn):
    """INPUT (a schedule file, or a problem file with -s NAME) and the problem overrides."""
    fn = click.option("-s", "--schedule", "name", help=_INPUT_HELP)(fn)
    return _problem_options(fn, metavar="INPUT")


def _problem_options(fn, metavar: str = "PROBLEM"):
    fn = click.option(
        "--objective", type=click.Choice(["makespan", "span"]), help="Override the problem's objective."
    )(fn)
    fn = click.option(
        "--memory-limit", type=_Finite(min=0, min_open=True), help="Override the memory limit (every rank), same unit as the problem."
    )(fn)
    return click.argument("problem", metavar=metavar)(fn)


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
@_input_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON, with per-op start and end times.")
def simulate_cmd(problem: str, memory_limit, objective, name: str | None, as_json: bool) -> None:
    """Simulate one schedule: times, bubble, memory per rank.

    INPUT is a schedule file (from `schedc solve` or `schedc compile`) or a problem file with -s.
    """
    prob, schedule = _schedule_input(problem, name, memory_limit, objective)
    _report(simulate(prob, schedule), prob.name or problem, as_json)


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


# Lowering and writing a schedule file takes about 4 to 5 times as long as simulating the schedule
# (p = 32, m = 256): solve() leaves that much of the time limit unused.
_WRITE_SIMULATIONS = 6.0


@main.command()
@_problem_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Schedule file to write (.json).")
@click.option("--time-limit", type=_Finite(min=0, min_open=True), default=60.0, show_default=True,
              help="Wall-clock seconds for the whole command: warm start, search, writing the file.")
@click.option("--gap", type=_Finite(min=0, max=1), default=1e-4, show_default=True,
              help="Stop when (objective - bound) / objective is below this.")
@click.option("--solver", type=click.Choice(["cbc", "highs", "cpsat"]), default="cbc", show_default=True,
              help="cbc (bundled with PuLP), highs (needs highspy), cpsat (needs ortools).")
@click.option("--threads", type=click.IntRange(min=1), help="Solver threads (default: the solver's).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of tables.")
@click.option("-q", "--quiet", is_flag=True, help="No live progress on stderr.")
@click.option("--torch", "with_torch", is_flag=True,
              help="Also start from torch.distributed.pipelining's schedules (slow to build for large p x m).")
def solve(problem: str, memory_limit, objective, output: str, time_limit: float, gap: float, solver: str,
          threads: int | None, as_json: bool, quiet: bool, with_torch: bool) -> None:
    """Find the fastest zero-bubble schedule for PROBLEM under its memory limit (ILP), with a
    proven lower bound, and write it to a schedule file.

    The search starts from the best registry schedule that fits (with --torch, also torch's
    schedules), so the result is never worse; a local search improves it, then the exact search.
    A memory limit no schedule can meet exits with status 2 and the smallest feasible limit.
    """
    from schedc.solvers.ilp import solve as solve_ilp

    started = time.perf_counter()
    prob = _problem(problem, memory_limit, objective)

    def show_progress(event) -> None:
        if quiet:
            return
        if event.note:
            click.echo(f"{event.seconds:7.1f}s  {event.note}", err=True)
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
    candidates = []
    if with_torch:
        from schedc.interop import torch_schedules

        candidates = [(name, schedule) for name, schedule, _ in torch_schedules(prob) if schedule is not None]
    # The limit is for the command as a whole (what a user times). Run as the `schedc` program,
    # the process's own age counts the interpreter's start and imports; called in-process (click's
    # test runner, a Python caller) only this command's own time counts, with a second kept for
    # what came before. A little more is kept for writing the file and the exit.
    used = time.perf_counter() - (_PROGRAM_STARTED if _PROGRAM_STARTED is not None else started - min(1.0, 0.02 * time_limit))
    left = time_limit - used - min(1.0, 0.03 * time_limit)
    result = solve_ilp(prob, solver=solver, time_limit=max(left, 1e-3), gap=gap, threads=threads,
                       progress=show_progress, reserve=_WRITE_SIMULATIONS, candidates=candidates)
    CompiledSchedule.build(prob, result.schedule, result.summary(), timeline=result.timeline).save(output)
    if as_json:
        click.echo(json.dumps({"problem": prob.name, "output": output, **result.summary()}, indent=2))
        return
    click.echo(
        f"{result.status}: {prob.objective} {_fmt(result.objective)}, bound {_fmt(result.bound)}"
        f" (gap {100 * result.gap:.2f}%), bubble {100 * result.timeline.bubble_rate():.2f}%,"
        f" {result.seconds:.1f} s; started from {result.warm_start} ({_fmt(result.warm_objective)})"
    )
    click.echo(f"bound: {result.bound_reason}")
    if result.not_evaluated:
        click.echo(f"not evaluated (time limit): {', '.join(result.not_evaluated)}")
    _timeline_table(prob, [("ilp", result.timeline), *result.registry])
    click.echo(f"wrote {output}")


def _placement(prob: Problem) -> str:
    return prob.placement if isinstance(prob.placement, str) else "explicit"


@main.command()
@click.option("-p", "--ranks", "p", type=click.IntRange(min=1), required=True, help="Pipeline ranks.")
@click.option("-m", "--microbatches", "m", type=click.IntRange(min=1), required=True, help="Microbatches.")
@click.option("-v", "--chunks", "v", type=click.IntRange(min=1), default=1, show_default=True, help="Chunks per rank.")
@click.option("-F", "F", type=_Finite(min=0, min_open=True), default=1.0, show_default=True,
              help="Forward time of one microbatch through a whole rank.")
@click.option("-B", "B", type=_Finite(min=0, min_open=True), default=1.0, show_default=True,
              help="Input-gradient time, whole rank.")
@click.option("-W", "W", type=_Finite(min=0, min_open=True), default=1.0, show_default=True,
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
@_input_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Figure file: .png, .svg or .pdf.")
@click.option("--trace", type=click.Path(dir_okay=False), help="Also write a Chrome/Perfetto trace JSON here.")
@click.option("--measured", type=click.Path(dir_okay=False),
              help="A trace the runtime wrote (PipelineRuntime.save_trace): drawn below the simulated timeline;"
                   " with measure_memory=True, its memory per rank too.")
def show(problem: str, memory_limit, objective, name: str | None, output: str, trace: str | None,
         measured: str | None) -> None:
    """Draw the Gantt chart (and memory per rank) of a schedule, and with --measured the run
    the runtime traced beside it (and the memory it measured, if it did, over the simulated
    memory: static plus measured activation, in MiB).

    INPUT is a schedule file (from `schedc solve` or `schedc compile`) or a problem file with -s.
    """
    from schedc.plot import draw_gantt, write_trace

    prob, schedule = _schedule_input(problem, name, memory_limit, objective)
    t = simulate(prob, schedule)
    timelines = [t]
    memory = None
    if measured:
        from schedc.trace import measured_memory, measured_timeline

        run = measured_timeline(measured, prob, schedule)
        timelines.append(run)
        click.echo(
            f"simulated makespan {_fmt(t.makespan)}, measured {_fmt(run.makespan)}"
            f" ({100 * (run.makespan / t.makespan - 1):+.1f}%); bubble simulated {100 * t.bubble_rate():.2f}%,"
            f" measured {100 * run.bubble_rate():.2f}%"
        )
        points = measured_memory(measured)
        if points is not None:
            memory = {1: points}
            peaks = [max(level for _, level in rank) for rank in points]
            click.echo(
                "peak activation memory per rank: simulated "
                + " ".join(f"{x:.4g}" for x in t.peak_activation) + ", measured (MiB) "
                + " ".join(f"{x:.4g}" for x in peaks) + ", measured / simulated "
                + " ".join(f"{m / s:.3f}" if s else "-" for m, s in zip(peaks, t.peak_activation))
            )
    draw_gantt(timelines, output)
    click.echo(f"wrote {output}")
    if trace:
        write_trace(t, trace)
        click.echo(f"wrote {trace} (open in https://ui.perfetto.dev or chrome://tracing)")


@main.command()
@_input_options
@click.option("--format", "fmt", type=click.Choice(["torch-csv"]), default="torch-csv", show_default=True,
              help="torch-csv: torch.distributed.pipelining's compute-only CSV, one row per rank.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="File to write, e.g. FILE.csv.")
def export(problem: str, memory_limit, objective, name: str | None, fmt: str, output: str) -> None:
    """Write a schedule in another tool's format.

    INPUT is a schedule file (from `schedc solve` or `schedc compile`) or a problem file with -s.
    """
    from schedc.interop import write_torch_csv

    _, schedule = _schedule_input(problem, name, memory_limit, objective)
    write_torch_csv(schedule, output)
    click.echo(f"wrote {output} ({schedule.name}: {len(schedule.ranks)} ranks, {schedule.n_ops} ops)")


@main.command(name="compile")
@_problem_options
@click.option("-s", "--schedule", "name", required=True, help="A registry schedule (see `schedc schedules`).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Schedule file to write (.json).")
def compile_cmd(problem: str, memory_limit, objective, name: str, output: str) -> None:
    """Lower a registry schedule on PROBLEM to a schedule file (`schedc solve` writes the same
    format for the ILP's schedule)."""
    compiled = CompiledSchedule.build(*_schedule_input(problem, name, memory_limit, objective))
    compiled.save(output)
    t = compiled.timeline
    click.echo(
        f"wrote {output}: {name}, {compiled.program.n_instructions} instructions on {len(t.schedule.ranks)} ranks,"
        f" {t.problem.objective} {_fmt(t.objective_value())}, bubble {100 * t.bubble_rate():.2f}%"
        + ("" if t.fits else f" (over the memory limit: {t.violations[0]})")
    )


@main.command()
@click.argument("schedule_file", metavar="SCHEDULE.json")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--print", "show", is_flag=True, help="Also print the program, one instruction per line.")
@click.option("--rank", type=click.IntRange(min=0), help="With --print: only this rank.")
def check(schedule_file: str, as_json: bool, show: bool, rank: int | None) -> None:
    """Verify a schedule file: its problem, schedule and timeline agree, and its per-rank program
    pairs every send with one receive in the same order and cannot deadlock (a send waits until
    its receive is posted). A failure names the first problem, or the cycle of waiting ranks."""
    from schedc.check import check as check_program
    from schedc.schedfile import load

    compiled = load(schedule_file)  # verifies everything; raises with one line if anything is off
    report = check_program(compiled.problem, compiled.program, compiled.schedule)
    if as_json:
        click.echo(json.dumps({"file": schedule_file, "ok": True, "schedule": compiled.name, **report.summary()}, indent=2))
    else:
        click.echo(f"{schedule_file}: ok: {compiled.name}, {compiled.program.n_instructions} instructions, no deadlock")
        _print_table(
            ["rank", "instructions", "sends", "receives", "local", "max receive buffers"],
            [
                [str(r), str(report.instructions[r]), str(report.sends[r]), str(report.receives[r]),
                 str(report.local[r]), str(report.receive_buffers[r])]
                for r in range(len(report.instructions))
            ],
        )
    if show:
        if rank is not None and rank >= compiled.problem.ranks:
            raise SchedcError(f"--rank {rank}: the program has ranks 0..{compiled.problem.ranks - 1}")
        click.echo(compiled.program.listing(rank))


@main.command()
@click.argument("model", metavar="MODEL")
@click.option("-p", "--ranks", type=click.IntRange(min=1), required=True, help="Pipeline ranks.")
@click.option("-m", "--microbatches", type=click.IntRange(min=1), required=True,
              help="Microbatches per iteration (the model's batch is split into this many).")
@click.option("-v", "--chunks", type=click.IntRange(min=1), default=1, show_default=True, help="Stages per rank.")
@click.option("--placement", type=click.Choice(["loop", "v"]), default="loop", show_default=True)
@click.option("--partition", type=click.Choice(["time", "params", "uniform"]), default="time", show_default=True,
              help="time: balance profiled F+B+W per block (DP); params: balance parameter counts; uniform.")
@click.option("--comm", type=_Finite(min=0), help="Transfer time in ms (default: measured between two local processes).")
@click.option("--memory-limit", type=_Finite(min=0, min_open=True), help="Memory limit per rank, MiB.")
@click.option("--objective", type=click.Choice(["makespan", "span"]), default="makespan", show_default=True)
@click.option("--threads", type=click.IntRange(min=1),
              help="torch threads while profiling on CPU (default: the cores each of the ranks will get).")
@click.option("--repeats", type=click.IntRange(min=1), default=7, show_default=True, help="Timed runs per op (median).")
@click.option("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available, else cpu).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Problem file to write (.yaml).")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
def profile(model: str, ranks: int, microbatches: int, chunks: int, placement: str, partition: str,
            comm: float | None, memory_limit: float | None, objective: str, threads: int | None, repeats: int,
            device: str | None, output: str, as_json: bool) -> None:
    """Profile a model on this machine and write the Problem for `schedc solve`.

    MODEL is FILE.py:FUNCTION or MODULE:FUNCTION returning a schedc.runtime.profile.ModelSpec
    (blocks in pipeline order, one batch, the loss), e.g. examples/train_gpt.py:gpt. The blocks
    are cut into ranks x chunks stages, each stage's F, B and W are timed (median after warm-up),
    its activation and static memory measured, and the transfer between two ranks timed. Times
    are in ms, memory in MiB; the partition is kept in the problem's stage_blocks.
    """
    import os

    import torch
    import yaml

    from schedc.runtime.profile import load_model_spec, profile_model

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        where = torch.device(dev)
    except (RuntimeError, ValueError):
        raise SchedcError(f"--device {dev!r}: not a device; use cpu, cuda or cuda:N") from None
    if where.type not in ("cpu", "cuda"):
        raise SchedcError(f"--device {dev!r}: schedc profiles on cpu or cuda only")
    if where.type == "cuda" and (not torch.cuda.is_available() or (where.index or 0) >= torch.cuda.device_count()):
        raise SchedcError(f"--device {dev!r}: torch sees {torch.cuda.device_count()} CUDA devices here")
    if dev == "cpu":
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // ranks))
    say = (lambda msg: None) if as_json else (lambda msg: click.echo(msg, err=True))
    spec = load_model_spec(model)
    say(f"profiling {model} on {dev} ({torch.get_num_threads()} threads): {len(spec.blocks)} blocks,"
        f" batch {tuple(spec.batch[0].shape)}, {microbatches} microbatches")
    name = Path(output).stem
    try:
        prob, prof = profile_model(spec, ranks=ranks, microbatches=microbatches, chunks=chunks, placement=placement,
                                   partition=partition, comm=comm, memory_limit=memory_limit, objective=objective,
                                   name=name, repeats=repeats, device=dev, progress=say)
    except ValueError as e:
        raise SchedcError(str(e)) from None
    data = prob.model_dump(exclude_none=True)
    header = (f"# {' '.join(['schedc', *sys.argv[1:]])}\n# profiled on {dev} with {torch.get_num_threads()} threads;"
              f" times in ms, memory in MiB; stage_blocks: model blocks per stage\n")
    try:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None))
    except OSError as e:
        raise SchedcError(f"{output}: cannot write: {e.strerror or e}") from None
    if as_json:
        click.echo(json.dumps({"problem": data, "profile": prof.to_dict(), "output": output}, indent=2))
        return
    _print_table(
        ["stage", "blocks", "F ms", "B ms", "W ms", "BW ms", "activation MiB", "kept for W", "static MiB"],
        [[str(s), str(prob.stage_blocks[s]), _fmt(prof.F[s]), _fmt(prof.B[s]), _fmt(prof.W[s]), _fmt(prof.BW[s]),
          _fmt(prof.activation[s]), _fmt(prof.kept_for_w[s]), _fmt(prof.static[s])] for s in range(prob.n_stages)],
    )
    click.echo(f"comm {_fmt(prob.comm)} ms; wrote {output}")


@main.command()
@click.argument("config", metavar="CONFIG.yaml")
@click.option("-o", "--output", type=click.Path(file_okay=False),
              help="Report folder (default: out/NAME, NAME from the config).")
@click.option("--json", "as_json", is_flag=True, help="Print every row as JSON instead of the summary table.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def ablate(config: str, output: str | None, as_json: bool, quiet: bool) -> None:
    """Run an ablation study: every cell of CONFIG's grid, every schedule (and the solver),
    simulated, and run with the runtime where the config asks. Writes a report folder:
    results.csv, summary.md, frontier.png, speedup.png and Gantt charts.

    See examples/ablation.yaml for the format.
    """
    from dataclasses import asdict

    from schedc.ablate import COLUMNS, headline_table, load_config, run

    cfg = load_config(config)
    out = Path(output or Path("out") / cfg.name)
    say = (lambda msg: None) if quiet else (lambda msg: click.echo(msg, err=True))
    rows = run(cfg, out, progress=say)
    if as_json:
        click.echo(json.dumps([{c: asdict(r)[c] for c in COLUMNS} for r in rows], indent=1))
        return
    by_cell: dict[str, list] = {}
    for r in rows:
        by_cell.setdefault(r.cell, []).append(r)
    click.echo("\n".join(headline_table(by_cell)))
    click.echo(f"wrote {out}/results.csv, summary.md, frontier.png, speedup.png")


@main.command()
def schema() -> None:
    """Print the JSON Schema of the schedule file."""
    from schedc.schedfile import schema as file_schema

    click.echo(json.dumps(file_schema(), indent=2))


@main.command(name="import")
@click.argument("csv_file", metavar="FILE.csv", type=click.Path(dir_okay=False))
@_problem_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON, with per-op start and end times.")
def import_cmd(csv_file: str, problem: str, memory_limit, objective, as_json: bool) -> None:
    """Read a torch.distributed.pipelining CSV schedule, check it on PROBLEM and simulate it."""
    from schedc.interop import from_torch_csv

    prob = _problem(problem, memory_limit, objective)
    _report(simulate(prob, from_torch_csv(Path(csv_file))), prob.name or problem, as_json)


# perf_counter() at the process's start when this module runs as the `schedc` program (see
# program()), else None: only then is the process's age the command's age.
_PROGRAM_STARTED: float | None = None


def _process_age() -> float | None:
    """Wall seconds since this process started (Linux: /proc), None where the system does not say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


def program() -> None:
    """The `schedc` console script: the CLI as its own process, so time limits count from its start."""
    global _PROGRAM_STARTED
    age = _process_age()
    if age is not None:
        _PROGRAM_STARTED = time.perf_counter() - age
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    program()
