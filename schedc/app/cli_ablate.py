"""``schedc ablate``: an ablation study over a grid of problems and schedules."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from schedc.app.ablate import run
from schedc.app.ablate_config import MAX_CELLS, load_config
from schedc.app.ablate_report import columns, headline_table
from schedc.app.cli_base import main


@main.command()
@click.argument("config", metavar="CONFIG.yaml")
@click.option("-o", "--output", type=click.Path(file_okay=False),
              help="Report folder (default: out/NAME, NAME from the config).")
@click.option("--json", "as_json", is_flag=True, help="Print every row as JSON instead of the summary table.")
@click.option("-q", "--quiet", is_flag=True,
              help="No per-cell progress on stderr; a longer run still prints, as cells finish, a line at most"
                   " once a minute (cells done, time so far, time left), and the solver's worst case up front"
                   " if over a minute.")
@click.option("--max-cells", type=click.IntRange(min=1), default=MAX_CELLS, show_default=True,
              help="Refuse a grid of more cells than this (each cell simulates every schedule and may solve"
                   " for the solver's time limit).")
def ablate(config: str, output: str | None, as_json: bool, quiet: bool, max_cells: int) -> None:
    """Run an ablation study: every cell of CONFIG's grid, every schedule (and the solver),
    simulated, and run with the runtime where the config asks. Writes a report folder:
    results.csv, summary.md, frontier.png, speedup.png and Gantt charts.

    See examples/ablation.yaml for the format.
    """

    cfg = load_config(config, max_cells)
    out = Path(output or Path("out") / cfg.name)
    echo = lambda msg: click.echo(msg, err=True)  # noqa: E731
    rows = run(cfg, out, progress=None if quiet else echo, pulse=echo if quiet else None, max_cells=max_cells)
    if as_json:
        names = columns(rows)
        click.echo(json.dumps([{c: asdict(r)[c] for c in names} for r in rows], indent=1))
        return
    by_cell: dict[str, list] = {}
    for r in rows:
        by_cell.setdefault(r.cell, []).append(r)
    click.echo("\n".join(headline_table(by_cell)))
    click.echo(f"wrote {out}/results.csv, summary.md, frontier.png, speedup.png")


