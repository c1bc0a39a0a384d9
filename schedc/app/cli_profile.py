"""``schedc profile``: a model's costs and memory on this machine, written as a problem file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import yaml

from schedc.app.cli_base import Finite, fmt, main, print_table
from schedc.errors import SchedcError


def spread_comment(prof) -> str:
    """The problem file's comment lines on how far the times can be trusted: per stage the spread of
    F, B, W's repeats ((p75 - p25) / median), the measurements taken and the warning, if any."""
    n = len(prof.F)
    lines = [f"# spread of the repeats, (p75 - p25) / median, per stage: "
             + "; ".join(f"{k} " + " ".join(f"{100 * x:.1f}%" for x in prof.spread[k])
                         for k in "FBW" if k in prof.spread)
             + f" ({prof.measurements} measurement{'s' if prof.measurements > 1 else ''}, {n} stages)"]
    if prof.warning:
        lines.append(f"# warning: {prof.warning}")
    return "\n".join(lines) + "\n" if prof.spread else ""


@main.command()
@click.argument("model", metavar="MODEL")
@click.option("-p", "--ranks", type=click.IntRange(min=1), required=True, help="Pipeline ranks.")
@click.option("-m", "--microbatches", type=click.IntRange(min=1), required=True,
              help="Microbatches per iteration (the model's batch is split into this many).")
@click.option("-v", "--chunks", type=click.IntRange(min=1), default=1, show_default=True, help="Stages per rank.")
@click.option("--placement", type=click.Choice(["loop", "v"]), default="loop", show_default=True)
@click.option("--partition", type=click.Choice(["time", "params", "uniform"]), default="time", show_default=True,
              help="time: balance profiled F+B+W per block (DP); params: balance parameter counts; uniform.")
@click.option("--comm", type=Finite(min=0), help="Transfer time in ms (default: measured between two local processes).")
@click.option("--memory-limit", type=Finite(min=0, min_open=True), help="Memory limit per rank, MiB.")
@click.option("--objective", type=click.Choice(["makespan", "span", "steady"]), default="makespan", show_default=True)
@click.option("--threads", type=click.IntRange(min=1),
              help="torch threads while profiling on CPU (default: the cores each of the ranks will get).")
@click.option("--repeats", type=click.IntRange(min=1), default=7, show_default=True, help="Timed runs per op (median).")
@click.option("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available, else cpu).")
@click.option("--policies/--no-policies", default=False, show_default=True,
              help="Also write the recompute: and offload: sections (recompute time and what a recomputed"
                   " microbatch keeps, selective recompute where every stage marks a part, copy time from the"
                   " measured host<->device bandwidth; on CPU a memcpy's).")
@click.option("--data-parallel", type=click.IntRange(min=1), default=1, show_default=True,
              help="Data-parallel replicas: also write the data_parallel section, each stage's gradient all-reduce"
                   " estimated from its size and an all-reduce measured between two local processes.")
@click.option("--replicas", type=click.IntRange(min=1, max=2), default=1, show_default=True,
              help="2: two pipelines in opposite directions (Chimera, DualPipe, BitPipe): also write the replicas"
                   " section, each stage's copies' gradient sum estimated from the same all-reduce measurement.")
@click.option("--layers", "per_layer", is_flag=True,
              help="Profile each block on its own and write a layer-level problem for `schedc plan` (the cut,"
                   " chunks and placement left to plan) instead of a stage problem.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Problem file to write (.yaml).")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
@click.option("--strict", is_flag=True,
              help="Fail (exit 2, nothing written) when the timings are noisy after re-measuring, instead of warning.")
def profile(model: str, ranks: int, microbatches: int, chunks: int, placement: str, partition: str,
            comm: float | None, memory_limit: float | None, objective: str, threads: int | None, repeats: int,
            device: str | None, policies: bool, data_parallel: int, replicas: int, per_layer: bool, output: str,
            as_json: bool, strict: bool) -> None:
    """Profile a model on this machine and write the Problem for `schedc solve`.

    MODEL is FILE.py:FUNCTION (FILE imported as Python runs a script: its folder on sys.path)
    or MODULE:FUNCTION, returning a schedc.runtime.ModelSpec
    (blocks in pipeline order, one batch, the loss), e.g. examples/train_gpt.py:gpt. The blocks
    are cut into ranks x chunks stages, each stage's F, B and W are timed (median after warm-up,
    the stages' repeats interleaved), its activation and static memory measured, and the transfer
    between two ranks timed. Times are in ms, memory in MiB; the partition is kept in the problem's
    stage_blocks. With --policies, also what activation recompute and offload cost and keep per
    stage. When the repeats spread, or stages of the same blocks disagree, over a limit, the stages
    are measured again (twice at most), then a one-line warning names them (--strict: an error).
    With --layers, each block is profiled alone and the file is a layer-level problem for
    `schedc plan` (docs/plan.md), which chooses the cut, chunks and placement itself.
    See docs/profile.md.
    """
    from schedc.runtime.device import choose_device  # torch: loaded only by commands that run a model
    from schedc.runtime.profile import load_model_spec, profile_model  # torch, likewise

    dev, n_threads = choose_device(device, ranks, threads)
    say = (lambda msg: None) if as_json else (lambda msg: click.echo(msg, err=True))
    spec = load_model_spec(model)
    say(f"profiling {model} on {dev} ({n_threads} threads): {len(spec.blocks)} blocks,"
        f" batch {tuple(spec.batch[0].shape)}, {microbatches} microbatches")
    name = Path(output).stem
    if per_layer:
        _profile_layers(spec, ranks, microbatches, comm, memory_limit, objective, name, repeats, dev, say, policies,
                        output, as_json, strict, (chunks, placement, partition, data_parallel, replicas))
        return
    try:
        prob, prof = profile_model(spec, ranks=ranks, microbatches=microbatches, chunks=chunks, placement=placement,
                                   partition=partition, comm=comm, memory_limit=memory_limit, objective=objective,
                                   name=name, repeats=repeats, device=dev, progress=say, policies=policies,
                                   data_parallel=data_parallel, replicas=replicas)
    except ValueError as e:
        raise SchedcError(str(e)) from None
    from schedc.runtime.noise import advice  # schedc.runtime's package imports torch: loaded here, as above

    if prof.warning and strict:
        raise SchedcError(f"--strict: {prof.warning} {advice()}; nothing written to {output}")
    data = prob.model_dump(exclude_none=True)
    header = (f"# {' '.join(['schedc', *sys.argv[1:]])}\n# profiled on {dev} with {n_threads} threads;"
              f" times in ms, memory in MiB; stage_blocks: model blocks per stage\n" + spread_comment(prof))
    if _written(output, header, data, prof, "problem", as_json):
        return
    print_table(
        ["stage", "blocks", "F ms", "B ms", "W ms", "BW ms", "spread F/B/W %", "activation MiB", "kept for W",
         "static MiB"],
        [[str(s), str(prob.stage_blocks[s]), fmt(prof.F[s]), fmt(prof.B[s]), fmt(prof.W[s]), fmt(prof.BW[s]),
          "/".join(f"{100 * prof.spread[k][s]:.0f}" for k in "FBW"),
          fmt(prof.activation[s]), fmt(prof.kept_for_w[s]), fmt(prof.static[s])] for s in range(prob.pipeline_stages)],
    )
    if policies and prof.recompute:
        print_table(
            ["stage", "recompute ms", "keeps MiB", "selective ms", "selective keeps MiB", "copy ms"],
            [[str(s), fmt(prof.recompute[s]), fmt(prof.keep[s]), fmt(prof.selective[s]), fmt(prof.selective_keep[s]),
              fmt(prof.offload[s])] for s in range(prob.pipeline_stages)],
        )
        click.echo(f"copy bandwidth {fmt(prof.copy_bandwidth)} MiB/ms"
                   + (" (CPU: a memcpy, no device memory to copy to)" if prof.device == "cpu" else ""))
        if prob.recompute is not None and prob.recompute.selective is None:
            click.echo("no recompute.selective: a stage marks no part for it (schedc_selective)")
    if prob.data_parallel is not None:
        click.echo(f"gradient all-reduce over {prob.data_parallel.degree} replicas, ms per stage: "
                   + " ".join(fmt(x) for x in prob.cost["AR"]) + " (estimated from a 2-process all-reduce)")
    if prob.tied is not None:
        click.echo(f"tied weights: stages {prob.tied.groups}; their gradient sum, ms per stage: "
                   + " ".join(fmt(x) for x in prob.cost["TS"][:prob.pipeline_stages]) + " (estimated likewise)")
    if prob.pipelines > 1:
        click.echo(f"two directions: the sum of a stage's copies, ms per stage: "
                   + " ".join(fmt(x) for x in prob.cost["RS"][:prob.pipeline_stages]) + " (estimated likewise)")
    click.echo(f"comm {fmt(prob.comm)} ms; wrote {output}")




def _profile_layers(spec, ranks, microbatches, comm, memory_limit, objective, name, repeats, dev, say, policies,
                    output, as_json, strict, stage_options) -> None:
    """``schedc profile --layers``: each block alone, written as a layer-level problem."""
    from schedc.runtime.noise import advice  # torch: loaded only by commands that run a model, as above
    from schedc.runtime.profile import profile_layers  # torch, likewise

    if stage_options != (1, "loop", "time", 1, 1):
        raise click.UsageError("--layers leaves the cut, chunks and placement to `schedc plan`: drop -v, --placement,"
                               " --partition, --data-parallel and --replicas")
    if objective == "steady":
        raise click.UsageError("--layers: plan's objectives are makespan and span")
    try:
        layers, prof = profile_layers(spec, ranks=ranks, microbatches=microbatches, comm=comm,
                                      memory_limit=memory_limit, objective=objective, name=name, repeats=repeats,
                                      device=dev, progress=say, recompute=policies)
    except ValueError as e:
        raise SchedcError(str(e)) from None
    if prof.warning and strict:
        raise SchedcError(f"--strict: {prof.warning} {advice()}; nothing written to {output}")
    data = layers.model_dump(mode="json", exclude_none=True)
    header = (f"# {' '.join(['schedc', *sys.argv[1:]])}\n# each block profiled alone on {dev}; times in ms, memory"
              " in MiB; types E, t, L guessed (first, middle, last block): edit them where they do not hold\n")
    if _written(output, header, data, prof, "layers", as_json):
        return
    print_table(["block", "type", "F ms", "B ms", "W ms", "activation MiB", "kept for W", "static MiB"],
                [[str(k), b.type, fmt(b.F), fmt(b.B), fmt(b.W), fmt(b.activation), fmt(b.held_for_w), fmt(b.static)]
                 for k, b in enumerate(layers.blocks)])
    click.echo(f"comm {fmt(layers.comm)} ms; wrote {output} (for `schedc plan`)")


def _written(output: str, header: str, data: dict, prof, key: str, as_json: bool) -> bool:
    """Write ``data`` under ``header`` to ``output``, warn where the timings are noisy, and with
    ``as_json`` print it (under ``key``) with the profile: True when that is all there is to print."""
    from schedc.runtime.noise import advice  # torch: loaded only by commands that run a model, as above

    try:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None))
    except OSError as e:
        raise SchedcError(f"{output}: cannot write: {e.strerror or e}") from None
    if prof.warning:
        click.echo(f"warning: {prof.warning} {advice()}", err=True)
    if as_json:
        click.echo(json.dumps({key: data, "profile": prof.to_dict(), "output": output}, indent=2))
    return as_json
