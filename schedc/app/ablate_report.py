"""An ablation study's report: results.csv, summary.md and the figures (frontier, speed-up, Gantt)."""

from __future__ import annotations

import csv
from pathlib import Path


from schedc.app.plot import draw_frontier, draw_gantt, draw_speedup
from schedc.app.results import ILP, Row, best_heuristic, outcome
from schedc.app.ablate_config import AblationConfig, Cell


COLUMNS = ["cell", "problem", "ranks", "microbatches", "chunks", "placement", "comm", "objective", "memory_factor",
           "memory_limit", "schedule", "status", "makespan", "span", "objective_value", "bubble", "peak_memory",
           "bound", "gap", "seconds", "measured_ms"]
# A study with a policies axis, or of problems that allow recompute or offload, has these columns too.
POLICY_COLUMNS = ["policies", "recompute", "selective", "offload"]


def columns(rows: list[Row]) -> list[str]:
    """results.csv's (and --json's) columns: COLUMNS, and POLICY_COLUMNS where a row has a value there."""
    return COLUMNS + (POLICY_COLUMNS if any(getattr(r, c) is not None for r in rows for c in POLICY_COLUMNS) else [])


def write_report(config: AblationConfig, cells: list[Cell], rows: list[Row], timelines: dict, out: Path) -> None:
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.writer(f)
        names = columns(rows)
        w.writerow(names)
        for r in rows:
            w.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in names])
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
