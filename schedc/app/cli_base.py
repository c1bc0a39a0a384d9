"""The ``schedc`` command group and what its commands share: options, reading a problem or
schedule file, tables. Mistakes in input exit with status 2 and one line on stderr."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

import schedc.solvers as solvers
from schedc.errors import SchedcError
from schedc.inputs import one_line, shorten
from schedc.kinds import ROWS
from schedc.problem import Problem, load_problem
from schedc.schedfile import load_any
from schedc.schedule import Schedule
from schedc.simulate import Timeline


# command -> the module of schedc.app that defines it, imported when the command runs (or when the
# help lists every command), so that a command loads what it uses and no other command's code:
# `schedc solve` no ablation layer, plotting or networkx, `schedc simulate` and `check` none of
# those nor solve's command module (tests/test_deps.py).
COMMANDS = {
    **dict.fromkeys(("schedules", "simulate", "compare", "bubble", "show", "export", "compile", "check", "schema",
                     "import"), "cli_schedules"),
    "solve": "cli_solve",
    "plan": "cli_plan",
    "profile": "cli_profile",
    "ablate": "cli_ablate",
}


@dataclass(frozen=True)
class ProgramStart:
    """What the `schedc` console script hands its commands (as click's ``obj``): the
    ``time.perf_counter()`` reading at which its process started, so that ``--time-limit`` counts
    the interpreter's start and the imports too."""

    at: float


class Group(click.Group):
    """Every mistake in input, in a file or on the command line, and a file the system will not
    read or write: one line on stderr, exit status 2. Commands are loaded when asked for
    (``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            # Its commands register on ``main``. (``__import__``, the import statement's own path:
            # ``python -X importtime`` lists it, as it does not what importlib.import_module loads.)
            __import__(f"schedc.app.{COMMANDS[cmd_name]}")
        return super().get_command(ctx, cmd_name)

    def all_commands(self) -> dict[str, click.Command]:
        """Every command, each module loaded: name -> command."""
        for name in COMMANDS:
            self.get_command(click.Context(self), name)
        return self.commands

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


class Finite(click.FloatRange):
    """A FloatRange that also refuses nan and infinities (click's lets them through)."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class Registered(click.Choice):
    """A choice among a registry's names as they are when the option is read, so that a name
    registered after import (a solver backend, a transport) is offered and accepted too."""

    def __init__(self, registry: Mapping[str, Any]) -> None:
        super().__init__(())
        self.registry = registry

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(sorted(getattr(self, "registry", ())))

    @choices.setter
    def choices(self, value: tuple[str, ...]) -> None:  # click.Choice.__init__ assigns it; the registry rules
        pass


class NameList(click.ParamType):
    """A comma-separated list of names from a registry (read when the option is): each name is
    stripped of spaces; an empty list, an empty name (``a,,b``, ``,``), a name given twice or an
    unknown one is refused, naming the option and the known names."""

    name = "names"

    def __init__(self, registry: Mapping[str, Any], what: str = "name") -> None:
        self.registry, self.what = registry, what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):  # already converted (a default, or a second pass)
            return value
        text = str(value)
        names = [n.strip() for n in text.split(",")]
        known = ", ".join(self.registry)
        if not any(names):
            self.fail(f"no {self.what} name in {shorten(text)}: give comma-separated names, e.g."
                      f" {','.join(list(self.registry)[:2])} (known: {known})", param, ctx)
        if "" in names:
            self.fail(f"empty {self.what} name at position {names.index('') + 1} in {shorten(text)}:"
                      " separate names with single commas", param, ctx)
        seen: set[str] = set()
        for n in names:
            if n in seen:
                self.fail(f"{self.what} {shorten(n)} is given twice: give each once", param, ctx)
            seen.add(n)
            if n not in self.registry:
                self.fail(f"unknown {self.what} {shorten(n)}; known: {known}", param, ctx)
        return names


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="schedc")
def main() -> None:
    """schedc: compile pipeline-parallel training schedules.

    A PROBLEM file (YAML or JSON) gives ranks, microbatches, chunks, placement, per-stage
    F/B/W costs, communication latency and memory; see examples/problems/. Schedules are
    judged by one simulator; `schedc schedules` lists the named ones.
    """


def read_problem(path: str, memory_limit: float | None, objective: str | None) -> Problem:
    return override(load_problem(path), memory_limit, objective)


def override(problem: Problem, memory_limit: float | None, objective: str | None) -> Problem:
    changes: dict[str, Any] = {}
    if memory_limit is not None:
        changes["memory"] = {"limit": memory_limit}
    if objective is not None:
        changes["objective"] = objective
    return problem.with_changes(**changes) if changes else problem


def schedule_input(path: str, name: str | None, memory_limit, objective) -> tuple[Problem, Schedule]:
    """INPUT is a schedule file (its problem and schedule) or a problem file with ``-s NAME``."""

    loaded = load_any(path)
    if isinstance(loaded, Problem):
        if name is None:
            raise click.UsageError(f"{path} is a problem file: name a schedule with -s/--schedule")
        problem = override(loaded, memory_limit, objective)
        return problem, solvers.build(name, problem)
    if name is not None:
        raise click.UsageError(f"{path} is a schedule file (it holds {loaded.name!r}); -s applies to problem files")
    return override(loaded.problem, memory_limit, objective), loaded.schedule


INPUT_HELP = "A registry schedule (see `schedc schedules`); needed when INPUT is a problem file."


def input_options(fn):
    """INPUT (a schedule file, or a problem file with -s NAME) and the problem overrides."""
    fn = click.option("-s", "--schedule", "name", help=INPUT_HELP)(fn)
    return problem_options(fn, metavar="INPUT")


def problem_options(fn, metavar: str = "PROBLEM"):
    fn = click.option(
        "--objective", type=click.Choice(["makespan", "span", "steady"]),
        help="Override the problem's objective (steady: time per microbatch, iterations back to back)."
    )(fn)
    fn = click.option(
        "--memory-limit", type=Finite(min=0, min_open=True), help="Override the memory limit (every rank), same unit as the problem."
    )(fn)
    return click.argument("problem", metavar=metavar)(fn)


def fmt(x: float) -> str:
    return f"{x:.6g}"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    click.echo(line(headers))
    click.echo(line(["-" * w for w in widths]))
    for r in rows:
        click.echo(line(r))


def peaks(values: list[float] | tuple[float, ...]) -> str:
    if len(values) <= 8:
        return " ".join(fmt(x) for x in values)
    top = max(range(len(values)), key=values.__getitem__)
    return f"max {fmt(values[top])} (rank {top})"


def fits_text(t: Timeline) -> str:
    if t.problem.memory_limit is None:
        return "-"
    if t.fits:
        return "yes"
    worst = max(t.violations, key=lambda v: v.over)
    return f"no (rank {worst.rank} +{fmt(worst.over)})"


def policy_names(prob: Problem) -> list[str]:
    """The policies (``KindRow.policy``: recompute, selective, offload) the problem allows, in the
    kinds' order; none for a problem without ``recompute`` or ``offload``."""
    return [ROWS[k].policy for k in prob.policies]


def policy_report(prob: Problem, schedule: Schedule) -> dict[str, dict[str, int]]:
    """For --json: ``{"policies": {policy: (stage, microbatch)s that use it}}`` where the problem
    allows recompute or offload (every policy it allows, 0 where unused); ``{}`` otherwise, so that
    a problem without them reports what it always did."""
    names = policy_names(prob)
    counts = schedule.policy_counts()
    return {"policies": {n: counts[n] for n in names}} if names else {}


def policies_line(prob: Problem, schedule: Schedule) -> str:
    """How many (stage, microbatch) of ``schedule`` use each policy the problem allows, of how many:
    "2 recompute, 0 selective, 1 offload of 8 (stage, microbatch)s" (`simulate`, `show`, `solve`)."""
    counts = policy_report(prob, schedule)["policies"]
    return (", ".join(f"{n} {policy}" for policy, n in counts.items())
            + f" of {prob.n_stages * prob.microbatches} (stage, microbatch)s")


def timeline_table(prob: Problem, named: list[tuple[str, Timeline]]) -> None:
    """The comparison table of `compare` and `solve`: one row per schedule; where the problem
    allows recompute or offload, a column per policy it allows: how many (stage, microbatch) of
    the schedule use it. Where a schedule is asynchronous (or the objective is ``steady``), the
    time per microbatch in the steady state beside, and an asynchronous one's name says so: its
    makespan and span cover all its rounds."""
    policies = policy_names(prob)
    steady = prob.objective == "steady" or any(not t.schedule.synchronous for _, t in named)
    rows = [
        [name + ("" if t.schedule.synchronous else f" (async, {t.schedule.rounds} rounds)"),
         fmt(t.makespan), fmt(t.span), *([fmt(t.per_microbatch)] if steady else []),
         f"{100 * t.bubble_rate():.2f}", peaks(t.peak_memory), fits_text(t),
         *(str(t.schedule.policy_counts()[n]) for n in policies)]
        for name, t in named
    ]
    print_table(["schedule", "makespan", "span", *(["per microbatch"] if steady else []), f"bubble% ({prob.objective})",
                 "peak memory per rank", "fits", *policies], rows)

