"""Tensor parallelism stays torch's: stage modules parallelised with torch's own ``ColwiseParallel``
/ ``RowwiseParallel`` on the ``tp`` dimension of a DeviceMesh run under the schedc runtime, which
takes its pipeline and data-parallel groups from that mesh (``runtime_groups``).

On CPU with gloo (torch's tensor parallelism runs there): a pp 2 x tp 2 mesh (4 ranks) trains a
two-stage MLP exactly like one process training the unparallelised model (<= 1e-5), with a fused
backward (1f1b), a split one (zb-h1: each W computes every linear weight gradient of the rank's
shard, each B none), full recompute (zb-h1 with R) and selective recompute of each stage's MLP,
marked schedc_selective (zb-h1 with S: the same split, its linear layers inside the recomputed
part); a pp 2 x dp 2 x tp 2 mesh (8 ranks) trains
exactly like one process on the global batch (the data-parallel all-reduce sums each rank's shard).
Stage 0's output, which torch's RowwiseParallel returns as an AsyncCollectiveTensor, is kept from F
to B without its values, as any stage output.
What the runtime cannot yet do with DTensor parameters (clipping, memory measurement, offload) is
refused at construction in one line, and so is a mesh without a pipeline dimension; a stage that
returns a DTensor stops the pipeline at its first forward with one line naming it.

The CUDA case is the same on one GPU: 4 gloo ranks on one device with tensor parallelism over CUDA
tensors (NCCL refuses two ranks on one device); it skips where torch sees no GPU. It passed on one
H100 with torch 2.11 (as did the CPU cases there). NCCL with one rank per GPU is not tested here.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import schedc
import schedc.solvers as solvers
from schedc import Problem
from schedc.kinds import Kind
from schedc.runtime import PipelineError, PipelineRuntime, runtime_groups
from schedc.schedfile import CompiledSchedule
from tests.ranks import run_local
from tests.test_program import with_policies

D, H = 16, 32  # the MLP's width and hidden width (H is split over the tensor-parallel ranks)
STEPS, M, BATCH = 2, 4, 8  # optimizer steps, microbatches, sequences per replica and step
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch sees no CUDA device (the GPU case runs 4 gloo ranks on one)"))]


class MLP(nn.Sequential):
    """An MLP block, marked for selective recompute (the runtime drops it only under S)."""

    schedc_selective = True


def blocks() -> list[nn.Module]:
    """The model: two stages, each an MLP block; the same weights on every rank (seeded)."""
    torch.manual_seed(0)
    return [MLP(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, D)) for _ in range(2)]


def mse(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((y - target) ** 2).mean()


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(n, D, generator=g), torch.randn(n, D, generator=g)) for _ in range(STEPS)]


def tensor_parallel(module: nn.Module, tp_mesh, use_local_output: bool = True) -> nn.Module:
    """Megatron's MLP split with torch's own API: the first linear layer by columns (its output
    stays sharded), the second by rows (its partial sums all-reduced)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(module, tp_mesh, {"0": ColwiseParallel(),
                                                "2": RowwiseParallel(use_local_output=use_local_output)})


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every tensor-parallel rank calls it), on the host.
    On CUDA the shards are gathered on the host: gloo's all-gather of CUDA tensors, which
    ``full_tensor`` would run, crashed (segmentation fault; torch 2.11 on an H100), while the
    all-reduces that tensor-parallel training runs work."""
    if not hasattr(t, "full_tensor"):
        return t.detach().cpu()
    if t.device.type == "cpu":
        return t.full_tensor().detach()
    (placement,) = t.placements
    local = t.to_local().detach().cpu()
    if placement.is_replicate():
        return local
    shards = [torch.empty_like(local) for _ in range(t.device_mesh.size())]  # even shards here: D, H divide by tp
    dist.all_gather(shards, local, group=t.device_mesh.get_group())
    return torch.cat(shards, dim=placement.dim)


def watch_split(rt: PipelineRuntime, mine: dict) -> list[tuple[str, int, int]]:
    """Record, per B and W the runtime runs, how many of this rank's linear weights (their local
    shards) got a new gradient, and how many there are."""
    weights = [m.weight for mod in mine.values() for m in mod.modules() if isinstance(m, nn.Linear)]
    log: list[tuple[str, int, int]] = []

    def watched(name: str, op: str):
        run = getattr(rt.store, name)

        def call(*args, **kwargs):
            before = [None if w.grad is None else w.grad.to_local().clone() for w in weights]
            run(*args, **kwargs)
            changed = sum(w.grad is not None and (b is None or not torch.equal(b, w.grad.to_local()))
                          for b, w in zip(before, weights))
            log.append((op, changed, len(weights)))

        return call

    for name, op in (("backward_input", "B"), ("backward_weight", "W")):
        setattr(rt.store, name, watched(name, op))
    return log


def watch_outputs(rt: PipelineRuntime) -> list[tuple[str, int | None]]:
    """Record, after each forward of a stage that is not the last, what the runtime keeps of the
    stage's output until its backward: its type and the bytes of its storage (None if it has none
    of its own). The runtime keeps only the autograd node, on a one-element storage."""
    forward, kept = rt._ops[Kind.F], []

    def call(state, instr, k):
        forward(state, instr, k)
        if instr.stage == 0 and (0, instr.mb) in state.saved:  # (not a forward whose R is due)
            out = state.saved[0, instr.mb][1]
            kept.append((type(out).__name__, out.untyped_storage().nbytes() if type(out) is torch.Tensor else None))

    rt._ops[Kind.F] = call
    return kept


def train(rank: int, world: int, paths: list[str], shape: tuple[int, ...], device: str) -> dict:
    """On a pp x tp (or pp x dp x tp) mesh, each schedule file in turn: a fresh model whose stages
    are tensor-parallel, STEPS steps of SGD (momentum 0.9) on this replica's part of the global
    batch; this rank's coordinates, groups, losses, full weights and split log."""
    from torch.distributed.device_mesh import init_device_mesh

    names = ("pp", "tp") if len(shape) == 2 else ("pp", "dp", "tp")
    mesh = init_device_mesh(device, shape, mesh_dim_names=names)
    groups = runtime_groups(mesh)
    pp = mesh["pp"].get_local_rank()
    dp, replicas = (mesh["dp"].get_local_rank(), mesh["dp"].size()) if "dp" in names else (0, 1)
    out: dict = {"pp": pp, "dp": dp, "pipeline_rank": dist.get_rank(groups["group"]),
                 "groups": sorted(groups), "pipeline": dist.get_process_group_ranks(groups["group"])}
    for path in paths:
        compiled = schedc.load(path)
        parts = blocks()
        mine = {s: tensor_parallel(parts[s].to(device), mesh["tp"]) for s in compiled.problem.rank_stages[pp]}
        opt = torch.optim.SGD([p for mod in mine.values() for p in mod.parameters()], lr=0.1, momentum=0.9)
        rt = PipelineRuntime(compiled, mine, mse, device=device, optimizer=opt, timeout=120, **groups)
        log, kept = watch_split(rt, mine), watch_outputs(rt)
        losses = []
        for x, y in batches(replicas * BATCH):
            x, y = x[dp * BATCH:(dp + 1) * BATCH], y[dp * BATCH:(dp + 1) * BATCH]
            loss = rt.step(x if 0 in mine else None, y if 1 in mine else None)
            losses.append(None if loss is None else loss.item())
        out[path] = {"losses": losses, "log": log, "kept": kept,
                     "weights": {f"{s}.{k}": full(t) for s, mod in mine.items() for k, t in mod.state_dict().items()}}
    return out


def reference(replicas: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process training the unparallelised model on the global batch: losses and weights."""
    parts = blocks()
    net = nn.Sequential(*parts)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches(replicas * BATCH):
        opt.zero_grad()
        n = replicas * M
        loss = torch.stack([mse(net(a), b) for a, b in zip(x.chunk(n), y.chunk(n))]).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {f"{s}.{k}": t.detach() for s, mod in enumerate(parts) for k, t in mod.state_dict().items()}


def problem(degree: int = 1) -> Problem:
    extra = {"data_parallel": {"degree": degree, "reduce": 1.0}} if degree > 1 else {}
    return Problem.parse(dict(ranks=2, microbatches=M, costs=dict(F=1, B=1, W=1), comm=0.1, memory=dict(F=4, B=-3),
                              **extra))


def with_policy(prob: Problem, order: str, kind: str, name: str) -> CompiledSchedule:
    """``order`` with ``kind`` (R: full recompute, S: selective, O: offload) on every (stage, microbatch)."""
    sections = prob.with_changes(recompute=dict(keep=1, selective=dict(time=0.5, keep=2)), offload=dict(time=0.5))
    schedule = with_policies(solvers.build(order, prob), {(s, i): kind for s in range(2) for i in range(M)})
    return CompiledSchedule.build(sections, schedule.renamed(name))


def assert_like_one_process(ranks: list[dict], path: str, replicas: int) -> None:
    """Every rank's full weights equal one process's (<= 1e-5), and so do the last stage's losses
    (averaged over the replicas)."""
    ref_losses, ref_weights = reference(replicas)
    per_replica = {r["dp"]: r[path]["losses"] for r in ranks if r[path]["losses"][0] is not None}
    assert sorted(per_replica) == list(range(replicas))
    mean = torch.tensor(list(per_replica.values())).mean(dim=0)
    torch.testing.assert_close(mean, torch.tensor(ref_losses), rtol=1e-5, atol=0, msg=path)
    for r in ranks:
        stages = {k.split(".")[0] for k in r[path]["weights"]}
        assert stages == {str(r["pp"])}, (path, stages)
        for k, t in r[path]["weights"].items():
            torch.testing.assert_close(t, ref_weights[k], rtol=1e-5, atol=1e-6, msg=f"{path}: {k}")
    initial = {f"{s}.{k}": t for s, mod in enumerate(blocks()) for k, t in mod.state_dict().items()}
    assert all(not torch.allclose(initial[k], t) for k, t in ref_weights.items())  # the steps changed every weight


def refusals(rank: int, world: int, offload_path: str, path: str) -> dict:
    """On a pp 2 x tp 2 mesh, one line per thing refused: the runtime's options that do not
    support DTensor parameters, meshes without a pipeline dimension, and (last, since it stops the
    pipeline) a stage that returns a DTensor."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
    pp = mesh["pp"].get_local_rank()
    compiled, offloaded = schedc.load(path), schedc.load(offload_path)
    out = {}

    def error(make) -> str | None:
        try:
            make()
        except PipelineError as e:
            return str(e)
        return None

    def stages(use_local_output: bool = True) -> dict:
        return {pp: tensor_parallel(blocks()[pp], mesh["tp"], use_local_output)}

    groups = runtime_groups(mesh)
    mine = stages()
    opt = torch.optim.SGD(mine[pp].parameters(), lr=0.1)
    out["clip"] = error(lambda: PipelineRuntime(compiled, mine, mse, optimizer=opt, clip_grad_norm=1.0, **groups))
    out["memory"] = error(lambda: PipelineRuntime(compiled, mine, mse, measure_memory=True, **groups))
    out["offload"] = error(lambda: PipelineRuntime(offloaded, mine, mse, **groups))
    other = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out["no pp"] = error(lambda: runtime_groups(other))
    out["unnamed"] = error(lambda: runtime_groups(init_device_mesh("cpu", (4,))))
    out["renamed"] = sorted(runtime_groups(other, pipeline="dp", data=None))
    out["same"] = error(lambda: runtime_groups(mesh, data="pp"))
    out["not a mesh"] = error(lambda: runtime_groups(mesh.get_group("pp")))
    from torch.distributed.device_mesh import DeviceMesh

    shuffled = DeviceMesh("cpu", torch.tensor([[2, 3], [0, 1]]), mesh_dim_names=("pp", "tp"))
    out["out of order"] = error(lambda: runtime_groups(shuffled))
    rt = PipelineRuntime(compiled, stages(use_local_output=False), mse, timeout=60, **groups)
    x, y = batches(BATCH)[0]
    out["dtensor output"] = error(lambda: rt.step(x if pp == 0 else None, y if pp == 1 else None))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_a_pipeline_by_tensor_parallel_mesh_trains_exactly_like_one_process(device, tmp_path):
    """pp 2 x tp 2: 1f1b, zb-h1 and zb-h1 with full or selective recompute give one process's weights; the
    pipeline group of each rank is its line along "pp" (group rank = pipeline coordinate); under
    zb-h1 every W, and no B, gives the rank's linear weight shards their gradients."""
    prob = problem()
    compiled = {name: schedc.compile(prob, name) for name in ("1f1b", "zb-h1")}
    compiled["zb-h1+R"] = with_policy(prob, "zb-h1", "R", "zb-h1+R")
    compiled["zb-h1+S"] = with_policy(prob, "zb-h1", "S", "zb-h1+S")
    paths = {}
    for name, c in compiled.items():
        paths[name] = str(tmp_path / f"{name}.json")
        c.save(paths[name])
    ranks = run_local(train, 4, list(paths.values()), (2, 2), device, timeout=300)
    assert [(r["pp"], r["pipeline_rank"], r["pipeline"], r["groups"]) for r in ranks] == [
        (0, 0, [0, 2], ["group"]), (0, 0, [1, 3], ["group"]), (1, 1, [0, 2], ["group"]), (1, 1, [1, 3], ["group"])]
    for name, path in paths.items():
        assert_like_one_process(ranks, path, 1)
        for r in ranks:
            # stage 0's output (torch's AsyncCollectiveTensor, waited for) kept from F to B without its values
            assert r[path]["kept"] == ([("Tensor", 4)] * (STEPS * M if "+R" not in name else 0) if r["pp"] == 0 else [])
            log = r[path]["log"]
            if name == "1f1b":
                assert log == [], log  # fused: no B, no W
                continue
            assert [op for op, _, _ in log].count("B") == [op for op, _, _ in log].count("W") == STEPS * M
            assert all(changed == (0 if op == "B" else n) and n == 2 for op, changed, n in log), (name, log)


def test_a_pipeline_by_data_by_tensor_parallel_mesh_trains_exactly_like_one_process(tmp_path):
    """pp 2 x dp 2 x tp 2 (8 gloo ranks): zb-h1 with the data-parallel all-reduce after each
    stage's last W; every replica's full weights equal one process's on the global batch."""
    path = str(tmp_path / "zb-h1-dp.json")
    schedc.compile(problem(degree=2), "zb-h1").save(path)
    ranks = run_local(train, 8, [path], (2, 2, 2), "cpu", timeout=300)
    assert all(r["groups"] == ["data_parallel_group", "group"] for r in ranks)
    assert sorted((r["dp"], r["pp"]) for r in ranks) == sorted([(d, p) for d in range(2) for p in range(2)] * 2)
    assert_like_one_process(ranks, path, 2)


def test_what_tensor_parallel_stages_do_not_support_is_refused_in_one_line(tmp_path):
    prob = problem()
    schedc.compile(prob, "1f1b").save(tmp_path / "1f1b.json")
    with_policy(prob, "1f1b", "O", "1f1b+O").save(tmp_path / "offload.json")
    ranks = run_local(refusals, 4, str(tmp_path / "offload.json"), str(tmp_path / "1f1b.json"), timeout=300)
    for rank, r in enumerate(ranks):
        pp = rank // 2
        stage = f"stage {pp} has tensor-parallel (DTensor) parameters: the runtime does not support"
        assert r["clip"] == f"{stage} clip_grad_norm with tensor parallelism yet"
        assert r["memory"] == f"{stage} measure_memory with tensor parallelism yet"
        assert r["offload"] == f"{stage} offload (O) with tensor parallelism yet"
        assert r["no pp"] == ("the device mesh has no pipeline dimension 'pp' (its dimensions are ('dp', 'tp')):"
                              " name it, e.g. init_device_mesh(..., mesh_dim_names=('pp', 'dp', 'tp')), or pass"
                              " pipeline=NAME")
        assert r["unnamed"].startswith("the device mesh has no pipeline dimension 'pp' (its dimensions have no names)")
        assert r["renamed"] == ["group"]
        assert r["same"] == "the pipeline and the data-parallel dimension are both 'pp'"
        assert r["not a mesh"] == "runtime_groups needs a torch DeviceMesh, got ProcessGroup"
        assert r["out of order"] == (  # ranks 2, 3 are coordinate 0 along pp, but rank 0 of its group
            f"this rank's pipeline coordinate in the mesh is {1 - pp} but its rank in the mesh's 'pp' group is {pp}"
            " (torch orders a group by global rank): build the mesh with init_device_mesh, or with global ranks"
            " ascending along 'pp'")
        if pp == 0:  # its stage returned the DTensor, at the shape exchange's forward
            assert r["dtensor output"] == (
                "stage 0 returned a DTensor ((Replicate(),)); a stage must return a plain tensor: keep use_local_output"
                "=True on its last tensor-parallel layer (torch's default), or return y.full_tensor()"), r
        else:  # waiting for that stage's output shape, stopped by its report
            assert r["dtensor output"].startswith(
                "rank 1: pipeline stopped at the shape exchange before step 0 (RECV act-1 s0->s1 from rank 0), waiting"
                f" for rank 0: rank 0 (global rank {rank - 2}) stage 0 returned a DTensor"), r
