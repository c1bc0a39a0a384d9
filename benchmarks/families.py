"""The remaining schedule families (issue 27): asynchronous PipeDream-2BW against the flushed
schedules, in the steady state.

    python benchmarks/families.py [--write] [--parts 2bw,seq]

Part ``2bw``: on the zero-bubble paper's settings (``examples/problems/zb-paper``, the 2p files:
the paper's measured F, B, W and latency per stage, memory in units of one microbatch's
activation per stage, M_B), the time per microbatch in the steady state (``Timeline.per_microbatch``,
objective ``steady``): 1F1B, ZB-H1 and ZB-V (on the same model cut into 2p stages, V placement)
with a flush every iteration of m microbatches (their makespan over m), against 2BW (1F1B without
a flush: ``schedc.solvers.families.asynchronous``, the mean over its middle rounds). Memory beside: each
schedule's peak activation in M_B against the 1p and 2p limits (p M_B and 2p M_B), and the weight
copies each keeps: 2BW one more than the others (the settings give activation memory only, so the
second copy is named, not added). No search: every figure is a simulation, exact, machine-free.

Part ``seq``: Seq1F1B (``schedc.solvers.families.sequence``; k = 2, 4, 8 chunks per sequence, fused and
split backward) against 1F1B and ZB-H1 at sequence lengths 4k to 32k, on the cost model of the
example GPT's block (``schedc.runtime.gpt.Block``: pre-norm attention, q/k/v in one Linear, MLP
4h wide, causal flash attention) at a 7B-like width, written out below (``gpt_problem``): FLOPs at
one throughput give the times, so a later chunk, whose queries attend to more keys, costs more;
activations as Megatron-LM counts them with flash attention (34 h bytes per token and layer: no
s^2 term), so each chunk holds 1/k of a sequence's. Per row: the iteration's makespan, the
bubble, and the peak memory (static included) of the busiest rank; and per length the memory
limit below which only the chunked schedules fit. Simulated: no search (``solve`` searches chunked
problems since issue 27, but not here: these problems are far above its full model's size), exact
on any machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from _results import v_twin, write_section  # noqa: E402

import schedc  # noqa: E402
import schedc.solvers  # noqa: E402,F401  (registers the schedules)
from schedc.simulate import simulate  # noqa: E402
from schedc.solvers.registry import build  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = sorted((ROOT / "examples/problems/zb-paper").glob("zb-*-2p.yaml"))
FLUSHED = ("1f1b", "zb-h1", "zb-v")

# The cost model of part "seq": a 7B-like GPT of schedc.runtime.gpt's blocks in bf16 with Adam.
HIDDEN, LAYERS, VOCAB = 4096, 32, 50257
RANKS, MICROBATCHES = 8, 16
THROUGHPUT = 400e12  # FLOP/s a GPU sustains on these matmuls (one figure for all: only ratios matter)
LINK = 100e9  # bytes/s between two pipeline ranks
STATIC_BYTES = 16  # per parameter: bf16 weight and gradient, fp32 master weight and two Adam moments
ACT_BYTES = 34  # per token, layer and unit of width: Megatron-LM's count with flash attention
LENGTHS = (4096, 8192, 16384, 32768)
CHUNKS = (2, 4, 8)
GIB = 2 ** 30


def gpt_problem(seq: int, chunks: int = 1) -> schedc.Problem:
    """The model cut into RANKS stages of LAYERS / RANKS blocks (the LM head on the last), one
    sequence per microbatch, cut into ``chunks``. Per block and token: the Linear layers' 24 h^2
    FLOPs forward, as many for the input gradient and for the weight gradient; causal attention
    4 h FLOPs per (query, key) pair forward and twice that backward, so chunk c of k (t = seq / k
    queries, each attending to the keys of chunks 0..c and the causal part of its own) does
    4 h t^2 (c + 1/2) forward. Times in ms, memory in GiB."""
    h, per_stage = HIDDEN, LAYERS // RANKS
    t = seq / chunks
    linear = 24 * h * h * seq * per_stage  # forward FLOPs of the stage's Linear layers, one sequence
    attention = 2 * h * seq * seq * per_stage  # forward FLOPs of its causal attention: 4 h s^2 / 2
    head = 2 * h * VOCAB * seq
    ms = 1e3 / THROUGHPUT
    costs = {"F": [(linear + attention + (head if s == RANKS - 1 else 0)) * ms for s in range(RANKS)],
             "B": [(linear + 2 * attention + (head if s == RANKS - 1 else 0)) * ms for s in range(RANKS)],
             "W": [(linear + (head if s == RANKS - 1 else 0)) * ms for s in range(RANKS)]}
    params = 12 * h * h * per_stage
    activation = ACT_BYTES * h * seq * per_stage / GIB
    data = {"name": f"gpt-7b-s{seq}", "ranks": RANKS, "microbatches": MICROBATCHES, "costs": costs,
            "comm": 2 * h * t / LINK * 1e3,  # one unit's activation (bf16) over the link
            "memory": {"F": activation, "B": -activation / 2, "static": params * STATIC_BYTES / GIB}}
    if chunks > 1:
        pair = [t * t * (c + 0.5) for c in range(chunks)]  # (query, key) pairs of each chunk
        share = lambda extra: [(linear * t / seq + extra * x / (seq * seq / 2) * attention) / (linear + extra * attention)  # noqa: E731
                               for x in pair]
        data["sequence_chunks"] = {"count": chunks, "F": share(1), "B": share(2), "W": [1 / chunks] * chunks}
    return schedc.Problem.parse(data)


def seq_rows() -> list[dict]:
    rows = []
    for seq in LENGTHS:
        cases = [("1f1b", 1), ("zb-h1", 1)] + [(name, k) for k in CHUNKS for name in ("seq1f1b", "seq1f1b-zb")]
        for name, k in cases:
            problem = gpt_problem(seq, k)
            t = simulate(problem, build(name, problem))
            rows.append({"seq": seq, "schedule": name, "k": k, "makespan": t.makespan, "bubble": t.bubble_rate(),
                         "peak": max(t.peak_memory), "activation": max(t.peak_activation)})
            print(f"s={seq} {name} k={k}: makespan {t.makespan:.1f} ms, bubble {t.bubble_rate():.2%},"
                  f" peak {max(t.peak_memory):.1f} GiB", flush=True)
    return rows


def seq_table(rows: list[dict]) -> str:
    lines = ["| sequence | schedule | chunks | iteration (ms) | bubble | peak memory (GiB) | of which activations |",
             "|---|---|---|---|---|---|---|"]
    limits = []
    for row in rows:
        lines.append(f"| {row['seq'] // 1024}k | {row['schedule']} | {row['k']} | {row['makespan']:.1f} |"
                     f" {100 * row['bubble']:.2f}% | {row['peak']:.1f} | {row['activation']:.1f} |")
    for seq in LENGTHS:
        whole = min(r["peak"] for r in rows if r["seq"] == seq and r["k"] == 1)
        chunked = min(r["peak"] for r in rows if r["seq"] == seq and r["k"] > 1)
        limits.append(f"{seq // 1024}k: below {whole:.1f} GiB only the chunked schedules fit (down to {chunked:.1f} GiB)")
    return "\n".join(lines) + "\n\n" + "; ".join(limits) + "."


def two_bw_rows() -> list[dict]:
    rows = []
    for path in SETTINGS:
        base = schedc.load_problem(path).with_changes(objective="steady", memory={"limit": None})
        p = base.ranks
        problems = {"1f1b": base, "zb-h1": base, "zb-v": v_twin(base), "2bw": base}
        row = {"setting": path.stem.removesuffix("-2p"), "p": p, "m": base.microbatches}
        for name, problem in problems.items():
            t = simulate(problem, build(name, problem))
            row[name] = (t.per_microbatch, max(t.peak_activation))
            print(f"{row['setting']}: {name} {t.per_microbatch:.4g} per microbatch, peak {max(t.peak_activation):g} M_B",
                  flush=True)
        rows.append(row)
    return rows


def two_bw_table(rows: list[dict]) -> str:
    lines = ["| setting | p | m | 1F1B | ZB-H1 | ZB-V | 2BW | 2BW vs best flushed |"
             " peak activation (M_B): 1F1B / ZB-H1 / ZB-V / 2BW | 2BW within 1p / 2p |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        best = min(row[name][0] for name in FLUSHED)
        peaks = " / ".join(f"{row[name][1]:g}" for name in (*FLUSHED, "2bw"))
        fits = " / ".join("yes" if row["2bw"][1] <= k * row["p"] + 1e-9 else "no" for k in (1, 2))
        lines.append(f"| {row['setting']} | {row['p']} | {row['m']} | "
                     + " | ".join(f"{row[name][0]:.2f}" for name in (*FLUSHED, "2bw"))
                     + f" | x{best / row['2bw'][0]:.3f} | {peaks} | {fits} |")
    return "\n".join(lines)


NOTE = ("Time per microbatch in ms (the paper's stage costs): a flushed schedule's makespan over its m"
        " microbatches, 2BW's steady state (the mean over its rounds between the first and the last). 2BW keeps"
        " two versions of every stage's weights, the flushed schedules one: that copy is not in the activation"
        " figures (the settings give activation memory only). 2BW's gradients are one step stale"
        " (w(t+1) = w(t) - lr g(w(t-1))): the comparison is of speed and memory, not of the training run.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the sections of benchmarks/RESULTS.md")
    ap.add_argument("--parts", default="2bw,seq", help="comma-separated: 2bw, seq")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"2bw", "seq"}
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}; the parts are: 2bw, seq")
    sections = {  # part -> (section, title, the table's maker, what follows the command)
        "2bw": ("families-2bw", "Asynchronous PipeDream-2BW against flushed schedules",
                lambda: two_bw_table(two_bw_rows()) + "\n\n" + NOTE, ""),
        "seq": ("families-seq", "Sequence chunks: Seq1F1B against 1F1B and ZB-H1", lambda: seq_table(seq_rows()),
                f" The cost model: {RANKS} stages of a {LAYERS}-layer GPT, width {HIDDEN}, {MICROBATCHES}"
                f" microbatches of one sequence, {THROUGHPUT / 1e12:g} TFLOP/s, {LINK / 1e9:g} GB/s between ranks,"
                " bf16 with Adam (benchmarks/families.py, gpt_problem)."),
    }
    for part, (section, title, make, model) in sections.items():
        if part not in parts:
            continue
        table = make()
        print(table)
        if args.write:
            write_section(section, f"## {title} (issue 27)\n\n`python benchmarks/families.py --write --parts {part}`"
                          f" (simulated: no search, exact on any machine).{model}\n\n{table}")

if __name__ == "__main__":
    main()
