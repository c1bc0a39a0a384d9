"""Whether a profile's times can be trusted: the spread of each stage's repeats, and blocks of the
same type compared with each other.

The profiler (``schedc.runtime.profile``) times every stage's F, B and W ``repeats`` times after a
warm-up, the stages' repeats interleaved (round i times stage 0, then stage 1, ..., so that a burst
of load from another job hits every stage alike rather than one stage's whole series), and keeps
the median. This module judges one such measurement, from the samples alone (no torch, no clock:
tests feed it samples):

- **spread**, per stage and kind: (p75 - p25) / median of the repeats, the interquartile range: as
  robust as the median to one repeat that a burst hit (which the median ignores), and wide when
  bursts hit many. A quiet machine gives a few per cent; another job's load tens of per cent.
- **disagreement**, per stage and kind: stages made of the same blocks (the same classes with the
  same parameter shapes) in proportional counts must take times proportional to their block
  counts; a stage's disagreement is its time per block over the median of its group's, minus 1
  (a 3-block stage at 148 ms next to a 2-block stage at 48 ms: 49.3 against 24 ms per block, +34 %
  and -34 % of their median 36.7). The last stage is not compared: its F and B include the loss.

``measure`` runs the rounds through a ``sample`` function (stage -> one repeat's times), and when
the spread or the disagreement is over its limit measures again, at most ``REMEASURE`` more times,
keeping the quietest measurement; ``Assessment.warning`` is then the one line that names the
stages (``schedc profile`` prints it; ``--strict`` makes it a failure).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import reduce

KINDS = ("F", "B", "W")  # the kinds judged (BW is reported, and timed in the same rounds)

# (p75 - p25) / median over a stage's repeats above which its median is not trusted: 20 % is a
# standard deviation of about 15 % of the time, where the median of 7 repeats is itself uncertain by
# about 7 %, over the 3 % that two profiles in a row should agree within (issue 38); see
# benchmarks/profile_noise.py for what a busy-looping process beside the profiler gives.
SPREAD_LIMIT = 0.20
# |time per block / the group's median - 1| above which stages of the same blocks disagree. Equal
# blocks cost the same work; 15 % is past what a stage's boundary (its input's gradient, one more
# send) adds to one of them, and well under the 2x seen on a busy machine (issue 38).
DISAGREEMENT_LIMIT = 0.15
# ms under which a difference is the timer's and the interpreter's, not the machine's: a spread or
# a disagreement of tiny ops (a bias's W, 10 us) is only counted where it is this many ms.
FLOOR_MS = 0.05
# More measurements after the first when it is over a limit; the quietest is kept.
REMEASURE = 2
# Stages the warning names one by one with their figures; past this, all in one phrase (the line
# stays one readable line when a busy machine spreads every block of a per-block profile).
SAY_EACH = 4
# Fewer repeats than this give no spread to judge (a smoke run: warmup=0, repeats=1): not judged.
MIN_REPEATS = 3


def spread(samples: Sequence[float]) -> float:
    """(p75 - p25) / median of ``samples`` (0 for fewer than two, or a median of 0)."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    if med <= 0:
        return 0.0
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return (q[2] - q[0]) / med


def composition(blocks: Sequence[Hashable]) -> tuple[tuple[Hashable, int], ...]:
    """A stage's blocks as (block key, count) pairs, sorted: stages of the same composition up to a
    factor are compared (``unit``)."""
    return tuple(sorted(Counter(blocks).items(), key=repr))


def unit(comp: tuple[tuple[Hashable, int], ...]) -> tuple[tuple[tuple[Hashable, int], ...], int]:
    """(the composition divided by the gcd of its counts, that gcd): 3 blocks are 3 times 1 block,
    an (embedding, 2 blocks) stage is not comparable with a 2-block stage."""
    g = reduce(math.gcd, (n for _, n in comp), 0)
    if g == 0:
        return comp, 1
    return tuple((key, n // g) for key, n in comp), g


@dataclass
class Assessment:
    """One measurement judged: per kind, per stage, the spread and the disagreement (0 where not
    compared), the medians, and the offences over the limits."""

    median: dict[str, list[float]]
    spread: dict[str, list[float]]
    disagreement: dict[str, list[float]]
    noisy: list[tuple[int, str, float]] = field(default_factory=list)  # (stage, kind, spread)
    disagreeing: list[tuple[tuple[int, ...], str, float]] = field(default_factory=list)  # (stages, kind, max/min)
    label: str = "stage"
    measurements: int = 1

    @property
    def ok(self) -> bool:
        return not self.noisy and not self.disagreeing

    @property
    def excess(self) -> float:
        """How far over the limits, the worst offence (0 when ``ok``): which measurement is quietest."""
        worst = [sp / SPREAD_LIMIT for _, _, sp in self.noisy]
        worst += [(ratio - 1) / DISAGREEMENT_LIMIT for _, _, ratio in self.disagreeing]
        return max(worst, default=0.0)

    @property
    def stages(self) -> list[int]:
        """The stages named by the warning, in order."""
        return sorted({s for s, _, _ in self.noisy} | {s for group, _, _ in self.disagreeing for s in group})

    def summary(self) -> str:
        """The offences in a few words each: ``stage 1 spread F 34%, B 41%; stages 1, 2 (same
        blocks) differ per block by F 2.05x``; past ``SAY_EACH`` stages, in one phrase for all."""
        parts = []
        by_stage: dict[int, list[str]] = {}
        for s, kind, sp in self.noisy:
            by_stage.setdefault(s, []).append(f"{kind} {100 * sp:.0f}%")
        if len(by_stage) > SAY_EACH:
            worst = max(self.noisy, key=lambda o: o[2])
            parts.append(f"{self.label}s {', '.join(map(str, sorted(by_stage)))} spread up to {100 * worst[2]:.0f}%"
                         f" ({self.label} {worst[0]} {worst[1]})")
        else:
            parts += [f"{self.label} {s} spread {', '.join(items)}" for s, items in sorted(by_stage.items())]
        by_group: dict[tuple[int, ...], list[str]] = {}
        for group, kind, ratio in self.disagreeing:
            by_group.setdefault(group, []).append(f"{kind} {ratio:.2f}x")
        if len(by_group) > 1 and len({s for g in by_group for s in g}) > SAY_EACH:
            named = sorted({s for g in by_group for s in g})
            worst = max(self.disagreeing, key=lambda o: o[2])
            parts.append(f"{self.label}s {', '.join(map(str, named))} (same blocks) differ per block by up to"
                         f" {worst[2]:.2f}x ({worst[1]})")
        else:
            parts += [f"{self.label}s {', '.join(map(str, group))} (same blocks) differ per block by {', '.join(items)}"
                      for group, items in sorted(by_group.items())]
        return "; ".join(parts)

    def warning(self) -> str:
        """What ``schedc profile``'s one-line warning says ('' when ``ok``); ``advice`` ends it."""
        if self.ok:
            return ""
        tries = f"{self.measurements} measurements" if self.measurements > 1 else "1 measurement"
        return f"timings noisy after {tries}: {self.summary()}"

    def to_dict(self) -> dict:
        return {"spread": self.spread, "disagreement": self.disagreement, "measurements": self.measurements,
                "stages": self.stages, "warning": self.warning()}


def advice() -> str:
    """The end of the warning: the limits, and what to do."""
    return (f"(limits: spread {100 * SPREAD_LIMIT:.0f}%, same blocks within {100 * DISAGREEMENT_LIMIT:.0f}%):"
            " is the machine busy? profile again when it is quiet")


def assess(samples: Sequence[dict[str, list[float]]], blocks: Sequence[Sequence[Hashable]] | None = None, *,
           label: str = "stage") -> Assessment:
    """Judge one measurement: ``samples[s][kind]`` the repeats of stage s (ms), ``blocks[s]`` the
    keys of its blocks (None: no comparison). Kinds other than ``KINDS`` are reported, not judged."""
    n = len(samples)
    kinds = list(samples[0]) if n else list(KINDS)
    median = {k: [statistics.median(samples[s][k]) if samples[s][k] else 0.0 for s in range(n)] for k in kinds}
    spreads = {k: [spread(samples[s][k]) for s in range(n)] for k in kinds}
    disagreement = {k: [0.0] * n for k in kinds}
    out = Assessment(median=median, spread=spreads, disagreement=disagreement, label=label)
    judged = n and min(len(samples[s][k]) for s in range(n) for k in kinds) >= MIN_REPEATS
    for s in range(n):
        for k in KINDS:
            if k not in samples[s] or not judged:
                continue
            width = spreads[k][s] * median[k][s]
            if spreads[k][s] > SPREAD_LIMIT and width >= FLOOR_MS:
                out.noisy.append((s, k, spreads[k][s]))
    if blocks is None or n < 2:
        return out
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for s in range(n - 1):  # the last stage's F and B include the loss
        if blocks[s]:
            u, count = unit(composition(blocks[s]))
            groups.setdefault(u, []).append((s, count))
    for members in groups.values():
        if len(members) < 2:
            continue
        for k in KINDS:
            if k not in median:
                continue
            per = {s: median[k][s] / count for s, count in members}
            mid = statistics.median(per.values())
            if mid <= 0:
                continue
            for s, t in per.items():
                disagreement[k][s] = t / mid - 1
            lo, hi = min(per.values()), max(per.values())
            if judged and hi - lo >= FLOOR_MS and max(abs(t / mid - 1) for t in per.values()) > DISAGREEMENT_LIMIT:
                named = tuple(s for s, t in per.items() if abs(t / mid - 1) > DISAGREEMENT_LIMIT)
                if len(named) < 2:  # the odd one out and the one it is furthest from
                    far = max(per, key=lambda s: abs(per[s] - per[named[0]]))
                    named = tuple(sorted({*named, far}))
                out.disagreeing.append((named, k, hi / lo if lo > 0 else math.inf))
    return out


def measure(sample: Callable[[int], dict[str, float]], n: int, warmup: int, repeats: int,
            blocks: Sequence[Sequence[Hashable]] | None = None, *, remeasure: int = REMEASURE,
            label: str = "stage", gather: Callable[[list], list] | None = None,
            progress: Callable[[str], None] | None = None) -> Assessment:
    """Time ``n`` stages, ``sample(s)`` one repeat of stage s ({kind: ms}): ``warmup`` rounds then
    ``repeats`` rounds, each round every stage once in order. Over a limit, measure again (at most
    ``remeasure`` more times) and keep the quietest measurement. ``gather``: every stage's samples
    (a list per stage of {kind: [ms]}) as the group's (tensor parallelism: the slowest rank's), so
    that every rank judges alike."""
    best: Assessment | None = None
    for attempt in range(1 + max(0, remeasure)):
        samples: list[dict[str, list[float]]] = [{} for _ in range(n)]
        for i in range(warmup + repeats):
            for s in range(n):
                got = sample(s)
                if i >= warmup:
                    for kind, ms in got.items():
                        samples[s].setdefault(kind, []).append(ms)
        if gather is not None:
            samples = gather(samples)
        now = assess(samples, blocks, label=label)
        now.measurements = attempt + 1
        if best is None or now.excess < best.excess:
            best = now
        best.measurements = attempt + 1
        if now.ok:
            break
        if attempt < remeasure and progress:
            progress(f"timings noisy ({now.summary()}): measuring again ({attempt + 2} of {1 + remeasure})")
    return best
