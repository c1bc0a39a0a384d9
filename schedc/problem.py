"""The input of every compile pass: what a pipeline costs and how much memory each rank has.

A Problem has ``ranks`` (p) ranks, ``microbatches`` (m) microbatches and ``chunks`` (v) model
chunks per rank, so ``p * v`` stages. Stage ``s`` runs on ``stage_rank[s]``, fixed by the
placement:

- ``loop``: stage s on rank s mod p (Megatron's interleaved layout);
- ``v``: chunks zig-zag, so for v = 2 rank r holds stages r and 2p-1-r (the V shape);
- an explicit list, either stage -> rank (``[0, 1, 1, 0]``) or rank -> stages
  (``[[0, 3], [1, 2]]``).

Costs are per stage: ``F`` (forward), ``B`` (gradient of the input), ``W`` (gradient of the
weights); a fused backward costs ``B + W``. ``comm`` is the latency of every transfer between two
different ranks. Memory is per stage as deltas (``F`` allocates the activation, ``B`` frees part,
``W`` the rest, so the three sum to zero) plus static memory and an optional limit per rank, and
optionally each stage's working memory: what one of its ops needs only while it runs (temporaries,
the received tensor it consumes), above its level. Scalars broadcast to every stage (or rank).

With ``replicas`` (two pipelines in opposite directions on the same ranks: Chimera, DualPipe) the
problem has ``replicas.count`` copies of the pipeline, pipeline k's stages k*L .. k*L + L - 1 (L =
ranks x chunks, ``pipeline_stages``), each running ``microbatches`` of its own; an odd pipeline is
placed mirrored, per-stage lists may give the model's L values, and the copies of a model stage
sum their gradients (``replicas.sync``). ``costs.FB`` (per rank) is how long a forward and an input
gradient of two microbatches take run overlapped (``pair_time``).

The memory model is conservative: a rank's peak activation is the highest level its ops' deltas
reach plus the largest working memory of its stages (``working_memory``), so every comparison of
a level against a limit uses ``activation_room`` = limit - static - that working memory.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cached_property, reduce
from operator import add
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from schedc.errors import ProblemError
from schedc.inputs import read_data, safe_filename, shorten
from schedc.kinds import ROWS, Kind, unsupported
from schedc.tolerance import REL_MEMORY, Tolerance

Number = Union[float, list[float]]
_ABSENT = object()  # Problem._field: a section on the way is not given
# The per-stage times that are > 0, but 0 on an empty stage (``Problem._costs``).
_STAGE_TIMES = ("costs.F", "costs.B", "costs.W", "costs.BW", "recompute.time", "recompute.selective.time",
                "offload.time")


def _summed(parts) -> tuple[float, ...]:
    """Per stage, the sum of ``parts`` (per-stage tuples), added left to right."""
    return tuple(reduce(add, xs) for xs in zip(*parts))


class Boundary(BaseModel):
    """A pydantic model at schedc's boundary (files, CLI, API). A misspelt field is an error,
    never silently ignored (extra="forbid"), and bad data, however the model is built
    (``Model(...)``, ``model_validate``, ``model_validate_json``), raises ``_error`` (one of
    schedc's errors, also a ValueError) with one line naming the field, never pydantic's
    multi-line ValidationError. A model nested in another is validated by pydantic's core as
    part of the outer one (its ``__init__`` is not called), so only the outermost call converts."""

    model_config = ConfigDict(extra="forbid")
    _error: ClassVar[type[Exception]] = ProblemError
    _source: ClassVar[str] = "problem"  # what the message starts with when no file is named

    def __init__(self, /, **data: Any) -> None:
        with self._one_line_errors():
            super().__init__(**data)

    # pydantic reads this: the __init__ above validates as BaseModel's does, so that validating a
    # model nested in another need not call it (else the outer field's error would be ours, not
    # pydantic's, and lose its location).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any:
        """A copy; with ``update``, a validated one (pydantic's own copies the fields unchecked,
        and for a Problem would also keep the derived views of the original: its stage_rank of
        the old ranks)."""
        if not update:
            return super().model_copy(deep=deep)
        data = {name: getattr(self, name) for name in type(self).model_fields}
        data = copy.deepcopy(data) if deep else data
        return type(self).model_validate({**data, **update})

    def __setattr__(self, name: str, value: Any) -> None:
        if self.model_config.get("frozen"):
            raise self._error(f"{self._source}: {name}: a {type(self).__name__} cannot be changed in place:"
                              " make a changed copy with model_copy(update=...)")
        with self._one_line_errors():
            super().__setattr__(name, value)

    @classmethod
    def _one_line(cls, e: ValidationError, source: str) -> Exception:
        return cls._error(f"{source}: {format_validation_error(e, cls)}")

    @classmethod
    @contextmanager
    def _one_line_errors(cls, source: str | None = None) -> Iterator[None]:
        """pydantic's ValidationError raised inside becomes ``_error`` with one line, starting
        with ``source`` (a file name) or the model's own ``_source``."""
        try:
            yield
        except ValidationError as e:
            raise cls._one_line(e, source or cls._source) from None

    @classmethod
    def validated(cls, data: Any, source: str | None = None) -> Any:
        """``data`` validated; ``source`` (a file name) starts the one-line error message."""
        with cls._one_line_errors(source):
            return super().model_validate(data)

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Any:
        with cls._one_line_errors():
            return super().model_validate(obj, **kwargs)

    @classmethod
    def model_validate_json(cls, json_data: Any, **kwargs: Any) -> Any:
        with cls._one_line_errors():
            return super().model_validate_json(json_data, **kwargs)

    @classmethod
    def model_validate_strings(cls, obj: Any, **kwargs: Any) -> Any:
        with cls._one_line_errors():
            return super().model_validate_strings(obj, **kwargs)


class _Strict(Boundary):
    """The problem's models: bad data raises ProblemError with one line. Frozen: a Problem's
    derived views (stage_rank, cost, ...) are computed once, so its fields cannot change."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _error = ProblemError


# Magnitudes in any unit (seconds to nanoseconds, bytes to terabytes fit): no amount above
# LARGEST (sums would overflow), and the largest time (op cost or comm) at least SMALLEST (times
# are compared relative to it; near the float limits nothing is exact any more).
SMALLEST, LARGEST = 1e-9, 1e15
# The most stage-microbatch pairs (p * v * m; three ops each with a split backward) a problem may
# have: every pass holds a few objects per op, so this keeps any command within a few GB.
MAX_STAGE_MICROBATCHES = 2**18


def check_numbers(value: Any, *, positive: bool = False, nonnegative: bool = False, or_zero: bool = False) -> Any:
    """Per-element check of a scalar-or-list field, so the message names the offending value.
    ``or_zero``: with ``positive``, a 0 in a list passes too (a per-stage time, 0 on an empty stage
    only: ``Problem._costs`` checks which; a single 0 would make every stage empty)."""
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        raise ValueError("must be a number or a non-empty list of numbers, got []")
    for i, x in enumerate(items):
        where = f" (index {i})" if isinstance(value, list) else ""
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"must be a number, got {shorten(x)}{where}")
        if x != x or x in (float("inf"), float("-inf")):
            raise ValueError(f"must be finite, got {x}{where}")
        if positive and (x < 0 or x == 0 and not (or_zero and isinstance(value, list))):
            raise ValueError(f"must be > 0, got {x}{where}")
        if nonnegative and x < 0:
            raise ValueError(f"must be >= 0, got {x}{where}")
        if abs(x) > LARGEST:
            raise ValueError(f"{shorten(x)}{where} is out of range: at most {LARGEST:g} in any unit; use another unit")
    return value


class Costs(_Strict):
    """Time of one microbatch through one stage, in any unit (ms by convention)."""

    _source = "costs"

    F: Number
    B: Number
    W: Number
    BW: Optional[Number] = Field(
        default=None, description="fused backward (B and W in one pass, as 1F1B runs it); default B + W"
    )
    FB: Optional[Number] = Field(
        default=None, description="per rank: a forward and an input gradient (B) of two microbatches run overlapped"
        " (DualPipe's F&B and torch's OVERLAP_F_B pair a forward with a FULL backward: F&B = FB + W);"
        " default the two one after the other, F + B")

    _positive = field_validator("FB", mode="before")(lambda v: v if v is None else check_numbers(v, positive=True))
    _per_stage = field_validator("F", "B", "W", "BW", mode="before")(  # (0 on an empty stage only: ``_costs``)
        lambda v: v if v is None else check_numbers(v, positive=True, or_zero=True)
    )


class Memory(_Strict):
    """Activation-memory deltas per stage and static memory / limit per rank (any unit, GB by convention)."""

    _source = "memory"

    F: Number = 1.0
    B: Number | None = Field(default=None, description="delta of B; default -F/2")
    W: Number | None = Field(default=None, description="delta of W; default -(F + B)")
    static: Number = 0.0
    limit: Number | None = None
    working: Number | None = Field(
        default=None,
        description="per stage: memory an op of the stage needs while it runs, above its level (temporaries,"
        " a received tensor); default 0",
    )
    weights: Number | None = Field(
        default=None,
        description="per stage: one copy of its parameters (part of static memory); an asynchronous schedule"
        " (PipeDream-2BW) keeps a second copy. Default: not given (counted as 0, and said so)",
    )

    @field_validator("F", "B", "W", mode="before")
    @classmethod
    def _deltas(cls, v: Any) -> Any:
        return v if v is None else check_numbers(v)

    @field_validator("static", mode="before")
    @classmethod
    def _static(cls, v: Any) -> Any:
        return check_numbers(v, nonnegative=True)

    @field_validator("limit", "working", "weights", mode="before")
    @classmethod
    def _nonnegative(cls, v: Any) -> Any:
        return v if v is None else check_numbers(v, nonnegative=True)


class Selective(_Strict):
    """Selective recompute (Megatron's): the forward keeps ``keep``, the rest is recomputed in ``time``."""

    _source = "recompute.selective"

    time: Number
    keep: Number

    _time = field_validator("time", mode="before")(lambda v: check_numbers(v, positive=True, or_zero=True))
    _keep = field_validator("keep", mode="before")(lambda v: check_numbers(v, nonnegative=True))


class Recompute(_Strict):
    """Activation recompute, per stage: a dropped microbatch's forward keeps ``keep`` (its input) and
    its recompute ``R`` brings the rest back in ``time`` before its backward."""

    _source = "recompute"

    time: Optional[Number] = Field(default=None, description="recomputing one microbatch's forward; default the stage's F")
    keep: Number = Field(default=0.0, description="what a dropped microbatch holds until its recompute; default 0")
    selective: Optional[Selective] = None

    _time = field_validator("time", mode="before")(
        lambda v: v if v is None else check_numbers(v, positive=True, or_zero=True))
    _keep = field_validator("keep", mode="before")(lambda v: check_numbers(v, nonnegative=True))


class Offload(_Strict):
    """Activation offload, per stage: copying one microbatch's activation to host memory takes
    ``time``, and the same back; both run on the rank's copy lane, beside compute."""

    _source = "offload"

    time: Number

    _time = field_validator("time", mode="before")(lambda v: check_numbers(v, positive=True, or_zero=True))


class DataParallel(_Strict):
    """Data parallelism: ``degree`` replicas of the pipeline, each stage's weight gradient
    all-reduced over them once per iteration in ``reduce`` (per stage), on the rank's communication
    lane beside compute; ``overlap`` issues a stage's reduce after its last weight gradient
    (Megatron's ``--overlap-grad-reduce``), else after the rank's last compute op."""

    _source = "data_parallel"

    degree: int = Field(ge=1, le=1_000_000, strict=True)
    reduce: Number = Field(description="the all-reduce of one stage's weight gradient over the replicas")
    overlap: bool = Field(default=True, strict=True, description="issue each reduce as soon as its stage's "
                          "gradients are complete (else all after the rank's last compute op)")

    _reduce = field_validator("reduce", mode="before")(lambda v: check_numbers(v, nonnegative=True))


class Replicas(_Strict):
    """Copies of the whole pipeline on the same ranks (a bidirectional placement: Chimera, DualPipe,
    BitPipe): ``count`` pipelines, each running the problem's ``microbatches`` of its own. Pipeline
    k holds stages k*L .. k*L + L - 1 (L = ranks x chunks: ``Problem.pipeline_stages``); with the
    named placements an odd pipeline is placed as pipeline 0 mirrored (rank r -> p - 1 - r), so a rank
    holds stage r of one direction and stage p - 1 - r of the other. The copies of one model stage
    sum their weight gradients before the step (RS), a collective of the ranks that hold them, in
    ``sync`` (per model stage)."""

    _source = "replicas"

    count: int = Field(ge=2, le=8, strict=True, description="pipelines (2: two directions)")
    sync: Number = Field(default=0.0, description="summing the weight gradients of one model stage's copies")

    _sync = field_validator("sync", mode="before")(lambda v: check_numbers(v, nonnegative=True))


SHARE_SUM_TOLERANCE = 0.01  # how far a kind's sequence-chunk shares may sum from 1 (rounding in a file)


class SequenceChunks(_Strict):
    """Sequence-level pipelining (Seq1F1B): each microbatch's sequence cut into ``count`` chunks
    that flow through the pipeline one after another. On each stage a chunk's forward needs the
    earlier chunks' keys and values (it waits for the forward of the chunk before it), and the
    backwards run in reverse chunk order (a chunk's backward waits for the one of the chunk after
    it, which gives it the gradient of its keys and values). ``F``, ``B``, ``W``: per chunk
    position, its share of the whole sequence's cost of that kind (causal attention: a later chunk
    attends to more keys and costs more); ``memory``: its share of the stage's activation. Each
    defaults to 1/count per chunk; the shares of a kind sum to 1 (within ``SHARE_SUM_TOLERANCE``,
    for rounded files): they split the stage's cost, and what chunking adds (smaller pieces may run
    less efficiently) belongs in the costs themselves (``runtime.profile.make_problem`` writes the
    chunked sequence's)."""

    _source = "sequence_chunks"

    count: int = Field(ge=1, le=64, strict=True, description="chunks per sequence")
    F: Optional[list[float]] = Field(default=None, description="per chunk, its share of the sequence's F")
    B: Optional[list[float]] = Field(default=None, description="per chunk, its share of the sequence's B")
    W: Optional[list[float]] = Field(default=None, description="per chunk, its share of the sequence's W")
    memory: Optional[list[float]] = Field(default=None, description="per chunk, its share of the activation")

    _shares = field_validator("F", "B", "W", "memory", mode="before")(
        lambda v: v if v is None else check_numbers(v, positive=True))

    @model_validator(mode="after")
    def _lengths(self) -> "SequenceChunks":
        for field in ("F", "B", "W", "memory"):
            shares = getattr(self, field)
            if shares is not None and len(shares) != self.count:
                raise ValueError(f"{field} has {len(shares)} shares but there are {self.count} chunks: one per chunk")
            if shares is not None and abs(sum(shares) - 1) > SHARE_SUM_TOLERANCE:
                raise ValueError(f"{field} shares sum to {sum(shares):g}, not 1: each is its chunk's part of the"
                                 f" whole sequence's {'activation' if field == 'memory' else field}, so they must"
                                 " add up to it (put what chunking adds into the costs or memory themselves)")
        return self

    def shares(self, field: str) -> tuple[float, ...]:
        given = getattr(self, field)
        return tuple(given) if given is not None else (1.0 / self.count,) * self.count


class Tied(_Strict):
    """Weights shared between stages (tied input and output embeddings): ``groups`` of stages
    holding the same weights, whose gradients are summed (TS) before the step, in ``sync`` (per
    stage), by the ranks holding them; stages of a group on one rank share the weights there and
    need no sum."""

    _source = "tied"

    groups: list[list[StrictInt]] = Field(description="stages that share weights, e.g. [[0, 7]]")
    sync: Number = Field(default=0.0, description="summing the tied weights' gradient over their ranks")

    _sync = field_validator("sync", mode="before")(lambda v: check_numbers(v, nonnegative=True))


class Problem(_Strict):
    name: str = Field(default="", max_length=200)
    ranks: int = Field(ge=1, le=4096, strict=True)
    microbatches: int = Field(ge=1, le=1_000_000, strict=True)
    chunks: int = Field(default=1, ge=1, le=64, strict=True)
    placement: Union[Literal["loop", "v"], list[StrictInt], list[list[StrictInt]]] = "loop"
    costs: Costs
    comm: float = 0.0
    memory: Memory = Memory()
    recompute: Optional[Recompute] = Field(default=None, description="lets a schedule recompute activations")
    offload: Optional[Offload] = Field(default=None, description="lets a schedule offload activations to host memory")
    data_parallel: Optional[DataParallel] = Field(
        default=None, description="data-parallel replicas: a gradient all-reduce per stage on a communication lane")
    replicas: Optional[Replicas] = Field(
        default=None, description="copies of the pipeline on the same ranks (bidirectional), or their count")
    tied: Optional[Tied] = Field(default=None, description="stages sharing weights (tied embeddings), or their groups")
    sequence_chunks: Optional[SequenceChunks] = Field(
        default=None, description="each sequence cut into chunks that flow one after another (Seq1F1B), or their count")
    objective: Literal["makespan", "span", "steady"] = "makespan"
    stage_blocks: Optional[list[Annotated[int, Field(ge=0)]]] = Field(
        default=None, description="model blocks in each stage of the model (of one pipeline), from the partitioner;"
        " 0 for an empty stage"
    )

    @field_validator("name")
    @classmethod
    def _printable(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError(f"must be printable text on one line, got {shorten(v)}")
        return v

    @field_validator("comm", mode="before")
    @classmethod
    def _comm(cls, v: Any) -> Any:
        return check_numbers(v, nonnegative=True)

    @field_validator("replicas", mode="before")
    @classmethod
    def _replica_count(cls, v: Any) -> Any:
        return {"count": v} if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("sequence_chunks", mode="before")
    @classmethod
    def _chunk_count(cls, v: Any) -> Any:
        return {"count": v} if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("tied", mode="before")
    @classmethod
    def _tied_shorthand(cls, v: Any) -> Any:
        return {"groups": v} if isinstance(v, list) else v

    @field_validator("placement", mode="before")
    @classmethod
    def _placement_shape(cls, v: Any) -> Any:
        if isinstance(v, str) and v not in ("loop", "v"):
            raise ValueError(f"must be 'loop', 'v' or a list, got {v!r}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Problem":
        pairs = self.n_stages * self.units
        if pairs > MAX_STAGE_MICROBATCHES:
            raise ValueError(
                f"ranks x chunks x microbatches{' x replicas' if self.replicas else ''}"
                f"{' x sequence chunks' if self.sequence_chunks else ''} is {pairs}, above the {MAX_STAGE_MICROBATCHES} that schedc"
                " handles (every pass holds each op in memory): fewer microbatches, or several problems"
            )
        if self.sequence_chunks is not None:
            given = [name for name in ("replicas", "recompute", "offload", "data_parallel", "tied")
                     if getattr(self, name) is not None] + (["costs.FB"] if self.costs.FB is not None else [])
            if given:
                raise ValueError(f"sequence_chunks cannot be combined with {', '.join(given)} yet")
        # Touch every derived array: each raises a ValueError naming the field.
        self.stage_rank
        self._costs()  # every kind's per-stage costs, each list of the right length and > 0 (empty stages 0)
        self.overlap_time  # read once here so a costs.FB of the wrong length is refused now
        self.sync_groups  # and tied groups out of range
        if self.time_scale < SMALLEST:
            raise ValueError(f"the largest op cost is {self.time_scale:g}, below {SMALLEST:g}: use a smaller unit of time")
        deltas = self.mem_deltas
        tol = self.memory_tol
        for s, (f, b, w) in enumerate(zip(*deltas)):
            if f < 0:
                raise ValueError(f"memory.F of stage {s} is {f}: a forward allocates, it cannot be negative")
            if not (tol.le(-f, b) and tol.le(b, 0.0) and tol.le(-f, w) and tol.le(w, 0.0)):
                raise ValueError(
                    f"memory deltas of stage {s} are F {f:g}, B {b:g}, W {w:g}: B frees part of what F"
                    f" allocated and W the rest, so each must lie in [-{f:g}, 0]"
                )
            if not tol.eq(f + b + w, 0.0):
                raise ValueError(
                    f"memory deltas of stage {s} sum to {f + b + w:g}, not 0 (F {f:g}, B {b:g}, W {w:g}):"
                    f" set memory.W to {-(f + b):g} or leave it out"
                )
        for field, keep in self._keeps():
            for s, (k, a) in enumerate(zip(keep, deltas[0])):
                if tol.gt(k, a):
                    raise ValueError(
                        f"{field} of stage {s} is {k:g}, above the stage's activation memory.F {a:g}: what a"
                        " dropped microbatch keeps is part of what its forward allocates"
                    )
        self._per_rank("memory.static", self.memory.static)
        self.stage_working  # read once here so a memory.working of the wrong length is refused now
        self.stage_weights  # and a memory.weights
        if self.stage_blocks is not None and len(self.stage_blocks) != self.pipeline_stages:
            raise ValueError(f"stage_blocks has {len(self.stage_blocks)} entries but there are {self.pipeline_stages}"
                             " stages")
        hollow = [s for s, k in enumerate(self.stage_blocks or ()) if (k == 0) != (s in self.empty_stages)]
        if hollow:
            s = hollow[0]
            raise ValueError(f"stage_blocks gives stage {s} {self.stage_blocks[s]} blocks, but its costs F, B and W"
                             f" are {'all 0 (an empty stage)' if s in self.empty_stages else 'not 0'}: a stage"
                             " with no block is empty, and only it")
        limits = self.memory_limit
        if limits is not None:
            for r, limit in enumerate(limits):
                need = self.min_memory(r)
                if tol.lt(limit, need):
                    raise ValueError(
                        f"memory.limit of rank {r} is {limit:g}, below the {need:g} that any schedule needs"
                        f" there (static memory plus one microbatch through stages"
                        f" {', '.join(map(str, self.rank_stages[r]))}"
                        + (f" plus working memory {self.working_memory[r]:g}" if self.working_memory[r] else "")
                        + "): raise it"
                    )
        return self

    # ---- derived, read-only views (plain tuples: cheap in hot loops) ----

    @property
    def n_stages(self) -> int:
        """Every stage of every pipeline: ``pipelines * pipeline_stages``."""
        return self.pipelines * self.ranks * self.chunks

    @property
    def pipelines(self) -> int:
        """How many copies of the pipeline run (``replicas.count``; 1 without replicas)."""
        return 1 if self.replicas is None else self.replicas.count

    @property
    def pipeline_stages(self) -> int:
        """The stages of one pipeline (ranks x chunks): a microbatch's chain, the model's stages.
        Stage s is stage ``s % pipeline_stages`` of the model in pipeline ``s // pipeline_stages``."""
        return self.ranks * self.chunks

    def _per_stage(self, field: str, value: Number) -> tuple[float, ...]:
        """A per-stage field: a scalar for every stage, one value per stage of the model (the same
        in every pipeline) or, with replicas, one per stage of every pipeline."""
        if isinstance(value, list) and self.pipelines > 1 and len(value) == self.pipeline_stages:
            value = value * self.pipelines
        return _broadcast(field, value, self.n_stages, "stages")

    def _per_rank(self, field: str, value: Number) -> tuple[float, ...]:
        return _broadcast(field, value, self.ranks, "ranks")

    @cached_property
    def stage_rank(self) -> tuple[int, ...]:
        """stage -> rank."""
        p, v, n, length = self.ranks, self.chunks * self.pipelines, self.n_stages, self.pipeline_stages
        pl = self.placement
        if pl in ("loop", "v"):  # pipeline 0's; an odd pipeline mirrored
            one = [s % p if pl == "loop" or (s // p) % 2 == 0 else p - 1 - s % p for s in range(length)]
            result = tuple(r if k % 2 == 0 else p - 1 - r for k in range(self.pipelines) for r in one)
        elif pl and all(isinstance(x, list) for x in pl):  # rank -> stages
            if len(pl) != p:
                raise ValueError(f"placement lists stages for {len(pl)} ranks, but ranks is {p}")
            owner: dict[int, int] = {}
            for r, stages in enumerate(pl):
                for s in stages:
                    if not 0 <= s < n:
                        raise ValueError(f"placement: stage {s} on rank {r} is out of range 0..{n - 1}")
                    if s in owner:
                        raise ValueError(f"placement: stage {s} appears twice (ranks {owner[s]} and {r})")
                    owner[s] = r
            missing = sorted(set(range(n)) - set(owner))
            if missing:
                raise ValueError(f"placement misses stages {missing} (there are {n} = ranks x chunks"
                                 f"{' x replicas' if self.pipelines > 1 else ''})")
            result = tuple(owner[s] for s in range(n))
        else:  # stage -> rank
            if len(pl) != n:
                raise ValueError(
                    f"placement has {len(pl)} entries but there are {n} stages (ranks {p} x chunks {self.chunks}"
                    f"{f' x replicas {self.pipelines}' if self.pipelines > 1 else ''});"
                    f" it {'misses' if len(pl) < n else 'has extra'} stages"
                )
            for s, r in enumerate(pl):
                if not 0 <= r < p:
                    raise ValueError(f"placement puts stage {s} on rank {r}, outside 0..{p - 1}")
            result = tuple(pl)
        for j in range(length if self.pipelines > 1 else 0):
            copies = [result[s] for s in range(j, n, length)]
            if len(set(copies)) < len(copies):
                r = next(r for r in copies if copies.count(r) > 1)
                raise ValueError(f"placement puts two copies of model stage {j} (stages"
                                 f" {', '.join(str(s) for s in range(j, n, length) if result[s] == r)}) on rank {r}:"
                                 " with replicas, a rank holds at most one copy of each model stage")
        for r in range(p):
            held = result.count(r)
            if held != v:
                raise ValueError(f"placement gives rank {r} {held} stages, but chunks is {self.chunks}"
                                 + (f" (x {self.pipelines} replicas: {v})" if self.pipelines > 1 else ""))
        return result

    @cached_property
    def rank_stages(self) -> tuple[tuple[int, ...], ...]:
        """rank -> its stages, ascending."""
        out: list[list[int]] = [[] for _ in range(self.ranks)]
        for s, r in enumerate(self.stage_rank):
            out[r].append(s)
        return tuple(tuple(x) for x in out)

    def pipeline_of(self, stage: int) -> int:
        return stage // self.pipeline_stages

    @cached_property
    def sync_groups(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        """A collective's group name (``KindRow.group``) -> its groups of stages, each run together
        by the ranks holding its members, in the one order every rank issues them in: "replicas",
        per model stage (the later first), its copies in every pipeline (none without replicas);
        "tied", the tied groups whose stages sit on different ranks."""
        length = self.pipeline_stages
        return {"replicas": tuple(tuple(range(j, self.n_stages, length)) for j in reversed(range(length)))
                if self.replicas is not None else (),
                "tied": self._tied_groups()}

    def _tied_groups(self) -> tuple[tuple[int, ...], ...]:
        """``tied.groups`` checked (stages in range, two or more distinct per group, none in two
        groups), those whose stages sit on more than one rank, in the file's order. With replicas
        the groups name model stages (0 .. L - 1), and each pipeline's copies of a group sum their
        tied weights' gradients (after each copy's sum with its own copies, RS, which every rank
        takes first: the tied weights' gradient is then the sum over every copy of every stage of
        the group); there each pipeline's stages of a group must sit on different ranks."""
        if self.tied is None:
            return ()
        length = self.pipeline_stages
        seen: dict[int, int] = {}
        out = []
        for k, group in enumerate(self.tied.groups):
            if len(set(group)) < 2 or len(set(group)) != len(group):
                raise ValueError(f"tied.groups[{k}] is {group}: a group is two or more distinct stages")
            for s in group:
                if not 0 <= s < length:
                    what = "model stage" if self.replicas is not None else "stage"
                    raise ValueError(f"tied.groups[{k}]: {what} {s} is out of range 0..{length - 1}")
                if s in seen:
                    raise ValueError(f"tied: stage {s} is in groups {seen[s]} and {k}; merge them into one")
                seen[s] = k
            for copy in (tuple(p * length + s for s in sorted(group)) for p in range(self.pipelines)):
                ranks = [self.stage_rank[s] for s in copy]
                if len(set(ranks)) == len(ranks):
                    out.append(copy)
                elif self.replicas is not None:
                    raise ValueError(f"tied.groups[{k}] {group}: with replicas each pipeline's stages of a tied group"
                                     f" must sit on different ranks (stages {list(copy)} share a rank): not supported"
                                     " yet")
                elif len(set(ranks)) > 1:
                    raise ValueError(f"tied.groups[{k}] {group}: two of its stages share a rank but not all; put the"
                                     " stages of a group each on its own rank, or all on one")
        return tuple(out)

    @cached_property
    def kinds(self) -> tuple[Kind, ...]:
        """The kinds of op a schedule of this problem may hold: F, B, W and BW, plus R with
        ``recompute``, S with ``recompute.selective``, O and L with ``offload``, AR with
        ``data_parallel`` and RS with ``replicas``."""
        return tuple(k for k, row in ROWS.items() if self._field(row.cost) is not _ABSENT)

    @cached_property
    def syncs(self) -> tuple[Kind, ...]:
        """The per-stage gradient syncs among ``kinds`` (AR, RS, TS): where there is one, each rank
        has a communication lane beside its compute (``schedule.comm_lane``)."""
        return tuple(k for k in self.kinds if ROWS[k].per_stage)

    @cached_property
    def cost(self) -> dict[Kind, tuple[float, ...]]:
        """kind -> per-stage duration, for every kind of ``kinds``, from the field its row names
        (``KindRow.cost``); a kind that fuses others (BW: B and W) costs their sum unless the
        problem gives its own, and a recompute without its own time costs the stage's F."""
        out: dict[Kind, tuple[float, ...]] = {}
        for kind in self.kinds:  # a fused kind's row comes after the rows of what it fuses
            row = ROWS[kind]
            given = self._field(row.cost)
            if given is None and row.fuses:
                out[kind] = _summed(out[k] for k in row.fuses)
            elif given is None:  # recompute.time: default the forward's
                out[kind] = out[Kind.F]
            else:
                out[kind] = self._per_stage(row.cost, given)
        return out

    @cached_property
    def empty_stages(self) -> frozenset[int]:
        """The stages whose F, B and W all cost 0: a stage that holds no layer (Megatron-LM's layouts
        allow them). It passes activations and gradients along (its hops between ranks stay) and
        holds nothing; every other op cost is > 0."""
        f, b, w = (self.cost[k] for k in (Kind.F, Kind.B, Kind.W))
        return frozenset(s for s in range(self.n_stages) if f[s] == b[s] == w[s] == 0)

    def _costs(self) -> None:
        """Every given per-stage time is > 0 but on an empty stage, where it is 0 (``empty_stages``),
        and some stage is not empty; a ValueError names the field (and index) otherwise. (The fields'
        own validators refuse a negative time, and a single 0, already.)"""
        empty = self.empty_stages
        if len(empty) == self.n_stages:
            raise ValueError("every stage is empty (costs F, B and W all 0): nothing to schedule")
        for path in _STAGE_TIMES:
            given = self._field(path)
            if given is None or given is _ABSENT:
                continue
            for s, x in enumerate(self._per_stage(path, given)):
                if x == 0 and s not in empty:
                    i = s % len(given) if isinstance(given, list) else None  # (one pipeline's list, repeated)
                    where, raw = ("", given) if i is None else (f" (index {i})", given[i])
                    raise ValueError(f"{path}: must be > 0, got {raw:g}{where}")

    def _field(self, path: str) -> Any:
        """The value at dotted ``path`` ("recompute.selective.time"), None where the field is left
        out; ``_ABSENT`` where a section on the way is not given."""
        value: Any = self
        for name in path.split("."):
            if value is None:
                return _ABSENT
            value = getattr(value, name)
        return value

    def _keeps(self) -> list[tuple[str, tuple[float, ...]]]:
        """(field, per stage) of each amount a policy keeps on the device: recompute.keep and
        recompute.selective.keep, where given."""
        r = self.recompute
        if r is None:
            return []
        out = [("recompute.keep", self._per_stage("recompute.keep", r.keep))]
        if r.selective is not None:
            out.append(("recompute.selective.keep", self._per_stage("recompute.selective.keep", r.selective.keep)))
        return out

    @cached_property
    def overlap_time(self) -> tuple[float, ...] | None:
        """Per rank, ``costs.FB``: how long a forward and an input gradient of two microbatches take
        run overlapped on the rank (None where the problem does not say: one after the other)."""
        return None if self.costs.FB is None else self._per_rank("costs.FB", self.costs.FB)

    def pair_time(self, forward: int, backward: Kind, stage: int) -> float:
        """How long the forward of stage ``forward`` and a ``backward`` (B, or a fused BW) of
        ``stage``, on the same rank, take run as an overlapped pair: ``costs.FB`` of the rank (plus
        the W part of a fused backward), or without it the two one after the other."""
        c = self.cost
        if self.overlap_time is None:
            return c[Kind.F][forward] + c[backward][stage]
        extra = c[Kind.W][stage] if backward is Kind.BW else 0.0
        return self.overlap_time[self.stage_rank[forward]] + extra

    @property
    def overlap_cheaper(self) -> bool:
        """Whether some rank runs some forward and input gradient of its stages faster as an
        overlapped pair (``costs.FB``) than one after the other."""
        if self.overlap_time is None:
            return False
        f, b = self.cost[Kind.F], self.cost[Kind.B]
        return any(self.time_tol.lt(self.overlap_time[r], max(f[s] for s in stages) + max(b[t] for t in stages))
                   for r, stages in enumerate(self.rank_stages))

    @property
    def fused_cheaper(self) -> bool:
        """Whether some stage's fused backward (a kind that fuses others: BW) costs less than the
        kinds it fuses (B plus W)."""
        c = self.cost
        return any(
            self.time_tol.lt(c[kind][s], reduce(add, (c[k][s] for k in row.fuses)))
            for kind, row in ROWS.items() if row.fuses for s in range(self.n_stages)
        )

    # ---- the scale of times and of memory (see schedc.tolerance) ----

    @cached_property
    def time_scale(self) -> float:
        """The largest op cost (F, B, W or fused BW of any stage, an overlapped pair) or ``comm``: the
        unit that comparisons of times are relative to. Scales with the costs."""
        return max(max(map(max, self.cost.values())), self.comm, max(self.overlap_time or (0.0,)))

    @cached_property
    def memory_scale(self) -> float:
        """The largest activation a forward allocates (no B or W frees more) or working memory of
        a stage: the unit that comparisons of memory are relative to (0 when no op allocates and no
        stage has working memory: levels are then exact). Scales with the memory amounts."""
        return max(max(map(abs, d)) for d in (*self.mem_deltas, self.stage_working))

    @cached_property
    def time_tol(self) -> Tolerance:
        """Comparisons of times (op ends, arrivals, objectives) up to float noise."""
        return Tolerance.of(self.time_scale)

    @cached_property
    def memory_tol(self) -> Tolerance:
        """Comparisons of memory (levels against limits) up to float noise."""
        return Tolerance.of(self.memory_scale, REL_MEMORY)

    @cached_property
    def mem_deltas(self) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        f = self._per_stage("memory.F", self.memory.F)
        b = (
            tuple(-x / 2 for x in f)
            if self.memory.B is None
            else self._per_stage("memory.B", self.memory.B)
        )
        w = (
            tuple(-(x + y) for x, y in zip(f, b))
            if self.memory.W is None
            else self._per_stage("memory.W", self.memory.W)
        )
        return f, b, w

    @cached_property
    def mem(self) -> dict[Kind, tuple[float, ...]]:
        """kind -> per-stage activation-memory delta, for every kind of ``kinds``: F, B and W from
        ``memory`` (``mem_deltas``; F's is the whole activation, what a kept microbatch holds), a
        kind that fuses others (BW) their sum; a recompute (R, S) brings back what its forward did
        not keep (F's minus ``keep``), an offload (O) frees the whole activation and its reload (L)
        allocates it again. The F of a microbatch that recomputes allocates only ``keep``:
        ``delta`` gives each op's delta under its (stage, microbatch)'s policy."""
        out = dict(zip((Kind.F, Kind.B, Kind.W), self.mem_deltas))
        a = out[Kind.F]
        keeps = dict(zip(("recompute", "selective"), (keep for _, keep in self._keeps())))  # by ``KindRow.policy``
        for kind in self.kinds:
            row = ROWS[kind]
            if kind in out:
                continue
            if row.fuses:
                out[kind] = _summed(out[k] for k in row.fuses)
            elif row.lightens:
                out[kind] = tuple(x - k for x, k in zip(a, keeps[row.policy]))
            elif row.policy == "offload":
                out[kind] = tuple(-x for x in a)
            elif row.comes_with is not None and ROWS[row.comes_with].policy == "offload":
                out[kind] = a
            elif row.lane == "comm":  # (communication holds no activation)
                out[kind] = (0.0,) * self.n_stages
            else:
                raise unsupported(kind, "the memory model (Problem.mem)", tuple(out))
        return out

    def delta(self, kind: Kind, stage: int, policy: Kind | None = None) -> float:
        """The activation-memory delta of the op ``kind`` of ``stage`` for a microbatch whose
        (stage, microbatch) holds the policy op ``policy`` (R, S, O; None: kept): ``mem``, except
        that the forward of a recomputed microbatch allocates only what it keeps."""
        if kind is Kind.F and policy is not None and ROWS[policy].lightens:
            return self.mem[Kind.F][stage] - self.mem[policy][stage]
        return self.mem[kind][stage]

    @cached_property
    def policies(self) -> tuple[Kind, ...]:
        """The policy kinds (R, S, O) this problem allows and the searches may choose, in the table's
        order (a schedule may also hold RG and SG, Megatron-LM's placement of R and S: ``kinds``)."""
        return tuple(k for k in self.kinds if ROWS[k].policy and ROWS[k].searched)

    @cached_property
    def recomputes(self) -> tuple[Kind, ...]:
        """The recompute kinds (R, S) this problem allows, in the table's order."""
        return tuple(k for k in self.policies if ROWS[k].lightens)

    def least_kept(self, stage: int) -> float:
        """The least a microbatch of ``stage`` holds between its forward and its backward, over the
        policies the problem allows (the whole activation without any)."""
        return min([self.delta(Kind.F, stage, k) if ROWS[k].lightens else 0.0 for k in self.policies]
                   + [self.mem[Kind.F][stage]])

    @cached_property
    def static_memory(self) -> tuple[float, ...]:
        return self._per_rank("memory.static", self.memory.static)

    @cached_property
    def memory_limit(self) -> tuple[float, ...] | None:
        if self.memory.limit is None:
            return None
        return self._per_rank("memory.limit", self.memory.limit)

    @cached_property
    def stage_working(self) -> tuple[float, ...]:
        """Per stage, the memory one of its ops needs while it runs, above the level the deltas
        give (``memory.working``; 0 when not given)."""
        w = self.memory.working
        return (0.0,) * self.n_stages if w is None else self._per_stage("memory.working", w)

    @cached_property
    def stage_weights(self) -> tuple[float, ...]:
        """Per stage, one copy of its parameters (``memory.weights``; 0 when not given)."""
        w = self.memory.weights
        return (0.0,) * self.n_stages if w is None else self._per_stage("memory.weights", w)

    @cached_property
    def weight_copy(self) -> tuple[float, ...]:
        """Per rank, one copy of the parameters of its stages: what an asynchronous schedule's
        second weight version adds to its static memory."""
        w = self.stage_weights
        return tuple(sum(w[s] for s in stages) for stages in self.rank_stages)

    @property
    def seq_chunks(self) -> int:
        """Chunks per sequence (``sequence_chunks.count``; 1 without)."""
        return 1 if self.sequence_chunks is None else self.sequence_chunks.count

    @property
    def units(self) -> int:
        """What each stage runs an op of every kind for: the microbatches times the chunks of
        each (an op's ``mb`` is ``microbatch * seq_chunks + chunk``)."""
        return self.microbatches * self.seq_chunks

    @cached_property
    def chunk_shares(self) -> dict[str, tuple[float, ...]]:
        """Per kind (F, B, W, BW) and "memory", per chunk position, its share of the sequence's
        (all 1 without sequence chunks). BW's is B's and W's, weighted by the stage's B and W."""
        if self.sequence_chunks is None:
            return {}
        seq = self.sequence_chunks
        return {k: seq.shares(k) for k in ("F", "B", "W", "memory")}

    def op_cost(self, kind: Kind, stage: int, unit: int) -> float:
        """The cost of ``kind`` on ``stage`` for ``unit`` (a chunk of a sequence: its share)."""
        cost = self.cost[kind][stage]
        if self.sequence_chunks is None:
            return cost
        c, shares = unit % self.seq_chunks, self.chunk_shares
        if kind is Kind.BW:
            b, w = self.cost[Kind.B][stage], self.cost[Kind.W][stage]
            return cost * (shares["B"][c] * b + shares["W"][c] * w) / (b + w)
        return cost * shares[kind.value][c]

    def memory_share(self, unit: int) -> float:
        """What part of a stage's memory deltas ``unit`` has: a chunk of a sequence its chunk
        position's share, else 1."""
        return 1.0 if self.sequence_chunks is None else self.chunk_shares["memory"][unit % self.seq_chunks]

    def op_delta(self, kind: Kind, stage: int, unit: int, policy: Kind | None = None) -> float:
        """The memory delta of ``kind`` on ``stage`` for ``unit`` whose (stage, unit) holds the
        policy op ``policy`` (``delta``); a chunk of a sequence, its share of it (``memory_share``)."""
        return self.delta(kind, stage, policy) * self.memory_share(unit)

    @property
    def search_objective(self) -> str:
        """What a search over synchronous schedules minimises: the span, or else the makespan
        (``steady``, the time per microbatch of iterations run back to back with a flush each, is
        the makespan over the microbatches)."""
        return "span" if self.objective == "span" else "makespan"

    @cached_property
    def working_memory(self) -> tuple[float, ...]:
        """Per rank, the largest working memory of its stages: what the rank needs above its
        activation level at any moment, whichever op runs then (conservative)."""
        w = self.stage_working
        return tuple(max(w[s] for s in stages) for stages in self.rank_stages)

    def activation_room_for(self, limits: tuple[float, ...] | None) -> tuple[float, ...] | None:
        """Per rank, how high the activation level (the running sum of its ops' deltas) may go
        under per-rank memory ``limits`` (static memory included): limit - static - working
        memory. None without limits. The one rule every memory check (simulator, heuristics,
        solvers, bounds) uses."""
        if limits is None:
            return None
        return tuple(lim - st - w for lim, st, w in zip(limits, self.static_memory, self.working_memory))

    @cached_property
    def activation_room(self) -> tuple[float, ...] | None:
        """``activation_room_for`` the problem's own memory limit (None without one)."""
        return self.activation_room_for(self.memory_limit)

    def min_memory(self, rank: int) -> float:
        """The least peak memory any schedule needs on ``rank``.

        Whatever the order, some microbatch's forwards of all the rank's stages are held at once
        (the backward of its earliest stage needs the later ones done): static memory plus the
        rank's working memory plus one microbatch through the rank's stages, forwards ascending,
        backward+weight descending (with replicas, the most over the pipelines: a microbatch runs
        through the stages of its own). Where the problem allows recompute or offload, each stage
        holds the least any policy keeps between its forward and its backward (``least_kept``),
        and its whole activation during its forward (an offload frees it after) and from what
        brings it back (R, S or L) to its weight gradient.

        With sequence chunks (no policies there), what is proven per stage: a sequence's backward
        of its last chunk waits for the forwards of all its chunks there, so the stage then holds
        every chunk's share of its activation (the shares sum to 1, within rounding).
        """
        f, b, w = self.mem_deltas
        if self.sequence_chunks is not None:
            held = sum(self.chunk_shares["memory"])
            return self.static_memory[rank] + self.working_memory[rank] + max(
                held * f[s] for s in self.rank_stages[rank])
        peaks = []
        for k in range(self.pipelines):
            stages = [s for s in self.rank_stages[rank] if self.pipeline_of(s) == k]
            level = peak = 0.0
            for s in stages:
                peak = max(peak, level + f[s])
                level += self.least_kept(s)
            for s in reversed(stages):
                level += f[s] - self.least_kept(s)
                peak = max(peak, level)
                level += b[s]
                peak = max(peak, level)
                level += w[s]
            peaks.append(peak)
        return self.static_memory[rank] + self.working_memory[rank] + max(peaks)

    def scaled(self, time: float = 1.0, memory: float = 1.0) -> "Problem":
        """The same problem in other units: every cost and ``comm`` times ``time``, every memory
        amount (deltas, static memory, limit, working memory) times ``memory``."""

        def times(value: Any, k: float) -> Any:
            return [x * k for x in value] if isinstance(value, list) else value * k

        data = self.model_dump(exclude_none=True)
        data["costs"] = {kind: times(v, time) for kind, v in data["costs"].items()}
        data["comm"] = data["comm"] * time
        data["memory"] = {key: times(v, memory) for key, v in data["memory"].items()}
        for section, key in (("data_parallel", "reduce"), ("replicas", "sync"), ("tied", "sync")):
            if section in data:
                data[section][key] = times(data[section][key], time)
        amounts = {"time": time, "keep": memory}
        for section in ("recompute", "offload"):
            if section in data:
                data[section] = {key: ({k: times(x, amounts[k]) for k, x in v.items()} if key == "selective"
                                       else times(v, amounts[key])) for key, v in data[section].items()}
        return Problem.parse(data, source=self.name or "problem")

    def with_changes(self, **changes: Any) -> "Problem":
        """A validated copy with top-level fields replaced (nested ones as dicts, merged)."""
        data = self.model_dump(exclude_none=True)
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return Problem.parse(data, source=self.name or "problem")

    @classmethod
    def parse(cls, data: Any, *, source: str = "problem") -> "Problem":
        """Validate a mapping; raise ProblemError with a one-line message naming the field."""
        if not isinstance(data, dict):
            raise ProblemError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
        return cls.validated(data, source)


def _broadcast(field: str, value: Number, n: int, what: str) -> tuple[float, ...]:
    if isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"{field} has {len(value)} values but there are {n} {what}")
        return tuple(float(x) for x in value)
    return (float(value),) * n


def load_problem(path: str | Path) -> Problem:
    """Read a problem from a YAML or JSON file."""
    path = Path(path)
    data = read_data(path, error=ProblemError, what="problem file")
    problem = Problem.parse(data, source=str(path))
    if problem.name:
        return problem
    return problem.model_copy(update={"name": path.stem[:200] if path.stem.isprintable() else safe_filename(path.stem)})


def format_validation_error(e: ValidationError, root: type[BaseModel] | None = None) -> str:
    """pydantic's errors as one line: ``field: what is wrong (got value)``; typos get a suggestion.
    ``root`` is the model validated (default Problem), to name the known fields of a typo."""
    parts = []
    errors = e.errors()
    suggestions = {}  # an unknown field's location -> the known field it is closest to
    for err in errors:
        if err["type"] == "extra_forbidden":
            known = _fields_at(root or Problem, err["loc"][:-1])
            close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1)
            suggestions[err["loc"]] = (close[0] if close else None, known)
    # A missing field that an unknown one was meant to be: the typo says it all.
    misspelt = {(*loc[:-1], close) for loc, (close, _) in suggestions.items() if close}
    for err in errors:
        loc = _format_loc(err["loc"])
        if err["type"] == "extra_forbidden":
            close, known = suggestions[err["loc"]]
            hint = f" (did you mean '{close}'?)" if close else f" (known: {', '.join(known)})" if known else ""
            parts.append(f"unknown field '{loc}'{hint}")
            continue
        if err["type"] == "missing" and err["loc"] in misspelt:
            continue
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if err["type"] == "value_error" or isinstance(got, (dict, list)) else f" (got {shorten(got)})"
        parts.append(f"{loc}: {msg}{shown}" if loc else f"{msg}{shown}")
    # An unknown field first: a typo explains the rest (and would be cut off after three).
    parts.sort(key=lambda p: not p.startswith("unknown field"))
    # pydantic reports each member of a union; keep the first message per field.
    seen, unique = set(), []
    for p in parts:
        key = p.split(":", 1)[0]
        if key not in seen:
            seen.add(key)
            unique.append(p)
    more = f"; and {len(unique) - 3} more" if len(unique) > 3 else ""
    return "; ".join(unique[:3]) + more


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("float", "int", "str") or "[" in str(part) or "'" in str(part):
            continue  # union-member tags pydantic adds to the location
        else:
            out += f".{part}" if out else str(part)
    return out


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The fields known where ``loc`` points inside ``model``: a model's (an optional section, a
    union with None, is its member) or a TypedDict's, through lists (an index takes the item
    type); none where the place is neither."""
    ann: Any = model
    for part in loc:
        ann = _unwrapped(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            field = ann.model_fields.get(str(part))
            ann = field.annotation if field else None
        elif _is_typeddict(ann):
            ann = ann.__annotations__.get(str(part))
        elif get_origin(ann) is list and isinstance(part, int):
            ann = get_args(ann)[0]
        else:
            return []
    ann = _unwrapped(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return list(ann.model_fields)
    return list(ann.__annotations__) if _is_typeddict(ann) else []


def _unwrapped(ann: Any) -> Any:
    """``ann`` without Annotated, NotRequired or a union (Optional): of a union, the member that
    is a model, a TypedDict or a list, if one is."""
    while (origin := get_origin(ann)) is not None and origin is not list:
        args = get_args(ann)
        if origin is Annotated or getattr(origin, "_name", None) in ("NotRequired", "Required"):
            ann = args[0]
            continue
        members = [a for a in args if _is_typeddict(a) or get_origin(a) is list
                   or (isinstance(a, type) and issubclass(a, BaseModel))]
        if not members:
            return ann
        ann = members[0]
    return ann


def _is_typeddict(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, dict) and hasattr(ann, "__required_keys__")
