"""The layer-level problem that ``schedc plan`` reads: the model as an ordered list of blocks
(layers), each with its own costs and memory, and the pipeline's shape still open.

A stage problem (``Problem``) fixes what each stage costs. Here the stages are not cut yet: the
file lists the blocks in model order, a block type (Megatron-LM's symbols: ``E`` embedding, ``t``
decoder layer, ``m`` MTP layer, ``L`` head and loss; any other name for other blocks) and a
``count`` for runs of identical blocks, and the choices ``plan`` may make: the chunks per rank
(v), the placements, the microbatches and the memory limit stay the problem's::

    name: llama-8b-p4
    ranks: 4
    microbatches: 16
    chunks: [1, 2]              # v to consider (default 1)
    placements: [loop, v]       # placements to consider (default loop; v needs 2 chunks;
                                # bidirectional: two pipelines in opposite directions, 1 chunk)
    comm: 0.05
    memory: {limit: 60}         # per rank, the same unit as the blocks' memory
    layers:
      - {type: E, F: 0.4, B: 0.4, W: 0.3, activation: 0.2, static: 8}
      - {type: t, count: 32, F: 1.0, B: 1.1, W: 0.9, activation: 1.0, static: 3.5}
      - {type: L, F: 2.2, B: 2.4, W: 2.0, activation: 4.0, static: 8}

Per block: F, B, W (time of one microbatch), ``activation`` (what its forward allocates and holds
until its backward), ``held_for_w`` (of that, what stays after B until W: default nothing),
``static`` (memory for the whole step: weights, gradients, optimizer state), ``recompute`` (time
to recompute its forward; default its F, used where the problem sets ``recompute: true``),
``sync`` (the ``bidirectional`` placement: time to sum its weight gradients with its copy's in the
other direction; default 0) and ``modules`` (names for the exports; ``{i}`` is numbered along the
blocks of the same pattern). A stage's costs and memory are its blocks' sums (``stage_problem``);
each rank also carries ``memory.static`` of the problem, the rest of what it holds for the whole
step. The ``bidirectional`` placement (Chimera, DualPipe) is the stage problem with ``replicas``
2: each direction runs half the step's ``microbatches`` (an even number), rank r holds stage r of
one and stage p-1-r of the other (both copies' weights), and each stage's copies sum their
gradients (``replicas.sync``, its blocks' ``sync``).
"""

from __future__ import annotations

from functools import cached_property, lru_cache
from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import Field, StrictInt, field_validator, model_validator

from schedc.errors import ProblemError
from schedc.inputs import read_data
from schedc.layout import stages_of
from schedc.problem import Boundary, Problem, check_numbers

BIDIRECTIONAL = "bidirectional"  # the placement of two pipelines in opposite directions (``replicas`` 2)

# The module names a block type is given by default (torchtitan's decoder: tok_embeddings,
# layers.<i>, norm and output; DeepSeek-V3's MTP modules as torchtitan names them).
DEFAULT_MODULES = {"E": ("tok_embeddings",), "t": ("layers.{i}",), "m": ("mtp.{i}",), "L": ("norm", "output")}


class _Layers(Boundary):
    """The layer-level models: bad data raises ProblemError with one line naming the field."""

    model_config = Boundary.model_config | {"frozen": True}
    _error: ClassVar[type[Exception]] = ProblemError
    _source: ClassVar[str] = "layers"


class Layer(_Layers):
    """One block, or ``count`` identical ones in a row."""

    type: str = Field(min_length=1, max_length=40, description="E, t, m, L (Megatron-LM's symbols) or another name")
    count: StrictInt = Field(default=1, ge=1, le=100_000)
    F: float
    B: float
    W: float
    activation: float = 0.0
    held_for_w: float = 0.0
    static: float = 0.0
    recompute: Optional[float] = None
    sync: float = 0.0
    modules: Optional[list[str]] = None

    _times = field_validator("F", "B", "W", mode="before")(lambda v: check_numbers(v, positive=True))
    _amounts = field_validator("activation", "held_for_w", "static", "sync", mode="before")(
        lambda v: check_numbers(v, nonnegative=True))
    _recompute = field_validator("recompute", mode="before")(lambda v: v if v is None else check_numbers(v, positive=True))

    @model_validator(mode="after")
    def _held(self) -> "Layer":
        if self.held_for_w > self.activation:
            raise ValueError(f"held_for_w {self.held_for_w:g} is above activation {self.activation:g}: what stays"
                             " until W is part of what the forward allocated")
        if self.modules is not None and (not self.modules or any(not m for m in self.modules)):
            raise ValueError("modules: a non-empty list of module names")
        return self

    def names(self) -> tuple[str, ...]:
        """Its module name patterns (``{i}`` numbered later), or () where none is known."""
        return tuple(self.modules) if self.modules is not None else DEFAULT_MODULES.get(self.type, ())


class LayerMemory(_Layers):
    _source = "memory"

    limit: Optional[float] = None
    static: float = 0.0

    _limit = field_validator("limit", mode="before")(lambda v: v if v is None else check_numbers(v, positive=True))
    _static = field_validator("static", mode="before")(lambda v: check_numbers(v, nonnegative=True))


class LayerProblem(_Layers):
    """A model as an ordered list of blocks, and the pipeline shapes ``plan`` may choose among."""

    name: str = Field(default="", max_length=200)
    ranks: StrictInt = Field(ge=1, le=4096)
    microbatches: StrictInt = Field(ge=1)
    chunks: Union[StrictInt, list[StrictInt]] = 1
    placements: list[Literal["loop", "v", "bidirectional"]] = ["loop"]
    comm: float = 0.0
    objective: Literal["makespan", "span"] = "makespan"
    memory: LayerMemory = LayerMemory()
    recompute: bool = False
    empty_stages: bool = Field(default=False, description="plan may leave a stage with no block (Megatron-LM's"
                               " layouts and schedc's runtime run it; torchtitan's and DeepSpeed's exports refuse it)")
    layers: list[Layer] = Field(min_length=1)

    _comm = field_validator("comm", mode="before")(lambda v: check_numbers(v, nonnegative=True))

    @model_validator(mode="after")
    def _shapes(self) -> "LayerProblem":
        chunks = self.chunk_choices
        if not chunks or any(v < 1 for v in chunks):
            raise ValueError(f"chunks: one or more counts >= 1, got {self.chunks!r}")
        if not self.placements:
            raise ValueError("placements: one or more of loop, v, bidirectional")
        if "v" in self.placements and 2 not in chunks:
            raise ValueError("placements: the V placement holds 2 chunks per rank: add 2 to chunks or drop v")
        if BIDIRECTIONAL in self.placements and 1 not in chunks:
            raise ValueError("placements: the bidirectional placement holds one stage of each direction per rank"
                             " (1 chunk): add 1 to chunks or drop bidirectional")
        if BIDIRECTIONAL in self.placements and self.ranks % 2:
            raise ValueError(f"placements: the bidirectional placement puts model stage s on ranks s and p-1-s,"
                             f" two ranks only where p is even, not {self.ranks}")
        if BIDIRECTIONAL in self.placements and self.microbatches % 2:
            raise ValueError(f"placements: the bidirectional placement gives each direction half the microbatches:"
                             f" {self.microbatches} is odd")
        if not self.shapes:
            raise ValueError(f"no pipeline shape fits {len(self.blocks)} blocks on {self.ranks} ranks: every stage holds"
                             f" at least one block, so at least ranks x chunks ({self.ranks * min(chunks)}) blocks"
                             " (or set empty_stages)")
        return self

    @cached_property
    def chunk_choices(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.chunks))) if isinstance(self.chunks, list) else (self.chunks,)

    @cached_property
    def blocks(self) -> tuple[Layer, ...]:
        """Every block in model order (a run of ``count`` repeated)."""
        return tuple(layer for layer in self.layers for _ in range(layer.count))

    @cached_property
    def shapes(self) -> tuple[tuple[int, str], ...]:
        """The (chunks, placement) pairs to consider: each placement with each v it holds, as many
        stages as there are blocks at most."""
        n = len(self.blocks)
        return tuple((v, pl) for v in self.chunk_choices for pl in self.placements
                     if (pl == "loop" or (pl == "v" and v == 2) or (pl == BIDIRECTIONAL and v == 1))
                     and (self.ranks * v <= n or self.empty_stages))

    @cached_property
    def module_names(self) -> tuple[tuple[str, ...], ...]:
        """Per block, its module names (``{i}`` numbered along the blocks of the same pattern, from 0)."""
        seen: dict[str, int] = {}
        out = []
        for block in self.blocks:
            names = []
            for pattern in block.names():
                i = seen.get(pattern, 0)
                seen[pattern] = i + 1
                names.append(pattern.replace("{i}", str(i)))
            out.append(tuple(names))
        return tuple(out)

    def stage_ranks(self, chunks: int, placement: str) -> tuple[int, ...]:
        """Each stage's rank with ``chunks`` stages per rank on ``placement`` (the cut does not
        matter); bidirectional: the stages of both directions, the model's stage s at s and at
        s + ranks (``Problem.stage_rank`` with replicas)."""
        return _stage_ranks(self.ranks, chunks, placement)

    def stage_problem(self, sizes: list[int], chunks: int, placement: str, name: str | None = None) -> Problem:
        """The stage problem of a partition: ``sizes`` blocks per stage (model order), ``chunks``
        stages per rank on ``placement``; each stage's costs and memory its blocks' sums."""
        n = self.ranks * chunks
        if len(sizes) != n or sum(sizes) != len(self.blocks) or min(sizes) < 0:
            raise ProblemError(f"{self.name or 'layers'}: a partition of {len(self.blocks)} blocks into {n} stages"
                               f" (0 for an empty stage), got {sizes}")
        stages = stages_of(sizes, self.blocks)

        def total(field: str) -> list[float]:
            return [round(sum(getattr(b, field) for b in stage), 12) for stage in stages]

        activation, held = total("activation"), total("held_for_w")
        two = placement == BIDIRECTIONAL  # (each direction runs half the step's microbatches)
        data: dict[str, Any] = dict(
            name=name or self.name or "plan", ranks=self.ranks, microbatches=self.microbatches // (2 if two else 1),
            chunks=chunks, placement="loop" if two else placement, comm=self.comm, objective=self.objective,
            stage_blocks=list(sizes),
            costs=dict(F=total("F"), B=total("B"), W=total("W")),
            memory=dict(F=activation, B=[h - a for a, h in zip(activation, held)], W=[-h for h in held]),
        )
        if two:
            data["replicas"] = dict(count=2, sync=total("sync"))
        static = [self.memory.static] * self.ranks
        for s, r in enumerate(self.stage_ranks(chunks, placement)):  # (bidirectional: both copies)
            static[r] += sum(b.static for b in stages[s % n])
        data["memory"]["static"] = [round(x, 12) for x in static]
        if self.memory.limit is not None:
            data["memory"]["limit"] = self.memory.limit
        if self.recompute:
            data["recompute"] = dict(time=[round(sum(b.F if b.recompute is None else b.recompute for b in stage), 12)
                                           for stage in stages])
        return Problem.parse(data, source=data["name"])


@lru_cache(maxsize=64)
def _stage_ranks(ranks: int, chunks: int, placement: str) -> tuple[int, ...]:
    """``LayerProblem.stage_ranks``, worked out once per shape (the plan's descent asks per cut)."""
    two = placement == BIDIRECTIONAL
    return Problem.parse(dict(ranks=ranks, microbatches=1, chunks=chunks, placement="loop" if two else placement,
                              costs=dict(F=1, B=1, W=1), **({"replicas": {"count": 2}} if two else {}))).stage_rank


def load_layers(path) -> LayerProblem:
    """Read a layer-level problem from a YAML or JSON file."""
    data = read_data(path, error=ProblemError, what="layer-level problem file")
    if not isinstance(data, dict):
        raise ProblemError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    if "costs" in data and "layers" not in data:
        raise ProblemError(f"{path}: a stage problem (costs per stage), not a layer-level one (its blocks under"
                           " 'layers'): `schedc solve` reads it; `schedc plan` reads the blocks (docs/plan.md)")
    return LayerProblem.validated(data, str(path))

