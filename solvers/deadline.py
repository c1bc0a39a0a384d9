"""Keeping ``schedc solve`` within its wall-clock limit.

Every time limit in ``solvers/`` is a ``Budget``: the moment it runs out on the monotonic clock
(``time.perf_counter()``), what is left of it, a share of it for one step, and the time a caller
keeps for itself after the solve, counted in simulations of the problem (what writing a schedule
file costs scales with them). Two tools let the steps of a solve stop when their budget runs out:

- ``Worker`` runs a generator in a forked child process with a process group of its own and
  hands its items over one at a time; when the budget runs out it kills the group (the child and
  any CBC the child started). Building the searched heuristic schedules and the ILP model of a
  large problem are plain Python loops that nothing can interrupt in place, and one of them alone
  can outlast a short limit (several seconds at p = 32, m = 256); in a child they can be stopped.
  Small problems, and platforms other than Linux (no safe fork), run the generator in this
  process instead: the caller still checks the budget between items.
- ``schedc.solvers.search.cbc.run_cbc`` runs CBC under a watchdog that uses the same budget.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import os
import signal
import sys
import time
import traceback
import weakref
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from schedc.problem import Problem

LATE = object()  # Worker.next: the budget ran out before the item (the child has been stopped)
END = object()  # Worker.next: the generator is exhausted
PR_SET_PDEATHSIG = 1  # prctl(2)
WORKER_OPS = 300  # above this many ops, schedules and models are built in a child process a budget can stop


@dataclass(frozen=True)
class Budget:
    """Wall-clock time for a solve or one step of it.

    ``end`` is the ``time.perf_counter()`` reading at which it runs out (``math.inf``: never).
    ``kept`` is time the caller keeps for itself after the solve, in simulations of the problem,
    before the end of the whole budget (``whole``; a share of a budget keeps its whole's): it is
    taken off only once a simulation's cost is known (``usable``)."""

    end: float
    kept: float = 0.0
    whole: float | None = None  # the whole budget's end, for a share of it; None: this is the whole

    @classmethod
    def seconds(cls, seconds: float, *, since: float | None = None, kept: float = 0.0) -> Budget:
        """``seconds`` from now, or from ``since`` (an earlier ``time.perf_counter()`` reading)."""
        return cls((time.perf_counter() if since is None else since) + seconds, kept)

    @classmethod
    def unlimited(cls) -> Budget:
        return cls(math.inf)

    @property
    def limited(self) -> bool:
        return self.end < math.inf

    def left(self) -> float:
        """Seconds left (0 once it has run out)."""
        return max(0.0, self.end - time.perf_counter())

    def expired(self) -> bool:
        return time.perf_counter() >= self.end

    def share(self, fraction: float) -> Budget:
        """The first ``fraction`` of what is left now (the time kept stays the whole's)."""
        now = time.perf_counter()
        return Budget(min(self.end, now + fraction * max(0.0, self.end - now)), self.kept, self._whole)

    def less(self, seconds: float) -> Budget:
        """Runs out ``seconds`` earlier (kept for a last step: reading a solution, a simulation)."""
        return replace(self, end=self.end - seconds)

    def at_most(self, seconds: float) -> Budget:
        """Runs out no later than ``seconds`` from now."""
        return replace(self, end=min(self.end, time.perf_counter() + seconds))

    def at_least(self, seconds: float) -> Budget:
        """Runs out no earlier than ``seconds`` from now."""
        return replace(self, end=max(self.end, time.perf_counter() + seconds))

    def earlier(self, other: Budget) -> Budget:
        """Whichever of the two runs out first."""
        return self if self.end <= other.end else other

    def usable(self, simulation: float) -> Budget:
        """What a step may use, one simulation of the problem costing ``simulation`` seconds:
        this budget, less the time kept for the caller (which it then no longer counts)."""
        return Budget(min(self.end, self._whole - self.kept * simulation))

    @property
    def _whole(self) -> float:
        return self.end if self.whole is None else self.whole


def in_child(problem: Problem) -> bool:
    """Whether a problem is large enough (more than WORKER_OPS ops) for its schedules and models
    to be built in a child process (a Worker) that its budget can stop mid-build."""
    return problem.n_stages * problem.microbatches * 3 > WORKER_OPS


class WorkerDied(RuntimeError):
    """The child process ended without a word (killed from outside, out of memory, a crash)."""


def can_fork() -> bool:
    """Linux (fork is safe there), and not a daemonic process (which may have no children)."""
    return (
        sys.platform.startswith("linux")
        and "fork" in multiprocessing.get_all_start_methods()
        and not multiprocessing.current_process().daemon
    )


class Worker:
    """``fn(*args)``, a generator, run in a child process (``child=True`` and Linux) or here.

    ``next(budget)`` returns its next item, ``END`` when it is exhausted, or ``LATE`` when
    ``budget`` (None waits for ever) runs out first, in which case the child is killed (or, with
    ``pause=True``, paused until the next ``next``). Run here,
    ``next`` cannot stop an item half way and ignores ``budget``.
    An exception in the generator is raised again by ``next``. Use it as a context manager:
    leaving the block kills whatever is still running."""

    def __init__(self, fn: Callable[..., Iterator], args: tuple, *, child: bool):
        self._name = getattr(fn, "__name__", "worker")
        self._proc = self._conn = self._gen = None
        self._paused = False
        if child and can_fork():
            ctx = multiprocessing.get_context("fork")
            self._conn, send = ctx.Pipe(duplex=False)
            self._proc = ctx.Process(target=_child_main, args=(send, fn, args, os.getpid()), daemon=True)
            self._proc.start()
            send.close()
            try:  # also in the child: whichever runs first makes the group
                os.setpgid(self._proc.pid, self._proc.pid)
            except OSError:
                pass
            # A Worker never stopped (an exception, an interpreter that exits) still kills its
            # group: a paused one would otherwise outlive this process, and multiprocessing's
            # own exit (SIGTERM, then join) would wait on it for ever.
            self._finalizer = weakref.finalize(self, _to_group, self._proc.pid, signal.SIGKILL)
        else:
            self._gen = fn(*args)

    @property
    def in_child(self) -> bool:
        return self._proc is not None

    def next(self, budget: Budget | None = None, *, pause: bool = False):
        """The next item; ``pause``: where ``budget`` runs out first, the child is paused, not
        killed (SIGSTOP to its group), and the next call goes on where it stopped."""
        if self._gen is not None:
            return next(self._gen, END)
        if self._conn is None:
            return END
        if self._paused:
            _to_group(self._proc.pid, signal.SIGCONT)
            self._paused = False
        wait = None if budget is None else budget.left()
        if not self._conn.poll(wait):
            if pause:
                _to_group(self._proc.pid, signal.SIGSTOP)
                self._paused = True
            else:
                self.stop()
            return LATE
        try:
            tag, value = self._conn.recv()
        except EOFError:
            code = self._proc.exitcode if self._proc is not None else None
            self.stop()
            raise WorkerDied(f"the child process running {self._name} died (exit code {code})") from None
        if tag == "item":
            return value
        self.stop()
        if tag == "end":
            return END
        raise value

    def stop(self) -> None:
        if self._gen is not None:
            self._gen.close()
            self._gen = None
        if self._proc is not None:
            _to_group(self._proc.pid, signal.SIGKILL)  # (a paused child too: SIGKILL needs no SIGCONT)
            self._proc.join()
            self._conn.close()
            self._proc = self._conn = None
            self._finalizer.detach()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _to_group(pid: int, signum: int) -> None:
    """``signum`` to a worker's process group and to the worker (its group may not be made yet)."""
    for send in (os.killpg, os.kill):
        try:
            send(pid, signum)
        except OSError:  # no such group (or process): nothing there to signal
            pass


def _child_main(conn, fn, args, parent: int) -> None:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (not the `schedc` program's handler, which ends a solve cleanly)
    _die_with_parent(parent)
    try:
        for item in fn(*args):
            conn.send(("item", item))
        conn.send(("end", None))
    except BaseException as e:  # noqa: BLE001 (handed to the parent, which raises it)
        try:
            conn.send(("error", e))
        except Exception:  # an exception that does not pickle
            conn.send(("error", RuntimeError(traceback.format_exc())))
    finally:
        conn.close()


def _prctl() -> Callable[..., int] | None:
    """libc's prctl(2), looked up once (None where there is none: not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl() if sys.platform.startswith("linux") else None


def _die_with_parent(parent: int) -> None:
    """Linux: this process is killed when its parent (pid ``parent``) ends, however it ends
    (PR_SET_PDEATHSIG), so that a solve killed from outside leaves no worker behind, paused or running."""
    if _PRCTL is None:  # no prctl here: as before, the worker ends when its pipe breaks
        return
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent ended before the request was made
        os._exit(1)


def dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that makes the program it starts (CBC) die with
    this process, however it ends (Linux; None elsewhere): killed from outside, this process leaves
    no solver running. What runs in the child between fork and exec is one call to the prctl
    looked up beforehand (nothing that takes a lock another thread may hold at the fork)."""
    if _PRCTL is None:
        return None
    parent = os.getpid()
    return lambda: _die_with_parent(parent)
