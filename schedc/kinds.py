"""The kinds of op, as one table.

An op is ``(kind, stage, microbatch)``. What a kind means to every pass that meets it (the
simulator, the dependency rule, the memory rule, lowering, the checker, the exporters and the
plots) is its row here: the lane it runs on, where its cost and memory delta come from, which ops
it waits for, what its output carries to another stage, and how it prints. A pass that cannot
handle a kind refuses it by name (``unsupported``), never drops it. A new kind (recompute,
offload, a gradient reduce, ...) is a new member of ``Kind`` and a new row of ``ROWS``.

Memory for time: each (stage, microbatch) keeps what its forward saved, or recomputes it (R full,
S selective) on the compute lane before its backward, or offloads it (O) to host memory on the
rank's copy lane and reloads it (L) before its backward. The op of a policy kind (``KindRow.policy``)
in a schedule chooses its (stage, microbatch)'s policy; at most one per (stage, microbatch).
R and S run as soon as their rank reaches them, so a recompute placed before a backward may run
while the rank waits for that backward's gradient (prefetched into the wait, as Mario does). RG and
SG are the same work as Megatron-LM runs it: inside the backward, once the output gradient has
arrived (they also wait for the backward of the stage after). The searches choose R and S; RG and
SG are for the baselines that run as Megatron does (``KindRow.searched``).

Gradient synchronization: with data parallelism, each stage's weight gradient is all-reduced over
the replicas (AR) on the rank's communication lane, once per iteration, after the stage's last
weight gradient; the optimizer step waits for it. A per-stage kind (``KindRow.per_stage``) has one
op per stage, written with microbatch 0, on a lane no schedule lists: the simulator derives it from
the problem (``schedc.schedule.comm_lane``), as the runtime issues the reduces.

Replicas: a bidirectional problem runs several copies of the pipeline (``Problem.replicas``); the
copies of one model stage sit on different ranks, and their gradients are summed (RS) before the
step by a collective of those ranks (``KindRow.group``: the stages that take part, one op each,
which start together and end together). Tied weights (an embedding shared by the first and last
stage) are summed the same way (TS), where the stages that share them sit on different ranks.

Sequence chunks (Seq1F1B): with ``Problem.sequence_chunks`` an op's microbatch is a chunk of a
sequence (``mb = microbatch * chunks + chunk``), and a kind's ``chunk_needs`` are the ops of its
own stage on a neighbouring chunk of the same sequence that it waits for: a forward the earlier
chunk's forward (its keys and values), a backward the later chunk's backward (the gradient of this
chunk's keys and values that it leaves).

``Kind`` is a ``str`` enum, so ``Kind.F == "F"``, schedule files keep their strings, and
``problem.cost[kind]`` finds the kind's costs under its name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    F = "F"  # forward
    B = "B"  # input gradient (the backward's part on the critical path)
    W = "W"  # weight gradient (deferrable)
    BW = "BW"  # the fused backward, B and W in one op
    R = "R"  # recompute: the stage's forward again, before its backward (its forward kept only its input)
    S = "S"  # selective recompute: the part of the forward the forward did not keep
    RG = "RG"  # R as Megatron-LM runs it: inside the backward, once the output gradient has arrived
    SG = "SG"  # S as Megatron-LM runs it (--recompute-granularity selective): once the gradient has arrived
    O = "O"  # offload: the activation copied to host memory (copy lane), freed on the device
    L = "L"  # reload: the offloaded activation copied back before the backward (copy lane)
    AR = "AR"  # gradient all-reduce of a stage over its data-parallel replicas (comm lane, once per stage)
    RS = "RS"  # gradient sum of a stage's copies in the pipelines of a bidirectional problem (a collective
    # of the ranks holding them, on their comm lanes, once per stage)
    TS = "TS"  # gradient sum of weights tied between stages on different ranks (tied embeddings: a collective)

    __str__ = str.__str__  # prints as its name ("F"), as in files and tables
    __format__ = str.__format__

    @property
    def row(self) -> KindRow:
        return ROWS[self]


BACKWARD = "backward"  # in a row's ``needs``: the backward of that stage, B or (fused) BW
SAVED = "saved"  # in a row's ``needs``: what brings the stage's activation back (R, S or L), else its F
GRADS = "grads"  # in a row's ``needs``: the weight gradient, W or (fused) BW, of every microbatch of the stage
LANES = ("compute", "copy", "comm")  # a rank's lanes: ops on different lanes of a rank overlap in time


@dataclass(frozen=True)
class KindRow:
    lane: str  # the lane of its rank it runs on (one of LANES)
    title: str  # what it is, for legends and messages
    needs: tuple[tuple[Kind | str, int], ...]  # (kind, BACKWARD or SAVED, stage offset): the ops whose results it uses
    carries: str | None  # what its output carries to another stage: "act", "grad", or None
    frees: bool  # the last op of its (stage, microbatch): what the forward saved is gone after it
    split: bool | None  # True: only in split-backward schedules; False: only fused; None: in both;
    # an optional kind (policy or comes_with set) is in neither form's list of what must be there
    torch: str | None  # torch.distributed.pipelining's action letter (None: torch has no such action)
    color: str  # its boxes in plots
    cost: str  # the Problem's field its per-stage cost comes from ("costs.F", "recompute.time", ...)
    fuses: tuple[Kind, ...] = ()  # the kinds it does in one op: its memory delta is theirs summed, and
    # its cost is theirs summed unless the problem gives its own
    policy: str | None = None  # the memory policy its presence chooses for its (stage, microbatch)
    comes_with: Kind | None = None  # in a schedule exactly when this kind's op of the same (stage, mb) is
    lightens: bool = False  # the forward of its (stage, microbatch) keeps only ``keep``; this op brings the rest
    per_stage: bool = False  # one op per stage and iteration (microbatch 0), on a lane the simulator derives
    group: str | None = None  # a collective: the problem's stage groups whose members run it together
    # (``Problem.sync_groups``), one op per member stage, all starting when the last member is ready
    chunk_needs: tuple[tuple[Kind | str, int], ...] = ()  # (kind or BACKWARD, chunk offset): on its own
    # stage, the op of a neighbouring chunk of the same sequence it waits for (sequence chunks only)
    searched: bool = True  # a policy kind the searches may choose; False: only the baselines that
    # place it as a framework does (RG, SG) hold it (``Problem.policies`` leaves it out)


ROWS: dict[Kind, KindRow] = {
    Kind.F: KindRow("compute", "F (forward)", ((Kind.F, -1),), "act", False, None, "F", "#3b75af", "costs.F",
                    chunk_needs=((Kind.F, -1),)),
    Kind.B: KindRow("compute", "B (input grad)", ((SAVED, 0), (BACKWARD, 1)), "grad", False, True, "I", "#ef8636",
                    "costs.B", chunk_needs=((BACKWARD, 1),)),
    Kind.W: KindRow("compute", "W (weight grad)", ((Kind.B, 0),), None, True, True, "W", "#519e3e", "costs.W"),
    Kind.BW: KindRow("compute", "BW (full backward)", ((SAVED, 0), (BACKWARD, 1)), "grad", True, False, "B",
                     "#c53a32", "costs.BW", fuses=(Kind.B, Kind.W), chunk_needs=((BACKWARD, 1),)),
    Kind.R: KindRow("compute", "R (recompute)", ((Kind.F, 0),), None, False, None, None, "#8c6bb1",
                    "recompute.time", policy="recompute", lightens=True),
    Kind.S: KindRow("compute", "S (selective recompute)", ((Kind.F, 0),), None, False, None, None, "#c994c7",
                    "recompute.selective.time", policy="selective", lightens=True),
    Kind.RG: KindRow("compute", "RG (recompute once the gradient is in)", ((Kind.F, 0), (BACKWARD, 1)), None, False,
                     None, None, "#6a51a3", "recompute.time", policy="recompute", lightens=True, searched=False),
    Kind.SG: KindRow("compute", "SG (selective recompute once the gradient is in)", ((Kind.F, 0), (BACKWARD, 1)),
                     None, False, None, None, "#ae017e", "recompute.selective.time", policy="selective",
                     lightens=True, searched=False),
    Kind.O: KindRow("copy", "O (offload)", ((Kind.F, 0),), None, False, None, None, "#969696", "offload.time",
                    policy="offload"),
    Kind.L: KindRow("copy", "L (reload)", ((Kind.O, 0),), None, False, None, None, "#525252", "offload.time",
                    comes_with=Kind.O),
    Kind.AR: KindRow("comm", "AR (gradient all-reduce)", ((GRADS, 0),), None, False, None, None, "#17becf",
                     "data_parallel.reduce", per_stage=True),
    Kind.RS: KindRow("comm", "RS (replica gradient sum)", ((GRADS, 0),), None, False, None, None, "#bcbd22",
                     "replicas.sync", per_stage=True, group="replicas"),
    Kind.TS: KindRow("comm", "TS (tied gradient sum)", ((GRADS, 0),), None, False, None, None, "#e377c2",
                     "tied.sync", per_stage=True, group="tied"),
}

BACKWARDS = frozenset(k for k, row in ROWS.items() if row.carries == "grad")  # B and BW
SPLIT = frozenset(k for k, row in ROWS.items() if row.split)  # B and W
FUSED = frozenset(k for k, row in ROWS.items() if row.split is False)  # BW


BY_NAME: dict[str, Kind] = {k.value: k for k in Kind}  # "F" -> Kind.F: parses a file's kinds
BY_TORCH: dict[str, Kind] = {row.torch: k for k, row in ROWS.items() if row.torch}  # torch's action letter -> kind
POLICIES = tuple(k for k, row in ROWS.items() if row.policy)  # R, S, RG, SG, O: at most one per (stage, microbatch)
RECOMPUTES = tuple(k for k, row in ROWS.items() if row.lightens)  # R, S, RG, SG: the policies run on the compute lane
OPTIONAL = tuple(k for k, row in ROWS.items() if row.policy or row.comes_with)  # R, S, RG, SG, O, L
PER_STAGE = tuple(k for k, row in ROWS.items() if row.per_stage)  # AR, RS, TS: derived by the simulator, in no schedule
COLLECTIVES = tuple(k for k, row in ROWS.items() if row.group)  # RS, TS: run together by the ranks of a stage group
# What a need of a row may be met by, the first the schedule holds, and what meets it in a schedule
# without recompute or offload (split backward): BACKWARD is B or BW (B), SAVED is R, S, L or F (F).
_MET_BY = {BACKWARD: ((Kind.B, Kind.BW), Kind.B), SAVED: ((Kind.R, Kind.S, Kind.RG, Kind.SG, Kind.L, Kind.F), Kind.F),
           GRADS: ((Kind.W, Kind.BW), Kind.W)}


def in_order(kinds: Iterable[Kind]) -> tuple[Kind, ...]:
    """``kinds`` in the table's order (sets of kinds iterate in an order that changes between runs)."""
    chosen = set(kinds)
    return tuple(k for k in Kind if k in chosen)


def candidates(need: Kind | str) -> tuple[Kind, ...]:
    """The kinds a row's need may be met by, the first a schedule holds meeting it: the kind
    itself; for BACKWARD the backward kinds (B, then the fused BW); for SAVED what brings the
    activation back (R, S, L), else the forward F; for GRADS the weight gradients (W, then BW)."""
    return _MET_BY[need][0] if need in _MET_BY else (Kind(need),)


def plain(need: Kind | str) -> Kind:
    """The kind that meets ``need`` in a split-backward schedule without recompute or offload."""
    return _MET_BY[need][1] if need in _MET_BY else Kind(need)


def kind_of(value: object) -> Kind:
    """``value`` as a Kind; ValueError naming the known kinds if it is none."""
    try:
        return Kind(value)
    except ValueError:
        raise ValueError(f"unknown op kind {value!r} (expected {', '.join(k.value for k in Kind)})") from None


def unsupported(kind: Kind, where: str, supported: frozenset[Kind] | tuple[Kind, ...]) -> ValueError:
    """The error of a pass that meets a kind it cannot handle: raise it, never skip the op."""
    known = ", ".join(k.value for k in supported)
    return ValueError(f"{where} cannot handle op kind {kind.value!r} (it handles {known})")


def check_supported(kinds: Iterable[Kind], where: str, supported: frozenset[Kind] | tuple[Kind, ...]) -> None:
    """Raise ``unsupported`` for the first of ``kinds`` (in the table's order) not in ``supported``."""
    for kind in in_order(kinds):
        if kind not in supported:
            raise unsupported(kind, where, in_order(supported))
