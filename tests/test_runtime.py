"""The runtime on CPU with gloo, in spawned processes: every registry schedule (and an ILP-solved
one) trains a small GPT exactly like single-process training; faults stop every rank with an
error naming the rank that failed; mismatched stages or world size fail at construction."""

import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

import schedc
import schedc.solvers as solvers
from schedc import Problem
from schedc.runtime import PipelineError, PipelineRuntime
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from schedc.runtime.launch import RankFailed
from tests.ranks import run_local

STEPS = 3


def problem(p, v, placement, m, **extra):
    n = p * v
    costs = dict(F=[1 + 0.25 * (s % 3) for s in range(n)], B=[1.5 + 0.5 * (s == n - 1) for s in range(n)], W=1)
    return Problem.parse(dict(ranks=p, microbatches=m, chunks=v, placement=placement, costs=costs, comm=0.1, **extra))


def model(n_stages):
    return stages(gpt_blocks(n_layers=max(1, n_stages - 2), seed=1), n_stages)


def sgd_steps(compiled, mine, batch, replica=0, replicas=1, **runtime) -> list[float | None]:
    """STEPS steps of SGD (momentum 0.9) with ``compiled`` on this rank's stage modules ``mine``
    (each parameter once), on replica ``replica``'s part of a global batch of ``replicas`` x
    ``batch`` sequences, the inputs given only where the rank holds the first stage of a pipeline
    and the targets where it holds a last one; the losses this rank returns (None where it holds no
    last stage). ``runtime``: more arguments of the PipelineRuntime."""
    depth = compiled.problem.pipeline_stages
    params = list({id(q): q for mod in mine.values() for q in mod.parameters()}.values())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    rt = PipelineRuntime(compiled, mine, lm_loss, optimizer=opt, timeout=120, **runtime)
    first, last = (any(s % depth == k for s in mine) for k in (0, depth - 1))
    losses = []
    for x, y in token_batches(STEPS, replicas * batch, seed=2):
        x, y = x[replica * batch:(replica + 1) * batch], y[replica * batch:(replica + 1) * batch]
        loss = rt.step(x if first else None, y if last else None)
        losses.append(None if loss is None else loss.item())
    return losses


def weights_of(mine) -> dict:
    """Stage modules' weights by "stage.name"."""
    return {f"{s}.{k}": t for s, mod in mine.items() for k, t in mod.state_dict().items()}


def train(rank, world, paths, batch):
    """Each schedule file in turn: a fresh model, 3 steps of SGD; this rank's losses and weights."""
    out = {}
    for path in paths:
        compiled = schedc.load(path)
        prob = compiled.problem
        mine = {s: mod for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[rank]}
        losses = sgd_steps(compiled, mine, batch)
        out[compiled.name] = {"losses": losses, "weights": weights_of(mine)}
    return out


def reference(n_stages, m, batch, make=None, data=None):
    """One process training the whole model (``make(n_stages)``, default ``model``) on the
    batches (``data``, default STEPS of ``batch`` sequences): its losses and weights."""
    parts = (make or model)(n_stages)
    net = torch.nn.Sequential(*parts)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in (token_batches(STEPS, batch, seed=2) if data is None else data):
        opt.zero_grad()
        loss = torch.stack([lm_loss(net(a), b) for a, b in zip(x.chunk(m), y.chunk(m))]).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {f"{s}.{k}": t for s, mod in enumerate(parts) for k, t in mod.state_dict().items()}


CONFIGS = [  # (p, v, placement, m): 2 and 4 ranks, one and two chunks, loop and V placement
    (2, 1, "loop", 4),
    (2, 2, "v", 4),
    (4, 1, "loop", 8),
    (4, 2, "loop", 8),
    (4, 2, "v", 8),
]


@pytest.mark.parametrize("p, v, placement, m", CONFIGS, ids=lambda x: str(x))
def test_every_schedule_trains_exactly_like_one_process(p, v, placement, m, tmp_path):
    prob = problem(p, v, placement, m)
    # asynchronous schedules (2bw) train by another rule: tests/test_runtime_async.py
    names = [s.name for s in solvers.REGISTRY.values() if s.why_not(prob) is None and s.synchronous]
    paths = []
    for name in names:
        schedc.compile(prob, name).save(tmp_path / f"{name}.json")
        paths.append(str(tmp_path / f"{name}.json"))
    if v == 1:  # and a solved schedule, under a memory limit that makes the solver work
        solved = schedc.compile(prob.with_changes(memory={"F": 1, "limit": p}), "ilp", time_limit=20)
        solved.save(tmp_path / "ilp.json")
        paths.append(str(tmp_path / "ilp.json"))
        names.append("ilp")
    batch = 2 * m
    ranks = run_local(train, p, paths, batch, timeout=900)
    ref_losses, ref_weights = reference(p * v, m, batch)
    assert len(names) >= 4
    for name in names:
        losses = next(r[name]["losses"] for r in ranks if r[name]["losses"][0] is not None)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0, msg=name)
        weights = {k: t for r in ranks for k, t in r[name]["weights"].items()}
        assert weights.keys() == ref_weights.keys()
        for k, t in ref_weights.items():
            torch.testing.assert_close(weights[k], t, rtol=1e-5, atol=1e-6, msg=f"{name}: {k}")
    initial = {f"{s}.{k}": t for s, mod in enumerate(model(p * v)) for k, t in mod.state_dict().items()}
    assert all(not torch.allclose(initial[k], t) for k, t in ref_weights.items() if k.endswith("weight"))


# ---- faults ----


def faulty_runtime(rank, path, victim, how, timeout, pipeline_rank=None, **runtime):
    """A runtime whose stage on rank ``victim`` raises ValueError (``how="raise"``) or kills its
    process (``"kill"``) on the 2nd forward of step 2 (one shape probe, 4 forwards in step 1).
    ``pipeline_rank``: the rank of the schedule this process runs (default ``rank``); ``runtime``:
    more arguments of PipelineRuntime (its groups in a mesh)."""
    compiled = schedc.load(path)
    prob = compiled.problem
    mine = {s: mod for s, mod in enumerate(model(prob.n_stages))
            if s in prob.rank_stages[rank if pipeline_rank is None else pipeline_rank]}
    calls = []

    def hook(module, args):
        calls.append(1)
        if rank == victim and len(calls) == 7:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("bad batch in the user's stage")

    for mod in mine.values():
        mod.register_forward_pre_hook(hook)
    return PipelineRuntime(compiled, mine, lm_loss, timeout=timeout, **runtime), prob


def failing(rank, world, path, victim, how, timeout):
    rt, prob = faulty_runtime(rank, path, victim, how, timeout)
    for x, y in token_batches(STEPS, 2 * prob.microbatches):
        try:
            rt.step(x, y)
        except PipelineError as e:
            return {"error": str(e), "culprit": e.culprit}
    return {"error": None}


def failing_alive(rank, world, path, victim):
    """The victim's stage raises on the 2nd forward of step 2 and its caller catches the error and
    stays alive until every other rank has stopped (told through the store); the others' runtime
    timeout (600 s) is far beyond the harness's, so they must stop by reading the victim's report."""
    rt, prob = faulty_runtime(rank, path, victim, "raise", 600.0)
    store = dist.distributed_c10d._get_default_store()
    for x, y in token_batches(STEPS, 2 * prob.microbatches):
        try:
            rt.step(x, y)
        except (PipelineError, ValueError) as e:
            stopped = time.perf_counter()
            if rank != victim:
                store.set(f"test/stopped{rank}", "1")
                return {"error": str(e), "culprit": getattr(e, "culprit", None)}
            store.wait([f"test/stopped{r}" for r in range(world) if r != victim], datetime.timedelta(seconds=200))
            return {"error": str(e), "alive_for": time.perf_counter() - stopped}
    return {"error": None}


@pytest.mark.parametrize("victim", [0, 2, 3])
def test_a_failed_rank_that_stays_alive_is_named_by_every_other_rank(victim, tmp_path):
    prob = problem(4, 1, "loop", 4)
    schedc.compile(prob, "zb-h1").save(tmp_path / "s.json")
    results = run_local(failing_alive, 4, str(tmp_path / "s.json"), victim, timeout=240)
    assert "bad batch" in results[victim]["error"]
    print(f"victim {victim}: every other rank stopped {results[victim]['alive_for']:.2f} s after it failed")
    for r in range(4):
        if r != victim:
            assert results[r]["culprit"] == victim, results[r]["error"]
            assert f"rank {victim} raised ValueError: bad batch" in results[r]["error"]


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_failed_rank_stops_the_others_with_its_name(how, tmp_path):
    prob = problem(4, 1, "loop", 4)
    schedc.compile(prob, "zb-h1").save(tmp_path / "s.json")
    victim = 1 if how == "kill" else 2
    # The harness allows far longer than the runtime's timeout: a hang would fail here.
    try:
        results = run_local(failing, 4, str(tmp_path / "s.json"), victim, how, 30.0, timeout=240)
        errors = {}
    except RankFailed as e:
        results, errors = e.results, e.errors
    assert victim in errors  # killed: no result; raised: the ValueError's traceback
    if how == "raise":
        assert "ValueError: bad batch in the user's stage" in errors[victim]
    survivors = [r for r in range(4) if r != victim]
    for r in survivors:
        assert results[r]["error"] is not None, r
        assert results[r]["culprit"] == victim, results[r]["error"]
        assert f"rank {victim} " in results[r]["error"]
        if how == "raise":
            assert "raised ValueError: bad batch" in results[r]["error"]


def construct(rank, world, path, stages_given):
    compiled = schedc.load(path)
    mods = {s: torch.nn.Linear(2, 2) for s in stages_given[rank]}
    try:
        PipelineRuntime(compiled, mods, lm_loss)
    except PipelineError as e:
        return str(e)
    return None


def test_mismatched_stages_or_world_size_fail_at_construction(tmp_path):
    schedc.compile(problem(2, 2, "v", 4), "zb-v").save(tmp_path / "v.json")
    schedc.compile(problem(4, 1, "loop", 4), "1f1b").save(tmp_path / "four.json")
    wrong = run_local(construct, 2, str(tmp_path / "v.json"), {0: [0, 1], 1: [2, 3]}, timeout=120)
    assert wrong[0] == "rank 0 holds stages [0, 3] in this schedule but was given stages [0, 1]"
    assert wrong[1] == "rank 1 holds stages [1, 2] in this schedule but was given stages [2, 3]"
    right = run_local(construct, 2, str(tmp_path / "v.json"), {0: [0, 3], 1: [1, 2]}, timeout=120)
    assert right == [None, None]
    world = run_local(construct, 2, str(tmp_path / "four.json"), {0: [0], 1: [1]}, timeout=120)
    assert world[0] == "the schedule '1f1b' is for 4 ranks but the process group has 2"


def bad_batch(rank, world, path, kind):
    """Rank 0 passes a batch step() cannot split; every rank's error message."""
    compiled = schedc.load(path)
    prob = compiled.problem
    mine = {s: mod for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[rank]}
    rt = PipelineRuntime(compiled, mine, lm_loss, timeout=60.0)
    x, y = token_batches(1, 2 * prob.microbatches)[0]
    bad = {"empty": x[:0], "scalar": x[0, 0], "list": [1, 2, 3], "uneven": x[:3]}[kind]
    try:
        rt.step(bad if rank == 0 else x, y)
    except PipelineError as e:
        return str(e)
    return None


@pytest.mark.parametrize("kind, message", [
    ("empty", "inputs: batch of 0 does not split into 4 equal, non-empty microbatches"),
    ("scalar", "inputs: expected a tensor with a batch dimension, got Tensor of 0 dimensions"),
    ("list", "inputs: expected a tensor with a batch dimension, got list"),
])
def test_a_batch_that_cannot_be_split_is_an_error_named_on_every_rank(tmp_path, kind, message):
    schedc.compile(problem(2, 1, "loop", 4), "1f1b").save(tmp_path / "s.json")
    first, second = run_local(bad_batch, 2, str(tmp_path / "s.json"), kind, timeout=120)
    assert first == message
    assert "rank 0" in second and message in second, second


# ---- trace ----


def traced(rank, world, path, trace_path):
    compiled = schedc.load(path)
    prob = compiled.problem
    mine = {s: mod for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[rank]}
    rt = PipelineRuntime(compiled, mine, lm_loss, trace=True)
    for x, y in token_batches(2, 2 * prob.microbatches):
        rt.step(x, y)
    rt.save_trace(trace_path)
    return rt.trace_events()


def test_trace_records_every_instruction_and_show_draws_it(tmp_path):
    import json

    from click.testing import CliRunner

    from schedc.app.cli import main

    path, trace = tmp_path / "s.json", tmp_path / "trace.json"
    schedc.compile(problem(2, 2, "v", 4), "zb-v").save(path)
    events = run_local(traced, 2, str(path), str(trace), timeout=300)
    program = schedc.load(path).program
    for r, evs in enumerate(events):
        assert [e["instr"] for e in evs] == [str(i) for i in program.for_rank(r)]
        assert all(a["end"] <= b["start"] for a, b in zip(evs, evs[1:]))  # one instruction at a time
    data = json.loads(trace.read_text())
    assert data["schedc"]["format"] == "schedc.trace" and len(data["traceEvents"]) > 2 * len(events[0])
    result = CliRunner().invoke(main, ["show", str(path), "--measured", str(trace), "-o", str(tmp_path / "g.png")])
    assert result.exit_code == 0, result.output
    assert "measured" in result.output and (tmp_path / "g.png").stat().st_size > 0
    other = tmp_path / "other.json"
    schedc.compile(problem(2, 2, "v", 4), "v-half").save(other)
    bad = CliRunner().invoke(main, ["show", str(other), "--measured", str(trace), "-o", str(tmp_path / "h.png")])
    assert bad.exit_code == 2 and "traces schedule 'zb-v', not 'v-half'" in bad.output


def helpers_after_close(rank, world, path):
    """The transport's helper threads alive after one step, then after ``rt.close()``."""
    import threading

    compiled = schedc.load(path)
    prob = compiled.problem
    mine = {s: mod for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[rank]}
    rt = PipelineRuntime(compiled, mine, lm_loss)
    for x, y in token_batches(1, 2 * prob.microbatches):
        rt.step(x, y)

    def helpers():
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("schedc_"))

    before = helpers()
    rt.close()
    return before, helpers()


def test_close_ends_the_transports_helper_threads(tmp_path):
    """On gloo the waits run on helper threads; close() (or the interpreter's exit) ends them, so
    none is left in a wait as the process tears down (that aborted runs at exit)."""
    path = tmp_path / "s.json"
    schedc.compile(problem(2, 1, "loop", 4), "1f1b").save(path)
    for before, after in run_local(helpers_after_close, 2, str(path), timeout=300):
        assert before == ["schedc_recv_queue", "schedc_send_queue"] and after == []
