"""CBC, the MIP solver bundled with PuLP: its command, a run under a watchdog, its log read back.

CBC checks its ``-sec`` limit only between nodes of its search, so root processing can overrun it
by minutes. ``run_cbc`` therefore runs it as a subprocess: when the budget runs out CBC is
interrupted (it then stops searching and writes its incumbent) and, if it has not stopped shortly
after, killed. A killed CBC writes no solution: the caller keeps its warm start and says "time
limit". CBC dies with the process that started it (``deadline.dies_with_parent``), so a solve
killed from outside leaves none running. ``parse_log`` reads the incumbents and bounds CBC
reported as it went, for the live progress and the bound.
"""

from __future__ import annotations

import math
import re
import signal
import subprocess
from pathlib import Path

from schedc.solvers.search.common import Progress
from schedc.solvers.deadline import Budget, dies_with_parent

INTERRUPT_GRACE = 1.0  # seconds between interrupting CBC and killing it (at most 20% of the time left)
MIN_SECONDS = 0.5  # CBC is not started with less time than this left


def cbc(**options):
    """The CBC bundled with PuLP. PuLP 3.3 marks this command deprecated for 4.0 (where CBC
    becomes a separate install); it is still the bundled solver here, so the warning is muted."""
    import warnings

    import pulp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, **options)


def run_cbc(lp, cmd, budget: Budget, log: Path) -> str:
    """Solve the PuLP problem ``lp`` with ``cmd`` (a ``pulp.PULP_CBC_CMD``: its path and options
    are used, its time limit is not), warm-started from the variables' initial values, so that
    CBC is gone when ``budget`` runs out. Assigns the solution to ``lp``'s variables and status as
    ``lp.solve`` would, and returns "" or why the time limit stopped CBC: "time limit (cbc
    interrupted)", or, with no solution assigned, "time limit (cbc killed)" or "time limit (no
    time left for cbc)". CBC's output goes to ``log``; its model and solution files beside it."""
    if budget.left() < MIN_SECONDS:
        return "time limit (no time left for cbc)"
    mps, mst, sol = (log.with_name(f"model.{ext}") for ext in ("mps", "mst", "sol"))
    variables, var_names, con_names, _ = lp.writeMPS(str(mps), rename=1)
    cmd.writesol(str(mst), lp, variables, var_names, con_names)
    left = budget.left()
    if left < MIN_SECONDS:  # writing the model took the time
        return "time limit (no time left for cbc)"
    grace = min(INTERRUPT_GRACE, 0.2 * left)
    # CBC's own limit, a little short of the interrupt: when it holds, CBC ends on its own.
    sec = max(0.05, 0.9 * (left - grace) - 0.1)
    args = [cmd.path, str(mps), "-mips", str(mst), "-sec", f"{sec:.2f}"]
    for option in cmd.getOptions():  # gap, threads and time mode, as PuLP spells them
        args += ("-" + option).split()
    args += ["-solve", "-printingOptions", "all", "-solution", str(sol)]
    stopped = ""
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL, preexec_fn=dies_with_parent())
        try:
            proc.wait(timeout=budget.less(grace).left())
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # CBC stops between nodes and writes its incumbent
            stopped = "time limit (cbc interrupted)"
            try:
                proc.wait(timeout=budget.left())
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


# CBC's log: incumbents and the bound as it goes, and the final bound.
_SOLUTION = re.compile(r"Integer solution of (\S+) found .*\((\S+) seconds\)")
_NODES = re.compile(r"After \d+ nodes, \d+ on tree, (\S+) best solution, best possible (\S+) \((\S+) seconds\)")
_FINAL_BOUND = re.compile(r"^Lower bound:\s+(\S+)", re.M)
_RESULT = re.compile(r"^Result - (.*)$", re.M)


def parse_log(text: str) -> tuple[list[Progress], float | None, str]:
    """``(history, final bound or None, result line)`` of a CBC log."""
    history = []
    for line in text.splitlines():
        if mt := _NODES.search(line):
            inc, bound, sec = mt.groups()
            history.append(Progress(float(sec), number(inc), number(bound)))
        elif mt := _SOLUTION.search(line):
            history.append(Progress(float(mt.group(2)), number(mt.group(1)), None))
    bound = _FINAL_BOUND.search(text)
    result = _RESULT.search(text)
    return history, (float(bound.group(1)) if bound else None), (result.group(1) if result else "")


def number(text: str) -> float | None:
    """A solver's printed number, None for one that is not finite (or a huge stand-in for one)."""
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) and abs(x) < 1e50 else None
