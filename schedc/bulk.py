"""Passes that build or walk millions of small objects at once (reading, simulating, lowering,
checking and writing a schedule of hundreds of thousands of ops).

Python's cyclic garbage collector runs each time allocations outnumber deallocations by a
threshold, and its older generations walk every tracked object held. A pass that builds a
million tuples therefore pays for many walks over everything it has built so far: reading a
393k-op schedule file took 11 s with the collector on and 7.7 s with it paused. None of these
passes makes reference cycles, so reference counting frees all they drop; ``paused_collector``
pauses the cyclic collector for the pass and restores it as it was.
"""

from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)


@contextmanager
def paused_collector() -> Iterator[None]:
    """The cyclic garbage collector paused inside the block, as it was after (nests)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def bulk(function: F) -> F:
    """``function`` run with the cyclic collector paused (``paused_collector``)."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        with paused_collector():
            return function(*args, **kwargs)

    return run  # type: ignore[return-value]
