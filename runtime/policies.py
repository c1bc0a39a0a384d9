"""What the runtime does for a (stage, microbatch) that does not keep its activation (issue 25):
recompute it in full (R), recompute a part of it (S, selective), or offload it to host memory and
reload it (O, L). The interpreter (``schedc.runtime.interpreter``) calls these at its instructions.

RNG: a recomputation must draw the random numbers its first run drew (dropout masks), and must not
move the random streams of what runs after it. ``capture_rng`` records the CPU generator's state and
the CUDA device's before the first run; ``replaying_rng`` runs a block with that state and restores
the streams afterwards (``torch.random.fork_rng``).

Full recompute (R): the F runs without autograd (``torch.no_grad``) and keeps only the stage's
input, the RNG state and the first values of the buffers it changes (``FirstBuffers``); R runs the
stage again with autograd from that input (the interpreter holds them).

Buffers: a forward that changes a buffer (BatchNorm's running statistics in training) is run twice
by a recompute. ``FirstBuffers`` keeps, at the first run, the values of the buffers it changes as
that run found them; the recomputation runs on those values (the same output) and its own updates
go to them and are dropped, so every buffer changes once per forward, as in ordinary training.

Selective recompute (S): a model marks the parts of a stage to drop with the class attribute
``schedc_selective = True`` on a module (the example GPT marks its attention core,
``schedc.runtime.gpt.AttentionCore``: softmax(q k^T) with its dropout, the part whose activations
grow with the square of the sequence, as Megatron-LM's ``--recompute-granularity selective``).
``enable_selective`` switches those modules' class (as ``wgrad.enable_split`` does for linear
layers: parameters, state_dict and ordinary training are untouched). During the F of a selective
(stage, microbatch), ``dropping(modules, regions)`` makes each marked module run as one autograd
node (``_Dropped``) that computes its output without autograd and keeps only its inputs and the RNG
state (a ``Region``). The S instruction calls ``Region.recompute`` on each: the part runs again with
autograd from the kept inputs, the RNG replayed, and its graph waits for the B. So the
recomputation runs at S, where the schedule puts it, not lazily inside B; a region whose S did not
run (never in a checked program) is recomputed in its B (``Region.lazy`` counts that).

Parameters inside a marked part (its own, a layer it calls twice or shares with the rest of the
stage; frozen ones get none) are inputs of its ``_Dropped`` node, whose backward returns their
gradients from the recomputed graph: its output wants a gradient where they do, even where the
part reads the caller's batch. With a split backward, the part's split linear layers defer their
weight gradients to the W of the B that runs the node (``wgrad.gradients_within``); its other
parameters get theirs in B, as elsewhere. What cannot be recomputed exactly is refused in one line
naming the part's class (``SchedcError``): a part that returns anything but one tensor, or whose
forward changes a buffer that its earlier forwards left alone (its first value is gone).

Offload (O, L): during the F of an offloaded (stage, microbatch), ``torch.autograd.graph.
saved_tensors_hooks`` hands every tensor autograd saves to an ``Offloaded`` box (the handle
autograd keeps is an index, so the box holds the only reference autograd has). Parameters and
tensors the runtime does not own (the caller's input batch) are left where they are. O copies the
boxed tensors' storages (each once, however many saved views share it) to host memory and drops
the device copies; L allocates them on the device again and copies back, and the saved views are
rebuilt on the new storages with their offsets, shapes and strides; B's unpack reads them there.

- CUDA: host buffers are pinned; both copies run on a side stream (one per runtime: the copy lane,
  one copy at a time in issue order) after the compute stream's work so far (``wait_stream``), and
  each records an event; the B of a reloaded microbatch makes the compute stream wait for its L's
  event, so the copies overlap compute. The device storages an offload copies from are handed to
  the side stream (``record_stream``) before they are dropped, so the allocator reuses them only
  after the copy. (Not run in this project's tests: there is no GPU on its CI machine.)
- CPU: there is no separate host memory, so "host memory" is memory outside torch's allocator:
  ``torch.frombuffer`` over a Python ``bytearray``. The activation measurement on CPU
  (``schedc.runtime.memory``) counts the allocations of torch's CPU allocator (torch.profiler's
  memory events), which never sees a bytearray: an offloaded activation leaves the measured
  memory at O and comes back at L, as it leaves and re-enters device memory on a GPU. The copies
  run synchronously at the instruction (a memcpy; nothing to overlap with on one CPU thread).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from schedc.errors import SchedcError
from schedc.runtime.device import indexed
from schedc.runtime.dtensor import local
from schedc.runtime.wgrad import gradients_within

RngState = tuple[torch.Tensor, torch.Tensor | None]  # (CPU generator state, CUDA device's or None)


def capture_rng(device: torch.device) -> RngState:
    """The random state a run on ``device`` draws from: the CPU generator's, and the device's on CUDA."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


@contextlib.contextmanager
def replaying_rng(state: RngState, device: torch.device) -> Iterator[None]:
    """Run the block with the random state ``state`` (``capture_rng``); afterwards every generator
    is back where it was before the block, as if the block drew nothing."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)
        yield


# ---- selective recompute ----


BufferSlot = tuple[nn.Module, str]  # a buffer by its owner and name (a forward may replace it)


def _class_name(module: nn.Module) -> str:
    """The user's name of ``module``'s class (not its selective subclass's)."""
    cls = type(module)
    return (cls.__bases__[0] if getattr(cls, "_schedc_switched", False) else cls).__name__


class FirstBuffers:
    """The buffers of ``module`` that one forward changes (BatchNorm's running statistics), as
    that forward found them: a recomputation runs from them (``as_found``) and its own changes are
    dropped, so the buffers change once per forward, as in ordinary training, and the recomputation
    sees what the first run saw. ``what``: the recomputation, for the one-line error.

    Which buffers a module's forward changes is learnt at its first forward in each train/eval
    mode (every buffer is copied before that one; a change is seen by the version counter, by
    identity where the forward replaces the buffer, or by value, since some kernels update a buffer
    without counting it); later forwards copy only those, and one that changes another buffer is
    refused (its value before that forward is gone)."""

    def __init__(self, module: nn.Module, what: str):
        self.module, self.what = module, what
        self.values: dict[BufferSlot, torch.Tensor] = {}  # what the first run changed, as it found it

    @contextlib.contextmanager
    def first_run(self) -> Iterator[None]:
        """Around the forward whose buffers a recomputation will start from."""
        slots = [(m, name) for m in self.module.modules() for name, b in m._buffers.items() if b is not None]
        learnt = self.module.__dict__.setdefault("_schedc_changes", {})  # per train/eval mode of its modules
        mode = tuple(m.training for m in self.module.modules())
        known: set[BufferSlot] | None = learnt.get(mode)
        before = {slot: (slot[0]._buffers[slot[1]], slot[0]._buffers[slot[1]]._version) for slot in slots}
        copies = {slot: buf.clone() for slot, (buf, _) in before.items() if known is None or slot in known}
        yield
        changed = {slot for slot, (buf, version) in before.items()
                   if slot[0]._buffers.get(slot[1]) is not buf or buf._version != version
                   or (slot in copies and not torch.equal(copies[slot], buf))}
        if known is None:
            learnt[mode] = changed
        elif not changed <= known:
            module, name = next(iter(changed - known))
            raise SchedcError(
                f"{self.what}: its forward changed the buffer {name!r} of {_class_name(module)}, which its earlier"
                " forwards left alone, so its value before this forward is gone and the recomputation cannot be"
                " exact: make the forward change the same buffers on every call, or do not recompute it")
        self.values = {slot: copies[slot] for slot in changed}

    @contextlib.contextmanager
    def as_found(self) -> Iterator[None]:
        """The buffers the first run changed as it found them, while the block runs (once);
        afterwards the current ones again (what the block did to the copies is dropped)."""
        current = {(m, name): m._buffers[name] for m, name in self.values}
        try:
            for (m, name), value in self.values.items():
                m._buffers[name] = value
            yield
        finally:
            for (m, name), value in current.items():
                m._buffers[name] = value
            self.values = {}


class Region:
    """One call of a marked module during a selective forward: its inputs, parameters, RNG state
    and the first values of the buffers it changes, kept until S recomputes its graph, which B
    then uses once."""

    def __init__(self, part: nn.Module, run, rng: RngState, device: torch.device):
        self.part, self.run, self.rng, self.device = part, run, rng, device
        self.inputs: tuple[torch.Tensor, ...] | None = ()
        self.wants: tuple[bool, ...] = ()  # per input, whether it wants a gradient
        self.params: tuple[torch.Tensor, ...] = ()  # the part's parameters that want a gradient
        self.buffers = FirstBuffers(part, f"selective recompute of {_class_name(part)}")
        self.graph: tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None = None
        self.lazy = False  # recomputed inside B, because no S ran before it

    def first_run(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The part's forward at F (autograd is off), its changed buffers' first values kept."""
        with self.buffers.first_run():
            out = self.run(*inputs)
        if not isinstance(out, torch.Tensor):
            raise SchedcError(f"selective recompute of {_class_name(self.part)}: its forward returns"
                              f" {type(out).__name__}, and a part marked schedc_selective must return one tensor:"
                              " mark a module that does, or unmark it")
        return out

    def recompute(self) -> None:
        """The part again, with autograd, from its kept inputs and with its first run's random
        numbers and buffers."""
        if self.inputs is None:
            raise RuntimeError("a selective region recomputed twice, or after its backward")
        leaves = tuple(t.detach().requires_grad_(w) if t.is_floating_point() else t.detach()
                       for t, w in zip(self.inputs, self.wants))
        saved: set[int] = set()

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.add(local(t).untyped_storage().data_ptr())  # a DTensor's storage is its shard's
            return t

        with torch.enable_grad(), replaying_rng(self.rng, self.device), self.buffers.as_found(), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = self.run(*leaves)
        # The backward needs of the leaves only their identity (to be given gradients) and of the
        # output only its node: where the recomputed graph saved neither's storage, drop their
        # values, so that S brings back what the part saves and no more (its inputs, views of a
        # larger tensor here, and its output are not held twice).
        for t in (*leaves, out):
            if (t.is_floating_point() and t.requires_grad and t._base is None and t.numel() > 1
                    and t.untyped_storage().data_ptr() not in saved):
                t.data = torch.empty(1, dtype=t.dtype, device=t.device).expand(t.shape)
        self.graph, self.inputs = (out, leaves), None

    def kept(self) -> list[torch.Tensor]:
        """What the region holds from its F to its S: the inputs and the first values of the
        buffers its part changes (the parameters live anyway)."""
        return [*(self.inputs or ()), *self.buffers.values.values()]


class _Dropped(torch.autograd.Function):
    """A marked module as one autograd node: its forward keeps no activation of its own (the
    ``Region`` keeps its inputs), its backward goes through the graph S recomputed.

    The part's parameters that want a gradient are inputs of the node too, so that its output
    wants a gradient when they do (a part that reads the caller's batch) and autograd calls the
    backward, which returns theirs. In a split backward, the part's split linear layers defer
    their weight gradients to the W of the B that runs it (``wgrad_inside``: the B tags this node
    with its queue and ``gradients_within`` passes the tag on to the recomputed graph)."""

    wgrad_inside = True

    @staticmethod
    def forward(ctx, region: Region, n: int, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.region = region
        inputs = tensors[:n]
        region.inputs = tuple(t.detach() for t in inputs)
        region.wants = tuple(t.requires_grad for t in inputs)
        region.params = tensors[n:]
        return region.first_run(*inputs)  # autograd is off inside a Function's forward

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        region: Region = ctx.region
        if region.graph is None:
            region.lazy = True
            region.recompute()
        out, leaves = region.graph
        region.graph = None
        wanted = [t for t in leaves if t.requires_grad]
        grads = iter(gradients_within(ctx, out, grad, (*wanted, *region.params)))
        return (None, None, *(next(grads) if t.requires_grad else None for t in leaves),
                *(next(grads) for _ in region.params))


def _selective_forward(self, *args, **kwargs):
    regions = self.__dict__.get("_schedc_regions")
    base = type(self).__bases__[0]
    if (regions is None or kwargs or not torch.is_grad_enabled()
            or not all(isinstance(a, torch.Tensor) for a in args)):
        return base.forward(self, *args, **kwargs)
    device = args[0].device if args else torch.device("cpu")
    region = Region(self, lambda *xs: base.forward(self, *xs), capture_rng(device), device)
    regions.append(region)
    params = {id(q): q for q in self.parameters() if q.requires_grad}  # a Parameter used twice: once
    return _Dropped.apply(region, len(args), *args, *params.values())


_SWITCHED: dict[type, type] = {}  # a marked class -> its selective subclass


def _selective_class(cls: type) -> type:
    if cls not in _SWITCHED:
        _SWITCHED[cls] = type(f"Selective{cls.__name__}", (cls,), {"forward": _selective_forward,
                                                                     "_schedc_switched": True})
    return _SWITCHED[cls]


def marked(module: nn.Module) -> list[nn.Module]:
    """The parts of ``module`` marked for selective recompute (class attribute ``schedc_selective``)."""
    return [m for m in module.modules() if getattr(m, "schedc_selective", False)]


def enable_selective(module: nn.Module) -> list[nn.Module]:
    """Switch the marked parts of ``module`` to their selective class (idempotent); returns them.
    They behave as before unless a forward runs inside ``dropping``."""
    parts = marked(module)
    for m in parts:
        if not getattr(type(m), "_schedc_switched", False):
            m.__class__ = _selective_class(type(m))
    return parts


@contextlib.contextmanager
def dropping(parts: Iterable[nn.Module], regions: list[Region]) -> Iterator[list[Region]]:
    """Inside the block, each call of a switched part (``enable_selective``) keeps only its inputs
    and appends its ``Region`` to ``regions``."""
    parts = list(parts)
    for m in parts:
        m._schedc_regions = regions
    try:
        yield regions
    finally:
        for m in parts:
            m._schedc_regions = None


# ---- offload ----


class Offloaded:
    """The tensors autograd saved during one forward (``pack`` / ``unpack`` are the
    ``saved_tensors_hooks``), on the device until ``offload``, on the host until ``reload``."""

    def __init__(self, device: torch.device, leave: set[int], stream=None):
        """``leave``: storage addresses to leave alone (parameters, the caller's input).
        ``stream``: the side CUDA stream of the copies (None on CPU)."""
        self.device, self.leave, self.stream = indexed(device), leave, stream
        self.tensors: list[torch.Tensor | None] | None = []  # on the device: what unpack hands over (once)
        self.host: list[torch.Tensor] = []  # while offloaded: one buffer per storage
        self.layout: list[tuple[int, int, torch.Size, tuple[int, ...], torch.dtype]] = []
        self.event = None  # CUDA: the last copy's completion
        self.nbytes = 0  # what the last offload moved

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in self.leave or t.device != self.device:
            return t  # not the runtime's to move: autograd keeps it as usual
        self.tensors.append(t.detach())
        return len(self.tensors) - 1

    def unpack(self, handle):
        if isinstance(handle, torch.Tensor):
            return handle
        if self.tensors is None:
            raise RuntimeError("a backward needs an offloaded activation that was not reloaded (an L before its B)")
        # Handed over, not kept: autograd frees a saved tensor once the node that used it has run,
        # and the box must not hold it past that (B's memory would not fall as it runs).
        t, self.tensors[handle] = self.tensors[handle], None
        if t is None:
            raise RuntimeError("an offloaded activation unpacked twice (a backward through the graph a second time)")
        return t

    def storages(self) -> set[int]:
        """The addresses of the device storages it holds (before ``offload``)."""
        return {t.untyped_storage().data_ptr() for t in self.tensors or ()}

    def offload(self) -> None:
        """Copy every saved storage to host memory once and drop the device copies."""
        tensors, self.tensors = self.tensors, None
        index: dict[int, int] = {}
        sources: list[torch.Tensor] = []
        self.layout = []
        for t in tensors:
            storage = t.untyped_storage()
            g = index.setdefault(storage.data_ptr(), len(index))
            if g == len(sources):
                sources.append(torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage))
            self.layout.append((g, t.storage_offset(), t.shape, t.stride(), t.dtype))
        del tensors
        self.nbytes = sum(s.numel() for s in sources)
        with self._copying():
            self.host = [self._host(s.numel()) for s in sources]
            for host, src in zip(self.host, sources):
                host.copy_(src, non_blocking=self.stream is not None)
                if self.stream is not None:
                    src.record_stream(self.stream)  # not reused by the allocator before the copy is done
        del sources  # the device memory goes now (on CUDA, for reuse after the copy)

    def reload(self) -> None:
        """Allocate the saved storages on the device again, copy them back, rebuild the saved views."""
        if self.tensors is not None:
            raise RuntimeError("a reload without its offload")
        # allocated on the compute stream, which uses them after the copy (``ready``)
        buffers = [torch.empty(h.numel(), dtype=torch.uint8, device=self.device) for h in self.host]
        with self._copying():
            for dev, host in zip(buffers, self.host):
                dev.copy_(host, non_blocking=self.stream is not None)
                if self.stream is not None:
                    dev.record_stream(self.stream)
        self.tensors = [torch.empty(0, dtype=dtype, device=self.device).set_(buffers[g].untyped_storage(), offset,
                                                                             shape, stride)
                        for g, offset, shape, stride, dtype in self.layout]
        if self.stream is None:
            self.host = []  # on CUDA the host buffers stay until ``ready`` (their copies may be running)

    def ready(self) -> None:
        """Before the backward: the compute stream waits for the reload (CUDA); nothing on CPU."""
        if self.tensors is None:
            raise RuntimeError("a backward before the reload of its offloaded activation")
        if self.event is not None:
            torch.cuda.current_stream(self.device).wait_event(self.event)
        self.host = []

    @contextlib.contextmanager
    def _copying(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # after what made (or last used) them
        with torch.cuda.stream(self.stream):
            yield
        self.event = torch.cuda.Event()
        self.event.record(self.stream)

    def _host(self, nbytes: int) -> torch.Tensor:
        if self.stream is not None:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        # CPU: outside torch's allocator (see the module notes), so not counted as activation memory
        return torch.frombuffer(bytearray(nbytes), dtype=torch.uint8)


def without_storage(x: torch.Tensor) -> None:
    """Replace the data of the stage input leaf ``x`` by one element expanded to its shape: B needs
    only the leaf (to be given its gradient), its values now live in the offloaded copy."""
    x.data = torch.empty(1, dtype=x.dtype, device=x.device).expand(x.shape)
