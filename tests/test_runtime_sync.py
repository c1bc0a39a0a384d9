"""The runtime with data parallelism, on CPU with gloo: a pipeline-by-data-parallel mesh trains a
small GPT exactly like one process on the global batch, whatever the schedule and wherever the
gradient all-reduces are issued; a mismatched data-parallel group fails at construction; a rank
that fails in one replica stops the ranks of the other replica too."""

import pytest
import torch
import torch.distributed as dist

import schedc
from schedc import Problem
from schedc.runtime import PipelineError, PipelineRuntime
from schedc.runtime.gpt import lm_loss, token_batches
from schedc.runtime.launch import RankFailed
from tests.ranks import run_local
from tests.test_runtime import STEPS, faulty_runtime, model, reference, sgd_steps, weights_of


def problem(p, v, placement, m, degree, overlap=True):
    n = p * v
    costs = dict(F=[1 + 0.25 * (s % 3) for s in range(n)], B=[1.5 + 0.5 * (s == n - 1) for s in range(n)], W=1)
    return Problem.parse(dict(ranks=p, microbatches=m, chunks=v, placement=placement, costs=costs, comm=0.1,
                              data_parallel=dict(degree=degree, reduce=[2.0] + [0.5] * (n - 1), overlap=overlap)))


def mesh(rank, pp, dp):
    """The pipeline group and the data-parallel group of global ``rank`` in a pp x dp mesh
    (replica d holds global ranks d pp .. d pp + pp - 1); every rank makes every group."""
    pipelines = [dist.new_group(list(range(d * pp, (d + 1) * pp))) for d in range(dp)]
    replicas = [dist.new_group(list(range(r, pp * dp, pp))) for r in range(pp)]
    return pipelines[rank // pp], replicas[rank % pp], rank // pp, rank % pp


def train(rank, world, paths, pp, dp, batch):
    """Each schedule file in turn: a fresh model, 3 steps of SGD on this replica's part of the
    global batch; this rank's losses and weights."""
    pipeline, replicas, d, r = mesh(rank, pp, dp)
    out = {}
    for path in paths:
        compiled = schedc.load(path)
        prob = compiled.problem
        mine = {s: mod for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[r]}
        losses = sgd_steps(compiled, mine, batch, d, dp, group=pipeline, data_parallel_group=replicas)
        out[path] = {"losses": losses, "weights": weights_of(mine), "replica": d}
    return out


@pytest.mark.parametrize("p, v, placement, names", [
    (2, 1, "loop", ["1f1b", "zb-h1", "zb-greedy"]),
    (2, 2, "v", ["zb-v", "v-half"]),
])
def test_a_pipeline_by_data_parallel_mesh_trains_exactly_like_one_process(p, v, placement, names, tmp_path):
    """2 x 2 (pipeline x data parallel): every replica's weights equal one process's on the global
    batch after 3 steps (<= 1e-5), with the reduces overlapped and at the end; each replica's
    mean loss averages to the global one."""
    m, dp = 4, 2
    paths = []
    for overlap in (True, False):
        prob = problem(p, v, placement, m, dp, overlap)
        for name in names:
            path = tmp_path / f"{name}-{overlap}.json"
            schedc.compile(prob, name).save(path)
            paths.append(str(path))
    batch = 2 * m
    ranks = run_local(train, p * dp, paths, p, dp, batch, timeout=900)
    ref_losses, ref_weights = reference(p * v, m * dp, dp * batch)
    assert len(paths) == 2 * len(names)
    for path in paths:
        per_replica = [[x for x in (r[path]["losses"] for r in ranks if r[path]["replica"] == d) if x[0] is not None][0]
                       for d in range(dp)]
        mean = torch.tensor(per_replica).mean(dim=0)
        torch.testing.assert_close(mean, torch.tensor(ref_losses), rtol=1e-5, atol=0, msg=path)
        for d in range(dp):
            weights = {k: t for r in ranks if r[path]["replica"] == d for k, t in r[path]["weights"].items()}
            assert weights.keys() == ref_weights.keys()
            for k, t in ref_weights.items():
                torch.testing.assert_close(weights[k], t, rtol=1e-5, atol=1e-6, msg=f"{path} replica {d}: {k}")


def construct(rank, world, path, pp, dp, give):
    pipeline, replicas, d, r = mesh(rank, pp, dp)
    compiled = schedc.load(path)
    mine = {s: torch.nn.Linear(2, 2) for s in compiled.problem.rank_stages[r]}
    try:
        PipelineRuntime(compiled, mine, lm_loss, group=pipeline,
                        data_parallel_group={"replicas": replicas, "none": None, "pipeline": pipeline}[give])
    except PipelineError as e:
        return str(e)
    return None


def test_the_data_parallel_group_must_match_the_degree(tmp_path):
    schedc.compile(problem(2, 1, "loop", 4, 2), "1f1b").save(tmp_path / "dp.json")
    none = run_local(construct, 4, str(tmp_path / "dp.json"), 2, 2, "none", timeout=120)
    assert all(e == "the schedule '1f1b' all-reduces gradients over 2 data-parallel replicas: pass"
               " data_parallel_group (this rank's replicas, one rank per replica)" for e in none), none
    right = run_local(construct, 4, str(tmp_path / "dp.json"), 2, 2, "replicas", timeout=120)
    assert right == [None] * 4
    schedc.compile(problem(2, 1, "loop", 4, 4), "1f1b").save(tmp_path / "dp4.json")
    wrong = run_local(construct, 4, str(tmp_path / "dp4.json"), 2, 2, "replicas", timeout=120)
    assert all(e == "the schedule '1f1b' is for 4 data-parallel replicas but data_parallel_group has 2 ranks"
               for e in wrong), wrong


def failing(rank, world, path, pp, dp, victim):
    """Global rank ``victim``'s stage raises on the 2nd forward of step 2; every rank's error."""
    pipeline, replicas, d, r = mesh(rank, pp, dp)
    rt, prob = faulty_runtime(rank, path, victim, "raise", 60.0, r, group=pipeline, data_parallel_group=replicas)
    for x, y in token_batches(STEPS, 2 * prob.microbatches):
        try:
            rt.step(x, y)
        except (PipelineError, ValueError) as e:
            return str(e)
    return None


def test_a_rank_that_fails_in_one_replica_stops_every_rank_of_the_mesh(tmp_path):
    """Global rank 2 (rank 0 of replica 1's pipeline) raises: its pipeline partner names it as
    rank 0, and the other replica's ranks, waiting in the gradient all-reduce, stop naming it by
    its global rank, long before their 60 s timeout."""
    schedc.compile(problem(2, 1, "loop", 4, 2), "1f1b").save(tmp_path / "dp.json")
    errors = run_local(failing, 4, str(tmp_path / "dp.json"), 2, 2, 2, timeout=50)
    assert errors[2] == "bad batch in the user's stage"
    assert "rank 0 (global rank 2) raised ValueError: bad batch in the user's stage" in errors[3], errors[3]
    for g in (0, 1):
        assert errors[g] is not None and "global rank 2" in errors[g] and "bad batch" in errors[g], errors[g]


def killed(rank, world, path, pp, dp, victim):
    """Global rank ``victim`` is killed (SIGKILL) on the 2nd forward of step 2: it reports nothing;
    every other rank's error and the global rank it blames."""
    pipeline, replicas, d, r = mesh(rank, pp, dp)
    rt, prob = faulty_runtime(rank, path, victim, "kill", 60.0, r, group=pipeline, data_parallel_group=replicas)
    for x, y in token_batches(STEPS, 2 * prob.microbatches):
        try:
            rt.step(x, y)
        except PipelineError as e:
            return {"error": str(e), "culprit_global": getattr(e, "culprit_global", None)}
    return None


@pytest.mark.parametrize("victim", [1, 2])
def test_a_rank_killed_in_a_mesh_is_named_by_its_global_rank_on_every_survivor(tmp_path, victim):
    """2 x 2 (pipeline x data parallel), global rank ``victim`` killed: its pipeline partner sees
    its transfer fail, the other replica's ranks see their gradient all-reduce fail (with the dead
    rank, or with a partner that stopped): each of the three names it by its global rank (the
    partner by its pipeline rank too), long before the 60 s timeout. Before, the partner said
    "rank 0" for global rank 2 and the other replica "a rank"."""
    schedc.compile(problem(2, 1, "loop", 4, 2), "1f1b").save(tmp_path / "dp.json")
    with pytest.raises(RankFailed) as failed:
        run_local(killed, 4, str(tmp_path / "dp.json"), 2, 2, victim, timeout=50)
    assert list(failed.value.errors) == [victim], failed.value.errors
    survivors = failed.value.results
    assert sorted(survivors) == sorted({0, 1, 2, 3} - {victim})
    partner = victim + 1 - 2 * (victim % 2)  # the other rank of its pipeline
    for g, got in survivors.items():
        named = f"rank {victim % 2} (global rank {victim})" if g == partner else f"global rank {victim}"
        assert got is not None and f": {named}" in got["error"], (g, got)
        # A survivor waiting on the dead rank says it did not answer; one whose post fails first (the
        # connection already reset, as happens under load) says it closed the connection.
        error = got["error"]
        assert ("waiting for" in error and "did not answer" in error
                or "posting to" in error and "closed the connection" in error), (g, got)
        assert got["culprit_global"] == victim, (g, got)
