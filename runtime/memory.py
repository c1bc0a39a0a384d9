"""Activation memory of one rank, measured per instruction over a step
(``PipelineRuntime(..., measure_memory=True)``).

For each instruction of the step: the level after it and the peak during it, in bytes,
relative to the level at the start of the step (so parameters, optimizer state and anything
allocated before the step are not counted).

    meter = MemoryMeter(device, params)      # params: this rank's parameters (for their .grad)
    meter.start()                            # at the start of the step
    for k, instr in enumerate(program):
        with meter.instruction(k, counted=instr.op != "STEP"):
            ...                              # run the instruction
    meter.stop()                             # -> [(after, peak), ...] in bytes, one per instruction

How, per device:

- CUDA: ``torch.cuda.memory_allocated`` after each instruction and ``max_memory_allocated``
  during it (``reset_peak_memory_stats`` before it); host-side counters of the caching
  allocator, no synchronisation needed.
- CPU: torch keeps no CPU allocator statistics, so the step runs under ``torch.profiler`` with
  ``profile_memory=True`` and each instruction in a ``record_function`` range; the profiler's
  ``[memory]`` events (bytes allocated or freed, with the address) are read back from its
  Chrome trace after the step and summed in time order. The profiler records allocations and
  frees of the thread that started it only (``profile_all_threads`` drops memory events on this
  torch), so the transport must free send buffers on the interpreter's thread
  (``Transport(..., release_on_caller=True)``: at the end of the instruction during which the
  transfer completed, instead of on gloo's helper thread at once; the measurement shows a send
  buffer up to one instruction longer than the run without it holds it). Autograd on CPU runs
  on the calling thread, and gloo receives into the buffer the interpreter allocated.

What is excluded:

- parameter gradients: every ``.grad`` storage that appears during the step (created at a
  stage's first B or W when the optimizer set the gradients to None) is taken out of the
  level from the point it is allocated: on CPU exactly (its allocation event is dropped,
  matched by address); on CUDA its bytes are subtracted from the level after the instruction
  that created it and from that instruction's peak (so that peak may be understated by at most
  the new gradients, if the peak came before them). Gradients accumulated in place allocate
  nothing lasting.
- the optimizer step: the ``STEP`` instruction is not measured (``counted=False``); its entry
  repeats the level before it.

What is counted is everything else this rank's interpreter allocates: tensors autograd saves,
stage outputs held for B, what B keeps for W, receive buffers from their RECV, send buffers
until their transfer completes, and transient working memory inside an op (in the peaks).
Overhead: nothing unless measuring; on CPU the profiler slows the step (every op is recorded)
and reading its trace takes a moment after the step.

torch's profiler (kineto) writes a line to the process's stderr each time it starts and stops
(``USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start``): 40-48 such lines went between
``schedc profile``'s own. ``native_chatter_hidden`` keeps them out: stderr's file descriptor goes to
a temporary file while the profiler starts or stops, and every other line written meanwhile is
written back to stderr after.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator

import torch

from schedc.runtime.dtensor import local

_RANGE = "schedc.instr."  # record_function name prefix: schedc.instr.K
# kineto's line at each start and stop of torch's profiler: chatter, not a message for the user
_CHATTER = re.compile(rb"^USDT:.*\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def native_chatter_hidden() -> Iterator[None]:
    """While the body runs, what C++ code writes to stderr (file descriptor 2) goes to a temporary
    file; after it, every line but torch profiler's start and stop chatter (``_CHATTER``) is written
    to stderr: the chatter is dropped, anything else (a real error, a line of schedc's) kept."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr to redirect: nothing to hide
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not _CHATTER.match(line)]
            if kept:
                os.write(2, b"".join(kept))


class MemoryMeter:
    def __init__(self, device: torch.device, params: Iterable[torch.Tensor]):
        self.device = torch.device(device)
        self.params = list(params)
        self.cuda = self.device.type == "cuda"
        self.results: list[tuple[int, int]] = []  # (after, peak) bytes per instruction of the last step

    # ---- the step ----

    def start(self) -> None:
        self._grads0 = self._grad_storages()
        self._new_grads: dict[int, tuple[int, int]] = {}  # storage ptr -> (instruction k, nbytes)
        self._counted: list[bool] = []
        if self.cuda:
            self._base = torch.cuda.memory_allocated(self.device)
            self._rows: list[tuple[int, int]] = []
            self._level = 0
        else:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            with native_chatter_hidden():
                self._prof.__enter__()

    @contextlib.contextmanager
    def instruction(self, k: int, counted: bool = True) -> Iterator[None]:
        """Measure instruction ``k`` (``counted=False``: not measured, e.g. the optimizer step)."""
        self._counted.append(counted)
        if self.cuda:
            if counted:
                torch.cuda.reset_peak_memory_stats(self.device)
            yield
            if not counted:
                self._rows.append((self._level, self._level))
                return
            new = self._note_grads(k)
            after = torch.cuda.memory_allocated(self.device) - self._base - new
            peak = torch.cuda.max_memory_allocated(self.device) - self._base - new
            self._rows.append((after, max(peak, after)))
            self._level = after
        else:
            with torch.profiler.record_function(f"{_RANGE}{k}"):
                yield
            if counted:
                self._note_grads(k)

    def stop(self, discard: bool = False) -> list[tuple[int, int]]:
        """End of the step: per instruction (level after, peak during) in bytes (``discard``: the
        step failed; nothing is read and the result is empty)."""
        if self.cuda:
            self.results = [] if discard else self._rows
            return self.results
        with native_chatter_hidden():
            self._prof.__exit__(None, None, None)
        if discard:
            self._prof, self.results = None, []
            return self.results
        fd, path = tempfile.mkstemp(suffix=".json", prefix="schedc-memory-")
        os.close(fd)
        try:
            self._prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        finally:
            os.unlink(path)
            self._prof = None
        self.results = levels(events, self._counted, {p: k for p, (k, _) in self._new_grads.items()})
        return self.results

    # ---- gradients ----

    def _grad_storages(self) -> dict[int, int]:
        out = {}
        for p in self.params:
            if p.grad is not None:
                st = local(p.grad).untyped_storage()  # a DTensor's: this rank's shard
                out[st.data_ptr()] = st.nbytes()
        return out

    def _note_grads(self, k: int) -> int:
        """Record gradient storages new since the step started; returns the bytes of all of them."""
        for ptr, nbytes in self._grad_storages().items():
            if ptr not in self._grads0 and ptr not in self._new_grads:
                self._new_grads[ptr] = (k, nbytes)
        return sum(n for _, n in self._new_grads.values())


def levels(events: list[dict], counted: list[bool], grads: dict[int, int]) -> list[tuple[int, int]]:
    """From a profiler Chrome trace: per instruction (after, peak) in bytes relative to the
    start. ``counted[k]``: whether instruction k is measured (else it repeats the level before
    it, and what it allocates or frees is ignored). ``grads``: gradient storage address -> the
    instruction after which it was first seen; its last allocation at or before the end of
    that instruction is dropped (it is not activation memory)."""
    windows: dict[int, tuple[float, float]] = {}
    mem = []
    for e in events:
        name = e.get("name", "")
        if name == "[memory]":
            args = e.get("args", {})
            if args.get("Device Type", 0) == 0:  # CPU
                mem.append((float(e["ts"]), int(args["Bytes"]), int(args.get("Addr", 0))))
        elif isinstance(name, str) and name.startswith(_RANGE) and e.get("ph") == "X":
            k = int(name[len(_RANGE):])
            windows[k] = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
    missing = [k for k in range(len(counted)) if k not in windows]
    if missing:
        raise RuntimeError(f"the profiler's trace has no range for instructions {missing[:5]}")
    mem.sort(key=lambda t: t[0])
    # the events to drop: each new gradient's last allocation before the end of its instruction
    allocs: dict[int, list[int]] = {}
    for i, (ts, b, a) in enumerate(mem):
        if b > 0 and a in grads:
            allocs.setdefault(a, []).append(i)
    drop: set[int] = set()
    for addr, k in grads.items():
        end = windows[k][1]
        hits = [i for i in allocs.get(addr, ()) if mem[i][0] <= end]
        if hits:
            drop.add(hits[-1])
    out: list[tuple[int, int]] = []
    level, i = 0, 0
    for k, ok in enumerate(counted):
        start, end = windows[k]
        while i < len(mem) and mem[i][0] < start:  # between instructions: part of the next level
            if i not in drop:
                level += mem[i][1]
            i += 1
        peak = level
        before = level
        while i < len(mem) and mem[i][0] <= end:
            if i not in drop:
                level += mem[i][1]
                peak = max(peak, level)
            i += 1
        if ok:
            out.append((level, peak))
        else:
            level = before
            out.append((level, level))
    return out


class SavedBytes:
    """The CPU measure of activation memory: the bytes of the tensors autograd saves for backward
    while ``hooks()`` is active (``saved_tensors_hooks``), each storage counted once, whole, and the
    ``exclude`` storages (the parameters) not at all. ``nbytes`` grows as forwards run under it.
    What this rank holds: a DTensor counts its local shard (its own storage is the whole tensor's,
    which no rank holds)."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self.exclude = {local(t).untyped_storage().data_ptr() for t in exclude}
        self.saved: dict[int, int] = {}

    def add(self, t: torch.Tensor) -> torch.Tensor:
        """Count ``t``'s storage (autograd's pack hook; also for tensors kept outside autograd)."""
        storage = local(t).untyped_storage()
        if storage.data_ptr() not in self.exclude:
            self.saved[storage.data_ptr()] = storage.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.add, lambda t: t)

    @property
    def nbytes(self) -> int:
        return sum(self.saved.values())
