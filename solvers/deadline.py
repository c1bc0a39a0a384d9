"""Keeping ``schedc solve`` within its wall-clock limit.

A deadline is a ``time.perf_counter()`` value. Two tools let the steps of a solve stop at one:

- ``Worker`` runs a generator in a forked child process with a process group of its own and
  hands its items over one at a time; at the deadline it kills the group (the child and any CBC
  the child started). Building the searched heuristic schedules and the ILP model of a large
  problem are plain Python loops that nothing can interrupt in place, and one of them alone can
  outlast a short limit (several seconds at p = 32, m = 256); in a child they can be stopped.
  Small problems, and platforms other than Linux (no safe fork), run the generator in this
  process instead: the caller still checks the deadline between items.
- ``run_cbc`` runs CBC on the model PuLP writes, under a watchdog. CBC checks its ``-sec``
  limit only between nodes of its search, so root processing can overrun it by minutes. At the
  deadline CBC is interrupted (it then stops searching and writes its incumbent) and, if it has
  not stopped shortly after, killed. A killed CBC writes no solution: the caller keeps its warm
  start and says "time limit".
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Iterator

LATE = object()  # Worker.next: the deadline came before the item (the child has been stopped)
END = object()  # Worker.next: the generator is exhausted


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

    ``next(until)`` returns its next item, ``END`` when it is exhausted, or ``LATE`` when
    ``until`` (a ``time.perf_counter()`` value; None waits for ever) passes first, in which case
    the child is killed. Run here, ``next`` cannot stop an item half way and ignores ``until``.
    An exception in the generator is raised again by ``next``. Use it as a context manager:
    leaving the block kills whatever is still running."""

    def __init__(self, fn: Callable[..., Iterator], args: tuple, *, child: bool):
        self._name = getattr(fn, "__name__", "worker")
        self._proc = self._conn = self._gen = None
        if child and can_fork():
            ctx = multiprocessing.get_context("fork")
            self._conn, send = ctx.Pipe(duplex=False)
            self._proc = ctx.Process(target=_child_main, args=(send, fn, args), daemon=True)
            self._proc.start()
            send.close()
            try:  # also in the child: whichever runs first makes the group
                os.setpgid(self._proc.pid, self._proc.pid)
            except OSError:
                pass
        else:
            self._gen = fn(*args)

    @property
    def in_child(self) -> bool:
        return self._proc is not None

    def next(self, until: float | None = None):
        if self._gen is not None:
            return next(self._gen, END)
        if self._conn is None:
            return END
        wait = None if until is None else max(0.0, until - time.perf_counter())
        if not self._conn.poll(wait):
            self.stop()
            return LATE
        try:
            kind, value = self._conn.recv()
        except EOFError:
            code = self._proc.exitcode if self._proc is not None else None
            self.stop()
            raise WorkerDied(f"the child process running {self._name} died (exit code {code})") from None
        if kind == "item":
            return value
        self.stop()
        if kind == "end":
            return END
        raise value

    def stop(self) -> None:
        if self._gen is not None:
            self._gen.close()
            self._gen = None
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except OSError:  # no such group: the child has not made it (then it started nothing)
                pass
            self._proc.kill()
            self._proc.join()
            self._conn.close()
            self._proc = self._conn = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _child_main(conn, fn, args) -> None:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
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


# ---- CBC under a watchdog ----

INTERRUPT_GRACE = 1.0  # seconds between interrupting CBC and killing it (at most 20% of the time left)
MIN_SECONDS = 0.5  # CBC is not started with less time than this left


def run_cbc(lp, cmd, deadline: float, log: Path) -> str:
    """Solve the PuLP problem ``lp`` with ``cmd`` (a ``pulp.PULP_CBC_CMD``: its path and options
    are used, its time limit is not), warm-started from the variables' initial values, so that
    CBC is gone by ``deadline``. Assigns the solution to ``lp``'s variables and status as
    ``lp.solve`` would, and returns "" or why the time limit stopped CBC: "time limit (cbc
    interrupted)", or, with no solution assigned, "time limit (cbc killed)" or "time limit (no
    time left for cbc)". CBC's output goes to ``log``; its model and solution files beside it."""
    if deadline - time.perf_counter() < MIN_SECONDS:
        return "time limit (no time left for cbc)"
    mps, mst, sol = (log.with_name(f"model.{ext}") for ext in ("mps", "mst", "sol"))
    variables, var_names, con_names, _ = lp.writeMPS(str(mps), rename=1)
    cmd.writesol(str(mst), lp, variables, var_names, con_names)
    left = deadline - time.perf_counter()
    if left < MIN_SECONDS:  # writing the model took the time
        return "time limit (no time left for cbc)"
    grace = min(INTERRUPT_GRACE, 0.2 * max(left, 0.0))
    # CBC's own limit, a little short of the interrupt: when it holds, CBC ends on its own.
    sec = max(0.05, 0.9 * (left - grace) - 0.1)
    args = [cmd.path, str(mps), "-mips", str(mst), "-sec", f"{sec:.2f}"]
    for option in cmd.getOptions():  # gap, threads and time mode, as PuLP spells them
        args += ("-" + option).split()
    args += ["-solve", "-printingOptions", "all", "-solution", str(sol)]
    stopped = ""
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout=max(0.0, deadline - grace - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # CBC stops between nodes and writes its incumbent
            stopped = "time limit (cbc interrupted)"
            try:
                proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return "time limit (cbc killed)"
        finally:
            if proc.poll() is None:  # an exception here (KeyboardInterrupt): leave no CBC behind
                proc.kill()
                proc.wait()
    if proc.returncode != 0 or not sol.exists():
        return stopped or f"solver error: cbc exited with status {proc.returncode}"
    status, values, reduced, prices, slacks, sol_status = cmd.readsol_MPS(str(sol), lp, variables, var_names, con_names)
    lp.assignVarsVals(values)
    lp.assignVarsDj(reduced)
    lp.assignConsPi(prices)
    lp.assignConsSlack(slacks, activity=True)
    lp.assignStatus(status, sol_status)
    return stopped
