"""PipelineRuntime: executes one rank's Program of a CompiledSchedule with torch.distributed.

    rt = PipelineRuntime(schedc.load("s.json"), stages={0: stage0, 3: stage3}, loss_fn=lm_loss)
    loss = rt.step(inputs, targets)     # all microbatches through this rank's program
    optimizer.step(); optimizer.zero_grad()

Each rank walks its instruction list in order:

- ``F``: the stage module on the microbatch (stage 0: the user's inputs; otherwise the received
  or handed-off activation, made a leaf that requires grad); the last stage adds the loss.
- ``B`` / ``W`` / ``BW``: input gradient, deferred weight gradient, or both
  (``schedc.runtime.wgrad``). The loss of each microbatch is scaled by 1/m, so the gradients are
  those of the mean loss over the batch, as in ordinary training.
- ``SEND`` / ``RECV``: ``isend`` / ``irecv`` posted in the Program's order; a received tensor
  is waited on only where it is consumed. A send's buffer is dropped as soon as the transfer
  has completed (checked after every instruction); ``STEP`` waits for those still in flight.
- ``LOCAL``: hands the tensor to the other stage on this rank.
- ``R`` (full recompute): the F of a recomputed (stage, microbatch) ran without autograd and kept
  only the stage input, the RNG state and the first values of the buffers it changed; R runs the
  stage again with autograd from that input, the RNG replayed (the same dropout masks) and those
  buffers restored (its own updates dropped), and B backpropagates through R's graph (split B/W as
  usual). ``S`` (selective): the F ran the stage's marked parts without keeping their activations;
  S recomputes those parts' graphs. ``O`` / ``L`` (offload / reload): the F handed what autograd
  saves to a box; O moves it to host memory, L brings it back, and the B waits for its L. See
  ``schedc.runtime.policies`` for each (and for what "host memory" is on CPU).
- ``AR`` (data parallelism): the stage's gradients, complete after its last weight gradient, are
  all-reduced over ``data_parallel_group`` (the stage's replicas) without waiting, one flat buffer
  per dtype; ``STEP`` waits for them and averages (the mean loss over the replicas' batches, as
  DDP). Over one replica the reduce is the identity.
- ``RS`` (replicas: two pipelines in opposite directions, Chimera or DualPipe): the stage's
  gradients are summed with those of its copies, the same model stage in the other pipelines, on
  other ranks of the pipeline group: an all-reduce over a group of those ranks (made at
  construction, by them alone), posted without waiting; ``STEP`` waits for it. Each pipeline runs
  ``microbatches`` of the batch (pipeline k the k-th part), the loss of each scaled by 1 / (its
  pipelines x microbatches), so the copies' summed gradients are the whole batch's mean loss's,
  and the copies, started equal, stay equal.
- Tensor-parallel stages (torch's ``parallelize_module`` on the ``tp`` dimension of a DeviceMesh;
  the groups from ``schedc.runtime.mesh.runtime_groups``) run as any module: each tensor-parallel
  rank sends its replicated output along its own pipeline. Their output (an
  ``AsyncCollectiveTensor``) is waited for as it leaves the stage; ``AR`` reduces each rank's
  shard of a DTensor gradient. Clipping, memory measurement and offload are refused with them.
- ``STEP``: completes every send, checks that nothing is left over, and runs the optimizer if
  one was given (otherwise the caller runs it after ``step``). With ``clip_grad_norm``, it
  clips to the global gradient norm of all ranks first, or skips a step whose norm is not finite,
  as ``torch.nn.utils.clip_grad_norm_`` in one process (``schedc.runtime.clip``): either waiting
  for the norm (``clip_mode="sync"``) or stepping at once and rolling the step back if the norm,
  checked at the next ``step`` or in ``synchronize()``, says so (``"post"``). In an asynchronous
  program it only ends the program (sends completed, nothing left over): the UPDATEs stepped.
- ``UPDATE`` (asynchronous programs, ``header.rounds`` R > 1: PipeDream-2BW, the ``2bw``
  schedule): ``step()`` runs all R rounds, its batch R times a synchronous step's, split in order
  into R x m microbatches (round r the r-th block of m); each round's loss is scaled by 1/m.
  Microbatch i belongs to round i // m, whose forwards and backwards all run on the round's weight
  version: the weights after ``UPDATE`` of round r - 2 (rounds 0 and 1 of a call: the weights the
  call starts with, so a call ends flushed and the next starts from its final weights). The
  module's Parameters hold the newest weights; a version is a list of leaves sharing their storage
  (``Parameter.data``, a version counter of its own) that the stage runs on in place of the
  parameters (``torch.func.functional_call``), each leaf accumulating the round's gradient (with a
  split backward too: W accumulates into the leaves). ``UPDATE(s, r)`` takes round r + 1's version
  if it was not yet taken, gives each parameter that a live version still shares a copy of its own
  (so no saved graph ever sees its weights change), puts round r's gradients into ``.grad`` and
  steps the optimizer (the rank's other parameters have no ``.grad``: only stage s steps), then
  drops round r's version and clears ``.grad``. So SGD gives w(t+1) = w(t) - lr * g(w(t-1)), and at
  most two copies of a stage's weights live at once (the parameters and one older version). It
  needs ``optimizer``; refused in one line at construction: ``clip_grad_norm`` (a synchronous
  option: one norm of every rank's gradients before one step), programs that recompute or offload
  (R, S, O), ``measure_memory``, tensor-parallel (DTensor) stages. Data parallelism, replicas and
  tied weights are refused by the core's schedule check.

Sequence chunks (``header.sequence_chunks`` k > 1: Seq1F1B, the ``seq1f1b`` and ``seq1f1b-zb``
schedules): an instruction's ``mb`` is a unit ``sequence * k + chunk``. ``step()`` takes the usual
batch, splits it into m microbatches and each microbatch's inputs and targets into k equal chunks
along dim 1 (``seqchunk.split_sequence``; a sequence k does not divide is refused in one line).
Each stage runs through a ``seqchunk.ChunkedStage`` (made at construction, sharing the runtime's
W store): F of a unit runs chunk ``mb % k`` of sequence ``mb // k``, attending to the sequence's
earlier chunks' keys and values kept on the stage; B / BW run in reverse chunk order (the program's
order) and W any time after its B; the sequence's state goes after its chunk 0's backward. Messages
are per unit, so activations and gradients travel per chunk; a stage's output keeps only its
autograd node as above. The last stage's chunk loss is recorded per unit and its backward scaled by
1/(k m): the microbatch's loss is the mean of its equal chunks' per-token means, the step's the mean
over microbatches, so the gradients are unchunked training's. Refused in one line at construction:
asynchronous programs, recompute or offload (R, S, O), data parallelism, replicas and tied weights
(the core refuses them first), tensor-parallel stages, a stage module holding sequence mixing that
``ChunkedStage`` cannot follow (``seqchunk.chunk_refusal``: torch's attention, RNNs, batch norm).
Checked on the first step, per stage: a chunk's forward that raises until the stage is checked
(in the shape exchange or a step) is refused naming the module (``seqchunk.chunk_failure``: e.g. a
position table of the whole sequence's length), and at its first sequence's last chunk the
stage's chunked forward is compared with its forward on that whole sequence (its inputs kept
until then; ``seqchunk.chunk_mismatch``: eval mode, no autograd, the random state untouched), refused
naming the first module whose output differs (a convolution over the sequence, hand-written
mixing). The refusing rank raises ``PipelineError`` before any optimizer step; the others stop
with it as with any failure. The check's time and transient memory fall in the first step's F of
that chunk (``trace``, ``measure_memory``: judge a later step).

Saved activations are dropped at B (autograd frees its graph) and W (the queued weight-gradient
inputs), so memory follows the schedule: each opcode runs in a method of its own, so no local
variable keeps a microbatch's tensors alive past its instruction. A stage's output keeps only
its autograd node until B (its values live on in the send or hand-off). Receive buffers get their shapes and dtypes from a
metadata exchange along the pipeline on the first step (and again if the input shape changes).
``measure_memory=True`` measures the activation memory per instruction (``schedc.runtime.memory``).

On CUDA with NCCL, torch runs point-to-point transfers on its own NCCL streams and ``wait`` makes
only the consuming compute stream wait (an event), so transfers overlap compute; with gloo on
CPU the transfers run on gloo's threads. With gloo and CUDA tensors, transfers are staged
through host memory.

Faults: every wait has a deadline (``timeout``). A rank whose step raises records the error in
the process group's store before re-raising. Every call into the transport (posting a send or a
receive, waiting, flushing the sends, the collectives of clipping and ``save_trace``, the shape
exchange's transfers) goes through ``_Attributed``: whatever fails there (the peer died, the
connection closed, the deadline passed, even a transport's own bug) raises ``PipelineError``
naming this rank, the instruction, the peer it was posting to or waiting for, and the rank that
failed first, as far as the store tells (else that peer) with the cause. Waiting ranks also poll
the store (``schedc.runtime.comm``), so they stop within a fraction of a second of any rank's
report, also when the failed rank stays alive. In a mesh the rank that failed is named by its
global rank on every rank. A runtime whose step failed is not used again, nor is its process
group: a transfer of the failed step may still be posted there, and gloo aborts the process when
it meets a new one, so ``step()`` on it is refused, and so is a new runtime on a group where a
failed step had posted (``_usable``, ``_failed_on``: this rank's, or as the store counts it).
"""

from __future__ import annotations

import itertools
import json
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from schedc.errors import SchedcError
from schedc.kinds import POLICIES, Kind, in_order, unsupported
from schedc.program import Instr, Message, Opcode
from schedc.runtime.clip import GradClip, clip_args_error
from schedc.runtime.comm import TRANSPORTS, Pending, Stopped, TransferFailed, Transport, describe
from schedc.runtime.device import indexed
from schedc.runtime.dtensor import is_dtensor, local, refused_output, waited
from schedc.runtime.memory import MemoryMeter
from schedc.runtime.policies import (FirstBuffers, Offloaded, Region, capture_rng, dropping, enable_selective,
                                     replaying_rng, without_storage)
from schedc.runtime.seqchunk import ChunkedStage, chunk_failure, chunk_mismatch, chunk_refusal, split_sequence
from schedc.runtime.wgrad import WeightGradStore, enable_split, fullgraph_compiled, refused_graph_break
from schedc.trace import write_trace_file

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.uint8,
           torch.bool]
_META_LEN = 12  # dtype, ndim, up to 10 dims
_RUNTIMES = itertools.count()  # constructions per process: the same sequence on every rank
# Process groups a runtime's step failed on after posting a transfer (this rank's step, or a rank's
# of the mesh, as the store tells): it may still be pending there, and gloo aborts the process
# (SIGABRT) when it meets a new runtime's transfer of another size. group -> what failed; and per
# group, the store keys of the runtimes built on it (their failure and poison counters).
_FAILED_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BUILT_ON: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

_AS_RUN = {Kind.RG: Kind.R, Kind.SG: Kind.S}  # Megatron's placement runs the same recompute once the gradient is in


class PipelineError(SchedcError):
    """The pipeline stopped: a rank failed, died, or did not answer within the timeout.
    ``culprit`` is the rank that failed first, as far as this rank can tell, as a rank of this
    rank's pipeline (None where it is none of them, e.g. in another replica of a data-parallel
    mesh); ``culprit_global`` is its global rank (the default process group's)."""

    def __init__(self, message: str, culprit: int | None = None, why: str | None = None,
                 culprit_global: int | None = None):
        super().__init__(message)
        self.culprit, self.why, self.culprit_global = culprit, why, culprit_global


@dataclass
class _StepState:
    """What one step holds between instructions."""

    xs: Any  # this rank's input microbatches (stage 0), else None
    ys: Any  # its targets (last stage), else None
    saved: dict = field(default_factory=dict)  # (stage, mb) -> (stage input leaf or None, output or loss)
    outbox: dict = field(default_factory=dict)  # Message -> computed, to be sent or handed off
    inbox: dict = field(default_factory=dict)  # Message -> (work or None, tensor)
    losses: dict = field(default_factory=dict)  # the step's microbatch index -> its loss (last stages)
    dropped: dict = field(default_factory=dict)  # (stage, mb) -> (input, RNG state, FirstBuffers): F ran no_grad, R due
    regions: dict = field(default_factory=dict)  # (stage, mb) -> [Region]: selective parts, S due
    boxes: dict = field(default_factory=dict)  # (stage, mb) -> (Offloaded, the stage input leaf or None)
    reduces: list = field(default_factory=list)  # (stage, posted or None: at STEP, params, group, divisor, where, what)


class PipelineRuntime:
    def __init__(
        self,
        compiled,
        stages: Mapping[int, nn.Module],
        loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
        *,
        device: torch.device | str | None = None,
        group: dist.ProcessGroup | None = None,
        data_parallel_group: dist.ProcessGroup | None = None,
        tied_parameters: Mapping[int, Any] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        clip_grad_norm: float | None = None,
        clip_mode: str = "sync",
        skip_nonfinite: bool = True,
        timeout: float = 300.0,
        trace: bool = False,
        measure_memory: bool = False,
        transport: str = "torch",
    ):
        """``compiled``: a CompiledSchedule (``schedc.load(path)``). ``stages``: this rank's stage
        modules by stage id. ``group``: the pipeline's process group (default: the world), so that
        other parallel axes can have groups of their own. ``data_parallel_group``: where the
        schedule's problem has ``data_parallel``, this rank's replicas (one rank per replica, each
        holding the same stages), over which its gradients are all-reduced; its size must be the
        degree. With replicas (two pipelines in opposite directions), ``stages`` holds this rank's
        stages of every pipeline, stage s a copy of model stage s % L (L stages per pipeline) whose
        parameters start equal to its copies' on the other ranks. ``tied_parameters``: where the
        problem ties weights of stages on different ranks (``tied``, an embedding shared by the first
        and last stage), per such stage of this rank its shared parameters, in the same order on
        every rank of the group and equal at the start; TS sums their gradients.
        ``timeout``: seconds any wait may take.
        ``clip_grad_norm``: clip to this max norm of all gradients of the whole model (every rank),
        as ``torch.nn.utils.clip_grad_norm_``, then step; a non-finite norm skips the step
        (``skip_nonfinite``). Needs ``optimizer``. ``clip_mode``: ``"sync"`` (wait for the norm
        at STEP) or ``"post"`` (step at once, check later; call ``synchronize()`` after the last
        step): see ``schedc.runtime.clip``.
        ``trace``: record each instruction's start and end (``trace_events``, ``save_trace``).
        ``measure_memory``: also measure this rank's activation memory per instruction
        (``schedc.runtime.memory``: the level after each and the peak during it, relative to the
        step's start, gradients and the optimizer step excluded); implies ``trace``. Set the
        attribute ``measure_memory`` to False to run a step unmeasured (e.g. a warm-up step).
        ``transport``: what moves tensors between ranks, a name in ``schedc.runtime.comm.TRANSPORTS``
        (default torch.distributed's point-to-point operations).
        Everything else the runtime needs comes from the Program's header (``program.header``)."""
        clip_error = clip_args_error(clip_grad_norm, clip_mode, optimizer)
        if clip_error:
            raise PipelineError(clip_error)
        if not dist.is_initialized():
            raise PipelineError("torch.distributed is not initialised: call init_process_group first (torchrun sets env://)")
        if compiled.program.header is None:
            raise PipelineError("the program has no header (ranks, microbatches, stages): lower() or schedc.load() it")
        head = compiled.program.header  # all the runtime needs besides the instructions
        for given, name in ((group, "group"), (data_parallel_group, "data_parallel_group")):
            why = _failed_on(given) if given is not None or name == "group" else None
            if why:
                which = "the default process group (group=None)" if given is None else f"the process group {name}"
                raise PipelineError(
                    f"{which} is unusable after a failure: {why}, which may still be pending there (gloo aborts the"
                    " process when one meets a new transfer): destroy the process group and create a new one"
                    " (dist.destroy_process_group(), then dist.init_process_group(...); for a subgroup,"
                    " dist.new_group(...)), or restart the job")
        self.compiled, self.header = compiled, head
        self.group = group
        self.rank = dist.get_rank(group)
        # the global rank of each pipeline rank: errors name a rank by both where they differ or
        # where the world holds more than this pipeline (a mesh)
        self._globals = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        world = dist.get_world_size(group)
        if world != head.n_ranks:
            raise PipelineError(
                f"the schedule {head.schedule!r} is for {head.n_ranks} ranks but the process group has {world}"
            )
        degree = head.data_parallel
        size = 1 if data_parallel_group is None else dist.get_world_size(data_parallel_group)
        if degree > 1 and data_parallel_group is None:
            raise PipelineError(
                f"the schedule {head.schedule!r} all-reduces gradients over {degree} data-parallel replicas:"
                " pass data_parallel_group (this rank's replicas, one rank per replica)")
        if size != degree:
            raise PipelineError(f"the schedule {head.schedule!r} is for {degree} data-parallel replica"
                                f"{'s' if degree > 1 else ''} but data_parallel_group has {size} ranks")
        self.dp_group = data_parallel_group if degree > 1 else None
        want = set(head.rank_stages[self.rank])
        if set(stages) != want:
            raise PipelineError(
                f"rank {self.rank} holds stages {sorted(want)} in this schedule but was given stages {sorted(stages)}"
            )
        for s, module in stages.items():
            if not isinstance(module, nn.Module):
                raise PipelineError(f"stage {s}: expected an nn.Module, got {type(module).__name__}")
        self.stages = dict(stages)
        self.loss_fn, self.optimizer, self.timeout = loss_fn, optimizer, float(timeout)
        self.program: tuple[Instr, ...] = compiled.program.for_rank(self.rank)
        self._ops: dict[Kind | Opcode, Callable[[_StepState, Instr, int], None]] = {  # opcode -> its method
            Kind.F: self._forward, Kind.B: self._backward_input, Kind.BW: self._backward_full, Kind.W: self._weight,
            Kind.R: self._recompute, Kind.S: self._recompute_selective, Kind.RG: self._recompute_after_gradient,
            Kind.SG: self._recompute_after_gradient, Kind.O: self._offload,
            Kind.L: self._reload, Kind.AR: self._reduce, Kind.RS: self._replica_sum, Kind.TS: self._tied_sum,
            Opcode.SEND: self._send, Opcode.RECV: self._recv, Opcode.LOCAL: self._local,
            Opcode.STEP: self._optimizer_step, Opcode.UPDATE: self._update,
        }
        # (stage, mb) -> the policy op the program holds for it (R, S, O; RG and SG as R and S); absent: kept
        self.policy = {(i.stage, i.mb): _AS_RUN.get(i.op, i.op) for i in self.program if i.op in POLICIES}
        for instr in self.program:  # a kind without a method here is refused before anything is set up
            if instr.op not in self._ops:
                runs = in_order(k for k in self._ops if isinstance(k, Kind))
                raise PipelineError(str(unsupported(instr.op, "the runtime", runs)))
        # Tensor-parallel stages (torch's DTensor parameters): what reads a parameter's or gradient's
        # storage, or sums gradient norms over the pipeline alone, would be wrong or fail with them.
        parallel = [s for s, mod in self.stages.items() if any(map(is_dtensor, mod.parameters()))]
        refused = [what for what, asked in (("clip_grad_norm", clip_grad_norm is not None),
                                            ("measure_memory", measure_memory),
                                            ("offload (O)", Kind.O in self.policy.values())) if asked]
        if parallel and refused:
            raise PipelineError(f"stage {min(parallel)} has tensor-parallel (DTensor) parameters: the runtime does not"
                                f" support {' or '.join(refused)} with tensor parallelism yet")
        if not head.synchronous:
            why = self._asynchronous_refusal(optimizer, clip_grad_norm, measure_memory, parallel)
            if why:
                raise PipelineError(f"the schedule {head.schedule!r} is asynchronous ({head.rounds} rounds, weight"
                                    f" versions): {why}")
        self.depth = head.pipeline_stages  # stage s is stage s % depth of the model, in pipeline s // depth
        self.m = head.microbatches  # per pipeline
        self.batches = head.microbatches * head.pipelines  # the microbatches a step splits its batch into
        if (head.pipelines > 1 or head.tied) and clip_grad_norm is not None:
            what = f"runs {head.pipelines} pipelines (replicas)" if head.pipelines > 1 else "ties weights across ranks"
            raise PipelineError(f"the schedule {head.schedule!r} {what}: clip_grad_norm does not support that yet"
                                " (the copies of a weight would be counted once per copy); clip outside the"
                                " runtime")
        first = next(iter(self.stages.values()))
        params = list(first.parameters())
        self.device = indexed(device) if device is not None else (params[0].device if params else torch.device("cpu"))
        backend = dist.get_backend(group)
        self.comm_device = self.device if backend != "gloo" else torch.device("cpu")
        self.split = head.split_backward
        self.store = WeightGradStore()
        if self.split:
            for s, module in self.stages.items():
                enable_split(module)
                for name in fullgraph_compiled(module):  # no graph break allowed: see schedc.runtime.wgrad
                    part = f"stage {s}" + (f" (its part {name!r})" if name else "")
                    warnings.warn(f"{part} is compiled with fullgraph=True, so its nn.Linear weight gradients are"
                                  " computed at B and its W does not do them: compile it without fullgraph=True"
                                  " to keep them deferred to W", stacklevel=2)
        self.params = {s: [p for p in mod.parameters() if p.requires_grad] for s, mod in self.stages.items()}
        # Sequence chunks (Seq1F1B): an op's mb is sequence * k + chunk; each stage runs one chunk at a time
        self.k = head.sequence_chunks
        self.chunked: dict[int, ChunkedStage] = {}
        if self.k > 1:
            why = self._sequence_refusal(parallel)
            if why:
                raise PipelineError(f"the schedule {head.schedule!r} cuts each sequence into {self.k} chunks: {why}")
            self.chunked = {s: ChunkedStage(mod, self.k, loss_fn if self._last(s) else None, self.store, s)
                            for s, mod in self.stages.items()}
        # stage -> its first sequence's chunk inputs so far, until its chunked forward is checked
        self._unchecked: dict[int, list[torch.Tensor]] = {s: [] for s in self.chunked}
        if head.pipelines > 1:  # each copy's sum (RS) takes its stage's parameters: one Parameter in two would count twice
            holder: dict[int, int] = {}
            for s, params in self.params.items():
                for q in params:
                    if holder.setdefault(id(q), s) != s:
                        raise PipelineError(
                            f"stages {holder[id(q)]} and {s} of rank {self.rank} share a parameter: with replicas"
                            " each stage needs its own (each pipeline its own copy of the model; tied weights are"
                            " summed by the schedule's TS)")
        # Asynchronous programs: this rank's trainable parameters by name per stage (what a round's
        # weight version replaces in the module), and the live versions, (stage, round) -> leaves.
        self.names = {s: [n for n, p in mod.named_parameters() if p.requires_grad] for s, mod in self.stages.items()}
        self.versions: dict[tuple[int, int], list[torch.Tensor]] = {}
        self.round_losses: torch.Tensor | None = None
        self.tied = self._tied(tied_parameters or {})
        # (kind, stage) -> the process group of the collective RS or TS of that stage, and its ranks
        self.sync_groups = self._stage_groups(group)
        self.selective: dict[int, list[nn.Module]] = {}  # stage -> its parts marked for selective recompute
        for s in sorted({s for (s, _), kind in self.policy.items() if kind is Kind.S}):
            self.selective[s] = enable_selective(self.stages[s])
            if not self.selective[s]:
                raise PipelineError(
                    f"the schedule {head.schedule!r} recomputes stage {s} selectively (S), but the stage's module"
                    " marks no part to drop: set the class attribute schedc_selective = True on the modules to"
                    " recompute (as schedc.runtime.gpt.AttentionCore does), or use a schedule without S")
        self._copy_stream = None  # CUDA: the copy lane's side stream, made at the first offload
        self._meta: dict[int, tuple[torch.Size, torch.dtype]] = {}  # stage s -> its output activation
        self._meta_key: tuple | None = None
        # The store's keys: failures are counted for the whole mesh (every replica stops), reports
        # and collective numbers per pipeline (its ranks' numbers), and per global rank for the mesh.
        self._mesh = f"schedc/runtime{next(_RUNTIMES)}"
        self._key = self._mesh if group is None else f"{self._mesh}/pipeline{min(dist.get_process_group_ranks(group))}"
        self._store = _default_store()
        self._failure: str | None = None  # why this runtime's step failed: it is not used again
        for used in {id(g): g for g in (_resolved(group), data_parallel_group) if g is not None}.values():
            _BUILT_ON.setdefault(used, []).append(self._mesh)
        if transport not in TRANSPORTS:
            raise PipelineError(f"unknown transport {transport!r}; known: {', '.join(TRANSPORTS)}")
        self.comm: Transport = TRANSPORTS[transport](group, self.timeout, self._someone_failed,
                                                     threaded=backend == "gloo", release_on_caller=measure_memory)
        self._io = _Attributed(self.comm, self._stopped, self._join)  # every call into the transport goes through it
        self.trace_enabled = trace or measure_memory
        self.events: list[tuple[Instr, float, float]] = []  # (instruction, start, end) of the last step
        self.meter = None
        self.measure_memory = measure_memory
        if measure_memory:
            self.meter = MemoryMeter(self.device, [p for ps in self.params.values() for p in ps])
        self.memory: list[tuple[int, int]] = []  # measure_memory: (after, peak) bytes per instruction, last step
        self.steps = 0
        self.clip: GradClip | None = None  # made last: its process group is made by every rank
        if clip_grad_norm is not None:
            mine = list({id(p): p for ps in self.params.values() for p in ps}.values())
            self.clip = GradClip(mine, optimizer, clip_grad_norm, clip_mode, skip_nonfinite, group, self.comm_device,
                                 self._io)

    def _sequence_refusal(self, parallel: list[int]) -> str | None:
        """What a program over sequence chunks cannot run with yet, in one line, or None. (The core
        refuses sequence chunks with data parallelism, replicas, tied weights, recompute and offload
        in the problem; a schedule file is checked again here.)"""
        head = self.header
        policies = sorted({kind.value for kind in self.policy.values()})
        if not head.synchronous:
            return "asynchronous programs (weight versions) do not run over sequence chunks yet"
        if policies:
            return (f"its program recomputes or offloads ({', '.join(policies)}), which the runtime does not run"
                    " over sequence chunks yet (the chunks share keys and values): use a schedule without them")
        if head.data_parallel > 1 or head.pipelines > 1 or head.tied:
            return "data parallelism, replicas and tied weights do not compose with sequence chunks yet"
        if parallel:
            return (f"stage {min(parallel)} has tensor-parallel (DTensor) parameters, which the runtime does not"
                    " run over sequence chunks yet")
        for s, module in sorted(self.stages.items()):
            why = chunk_refusal(module)
            if why:
                return f"stage {s} {why}"
        return None

    def _asynchronous_refusal(self, optimizer, clip_grad_norm, measure_memory, parallel: list[int]) -> str | None:
        """What an asynchronous program (weight versions, UPDATE per stage and round) cannot run
        with yet, in one line, or None."""
        policies = sorted({kind.value for kind in self.policy.values()})
        if optimizer is None:
            return ("its UPDATEs step the optimizer inside step(), per stage and round: pass"
                    " PipelineRuntime(..., optimizer=opt) over this rank's stage parameters")
        if clip_grad_norm is not None:
            return ("clip_grad_norm is a synchronous optimizer option (one norm of every rank's gradients before one"
                    " step) and an asynchronous schedule steps each stage on its own, once per round: drop"
                    " clip_grad_norm or use a synchronous schedule")
        if policies:
            return (f"its program recomputes or offloads ({', '.join(policies)}), which the runtime does not run on"
                    " weight versions yet (a recompute or offload would not keep to its round's version): use a"
                    " schedule without them")
        if measure_memory:
            return ("measure_memory does not tell the second weight version from activations yet: measure a"
                    " synchronous schedule")
        if parallel:
            return (f"stage {min(parallel)} has tensor-parallel (DTensor) parameters, which the runtime does not"
                    " keep weight versions of yet")
        return None

    # ---- the step ----

    def step(self, inputs: torch.Tensor | None = None, targets: Any = None) -> torch.Tensor | None:
        """One iteration: the batch is split into m microbatches along dim 0. ``inputs`` is needed
        on the rank holding stage 0, ``targets`` on the rank holding the last stage (others may pass
        None). Returns the mean loss over microbatches on the last stage's rank, else None.
        Gradients accumulate into ``.grad`` as with ``loss.backward()``.

        An asynchronous schedule (``header.rounds`` R > 1, e.g. 2bw) runs all R rounds in one call:
        the batch is R times a synchronous step's, split in order into R x m microbatches, round r
        the r-th block of m (``batch.chunk(R)[r]``). The optimizer steps inside the call, once per
        stage and round (UPDATE), and ``.grad`` is left None; the return is the mean over all R x m
        microbatches, and ``round_losses`` holds the R per-round means."""
        self._usable("step()")
        posts = self._io.posts
        try:
            if self.clip is not None:
                self.clip.check()  # clip_mode="post": the previous step's norm, before these forwards
            return self._step(inputs, targets)
        except BaseException as e:
            self._failed(e, posted=self._io.posts > posts)
            raise

    def synchronize(self) -> None:
        """With ``clip_mode="post"``: wait for the last step's global gradient norm and, if that
        step should have been clipped or skipped, roll it back and redo it clipped or skip it.
        Call it after the last ``step()`` (before evaluating or saving the model); ``step()`` does
        it for the previous step by itself. Any rank may call it alone. A no-op otherwise."""
        if self.clip is None:
            return
        self._usable("synchronize()")
        posts = self._io.posts
        try:
            self.clip.check()
        except BaseException as e:
            self._failed(e, posted=self._io.posts > posts)
            raise

    @property
    def last_grad_norm(self) -> float | None:
        """The global gradient norm of the last checked step (clipping only; with ``"post"``
        the step before the last until ``synchronize()``), for logging."""
        return None if self.clip is None else self.clip.norm

    @property
    def last_step_clipped(self) -> bool:
        """Whether the last checked step's gradients were scaled down."""
        return self.clip is not None and self.clip.clipped

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last checked step was skipped (non-finite norm, ``skip_nonfinite``)."""
        return self.clip is not None and self.clip.skipped

    def _usable(self, call: str) -> None:
        """Refuse ``call`` on a runtime whose step failed: its transfers may still be posted."""
        if self._failure is not None:
            raise PipelineError(f"{call} on a PipelineRuntime whose step failed ({self._failure}): a runtime is not"
                                " used again after a failure; destroy the process group and create a new one, then"
                                " a new runtime on it, or restart the job")

    def _poisoned(self, e: BaseException, posted: bool) -> None:
        """Mark this runtime as failed and, if the failed call ``posted`` a transfer or collective
        (it may still be posted), every process group it posts on, here and in the store
        (``_failed_on``). A step that failed before posting anything (a batch that does not split)
        leaves the groups usable, unless another rank's failed step posted."""
        self._failure = f"at step {self.steps}: {type(e).__name__}"
        if not posted:
            return
        groups = [_resolved(self.group), self.dp_group, *(g for g, _ in self.sync_groups.values())]
        groups += [self.clip.group] if getattr(self, "clip", None) is not None else []
        for g in groups:
            if g is not None:
                _FAILED_GROUPS[g] = (f"a PipelineRuntime's step failed on this rank ({self._failure}) with"
                                     " transfers posted")
        if self._store is not None:
            try:
                self._store.add(f"{self._mesh}/poisoned", 1)
            except Exception:  # noqa: BLE001 - the store may be gone with the rank that hosted it
                pass

    def _failed(self, e: BaseException, posted: bool = True) -> None:
        """Tell the other ranks, through the store, why this rank's step (or check) failed. A
        PipelineError of a transfer that could not tell who failed (``why`` but no ``culprit``)
        blames no one; any other PipelineError is this rank's own. ``posted``: the failed call
        had posted a transfer or collective (``_poisoned``)."""
        self._poisoned(e, posted)
        if isinstance(e, PipelineError):
            own = e.culprit is None and e.why is None and e.culprit_global is None
            self._report(self.rank if own else e.culprit, e.why or str(e), None if own else e.culprit_global)
        else:
            self._report(self.rank, f"raised {type(e).__name__}: {' '.join(str(e).split())[:300]}")

    def _step(self, inputs, targets):
        xs = self._split("inputs", inputs) if any(map(self._first, self.stages)) else None
        ys = self._split("targets", targets) if any(map(self._last, self.stages)) else None
        self._exchange_meta(xs)
        self.events = []
        state = _StepState(xs, ys)
        if not self.header.synchronous:  # the UPDATEs fill .grad from each round's versions, one stage at a time
            self.versions.clear()
            for params in self.params.values():
                for q in params:
                    q.grad = None
        meter = self.meter if self.measure_memory else None
        self.memory = []
        if meter is not None:
            meter.start()
        done = False
        try:
            for k, instr in enumerate(self.program):
                t0 = time.perf_counter()
                if meter is None:
                    self._ops[instr.op](state, instr, k)
                    self._io.release()
                else:
                    with meter.instruction(k, counted=instr.op is not Opcode.STEP):
                        self._ops[instr.op](state, instr, k)
                        self._io.release()  # completed sends' buffers, freed where the meter sees it
                if self.trace_enabled:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                    self.events.append((instr, t0, time.perf_counter()))
            done = True
        finally:
            if meter is not None:
                self.memory = meter.stop(discard=not done)
        self.steps += 1
        if not state.losses:
            return None
        losses = torch.stack([state.losses[i] for i in sorted(state.losses)])
        if not self.header.synchronous:  # the step's microbatches in round order: one row per round
            self.round_losses = losses.reshape(self.header.rounds, -1).mean(dim=1)
        return losses.mean()

    # ---- one method per opcode (``self._ops``); each leaves nothing behind in locals ----

    def _forward(self, state: _StepState, instr: Instr, k: int) -> None:
        s, mb = instr.stage, instr.mb
        first = self._first(s)
        x = state.xs[self._batch_index(s, mb)].to(self.device) if first else self._take(
            state.inbox, Message("act", mb, s - 1, s), instr, k)
        if self.chunked:
            self._forward_chunk(state, s, mb, x)
            return
        policy = self.policy.get((s, mb))
        if policy is Kind.R:  # keep only the input, the random state and the buffers it changes; R runs it again
            rng = capture_rng(self.device)
            found = FirstBuffers(self.stages[s], f"full recompute (R) of stage {s}")
            with torch.no_grad():
                with found.first_run():
                    y = self._call_stage(s, x, mb)
                self._output(state, s, mb, y)
                del y
            state.dropped[(s, mb)] = (x, rng, found)
            return
        if not first and x.is_floating_point():
            x = x.detach().requires_grad_(True)
        if policy is Kind.O:
            box = Offloaded(self.device, self._not_ours(s, x if first else None), self._copy_lane())
            with torch.autograd.graph.saved_tensors_hooks(box.pack, box.unpack):
                out = self._output(state, s, mb, self._call_stage(s, x, mb))
            state.boxes[(s, mb)] = (box, None if first else x)
        elif policy is Kind.S:
            regions: list[Region] = []
            with dropping(self.selective[s], regions):
                out = self._output(state, s, mb, self._call_stage(s, x, mb))
            state.regions[(s, mb)] = regions
        else:
            out = self._output(state, s, mb, self._call_stage(s, x, mb))
        state.saved[(s, mb)] = (None if first else x, _without_data(out))

    def _forward_chunk(self, state: _StepState, s: int, mb: int, x) -> None:
        """F of chunk ``mb % k`` of sequence ``mb // k`` (``ChunkedStage``): attention over the
        sequence's earlier chunks' keys and values on this stage. The last stage's loss is the
        chunk's; its backward is scaled by 1/(k m) (the mean over the chunks and the sequences)."""
        if self._last(s):
            loss = self._run_chunk(s, x, mb, self._target(state, s, mb))
            state.losses[self._batch_index(s, mb)] = loss.detach()
            return
        y = _plain_output(s, self._run_chunk(s, x, mb))
        state.outbox[Message("act", mb, s, s + 1)] = y.detach()
        _without_data(y)  # the chunk's record keeps only the output's autograd node until its backward

    def _run_chunk(self, s: int, x, mb: int, target=None):
        """Stage ``s``'s ``ChunkedStage.forward`` of unit ``mb``. Until the stage is checked (its
        first sequence's chunks of the first step), a forward that raises is refused in one line
        naming the module (``seqchunk.chunk_failure``), and after the sequence's last chunk the
        stage's chunked forward is compared with its forward on the whole sequence
        (``seqchunk.chunk_mismatch``): refused in one line naming the module where they differ."""
        seq, c = divmod(mb, self.k)
        inputs = self._unchecked.get(s)
        if inputs is None:
            return self.chunked[s].forward(x, seq, c, target)
        try:
            out = self.chunked[s].forward(x, seq, c, target)
        except (PipelineError, torch.OutOfMemoryError):  # not the chunk's doing
            raise
        except Exception as e:
            raise PipelineError(f"stage {s}" + chunk_failure(self.stages[s], e, x.shape[1], self.k)) from None
        if seq == 0:
            inputs.append(x)
        if seq == 0 and c == self.k - 1:
            del self._unchecked[s]
            # (also a chunk that raises in eval mode only, e.g. on a branch dropout's off-switch takes)
            why = chunk_mismatch(self.stages[s], torch.cat(inputs, dim=1), self.k)
            if why:
                raise PipelineError(f"stage {s}{why}")
        return out

    def _first(self, s: int) -> bool:
        """Whether stage ``s`` is the first of its pipeline (it reads the user's inputs)."""
        return s % self.depth == 0

    def _last(self, s: int) -> bool:
        """Whether stage ``s`` is the last of its pipeline (it computes the loss)."""
        return s % self.depth == self.depth - 1

    def _batch_index(self, s: int, mb: int) -> int:
        """Which of the step's microbatches microbatch ``mb`` of stage ``s``'s pipeline is (with
        sequence chunks: which of the step's chunks, ``sequence * k + chunk``)."""
        return s // self.depth * self.m * self.k + mb

    def _output(self, state: _StepState, s: int, mb: int, y):
        """What a forward of stage ``s`` leaves for its backward: the last stage's loss (scaled by
        1/m over every pipeline's m; recorded), else the output ``y``, whose values go to the outbox for
        the next stage."""
        if self._last(s):
            loss = self.loss_fn(y, self._target(state, s, mb))
            state.losses[self._batch_index(s, mb)] = loss.detach()
            return loss / self.batches
        if not isinstance(y, torch.Tensor):
            raise PipelineError(f"stage {s} returned {type(y).__name__}; a stage must return one tensor")
        state.outbox[Message("act", mb, s, s + 1)] = y.detach()
        return y

    def _target(self, state: _StepState, s: int, mb: int) -> torch.Tensor:
        """The targets of microbatch ``mb`` of stage ``s``'s pipeline on this rank's device, where the
        loss is computed (the caller may pass them on the host, as the inputs)."""
        return state.ys[self._batch_index(s, mb)].to(self.device)

    def _recompute(self, state: _StepState, instr: Instr, k: int) -> None:
        """R: the forward again, with autograd, from the kept input and with the first run's random
        numbers; what it saves is held for the B (and, split, the W) as an ordinary F's is."""
        s, mb = instr.stage, instr.mb
        x, rng, found = state.dropped.pop((s, mb))
        first = self._first(s)
        if not first and x.is_floating_point():
            x = x.detach().requires_grad_(True)
        with replaying_rng(rng, self.device):
            with found.as_found():
                y = self._call_stage(s, x, mb)
            out = self.loss_fn(y, self._target(state, s, mb)) / self.batches if self._last(s) else y
        del y
        state.saved[(s, mb)] = (None if first else x, _without_data(out))

    def _recompute_after_gradient(self, state: _StepState, instr: Instr, k: int) -> None:
        """RG / SG: R / S once the output gradient of the (stage, microbatch) has arrived (Megatron-LM
        recomputes inside the backward); the B takes the gradient as usual."""
        if not self._last(instr.stage):
            self._arrived(state.inbox, Message("grad", instr.mb, instr.stage + 1, instr.stage), instr, k)
        self._ops[_AS_RUN[instr.op]](state, instr, k)

    def _recompute_selective(self, state: _StepState, instr: Instr, k: int) -> None:
        """S: the marked parts of the stage again, with autograd, from their kept inputs."""
        for region in state.regions.pop((instr.stage, instr.mb)):
            region.recompute()

    def _offload(self, state: _StepState, instr: Instr, k: int) -> None:
        """O: what the forward saved to host memory; the stage input leaf keeps only its identity."""
        box, x = state.boxes[(instr.stage, instr.mb)]
        ours = box.storages()
        box.offload()
        if x is not None and x.untyped_storage().data_ptr() in ours:
            without_storage(x)

    def _reload(self, state: _StepState, instr: Instr, k: int) -> None:
        state.boxes[(instr.stage, instr.mb)][0].reload()

    def _not_ours(self, s: int, x) -> set[int]:
        """Storages an offload leaves where they are: the stage's parameters, the caller's input."""
        held = {p.untyped_storage().data_ptr() for p in self.stages[s].parameters()}
        return held | ({x.untyped_storage().data_ptr()} if x is not None else set())

    def _copy_lane(self):
        """The side stream offloads and reloads run on (CUDA), None on CPU (copies run at once)."""
        if self.device.type != "cuda":
            return None
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        return self._copy_stream

    def _call_stage(self, s: int, x, mb: int | None = None):
        """Stage ``s`` on ``x``; in an asynchronous program, microbatch ``mb``'s on its round's
        weight version (``_version``) in place of the module's parameters."""
        module = self.stages[s]
        try:
            if mb is None or self.header.synchronous:
                return _plain_output(s, module(x))
            weights = dict(zip(self.names[s], self._version(s, mb // self.m)))
            return _plain_output(s, torch.func.functional_call(module, weights, (x,)))
        except Exception as e:
            if not refused_graph_break(e):
                raise
            raise PipelineError(  # torch's own message is dozens of lines; it says only this
                f"stage {s} is compiled in a way that allows no graph break (fullgraph=True), but the B/W split"
                f" of {self.header.schedule!r} runs each nn.Linear outside the compiled graph: compile the"
                " stage module (torch.compile(module) or module.compile()) without fullgraph=True, or use a"
                " schedule without a split backward"
            ) from None

    def _backward_input(self, state: _StepState, instr: Instr, k: int) -> None:
        """B: the input gradient; the weight gradients wait in the store for W."""
        self._backward(state, instr, k, split=True)

    def _backward_full(self, state: _StepState, instr: Instr, k: int) -> None:
        """BW: the input and the weight gradients in one pass."""
        self._backward(state, instr, k, split=False)

    def _backward(self, state: _StepState, instr: Instr, k: int, split: bool) -> None:
        s, mb = instr.stage, instr.mb
        if self.chunked:
            self._backward_chunk(state, instr, k, split)
            return
        x, out = state.saved.pop((s, mb))
        if (s, mb) in state.boxes:  # offloaded: its reload must have completed
            box, _ = state.boxes.pop((s, mb))
            box.ready()
            del box
        grad = None if self._last(s) else self._take(state.inbox, Message("grad", mb, s + 1, s), instr, k)
        inputs = [x] if x is not None and x.requires_grad else []
        # the weights the forward ran on: the module's, or (asynchronous) the round's version
        params = self.params[s] if self.header.synchronous else self.versions[s, mb // self.m]
        if split:
            self.store.backward_input((s, mb), out, grad, inputs, params)
        else:
            self.store.backward_full(out, grad, inputs, params)
        if not self._first(s):
            state.outbox[Message("grad", mb, s, s - 1)] = x.grad

    def _backward_chunk(self, state: _StepState, instr: Instr, k: int, split: bool) -> None:
        """B or BW of chunk ``mb % k`` of sequence ``mb // k`` (after the sequence's later chunks'
        on this stage: ``ChunkedStage``); after chunk 0's, the sequence's keys and values are gone."""
        s, mb = instr.stage, instr.mb
        if self._last(s):  # the chunk's loss: its share of the step's mean
            grad = torch.tensor(1.0 / self.batches, device=self.device)
        else:
            grad = self._take(state.inbox, Message("grad", mb, s + 1, s), instr, k)
        run = self.chunked[s].backward_input if split else self.chunked[s].backward
        dx = run(mb // self.k, mb % self.k, grad)
        if not self._first(s):
            state.outbox[Message("grad", mb, s, s - 1)] = dx

    def _weight(self, state: _StepState, instr: Instr, k: int) -> None:
        if self.chunked:
            self.chunked[instr.stage].backward_weight(instr.mb // self.k, instr.mb % self.k)
            return
        self.store.backward_weight((instr.stage, instr.mb))

    # ---- asynchronous programs: weight versions ----

    def _version(self, s: int, r: int) -> list[torch.Tensor]:
        """Round ``r``'s weights of stage ``s``: leaves that share the storage of the module's
        parameters as they are when first asked for (the program asks after ``UPDATE(s, r - 2)`` and
        no later than ``UPDATE(s, r - 1)``: that version), each with a version counter of its own
        and its own ``.grad``, into which the round's backwards accumulate. The parameters are
        never changed in place while a version shares their storage (``_update`` gives them a
        storage of their own first), so no saved graph sees its weights change."""
        leaves = self.versions.get((s, r))
        if leaves is None:
            leaves = self.versions[s, r] = [q.data.requires_grad_(True) for q in self.params[s]]
        return leaves

    def _update(self, state: _StepState, instr: Instr, k: int) -> None:
        """UPDATE(s, r): the optimizer step of stage ``s`` with round ``r``'s gradients (computed on
        round r's version), applied to the module's parameters, the newest weights; round r's version
        is dropped. Round r + 1's version is taken first if it was not yet (the weights it needs are
        those this step replaces), and a parameter whose storage a version shares gets a copy of its
        own before the step changes it: at most two versions per parameter live at once (the
        parameter, and the one older version a round still in flight uses)."""
        s, r = instr.stage, instr.mb
        grads = [leaf.grad for leaf in self.versions.pop((s, r), ())]
        if not grads and self.params[s]:
            raise PipelineError(f"rank {self.rank}: {instr} comes before any forward of round {r} on stage {s}")
        if r + 1 < self.header.rounds:
            self._version(s, r + 1)
        live = [leaves for (t, _), leaves in self.versions.items() if t == s]
        for i, q in enumerate(self.params[s]):
            if any(leaves[i].untyped_storage().data_ptr() == q.untyped_storage().data_ptr() for leaves in live):
                q.data = q.data.clone()
            q.grad = grads[i]
        del grads, live
        self.optimizer.step()  # the rank's other parameters have no .grad: only this stage steps
        for q in self.params[s]:
            q.grad = None

    def _send(self, state: _StepState, instr: Instr, k: int) -> None:
        self._io.send(state.outbox.pop(instr.message).to(self.comm_device).contiguous(), instr.peer,
                       (k, instr, self.steps))

    def _recv(self, state: _StepState, instr: Instr, k: int) -> None:
        shape, dtype = self._meta[min(instr.message.src, instr.message.dst)]
        buf = torch.empty(shape, dtype=dtype, device=self.comm_device)
        state.inbox[instr.message] = (self._io.recv(buf, instr.peer, (k, instr, self.steps)), buf)

    def _local(self, state: _StepState, instr: Instr, k: int) -> None:
        state.inbox[instr.message] = (None, state.outbox.pop(instr.message))

    def _reduce(self, state: _StepState, instr: Instr, k: int) -> None:
        """Post the all-reduce of stage ``instr.stage``'s gradients over its replicas (a sum; STEP
        waits and averages). The gradients that exist are reduced, the same on every replica (the
        same model and program); one flat buffer per dtype, on the transport's device."""
        if self.dp_group is None:
            return  # one replica: nothing to reduce
        self._sum_gradients(state, instr, k, self.dp_group, self.header.data_parallel,
                            f"the gradient all-reduce of stage {instr.stage}")

    def _replica_sum(self, state: _StepState, instr: Instr, k: int) -> None:
        """Post the sum of stage ``instr.stage``'s gradients with its copies' (the same model stage in
        the other pipelines, on other ranks); STEP waits for it."""
        group, ranks = self.sync_groups[Kind.RS, instr.stage]
        self._sum_gradients(state, instr, k, group, 1, f"the gradient sum of stage {instr.stage} with its copies"
                            f" on ranks {', '.join(map(str, ranks))}")

    def _tied_sum(self, state: _StepState, instr: Instr, k: int) -> None:
        """Post the sum of the gradients of stage ``instr.stage``'s tied weights (``tied_parameters``)
        with those of the stages that share them on other ranks; STEP waits for it."""
        group, ranks = self.sync_groups[Kind.TS, instr.stage]
        self._sum_gradients(state, instr, k, group, 1, f"the tied-weight gradient sum of stage {instr.stage} with"
                            f" ranks {', '.join(map(str, ranks))}", self.tied[instr.stage])

    def _sum_gradients(self, state: _StepState, instr: Instr, k: int, group, divisor: int, what: str,
                       params: list | None = None) -> None:
        """Post the sum of stage ``instr.stage``'s gradients (or of ``params``') over ``group`` (STEP
        waits and divides by ``divisor``). The gradients that exist are summed, the same on every
        member (the same model stage and program); one flat buffer per dtype, on the transport's
        device. Where a sum of the same stage is still in flight (data parallelism and replicas or
        tied weights: AR and RS or TS), this one must start from its result, so it is posted at STEP,
        once that one has been written back (the simulator runs it on the communication lane right
        after; here it is not overlapped)."""
        where = (k, instr, self.steps)
        params = self.params[instr.stage] if params is None else params
        if any(item[0] == instr.stage for item in state.reduces):
            state.reduces.append((instr.stage, None, params, group, divisor, where, what))
            return
        state.reduces.append((instr.stage, self._post_sum(params, group, where, what), params, group, divisor, where,
                              what))

    def _post_sum(self, params: list, group, where: tuple, what: str) -> list:
        """Post the all-reduces of the gradients of ``params`` over ``group``: (pending, flat buffer,
        its gradients) per dtype."""
        grads = [local(p.grad) for p in params if p.grad is not None]  # a DTensor's: this rank's shard
        posted = []
        for dtype in sorted({g.dtype for g in grads}, key=str):
            mine = [g for g in grads if g.dtype == dtype]
            flat = torch.cat([g.reshape(-1) for g in mine]).to(self.comm_device)
            posted.append((self._io.all_reduce_among(flat, group, where, what), flat, mine))
        return posted

    def _await_reduces(self, state: _StepState) -> None:
        """Wait for the posted gradient sums, in the order they were issued (one lane), and write
        each back: the data-parallel replicas' mean, the copies' sum; post those left for the step."""
        for _, posted, params, group, divisor, where, what in state.reduces:
            if posted is None:
                posted = self._post_sum(params, group, where, what)
            for pending, flat, grads in posted:
                self._io.wait(pending, where)
                if divisor != 1:
                    flat.div_(divisor)
                offset = 0
                for g in grads:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
        state.reduces.clear()

    def _optimizer_step(self, state: _StepState, instr: Instr, k: int) -> None:
        self._io.flush((k, instr, self.steps))
        self._await_reduces(state)
        left = [f"{what} {sorted(held)}" for what, held in (("forwards without their R", state.dropped),
                                                             ("selective forwards without their S", state.regions),
                                                             ("offloaded activations without their B", state.boxes))
                if held]
        if left:
            raise PipelineError(f"rank {self.rank}: the program ended with " + "; ".join(left))
        self._finish_step(state.saved, state.outbox, state.inbox, (k, instr, self.steps))

    def _finish_step(self, saved, outbox, inbox, where) -> None:
        left = [f"saved activations {sorted(saved)}"] if saved else []
        left += [f"unsent {list(map(str, outbox))}"] if outbox else []
        left += [f"unused {list(map(str, inbox))}"] if inbox else []
        left += [f"weight gradients without W {self.store.pending()}"] if self.store.pending() else []
        left += [f"stage {s}'s sequences without their backward {sorted(c.states)}"
                 for s, c in self.chunked.items() if c.states]
        if self.versions:
            left += [f"weight versions without their UPDATE (stage, round) {sorted(self.versions)}"]
        if left:
            raise PipelineError(f"rank {self.rank}: the program ended with " + "; ".join(left))
        if not self.header.synchronous:
            return  # asynchronous: the UPDATEs stepped
        if self.clip is not None:
            self.clip.step(where)
        elif self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def _stage_groups(self, group) -> dict[tuple[Kind, int], tuple[dist.ProcessGroup, tuple[int, ...]]]:
        """Per collective of this rank, (RS or TS, stage) -> the process group of the ranks holding
        its group's stages (and those pipeline ranks): for RS the model stage's copies, for TS the
        stages sharing tied weights. Each process group is made by its members alone
        (``use_local_synchronization``), in one order on every rank (the header's groups), so that
        the other pipelines of a data-parallel mesh make theirs alike; groups of the same ranks share one."""
        head = self.header
        world = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        groups = [(Kind.RS, tuple(range(j, head.n_stages, self.depth))) for j in range(self.depth)] if head.pipelines > 1 else []
        groups += [(Kind.TS, g) for g in head.tied]
        out = {}
        made: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for kind, stages in groups:
            ranks = tuple(sorted({head.stage_rank[s] for s in stages}))
            if self.rank not in ranks:
                continue
            if ranks not in made:
                made[ranks] = dist.new_group([world[r] for r in ranks], use_local_synchronization=True)
            out.update(((kind, s), (made[ranks], ranks)) for s in stages if head.stage_rank[s] == self.rank)
        return out

    def _tied(self, given: Mapping[int, Any]) -> dict[int, list]:
        """Stage -> its tied weights, for each stage of this rank in a tied group across ranks
        (``tied_parameters``, checked)."""
        mine = {s for g in self.header.tied for s in g if self.header.stage_rank[s] == self.rank}
        if set(given) - mine:
            raise PipelineError(f"tied_parameters names stages {sorted(set(given) - mine)}, which share no weights"
                                f" with another rank in {self.header.schedule!r} (its tied groups: {list(self.header.tied)})")
        out = {}
        for s in sorted(mine):
            params = list(given.get(s, ()))
            if not params or not all(isinstance(p, nn.Parameter) and any(p is q for q in self.params[s]) for p in params):
                raise PipelineError(f"stage {s} shares weights with another rank in {self.header.schedule!r}: pass"
                                    " tied_parameters={" + str(s) + ": [the shared parameters of its module]}")
            out[s] = params
        return out

    def _split(self, what: str, batch):
        if batch is None:
            which = "the first stage of a pipeline" if what == "inputs" else "the last stage of a pipeline"
            raise PipelineError(f"rank {self.rank} holds {which}: step() needs {what}")
        if not isinstance(batch, torch.Tensor) or batch.dim() == 0:
            raise PipelineError(f"{what}: expected a tensor with a batch dimension, got {type(batch).__name__}"
                                + (" of 0 dimensions" if isinstance(batch, torch.Tensor) else ""))
        n, count = batch.shape[0], self.batches * self.header.rounds
        if n == 0 or n % count:
            rounds = self.header.rounds
            of = "" if rounds == 1 else f" ({rounds} rounds of {self.batches}: an asynchronous step runs every round)"
            raise PipelineError(f"{what}: batch of {n} does not split into {count} equal, non-empty microbatches{of}")
        if self.k == 1:
            return batch.chunk(count)
        if batch.dim() < 2:
            raise PipelineError(f"{what}: expected (batch, sequence, ...) to cut each sequence into {self.k} chunks,"
                                f" got {batch.dim()} dimension")
        try:  # microbatch i's chunk c at i * k + c, as the program's units
            return [c for micro in batch.chunk(count) for c in split_sequence(micro, self.k)]
        except ValueError as e:
            raise PipelineError(f"{what}: {e}") from None

    def _take(self, inbox, msg: Message, instr: Instr, k: int) -> torch.Tensor:
        """The received ``msg``, waited for, out of the inbox."""
        self._arrived(inbox, msg, instr, k)
        return inbox.pop(msg)[1].to(self.device)

    def _arrived(self, inbox, msg: Message, instr: Instr, k: int) -> None:
        """Wait for ``msg``'s receive, leaving the tensor in the inbox (an RG waits for the gradient
        its B takes)."""
        pending, tensor = inbox[msg]
        if pending is not None:
            self._io.wait(pending, (k, instr, self.steps))
            inbox[msg] = (None, tensor)

    # ---- waiting, and naming who failed ----

    def _stopped(self, where: tuple, peer: int, target: str, posting: bool, cause: str | None,
                 collective: int | None = None, among=None) -> PipelineError:
        """The error of a transport call that failed (``cause``: what failed, from the transport)
        or stopped because another rank reported a failure (``cause`` None). It names this rank,
        the instruction ``where`` = (index, instruction, step), what this rank was posting to or
        waiting for (``target``: rank ``peer``, or the ``collective``-th collective, ``peer`` -1)
        and the rank that failed first as far as the store tells, else the peer; for a collective,
        the rank that never joined it (``_join``), else, over two ranks, the other one (``among``:
        the process group of a collective outside the pipeline's numbering, a stage's replicas).
        In a mesh the culprit is named by its global rank too (``_name``)."""
        k, instr, step = where
        failed = cause is not None
        if cause is None:
            cause = "(this rank stopped waiting when it read that)"
        elif posting:
            cause = f"closed the connection before this rank posted to it (died?) [{cause}]"
        else:
            cause = f"did not answer within {self.timeout:g} s or closed the connection (died?) [{cause}]"
        found = self._first_failure(peer)
        if found is None and peer < 0 and collective is not None:
            absent = self._absent(collective)
            found = self._first_failure(peer)  # a rank that failed elsewhere may have reported meanwhile
        if found is None and peer < 0 and collective is not None:
            if len(absent) == 1:
                found = self._blame(absent[0], f"never joined {target} (died?) [{cause}]")
            elif absent:
                cause = f"{cause}; ranks {absent} never joined it"
            elif self.header.n_ranks == 2:  # the collective's only other rank failed in it
                peer = 1 - self.rank
        if found is None and among is not None and failed:  # the collective's only other rank failed in it
            others = [g for g in dist.get_process_group_ranks(among) if g != self._globals[self.rank]]
            if len(others) == 1:
                g = others[0]
                found = self._blame(self._globals.index(g), cause) if g in self._globals else (None, g, cause, None)
        if found is None:
            found = self._blame(peer, cause) if peer >= 0 else (None, None, cause, None)
        culprit, culprit_global, why, there = found
        at = f"the shape exchange before step {step} ({instr})" if k < 0 else f"instruction {k} ({instr}) of step {step}"
        doing = "posting to" if posting else "waiting for"
        return PipelineError(f"rank {self.rank}: pipeline stopped at {at}, {doing} {target}:"
                             f" {self._name(culprit, culprit_global, there)} {why}", culprit, why, culprit_global)

    def _blame(self, rank: int, why: str) -> tuple[int, int, str, None]:
        """A rank of this pipeline blamed, as ``_stopped`` takes it: (pipeline rank, its global
        rank, why, None); ``_elsewhere`` puts a rank of another pipeline's position there last."""
        return rank, self._globals[rank], why, None

    def _name(self, rank: int | None, global_rank: int | None, of: int | None = None) -> str:
        """A rank as errors name it: "rank r" where the pipeline is the whole world with its
        numbering; in a mesh "rank r (global rank g)"; a rank of another pipeline (``rank`` None)
        "global rank g" (with ``of``, its rank there: "(rank 0 of another replica's pipeline)");
        "a rank" where none is known."""
        if rank is not None:
            whole = len(self._globals) == dist.get_world_size() and self._globals[rank] == rank
            return f"rank {rank}" if whole else f"rank {rank} (global rank {self._globals[rank]})"
        if global_rank is None:
            return "a rank"
        return f"global rank {global_rank}" + ("" if of is None else f" (rank {of} of another replica's pipeline)")

    def _join(self, n: int) -> None:
        """Record in the store that this rank is posting its ``n``-th collective (1, 2, ...), so
        that if the collective fails, a rank that never came to it can be named."""
        if self._store is None:
            return
        try:
            self._store.set(f"{self._key}/joined/rank{self.rank}", str(n))
        except Exception:  # noqa: BLE001 - the store may be gone with the rank that hosted it
            pass

    def _absent(self, n: int, grace: float = 1.0) -> list[int]:
        """The other ranks that have not posted collective ``n``. While more than one is missing,
        wait up to ``grace`` seconds for slow ranks to come or for a rank to report a failure."""
        if self._store is None:
            return []
        deadline = time.monotonic() + grace
        while True:
            absent = []
            for r in range(self.header.n_ranks):
                key = f"{self._key}/joined/rank{r}"
                try:
                    if r != self.rank and (not self._store.check([key]) or int(self._store.get(key)) < n):
                        absent.append(r)
                except Exception:  # noqa: BLE001 - no store, no names
                    return []
            if len(absent) <= 1 or time.monotonic() > deadline or self._someone_failed():
                return absent
            time.sleep(0.1)

    def _someone_failed(self) -> bool:
        """Has any rank of this runtime reported a failure? (polled while a wait lasts)"""
        if self._store is None:
            return False
        try:
            return self._store.add(f"{self._mesh}/failed", 0) > 0
        except Exception:  # noqa: BLE001 - the store may be gone with the rank that hosted it
            return False

    def _first_failure(self, peer: int) -> tuple[int | None, int | None, str, int | None] | None:
        """The report of a rank that failed by itself (blamed no other), else ``peer``'s if it
        names a rank, else any report naming a rank, else what the other replicas' ranks reported
        (``_elsewhere``), else None; as (pipeline rank or None, global rank, why, its rank in its
        own pipeline where that is another)."""
        reports = {r: self._read_report(r) for r in range(self.header.n_ranks) if r != self.rank}
        own = [rep for r, rep in reports.items() if rep is not None and rep[0] == r]
        naming = [rep for rep in reports.values() if rep is not None and rep[0] is not None]
        if own:
            return self._blame(*own[0])
        if reports.get(peer) is not None and reports[peer][0] is not None:
            return self._blame(*reports[peer])
        return self._blame(*naming[0]) if naming else self._elsewhere()

    def _elsewhere(self) -> tuple[int | None, int, str, int | None] | None:
        """With data parallelism, what the ranks of the other replicas reported: a rank that failed
        by itself, else the rank a report blames (one of them died: its partners name it), as
        (None, its global rank, why, its rank in its pipeline if known) or, where it is a rank of
        this pipeline, ``_blame``'s; else None."""
        if self._store is None or self.dp_group is None:
            return None
        me = dist.get_rank()
        reports = {}
        for g in range(dist.get_world_size()):
            key = f"{self._mesh}/global{g}"
            try:
                if g != me and self._store.check([key]):
                    reports[g] = json.loads(self._store.get(key))
            except Exception:  # noqa: BLE001 - no store, no names
                return None
        own = [(g, report["rank"], report["why"]) for g, report in reports.items() if report.get("own")]
        blamed = sorted(((report["culprit"], report.get("culprit_rank"), report["why"]) for report in reports.values()
                         if report.get("culprit") is not None), key=lambda b: b[1] is None)  # its position known first
        for g, rank, why in own + blamed:
            if g in self._globals:
                return self._blame(self._globals.index(g), why)
            return None, g, why, rank
        return None

    def _report(self, culprit: int | None, why: str, culprit_global: int | None = None) -> None:
        """Tell the other ranks, through the store, which rank failed first (``culprit``, a rank
        of this pipeline, or ``culprit_global``, one of another pipeline) and how."""
        if self._store is None:
            return
        try:
            self._store.set(f"{self._key}/rank{self.rank}", json.dumps({"culprit": culprit, "why": why}))
            if self.dp_group is not None:
                g = self._globals[culprit] if culprit is not None else culprit_global
                self._store.set(f"{self._mesh}/global{dist.get_rank()}",
                                json.dumps({"own": culprit == self.rank, "rank": self.rank, "why": why, "culprit": g,
                                            "culprit_rank": culprit}))
            self._store.add(f"{self._mesh}/failed", 1)
        except Exception:  # noqa: BLE001 - the store may be gone with the rank that hosted it
            pass

    def _read_report(self, rank: int) -> tuple[int | None, str] | None:
        """What ``rank`` reported: (the rank it blames or None, why), or None."""
        if self._store is None:
            return None
        key = f"{self._key}/rank{rank}"
        try:
            if not self._store.check([key]):
                return None
            report = json.loads(self._store.get(key))
            culprit = report["culprit"]
            return (None if culprit is None else int(culprit)), str(report["why"])
        except Exception:  # noqa: BLE001
            return None

    # ---- shapes of received tensors ----

    def _exchange_meta(self, xs) -> None:
        """On the first step, run the stages once along the pipeline without gradients (eval mode,
        one microbatch) and send each stage's output shape and dtype to the next stage's rank:
        receive buffers are sized from this, not guessed. Later steps must keep the input shape."""
        key = None if xs is None else (tuple(xs[0].shape), xs[0].dtype)
        if self.steps:
            if key is not None and key != self._meta_key:
                raise PipelineError(
                    f"rank {self.rank}: microbatch inputs changed from {self._meta_key} to {key}; the"
                    " receive buffers were sized on the first step: build a new PipelineRuntime"
                )
            return
        stage_rank, here = self.header.stage_rank, self.rank
        x = None
        for s in range(self.header.n_stages):
            if self._last(s):
                continue
            if self._first(s):  # each pipeline's chain starts from the inputs
                x = xs[0].to(self.device) if xs is not None else None
            src, dst = stage_rank[s], stage_rank[s + 1]
            meta_instr = Instr(Opcode.SEND, s, -1, "act", dst, s + 1)  # names the exchange in errors
            if src == here:
                module = self.stages[s]
                mode = module.training
                module.eval()
                try:
                    with torch.no_grad():
                        y = self._call_stage(s, x)
                except (PipelineError, torch.OutOfMemoryError):
                    raise
                except Exception as e:  # on a sequence chunk: the first forward it runs (seqchunk.chunk_failure)
                    if not self.chunked:
                        raise
                    raise PipelineError(f"stage {s}" + chunk_failure(module, e, x.shape[1], self.k)) from None
                finally:
                    module.train(mode)
                if not isinstance(y, torch.Tensor):
                    raise PipelineError(f"stage {s} returned {type(y).__name__}; a stage must return one tensor")
                self._meta[s] = (y.shape, y.dtype)
                if dst != here:
                    self._io.send(_encode(y), dst, (-1, meta_instr, self.steps))  # waited for with the step's sends
                x = y
            elif dst == here:
                meta = torch.empty(_META_LEN, dtype=torch.int64)
                where = (-1, meta_instr._replace(op=Opcode.RECV, stage=s + 1, peer=src, peer_stage=s), self.steps)
                self._io.wait(self._io.recv(meta, src, where), where)
                self._meta[s] = _decode(meta)
                x = torch.zeros(self._meta[s][0], dtype=self._meta[s][1], device=self.device)
        self._meta_key = key

    # ---- trace ----

    def trace_events(self) -> list[dict]:
        """The last step's executed instructions (``trace=True``): instruction, op, stage, mb, start
        and end in seconds (``time.perf_counter``, comparable between processes on one host); with
        ``measure_memory=True`` also ``memory`` (MiB after the instruction) and ``memory_peak``
        (MiB during it), this rank's activation memory relative to the step's start."""
        events = [
            {"instr": str(i), "op": i.op.value, "stage": i.stage, "mb": i.mb, "start": t0, "end": t1}
            for i, t0, t1 in self.events
        ]
        if self.memory and len(self.memory) == len(events):
            for e, (after, peak) in zip(events, self.memory):
                e["memory"], e["memory_peak"] = after / 2**20, peak / 2**20
        return events

    def close(self) -> None:
        """End the transport's helper threads (gloo); the runtime is not used again. Optional: a
        runtime not closed is closed as the interpreter exits."""
        self.comm.close()

    def save_trace(self, path: str) -> None:
        """Collective (every rank calls it): rank 0 of the group writes the last step's trace of
        all ranks to ``path`` (a Perfetto trace that ``schedc show --measured`` also reads)."""
        if not self.trace_enabled:
            raise PipelineError("save_trace needs PipelineRuntime(..., trace=True)")
        self._usable("save_trace()")
        try:
            self._gather_trace(path)
        except PipelineError as e:  # a gather failed (not reported: the others' steps are done)
            self._poisoned(e, posted=True)
            raise

    def _gather_trace(self, path: str) -> None:
        """``save_trace``'s two gathers (each rank's size, then the padded traces) and the write."""
        # As JSON bytes in uint8 tensors (never pickle: a peer's data is not code to run).
        mine = torch.frombuffer(bytearray(json.dumps(self.trace_events()).encode()), dtype=torch.uint8)
        n = dist.get_world_size(self.group)
        # after the last step's program; not an instruction of it (Instr takes only opcodes), named in errors
        where = (len(self.program), "SAVE_TRACE", self.steps - 1)
        what = "the trace gather"
        size = torch.tensor([mine.numel()], dtype=torch.int64, device=self.comm_device)
        sizes = [torch.zeros_like(size) for _ in range(n)]
        self._io.wait(self._io.all_gather(sizes, size, self.group, where, what), where)
        longest = max(int(x) for x in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8, device=self.comm_device)
        padded[: mine.numel()] = mine.to(self.comm_device)
        received = [torch.empty_like(padded) for _ in range(n)]
        self._io.wait(self._io.all_gather(received, padded, self.group, where, what), where)
        if self.rank == 0:
            gathered = [json.loads(b[: int(k)].cpu().numpy().tobytes()) for b, k in zip(received, sizes)]
            write_trace_file(path, self.header.schedule, self.steps - 1, gathered)


class _Attributed:
    """The transport as the interpreter calls it: a failure of any call (posting, waiting,
    flushing, a collective) becomes the runtime's PipelineError (``PipelineRuntime._stopped``)
    naming this rank, the instruction, the peer or collective and the cause; TransferFailed and
    Stopped as the transport raises them, anything else as a transport's own error. ``where`` = (instruction index, instruction, step) is also the tag
    the transport gets (a flushed send's failure names that send's instruction)."""

    def __init__(self, transport: Transport, stopped: Callable[..., PipelineError], join: Callable[[int], None]):
        """``stopped``: ``PipelineRuntime._stopped``; ``join(n)``: called before the ``n``-th
        collective is posted (``PipelineRuntime._join``)."""
        self.transport, self.stopped, self.join = transport, stopped, join
        self.collectives = 0  # posted so far: the same sequence on every rank
        self._numbers: dict[int, int] = {}  # id(pending collective) -> its number
        self._among: dict[int, Any] = {}  # id(pending all_reduce_among) -> its process group
        self.posts = 0  # transfers and collectives posted so far (a failed step that posted one leaves it posted)

    def send(self, tensor: torch.Tensor, peer: int, where: tuple) -> None:
        self._call(lambda: self.transport.send(tensor, peer, where), where, peer)

    def recv(self, buffer: torch.Tensor, peer: int, where: tuple) -> Pending:
        return self._call(lambda: self.transport.recv(buffer, peer, where), where, peer)

    def wait(self, pending: Pending, where: tuple) -> None:
        n, among = self._numbers.pop(id(pending), None), self._among.pop(id(pending), None)
        self._call(lambda: self.transport.wait(pending, where), where, pending.peer, pending.what, False, n, among)

    def flush(self, where: tuple) -> None:
        self._call(self.transport.flush, where, -1, "its sends", posting=False)

    def all_reduce(self, tensor: torch.Tensor, group, where: tuple, what: str) -> Pending:
        return self._collective(lambda: self.transport.all_reduce(tensor, group, where), where, what)

    def all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor, group, where: tuple, what: str) -> Pending:
        return self._collective(lambda: self.transport.all_gather(outputs, tensor, group, where), where, what)

    def all_reduce_among(self, tensor: torch.Tensor, group, where: tuple, what: str) -> Pending:
        """A sum all-reduce over a group other than the pipeline's (a stage's data-parallel
        replicas): not numbered among the pipeline's collectives (``_join`` names the pipeline's
        ranks that never joined one of those)."""
        pending = self._call(lambda: self.transport.all_reduce(tensor, group, where), where, -1, what, True,
                             among=group)
        pending.what = what
        self._among[id(pending)] = group
        return pending

    def _collective(self, post: Callable[[], Pending], where: tuple, what: str) -> Pending:
        self.collectives += 1
        n = self.collectives
        self.join(n)
        pending = self._call(post, where, -1, what, True, n)
        pending.what = what
        self._numbers[id(pending)] = n
        return pending

    def release(self) -> None:
        self.transport.release()

    def _call(self, call: Callable[[], Any], where: tuple, peer: int, what: str = "", posting: bool = True,
              collective: int | None = None, among=None):
        self.posts += posting
        try:
            return call()
        except Stopped as e:
            tag, peer, cause, posting = e.tag, e.peer, None, False
        except TransferFailed as e:
            tag, peer, cause, posting = e.tag, e.peer, e.cause, e.posting
        except Exception as e:  # noqa: BLE001 - a transport's own error, attributed all the same
            tag, cause = where, describe(e)
        if not (isinstance(tag, tuple) and len(tag) == 3):
            tag = where  # a transport that tags its errors otherwise
        target = f"rank {peer}" if peer >= 0 else what or "the collective"
        raise self.stopped(tag, peer, target, posting, cause, collective, among) from None


def _plain_output(s: int, y):
    """A stage's output as the runtime can send it and drop its storage: a tensor-parallel stage's
    last layer (torch's ``RowwiseParallel``) returns an ``AsyncCollectiveTensor``, a wrapper whose
    all-reduce may still be in flight and whose values live in an inner tensor that
    ``_without_data`` cannot reach (it would hold the output from F to B, and the shape exchange
    would leave its collective never waited for). ``waited`` waits for it and gives a plain
    tensor, differentiable (its gradient passes through unchanged). A DTensor output is refused:
    its local shard is not the activation the next stage expects."""
    y = waited(y)
    if is_dtensor(y):
        raise PipelineError(refused_output(s, y))
    return y


def _without_data(y: torch.Tensor) -> torch.Tensor:
    """``y`` with its storage replaced by one element (expanded to its shape): B needs only its
    autograd node, and the values travel on in ``y.detach()`` (the send or hand-off), so a
    stage's output is not held from F to B (as Megatron-LM's ``deallocate_output_tensor``). A
    view or a tensor without a node is returned as it is; so is the storage autograd saved (its
    own reference stays valid)."""
    if y.grad_fn is None or y._base is not None or y.numel() <= 1:
        return y
    y.data = torch.empty(1, dtype=y.dtype, device=y.device).expand(y.shape)
    return y


def _encode(t: torch.Tensor) -> torch.Tensor:
    if t.dim() > _META_LEN - 2 or t.dtype not in _DTYPES:
        raise PipelineError(f"cannot send a {t.dim()}-d {t.dtype} tensor between stages")
    return torch.tensor([_DTYPES.index(t.dtype), t.dim(), *t.shape] + [0] * (_META_LEN - 2 - t.dim()), dtype=torch.int64)


def _decode(meta: torch.Tensor) -> tuple[torch.Size, torch.dtype]:
    values = meta.tolist()
    return torch.Size(values[2:2 + values[1]]), _DTYPES[values[0]]


def _resolved(group):
    """The process group ``group`` names: itself, or for None the default group."""
    return dist.group.WORLD if group is None else group


def _failed_on(group, grace: float = 1.0) -> str | None:
    """Why a new runtime cannot use ``group`` (None: the default group), or None: a runtime's step
    that had posted a transfer failed on it on this rank, or the store says so of a rank (a
    runtime built on the group counts it, ``_poisoned``). Where a runtime there failed but none
    has said so yet, wait up to ``grace`` seconds: a rank that posted and now waits notices the
    failure within ``comm.POLL``."""
    group = _resolved(group)
    if group is None:
        return None
    if group in _FAILED_GROUPS:
        return _FAILED_GROUPS[group]
    store = _default_store()
    keys = _BUILT_ON.get(group, []) if store is not None else []
    for key in list(keys):
        try:
            deadline = time.monotonic() + grace
            while store.add(f"{key}/poisoned", 0) == 0:
                if store.add(f"{key}/failed", 0) == 0:
                    break
                if time.monotonic() > deadline:  # failed, and none had posted: judged once
                    keys.remove(key)
                    break
                time.sleep(0.05)
            else:
                _FAILED_GROUPS[group] = "a PipelineRuntime's step failed on another rank with transfers posted"
                return _FAILED_GROUPS[group]
        except Exception:  # noqa: BLE001 - the store may be gone with the rank that hosted it
            return None
    return None


def _default_store():
    """The default process group's key-value store (torchrun's, or init_process_group's), used
    only to report failures; None if this torch does not expose it."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - a private accessor; without it, errors name the peer
        return None
