"""Tied embeddings on the runtime, CPU with gloo: the first stage's token embedding and the last
stage's output weight are one Parameter in the model; on different ranks each holds a copy, the
two copies' gradients are summed (TS) before the step, and the pipeline trains exactly like one
process with the weight shared (and the copies stay equal). With the V placement both stages sit
on one rank, share the Parameter there, and the schedule has no TS."""

import pytest
import torch

import schedc
from schedc import Problem
from schedc.runtime import PipelineError, PipelineRuntime
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages
from tests.ranks import run_local
from tests.test_runtime import reference, sgd_steps, weights_of


def model(n_stages):
    return stages(gpt_blocks(n_layers=max(1, n_stages - 2), seed=1, tied=True), n_stages)


def embedding(parts):
    """A tied model copy's shared weight: the token embedding, also the head's output weight."""
    return parts[0][0].tok.weight


def problem(p, v, placement, m):
    n = p * v
    return Problem.parse(dict(ranks=p, microbatches=m, chunks=v, placement=placement, comm=0.1,
                              costs=dict(F=[1 + 0.25 * (s % 3) for s in range(n)], B=1.5, W=1),
                              tied=dict(groups=[[0, n - 1]], sync=0.5)))


def train(rank, world, paths, batch):
    out = {}
    for path in paths:
        compiled = schedc.load(path)
        prob = compiled.problem
        parts = model(prob.n_stages)
        mine = {s: parts[s] for s in prob.rank_stages[rank]}
        shared = embedding(parts)
        tied = {s: [shared] for g in compiled.program.header.tied for s in g if s in mine}
        losses = sgd_steps(compiled, mine, batch, tied_parameters=tied)
        out[path] = {"losses": losses, "weights": weights_of(mine)}
    return out


@pytest.mark.parametrize("p, v, placement, names", [
    (2, 1, "loop", ["1f1b", "zb-h1"]),
    (4, 1, "loop", ["zb-greedy"]),
    (2, 2, "v", ["zb-v"]),
])
def test_tied_embeddings_train_exactly_like_one_process(p, v, placement, names, tmp_path):
    m = 4
    prob = problem(p, v, placement, m)
    paths = []
    for name in names:
        compiled = schedc.compile(prob, name)
        assert bool(compiled.program.header.tied) == (placement == "loop")  # the V puts both on rank 0
        path = tmp_path / f"{name}.json"
        compiled.save(path)
        paths.append(str(path))
    batch = 2 * m
    ranks = run_local(train, p, paths, batch, timeout=900)
    ref_losses, ref_weights = reference(p * v, m, batch, make=model)  # (SGD takes the shared weight once)
    for path in paths:
        losses = [r[path]["losses"] for r in ranks if r[path]["losses"][0] is not None]
        torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(ref_losses), rtol=1e-5, atol=0, msg=path)
        weights = {k: t for r in ranks for k, t in r[path]["weights"].items()}
        assert weights.keys() == ref_weights.keys()
        for k, t in ref_weights.items():  # the head's copy of the embedding too
            torch.testing.assert_close(weights[k], t, rtol=1e-5, atol=1e-6, msg=f"{path}: {k}")


def construct(rank, world, path, give):
    compiled = schedc.load(path)
    mine = {s: torch.nn.Linear(2, 2) for s in compiled.problem.rank_stages[rank]}
    tied = {s: [mine[s].weight] for s in mine} if give else None
    try:
        PipelineRuntime(compiled, mine, lm_loss, tied_parameters=tied)
    except PipelineError as e:
        return str(e)
    return None


def test_the_tied_parameters_must_be_given(tmp_path):
    schedc.compile(problem(2, 1, "loop", 4), "1f1b").save(tmp_path / "t.json")
    errors = run_local(construct, 2, str(tmp_path / "t.json"), False, timeout=120)
    assert errors[0] == ("stage 0 shares weights with another rank in '1f1b': pass tied_parameters={0: [the shared"
                         " parameters of its module]}")
    assert run_local(construct, 2, str(tmp_path / "t.json"), True, timeout=120) == [None, None]


@pytest.mark.parametrize("p, name", [(2, "chimera"), (4, "dualpipe")])
def test_tied_embeddings_with_two_directions_train_exactly_like_one_process(p, name, tmp_path):
    """Replicas and tied weights: each copy of a model stage sums its gradients with its copies' (RS),
    then each pipeline's first and last stage sum their tied weights' (TS): the tied weight's
    gradient is the sum over every copy of both stages, and every copy equals one process's."""
    from tests.test_runtime_bidirectional import assert_like_one_process, train as train_both_ways

    m = p
    prob = Problem.parse(dict(ranks=p, microbatches=m, comm=0.1, costs=dict(F=1, B=1.5, W=1),
                              replicas=dict(count=2, sync=0.5), tied=dict(groups=[[0, p - 1]], sync=0.5)))
    assert prob.sync_groups["tied"] == ((0, p - 1), (p, 2 * p - 1))
    path = tmp_path / f"{name}.json"
    schedc.compile(prob, name).save(path)
    batch = 2 * 2 * m
    ranks = run_local(train_both_ways, p, [str(path)], batch, "cpu", model, embedding, timeout=900)
    assert_like_one_process(ranks, str(path), *reference(p, 2 * m, batch, make=model))


def shared_across_stages(rank, world, path):
    compiled = schedc.load(path)
    parts = model(compiled.problem.pipeline_stages)  # one model: stages 0 and 1 of rank 0 share the embedding
    mine = {s: parts[s % compiled.problem.pipeline_stages] for s in compiled.problem.rank_stages[rank]}
    try:
        PipelineRuntime(compiled, mine, lm_loss, tied_parameters={s: [embedding(parts)] for s in mine})
    except PipelineError as e:
        return str(e)
    return None


def test_two_directions_refuse_a_parameter_shared_by_two_stages_of_a_rank(tmp_path):
    prob = Problem.parse(dict(ranks=2, microbatches=2, costs=dict(F=1, B=1, W=1), replicas=2, tied=[[0, 1]]))
    schedc.compile(prob, "chimera").save(tmp_path / "c.json")
    errors = run_local(shared_across_stages, 2, str(tmp_path / "c.json"), timeout=120)
    assert errors[0] == ("stages 0 and 3 of rank 0 share a parameter: with replicas each stage needs its own (each"
                         " pipeline its own copy of the model; tied weights are summed by the schedule's TS)")
