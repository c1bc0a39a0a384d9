"""Malformed and hostile inputs through every reader and command: each must end in one line of
error with exit status 2 (or the API's exception), no traceback, within a time bound and a
memory bound.

Each case runs in its own process forked from a fresh server that has imported schedc's CLI
(multiprocessing's forkserver), with an address-space limit; the parent waits at most TIMEOUT
seconds and kills it, so a hang fails its case instead of blocking CI. Valid controls in the same
harness show that the harness itself passes good input through.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import resource
from pathlib import Path

import pytest

from tests.ranks import PRELOAD

ROOT = Path(__file__).resolve().parent.parent
UNIFORM = ROOT / "examples" / "problems" / "uniform.yaml"
TIMEOUT = 60.0  # seconds per case; every case here needs well under one
MEMORY = 6 * 2**30  # address space per case, bytes
MAX_LINE = 400  # characters of the error line

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(PRELOAD)  # the one list every forking test names (tests/ranks.py)


# ---- the harness ----

def _child(conn, kind: str, payload, cwd: str) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    os.chdir(cwd)
    try:
        if kind == "cli":
            from click.testing import CliRunner

            from schedc.app.cli import main

            result = CliRunner().invoke(main, payload)
            exc = result.exception
            crashed = exc is not None and not isinstance(exc, SystemExit)
            out = (result.exit_code, result.stdout, result.stderr, repr(exc) if crashed else "")
        else:
            try:
                API[payload]()
                out = ("returned", "", "", "")
            except Exception as e:  # noqa: BLE001 - reported to the parent
                out = ("raised", type(e).__name__, str(e), "")
    except BaseException as e:  # noqa: BLE001 - MemoryError and the like: the case fails
        out = ("crashed", "", "", repr(e)[:2000])
    conn.send(out)
    conn.close()


def _run(kind: str, payload, cwd: Path):
    receive, send = _CTX.Pipe(duplex=False)
    proc = _CTX.Process(target=_child, args=(send, kind, payload, str(cwd)), daemon=True)
    proc.start()
    send.close()
    try:
        if not receive.poll(TIMEOUT):
            pytest.fail(f"{kind} {payload}: no answer within {TIMEOUT:g} s (hang?)")
        return receive.recv()
    except EOFError:
        pytest.fail(f"{kind} {payload}: the process died (exit code {proc.exitcode}; memory?)")
    finally:
        proc.kill()
        proc.join()


def cli(args: list, cwd: Path):
    return _run("cli", [str(a) for a in args], cwd)


def assert_refused(result, *, contains: str = "") -> str:
    code, out, err, crashed = result
    assert not crashed, f"crashed: {crashed}"
    assert code == 2, f"exit {code}; stdout {out[-500:]!r}; stderr {err[-500:]!r}"
    assert "Traceback" not in out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.rstrip("\n").splitlines()[-1] == errors[0], err[-1000:]
    line = errors[0]
    assert len(line) <= MAX_LINE, f"{len(line)} characters: {line[:200]}..."
    assert line.isprintable()
    assert contains.lower() in line.lower(), line
    return line


# ---- problem files: every case through `simulate`, a sample through the other commands ----

GOOD = "ranks: 2\nmicrobatches: 4\ncosts: {F: 1, B: 1, W: 1}\n"
BOMB = "a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n" \
       "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n" \
       "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n" \
       "ranks: 2\nmicrobatches: 4\ncosts: {F: *h, B: 1, W: 1}\n"


def _problem(**fields) -> str:
    data = {"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": 1, "W": 1}}
    data.update(fields)
    return json.dumps(data)


PROBLEMS: dict[str, tuple[str | bytes, str]] = {  # id -> (file text, a word the error names)
    "not-utf8": (b"ranks: 2\nname: \xff\xfe\n", "UTF-8"),
    "latin1-name": ("ranks: 2\nname: caf\u00e9\n".encode("latin-1"), "UTF-8"),
    "empty": ("", "mapping"),
    "only-comment": ("# nothing\n", "mapping"),
    "top-list": ("- 1\n- 2\n", "mapping"),
    "top-scalar": ("42\n", "mapping"),
    "syntax": ("ranks: [1, 2\n", "YAML"),
    "tabs": ("ranks:\t2\n\tmicrobatches: 4\n", "YAML"),
    "dup-top": (GOOD + "ranks: 3\n", "duplicate"),
    "dup-nested": ("ranks: 2\nmicrobatches: 4\ncosts: {F: 1, F: 2, B: 1, W: 1}\n", "duplicate"),
    "dup-memory": (GOOD + "memory:\n  F: 1\n  F: 2\n", "duplicate"),
    "alias-bomb": (BOMB, "expands"),
    "deep-list": ("ranks: " + "[" * 5000 + "]" * 5000 + "\n", "nested"),
    "deep-map": ("a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\n", ""),
    "int-5000-digits": ("ranks: " + "9" * 5000 + "\n", ""),
    "int-4000-digits": ("ranks: " + "9" * 4000 + "\n" + "microbatches: 4\ncosts: {F: 1, B: 1, W: 1}\n", "range"),
    "python-tag": ("ranks: !!python/object/apply:os.system ['true']\n", "YAML"),
    "binary-tag": ("ranks: !!binary aGVsbG8=\n", "ranks"),
    "timestamp": ("ranks: 2024-01-01\nmicrobatches: 4\ncosts: {F: 1, B: 1, W: 1}\n", "ranks"),
    "unknown-field": (GOOD + "rankz: 3\n", "unknown field"),
    "unknown-nested": (GOOD + "memory: {F: 1, statik: 3}\n", "unknown field"),
    "missing-costs": ("ranks: 2\nmicrobatches: 4\n", "costs"),
    "missing-F": ("ranks: 2\nmicrobatches: 4\ncosts: {B: 1, W: 1}\n", "costs.F"),
    "missing-ranks": ("microbatches: 4\ncosts: {F: 1, B: 1, W: 1}\n", "ranks"),
    "ranks-true": (_problem(ranks=True), "ranks"),
    "ranks-false": (_problem(ranks=False), "ranks"),
    "ranks-zero": (_problem(ranks=0), "ranks"),
    "ranks-negative": (_problem(ranks=-3), "ranks"),
    "ranks-float": (_problem(ranks=2.5), "ranks"),
    "ranks-string": (_problem(ranks="4"), "ranks"),
    "ranks-null": (_problem(ranks=None), "ranks"),
    "ranks-list": (_problem(ranks=[2]), "ranks"),
    "ranks-huge": (_problem(ranks=5000), "ranks"),
    "microbatches-zero": (_problem(microbatches=0), "microbatches"),
    "microbatches-true": (_problem(microbatches=True), "microbatches"),
    "microbatches-huge": (_problem(microbatches=10**7), "microbatches"),
    "chunks-zero": (_problem(chunks=0), "chunks"),
    "chunks-huge": (_problem(chunks=1000), "chunks"),
    "chunks-true": (_problem(chunks=True), "chunks"),
    "ceiling-p4096": (_problem(ranks=4096, microbatches=10**6), "4096000000"),
    "ceiling-p64": (_problem(ranks=64, microbatches=100000), "handles"),
    "ceiling-v": (_problem(ranks=64, chunks=64, microbatches=1000), "handles"),
    "placement-bools": (_problem(placement=[True, False]), "placement"),
    "placement-word": (_problem(placement="zigzag"), "placement"),
    "placement-short": (_problem(placement=[0]), "placement"),
    "placement-twice": (_problem(placement=[0, 0]), "placement"),
    "placement-range": (_problem(placement=[0, 5]), "placement"),
    "placement-lists-dup": (_problem(placement=[[0], [0]]), "placement"),
    "placement-lists-miss": (_problem(chunks=2, placement=[[0, 1], [2]]), "placement"),
    "placement-negative": (_problem(placement=[-1, 0]), "placement"),
    "placement-nested-deep": (_problem(placement=[[[0]], [[1]]]), "placement"),
    "costs-scalar": (_problem(costs=3), "costs"),
    "costs-zero": (_problem(costs={"F": 0, "B": 1, "W": 1}), "costs.F"),
    "costs-negative": (_problem(costs={"F": 1, "B": -1, "W": 1}), "costs.B"),
    "costs-nan-yaml": ("ranks: 2\nmicrobatches: 4\ncosts: {F: .nan, B: 1, W: 1}\n", "finite"),
    "costs-inf-yaml": ("ranks: 2\nmicrobatches: 4\ncosts: {F: .inf, B: 1, W: 1}\n", "finite"),
    "costs-minus-inf": ("ranks: 2\nmicrobatches: 4\ncosts: {F: 1, B: -.inf, W: 1}\n", "finite"),
    "costs-1e308": (_problem(costs={"F": 1e308, "B": 1e308, "W": 1e308}), "range"),
    "costs-denormal": (_problem(costs={"F": 5e-324, "B": 5e-324, "W": 5e-324}), "unit"),
    "costs-tiny": (_problem(costs={"F": 1e-12, "B": 1e-12, "W": 1e-12}), "unit"),
    "costs-bool": (_problem(costs={"F": True, "B": 1, "W": 1}), "number"),
    "costs-string": (_problem(costs={"F": "1", "B": 1, "W": 1}), "number"),
    "costs-empty-list": (_problem(costs={"F": [], "B": 1, "W": 1}), "costs.F"),
    "costs-wrong-length": (_problem(costs={"F": [1, 2, 3], "B": 1, "W": 1}), "costs.F"),
    "costs-nested-list": (_problem(costs={"F": [[1], [2]], "B": 1, "W": 1}), "costs.F"),
    "costs-mapping": (_problem(costs={"F": {"a": 1}, "B": 1, "W": 1}), "costs.F"),
    "costs-BW-zero": (_problem(costs={"F": 1, "B": 1, "W": 1, "BW": 0}), "costs.BW"),
    "costs-list-nan": ("ranks: 2\nmicrobatches: 4\ncosts: {F: [1, .nan], B: 1, W: 1}\n", "finite"),
    "comm-negative": (_problem(comm=-1), "comm"),
    "comm-nan": ("ranks: 2\nmicrobatches: 4\ncosts: {F: 1, B: 1, W: 1}\ncomm: .nan\n", "finite"),
    "comm-true": (_problem(comm=True), "comm"),
    "comm-string": (_problem(comm="fast"), "comm"),
    "comm-huge": (_problem(comm=1e300), "range"),
    "comm-list": (_problem(comm=[1, 2]), "comm"),
    "memory-string": (_problem(memory="lots"), "memory"),
    "memory-F-negative": (_problem(memory={"F": -1}), "memory"),
    "memory-B-positive": (_problem(memory={"F": 1, "B": 2}), "memory"),
    "memory-sum": (_problem(memory={"F": 1, "B": -0.5, "W": -0.2}), "sum"),
    "memory-static-negative": (_problem(memory={"static": -1}), "static"),
    "memory-static-nan": ("ranks: 2\nmicrobatches: 4\ncosts: {F: 1, B: 1, W: 1}\nmemory: {static: .nan}\n", "finite"),
    "memory-limit-zero": (_problem(memory={"F": 1, "limit": 0}), "limit"),
    "memory-limit-negative": (_problem(memory={"limit": -5}), "limit"),
    "memory-limit-too-small": (_problem(memory={"F": 1, "limit": 0.5}), "limit"),
    "memory-limit-bool": (_problem(memory={"limit": True}), "number"),
    "memory-limit-wrong-length": (_problem(memory={"limit": [1, 2, 3]}), "limit"),
    "memory-huge": (_problem(memory={"F": 1e300}), "range"),
    "objective-word": (_problem(objective="speed"), "objective"),
    "objective-number": (_problem(objective=1), "objective"),
    "name-newline": (_problem(name="a\nb"), "name"),
    "name-escape": (_problem(name="x\x1b[31mred"), "name"),
    "name-long": (_problem(name="n" * 5000), "name"),
    "name-number": (_problem(name=5), "name"),
    "stage-blocks-length": (_problem(stage_blocks=[1, 2, 3]), "stage_blocks"),
    "stage-blocks-zero": (_problem(stage_blocks=[0, 1]), "stage_blocks"),
}

# Recompute and offload (issue 25): each error is one line naming the field (2 stages here).
POLICY_PROBLEMS: dict[str, tuple[str, str]] = {
    "recompute-time-zero": (_problem(recompute={"time": 0}), "recompute.time: must be > 0, got 0"),
    "recompute-time-negative": (_problem(recompute={"time": [1, -1]}), "recompute.time: must be > 0, got -1 (index 1)"),
    "recompute-time-nan": (GOOD + "recompute: {time: .nan}\n", "finite"),
    "recompute-time-bool": (_problem(recompute={"time": True}), "recompute.time: must be a number"),
    "recompute-time-huge": (_problem(recompute={"time": 1e300}), "recompute.time: 1e+300 is out of range"),
    "recompute-keep-negative": (_problem(recompute={"keep": -0.1}), "recompute.keep: must be >= 0"),
    "recompute-keep-above": (_problem(recompute={"keep": 1.5}), "recompute.keep of stage 0 is 1.5, above the stage's"
                             " activation memory.F 1"),
    "recompute-keep-above-stage": (_problem(memory={"F": [1, 3]}, recompute={"keep": [0.5, 4]}),
                                   "recompute.keep of stage 1 is 4, above the stage's activation memory.F 3"),
    "recompute-keep-length": (_problem(recompute={"keep": [0.1, 0.1, 0.1]}), "recompute.keep has 3 values but there"
                              " are 2 stages"),
    "recompute-time-length": (_problem(recompute={"time": [1]}), "recompute.time has 1 values but there are 2 stages"),
    "recompute-unknown": (_problem(recompute={"time": 1, "kep": 0}), "unknown field 'recompute.kep' (did you mean"
                          " 'keep'?)"),
    "recompute-unknown-far": (_problem(recompute={"granularity": "full"}), "unknown field 'recompute.granularity'"
                              " (known: time, keep, selective)"),
    "recompute-not-mapping": (_problem(recompute=[1, 2]), "recompute: Input should be a valid dictionary"),
    "selective-time-zero": (_problem(recompute={"selective": {"time": 0, "keep": 0.5}}),
                            "recompute.selective.time: must be > 0, got 0"),
    "selective-keep-above": (_problem(recompute={"selective": {"time": 0.1, "keep": [0.5, 2]}}),
                             "recompute.selective.keep of stage 1 is 2, above the stage's activation memory.F 1"),
    "selective-keep-length": (_problem(recompute={"selective": {"time": 0.1, "keep": [0.5] * 5}}),
                              "recompute.selective.keep has 5 values but there are 2 stages"),
    "selective-missing-keep": (_problem(recompute={"selective": {"time": 0.1}}), "recompute.selective.keep: Field"
                               " required"),
    "selective-unknown": (_problem(recompute={"selective": {"time": 0.1, "keep": 0.5, "tim": 1}}),
                          "unknown field 'recompute.selective.tim' (did you mean 'time'?)"),
    "offload-time-zero": (_problem(offload={"time": 0}), "offload.time: must be > 0, got 0"),
    "offload-time-negative": (_problem(offload={"time": [0.5, -2]}), "offload.time: must be > 0, got -2 (index 1)"),
    "offload-time-length": (_problem(offload={"time": [0.5, 0.5, 0.5]}), "offload.time has 3 values but there are 2"
                            " stages"),
    "offload-missing-time": (_problem(offload={}), "offload.time: Field required"),
    "offload-unknown": (_problem(offload={"tme": 1}), "unknown field 'offload.tme' (did you mean 'time'?)"),
    "offload-unknown-far": (_problem(offload={"time": 1, "bandwidth": 15}), "unknown field 'offload.bandwidth'"
                            " (known: time)"),
    "offload-scalar": (_problem(offload=0.5), "offload: Input should be a valid dictionary"),
    "recompute-limit-too-small": (_problem(memory={"F": 1, "limit": 0.2}, recompute={"keep": 0.1}),
                                  "memory.limit of rank 0 is 0.2, below the 1 that any schedule needs there"),
}

JSON_PROBLEMS: dict[str, tuple[str | bytes, str]] = {
    "json-syntax": ('{"ranks": 2,', "JSON"),
    "json-nan": ('{"ranks": 2, "microbatches": 4, "costs": {"F": NaN, "B": 1, "W": 1}}', "NaN"),
    "json-infinity": ('{"ranks": 2, "microbatches": 4, "costs": {"F": Infinity, "B": 1, "W": 1}}', "Infinity"),
    "json-dup": ('{"ranks": 2, "ranks": 3, "microbatches": 4, "costs": {"F": 1, "B": 1, "W": 1}}', "duplicate"),
    "json-deep": ('{"ranks": ' + "[" * 5000 + "]" * 5000 + "}", "nested"),
    "json-65-deep": ('{"ranks": ' + "[" * 65 + "]" * 65 + "}", "nested deeper than 64 levels"),
    "json-huge-float": ('{"ranks": 2, "microbatches": 4, "costs": {"F": 1e999, "B": 1, "W": 1}}', "1e999"),
    "json-bigint": ('{"ranks": ' + "9" * 5000 + "}", "range"),
    "json-trailing": (_problem() + " garbage", "JSON"),
    "json-list": ("[1, 2]", "mapping"),
    "json-not-utf8": (b'{"name": "\xff"}', "UTF-8"),
    "json-utf16": (_problem().encode("utf-16"), "UTF-8"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    for key, (text, _) in {**PROBLEMS, **JSON_PROBLEMS}.items():
        path = d / (f"{key}.json" if key.startswith("json-") else f"{key}.yaml")
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    (d / "good.yaml").write_text(GOOD)
    return d


@pytest.mark.parametrize("key", sorted(PROBLEMS) + sorted(JSON_PROBLEMS))
def test_problem_file_is_refused(files, key):
    word = {**PROBLEMS, **JSON_PROBLEMS}[key][1]
    name = f"{key}.json" if key.startswith("json-") else f"{key}.yaml"
    assert_refused(cli(["simulate", files / name, "-s", "1f1b"], files), contains=word)


@pytest.mark.parametrize("command", [
    ["solve", "{f}", "-o", "out.json", "--time-limit", "5"],
    ["compare", "{f}"],
    ["show", "{f}", "-s", "1f1b", "-o", "g.png"],
    ["compile", "{f}", "-s", "1f1b", "-o", "c.json"],
    ["export", "{f}", "-s", "1f1b", "-o", "e.csv"],
    ["check", "{f}"],
])
@pytest.mark.parametrize("key", ["not-utf8", "alias-bomb", "dup-top", "ceiling-p4096", "costs-1e308", "name-escape"])
def test_every_command_refuses_a_bad_problem_file(files, command, key):
    args = [a.replace("{f}", str(files / f"{key}.yaml")) for a in command]
    assert_refused(cli(args, files))


@pytest.fixture(scope="module")
def policy_files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("policies")
    for key, (text, _) in POLICY_PROBLEMS.items():
        (d / f"{key}.yaml").write_text(text)
    return d


@pytest.mark.parametrize("command", [
    ["simulate", "{f}", "-s", "1f1b"],
    ["solve", "{f}", "-o", "out.json", "--time-limit", "5"],
])
@pytest.mark.parametrize("key", sorted(POLICY_PROBLEMS))
def test_a_bad_recompute_or_offload_section_is_one_line_naming_the_field(policy_files, command, key):
    args = [a.replace("{f}", str(policy_files / f"{key}.yaml")) for a in command]
    line = assert_refused(cli(args, policy_files), contains=POLICY_PROBLEMS[key][1])
    assert line.startswith(f"error: {policy_files / key}.yaml: ")
    assert not (policy_files / "out.json").exists()


def test_the_harness_runs_a_good_problem(files):
    code, out, err, crashed = cli(["simulate", files / "good.yaml", "-s", "1f1b"], files)
    assert (code, crashed) == (0, ""), err


@pytest.mark.parametrize("what", ["directory", "fifo", "dev-zero", "missing", "oversized"])
def test_files_that_are_not_files(tmp_path, what):
    target = {"directory": tmp_path, "fifo": tmp_path / "pipe.yaml", "dev-zero": Path("/dev/zero"),
              "missing": tmp_path / "nothing.yaml", "oversized": tmp_path / "big.yaml"}[what]
    if what == "fifo":
        os.mkfifo(target)
    if what == "oversized":
        with open(target, "wb") as f:
            f.truncate(300 * 2**20)  # sparse: no disk used
    for command in (["simulate", target, "-s", "1f1b"], ["check", target]):
        assert_refused(cli(command, tmp_path))


# ---- schedule files: `schedc check` verifies every field ----

@pytest.fixture(scope="module")
def schedule_files(tmp_path_factory) -> Path:
    import schedc

    d = tmp_path_factory.mktemp("schedules")
    schedc.compile(UNIFORM, "zb-h1").save(d / "named.json")
    schedc.compile(schedc.load_problem(UNIFORM).with_changes(microbatches=4), "ilp", time_limit=10).save(d / "solved.json")
    return d


def _edit(data: dict, path: str, value) -> dict:
    """``data`` with the field at dotted ``path`` (list indices as numbers) set, or removed
    when ``value`` is DELETE."""
    keys = [int(k) if k.lstrip("-").isdigit() else k for k in path.split(".")]
    node = data
    for k in keys[:-1]:
        node = node[k]
    if value is DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


DELETE = object()
SCHEDULE_EDITS = {  # id -> (file, dotted path, new value)
    "format": ("named", "format", "other"),
    "no-format": ("named", "format", DELETE),
    "version-new": ("named", "version", 99),
    "version-string": ("named", "version", "1"),
    "version-bool": ("named", "version", True),
    "version-zero": ("named", "version", 0),
    "problem-ranks-bool": ("named", "problem.ranks", True),
    "problem-costs-nan": ("named", "problem.costs.F", "nan"),
    "problem-ceiling": ("named", "problem.microbatches", 10**6),
    "problem-missing": ("named", "problem", DELETE),
    "problem-extra": ("named", "problem.extra", 1),
    "schedule-op-dropped": ("named", "schedule.ranks.0", []),
    "schedule-op-kind": ("named", "schedule.ranks.0.0", ["X", 0, 0]),
    "schedule-op-stage": ("named", "schedule.ranks.0.0", ["F", 99, 0]),
    "schedule-op-bool": ("named", "schedule.ranks.0.0", ["F", True, 0]),
    "schedule-name-escape": ("named", "schedule.name", "a\x1b[2J"),
    "program-op-unknown": ("named", "program.0.0.op", "HACK"),
    "program-dropped-rank": ("named", "program.1", []),
    "program-peer-range": ("named", "program.0.0.peer", 99),
    "program-send-peer": ("named", "program.0.1.peer", 3),
    "program-step-stage": ("named", "program.0.-1.stage", 0),
    "timeline-makespan": ("named", "timeline.makespan", 1.0),
    "timeline-span": ("named", "timeline.span", 1.0),
    "timeline-bubble": ("named", "timeline.bubble_makespan", 0.0),
    "timeline-busy": ("named", "timeline.busy", [0, 0, 0, 0]),
    "timeline-fits": ("named", "timeline.fits", False),
    "timeline-peak": ("named", "timeline.peak_memory", [1, 1, 1, 1]),
    "timeline-schedule": ("named", "timeline.schedule", "1f1b"),
    "timeline-extra": ("named", "timeline.extra", 1),
    "timeline-violations": ("named", "timeline.violations", ["made up"]),
    "provenance-newline": ("named", "provenance.command", "schedc\nrm -rf /"),
    "provenance-escape": ("named", "provenance.schedc", "\x1b]0;owned\x07"),
    "provenance-number": ("named", "provenance.created", 5),
    "provenance-missing": ("named", "provenance", DELETE),
    "solver-objective": ("solved", "solver.objective", 1.0),
    "solver-bound-above": ("solved", "solver.bound", 1e6),
    "solver-gap": ("solved", "solver.gap", 0.5),
    "solver-gap-range": ("solved", "solver.gap", 7),
    "solver-status": ("solved", "solver.status", "perfect"),
    "solver-kind": ("solved", "solver.objective_kind", "span"),
    "solver-makespan": ("solved", "solver.makespan", 2.0),
    "solver-peak": ("solved", "solver.peak_memory", [0, 0, 0, 0]),
    "solver-fits": ("solved", "solver.fits", False),
    "solver-seconds": ("solved", "solver.seconds", -1),
    "solver-binaries-bool": ("solved", "solver.binaries", True),
    "solver-warm-better": ("solved", "solver.warm_objective", 1.0),
    "solver-extra": ("solved", "solver.extra", 1),
    "solver-name-escape": ("solved", "solver.solver", "cbc\x1b[0m"),
    "solver-not-evaluated": ("solved", "solver.not_evaluated", [1]),
}


@pytest.mark.parametrize("key", sorted(SCHEDULE_EDITS))
def test_tampered_schedule_file_is_refused(schedule_files, tmp_path, key):
    source, path, value = SCHEDULE_EDITS[key]
    data = json.loads((schedule_files / f"{source}.json").read_text())
    (tmp_path / "f.json").write_text(json.dumps(_edit(data, path, value)))
    assert_refused(cli(["check", tmp_path / "f.json"], tmp_path))


@pytest.mark.parametrize("source", ["named", "solved"])
def test_the_harness_checks_an_untouched_schedule_file(schedule_files, source):
    code, out, err, crashed = cli(["check", schedule_files / f"{source}.json"], schedule_files)
    assert (code, crashed) == (0, ""), err


SCHEDULE_TEXTS = {
    "truncated": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    "not-utf8": lambda text: text.replace('"uniform"', '"\udcff"', 1),
    "json-list": lambda text: "[]",
    "nan": lambda text: text.replace('"makespan": ', '"makespan": NaN, "x": ', 1),
    "duplicate-key": lambda text: text.replace('"format"', '"format": "schedc.schedule", "format"', 1),
    "deep": lambda text: '{"format": "schedc.schedule", "version": 1, "problem": ' + "[" * 5000 + "]" * 5000 + "}",
}


@pytest.mark.parametrize("key", sorted(SCHEDULE_TEXTS))
def test_corrupt_schedule_file_is_refused(schedule_files, tmp_path, key):
    text = SCHEDULE_TEXTS[key]((schedule_files / "named.json").read_text())
    (tmp_path / "f.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    for command in (["check", tmp_path / "f.json"], ["simulate", tmp_path / "f.json"]):
        assert_refused(cli(command, tmp_path))


def test_a_huge_schedule_file_is_refused_quickly(tmp_path):
    """p = 4096, m = 10**6 in a small file: refused by the problem's ceiling, not simulated."""
    data = {"format": "schedc.schedule", "version": 1,
            "provenance": {"schedc": "0", "command": "x", "created": "now"},
            "problem": {"ranks": 4096, "microbatches": 10**6, "costs": {"F": 1, "B": 1, "W": 1}},
            "schedule": {"name": "x", "ranks": [[["F", 0, m] for m in range(2000)]] * 40},
            "program": [[]] * 4096, "timeline": {}, "solver": None}
    (tmp_path / "huge.json").write_text(json.dumps(data))
    assert_refused(cli(["check", tmp_path / "huge.json"], tmp_path), contains="handles")


# ---- torch CSV schedules (`schedc import`) ----

CSVS = {
    "not-utf8": b"0F0,\xff\n",
    "empty": b"",
    "bad-cell": b"0F0,XYZ\n0F0\n",
    "no-microbatch": b"0F\n0F\n",
    "unknown-action": b"0Q0\n0Q0\n",
    "wrong-ranks": b"0F0\n0F0\n0F0\n0F0\n0F0\n0F0\n",
    "stage-range": b"99F0\n1F0\n",
    "incomplete": b"0F0\n1F0\n",
    "huge-number": b"0F" + b"9" * 5000 + b"\n",
}


@pytest.mark.parametrize("key", sorted(CSVS))
def test_torch_csv_is_refused(tmp_path, key):
    (tmp_path / "s.csv").write_bytes(CSVS[key])
    assert_refused(cli(["import", tmp_path / "s.csv", UNIFORM], tmp_path))


def test_a_directory_as_torch_csv(tmp_path):
    assert_refused(cli(["import", tmp_path, UNIFORM], tmp_path))


# ---- ablation configs: nothing written outside -o, nothing-to-show is an error ----

CELL = "problem: {ranks: 2, microbatches: 4, costs: {F: 1, B: 1, W: 1}}"
ABLATIONS = {  # id -> (config text, word in the error)
    "name-parent": (f"name: ../../escaped\nproblems:\n  - {{{CELL}}}\n", "file name"),
    "name-absolute": (f"name: /tmp/schedc-escaped\nproblems:\n  - {{{CELL}}}\n", "file name"),
    "name-hidden": (f"name: .hidden\nproblems:\n  - {{{CELL}}}\n", "file name"),
    "name-escape": (f"name: \"a\\e[31m\"\nproblems:\n  - {{{CELL}}}\n", "file name"),
    "entry-name-parent": (f"problems:\n  - {{name: ../../escaped, {CELL}}}\n", "file name"),
    "entry-name-slash": (f"problems:\n  - {{name: a/b, {CELL}}}\n", "file name"),
    "all-skipped": ("problems:\n  - {problem: {ranks: 2, microbatches: 4, costs: {F: 1, B: 1, W: 1}}}\n"
                    "grid: {microbatches: [1000000]}\n", "nothing to show"),
    "no-problems": ("problems: []\n", "problems"),
    "unknown-schedule": (f"problems:\n  - {{{CELL}}}\nschedules: [nope]\n", "nope"),
    "dup-key": (f"name: a\nname: b\nproblems:\n  - {{{CELL}}}\n", "duplicate"),
    "not-utf8": (b"name: \xff\n", "UTF-8"),
    "alias-bomb": (BOMB.replace("ranks: 2\nmicrobatches: 4\ncosts: {F: *h, B: 1, W: 1}\n", "problems: *h\n"), "expands"),
    "two-sources": (f"problems:\n  - {{file: x.yaml, {CELL}}}\n", "exactly one"),
    "time-limit-nan": (f"problems:\n  - {{{CELL}}}\nsolver: {{time_limit: .nan}}\n", "time_limit"),
    "time-limit-negative": (f"problems:\n  - {{{CELL}}}\nsolver: {{time_limit: -1}}\n", "time_limit"),
    "threads-zero": (f"problems:\n  - {{{CELL}}}\nsolver: {{threads: 0}}\n", "threads"),
    "grid-memory-nan": (f"problems:\n  - {{{CELL}}}\ngrid: {{memory: [.nan]}}\n", "finite"),
    "grid-both-m": (f"problems:\n  - {{{CELL}}}\ngrid: {{microbatches: [4], microbatches_per_rank: [2]}}\n", "not both"),
    "missing-file": ("problems:\n  - {file: nowhere.yaml}\n", "nowhere"),
    "top-list": ("- 1\n", "mapping"),
    # every name that refers to something must exist; every list that must hold something must
    "gantt-unknown-cell": (f"problems:\n  - {{{CELL}}}\ngantt: [nope]\n", "gantt: no cell 'nope'"),
    "gantt-near-miss": (f"problems:\n  - {{{CELL}}}\ngrid: {{memory: [1, 2]}}\ngantt: [inline-mem3]\n",
                        "did you mean"),
    "gantt-twice": (f"problems:\n  - {{{CELL}}}\ngantt: [inline, inline]\n", "twice"),
    "schedules-empty": (f"problems:\n  - {{{CELL}}}\nschedules: []\n", "schedules: empty"),
    "schedules-twice": (f"problems:\n  - {{{CELL}}}\nschedules: [1f1b, 1f1b]\n", "twice"),
    "schedules-blank-name": (f"problems:\n  - {{{CELL}}}\nschedules: ['']\n", "unknown schedule"),
    "schedules-spaced-name": (f"problems:\n  - {{{CELL}}}\nschedules: [' 1f1b']\n", "did you mean '1f1b'"),
    "solver-unknown": (f"problems:\n  - {{{CELL}}}\nsolver: {{solver: gurobi}}\n", "solver.solver"),
    "profile-missing-file": ("problems:\n  - {profile: nowhere.py:gpt}\n", "problems[0].profile"),
    "profile-no-function": ("problems:\n  - {profile: nowhere.py}\n", "FILE.py:FUNCTION"),
    "execute-nothing-profiled": (f"problems:\n  - {{{CELL}}}\nexecute: {{steps: 2}}\n", "execute"),
    "per-rank-without-ranks": (f"problems:\n  - {{{CELL}}}\ngrid: {{microbatches_per_rank: [2]}}\n", "ranks axis"),
    "entries-share-a-name": (f"problems:\n  - {{{CELL}}}\n  - {{{CELL}}}\n", "own name"),
    "cell-ids-collide": (f"problems:\n  - {{{CELL}}}\ngrid: {{memory: [1.0000001, 1.0000002]}}\n", "id"),
    "entry-grid-empty-axis": (f"problems:\n  - {{{CELL}, grid: {{comm: []}}}}\n", "problems[0].grid.comm"),
    "grid-ranks-bool": (f"problems:\n  - {{{CELL}}}\ngrid: {{ranks: [true]}}\n", "ranks"),
    "grid-memory-zero": (f"problems:\n  - {{{CELL}}}\ngrid: {{memory: [0]}}\n", "memory"),
    "heavy-zero": (f"problems:\n  - {{{CELL}, heavy_last: 0}}\n", "heavy_last"),
    # the grid's size: refused above the ceiling before anything runs (or is expanded)
    "grid-200x200": (f"problems:\n  - {{{CELL}}}\ngrid: {{ranks: {list(range(1, 201))},"
                     f" microbatches: {list(range(1, 201))}}}\n", "--max-cells 40000"),
    "grid-10-to-the-8": (f"problems:\n  - {{{CELL}}}\ngrid: {{ranks: {list(range(1, 101))},"
                         f" microbatches: {list(range(1, 101))}, comm: {list(range(100))},"
                         f" memory: {list(range(1, 101))}}}\n", "100000000 cells"),
}


@pytest.mark.parametrize("key", sorted(ABLATIONS))
def test_ablation_config_is_refused_and_writes_nothing_outside(tmp_path, key):
    text, word = ABLATIONS[key]
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    before = set(tmp_path.rglob("*"))
    assert_refused(cli(["ablate", work / "config.yaml", "-o", work / "out", "--quiet"], work), contains=word)
    written = set(tmp_path.rglob("*")) - before
    assert all(work / "out" in p.parents or p == work / "out" for p in written), written
    assert not Path("/tmp/schedc-escaped").exists()
    assert not any(p.suffix == ".png" for p in written)


def test_ablation_with_the_default_folder_and_a_bad_name_writes_nothing(tmp_path):
    (tmp_path / "c.yaml").write_text(f"name: ../escaped\nproblems:\n  - {{{CELL}}}\n")
    assert_refused(cli(["ablate", tmp_path / "c.yaml", "--quiet"], tmp_path))
    assert not (tmp_path.parent / "escaped").exists() and not (tmp_path / "out").exists()


def test_an_ablation_keeps_a_problem_files_own_memory_limit(tmp_path):
    """Without a memory axis the problem's limit stands (it used to be dropped without a word)."""
    problem = tmp_path / "p.yaml"
    problem.write_text("ranks: 2\nmicrobatches: 4\ncosts: {F: 1, B: 1, W: 1}\nmemory: {F: 1, limit: 2}\n")
    (tmp_path / "c.yaml").write_text(f"problems:\n  - {{file: {problem}}}\nschedules: [1f1b, gpipe]\n")
    code, out, err, crashed = cli(["ablate", tmp_path / "c.yaml", "-o", tmp_path / "out", "--quiet"], tmp_path)
    assert (code, crashed) == (0, ""), err
    import csv

    rows = {r["schedule"]: r for r in csv.DictReader((tmp_path / "out" / "results.csv").open())}
    assert float(rows["1f1b"]["memory_limit"]) == 2.0
    assert rows["gpipe"]["status"] == "over memory"


def test_a_cell_name_with_odd_characters_becomes_a_safe_file_name(tmp_path):
    (tmp_path / "we ird;$(x).yaml").write_text(GOOD)
    (tmp_path / "c.yaml").write_text("problems:\n  - {file: 'we ird;$(x).yaml'}\nschedules: [1f1b]\n")
    code, out, err, crashed = cli(["ablate", tmp_path / "c.yaml", "-o", tmp_path / "out", "--quiet"], tmp_path)
    assert (code, crashed) == (0, ""), err
    names = [p.name for p in (tmp_path / "out" / "problems").iterdir()]
    assert names and all(n.replace("_", "").replace("-", "").replace(".", "").isalnum() for n in names), names


def _axis_values() -> dict[str, list]:
    """Two equal values for every axis of the grid (a new axis must be added here)."""
    from schedc.app.ablate_config import Grid

    same = {"ranks": [2, 2], "microbatches": [4, 4], "microbatches_per_rank": [2, 2], "chunks": [1, 1],
            "placement": ["loop", "loop"], "comm": [0, 0.0], "memory": [1, 1.0], "objective": ["span", "span"],
            "policies": ["none", "none"]}
    return {axis: same[axis] for axis in Grid.model_fields}


@pytest.mark.parametrize("how", ["empty", "twice"])
@pytest.mark.parametrize("axis", sorted(_axis_values()))
def test_every_grid_axis_refuses_an_empty_or_repeated_list(tmp_path, axis, how):
    values = [] if how == "empty" else _axis_values()[axis]
    (tmp_path / "c.yaml").write_text(f"problems:\n  - {{{CELL}}}\ngrid: {json.dumps({axis: values})}\n")
    line = assert_refused(cli(["ablate", tmp_path / "c.yaml", "-o", tmp_path / "out", "-q"], tmp_path),
                          contains=f"grid.{axis}: ")
    assert ("empty" if how == "empty" else "given twice") in line
    assert not (tmp_path / "out").exists()


def test_raising_the_cell_ceiling_runs_the_grid(tmp_path):
    (tmp_path / "c.yaml").write_text(f"problems:\n  - {{{CELL}}}\ngrid: {{microbatches: [2, 3, 4]}}\nschedules: [1f1b]\n")
    line = assert_refused(cli(["ablate", tmp_path / "c.yaml", "-o", tmp_path / "out", "--max-cells", "2"], tmp_path),
                          contains="--max-cells 3")
    assert "3 cells" in line and not (tmp_path / "out").exists()
    code, out, err, crashed = cli(["ablate", tmp_path / "c.yaml", "-o", tmp_path / "out", "--max-cells", "3"], tmp_path)
    assert (code, crashed) == (0, ""), err
    assert "3 cells x 1 schedules" in err and "[3/3]" in err


# ---- list-valued options: each refuses an empty list, an empty, repeated or unknown name ----

LIST_OPTION_ARGS = {"compare": [UNIFORM]}  # what a command with a list option needs besides it
BAD_LISTS = {"all-commas": ",,,", "one-comma": ",", "empty": "", "blank": "  ", "empty-name": "{a},,{b}",
             "trailing-comma": "{a},", "leading-comma": ",{a}", "twice": "{a},{a}", "twice-spaced": " {a} , {a}",
             "unknown": "{a},nope", "space-inside": "{a} {b}", "control": "{a}\x1b[2J"}


def _list_options() -> list[tuple[str, str]]:
    """(command, option) of every option that takes a comma-separated list, found by its type or
    by its help text, so that a new one is tested too."""
    from schedc.app.cli import main
    from schedc.app.cli_base import NameList

    return sorted((name, p.opts[-1]) for name, cmd in main.all_commands().items() for p in cmd.params
                  if isinstance(p.type, NameList)
                  or re.search(r"comma[- ]separated|separated by commas", getattr(p, "help", None) or "", re.I))


def test_every_list_option_is_a_checked_name_list():
    from schedc.app.cli import main
    from schedc.app.cli_base import NameList

    found = _list_options()
    assert ("compare", "--schedules") in found
    for command, option in found:
        param = next(p for p in main.all_commands()[command].params if option in p.opts)
        assert isinstance(param.type, NameList), f"{command} {option} splits a list without NameList"
        assert command in LIST_OPTION_ARGS, f"add {command}'s arguments to LIST_OPTION_ARGS"


def _names(command: str, option: str) -> list[str]:
    from schedc.app.cli import main

    return list(next(p for p in main.all_commands()[command].params if option in p.opts).type.registry)


@pytest.mark.parametrize("key", sorted(BAD_LISTS))
@pytest.mark.parametrize("command, option", _list_options())
def test_a_list_option_refuses_empty_repeated_and_unknown_names(tmp_path, command, option, key):
    a, b = _names(command, option)[:2]
    value = BAD_LISTS[key].format(a=a, b=b)
    line = assert_refused(cli([command, *LIST_OPTION_ARGS[command], option, value], tmp_path), contains=option)
    assert "\x1b" not in line


@pytest.mark.parametrize("command, option", _list_options())
def test_a_list_option_takes_names_with_spaces_around(tmp_path, command, option):
    a, b = _names(command, option)[:2]
    code, out, err, crashed = cli([command, *LIST_OPTION_ARGS[command], option, f" {a} , {b} "], tmp_path)
    assert (code, crashed) == (0, ""), err
    assert f"\n{a} " in out and f"\n{b} " in out


# ---- measured traces (`schedc show --measured`) ----

def _trace(ranks) -> str:
    return json.dumps({"traceEvents": [], "schedc": {"format": "schedc.trace", "version": 1, "schedule": "zb-h1",
                                                     "step": 0, "ranks": ranks}})


EVENT = {"instr": "F0", "op": "F", "stage": 0, "mb": 0, "start": 0.0, "end": 1.0}
TRACES = {
    "not-json": "{",
    "not-utf8": b"\xff\xfe",
    "no-schedc": json.dumps({"traceEvents": []}),
    "format": json.dumps({"schedc": {"format": "other", "ranks": []}}),
    "ranks-not-list": _trace(5),
    "rank-not-list": _trace([5, 6, 7, 8]),
    "event-not-object": _trace([[5], [], [], []]),
    "event-missing-op": _trace([[{k: v for k, v in EVENT.items() if k != "op"}], [], [], []]),
    "event-start-string": _trace([[dict(EVENT, start="0")], [], [], []]),
    "event-stage-bool": _trace([[dict(EVENT, stage=True)], [], [], []]),
    "event-backwards": _trace([[dict(EVENT, start=2.0, end=1.0)], [], [], []]),
    "event-memory-string": _trace([[dict(EVENT, memory="1")], [], [], []]),
    "nan": _trace([[EVENT], [], [], []]).replace("1.0", "NaN", 1),
    "wrong-schedule": _trace([[EVENT], [], [], []]).replace('"zb-h1"', '"1f1b"'),
    "wrong-ranks": _trace([[EVENT]]),
    "wrong-ops": _trace([[EVENT], [], [], []]),
    "deep": '{"schedc": ' + "[" * 5000 + "]" * 5000 + "}",
}


@pytest.mark.parametrize("key", sorted(TRACES))
def test_malformed_measured_trace_is_refused(tmp_path, key):
    text = TRACES[key]
    (tmp_path / "t.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    assert_refused(cli(["show", UNIFORM, "-s", "zb-h1", "-o", tmp_path / "g.png", "--measured", tmp_path / "t.json"],
                       tmp_path))


# ---- command-line options ----

OPTIONS = {
    "time-limit-nan": ["solve", UNIFORM, "-o", "x.json", "--time-limit", "nan"],
    "time-limit-inf": ["solve", UNIFORM, "-o", "x.json", "--time-limit", "inf"],
    "time-limit-negative": ["solve", UNIFORM, "-o", "x.json", "--time-limit", "-1"],
    "time-limit-zero": ["solve", UNIFORM, "-o", "x.json", "--time-limit", "0"],
    "time-limit-word": ["solve", UNIFORM, "-o", "x.json", "--time-limit", "soon"],
    "gap-nan": ["solve", UNIFORM, "-o", "x.json", "--gap", "nan"],
    "gap-two": ["solve", UNIFORM, "-o", "x.json", "--gap", "2"],
    "threads-zero": ["solve", UNIFORM, "-o", "x.json", "--threads", "0"],
    "solver-unknown": ["solve", UNIFORM, "-o", "x.json", "--solver", "gurobi"],
    "memory-limit-nan": ["simulate", UNIFORM, "-s", "1f1b", "--memory-limit", "nan"],
    "memory-limit-negative": ["simulate", UNIFORM, "-s", "1f1b", "--memory-limit", "-3"],
    "memory-limit-too-small": ["simulate", UNIFORM, "-s", "1f1b", "--memory-limit", "1"],
    "objective-word": ["simulate", UNIFORM, "-s", "1f1b", "--objective", "speed"],
    "schedule-unknown": ["simulate", UNIFORM, "-s", "nope"],
    "schedule-missing": ["simulate", UNIFORM],
    "schedule-not-applicable": ["simulate", UNIFORM, "-s", "zb-v"],
    "bubble-F-nan": ["bubble", "-p", "4", "-m", "8", "-F", "nan"],
    "bubble-F-inf": ["bubble", "-p", "4", "-m", "8", "-F", "inf"],
    "bubble-F-zero": ["bubble", "-p", "4", "-m", "8", "-F", "0"],
    "bubble-W-negative": ["bubble", "-p", "4", "-m", "8", "-W", "-1"],
    "bubble-p-zero": ["bubble", "-p", "0", "-m", "8"],
    "bubble-p-word": ["bubble", "-p", "four", "-m", "8"],
    "show-unwritable": ["show", UNIFORM, "-s", "zb-h1", "-o", "file.txt/sub/g.png"],
    "export-unwritable": ["export", UNIFORM, "-s", "zb-h1", "-o", "file.txt/e.csv"],
    "compile-unwritable": ["compile", UNIFORM, "-s", "zb-h1", "-o", "file.txt/c.json"],
    "check-rank-range": ["check", "named.json", "--print", "--rank", "9"],
    "unknown-command": ["frobnicate"],
    "unknown-option": ["simulate", UNIFORM, "--bogus"],
    "profile-no-colon": ["profile", "examples/train_gpt.py", "-p", "2", "-m", "2", "-o", "p.yaml"],
    "profile-missing-file": ["profile", "nowhere.py:gpt", "-p", "2", "-m", "2", "-o", "p.yaml"],
    "profile-missing-function": ["profile", f"{ROOT}/examples/train_gpt.py:nope", "-p", "2", "-m", "2", "-o", "p.yaml"],
    "profile-needs-arguments": ["profile", "needs_args.py:model", "-p", "2", "-m", "2", "-o", "p.yaml"],
    "profile-device-nonsense": ["profile", f"{ROOT}/examples/train_gpt.py:gpt", "-p", "2", "-m", "2", "-o", "p.yaml",
                                "--device", "nonsense"],
    "profile-device-tpu": ["profile", f"{ROOT}/examples/train_gpt.py:gpt", "-p", "2", "-m", "2", "-o", "p.yaml",
                           "--device", "meta"],
    "profile-device-cuda-99": ["profile", f"{ROOT}/examples/train_gpt.py:gpt", "-p", "2", "-m", "2", "-o", "p.yaml",
                               "--device", "cuda:99"],
}


@pytest.mark.parametrize("key", sorted(OPTIONS))
def test_bad_command_line_is_refused(tmp_path, key):
    import schedc

    (tmp_path / "file.txt").write_text("a file, not a folder")
    (tmp_path / "needs_args.py").write_text("def model(size):\n    raise AssertionError('must not be called')\n")
    schedc.compile(UNIFORM, "zb-h1").save(tmp_path / "named.json")
    assert_refused(cli(OPTIONS[key], tmp_path))


# ---- the Python API: its own exception types, one line each ----

def _problem_obj():
    from schedc import Problem

    return Problem.parse({"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": 1, "W": 1}})


def _solve(**kw):
    import schedc

    return schedc.compile(_problem_obj(), "ilp", **kw)


def _api():
    import schedc
    from schedc import Problem, Schedule

    return {
        "load-none": (lambda: schedc.load(None), "TypeError"),
        "load-number": (lambda: schedc.load(12345), "TypeError"),
        "load-directory": (lambda: schedc.load("/"), "ScheduleFileError"),
        "load-problem-none": (lambda: schedc.load_problem(None), "TypeError"),
        "load-problem-missing": (lambda: schedc.load_problem("/nonexistent.yaml"), "ProblemError"),
        "simulate-none-schedule": (lambda: schedc.simulate(_problem_obj(), None), "TypeError"),
        "simulate-none-problem": (lambda: schedc.simulate(None, Schedule.from_lists("x", [[]])), "TypeError"),
        "parse-none": (lambda: Problem.parse(None), "ProblemError"),
        "parse-list": (lambda: Problem.parse([1, 2]), "ProblemError"),
        "parse-bool-ranks": (lambda: Problem.parse({"ranks": True, "microbatches": 4,
                                                    "costs": {"F": 1, "B": 1, "W": 1}}), "ProblemError"),
        "compile-unknown": (lambda: schedc.compile(_problem_obj(), "nope"), "ScheduleError"),
        "solve-time-negative": (lambda: _solve(time_limit=-1), "ValueError"),
        "solve-time-nan": (lambda: _solve(time_limit=float("nan")), "ValueError"),
        "solve-time-inf": (lambda: _solve(time_limit=float("inf")), "ValueError"),
        "solve-time-string": (lambda: _solve(time_limit="5"), "ValueError"),
        "solve-threads-zero": (lambda: _solve(threads=0), "ValueError"),
        "solve-threads-bool": (lambda: _solve(threads=True), "ValueError"),
        "solve-gap-nan": (lambda: _solve(gap=float("nan")), "ValueError"),
        "solve-gap-negative": (lambda: _solve(gap=-0.1), "ValueError"),
        "solve-solver-unknown": (lambda: _solve(solver="gurobi"), "SchedcError"),
        "scaled-nan": (lambda: _problem_obj().scaled(time=float("nan")), "ProblemError"),
        "with-changes-bool": (lambda: _problem_obj().with_changes(microbatches=True), "ProblemError"),
        # pydantic models built directly: schedc's one-line error, not pydantic's ValidationError
        "problem-direct": (lambda: Problem(ranks=0, microbatches=4, costs={"F": 1, "B": 1, "W": 1}), "ProblemError"),
        "problem-direct-typo": (lambda: Problem(rankz=2, microbatches=4, costs={"F": 1, "B": 1, "W": 1}),
                                "ProblemError"),
        "problem-direct-limit": (lambda: Problem(ranks=2, microbatches=4, costs={"F": 1, "B": 1, "W": 1},
                                                 memory={"limit": 0.5}), "ProblemError"),
        "problem-direct-nothing": (lambda: Problem(), "ProblemError"),
        "problem-model-validate": (lambda: Problem.model_validate({"ranks": True}), "ProblemError"),
        "problem-validate-json": (lambda: Problem.model_validate_json("{"), "ProblemError"),
        "problem-copy-update": (lambda: _problem_obj().model_copy(update={"ranks": 0}), "ProblemError"),
        "problem-copy-typo": (lambda: _problem_obj().model_copy(update={"rankz": 3}), "ProblemError"),
        "problem-assign": (lambda: setattr(_problem_obj(), "ranks", 0), "ProblemError"),
        "costs-assign": (lambda: setattr(_problem_obj().costs, "F", -1), "ProblemError"),
        "costs-direct": (lambda: _models()["Costs"](F=-1, B=1, W=1), "ProblemError"),
        "memory-direct": (lambda: _models()["Memory"](static=float("nan")), "ProblemError"),
        "schedule-file-direct": (lambda: _models()["ScheduleFile"](format="x"), "ScheduleFileError"),
        "instruction-direct": (lambda: _models()["ScheduleFile"](format="schedc.schedule", program=[[{"op": "HACK"}]]),
                               "ScheduleFileError"),
        "config-direct-empty": (lambda: _models()["AblationConfig"](problems=[]), "ConfigError"),
        "config-direct-schedules": (lambda: _models()["AblationConfig"](problems=[{"file": "x"}], schedules=[]),
                                    "ConfigError"),
        "grid-direct": (lambda: _models()["Grid"](ranks=[]), "ConfigError"),
        "ablation-run-gantt": (lambda: _ablate(gantt=["nope"]), "ConfigError"),
        "ablation-run-ceiling": (lambda: _ablate(grid={"microbatches": [2, 4]}, max_cells=1), "ConfigError"),
    }


def _models() -> dict:
    from schedc.app.ablate_config import AblationConfig, Grid
    from schedc.problem import Costs, Memory
    from schedc.schedfile import ScheduleFile

    return {m.__name__: m for m in (AblationConfig, Grid, Costs, Memory, ScheduleFile)}


def _ablate(max_cells: int = 1000, **fields):
    from schedc.app.ablate import run
    from schedc.app.ablate_config import AblationConfig

    config = AblationConfig(problems=[{"problem": {"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": 1, "W": 1}}}],
                            schedules=["1f1b"], **fields)
    return run(config, "out", max_cells=max_cells)


API: dict = {}  # key -> the call; filled at import, in the child too (names cross processes, lambdas do not)


@pytest.mark.parametrize("key", sorted(_api()))
def test_api_misuse_raises_its_own_exception(tmp_path, key):
    outcome, kind, message, crashed = _run("api", key, tmp_path)
    assert not crashed, crashed
    assert outcome == "raised", f"{key}: returned without an error"
    expected = _api()[key][1]
    assert kind == expected, f"{key}: {kind}: {message}"
    assert "\n" not in message and len(message) <= MAX_LINE, message


def _boundary_models() -> list[type]:
    """Every pydantic model that schedc defines (the core, the schedule file, the application)."""
    import schedc.app.ablate_config  # noqa: F401  (define the models)
    import schedc.schedfile  # noqa: F401
    from pydantic import BaseModel

    found, todo = [], [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("schedc."):
                found.append(sub)
    return found


def test_every_pydantic_model_raises_a_one_line_schedc_error_that_is_a_value_error():
    from schedc.errors import SchedcError

    models = _boundary_models()
    assert len(models) >= 12, [m.__name__ for m in models]
    for model in models:
        for build in (lambda: model(not_a_field=1), lambda: model.model_validate({"not_a_field": 1}),
                      lambda: model.model_validate_json('{"not_a_field": 1}')):
            with pytest.raises(SchedcError) as info:
                build()
            assert isinstance(info.value, ValueError), model
            message = str(info.value)
            assert "\n" not in message and len(message) <= MAX_LINE and "not_a_field" in message, (model, message)


@pytest.mark.parametrize("key", sorted(k for k, (text, _) in PROBLEMS.items() if isinstance(text, str)
                                       and text.startswith("{")))
def test_problem_built_directly_says_what_problem_parse_says(key):
    from schedc import Problem
    from schedc.errors import ProblemError

    data = json.loads(PROBLEMS[key][0])
    with pytest.raises(ProblemError) as parsed:
        Problem.parse(data)
    with pytest.raises(ProblemError) as built:
        Problem(**data)
    assert str(built.value) == str(parsed.value)


def test_the_corpus_is_large():
    cases = (len(PROBLEMS) + len(JSON_PROBLEMS) + 6 * 6 + 5 + len(SCHEDULE_EDITS) + len(SCHEDULE_TEXTS) + 1
             + len(CSVS) + 1 + len(ABLATIONS) + 1 + len(TRACES) + len(OPTIONS) + len(_api()))
    assert cases >= 150, cases


API.update({key: fn for key, (fn, _) in _api().items()})
