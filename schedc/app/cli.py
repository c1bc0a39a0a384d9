"""The ``schedc`` command line: the command group (``cli_base``) with its commands, one module per
job (``cli_schedules``, ``cli_solve``, ``cli_profile``, ``cli_ablate``, each loaded when one of its
commands runs: ``cli_base.COMMANDS``), and the console script."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from schedc.app.cli_base import ProgramStart, main

__all__ = ["main", "program"]


def _process_age() -> float | None:
    """Wall seconds since this process started (Linux: /proc), None where the system does not say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)


def _ended(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def program() -> None:
    """The `schedc` console script: the CLI as its own process, so time limits count from its start.
    Ended from outside (SIGTERM, as `timeout` and job schedulers send it, or SIGHUP), it exits as
    Ctrl-C does: what it started (a solver, its workers) is stopped and its temporary files removed
    on the way out, and the exit status is 128 + the signal's number."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _ended)
    age = _process_age()
    sys.exit(main(obj=None if age is None else ProgramStart(time.perf_counter() - age)))


if __name__ == "__main__":  # pragma: no cover
    program()
