"""`schedc ablate` end to end on a tiny grid; its numbers against `schedc simulate` run directly."""

import json
import re
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from schedc.app.ablate_report import read_csv
from schedc.app.cli import main

CONFIG = """
name: tiny
problems:
  - file: {root}/examples/problems/uniform.yaml
  - name: skewed
    problem: {{ranks: 2, microbatches: 3, chunks: 2, comm: 3.0, objective: makespan,
              costs: {{F: [4, 1, 2, 1], B: [4, 2, 2, 3], W: [2, 3, 1, 1]}},
              memory: {{F: [2, 3, 3, 2], B: [-1, -1.5, -1.5, -1]}}}}
grid:
  memory: [0.67, 1.0, null]
schedules: [1f1b, zb-h1, zb-h2, zb-greedy, ilp]
solver: {{time_limit: 8}}
"""


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from pathlib import Path

    tmp = tmp_path_factory.mktemp("ablate")
    config = tmp / "tiny.yaml"
    config.write_text(CONFIG.format(root=Path(__file__).parent.parent))
    out = tmp / "report"
    output = run("ablate", config, "-o", out, "-q")
    return out, output


def test_report_files(report):
    out, output = report
    for name in ("results.csv", "summary.md", "frontier.png", "speedup.png"):
        assert (out / name).stat().st_size > 0, name
    assert list(out.glob("gantt-*.png")), "the cell with the largest speed-up is drawn"
    assert "| cell | best heuristic |" in output


def test_numbers_match_schedc_simulate(report):
    out, _ = report
    rows = read_csv(out / "results.csv")
    cells = {r["cell"] for r in rows}
    assert len(cells) == 6 and len(rows) == 30
    checked = 0
    for r in rows:
        problem = out / "problems" / f"{r['cell']}.yaml"
        if r["status"].startswith("n/a"):
            continue
        if r["schedule"] == "ilp":
            sim = json.loads(run("simulate", out / "schedules" / f"{r['cell']}-ilp.json", "--json"))
        else:
            sim = json.loads(run("simulate", problem, "-s", r["schedule"], "--json"))
        assert float(r["makespan"]) == pytest.approx(sim["makespan"], rel=1e-12)
        assert float(r["span"]) == pytest.approx(sim["span"], rel=1e-12)
        assert float(r["bubble"]) == pytest.approx(sim["bubble_makespan"], rel=1e-12)
        assert float(r["peak_memory"]) == pytest.approx(max(sim["peak_memory"]), rel=1e-12)
        assert (r["status"] != "over memory") == sim["fits"] or r["schedule"] == "ilp"
        checked += 1
    assert checked >= 21  # the two-chunk problem has no 1f1b, zb-h1 or zb-h2


def test_summary_speedups_follow_from_the_csv(report):
    out, _ = report
    rows = read_csv(out / "results.csv")
    summary = (out / "summary.md").read_text()
    by_cell = {}
    for r in rows:
        by_cell.setdefault(r["cell"], []).append(r)
    wins = 0
    for cell, cell_rows in by_cell.items():
        fitting = [r for r in cell_rows if r["schedule"] != "ilp" and r["status"] == "fits"]
        best = min(fitting, key=lambda r: float(r["objective_value"]))
        ilp = next(r for r in cell_rows if r["schedule"] == "ilp")
        speedup = float(best["objective_value"]) / float(ilp["objective_value"])
        line = next(ln for ln in summary.splitlines() if ln.startswith(f"| {cell} |"))
        assert f"x{speedup:.3f}" in line and float(best["bubble"]) * 100 == pytest.approx(
            float(re.search(r"\| ([\d.]+)% \|", line).group(1)), abs=0.006)
        assert speedup >= 1 - 1e-9  # the solver starts from the best heuristic
        wins += speedup > 1.01
    assert wins >= 1, "the skewed problem at a tight limit is one the heuristics lose"


@pytest.mark.parametrize(
    "text, message",
    [
        ("problems: []", "problems"),
        ("problems: [{file: a.yaml, profile: b.py:f}]", "give exactly one of file, problem, profile"),
        ("problems: [{file: a.yaml}]\nschedules: [zb-h9]", "unknown schedule 'zb-h9'"),
        ("problems: [{file: a.yaml}]\ngrdi: {}", "unknown field 'grdi' (did you mean 'grid'?)"),
    ],
)
def test_config_mistakes_are_one_line(tmp_path, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    result = CliRunner().invoke(main, ["ablate", str(config), "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, result.output


def test_a_memory_factor_leaves_room_for_working_memory():
    """x = 1 is 1F1B's budget: static and working memory plus p microbatches of activations, so
    1F1B fits at x = 1 whatever the working memory (and not below it)."""
    import schedc
    from schedc.app.ablate import build_problem
    from schedc.app.ablate_config import AblationConfig, expand

    config = AblationConfig.model_validate({
        "problems": [{"problem": {"ranks": 3, "microbatches": 6, "costs": {"F": 1, "B": 1, "W": 1},
                                  "memory": {"F": 2, "B": -1, "static": 5, "working": [0.5, 0.25, 0.75]}}}],
        "grid": {"memory": [1.0, 0.9]},
    })
    fits = {}
    for cell in expand(config):
        problem = build_problem(cell)
        assert problem.memory_limit == tuple(5 + w + cell.values["memory"] * 3 * 2 for w in (0.5, 0.25, 0.75))
        fits[cell.values["memory"]] = schedc.simulate(problem, schedc.solvers.build("1f1b", problem)).fits
    assert fits == {1.0: True, 0.9: False}


SMALL = """
name: small
problems:
  - problem: {ranks: 2, microbatches: 2, costs: {F: 1, B: 1, W: 1}}
grid: {microbatches: [2, 3, 4]}
schedules: [1f1b, ilp]
solver: {time_limit: 5}
"""


@pytest.mark.parametrize("quiet", [False, True])
@pytest.mark.parametrize("pulse", [60.0, 0.0])
def test_progress_gives_the_plan_and_time_left_and_quiet_is_not_silent_for_long(tmp_path, monkeypatch, quiet, pulse):
    """A study prints its plan, then a line per cell with the time left; with -q nothing for a
    short run, but once runs outlast the pulse (set to 0 here, a minute by default) a line per
    pulse still comes, and the solver's worst case up front."""
    import schedc.app.ablate as ablate

    monkeypatch.setattr(ablate, "PULSE_SECONDS", pulse)
    (tmp_path / "c.yaml").write_text(SMALL)
    result = CliRunner().invoke(main, ["ablate", str(tmp_path / "c.yaml"), "-o", str(tmp_path / "out")]
                                + (["-q"] if quiet else []))
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    plan = "small: 3 cells x 2 schedules; the solver takes up to 5 s a cell, 15 s in all"
    if not quiet:
        assert lines[0] == plan
        cells = [ln for ln in lines if ln.startswith("[")]
        assert [ln[:5] for ln in cells] == ["[1/3]", "[2/3]", "[3/3]"]
        assert all(re.search(r"\(\d+ s, about \d+ s left\)$", ln) for ln in cells[:2]), cells
        assert not any("cells done" in ln for ln in lines)
    elif pulse:
        assert lines == []
    else:
        assert lines[0] == plan, lines
        assert [ln.split(" (")[0] for ln in lines[1:]] == ["small: 1 of 3 cells done", "small: 2 of 3 cells done"]
        assert all(re.search(r"\(\d+ s, about \d+ s left\)$", ln) for ln in lines[1:]), lines


def test_the_cell_ceiling_is_checked_by_the_api_too(tmp_path):
    from schedc.app.ablate import run
    from schedc.app.ablate_config import AblationConfig
    from schedc.errors import ConfigError

    config = AblationConfig.model_validate(yaml.safe_load(SMALL))
    with pytest.raises(ConfigError, match=r"the grid has 3 cells .* above the ceiling of 2: .*max_cells=3"):
        run(config, tmp_path / "out", max_cells=2)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"gantt: no cell 'inline-m5' \(did you mean 'inline-m4'\?\); the cells are"
                                          r" inline-m2, inline-m3, inline-m4$"):
        run(config.model_copy(update={"gantt": ["inline-m5"]}), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---- the policies axis (issue 25): which recompute / offload sections each cell declares ----

POLICY_CONFIG = """
name: policies
problems:
  - name: two-chunk
    problem: {ranks: 2, microbatches: 4, chunks: 2, costs: {F: 1, B: 1, W: 1}, memory: {F: 1}}
grid:
  policies: [none, recompute, selective, offload, all]
  memory: [0.4, 1.0]
recompute: {keep: 0.1, selective: {time: 0.2, keep: 0.4}}
offload: {time: 0.5}
schedules: [interleaved-1f1b, every-policy]
"""


def _every_policy(problem):
    """interleaved 1F1B with each (stage, microbatch) given the policies the problem allows in turn
    (microbatch i: the (i mod k)-th of its k policies)."""
    import schedc.solvers as solvers
    from schedc.solvers.families.memtime import with_policies

    base = solvers.build("interleaved-1f1b", problem)
    kinds = problem.policies
    if not kinds:
        return base.renamed("every-policy")
    chosen = {(s, i): kinds[i % len(kinds)] for s in range(problem.n_stages) for i in range(problem.microbatches)}
    return with_policies(problem, base, chosen, name="every-policy")


@pytest.fixture
def every_policy(monkeypatch):
    import schedc.solvers as solvers
    from schedc.solvers.registry import ScheduleSpec

    spec = ScheduleSpec("every-policy", _every_policy, "test: interleaved 1F1B, every policy the problem allows",
                        True, solvers.REGISTRY["interleaved-1f1b"].requires)
    monkeypatch.setitem(solvers.REGISTRY, "every-policy", spec)


def test_the_policies_axis_declares_the_sections_and_counts_them(tmp_path, every_policy):
    config = tmp_path / "policies.yaml"
    config.write_text(POLICY_CONFIG)
    run("ablate", config, "-o", tmp_path / "r", "-q")
    rows = read_csv(tmp_path / "r" / "results.csv")
    cells = {r["cell"] for r in rows}
    # 0.4 x 1F1B's activation memory is below what a rank of two stages needs keeping everything
    # (its two forwards, 0.5 x): only the cells that declare recompute or offload run there.
    assert cells == {f"two-chunk-{v}-mem{m}" for v in ("none", "recompute", "selective", "offload", "all")
                     for m in ("0.4", "1")} - {"two-chunk-none-mem0.4"}
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "- two-chunk-none-mem0.4: two-chunk-none-mem0.4: memory.limit of rank 0 is 1.6, below the 2" in summary
    n = 4 * 4  # stages x microbatches
    want = {  # policies value -> (recompute, selective, offload) of every-policy; "" where not declared
        "none": ("", "", ""), "recompute": (str(n), "", ""), "selective": (str(n // 2), str(n // 2), ""),
        "offload": ("", "", str(n)), "all": ("8", "4", "4"),  # microbatches 0, 3: R; 1: S; 2: O
    }
    for r in rows:
        assert r["policies"] == r["cell"].split("-")[2]
        problem = yaml.safe_load((tmp_path / "r" / "problems" / f"{r['cell']}.yaml").read_text())
        declared = {k for k in ("recompute", "offload") if k in problem}
        assert declared == {"none": set(), "recompute": {"recompute"}, "selective": {"recompute"},
                            "offload": {"offload"}, "all": {"recompute", "offload"}}[r["policies"]]
        assert ("selective" in problem.get("recompute", {})) == (r["policies"] in ("selective", "all"))
        counts = (r["recompute"], r["selective"], r["offload"])
        if r["schedule"] == "every-policy":
            assert counts == want[r["policies"]]
        else:
            assert counts == tuple("0" if c else "" for c in want[r["policies"]])
        # The numbers are the simulator's, on the problem file the study wrote.
        sim = json.loads(run("simulate", tmp_path / "r" / "problems" / f"{r['cell']}.yaml", "-s", r["schedule"],
                             "--json"))
        assert float(r["makespan"]) == pytest.approx(sim["makespan"], rel=1e-12)
        assert float(r["peak_memory"]) == pytest.approx(max(sim["peak_memory"]), rel=1e-12)
        assert {k: str(v) for k, v in sim.get("policies", {}).items()} == {
            k: v for k, v in zip(("recompute", "selective", "offload"), counts) if v != ""}
    # At 0.4 x only a schedule that recomputes can fit (every-policy recomputing every microbatch peaks
    # at 1.4 of the 1.6 there; offloading each right after its forward, with the reload right before
    # its backward, the copy lane falls behind and holds more).
    fits = {r["cell"] for r in rows if r["status"] == "fits" and r["memory_factor"] == "0.4"}
    assert fits and all(r["schedule"] == "every-policy" for r in rows if r["cell"] in fits and r["status"] == "fits")
    assert "two-chunk-recompute-mem0.4" in fits


def test_a_study_without_the_policies_axis_has_the_columns_it_always_had(report):
    out, _ = report
    with (out / "results.csv").open() as f:
        header = f.readline().strip().split(",")
    assert header[-1] == "measured_ms" and "policies" not in header


@pytest.mark.parametrize("text, message", [
    ("problems: [{problem: {ranks: 2, microbatches: 2, costs: {F: 1, B: 1, W: 1}}}]\ngrid: {policies: [offload]}",
     "problems[0]: the policies axis has offload, but neither the config nor the problem gives an offload section"),
    ("problems: [{problem: {ranks: 2, microbatches: 2, costs: {F: 1, B: 1, W: 1}}}]\ngrid: {policies: [selective]}",
     "problems[0]: the policies axis has selective, but neither the config nor the problem gives recompute.selective"),
    ("problems: [{problem: {ranks: 2, microbatches: 2, costs: {F: 1, B: 1, W: 1}}}]\ngrid: {policies: [keep]}",
     "grid.policies[0]: Input should be 'none', 'recompute', 'selective', 'offload' or 'all'"),
    ("problems: [{problem: {ranks: 2, microbatches: 2, costs: {F: 1, B: 1, W: 1}}}]\n"
     "grid: {policies: [none, none]}", "grid.policies: 'none' is given twice: give each value once"),
    ("problems: [{problem: {ranks: 2, microbatches: 2, costs: {F: 1, B: 1, W: 1}}}]\noffload: {time: 0}",
     "offload.time: must be > 0, got 0"),
    ("problems: [{problem: {ranks: 2, microbatches: 2, costs: {F: 1, B: 1, W: 1}}}]\nrecompute: {kep: 1}",
     "unknown field 'recompute.kep' (did you mean 'keep'?)"),
])
def test_policies_axis_mistakes_are_one_line(tmp_path, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    result = CliRunner().invoke(main, ["ablate", str(config), "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, result.output


def test_a_problem_file_without_an_offload_section_skips_the_offload_cells(tmp_path):
    from pathlib import Path

    uniform = Path(__file__).parent.parent / "examples/problems/uniform.yaml"
    config = tmp_path / "c.yaml"
    config.write_text(f"problems: [{{file: {uniform}}}]\ngrid: {{policies: [none, offload]}}\nschedules: [1f1b]\n")
    run("ablate", config, "-o", tmp_path / "r", "-q")
    assert {r["cell"] for r in read_csv(tmp_path / "r" / "results.csv")} == {"uniform-none"}
    assert ("uniform-offload: policies 'offload' needs an offload section (time): give offload: in the config or in"
            " the problem") in (tmp_path / "r" / "summary.md").read_text()


# A study whose last problem is a model to profile and run: the estimate before it must count them.
PROFILED = """
name: t
problems:
  - file: {root}/examples/problems/uniform.yaml
    grid: {{memory: [null]}}
  - name: model
    profile: model.py:spec
    grid: {{ranks: [2], microbatches: [4], memory: [1.0, null]}}
schedules: [1f1b, zb-h1]
execute: {{steps: 3, warmup: 1, max_ranks: 2}}
"""


class _Clock:
    """Seconds that pass only when the fakes below say so."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _fake_runtime(monkeypatch, clock: _Clock | None, profile_s: float, step_s: float) -> list:
    """schedc.runtime's profiler and timer replaced: a profile takes ``profile_s``, a step ``step_s``
    (on ``clock``), and the problem is a fixed one; returns the list of profiles made."""
    import schedc.runtime.profile as profile
    import schedc.runtime.timing as timing
    from schedc.problem import Problem

    made = []

    def profile_model(spec, *, ranks, chunks, placement, microbatches, name):
        made.append((ranks, microbatches))
        if clock:
            clock.t += profile_s
        return Problem.parse({"ranks": ranks, "microbatches": microbatches, "costs": {"F": 2, "B": 2, "W": 1},
                              "memory": {"F": 1, "B": -0.5}}, source=name), SimpleNamespace(warning="")  # quiet

    def time_schedules(ranks, ref, paths, steps, warmup):
        if clock:
            clock.t += len(paths) * (steps + warmup) * step_s
        return [{p: 10.0 for p in paths}] * ranks

    monkeypatch.setattr(profile, "load_model_spec", lambda ref: None)
    monkeypatch.setattr(profile, "profile_model", profile_model)
    monkeypatch.setattr(timing, "time_schedules", time_schedules)
    return made


def test_the_time_left_counts_profiling_and_execution(tmp_path, monkeypatch):
    """The clock injected: simulation takes no time, a profile 60 s, a step 2 s. Before the profile
    the estimate names the profile and the runs not yet timed (it said "about 0 s left" in front of
    them); after it, the runs left at the measured 2 s a step: 1 cell x 2 schedules x 4 steps."""
    from pathlib import Path

    from schedc.app.ablate import run
    from schedc.app.ablate_config import load_config

    clock = _Clock()
    made = _fake_runtime(monkeypatch, clock, profile_s=60.0, step_s=2.0)
    (tmp_path / "model.py").write_text("def spec():\n    pass\n")
    (tmp_path / "t.yaml").write_text(PROFILED.format(root=Path(__file__).parent.parent))
    lines: list[str] = []
    rows = run(load_config(tmp_path / "t.yaml"), tmp_path / "out", lines.append, clock=clock)
    assert made == [(2, 4)]  # one profile serves both memory limits
    assert {r.measured_ms for r in rows if r.cell.startswith("model")} == {10.0}
    assert lines[0] == "t: 3 cells x 2 schedules; 1 model profile and up to 4 schedule runs of 4 steps"
    cells = [ln for ln in lines if ln.startswith("[")]
    assert cells[0].endswith("(0 s, about 0 s left plus 1 profile and 4 schedule runs of 4 steps not yet timed)")
    assert cells[1].endswith("(76 s, about 16 s left)"), cells  # 60 s profile + 2 runs x 4 steps x 2 s
    assert cells[2].endswith("(92 s)"), cells


def test_the_estimate_counts_each_kind_at_its_own_pace():
    """Estimate.left from its inputs: cells, profiles and schedule steps each at their measured pace."""
    from schedc.app.ablate import Estimate

    e = Estimate(cells=10, profiles=3, executed_cells=4, runs_per_cell=5, steps_per_run=8)
    e.cell_done(2.0)
    assert e.left() == (18.0, ["3 profiles", "20 schedule runs of 8 steps"])
    e.profiled(1, 100.0)
    e.executed(4, 64.0)  # 4 runs x 8 steps in 64 s: 2 s a step
    e.cell_done(4.0)
    # 8 cells x 3 s, 2 profiles x 100 s, 3 cells x 4 runs (the mean so far) x 8 steps x 2 s
    assert e.left() == (8 * 3.0 + 2 * 100.0 + 3 * 4 * 8 * 2.0, [])
    assert e.pace(500.0) == "8 min, about 7 min left"


def test_the_plan_line_names_the_profiles_and_runs(tmp_path, monkeypatch):
    """Through the CLI, with the real clock (no time asserted): the plan names the profiling and
    execution, and the first cell's estimate says they are not yet timed."""
    from pathlib import Path

    _fake_runtime(monkeypatch, None, 0.0, 0.0)
    (tmp_path / "model.py").write_text("def spec():\n    pass\n")
    (tmp_path / "t.yaml").write_text(PROFILED.format(root=Path(__file__).parent.parent))
    result = CliRunner().invoke(main, ["ablate", str(tmp_path / "t.yaml"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0].endswith("; 1 model profile and up to 4 schedule runs of 4 steps"), lines
    first = next(ln for ln in lines if ln.startswith("[1/3]"))
    assert first.endswith("left plus 1 profile and 4 schedule runs of 4 steps not yet timed)"), first
