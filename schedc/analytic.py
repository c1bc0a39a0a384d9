"""Published closed forms for the bubble and peak activation memory of the named schedules.

Costs here are per rank: ``F``, ``B``, ``W`` are one microbatch through all of a rank's layers
(with v chunks, each chunk costs F / v). The bubble is the idle time of the busiest rank over
one iteration (its span minus its work), so the iteration takes ``m (F + B + W) + bubble``.
Peak activation is on rank 0, in microbatches' worth of one rank's activations.

The forms are exact in our simulator when every stage costs the same, there is no
communication latency, and the condition in ``holds`` is met; the tests check that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Formula:
    schedule: str
    bubble: Callable[[int, int, int, float, float, float], float]  # (p, m, v, F, B, W)
    peak_activation: Callable[[int, int, int], float]  # (p, m, v), on rank 0
    holds: str
    source: str


FORMULAS: tuple[Formula, ...] = (
    Formula(
        "gpipe",
        lambda p, m, v, F, B, W: (p - 1) * (F + B + W),
        lambda p, m, v: m,
        "v = 1",
        "Huang et al. 2019",
    ),
    Formula(
        "1f1b",
        lambda p, m, v, F, B, W: (p - 1) * (F + B + W),
        lambda p, m, v: min(p, m),
        "v = 1",
        "Narayanan et al. 2021 (PipeDream-flush)",
    ),
    Formula(
        "interleaved-1f1b",
        lambda p, m, v, F, B, W: (p - 1) * (F + B + W) / v,
        lambda p, m, v: min(v * p + p - 1, m * v) / v,
        "m a multiple of p",
        "Narayanan et al. 2021 (Megatron-LM)",
    ),
    Formula(
        "looped-bfs",
        lambda p, m, v, F, B, W: (p - 1) * (F + B + W) / v,
        lambda p, m, v: m,
        "m >= p",
        "Lamy-Poirier 2023",
    ),
    Formula(
        "zb-h1",
        lambda p, m, v, F, B, W: (p - 1) * (F + B - W),
        lambda p, m, v: min(p, m),
        "v = 1, m >= p",
        "Qi et al. 2024",
    ),
    Formula(
        "zb-h2",
        lambda p, m, v, F, B, W: (p - 1) * max(0.0, F + B - 2 * W),
        lambda p, m, v: min(2 * p - 1, m),
        "v = 1, m >= 2p-1, F+B >= 2W, by span",
        "Qi et al. 2024",
    ),
)


def bubble_table(p: int, m: int, v: int, F: float, B: float, W: float) -> list[dict]:
    """One row per schedule: bubble time, bubble rate and peak activation at these figures."""
    rows = []
    work = m * (F + B + W)
    for f in FORMULAS:  # schedules marked "v = 1" ignore v: they are the one-chunk reference
        bubble = f.bubble(p, m, v, F, B, W)
        rows.append(
            {
                "schedule": f.schedule,
                "bubble": bubble,
                "bubble_rate": bubble / (work + bubble) if work + bubble > 0 else 0.0,
                "peak_activation": f.peak_activation(p, m, v),
                "holds": f.holds,
                "source": f.source,
            }
        )
    return rows
