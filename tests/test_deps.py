"""Dependencies that earn their place: the CLI's top module loads no heavy library that only one
command needs, and the Makefile's two entry points install what each runs (the demo its
dependencies, the tests the "dev" extra on top, also after a demo)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Loaded only by the commands that use them: torch (profile, the runtime), pulp (solve's ILP),
# matplotlib (a plot), networkx (a critical path), ortools / highspy (optional solvers).
HEAVY = ("torch", "pulp", "matplotlib", "networkx", "ortools", "highspy", "numpy")


@pytest.mark.parametrize("statement", ["import schedc.app.cli", "from schedc.app.cli import main"])
def test_the_cli_loads_no_heavy_library(statement):
    code = f"import sys; {statement}; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "schedc.app.cli_schedules" not in out.stdout  # the print is what it claims: sys.modules' heavy names
    assert out.stdout.split() == []


def test_schedc_help_loads_no_heavy_library():
    """``schedc --help`` as the console script runs it, then each heavy name still absent."""
    code = ("import sys; from schedc.app.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"print('LOADED', *sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "show" in out.stdout  # the help was printed
    assert out.stdout.splitlines()[-1].split() == ["LOADED"]


def test_a_critical_path_loads_networkx_when_computed():
    code = ("import sys; from schedc.critical import critical_path; from schedc.problem import load_problem; "
            "from schedc.simulate import simulate; from schedc.solvers.registry import build; "
            "before = 'networkx' in sys.modules; "
            f"p = load_problem({str(ROOT / 'examples/problems/uniform.yaml')!r}); "
            "path = critical_path(simulate(p, build('1f1b', p))); print(before, 'networkx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]


def _make(target: str, venv: Path) -> str:
    """What ``make -n TARGET`` would run with ``venv`` as the virtual environment."""
    out = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_installs_the_demo_and_make_test_adds_the_test_tools(tmp_path):
    venv = tmp_path / "venv"
    demo = _make("demo", venv)
    assert "pip install -e ." in demo and ".[dev]" not in demo  # the demo never runs pytest or ortools
    test = _make("test", venv)
    assert "pip install -e ." in test and 'pip install -e ".[dev]"' in test
    # After `make demo`: its stamp in the venv, newer than pyproject.toml.
    venv.mkdir()
    stamps = sorted(set(_stamps(demo)))
    assert len(stamps) == 1
    Path(stamps[0]).touch()
    later = (ROOT / "pyproject.toml").stat().st_mtime + 10
    os.utime(stamps[0], (later, later))
    demo = _make("demo", venv)
    assert "pip install" not in demo  # installed already
    test = _make("test", venv)
    assert 'pip install -e ".[dev]"' in test  # the test tools are added
    assert "pip install -e .\n" not in test  # schedc is not installed again


def _stamps(commands: str) -> list[str]:
    return [line.split()[1] for line in commands.splitlines() if line.startswith("touch ")]
