"""The one time budget of a solve (``schedc.solvers.deadline.Budget``): its arithmetic, and the CLI
counting ``--time-limit`` from the start the console script hands it. No test here asserts on
wall-clock time: budgets are built far from now (hours) or already spent."""

import json
import math
import time

from click.testing import CliRunner

from schedc import Problem
from schedc.app.cli import main
from schedc.app.cli_base import ProgramStart
from schedc.solvers.deadline import Budget

HOUR = 3600.0


def test_a_share_is_a_fraction_of_what_is_left_and_keeps_the_whole_end():
    budget = Budget.seconds(4 * HOUR, kept=6.0)
    half = budget.share(0.5)
    assert budget.end - 2.01 * HOUR < half.end < budget.end - 1.99 * HOUR
    assert half.kept == 6.0 and half.whole == budget.end
    # What a step may use: the share, unless the simulations kept before the whole end cut it.
    assert half.usable(1.0).end == half.end
    assert half.usable(HOUR).end == budget.end - 6 * HOUR
    assert budget.usable(10.0).end == budget.end - 60.0
    assert budget.usable(10.0).kept == 0.0  # counted once


def test_less_at_most_at_least_and_earlier():
    budget = Budget.seconds(HOUR)
    assert budget.less(60.0).end == budget.end - 60.0
    assert budget.at_most(2 * HOUR) == budget
    assert budget.at_most(60.0).end < budget.end
    assert budget.at_least(2 * HOUR).end > budget.end
    assert budget.earlier(budget.less(1.0)) == budget.less(1.0)
    assert Budget.seconds(HOUR, since=budget.end - HOUR).end == budget.end


def test_expired_left_and_unlimited():
    spent = Budget(time.perf_counter() - 1.0)
    assert spent.expired() and spent.left() == 0.0
    assert spent.share(0.5).expired()
    forever = Budget.unlimited()
    assert not forever.limited and not forever.expired() and forever.left() == math.inf
    assert forever.usable(1.0).end == math.inf
    assert Budget.seconds(HOUR).limited and not Budget.seconds(HOUR).expired()


def test_the_cli_counts_the_time_limit_from_the_program_start(tmp_path):
    # The memory limit binds and the independent bound stays below the optimum: no warm start is
    # proven optimal without a search (tests/test_solve_deadline.py's BINDING).
    data = dict(name="binding", ranks=3, microbatches=4, costs=dict(F=[1, 2, 1], B=[2, 2, 1], W=[1, 1, 2]),
                memory=dict(F=[2, 1.5, 1], B=[-1, -0.5, -0.5], static=[1, 0.5, 0], limit=[5, 4, 2]))
    path = tmp_path / "p.json"
    path.write_text(Problem.parse(data).model_dump_json())
    args = ["solve", str(path), "-o", str(tmp_path / "s.json"), "--time-limit", "30", "-q", "--json"]
    # A process that started an hour ago has spent its 30 s: the warm start is returned, cut short.
    late = CliRunner().invoke(main, args, obj=ProgramStart(time.perf_counter() - HOUR))
    assert late.exit_code == 0, late.output
    assert json.loads(late.stdout)["status"] == "time limit"
    assert (tmp_path / "s.json").exists()
    # Started now, the same command has its 30 s (plenty here) and searches.
    now = CliRunner().invoke(main, args, obj=ProgramStart(time.perf_counter()))
    assert now.exit_code == 0, now.output
    assert json.loads(now.stdout)["status"] != "time limit"
