"""The application layer: what a user runs, built on the core, the solvers and the runtime.

- ``cli``: the ``schedc`` command line;
- ``compile``: ``schedc.compile``, a problem to a schedule file by a solver or a named schedule;
- ``ablate``: ablation studies over a grid of problems;
- ``plot``: the figures (Gantt charts, memory curves, study figures).

Nothing below this layer imports it (tests/test_architecture.py).
"""
