"""Memory for time: `schedc solve` (order and keep / recompute / offload per stage and microbatch,
decided together) against the schedules users run today, on the zero-bubble paper's settings,
at memory limits from a quarter to twice 1F1B's activation memory.

    python benchmarks/memory_time.py [--write] [--time-limit S] [--only TEXT] [--placement loop|v] [--jobs N] [--resume]
    python benchmarks/memory_time.py --report [--write] [--rebound]   # the table again from a finished run's cells
    python benchmarks/memory_time.py --rebound-published [--write]   # the published table, this checkout's bounds
    python benchmarks/memory_time.py --problems   # only (re)write examples/problems/memory-time/

Sources and the model (see benchmarks/zb_paper.py for the settings themselves):

- Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024): the 12 settings (Table 3 models,
  Table 9 profiled T_F, T_B, T_W, T_comm per stage), memory per layer M_B = 34h + 5as (Table 1),
  W keeps M_W = 32h. Memory is in units of one stage's M_B, as in zb_paper.py.
- Recompute (Korthikanti et al. 2022): full recompute keeps the stage's input, 2h bytes per token
  against a stage's (L + 2) / p layers of 34h + 5as (L, the layer count of Table 3: 22, 30, 46, 62;
  the first and last stage hold the embedding and the output layer in place of a transformer
  layer), and takes a forward (recompute time = F). Selective recompute keeps 34h per layer and
  recomputes the attention core: 4bs^2h of the forward's 24bsh^2 + 4bs^2h FLOPs, so it takes
  F * s / (6h + s).
- Offload (PipeOffload, ICML 2025): copying a microbatch's activation to host memory, and back,
  each takes (34h + 5as) bytes per token per layer at 15 GB/s, against the forward's
  24h^2 + 4sh FLOPs per token per layer at 220 TFLOPS: copy time = F * (34h + 5as) / 15e9 /
  ((24h^2 + 4sh) / 220e12). At these figures a copy takes 7 to 22 forwards (the settings' h is
  small against 220 TFLOPS / 15 GB/s), so offload pays only across long idle times; the search
  finds out where.
- Limits: 0.25, 0.33, 0.5, 0.75, 1 and 2 x 1F1B's activation memory (p M_B); no static memory.
  Loop placement (one stage per rank) and V placement (two chunks per rank, each half a stage's
  costs and memory), objective span, as the paper measures its bubble.

Per cell: every registry schedule through `schedc compare` (the best that fits is "best
baseline"; 1F1B with full recompute, `1f1b-recompute`, is what Megatron-LM users run below 1F1B's
memory: each recompute inside the backward, once the gradient has arrived), and
`schedc solve --time-limit S` (the wall time of the whole command), whose file is read back with
`schedc simulate`: the reported span is the simulated one. 1F1B runs on the loop placement only,
so a V row's "vs 1F1B with full recompute" holds it against the loop row of the same setting and
limit (the same model and memory). Below the table, each cell whose gap passes issue 39's line
(2 % at 0.5x and above, 5 % below) with where the rank that sets solve's span spends its time
besides its F, B and W (recompute, and idle in its warm-up, steady state and cool-down:
``Timeline.rank_time``), the rank whose compute takes the most of the critical path, and the first
clause of the bound's reason: which side a gap lies on starts there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from schedc import Problem, load_problem
from schedc.critical import critical_path
from schedc.kinds import Kind
from schedc.schedfile import load
from schedc.solvers.bounds import lower_bound

sys.path.insert(0, os.path.dirname(__file__))

from _results import commit as current_commit  # noqa: E402
from zb_paper import COSTS, MODELS, SEQ, paper_problem, run_json  # noqa: E402  (the paper's settings, one transcription)

ROOT = Path(__file__).resolve().parent.parent
PROBLEM_DIR = ROOT / "examples" / "problems" / "memory-time"
LAYERS = {"1.5B": 22, "6.2B": 30, "14.6B": 46, "28.3B": 62}  # Table 3
LIMITS = (0.25, 0.33, 0.5, 0.75, 1.0, 2.0)  # x 1F1B's activation memory, p M_B
BANDWIDTH, FLOPS = 15e9, 220e12  # host <-> device bytes/s, device FLOP/s (PipeOffload's A100 figures)
MEGATRON = "1f1b-recompute"  # what Megatron-LM users run below 1F1B's memory
TITLE = "## Memory for time: recompute and offload decided by solve\n\n"  # the full table's section


def policy_model(model: str) -> dict[str, float]:
    """Per stage, as fractions of a stage's forward time and of its M_B: what full and selective
    recompute keep, what selective recompute takes, and what a copy takes."""
    p, h, a = MODELS[model]
    layers = (LAYERS[model] + 2) / p
    per_layer = 34 * h + 5 * a * SEQ  # bytes per token
    return {
        "keep": 2 * h / (layers * per_layer),
        "selective_keep": 34 * h / per_layer,
        "selective_time": SEQ / (6 * h + SEQ),
        "copy_time": (per_layer / BANDWIDTH) / ((24 * h * h + 4 * SEQ * h) / FLOPS),
    }


def problem_of(model: str, m: int, limit: float, v_shape: bool) -> Problem:
    """The setting (model, m) at ``limit`` x p M_B, with recompute (full and selective) and
    offload declared."""
    paper = paper_problem(model, m, 1, v_shape=v_shape)
    f, pol = paper.cost[Kind.F][0], policy_model(model)
    scale = 0.5 if v_shape else 1.0
    return paper.with_changes(
        name=f"mt-{model}-m{m}-{limit:g}x" + ("-v" if v_shape else ""),
        memory={"limit": round(limit * paper.ranks, 9)},
        recompute=dict(
            time=f,
            keep=round(pol["keep"] * scale, 9),
            selective=dict(time=round(f * pol["selective_time"], 6), keep=round(pol["selective_keep"] * scale, 9)),
        ),
        offload=dict(time=round(f * pol["copy_time"], 6)),
    )


def cells() -> list[tuple[str, int, float, bool]]:
    return [(model, m, limit, v) for v in (False, True) for (model, m) in COSTS for limit in LIMITS]


def write_problems(directory: Path = PROBLEM_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for model, m, limit, v in cells():
        problem = problem_of(model, m, limit, v)
        head = [
            f"# Zero Bubble Pipeline Parallelism (Qi et al., ICLR 2024), model {model}, m = {m}, memory limit"
            f" {limit:g} x 1F1B's activation memory;",
            "# recompute and offload from the model in benchmarks/memory_time.py. Written by that script.",
        ]
        path = directory / f"{problem.name}.yaml"
        path.write_text("\n".join(head) + "\n" + yaml.safe_dump(problem.model_dump(exclude_none=True), sort_keys=False))
        paths.append(path)
    return paths


def run_cell(path: Path, time_limit: float, out_dir: Path, shared: bool = False) -> dict:
    """The baselines (compare) and solve's answer on one problem file; ``shared``: other cells run
    at the same time, so the solve takes one core (``--threads 1``: no local search beside its
    backend on a second core, which another cell is using)."""
    compared, _, err = run_json(["compare", str(path)], timeout=1800)
    if compared is None:
        return {"error": f"compare: {err}"}
    baselines = {row["schedule"]: row["span"] for row in compared["results"] if row.get("applies") and row["fits"]}
    output = out_dir / f"{path.stem}.json"
    solved, wall, err = run_json(["solve", str(path), "-o", str(output), "--time-limit", str(time_limit), "-q"]
                                 + (["--threads", "1"] if shared else []), timeout=10 * time_limit + 120)
    if solved is None:
        return {"error": f"solve: {err}", "baselines": baselines, "wall": wall}
    sim, _, err = run_json(["simulate", str(output)], timeout=600)
    if sim is None:
        return {"error": f"simulate: {err}", "baselines": baselines, "wall": wall}
    if abs(sim["span"] - solved["span"]) > 1e-9 * max(1.0, solved["span"]):
        raise RuntimeError(f"{output}: solve reported span {solved['span']}, the file simulates to {sim['span']}")
    chain = sim.get("critical_path") or {}
    return {"baselines": baselines, "span": sim["span"], "fits": sim["fits"], "bound": solved.get("bound"),
            "gap": solved.get("gap"), "status": solved.get("status"), "policies": solved.get("policies"),
            "wall": wall, "time": sim.get("rank_time"), "bound_reason": solved.get("bound_reason"),
            "lane": _lane(chain.get("compute"), chain.get("window"))}


def _lane(compute, window) -> list | None:
    """[rank, share]: the rank whose compute ops take the most of a critical path's window (per
    rank, ``CriticalPath.compute``), and that share; None without them."""
    if not compute or not window or window[1] <= window[0]:
        return None
    rank = max(range(len(compute)), key=compute.__getitem__)
    return [rank, compute[rank] / (window[1] - window[0])]


COLORS = {"solve": "#3b75af", "best baseline that fits": "#519e3e", f"{MEGATRON} (loop)": "#ef8636"}


def _megatron(results: dict, model: str, m: int, limit: float) -> float | None:
    """1F1B with full recompute at (model, m, limit): it runs on the loop placement, so a V cell is
    held against the loop cell of the same setting and limit (the same model and memory)."""
    return (results.get((model, m, limit, False)) or {}).get("baselines", {}).get(MEGATRON)


def plot(results: dict, path: Path) -> None:
    """Span against the memory limit, one panel per setting and placement, a curve per schedule
    (solve, 1F1B with full recompute, the best baseline that fits)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(COSTS)
    fig, axes = plt.subplots(4, 6, figsize=(24, 14), squeeze=False)
    for k, (v, (model, m)) in enumerate((v, s) for v in (False, True) for s in settings):
        ax = axes[k // 6][k % 6]
        curves: dict[str, list[tuple[float, float]]] = {name: [] for name in COLORS}
        for limit in LIMITS:
            r = results.get((model, m, limit, v))
            if not r:
                continue
            if "span" in r and r["fits"]:
                curves["solve"].append((limit, r["span"]))
            if r.get("baselines"):
                curves["best baseline that fits"].append((limit, min(r["baselines"].values())))
            megatron = _megatron(results, model, m, limit)
            if megatron is not None:
                curves[f"{MEGATRON} (loop)"].append((limit, megatron))
        for name, points in curves.items():
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", label=name, color=COLORS[name])
        ax.set_xscale("log")
        ax.set_xticks(LIMITS, [f"{x:g}" for x in LIMITS])
        ax.set_title(f"{model} m={m} {'V' if v else 'loop'}", fontsize=9)
        ax.set_xlabel("memory limit (x 1F1B's)", fontsize=8)
        ax.set_ylabel("span (ms)", fontsize=8)
        if k in (0, len(settings)):
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    from _results import machine, refuse_partial_write, write_section

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md and the figure")
    parser.add_argument("--problems", action="store_true", help="only (re)write examples/problems/memory-time/")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve (default 60)")
    parser.add_argument("--only", default="", help="run the cells whose problem name contains this")
    parser.add_argument("--placement", choices=("loop", "v"),
                        help="run the cells of one placement only (--only cannot pick the loop's: every V"
                             " cell's name holds its loop twin's)")
    parser.add_argument("--jobs", type=int, default=1, help="cells run at once (above 1, each solve is given one thread: --threads 1)")
    parser.add_argument("--limits", default=",".join(f"{x:g}" for x in LIMITS),
                        help="the limits to run, as multiples of 1F1B's activation memory (default all)")
    parser.add_argument("--out", default="out/memory-time", help="where the solved schedule files go")
    parser.add_argument("--resume", action="store_true",
                        help="take the cells an earlier run of this commit (and time limit) finished in --out")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: the table (and with --write the figure) from the cells an earlier run "
                             "finished in --out, whatever its commit")
    parser.add_argument("--rebound", action="store_true",
                        help="with --report: each cell's bound (and gap) the larger of its solve's and this checkout's"
                             " lower bound of its problem, for bounds proven better since the run (the spans stay)")
    parser.add_argument("--rebound-published", action="store_true",
                        help="run nothing: the table in benchmarks/RESULTS.md again, each cell's bound (and gap) the"
                             " larger of the published one and this checkout's lower bound (its spans, baselines and"
                             " walls stay); with --write it replaces that table")
    args = parser.parse_args()
    refuse_partial_write(parser, args)
    if args.rebound and not args.report:
        parser.error("--rebound goes with --report")
    paths = write_problems()
    if args.rebound_published:
        text = republished(paths, current_commit())
        print(text)
        if args.write:
            write_section("memory-time", TITLE + text)
        return
    if args.problems:
        print(f"wrote {len(paths)} problems to {PROBLEM_DIR.relative_to(ROOT)}")
        return
    out_dir = ROOT / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    limits = {float(x) for x in args.limits.split(",")}
    unknown = limits - set(LIMITS)
    if unknown:
        parser.error(f"--limits: {', '.join(map(str, sorted(unknown)))} not among {', '.join(f'{x:g}' for x in LIMITS)}")
    chosen = [(cell, path) for cell, path in zip(cells(), paths) if args.only in path.stem and cell[2] in limits
              and (args.placement is None or cell[3] == (args.placement == "v"))]
    results: dict = {}

    head = current_commit()

    def saved_of(path: Path) -> Path:
        return out_dir / f"{path.stem}.cell.json"  # each cell's result as it is done, for --resume

    def one(item):
        cell, path = item
        saved = saved_of(path)
        if (args.resume or args.report) and saved.exists():
            kept = json.loads(saved.read_text())
            if args.report or (kept.get("commit") == head and kept.get("time_limit") == args.time_limit):
                commits[kept.get("commit", "unknown")] += 1
                r = _diagnosed(kept["result"], out_dir / f"{path.stem}.json")
                return cell, (_rebound(r, path) if args.rebound else r)
        r = run_cell(path, args.time_limit, out_dir, shared=args.jobs > 1)
        saved.write_text(json.dumps({"commit": head, "time_limit": args.time_limit, "result": r}))
        commits[head] += 1
        print(path.stem, json.dumps({k: v for k, v in r.items() if k != "baselines"}), flush=True)
        return cell, r

    missing = [path.stem for _, path in chosen if not saved_of(path).exists()]
    if args.report and missing:
        parser.error(f"--report: no result in {args.out} for {', '.join(missing)}: run those cells first")
    commits: Counter[str] = Counter()  # commit -> cells it ran
    began = time.perf_counter()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for done, (cell, r) in enumerate(pool.map(one, chosen), 1):
            results[cell] = r
            left = (time.perf_counter() - began) / done * (len(chosen) - done)
            if not args.report:
                print(f"[{done}/{len(chosen)}] about {left / 60:.0f} min left", flush=True)
    (out_dir / "results.json").write_text(json.dumps([[list(cell), r] for cell, r in results.items()], indent=1))
    command = ("python benchmarks/memory_time.py " + ("--report --write" if args.report else "--write")
               + (f" --time-limit {args.time_limit:g}" if args.time_limit != 60 else "")
               + (f" --jobs {args.jobs}" if args.jobs != 1 else "")
               + (f" --limits {args.limits}" if limits != set(LIMITS) else ""))
    ran = ", ".join(f"{c} ({n} cells)" if len(commits) > 1 else c for c, n in sorted(commits.items()))
    if args.rebound:
        command += " --rebound"
        ran += f"; bounds (and gaps) as of {head}"
    text = report(results, command, f"{machine()}. Commit: {ran}")
    print(text)
    if args.write and limits == set(LIMITS):
        plot(results, Path(__file__).with_name("memory_time.png"))
        write_section("memory-time", TITLE + text)
    elif args.write:  # some limits only: a section of its own, the full table stays
        shown = ", ".join(f"{x:g}x" for x in sorted(limits))
        write_section(f"memory-time-{'-'.join(f'{x:g}' for x in sorted(limits))}",
                      f"### Memory for time at {shown} only\n\n" + text)


def republished(paths: list[Path], head: str) -> str:
    """The memory-time table of benchmarks/RESULTS.md read back (each row's span, bound, best
    baseline, 1F1B with full recompute, policies and wall) and written again with the bounds of this
    checkout (as ``_rebound``, up to the table's rounding of spans to 0.1): a bound proven since
    the run raises its cell's bound and gap, and the figures that follow from them, without
    solving again."""
    from _results import RESULTS

    text = RESULTS.read_text()
    section = text[text.index("<!-- memory-time:begin -->"):text.index("<!-- memory-time:end -->")]
    command = re.search(r"Command: `([^`]*)`", section).group(1)
    machine, ran = re.search(r"Machine: (.*?)\. Commit: ([^;\n]*)", section).groups()
    by_name = {path.stem: path for path in paths}
    results: dict = {}
    for row in section.splitlines():
        cols = [c.strip() for c in row.strip("|").split("|")]
        if len(cols) != 13 or not cols[4].replace(".", "", 1).isdigit():
            continue  # (the header, its rule, a cell that errs or does not fit: none in the table read back)
        model, m, placement, limit = cols[0], int(cols[1]), cols[2], float(cols[3])
        v = placement == "V"
        best_name, best_span = cols[7].rsplit(" ", 1)
        baselines = {best_name: float(best_span)}
        if not v and cols[8]:
            baselines[MEGATRON] = float(cols[8])
        policies = dict((k, int(n)) for k, n in (part.rsplit(" ", 1) for part in cols[11].split(", ") if part))
        r = {"baselines": baselines, "span": float(cols[4]), "fits": True, "bound": float(cols[5]),
             "policies": policies, "wall": float(cols[12])}
        results[(model, m, limit, v)] = _rebound(r, by_name[problem_of(model, m, limit, v).name], rounding=0.05)
    again = " (then --rebound-published)"
    return report(results, command.split(again)[0] + again, f"{machine}. Commit: {ran}; bounds (and gaps) as of {head}")


def _diagnosed(r: dict, schedule: Path) -> dict:
    """A finished cell with where its span-setting rank's time goes (``Timeline.rank_time``) and
    the rank that carries most of its critical path (``_lane``), as ``run_cell`` records them since
    it does, read from its schedule file where the cell lacks them."""
    if "span" not in r or (r.get("time") and r.get("lane")) or not schedule.exists():
        return r
    timeline = load(schedule).timeline
    chain = critical_path(timeline)
    return {**r, "time": timeline.rank_time().summary(), "lane": _lane(chain.compute(), chain.window)}


def _rebound(r: dict, path: Path, rounding: float = 0.0) -> dict:
    """A finished cell with the larger of its solve's bound and this checkout's ``lower_bound`` of
    its problem (a bound is the problem's alone), the gap to it and the bound's reason. ``rounding``:
    how far the cell's span and bound may be off (a published table's, rounded): a bound within it
    of this checkout's is taken as this checkout's."""
    if "span" not in r:
        return r
    problem = load_problem(path)
    ours, given = lower_bound(problem), r.get("bound") or 0.0
    bound = given if given > ours.value + rounding else ours.value
    if not problem.time_tol.ge(r["span"] + rounding, bound):
        raise RuntimeError(f"{path.name}: the bound {bound!r} is above the span of a schedule that fits, {r['span']!r}")
    bound = min(bound, r["span"])  # (equal up to float noise: proven optimal)
    mine = ours.value + rounding >= given - 1e-6 * max(1.0, given)  # (solve's JSON rounds its bound to 1e-6)
    reason = ours.reason if mine else r.get("bound_reason")
    return {**r, "bound": bound, "gap": (r["span"] - bound) / r["span"], "bound_reason": reason}


def report(results: dict, command: str, machine: str) -> str:
    """The results table, the cells where solve misses, and the acceptance figures at half of
    1F1B's memory (the gains over 1F1B with full recompute, and the most any schedule could gain:
    1 - bound / 1F1B-recompute's span)."""
    lines, misses, where = [], [], []
    for (model, m, limit, v), r in results.items():
        name = f"{model} m={m} {'V' if v else 'loop'} {limit:g}x"
        base = r.get("baselines", {})
        best = min(base.items(), key=lambda kv: kv[1]) if base else None
        megatron = _megatron(results, model, m, limit)
        if "error" in r:
            misses.append(f"{name}: {r['error']}")
            lines.append(f"| {model} | {m} | {'V' if v else 'loop'} | {limit:g} | error: {r['error']} | | | | | | | |")
            continue
        span = r["span"] if r["fits"] else None
        if span is None:
            misses.append(f"{name}: solve's schedule does not fit")
        elif best and span > best[1] * (1 + 1e-9):
            misses.append(f"{name}: solve {span:.1f} slower than {best[0]} {best[1]:.1f}")
        gain = f"{_shorter(span, megatron):.1f}%" if span and megatron else "n/a"
        most = f"{_shorter(r['bound'], megatron):.1f}%" if r.get("bound") and megatron else "n/a"
        policies = r.get("policies") or {}
        lines.append(
            f"| {model} | {m} | {'V' if v else 'loop'} | {limit:g} | "
            + (f"{span:.1f}" if span else "does not fit")
            + f" | {r.get('bound') or 0:.1f} | {100 * (r.get('gap') or 0):.2f}% | "
            + (f"{best[0]} {best[1]:.1f}" if best else "none fits")
            + f" | {'' if megatron is None else f'{megatron:.1f}'} | {gain} | {most} | "
            + ", ".join(f"{k} {n}" for k, n in policies.items() if n) + f" | {r['wall']:.1f} |"
        )
        if span and r.get("gap") is not None and r["gap"] > gap_line(limit):
            where.append(_where(model, m, limit, v, r))
    return "\n".join([
        f"Command: `{command}`",
        "",
        f"Machine: {machine}.",
        "",
        "The zero-bubble paper's 12 settings with recompute (full, selective) and offload declared (the",
        "model is in the script's docstring), limits as multiples of 1F1B's activation memory p M_B,",
        "objective span (ms). `solve` is `schedc solve --time-limit` read back with `schedc simulate`;",
        "its bound and gap are the proven ones. Best baseline: the fastest registry schedule that fits",
        f"(`schedc compare`); vs {MEGATRON}: how much shorter solve's span is than 1F1B with full recompute;",
        "at most: how much shorter any schedule could be (1 - bound / its span).",
        "Figure: benchmarks/memory_time.png.",
        "",
        "| model | m | placement | limit | solve span | bound | gap | best baseline that fits |"
        f" {MEGATRON} | solve vs {MEGATRON} | at most | policies | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *lines,
        "",
        "Cells where solve is slower than a baseline that fits, or does not fit: "
        + ("; ".join(misses) if misses else "none") + ".",
        "",
        *acceptance(results),
        *_where_table(where),
    ])


def gap_line(limit: float) -> float:
    """The gap issue 39 asks for at ``limit``: 2 % at half of 1F1B's memory and above, 5 % below."""
    return 0.02 if limit >= 0.5 else 0.05


def _where(model: str, m: int, limit: float, v: bool, r: dict) -> str:
    """One row of ``_where_table``: the cell, its gap, where the rank that sets solve's span spends
    its time beyond its passes (``Timeline.rank_time``, from ``schedc simulate``), the rank that
    carries most of the critical path (``_lane``) and the bound's reason, cut to its first clause;
    "not recorded" for a cell solved before the script kept them."""
    head = (f"| {model} | {m} | {'V' if v else 'loop'} | {limit:g} | {100 * r['gap']:.2f}% |"
            f" {r['span'] - r['bound']:.1f} |")
    t = r.get("time")
    if not t:
        return head + " not recorded | | | | | | |"
    reason = re.split(r" \(|; |, and ", r.get("bound_reason") or "")[0]
    if len(reason) > 90:
        reason = reason[:90].rsplit(" ", 1)[0] + " ..."
    lane = f"rank {r['lane'][0]} {100 * r['lane'][1]:.0f}%" if r.get("lane") else ""
    return (head + f" {t['rank']} | {t['recompute']:.1f} | {t['idle_warm_up']:.1f} | {t['idle_steady']:.1f} |"
            f" {t['idle_cool_down']:.1f} | {lane} | {reason} |")


def _where_table(rows: list[str]) -> list[str]:
    """Where each gap over issue 39's line lies (``gap_line``): none, or a table of ``_where`` rows."""
    if not rows:
        return ["", "Gaps over the line (2 % at 0.5x and above, 5 % below): none."]
    return [
        "",
        "Where the gaps over the line lie (2 % at 0.5x and above, 5 % below): the rank that sets solve's",
        "span, what it spends besides its F, B and W (recompute, and idle split at its first stage into",
        "warm-up, until its first backward there; cool-down, from its last forward there; the steady",
        "state between, as `schedc solve` prints it), the rank whose compute takes the most of the",
        "critical path (`schedc simulate`'s; where it is another rank, the idle above is slack), and the",
        "bound's reason, cut to its first clause.",
        "",
        "| model | m | placement | limit | gap | span - bound | rank | recompute | idle warm-up |"
        " idle steady | idle cool-down | critical path | the bound |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def _shorter(span: float, than: float) -> float:
    """How much shorter ``span`` is than ``than``, in percent."""
    return 100 * (1 - span / than)


def acceptance(results: dict, limit: float = 0.5) -> list[str]:
    """At ``limit``: per placement, solve's gains over 1F1B with full recompute against the issue's
    targets (20 % loop, 35 % V), the cells below target with the most any schedule could gain
    there, and how many cells solve beats the best baseline that fits; at every limit, the gaps."""
    out = []
    for v, target in ((False, 20.0), (True, 35.0)):
        gains, below, beats, total = [], [], 0, 0
        for (model, m, lim, vv), r in results.items():
            megatron = _megatron(results, model, m, lim)
            if lim != limit or vv != v or "span" not in r or not r["fits"] or not megatron:
                continue
            total += 1
            gain = _shorter(r["span"], megatron)
            gains.append(gain)
            base = r.get("baselines") or {}
            beats += not base or r["span"] < min(base.values()) * (1 - 1e-9)
            if gain < target:
                most = _shorter(r["bound"], megatron) if r.get("bound") else float("nan")
                below.append(f"{model} m={m} {gain:.1f}% (at most {most:.1f}%)")
        if total:
            out.append(f"At {limit:g}x, {'V' if v else 'loop'} placement: solve is {min(gains):.1f}-{max(gains):.1f}% "
                       f"faster than {MEGATRON} (target {target:g}%); below target: "
                       + (", ".join(below) if below else "none")
                       + f"; faster than the best baseline that fits on {beats} of {total}.")
    for lim in LIMITS:
        rows = [r for (_, _, x, _), r in results.items() if x == lim and "span" in r]
        if rows:
            fit = sum(r["fits"] for r in rows)
            gaps = [100 * r["gap"] for r in rows if r.get("gap") is not None]
            out.append(f"At {lim:g}x: solve fits on {fit} of {len(rows)} cells"
                       + (f", proven gaps {min(gaps):.1f}-{max(gaps):.1f}%." if gaps else "."))
    return out


if __name__ == "__main__":
    main()
