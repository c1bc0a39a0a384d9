"""The kinds of op, as one table.

An op is ``(kind, stage, microbatch)``. What a kind means to every pass that meets it (the
simulator, the dependency rule, the memory rule, lowering, the checker, the exporters and the
plots) is its row here: the lane it runs on, where its cost and memory delta come from, which ops
it waits for, what its output carries to another stage, and how it prints. A pass that cannot
handle a kind refuses it by name (``unsupported``), never drops it. A new kind (recompute,
offload, a gradient reduce, ...) is a new member of ``Kind`` and a new row of ``ROWS``.

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

    __str__ = str.__str__  # prints as its name ("F"), as in files and tables
    __format__ = str.__format__

    @property
    def row(self) -> KindRow:
        return ROWS[self]


BACKWARD = "backward"  # in a row's ``needs``: the backward of that stage, B or (fused) BW


@dataclass(frozen=True)
class KindRow:
    lane: str  # the lane of its rank it runs on: "compute" (copy and comm lanes come with later kinds)
    title: str  # what it is, for legends and messages
    needs: tuple[tuple[Kind | str, int], ...]  # (kind or BACKWARD, stage offset): the ops whose results it uses
    carries: str | None  # what its output carries to another stage: "act", "grad", or None
    frees: bool  # the last op of its (stage, microbatch): what the forward saved is gone after it
    split: bool | None  # True: only in split-backward schedules; False: only fused; None: in both
    torch: str  # torch.distributed.pipelining's action letter
    color: str  # its boxes in plots
    fuses: tuple[Kind, ...] = ()  # the kinds it does in one op: its memory delta is theirs summed, and
    # its cost is theirs summed unless the problem gives its own


ROWS: dict[Kind, KindRow] = {
    Kind.F: KindRow("compute", "F (forward)", ((Kind.F, -1),), "act", False, None, "F", "#3b75af"),
    Kind.B: KindRow("compute", "B (input grad)", ((Kind.F, 0), (BACKWARD, 1)), "grad", False, True, "I", "#ef8636"),
    Kind.W: KindRow("compute", "W (weight grad)", ((Kind.B, 0),), None, True, True, "W", "#519e3e"),
    Kind.BW: KindRow("compute", "BW (full backward)", ((Kind.F, 0), (BACKWARD, 1)), "grad", True, False, "B",
                     "#c53a32", fuses=(Kind.B, Kind.W)),
}

BACKWARDS = frozenset(k for k, row in ROWS.items() if row.carries == "grad")  # B and BW
SPLIT = frozenset(k for k, row in ROWS.items() if row.split)  # B and W
FUSED = frozenset(k for k, row in ROWS.items() if row.split is False)  # BW


BY_NAME: dict[str, Kind] = {k.value: k for k in Kind}  # "F" -> Kind.F: parses a file's kinds
BY_TORCH: dict[str, Kind] = {row.torch: k for k, row in ROWS.items()}  # torch's action letter -> kind


def in_order(kinds: Iterable[Kind]) -> tuple[Kind, ...]:
    """``kinds`` in the table's order (sets of kinds iterate in an order that changes between runs)."""
    chosen = set(kinds)
    return tuple(k for k in Kind if k in chosen)


def candidates(need: Kind | str) -> tuple[Kind, ...]:
    """The kinds a row's need may be met by, in the table's order: the kind itself, or for
    BACKWARD the backward kinds (B, then the fused BW)."""
    return in_order(BACKWARDS) if need == BACKWARD else (Kind(need),)


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
