"""Comparisons of times and of memory that do not depend on their unit.

A problem's times (op costs, ``comm``) are in any one unit, and so are its memory amounts
(deltas, static memory, limits). Multiplying every time by a constant c must give the same
schedules, with every time and objective multiplied by c; likewise for memory. So no comparison
of times or of memory uses an absolute epsilon: sums of float costs carry rounding noise, and
"equal up to noise" is measured against the problem's own scale of the quantity:

- ``Problem.time_scale``: the largest op cost (F, B, W or the fused BW of any stage) or ``comm``;
- ``Problem.memory_scale``: the largest memory amount (a delta, static memory or a limit);

and ``Problem.time_tol`` / ``Problem.memory_tol`` are the ``Tolerance`` of each: ``REL`` of the
time scale, ``REL_MEMORY`` of the memory scale. A time is a sum of up to n costs along a chain, so
its rounding grows to about n**2 * 1e-16 of the scale, below ``REL`` for chains of a thousand ops;
a memory level stays within the limit, so its rounding stays near n * 1e-16 of the limit, and a
tighter tolerance keeps what the bounds concede to it (a knapsack over the room plus the
tolerance) as small as before in the usual units. Real differences between schedules are whole
op costs and activations, far above either.

An objective against a lower bound (solver bounds carry the solver's own tolerances) is compared
relative to the objective itself: ``meets``.
"""

from __future__ import annotations

from dataclasses import dataclass

REL = 1e-9  # float noise in times, relative to the problem's time scale
REL_MEMORY = 1e-10  # float noise in memory levels, relative to the problem's memory scale
MEETS = 1e-7  # an objective this close to a lower bound (relative to the objective) meets it


@dataclass(frozen=True)
class Tolerance:
    """Comparisons of two values of one quantity that treat differences up to ``eps`` as noise."""

    eps: float

    @classmethod
    def of(cls, scale: float, rel: float = REL) -> "Tolerance":
        return cls(rel * abs(scale))

    def lt(self, a: float, b: float) -> bool:
        """a is clearly less than b (beyond noise)."""
        return a < b - self.eps

    def gt(self, a: float, b: float) -> bool:
        """a is clearly more than b."""
        return a > b + self.eps

    def le(self, a: float, b: float) -> bool:
        """a is at most b, up to noise."""
        return a <= b + self.eps

    def ge(self, a: float, b: float) -> bool:
        """a is at least b, up to noise."""
        return a >= b - self.eps

    def eq(self, a: float, b: float) -> bool:
        """a equals b, up to noise."""
        return abs(a - b) <= self.eps

    def key(self, a: float) -> float:
        """A sort key for ``a`` that ties values equal up to noise: ``a`` in whole units of
        ``eps``, so that ties are broken by the next key, not by rounding noise that depends on
        the unit. (Two values a noise apart can still fall either side of a unit's edge, but noise
        is far below ``eps``, so only values within noise of an edge do.)"""
        return round(a / self.eps) if self.eps > 0 else a


def meets(value: float, bound: float, rel: float = MEETS) -> bool:
    """``value`` (an objective) is no more than ``bound`` (a lower bound on it), up to ``rel`` of
    the value: sums of many float costs, and a solver's own tolerances on its bound."""
    return value - bound <= rel * abs(value)
