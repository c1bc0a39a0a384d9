"""``schedc solve``: the exact search, within a wall-clock limit for the whole command."""

from __future__ import annotations

import json
import time

import click

from schedc.app.cli_base import (
    Finite, ProgramStart, Registered, fmt, main, policies_line, policy_report, problem_options, read_problem,
    timeline_table,
)
from schedc.critical import critical_path
from schedc.schedfile import CompiledSchedule, load
from schedc.solvers.search.auto import AUTO, backend_for
from schedc.solvers.search.common import BACKENDS
from schedc.solvers.deadline import Budget
from schedc.solvers.search.solve import solve as solve_ilp

# Lowering and writing a schedule file takes about 2.6 to 3 times as long as simulating the schedule
# (p = 64, v = 2, m = 256 and 1024, measured after the per-op work of issue 40): solve() leaves four
# simulations' worth of the time limit unused (its simulations, timed beside other work, run slower
# than the one that times the file's writing).
_WRITE_SIMULATIONS = 4.0


def time_budget(time_limit: float, started: float) -> Budget:
    """The whole command's budget, ``time_limit`` seconds (what a user times). Run as the `schedc`
    program, it counts from the process's start; called in-process (click's test runner, a Python
    caller) from this command's start ``started``, with a second kept for what came before. A
    little more is kept for the exit, and four simulations' worth for writing the file."""
    program = click.get_current_context().find_root().obj
    origin = program.at if isinstance(program, ProgramStart) else started - min(1.0, 0.02 * time_limit)
    budget = Budget.seconds(time_limit, since=origin, kept=_WRITE_SIMULATIONS)
    return budget.less(min(1.0, 0.03 * time_limit)).at_least(1e-3)


@main.command()
@problem_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Schedule file to write (.json).")
@click.option("--time-limit", type=Finite(min=0, min_open=True), default=60.0, show_default=True,
              help="Wall-clock seconds for the whole command: warm start, search, writing the file.")
@click.option("--gap", type=Finite(min=0, max=1), default=1e-4, show_default=True,
              help="Stop when (objective - bound) / objective is below this.")
@click.option("--solver", type=Registered(BACKENDS), default=AUTO, show_default=True,
              help="cbc (bundled with PuLP), highs (needs highspy), cpsat (needs ortools); auto: cpsat where the"
                   " problem declares recompute or offload and OR-Tools is installed, else cbc.")
@click.option("--threads", type=click.IntRange(min=1),
              help="Solver threads (default: the solver's, and with two or more cores a local search"
                   " beside the solver on another).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of tables.")
@click.option("-q", "--quiet", is_flag=True, help="No live progress on stderr.")
@click.option("--torch", "with_torch", is_flag=True,
              help="For torch.distributed.pipelining's runtime: also start from torch's schedules (slow to build for"
                   " large p x m), and number the microbatches in the order the last stage runs their forwards, as"
                   " torch's runtime assumes (the same schedule).")
@click.option("--start", "start_file", type=click.Path(dir_okay=False), metavar="OLD.json",
              help="Re-solve: start from the schedule of this schedule file (one solved before the costs changed;"
                   " its problem must have the same ranks, chunks, placement and microbatches).")
def solve(problem: str, memory_limit, objective, output: str, time_limit: float, gap: float, solver: str,
          threads: int | None, as_json: bool, quiet: bool, with_torch: bool, start_file: str | None) -> None:
    """Find the fastest zero-bubble schedule for PROBLEM under its memory limit (ILP), with a
    proven lower bound, and write it to a schedule file.

    The search starts from the best registry schedule that fits (with --torch, also torch's
    schedules), so the result is never worse; a local search improves it, then the exact search.
    With --torch, the schedule is written for torch's runtime (`schedc export`, `torch_pipeline`).
    With --start OLD.json, OLD.json's schedule is the first candidate (a re-solve after the costs changed).
    A memory limit no schedule can meet exits with status 2 and the smallest feasible limit.
    """

    started = time.perf_counter()
    prob = read_problem(problem, memory_limit, objective)
    start = load(start_file).schedule if start_file is not None else None

    def show_progress(event) -> None:
        if quiet:
            return
        if event.note:
            click.echo(f"{event.seconds:7.1f}s  {event.note}", err=True)
            return
        parts = [f"{event.seconds:7.1f}s"]
        if event.incumbent is not None:
            parts.append(f"incumbent {fmt(event.incumbent)}")
        if event.bound is not None:
            parts.append(f"bound {fmt(event.bound)}")
        if event.incumbent and event.bound is not None:
            parts.append(f"gap {100 * (event.incumbent - event.bound) / event.incumbent:.2f}%")
        click.echo("  ".join(parts), err=True)

    if not quiet:
        backend = f"{backend_for(prob)} (auto)" if solver == AUTO else solver
        click.echo(f"solving {prob.name or problem} with {backend} (time limit {fmt(time_limit)} s) ...", err=True)
    candidates = []
    if with_torch:
        from schedc.runtime.torch_schedules import torch_schedules  # torch: only with --torch

        candidates = [(name, schedule) for name, schedule, _ in torch_schedules(prob) if schedule is not None]
    result = solve_ilp(prob, solver=solver, time_limit=time_budget(time_limit, started), gap=gap, threads=threads,
                       progress=show_progress, candidates=candidates, torch=with_torch, start=start)
    CompiledSchedule.build(prob, result.schedule, result.summary(), timeline=result.timeline).save(output)
    if as_json:
        click.echo(json.dumps({"problem": prob.name, "output": output, **result.summary(),
                               "rank_time": result.timeline.rank_time().summary(),
                               **policy_report(prob, result.schedule)}, indent=2))
        return
    click.echo(
        f"{result.status}: {prob.objective} {fmt(result.objective)}, bound {fmt(result.bound)}"
        f" (gap {100 * result.gap:.2f}%), bubble {100 * result.timeline.bubble_rate():.2f}%,"
        f" {result.seconds:.1f} s; started from {result.warm_start} ({fmt(result.warm_objective)})"
    )
    click.echo(f"bound: {result.bound_reason}")
    click.echo(f"time: {result.timeline.rank_time()}")
    click.echo(critical_path(result.timeline).headline())  # the chain's ranks (simulate: its ops too)
    if prob.policies:
        click.echo(f"policies: {policies_line(prob, result.schedule)}")
    if result.not_evaluated:
        click.echo(f"not evaluated (time limit): {', '.join(result.not_evaluated)}")
    timeline_table(prob, [("ilp", result.timeline), *result.registry])
    click.echo(f"wrote {output}")


