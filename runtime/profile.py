"""Profiling: what each stage costs on this machine, as a Problem that ``schedc solve`` reads.

``profile_stages`` runs each stage on one microbatch, chaining real activations from stage to
stage, and measures, per stage:

- F, B, W times in ms: warm-up runs, then the median of repeats (CUDA events on GPU), the stages'
  repeats interleaved round by round and the measurement judged and, if noisy, taken again
  (``schedc.runtime.noise``; ``StageProfile.spread``, ``disagreement``, ``warning``). B and W
  are timed exactly as the runtime runs them (``schedc.runtime.wgrad``: B computes the input
  gradient and the non-Linear weight gradients, W the deferred Linear ones); the last stage's F
  includes the loss.
- activation memory of one microbatch, MiB: on GPU the allocator's growth over F that is still
  held afterwards; on CPU the bytes of the tensors autograd saves for backward (parameters
  excluded). What B keeps for W (each split Linear's input and output gradient) is measured the
  same way, so B releases the rest and W what it kept.
- static memory, MiB: parameters, their gradients and ``optimizer_state`` times the parameters
  (2 for Adam's two moments, 1 for SGD with momentum).
- the size of the tensor each stage sends on.
- working memory, MiB: what F, B, W and the fused BW need while they run above the level the
  simulator holds then (after an F, before a backward): autograd's temporaries (e.g. the gradients
  of the largest intermediate tensors) and a backward's output gradient; the largest of the four,
  measured with the runtime's ``MemoryMeter`` (CUDA allocator; on CPU, torch.profiler's memory
  events).

For recompute and offload (issue 25; ``make_problem(..., policies=True)`` writes them as the
problem's ``recompute:`` and ``offload:`` sections):

- recompute time, ms: the stage's forward with autograd from its kept input, with the RNG state
  replayed, exactly as the runtime's R runs it (``schedc.runtime.policies``); the last stage's
  includes the loss.
- what a recomputed microbatch keeps, MiB: its input, the tensor received from the stage before
  (stage 0's input is the caller's batch, allocated before the step and not activation memory:
  0); at most the activation.
- selective recompute (where the stage has parts marked ``schedc_selective``): the time of
  recomputing those parts (the runtime's S) and what a selective forward keeps (the tensors
  autograd saves plus the marked parts' inputs, measured as the activation is).
- copy time, ms: the stage's activation over the host<->device bandwidth measured by
  ``copy_bandwidth`` (CUDA: pinned host memory to and from the device, the mean of both ways; CPU:
  there is no device, so the bandwidth of the memcpy the runtime's offload and reload do, into a
  buffer outside torch's allocator and back).

``make_problem`` writes each stage's ``memory.working``: that working memory plus the largest
tensor the stage receives (its input from the stage before, the gradient of its output from the
stage after): the runtime posts receives ahead of the ops that consume them, so received tensors
sit in memory beside the activations (see benchmarks/RESULTS.md, "Activation memory").

Ranks that share a machine slow each other down (memory bandwidth, caches): two 1-thread
processes on two cores each run a transformer stage about 25-30% slower than one alone on this
project's CI machine. ``load=k`` reproduces that: k background threads run the same stage's F, B
and W on their own copies while it is timed (``profile_model`` sets k = ranks - 1 on CPU, 0 on GPU,
where each rank has its own device).

``measure_comm`` times a transfer of that size between two ranks (half a round trip).
With data parallelism (``profile_model(..., data_parallel=d)``, ``schedc profile --data-parallel
D``), each stage's gradient all-reduce over the d replicas is estimated from the gradient's size
(``grads``: the trainable parameters') and an all-reduce measured between two local processes
(``reduce_times``), and written as the problem's ``data_parallel`` section.
``make_problem`` turns a profile into a Problem for any placement of the stages.

Tensor-parallel stages (torch's ``parallelize_module`` on the ``tp`` dimension of a DeviceMesh):
their F, B and W run collectives over the tensor-parallel group, so every rank of it calls
``profile_stages(..., group=mesh["tp"].get_group())`` at once with the same stages and batch.

- times are the group's: before each timed region the group meets at a barrier (on CUDA after the
  device's queued work is done), and each repeat counts the slowest rank's time (an all-reduce of
  the max), so the medians are the same on every rank of the group. F includes waiting for the
  stage output's collective (torch's ``AsyncCollectiveTensor``), as the runtime's F does.
- memory is one rank's: static memory and ``grads`` from its local shards of the parameters; the
  activation and what B keeps for W from the local tensors (``schedc.runtime.dtensor.local``: a
  DTensor's own storage is the whole tensor's, which no rank holds); on CUDA the allocator's growth,
  as without tensor parallelism (not yet run on a GPU). The send size is the (replicated) stage
  output's, which each rank sends whole.
- not measured: offload (``offload`` empty, ``copy_bandwidth`` 0; the runtime refuses O with
  DTensor parameters) and, on CUDA, working memory (``working`` empty).
- refused in one line: DTensor parameters without ``group``, a ``group`` other than the one the
  stages are parallelised over, ``load`` copies beside them (their collectives would mix with the
  timed stage's on the same group), a stage that returns a DTensor.

The profile records the group's size in ``tensor_parallel``; ``make_problem`` makes its Problem as
any other's (the pipeline's ``comm`` is the caller's to time, e.g. ``measure_comm`` on the pipeline
group). ``profile_model`` and ``schedc profile`` profile in one process and do not parallelise.

``profile_model`` is the whole of ``schedc profile``: a model given as a ``ModelSpec`` (ordered
blocks, a sample batch, the loss) is partitioned into stages (uniform, parameter-balanced, or
time-balanced from per-block profiles), the stages are profiled, the transfer is timed between two
local processes, and the Problem records the partition in ``stage_blocks``.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from schedc.errors import SchedcError
from schedc.kinds import ROWS, Kind, check_supported
from schedc.layers import LayerProblem
from schedc.partition import balanced, stage_weights, uniform
from schedc.problem import Problem
from schedc.runtime.dtensor import is_dtensor, local_bytes, refused_output, waited
from schedc.runtime.launch import run_local
from schedc.runtime.memory import MemoryMeter, SavedBytes
from schedc.runtime.model import ModelSpec, cut  # ModelSpec: importable from here, as before runtime/model.py
from schedc.runtime.noise import KINDS, REMEASURE, measure
from schedc.runtime.policies import Offloaded, Region, capture_rng, dropping, enable_selective, replaying_rng
from schedc.runtime.seqchunk import ChunkedStage, chunk_activation_bytes, chunk_mismatch, split_sequence
from schedc.runtime.wgrad import SplitLinear, WeightGradStore, enable_split

MiB = float(1 << 20)
TIMED = (Kind.F, Kind.B, Kind.W, Kind.BW)  # the op kinds the profiler times, in _StageRunner.times' order
# The kinds every problem has (their costs are the problem's ``costs``): the profiler must time each.
# The recompute and offload kinds' costs are the optional sections ``recompute`` and ``offload``.
EVERY_PROBLEM = tuple(k for k, row in ROWS.items() if row.cost.startswith("costs."))


@dataclass(frozen=True)
class StageProfile:
    F: list[float]  # ms per microbatch, per stage
    B: list[float]
    W: list[float]
    BW: list[float]  # the fused backward, as 1F1B runs it (often less than B + W)
    activation: list[float]  # MiB a microbatch's F holds until its backward
    kept_for_w: list[float]  # MiB of that (or more) which B keeps until W
    static: list[float]  # MiB: parameters, gradients, optimizer state
    sends: list[float]  # MiB stage s sends to s+1 (the last stage: 0)
    microbatch_size: int
    device: str
    threads: int
    # MiB an op of the stage needs while it runs, above the level the simulator holds then (the
    # largest over F, B, W and BW); empty in profiles from before it was measured
    working: list[float] = field(default_factory=list)
    # recompute and offload (empty in profiles from before they were measured): per stage, the
    # recompute's ms and what a recomputed microbatch keeps (MiB); the selective recompute's ms and
    # keep (0 ms where the stage marks no part); the copy's ms each way; the bandwidth, MiB per ms
    recompute: list[float] = field(default_factory=list)
    keep: list[float] = field(default_factory=list)
    selective: list[float] = field(default_factory=list)
    selective_keep: list[float] = field(default_factory=list)
    offload: list[float] = field(default_factory=list)
    copy_bandwidth: float = 0.0
    # MiB of the trainable parameters' gradients per stage, what a data-parallel all-reduce moves
    # (empty in profiles from before it was recorded)
    grads: list[float] = field(default_factory=list)
    # ranks of the tensor-parallel group each stage was profiled on (1: not tensor-parallel); times
    # are then the group's, memory one rank's (its shards)
    tensor_parallel: int = 1
    # sequence chunks (Seq1F1B; ``profile_stages(..., sequence_chunks=k)``): per stage, per chunk
    # position, the chunk's F, B, W in ms on the chunked stage (``seqchunk.ChunkedStage``) and the
    # activation (MiB) its F holds (``seqchunk.chunk_activation_bytes``); empty when not profiled
    sequence_chunks: int = 1
    chunk_F: list[list[float]] = field(default_factory=list)
    chunk_B: list[list[float]] = field(default_factory=list)
    chunk_W: list[list[float]] = field(default_factory=list)
    chunk_activation: list[list[float]] = field(default_factory=list)
    chunk_working: list[float] = field(default_factory=list)  # per stage, MiB: ``working`` of its chunk ops
    # whether the times can be trusted (``schedc.runtime.noise``; empty in profiles from before):
    # per kind (F, B, W, BW), per stage, the (p75 - p25) / median of the repeats and the time per
    # block over that of the stages of the same blocks, minus 1 (0 where none is comparable); how
    # many measurements were taken (more than 1: the first was over a limit); the warning ('' if none)
    spread: dict[str, list[float]] = field(default_factory=dict)
    disagreement: dict[str, list[float]] = field(default_factory=dict)
    measurements: int = 1
    warning: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def profile_stages(
    stages: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: Any,
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
    *,
    microbatches: int = 1,
    warmup: int = 2,
    repeats: int = 7,
    device: torch.device | str | None = None,
    optimizer_state: float = 2.0,
    load: int = 0,
    progress: Callable[[str], None] | None = None,
    group: dist.ProcessGroup | None = None,
    sequence_chunks: int = 1,
    remeasure: int = REMEASURE,
    label: str = "stage",
) -> StageProfile:
    """Profile ``stages`` (in pipeline order) on one microbatch of the batch ``inputs`` /
    ``targets`` split into ``microbatches``, with ``load`` copies of each stage running beside it.
    The modules are copied, not changed.

    ``group``: the stages are tensor-parallel over this process group (torch's
    ``parallelize_module`` on a DeviceMesh: ``group=mesh["tp"].get_group()``), and every rank of it
    calls ``profile_stages`` at once with the same stages and batch (see the module docstring).

    ``sequence_chunks`` k > 1: also each chunk position's F, B, W and activation with the
    microbatch's sequence (dim 1) cut into k chunks (``StageProfile.chunk_*``), from which
    ``make_problem`` writes the problem's ``sequence_chunks`` section; a stage whose chunks do not
    give its output on the whole sequence is refused in one line (``seqchunk.chunk_mismatch``).

    F, B, W and BW are timed ``warmup`` + ``repeats`` times, the stages' repeats interleaved, and
    each is the median of its repeats. The measurement is judged (``schedc.runtime.noise``: the
    spread of each stage's repeats, stages of the same blocks compared) and, over a limit, taken
    again up to ``remeasure`` more times, the quietest kept; ``StageProfile.warning`` is then one
    line naming the ``label`` s (stages; ``profile_model`` says blocks for its per-block profile)."""
    _check_tensor_parallel(stages, group, load)
    if sequence_chunks > 1 and group is not None:
        raise ValueError("sequence_chunks cannot be profiled on tensor-parallel stages yet (the runtime does not run"
                         " them over sequence chunks): profile without group, or with sequence_chunks=1")
    if sequence_chunks > 1:
        split_sequence(inputs, sequence_chunks)  # refused in one line if the sequence does not cut evenly
    if inputs.shape[0] % microbatches:
        raise ValueError(f"a batch of {inputs.shape[0]} does not split into {microbatches} equal microbatches")
    size = inputs.shape[0] // microbatches
    device = torch.device(device) if device is not None else _device_of(stages[0])
    if sequence_chunks > 1 and device.type != "cpu":
        raise ValueError("per-chunk activation memory is measured on CPU only yet: profile sequence chunks with"
                         " device='cpu'")
    x = inputs[:size].to(device)
    y = targets[:size].to(device) if isinstance(targets, torch.Tensor) else targets
    check_supported(EVERY_PROBLEM, "the profiler", TIMED)
    out: dict[str, list[float]] = {
        k: [] for k in (*(kind.value for kind in TIMED), "activation", "kept_for_w", "static", "sends", "working",
                        "recompute", "keep", "selective", "selective_keep", "grads",
                        *(("chunk_F", "chunk_B", "chunk_W", "chunk_activation", "chunk_working") if sequence_chunks > 1
                          else ()))
    }
    runs, inputs_of = [], []  # per stage: its runner, the input it is given (the stage before's output)
    for s, original in enumerate(stages):
        last = s == len(stages) - 1
        module = _split_copy(original, device)
        run = _StageRunner(module, x, y if last else None, loss_fn, group)
        following = run.output(s)  # the next stage's input (first: a DTensor output is refused before any timing)
        if sequence_chunks > 1:  # chunk by chunk as on the whole sequence, or refused before any timing
            why = chunk_mismatch(module, x, sequence_chunks)
            if why:
                raise ValueError(f"stage {s}{why}")
        runs.append(run)
        inputs_of.append(x)
        x = following
    n = len(stages)
    # load copies of every stage, each of the ``load`` threads running the copy of the stage being timed
    background = _Background([[_StageRunner(_split_copy(original, device), inputs_of[s],
                                            y if s == n - 1 else None, loss_fn) for s, original in enumerate(stages)]
                              for _ in range(load)])

    def sample(s: int) -> dict[str, float]:
        background.follow(s)
        return dict(zip((kind.value for kind in TIMED), runs[s].sample()))

    with background:
        judged = measure(sample, n, warmup, repeats, [block_keys(stage) for stage in stages], remeasure=remeasure,
                         label=label, gather=runs[0].gather if group is not None else None, progress=progress)
    for run in runs:
        run.module.zero_grad(set_to_none=True)
    for s in range(n):
        run, x, last = runs[s], inputs_of[s], s == n - 1
        module = run.module
        with background.on(s):
            times = {kind: judged.median[kind.value][s] for kind in TIMED}
            recompute, selective = run.recompute_times(warmup, repeats)
            if sequence_chunks > 1:
                for kind, per_chunk in zip(("F", "B", "W"), run.chunk_times(sequence_chunks, warmup, repeats)):
                    out[f"chunk_{kind}"].append(per_chunk)
        held, kept = run.memory()
        if sequence_chunks > 1:
            out["chunk_activation"].append([b / MiB for b in run.chunk_memory(sequence_chunks)])
            out["chunk_working"].append(run.chunk_working(sequence_chunks) / MiB)
        working = run.working() if group is None or device.type == "cpu" else None
        selective_held = run.memory(selective=True)[0] if selective > 0 else held
        params = sum(local_bytes(p) for p in module.parameters() if p.requires_grad)  # this rank's shards
        for kind, ms in times.items():
            out[kind.value].append(ms)
        out["activation"].append(held / MiB)
        out["kept_for_w"].append(min(kept, held) / MiB)
        out["static"].append(params * (2 + optimizer_state) / MiB)
        out["grads"].append(params / MiB)
        if working is not None:
            out["working"].append(working / MiB)
        out["recompute"].append(recompute)
        out["keep"].append(min(run.input_bytes(), held) / MiB)
        out["selective"].append(selective)
        out["selective_keep"].append(min(selective_held, held) / MiB)
        following = inputs_of[s + 1] if not last else None
        out["sends"].append(0.0 if last else following.numel() * following.element_size() / MiB)
        if progress:
            progress(f"{label} {s}: " + "  ".join(f"{kind} {ms:.3f} ms" for kind, ms in times.items())
                     + f"  spread {' '.join(f'{k} {100 * judged.spread[k][s]:.0f}%' for k in KINDS)}"
                     + f"  activation {held / MiB:.2f} MiB"
                     + (f"  working {working / MiB:.2f} MiB" if working is not None else ""))
    noise = dict(spread=judged.spread, disagreement=judged.disagreement, measurements=judged.measurements,
                 warning=judged.warning())
    degree = 1 if group is None else dist.get_world_size(group)
    if group is not None:
        # Not measured, rather than measured wrong: the runtime refuses offload with DTensor
        # parameters, and on CUDA what a collective allocates beside an op is not known to be the
        # caching allocator's.
        out["offload"] = []
        if progress:
            progress(f"tensor-parallel over {degree} ranks: times are the group's, memory this rank's shards;"
                     " offload not measured (the runtime refuses offload with tensor parallelism)"
                     + ("" if device.type == "cpu" else "; working memory not measured on CUDA"))
        return StageProfile(**out, microbatch_size=size, device=str(device), threads=torch.get_num_threads(),
                            tensor_parallel=degree, **noise)
    bandwidth = copy_bandwidth(device, max(max(out["activation"]), 1.0))
    out["offload"] = [a / bandwidth for a in out["activation"]]
    if progress:
        progress(f"host<->device copy: {bandwidth:.1f} MiB/ms" + (" (CPU: a memcpy)" if device.type == "cpu" else ""))
    return StageProfile(**out, microbatch_size=size, device=str(device), threads=torch.get_num_threads(),
                        copy_bandwidth=bandwidth, sequence_chunks=sequence_chunks, **noise)


def _check_tensor_parallel(stages: Sequence[nn.Module], group: dist.ProcessGroup | None, load: int) -> None:
    """Refuse, in one line, tensor-parallel stages profiled as if they were not (by one rank alone, its
    collectives unanswered), stages parallelised over other ranks than ``group``, and load copies
    beside them (their collectives would interleave with the timed stage's on the same group)."""
    for s, stage in enumerate(stages):
        meshes = {tuple(p.device_mesh.mesh.flatten().tolist()) for p in stage.parameters() if is_dtensor(p)}
        if meshes and group is None:
            raise ValueError(f"stage {s} has tensor-parallel (DTensor) parameters: profile it on every rank of its"
                             " tensor-parallel group at once, each calling profile_stages(..., group=mesh['tp']"
                             ".get_group())")
        ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else ()
        if any(sorted(m) != sorted(ranks) for m in meshes):
            raise ValueError(f"stage {s} is tensor-parallel over ranks {sorted(meshes)[0]} but group has ranks"
                             f" {ranks}: pass the group of the mesh dimension the stage is parallelised on")
    if group is not None and load:
        raise ValueError(f"load={load} copies cannot run beside tensor-parallel stages (their collectives would"
                         " mix with the timed stage's on the group): pass load=0; the group's own ranks share the"
                         " machine already")


def copy_bandwidth(device: torch.device, mib: float, repeats: int = 5) -> float:
    """MiB per ms of the copies an offload and its reload do on ``device``, the mean time of the two
    ways (median of ``repeats``): on CUDA pinned host memory from and to the device; on CPU (no
    device memory: the memcpy the runtime does) into a buffer outside torch's allocator and back,
    as ``schedc.runtime.policies.Offloaded`` does."""
    device = torch.device(device)
    src = torch.ones(max(1, int(mib * MiB)), dtype=torch.uint8, device=device)
    ways = []
    for _ in range(repeats + 1):
        box = Offloaded(device, set(), torch.cuda.Stream(device) if device.type == "cuda" else None)
        box.tensors.append(src)
        with _Timer(device) as out:
            box.offload()
            if box.event is not None:
                box.event.synchronize()
        with _Timer(device) as back:
            box.reload()
            if box.event is not None:
                box.event.synchronize()
        box.ready()
        ways.append((out.ms + back.ms) / 2)
    return src.numel() / MiB / statistics.median(ways[1:])


def block_keys(stage: nn.Module) -> list[tuple]:
    """A stage's blocks (an ``nn.Sequential``'s children, else the stage itself as one block), each
    as its class and its parameters' shapes: blocks of the same key do the same work, so stages of
    the same keys in proportional counts are compared (``noise.assess``)."""
    blocks = list(stage.children()) if isinstance(stage, nn.Sequential) else [stage]
    return [(type(b).__qualname__, tuple(tuple(p.shape) for p in b.parameters())) for b in blocks]


def _split_copy(module: nn.Module, device: torch.device) -> nn.Module:
    copied = copy.deepcopy(module).to(device)
    enable_split(copied)
    return copied


class _StageRunner:
    """F, B and W of one stage on one microbatch, as the runtime runs them."""

    def __init__(self, module: nn.Module, x: torch.Tensor, target: Any, loss_fn,
                 group: dist.ProcessGroup | None = None):
        self.module, self.x, self.target, self.loss_fn = module, x, target, loss_fn
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.store = WeightGradStore()
        self.device = x.device
        self.group = group  # tensor-parallel: every rank of it runs the same ops at once

    def timer(self) -> _Timer:
        return _Timer(self.device, self.group)

    def median(self, samples: list[float]) -> float:
        """The median of ``samples`` (ms); tensor-parallel, of the group's (each sample the slowest
        rank's), the same on every rank of the group."""
        if self.group is not None:
            slowest = torch.tensor(samples, dtype=torch.float64, device=self.device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.group)
            samples = slowest.tolist()
        return statistics.median(samples)

    def once(self) -> None:
        x, out = self.forward()
        self.backward_input(x, out)
        self.store.backward_weight("profile")

    def forward(self):
        x = self.x.detach().requires_grad_(True) if self.x.is_floating_point() else self.x
        out = waited(self.module(x))  # as the runtime's F: a tensor-parallel stage's collective waited for
        if self.target is not None:
            out = self.loss_fn(out, self.target)
        return x, out

    def backward_input(self, x, out) -> None:
        grad = None if self.target is not None else torch.ones_like(out)
        inputs = [x] if x.requires_grad else []
        self.store.backward_input("profile", out, grad, inputs, self.params)

    def recompute_times(self, warmup: int, repeats: int) -> tuple[float, float]:
        """Median ms of the runtime's R (the forward with autograd from the kept input, the RNG
        replayed) and of its S (the marked parts recomputed; 0 where the stage marks none)."""
        parts = enable_selective(self.module)
        r, sel = [], []
        for i in range(warmup + repeats):
            rng = capture_rng(self.device)
            with self.timer() as tr, replaying_rng(rng, self.device):
                x, out = self.forward()
            del x, out
            regions: list[Region] = []
            with dropping(parts, regions):
                x, out = self.forward()
            with self.timer() as ts:
                for region in regions:
                    region.recompute()
            self.backward_input(x, out)
            self.store.backward_weight("profile")
            del x, out, regions
            if i >= warmup:
                r.append(tr.ms)
                sel.append(ts.ms if parts else 0.0)
        self.module.zero_grad(set_to_none=True)
        return self.median(r), self.median(sel)

    def input_bytes(self) -> int:
        """What a recomputed microbatch keeps: its input, unless it is the caller's batch (stage 0,
        an integer tensor of token ids here: allocated before the step, not activation memory)."""
        return self.x.numel() * self.x.element_size() if self.x.is_floating_point() else 0

    def sample(self) -> tuple[float, float, float, float]:
        """One repeat: F, B, W and the fused BW in ms."""
        with self.timer() as tf:
            x, out = self.forward()
        with self.timer() as tb:
            self.backward_input(x, out)
        with self.timer() as tw:
            self.store.backward_weight("profile")
        x, out = self.forward()
        with self.timer() as tbw:
            grad = None if self.target is not None else torch.ones_like(out)
            self.store.backward_full(out, grad, [x] if x.requires_grad else [], self.params)
        return tf.ms, tb.ms, tw.ms, tbw.ms

    def gather(self, samples: list[dict[str, list[float]]]) -> list[dict[str, list[float]]]:
        """Tensor-parallel: every stage's samples as the group's (each the slowest rank's), the same
        on every rank of the group, so that every rank judges them alike (``noise.measure``)."""
        flat = [ms for stage in samples for kind in stage for ms in stage[kind]]
        slowest = torch.tensor(flat, dtype=torch.float64, device=self.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.group)
        values = iter(slowest.tolist())
        return [{kind: [next(values) for _ in stage[kind]] for kind in stage} for stage in samples]

    def chunk_times(self, k: int, warmup: int, repeats: int) -> tuple[list[float], ...]:
        """Per chunk position, median F, B and W in ms of the stage run over ``k`` sequence chunks as
        the runtime runs it (``seqchunk.ChunkedStage``: forwards in chunk order, then B in reverse,
        then the Ws)."""
        xs = split_sequence(self.x, k)
        ys = split_sequence(self.target, k) if isinstance(self.target, torch.Tensor) else [self.target] * k
        stage = ChunkedStage(self.module, k, self.loss_fn if self.target is not None else None, self.store, "profile")
        samples = {kind: [[] for _ in range(k)] for kind in "FBW"}
        for i in range(warmup + repeats):
            outs = []
            for c in range(k):
                with self.timer() as t:
                    out = stage.forward(xs[c], i, c, ys[c])
                outs.append(out)
                if i >= warmup:
                    samples["F"][c].append(t.ms)
            for c in reversed(range(k)):
                grad = None if self.target is not None else torch.ones_like(outs[c])
                with self.timer() as t:
                    stage.backward_input(i, c, grad)
                if i >= warmup:
                    samples["B"][c].append(t.ms)
            del outs, out, grad
            for c in range(k):
                with self.timer() as t:
                    stage.backward_weight(i, c)
                if i >= warmup:
                    samples["W"][c].append(t.ms)
        self.module.zero_grad(set_to_none=True)
        return tuple([self.median(per) for per in samples[kind]] for kind in "FBW")

    def chunk_memory(self, k: int) -> list[int]:
        """Per chunk position, the bytes its forward holds for backward (CPU: autograd's saved
        tensors, each storage counted once, as ``memory``; ``seqchunk.chunk_activation_bytes``)."""
        xs = split_sequence(self.x, k)
        ys = split_sequence(self.target, k) if isinstance(self.target, torch.Tensor) else None
        return chunk_activation_bytes(self.module, xs, ys, self.loss_fn if self.target is not None else None)

    def chunk_working(self, k: int, repeats: int = 2) -> float:
        """``working`` of the stage's chunk ops over ``k`` sequence chunks (the largest over every
        chunk's F, B, W and fused BW, as the runtime runs them through ``seqchunk.ChunkedStage``):
        what the problem's working memory is when its ops are chunks."""
        xs = split_sequence(self.x, k)
        ys = split_sequence(self.target, k) if isinstance(self.target, torch.Tensor) else [self.target] * k
        stage = ChunkedStage(self.module, k, self.loss_fn if self.target is not None else None, self.store, "working")
        for _ in range(repeats):
            meter = MemoryMeter(self.device, self.params)
            meter.start()
            ops: list[str] = []  # per instruction: F, B (B, W, BW: above the level before) or "" (not an op)
            try:
                for split in (True, False):
                    outs = []
                    for c in range(k):
                        with meter.instruction(len(ops)):
                            outs.append(stage.forward(xs[c], split, c, ys[c]))
                        ops.append("F")
                    for c in reversed(range(k)):
                        with meter.instruction(len(ops)):
                            grad = None if self.target is not None else torch.ones_like(outs[c])
                            (stage.backward_input if split else stage.backward)(split, c, grad)
                            del grad
                        ops.append("B")
                    with meter.instruction(len(ops)):
                        del outs
                    ops.append("")
                    for c in range(k) if split else ():
                        with meter.instruction(len(ops)):
                            stage.backward_weight(split, c)
                        ops.append("B")
            except BaseException:
                meter.stop(discard=True)
                stage.release(True)
                stage.release(False)
                raise
            rows = meter.stop()
            self.module.zero_grad(set_to_none=True)
        levels = [0] + [after for after, _ in rows]
        above = [rows[i][1] - (max(levels[i], levels[i + 1]) if op == "F" else levels[i])
                 for i, op in enumerate(ops) if op]
        return float(max(0, *above))

    def memory(self, selective: bool = False) -> tuple[float, float]:
        """(bytes F holds for backward, bytes B keeps for W); ``selective``: of a forward that drops
        the stage's marked parts (their inputs counted as held)."""
        if self.device.type == "cuda":
            return self._cuda_memory(selective)
        saved = SavedBytes(self.module.parameters())
        kept = []
        hooks = [
            m.register_forward_hook(lambda mod, args, out: kept.append(local_bytes(args[0]) + local_bytes(out)))
            for m in self.module.modules() if isinstance(m, SplitLinear)
        ]
        regions: list[Region] = []
        try:
            with saved.hooks(), dropping(enable_selective(self.module) if selective else [], regions):
                self.forward()
        finally:
            for h in hooks:
                h.remove()
        for region in regions:  # a dropped part keeps its inputs (outside autograd's saved tensors)
            for t in region.kept():
                saved.add(t)
        return float(saved.nbytes), float(sum(kept))

    def working(self, repeats: int = 2) -> float:
        """Bytes the stage's F, B, W or fused BW needs while it runs above the level the simulator
        holds during it (an F's: the level after it; a backward's: the level before it), the
        largest of the four, in the last of ``repeats`` runs (the first may allocate once-only
        buffers), measured as the runtime measures itself (``MemoryMeter``: new parameter
        gradients excluded). A backward's includes the gradient it is given, made here inside it
        (``ones_like``), where the runtime receives it before."""
        for _ in range(repeats):
            meter = MemoryMeter(self.device, self.params)
            meter.start()
            try:
                with meter.instruction(0):
                    x, out = self.forward()
                with meter.instruction(1):
                    self.backward_input(x, out)
                with meter.instruction(2):
                    self.store.backward_weight("profile")
                with meter.instruction(3):
                    del x, out
                with meter.instruction(4):
                    x, out = self.forward()
                with meter.instruction(5):
                    grad = None if self.target is not None else torch.ones_like(out)
                    self.store.backward_full(out, grad, [x] if x.requires_grad else [], self.params)
                    del grad
                del x, out
            except BaseException:
                meter.stop(discard=True)
                raise
            rows = meter.stop()
            self.module.zero_grad(set_to_none=True)
        levels = [0] + [after for after, _ in rows]
        # Above the level the simulator holds during each op: an F's allocation counts from its
        # start (the level after it), a backward's frees from its end (the level before it).
        # Instruction 3 only frees the first microbatch's leftovers: not an op.
        above = [rows[k][1] - max(levels[k], levels[k + 1]) for k in (0, 4)]  # F
        above += [rows[k][1] - levels[k] for k in (1, 2, 5)]  # B, W, BW
        return float(max(0, *above))

    def _cuda_memory(self, selective: bool = False) -> tuple[float, float]:
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        regions: list[Region] = []
        with dropping(enable_selective(self.module) if selective else [], regions):
            x, out = self.forward()
        torch.cuda.synchronize(self.device)
        held = torch.cuda.memory_allocated(self.device) - base
        self.backward_input(x, out)
        del out
        torch.cuda.synchronize(self.device)
        kept = torch.cuda.memory_allocated(self.device) - base
        self.store.backward_weight("profile")
        self.module.zero_grad(set_to_none=True)
        return float(held), float(max(0, kept))

    def output(self, s: int = 0) -> torch.Tensor:
        """The stage's output, as the next stage receives it: a plain tensor (a tensor-parallel
        stage's collective waited for; a DTensor refused, as the runtime refuses it)."""
        with torch.no_grad():
            y = waited(self.module(self.x))
        if is_dtensor(y):
            raise ValueError(refused_output(s, y))
        return y.detach()


class _Background:
    """Runs, on a thread per load copy, copies of a stage's F, B, W in a loop (torch ops release the
    GIL) while the body runs: the load of the other ranks on a shared machine. ``copies[t][s]`` is
    thread t's copy of stage s; the threads run the copies of the stage ``follow`` names (the one
    being timed), so that the stages' repeats can be interleaved."""

    def __init__(self, copies: list[list[_StageRunner]]):
        self.copies = copies
        self.current = 0
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()

    def follow(self, s: int) -> None:
        self.current = s

    def on(self, s: int) -> _Background:
        self.follow(s)
        return self

    def _loop(self, runners: list[_StageRunner], stop: threading.Event) -> None:
        while not stop.is_set():
            runners[self.current].once()

    def __enter__(self):
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(r, self.stop), daemon=True) for r in self.copies]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


class _Timer:
    """Milliseconds of the body (CUDA events on GPU). With a ``group`` (tensor parallelism), every
    rank of it starts together: the device's queued work is finished and the group meets at a
    barrier before the clock starts."""

    def __init__(self, device: torch.device, group: dist.ProcessGroup | None = None):
        self.cuda = device.type == "cuda"
        self.device, self.group = device, group
        self.ms = 0.0

    def __enter__(self):
        if self.group is not None:
            if self.cuda:
                torch.cuda.synchronize(self.device)
            dist.barrier(group=self.group)
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            self.ms = self.start.elapsed_time(self.end)
        else:
            self.ms = 1e3 * (time.perf_counter() - self.t0)


def measure_comm(mib: float, *, repeats: int = 20, warmup: int = 3, group: dist.ProcessGroup | None = None,
                 device: torch.device | str = "cpu") -> float:
    """One-way time in ms of a ``mib`` MiB float32 tensor between ranks 0 and 1 of ``group`` (half
    the median round trip). Every rank of the group must call it; ranks above 1 only wait."""
    rank = dist.get_rank(group)
    peer = 1 - rank
    buf = torch.zeros(max(1, int(mib * MiB) // 4), dtype=torch.float32, device=device)
    rounds = []
    for i in range(warmup + repeats):
        if rank > 1:
            continue
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, _global(group, peer), group=group)
            dist.recv(buf, _global(group, peer), group=group)
        else:
            dist.recv(buf, _global(group, peer), group=group)
            dist.send(buf, _global(group, peer), group=group)
        if i >= warmup:
            rounds.append(time.perf_counter() - t0)
    dist.barrier(group=group)
    return 1e3 * statistics.median(rounds) / 2 if rounds else 0.0


def measure_all_reduce(mib: float, *, repeats: int = 10, warmup: int = 3, group: dist.ProcessGroup | None = None,
                       device: torch.device | str = "cpu") -> float:
    """Time in ms of a sum all-reduce of a ``mib`` MiB float32 tensor over ``group`` (the median).
    Every rank of the group must call it."""
    buf = torch.zeros(max(1, int(mib * MiB) // 4), dtype=torch.float32, device=device)
    times = []
    for i in range(warmup + repeats):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def reduce_times(grads: Sequence[float], degree: int, probe_mib: float, probe_ms: float) -> list[float]:
    """Per stage, the all-reduce of its gradient (``grads``, MiB) over ``degree`` data-parallel
    replicas, from one measured all-reduce of ``probe_mib`` MiB over two ranks taking ``probe_ms``:
    a ring all-reduce moves 2 (d - 1) / d of the buffer per rank, which is 1 for two ranks, so the
    time scales with the gradient's size and with 2 (d - 1) / d (an estimate: the network between
    the replicas is taken to be the one measured)."""
    if degree < 2:
        return [0.0] * len(grads)
    per_mib = probe_ms / probe_mib
    return [per_mib * g * 2 * (degree - 1) / degree for g in grads]


def tied_groups(parts: Sequence[nn.Module]) -> list[tuple[list[int], float]]:
    """Stages that share parameters (a tied embedding: one Parameter in the first stage's
    embedding and the last stage's head), as ``(stages, MiB shared)``, stages merged into one
    group where they share any parameter."""
    holders: dict[int, set[int]] = {}
    size: dict[int, int] = {}
    for s, part in enumerate(parts):
        for p in part.parameters():
            holders.setdefault(id(p), set()).add(s)
            size[id(p)] = p.numel() * p.element_size()
    groups: list[tuple[set[int], int]] = []
    for key, stages in holders.items():
        if len(stages) < 2:
            continue
        joined = [g for g in groups if g[0] & stages]
        groups = [g for g in groups if not g[0] & stages]
        groups.append((stages.union(*(g[0] for g in joined)), size[key] + sum(g[1] for g in joined)))
    return sorted((sorted(g), b / MiB) for g, b in groups)


def _global(group, r: int) -> int:
    return dist.get_global_rank(group, r) if group is not None else r


def make_problem(
    profile: StageProfile,
    *,
    ranks: int,
    microbatches: int,
    chunks: int = 1,
    placement: str | list = "loop",
    comm: float = 0.0,
    memory_limit: float | None = None,
    objective: str = "makespan",
    name: str = "profiled",
    stage_blocks: list[int] | None = None,
    policies: bool = False,
    data_parallel: dict[str, Any] | None = None,
    replicas: dict[str, Any] | None = None,
    tied: dict[str, Any] | None = None,
    sequence_chunks: bool = True,
) -> Problem:
    """The Problem of running the profiled stages on ``ranks`` x ``chunks`` (times in ms, memory
    in MiB). Static memory per rank is the sum over the stages the placement puts there;
    ``memory.weights`` per stage one copy of its trainable parameters (what PipeDream-2BW's second
    weight version adds), where the profile recorded them (``grads``).
    ``policies``: also the ``recompute:`` section (time, keep, and ``selective:`` where every stage
    marks a part to drop) and the ``offload:`` section (copy time), from a profile that has them.
    ``data_parallel``: the problem's ``data_parallel`` section (degree, reduce per stage), as is.
    ``replicas``: the problem's ``replicas`` section (count, sync per model stage), as is: the
    profiled stages are then each pipeline's, and a rank's static memory counts both its copies.
    ``tied``: the problem's ``tied`` section (groups, sync per stage), as is.
    ``sequence_chunks``: from a profile of sequence chunks (``profile_stages(..., sequence_chunks=k)``),
    the problem's ``sequence_chunks`` section (``chunk_shares``), each stage's costs and memory
    deltas those of the chunked sequence (``chunked_scale``); False: the unchunked problem."""
    check_supported(EVERY_PROBLEM, "a profiled problem", TIMED)
    n = len(profile.F)
    if ranks * chunks != n:
        raise ValueError(f"the profile has {n} stages but ranks x chunks is {ranks} x {chunks}")
    chunked = sequence_chunks and profile.sequence_chunks > 1
    scale = chunked_scale(profile) if chunked else {"F": 1.0, "B": 1.0, "W": 1.0, "memory": 1.0}
    act = [a * scale["memory"] for a in profile.activation]  # chunked: the chunked sequence's
    b_delta = [-(a - k * scale["memory"]) for a, k in zip(act, profile.kept_for_w)]
    w_delta = [-k * scale["memory"] for k in profile.kept_for_w]
    mesh = dict(ranks=ranks, microbatches=microbatches, chunks=chunks, placement=placement,
                **({"replicas": replicas} if replicas else {}))
    base = Problem.parse(dict(**mesh, costs=dict(F=1, B=1, W=1)))
    static = [sum(profile.static[s % n] for s in stages) for stages in base.rank_stages]
    memory: dict[str, Any] = dict(F=act, B=b_delta, W=w_delta, static=static)
    if profile.working:
        memory["working"] = working_memory(profile, chunked=chunked)
    if profile.grads:  # one copy of the trainable weights: what an asynchronous schedule's second version adds
        memory["weights"] = list(profile.grads)
    if memory_limit is not None:
        memory["limit"] = memory_limit
    return Problem.parse(
        dict(name=name, **mesh,
             costs=_chunked_costs(profile, scale) if chunked else {k.value: getattr(profile, k.value) for k in TIMED},
             comm=comm, memory=memory,
             objective=objective, stage_blocks=stage_blocks,
             **({"data_parallel": data_parallel} if data_parallel else {}),
             **({"tied": tied} if tied else {}),
             **(policy_sections(profile) if policies else {}),
             **({"sequence_chunks": chunk_shares(profile)} if chunked else {})),
        source=name,
    )


def chunk_shares(profile: StageProfile) -> dict[str, Any]:
    """The problem's ``sequence_chunks`` section from a profile of sequence chunks: per chunk
    position, its part of the chunked sequence's F, B, W and activation (shares summing to 1). The
    problem has one share per chunk position for every stage, so each is the pipeline's: the sum
    over the stages of the chunk's cost (or memory) over the sum over the stages and chunks (a
    stage whose cost is mostly position-wise would alone give nearer 1/k to every chunk, one with
    much attention more to the later chunks). What chunking adds (smaller pieces run less
    efficiently) is ``chunked_scale``'s, put into the costs and memory by ``make_problem``."""
    k = profile.sequence_chunks
    out: dict[str, Any] = {"count": k}
    for field_, per_chunk, _ in _chunk_fields(profile):
        sums = [sum(stage[c] for stage in per_chunk) for c in range(k)]
        shares = [x / sum(sums) if sum(sums) > 0 else 1.0 / k for x in sums]
        shares = [max(share, 1e-6) for share in shares]  # shares are positive
        out[field_] = [share / sum(shares) for share in shares]
    return out


def chunked_scale(profile: StageProfile) -> dict[str, float]:
    """Per field (F, B, W, memory), the chunked sequence's measure over the unchunked one, summed
    over the stages (1 where nothing was measured): by how much ``make_problem`` scales each stage's
    cost or activation in a problem with sequence chunks (1.1-3.7 for tests.test_memory_measure's
    GPT in 2 stages, k = 2 and 4, on a 2-core CPU)."""
    out = {}
    for field_, per_chunk, whole in _chunk_fields(profile):
        chunked, total = sum(map(sum, per_chunk)), sum(whole)
        out[field_] = chunked / total if chunked > 0 and total > 0 else 1.0
    return out


def _chunked_costs(profile: StageProfile, scale: dict[str, float]) -> dict[str, list[float]]:
    """The problem's ``costs`` from ``profile``, F, B and W scaled by ``scale`` (``chunked_scale``);
    BW by what makes each chunk's BW cost what it was before scaling (the problem takes a chunk's
    BW share as its B and W shares weighted by the stage's B and W)."""
    costs = {kind.value: [t * scale[kind.value] for t in getattr(profile, kind.value)] for kind in TIMED
             if kind is not Kind.BW}
    costs["BW"] = [bw * ((scale["B"] * b + scale["W"] * w) / (b + w) if b + w > 0 else 1.0)
                   for bw, b, w in zip(profile.BW, profile.B, profile.W)]
    return costs


def _chunk_fields(profile: StageProfile):
    """(field, per stage its per-chunk measures, per stage its unchunked measure) of a chunk profile."""
    return (("F", profile.chunk_F, profile.F), ("B", profile.chunk_B, profile.B), ("W", profile.chunk_W, profile.W),
            ("memory", profile.chunk_activation, profile.activation))


def policy_sections(profile: StageProfile) -> dict[str, Any]:
    """The problem's ``recompute:`` and ``offload:`` sections from ``profile`` (none it lacks).
    ``recompute.selective`` only where every stage marks a part to drop (its time is positive):
    a stage without one has no selective recompute to offer."""
    out: dict[str, Any] = {}
    act = profile.activation
    if profile.recompute:
        out["recompute"] = dict(time=profile.recompute, keep=[min(k, a) for k, a in zip(profile.keep, act)])
        if profile.selective and min(profile.selective) > 0:
            out["recompute"]["selective"] = dict(time=profile.selective,
                                                 keep=[min(k, a) for k, a in zip(profile.selective_keep, act)])
    if profile.offload and min(profile.offload) > 0:
        out["offload"] = dict(time=profile.offload)
    return out


def working_memory(profile: StageProfile, chunked: bool = False) -> list[float]:
    """Per stage, MiB: the profiled working memory of its ops plus the largest tensor it receives
    (its input from the stage before, the gradient of its output from the stage after): a
    received tensor waits in memory for the op that consumes it. ``chunked``: of its ops over
    sequence chunks (``chunk_working``; a received tensor is a chunk's, 1/k of a sequence's)."""
    sends, n = profile.sends, len(profile.sends)
    k = profile.sequence_chunks if chunked else 1
    received = [max(sends[s - 1] if s > 0 else 0.0, sends[s] if s < n - 1 else 0.0) / k for s in range(n)]
    working = profile.chunk_working if chunked and profile.chunk_working else profile.working
    return [w + r for w, r in zip(working, received)]


def load_model_spec(ref: str) -> ModelSpec:
    """``path/to/file.py:function`` or ``package.module:function``; the function takes no
    arguments and returns a ModelSpec. FILE is imported as Python runs a script: its folder first
    on ``sys.path`` (where it stays, as for a script), so that it imports the modules beside it."""
    where, sep, func = ref.rpartition(":")
    if not sep or not where or not func:
        raise SchedcError(f"model {ref!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise SchedcError(f"model {ref!r}: no file {where}")
            folder = str(path.resolve().parent)
            if folder not in sys.path:
                sys.path.insert(0, folder)
            name = f"schedc_model_{path.stem}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # its classes can be pickled and deep-copied by name
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        else:
            module = importlib.import_module(where)
    except ImportError as e:
        raise SchedcError(f"model {ref!r}: cannot import {where}: {e}") from None
    fn = getattr(module, func, None)
    if not callable(fn):
        raise SchedcError(f"model {ref!r}: {where} has no function {func!r}")
    try:
        inspect.signature(fn).bind()
    except TypeError as e:
        raise SchedcError(f"model {ref!r}: {func}() must take no arguments ({e})") from None
    except ValueError:
        pass  # no signature to inspect (a builtin): call it and see
    model = fn()
    if not isinstance(model, ModelSpec):
        raise SchedcError(f"model {ref!r}: {func}() returned {type(model).__name__}, not a ModelSpec")
    return model


def profile_model(
    model: ModelSpec,
    *,
    ranks: int,
    microbatches: int,
    chunks: int = 1,
    placement: str | list = "loop",
    partition: str = "time",
    comm: float | None = None,
    memory_limit: float | None = None,
    objective: str = "makespan",
    name: str = "profiled",
    warmup: int = 2,
    repeats: int = 7,
    device: torch.device | str | None = None,
    load: int | None = None,
    progress: Callable[[str], None] | None = None,
    policies: bool = False,
    data_parallel: int = 1,
    replicas: int = 1,
) -> tuple[Problem, StageProfile]:
    """Partition, profile and time the transfer: the Problem ``schedc solve`` takes. ``comm``
    None measures it between two local processes (gloo, CPU). ``load`` None: ranks - 1 copies
    run beside each timed stage on CPU (the ranks share the machine), none on GPU. ``policies``:
    the problem also gets the ``recompute:`` and ``offload:`` sections (``make_problem``).
    ``data_parallel`` > 1: the ``data_parallel`` section, each stage's gradient all-reduce over that
    many replicas estimated from an all-reduce measured between two local processes
    (``reduce_times``). ``replicas`` 2: two pipelines in opposite directions (the problem's
    ``replicas`` section), each model stage's copies summing their gradients (RS): an all-reduce
    of its gradient over two ranks, estimated from the same measurement. Stages that share
    parameters (a tied embedding, ``tied_groups``) get the ``tied`` section, each group's sum an
    all-reduce of the shared weights over two ranks, estimated likewise."""
    say = progress or (lambda msg: None)
    n = ranks * chunks
    inputs, targets = model.batch
    blocks = model.blocks
    if not 1 <= n <= len(blocks):
        raise ValueError(f"cannot cut {len(blocks)} blocks into {n} stages ({ranks} ranks x {chunks} chunks)")
    if partition == "uniform":
        sizes = uniform(len(blocks), n)
    elif partition == "params":
        sizes = balanced([sum(p.numel() for p in b.parameters()) for b in blocks], n)
    elif partition == "time":
        say(f"profiling {len(blocks)} blocks one by one for the time-balanced partition")
        per_block = profile_stages(blocks, inputs, targets, model.loss_fn, microbatches=microbatches,
                                   warmup=warmup, repeats=repeats, device=device,
                                   optimizer_state=model.optimizer_state, label="block")
        weights = [f + b + w for f, b, w in zip(per_block.F, per_block.B, per_block.W)]  # split, as zero-bubble runs
        sizes = balanced(weights, n)
        say(f"partition {sizes}: slowest stage {max(stage_weights(weights, sizes)):.3f} ms"
            f" (uniform {uniform(len(blocks), n)}: {max(stage_weights(weights, uniform(len(blocks), n))):.3f} ms)")
    else:
        raise ValueError(f"partition must be uniform, params or time, got {partition!r}")
    if load is None:
        load = ranks - 1 if torch.device(device or _device_of(blocks[0])).type == "cpu" else 0
    say(f"profiling {n} stages" + (f" with {load} busy copies beside each (the other ranks' load)" if load else ""))
    parts = cut(blocks, sizes)
    shared = tied_groups(parts)
    prof = profile_stages(parts, inputs, targets, model.loss_fn, microbatches=microbatches,
                          warmup=warmup, repeats=repeats, device=device, optimizer_state=model.optimizer_state,
                          load=load, progress=say)
    if partition == "time" and per_block.warning:  # the partition was cut from noisy block times: say so too
        blocks_too = f"the partition's per-block profile: {per_block.warning}"
        prof = replace(prof, warning=f"{prof.warning}; {blocks_too}" if prof.warning else blocks_too)
    if comm is None:
        comm = _measured_comm(prof, ranks, repeats, say)
    dp = sync = tied = None
    probe = None
    if data_parallel > 1 or replicas > 1 or (shared and ranks > 1):
        mib = max(max(prof.grads), 1.0)
        probe = run_local(_all_reduce_probe, 2, mib, repeats, timeout=300)[0]
        say(f"all-reduce of {mib:.3f} MiB between two local processes: {probe:.3f} ms")
        if data_parallel > 1:
            dp = {"degree": data_parallel, "reduce": reduce_times(prof.grads, data_parallel, mib, probe)}
            say(f"over {data_parallel} replicas each stage's gradient takes {', '.join(f'{x:.3f}' for x in dp['reduce'])} ms")
        if replicas > 1:
            sync = {"count": replicas, "sync": reduce_times(prof.grads, 2, mib, probe)}
            say(f"the sum of a stage's two copies takes {', '.join(f'{x:.3f}' for x in sync['sync'])} ms")
    if shared:
        per_stage = [0.0] * n
        for group, size in shared:
            took = reduce_times([size], 2, mib, probe)[0] if probe is not None else 0.0
            for s in group:
                per_stage[s] = took
            say(f"stages {group} share {size:.3f} MiB of weights (tied): their gradient sum takes {took:.3f} ms")
        tied = {"groups": [group for group, _ in shared], "sync": per_stage}
    problem = make_problem(prof, ranks=ranks, microbatches=microbatches, chunks=chunks, placement=placement,
                           comm=comm, memory_limit=memory_limit, objective=objective, name=name, stage_blocks=sizes,
                           policies=policies, data_parallel=dp, replicas=sync, tied=tied)
    return problem, prof


def profile_layers(
    model: ModelSpec,
    *,
    ranks: int,
    microbatches: int,
    comm: float | None = None,
    memory_limit: float | None = None,
    objective: str = "makespan",
    name: str = "profiled",
    warmup: int = 2,
    repeats: int = 7,
    device: torch.device | str | None = None,
    load: int | None = None,
    progress: Callable[[str], None] | None = None,
    recompute: bool = False,
) -> tuple[LayerProblem, StageProfile]:
    """Each block profiled on its own, with ``load`` copies beside it as ``profile_model`` runs
    stages, and written as the layer-level problem ``schedc plan`` reads: per block its F, B, W,
    activation, what B keeps until W, static memory and recompute time (ms, MiB). Types: E for the
    first block, L for the last, t between (Megatron-LM's symbols for a decoder: edit the file
    where they do not hold); chunks 1 and 2 and both placements where the blocks suffice (2p).
    ``recompute``: the problem lets ``plan`` recompute (``LayerProblem.recompute``)."""
    say = progress or (lambda msg: None)
    inputs, targets = model.batch
    blocks = model.blocks
    if len(blocks) < ranks:
        raise ValueError(f"cannot cut {len(blocks)} blocks into stages on {ranks} ranks: every stage holds a block")
    if load is None:
        load = ranks - 1 if torch.device(device or _device_of(blocks[0])).type == "cpu" else 0
    say(f"profiling {len(blocks)} blocks one by one" + (f" with {load} busy copies beside each" if load else ""))
    prof = profile_stages(blocks, inputs, targets, model.loss_fn, microbatches=microbatches, warmup=warmup,
                          repeats=repeats, device=device, optimizer_state=model.optimizer_state, load=load,
                          progress=say, label="block")
    if comm is None:
        comm = _measured_comm(prof, ranks, repeats, say)
    tiny = 1e-6  # ms: a block with nothing to time (no weights: W) still has a cost > 0, as a problem needs

    def block(k: int) -> dict:
        out = dict(type="E" if k == 0 else "L" if k == len(blocks) - 1 else "t",
                   F=max(prof.F[k], tiny), B=max(prof.B[k], tiny), W=max(prof.W[k], tiny),
                   activation=prof.activation[k], held_for_w=min(prof.kept_for_w[k], prof.activation[k]),
                   static=prof.static[k])
        if prof.recompute and prof.recompute[k] > 0:
            out["recompute"] = prof.recompute[k]
        return out

    chunks = [1, 2] if len(blocks) >= 2 * ranks else [1]
    data: dict[str, Any] = dict(name=name, ranks=ranks, microbatches=microbatches, chunks=chunks,
                                placements=["loop", "v"] if 2 in chunks else ["loop"], comm=comm, objective=objective,
                                recompute=recompute, layers=[block(k) for k in range(len(blocks))])
    if memory_limit is not None:
        data["memory"] = {"limit": memory_limit}
    return LayerProblem.validated(data, name), prof


def _measured_comm(prof: StageProfile, ranks: int, repeats: int, say: Callable[[str], None]) -> float:
    """The transfer of the largest tensor a stage (or block) sends, timed between two local
    processes (0 on one rank)."""
    if ranks < 2:
        return 0.0
    mib = max(prof.sends)
    comm = run_local(_comm_probe, 2, mib, repeats, timeout=300)[0]
    say(f"transfer of {mib:.3f} MiB between two local processes: {comm:.3f} ms")
    return comm


def _comm_probe(rank: int, world: int, mib: float, repeats: int) -> float:
    return measure_comm(mib, repeats=max(repeats, 10))


def _all_reduce_probe(rank: int, world: int, mib: float, repeats: int) -> float:
    return measure_all_reduce(mib, repeats=max(repeats, 10))


def _device_of(module: nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
