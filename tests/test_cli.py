"""The CLI as a user runs it: tables, --json, pictures, and one-line errors with exit status 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import schedc.solvers as solvers
from schedc import load_problem, simulate
from schedc.app.cli import main

EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "problems").glob("*.yaml"))
GPT = next(p for p in EXAMPLES if p.stem == "gpt-h200")  # one chunk per rank: every loop schedule applies


def run(*args, ok=True):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_compare_lists_every_registry_schedule_and_json_matches_simulate(path):
    out = run("compare", path).output
    for name in solvers.REGISTRY:
        assert name in out
    data = json.loads(run("compare", path, "--json").output)
    assert [r["schedule"] for r in data["results"]] == list(solvers.REGISTRY)
    problem = load_problem(path)
    for r in data["results"]:
        spec = solvers.get(r["schedule"])
        if not r["applies"]:
            assert r["reason"] == spec.why_not(problem)
            assert f"n/a {spec.name}: {r['reason']}" in out
            continue
        t = simulate(problem, spec.build(problem))
        assert r["makespan"] == t.makespan and r["span"] == t.span
        assert r["peak_memory"] == list(t.peak_memory) and r["fits"] == t.fits
        line = next(ln for ln in out.splitlines() if ln.startswith(spec.name + " "))
        assert f"{100 * t.bubble_rate():.2f}" in line


def test_compare_subset_memory_override_and_fit_column(tmp_path):
    path = GPT
    out = run("compare", path, "--schedules", "gpipe,1f1b", "--memory-limit", "1000").output
    assert "zb-h1" not in out and "yes" in out
    tight = next(p for p in EXAMPLES if p.stem == "memory_tight")
    lines = run("compare", tight).output.splitlines()
    assert "no (rank 0 +16)" in next(ln for ln in lines if ln.startswith("gpipe "))
    assert next(ln for ln in lines if ln.startswith("zb-h1 ")).endswith("yes")


def test_simulate_table_and_json():
    path = GPT
    out = run("simulate", path, "-s", "zb-h1").output
    assert "makespan" in out and "bubble" in out and "rank" in out
    data = json.loads(run("simulate", path, "--schedule", "1f1b", "--json").output)
    problem = load_problem(path)
    assert len(data["ops"]) == 2 * problem.n_stages * problem.microbatches
    assert data["makespan"] == max(op["end"] for op in data["ops"])
    # where the time of the rank that sets the makespan goes: its work, recompute and idle fill it
    spent = data["rank_time"]
    ops = [op for op in data["ops"] if op["rank"] == spent["rank"]]
    assert spent["work"] == pytest.approx(sum(op["end"] - op["start"] for op in ops))
    idle = spent["idle_warm_up"] + spent["idle_steady"] + spent["idle_cool_down"]
    assert spent["work"] + spent["recompute"] + idle == pytest.approx(data["makespan"])
    assert f"time: rank {spent['rank']} sets the makespan" in run("simulate", path, "-s", "1f1b").output


def test_schedules_and_bubble():
    out = run("schedules").output
    assert all(name in out for name in solvers.REGISTRY)
    assert {r["name"] for r in json.loads(run("schedules", "--json").output)} == set(solvers.REGISTRY)
    rows = {r["schedule"]: r for r in json.loads(run("bubble", "-p", 4, "-m", 8, "-v", 2, "--json").output)}
    assert rows["1f1b"]["bubble"] == 9 and rows["interleaved-1f1b"]["bubble"] == 4.5
    assert "zb-h2" in run("bubble", "-p", 8, "-m", 32, "-F", 2, "-B", 2, "-W", 1).output


def test_show_writes_figure_and_trace(tmp_path):
    png, trace = tmp_path / "g.png", tmp_path / "t.json"
    run("show", GPT, "-s", "zb-h1", "-o", png, "--trace", trace)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(trace.read_text())["traceEvents"]
    plot = tmp_path / "cmp.svg"
    run("compare", GPT, "--plot", plot)
    assert plot.read_text().lstrip().startswith("<?xml")


BAD = {
    "typo.yaml": ("ranks: 4\nmicrobatchs: 8\ncosts: {F: 1, B: 1, W: 1}\n", "unknown field 'microbatchs'"),
    "negative.yaml": ("ranks: 4\nmicrobatches: 8\ncosts: {F: 1, B: -1, W: 1}\n", "costs.B: must be > 0, got -1"),
    "memory.yaml": (
        "ranks: 4\nmicrobatches: 8\ncosts: {F: 1, B: 1, W: 1}\nmemory: {F: 2, static: 4, limit: 5}\n",
        "memory.limit of rank 0 is 5, below the 6",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("command", [["compare"], ["simulate", "-s", "1f1b"], ["show", "-s", "1f1b", "-o", "x.png"]])
def test_bad_problem_files_exit_2_with_one_line(tmp_path, name, command):
    text, words = BAD[name]
    path = tmp_path / name
    path.write_text(text)
    result = run(command[0], path, *command[1:], ok=False)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert words in result.output and name in result.output


def test_other_mistakes_exit_2():
    path = GPT
    for args, words in [
        (["simulate", path, "-s", "nope"], "unknown schedule 'nope'"),
        (["compare", "missing.yaml"], "cannot read"),
        (["compare", path, "--memory-limit", "1"], "memory.limit"),
        (["simulate", next(p for p in EXAMPLES if p.stem == "v_shape"), "-s", "1f1b"], "does not apply"),
        (["show", path, "-s", "1f1b", "-o", "out.bmp"], "bmp"),
    ]:
        result = run(*args, ok=False)
        assert result.exit_code == 2, (args, result.output)
        assert words in result.output


def test_console_script_prints_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD["typo.yaml"][0])
    proc = subprocess.run(
        [sys.executable, "-m", "schedc.app.cli", "compare", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
