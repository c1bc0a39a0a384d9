"""The torch.distributed interpreter of a compiled Program (imported as ``schedc.runtime``).

``PipelineRuntime`` runs one rank's instruction list; ``wgrad`` splits backward into B and W;
``launch.run_local`` starts a local multi-process group (tests, benchmarks); ``gpt`` is a small
GPT-style model given as a list of blocks; ``torch_pipeline`` / ``torch_actions`` /
``torch_placement`` (``torch_export``) run a compiled schedule with torch.distributed.pipelining's
own runtime instead. Importing this package imports torch.
"""

from schedc.runtime.interpreter import PipelineError, PipelineRuntime
from schedc.runtime.torch_export import torch_actions, torch_pipeline, torch_placement

__all__ = ["PipelineError", "PipelineRuntime", "torch_actions", "torch_pipeline", "torch_placement"]
