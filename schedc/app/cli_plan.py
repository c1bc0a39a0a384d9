"""``schedc plan``: the layer split, chunks and placement chosen with the schedule."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import click
import yaml

from schedc.app.cli_base import Finite, Registered, fmt, main
from schedc.app.cli_solve import time_budget
from schedc.layers import BIDIRECTIONAL, load_layers
from schedc.layout import deepspeed_parts, megatron_layout, torchtitan_modules
from schedc.solvers.search.common import BACKENDS
from schedc.solvers.search.plan import plan as plan_layers


@main.command()
@click.argument("layers", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Schedule file to write (.json); its problem is the chosen cut's stage problem.")
@click.option("--problem-out", type=click.Path(dir_okay=False), metavar="FILE.yaml",
              help="Also write the chosen stage problem as a problem file.")
@click.option("--time-limit", type=Finite(min=0, min_open=True), default=60.0, show_default=True,
              help="Wall-clock seconds for the whole command: the cuts, the solve, writing the files.")
@click.option("--solver", type=Registered(BACKENDS), default="auto", show_default=True, help="solve's backend (see `schedc solve --help`).")
@click.option("--threads", type=click.IntRange(min=1), help="Solver threads (as `schedc solve`).")
@click.option("--json", "as_json", is_flag=True, help="Print the result, the seeds and the exports as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def plan(layers: str, output: str, problem_out: str | None, time_limit: float, solver: str, threads: int | None,
         as_json: bool, quiet: bool) -> None:
    """Choose the cut of LAYERS' blocks into stages, the chunks per rank, the placement and the
    schedule together, with a lower bound valid over every cut and shape it was allowed.

    LAYERS is a layer-level problem (docs/plan.md): the blocks in model order with their costs and
    memory, and the chunks and placements to consider. The answer is an ordinary schedule file
    (every command reads it) and the layouts to paste: Megatron-LM's
    --pipeline-model-parallel-layout, torchtitan's per-stage modules, DeepSpeed's parts.
    """
    started = time.perf_counter()
    lp = load_layers(layers)

    def say(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    say(f"planning {lp.name or layers}: {len(lp.blocks)} blocks on {lp.ranks} ranks, shapes "
        + ", ".join(f"{v} chunk(s) {pl}" for v, pl in lp.shapes) + f" (time limit {fmt(time_limit)} s) ...")
    result = plan_layers(lp, time_limit=time_budget(time_limit, started), solver=solver, threads=threads, say=say)
    result.compiled().save(output)
    if problem_out is not None:
        data = result.problem.model_dump(mode="json", exclude_none=True)
        Path(problem_out).write_text(f"# written by schedc plan from {layers}\n" + yaml.safe_dump(data, sort_keys=False))
    exports = layout_exports(lp, result.chosen.sizes, result.chosen.chunks, result.chosen.placement)
    if as_json:
        click.echo(json.dumps({"layers": lp.name, "output": output, **result.summary(), "exports": exports}, indent=2))
        return
    chosen = result.chosen
    click.echo(f"plan: {chosen.chunks} chunk(s), {chosen.placement}, blocks per stage {chosen.sizes}")
    click.echo(f"{lp.objective} {fmt(result.objective)} ({result.result.status} for this cut, gap"
               f" {100 * result.result.gap:.2f}% to its own bound), bound over every cut and shape"
               f" {fmt(result.bound)} (gap {100 * result.gap:.2f}%)")
    click.echo(f"bound: {result.bound_reason}")
    click.echo("baselines (best registry schedule of the seed cuts; the cut searched from the best):")
    for c in [*result.seeds, *result.best_per_shape]:
        value = fmt(c.objective) if c.objective < math.inf else "nothing fits"
        click.echo(f"  {c.chunks} chunk(s) {c.placement:13} {c.seed:18} {value:>12}  {c.schedule}  {c.sizes}")
    for name, value in exports.items():
        click.echo(f"{name}: {value if isinstance(value, str) else json.dumps(value)}")
    click.echo(f"wrote {output}" + (f" and {problem_out}" if problem_out else ""))


def layout_exports(lp, sizes: list[int], chunks: int, placement: str) -> dict:
    """The cut in each framework's terms; where one cannot hold it, why not."""
    types = [b.type for b in lp.blocks]
    out: dict = {}
    for name, make in (("megatron", lambda: megatron_layout(sizes, types, placement)),
                       ("torchtitan", lambda: torchtitan_modules(sizes, lp.module_names)),
                       ("deepspeed", lambda: deepspeed_parts(sizes, chunks)),
                       ("stage_blocks", lambda: list(sizes))):
        if placement == BIDIRECTIONAL and name in ("torchtitan", "deepspeed"):
            out[name] = f"n/a: {name}'s pipeline schedules run one direction, not two"
            continue
        try:
            out[name] = make()
        except ValueError as e:  # (ProblemError: this framework cannot hold the cut)
            out[name] = f"n/a: {e}"
    return out
