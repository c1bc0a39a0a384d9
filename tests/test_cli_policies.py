"""compare, simulate, show and solve report how many (stage, microbatch) each schedule recomputes,
recomputes selectively and offloads (issue 25), in text and --json, where the problem allows it;
a problem without recompute or offload prints what it always did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import schedc.solvers as solvers
from schedc.app.cli import main
from schedc.critical import critical_path
from schedc.problem import Problem
from schedc.schedfile import CompiledSchedule
from schedc.solvers.families.memtime import with_policies

ROOT = Path(__file__).resolve().parent.parent
UNIFORM = ROOT / "examples" / "problems" / "uniform.yaml"
PROBLEM = dict(name="rc", ranks=2, microbatches=4, costs=dict(F=1, B=1, W=1), memory=dict(F=2, static=1),
               recompute=dict(keep=0.5, selective=dict(time=0.25, keep=1)), offload=dict(time=0.5))
CHOSEN = {(0, 0): "R", (0, 1): "O", (1, 2): "S", (0, 3): "O", (1, 3): "R"}


def run(*args, ok=True):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture
def files(tmp_path) -> Path:
    problem = Problem.parse(PROBLEM)
    (tmp_path / "rc.json").write_text(json.dumps(PROBLEM))
    only_recompute = {k: v for k, v in PROBLEM.items() if k != "offload"}
    (tmp_path / "recompute-only.json").write_text(json.dumps(only_recompute))
    schedule = with_policies(problem, solvers.build("zb-h1", problem), CHOSEN, name="mixed")
    CompiledSchedule.build(problem, schedule).save(tmp_path / "mixed.json")
    return tmp_path


def test_compare_has_a_column_per_policy_the_problem_allows(files):
    out = run("compare", files / "rc.json", "--schedules", "1f1b,zb-h1").splitlines()
    assert out[1].split()[-3:] == ["recompute", "selective", "offload"]
    assert [ln.split()[-3:] for ln in out[3:5]] == [["0", "0", "0"]] * 2  # the registry's keep everything
    out = run("compare", files / "recompute-only.json", "--schedules", "1f1b").splitlines()
    assert out[1].split()[-3:] == ["fits", "recompute", "selective"]
    plain = run("compare", UNIFORM, "--schedules", "1f1b").splitlines()
    assert plain[1].split()[-1] == "fits" and "recompute" not in "\n".join(plain)


def test_compare_json_reports_the_policies_only_where_the_problem_allows_them(files):
    results = json.loads(run("compare", files / "rc.json", "--schedules", "1f1b", "--json"))["results"]
    assert results[0]["policies"] == {"recompute": 0, "selective": 0, "offload": 0}
    results = json.loads(run("compare", files / "recompute-only.json", "--schedules", "1f1b", "--json"))["results"]
    assert results[0]["policies"] == {"recompute": 0, "selective": 0}
    plain = json.loads(run("compare", UNIFORM, "--schedules", "1f1b", "--json"))["results"]
    assert "policies" not in plain[0]


def test_simulate_and_show_count_a_schedule_files_policies(files):
    counts = "2 recompute, 1 selective, 2 offload of 8 (stage, microbatch)s"
    out = run("simulate", files / "mixed.json").splitlines()
    assert f"mixed: {counts}" in out
    data = json.loads(run("simulate", files / "mixed.json", "--json"))
    assert data["policies"] == {"recompute": 2, "selective": 1, "offload": 2}
    assert {o["kind"] for o in data["ops"]} == {"F", "B", "W", "R", "S", "O", "L"}
    out = run("show", files / "mixed.json", "-o", files / "mixed.png", "--trace", files / "trace.json").splitlines()
    assert out[0] == f"mixed: {counts}" and out[1] == f"wrote {files / 'mixed.png'}"
    trace = json.loads((files / "trace.json").read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in trace) == len(data["ops"]) == 24 + 3 + 4  # F, B, W; R, S; O, L
    plain = run("simulate", UNIFORM, "-s", "1f1b")
    assert "recompute" not in plain


def test_solve_reports_the_policies_of_its_schedule(files, monkeypatch):
    # The search itself is the solver's (tests/test_ilp.py and others); here its result is a given
    # schedule that recomputes and offloads, and the command must report what that schedule does.
    from schedc.app import cli_solve
    from schedc.simulate import simulate
    from schedc.solvers.search.solve import SolveResult

    problem = Problem.parse(PROBLEM)
    schedule = with_policies(problem, solvers.build("zb-h1", problem), CHOSEN, name="ilp")
    t = simulate(problem, schedule)

    def solved(prob, **_):
        return SolveResult(schedule, t, "feasible", t.makespan, 1.0, "given", "zb-h1", t.makespan, "cbc", 0.1, 0)

    monkeypatch.setattr(cli_solve, "solve_ilp", solved)
    data = json.loads(run("solve", files / "rc.json", "-o", files / "s.json", "-q", "--json"))
    assert data["policies"] == {"recompute": 2, "selective": 1, "offload": 2}
    out = run("solve", files / "rc.json", "-o", files / "s.json", "-q").splitlines()
    assert "policies: 2 recompute, 1 selective, 2 offload of 8 (stage, microbatch)s" in out
    assert data["rank_time"] == t.rank_time().summary() and f"time: {t.rank_time()}" in out
    assert critical_path(t).describe().splitlines()[0] in out  # whose lanes the chain runs on
    header = next(ln for ln in out if ln.startswith("schedule "))
    assert header.split()[-3:] == ["recompute", "selective", "offload"]
    assert next(ln for ln in out if ln.startswith("ilp ")).split()[-3:] == ["2", "1", "2"]
    saved = json.loads((files / "s.json").read_text())
    assert saved["version"] == 3 and saved["timeline"]["policies"] == data["policies"]
