"""Sequence chunks (issue 27, Seq1F1B) in the core: the chunk dependency rule, per-chunk costs and
memory, the seq1f1b schedules, lowering, the checker and the schedule file."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc
import schedc.solvers as solvers
from schedc import Problem
from schedc.check import check
from schedc.errors import ProblemError, ProgramError, SchedcError, ScheduleError
from schedc.program import Program, lower
from schedc.schedule import Op, Schedule, producers
from schedc.simulate import simulate
from schedc.solvers.search.solve import solve


def problem(p=4, m=8, k=2, **extra) -> Problem:
    return Problem.parse({"ranks": p, "microbatches": m, "costs": {"F": 1, "B": 1, "W": 1}, "memory": {"F": 1},
                          "sequence_chunks": k, **extra})


def test_the_chunk_rule_forwards_in_order_backwards_in_reverse():
    k, depth = 3, 4
    assert producers(Op("F", 1, 3), depth, chunks=k) == [Op("F", 0, 3)]  # chunk 0 of sequence 1: no chunk need
    assert producers(Op("F", 1, 4), depth, chunks=k) == [Op("F", 0, 4), Op("F", 1, 3)]
    assert producers(Op("B", 1, 5), depth, chunks=k) == [Op("F", 1, 5), Op("B", 2, 5)]  # the last chunk
    assert producers(Op("B", 1, 4), depth, chunks=k) == [Op("F", 1, 4), Op("B", 2, 4), Op("B", 1, 5)]
    where = {Op("BW", 1, 5): (0, 0)}  # a fused backward meets the need where the schedule holds one
    assert producers(Op("BW", 1, 4), depth, where, chunks=k)[-1] == Op("BW", 1, 5)
    assert producers(Op("W", 1, 4), depth, chunks=k) == [Op("B", 1, 4)]
    assert producers(Op("F", 1, 4), depth) == [Op("F", 0, 4)]  # without chunks, as before


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 5), st.integers(1, 6), st.integers(1, 5), st.sampled_from([0.0, 0.3]), st.data())
def test_seq1f1b_respects_the_chunk_rule_and_holds_p_minus_s_minus_1_plus_k_chunks(p, m, k, comm, data):
    weights = data.draw(st.lists(st.sampled_from([0.1, 0.25, 0.4]), min_size=k, max_size=k))
    shares = [x / sum(weights) for x in weights]  # each chunk position's part of the sequence
    prob = Problem.parse({"ranks": p, "microbatches": m, "comm": comm, "costs": {"F": 2, "B": 2, "W": 1},
                          "sequence_chunks": {"count": k, "F": shares, "B": shares[::-1]}, "memory": {"F": 1}})
    for name in ("seq1f1b", "seq1f1b-zb"):
        schedule = solvers.build(name, prob)
        t = simulate(prob, schedule)
        times = t.op_times()
        assert len(times) == p * m * k * (3 if name.endswith("zb") else 2)
        for op, (_, start, end) in times.items():
            c = op.mb % k
            share = {"F": shares, "B": shares[::-1], "W": [1 / k] * k}
            want = (2 * shares[::-1][c] + 1 / k) if op.kind == "BW" else {"F": 2, "B": 2, "W": 1}[op.kind] * share[op.kind][c]
            assert end - start == pytest.approx(want)
            if op.kind == "F" and c > 0:  # after its sequence's earlier chunk on its stage
                assert start >= times[Op("F", op.stage, op.mb - 1)][2] - 1e-9
            if op.kind in ("B", "BW") and c < k - 1:  # after the later chunk's backward
                assert start >= times[Op(op.kind, op.stage, op.mb + 1)][2] - 1e-9
        program = lower(prob, schedule)
        check(prob, program, schedule)
        if name == "seq1f1b":  # fused: a chunk's memory (1/k of the sequence's) is held until its backward
            assert t.peak_activation == pytest.approx(
                tuple(min(p - 1 - s + k, m * k) / k for s in range(p)))


def test_one_chunk_is_1f1b_and_zb_h1_and_chunks_shrink_bubble_and_memory():
    flat = problem(k=1)
    assert solvers.build("seq1f1b", flat).ranks == solvers.build("1f1b", flat.with_changes(sequence_chunks=None)).ranks
    assert solvers.build("seq1f1b-zb", flat).ranks == solvers.build("zb-h1", flat.with_changes(sequence_chunks=None)).ranks
    runs = [simulate(problem(k=k), solvers.build("seq1f1b", problem(k=k))) for k in (1, 2, 4, 8)]
    assert [t.makespan for t in runs] == sorted((t.makespan for t in runs), reverse=True)
    assert [max(t.peak_activation) for t in runs] == [4, 2.5, 1.75, 1.375]


def test_an_order_that_breaks_the_chunk_rule_is_refused():
    prob = problem(p=2, m=1, k=2)
    good = solvers.build("seq1f1b", prob)
    ranks = [list(ops) for ops in good.ranks]
    ranks[0][0], ranks[0][1] = ranks[0][1], ranks[0][0]  # chunk 1's forward before chunk 0's
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(prob, Schedule.from_lists("bad", ranks))
    program = lower(prob, good)
    edited = [list(instrs) for instrs in program.ranks]
    last = edited[1]
    k0, k1 = (next(j for j, i in enumerate(last) if i.op == "BW" and i.mb == mb) for mb in (0, 1))
    last[k0], last[k1] = last[k1], last[k0]
    with pytest.raises(ProgramError, match=r"BW0@s1 runs before BW1@s1"):
        check(prob, Program.from_lists(edited, program.header))


def test_bad_sequence_chunks_are_refused_in_one_line():
    for chunks, message in (({"count": 2, "F": [0.5]}, "F has 1 shares but there are 2 chunks"),
                            ({"count": 2, "memory": [0.5, 0]}, "memory"),
                            ({"count": 2, "F": [0.001, 0.001]}, "F shares sum to 0.002, not 1"),
                            ({"count": 2, "memory": [5, 5]}, "memory shares sum to 10, not 1"),
                            (0, "greater than or equal to 1")):
        with pytest.raises(ProblemError, match=message):
            problem(sequence_chunks=chunks)
    with pytest.raises(ProblemError, match="sequence_chunks cannot be combined with recompute yet"):
        problem(recompute={"time": 1})
    assert "runs whole sequences" in solvers.get("1f1b").why_not(problem())
    assert solvers.get("1f1b").why_not(problem(k=1)) is None
    found = solve(problem(p=2, m=2, k=2), time_limit=20)  # searched now (tests/test_seq_solve.py)
    assert found.status == "optimal" and found.bound <= found.objective


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 10), min_size=1, max_size=6), st.floats(0.5, 2), st.sampled_from(["F", "B", "W", "memory"]))
def test_shares_are_taken_exactly_when_they_sum_to_1(weights, scale, kind):
    """A kind's shares split the sequence's cost or activation: refused in one line unless they sum
    to 1 (within 0.01), whatever their number and spread."""
    shares = [w / sum(weights) * scale for w in weights]
    chunks = {"count": len(shares), kind: shares}
    if abs(sum(shares) - 1) <= 0.01:
        assert problem(k=len(shares), sequence_chunks=chunks).sequence_chunks.shares(kind) == tuple(shares)
    else:
        with pytest.raises(ProblemError, match=f"{kind} shares sum to .*, not 1") as e:
            problem(k=len(shares), sequence_chunks=chunks)
        assert "\n" not in str(e.value)


def test_the_file_keeps_the_chunks(tmp_path):
    prob = problem(p=2, m=2, k=3)
    schedc.compile(prob, "seq1f1b-zb").save(tmp_path / "a.json")
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["version"] == 6 and data["problem"]["sequence_chunks"]["count"] == 3
    back = schedc.load(tmp_path / "a.json")
    assert back.program.header.sequence_chunks == 3 and back.timeline.makespan == simulate(prob, back.schedule).makespan


def test_the_plotted_memory_is_the_simulated_one():
    from schedc.app.plot import memory_steps

    prob = problem(p=3, m=3, k=2, memory={"F": 1, "static": 0.5}, sequence_chunks={"count": 2, "memory": [0.3, 0.7]})
    t = simulate(prob, solvers.build("seq1f1b-zb", prob))
    assert [max(level for _, level in points) for points in memory_steps(t)] == pytest.approx(t.peak_memory)


@pytest.mark.parametrize("F, B, W", [(1, 1, 1), (2, 2, 1), (1, 2, 1)])
def test_the_bubble_is_1f1b_s_and_zb_h1_s_over_k(F, B, W):
    """With equal chunks and no latency: seq1f1b idles (p - 1)(F + B + W) / k, 1F1B's bubble over
    k; seq1f1b-zb (p - 1)(F + B - W) / k, ZB-H1's over k (m >= p, as ZB-H1's form needs)."""
    for p in (2, 3, 4, 6):
        for m in (1, p, 2 * p + 1):
            for k in (1, 2, 3, 8):
                prob = Problem.parse({"ranks": p, "microbatches": m, "costs": {"F": F, "B": B, "W": W},
                                      "sequence_chunks": k})
                work = m * (F + B + W)
                fused = simulate(prob, solvers.build("seq1f1b", prob)).makespan
                assert fused - work == pytest.approx((p - 1) * (F + B + W) / k)
                if m >= p:
                    split = simulate(prob, solvers.build("seq1f1b-zb", prob)).makespan
                    assert split - work == pytest.approx((p - 1) * (F + B - W) / k)
