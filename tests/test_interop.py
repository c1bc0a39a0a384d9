"""torch.distributed.pipelining interop: CSV export / import checked with torch's own loader,
torch's own schedules next to ours, and the CLI commands around them."""

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from click.testing import CliRunner

import schedc.solvers as S
from schedc import Op, Problem, SchedcError, Schedule, ScheduleError, load_problem, simulate
from schedc.app.cli import main
from schedc.interop import from_torch_csv, to_torch_csv, write_torch_csv
from schedc.runtime.torch_schedules import TORCH_SCHEDULES, torch_schedules
from schedc.schedfile import CompiledSchedule
from schedc.solvers.families.memtime import with_policies

EXAMPLES = Path(__file__).parent.parent / "examples" / "problems"


def problem(v: int, placement: str = "loop", p: int = 4, m: int = 8) -> Problem:
    return Problem.parse(
        dict(name="t", ranks=p, microbatches=m, chunks=v, placement=placement, costs=dict(F=1, B=1, W=1))
    )


PROBLEMS = {"v1": problem(1), "v2-loop": problem(2), "v2-v": problem(2, "v")}
CASES = [(key, name) for key, prob in PROBLEMS.items() for name, spec in S.REGISTRY.items()
         if not spec.why_not(prob) and spec.synchronous]


def torch_load(path: Path, prob: Problem):
    """Load a compute-only CSV the way torch does, on mocked stages (no process group): torch parses
    each cell, validates the order and infers stage -> rank (_validate_schedule), then lowers it with
    sends and receives (_add_send_recv), which raises on an order whose transfers cannot be paired."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.num_stages, stage.submod = 0, prob.ranks, prob.n_stages, None
    runtime = _PipelineScheduleRuntime([stage] * prob.chunks, prob.microbatches)
    runtime._load_csv(str(path), format="compute_only")
    return runtime


# ---- (a) export -> torch's loader and validation -> import ----


@pytest.mark.parametrize("key,name", CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_round_trip_through_torchs_loader(tmp_path, key, name):
    prob = PROBLEMS[key]
    schedule = S.build(name, prob)
    path = tmp_path / f"{name}.csv"
    write_torch_csv(schedule, path)
    runtime = torch_load(path, prob)
    assert runtime.stage_index_to_group_rank == dict(enumerate(prob.stage_rank))
    cells = [[str(a) for a in runtime.pipeline_order[r]] for r in range(prob.ranks)]
    assert cells == [row.split(",") for row in path.read_text().splitlines()]
    back = from_torch_csv(path)
    assert back.name == name and back.ranks == schedule.ranks
    runtime._dump_csv(str(tmp_path / "torch.csv"), format="compute_only")  # torch writes, we read
    assert from_torch_csv(tmp_path / "torch.csv").ranks == schedule.ranks


def test_torch_and_our_simulator_both_reject_a_deadlock(tmp_path):
    path, prob = tmp_path / "deadlock.csv", problem(1, p=2, m=2)
    path.write_text("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n")  # rank 1 wants microbatch 1 first
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(prob, from_torch_csv(path))
    with pytest.raises(AssertionError, match="can't schedule sends/recvs"):
        torch_load(path, prob)


def test_action_names_and_text_input():
    schedule = Schedule.from_lists("x", [[("F", 0, 0), ("B", 0, 0), ("W", 0, 0)], [("F", 1, 0), ("BW", 1, 0)]])
    text = to_torch_csv(schedule)
    assert text == "0F0,0I0,0W0\n1F0,1B0\n"
    assert from_torch_csv(text, name="x") == schedule


def test_idle_comm_and_overlapped_cells():
    # Idle steps and actions that compute nothing are skipped; an overlapped F+B becomes both, in order.
    text = "0F0,,0SEND_F0, 0B0 ,0REDUCE_GRAD,0UNSHARD\n1RECV_F0,(1F0;1B0)OVERLAP_F_B,1SEND_B0\n"
    assert from_torch_csv(text).ranks == ((Op("F", 0, 0), Op("BW", 0, 0)), (Op("F", 1, 0), Op("BW", 1, 0)))


# ---- (b) malformed CSV ----


@pytest.mark.parametrize(
    "text,words",
    [
        ("0F0,0X1\n", ["row 1 (rank 0), column 2", "unknown action 'X'", "'0X1'"]),
        ("0F0\n1F0,F1\n", ["row 2 (rank 1), column 2", "malformed", "'F1'"]),
        ("0F,0B0\n", ["row 1 (rank 0), column 1", "needs a microbatch", "'0F'"]),
        ("0F0,0f1\n", ["column 2", "malformed", "'0f1'"]),
        ("0F0,(0F1;1Q0)OVERLAP_F_B\n", ["column 2", "unknown action 'Q'"]),
        ("", ["empty"]),
    ],
)
def test_malformed_csv_is_one_line_error(text, words):
    with pytest.raises(SchedcError) as e:
        from_torch_csv(text)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_unreadable_file(tmp_path):
    with pytest.raises(SchedcError, match="cannot read"):
        from_torch_csv(tmp_path / "missing.csv")


# ---- (c) torch's own schedules ----


def test_torch_schedules_on_one_chunk():
    pytest.importorskip("torch")
    prob = PROBLEMS["v1"]
    got = {name: (s, why) for name, s, why in torch_schedules(prob)}
    assert list(got) == [f"torch:{n}" for n in TORCH_SCHEDULES]
    for name in ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
        assert got[f"torch:{name}"][0] is None and "2 or more chunks" in got[f"torch:{name}"][1]
    gpipe, one_f_one_b = got["torch:GPipe"][0], got["torch:1F1B"][0]
    assert gpipe.ranks == S.build("gpipe", prob).ranks
    assert simulate(prob, gpipe).makespan == simulate(prob, S.build("gpipe", prob)).makespan == 33
    # torch 2.13's 1F1B order (Schedule1F1B._get_pipeline_order) equals ours on ranks 0..p-2, but on
    # the last rank, which has no warm-up forwards, it numbers the forwards 1..m instead of 0..m-1:
    # F0 is missing and F8 is out of range, so our simulator (and torch's own _validate_schedule)
    # reject it. torch's runtime (Schedule1F1B._step_microbatches) runs the same order as our 1f1b.
    ours = S.build("1f1b", prob).ranks
    assert one_f_one_b.ranks[:-1] == ours[:-1]
    assert one_f_one_b.ranks[-1] == tuple(op._replace(mb=op.mb + 1) if op.kind == "F" else op for op in ours[-1])
    with pytest.raises(ScheduleError, match="F8@s3 is outside 4 stages x 8 microbatches"):
        simulate(prob, one_f_one_b)


@pytest.mark.parametrize(
    "key,applies",
    [("v2-loop", {"Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"}), ("v2-v", {"ZBVZeroBubble", "DualPipeV"})],
)
def test_torch_schedules_on_two_chunks(key, applies):
    pytest.importorskip("torch")
    prob = PROBLEMS[key]
    got = {name.removeprefix("torch:"): (s, why) for name, s, why in torch_schedules(prob)}
    assert {n for n, (s, _) in got.items() if s is not None} == applies
    assert "one stage per rank" in got["1F1B"][1]
    assert "places stages" in got["LoopedBFS" if key == "v2-v" else "DualPipeV"][1]
    timelines = {n: simulate(prob, got[n][0]) for n in applies}  # all complete, none deadlocks
    if key == "v2-loop":
        # Interleaved 1F1B is ours op for op (m a multiple of p). Looped BFS runs each stage's
        # backwards in descending microbatch order where ours ascends: same makespan here.
        assert got["Interleaved1F1B"][0].ranks == S.build("interleaved-1f1b", prob).ranks
        ours = S.build("looped-bfs", prob)
        for t_ops, o_ops in zip(got["LoopedBFS"][0].ranks, ours.ranks):
            half = len(o_ops) // 2  # forwards, then backwards
            assert t_ops[:half] == o_ops[:half]
            assert list(t_ops[half:]) == sorted(o_ops[half:], key=lambda op: (-op.stage, -op.mb))
        assert timelines["LoopedBFS"].makespan == simulate(prob, ours).makespan


def test_torch_constraint_is_a_reason():
    pytest.importorskip("torch")
    got = {name: why for name, _, why in torch_schedules(problem(2, "v", m=6))}
    assert got["torch:DualPipeV"].startswith("torch: DualPipeV requires at least as many microbatches as stages")


def test_schedc_imports_no_torch():
    code = "import sys, schedc, schedc.app.cli, schedc.interop; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---- (d) CLI ----


def run(*args, ok=True):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def test_compare_with_torch_rows():
    pytest.importorskip("torch")
    path = EXAMPLES / "uniform.yaml"
    out = run("compare", path, "--schedules", "gpipe,1f1b", "--torch").output
    assert next(ln for ln in out.splitlines() if ln.startswith("torch:GPipe ")).split()[1] == "33"
    assert "n/a torch:1F1B: F8@s3 is outside" in out and "n/a torch:DualPipeV: " in out
    data = json.loads(run("compare", path, "--schedules", "gpipe", "--torch", "--json").output)
    results = {r["schedule"]: r for r in data["results"]}
    assert list(results) == ["gpipe"] + [f"torch:{n}" for n in TORCH_SCHEDULES]
    assert results["torch:GPipe"]["applies"] and results["torch:GPipe"]["makespan"] == results["gpipe"]["makespan"]
    assert not results["torch:1F1B"]["applies"] and "outside" in results["torch:1F1B"]["reason"]
    v_out = run("compare", EXAMPLES / "v_shape.yaml", "--schedules", "looped-bfs", "--torch").output
    assert any(ln.startswith("torch:ZBVZeroBubble ") for ln in v_out.splitlines())


def test_export_import_round_trip(tmp_path):
    path, csv_file = EXAMPLES / "v_shape.yaml", tmp_path / "looped-bfs.csv"
    assert "wrote" in run("export", path, "-s", "looped-bfs", "--format", "torch-csv", "-o", csv_file).output
    assert from_torch_csv(csv_file).ranks == S.build("looped-bfs", load_problem(path)).ranks
    imported = json.loads(run("import", csv_file, path, "--json").output)
    assert imported == json.loads(run("simulate", path, "-s", "looped-bfs", "--json").output)
    table = run("import", csv_file, path).output
    assert table == run("simulate", path, "-s", "looped-bfs").output


def test_cli_mistakes_exit_2(tmp_path, monkeypatch):
    path = EXAMPLES / "uniform.yaml"
    bad, two_ranks = tmp_path / "bad.csv", tmp_path / "two.csv"
    bad.write_text("0F0,0Z0\n")
    two_ranks.write_text("0F0,0B0\n1F0,1B0\n")
    for args, words in [
        (["import", bad, path], "column 2: unknown action 'Z'"),
        (["import", two_ranks, path], "has 2 ranks, the problem has 4"),
        (["import", tmp_path / "missing.csv", path], "cannot read"),
        (["export", path, "-s", "nope", "-o", tmp_path / "x.csv"], "unknown schedule 'nope'"),
        (["export", path, "-s", "1f1b", "-o", tmp_path / "no" / "x.csv"], "cannot write"),
    ]:
        result = run(*args, ok=False)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.count("\n") == 1 and words in result.output, result.output
    monkeypatch.setitem(sys.modules, "torch.distributed.pipelining._schedule_visualizer", None)
    result = run("compare", path, "--torch", ok=False)
    assert result.exit_code == 2 and "--torch needs torch installed" in result.output


# ---- (d) recompute and offload: torch's IR has no such action, every writer says so in one line ----


def _policy_file(tmp_path, chosen) -> tuple[Path, CompiledSchedule]:
    prob = Problem.parse(dict(name="rc", ranks=2, microbatches=4, costs=dict(F=1, B=1, W=1), memory=dict(F=2),
                              recompute=dict(keep=0.5, selective=dict(time=0.2, keep=1)), offload=dict(time=0.5)))
    compiled = CompiledSchedule.build(prob, with_policies(prob, S.build("zb-h1", prob), chosen))
    compiled.save(tmp_path / "rc.json")
    return tmp_path / "rc.json", compiled


@pytest.mark.parametrize("chosen, words", [
    ({(0, 1): "R"}, "torch's IR has no recompute action (the schedule has 1 R)"),
    ({(0, 1): "S", (1, 0): "R"}, "torch's IR has no recompute action (the schedule has 1 R, 1 S)"),
    ({(0, 1): "O"}, "torch's IR has no offload action (the schedule has 1 O, 1 L)"),
    ({(0, 1): "O", (1, 3): "S"}, "torch's IR has no recompute or offload action (the schedule has 1 S, 1 O, 1 L)"),
])
def test_every_torch_writer_refuses_recompute_and_offload_in_one_line(tmp_path, chosen, words):
    from schedc.interop import to_torch_comms_csv

    path, compiled = _policy_file(tmp_path, chosen)
    writers = [lambda: to_torch_csv(compiled.schedule), lambda: write_torch_csv(compiled.schedule, tmp_path / "a.csv")]
    # A Program's writers see its compute instructions: R and S always; O and L where lowering puts
    # the copy lane into the Program (the message then names what the Program holds).
    untorchable = sorted({i.op.value for instrs in compiled.program.ranks for i in instrs if i.op in ("R", "S", "O", "L")})
    if untorchable:
        writers += [lambda: to_torch_comms_csv(compiled.program), lambda: write_torch_csv(compiled.program, tmp_path / "b.csv")]
    assert untorchable or set(chosen.values()) == {"O"}
    for k, write in enumerate(writers):
        with pytest.raises(ScheduleError) as e:
            write()
        assert "torch's IR has no" in str(e.value) and "\n" not in str(e.value)
        assert k >= 2 or words in str(e.value)
    for fmt in ("torch-csv", "torch-comms-csv"):
        result = run("export", path, "--format", fmt, "-o", tmp_path / "x.csv", ok=False)
        assert result.exit_code == 2 and result.output == f"error: zb-h1: {words}: export a schedule without recompute" \
            " or offload, or run this one with schedc's runtime\n"
        assert not (tmp_path / "x.csv").exists()
    assert not (tmp_path / "a.csv").exists() and not (tmp_path / "b.csv").exists()


def test_torchs_runtime_refuses_recompute_and_offload_in_one_line(tmp_path):
    pytest.importorskip("torch")
    from schedc.runtime.torch_export import torch_actions

    _, compiled = _policy_file(tmp_path, {(1, 2): "R", (0, 0): "O"})
    for call in (lambda: torch_actions(compiled), lambda: torch_actions(compiled, comms="torch"),
                 lambda: torch_actions(compiled, comms="none"),
                 lambda: torch_actions(compiled.problem, compiled.schedule)):
        with pytest.raises(SchedcError, match=r"^zb-h1: torch's IR has no recompute or offload action \(the schedule"
                                              r" has 1 R, 1 O, 1 L\)") as e:
            call()
        assert "\n" not in str(e.value)
