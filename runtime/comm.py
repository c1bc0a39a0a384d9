"""Point-to-point transfers between pipeline ranks: the runtime's one seam for moving tensors.

``Transport`` is the interface the interpreter calls; ``TRANSPORTS`` names the implementations.
``TorchTransport`` posts sends and receives on the pipeline's process group and waits for them:

- ``send(tensor, peer, tag)``: posts the send and keeps the buffer only until the transfer is
  done, so memory follows the schedule (a boundary tensor is not held to the optimizer step).
- ``recv(buffer, peer, tag)`` posts a receive; ``wait(pending, tag)`` waits for it.
- ``flush()`` waits for every send (at the optimizer step).
- ``all_reduce`` / ``all_gather`` post a collective (the gradient norm, the trace); ``wait``
  waits for it like a receive.

Every failure of these calls is raised as ``TransferFailed`` (posting included: a peer that
closed its connections before a send or receive to it is posted makes gloo raise at once) or
``Stopped``, never as the backend's own error; the interpreter turns both into its
``PipelineError`` naming the rank that failed.

Waiting has a deadline (``timeout``) and stops early when ``stopped()`` says another rank has
failed (checked every ``POLL`` seconds while a wait lasts), so a rank whose peer raised and
stayed alive does not sit out its whole timeout.

gloo: a transfer's completion is seen only by ``wait()`` (``is_completed()`` stays false until
then, and a wait can be neither interrupted nor given up and resumed). So blocking waits run on
helper threads: one waits for sends in posting order and drops each buffer when its transfer is
done; another waits for the receive the interpreter needs, while the interpreter's thread waits
on an event in POLL slices and checks ``stopped()`` between them. After a failure the runtime is
not used again (a receive may still be pending on the helper thread).

NCCL: ``wait()`` does not block the host (it makes the current stream wait for the transfer's
stream), and the process group holds each sent tensor until its transfer has completed; sends
are dropped here once ``is_completed()``. Blocking happens in CUDA, under NCCL's own timeout.
"""

from __future__ import annotations

import atexit
import datetime
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

POLL = 0.25  # seconds between checks of ``stopped()`` while a wait lasts


class TransferFailed(RuntimeError):
    """A transfer failed: the peer died or closed the connection, or the timeout passed.
    ``posting``: it failed as it was posted (else while it was waited for). ``peer`` is -1 for
    a collective."""

    def __init__(self, tag: Any, peer: int, cause: str, posting: bool = False):
        super().__init__(cause)
        self.tag, self.peer, self.cause, self.posting = tag, peer, cause, posting


class Stopped(RuntimeError):
    """Another rank reported a failure while this one waited."""

    def __init__(self, tag: Any, peer: int):
        super().__init__(f"stopped while waiting for rank {peer}")
        self.tag, self.peer = tag, peer


def describe(e: BaseException) -> str:
    """A backend's exception in one line: its type and the start of its message."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def posted(tag: Any, peer: int, post: Callable[[], Any]) -> Any:
    """``post()`` (a non-blocking send, receive or collective); its failure as TransferFailed."""
    try:
        return post()
    except Exception as e:  # noqa: BLE001 - gloo and NCCL raise RuntimeError subclasses
        raise TransferFailed(tag, peer, describe(e), posting=True) from None


class Pending:
    """A posted receive (or send, or collective) and what waiting for it found. ``what`` names a
    collective in errors (e.g. "the gradient-norm all-reduce"); ``peer`` is -1 for one."""

    __slots__ = ("work", "peer", "done", "error", "what")

    def __init__(self, work, peer: int, what: str = ""):
        self.work, self.peer, self.what = work, peer, what
        self.done = threading.Event()
        self.error: str | None = None


class Transport:
    """The seam between the interpreter and whatever moves tensors between ranks. The
    interpreter's opcodes call only these methods; a transport is built as
    ``cls(group, timeout, stopped, threaded=..., release_on_caller=...)`` (see TorchTransport)
    and registered in TRANSPORTS under the name ``PipelineRuntime(..., transport=NAME)`` takes.
    The ranks' SENDs and RECVs between two ranks list the same messages in the same order (the
    Program guarantees it), so a transport may match them by their order alone.

    Each method raises TransferFailed or Stopped when it fails (``posted`` wraps a post);
    anything else it raises is still attributed by the interpreter, as a transport's bug.
    ``tag`` is opaque here: the interpreter's (instruction index, instruction, step)."""

    def send(self, tensor: torch.Tensor, peer: int, tag: Any) -> None:
        """Post the transfer of ``tensor`` to ``peer`` (a rank of the group); do not wait."""
        raise NotImplementedError

    def recv(self, buffer: torch.Tensor, peer: int, tag: Any) -> Pending:
        """Post a receive from ``peer`` into ``buffer``; ``wait`` completes it."""
        raise NotImplementedError

    def wait(self, pending: Pending, tag: Any) -> None:
        """Wait for a posted receive, or for a collective's work (``Pending(work, -1)``); raise
        TransferFailed (or Stopped, when ``stopped()`` turns true while waiting)."""
        raise NotImplementedError

    def flush(self) -> None:
        """Wait for every send posted so far (at the optimizer step)."""
        raise NotImplementedError

    def release(self) -> None:
        """Free, on the caller's thread, what completed sends still hold (may do nothing)."""

    def in_flight(self) -> int:
        """How many posted sends may still hold their buffer (0 for a transport whose sends
        complete when posted)."""
        return 0

    def close(self) -> None:
        """Stop whatever the transport runs beside the caller (may do nothing); it is not used again."""

    # Collectives on a process group of the caller's (every rank of it calls them in the same
    # order); by default torch.distributed's asynchronous ones, waited for with ``wait``.

    def all_reduce(self, tensor: torch.Tensor, group, tag: Any) -> Pending:
        """Post a sum all-reduce of ``tensor`` in place over ``group``."""
        return Pending(posted(tag, -1, lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group,
                                                                async_op=True)), -1)

    def all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor, group, tag: Any) -> Pending:
        """Post an all-gather of ``tensor`` into ``outputs`` (one per rank of ``group``)."""
        return Pending(posted(tag, -1, lambda: dist.all_gather(outputs, tensor, group=group, async_op=True)), -1)


class TorchTransport(Transport):
    """torch.distributed's point-to-point ``isend`` / ``irecv`` on the pipeline's process group
    (gloo or NCCL)."""

    def __init__(self, group, timeout: float, stopped: Callable[[], bool], *, threaded: bool,
                 release_on_caller: bool = False):
        """``group``: the process group (None: the world); peers are ranks in it. ``threaded``:
        wait on helper threads (gloo), else in place (NCCL). ``release_on_caller``: a completed
        send's buffer is freed by the next ``release()`` on the caller's thread, not on the
        helper thread (for ``schedc.runtime.memory``, whose CPU profiler sees one thread only)."""
        self.group, self.timeout, self.stopped, self.threaded = group, timeout, stopped, threaded
        self.release_on_caller = release_on_caller
        self._released: list[torch.Tensor] = []  # completed sends' buffers, for release()
        world = dist.get_world_size(group)
        self._global = [dist.get_global_rank(group, r) if group is not None else r for r in range(world)]
        self._sends: list[tuple[Pending, torch.Tensor | None, Any]] = []  # NCCL: in flight; gloo: waited for
        self._lock = threading.Lock()
        self._send_queue: queue.SimpleQueue | None = None
        self._recv_queue: queue.SimpleQueue | None = None
        self._helpers: list[threading.Thread] = []

    # ---- posting ----

    def send(self, tensor: torch.Tensor, peer: int, tag: Any) -> None:
        work = posted(tag, peer, lambda: dist.isend(tensor, self._global[peer], group=self.group))
        pending = Pending(work, peer)
        if not self.threaded:
            self._sends = [s for s in self._sends if not s[0].work.is_completed()]
            self._sends.append((pending, tensor, tag))
            return
        with self._lock:
            self._sends.append((pending, None, tag))
        self._start("_send_queue", self._send_loop).put((pending, tensor, tag))

    def release(self) -> None:
        """Free (on this thread) the buffers of sends completed so far (``release_on_caller``)."""
        with self._lock:
            self._released.clear()

    def in_flight(self) -> int:
        """Sends whose buffer is not yet dropped: on gloo, those the helper thread has not yet
        seen complete (``done`` is set after the buffer goes); on NCCL, those not completed."""
        with self._lock:
            if self.threaded:
                return sum(not pending.done.is_set() for pending, _, _ in self._sends)
            return sum(not pending.work.is_completed() for pending, _, _ in self._sends)

    def recv(self, buffer: torch.Tensor, peer: int, tag: Any) -> Pending:
        return Pending(posted(tag, peer, lambda: dist.irecv(buffer, self._global[peer], group=self.group)), peer)

    # ---- waiting ----

    def wait(self, pending: Pending, tag: Any) -> None:
        """Wait for a posted receive (or send); raises TransferFailed or Stopped."""
        if not self.threaded:
            self._wait_here(pending)
        else:
            self._start("_recv_queue", self._recv_loop).put(pending)
            self._until_done(pending, tag)
        if pending.error is not None:
            raise TransferFailed(tag, pending.peer, pending.error)

    def flush(self) -> None:
        """Wait for every send posted so far; raises as ``wait`` does, for the first that failed."""
        with self._lock:
            sends, self._sends = self._sends, []
        for pending, _, tag in sends:
            if self.threaded:
                self._until_done(pending, tag)
            else:
                self._wait_here(pending)
            if pending.error is not None:
                raise TransferFailed(tag, pending.peer, pending.error)

    def _until_done(self, pending: Pending, tag: Any) -> None:
        deadline = time.monotonic() + self.timeout + 2 * POLL  # the helper's own wait ends by the timeout
        while not pending.done.wait(POLL):
            if self.stopped():
                raise Stopped(tag, pending.peer)
            if time.monotonic() > deadline:
                pending.error = f"no answer within {self.timeout:g} s"
                return

    def _wait_here(self, pending: Pending, signal: bool = True) -> None:
        try:
            pending.work.wait(datetime.timedelta(seconds=self.timeout))
        except Exception as e:  # noqa: BLE001 - gloo and NCCL raise RuntimeError subclasses
            pending.error = describe(e)
        if signal:
            pending.done.set()

    # ---- helper threads (gloo) ----

    def _start(self, name: str, loop: Callable[[queue.SimpleQueue], None]) -> queue.SimpleQueue:
        q = getattr(self, name)
        if q is None:
            q = queue.SimpleQueue()
            setattr(self, name, q)
            helper = threading.Thread(target=loop, args=(q,), name=f"schedc{name}", daemon=True)
            helper.start()
            if not self._helpers:  # ended before the interpreter's teardown, even where close() is never called
                atexit.register(self.close)
            self._helpers.append(helper)
        return q

    def close(self) -> None:
        """End the helper threads, each once the wait it is in (if any) is over; after a failure
        (``stopped()``) they are not waited for. A helper left to the interpreter's teardown,
        still holding the transport's works, can abort the process as it exits ("terminate
        called without an active exception")."""
        helpers, self._helpers = self._helpers, []
        for name in ("_send_queue", "_recv_queue"):
            if (q := getattr(self, name)) is not None:
                q.put(None)
                setattr(self, name, None)
        if not self.stopped():
            for helper in helpers:
                helper.join(self.timeout)
        if helpers:
            atexit.unregister(self.close)

    def _send_loop(self, q: queue.SimpleQueue) -> None:
        for pending, tensor, tag in iter(q.get, None):  # (None: close())
            self._wait_here(pending, signal=False)
            pending.work = None  # gloo's work holds the tensor too
            if self.release_on_caller:
                with self._lock:
                    self._released.append(tensor)
            del tensor  # the buffer goes as soon as its transfer is done (or at release())
            pending.done.set()  # after the hand-over: a release() after flush() frees it

    def _recv_loop(self, q: queue.SimpleQueue) -> None:
        for pending in iter(q.get, None):
            self._wait_here(pending)
            del pending  # (its work holds the receive's buffer: not kept while the next is awaited)


# name -> transport class, for PipelineRuntime(..., transport=NAME)
TRANSPORTS: dict[str, type[Transport]] = {"torch": TorchTransport}
