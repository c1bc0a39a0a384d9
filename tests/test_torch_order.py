"""What torch.distributed.pipelining's runtime assumes of a schedule's order, checked at export:
its last stage's forwards in microbatch order (torch keeps the losses in the order those run and
reads them back by microbatch). tests/data/v_out_of_order.json is an optimal V schedule (CP-SAT,
39.4) with microbatches 4 and 5 swapped on every op, so its last stage runs F5 before F4, as the
solved schedule that crashed torch's runtime did: every torch writer refuses it in one line,
``renumber`` runs it renumbered (the same schedule), ``solve --torch`` writes it renumbered, and
torch's runtime trains the result on 2 gloo ranks to single-process gradients."""

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import schedc
import schedc.solvers as S
from schedc import Problem, SchedcError, Schedule, ScheduleError, simulate
from schedc.app.cli import main
from schedc.interop import in_torch_order, to_torch_comms_csv, to_torch_csv, torch_ready
from schedc.runtime import torch_actions, torch_pipeline
from schedc.schedfile import CompiledSchedule
from schedc.solvers.search.solve import solve
from tests.ranks import run_local
from tests.strategies import pipeline_problems

DATA = Path(__file__).parent / "data"
OUT_OF_ORDER = DATA / "v_out_of_order.json"
REFUSAL = ("v-out-of-order: torch's runtime keeps the last stage's losses in the order its forwards run and reads"
           " them by microbatch, but rank 0 runs 3F5 before 3F4: renumber the microbatches (solve --torch, export"
           " --renumber, renumber=True) or use schedc's runtime")


def last_forwards(schedule: Schedule, problem: Problem) -> list[int]:
    return [op.mb for ops in schedule.ranks for op in ops if op.kind == "F" and op.stage == problem.n_stages - 1]


def permuted(schedule: Schedule, perm: list[int]) -> Schedule:
    """``schedule`` with microbatch i renamed perm[i] on every op of every lane (the same schedule,
    renumbered)."""
    def lane(per_rank):
        return [[None if op is None else (op.kind, op.stage, perm[op.mb]) for op in ops] for ops in per_rank]

    return Schedule.from_lists(schedule.name, lane(schedule.ranks), lane(schedule.copy), lane(schedule.after),
                               lane(schedule.pairs))


# ---- the check and the renumbering, without torch's runtime ----


def test_every_torch_writer_refuses_the_last_stage_out_of_order_in_one_line(tmp_path):
    compiled = schedc.load(OUT_OF_ORDER)
    assert last_forwards(compiled.schedule, compiled.problem) == [0, 1, 2, 3, 5, 4]
    for write in (lambda: to_torch_csv(compiled.schedule), lambda: to_torch_comms_csv(compiled.program),
                  lambda: torch_actions(compiled), lambda: torch_actions(compiled, comms="torch"),
                  lambda: torch_actions(compiled.problem, compiled.schedule), lambda: torch_ready(compiled.problem, compiled.schedule)):
        with pytest.raises(ScheduleError) as e:
            write()
        assert str(e.value) == REFUSAL
    for fmt in ("torch-csv", "torch-comms-csv"):
        result = CliRunner().invoke(main, ["export", str(OUT_OF_ORDER), "--format", fmt, "-o", str(tmp_path / "x.csv")])
        assert result.exit_code == 2 and result.output == f"error: {REFUSAL}\n"
        assert not (tmp_path / "x.csv").exists()


def test_export_renumber_writes_the_same_schedule_in_torchs_order(tmp_path):
    compiled = schedc.load(OUT_OF_ORDER)
    for fmt in ("torch-csv", "torch-comms-csv"):
        out = tmp_path / f"{fmt}.csv"
        result = CliRunner().invoke(main, ["export", str(OUT_OF_ORDER), "--format", fmt, "--renumber", "-o", str(out)])
        assert result.exit_code == 0, result.output
        text = out.read_text()
        assert "3F4" in text and text.index("3F4") < text.index("3F5")  # rank 0's row: the last stage in order
    renumbered = in_torch_order(compiled.problem, compiled.schedule)
    assert renumbered.ranks == permuted(compiled.schedule, [0, 1, 2, 3, 5, 4]).ranks
    assert (tmp_path / "torch-csv.csv").read_text() == to_torch_csv(renumbered)
    acts = torch_actions(compiled, renumber=True)
    assert acts == torch_actions(compiled.problem, renumbered)


def test_torch_is_refused_sequence_chunks_in_one_line(tmp_path):
    prob = Problem.parse(dict(name="seq", ranks=2, microbatches=4, costs=dict(F=1, B=1, W=1), sequence_chunks=2))
    compiled = schedc.compile(prob, "seq1f1b")
    words = "seq1f1b: torch.distributed.pipelining has no sequence chunks, and this schedule cuts each microbatch into 2"
    for write in (lambda: to_torch_comms_csv(compiled.program), lambda: torch_actions(compiled),
                  lambda: torch_ready(prob, compiled.schedule, renumber=True)):
        with pytest.raises(ScheduleError, match=words) as e:
            write()
        assert "\n" not in str(e.value)
    compiled.save(tmp_path / "seq.json")
    result = CliRunner().invoke(main, ["export", str(tmp_path / "seq.json"), "-o", str(tmp_path / "x.csv")])
    assert result.exit_code == 2 and result.output.startswith(f"error: {words}: run it with schedc's runtime")
    with pytest.raises(ScheduleError, match="seq: torch.distributed.pipelining has no sequence chunks"):
        solve(prob, time_limit=5, torch=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prob=pipeline_problems(max_microbatches=8), data=st.data())
def test_renumbering_is_the_same_schedule_op_for_op(prob, data):
    """Any schedule is a renumbering of one in torch's order; in_torch_order finds it, and the
    simulator times each op as it timed the op it renumbers (start, end, memory, peak)."""
    names = [n for n, spec in S.REGISTRY.items() if not spec.why_not(prob) and spec.synchronous]
    schedule = S.build(data.draw(st.sampled_from(names)), prob)
    scrambled = permuted(schedule, data.draw(st.permutations(range(prob.microbatches))))
    renumbered = in_torch_order(prob, scrambled)
    assert last_forwards(renumbered, prob) == list(range(prob.microbatches))
    torch_ready(prob, renumbered)  # passes
    a, b = simulate(prob, scrambled), simulate(prob, renumbered)
    assert (a.start, a.end, a.memory, a.peak_activation, a.makespan) == (b.start, b.end, b.memory, b.peak_activation, b.makespan)
    assert in_torch_order(prob, renumbered) is renumbered


def test_renumbering_carries_the_copy_lane():
    """An offloading schedule (torch refuses it, schedc's runtime runs it): its copy lane and issue
    points are renumbered with the compute lane, and the simulator times every op as before."""
    prob = Problem.parse(dict(ranks=2, microbatches=4, chunks=2, placement="v", costs=dict(F=1, B=1, W=1),
                              offload=dict(time=0.5), memory=dict(limit=2.5)))
    schedule = S.build("zb-v-offload", prob)
    assert schedule.copy
    scrambled = permuted(schedule, [2, 0, 3, 1])
    renumbered = in_torch_order(prob, scrambled)
    assert renumbered == schedule
    a, b = simulate(prob, scrambled), simulate(prob, renumbered)
    assert (a.start, a.end, a.copy_start, a.copy_end, a.memory) == (b.start, b.end, b.copy_start, b.copy_end, b.memory)
    with pytest.raises(ScheduleError, match="torch's IR has no offload action"):
        torch_ready(prob, scrambled, renumber=True)


# ---- solve --torch ----


def test_solve_torch_numbers_what_it_finds_in_torchs_order(tmp_path, monkeypatch):
    """The out-of-order schedule, optimal and better than every registry schedule (40.4), given as
    one of torch's candidates: solve returns it, and with --torch renumbered (same objective)."""
    import schedc.runtime.torch_schedules as ts

    compiled = schedc.load(OUT_OF_ORDER)
    prob = compiled.problem
    monkeypatch.setattr(ts, "torch_schedules", lambda problem: [("torch:hand", compiled.schedule, None)])
    problem_file = tmp_path / "v.yaml"
    problem_file.write_text("name: v-out-of-order\nranks: 2\nmicrobatches: 6\nchunks: 2\nplacement: v\n"
                            "costs: {F: 1, B: 1, W: 1}\ncomm: 0.1\nmemory: {limit: 3}\n")
    assert schedc.load_problem(problem_file) == prob
    result = CliRunner().invoke(main, ["solve", str(problem_file), "--torch", "--time-limit", "4", "-q",
                                       "-o", str(tmp_path / "solved.json")])
    assert result.exit_code == 0, result.output
    solved = schedc.load(tmp_path / "solved.json")
    assert solved.timeline.objective_value() == pytest.approx(39.4)
    assert last_forwards(solved.schedule, prob) == list(range(6))
    torch_ready(prob, solved.schedule)
    # the API: the same, and without torch the order as found (what torch's runtime crashed on)
    found = solve(prob, time_limit=3, candidates=[("hand", compiled.schedule)])
    assert last_forwards(found.schedule, prob) == [0, 1, 2, 3, 5, 4]
    for_torch = solve(prob, time_limit=3, candidates=[("hand", compiled.schedule)], torch=True)
    assert last_forwards(for_torch.schedule, prob) == list(range(6))
    assert for_torch.objective == found.objective == pytest.approx(39.4)
    assert for_torch.timeline.schedule == for_torch.schedule
    assert for_torch.timeline.makespan == pytest.approx(39.4)


def test_solve_and_compile_for_torch_refuse_what_torch_cannot_run():
    recompute = Problem.parse(dict(name="r", ranks=2, microbatches=4, costs=dict(F=1, B=1, W=1), recompute={}))
    with pytest.raises(ScheduleError) as e:
        solve(recompute, time_limit=5, torch=True)
    assert str(e.value) == ("r allows recompute, for which torch's IR has no action: drop that section to solve for"
                            " torch's runtime, or solve without --torch and run the schedule with schedc's runtime")
    with pytest.raises(ScheduleError, match="torch's IR has no recompute action"):
        schedc.compile(recompute, "1f1b-recompute", torch=True)
    plain = Problem.parse(dict(ranks=2, microbatches=4, chunks=2, placement="v", costs=dict(F=1, B=1, W=1)))
    assert last_forwards(schedc.compile(plain, "zb-v", torch=True).schedule, plain) == [0, 1, 2, 3]


# ---- torch's runtime trains them ----

M = 6


class Conv(nn.Module):
    """Stage 0: a convolution over the sequence, scaled per channel by a buffer."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 8, 3, padding=1)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8).view(1, 8, 1))

    def forward(self, x):
        return torch.tanh(self.conv(x) * self.scale)


class Mix(nn.Module):
    """Middle stages: a linear map over the channels at every position, with a residual."""

    def __init__(self, norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(8) if norm else nn.Identity()
        self.lin = nn.Linear(8, 8)

    def forward(self, h):
        return h + torch.relu(self.lin(self.norm(h.transpose(1, 2)))).transpose(1, 2)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(8 * 5, 4)

    def forward(self, h):
        return self.out(h.flatten(1))


def model():
    torch.manual_seed(3)
    return [Conv(), Mix(False), Mix(True), Head()]


def batch():
    g = torch.Generator().manual_seed(4)
    return torch.randn(2 * M, 3, 5, generator=g), torch.randn(2 * M, 4, generator=g)


def loss_fn(out, target):
    return nn.functional.mse_loss(out, target)


def grads(mods):
    return {f"{s}.{k}": p.grad.detach().clone() for s, mod in mods.items() for k, p in mod.named_parameters()}


def train(rank, world, solved_path):
    """On this rank: the out-of-order file refused, then run renumbered, and the schedule solve
    --torch wrote; each one step of torch's runtime, with fresh stages; gradients and losses."""
    x, y = batch()
    out = {}
    compiled = schedc.load(OUT_OF_ORDER)
    mine = lambda: {s: m for s, m in enumerate(model()) if s in compiled.problem.rank_stages[rank]}  # noqa: E731
    try:
        torch_pipeline(compiled, mine(), loss_fn)
    except SchedcError as e:
        out["refused"] = str(e)
    for key, kwargs, comp in (("renumbered", dict(renumber=True), compiled),
                              ("solved", {}, schedc.load(solved_path)),
                              ("solved-torch-comms", dict(comms="torch"), schedc.load(solved_path))):
        mods = mine()
        pipe = torch_pipeline(comp, mods, loss_fn, **kwargs)
        losses = []
        last = 3 in mods
        pipe.step(*([x] if 0 in mods else []), target=y if last else None, losses=losses)
        out[key] = {"grads": grads(mods), "losses": [v.item() for v in losses] if last else None}
    return out


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    compiled = schedc.load(OUT_OF_ORDER)
    found = solve(compiled.problem, time_limit=3, candidates=[("hand", compiled.schedule)], torch=True)
    path = tmp_path_factory.mktemp("solved") / "solved.json"
    CompiledSchedule.build(compiled.problem, found.schedule, found.summary(), timeline=found.timeline).save(path)
    return str(path)


def test_torchs_runtime_trains_the_solved_v_schedule_like_one_process(solved):
    ran = run_local(train, 2, solved, timeout=300)
    assert ran[0]["refused"] == ran[1]["refused"] == REFUSAL
    parts = model()
    x, y = batch()
    per_mb = [loss_fn(nn.Sequential(*parts)(a), b) for a, b in zip(x.chunk(M), y.chunk(M))]
    torch.stack(per_mb).mean().backward()
    want = grads(dict(enumerate(parts)))
    for key in ("renumbered", "solved", "solved-torch-comms"):
        got = {k: t for r in ran for k, t in r[key]["grads"].items()}
        assert got.keys() == want.keys(), key
        for k, t in want.items():
            torch.testing.assert_close(got[k], t, rtol=1e-5, atol=1e-6, msg=f"{key}: {k}")
        # the last stage (rank 0 in the V) returns the losses in the inputs' microbatch order
        assert ran[0][key]["losses"] == pytest.approx([v.item() for v in per_mb], rel=1e-5), key
