"""The torch.distributed interpreter of a compiled Program (imported as ``schedc.runtime``).

``PipelineRuntime`` runs one rank's instruction list; ``wgrad`` splits backward into B and W;
``launch.run_local`` starts a local multi-process group (tests, benchmarks); ``gpt`` is a small
GPT-style model given as a list of blocks. Importing this package imports torch.
"""

from schedc.runtime.interpreter import PipelineError, PipelineRuntime

__all__ = ["PipelineError", "PipelineRuntime"]
