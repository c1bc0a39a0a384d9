"""Shared by the benchmark scripts: machine description and RESULTS.md sections."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def commit() -> str:
    """The checked-out commit (with "+changes" where the tree differs from it), or "unknown"."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def refuse_partial_write(parser, args) -> None:
    """``--write`` publishes a script's whole table and ``--only`` (or ``--placement``, where a
    script has it) runs part of its cells, which it prints but never writes: the two together are
    refused before anything runs (rather than a run whose --write is silently dropped)."""
    for option in ("only", "placement"):
        if args.write and getattr(args, option, None):
            parser.error(f"--write publishes the whole table and --{option} runs part of it (printed, never"
                         " written): drop one of them")


def write_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section between ``<!-- name:begin -->`` and ``<!-- name:end -->``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n\nEach section is written by the script it names.\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def v_twin(base, **changes):
    """``base`` (a one-chunk Problem) as the same model cut into 2p stages on the V placement:
    each stage's costs and memory deltas halved, two per rank (``changes``: more fields)."""
    from schedc import Problem

    data = base.model_dump(exclude_none=True)
    c, mem = base.cost, base.mem_deltas

    def halved(values):
        return [x / 2 for x in values for _ in (0, 1)]

    return Problem.parse({**data, "chunks": 2, "placement": "v",
                          "costs": {k: halved(c[k]) for k in ("F", "B", "W")},
                          "memory": {**data["memory"], "F": halved(mem[0]), "B": halved(mem[1]), "W": halved(mem[2])},
                          **changes})
