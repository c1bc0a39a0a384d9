"""The benchmark scripts' command lines (what they refuse before running anything)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"


@pytest.mark.parametrize("script", ["backends.py", "memory_time.py", "memtime_small.py", "plan.py"])
def test_write_with_only_is_refused_before_anything_runs(script):
    """--only runs part of a table, which --write never wrote: together they are an error (exit 2,
    one line saying why), not a run whose --write is dropped; RESULTS.md stays as it was."""
    before = RESULTS.read_bytes()
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--write", "--only", "no-such-cell"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "--write publishes the whole table and --only runs part of it" in run.stderr
    assert "Traceback" not in run.stderr
    assert RESULTS.read_bytes() == before
