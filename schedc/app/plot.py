"""Pictures of Timelines: a Gantt chart with memory curves (draw_gantt), a Perfetto trace
(write_trace); and of ablation studies: the memory / bubble frontier (draw_frontier), the solver's
speed-ups (draw_speedup).

matplotlib is imported inside draw_gantt (no pyplot, so no global backend state), so importing this
module stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from schedc.app.results import outcome
from schedc.errors import SchedcError
from schedc.kinds import ROWS, in_order
from schedc.simulate import Timeline

if TYPE_CHECKING:  # only a type here
    from schedc.critical import CriticalPath

KIND_COLORS = {k: row.color for k, row in ROWS.items()}  # from the kinds' rows (schedc.kinds)
KIND_NAMES = {k: row.title for k, row in ROWS.items()}
CRITICAL_COLOR = "black"
FORMATS = (".png", ".svg", ".pdf")
WIDTH_IN = 14.0  # figure width; the time axis gets about WIDTH_IN - AXIS_MARGIN_IN inches
AXIS_MARGIN_IN = 1.4  # the rank labels left of a chart, the margins
MAX_WIDTH_IN = 32.0  # a chart too crowded for labels grows wider up to this; narrower boxes go unlabelled
MAX_HEIGHT_IN = 60.0
MIN_FONT = 6.0  # points: the smallest microbatch number legible at the saved resolution (110 dpi)


def memory_steps(timeline: Timeline) -> list[list[tuple[float, float]]]:
    """Per rank, the memory level (static included) as step points ``(time, level)``: the levels
    ``simulate`` counts.

    Each op's delta is ``Problem.op_delta`` under its (stage, microbatch)'s policy (the forward of a
    recomputed microbatch allocates only what it keeps; R, S and a reload L allocate, an offload O
    frees). An allocating op counts from its start, a freeing one from its end; the ops of the
    compute and copy lanes merge by time, a free before an allocation at one instant, and changes
    at one instant are merged. The first point is at time 0 (static memory unless an allocation
    starts then); the last level is static plus the final activation.
    """
    p = timeline.problem
    schedule = timeline.schedule
    policy = schedule.policies()
    times = timeline.lane_times()
    steps = []
    for r in range(p.ranks):
        events = sorted(
            (s if d > 0 else e, 1 if d > 0 else 0, d)
            for lane, per_rank in timeline.lanes.items()
            for op, s, e in zip(per_rank[r], times[lane][0][r], times[lane][1][r])
            for d in (p.op_delta(op.kind, op.stage, op.mb, policy.get((op.stage, op.mb))),)
        )
        level = timeline.static_memory[r]
        points = [(0.0, level)]
        for t, _, delta in events:
            level += delta
            if t == points[-1][0]:  # a free and an allocation at one instant: keep the level after both
                points.pop()
            points.append((t, level))
        steps.append(points)
    return steps


def write_trace(timeline: Timeline, path: str | Path) -> None:
    """Write a Chrome / Perfetto trace (one cost unit shown as one millisecond): a track per rank
    (``tid`` r) and, for each other lane of the timeline (the copy lane where the schedule offloads,
    the comm lane of the gradient all-reduces), a track per rank (``tid`` k p + r for the k-th lane,
    "rank r copy", sorted under its rank's track), and a memory counter per rank."""
    name = timeline.schedule.name
    p = timeline.problem.ranks
    lanes = timeline.lanes
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": name}}]
    times = timeline.lane_times()
    for k, (lane, per_rank) in enumerate(lanes.items()):
        starts, ends = times[lane]
        for r, ops in enumerate(per_rank):
            tid = k * p + r
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                           "args": {"name": f"rank {r}" if lane == "compute" else f"rank {r} {lane}"}})
            if len(lanes) > 1:  # the side lanes' tracks right under their rank's
                events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid,
                               "args": {"sort_index": len(lanes) * r + k}})
            for op, s, e in zip(ops, starts[r], ends[r]):
                events.append({
                    "name": f"{op.kind}{op.mb}", "cat": op.kind, "ph": "X", "pid": 0, "tid": tid,
                    "ts": s * 1000, "dur": (e - s) * 1000,
                    "args": {"stage": op.stage, "microbatch": op.mb, "kind": op.kind},
                })
    for r, points in enumerate(memory_steps(timeline)):
        events += [
            {"name": f"memory rank {r}", "ph": "C", "pid": 0, "ts": t * 1000, "args": {"memory": level}}
            for t, level in points
        ]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


def draw_gantt(timelines: list[Timeline], path: str | Path, *, title: str | None = None,
               measured_memory: dict[int, list[list[tuple[float, float]]]] | None = None,
               critical: dict[int, CriticalPath] | None = None, shared_axis: bool = False) -> None:
    """Draw each timeline as a Gantt chart over its memory curves (``gantt_figure``) into ``path``
    (.png, .svg or .pdf)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise SchedcError(f"{path}: unknown figure format {path.suffix!r}: use {', '.join(FORMATS)}")
    if not timelines:
        raise SchedcError(f"{path}: no schedules to draw")
    _save(gantt_figure(timelines, title=title, measured_memory=measured_memory, critical=critical,
                       shared_axis=shared_axis), path)


def gantt_figure(timelines: list[Timeline], *, title: str | None = None,
                 measured_memory: dict[int, list[list[tuple[float, float]]]] | None = None,
                 critical: dict[int, CriticalPath] | None = None, shared_axis: bool = False):
    """Each timeline as a Gantt chart over its memory curves, each on its own time axis (a
    schedule of 27 units is not squeezed into the axis of one of 200), every box labelled with
    its microbatch (``_draw_ops``; the figure is widened, up to ``MAX_WIDTH_IN``, until the
    narrowest box holds a label). An asynchronous schedule is drawn over its first round's span
    (``_window``), its title saying so and how many rounds it has. ``shared_axis``: one time
    axis for all (as for a simulated and a measured run of one schedule), where every timeline
    is synchronous. ``measured_memory``: for the timeline at an index, per rank the measured
    activation memory as step points (time, level; ``schedc.trace.measured_memory``), drawn solid
    over that timeline's simulated curve (dashed) with the problem's static memory added, so both
    are in the problem's memory units (MiB for a problem from ``schedc profile``). ``critical``:
    for the timeline at an index, its critical path (``schedc.critical.critical_path``), outlined
    in black with a line for each wait on another rank. A matplotlib Figure (no pyplot)."""
    if not timelines:
        raise SchedcError("no schedules to draw")
    # A bare Figure, not pyplot: no global backend switch, no figure registry to leak into; it
    # renders with Agg (png) or matplotlib's svg / pdf backends and is freed with its last reference.
    from matplotlib.figure import Figure  # heavy: loaded only to draw
    from matplotlib.patches import Patch  # heavy: loaded only to draw

    windows = [_window(t) for t in timelines]
    if shared_axis and all(t.schedule.synchronous for t in timelines):
        end = max(w[1] for w in windows)
        windows = [(0.0, end) for _ in windows]
    # Heights in inches: one row per rank, a fixed memory panel, shrunk together past the cap.
    # Taller rows where ops run together, stacked in their rank's row (``_stacks``).
    depth = [max((len(g) for groups in _stacks(t) for g in groups), default=1) for t in timelines]
    gantt_h = [max(1.2, 0.32 * t.problem.ranks) * (1 + 0.6 * (d - 1)) for t, d in zip(timelines, depth)]
    mem_h = 1.4
    total = sum(gantt_h) + len(timelines) * (mem_h + 0.9) + 0.8
    scale = min(1.0, MAX_HEIGHT_IN / total)
    width = _figure_width(timelines, windows)
    fig = Figure(figsize=(width, total * scale), layout="constrained")
    ratios = [h for g in gantt_h for h in (g, mem_h)]
    axes = fig.subplots(2 * len(timelines), 1, gridspec_kw={"height_ratios": ratios})
    for i, (tl, (t0, t1)) in enumerate(zip(timelines, windows)):
        ax_g, ax_m = axes[2 * i], axes[2 * i + 1]
        _rank_axis(ax_g, tl.problem.ranks, gantt_h[i] * scale * 72 / tl.problem.ranks)
        _draw_memory(ax_m, tl, (measured_memory or {}).get(i))
        if tl.makespan <= t1:
            ax_g.axvline(tl.makespan, color="black", linestyle="--", linewidth=1)
        for ax in (ax_g, ax_m):
            ax.set_xlim(t0, t0 + (t1 - t0) * 1.02)
        ax_g.set_title(_block_title(tl, t1), fontsize=10, loc="left")
    axes[-1].set_xlabel("time")
    kinds = in_order({op.kind for t in timelines for per_rank in t.lanes.values() for ops in per_rank for op in ops})
    handles = [Patch(color=KIND_COLORS[k], label=KIND_NAMES[k]) for k in kinds]
    if any(t.problem.chunks > 1 for t in timelines):
        handles.append(Patch(color=_shade("#808080", 1, 2), label="lighter: higher chunk"))
    if critical:
        handles.append(Patch(facecolor="none", edgecolor=CRITICAL_COLOR, linewidth=1.5, label="critical path"))
    handles.append(Patch(color="none", label="numbers: microbatch"))
    if max(depth) > 1:
        handles.append(Patch(color="none", label="stacked: run together"))
    # As many entries a line as fit the width (a 9-point character is about 5 points, a patch 30).
    per_line, used = 0, 0.0
    for h in handles:
        used += 5.0 * len(h.get_label()) + 30
        if used > (width - 0.5) * 72:
            break
        per_line += 1
    fig.legend(handles=handles, loc="outside upper center", ncol=max(1, per_line), fontsize=9, frameon=False,
               title=title, title_fontsize=12)
    # The boxes and their labels last, at the scale the layout gave each chart (points per time unit
    # and per rank row), so that a label is sized to the box it is drawn in.
    fig.get_layout_engine().execute(fig)
    for i, (tl, window) in enumerate(zip(timelines, windows)):
        ax_g = axes[2 * i]
        box = ax_g.get_window_extent()
        x0, x1 = ax_g.get_xlim()
        pt = 72 / fig.dpi  # points per display pixel
        _draw_ops(ax_g, tl, box.width * pt / (x1 - x0), box.height * pt / tl.problem.ranks, window)
        if critical and i in critical:
            _draw_critical(ax_g, critical[i])
    return fig


def _window(tl: Timeline) -> tuple[float, float]:
    """The time a chart shows: the whole timeline, or for an asynchronous schedule the span of its
    first round (until its last op ends; the next round's first ops, which overlap it, shown too):
    later rounds repeat it, and all of them would shrink its boxes below a legible label."""
    end = tl.makespan if tl.schedule.synchronous else tl.round_ends()[0]
    return 0.0, end or 1.0


def _figure_width(timelines: list[Timeline], windows: list[tuple[float, float]]) -> float:
    """Inches: ``WIDTH_IN``, or wider (up to ``MAX_WIDTH_IN``) where a chart's narrowest compute
    box would be too narrow for a label set on end at ``MIN_FONT``."""
    width = WIDTH_IN
    for tl, (t0, t1) in zip(timelines, windows):
        starts, ends = tl.lane_times()["compute"]
        narrow = min((min(e, t1) - max(s, t0) for rs, re_ in zip(starts, ends) for s, e in zip(rs, re_)
                      if min(e, t1) - max(s, t0) > 1e-9 * (t1 - t0)), default=None)
        if narrow:
            need = 1.1 * (_ON_END * MIN_FONT + _PAD + 0.4)  # points the narrowest box must be wide, edges
            width = max(width, need / narrow * (t1 - t0) * 1.02 / 72 + AXIS_MARGIN_IN)  # and margins with it
    return min(width, MAX_WIDTH_IN)


def _block_title(tl: Timeline, shown: float | None = None) -> str:
    """The chart's title: its schedule and what the simulator says of it; for an asynchronous
    schedule its rounds and, where the chart shows less than the whole, which part."""
    fits = "" if tl.fits else ", OVER the memory limit"
    policies = policy_text(tl.schedule.policy_counts()) if tl.schedule.policies() else ""
    if tl.schedule.synchronous:
        head = f"{tl.schedule.name}: makespan {tl.makespan:g}, span {tl.span:g}"
    else:
        window = f"; round 1 shown, 0-{shown:g} of {tl.makespan:g}" if shown and shown < tl.makespan else ""
        head = (f"{tl.schedule.name} (asynchronous, {tl.schedule.rounds} rounds of"
                f" {tl.problem.microbatches * tl.problem.pipelines} microbatches{window}):"
                f" {tl.per_microbatch:g} per microbatch in the steady state, makespan {tl.makespan:g}")
    return (f"{head}, bubble {tl.bubble_rate():.1%} ({tl.problem.objective}),"
            f" peak memory {max(tl.peak_memory):g}{fits}" + (f"; {policies}" if policies else ""))


def policy_text(counts: dict[str, int]) -> str:
    """``Schedule.policy_counts`` in words: "recomputes 3, selectively 2, offloads 4 (stage,
    microbatch)s", the policies with none left out ("" for none)."""
    words = {"recompute": "recomputes", "selective": "selectively recomputes", "offload": "offloads"}
    parts = [f"{words.get(policy, policy)} {n}" for policy, n in counts.items() if n]
    return ", ".join(parts) + " (stage, microbatch)s" if parts else ""


# The rows of a rank in a Gantt chart, as (bottom, top) around the rank's y: the compute lane's
# boxes fill it; each other lane (copy, comm) the timeline has is a thin row under the compute boxes.
_SIDE_ROW, _GAP = 0.18, 0.04


def _lane_rows(tl: Timeline) -> dict[str, tuple[float, float]]:
    sides = [lane for lane in tl.lanes if lane != "compute"]
    top = 0.4 if not sides else 0.44 - len(sides) * (_SIDE_ROW + _GAP)
    rows = {"compute": (-0.4, top)}
    for k, lane in enumerate(sides):
        lo = top + _GAP + k * (_SIDE_ROW + _GAP)
        rows[lane] = (lo, lo + _SIDE_ROW)
    return rows


# A label's extent in points, for a font of ``size``: a digit is ``_DIGIT`` x size wide, a line
# ``_LINE`` x size high (ascent and descent), with ``_PAD`` between the text and the box's edges.
_DIGIT, _LINE, _PAD = 0.64, 1.2, 2.0
_ON_END = _LINE  # a label set on end (rotated) takes a line's height across the box


def _label_font(width_pt: float, height_pt: float, chars: int, largest: float) -> tuple[float, int] | None:
    """The font size and rotation (0 or 90 degrees) of a ``chars`` long label in a box of
    ``width_pt`` x ``height_pt`` points: across at the largest size that fits up to ``largest``,
    else on end in a narrow, tall box; None where neither fits at ``MIN_FONT`` or more."""
    across = min(largest, (width_pt - _PAD) / (_DIGIT * chars), (height_pt - _PAD) / _LINE)
    if across >= MIN_FONT:
        return across, 0
    on_end = min(largest, (width_pt - _PAD) / _ON_END, (height_pt - _PAD) / (_DIGIT * chars))
    if on_end >= MIN_FONT:
        return on_end, 90
    return None


def _stacks(tl: Timeline) -> list[list[list[int]]]:
    """Per rank, its compute ops (by index in the lane) grouped where they overlap in time: a pair
    that runs together (DualPipe's overlapped forward and backward) is a group of two, drawn one
    above the other; every other op is a group of one."""
    starts, ends = tl.lane_times()["compute"]
    eps = 1e-9 * max(tl.makespan, 1e-300)
    out = []
    for rs, re_ in zip(starts, ends):
        groups: list[list[int]] = []
        end = float("-inf")
        for k in sorted(range(len(rs)), key=lambda k: (rs[k], re_[k])):
            if groups and rs[k] < end - eps:
                groups[-1].append(k)
                end = max(end, re_[k])
            else:
                groups.append([k])
                end = re_[k]
        out.append(groups)
    return out


def _rank_axis(ax, ranks: int, row_pt: float) -> None:
    """A Gantt chart's rows: rank 0 on top, each named."""
    ax.set_ylim(ranks - 0.5, -0.5)
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)], fontsize=min(9.0, 0.8 * row_pt))
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _draw_ops(ax, tl: Timeline, pt_per_unit: float, row_pt: float, window: tuple[float, float] | None = None) -> None:
    """One row per rank (rank 0 on top), a box per op with its microbatch: across the box at up
    to 9 points, smaller in narrower boxes, on end in the narrowest (``_label_font``); only where
    the text fits inside its box, so no two labels overlap. Ops that run together on a rank (a
    pair) share its row, one above the other (``_stacks``). ``window``: the time shown (a box cut
    by its edge is labelled in the part shown)."""
    from matplotlib.collections import PolyCollection  # heavy: loaded only to draw

    p = tl.problem
    rows = _lane_rows(tl)
    times = tl.lane_times()
    t0, t1 = window or (0.0, tl.makespan)
    stacked = {}  # (rank, index in the compute lane) -> (its place in its group, the group's size)
    for r, groups in enumerate(_stacks(tl)):
        for group in groups:
            for j, k in enumerate(group):
                stacked[r, k] = (j, len(group))
    boxes, colors, labels = [], [], []
    for lane, per_rank in tl.lanes.items():
        starts, ends = times[lane]
        for r, ops in enumerate(per_rank):
            for k, (op, s, e) in enumerate(zip(ops, starts[r], ends[r])):
                lo, hi = rows[lane]
                if lane == "compute":
                    j, n = stacked[r, k]
                    lo, hi = lo + (hi - lo) * j / n, lo + (hi - lo) * (j + 1) / n
                boxes.append([(s, r + lo), (e, r + lo), (e, r + hi), (s, r + hi)])
                colors.append(_shade(KIND_COLORS[op.kind], op.stage // p.ranks, p.chunks))
                if lane == "compute" and min(e, t1) > max(s, t0):  # the other rows are too thin for text
                    labels.append((max(s, t0), min(e, t1), r + lo, r + hi, str(op.mb), colors[-1]))
    widths = sorted(e - s for s, e, *_ in labels)
    median_pt = widths[len(widths) // 2] * pt_per_unit if widths else 0.0
    edge = 0.4 if median_pt > 4 else 0.0  # white gaps would wash out very narrow boxes
    ax.add_collection(PolyCollection(boxes, facecolors=colors, edgecolors="white", linewidths=edge))
    largest = min(9.0, 0.6 * row_pt)
    for s, e, lo, hi, text, color in labels:
        font = _label_font((e - s) * pt_per_unit - edge, (hi - lo) * row_pt - edge, len(text), largest)
        if font is not None:
            ax.text((s + e) / 2, (lo + hi) / 2, text, ha="center", va="center", fontsize=font[0],
                    rotation=font[1], rotation_mode="anchor", color=_ink(color), clip_on=True, in_layout=False)
    _rank_axis(ax, p.ranks, row_pt)


def _draw_critical(ax, path: CriticalPath) -> None:
    """The chain's boxes outlined, and a line from each op to the one on another rank that
    waited for it (its result's transfer). For the span, only the window is drawn."""
    from matplotlib.collections import LineCollection, PolyCollection  # heavy: loaded only to draw

    t0, t1 = path.window
    rows = _lane_rows(path.timeline)
    span = [rows[ROWS[op.kind].lane] for op in path.ops]  # per op, its lane's row
    boxes = [[(max(s, t0), r + lo), (e, r + lo), (e, r + hi), (max(s, t0), r + hi)]
             for (r, s, e), (lo, hi) in zip(path.times, span)]
    ax.add_collection(PolyCollection(boxes, facecolors="none", edgecolors=CRITICAL_COLOR, linewidths=1.5, zorder=3))
    middle = [r + (lo + hi) / 2 for (r, _, _), (lo, hi) in zip(path.times, span)]
    hops = [  # a line where the chain moves to another rank, or between a rank's lanes
        [(max(e, t0), ya), (s, yb)]
        for (_, _, e), (_, s, _), ya, yb in zip(path.times, path.times[1:], middle, middle[1:])
        if ya != yb
    ]
    ax.add_collection(LineCollection(hops, colors=CRITICAL_COLOR, linewidths=1.2, zorder=3))
    if path.objective == "span":
        ax.axvline(t0, color=CRITICAL_COLOR, linestyle=":", linewidth=1)


def _draw_memory(ax, tl: Timeline, measured: list[list[tuple[float, float]]] | None = None) -> None:
    """Memory (static + activation) per rank as a step function; the limit dashed, and dotted
    below it the limit less the rank's working memory, where any is set. With
    ``measured`` (per rank, activation memory step points): those solid, the simulated dashed."""
    import matplotlib as mpl  # heavy: loaded only to draw

    p = tl.problem
    cmap = mpl.colormaps["viridis"]
    top = max([*tl.peak_memory, *(p.memory_limit or ())])
    for r, points in enumerate(memory_steps(tl)):
        color = cmap(r / max(1, p.ranks - 1) * 0.9)
        ts, levels = zip(*points, (tl.makespan, points[-1][1]))
        if measured is None:
            ax.step(ts, levels, where="post", linewidth=1, color=color, label=f"rank {r}")
            continue
        ax.step(ts, levels, where="post", linewidth=0.8, linestyle="--", color=color,
                label="simulated (dashed)" if r == 0 else None)
        mts, mlevels = zip(*measured[r])
        mlevels = [p.static_memory[r] + level for level in mlevels]
        ax.step(mts, mlevels, where="post", linewidth=1.2, color=color, label=f"rank {r} measured")
        top = max(top, *mlevels)
    for i, limit in enumerate(sorted(set(p.memory_limit or ()))):
        ax.axhline(limit, color="red", linestyle="--", linewidth=1, label=None if i else "limit")
    # What the curve may reach: an op's working memory (memory.working) comes on top while it runs.
    rooms = sorted({limit - w for limit, w in zip(p.memory_limit or (), p.working_memory) if w > 0})
    for i, room in enumerate(rooms):
        ax.axhline(room, color="red", linestyle=":", linewidth=1, label=None if i else "limit - working memory")
    ax.set_ylabel("memory" if measured is None else "memory (MiB)", fontsize=9)
    ax.set_ylim(0, top * 1.35 or 1.0)  # headroom for the legend
    if p.ranks <= 8:
        ax.legend(fontsize=7, ncol=p.ranks + 1, loc="upper right", frameon=False)
    else:
        ax.text(0.995, 0.97, f"rank 0 (dark) .. rank {p.ranks - 1} (light)", transform=ax.transAxes,
                ha="right", va="top", fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def _shade(color: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """``color`` mixed with white, more for higher chunks (chunk 0 keeps the full colour)."""
    from matplotlib.colors import to_rgb  # heavy: loaded only to draw

    mix = 0.55 * chunk / max(1, chunks - 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(color))


def _ink(rgb: tuple[float, float, float]) -> str:
    """Black or white text, whichever reads better on ``rgb``."""
    return "black" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 0.6 else "white"


def _settings(rows) -> dict[tuple, list]:
    """Ablation rows grouped by everything but the memory limit and the schedule."""
    groups: dict[tuple, list] = {}
    for r in rows:
        key = (r.problem, r.ranks, r.microbatches, r.chunks, r.placement, r.comm, r.objective, r.policies)
        groups.setdefault(key, []).append(r)
    return groups


def draw_frontier(rows, path: str | Path, *, title: str | None = None) -> None:
    """Bubble against memory limit (x 1F1B's activation memory), one line per schedule, one panel
    per setting of the grid: where each schedule fits, and what it buys. No limit is drawn at the
    right of the axis."""
    from matplotlib.figure import Figure  # heavy: loaded only to draw

    groups = _settings(rows)
    factors = sorted({r.memory_factor for r in rows if r.memory_factor is not None})
    unlimited = (max(factors) + 0.5) if factors else 1.0
    names = list(dict.fromkeys(r.schedule for r in rows if r.schedule != "ilp"))
    palette = [f"C{i}" for i in range(10)]
    color = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    n = len(groups)
    cols = min(3, n)
    nrows = (n + cols - 1) // cols
    fig = Figure(figsize=(5.2 * cols, 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax, ((problem, p, m, v, placement, comm, objective, policies), group) in zip(axes.flat, groups.items()):
        for name in dict.fromkeys(r.schedule for r in group):
            pts = sorted(
                ((unlimited if r.memory_factor is None else r.memory_factor), 100 * r.bubble)
                for r in group if r.schedule == name and r.fits
            )
            if pts:
                style = (dict(color="black", linewidth=1.6, linestyle="--", zorder=5) if name == "ilp"
                         else dict(color=color[name], linewidth=1.2, alpha=0.85))
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=name, **style)
        ax.set_title(f"{problem}: p={p} m={m} v={v} {placement}" + (f" comm={comm:.3g}" if comm else "")
                     + (f" {policies}" if policies else ""), fontsize=9)
        ticks = sorted({(unlimited if r.memory_factor is None else r.memory_factor) for r in group})
        ax.set_xticks(ticks, [("none" if x == unlimited and None in {r.memory_factor for r in group} else f"{x:g}")
                              for x in ticks])
        ax.set_xlabel("memory limit (x 1F1B activation memory)", fontsize=8)
        ax.set_ylabel(f"bubble % ({objective})", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles: dict = {}
    for ax in list(axes.flat)[:n]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=8)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def draw_speedup(by_cell: dict, path: str | Path, *, title: str | None = None) -> None:
    """Per cell, the solved schedule's speed-up over the best fitting heuristic and over 1F1B."""
    from matplotlib.figure import Figure  # heavy: loaded only to draw


    labels, vs_best, vs_1f1b = [], [], []
    for cell_id, rows in by_cell.items():
        o = outcome(rows)
        if o.ilp is None:
            continue
        labels.append(cell_id)
        vs_best.append(float("nan") if o.vs_best is None else o.vs_best)
        vs_1f1b.append(float("nan") if o.vs_1f1b is None else o.vs_1f1b)
    fig = Figure(figsize=(9, 0.3 * len(labels) + 1.6), layout="constrained")
    ax = fig.subplots()
    y = list(range(len(labels)))
    # Bars grow from 1.0 (no speed-up), labelled with their value.
    for offset, values, label, color in ((-0.2, vs_best, "over the best heuristic that fits", "#3b75af"),
                                         (0.2, vs_1f1b, "over 1F1B (where it fits)", "#bbbbbb")):
        ys = [i + offset for i in y]
        ax.barh(ys, [x - 1 for x in values], left=1.0, height=0.4, label=label, color=color)
        for yy, x in zip(ys, values):
            if x == x:
                ax.text(max(x, 1.0), yy, f" {x:.3f}", va="center", fontsize=6)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speed-up of the solved schedule (objective ratio)")
    finite = [x for x in vs_best + vs_1f1b if x == x]
    if finite:
        ax.set_xlim(min(0.995, min(finite) - 0.01), max(finite) * 1.03)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title)
    _save(fig, path)


def _save(fig, path: str | Path) -> None:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise SchedcError(f"{path}: unknown figure format {path.suffix!r}: use {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110 if path.suffix.lower() == ".png" else None)
