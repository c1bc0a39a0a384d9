"""Fault injection at the transport seam, for tests and benchmarks (``tests/test_faults.py``,
``benchmarks/faults.py``): a ``TorchTransport`` that kills its process, or fails a post, at a
chosen call, and one that waits for a peer's death before it posts to it, so that "a peer died
just before this rank posted to it" happens by construction rather than by a race.

    install(FaultPlan(die="post", step=1))   # in the rank's process, before PipelineRuntime(...)
    rt = PipelineRuntime(..., transport="faulty")

Steps are counted by the transport's flushes (one per step, at STEP): step 0 is the first
``step()``, shape exchange included. ``dead(rank)`` is the store key a dying rank sets first.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from schedc.runtime.comm import TRANSPORTS, Pending, TorchTransport, posted


@dataclass(frozen=True)
class FaultPlan:
    """What this rank's transport does. ``die``: "post" (``os._exit(1)`` at the first send or
    receive of step ``step``, before posting it) or "flush" (at that step's flush, before its
    collectives). ``fail_post``: make the first post of step ``step`` fail as gloo does when the
    peer has closed the connection. ``wait_for``: a rank whose death this rank waits for before
    its first post to that rank in step ``step`` (at most ``patience`` seconds)."""

    die: str | None = None
    fail_post: bool = False
    wait_for: int | None = None
    step: int = 1
    patience: float = 30.0


_PLAN = FaultPlan()


def install(plan: FaultPlan) -> None:
    """Register ``"faulty"`` in TRANSPORTS with ``plan`` (this process's, for the runtimes it makes next)."""
    global _PLAN
    _PLAN = plan
    TRANSPORTS["faulty"] = FaultyTransport


def dead(rank: int) -> str:
    """The store key a rank that dies on purpose sets just before: "pid time" (``time.time()``)."""
    return f"schedc/faults/dead{rank}"


class FaultyTransport(TorchTransport):
    """TorchTransport doing what the installed FaultPlan says."""

    def __init__(self, group, timeout, stopped, *, threaded, release_on_caller=False):
        super().__init__(group, timeout, stopped, threaded=threaded, release_on_caller=release_on_caller)
        self.plan, self.flushes, self.posts = _PLAN, 0, 0
        self.rank = dist.get_rank(group)
        self._store = dist.distributed_c10d._get_default_store()

    def send(self, tensor: torch.Tensor, peer: int, tag: Any) -> None:
        if self._before_post(peer):
            return posted(tag, peer, _closed)
        super().send(tensor, peer, tag)

    def recv(self, buffer: torch.Tensor, peer: int, tag: Any) -> Pending:
        if self._before_post(peer):
            return posted(tag, peer, _closed)
        return super().recv(buffer, peer, tag)

    def flush(self) -> None:
        if self.plan.die == "flush" and self.flushes == self.plan.step:
            self._die()
        self.flushes += 1
        super().flush()

    def _before_post(self, peer: int) -> bool:
        """Die, or wait for ``peer``'s death, as planned; True: fail this post."""
        plan, now = self.plan, self.flushes == self.plan.step
        first = now and self.posts == 0
        if now:
            self.posts += 1
        if first and plan.die == "post":
            self._die()
        if now and plan.wait_for == peer and not getattr(self, "_waited", False):
            self._waited = True
            wait_for_death(self._store, peer, plan.patience)
        return first and plan.fail_post

    def _die(self) -> None:
        self._store.set(dead(self.rank), f"{os.getpid()} {time.time()}")
        os._exit(1)


def _closed():
    raise RuntimeError("[injected] Connection closed by peer")


def wait_for_death(store, rank: int, patience: float) -> None:
    """Wait until ``rank`` has set ``dead(rank)`` and its process has exited (its sockets closed),
    then a little longer, so that the peer's end of the connection has seen it."""
    deadline = time.monotonic() + patience
    while not store.check([dead(rank)]):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    pid = int(store.get(dead(rank)).split()[0])
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.01)
    time.sleep(0.2)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has exited: its descriptors are closed)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        if os.path.isdir("/proc"):
            return False
    try:
        os.kill(pid, 0)  # not Linux: a zombie still counts as running, until the patience ends
    except ProcessLookupError:
        return False
    return True
