"""The layers, checked with import-linter (contracts in pyproject.toml, [tool.importlinter]).

The installed package maps three folders into one: ``schedc/`` is ``schedc``, ``solvers/`` is
``schedc.solvers`` and ``runtime/`` is ``schedc.runtime`` (pyproject's package-dir). import-linter
finds a package's modules by walking its folder, so it would see only ``schedc/``: the check runs
on a copy of the three folders laid out as the installed package is. One test shows that a wrong
arrow fails it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("importlinter")


def installed_layout(tmp: Path) -> Path:
    """``tmp/schedc`` as the installed package: schedc/ with solvers/ and runtime/ inside."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "schedc", tmp / "schedc", ignore=ignore)
    shutil.copytree(ROOT / "solvers", tmp / "schedc" / "solvers", ignore=ignore)
    shutil.copytree(ROOT / "runtime", tmp / "schedc" / "runtime", ignore=ignore)
    return tmp


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """import-linter's command with the project's contracts, on ``tree`` instead of the install."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=300,
    )


def test_the_import_contracts_hold(tmp_path):
    result = lint_imports(installed_layout(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("module, line", [
    ("problem.py", "import schedc.solvers.registry  # a wrong arrow: the core importing a solver"),
    ("simulate.py", "import torch  # a wrong arrow: the core importing torch"),
    ("solvers/registry.py", "import schedc.runtime  # a wrong arrow: a solver importing the runtime"),
    ("solvers/families/heuristics.py", "import schedc.solvers.search.ilp  # a wrong arrow: a family importing the search"),
    ("runtime/comm.py", "import schedc.app.cli  # a wrong arrow: the runtime importing the application"),
    ("__init__.py", "import schedc.solvers  # a wrong arrow: the front door loading the solvers"),
    ("__init__.py", "from schedc.app.plot import draw_gantt  # a wrong arrow: the front door loading the app"),
])
def test_a_wrong_import_breaks_a_contract(tmp_path, module, line):
    tree = installed_layout(tmp_path)
    path = tree / "schedc" / module
    path.write_text(path.read_text() + "\n" + line + "\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("statement", ["import schedc", "import schedc.problem", "import schedc.schedfile"])
def test_the_front_door_loads_the_core_alone(statement):
    """What ``python -X importtime -c STATEMENT`` lists: no solver, runtime or application module,
    and no torch, PuLP, matplotlib or OR-Tools (a runtime rank imports schedc for the file format)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], capture_output=True, text=True,
                         timeout=120, check=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "schedc.problem" in loaded  # the listing is what it claims to be
    heavy = sorted(m for m in loaded if m.split(".")[0] in ("torch", "pulp", "matplotlib", "ortools")
                   or m.startswith(("schedc.solvers", "schedc.runtime", "schedc.app")))
    assert heavy == []


def test_schedc_compile_is_loaded_on_first_use():
    code = ("import sys, schedc; before = 'schedc.app.compile' in sys.modules; "
            "from schedc import compile; print(before, compile is schedc.compile, compile.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "True", "schedc.app.compile"]


def test_no_module_cycles(tmp_path):
    """No two of the project's modules import each other, directly or around a loop."""
    code = (
        "import json, grimp; g = grimp.build_graph('schedc'); "
        "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))"
    )
    tree = installed_layout(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env={"PYTHONPATH": str(tree)},
                         capture_output=True, text=True, timeout=300, check=True)
    imports = {m: [d for d in deps if d.startswith("schedc")] for m, deps in json.loads(out.stdout).items()}
    assert cycles(imports) == []


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module."""
    g = nx.DiGraph([(m, d) for m, deps in graph.items() for d in deps])
    return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)


def test_the_cycle_finder_finds_a_loop():
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": []}) == []


def test_function_level_imports_of_the_project_say_why():
    """An import of schedc inside a function hides an arrow from readers and tools: allowed only
    for heavy optional dependencies (torch), with a comment on the line saying so."""
    import ast

    unexplained = []
    for folder in ("schedc", "solvers", "runtime"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        names = [sub.module or ""] if isinstance(sub, ast.ImportFrom) else [a.name for a in sub.names]
                        if any(n.startswith("schedc") for n in names):
                            block = lines[sub.lineno - 2: sub.end_lineno]  # the line above, and the import
                            if not any("#" in line for line in block):
                                unexplained.append(f"{path.relative_to(ROOT)}:{sub.lineno}")
    assert unexplained == []
