"""Commands on named schedules and schedule files: schedules, simulate, compare, bubble, show,
export, import, compile, check, schema."""

from __future__ import annotations

import json
from pathlib import Path

import click

import schedc.solvers as solvers
from schedc.analytic import bubble_table
from schedc.app.cli_base import (
    Finite, NameList, fmt, input_options, main, policies_line, policy_report, print_table, problem_options,
    read_problem, schedule_input, timeline_table,
)
from schedc.app.plot import draw_gantt, write_trace
from schedc.critical import critical_path
from schedc.errors import SchedcError, ScheduleError
from schedc.interop import from_torch_csv, torch_ready, write_torch_csv
from schedc.problem import Problem
from schedc.program import COMM
from schedc.schedfile import CompiledSchedule, load
from schedc.schedfile import schema as file_schema
from schedc.simulate import Timeline, simulate
from schedc.trace import measured_memory, measured_timeline


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def schedules(as_json: bool) -> None:
    """List the named schedules of the registry."""
    reg = solvers.REGISTRY
    rows = [
        {"name": s.name, "backward": "split B/W" if s.split_backward else "fused BW",
         "semantics": "synchronous" if s.synchronous else "asynchronous", "summary": s.summary}
        for s in reg.values()
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    print_table(["name", "backward", "semantics", "summary"],
                [[r["name"], r["backward"], r["semantics"], r["summary"]] for r in rows])
    click.echo("synchronous: one optimizer step after every microbatch's gradient (a flush each step);"
               " asynchronous: weight versions, no flush, gradients one step stale (PipeDream-2BW)")


@main.command(name="simulate")
@input_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON, with per-op start and end times.")
def simulate_cmd(problem: str, memory_limit, objective, name: str | None, as_json: bool) -> None:
    """Simulate one schedule: times, bubble, memory per rank.

    INPUT is a schedule file (from `schedc solve` or `schedc compile`) or a problem file with -s.
    """
    prob, schedule = schedule_input(problem, name, memory_limit, objective)
    _report(simulate(prob, schedule), prob.name or problem, as_json)


def _report(t: Timeline, where: str, as_json: bool) -> None:
    """What `simulate` and `import` print: a summary table and the critical path, or JSON with
    every op's times and the critical path."""
    prob = t.problem
    critical = critical_path(t)
    if as_json:
        out = {**t.summary(), "rank_time": t.rank_time().summary(), **policy_report(prob, t.schedule)}
        out["ops"] = [
            {"rank": r, "kind": op.kind.value, "stage": op.stage, "mb": op.mb, "start": s, "end": e}
            for op, (r, s, e) in t.op_times().items()
        ]
        out["critical_path"] = critical.summary()
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(
        f"{t.schedule.name} on {where}: p={prob.ranks} m={prob.microbatches} v={prob.chunks}"
        f" objective={prob.objective}"
    )
    click.echo(
        f"makespan {fmt(t.makespan)}  span {fmt(t.span)}  bubble {100 * t.bubble_rate('makespan'):.2f}%"
        f" (makespan) / {100 * t.bubble_rate('span'):.2f}% (span)"
    )
    click.echo(f"time: {t.rank_time()}")
    if not t.schedule.synchronous or prob.objective == "steady":
        click.echo(f"per microbatch {fmt(t.per_microbatch)} in the steady state, bubble"
                   f" {100 * t.bubble_rate('steady'):.2f}%"
                   + ("" if t.schedule.synchronous else
                      f" (asynchronous: {t.schedule.rounds} rounds of {prob.microbatches} microbatches, weight"
                      " versions; makespan and span cover every round)"))
    limits = prob.memory_limit
    rows = [
        [
            str(r),
            fmt(t.busy[r]),
            fmt(t.idle()[r]),
            fmt(t.rank_span[r]),
            fmt(t.peak_memory[r]),
            fmt(limits[r]) if limits else "-",
            *([fmt(t.exposed_reduce[r])] if t.comm else []),
        ]
        for r in range(prob.ranks)
    ]
    print_table(["rank", "busy", "idle", "span", "peak mem", "limit", *(["all-reduce after"] if t.comm else [])], rows)
    if prob.policies:
        click.echo(f"{t.schedule.name}: {policies_line(prob, t.schedule)}")
    click.echo(critical.describe())
    for v in t.violations:
        click.echo(f"memory limit exceeded: {v}")


@main.command()
@problem_options
@click.option("--schedules", "names", type=NameList(solvers.REGISTRY, "schedule"),
              help="Comma-separated schedule names, each once (default: the whole registry).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Also draw every schedule's Gantt chart (.png/.svg).")
@click.option("--torch", "with_torch", is_flag=True,
              help="Also compare torch.distributed.pipelining's own schedules (needs torch).")
def compare(
    problem: str, memory_limit, objective, names: list[str] | None, as_json: bool, plot: str | None, with_torch: bool
) -> None:
    """Compare schedules on PROBLEM: makespan, span, bubble, peak memory, fit."""
    prob = read_problem(problem, memory_limit, objective)
    # (name, why it does not apply, timeline): one entry per schedule, in the order asked.
    entries: list[tuple[str, str | None, Timeline | None]] = [
        (e.name, e.reason, e.timeline) for e in solvers.evaluate(prob, names)
    ]
    if with_torch:
        from schedc.runtime.torch_schedules import torch_schedules  # torch: only with --torch

        for name, schedule, reason in torch_schedules(prob):
            try:  # torch's order is judged like ours: an incomplete or deadlocking one is n/a
                entries.append((name, reason, None if reason else simulate(prob, schedule)))
            except ScheduleError as e:
                entries.append((name, str(e).removeprefix(f"{name}: "), None))
    timelines = [t for _, _, t in entries if t is not None]
    if plot:

        if not timelines:
            raise SchedcError("no schedule applies to this problem, nothing to plot")
        draw_gantt(timelines, plot, title=f"{prob.name}: p={prob.ranks} m={prob.microbatches} v={prob.chunks}")
    if as_json:
        results = [
            {"schedule": name, "applies": False, "reason": reason} if t is None
            else {"applies": True, **t.summary(), "per_microbatch": t.per_microbatch, "synchronous": t.schedule.synchronous,
                  **policy_report(prob, t.schedule)}
            for name, reason, t in entries
        ]
        click.echo(json.dumps({"problem": prob.name, "objective": prob.objective, "results": results}, indent=2))
        return
    click.echo(
        f"{prob.name or problem}: p={prob.ranks} m={prob.microbatches} v={prob.chunks} placement={_placement(prob)}"
        + (f" replicas={prob.pipelines} (m per direction)" if prob.replicas else "")
        + (f" sequence_chunks={prob.seq_chunks}" if prob.sequence_chunks else "")
        + f" comm={fmt(prob.comm)} objective={prob.objective}"
    )
    timeline_table(prob, [(name, t) for name, _, t in entries if t is not None])
    for name, reason, t in entries:
        if t is None:
            click.echo(f"n/a {name}: {reason}")
    if plot:
        click.echo(f"wrote {plot}")


def _placement(prob: Problem) -> str:
    return prob.placement if isinstance(prob.placement, str) else "explicit"


@main.command()
@click.option("-p", "--ranks", "p", type=click.IntRange(min=1), required=True, help="Pipeline ranks.")
@click.option("-m", "--microbatches", "m", type=click.IntRange(min=1), required=True, help="Microbatches.")
@click.option("-v", "--chunks", "v", type=click.IntRange(min=1), default=1, show_default=True, help="Chunks per rank.")
@click.option("-F", "F", type=Finite(min=0, min_open=True), default=1.0, show_default=True,
              help="Forward time of one microbatch through a whole rank.")
@click.option("-B", "B", type=Finite(min=0, min_open=True), default=1.0, show_default=True,
              help="Input-gradient time, whole rank.")
@click.option("-W", "W", type=Finite(min=0, min_open=True), default=1.0, show_default=True,
              help="Weight-gradient time, whole rank.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bubble(p: int, m: int, v: int, F: float, B: float, W: float, as_json: bool) -> None:
    """The published bubble and memory formulas side by side (no problem file needed).

    Bubble is the idle time of the busiest rank per iteration; peak activation is on rank 0
    in microbatches of one rank's activations.
    """

    rows = bubble_table(p, m, v, F, B, W)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"p={p} m={m} v={v} F={fmt(F)} B={fmt(B)} W={fmt(W)}: work per rank {fmt(m * (F + B + W))}")
    print_table(
        ["schedule", "bubble", "bubble%", "peak act (mb)", "exact when", "source"],
        [
            [r["schedule"], fmt(r["bubble"]), f"{100 * r['bubble_rate']:.2f}", fmt(r["peak_activation"]),
             r["holds"], r["source"]]
            for r in rows
        ],
    )


@main.command()
@input_options
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

    prob, schedule = schedule_input(problem, name, memory_limit, objective)
    t = simulate(prob, schedule)
    timelines = [t]
    memory = None
    if measured:

        run = measured_timeline(measured, prob, schedule)
        timelines.append(run)
        click.echo(
            f"simulated makespan {fmt(t.makespan)}, measured {fmt(run.makespan)}"
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
    # One time axis for the simulated and the measured run, so that their lengths compare at a glance.
    draw_gantt(timelines, output, measured_memory=memory, critical={0: critical_path(t)}, shared_axis=True)
    if prob.policies:
        click.echo(f"{schedule.name}: {policies_line(prob, schedule)}")
    click.echo(f"wrote {output}")
    if trace:
        write_trace(t, trace)
        click.echo(f"wrote {trace} (open in https://ui.perfetto.dev or chrome://tracing)")


@main.command()
@input_options
@click.option("--format", "fmt", type=click.Choice(["torch-csv", "torch-comms-csv"]), default="torch-csv",
              show_default=True,
              help="torch-csv: torch.distributed.pipelining's compute-only CSV, one row per rank (torch adds its own"
                   " sends and receives); torch-comms-csv: torch's compute_comms CSV, with schedc's sends, receives"
                   " and REDUCE_GRAD (load it with _load_csv(path, format=\"compute_comms\")).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="File to write, e.g. FILE.csv.")
@click.option("--renumber", is_flag=True,
              help="Renumber the microbatches in the order the last stage runs their forwards, which torch's runtime"
                   " assumes (the same schedule; `schedc solve --torch` writes it so).")
def export(problem: str, memory_limit, objective, name: str | None, fmt: str, output: str, renumber: bool) -> None:
    """Write a schedule in another tool's format.

    INPUT is a schedule file (from `schedc solve` or `schedc compile`) or a problem file with -s.
    What torch's runtime assumes is checked first (one line naming what it cannot run).
    """

    prob, schedule = schedule_input(problem, name, memory_limit, objective)
    schedule = torch_ready(prob, schedule, renumber)  # before lowering: one line naming what torch cannot run
    if fmt == "torch-comms-csv":
        program = CompiledSchedule.build(prob, schedule).program
        write_torch_csv(program, output)
        n_comm = sum(i.op in COMM for instrs in program.ranks for i in instrs)
        click.echo(f"wrote {output} ({schedule.name}: {len(schedule.ranks)} ranks, {schedule.n_ops} ops,"
                   f" {n_comm} sends and receives)")
        return
    write_torch_csv(schedule, output)
    click.echo(f"wrote {output} ({schedule.name}: {len(schedule.ranks)} ranks, {schedule.n_ops} ops)")


@main.command(name="compile")
@problem_options
@click.option("-s", "--schedule", "name", required=True, help="A registry schedule (see `schedc schedules`).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Schedule file to write (.json).")
def compile_cmd(problem: str, memory_limit, objective, name: str, output: str) -> None:
    """Lower a registry schedule on PROBLEM to a schedule file (`schedc solve` writes the same
    format for the ILP's schedule)."""
    compiled = CompiledSchedule.build(*schedule_input(problem, name, memory_limit, objective))
    compiled.save(output)
    t = compiled.timeline
    click.echo(
        f"wrote {output}: {name}, {compiled.program.n_instructions} instructions on {len(t.schedule.ranks)} ranks,"
        f" {t.problem.objective} {fmt(t.objective_value())}, bubble {100 * t.bubble_rate():.2f}%"
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

    compiled = load(schedule_file, verify=True)  # checks the program in full (the report is that check's); one line if anything is off
    report = compiled.report
    if as_json:
        click.echo(json.dumps({"file": schedule_file, "ok": True, "schedule": compiled.name, **report.summary()}, indent=2))
    else:
        click.echo(f"{schedule_file}: ok: {compiled.name}, {compiled.program.n_instructions} instructions, no deadlock")
        print_table(
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
def schema() -> None:
    """Print the JSON Schema of the schedule file."""

    click.echo(json.dumps(file_schema(), indent=2))


@main.command(name="import")
@click.argument("csv_file", metavar="FILE.csv", type=click.Path(dir_okay=False))
@problem_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON, with per-op start and end times.")
def import_cmd(csv_file: str, problem: str, memory_limit, objective, as_json: bool) -> None:
    """Read a torch.distributed.pipelining CSV schedule, check it on PROBLEM and simulate it."""

    prob = read_problem(problem, memory_limit, objective)
    _report(simulate(prob, from_torch_csv(Path(csv_file))), prob.name or problem, as_json)


