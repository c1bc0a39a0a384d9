"""The runtime on asynchronous schedules (issue 27: PipeDream-2BW), on CPU with gloo.

One ``step()`` runs every round of the program: its batch is R times a synchronous step's, split
in order into R x m microbatches, round r the r-th block of m. Each stage's UPDATE of round r
steps the optimizer with round r's gradients, computed on the weights the UPDATE of round r - 2
made (rounds 0 and 1 of a call: the weights the call started with). Checked against one process
implementing that rule, w(t+1) = w(t) - lr * g(batch t; w(t-1)), w(-1) = w(0), which is checked
to differ from plain SGD on the same batches; and what does not compose is refused in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import schedc
from schedc import Problem
from schedc.kinds import Kind
from schedc.program import Instr, Program
from schedc.runtime import PipelineError, PipelineRuntime
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from schedc.schedfile import CompiledSchedule
from schedc.schedule import Op, Schedule
from schedc.solvers.families.asynchronous import two_bw
from tests.ranks import run_local

ROUNDS = 4  # rounds 2 and 3 run on weights one update stale
CALLS = 2  # two calls of step(): the second starts from the first's weights
PER_MB = 2  # sequences per microbatch


def problem(p: int, m: int) -> Problem:
    return Problem.parse({"ranks": p, "microbatches": m, "costs": {"F": 1, "B": 1, "W": 1}})


def model(n_stages: int) -> list[torch.nn.Module]:
    return stages(gpt_blocks(n_layers=max(1, n_stages - 2), d_model=16, seed=1), n_stages)


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    # eps: the gradient of the attention's key bias is zero but for rounding (softmax ignores a shift
    # of every score), and Adam divides it by its own root: a tiny eps makes rounding noise a step
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2, eps=1e-4),
}


def batches(m: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One batch per call: ROUNDS rounds of m microbatches of PER_MB sequences."""
    return token_batches(CALLS, ROUNDS * m * PER_MB, seed=2)


def pipelined(rank, world, path, optimizer, device="cpu"):
    """This rank's part of CALLS steps: its per-round losses (last stage) and final weights (on the
    host), its stages on ``device``."""
    compiled = schedc.load(path)
    prob = compiled.problem
    mine = {s: mod.to(device) for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[rank]}
    params = [q for mod in mine.values() for q in mod.parameters()]
    rt = PipelineRuntime(compiled, mine, lm_loss, optimizer=OPTIMIZERS[optimizer](params), timeout=60)
    copies = [0]  # the most weight copies of one parameter held at once (the parameter's and its versions')

    def counted(run):
        def op(state, instr, k):
            run(state, instr, k)
            for s, names in rt.names.items():
                for i, q in enumerate(rt.params[s]):
                    held = {q.untyped_storage().data_ptr()}
                    held |= {v[i].untyped_storage().data_ptr() for (t, _), v in rt.versions.items() if t == s}
                    copies[0] = max(copies[0], len(held))
        return op

    rt._ops = {code: counted(run) for code, run in rt._ops.items()}
    losses, means = [], []
    for x, y in batches(prob.microbatches):
        mean = rt.step(x, y)
        if mean is not None:
            losses += rt.round_losses.tolist()
            means.append(mean.item())
    weights = {f"{s}.{k}": t.cpu() for s, mod in mine.items() for k, t in mod.state_dict().items()}
    return {"losses": losses or None, "means": means, "weights": weights, "copies": copies[0]}


def reference(n_stages: int, m: int, optimizer: str, stale: bool = True):
    """One process, the whole model: per round, the gradient of the round's mean loss at the
    weights before the previous update (``stale``; else at the current ones: plain SGD), applied to
    the current weights. Each call starts afresh (its rounds 0 and 1 on its starting weights). The
    per-round losses and the final weights by "stage.name"."""
    parts = model(n_stages)
    net = torch.nn.Sequential(*parts)
    params = list(net.parameters())
    opt = OPTIMIZERS[optimizer](params)
    losses = []
    for x, y in batches(m):
        previous = [q.detach().clone() for q in params]  # w(-1) = w(0)
        for xr, yr in zip(x.chunk(ROUNDS), y.chunk(ROUNDS)):
            current = [q.detach().clone() for q in params]
            with torch.no_grad():
                for q, w in zip(params, previous if stale else current):
                    q.copy_(w)
            opt.zero_grad()
            loss = torch.stack([lm_loss(net(a), b) for a, b in zip(xr.chunk(m), yr.chunk(m))]).mean()
            loss.backward()
            with torch.no_grad():
                for q, w in zip(params, current):
                    q.copy_(w)
            opt.step()
            previous = current
            losses.append(loss.item())
    return losses, {f"{s}.{k}": t for s, mod in enumerate(parts) for k, t in mod.state_dict().items()}


def split_2bw(prob: Problem) -> Schedule:
    """2bw with each fused backward split into B and W right after it (an asynchronous schedule
    with a split backward: its W carry the weight gradients an UPDATE waits for)."""
    ranks = [[x for op in ops for x in ((Op(Kind.B, op.stage, op.mb), Op(Kind.W, op.stage, op.mb))
                                        if op.kind is Kind.BW else (op,))]
             for ops in two_bw(prob, rounds=ROUNDS).ranks]
    return Schedule.from_lists("2bw-split", ranks, rounds=ROUNDS)


def compiled_file(tmp_path, p: int, m: int, split: bool = False) -> str:
    prob = problem(p, m)
    compiled = CompiledSchedule.build(prob, split_2bw(prob) if split else two_bw(prob, rounds=ROUNDS))
    path = tmp_path / "s.json"
    compiled.save(path)
    return str(path)


def assert_like_reference(results, p: int, m: int, optimizer: str) -> None:
    ref_losses, ref_weights = reference(p, m, optimizer)
    losses = next(r["losses"] for r in results if r["losses"] is not None)
    assert len(losses) == CALLS * ROUNDS
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    means = next(r["means"] for r in results if r["means"])
    torch.testing.assert_close(torch.tensor(means), torch.tensor(losses).reshape(CALLS, ROUNDS).mean(1), rtol=1e-6,
                               atol=0)
    assert [r["copies"] for r in results] == [2] * len(results)  # two versions at most, and stale ones used
    weights = {k: t for r in results for k, t in r["weights"].items()}
    assert weights.keys() == ref_weights.keys()
    for k, t in ref_weights.items():
        torch.testing.assert_close(weights[k], t, rtol=1e-5, atol=1e-5, msg=k)


@pytest.mark.parametrize("p, m, optimizer", [(2, 2, "sgd"), (2, 2, "adam"), (4, 4, "sgd"), (4, 3, "momentum")])
def test_2bw_trains_like_the_delayed_update_rule_in_one_process(p, m, optimizer, tmp_path):
    results = run_local(pipelined, p, compiled_file(tmp_path, p, m), optimizer, timeout=300)
    assert_like_reference(results, p, m, optimizer)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
def test_2bw_on_cuda_trains_like_the_delayed_update_rule(split, tmp_path):
    """The weight versions with CUDA tensors: 2 gloo ranks on the one GPU (NCCL refuses two ranks
    on one device), Adam, against one process on the host."""
    results = run_local(pipelined, 2, compiled_file(tmp_path, 2, 2, split=split), "adam", "cuda", timeout=300)
    assert_like_reference(results, 2, 2, "adam")


def test_a_split_backward_keeps_each_rounds_weight_gradients_apart(tmp_path):
    results = run_local(pipelined, 2, compiled_file(tmp_path, 2, 2, split=True), "momentum", timeout=300)
    assert_like_reference(results, 2, 2, "momentum")


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_the_delayed_rule_differs_from_plain_sgd_on_the_same_batches(optimizer):
    """What the tests above compare is not what synchronous training would give: the loss of every
    round after the first differs beyond their tolerance, and so (with momentum, whose steps are
    larger here) does every parameter."""
    stale_losses, stale = reference(2, 2, optimizer)
    plain_losses, plain = reference(2, 2, optimizer, stale=False)
    # beyond the losses' tolerance in assert_like_reference, but round 0 of the first call (w(0) either way)
    differ = [abs(a - b) > 1e-5 * abs(b) + 1e-6 for a, b in zip(stale_losses, plain_losses)]
    assert differ == [False] + [True] * (CALLS * ROUNDS - 1), (stale_losses, plain_losses)
    if optimizer == "momentum":
        for k, t in stale.items():
            assert not torch.allclose(t, plain[k], rtol=1e-5, atol=1e-5), k


# ---- refusals ----


def construct(rank, world, path, runtime):
    compiled = schedc.load(path)
    if runtime.pop("recompute", False):  # the program edited: round 0's first forward of each stage recomputed
        program = compiled.program
        ranks = [[Instr(Kind.R, i.stage, i.mb) if i.op is Kind.F and i.mb == 0 else i for i in instrs]
                 for instrs in program.ranks]
        compiled = SimpleNamespace(program=Program.from_lists(ranks, program.header), problem=compiled.problem)
    mine = {s: mod for s, mod in enumerate(model(compiled.problem.n_stages)) if s in compiled.problem.rank_stages[rank]}
    params = [q for mod in mine.values() for q in mod.parameters()]
    kwargs = {"optimizer": torch.optim.SGD(params, lr=0.1), **runtime}
    if kwargs["optimizer"] is False:
        kwargs["optimizer"] = None
    try:
        PipelineRuntime(compiled, mine, lm_loss, **kwargs)
    except PipelineError as e:
        return str(e)
    return None


@pytest.mark.parametrize("runtime, message", [
    ({"optimizer": False}, "its UPDATEs step the optimizer inside step(), per stage and round: pass"
                           " PipelineRuntime(..., optimizer=opt) over this rank's stage parameters"),
    ({"clip_grad_norm": 1.0}, "clip_grad_norm is a synchronous optimizer option (one norm of every rank's"
                              " gradients before one step) and an asynchronous schedule steps each stage on its own,"
                              " once per round: drop clip_grad_norm or use a synchronous schedule"),
    ({"measure_memory": True}, "measure_memory does not tell the second weight version from activations yet"),
    ({"recompute": True}, "its program recomputes or offloads (R), which the runtime does not run on weight versions"
                          " yet (a recompute or offload would not keep to its round's version): use a schedule"
                          " without them"),
])
def test_what_does_not_compose_is_refused_in_one_line(runtime, message, tmp_path):
    errors = run_local(construct, 2, compiled_file(tmp_path, 2, 2), runtime, timeout=120)
    for error in errors:
        assert error.startswith("the schedule '2bw' is asynchronous (4 rounds, weight versions): " + message), error
        assert "\n" not in error


def wrong_batch(rank, world, path):
    compiled = schedc.load(path)
    mine = {s: mod for s, mod in enumerate(model(2)) if s in compiled.problem.rank_stages[rank]}
    params = [q for mod in mine.values() for q in mod.parameters()]
    rt = PipelineRuntime(compiled, mine, lm_loss, optimizer=torch.optim.SGD(params, lr=0.1), timeout=30)
    x, y = token_batches(1, 2 * PER_MB)[0]  # a synchronous step's batch: one round's
    try:
        rt.step(x, y)
    except PipelineError as e:
        return str(e)
    return None


def test_a_batch_of_one_round_is_an_error_that_says_how_many_rounds(tmp_path):
    first, _ = run_local(wrong_batch, 2, compiled_file(tmp_path, 2, 2), timeout=120)
    assert first == ("inputs: batch of 4 does not split into 8 equal, non-empty microbatches (4 rounds of 2: an"
                     " asynchronous step runs every round)")
