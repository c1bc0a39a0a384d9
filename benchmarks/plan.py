"""``schedc plan`` on cost models built from published model shapes (issue 41), against the
layouts users run today.

    python benchmarks/plan.py [--write] [--time-limit 60] [--only NAME]   # --write: the table and benchmarks/plan.png

Cases (``CASES``; shapes from ../shared/model-shapes.md, each model's published config):
Llama-3-8B-like on p = 4 and 8 (v 1 or 2, loop or V); Llama-3-70B-like on PP8 x VPP5 (NeMo's
shape); a DeepSeek-V3-like stack on PP16 x VPP2, against Megatron-LM's published layout
``Et*3|(tt|)*29,m|L``; a GPT-3-175B-like model under a memory limit that forces recompute.

The cost model (``layer_problem``), per token of a microbatch of ``TOKENS`` tokens, bf16, split
over ``TP`` tensor-parallel GPUs (FLOPs and activations divided by TP), at ``THROUGHPUT`` FLOP/s:

- decoder layer: the Linear layers' 2 x (parameters) FLOPs forward (attention projections with
  grouped KV heads, SwiGLU MLP: 3 h ffn; GPT-3: 4h-wide GELU MLP); causal attention 2 s h FLOPs
  forward (4 s h over (query, key) pairs, half of them masked); B = Linear + twice the attention,
  W = Linear (weight gradients only where there are weights);
- DeepSeek-V3: MLA's projections (q LoRA rank 1536, kv 512 + 64 rope, 128 heads of 128 + 64 and
  128), the first 3 layers dense (FFN 18432), the others MoE: 8 routed experts and 1 shared of
  2048 each per token, and the router; the MTP module one MoE layer plus its 2h -> h projection
  and the shared head again;
- head and loss (L): 2 h V FLOPs forward, as many for B and for W; embedding (E): a gather, costed
  as 2 h FLOPs per token each way;
- activation memory: Megatron-LM's 34 s h bytes per layer with flash attention (sequence parallel:
  over TP), MoE layers also the 8 experts' 3 x 2048-wide intermediates; the head's logits 6 s V
  bytes (bf16 and fp32 for the loss); held for W: the Linear layers' inputs;
- static memory: 16 bytes per parameter (bf16 weight and gradient, fp32 master weight, two Adam
  moments) over TP; an MoE layer counts the experts one token activates (9 of 257), as if expert
  parallelism spread the rest over other GPUs; the limit 80 GB (an H100) less 8 GB for the framework.

Per case, two uniform splits, each with the best registry schedule that fits on each shape the
case allows (what ``schedc compare`` finds, the greedy's searches included), the best over the
shapes: ``uniform layers`` (``layers_uniform``), the decoder layers in equal counts, the embedding
added to the first stage and the MTP module and the head to the last (Megatron-LM's default
without a layout string or its ``--account-for-embedding/loss-in-pipeline-split`` flags; the first
stages take one more where the count does not divide); ``uniform blocks``, equal counts of every
block, the embedding and the head each counted as a layer (DeepSpeed's ``partition_method="uniform"``
over its layer list, Megatron-LM with those two flags, torchtitan's split with the input and output
modules weighted as layers);
``balanced + solve``: the time-balanced cut (``schedc.partition.balanced``, what ``schedc profile
--partition time`` writes) on the case's first shape, ``schedc solve --time-limit T``; ``Megatron``
(DeepSeek-V3): the published layout with Megatron-LM's interleaved 1F1B; ``plan``: ``schedc plan
--time-limit T`` (its wall time beside), with its bound over every cut and shape and the gap.
``AdaPipe-like`` (cases that declare recompute): ``adapipe_like``. Partial: the V placement has no
Megatron-LM layout to compare with.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, os.path.dirname(__file__))

from _results import machine, refuse_partial_write, write_section  # noqa: E402
from zb_paper import run_json  # noqa: E402

from schedc.layers import LayerProblem  # noqa: E402
from schedc.layout import parse_megatron_layout  # noqa: E402
from schedc.partition import balanced, min_max_cut, uniform  # noqa: E402
from schedc.simulate import simulate  # noqa: E402
from schedc.solvers.families.memtime import with_policies  # noqa: E402
from schedc.solvers.registry import REGISTRY, unfuse  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
THROUGHPUT = 400e12  # FLOP/s per GPU on these matmuls (one figure: only ratios matter)
LINK = 50e9  # bytes/s between two pipeline ranks
GB = 1e9
LIMIT = 80 - 8  # GB per GPU for the model's state and activations

# name: (layers, hidden, heads, kv heads, ffn, vocabulary) from ../shared/model-shapes.md
SHAPES = {
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": (80, 8192, 64, 8, 28672, 128256),
    "gpt3-175b": (96, 12288, 96, 96, 49152, 50257),
    "deepseek-v3": (61, 7168, 128, 128, 18432, 129280),
}
MEGATRON_DEEPSEEK = "Et*3|(tt|)*29,m|L"  # Megatron-LM's docs, PP16 x VPP2

# name -> (model, ranks, microbatches, chunks, placements, tokens per microbatch, TP, recompute)
CASES = {
    "llama3-8b-p4": ("llama3-8b", 4, 16, [1, 2], ["loop", "v"], 8192, 1, False),
    "llama3-8b-p8": ("llama3-8b", 8, 32, [1, 2], ["loop", "v"], 8192, 1, False),
    "llama3-70b-pp8-vpp5": ("llama3-70b", 8, 32, [5], ["loop"], 8192, 8, False),
    "deepseek-v3-pp16-vpp2": ("deepseek-v3", 16, 32, [2], ["loop"], 4096, 8, False),
    "gpt3-175b-p8": ("gpt3-175b", 8, 32, [1, 2], ["loop", "v"], 8192, 8, True),
}


def _decoder(model: str, h: int, heads: int, kv: int, ffn: int, dense: bool = True) -> tuple[float, float, float]:
    """(Linear parameters, attention FLOPs per token and key, extra activation bytes per token) of one layer."""
    if model == "deepseek-v3":
        attn = h * 1536 + 1536 * heads * 192 + h * 576 + 512 * heads * 256 + heads * 128 * h
        mlp = 3 * h * ffn if dense else 9 * 3 * h * 2048 + h * 256
        extra = 0.0 if dense else 8 * 3 * 2048 * 2  # the routed experts' intermediates, bf16
        return attn + mlp, 2 * heads * (192 + 128) / 2, extra
    head_dim = h // heads
    attn = 2 * h * h + 2 * h * kv * head_dim
    mlp = 2 * h * ffn if model == "gpt3-175b" else 3 * h * ffn
    return attn + mlp, 2 * h, 0.0


def layer_problem(case: str) -> LayerProblem:
    """The case's layer-level problem from the cost model in the module notes (ms, GB)."""
    model, p, m, chunks, placements, tokens, tp, recompute = CASES[case]
    n_layers, h, heads, kv, ffn, vocab = SHAPES[model]
    ms = 1e3 / THROUGHPUT / tp

    def block(kind: str, params: float, attention: float, act_bytes: float, held_bytes: float, count: int = 1,
              extra_flops: float = 0.0) -> dict:
        linear = 2 * params * tokens + extra_flops
        core = attention * tokens * tokens / 2  # causal: half of the (query, key) pairs
        return dict(type=kind, count=count, F=round((linear + core) * ms, 6), B=round((linear + 2 * core) * ms, 6),
                    W=round(max(linear, 1.0) * ms, 6), activation=round(act_bytes * tokens / tp / GB, 6),
                    held_for_w=round(min(act_bytes, held_bytes) * tokens / tp / GB, 6),
                    static=round(16 * params / tp / GB, 6))

    layers = [block("E", vocab * h, 0.0, 2 * h, 0.0, extra_flops=2 * h * tokens - 2 * vocab * h * tokens)]
    held = 2 * (3 * h + ffn)  # the Linear layers' inputs, bf16
    if model == "deepseek-v3":
        dense, att, _ = _decoder(model, h, heads, kv, ffn, dense=True)
        moe, _, extra = _decoder(model, h, heads, kv, ffn, dense=False)
        layers.append(block("t", dense, att, 34 * h, held, count=3))
        layers.append(block("t", moe, att, 34 * h + extra, held, count=n_layers - 3))
        layers.append(block("m", moe + 2 * h * h + vocab * h, att, 34 * h + extra + 6 * vocab, held))
    else:
        params, att, _ = _decoder(model, h, heads, kv, ffn)
        layers.append(block("t", params, att, 34 * h, held, count=n_layers))
    layers.append(block("L", vocab * h, 0.0, 6 * vocab, 2 * h))
    data = dict(name=case, ranks=p, microbatches=m, chunks=chunks, placements=placements,
                comm=round(2 * h * tokens / tp / LINK * 1e3, 6), memory=dict(limit=LIMIT), recompute=recompute,
                layers=layers)
    return LayerProblem.validated(data, case)


def best_registry(problem) -> tuple[float, str]:
    """What `schedc compare` finds: the shortest registry schedule that fits (the greedy's whole
    searches included), (inf, "") where none does."""
    best = (float("inf"), "")
    for name, spec in REGISTRY.items():
        if spec.why_not(problem) is None:
            t = simulate(problem, spec.build(problem))
            if t.fits and t.objective_value() < best[0]:
                best = (t.objective_value(), name)
    return best


def adapipe_like(lp: LayerProblem) -> dict | None:
    """AdaPipe's idea as a baseline (Sun et al., ASPLOS'24: the cut and each stage's recompute
    chosen together, the order fixed): 1F1B on one chunk, each stage recomputing all its
    microbatches exactly where 1F1B's peak there (static memory plus p - s microbatches' activation
    on stage s) would pass the limit, and the cut that minimises the heaviest stage's work with
    that recompute included (dynamic programming over the cut points, each stage's cost its blocks'
    m (F + B + W), plus m F where it must recompute). Coarser than AdaPipe's own (it recomputes
    whole stages, not chosen layers). None where the problem declares no recompute."""
    if not lp.recompute:
        return None
    blocks, p, m = lp.blocks, lp.ranks, lp.microbatches
    limit = lp.memory.limit

    def cost(j: int, i: int, s: int) -> float:
        part = blocks[j:i]
        work = m * sum(b.F + b.B + b.W for b in part)
        static = lp.memory.static + sum(b.static for b in part)
        held = (p - s) * sum(b.activation for b in part)
        return work if limit is None or static + held <= limit else work + m * sum(b.F for b in part)

    _, sizes = min_max_cut(len(blocks), p, cost)
    problem = lp.stage_problem(sizes, 1, "loop")
    schedule = unfuse(REGISTRY["1f1b"].build(problem))
    at, recomputed = 0, []
    for s, k in enumerate(sizes):
        if cost(at, at + k, s) > m * sum(b.F + b.B + b.W for b in blocks[at:at + k]):
            recomputed.append(s)
        at += k
    policy = {(s, i): "R" for s in recomputed for i in range(m)}
    t = simulate(problem, with_policies(problem, schedule, policy, "adapipe-like"))
    return {"objective": t.objective_value() if t.fits else None, "fits": t.fits, "stage_blocks": sizes,
            "recomputed_stages": recomputed}


def layers_uniform(lp: LayerProblem, n_stages: int) -> list[int]:
    """Blocks per stage of Megatron-LM's default split: the decoder layers (the blocks between the
    leading embedding and the trailing MTP and head blocks) in equal counts, the first stages one
    more where they do not divide, the embedding on the first stage, MTP and head on the last."""
    types = [b.type for b in lp.blocks]
    front = len(types) - len("".join(types).lstrip("E"))
    back = len(types) - len("".join(types).rstrip("mL"))
    sizes = uniform(len(types) - front - back, n_stages)
    sizes[0] += front
    sizes[-1] += back
    return sizes


UNIFORM = {"uniform_layers": layers_uniform, "uniform_blocks": lambda lp, n: uniform(len(lp.blocks), n)}


def baselines(lp: LayerProblem) -> dict:
    """Each uniform split with the best registry schedule (over the shapes), the balanced cut of
    the first shape, and (DeepSeek-V3) Megatron-LM's published layout with its interleaved 1F1B."""
    out = {}
    for key, split in UNIFORM.items():
        best = None
        for v, placement in lp.shapes:
            sizes = split(lp, lp.ranks * v)
            objective, name = best_registry(lp.stage_problem(sizes, v, placement))
            if best is None or objective < best[0]:
                best = (objective, name, v, placement, sizes)
        out[key] = dict(zip(("objective", "schedule", "chunks", "placement", "stage_blocks"), best))
    v, placement = lp.shapes[0]
    out["balanced"] = {"chunks": v, "placement": placement,
                       "stage_blocks": balanced([b.F + b.B + b.W for b in lp.blocks], lp.ranks * v)}
    adapipe = adapipe_like(lp)
    if adapipe is not None:
        out["adapipe"] = adapipe
    if lp.name.startswith("deepseek"):
        sizes = [len(s) for s in parse_megatron_layout(MEGATRON_DEEPSEEK)]
        problem = lp.stage_problem(sizes, 2, "loop")
        t = simulate(problem, REGISTRY["interleaved-1f1b"].build(problem))
        out["megatron"] = {"objective": t.objective_value() if t.fits else None, "fits": t.fits,
                           "stage_blocks": sizes, "layout": MEGATRON_DEEPSEEK}
    return out


def run_case(case: str, time_limit: float, out_dir: Path) -> dict:
    lp = layer_problem(case)
    layers_path = out_dir / f"{case}.layers.yaml"
    layers_path.write_text(yaml.safe_dump(lp.model_dump(mode="json", exclude_none=True), sort_keys=False))
    row = {"case": case, "blocks": len(lp.blocks), "ranks": lp.ranks, "microbatches": lp.microbatches,
           **{f"base_{k}": v for k, v in baselines(lp).items()}}
    b = row["base_balanced"]
    stage = out_dir / f"{case}.balanced.yaml"
    stage.write_text(yaml.safe_dump(lp.stage_problem(b["stage_blocks"], b["chunks"], b["placement"])
                                    .model_dump(mode="json", exclude_none=True), sort_keys=False))
    solved, _, err = run_json(["solve", str(stage), "-o", str(out_dir / f"{case}.balanced.json"), "--time-limit",
                               str(time_limit), "-q"], timeout=10 * time_limit + 120)
    b["objective"] = None if solved is None else solved["objective"]
    b["error"] = err if solved is None else None
    began = time.perf_counter()
    planned, _, err = run_json(["plan", str(layers_path), "-o", str(out_dir / f"{case}.plan.json"),
                                "--time-limit", str(time_limit), "-q"], timeout=10 * time_limit + 120)
    row["plan_wall"] = time.perf_counter() - began
    row["plan"] = planned if planned is not None else {"error": err}
    return row


def report(rows: list[dict], command: str) -> str:
    def fitted(base: dict | None) -> str:
        return "-" if base is None else (f"{base['objective']:.1f}" if base["fits"] else "does not fit")

    def pct(a, b) -> str:
        return f"{100 * (b - a) / b:.1f}%" if a is not None and b else "-"

    lines = [f"Command: `{command}`", "", f"Machine: {machine()}.", "",
             "Time per iteration (makespan, ms) of the cost models in the script's notes. uniform layers + best: the"
             " decoder layers in equal counts, the embedding added to the first stage and the head (and MTP) to the last"
             " (Megatron-LM's default split); uniform blocks + best: equal counts of all blocks, embedding and head each"
             " counted as a layer (DeepSpeed's uniform, Megatron-LM's --account-for-embedding/loss-in-pipeline-split);"
             " each with the best registry schedule that fits, over the case's shapes; balanced + solve: the"
             " time-balanced cut of the first shape, `schedc solve`; Megatron: its published layout and interleaved"
             " 1F1B; AdaPipe-like: the cut and whole-stage recompute chosen together, 1F1B; plan: `schedc plan` (its layout,"
             " bound over every cut and shape, gap, wall time). A % is how much shorter plan's iteration is; at most:"
             " how much shorter any schedule of any cut could be (1 - bound / the baseline).", "",
             "| case | uniform layers + best | uniform blocks + best | balanced + solve | Megatron layout | AdaPipe-like"
             " | plan | plan's layout | bound | gap | vs uniform layers (at most) | vs uniform blocks (at most)"
             " | vs balanced | vs Megatron | vs AdaPipe-like | plan wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def uniform_cell(base: dict) -> str:
        return f"{base['objective']:.1f} ({base['schedule']}, v {base['chunks']} {base['placement']})"

    for r in rows:
        plan = r["plan"]
        obj = plan.get("objective")
        lay, blk, bal = r["base_uniform_layers"], r["base_uniform_blocks"], r["base_balanced"]
        meg, ada = r.get("base_megatron"), r.get("base_adapipe")
        layout = (f"v {plan['chunks']} {plan['placement']} {plan['stage_blocks']}" if obj is not None
                  else plan.get("error", "")[:80])
        lines.append(
            f"| {r['case']} | {uniform_cell(lay)} | {uniform_cell(blk)}"
            f" | {bal['objective'] if bal['objective'] is None else round(bal['objective'], 1)}"
            f" | {fitted(meg)} | {fitted(ada)}"
            f" | {'-' if obj is None else round(obj, 1)} | {layout} | {plan.get('bound', 0):.1f}"
            f" | {100 * plan.get('gap', 0):.1f}%"
            f" | {pct(obj, lay['objective'])} ({pct(plan.get('bound'), lay['objective'])})"
            f" | {pct(obj, blk['objective'])} ({pct(plan.get('bound'), blk['objective'])})"
            f" | {pct(obj, bal['objective'])} | {pct(obj, meg['objective']) if meg and meg['fits'] else '-'}"
            f" | {pct(obj, ada['objective']) if ada and ada['fits'] else '-'} | {r['plan_wall']:.1f} |")
    return "\n".join(lines)


LAYOUTS = (  # (row key, label), as the table's columns
    ("base_uniform_layers", "uniform layers + best"),
    ("base_uniform_blocks", "uniform blocks + best"),
    ("base_balanced", "balanced + solve"),
    ("base_megatron", "Megatron layout"),
    ("base_adapipe", "AdaPipe-like"),
    ("plan", "plan"),
)


def plot(rows: list[dict], path: Path) -> None:
    """One panel per case, each on its own time axis (zoomed in: the layouts differ by a few percent):
    a dot per layout that has an iteration time (a baseline that does not fit, or has none for the
    case, is left out), plan's proven bound dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 1.8 * len(rows)), squeeze=False)
    for ax, r in zip(axes[:, 0], rows):
        dots = [(label, r[key]["objective"]) for key, label in LAYOUTS
                if r.get(key) and r[key].get("objective") is not None and r[key].get("fits", True)]
        bound = r["plan"].get("bound")
        for y, (label, x) in enumerate(dots):
            ax.scatter([x], [y], color="tab:blue" if label == "plan" else "tab:gray", zorder=3)
            ax.annotate(f"{x:.0f}", (x, y), textcoords="offset points", xytext=(6, -3), fontsize=7)
        ax.set_yticks(range(len(dots)), [label for label, _ in dots], fontsize=7)
        ax.set_ylim(len(dots) - 0.5, -0.5)
        xs = [x for _, x in dots] + ([bound] if bound is not None else [])
        if xs:
            width = (max(xs) - min(xs)) or max(xs) * 0.01
            ax.set_xlim(min(xs) - 0.04 * width, max(xs) + 0.12 * width)
        title = r["case"]
        if bound is not None:
            ax.axvline(bound, color="tab:red", linestyle="--", linewidth=1)
            title += f": plan {r['plan']['objective']:.0f}, its bound over every cut {bound:.0f} (dashed)"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("iteration (ms)", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="write the table into benchmarks/RESULTS.md (section plan) and benchmarks/plan.png")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds for each solve and each plan")
    parser.add_argument("--only", default="", help="the cases whose name contains this")
    parser.add_argument("--out", default="out/plan", help="where the files go")
    args = parser.parse_args()
    refuse_partial_write(parser, args)
    out_dir = ROOT / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in CASES:
        if args.only in case:
            rows.append(run_case(case, args.time_limit, out_dir))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "plan"} | {"plan": {
                k: rows[-1]["plan"].get(k) for k in ("objective", "bound", "gap", "chunks", "placement", "stage_blocks")}}),
                flush=True)
    command = "python benchmarks/plan.py" + (" --write" if args.write else "") + (
        f" --time-limit {args.time_limit:g}" if args.time_limit != 60 else "")
    text = report(rows, command)
    print(text)
    if args.write:
        write_section("plan", "## plan: the layout chosen with the schedule\n\n" + text)
        plot(rows, Path(__file__).with_name("plan.png"))


if __name__ == "__main__":
    main()
