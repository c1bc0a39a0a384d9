"""Two directions and gradient synchronization (issue 26): published bubbles of the two-direction
schedules, and solve against the schedules users run, with data-parallel all-reduces.

    python benchmarks/sync.py [--write] [--parts published,settings,dualpipe,runtime] [--time-limit S]
                              [--jobs N] [--alphas 0,0.25,0.5,1] [--only NAME]

Part 1, published bubbles on uniform costs (no search, exact), each with its source and its
notation: Chimera (Li and Hoefler, SC'21), D stages and N microbatches in all, one fused backward
(no B/W split) as long as the forward: 2N + D - 2 per iteration; DualPipe (deepseek-ai/DualPipe's
README table, from the DeepSeek-V3 report): each rank idles (PP/2 - 1)(F&B + B - 3W) with DualPipe's
B the FULL backward and F&B a forward overlapped with a full backward, which in schedc's notation
(B the input gradient, ``costs.FB`` a forward overlapped with a B: F&B = FB + W, full backward
B + W) is (p/2 - 1)(FB + B - W), on F = B = 2, W = 1, without ``costs.FB`` (FB = F + B: the pair's
two ops one after the other) and with FB = 3; the idle of the ranks with the most pairs is shown;
BitPipe (Wu et al. 2024, its repository's figure): both directions on the V placement, one fused
backward twice the forward, p microbatches in all: 2(p - 2) forward times idle per rank, and its
order with more rounds measured. Its own section (``--parts published``, seconds).

Part 2, the zero-bubble paper's settings (``examples/problems/zb-paper``, the 2p files: the memory
limit of 2p microbatches' activations, objective makespan here since the step ends with the
reduces) with a data-parallel all-reduce of alpha x (F + B + W) per stage, issued after the stage's
last W (overlapped) or at the end. Per cell: 1F1B and ZB-H1 on the pipeline; ZB-V on the same
model cut into 2p stages (V placement, each stage's costs and memory halved); Chimera and DualPipe
on two directions (replicas 2, m/2 microbatches each way, the same global batch; the copies' sum
RS taken as half the all-reduce, an all-reduce over two ranks; parameters are not counted, the
settings give activation memory only); and ``solve`` on each of the three problems (each within
the time limit), the best of the three with its proven gap (for the problem it was found on).
A schedule over the memory limit is marked so and not compared. ``solve`` no slower than the best
baseline that fits is the acceptance column.

Part 3 (``--parts dualpipe``, its own section), DualPipe's own problem: two directions, F = B = 2,
W = 1, overlapped pairs (``costs.FB`` 3, or 4: no gain), p + 1 activations' memory limit (DualPipe's
peak), p = 4 and 8 with 2p microbatches each way: ``solve`` (on the two-direction problem, from
every two-direction schedule; CBC, then CP-SAT, each within the time limit, with two threads)
against DualPipe, bubble = 1 - busy / (p x makespan), with each search's proven bound (the larger
of its own and schedc's independent one). A published mixed-integer planner (arXiv 2503.09357)
reports half of DualPipe's bubble under the same limit.

Part 4 (``--parts runtime``, its own section), measured against simulated, on this machine's CPU
with gloo: a small GPT (``schedc.runtime.gpt``, d_model 128, seq 64) profiled by
``profile_stages`` with as many busy copies beside each stage as the other processes (they share
the cores), the all-reduce and the transfer measured between local processes; DualPipe on 4 ranks
(8 microbatches each way; the copies' sums RS over pairs of ranks) and ZB-H1 on a 2 x 2 pipeline x
data-parallel mesh (all-reduces overlapped), each trained with the runtime for ``--steps`` steps
(the median after warm-up, from a barrier to the last rank's end) against the simulated makespan.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from _results import RESULTS, machine, v_twin, write_section  # noqa: E402

import schedc  # noqa: E402
import schedc.solvers  # noqa: E402,F401  (registers the schedules)
from schedc import Problem  # noqa: E402
from schedc.simulate import simulate  # noqa: E402
from schedc.solvers.registry import build  # noqa: E402
from schedc.solvers.search.solve import solve  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = sorted((ROOT / "examples/problems/zb-paper").glob("zb-*-2p.yaml"))
BASELINES = ("1f1b", "zb-h1", "zb-v", "chimera", "dualpipe")
SOLVED = {"one": "p stages", "v": "V, 2p stages", "both": "two directions"}  # the problems solve runs on


PUBLISHED_NOTE = (
    "Sources and notation. chimera: Li and Hoefler, SC'21 (Chimera), bubble ratio (D - 2)/(2N + D - 2), i.e."
    " 2N + D - 2 forward times per iteration, D pipeline stages, N microbatches in all; Chimera does not split"
    " the backward, so its backward is schedc's fused BW, here as long as the forward (F = BW = 1, the costs"
    " on which schedc meets the formula). dualpipe: deepseek-ai/DualPipe's README table (the DeepSeek-V3"
    " report's), bubble (PP/2 - 1)(F&B + B - 3W), PP the ranks, where DualPipe's B is the FULL backward"
    " (schedc's B + W), W the weight gradient and F&B a forward overlapped with a full backward (schedc's"
    " FB + W, FB a forward overlapped with an input gradient B, F + B without costs.FB); in schedc's notation"
    " (p/2 - 1)(FB + B - W), written so in the published column; 'idle' is the largest per-rank idle"
    " (makespan less the rank's busy time): every rank's without costs.FB, where a pair saves nothing, and"
    " the ranks' with the most overlapped pairs with FB = 3 (the edge ranks pair less and idle less)."
    " bitpipe: Wu et al. 2024, its repository's figure (p = 4; no formula is published), one fused backward"
    " (schedc's BW) twice the forward. "
    "BitPipe (its repository's figures, p = 4): with p microbatches in all (one round) schedc's order is"
    " the figure's, and each rank idles 2(p - 2) forward times for every p here; with more rounds the reference implementation's order idles more"
    " (its repository's figure for p = 4 and 8 microbatches shows 53 where this order takes 54: the"
    " figure runs a forward in the slot where the code's order waits for a backward's input).")


def uniform_table() -> str:
    lines = ["| schedule | p | microbatches | costs | published | schedc | peak activations |",
             "|---|---|---|---|---|---|---|"]
    for d in (4, 8, 16):
        for n in (d, 2 * d):
            p = Problem.parse({"ranks": d, "microbatches": n // 2, "costs": {"F": 1, "B": 0.5, "W": 0.5}, "replicas": 2})
            t = simulate(p, build("chimera", p))
            lines.append(f"| chimera | {d} | {n} in all | F = BW = 1 | 2N + D - 2 = {2 * n + d - 2} | {t.makespan:g} |"
                         f" {max(t.peak_activation):g} |")
    # F = B = 2, W = 1 on p = 4, 8, 16; then DualPipe's figure: 8 ranks, 20 microbatches in two
    # directions, forward, backward and weight cells of one width (F = B = W = 1).
    for d, m, (F, B, W), fbs in [(4, 8, (2, 2, 1), (None, 3.0)), (8, 16, (2, 2, 1), (None, 3.0)),
                                 (16, 32, (2, 2, 1), (None, 3.0)), (8, 10, (1, 1, 1), (None,))]:
        for fb in fbs:
            costs = {"F": F, "B": B, "W": W, **({"FB": fb} if fb else {})}
            p = Problem.parse({"ranks": d, "microbatches": m, "costs": costs, "replicas": 2})
            t = simulate(p, build("dualpipe", p))
            idle = max(t.idle())
            pair = fb or F + B  # schedc's FB: a forward and an input gradient B
            published = (d / 2 - 1) * ((pair + W) + (B + W) - 3 * W)  # DualPipe's F&B and full B
            lines.append(f"| dualpipe | {d} | {m} each way | F = {F:g}, B = {B:g}, W = {W:g}, FB = {pair:g}"
                         f"{' (overlapped pairs)' if fb else ' (no costs.FB: one after the other)'} |"
                         f" idle (p/2 - 1)(FB + B - W) = {published:g} | idle {idle:g} | {max(t.peak_activation):g} |")
    for d in (4, 8, 16):
        for n in (d, 2 * d, 4 * d):
            p = Problem.parse({"ranks": d, "microbatches": n // 2, "chunks": 2, "placement": "v", "replicas": 2,
                               "costs": {"F": 1, "B": 1, "W": 1}})
            t = simulate(p, build("bitpipe", p))
            published = {(4, 4): "figure: 28 (idle 4)", (4, 8): "figure: 53 (idle 5)"}.get((d, n), "-")
            lines.append(f"| bitpipe | {d} | {n} in all | per chunk F = 1, BW = 2 | {published} |"
                         f" {t.makespan:g} (idle {max(t.idle()):g}) |"
                         f" {max(t.peak_activation):g} chunks |")
    return "\n".join(lines)


def cell_problems(path: Path, alpha: float, overlap: bool) -> dict[str, Problem]:
    base = schedc.load_problem(path).with_changes(objective="makespan")
    c = base.cost
    reduce = [alpha * (c["F"][s] + c["B"][s] + c["W"][s]) for s in range(base.n_stages)]
    one = base.with_changes(data_parallel={"degree": 2, "reduce": reduce, "overlap": overlap})
    data = one.model_dump(exclude_none=True)
    v = v_twin(one, data_parallel={**data["data_parallel"], "reduce": [x / 2 for x in reduce for _ in (0, 1)]})
    both = Problem.parse({**data, "microbatches": base.microbatches // 2,
                          "replicas": {"count": 2, "sync": [x / 2 for x in reduce]}})
    return {"one": one, "v": v, "both": both}


def run_cell(args) -> dict:
    path, alpha, overlap, time_limit = args
    problems = cell_problems(Path(path), alpha, overlap)
    out = {"setting": Path(path).stem, "alpha": alpha, "overlap": overlap, "baselines": {}}
    where = {"1f1b": "one", "zb-h1": "one", "zb-v": "v", "chimera": "both", "dualpipe": "both"}
    for name in BASELINES:
        p = problems[where[name]]
        t = simulate(p, build(name, p))
        out["baselines"][name] = (t.makespan, t.fits)
    best = None
    for key in ("one", "v", "both"):
        began = time.perf_counter()
        r = solve(problems[key], time_limit=time_limit, threads=1)
        found = (r.objective, r.bound, key, r.warm_start, time.perf_counter() - began)
        if r.timeline.fits and (best is None or r.objective < best[0]):
            best = found
    out["solve"] = best
    return out


def dualpipe_table(time_limit: float) -> str:
    try:  # before PuLP loads highspy, whose HiGHS clashes with OR-Tools' (solvers/search/cpsat.py)
        import ortools.sat.python.cp_model  # noqa: F401

        searches = ("cbc", "cpsat")
    except ImportError:
        searches = ("cbc",)
    lines = ["| p | microbatches each way | FB | memory limit | dualpipe | bubble | "
             + " | ".join(f"solve ({name}) | bubble | bound | gap" for name in searches) + " |",
             "|---|---|---|---|---|---|" + "---|---|---|---|" * len(searches)]
    for d in (4, 8):
        for fb in (3.0, 4.0):
            p = Problem.parse({"ranks": d, "microbatches": 2 * d, "costs": {"F": 2, "B": 2, "W": 1, "FB": fb},
                               "replicas": 2, "memory": {"F": 1, "limit": d + 1}})
            t = simulate(p, build("dualpipe", p))
            cells = []
            for name in searches:
                r = solve(p, solver=name, time_limit=time_limit, threads=2)
                cells.append(f" {r.objective:g} | {100 * r.timeline.bubble_rate():.2f}% | {r.bound:g} | {100 * r.gap:.1f}% |")
            lines.append(f"| {d} | {2 * d} | {fb:g} | {d + 1} activations | {t.makespan:g} | {100 * t.bubble_rate():.2f}% |"
                         + "".join(cells))
            print(lines[-1], flush=True)
    return "\n".join(lines)


def table_rows(text: str) -> list[tuple[float, str, dict[str, float], float]]:
    """The settings table's rows, read back from RESULTS.md: (alpha, reduce, baseline -> makespan
    where it fits, solve's makespan)."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 + len(BASELINES) or cells[0] in ("setting", "---") or cells[0].startswith("-"):
            continue
        values = {name: float(c) for name, c in zip(BASELINES, cells[3:3 + len(BASELINES)]) if not c.startswith("(")}
        out.append((float(cells[1]), cells[2], values, float(cells[3 + len(BASELINES)].split()[0])))
    return out


def plot(rows, path: Path) -> None:
    """Per reduce placement, each baseline's makespan over solve's, the mean over the settings, by alpha."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, reduce in zip(axes, ("overlapped", "at the end")):
        alphas = sorted({a for a, r, _, _ in rows if r == reduce})
        for name in BASELINES:
            ys = []
            for a in alphas:
                ratios = [v[name] / solved for x, r, v, solved in rows if x == a and r == reduce and name in v]
                ys.append(sum(ratios) / len(ratios) if ratios else float("nan"))
            ax.plot(alphas, ys, marker="o", label=name)
        ax.axhline(1.0, color="black", lw=1, ls="--", label="solve")
        ax.set_title(f"all-reduce {reduce}")
        ax.set_xlabel("all-reduce time / (F + B + W) of a stage")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("makespan / solve's (mean over 12 settings)")
    axes[1].legend(fontsize=8)
    fig.suptitle("zero-bubble paper's settings, 2p memory, data-parallel all-reduce per stage")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _timed_rank(rank: int, world: int, path: str, pp: int, dp: int, steps: int, batch: int) -> float:
    """This rank's median step time (ms, from a barrier) training the schedule at ``path`` on a pp x
    dp mesh of the small GPT, each stage a copy of its model stage."""
    import statistics

    import torch.distributed as dist

    from schedc.runtime import PipelineRuntime
    from schedc.runtime.gpt import lm_loss, token_batches

    compiled = schedc.load(path)
    prob = compiled.problem
    pipelines = [dist.new_group(list(range(d * pp, (d + 1) * pp))) for d in range(dp)]
    replicas = [dist.new_group(list(range(r, pp * dp, pp))) for r in range(pp)]
    d, r = rank // pp, rank % pp
    parts = _gpt_stages(prob.pipeline_stages)
    mine = {s: parts[s % prob.pipeline_stages] for s in prob.rank_stages[r]}
    rt = PipelineRuntime(compiled, mine, lm_loss, group=pipelines[d] if dp > 1 else None,
                         data_parallel_group=replicas[r] if dp > 1 else None, timeout=600)
    (x, y), = token_batches(1, batch, seq_len=64, vocab=256, seed=1)
    times = []
    for k in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        rt.step(x, y)
        dist.barrier()
        times.append(1e3 * (time.perf_counter() - t0))
        for mod in mine.values():
            mod.zero_grad(set_to_none=True)
    return statistics.median(times[2:])


def _gpt_stages(n: int):
    from schedc.runtime.gpt import gpt_blocks, stages

    return stages(gpt_blocks(vocab=256, d_model=128, n_layers=2 * n - 2, n_heads=4, seq_len=64, seed=1), n)


def runtime_table(steps: int) -> str:
    from schedc.runtime.launch import run_local
    from schedc.runtime.profile import (_all_reduce_probe, _comm_probe, make_problem, profile_stages,
                                        reduce_times)
    from schedc.runtime.gpt import lm_loss, token_batches

    lines = ["| run | ranks | schedule | simulated ms | measured ms | measured / simulated |", "|---|---|---|---|---|---|"]
    for label, pp, dp, name, m in (("DualPipe, two directions", 4, 1, "dualpipe", 8),
                                   ("pipeline x data parallel", 2, 2, "zb-h1", 8)):
        world = pp * dp
        batch = 2 * m * (2 if name == "dualpipe" else dp)  # two sequences per microbatch, the global batch
        (x, y), = token_batches(1, batch, seq_len=64, vocab=256, seed=1)
        prof = profile_stages(_gpt_stages(pp), x, y, lm_loss, microbatches=batch // 2, warmup=2, repeats=5,
                              load=world - 1)
        comm = run_local(_comm_probe, 2, max(prof.sends), 10, timeout=300)[0]
        data = make_problem(prof, ranks=pp, microbatches=m, comm=comm, name=label).model_dump(exclude_none=True)
        mib = max(max(prof.grads), 1.0)
        probe = run_local(_all_reduce_probe, 2, mib, 10, timeout=300)[0]  # an all-reduce over two ranks
        if name == "dualpipe":  # the copies' sum: an all-reduce over the two ranks holding them
            data["replicas"] = {"count": 2, "sync": reduce_times(prof.grads, 2, mib, probe)}
        else:
            data["data_parallel"] = {"degree": dp, "reduce": reduce_times(prof.grads, dp, mib, probe)}
        problem = Problem.parse(data)
        compiled = schedc.compile(problem, name)
        with tempfile.TemporaryDirectory() as tmp:
            path = f"{tmp}/s.json"
            compiled.save(path)
            measured = max(run_local(_timed_rank, world, path, pp, dp, steps, batch // dp, timeout=1800))
        simulated = compiled.timeline.makespan
        lines.append(f"| {label} | {pp} x {dp} | {name} | {simulated:.1f} | {measured:.1f} | {measured / simulated:.2f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the tables to benchmarks/RESULTS.md")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve (three per cell)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--alphas", default="0,0.25,0.5,1")
    ap.add_argument("--only", help="only the settings whose name contains this")
    ap.add_argument("--parts", default="settings",
                    help="comma-separated: published (part 1), settings (part 2), dualpipe (part 3), runtime (part 4)")
    ap.add_argument("--plot", action="store_true", help="only draw benchmarks/sync.png from the table in RESULTS.md")
    ap.add_argument("--steps", type=int, default=10, help="runtime part: steps per run (the first two are warm-up)")
    args = ap.parse_args()
    figure = Path(__file__).with_name("sync.png")
    if args.plot:
        section = RESULTS.read_text().split("<!-- sync:begin -->")[1].split("<!-- sync:end -->")[0]
        plot(table_rows(section), figure)
        print(f"wrote {figure}")
        return
    parts = args.parts.split(",")
    if "runtime" in parts:
        table4 = runtime_table(args.steps)
        if args.write:
            write_section("sync-runtime", "## Two directions and data parallelism on the runtime: measured against"
                          " simulated (issue 26)\n\n"
                          f"`python benchmarks/sync.py --write --parts runtime --steps {args.steps}` on {machine()}"
                          " (gloo, CPU; every rank a process on these cores).\n\n" + table4)
    if "dualpipe" in parts:
        table3 = dualpipe_table(args.time_limit)
        if args.write:
            write_section("sync-dualpipe", "## DualPipe's own problem: solve against DualPipe (issue 26)\n\n"
                          f"`python benchmarks/sync.py --write --parts dualpipe --time-limit {args.time_limit:g}`"
                          f" on {machine()}; makespan in time units, bubble = 1 - busy / (p x makespan); FB:"
                          " costs.FB, a forward overlapped with an input gradient B (DualPipe's F&B, with a full"
                          " backward, is FB + W; FB = 4 = F + B: the pairs gain nothing).\n\n" + table3)
    if "published" in parts:
        table1 = uniform_table()
        print(table1, flush=True)
        if args.write:
            write_section("sync-published", "## Two directions: published bubbles on uniform costs (issue 26)\n\n"
                          "`python benchmarks/sync.py --write --parts published` (schedc's simulator, no search;"
                          " exact, no machine dependence).\n\n" + table1 + "\n\n" + PUBLISHED_NOTE)
    if "settings" not in parts:
        return
    alphas = [float(a) for a in args.alphas.split(",")]
    settings = [p for p in SETTINGS if args.only is None or args.only in p.stem]
    cells = [(str(p), a, ov, args.time_limit) for p in settings for a in alphas for ov in (True, False)]
    results = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for k, r in enumerate(pool.map(run_cell, cells), 1):
            results.append(r)
            print(f"[{k}/{len(cells)}] {r['setting']} alpha {r['alpha']:g} overlap {r['overlap']}: solve"
                  f" {r['solve'][0]:.6g} ({r['solve'][2]}), best baseline"
                  f" {min((v for v, fits in r['baselines'].values() if fits), default=float('nan')):.6g}", flush=True)
    rows = ["| setting | alpha | reduce | " + " | ".join(BASELINES) + " | solve (problem, gap) | no slower |",
            "|---|---|---|" + "---|" * len(BASELINES) + "---|---|"]
    wins = 0
    for r in results:
        fitting = [v for v, fits in r["baselines"].values() if fits]
        objective, bound, key, _, _ = r["solve"]
        ok = not fitting or objective <= min(fitting) * (1 + 1e-9)
        wins += ok
        cells_ = [f"{v:.1f}" if fits else f"({v:.1f}, over)" for v, fits in (r["baselines"][n] for n in BASELINES)]
        gap = (objective - bound) / objective if objective else 0.0
        rows.append(f"| {r['setting'].removeprefix('zb-').removesuffix('-2p')} | {r['alpha']:g} |"
                    f" {'overlapped' if r['overlap'] else 'at the end'} | " + " | ".join(cells_)
                    + f" | {objective:.1f} ({SOLVED[key]}, {100 * gap:.1f}%) |"
                    f" {'yes' if ok else 'NO'} |")
    table2 = "\n".join(rows)
    print(table2)
    plot(table_rows(table2), figure)
    print(f"solve no slower than the best baseline that fits: {wins} of {len(results)}")
    if args.write:
        command = "python benchmarks/sync.py --write" + (f" --time-limit {args.time_limit:g}" if args.time_limit != 10 else "") \
            + (f" --alphas {args.alphas}" if args.alphas != "0,0.25,0.5,1" else "") + (f" --only {args.only}" if args.only else "")
        body = (f"## Two directions and gradient synchronization (issue 26)\n\n`{command}` on {machine()}.\n\n"
                "The zero-bubble paper's settings (2p memory limit, makespan) with a data-parallel all-reduce of"
                " alpha x (F + B + W) per stage; makespan in ms; '(x, over)': over the memory limit. solve: the"
                " best of solve on the p-stage, the V (2p stages) and the two-direction problem, with its proven"
                " gap on that problem; the last column is the"
                f" acceptance point (solve no slower than the best baseline that fits): {wins} of {len(results)}.\n\n"
                + table2 + "\n\nFigure: benchmarks/sync.png (`python benchmarks/sync.py --plot` redraws it from this"
                " table).")
        write_section("sync", body)


if __name__ == "__main__":
    main()
