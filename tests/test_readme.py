"""The README's example sessions, run: every ``$ schedc ...`` line in a code block must print
exactly the lines that follow it (up to the next ``$`` line or the block's end).

Standard output is compared (and for a failing command, the error on stderr; `solve`'s live
progress on stderr is not shown in the README). Wall-clock seconds in `solve`'s summary line
("0.5 s") are the one thing that differs from run to run; they are compared as "<seconds>". The README's `bad.yaml` is the misspelt problem file
its text describes: uniform.yaml with "microbatchs".
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
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
def shown() -> dict[int, list[str]]:
    """Every session run in README order in one working directory (a later session may read a
    file an earlier one wrote, and pytest-xdist may give the tests to different workers): README
    line -> what it printed, normalised."""
    with tempfile.TemporaryDirectory(prefix="readme") as tmp:
        d = Path(tmp)
        (d / "examples").symlink_to(ROOT / "examples")
        (d / "bad.yaml").write_text((ROOT / "examples/problems/uniform.yaml").read_text().replace("microbatches:", "microbatchs:"))
        here = os.getcwd()
        os.chdir(d)
        try:
            out = {}
            for line, command, _ in sessions():
                result = CliRunner().invoke(main, shlex.split(command)[1:])
                printed = result.stdout if result.exit_code == 0 else result.stdout + result.stderr  # progress is on stderr
                out[line] = normalise(printed)
            return out
        finally:
            os.chdir(here)


def test_the_readme_has_example_sessions():
    assert len(sessions()) >= 5


@pytest.mark.parametrize("line, command, expected", sessions(), ids=[f"README:{s[0]}" for s in sessions()])
def test_a_readme_session_prints_what_the_readme_shows(shown, line, command, expected):
    assert shown[line] == normalise("\n".join(expected)), f"README line {line}: {command}"
