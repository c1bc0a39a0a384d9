"""Measured against predicted activation memory, per rank, for every schedule that applies.

    python benchmarks/memory.py [--write] [--ps 2,4] [--ms 8,32] [--steps 2]

A small GPT (``schedc.runtime.gpt``) is cut into p x v stages and profiled with
``profile_stages`` (activation memory of one microbatch per stage, in MiB, from the tensors
autograd saves, what B keeps for W, and each stage's working memory: what its ops need while they
run); ``make_problem`` makes the Problem (``memory.working``: that working memory plus the largest
tensor the stage receives). For p = 2 and 4 and
m = 8 and 32, on three layouts, every registry schedule with ``why_not(problem) is None`` is
compiled (one chunk per rank, loop placement: all that apply; two chunks, the V placement: all
that apply; two chunks, loop placement: interleaved 1F1B, the one schedule made for it), and one
ILP schedule (``schedc.compile(..., "ilp")``) on the one-chunk layout under a memory limit of
static + 1.5 x 1F1B's peak activation on every rank (at most 5 s).

Each p runs in one ``run_local`` group (gloo, CPU, p processes): every schedule for ``--steps``
steps with an SGD optimizer (gradients set to None at each step, so the runtime's gradient
exclusion is exercised), ``PipelineRuntime(..., measure_memory=True)``. Measured: the largest
per-instruction peak of the last step, per rank. Predicted: ``simulate(problem,
schedule).peak_activation`` (the highest activation level plus the rank's working memory). Ratio:
measured / predicted. The notes split the excess over the modelled level at each rank's peak
instruction into what was held before the instruction beyond the simulated level (received
tensors waiting for their op, sends in flight, deltas measured differently) and the
instruction's own transient (its peak above the levels before and after it).

--write puts the table into benchmarks/RESULTS.md with the command and the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import schedc
import schedc.solvers as solvers
from schedc.kinds import BY_NAME
from schedc.runtime import PipelineRuntime
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from schedc.runtime.launch import run_local
from schedc.runtime.profile import MiB, make_problem, profile_stages

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_section  # noqa: E402

LAYOUTS = (("loop", 1), ("loop", 2), ("v", 2))  # (placement, chunks)


@dataclass(frozen=True)
class Config:
    layers: int = 14
    d_model: int = 64
    heads: int = 2
    seq: int = 64
    vocab: int = 128
    mb_size: int = 2  # sequences per microbatch
    steps: int = 2
    ilp_time: float = 5.0
    seed: int = 0

    def blocks(self):
        return gpt_blocks(vocab=self.vocab, d_model=self.d_model, n_layers=self.layers, n_heads=self.heads,
                          seq_len=self.seq, seed=self.seed)

    def describe(self) -> str:
        return (f"GPT {self.layers} layers, d_model {self.d_model}, {self.heads} heads, seq {self.seq}, vocab {self.vocab},"
                f" microbatches of {self.mb_size} sequences; stages cut uniformly ({self.layers + 2} blocks:"
                f" embedding, {self.layers} transformer blocks, head)")


def profile(cfg: Config, n_stages: int):
    x, y = token_batches(1, cfg.mb_size, cfg.seq, cfg.vocab, seed=cfg.seed)[0]
    return profile_stages(stages(cfg.blocks(), n_stages), x, y, lm_loss, warmup=1, repeats=3, optimizer_state=0)


def cases(cfg: Config, p: int, ms: list[int], tmp: Path, say) -> list[dict]:
    """Compile every schedule for ``p`` ranks: [{name, path, layout, m, predicted}]."""
    out = []
    for placement, v in LAYOUTS:
        prof = profile(cfg, p * v)
        for m in ms:
            prob = make_problem(prof, ranks=p, microbatches=m, chunks=v, placement=placement,
                                name=f"gpt-p{p}-m{m}-{placement}{v}")
            todo = [(n, prob) for n, spec in solvers.REGISTRY.items() if spec.why_not(prob) is None
                    and (v == 1 or placement == "v" or n == "interleaved-1f1b")]
            if (placement, v) == ("loop", 1):
                peak = schedc.simulate(prob, solvers.build("1f1b", prob)).peak_activation
                limit = max(s + 1.5 * a for s, a in zip(prob.static_memory, peak))
                todo.append(("ilp", prob.with_changes(memory={"limit": limit})))
            for name, problem in todo:
                t0 = time.perf_counter()
                compiled = schedc.compile(problem, name, time_limit=cfg.ilp_time) if name == "ilp" \
                    else schedc.compile(problem, name)
                path = tmp / f"{prob.name}-{name}.json"
                compiled.save(path)
                if name == "ilp":
                    say(f"  ilp on {prob.name} under limit {limit:.2f} MiB: {time.perf_counter() - t0:.1f} s")
                out.append(dict(name=name, path=str(path), layout=f"{placement} v={v}", m=m,
                                predicted=list(compiled.timeline.peak_activation),
                                key=(prob.name, tuple(map(tuple, compiled.schedule.ranks))),
                                profile=dict(activation=prof.activation, sends=prof.sends,
                                             working=list(prob.stage_working)),
                                mem={k: list(v) for k, v in prob.mem.items()}))
    return out


def rank_main(rank: int, world: int, cfg: Config, todo: list[dict]) -> list[list[tuple[str, float, float]]]:
    """Per case, the last step's instructions with the level after and the peak during each (MiB)."""
    out = []
    for case in todo:
        compiled = schedc.load(case["path"])
        prob = compiled.problem
        mods = stages(cfg.blocks(), prob.n_stages)
        mine = {s: mods[s] for s in prob.rank_stages[rank]}
        opt = torch.optim.SGD([q for mod in mine.values() for q in mod.parameters()], lr=1e-3)
        rt = PipelineRuntime(compiled, mine, lm_loss, optimizer=opt, measure_memory=True, timeout=600)
        batches = token_batches(cfg.steps, cfg.mb_size * prob.microbatches, cfg.seq, cfg.vocab, seed=cfg.seed)
        for i, (x, y) in enumerate(batches):
            rt.measure_memory = i == len(batches) - 1  # the earlier steps warm up, unmeasured
            rt.step(x, y)
        out.append([(str(ins), a / MiB, pk / MiB) for ins, (a, pk) in zip(rt.program, rt.memory)])
    return out


def transients(instrs: list[tuple[str, float, float]]) -> dict[str, list[float]]:
    """Per compute kind, how far each op's peak rose above the larger of the levels before and
    after it (MiB): working memory that lives only during the op."""
    out: dict[str, list[float]] = {}
    before = 0.0
    for name, after, peak in instrs:
        kind = BY_NAME.get(name.split("@")[0].rstrip("0123456789"))  # None: not a compute op
        if kind is not None:
            out.setdefault(kind, []).append(peak - max(before, after))
        before = after
    return out


def at_peak(instrs: list[tuple[str, float, float]], mem: dict[str, list[float]]) -> tuple[float, float]:
    """At the instruction with the rank's highest peak: (level before it minus the simulated
    activation level before it, its peak above the levels before and after it), MiB."""
    before, simulated = 0.0, 0.0
    best = None
    for name, after, peak in instrs:
        if best is None or peak > best[0]:
            best = (peak, before - simulated, peak - max(before, after))
        head = name.split()[0]
        kind = BY_NAME.get(head.split("@")[0].rstrip("0123456789"))
        if kind is not None:
            simulated += mem[kind][int(head.split("@s")[1])]
        before = after
    return best[1], best[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ps", default="2,4", help="pipeline ranks, comma-separated")
    ap.add_argument("--ms", default="8,32", help="microbatches, comma-separated")
    ap.add_argument("--steps", type=int, default=Config.steps, help="steps per schedule (the last is measured)")
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()
    cfg = Config(steps=max(2, args.steps))
    ms = [int(x) for x in args.ms.split(",")]
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    rows, notes = [], []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="schedc-memory-") as tmp:
        for p in (int(x) for x in args.ps.split(",")):
            todo, same = unique(cases(cfg, p, ms, Path(tmp), say))
            say(f"p={p}: {len(todo)} distinct schedules ({len(same)} cases), running")
            t0 = time.perf_counter()
            results = run_local(rank_main, p, cfg, todo, timeout=3600, threads=1)
            say(f"p={p}: ran in {time.perf_counter() - t0:.0f} s")
            extra: dict[str, dict[str, list[float]]] = {}
            held, transient = [], []
            for case, i in same:
                steps = [results[r][i] for r in range(p)]
                meas = [max(pk for _, _, pk in st) for st in steps]
                ratios = [mm / pr if pr else float("nan") for mm, pr in zip(meas, case["predicted"])]
                rows.append(dict(case, p=p, measured=meas, ratios=ratios, end=[st[-1][1] for st in steps]))
                for st in steps:
                    for kind, values in transients(st).items():
                        extra.setdefault(case["layout"], {}).setdefault(kind, []).extend(values)
                    h, t = at_peak(st, case["mem"])
                    held.append(h)
                    transient.append(t)
                say(f"{case['layout']:9} m={case['m']:<3} {case['name']:17} pred "
                    + " ".join(f"{v:7.2f}" for v in case["predicted"]) + " | meas "
                    + " ".join(f"{v:7.2f}" for v in meas) + " | ratio " + " ".join(f"{v:.3f}" for v in ratios))
            boundary = max(same[0][0]["profile"]["sends"])
            notes.append(
                f"p={p}, at each rank's peak instruction ({len(held)} rank-cases): held before it beyond the"
                f" simulated level {statistics.median(held):.3f} median, {min(held):.3f} to {max(held):.3f} MiB"
                f" ({min(held) / boundary:.1f} to {max(held) / boundary:.1f} boundary tensors); its transient"
                f" {statistics.median(transient):.3f} median, {min(transient):.3f} to {max(transient):.3f} MiB")
            for layout, kinds in extra.items():
                prof = next(c["profile"] for c, _ in same if c["layout"] == layout)
                notes.append(
                    f"p={p}, {layout}: one microbatch's activation per stage {fmt(prof['activation'], 2)} MiB,"
                    f" boundary tensor {fmt(prof['sends'][:-1], 3)} MiB, modelled working memory"
                    f" (`memory.working`) {fmt(prof['working'], 3)} MiB; measured transients above the levels"
                    f" before and after the op (median / max over ops, MiB): "
                    + ", ".join(f"{k} {statistics.median(v):.2f} / {max(v):.2f}" for k, v in sorted(kinds.items())))
    wall = time.perf_counter() - t_start
    table = report(cfg, rows, notes, wall, " ".join(["python", "benchmarks/memory.py", *sys.argv[1:]]))
    print(table)
    if args.write:
        write_section("memory", table)


def unique(cases: list[dict]) -> tuple[list[dict], list[tuple[dict, int]]]:
    """Cases whose schedules are the same order on the same problem run once."""
    todo, index, same = [], {}, []
    for case in cases:
        key = case["key"]
        if key not in index:
            index[key] = len(todo)
            todo.append(case)
        same.append((case, index[key]))
    return todo, same


def fmt(values, digits: int) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def report(cfg: Config, rows: list[dict], notes: list[str], wall: float, command: str) -> str:
    lines = [
        "## Activation memory: measured against the simulator's prediction",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}, torch {torch.__version__}, gloo, one torch thread per rank  ",
        f"Setup: {cfg.describe()}; profiled with `profile_stages` (MiB), `make_problem`; {cfg.steps} steps per"
        f" schedule with SGD (gradients set to None at each step), the last measured (`measure_memory=True`);"
        f" schedules that are the same order on the same problem run once; wall time {wall:.0f} s.  ",
        "Predicted: `simulate(problem, schedule).peak_activation` per rank (MiB): the highest activation level"
        " plus the rank's working memory (the largest `memory.working` of its stages). Measured: the largest"
        " per-instruction peak of the step per rank (MiB, relative to the step's start; parameter gradients and"
        " the optimizer step excluded). Ratio: measured / predicted, per rank.",
        "",
        "| p | m | layout | schedule | predicted (MiB) | measured (MiB) | ratio per rank | worst | excess (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        worst = max(r["ratios"], key=lambda x: abs(x - 1))
        excess = [m - p for m, p in zip(r["measured"], r["predicted"])]
        lines.append(f"| {r['p']} | {r['m']} | {r['layout']} | {r['name']} | {fmt(r['predicted'], 2)} |"
                     f" {fmt(r['measured'], 2)} | {fmt(r['ratios'], 3)} | {worst:.3f} | {fmt(excess, 2)} |")
    within = [r for r in rows if all(abs(x - 1) <= 0.10 for x in r["ratios"])]
    missed = [f"p={r['p']} m={r['m']} {r['layout']} {r['name']}" for r in rows if r not in within]
    spread = []
    for p in sorted({r["p"] for r in rows}):
        ratios = [x for r in rows if r["p"] == p for x in r["ratios"]]
        spread.append(f"p = {p} {min(ratios):.3f} to {max(ratios):.3f}")
    lines += ["", f"Within 10 % on every rank: {len(within)} of {len(rows)} cases"
              + (f"; missed: {', '.join(missed)}." if missed else ".")
              + f" Ratios over every rank: {', '.join(spread)}.", ""]
    boundary = max(max(r["profile"]["sends"]) for r in rows)
    most = max(rows, key=lambda r: max(r["end"]))
    left = max(most["end"])
    lines.append(f"- level before STEP, which waits for the sends still in flight: at most {left:.3f} MiB"
                 f" ({left / boundary:.1f} boundary tensors; p={most['p']} m={most['m']} {most['layout']} {most['name']})")
    by_m = {}
    for r in rows:
        by_m.setdefault((r["p"], r["layout"], r["name"]), {})[r["m"]] = max(r["ratios"])
    growth = [v[max(v)] - v[min(v)] for v in by_m.values() if len(v) > 1]
    if growth:
        lines.append(f"- worst ratio at the largest m minus at the smallest, per schedule: {min(growth):+.3f} to"
                     f" {max(growth):+.3f}")
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
