"""The profile -> solve -> train chain of docs/runtime.md on this machine: profile -> solve -> train under torchrun (2 gloo ranks)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import schedc
from schedc.app.cli import main

ROOT = Path(__file__).parent.parent


def test_profile_solve_train(tmp_path):
    problem, schedule, summary = tmp_path / "gpt.yaml", tmp_path / "gpt.json", tmp_path / "train.json"
    result = CliRunner().invoke(main, ["profile", f"{ROOT}/examples/train_gpt.py:gpt", "-p", "2", "-m", "8",
                                       "--repeats", "2", "-o", str(problem)])
    assert result.exit_code == 0, result.output
    prob = schedc.load_problem(problem)
    assert prob.ranks == 2 and sum(prob.stage_blocks) == 10 and min(prob.cost["F"]) > 0
    result = CliRunner().invoke(main, ["solve", str(problem), "-o", str(schedule), "-q", "--time-limit", "20"])
    assert result.exit_code == 0, result.output
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(ROOT / "examples" / "train_gpt.py"), str(schedule), "--steps", "8", "--json", str(summary)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads(summary.read_text())
    assert out["losses"][-1] < out["losses"][0] - 0.5  # it learns
    assert out["measured_ms"] > 0 and out["simulated_ms"] == schedc.load(schedule).timeline.makespan


def test_profile_errors_are_one_line(tmp_path):
    for model, message in [
        ("nope.py:gpt", "no file nope.py"),
        (f"{ROOT}/examples/train_gpt.py:missing", "has no function 'missing'"),
        ("gpt", "expected FILE.py:FUNCTION"),
        (f"{ROOT}/examples/train_gpt.py:gpt", "cannot cut 10 blocks into 12 stages"),
    ]:
        result = CliRunner().invoke(main, ["profile", model, "-p", "12", "-m", "2", "-o", str(tmp_path / "x.yaml")])
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
