"""The torch.distributed interpreter of a compiled Program (imported as ``schedc.runtime``).

Bringing a model (``model``): ``ModelSpec`` (what ``schedc profile`` takes), ``cut`` and ``stages``
(blocks into stages), ``local_stages`` (the stages a rank holds under a schedule) and
``init_distributed`` (torchrun's group: NCCL on GPUs, else gloo). ``PipelineRuntime`` runs one
rank's instruction list; ``wgrad`` splits backward into B and W;
``launch.run_local`` starts a local multi-process group (tests, benchmarks); ``gpt`` is a small
GPT-style model given as a list of blocks; ``torch_pipeline`` / ``torch_actions`` /
``torch_placement`` (``torch_export``) run a compiled schedule with torch.distributed.pipelining's
own runtime instead. Importing this package imports torch (torch.distributed.pipelining only when
one of the torch_* names is first used).
"""

from schedc.runtime.interpreter import PipelineError, PipelineRuntime
from schedc.runtime.mesh import runtime_groups
from schedc.runtime.model import ModelSpec, cut, init_distributed, local_stages, stages

_TORCH_EXPORT = ("torch_actions", "torch_pipeline", "torch_placement")
__all__ = ["ModelSpec", "PipelineError", "PipelineRuntime", "cut", "init_distributed", "local_stages", "runtime_groups",
           "stages", *_TORCH_EXPORT]


def __getattr__(name: str):
    if name in _TORCH_EXPORT:
        from schedc.runtime import torch_export  # torch.distributed.pipelining takes seconds to import: on first use

        return getattr(torch_export, name)
    raise AttributeError(f"module 'schedc.runtime' has no attribute {name!r}")
