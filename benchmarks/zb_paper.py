"""The zero-bubble paper's own settings: schedc's solver against the paper's ZB-1p / ZB-2p.

    python benchmarks/zb_paper.py [--write] [--time-limit S] [--solvers cbc,cpsat] [--only NAME]
    python benchmarks/zb_paper.py --problems   # only (re)write examples/problems/zb-paper/

Source: Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024.

- Table 3, the models: 1.5B (p = 8, h = 2304, a = 24), 6.2B (p = 8, h = 4096, a = 32),
  14.6B (p = 16, h = 5120, a = 40), 28.3B (p = 32, h = 6144, a = 48); sequence length s = 1024.
- Table 9, profiled per-stage times in ms: T_F, T_B, T_W and T_comm for each model at three
  microbatch counts (the ``COSTS`` below, copied figure by figure). Every stage gets the same
  costs, as the paper's own scheduler uses them.
- Table 1, activation memory per layer (per token of a microbatch): a forward allocates
  M_B = 34h + 5as, B frees M_B - M_W, W frees M_W = 32h. Only the ratio M_W / M_B matters, so
  memory is in units of one stage's M_B: memory.F = 1, memory.B = -(1 - M_W/M_B),
  memory.W = -M_W/M_B.
- The memory limits: 1p = p * M_B (1F1B's peak), 2p = 2p * M_B; no static memory.
- Table 5, published bubble rates (``PUBLISHED``): 1F1B, 1F1B-I, ZB-H1, ZB-H2, ZB-1p, ZB-2p.
  The bubble is span based (per stage: 1 - busy / (its own first start to last end)), so every
  problem has ``objective: span``.

Check of the transcription: our simulator reproduces the published 1F1B, ZB-H1 and ZB-H2
bubble rates to all four printed digits on 10 of the 12 rows; on 28.3B at m = 128 and 256 it does
not (within 3 %), and the table marks those rows (the figures there are as recorded here).

The V placement (v = 2, each chunk half a stage's costs and memory) is added at 1p and 2p
memory for the 1.5B and 6.2B costs at m = 24, with torch's ZBVZeroBubble and DualPipeV beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import yaml

from schedc import Problem

sys.path.insert(0, os.path.dirname(__file__))

ROOT = Path(__file__).resolve().parent.parent
PROBLEM_DIR = ROOT / "examples" / "problems" / "zb-paper"
SEQ = 1024

MODELS = {  # Table 3: ranks p, hidden size h, attention heads a
    "1.5B": (8, 2304, 24),
    "6.2B": (8, 4096, 32),
    "14.6B": (16, 5120, 40),
    "28.3B": (32, 6144, 48),
}

COSTS = {  # Table 9: (model, microbatches) -> T_F, T_B, T_W, T_comm in ms
    ("1.5B", 24): (18.522, 18.086, 9.337, 0.601),
    ("1.5B", 32): (18.513, 18.086, 9.331, 0.626),
    ("1.5B", 64): (18.546, 18.097, 9.321, 0.762),
    ("6.2B", 24): (29.718, 29.444, 19.927, 0.527),
    ("6.2B", 32): (29.802, 29.428, 19.530, 0.577),
    ("6.2B", 64): (29.935, 29.621, 19.388, 0.535),
    ("14.6B", 48): (11.347, 11.248, 8.132, 0.377),
    ("14.6B", 64): (11.307, 11.254, 8.101, 0.379),
    ("14.6B", 128): (11.325, 11.308, 8.109, 0.378),
    ("28.3B", 96): (10.419, 10.207, 7.715, 0.408),
    ("28.3B", 128): (10.408, 10.204, 7.703, 0.408),
    ("28.3B", 256): (10.402, 10.248, 7.698, 0.460),
}

PUBLISHED_COLUMNS = ("1F1B", "1F1B-I", "ZB-H1", "ZB-H2", "ZB-1p", "ZB-2p")
PUBLISHED = {  # Table 5: bubble rates
    ("1.5B", 24): (0.2431, 0.1055, 0.1585, 0.1083, 0.1585, 0.0433),
    ("1.5B", 32): (0.1985, 0.0818, 0.1242, 0.0837, 0.1242, 0.0039),
    ("1.5B", 64): (0.1240, 0.0443, 0.0674, 0.0444, 0.0674, 0.0026),
    ("6.2B", 24): (0.2347, 0.0808, 0.1323, 0.0698, 0.1323, 0.0029),
    ("6.2B", 32): (0.1898, 0.0628, 0.1045, 0.0559, 0.1045, 0.0022),
    ("6.2B", 64): (0.1091, 0.0320, 0.0554, 0.0294, 0.0554, 0.0010),
    ("14.6B", 48): (0.2552, 0.1104, 0.1397, 0.0672, 0.1397, 0.0066),
    ("14.6B", 64): (0.2082, 0.0852, 0.1088, 0.0516, 0.1088, 0.0054),
    ("14.6B", 128): (0.1251, 0.0445, 0.0576, 0.0266, 0.0576, 0.0028),
    ("28.3B", 96): (0.2646, 0.1493, 0.1421, 0.0641, 0.1421, 0.0038),
    ("28.3B", 128): (0.2226, 0.1212, 0.1151, 0.0516, 0.1151, 0.0037),
    ("28.3B", 256): (0.1306, 0.0643, 0.0592, 0.0266, 0.0592, 0.0015),
}

V_SETTINGS = (("1.5B", 24), ("6.2B", 24))


def memory_ratio(model: str) -> float:
    """M_W / M_B per layer (Table 1): 32h / (34h + 5as)."""
    _, h, a = MODELS[model]
    return 32 * h / (34 * h + 5 * a * SEQ)


def paper_problem(model: str, m: int, k: int, *, v_shape: bool = False) -> Problem:
    """The paper's setting (model, m) at k p * M_B memory; ``v_shape``: two chunks per rank in
    the V placement, each with half a stage's costs and memory."""
    p = MODELS[model][0]
    f, b, w, comm = COSTS[model, m]
    r = memory_ratio(model)
    scale = 0.5 if v_shape else 1.0
    data = dict(
        name=f"zb-{model}-m{m}-{k}p" + ("-v" if v_shape else ""),
        ranks=p,
        microbatches=m,
        chunks=2 if v_shape else 1,
        placement="v" if v_shape else "loop",
        costs=dict(F=round(f * scale, 6), B=round(b * scale, 6), W=round(w * scale, 6)),
        comm=comm,
        memory=dict(F=scale, B=round(-(1 - r) * scale, 9), W=round(-r * scale, 9), limit=float(k * p)),
        objective="span",
    )
    return Problem.parse(data, source=data["name"])


def settings() -> list[tuple[str, int, int, bool]]:
    """(model, m, k, v_shape) of every cell: the 12 rows x {1p, 2p}, then the V cells."""
    out = [(model, m, k, False) for (model, m) in COSTS for k in (1, 2)]
    out += [(model, m, k, True) for (model, m) in V_SETTINGS for k in (1, 2)]
    return out


def write_problems(directory: Path = PROBLEM_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for model, m, k, v in settings():
        problem = paper_problem(model, m, k, v_shape=v)
        pub = PUBLISHED[model, m]
        head = [
            f"# Zero Bubble Pipeline Parallelism (Qi et al., ICLR 2024), model {model}, m = {m}:",
            "# costs from Table 9 (ms per stage), memory in units of M_B from Table 1, limit"
            f" {k}p * M_B. Written by benchmarks/zb_paper.py.",
        ]
        if v:
            head.append("# V placement: two chunks per rank, each half a stage's costs and memory.")
        else:
            head.append(f"# Published bubble (Table 5): ZB-1p {pub[4]}, ZB-2p {pub[5]}, ZB-H1 {pub[2]}, ZB-H2 {pub[3]}.")
        path = directory / f"{problem.name}.yaml"
        body = yaml.safe_dump(problem.model_dump(exclude_none=True), sort_keys=False)
        path.write_text("\n".join(head) + "\n" + body)
        paths.append(path)
    return paths


def run_json(args: list[str], timeout: float) -> tuple[dict | None, float, str]:
    """Run a schedc command with --json; (parsed output or None, wall seconds, error text)."""
    import json
    import subprocess

    began = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "schedc.app.cli", *args, "--json"], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - began, f"killed after {timeout:g} s"
    wall = time.perf_counter() - began
    if out.returncode != 0:
        return None, wall, (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]
    return json.loads(out.stdout), wall, ""


def solve_cell(path: Path, solver: str, time_limit: float, out_dir: Path) -> dict:
    """``schedc solve`` as a user runs it (wall time of the whole command), then ``schedc
    simulate`` of the file it wrote: the reported bubble must be the simulated one."""
    output = out_dir / f"{path.stem}.{solver}.json"
    res, wall, err = run_json(
        ["solve", str(path), "-o", str(output), "--solver", solver, "--time-limit", str(time_limit), "-q"],
        timeout=10 * time_limit + 60,
    )
    if res is None:
        return {"error": err, "wall": wall}
    sim, _, err = run_json(["simulate", str(output)], timeout=600)
    if sim is None:
        return {"error": f"simulate: {err}", "wall": wall}
    if abs(sim["span"] - res["span"]) > 1e-9 * max(1.0, res["span"]):
        raise RuntimeError(f"{output}: solve reported span {res['span']}, the file simulates to {sim['span']}")
    return {**res, "wall": wall, "simulated_bubble": sim["bubble_span"]}


def torch_rows(path: Path) -> dict[str, float | None]:
    """torch.distributed.pipelining's ZBVZeroBubble and DualPipeV on the problem (None: does not fit)."""
    res, _, err = run_json(["compare", str(path), "--torch"], timeout=600)
    out: dict[str, float | None] = {}
    for row in (res or {}).get("results", []):
        if row["schedule"] in ("torch:ZBVZeroBubble", "torch:DualPipeV", "zb-v", "dualpipev") and row.get("applies"):
            out[row["schedule"]] = row["bubble_span"] if row["fits"] else None
    return out


def _pct(x: float | None, digits: int = 2) -> str:
    return "does not fit" if x is None else f"{100 * x:.{digits}f}%"


def main() -> None:
    from _results import commit, machine, write_section

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    parser.add_argument("--problems", action="store_true", help="only (re)write examples/problems/zb-paper/")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--solvers", default="cbc,cpsat")
    parser.add_argument("--only", default="", help="run the cells whose name contains this")
    parser.add_argument("--out", default="out/zb-paper", help="where the solved schedule files go")
    args = parser.parse_args()
    paths = write_problems()
    if args.problems:
        print(f"wrote {len(paths)} problems to {PROBLEM_DIR.relative_to(ROOT)}")
        return
    solver_names = [s for s in args.solvers.split(",") if s]
    out_dir = ROOT / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    misses = []
    for (model, m, k, v), path in zip(settings(), paths):
        if args.only and args.only not in path.stem:
            continue
        published = None if v else PUBLISHED[model, m][3 + k]  # ZB-1p or ZB-2p
        cells = [f"{model}", str(m), f"{k}p" + (" V" if v else ""), "n/a" if published is None else f"{published:.4f}"]
        extra = torch_rows(path) if v else {}
        if v:
            zbv = extra.get("torch:ZBVZeroBubble")
            cells[3] = f"ZBV {_pct(zbv)}, DualPipeV {_pct(extra.get('torch:DualPipeV'))}"
        for solver in solver_names:
            r = solve_cell(path, solver, args.time_limit, out_dir)
            if "error" in r:
                cells += [f"error: {r['error']}", "", "", "", f"{r['wall']:.1f}"]
                misses.append(f"{path.stem} ({solver}): {r['error']}")
                print(path.stem, solver, r["error"], flush=True)
                continue
            bubble = r["simulated_bubble"]
            bound_bubble = 1 - (1 - bubble) * r["span"] / max(r["bound"], 1e-300) if r["bound"] else None
            verdict = ""
            if published is not None:
                verdict = "≤ paper" if round(bubble, 4) <= published else "WORSE than paper"
            elif v and extra.get("torch:ZBVZeroBubble") is not None:
                verdict = "< ZBV" if bubble < extra["torch:ZBVZeroBubble"] - 1e-12 else (
                    "= ZBV, proven optimal" if r["status"] == "optimal" else "= ZBV")
            if r["wall"] > args.time_limit * 1.1 + 2:
                verdict += "; over the time limit"
            if r["gap"] > 0.01:
                misses.append(f"{path.stem} ({solver}): gap {100 * r['gap']:.2f}% ({r['status']})")
            if verdict.startswith("WORSE"):
                misses.append(f"{path.stem} ({solver}): bubble {bubble:.4f} above the paper's {published}")
            cells += [
                f"{bubble:.4f}",
                f"{r['status']}, gap {100 * r['gap']:.2f}%" + (f" ({verdict})" if verdict else ""),
                "n/a" if bound_bubble is None else f"{max(0.0, bound_bubble):.4f}",
                f"{max(r['peak_memory']):g} / {k * MODELS[model][0]:g}",
                f"{r['wall']:.1f}",
            ]
            print(path.stem, solver, f"bubble {bubble:.5f}", r["status"], f"gap {100 * r['gap']:.2f}%",
                  f"{r['wall']:.1f} s", verdict, flush=True)
        lines.append("| " + " | ".join(cells) + " |")
    head = ["model", "m", "memory", "paper ZB-1p/2p bubble (V: torch)"]
    for solver in solver_names:
        head += [f"{solver} bubble", f"{solver} status", f"{solver} bound bubble", "peak / limit", f"{solver} wall s"]
    body = [
        "Command: `python benchmarks/zb_paper.py --write"
        + (f" --time-limit {args.time_limit:g}" if args.time_limit != 60 else "")
        + (f" --solvers {args.solvers}" if args.solvers != "cbc,cpsat" else "") + "`",
        "",
        f"Machine: {machine()}. Commit: {commit()}.",
        "",
        "The zero-bubble paper's settings (Qi et al. 2024: Table 3 models, Table 9 profiled costs, Table 1",
        "memory, Table 5 published bubble rates; see the script's docstring), `objective: span`, solved with",
        f"`schedc solve --time-limit {args.time_limit:g}` (wall time of the whole command). Bubble = 1 - work /",
        "(p x largest rank span), read back with `schedc simulate` from the written file; the bound column",
        "is the bubble the proven lower bound allows. Peak memory in units of one stage's M_B.",
        "On 28.3B at m = 128 and 256 our simulation does not reproduce the paper's own 1F1B / ZB-H1 / ZB-H2",
        "figures from the Table 9 costs as recorded here (off by up to 4 %), so those two rows compare",
        "unlike inputs.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *lines,
        "",
        "Cells that miss the 1 % gap target or the paper's value: " + ("; ".join(misses) if misses else "none") + ".",
    ]
    text = "\n".join(body)
    print(text)
    if args.write and not args.only:
        write_section("zb-paper", "## The zero-bubble paper's settings: solved vs published ZB-1p / ZB-2p\n\n" + text)


if __name__ == "__main__":
    main()
