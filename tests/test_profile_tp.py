"""The profiler on tensor-parallel stages (issue 26): every rank of a tp 2 group (two gloo ranks on
CPU) profiles a two-stage MLP parallelised with torch's own ``ColwiseParallel`` / ``RowwiseParallel``
(the model of tests/test_runtime_tp.py) with ``profile_stages(..., group=...)``.

Times are the group's (the same on both ranks, never compared with a clock); memory is one rank's:
its shards of the parameters (half of each split linear layer's weight, half of the first layer's
bias, all of the second's) and the bytes autograd saves of the local tensors, each checked against
sizes computed here from the MLP's shape, which differ from the unsharded ones (the measurement
that ignored the sharding would fail). The profile makes a Problem that compiles; what it cannot
profile is refused in one line.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import schedc
from schedc.problem import Problem
from schedc.runtime.profile import MiB, make_problem, profile_stages
from tests.ranks import run_local
from tests.test_runtime_tp import D, H, blocks, mse, tensor_parallel

N = 4  # sequences per microbatch (the batch is one microbatch: the input's storage is its own)
OPTIMIZER_STATE = 1.0  # SGD with momentum


def profile(rank: int, world: int) -> dict:
    """This rank's tensor-parallel profile and, for comparison, the unparallelised one; then the
    refusals, one line each."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(N, D, generator=g), torch.randn(N, D, generator=g)
    parts = [tensor_parallel(b, mesh) for b in blocks()]
    lines: list[str] = []
    prof = profile_stages(parts, x, y, mse, warmup=1, repeats=2, optimizer_state=OPTIMIZER_STATE,
                          group=mesh.get_group(), progress=lines.append)
    out = {"profile": prof.to_dict(), "lines": lines,
           "unchanged": all(type(m) is nn.Linear for part in parts for m in part.modules() if isinstance(m, nn.Linear))}
    if rank == 0:
        out["plain"] = profile_stages(blocks(), x, y, mse, warmup=0, repeats=1, optimizer_state=OPTIMIZER_STATE).to_dict()

    def error(**kwargs) -> str | None:
        try:
            profile_stages(kwargs.pop("stages", parts), x, y, mse, warmup=0, repeats=1, **kwargs)
        except ValueError as e:
            return str(e)
        return None

    alone = [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group
    out["no group"] = error()
    out["load"] = error(group=mesh.get_group(), load=1)
    out["other group"] = error(group=alone)
    out["dtensor output"] = error(stages=[tensor_parallel(b, mesh, use_local_output=False) for b in blocks()],
                                  group=mesh.get_group())
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_local(profile, 2, timeout=300)


def shard_bytes() -> int:
    """One rank's parameter bytes of a stage: Linear(D, H) by columns (half its weight rows and
    half its bias), Linear(H, D) by rows (half its weight columns; its bias replicated)."""
    return 4 * (H // 2 * D + H // 2 + D * H // 2 + D)


def test_times_are_the_groups_and_positive(ranks):
    first, second = (r["profile"] for r in ranks)
    for kind in ("F", "B", "W", "BW", "recompute"):
        assert len(first[kind]) == 2 and all(t > 0 for t in first[kind]), kind
        assert first[kind] == second[kind], kind  # the slowest rank's, identical on every rank of the group
    assert first["tensor_parallel"] == 2 and first["microbatch_size"] == N
    assert ranks[0]["lines"][-1] == ("tensor-parallel over 2 ranks: times are the group's, memory this rank's shards;"
                                     " offload not measured (the runtime refuses offload with tensor parallelism)")
    assert all(r["unchanged"] for r in ranks)  # the caller's modules keep their plain nn.Linear


def test_memory_is_one_ranks_shards(ranks):
    plain = ranks[0]["plain"]
    for r in ranks:
        prof = r["profile"]
        # static: the shards' parameters, gradients and optimizer state; not the whole stage's
        assert prof["static"] == pytest.approx([shard_bytes() * (2 + OPTIMIZER_STATE) / MiB] * 2)
        assert prof["grads"] == pytest.approx([shard_bytes() / MiB] * 2)
        assert prof["static"][0] < plain["static"][0] == pytest.approx(4 * (2 * H * D + H + D) * 3 / MiB)
        # activation: the stage's input (replicated: whole) and the ReLU's output (sharded: half,
        # also the second layer's input); the last stage also the loss's difference (whole)
        held = [4 * N * (D + H // 2), 4 * N * (D + H // 2 + D)]
        assert prof["activation"] == pytest.approx([b / MiB for b in held])
        assert plain["activation"] == pytest.approx([4 * N * (D + H) / MiB, 4 * N * (2 * D + H) / MiB])
        # what B keeps for W: each split layer's input and output gradient, local (at most the activation)
        kept = 4 * N * (D + H // 2 + H // 2 + D)
        assert prof["kept_for_w"] == pytest.approx([min(kept, b) / MiB for b in held])
        # the stage's output is replicated: each rank sends the whole of it on
        assert prof["sends"] == [4 * N * D / MiB, 0.0]
        assert len(prof["working"]) == 2 and all(w >= 0 for w in prof["working"])
        assert prof["offload"] == [] and prof["copy_bandwidth"] == 0.0


def test_the_profile_is_a_problem_that_compiles(ranks):
    from schedc.runtime.profile import StageProfile

    prof = StageProfile(**ranks[0]["profile"])
    prob = make_problem(prof, ranks=2, microbatches=4, comm=0.01, policies=True)
    assert prob.cost["F"] == tuple(prof.F) and prob.cost["W"] == tuple(prof.W)
    assert prob.static_memory == pytest.approx(tuple(prof.static))
    assert prob.offload is None and prob.recompute is not None  # the runtime runs R, not O, with tensor parallelism
    again = Problem.parse(prob.model_dump(exclude_none=True))  # what `schedc profile` writes, `schedc solve` reads
    assert again.cost == prob.cost
    compiled = schedc.compile(again, "zb-h1")
    assert compiled.problem.ranks == 2


def test_what_it_cannot_profile_is_refused_in_one_line(ranks):
    for rank, r in enumerate(ranks):
        assert r["no group"] == ("stage 0 has tensor-parallel (DTensor) parameters: profile it on every rank of its"
                                 " tensor-parallel group at once, each calling profile_stages(..., group=mesh['tp']"
                                 ".get_group())")
        assert r["load"] == ("load=1 copies cannot run beside tensor-parallel stages (their collectives would mix with"
                             " the timed stage's on the group): pass load=0; the group's own ranks share the machine"
                             " already")
        assert r["other group"] == (f"stage 0 is tensor-parallel over ranks (0, 1) but group has ranks ({rank},): pass"
                                    " the group of the mesh dimension the stage is parallelised on")
        assert r["dtensor output"] == (
            "stage 0 returned a DTensor ((Replicate(),)); a stage must return a plain tensor: keep use_local_output"
            "=True on its last tensor-parallel layer (torch's default), or return y.full_tensor()")
