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
# matplotlib (a plot), networkx (tests/test_architecture.py's import graph), ortools / highspy (optional solvers).
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


# What a command that runs must not load (`python -X importtime` lists every module a run imports):
# the heavy libraries it does not use, the ablation layer, and another command's module.
ABLATION = ("schedc.app.ablate", "schedc.app.ablate_config", "schedc.app.ablate_report", "schedc.app.cli_ablate")
NOT_FOR = {
    "solve": ("networkx", "matplotlib", "torch", *ABLATION, "schedc.app.cli_schedules", "schedc.app.cli_profile"),
    "simulate": ("networkx", "matplotlib", "torch", "pulp", *ABLATION, "schedc.app.cli_solve"),
    "check": ("networkx", "matplotlib", "torch", "pulp", *ABLATION, "schedc.app.cli_solve"),
}


def _imported(args: list[str], cwd: Path) -> set[str]:
    """The modules a `schedc ARGS` run imports, read from ``python -X importtime``'s report."""
    code = "import sys; from schedc.app.cli import main; sys.exit(main(sys.argv[1:]))"
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *args], capture_output=True, text=True,
                         timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    assert "schedc.app.cli" in lines  # the report is what it claims
    return set(lines)


def test_each_command_loads_only_what_it_uses(tmp_path):
    """`schedc solve`, `simulate` and `check`, run for real: none loads networkx, matplotlib, the
    ablation layer or another command's code (the CLI loads a command's module when it runs)."""
    problem = str(ROOT / "examples/problems/uniform.yaml")
    runs = {"solve": ["solve", problem, "--time-limit", "3", "-o", "s.json", "-q"],
            "simulate": ["simulate", "s.json"], "check": ["check", "s.json"]}
    for command, args in runs.items():
        loaded = _imported(args, tmp_path)
        assert f"schedc.app.{'cli_solve' if command == 'solve' else 'cli_schedules'}" in loaded
        assert not {m for m in loaded for bad in NOT_FOR[command] if m == bad or m.startswith(bad + ".")}, command


def test_every_command_is_loaded_by_its_name():
    """``cli_base.COMMANDS`` names every command's module: each loads, and no command is left out."""
    from schedc.app.cli_base import COMMANDS, main

    assert set(main.all_commands()) == set(COMMANDS)


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
