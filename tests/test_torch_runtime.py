"""schedc schedules executed by torch.distributed.pipelining's own runtime (``_PipelineScheduleRuntime``,
through ``schedc.runtime.torch_pipeline``) on 2 gloo ranks: the gradients and loss of one step equal
schedc's own runtime's and single-process training's, for a split-backward loop schedule, a fused
one, a V schedule (two stages per rank), interleaved 1F1B and an explicit placement, with schedc's
sends and receives, with torch's own lowering of the compute order, and from the file `schedc
export --format torch-comms-csv` writes, loaded by torch's own loader onto stages built by hand."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

import schedc
from schedc import Problem, SchedcError
from schedc.app.cli import main
from schedc.interop import torch_comms_rows
from schedc.runtime import PipelineRuntime, torch_actions, torch_pipeline, torch_placement
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from tests.ranks import run_local

P, M = 2, 4
CASES = [  # (schedule, chunks, placement): split and fused backward, loop, V and explicit placements
    ("zb-h1", 1, "loop"),
    ("1f1b", 1, "loop"),
    ("zb-v", 2, "v"),
    ("interleaved-1f1b", 2, "loop"),
    ("zb-1p", 2, [[0, 1], [2, 3]]),  # explicit: each rank two consecutive stages
]
COMMS = ("schedc", "torch")
ROOT = Path(__file__).parent.parent


def problem(v, placement, ranks=P):
    n = ranks * v
    costs = dict(F=[1 + 0.25 * (s % 3) for s in range(n)], B=[1.5 + 0.5 * (s == n - 1) for s in range(n)], W=1)
    return Problem.parse(dict(ranks=ranks, microbatches=M, chunks=v, placement=placement, costs=costs, comm=0.1))


def model(n_stages):
    return stages(gpt_blocks(n_layers=max(1, n_stages - 2), seed=1), n_stages)


def batch():
    return token_batches(1, 2 * M, seed=2)[0]


def grads(mods):
    return {f"{s}.{k}": p.grad.detach().clone() for s, mod in mods.items() for k, p in mod.named_parameters()}


def run_cases(rank, world, paths):
    """Per schedule file: one step with schedc's runtime, one with torch's for each ``comms``, and
    one with torch's runtime loading the exported CSV (fresh stages each time); this rank's
    gradients and the last stage's loss."""
    x, y = batch()
    out = {}
    for path in paths:
        compiled = schedc.load(path)
        prob = compiled.problem
        last = prob.n_stages - 1 in prob.rank_stages[rank]
        fresh = lambda: {s: mod for s, mod in enumerate(model(prob.n_stages)) if torch_placement(compiled)[s] == rank}  # noqa: E731
        mods = fresh()
        loss = PipelineRuntime(compiled, mods, lm_loss, timeout=120).step(x, y)
        out[f"{compiled.name}/ours"] = {"grads": grads(mods), "loss": loss.item() if last else None}
        for comms in (*COMMS, "csv"):
            mods = fresh()
            if comms == "csv":  # what a user of torch alone does with the file
                stages = [PipelineStage(mods[s], s, prob.n_stages, torch.device("cpu")) for s in sorted(mods)]
                pipe = torch_schedules._PipelineScheduleRuntime(stages, n_microbatches=M, loss_fn=lm_loss)
                pipe._load_csv(path.replace(".json", ".csv"), format="compute_comms")
            else:
                pipe = torch_pipeline(compiled, mods, lm_loss, comms=comms)
            losses = []
            pipe.step(*([x] if 0 in mods else []), target=y if last else None, losses=losses)
            out[f"{compiled.name}/torch-{comms}"] = {
                "grads": grads(mods),
                "loss": torch.stack(losses).mean().item() if last else None,
                "mapping": [pipe.stage_index_to_group_rank[s] for s in range(prob.n_stages)],
                "actions": [str(a) for a in pipe.pipeline_order_with_comms[rank]],
            }
    # mistakes: the wrong stages for this rank, a schedule for another world size
    compiled = schedc.load(paths[0])
    errors = []
    try:
        torch_pipeline(compiled, {s: torch.nn.Identity() for s in range(compiled.problem.n_stages)}, lm_loss)
    except SchedcError as e:
        errors.append(str(e))
    try:
        torch_pipeline(schedc.compile(problem(1, "loop", ranks=4), "1f1b"), {rank: torch.nn.Identity()}, lm_loss)
    except SchedcError as e:
        errors.append(str(e))
    out["errors"] = errors
    return out


def reference(n_stages):
    """Single-process gradients of the mean loss over the microbatches."""
    parts = model(n_stages)
    x, y = batch()
    loss = torch.stack([lm_loss(torch.nn.Sequential(*parts)(a), b) for a, b in zip(x.chunk(M), y.chunk(M))]).mean()
    loss.backward()
    return loss.item(), grads(dict(enumerate(parts)))


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torchrt")
    paths = []
    for name, v, placement in CASES:
        path = tmp / f"{name}.json"
        schedc.compile(problem(v, placement), name).save(path)
        paths.append(str(path))
        result = CliRunner().invoke(main, ["export", str(path), "--format", "torch-comms-csv", "-o", str(tmp / f"{name}.csv")])
        assert result.exit_code == 0 and "sends and receives" in result.output, result.output
    return run_local(run_cases, P, paths, timeout=300)


@pytest.mark.parametrize("name, v, placement", CASES, ids=[c[0] for c in CASES])
def test_torchs_runtime_trains_like_ours_and_one_process(ran, name, v, placement):
    prob = problem(v, placement)
    ref_loss, ref_grads = reference(prob.n_stages)
    for who in ("ours", *(f"torch-{c}" for c in (*COMMS, "csv"))):
        key = f"{name}/{who}"
        got = {k: t for r in ran for k, t in r[key]["grads"].items()}
        assert got.keys() == ref_grads.keys(), key
        for k, t in ref_grads.items():
            torch.testing.assert_close(got[k], t, rtol=1e-5, atol=1e-6, msg=f"{key}: {k}")
        (loss,) = [r[key]["loss"] for r in ran if r[key]["loss"] is not None]
        assert loss == pytest.approx(ref_loss, rel=1e-5), key
    compiled = schedc.compile(prob, name)
    for comms in (*COMMS, "csv"):
        for rank, r in enumerate(ran):
            run = r[f"{name}/torch-{comms}"]
            assert run["mapping"] == list(prob.stage_rank)  # torch placed the stages as the problem does
            # torch ran the actions torch_actions gives (the file holds schedc's)
            want = torch_actions(compiled, comms="schedc" if comms == "csv" else comms)[rank]
            assert run["actions"] == [str(a) for a in want]


def test_actions_carry_sends_receives_and_the_split():
    compiled = schedc.compile(problem(2, "v"), "zb-v")
    acts = torch_actions(compiled)
    kinds = {a.computation_type.value for r in acts.values() for a in r}
    assert kinds == {"F", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD"}
    assert [str(a) for a in acts[1]] == torch_comms_rows(compiled.program)[1]
    # V on 2 ranks: stages 1 and 2 share rank 1, so their hand-off has no send; 0 -> 1 and 2 -> 3 do
    sends = {(a.stage_index, a.computation_type.value) for r in acts.values() for a in r if "SEND" in a.computation_type.value}
    assert sends == {(0, "SEND_F"), (2, "SEND_F"), (3, "SEND_B"), (1, "SEND_B")}
    assert torch_placement(compiled) == {0: 0, 1: 1, 2: 1, 3: 0}
    fused = torch_actions(schedc.compile(problem(1, "loop"), "1f1b"), comms="none")
    assert {a.computation_type.value for r in fused.values() for a in r} == {"F", "B"}
    # a Problem and a Schedule give what their compiled schedule gives
    assert torch_actions(compiled.problem, compiled.schedule) == acts
    # each lowering sends and receives the same messages, in its own order
    theirs = torch_actions(compiled, comms="torch")
    for r in range(P):
        ours_comm = sorted(str(a) for a in acts[r] if a.computation_type.value not in ("F", "I", "W"))
        their_comm = sorted(str(a) for a in theirs[r] if a.computation_type.value not in ("F", "I", "W", "UNSHARD", "RESHARD"))
        assert ours_comm == their_comm


def test_errors_are_one_line(ran, monkeypatch):
    for r in ran:
        assert len(r["errors"]) == 2 and all("\n" not in e for e in r["errors"])
        assert "holds stages" in r["errors"][0] and "is for 4 ranks, the process group has 2" in r["errors"][1]
    compiled = schedc.compile(problem(1, "loop"), "zb-h1")
    with pytest.raises(SchedcError, match="comms='nccl' is not one of schedc, torch, none"):
        torch_actions(compiled, comms="nccl")
    with pytest.raises(SchedcError, match="needs sends and receives"):
        torch_pipeline(compiled, {}, lm_loss, comms="none")
    with pytest.raises(SchedcError, match="needs an initialised process group"):
        torch_pipeline(compiled, {}, lm_loss)
    with pytest.raises(SchedcError, match="a Problem needs its Schedule"):
        torch_actions(compiled.problem)
    # an order torch's lowering refuses: torch's multi-line assertion becomes one line naming torch and the schedule
    def refuse(*args, **kwargs):
        raise AssertionError("Malformed compute schedule, can't schedule sends/recvs\n\nFull pipeline schedule: ...")

    monkeypatch.setattr(torch_schedules, "_add_send_recv", refuse)
    with pytest.raises(SchedcError) as e:
        torch_actions(compiled, comms="torch")
    assert str(e.value) == (f"torch {torch.__version__}'s _PipelineScheduleRuntime rejects schedule 'zb-h1' (placement"
                            " loop): Malformed compute schedule, can't schedule sends/recvs")
    # a torch without the runtime's names (another version) is named, not an AttributeError
    monkeypatch.delattr(torch_schedules, "_add_send_recv")
    with pytest.raises(SchedcError, match=r"torch .* has no torch\.distributed\.pipelining\.schedules\._add_send_recv") as e:
        torch_actions(compiled)
    assert "\n" not in str(e.value)


def test_the_readme_example_trains(tmp_path):
    """examples/train_gpt_torch.py under torchrun, as the README runs it (a compiled zb-v instead of
    a profiled one, and 2 steps)."""
    problem_file, schedule = tmp_path / "gpt-v.yaml", tmp_path / "zbv.json"
    problem_file.write_text("ranks: 2\nchunks: 2\nplacement: v\nmicrobatches: 4\ncosts: {F: 1, B: 1, W: 1}\n")
    result = CliRunner().invoke(main, ["compile", str(problem_file), "-s", "zb-v", "-o", str(schedule)])
    assert result.exit_code == 0, result.output
    summary = tmp_path / "train.json"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(ROOT / "examples" / "train_gpt_torch.py"), str(schedule), "--steps", "2", "--warmup", "1",
         "--json", str(summary)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "zb-v: stage -> rank {0: 0, 1: 1, 2: 1, 3: 0}" in run.stdout
    out = json.loads(summary.read_text())
    assert out["comms"] == "schedc" and len(out["losses"]) == 2 and out["losses"][-1] < out["losses"][0]


def test_the_docs_snippet_runs_as_written(tmp_path):
    """docs/interop.md's Python block for torch's runtime, saved as pp.py and run under torchrun next
    to the out/zbv.json it loads (compiled here instead of profiled)."""
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "interop.md").read_text(), re.S)
               if "torch_pipeline(compiled" in b]
    (tmp_path / "pp.py").write_text(code)
    (tmp_path / "out").mkdir()
    problem_file = tmp_path / "gpt-v.yaml"
    problem_file.write_text("ranks: 2\nchunks: 2\nplacement: v\nmicrobatches: 8\ncosts: {F: 1, B: 1, W: 1}\n")
    result = CliRunner().invoke(main, ["compile", str(problem_file), "-s", "zb-v", "-o", str(tmp_path / "out" / "zbv.json")])
    assert result.exit_code == 0, result.output
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "pp.py"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout + run.stderr
    losses = [float(v) for v in re.findall(r"^step \d+: loss ([\d.]+)$", run.stdout, re.M)]
    assert len(losses) == 4 and losses[-1] < losses[0], run.stdout
