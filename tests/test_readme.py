"""The README's example sessions, run: every ``$ schedc ...`` line in a code block must print
exactly the lines that follow it (up to the next ``$`` line or the block's end).

Standard output is compared (and for a failing command, the error on stderr; `solve`'s live
progress on stderr is not shown in the README). Wall-clock seconds in `solve`'s summary line
("0.5 s") are the one thing that differs from run to run; they are compared as "<seconds>". The README's `bad.yaml` is the misspelt problem file
its text describes: uniform.yaml with "microbatchs".
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedc.app.cli import main

ROOT = Path(__file__).resolve().parent.parent
SECONDS = re.compile(r"\b\d+(\.\d+)? s;")


def sessions() -> list[tuple[int, str, list[str]]]:
    """(README line, command, expected output lines) of every example session."""
    out, block, in_code = [], None, False
    for number, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code, block = not in_code, None
            continue
        if not in_code:
            continue
        if line.startswith("$ schedc "):
            block = (number, line[2:], [])
            out.append(block)
        elif block is not None:
            block[2].append(line)
    return out


def normalise(text: str) -> list[str]:
    return [SECONDS.sub("<seconds> s;", line.rstrip()) for line in text.rstrip("\n").splitlines()]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    (d / "examples").symlink_to(ROOT / "examples")
    (d / "bad.yaml").write_text((ROOT / "examples/problems/uniform.yaml").read_text().replace("microbatches:", "microbatchs:"))
    return d


def test_the_readme_has_example_sessions():
    assert len(sessions()) >= 5


@pytest.mark.parametrize("line, command, expected", sessions(), ids=[f"README:{s[0]}" for s in sessions()])
def test_a_readme_session_prints_what_the_readme_shows(workdir, monkeypatch, line, command, expected):
    monkeypatch.chdir(workdir)
    result = CliRunner().invoke(main, shlex.split(command)[1:])
    shown = result.stdout if result.exit_code == 0 else result.stdout + result.stderr  # progress is on stderr
    assert normalise(shown) == normalise("\n".join(expected)), f"README line {line}: {command}"
