"""The runtime's process groups from a torch DeviceMesh (pipeline × data × tensor parallelism).

Tensor parallelism stays torch's: a stage module is parallelised with torch's own API
(``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` on ``mesh["tp"]``), and
``PipelineRuntime`` runs it like any module. What the runtime needs from the mesh is two groups:

- the pipeline: the ranks that differ only in the pipeline coordinate. Every tensor-parallel rank
  of a stage holds the whole (replicated) stage output and sends it to the rank of the next stage
  with the same data and tensor coordinates, so each such line of the mesh is one pipeline of its
  own, and its group is exactly ``mesh["pp"].get_group()`` (the pipeline rank = the coordinate).
- the data-parallel replicas: the ranks that differ only in the data coordinate, which hold the
  same stage and the same shard of each parameter, so that summing their shards' gradients sums
  the gradient (``mesh["dp"].get_group()``).

The tensor dimension needs nothing from the runtime: its collectives run inside the stage
modules, in torch's code.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from schedc.runtime.interpreter import PipelineError


def runtime_groups(mesh: Any, pipeline: str = "pp", data: str | None = "dp") -> dict[str, dist.ProcessGroup]:
    """The ``group`` and (where the mesh has a ``data`` dimension) ``data_parallel_group`` keyword
    arguments of ``PipelineRuntime`` for this rank, from a ``DeviceMesh`` with named dimensions::

        mesh = init_device_mesh("cuda", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        rt = PipelineRuntime(compiled, stages, loss_fn, **runtime_groups(mesh))

    A mesh without a ``data`` dimension (or ``data=None``) gives no data-parallel group: the
    runtime then refuses a schedule whose problem has ``data_parallel`` degree above 1. A mesh
    without a dimension named ``pipeline`` is refused: which dimension is the pipeline cannot be
    guessed (a mesh's first dimension is often data-parallel). So is a mesh whose ranks do not
    ascend along the pipeline: torch orders a group's ranks by global rank, so the runtime would
    run another stage's program than the one the mesh coordinate names."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if not hasattr(mesh, "get_group"):
        raise PipelineError(f"runtime_groups needs a torch DeviceMesh, got {type(mesh).__name__}")
    if pipeline not in names:
        have = f"its dimensions are {names}" if names else "its dimensions have no names"
        raise PipelineError(f"the device mesh has no pipeline dimension {pipeline!r} ({have}): name it, e.g."
                            " init_device_mesh(..., mesh_dim_names=('pp', 'dp', 'tp')), or pass pipeline=NAME")
    if data is not None and data == pipeline:
        raise PipelineError(f"the pipeline and the data-parallel dimension are both {pipeline!r}")
    group = mesh[pipeline].get_group()
    coordinate, rank = mesh.get_coordinate()[names.index(pipeline)], dist.get_rank(group)
    if rank != coordinate:  # a mesh built by hand with its ranks out of order along the pipeline
        raise PipelineError(f"this rank's pipeline coordinate in the mesh is {coordinate} but its rank in the"
                            f" mesh's {pipeline!r} group is {rank} (torch orders a group by global rank): build the"
                            f" mesh with init_device_mesh, or with global ranks ascending along {pipeline!r}")
    groups = {"group": group}
    if data is not None and data in names:
        groups["data_parallel_group"] = mesh[data].get_group()
    return groups
