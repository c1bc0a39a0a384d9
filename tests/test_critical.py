"""critical_path: the chain of ops that sets a timeline's makespan or span, by hand and as an
invariant over random problems and random deadlock-free schedules."""

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import schedc.solvers as solvers
from schedc import Op, Problem, Schedule, simulate
from schedc.app.cli import main
from schedc.critical import Wait, critical_path
from schedc.kinds import ROWS
from schedc.schedule import producers
from schedc.simulate import durations
from tests.strategies import pipeline_problems

UNIFORM = str(Path(__file__).resolve().parent.parent / "examples/problems/uniform.yaml")


def sched(*ranks):
    return Schedule.from_lists("hand", [[Op(*x) for x in r] for r in ranks])


def test_chain_by_hand():
    # test_simulate.test_times_by_hand's timeline: rank 0 F0 0-1, F1 1-2, B0 5-7, W0 7-10, B1 10-12,
    # W1 12-15; rank 1 F0 1.5-2.5, B0 2.5-4.5, F1 4.5-5.5, B1 5.5-7.5, W0 7.5-10.5, W1 10.5-13.5.
    problem = Problem.parse(dict(ranks=2, microbatches=2, costs=dict(F=1, B=2, W=3), comm=0.5, memory=dict(F=4, B=-1)))
    t = simulate(problem, sched(
        [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("W", 0, 0), ("B", 0, 1), ("W", 0, 1)],
        [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1), ("W", 1, 0), ("W", 1, 1)],
    ))
    c = critical_path(t)
    assert [str(op) for op in c.ops] == ["F0@s0", "F0@s1", "B0@s1", "B0@s0", "W0@s0", "B1@s0", "W1@s0"]
    data, rank = Wait("data", 0.0), Wait("rank", 0.0)
    # B1@s0 waits for rank 0 (busy with W0@s0 until 10), not for B1@s1 (arrived at 8).
    assert c.waits == (None, Wait("data", 0.5), data, Wait("data", 0.5), data, rank, data)
    assert (c.objective, c.rank, c.window, c.value) == ("makespan", 0, (0.0, 15.0), 15.0)
    assert c.compute() == (11.0, 3.0)
    assert c.comm() == 1.0
    assert [run for run, _ in c.runs()] == [0, 1, 0]
    assert c.describe().splitlines() == [
        "critical path: 7 ops set the makespan 15: compute 93.3% (rank 0 73.3%, rank 1 20.0%), comm 6.7%",
        "  rank 0 F0@s0 -> rank 1 F0@s1 .. B0@s1 (2 ops) -> rank 0 B0@s0 .. W1@s0 (4 ops)",
    ]


def test_span_chain_starts_where_the_rank_that_sets_it_starts():
    # One microbatch; rank 1's W is long: its span 1.5..15.5 is the longest. The chain into its W
    # starts at F0@s0 on rank 0, which (with the transfer after it) lies before the window.
    problem = Problem.parse(dict(ranks=2, microbatches=1, costs=dict(F=1, B=[1, 3], W=[1, 10]), comm=0.5,
                                 memory=dict(F=1, B=-0.5), objective="span"))
    t = simulate(problem, sched([("F", 0, 0), ("B", 0, 0), ("W", 0, 0)], [("F", 1, 0), ("B", 1, 0), ("W", 1, 0)]))
    c = critical_path(t)
    assert (c.rank, c.window, c.value) == (1, (1.5, 15.5), t.span)
    assert [str(op) for op in c.ops] == ["F0@s1", "B0@s1", "W0@s1"]
    assert c.waits[0] == Wait("data", 0.5)  # its transfer ends where the window opens: not counted
    assert (c.compute(), c.comm()) == ((0.0, 14.0), 0.0)
    assert "rank 1's span 14 (1.5 to 15.5)" in c.describe()
    # The same timeline judged by makespan: the chain from time 0, through rank 1's W.
    m = critical_path(t, "makespan")
    assert (m.ops[0], m.window, m.comm()) == (Op("F", 0, 0), (0.0, 15.5), 0.5)


def random_schedule(problem: Problem, rng: random.Random) -> Schedule:
    """A random deadlock-free schedule: each (stage, microbatch) fused or split at random, the
    ops in a random topological order of their data dependencies, cut per rank."""
    n, m = problem.n_stages, problem.microbatches
    ops = []
    for s in range(n):
        for i in range(m):
            ops += [Op("F", s, i)] + ([Op("BW", s, i)] if rng.random() < 0.5 else [Op("B", s, i), Op("W", s, i)])
    present = {op: (0, 0) for op in ops}
    need = {op: set(producers(op, n, present)) for op in ops}
    done: set[Op] = set()
    ranks: list[list[Op]] = [[] for _ in range(problem.ranks)]
    ready = [op for op in ops if not need[op]]
    while ready:
        op = ready.pop(rng.randrange(len(ready)))
        done.add(op)
        ranks[problem.stage_rank[op.stage]].append(op)
        ready += [o for o in ops if o not in done and o not in ready and need[o] <= done]
    return Schedule.from_lists("random", ranks)


def check_chain(t, c, objective):
    """The chain is gapless in the timeline, each link is the wait it names, and it ends the
    objective."""
    p = t.problem
    times = t.op_times()
    where = t.schedule.locate()
    paired = t.schedule.paired() if t.schedule.pairs else {}
    tol = p.time_tol
    for a, b, w in zip(c.ops, c.ops[1:], c.waits[1:]):
        ra, rb = times[a][0], times[b][0]
        if w.kind == "pair":  # an overlapped pair's backward, after its forward: they start together
            assert paired[a] == b and ra == rb and w.latency == 0.0 and times[a][1:] == times[b][1:]
            continue
        if w.kind == "data":  # (a pair's forward waits for its backward's producers too)
            assert any(a in producers(x, p.n_stages, where) for x in (b, paired.get(b)) if x is not None)
            assert w.latency == (p.comm if ra != rb else 0.0)
        elif w.kind == "issue":  # a copy op, issued after this compute op of its rank
            assert t.anchors()[b] == a and ra == rb and w.latency == 0.0
            assert ROWS[a.kind].lane == "compute" and ROWS[b.kind].lane == "copy"
        else:  # the next op on the same lane of the same rank
            assert w.kind == "rank" and ra == rb and where[a][1] + 1 == where[b][1]
            assert ROWS[a.kind].lane == ROWS[b.kind].lane
            assert w.latency == 0.0
        assert tol.eq(times[a][2] + w.latency, times[b][1])  # no slack: b started the moment a allowed
    last = c.ops[-1]
    assert last == t.schedule.ranks[c.rank][-1]
    assert times[last][2] == c.window[1]
    assert c.times == tuple(times[op] for op in c.ops)
    value = t.objective_value(objective)
    assert c.value == pytest.approx(value, rel=1e-12)
    # The chain's compute, copies and transfers fill the window exactly.
    assert sum(c.compute()) + sum(c.copy()) + c.comm() == pytest.approx(value, rel=1e-9, abs=1e-9)
    if objective == "makespan":
        first = c.ops[0]
        assert c.waits[0] is None and times[first][1] == 0.0 and where[first][1] == 0
        # The makespan is the sum of the chain's costs and latencies, read from the problem alone.
        total = sum(durations(p, list(c.ops), paired)) + sum(w.latency for w in c.waits[1:])
        assert total == pytest.approx(t.makespan, rel=1e-9)
    else:
        assert c.rank == max(range(p.ranks), key=lambda r: t.rank_span[r])
        assert c.window[0] == t.start[c.rank][0]
        assert tol.gt(times[c.ops[0]][2], c.window[0])
        json.dumps(c.summary())


@settings(max_examples=60, deadline=None)
@given(st.data(), pipeline_problems(max_microbatches=5))
def test_the_chain_sets_the_objective_of_random_schedules(data, problem):
    t = simulate(problem, random_schedule(problem, data.draw(st.randoms(use_true_random=False))))
    for objective in ("makespan", "span"):
        check_chain(t, critical_path(t, objective), objective)


@settings(max_examples=25, deadline=None)
@given(pipeline_problems(max_microbatches=6))
def test_the_chain_sets_the_objective_of_the_named_schedules(problem):
    for name in ("1f1b", "zb-h1", "zb-greedy", "interleaved-1f1b", "zb-v"):
        if solvers.REGISTRY[name].why_not(problem) is None:
            t = simulate(problem, solvers.build(name, problem))
            for objective in ("makespan", "span"):
                check_chain(t, critical_path(t, objective), objective)


def test_the_chain_runs_through_overlapped_pairs(tmp_path):
    """DualPipe's own problem (an F and a B overlapped in 3 where they take 4): a pair runs as one op
    from when the inputs of both halves have arrived, so the chain reaches its backward through its
    forward ("pair"), which carries the pair's time and waits for the backward's producers too. Every
    registry schedule with pairs there, fused and split, has a chain that sets its objective (each
    of them used to raise, and `schedc simulate` with them)."""
    from schedc.solvers.registry import unfuse
    from tests.test_ilp_model import dualpipe_own

    for d in (4, 6):
        problem = dualpipe_own(d)
        named = [solvers.build(n, problem) for n in ("dualpipe", "chimera", "bidir-zb")]
        for schedule in named + [unfuse(s) for s in named]:
            assert schedule.pairs
            t = simulate(problem, schedule)
            chains = [critical_path(t, objective) for objective in ("makespan", "span")]
            for objective, c in zip(("makespan", "span"), chains):
                check_chain(t, c, objective)
            assert any(w is not None and w.kind == "pair" for c in chains for w in c.waits), schedule.name
    path = tmp_path / "dualpipe.json"
    path.write_text(dualpipe_own(4).model_dump_json())
    out = CliRunner().invoke(main, ["simulate", str(path), "-s", "dualpipe"])
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[-2].startswith("critical path: ")


def test_random_schedules_are_random():
    problem = Problem.parse(dict(ranks=2, microbatches=3, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=-0.5)))
    seen = {random_schedule(problem, random.Random(seed)).ranks for seed in range(20)}
    assert len(seen) > 5


def test_a_tie_keeps_the_busy_rank():
    # Uniform costs, no latency: F1@s1 could wait on F1@s0 (ends at 2) or on F0@s1 (ends at 2);
    # the chain stays on rank 1, busy from F0@s1 to the end.
    problem = Problem.parse(dict(ranks=2, microbatches=3, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=-0.5)))
    t = simulate(problem, solvers.build("1f1b", problem))
    c = critical_path(t)
    assert c.compute()[1] == pytest.approx(t.busy[1])


def test_the_steady_objective_has_the_chain_of_its_makespan():
    """objective: steady (iterations back to back) takes the chain of the makespan of what the
    timeline ran, as ``rank_time`` does; `schedc simulate --objective steady` prints it (it raised)."""
    problem = Problem.parse(dict(ranks=2, microbatches=3, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=-0.5),
                                 objective="steady"))
    t = simulate(problem, solvers.build("1f1b", problem))
    c = critical_path(t)
    assert c.objective == "makespan" and c == critical_path(t, "makespan")
    check_chain(t, c, "makespan")
    out = CliRunner().invoke(main, ["simulate", UNIFORM, "-s", "1f1b", "--objective", "steady"])
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[-2].startswith("critical path: ")


def test_critical_path_rejects_an_unknown_objective():
    problem = Problem.parse(dict(ranks=1, microbatches=1, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=-0.5)))
    with pytest.raises(ValueError, match="'makespan' or 'span'"):
        critical_path(simulate(problem, solvers.build("1f1b", problem)), "bubble")


def test_simulate_prints_and_writes_the_critical_path():
    run = CliRunner()
    out = run.invoke(main, ["simulate", UNIFORM, "-s", "1f1b"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[-2] == "critical path: 22 ops set the makespan 33: compute 100.0% (rank 3 72.7%, rank 0 9.1%, rank 1 9.1%)"
    assert lines[-1] == ("  rank 0 F0@s0 -> rank 1 F0@s1 -> rank 2 F0@s2 -> rank 3 F0@s3 .. BW7@s3 (16 ops)"
                         " -> rank 2 BW7@s2 -> rank 1 BW7@s1 -> rank 0 BW7@s0")
    out = run.invoke(main, ["simulate", UNIFORM, "-s", "1f1b", "--json"])
    assert out.exit_code == 0, out.output
    cp = json.loads(out.stdout)["critical_path"]
    assert (cp["objective"], cp["rank"], cp["window"], len(cp["ops"])) == ("makespan", 0, [0.0, 33.0], 22)
    assert sum(o["end"] - o["start"] for o in cp["ops"]) == 33.0
    assert [o["wait"] for o in cp["ops"][:5]] == [None, "data", "data", "data", "data"]


def test_measured_times_are_refused():
    from schedc.simulate import with_times

    problem = Problem.parse(dict(ranks=2, microbatches=2, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=-0.5)))
    t = simulate(problem, solvers.build("1f1b", problem))
    slower = lambda times: [[1.1 * x for x in xs] for xs in times]  # noqa: E731
    late = with_times(problem, t.schedule, slower(t.start), slower(t.end))
    with pytest.raises(ValueError, match="needs the times simulate"):
        critical_path(late)


# ---- recompute and offload: the chain may run through R, S and the copy lane ----


@settings(max_examples=40, deadline=None)
@given(st.data(), pipeline_problems(max_microbatches=5))
def test_the_chain_sets_the_objective_with_recompute_and_offload(data, problem):
    from schedc.solvers.families.memtime import with_policies

    copy = data.draw(st.floats(0.05, 20), label="offload.time")
    problem = problem.with_changes(recompute=dict(time=data.draw(st.floats(0.05, 20), label="recompute.time")),
                                   offload=dict(time=copy))
    pairs = st.tuples(st.integers(0, problem.n_stages - 1), st.integers(0, problem.microbatches - 1))
    chosen = data.draw(st.dictionaries(pairs, st.sampled_from("RO")), label="policies")
    base = random_schedule(problem, data.draw(st.randoms(use_true_random=False)))
    t = simulate(problem, with_policies(problem, base, chosen))
    for objective in ("makespan", "span"):
        c = critical_path(t, objective)
        check_chain(t, c, objective)
        assert ("copy" in c.summary()) == bool(t.schedule.copy)


def test_a_slow_reload_is_on_the_chain():
    # One rank, 1F1B (F0 BW0 F1 BW1), the first microbatch offloaded with a copy as long as 10
    # forwards, the second recomputed: BW0 waits for its reload L0 (1 + 10 + 10), which waits for
    # the offload, which waits for F0; then F1, R1 and BW1 on the rank: 21 + 2 + 1 + 0.5 + 2.
    problem = Problem.parse(dict(ranks=1, microbatches=2, costs=dict(F=1, B=1, W=1), memory=dict(F=1),
                                 offload=dict(time=10), recompute=dict(time=0.5)))
    from schedc.solvers.families.memtime import with_policies

    t = simulate(problem, with_policies(problem, solvers.build("1f1b", problem), {(0, 0): "O", (0, 1): "R"}))
    c = critical_path(t)
    assert [str(op) for op in c.ops] == ["F0@s0", "O0@s0", "L0@s0", "BW0@s0", "F1@s0", "R1@s0", "BW1@s0"]
    assert c.copy() == (20.0,) and c.compute() == (6.5,) and c.value == t.makespan == 26.5
    assert c.describe().splitlines() == [
        "critical path: 7 ops set the makespan 26.5: compute 24.5% (rank 0 24.5%), copy 75.5%",
        "  rank 0 F0@s0 -> rank 0 copy O0@s0 .. L0@s0 (2 ops) -> rank 0 BW0@s0 .. BW1@s0 (4 ops)",
    ]
    summary = c.summary()
    assert [o["lane"] for o in summary["ops"]] == ["compute", "copy", "copy", *["compute"] * 4]
    assert summary["copy"] == [20.0]


def test_a_copy_issued_after_a_compute_op_is_a_link_of_the_chain():
    """One microbatch on the V placement, stage 0's activation offloaded with copies of 4: the copy
    out is issued after the compute op before it on its rank, and the makespan's chain runs through
    that link ("issue"), which the checks accept."""
    from schedc.solvers.families.memtime import with_policies

    problem = Problem.parse(dict(ranks=2, microbatches=1, chunks=2, placement="v", costs=dict(F=1, B=1, W=1),
                                 memory=dict(F=0), recompute=dict(time=1), offload=dict(time=4)))
    for seed in range(8):
        t = simulate(problem, with_policies(problem, random_schedule(problem, random.Random(seed)), {(0, 0): "O"}))
        for objective in ("makespan", "span"):
            c = critical_path(t, objective)
            check_chain(t, c, objective)
            if objective == "makespan" and any(w is not None and w.kind == "issue" for w in c.waits):
                return
    pytest.fail("no chain ran through a copy's issue")
