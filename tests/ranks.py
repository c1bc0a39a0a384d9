"""Multi-rank runs in the tests: ``runtime.launch.run_local`` with its ranks forked from one
server process per pytest worker that has imported torch and the runtime once (``preload``),
instead of spawned afresh. A spawned rank spends seconds importing torch, so a four-rank run
costs some 10-20 s on two cores before it does anything; forked, well under one.

Every forkserver of a process is one and the same (multiprocessing keeps one per process, and
the first to start it fixes what it imports), so every test that forks, test_bad_inputs'
harness included, names this one list. tests/test_launch.py keeps the spawned default."""

from __future__ import annotations

from typing import Any, Callable

from schedc.runtime import launch

PRELOAD = [
    "torch", "torch.distributed", "torch._dynamo", "schedc.runtime.interpreter", "schedc.runtime.faults",
    "schedc.app.cli", "click.testing",
]


def run_local(fn: Callable[..., Any], world_size: int, *args: Any, **kwargs: Any) -> list[Any]:
    """``launch.run_local`` with the ranks forked from the preloaded server."""
    kwargs.setdefault("preload", PRELOAD)
    return launch.run_local(fn, world_size, *args, **kwargs)
