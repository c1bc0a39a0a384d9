"""Faults at every kind of transport call, on 2 gloo ranks, made to happen by construction
(``schedc.runtime.faults``), not by a race: a peer that died before this rank posts to it, a post
that fails, and collectives (the gradient-norm all-reduce, the trace gather) that a rank never
joins. Every other rank must end in a PipelineError naming the rank that failed, the instruction
and the cause; the harness allows far longer than the runtime's deadline, so a hang fails."""

import os

import pytest
import torch
import torch.distributed as dist

import schedc
from schedc.runtime import PipelineError, PipelineRuntime
from schedc.runtime.faults import FaultPlan, install
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from schedc.runtime.launch import RankFailed
from tests.ranks import run_local
from tests.test_runtime import STEPS, faulty_runtime, model

# the ranks fork from a server that imported these once (the first optimizer imports torch._dynamo)
def schedule(tmp_path, name="1f1b"):
    prob = schedc.Problem.parse({"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": 2, "W": 1}})
    schedc.compile(prob, name).save(tmp_path / "s.json")
    return str(tmp_path / "s.json")


def runtime(rank, path, plan, **kwargs):
    install(plan)
    compiled = schedc.load(path)
    parts = stages(gpt_blocks(vocab=64, d_model=16, n_layers=1, n_heads=2, seq_len=16, seed=1), 2)
    mine = {s: parts[s] for s in compiled.problem.rank_stages[rank]}
    opt = torch.optim.SGD([p for mod in mine.values() for p in mod.parameters()], lr=0.1)
    return PipelineRuntime(compiled, mine, lm_loss, optimizer=opt, transport="faulty", **kwargs)


def train(rt, steps=3):
    """Run ``steps`` steps; the PipelineError that stopped them (message, culprit), else None."""
    try:
        for x, y in token_batches(steps, 8, seed=2):
            rt.step(x, y)
    except PipelineError as e:
        return {"error": str(e), "culprit": e.culprit}
    return None


def peer_dies_before_post(rank, world, path, victim, step):
    """The victim exits just before its first send or receive of ``step``; the other rank waits
    until it has exited, then posts its own first transfer to it in that step."""
    plan = FaultPlan(die="post", step=step) if rank == victim else FaultPlan(wait_for=victim, step=step)
    return train(runtime(rank, path, plan, timeout=60.0))


@pytest.mark.parametrize("victim", [0, 1])
@pytest.mark.parametrize("step", [0, 1], ids=["shape-exchange", "step"])
def test_a_peer_that_died_before_a_post_is_named(tmp_path, victim, step):
    with pytest.raises(RankFailed) as failed:
        run_local(peer_dies_before_post, 2, schedule(tmp_path), victim, step, timeout=240)
    other = 1 - victim
    assert victim in failed.value.errors and "exited with code 1" in failed.value.errors[victim]
    got = failed.value.results[other]
    assert got is not None and got["culprit"] == victim, got
    error = got["error"]
    assert error.startswith(f"rank {other}: pipeline stopped at ")
    assert f" of step {step}," in error or (step == 0 and "the shape exchange before step 0" in error), error
    # gloo refuses the post at once when it has seen the connection close (it has here, every
    # time this was tried); were it to accept it, the wait names the same rank
    assert f", posting to rank {victim}: rank {victim} closed the connection" in error \
        or f", waiting for rank {victim}: rank {victim} did not answer" in error, error


def post_fails(rank, world, path, victim):
    """The victim's first post of step 1 fails as gloo's does when the peer closed the connection
    (injected); the other rank stays alive and must stop by reading the victim's report."""
    plan = FaultPlan(fail_post=True, step=1) if rank == victim else FaultPlan()
    return train(runtime(rank, path, plan, timeout=600.0))


@pytest.mark.parametrize("victim", [0, 1])
def test_a_post_that_fails_is_an_error_naming_the_peer_and_the_instruction(tmp_path, victim):
    results = run_local(post_fails, 2, schedule(tmp_path), victim, timeout=240)
    other = 1 - victim
    error = results[victim]["error"]
    assert results[victim]["culprit"] == other
    assert error.startswith(f"rank {victim}: pipeline stopped at instruction ")
    assert f"from rank {other}) of step 1, posting to rank {other}: rank {other} closed the connection" in error \
        or f"to rank {other}) of step 1, posting to rank {other}: rank {other} closed the connection" in error, error
    assert "[RuntimeError: [injected] Connection closed by peer]" in error
    assert results[other] is not None and results[other]["culprit"] == other  # what the victim reported


def collective_unjoined(rank, world, path, victim, how):
    """``allreduce``: clipping (sync); the victim exits at step 1's STEP before it posts the
    gradient-norm all-reduce. ``gather`` / ``gather-alive``: after 2 good steps the victim exits,
    or stays alive without calling ``save_trace`` (until the other has stopped); the other's
    trace gather must stop all the same (the alive case at the runtime's 5 s deadline)."""
    me = rank == victim
    if how == "allreduce":
        rt = runtime(rank, path, FaultPlan(die="flush", step=1) if me else FaultPlan(), timeout=60.0,
                     clip_grad_norm=1.0)
        return train(rt)
    rt = runtime(rank, path, FaultPlan(), timeout=5.0, trace=True)
    assert train(rt, steps=2) is None
    store = dist.distributed_c10d._get_default_store()
    if me:
        if how == "gather":
            os._exit(1)
        store.wait(["test/done"])
        return None
    try:
        rt.save_trace(os.devnull)
    except PipelineError as e:
        return {"error": str(e), "culprit": e.culprit}
    finally:
        store.set("test/done", "1")
    return None


@pytest.mark.parametrize("how", ["allreduce", "gather", "gather-alive"])
def test_a_rank_that_never_joins_a_collective_is_named(tmp_path, how):
    # the victim holds stage 0: when it comes to STEP, every tensor it sent has been used (the
    # gradients it received came after), so the other rank's only call left to fail is the collective
    victim, other = 0, 1
    try:
        results = run_local(collective_unjoined, 2, schedule(tmp_path, "zb-h1"), victim, how, timeout=240)
    except RankFailed as e:
        assert how != "gather-alive" and victim in e.errors
        results = e.results
    got = results[other]
    assert got is not None and got["culprit"] == victim, got
    what = "the gradient-norm all-reduce" if how == "allreduce" else "the trace gather"
    assert f", waiting for {what}: rank {victim} never joined {what}" in got["error"], got["error"]
    assert got["error"].startswith(f"rank {other}: pipeline stopped at instruction ")


UNUSABLE = ("the default process group (group=None) is unusable after a failure: a PipelineRuntime's step failed on"
            " {where} with transfers posted, which may still be pending there (gloo aborts the process when one"
            " meets a new transfer): destroy the process group and create a new one (dist.destroy_process_group(),"
            " then dist.init_process_group(...); for a subgroup, dist.new_group(...)), or restart the job")


def rebuilt_after_a_failure(rank, world, path, victim):
    """Step 2 fails (the victim's stage raises, the other rank stops); each rank catches it and
    builds a new runtime on the same process group and steps it, as a user retrying would (gloo
    aborted the process there: a transfer of the failed step was still posted). Then the step
    again on the failed runtime, and last the advice followed: a new default group, a new runtime
    on it, a step."""
    rt, prob = faulty_runtime(rank, path, victim, "raise", 30.0)
    batches = token_batches(STEPS, 2 * prob.microbatches)
    out = {}
    for x, y in batches:
        try:
            rt.step(x, y)
        except (PipelineError, ValueError) as e:
            out["failed"] = type(e).__name__
            break
    compiled = schedc.load(path)

    def fresh():
        mine = {s: mod for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[rank]}
        return PipelineRuntime(compiled, mine, lm_loss, timeout=30.0)

    def error(call):
        try:
            call()
        except PipelineError as e:
            return str(e)
        return None

    out["rebuilt"] = error(lambda: fresh().step(*batches[0]))
    out["stepped again"] = error(lambda: rt.step(*batches[0]))
    store = dist.distributed_c10d._get_default_store()
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore("again", store), rank=rank, world_size=world)
    out["new group"] = error(lambda: fresh().step(*batches[0]))
    return out


def failed_elsewhere(rank, world, path):
    """First both ranks' steps fail before posting anything (a batch of 3 does not split into 4
    microbatches): a new runtime on the group is built. Then rank 0 steps that one alone: its
    step posts (the shape exchange, the forwards' sends) and stops at its 2 s deadline; rank 1,
    which never stepped, then builds another runtime on the group: the store says it is unusable
    (rank 0's sends wait unread on rank 1's side)."""
    compiled = schedc.load(path)
    prob = compiled.problem

    def fresh(timeout=30.0):
        mine = {s: mod for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[rank]}
        return PipelineRuntime(compiled, mine, lm_loss, timeout=timeout)

    store = dist.distributed_c10d._get_default_store()
    out = {}
    try:
        fresh().step(*token_batches(1, 3)[0])
    except PipelineError as e:
        out["bad batch"] = str(e)
    again = fresh(timeout=2.0)  # not refused: nothing was posted
    if rank == 0:
        try:
            again.step(*token_batches(1, 2 * prob.microbatches)[0])
        except PipelineError as e:
            out["alone"] = str(e)
        store.set("test/failed", "1")
        store.wait(["test/tried"])
        return out
    store.wait(["test/failed"])
    try:
        fresh()
    except PipelineError as e:
        out["rebuilt"] = str(e)
    finally:
        store.set("test/tried", "1")
    return out


@pytest.mark.parametrize("victim", [0, 1])
def test_a_runtime_on_a_group_a_runtime_failed_on_is_refused_in_one_line(tmp_path, victim):
    """Every rank gets one line saying the group is unusable and what to do, never a SIGABRT (a rank
    the harness sees exit by a signal fails the test: run_local raises RankFailed, "exited with code
    -6"); the failed runtime refuses another step; on a new process group a new runtime trains."""
    try:
        results = run_local(rebuilt_after_a_failure, 2, schedule(tmp_path), victim, timeout=120)
    except RankFailed as e:
        pytest.fail(f"a rank failed instead of refusing in one line: {e.errors}")
    for rank, got in enumerate(results):
        assert got["failed"] == ("ValueError" if rank == victim else "PipelineError"), got
        assert got["rebuilt"] == UNUSABLE.format(where="this rank (at step 1: " + got["failed"] + ")"), got
        assert got["stepped again"] == (
            f"step() on a PipelineRuntime whose step failed (at step 1: {got['failed']}): a runtime is not used again"
            " after a failure; destroy the process group and create a new one, then a new runtime on it, or restart"
            " the job"), got
        assert got["new group"] is None, got


def test_a_group_is_unusable_where_a_failed_step_had_posted_on_any_rank(tmp_path):
    first, second = run_local(failed_elsewhere, 2, schedule(tmp_path), timeout=240)
    assert first["bad batch"] == "inputs: batch of 3 does not split into 4 equal, non-empty microbatches"
    assert second["bad batch"] == "targets: batch of 3 does not split into 4 equal, non-empty microbatches"
    assert "did not answer within 2 s" in first["alone"], first
    assert second["rebuilt"] == UNUSABLE.format(where="another rank"), second
