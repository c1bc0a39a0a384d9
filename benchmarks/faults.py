"""Fault stress: every kind of fault, many times, on 2 and 4 gloo ranks; how every other rank ends.

    python benchmarks/faults.py [--write] [--reps 20] [--hang 60] [--kinds raise,sigkill,...]

Each run is a fresh group of ranks (``run_local``, gloo on CPU, ranks forked from a server that
imported torch once) training a small GPT cut into one stage per rank, with ``PipelineRuntime``
for 3 steps, on 2 ranks (1F1B and ZB-H1 in turn, 4 microbatches) or 4 ranks (8 microbatches),
the runs alternating between the two. In each run one rank, the victim, faults:

- ``raise``: its stage raises ValueError on its j-th forward (j drawn per run, within the first
  two steps, the shape probe included); the exception ends its process, as a script's would.
- ``sigkill`` / ``exit``: its process is killed (SIGKILL) or exits (``os._exit(1)``) there.
- ``alive``: its stage raises there, its caller catches the error and stays alive until every
  other rank has ended (so no connection closes: the others can only learn it from the store).
- ``post``: it exits just before its first send or receive of step 0 (the shape exchange) or 1,
  and each rank next to it in the pipeline waits for that death (the process gone, then 0.2 s)
  before its own first post to it in that step: the peer died before a post, by construction
  (``schedc.runtime.faults``).
- ``batch``: rank 0 passes inputs, or the last rank targets, that ``step()`` cannot split into
  the microbatches (empty, a scalar, a list, an uneven batch) at step 0 or 1, and returns.
- ``allreduce``: with ``clip_grad_norm`` (sync), it exits at step 1's STEP before it posts the
  gradient-norm all-reduce, so the others fail in the collective.

Every other rank's outcome is classified: named (a ``PipelineError`` whose ``culprit`` is the
victim and whose message says "rank <victim>"), raw (any other exception, a PipelineError naming
another rank or none, a rank that ended without an outcome, or one that finished its steps as if
nothing had happened), or hang (no outcome ``--hang`` seconds after the run started). The
runtime's own deadline (``timeout=``) is set to twice that, so a rank that would only stop at its
deadline counts as a hang. Time to stop: from the fault (the victim's clock just before it
faulted) to the rank's outcome. "While posting": outcomes whose transport call was a post.

--write puts the table into benchmarks/RESULTS.md with the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import schedc
from schedc.runtime import PipelineRuntime
from schedc.runtime.faults import FaultPlan, dead, install
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from schedc.runtime.launch import RankFailed, run_local

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_section  # noqa: E402

KINDS = {
    "raise": "an exception in a stage (the process ends)",
    "sigkill": "a rank killed mid-step (SIGKILL)",
    "exit": "a rank killed mid-step (`os._exit`)",
    "alive": "a rank that fails and stays alive",
    "post": "a peer that dies just before a post to it",
    "batch": "a batch that cannot be split",
    "allreduce": "a rank that dies before the gradient-norm all-reduce",
}
STEPS = 3
# imported once by the server the ranks fork from (torch._dynamo: the first optimizer imports it, 2-3 s)
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "schedc.runtime.interpreter", "schedc.runtime.gpt",
           "schedc.runtime.faults", "schedc.solvers"]


def case_for(kind: str, rep: int, tmp: Path) -> dict:
    """The run ``rep`` of ``kind``: world, schedule file, victim and where it faults."""
    rng = random.Random(f"{kind}/{rep}")
    world = 2 if rep % 2 == 0 else 4
    m = 4 if world == 2 else 8
    name = "1f1b" if (rep // 2) % 2 == 0 else "zb-h1"
    path = tmp / f"{name}-{world}.json"
    if not path.exists():
        prob = schedc.Problem.parse({"ranks": world, "microbatches": m, "costs": {"F": 1, "B": 2, "W": 1}})
        schedc.compile(prob, name).save(path)
    case = dict(kind=kind, world=world, m=m, schedule=name, path=str(path), victim=rng.randrange(world),
                forward=rng.randint(1, 2 * m), step=rng.randint(0, 1), bad=None)
    if kind == "batch":
        case["victim"] = rng.choice([0, world - 1])
        case["bad"] = rng.choice(["empty", "scalar", "list", "uneven"])
    if kind == "allreduce":
        case["step"] = 1
    return case


def rank_main(rank: int, world: int, case: dict, out: str) -> None:
    """One rank of one run: fault as the case says if it is the victim, else train and write
    what stopped it to ``out/rank<r>.json``."""
    kind, victim = case["kind"], case["victim"]
    me = rank == victim
    compiled = schedc.load(case["path"])
    parts = stages(gpt_blocks(vocab=64, d_model=16, n_layers=max(1, world - 2), n_heads=2, seq_len=16, seed=1), world)
    mine = {s: parts[s] for s in compiled.problem.rank_stages[rank]}
    opt = torch.optim.SGD([p for mod in mine.values() for p in mod.parameters()], lr=0.1)
    plan = FaultPlan()
    if kind == "post":
        neighbours = {victim - 1, victim + 1} & set(range(world))
        plan = FaultPlan(die="post", step=case["step"]) if me else \
            FaultPlan(wait_for=victim, step=case["step"]) if rank in neighbours else plan
    elif kind == "allreduce" and me:
        plan = FaultPlan(die="flush", step=case["step"])
    install(plan)
    calls = []

    def fault(module, args):
        calls.append(1)
        if me and len(calls) == case["forward"] and kind in ("raise", "sigkill", "exit", "alive"):
            mark(out, "fault", t=time.time())
            if kind == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "exit":
                os._exit(1)
            raise ValueError(f"injected fault on rank {rank}")

    for mod in mine.values():
        mod.register_forward_pre_hook(fault)
    rt = PipelineRuntime(compiled, mine, lm_loss, optimizer=opt, timeout=2 * case["hang"],
                         transport="faulty", clip_grad_norm=1.0 if kind == "allreduce" else None)
    try:
        for step, (x, y) in enumerate(token_batches(STEPS, 2 * case["m"], seed=2)):
            if me and kind == "batch" and step == case["step"]:
                t = x if victim == 0 else y
                bad = {"empty": t[:0], "scalar": t[0, 0], "list": [1, 2, 3], "uneven": t[:3]}[case["bad"]]
                x, y = (bad, y) if victim == 0 else (x, bad)
                mark(out, "fault", t=time.time())
            rt.step(x, y)
    except BaseException as e:  # noqa: BLE001 - every outcome is recorded
        outcome = dict(t=time.time(), type=type(e).__name__, message=" ".join(str(e).split())[:600],
                       culprit=getattr(e, "culprit", None))
        if not me:
            store = dist.distributed_c10d._get_default_store()
            if store.check([dead(victim)]):  # kinds post and allreduce: the victim's clock as it died
                outcome["t_fault"] = float(store.get(dead(victim)).split()[1])
            mark(out, f"rank{rank}", **outcome)
            return
        if kind == "alive":  # stay alive (connections open) until every other rank has ended
            deadline = time.monotonic() + case["hang"]
            while time.monotonic() < deadline and not all(
                    (Path(out) / f"rank{r}.json").exists() for r in range(world) if r != rank):
                time.sleep(0.05)
            return
        if kind == "batch":
            return  # the rank that got the bad batch returns normally (its process ends cleanly)
        raise
    mark(out, f"rank{rank}", t=time.time(), type=None, message="finished every step", culprit=None)


def mark(out: str, name: str, **fields) -> None:
    tmp = Path(out) / f".{name}.json"
    tmp.write_text(json.dumps(fields))
    tmp.rename(Path(out) / f"{name}.json")


def run_case(case: dict) -> list[dict]:
    """Run one case; one row per rank other than the victim: outcome, seconds to stop, posting."""
    with tempfile.TemporaryDirectory(prefix="schedc-faults-") as out:
        timed_out = False
        try:
            run_local(rank_main, case["world"], case, out, timeout=case["hang"], threads=1, preload=PRELOAD)
        except RankFailed:
            pass
        except TimeoutError:
            timed_out = True
        fault = Path(out) / "fault.json"
        t_fault = json.loads(fault.read_text())["t"] if fault.exists() else None
        rows = []
        for r in range(case["world"]):
            if r == case["victim"]:
                continue
            f = Path(out) / f"rank{r}.json"
            if not f.exists():
                rows.append(dict(outcome="hang" if timed_out else "raw", seconds=None, posting=False,
                                 message="no outcome" + (f" within {case['hang']:g} s" if timed_out else ""), rank=r))
                continue
            res = json.loads(f.read_text())
            named = (res["type"] == "PipelineError" and res["culprit"] == case["victim"]
                     and f"rank {case['victim']} " in res["message"])
            start = res.get("t_fault", t_fault)
            rows.append(dict(outcome="named" if named else "raw", rank=r, message=res["message"],
                             seconds=None if start is None else res["t"] - start,
                             posting=", posting to " in res["message"]))
        return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20, help="runs per fault kind (half on 2 ranks, half on 4)")
    ap.add_argument("--hang", type=float, default=60.0, help="seconds after which a rank without an outcome hangs")
    ap.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, comma-separated: " + ", ".join(KINDS))
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        sys.exit(f"error: unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    t_start = time.perf_counter()
    rows, examples = [], {}
    with tempfile.TemporaryDirectory(prefix="schedc-faults-") as tmp:
        for kind in kinds:
            results = []
            for rep in range(args.reps):
                case = dict(case_for(kind, rep, Path(tmp)), hang=args.hang)
                got = run_case(case)
                results += got
                for g in got:
                    examples.setdefault((kind, g["outcome"]), g["message"])
                bad = [g for g in got if g["outcome"] != "named"]
                say(f"{kind:9} rep {rep:2} p={case['world']} {case['schedule']:5} victim {case['victim']}: "
                    + ("all named" if not bad else "; ".join(f"rank {g['rank']} {g['outcome']}: {g['message'][:160]}"
                                                               for g in bad)))
            times = [g["seconds"] for g in results if g["seconds"] is not None]
            rows.append(dict(kind=kind, runs=args.reps, ranks=len(results),
                             named=sum(g["outcome"] == "named" for g in results),
                             raw=sum(g["outcome"] == "raw" for g in results),
                             hang=sum(g["outcome"] == "hang" for g in results),
                             posting=sum(g["posting"] for g in results),
                             median=sorted(times)[len(times) // 2] if times else None,
                             max=max(times) if times else None))
    wall = time.perf_counter() - t_start
    table = report(rows, examples, args, wall, " ".join(["python", "benchmarks/faults.py", *sys.argv[1:]]))
    print(table)
    if args.write:
        write_section("faults", table)


def report(rows: list[dict], examples: dict, args, wall: float, command: str) -> str:
    sec = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [
        "## Faults: every other rank names the rank that failed",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}, torch {torch.__version__}, gloo, one torch thread per rank  ",
        f"Setup: {args.reps} runs per fault kind, alternately on 2 ranks (1F1B or ZB-H1, 4 microbatches) and"
        f" 4 ranks (8 microbatches), a small GPT with one stage per rank, {STEPS} steps, the victim and the"
        f" moment drawn per run (benchmarks/faults.py says how); a rank without an outcome {args.hang:g} s"
        f" after its run started hangs (the runtime's deadline is {2 * args.hang:g} s, so stopping at the"
        f" deadline would count as a hang); wall time {wall:.0f} s.  ",
        "Ranks: the ranks other than the victim, over all runs. Named: a `PipelineError` whose `culprit` is"
        " the victim and whose message names it. Raw: anything else. While posting: named while posting a send,"
        " a receive or a collective (not while waiting). Time to stop: from the fault to the rank's error (s).",
        "",
        "| fault | runs | ranks | named | raw errors | hangs | while posting | median time to stop (s) |"
        " max time to stop (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {KINDS[r['kind']]} (`{r['kind']}`) | {r['runs']} | {r['ranks']} | {r['named']} | {r['raw']}"
                     f" | {r['hang']} | {r['posting']} | {sec(r['median'])} | {sec(r['max'])} |")
    raw, hang = sum(r["raw"] for r in rows), sum(r["hang"] for r in rows)
    posting = sum(r["posting"] for r in rows)
    lines += ["", f"In all: {sum(r['ranks'] for r in rows)} ranks, {raw} raw errors, {hang} hangs. {posting} ranks"
              " stopped while posting: before every transport call was attributed (issue 23), a failed post"
              " escaped the runtime as gloo's own `RuntimeError`.", ""]
    for (kind, outcome), message in sorted(examples.items()):
        lines.append(f"- `{kind}`, {outcome}, e.g.: {message[:300]}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
