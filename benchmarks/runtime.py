"""Our runtime against torch.distributed.pipelining's, and measured against simulated iteration time.

    python benchmarks/runtime.py [--iters 30] [--layers 6] [--d-model 256] [--write]

On CPU, with 2 spawned gloo ranks (one pipeline stage each, torch threads = cores / 2), a GPT
from ``schedc.runtime.gpt`` cut into 2 stages, m microbatches, no optimizer (gradients are
zeroed between iterations, so every iteration sees the same weights and data):

1. Runtime overhead. For each schedule (1F1B, ZB-H1) compiled by ``schedc.compile``, two
   runtimes execute the same order on identically initialised copies of the same stage:
   ours (``PipelineRuntime``) and torch's (``_PipelineScheduleRuntime`` loading our compute-only
   CSV export, to which torch adds its own sends and receives). The first iteration of each
   checks that both give the same loss and the same gradients. After warm-up, iterations
   alternate ours / torch's (ABAB...), so both see the same machine state. An iteration is
   timed from a barrier to the last rank's return (``time.perf_counter`` is one clock for all
   processes of a host): max over ranks of the end minus min over ranks of the start.
   Reported: medians, their ratio ours / torch's, and the median of the paired ratios with its
   distribution-free 95 % confidence interval.
2. Prediction. ``profile_stages`` measures each stage's F, B, W and fused BW in this process
   alone, with the threads a rank gets: once before the ranks start, and again whenever they
   pause for it (every ``--profile-every`` timed iterations); each op's cost is its median over
   the profiles. (This machine's speed drifts by 20 % over minutes, so a profile taken only
   before the run can land in a faster or slower spell than the run; the pauses sample the
   same spells as the iterations.) Inside the ranks, ``measure_comm`` times a transfer of one
   activation; ``make_problem`` turns costs and latency into a Problem. The simulated makespan
   of the schedule on it is the prediction, set against our measured median. (The ranks
   compile the schedules from the first profile; the orders of 1F1B and ZB-H1 do not depend
   on the costs, which the script checks.)
3. Steps back to back (``STEADY``): ``--steady-steps`` steps of our runtime with an optimizer and
   no barrier between them, against as many that each start from a barrier, and against the
   simulator's ``back_to_back`` on the same costs (between the span and the makespan of one step).
4. Diagnosis, from our runtime's trace (``trace=True``): each compute op's duration in the
   run, not counting the wait for its input (an op that consumes a message is taken to start
   computing when the peer posted it, if that is later than the op's own start); those in-run
   costs against the profiled ones, and the makespan the simulator predicts from the in-run
   costs ("replay"): if the replay matches the measurement, the simulator's model of the
   schedule holds and any error lies in the profiled costs.

The machine may be shared. Other processes' CPU time (``/proc/stat``'s busy time minus the
benchmark's own) is measured during profiling and during every iteration; the script waits
(up to ``--quiet-wait`` seconds) for a quiet machine before profiling and before starting the
ranks, drops disturbed profiling rounds (unless all were), and takes the medians over the
pairs of iterations during which other processes used less than ``--max-foreign`` cores (all
pairs, flagged, if fewer than 3 qualify). The load is reported with the results.

--write puts the tables into benchmarks/RESULTS.md with the command and the machine;
--raw FILE keeps the raw measurements (JSON: per-iteration times and load, our traces).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

import schedc
from schedc.interop import to_torch_csv, write_torch_csv
from schedc.kinds import BACKWARDS, Kind
from schedc.runtime import PipelineRuntime
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from schedc.runtime.launch import run_local
from schedc.runtime.profile import StageProfile, make_problem, measure_comm, profile_stages
from schedc.simulate import back_to_back

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_section  # noqa: E402

RANKS = 2
SCHEDULES = ("1f1b", "zb-h1")
STEADY = ("1f1b", "zb-h1", "zb-h2")  # steps back to back: zb-h2's span is below its makespan
COMPUTE = ("F", "B", "W", "BW")
# One timed iteration on one rank: (start, end, machine busy CPU s at start, at end, this
# process's CPU s at start, at end). Busy times are NaN where /proc/stat is unavailable.
Sample = tuple[float, float, float, float, float, float]
TraceRow = tuple[str, int, int, str, float, float]  # op, stage, mb, tensor ("act" / "grad"), start, end


@dataclass(frozen=True)
class Config:
    layers: int = 6
    d_model: int = 256
    heads: int = 4
    seq: int = 128
    vocab: int = 256
    microbatches: int = 8
    mb_size: int = 2  # sequences per microbatch
    iters: int = 30  # timed iterations per runtime and schedule
    warmup: int = 2  # untimed iterations per runtime and schedule (the first also checks losses)
    threads: int = 1  # torch threads per rank, and of the profiling process
    max_foreign: float = 0.15  # cores other processes may use during an iteration that counts
    quiet_wait: float = 45.0  # seconds to wait for a quiet machine before profiling / running
    profile_every: int = 10  # timed iterations between two profiles (0: profile only before the run)
    steady_steps: int = 12  # steps back to back, per schedule in STEADY (and as many from a barrier each)
    seed: int = 0

    @property
    def batch(self) -> int:
        return self.microbatches * self.mb_size

    def describe(self) -> str:
        return (f"GPT {self.layers} layers, d_model {self.d_model}, {self.heads} heads, seq {self.seq}, vocab {self.vocab};"
                f" p={RANKS} (one stage per rank), m={self.microbatches} microbatches of {self.mb_size} sequences;"
                f" {self.threads} torch thread(s) per rank; {self.warmup} warm-up + {self.iters} timed iterations"
                f" per runtime and schedule")


def model_stages(cfg: Config) -> list[nn.Sequential]:
    """The model cut into RANKS stages, initialised from ``cfg.seed``: every call builds the same weights."""
    blocks = gpt_blocks(vocab=cfg.vocab, d_model=cfg.d_model, n_layers=cfg.layers, n_heads=cfg.heads,
                        seq_len=cfg.seq, seed=cfg.seed)
    return stages(blocks, RANKS)


def batch(cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    return token_batches(1, cfg.batch, cfg.seq, cfg.vocab, seed=cfg.seed + 1)[0]


def problem_of(cfg: Config, profile: StageProfile, comm: float) -> schedc.Problem:
    return make_problem(profile, ranks=RANKS, microbatches=cfg.microbatches, comm=comm,
                        name=f"gpt-{cfg.layers}x{cfg.d_model}-p{RANKS}-m{cfg.microbatches}")


# ---- CPU accounting: how much of the machine other processes take ----


def machine_busy() -> float:
    """CPU seconds all cores have been busy since boot (/proc/stat: user .. steal), NaN if unknown."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return math.nan
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """CPU seconds of this process and of its children that have been joined."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Load:
    """Cores used by other processes (and the hypervisor's steal) over a ``with`` block."""

    def __enter__(self) -> "Load":
        self.t0, self.busy0, self.own0 = time.perf_counter(), machine_busy(), own_cpu()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.t0
        self.own = own_cpu() - self.own0
        self.foreign = max(0.0, machine_busy() - self.busy0 - self.own) / self.wall

    def describe(self) -> str:
        if math.isnan(self.foreign):
            return f"the benchmark used {self.own / self.wall:.2f} cores; other processes: unknown (no /proc/stat)"
        return (f"the benchmark used {self.own / self.wall:.2f} of {os.cpu_count()} cores, other processes"
                f" {self.foreign:.2f} (load average {os.getloadavg()[0]:.2f} at the end)")


def wait_for_quiet(cfg: Config, say: Callable[[str], None]) -> None:
    """Wait until other processes use less than ``cfg.max_foreign`` cores for 3 s in a row, at most ``cfg.quiet_wait`` s."""
    deadline, quiet, last_said = time.monotonic() + cfg.quiet_wait, 0, 0.0
    while quiet < 3 and time.monotonic() < deadline:
        with Load() as load:
            time.sleep(1.0)
        if math.isnan(load.foreign):
            return
        quiet = quiet + 1 if load.foreign < cfg.max_foreign else 0
        if quiet == 0 and time.monotonic() - last_said > 10:
            say(f"  waiting for a quiet machine: other processes use {load.foreign:.2f} cores")
            last_said = time.monotonic()
    if quiet < 3:
        say(f"  the machine did not get quiet within {cfg.quiet_wait:g} s: measuring anyway")


def foreign_cores(per_rank: list[Sample]) -> float:
    """Cores other processes used during one iteration (all ranks' samples of it)."""
    widest = max(per_rank, key=lambda s: s[1] - s[0])
    ours = sum(s[5] - s[4] for s in per_rank)
    return max(0.0, widest[3] - widest[2] - ours) / (widest[1] - widest[0])


# ---- the two runtimes, behind one small interface ----


class OurRuntime:
    """schedc's PipelineRuntime on one rank's stage."""

    def __init__(self, compiled: schedc.CompiledSchedule, module: nn.Module, rank: int, x, y):
        self.module, self.rank = module, rank
        self.rt = PipelineRuntime(compiled, {rank: module}, lm_loss, timeout=300, trace=True)
        self.x = x if rank == 0 else None
        self.y = y if rank == RANKS - 1 else None

    def step(self) -> float | None:
        loss = self.rt.step(self.x, self.y)
        return None if loss is None else loss.item()

    def trace(self) -> list[TraceRow]:
        """The last step, one row per instruction in program order."""
        events = self.rt.trace_events()
        assert len(events) == len(self.rt.program), "the trace covers every instruction of the program"
        return [(i.op, i.stage, i.mb, i.tensor, e["start"], e["end"]) for i, e in zip(self.rt.program, events)]


class TorchRuntime:
    """torch.distributed.pipelining's schedule runtime executing our compute-only CSV export."""

    def __init__(self, csv: Path, module: nn.Module, rank: int, m: int, x, y):
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

        self.module, self.rank = module, rank
        stage = PipelineStage(module, rank, RANKS, torch.device("cpu"))
        # scale_grads: torch divides the summed gradients by m at the end, as our runtime's
        # loss / m does: both give the gradients of the mean loss.
        self.schedule = _PipelineScheduleRuntime([stage], n_microbatches=m, loss_fn=lm_loss, scale_grads=True)
        self.schedule._load_csv(str(csv), format="compute_only")
        self.args = (x,) if rank == 0 else ()
        self.y = y if rank == RANKS - 1 else None
        # Time the stage's compute calls (the schedule waits for received tensors before it
        # calls them, so these are compute only): a diagnostic wrapper on this instance.
        self.ops: list[tuple[str, int, float, float]] = []  # kind, mb, start, end of the last step
        self._time(stage, "forward_one_chunk", lambda kw: "F")
        self._time(stage, "backward_one_chunk", lambda kw: "BW" if kw.get("full_backward", True) else "B")
        self._time(stage, "backward_weight_one_chunk", lambda kw: "W")

    def _time(self, stage, method: str, kind: Callable[[dict], str]) -> None:
        inner = getattr(stage, method)

        def timed_call(mb: int, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(mb, *args, **kwargs)
            finally:
                self.ops.append((kind(kwargs), mb, t0, time.perf_counter()))

        setattr(stage, method, timed_call)

    def step(self) -> float | None:
        self.ops = []
        if self.y is None:
            self.schedule.step(*self.args, return_outputs=False)
            return None
        losses: list[torch.Tensor] = []
        self.schedule.step(*self.args, target=self.y, losses=losses, return_outputs=False)
        return torch.stack(losses).mean().item()


def grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in module.parameters()]


def rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """max |a - b| / max |b| over all parameters."""
    num = max(float((x - y).abs().max()) for x, y in zip(a, b))
    den = max(float(y.abs().max()) for y in b)
    return num / max(den, 1e-30)


def timed(runner: OurRuntime | TorchRuntime) -> Sample:
    """One iteration from a barrier; gradients are zeroed after it, untimed."""
    dist.barrier()
    t0, busy0, cpu0 = time.perf_counter(), machine_busy(), time.process_time()
    runner.step()
    t1, busy1, cpu1 = time.perf_counter(), machine_busy(), time.process_time()
    runner.module.zero_grad(set_to_none=True)
    return t0, t1, busy0, busy1, cpu0, cpu1


# ---- one rank ----


def rank_main(rank: int, world: int, cfg: Config, profile: StageProfile, tmp: Path) -> dict[str, Any]:
    say = (lambda msg: print(msg, flush=True)) if rank == 0 else (lambda msg: None)
    comm = measure_comm(profile.sends[0])
    say(f"  comm: {comm:.3f} ms one way for {profile.sends[0]:.2f} MiB (gloo, measure_comm)")
    problem = problem_of(cfg, profile, comm)
    x, y = batch(cfg)
    out: dict[str, Any] = {"comm": comm}
    pauses = 0
    for name in SCHEDULES:
        compiled = schedc.compile(problem, name)
        csv = tmp / f"{name}.rank{rank}.csv"
        write_torch_csv(compiled.schedule, csv)
        ours = OurRuntime(compiled, model_stages(cfg)[rank], rank, x, y)
        theirs = TorchRuntime(csv, model_stages(cfg)[rank], rank, cfg.microbatches, x, y)

        # Sanity: the same loss and gradients from both, on the first iteration.
        loss_ours = ours.step()
        g_ours = grads(ours.module)
        ours.module.zero_grad(set_to_none=True)
        loss_torch = theirs.step()
        g_torch = grads(theirs.module)
        theirs.module.zero_grad(set_to_none=True)
        grad_diff = rel_diff(g_ours, g_torch)
        if grad_diff > 1e-4 or (loss_ours is not None and abs(loss_ours - loss_torch) > 1e-5 * abs(loss_torch)):
            raise RuntimeError(f"{name}, rank {rank}: the runtimes disagree: loss {loss_ours} vs {loss_torch},"
                               f" gradients differ by {grad_diff:.1e} (relative): nothing to compare")
        for _ in range(cfg.warmup - 1):
            timed(ours)
            timed(theirs)

        samples: dict[str, list[Sample]] = {"ours": [], "torch": []}
        traces, torch_ops = [], []
        for i in range(cfg.iters):
            a = timed(ours)
            traces.append(ours.trace())
            b = timed(theirs)
            torch_ops.append(theirs.ops)
            samples["ours"].append(a)
            samples["torch"].append(b)
            say(f"  {name} iteration {i + 1}/{cfg.iters}: ours {1e3 * (a[1] - a[0]):.0f} ms,"
                f" torch {1e3 * (b[1] - b[0]):.0f} ms (rank 0's view)")
            if cfg.profile_every and (i + 1) % cfg.profile_every == 0:
                pause_for_profiling(rank, tmp, pauses)
                pauses += 1
        out[name] = {
            "loss_ours": loss_ours, "loss_torch": loss_torch, "grad_diff": grad_diff,
            "samples": samples, "traces": traces, "torch_ops": torch_ops, "csv": to_torch_csv(compiled.schedule),
        }
    for name in STEADY:
        out.setdefault(name, {})["steady"] = steady(cfg, problem, name, rank, x, y)
    return out


def steady(cfg: Config, problem: schedc.Problem, name: str, rank: int, x, y) -> dict[str, list[float]]:
    """Our runtime (plain SGD, so each step also updates and zeroes the gradients): ``steady_steps``
    steps back to back (one barrier before the first; each rank starts its next step when its own
    is done), then as many that each start from a barrier. Per step, this rank's end time
    (back to back) and its start and end times (from a barrier)."""
    module = model_stages(cfg)[rank]
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)
    rt = PipelineRuntime(schedc.compile(problem, name), {rank: module}, lm_loss, optimizer=opt, timeout=300)
    xs, ys = (x if rank == 0 else None), (y if rank == RANKS - 1 else None)
    for _ in range(cfg.warmup):
        rt.step(xs, ys)
    dist.barrier()
    ends = []
    for _ in range(cfg.steady_steps):
        rt.step(xs, ys)
        ends.append(time.perf_counter())
    spans = []
    for _ in range(cfg.steady_steps):
        dist.barrier()
        t0 = time.perf_counter()
        rt.step(xs, ys)
        spans.append((t0, time.perf_counter()))
    return {"ends": ends, "barrier": spans}


# ---- analysis in the parent ----


def iterations(results: list[dict], name: str, runtime: str) -> list[tuple[float, float]]:
    """(seconds, cores used by other processes) per iteration: the last rank's end minus the first rank's start."""
    out = []
    for per_rank in zip(*(r[name]["samples"][runtime] for r in results)):
        out.append((max(s[1] for s in per_rank) - min(s[0] for s in per_rank), foreign_cores(list(per_rank))))
    return out


def compute_durations(traces: list[list[TraceRow]]) -> dict[tuple[str, int], list[float]]:
    """(kind, stage) -> durations in ms of one iteration's compute ops on all ranks, each without
    the wait for its input: an op that consumes a message is taken to start computing when the
    sender posted it (its SEND ended) if that is later than the op's own start."""
    posted: dict[tuple[str, int, int], float] = {}  # (tensor, sending stage, mb) -> SEND end
    for trace in traces:
        for op, s, mb, tensor, _t0, t1 in trace:
            if op == "SEND":
                posted[(tensor, s, mb)] = t1
    last = max(row[1] for trace in traces for row in trace)
    out: dict[tuple[str, int], list[float]] = {}
    for trace in traces:
        for op, s, mb, _tensor, t0, t1 in trace:
            if op not in COMPUTE:
                continue
            if op == Kind.F and s > 0:
                t0 = max(t0, posted.get(("act", s - 1, mb), t0))
            elif op in BACKWARDS and s < last:
                t0 = max(t0, posted.get(("grad", s + 1, mb), t0))
            out.setdefault((op, s), []).append(1e3 * (t1 - t0))
    return out


def between_instructions(trace: list[TraceRow]) -> float:
    """ms of one rank's iteration spent outside any instruction (the interpreter's own Python)."""
    return 1e3 * sum(b[4] - a[5] for a, b in zip(trace, trace[1:]))


def in_run_costs(results: list[dict], name: str, keep: list[int]) -> dict[tuple[str, int], float]:
    """(kind, stage) -> median in-run duration (ms) over every microbatch of the iterations ``keep``."""
    pooled: dict[tuple[str, int], list[float]] = {}
    for it in keep:
        for key, ds in compute_durations([r[name]["traces"][it] for r in results]).items():
            pooled.setdefault(key, []).extend(ds)
    return {key: statistics.median(ds) for key, ds in pooled.items()}


def torch_costs(results: list[dict], name: str, keep: list[int]) -> dict[tuple[str, int], float]:
    """(kind, stage) -> median duration (ms) of torch's compute calls in the iterations ``keep``."""
    pooled: dict[tuple[str, int], list[float]] = {}
    for stage, r in enumerate(results):  # one stage per rank
        for it in keep:
            for kind, _mb, t0, t1 in r[name]["torch_ops"][it]:
                pooled.setdefault((kind, stage), []).append(1e3 * (t1 - t0))
    return {key: statistics.median(ds) for key, ds in pooled.items()}


def not_computing(results: list[dict], name: str, keep: list[int]) -> dict[str, list[float]]:
    """runtime -> per rank, median ms of an iteration the rank spent not computing (waiting for its
    peer, posting and completing transfers, the runtime's own Python): its span minus its compute."""
    out: dict[str, list[float]] = {"ours": [], "torch": []}
    for rank, r in enumerate(results):
        ours, theirs = [], []
        for it in keep:
            durations = compute_durations([x[name]["traces"][it] for x in results])
            compute = sum(sum(ds) for (kind, stage), ds in durations.items() if stage == rank)  # stage = rank
            t0, t1 = r[name]["samples"]["ours"][it][:2]
            ours.append(1e3 * (t1 - t0) - compute)
            t0, t1 = r[name]["samples"]["torch"][it][:2]
            theirs.append(1e3 * (t1 - t0) - sum(1e3 * (b - a) for _, _, a, b in r[name]["torch_ops"][it]))
        out["ours"].append(statistics.median(ours))
        out["torch"].append(statistics.median(theirs))
    return out


def replay(cfg: Config, profile: StageProfile, comm: float, name: str, costs: dict[tuple[str, int], float]) -> float:
    """The simulator's makespan (ms) of schedule ``name`` with the in-run costs in place of the profiled."""
    measured = {kind: [costs[(kind, s)] for s in range(RANKS)] for kind in COMPUTE if (kind, 0) in costs}
    return schedc.compile(problem_of(cfg, replace(profile, **measured), comm), name).timeline.makespan


def median_profile(profiles: list[StageProfile]) -> StageProfile:
    """Each op's median cost over the profiles."""
    def median(kind: str) -> list[float]:
        return [statistics.median(values) for values in zip(*(getattr(p, kind) for p in profiles))]

    return replace(profiles[0], F=median("F"), B=median("B"), W=median("W"), BW=median("BW"))


def median_ci(values: list[float]) -> tuple[float, float, float]:
    """The median and a distribution-free ~95 % confidence interval for it (order statistics)."""
    v, n = sorted(values), len(values)
    k = max(0, math.floor((n - 1.96 * math.sqrt(n)) / 2))
    return statistics.median(v), v[k], v[n - 1 - k]


def predict(cfg: Config, profile: StageProfile, comm: float, name: str, ran: str) -> float:
    """The simulated makespan (ms) of schedule ``name`` on ``profile``; ``ran``: the order the ranks ran (CSV)."""
    compiled = schedc.compile(problem_of(cfg, profile, comm), name)
    if to_torch_csv(compiled.schedule) != ran:
        raise RuntimeError(f"{name}: the order compiled from the median profile is not the one the ranks ran")
    return compiled.timeline.makespan


class Profiler:
    """``profile_stages`` rounds in this process: one before the ranks start, then one whenever
    the ranks pause for it (a thread answers their requests), so that the rounds sample the
    machine's state over the whole run. Rounds that other processes disturbed are dropped
    unless all were."""

    def __init__(self, cfg: Config, say: Callable[[str], None], tmp: Path):
        self.cfg, self.say, self.tmp = cfg, say, tmp
        self.rounds: list[tuple[StageProfile, Load]] = []
        self.x, self.y = batch(cfg)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def profile(self) -> StageProfile:
        with Load() as load:
            profile = profile_stages(model_stages(self.cfg), self.x, self.y, lm_loss,
                                     microbatches=self.cfg.microbatches, repeats=11)
        self.rounds.append((profile, load))
        self.say(f"  profile {len(self.rounds)}: F {fmt(profile.F)}  B {fmt(profile.B)}  W {fmt(profile.W)}"
                 f"  BW {fmt(profile.BW)} ms (stage 0 / 1); other processes {load.foreign:.2f} cores")
        return profile

    def serve(self) -> None:
        k = 0
        while not self.stop.is_set():
            if not (self.tmp / f"pause-{k}").exists():
                time.sleep(0.02)
                continue
            try:
                self.profile()
            finally:
                (self.tmp / f"resume-{k}").touch()
            k += 1

    def __enter__(self) -> "Profiler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def kept(self) -> tuple[list[StageProfile], Load]:
        """The profiles to use, and the load during the most disturbed of them."""
        kept = [r for r in self.rounds if not r[1].foreign >= self.cfg.max_foreign] or self.rounds  # NaN: kept
        if len(kept) < len(self.rounds):
            self.say(f"  {len(self.rounds) - len(kept)} disturbed profile(s) dropped")
        return [p for p, _ in kept], max((load for _, load in kept), key=lambda load: load.foreign)


def pause_for_profiling(rank: int, tmp: Path, k: int) -> None:
    """All ranks stop while the parent process profiles (pause number ``k``)."""
    dist.barrier()
    if rank == 0:
        (tmp / f"pause-{k}").touch()
        while not (tmp / f"resume-{k}").exists():
            time.sleep(0.02)
    dist.barrier()


def fmt(values: list[float], digits: int = 1) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def report(cfg: Config, profiles: list[StageProfile], results: list[dict], command: str,
           loads: dict[str, Load] | None = None) -> str:
    """The tables; ``profiles``: the first before the run, the others during it; ``loads``: what
    other processes took, by phase."""
    comm = results[0]["comm"]
    profile = median_profile(profiles)
    last = RANKS - 1
    main_rows, cost_rows, notes = [], [], []
    for name in SCHEDULES:
        r_last = results[last][name]
        ours, theirs = iterations(results, name, "ours"), iterations(results, name, "torch")
        quiet = [i for i in range(cfg.iters) if max(ours[i][1], theirs[i][1]) < cfg.max_foreign]
        noisy = len(quiet) < 3
        keep = list(range(cfg.iters)) if noisy else quiet
        med_ours = 1e3 * statistics.median(ours[i][0] for i in keep)
        med_torch = 1e3 * statistics.median(theirs[i][0] for i in keep)
        paired, low, high = median_ci([ours[i][0] / theirs[i][0] for i in keep])
        predicted = predict(cfg, profile, comm, name, r_last["csv"])
        first = predict(cfg, profiles[0], comm, name, r_last["csv"])
        costs = in_run_costs(results, name, keep)
        theirs_costs = torch_costs(results, name, keep)
        replayed = replay(cfg, profile, comm, name, costs)
        gaps = [statistics.median(between_instructions(r[name]["traces"][i]) for i in keep) for r in results]
        foreign = statistics.median(max(ours[i][1], theirs[i][1]) for i in keep)
        main_rows.append(
            f"| {name} | {len(quiet)} of {cfg.iters}{' (noisy: all used)' if noisy else ''} | {foreign:.2f}"
            f" | {med_ours:.1f} | {med_torch:.1f} | {med_ours / med_torch:.3f} | {paired:.3f} ({low:.3f}-{high:.3f})"
            f" | {predicted:.1f} | {100 * (predicted / med_ours - 1):+.1f}% | {replayed:.1f}"
            f" | {100 * (replayed / med_ours - 1):+.1f}% |"
        )
        loss_diff = abs(r_last["loss_ours"] - r_last["loss_torch"])
        grad_diff = max(r[name]["grad_diff"] for r in results)
        notes.append(f"{name}: predicted from the earliest profile alone {first:.1f} ms"
                     f" ({100 * (first / med_ours - 1):+.1f}%)")
        idle = not_computing(results, name, keep)
        notes.append(f"{name}: time per iteration a rank spends not computing (waiting for its peer, transfers,"
                     f" the runtime's own work), rank 0 / 1: ours {fmt(idle['ours'])} ms, torch {fmt(idle['torch'])} ms")
        notes.append(f"{name}: first-iteration loss ours {r_last['loss_ours']:.6f}, torch {r_last['loss_torch']:.6f}"
                     f" (|diff| {loss_diff:.1e}), gradients' max relative difference {grad_diff:.1e};"
                     f" our interpreter's Python between instructions: {fmt(gaps, 2)} ms per iteration on ranks"
                     f" {' / '.join(map(str, range(RANKS)))}")
        for kind in (Kind.F, Kind.BW) if (Kind.BW, 0) in costs else (Kind.F, Kind.B, Kind.W):
            prof = getattr(profile, kind)
            run = [costs[(kind, s)] for s in range(RANKS)]
            torch_run = fmt([theirs_costs[(kind, s)] for s in range(RANKS)]) if (kind, 0) in theirs_costs else "-"
            cost_rows.append(f"| {name} | {kind} | {fmt(prof)} | {fmt(run)} | {fmt([b / a for a, b in zip(prof, run)], 2)}"
                             f" | {torch_run} |")
        if ("B", 0) in costs and ("B", 0) in theirs_costs:
            split = lambda c: fmt([c[("B", s)] + c[("W", s)] for s in range(RANKS)])  # noqa: E731
            notes.append(f"{name}: a split backward per microbatch in the run, stage 0 / 1: ours B + W {split(costs)} ms,"
                         f" torch's I + W {split(theirs_costs)} ms (on the first stage torch's I computes nothing and"
                         f" its W the whole backward, fused); profiled alone: B + W"
                         f" {fmt([profile.B[s] + profile.W[s] for s in range(RANKS)])} ms, fused BW {fmt(profile.BW)} ms")

    steady_rows = []
    for name in STEADY:
        n = cfg.steady_steps
        ends = [r[name]["steady"]["ends"] for r in results]
        back = 1e3 * (max(e[-1] for e in ends) - max(e[0] for e in ends)) / (n - 1)
        barrier = 1e3 * statistics.median(
            max(t[1] for t in step) - min(t[0] for t in step) for step in zip(*(r[name]["steady"]["barrier"] for r in results))
        )
        prob = problem_of(cfg, profile, comm)
        compiled = schedc.compile(prob, name)
        sim = back_to_back(prob, compiled.schedule, n)
        sim_back = (sim[-1] - sim[0]) / (n - 1)
        t = compiled.timeline
        steady_rows.append(
            f"| {name} | {barrier:.1f} | {back:.1f} | {back / barrier:.3f} | {t.makespan:.1f} | {t.span:.1f}"
            f" | {sim_back:.1f} | {100 * (sim_back / back - 1):+.1f}% | {sim_back / t.makespan:.3f} |"
        )

    spread = "; ".join(f"{kind} " + " / ".join(f"{min(getattr(p, kind)[s] for p in profiles):.1f}-"
                                              f"{max(getattr(p, kind)[s] for p in profiles):.1f}" for s in range(RANKS))
                       for kind in COMPUTE)
    notes.insert(0, f"profiled costs over the {len(profiles)} profiles, min-max in ms, stage 0 / 1: {spread}")
    load_text = "; ".join(f"{phase} ({load.wall:.0f} s), {load.describe()}" for phase, load in (loads or {}).items())
    table = [
        "## Runtime: ours vs torch.distributed.pipelining, measured vs simulated",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}, torch {torch.__version__}, gloo  ",
        f"Setup: {cfg.describe()}.  ",
        *([f"Other processes: {load_text}.  "] if load_text else []),
        "Iteration: barrier, then the last rank's end minus the first rank's start; ours and torch's alternate;"
        f" medians over the iteration pairs during which other processes used < {cfg.max_foreign:g} cores"
        " (\"pairs\"; all, flagged noisy, if fewer than 3)."
        " Torch runs our compute-only CSV export with `_PipelineScheduleRuntime` (it adds its own send/recv)."
        f" Predicted: `simulate` on costs from `profile_stages` (one process, {cfg.threads} thread(s); each op's"
        f" median over {len(profiles)} profiles, one before the run and the others while the ranks paused,"
        f" every {cfg.profile_every} iterations) and"
        f" comm {comm:.3f} ms from `measure_comm`. Replay: `simulate` on the per-op durations measured inside"
        " our run (trace, input waits excluded). Error: predicted / measured - 1.",
        "",
        "| schedule | pairs | other procs (cores) | ours (ms) | torch (ms) | ours / torch | paired ratio (95% CI)"
        " | predicted (ms) | error | replay (ms) | replay error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *main_rows,
        "",
        "Per-op cost in ms, stage 0 / stage 1: profiled alone vs inside our run (median over microbatches"
        " and the same iterations, input waits excluded), their ratio, and torch's stage calls in its run (its"
        " last-stage F excludes the loss, ours includes it):",
        "",
        "| schedule | op | profiled | ours in run | in run / profiled | torch in run |",
        "|---|---|---|---|---|---|",
        *cost_rows,
        "",
        *(f"- {n}" for n in notes),
        "",
        f"Steps back to back (our runtime with plain SGD, {cfg.steady_steps} steps per row after"
        f" {cfg.warmup} warm-up): each rank starts its next step as soon as its own step is done, with no"
        " barrier; per step: (the last rank's end of the last step - the last rank's end of the first) /"
        f" {cfg.steady_steps - 1}. From a barrier: the median step when every step starts from a barrier."
        " Simulated: `schedc.simulate.back_to_back` on the median profile (as above), the same difference;"
        " the makespan and span of one step beside it.",
        "",
        "| schedule | from a barrier (ms) | back to back (ms) | back to back / barrier | simulated makespan (ms)"
        " | simulated span (ms) | simulated back to back (ms) | error | simulated back to back / makespan |",
        "|---|---|---|---|---|---|---|---|---|",
        *steady_rows,
    ]
    return "\n".join(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=Config.iters, help="timed iterations per runtime and schedule")
    ap.add_argument("--warmup", type=int, default=Config.warmup, help="untimed iterations first (at least 1)")
    ap.add_argument("--layers", type=int, default=Config.layers, help="transformer blocks")
    ap.add_argument("--d-model", type=int, default=Config.d_model)
    ap.add_argument("--microbatches", type=int, default=Config.microbatches)
    ap.add_argument("--mb-size", type=int, default=Config.mb_size, help="sequences per microbatch")
    ap.add_argument("--max-foreign", type=float, default=Config.max_foreign,
                    help="cores other processes may use during an iteration that counts")
    ap.add_argument("--quiet-wait", type=float, default=Config.quiet_wait,
                    help="seconds to wait for a quiet machine before profiling and before running (0: do not)")
    ap.add_argument("--profile-every", type=int, default=Config.profile_every,
                    help="timed iterations between two profiles while the ranks pause (0: profile only before)")
    ap.add_argument("--steady-steps", type=int, default=Config.steady_steps,
                    help="steps back to back per schedule (at least 2), and as many from a barrier each")
    ap.add_argument("--raw", type=Path, help="also write the raw measurements to this JSON file")
    ap.add_argument("--write", action="store_true", help="write the tables into benchmarks/RESULTS.md")
    args = ap.parse_args()
    threads = max(1, (os.cpu_count() or 1) // RANKS)
    cfg = Config(layers=args.layers, d_model=args.d_model, microbatches=args.microbatches, mb_size=args.mb_size,
                 iters=args.iters, warmup=max(1, args.warmup), threads=threads, max_foreign=args.max_foreign,
                 quiet_wait=args.quiet_wait, profile_every=max(0, args.profile_every),
                 steady_steps=max(2, args.steady_steps))
    say: Callable[[str], None] = lambda msg: print(msg, flush=True)  # noqa: E731
    say(cfg.describe())

    # Profile in this process alone, with the threads each rank will get.
    torch.set_num_threads(cfg.threads)
    with tempfile.TemporaryDirectory(prefix="schedc-bench-") as tmp:
        say("profiling the stages (profile_stages, in this process):")
        wait_for_quiet(cfg, say)
        with Profiler(cfg, say, Path(tmp)) as profiler:
            first = profiler.profile()
            say(f"running {RANKS} gloo ranks (they pause every {cfg.profile_every} iterations for a profile):")
            wait_for_quiet(cfg, say)
            with Load() as run_load:
                results = run_local(rank_main, RANKS, cfg, first, Path(tmp), threads=cfg.threads, timeout=1800)
    say(f"  ranks done in {run_load.wall:.0f} s; {run_load.describe()}")
    profiles, profile_load = profiler.kept()
    if args.raw:
        args.raw.write_text(json.dumps({"config": asdict(cfg), "profiles": [p.to_dict() for p in profiles],
                                        "results": results}))
        say(f"  raw measurements written to {args.raw}")

    command = " ".join(["python benchmarks/runtime.py", *sys.argv[1:]])
    loads = {"profiling (the most disturbed profile)": profile_load, "running": run_load}
    table = report(cfg, profiles, results, command, loads)
    print("\n" + table)
    if args.write:
        write_section("runtime", table)


if __name__ == "__main__":
    main()
