"""A partition (blocks per stage) written as what users paste into their framework.

- Megatron-LM's ``--pipeline-model-parallel-layout`` (``megatron_layout``, read back by
  ``parse_megatron_layout``): the stages in model order, split by ``|``; ``E`` embedding, ``t``
  decoder layer, ``m`` MTP layer, ``L`` loss (head); ``X*N`` repeats a symbol, ``(...)*N`` a
  part of the string; commas are only for reading; an empty stage is allowed (``E||t|L``). Stage
  k of the string runs on pipeline rank k mod p, virtual stage k // p: the loop placement.
- torchtitan's per-stage module lists (``torchtitan_modules``: ``module_fqns_per_model_part``).
- DeepSpeed's ``parts`` (``deepspeed_parts``): the index of each stage's first layer, then the
  number of layers; one stage per rank.
- schedc's own ``stage_blocks`` (blocks per stage; the stage problem carries it).
"""

from __future__ import annotations

from collections.abc import Sequence

from schedc.errors import ProblemError

MEGATRON_SYMBOLS = "EtmL"


def stages_of(sizes: Sequence[int], items: Sequence) -> list[list]:
    """``items`` (one per block, model order) cut into stages of ``sizes`` blocks."""
    if sum(sizes) != len(items) or any(k < 0 for k in sizes):
        raise ProblemError(f"a partition of {len(items)} blocks, got {list(sizes)} (sum {sum(sizes)})")
    out, at = [], 0
    for k in sizes:
        out.append(list(items[at:at + k]))
        at += k
    return out


def megatron_layout(sizes: Sequence[int], types: Sequence[str], placement: str = "loop") -> str:
    """Megatron-LM's layout string for stages of ``sizes`` blocks whose types are ``types``
    (E, t, m, L only), on the loop placement (Megatron's interleaving); runs of one symbol as
    ``t*N`` and runs of equal stages as ``(...|)*N``."""
    if placement != "loop":
        raise ProblemError(f"Megatron-LM's layout runs stage k on rank k mod p (the loop placement); a {placement}"
                           " placement cannot be written as one")
    bad = sorted({t for t in types if t not in MEGATRON_SYMBOLS})
    if bad:
        raise ProblemError(f"Megatron-LM's layout knows the block types E, t, m and L only, not {', '.join(bad)}")
    stages = ["".join(_runs(stage)) for stage in stages_of(sizes, types)]
    pieces, i = [], 0
    while i < len(stages):
        n = 1
        while i + n < len(stages) and stages[i + n] == stages[i]:
            n += 1
        last = i + n == len(stages)
        repeat = n - 1 if last else n  # (the string's last stage has no "|" after it)
        if repeat >= 2:
            pieces.append(f"({stages[i]}|)*{repeat},")
        elif repeat == 1:
            pieces.append(stages[i] + "|")
        if last:
            pieces.append(stages[i])
        i += n
    return "".join(pieces).rstrip(",")


def _runs(symbols: Sequence[str]) -> list[str]:
    out, i = [], 0
    while i < len(symbols):
        n = 1
        while i + n < len(symbols) and symbols[i + n] == symbols[i]:
            n += 1
        out.append(symbols[i] * n if n <= 2 else f"{symbols[i]}*{n}")
        i += n
    return out


def parse_megatron_layout(text: str) -> list[str]:
    """The stages of a Megatron-LM layout string, each as its symbols in order (``"Et*2|L"`` ->
    ``["Ett", "L"]``); ProblemError naming the position of what it cannot read."""
    expanded, at = _expand(text, 0, 0)
    if at != len(text):
        raise ProblemError(f"layout {text!r}: unexpected {text[at]!r} at position {at}")
    return expanded.split("|")


def _expand(text: str, at: int, depth: int) -> tuple[str, int]:
    """Expand from ``at`` up to a ``)`` or the end: (the expansion, where it stopped)."""
    if depth > 16:
        raise ProblemError(f"layout {text!r}: parentheses nested more than 16 deep")
    out: list[str] = []
    while at < len(text) and text[at] != ")":
        c = text[at]
        if c in ", \t":
            at += 1
            continue
        if c in MEGATRON_SYMBOLS or c == "|":
            piece, at = c, at + 1
        elif c == "(":
            piece, at = _expand(text, at + 1, depth + 1)
            if at >= len(text):
                raise ProblemError(f"layout {text!r}: '(' without its ')'")
            at += 1
        else:
            raise ProblemError(f"layout {text!r}: unexpected {c!r} at position {at} (symbols E, t, m, L; '|' between"
                               " stages; '*N' repeats; '(...)' groups)")
        if at < len(text) and text[at] == "*":
            end = at + 1
            while end < len(text) and text[end].isdigit():
                end += 1
            if end == at + 1 or end - at > 7:
                raise ProblemError(f"layout {text!r}: '*' takes a count at position {at}")
            piece, at = piece * int(text[at + 1:end]), end
        out.append(piece)
        if sum(map(len, out)) > 10**6:
            raise ProblemError(f"layout {text!r}: expands to more than a million symbols")
    return "".join(out), at


def torchtitan_modules(sizes: Sequence[int], names: Sequence[Sequence[str]]) -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part``: per stage, its blocks' module names."""
    _refuse_empty(sizes, "torchtitan's per-stage module lists")
    missing = [k for k, n in enumerate(names) if not n]
    if missing:
        raise ProblemError(f"block {missing[0]} has no module names: give its layer 'modules' (torchtitan names"
                           " the modules of each stage)")
    return [[m for block in stage for m in block] for stage in stages_of(sizes, names)]


def deepspeed_parts(sizes: Sequence[int], chunks: int = 1) -> list[int]:
    """DeepSpeed's ``parts``: the first layer of each stage, then the number of layers."""
    _refuse_empty(sizes, "DeepSpeed's parts")
    if chunks != 1:
        raise ProblemError(f"DeepSpeed's pipeline runs one stage per rank, not {chunks}")
    out = [0]
    for k in sizes:
        out.append(out[-1] + k)
    return out


def _refuse_empty(sizes: Sequence[int], what: str) -> None:
    """A ProblemError where a stage holds no block: only Megatron-LM's layout (and schedc's
    runtime) are known to run an empty stage."""
    if 0 in sizes:
        raise ProblemError(f"stage {list(sizes).index(0)} is empty: {what} are not known to run a stage with no"
                           " module (Megatron-LM's layout and schedc's runtime are)")
