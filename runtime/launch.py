"""run_local: run a function in N fresh local processes that share a process group.

For tests and benchmarks on one machine (gloo on CPU by default). Real jobs use torchrun, which
needs none of this: ``PipelineRuntime`` only needs an initialised process group.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time
import traceback
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RankFailed(RuntimeError):
    """A rank raised: ``errors`` maps rank -> its traceback text; ``results`` has the others'."""

    def __init__(self, errors: dict[int, str], results: dict[int, Any]):
        first = min(errors)
        super().__init__(f"rank {first} failed:\n{errors[first]}")
        self.errors, self.results = errors, results


def run_local(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
              timeout: float = 600.0, threads: int | None = None, preload: Sequence[str] = ()) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes with the default
    process group initialised; return each rank's return value (saved with ``torch.save``, read
    with ``weights_only=True``: plain data and tensors). Raises RankFailed if any rank raised,
    TimeoutError (after killing them) if they are not done within ``timeout`` seconds.
    ``threads`` sets each process's torch threads (default: cores shared out). ``preload``:
    module names; if given, the ranks are forked from a server process that imported them once
    (``multiprocessing``'s forkserver, kept for the parent's lifetime) instead of each spawned
    afresh: a run starts in a fraction of a second, for many short runs (benchmarks/faults.py)."""
    threads = threads or max(1, (os.cpu_count() or 1) // world_size)
    # The parent hosts the key-value store, as torchrun's agent does: it outlives any rank.
    store, listener = loopback_store(world_size)
    port = store.port
    with listener, tempfile.TemporaryDirectory(prefix="schedc-") as tmp:
        ctx = mp.get_context("forkserver" if preload else "spawn")
        if preload:
            ctx.set_forkserver_preload(list(preload))
        procs = [
            ctx.Process(target=_child, args=(fn, r, world_size, args, backend, port, tmp, threads), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        if any(p.is_alive() for p in procs):
            for p in procs:
                p.kill()
            raise TimeoutError(f"ranks {[r for r, p in enumerate(procs) if p.is_alive()]} still running after {timeout:g} s")
        results, errors = {}, {}
        for r, p in enumerate(procs):
            out = Path(tmp) / f"rank{r}.pt"
            if not out.exists():
                errors[r] = f"exited with code {p.exitcode} and no result"
                continue
            status, value = torch.load(out, weights_only=True)
            (results if status == "ok" else errors)[r] = value
        if errors:
            raise RankFailed(errors, results)
        return [results[r] for r in range(world_size)]


def loopback_store(world_size: int) -> tuple[dist.TCPStore, socket.socket]:
    """A TCPStore server that listens on 127.0.0.1 only, on a free port. (Given the host
    "127.0.0.1", TCPStore still listens on every interface: it is handed a socket bound to the
    loopback instead.) Keep the returned socket open as long as the store. The store gets a
    duplicate of the socket's descriptor: it closes the one it is given when it is destroyed, which
    may be long after the socket is closed (a caught RankFailed's traceback holds ``run_local``'s
    frame, and with it the store), and by then the number may be another socket's."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    store = dist.TCPStore("127.0.0.1", listener.getsockname()[1], world_size, is_master=True,
                          wait_for_workers=False, master_listen_fd=os.dup(listener.fileno()))
    return store, listener


def _child(fn, rank, world_size, args, backend, port, tmp, threads) -> None:
    torch.set_num_threads(threads)
    # The process group's own listeners (gloo's pairs, NCCL's bootstrap) on the loopback
    # interface too, not on the interface the host name resolves to: these ranks talk only to
    # each other. A setting of the caller's is kept.
    loopback = _loopback_interface()
    if loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=datetime.timedelta(seconds=600))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=600))
    # Every rank has connected before any runs fn: a rank that returns (or dies) at once would
    # otherwise close its connections while another is still making its own (gloo then fails
    # in init_process_group, outside anything fn could attribute).
    if store.add("schedc/run_local/connected", 1) == world_size:
        store.set("schedc/run_local/all", "1")
    store.wait(["schedc/run_local/all"])
    try:
        result = ("ok", fn(rank, world_size, *args))
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback
        result = ("error", traceback.format_exc())
    torch.save(result, Path(tmp) / f"rank{rank}.pt")
    if result[0] == "ok":
        dist.destroy_process_group()
    else:
        os._exit(1)  # do not wait for peers in teardown: they may be waiting for us


def _loopback_interface() -> str | None:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), None if there is none."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)
