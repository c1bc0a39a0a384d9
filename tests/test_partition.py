"""The partitioner: the DP is exact (brute force on small cases) and never worse than uniform."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedc.partition import balanced, stage_weights, uniform


def brute_force(weights, k):
    n = len(weights)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


@given(st.lists(st.integers(0, 50), min_size=1, max_size=10), st.data())
def test_dp_equals_brute_force_and_beats_uniform(weights, data):
    k = data.draw(st.integers(1, len(weights)))
    sizes = balanced(weights, k)
    assert len(sizes) == k and sum(sizes) == len(weights) and min(sizes) >= 1
    heaviest = max(stage_weights(weights, sizes))
    assert heaviest == brute_force(weights, k)
    assert heaviest <= max(stage_weights(weights, uniform(len(weights), k)))


def test_examples_and_errors():
    assert uniform(7, 3) == [3, 2, 2]
    assert balanced([5, 1, 1, 1, 1, 5], 3) == [1, 4, 1]
    assert balanced([1.0] * 6, 3) == [2, 2, 2]
    with pytest.raises(ValueError, match="cannot cut 2 blocks into 3 stages"):
        balanced([1, 1], 3)
    with pytest.raises(ValueError, match="must be >= 0"):
        balanced([1, -1], 1)
