"""A plan's schedule file trains as its cut says: the runtime cuts the model by the stage
problem's ``stage_blocks`` (``local_stages``), and training is exact against one process, in one
direction and in two."""

from __future__ import annotations

import pytest
import torch

import schedc
from schedc.layers import LayerProblem
from schedc.runtime import local_stages
from schedc.runtime.gpt import gpt_blocks, lm_loss, token_batches
from schedc.solvers.search.plan import plan
from tests.ranks import run_local
from tests.test_runtime import STEPS, sgd_steps, weights_of

N_LAYERS = 5


def train(rank, world, path, batch):
    compiled = schedc.load(path)
    mine = local_stages(compiled, gpt_blocks(n_layers=N_LAYERS, seed=1), rank=rank)
    return {"losses": sgd_steps(compiled, mine, batch), "weights": weights_of(mine)}


def reference(m, batch, sizes):
    """One process, the whole model; weights named by the plan's stages (as ``weights_of``)."""
    blocks = gpt_blocks(n_layers=N_LAYERS, seed=1)
    net = torch.nn.Sequential(*blocks)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in token_batches(STEPS, batch, seed=2):
        opt.zero_grad()
        loss = torch.stack([lm_loss(net(a), b) for a, b in zip(x.chunk(m), y.chunk(m))]).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    weights, at = {}, 0
    for s, k in enumerate(sizes):
        stage = torch.nn.Sequential(*blocks[at:at + k])
        weights.update({f"{s}.{name}": t for name, t in stage.state_dict().items()})
        at += k
    return losses, weights


def _trains_like_one_process(path, m: int, sizes: list[int]) -> None:
    """Two gloo ranks train the schedule file at ``path`` to one process's losses and weights."""
    ranks = run_local(train, 2, str(path), 2 * m, timeout=600)
    ref_losses, ref_weights = reference(m, 2 * m, sizes)
    losses = next(r["losses"] for r in ranks if r["losses"][0] is not None)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    weights = {k: t for r in ranks for k, t in r["weights"].items()}
    assert weights.keys() == ref_weights.keys()
    for k, t in ref_weights.items():
        torch.testing.assert_close(weights[k], t, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("chunks, placement", [(1, "loop"), (2, "v")])
def test_a_plans_uneven_cut_trains_exactly_like_one_process(chunks, placement, tmp_path):
    """The example GPT's blocks (embedding, five layers, head) with a head five times a layer:
    the plan cuts unevenly, and the two gloo ranks train to one process's losses and weights."""
    m = 4
    lp = LayerProblem.validated(dict(ranks=2, microbatches=m, chunks=chunks, placements=[placement], comm=0.1, layers=[
        dict(type="E", F=0.2, B=0.2, W=0.1), dict(type="t", count=N_LAYERS, F=1, B=1.1, W=0.9),
        dict(type="L", F=5, B=5.5, W=4.5)]))
    result = plan(lp, time_limit=10, threads=1)
    sizes = result.chosen.sizes
    assert len(set(sizes)) > 1  # (an uneven cut: the head's stage holds fewer blocks)
    path = tmp_path / "plan.json"
    result.compiled().save(path)
    _trains_like_one_process(path, m, sizes)


def train_two_ways(rank, world, path, batch):
    """As ``train``, each weight named by (direction, "model stage.name")."""
    compiled = schedc.load(path)
    depth = compiled.problem.pipeline_stages
    mine = local_stages(compiled, gpt_blocks(n_layers=N_LAYERS, seed=1), rank=rank)
    losses = sgd_steps(compiled, mine, batch)
    return {"losses": losses, "weights": {(s // depth, f"{s % depth}.{k}"): t for s, mod in mine.items()
                                          for k, t in mod.state_dict().items()}}


def test_a_plans_cut_in_two_directions_trains_exactly_like_one_process(tmp_path):
    """The same blocks planned in two directions (half the microbatches each way): each
    direction's copy of every model stage ends at one process's weights on the global batch, and
    the two directions' mean losses average to its losses."""
    m = 4
    lp = LayerProblem.validated(dict(ranks=2, microbatches=m, placements=["bidirectional"], comm=0.1, layers=[
        dict(type="E", F=0.2, B=0.2, W=0.1), dict(type="t", count=N_LAYERS, F=1, B=1.1, W=0.9),
        dict(type="L", F=5, B=5.5, W=4.5, sync=0.5)]))
    result = plan(lp, time_limit=10, threads=1)
    assert result.problem.pipelines == 2
    sizes = result.chosen.sizes
    path = tmp_path / "plan.json"
    result.compiled().save(path)
    ranks = run_local(train_two_ways, 2, str(path), 2 * m, timeout=600)
    ref_losses, ref_weights = reference(m, 2 * m, sizes)
    per_direction = [r["losses"] for r in ranks if r["losses"][0] is not None]
    assert len(per_direction) == 2  # (each rank holds the last stage of one direction)
    torch.testing.assert_close(torch.tensor(per_direction).mean(dim=0), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for k in (0, 1):
        weights = {name: t for r in ranks for (way, name), t in r["weights"].items() if way == k}
        assert weights.keys() == ref_weights.keys()
        for name, t in ref_weights.items():
            torch.testing.assert_close(weights[name], t, rtol=1e-5, atol=1e-6, msg=f"direction {k}: {name}")


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "zb-greedy"])
def test_a_cut_with_an_empty_stage_trains_exactly_like_one_process(schedule, tmp_path):
    """A stage with no block (``stage_blocks`` 0, costs 0) passes activations and gradients along:
    the two gloo ranks train to one process's losses and weights, fused backward and split."""
    m, sizes = 4, [2, 0, 3, 2]  # (stage 1, on rank 1, is empty)
    lp = LayerProblem.validated(dict(ranks=2, microbatches=m, chunks=2, placements=["loop"], comm=0.1, layers=[
        dict(type="E", F=0.2, B=0.2, W=0.1), dict(type="t", count=N_LAYERS, F=1, B=1.1, W=0.9),
        dict(type="L", F=2, B=2.2, W=1.8)]))
    problem = lp.stage_problem(sizes, 2, "loop")
    assert problem.empty_stages == {1}
    path = tmp_path / "empty.json"
    schedc.compile(problem, schedule).save(path)
    _trains_like_one_process(path, m, sizes)
