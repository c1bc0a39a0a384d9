"""The README's and the docs pages' examples, run.

Sessions: every ``$ schedc ...`` line in a code block must print exactly the lines that follow it
(up to the next ``$`` line or the block's end). Standard output is compared (and for a failing
command, the error on stderr; `solve`'s live progress on stderr is not shown in the pages).
Wall-clock seconds in `solve`'s summary line ("0.5 s") are the one thing that differs from run to
run; they are compared as "<seconds>". A page's `bad.yaml` is the misspelt problem file its text
describes: uniform.yaml with "microbatchs". Each page's sessions run in page order in one working
directory of their own (a later session may read a file an earlier one wrote).

Python: every ```python block of a page runs, the page's blocks in order in one namespace, in a
working directory of their own with examples/ linked. A block that cannot run here (it needs
torchrun, a GPU, or code the reader writes) is marked by the line ``<!-- not run: REASON -->``
just before its fence and is skipped with that reason.

Pages: README.md and every docs/*.md. The README is the front page: at most 400 lines, and it
links to every docs page.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import tempfile
import traceback
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedc.app.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
SECONDS = re.compile(r"\b\d+(\.\d+)? s;")
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")
MAX_README_LINES = 400
# Pages the README links to that other branches of issue 38 write; checked like any page once
# they exist here.
PENDING = {"docs/your-model.md", "docs/profile.md"}


def _lines(page: str) -> list[str]:
    return (ROOT / page).read_text().splitlines()


def sessions(page: str) -> list[tuple[int, str, list[str]]]:
    """(line, command, expected output lines) of every example session of a page."""
    out, block, in_code = [], None, False
    for number, line in enumerate(_lines(page), 1):
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


def python_blocks(page: str) -> list[tuple[int, str, str | None]]:
    """(line of the opening fence, code, why not run or None) of every ```python block."""
    out, code, start, skip, previous = [], None, 0, None, ""
    for number, line in enumerate(_lines(page), 1):
        if code is None:
            if line.strip() == "```python":
                mark = NOT_RUN.match(previous.strip())
                code, start, skip = [], number, mark.group(1) if mark else None
            elif line.strip():
                previous = line
        elif line.startswith("```"):
            out.append((start, "\n".join(code) + "\n", skip))
            code, previous = None, ""
        else:
            code.append(line)
    return out


def normalise(text: str) -> list[str]:
    return [SECONDS.sub("<seconds> s;", line.rstrip()) for line in text.rstrip("\n").splitlines()]


@contextlib.contextmanager
def _workdir():
    """A temporary working directory with examples/ linked and the pages' bad.yaml."""
    with tempfile.TemporaryDirectory(prefix="readme") as tmp:
        d = Path(tmp)
        (d / "examples").symlink_to(ROOT / "examples")
        (d / "bad.yaml").write_text((ROOT / "examples/problems/uniform.yaml").read_text().replace("microbatches:", "microbatchs:"))
        here = os.getcwd()
        os.chdir(d)
        try:
            yield d
        finally:
            os.chdir(here)


_SHOWN: dict[str, dict[int, list[str]]] = {}
_RAN: dict[str, dict[int, str | None]] = {}


def shown(page: str) -> dict[int, list[str]]:
    """Every session of a page run in page order in one working directory (pytest-xdist may give
    the tests to different workers; each worker runs a page once): line -> what it printed,
    normalised."""
    if page not in _SHOWN:
        with _workdir():
            out = {}
            for line, command, _ in sessions(page):
                result = CliRunner().invoke(main, shlex.split(command)[1:])
                printed = result.stdout if result.exit_code == 0 else result.stdout + result.stderr  # progress is on stderr
                out[line] = normalise(printed)
            _SHOWN[page] = out
    return _SHOWN[page]


def ran(page: str) -> dict[int, str | None]:
    """Every runnable python block of a page run in page order in one namespace: line -> None
    where it ran, else the error's traceback."""
    if page not in _RAN:
        with _workdir():
            namespace: dict = {"__name__": "__docs__"}
            out = {}
            for line, code, skip in python_blocks(page):
                if skip is not None:
                    continue
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        exec(compile(code, f"{page}:{line}", "exec"), namespace)
                    out[line] = None
                except Exception:
                    out[line] = traceback.format_exc()
            _RAN[page] = out
    return _RAN[page]


SESSIONS = [(page, *s) for page in PAGES for s in sessions(page)]
BLOCKS = [(page, *b) for page in PAGES for b in python_blocks(page)]


def test_the_pages_have_example_sessions_and_code():
    assert len(SESSIONS) >= 5
    assert len([b for b in BLOCKS if b[3] is None]) >= 2


@pytest.mark.parametrize("page, line, command, expected", SESSIONS, ids=[f"{s[0]}:{s[1]}" for s in SESSIONS])
def test_a_session_prints_what_the_page_shows(page, line, command, expected):
    assert shown(page)[line] == normalise("\n".join(expected)), f"{page} line {line}: {command}"


@pytest.mark.parametrize("page, line, code, skip", BLOCKS, ids=[f"{b[0]}:{b[1]}" for b in BLOCKS])
def test_a_python_block_runs(page, line, code, skip):
    if skip is not None:
        pytest.skip(f"{page} line {line}: not run: {skip}")
    error = ran(page)[line]
    assert error is None, f"{page} line {line}:\n{error}"


def test_the_readme_is_a_front_page_of_at_most_400_lines():
    n = len(_lines("README.md"))
    assert n <= MAX_README_LINES, f"README.md has {n} lines, more than {MAX_README_LINES}: move reference text to docs/"


def test_every_docs_page_is_linked_from_the_readme():
    text = (ROOT / "README.md").read_text()
    missing = [page for page in PAGES[1:] if f"]({page})" not in text and f"]({page}#" not in text]
    assert not missing, f"docs pages the README does not link to: {missing}"


def anchors(page: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but - and _ dropped,
    spaces as -."""
    out, fence = set(), False
    for line in _lines(page):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_every_local_link_of_the_pages_points_to_a_file_and_heading():
    link = re.compile(r"\]\(([^)#:]*)(?:#([^)]*))?\)")
    broken = []
    for page in PAGES:
        for target, anchor in link.findall((ROOT / page).read_text()):
            path = os.path.normpath(str(Path(page).parent / target)) if target else page
            if path in PENDING and not (ROOT / path).exists():
                continue
            if not (ROOT / path).exists():
                broken.append(f"{page}: {target} (no such file)")
            elif anchor and path.endswith(".md") and anchor not in anchors(path):
                broken.append(f"{page}: {target}#{anchor} (no such heading)")
    assert not broken, f"broken links: {broken}"
