"""Asynchronous schedules (issue 27): PipeDream-2BW's weight versions in the core.

The steady-state time per microbatch, the second weight copy in memory, the version rule (a
forward of round r after the last weight gradient of round r - 2 on its stage), the per-round
UPDATEs of the lowered program, the schedule file's ``synchronous: false``, and the search, which
stays synchronous, under the ``steady`` objective."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc
import schedc.solvers as solvers
from schedc import Problem
from schedc.check import check
from schedc.errors import ProgramError, ScheduleError, ScheduleFileError
from schedc.program import Instr, Opcode, Program, lower
from schedc.schedule import Op, Schedule
from schedc.simulate import simulate
from schedc.solvers.families.asynchronous import two_bw
from schedc.solvers.search.solve import solve


def problem(p=4, m=8, **extra) -> Problem:
    return Problem.parse({"ranks": p, "microbatches": m, "costs": {"F": 1, "B": 1, "W": 1}, **extra})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 6).flatmap(lambda p: st.tuples(
    st.just(p), st.integers(max(1, p - 1), 12),
    st.lists(st.tuples(*[st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])] * 3), min_size=p, max_size=p),
    st.sampled_from([0.0, 0.25]))))
def test_2bw_steady_time_is_the_busiest_stage_without_latency_and_never_below_it(case):
    p, m, costs, comm = case
    prob = Problem.parse({"ranks": p, "microbatches": m, "comm": comm,
                          "costs": {k: [c[i] for c in costs] for i, k in enumerate("FBW")}})
    t = simulate(prob, two_bw(prob))
    busiest = max(sum(c) for c in costs)  # every microbatch runs F, B and W on every stage
    ends = t.round_ends()
    steps = [b - a for a, b in zip(ends, ends[1:-1])]  # the rounds measured
    if comm == 0:  # the busiest stage sets the pace, every round alike
        assert t.per_microbatch == pytest.approx(busiest)
        assert max(steps) - min(steps) < 1e-9
    else:  # latency can add to it: the mean of the rounds between the first and the last
        assert t.per_microbatch >= busiest - 1e-9
        assert min(steps) / m - 1e-9 <= t.per_microbatch <= max(steps) / m + 1e-9
        if m >= p:  # the rounds measured run as in a longer run (its drain comes after them)
            long = simulate(prob, two_bw(prob, rounds=t.schedule.rounds + 3)).round_ends()
            assert long[:-4] == pytest.approx(ends[:-1])
    flushed = simulate(prob, solvers.build("1f1b", prob))
    assert t.per_microbatch <= flushed.per_microbatch + 1e-9 == flushed.makespan / m + 1e-9


def test_steady_objective_and_bubble_of_both_kinds():
    prob = problem(objective="steady")
    one = simulate(prob, solvers.build("1f1b", prob))
    assert one.objective_value() == one.makespan / 8 == 33 / 8
    assert one.bubble_rate() == pytest.approx(one.bubble_rate("makespan"))
    two = simulate(prob, two_bw(prob, rounds=5))
    assert two.schedule.rounds == 5 and not two.schedule.synchronous
    assert two.objective_value() == 3.0 and two.bubble_rate() == pytest.approx(0.0)
    assert two.idle() == pytest.approx((0.0,) * 4)
    summary = two.summary()
    assert summary["rounds"] == 5 and summary["per_microbatch"] == 3.0 and "rounds" not in one.summary()


def test_the_second_weight_copy_is_static_memory_and_can_break_the_limit():
    base = problem(memory={"F": 1, "static": 2, "weights": [3, 1, 1, 1]})
    one, two = (simulate(base, solvers.build(name, base)) for name in ("1f1b", "2bw"))
    assert one.peak_activation == two.peak_activation == (4, 3, 2, 1)  # 1F1B's in-flight microbatches
    assert one.peak_memory == (6, 5, 4, 3) and two.peak_memory == (9, 6, 5, 4)
    tight = base.with_changes(memory={"limit": 8})
    assert simulate(tight, solvers.build("1f1b", tight)).fits
    t = simulate(tight, solvers.build("2bw", tight))
    assert not t.fits and t.violations[0].rank == 0 and t.violations[0].peak == 9


def test_a_forward_before_the_weights_it_uses_is_refused():
    prob = problem(p=2, m=2)
    ops = list(two_bw(prob, rounds=3).ranks[0])
    ops.remove(Op("F", 0, 4))  # round 2's first forward on stage 0 ...
    ops.insert(0, Op("F", 0, 4))  # ... before round 0's backwards
    bad = Schedule.from_lists("bad", [ops, two_bw(prob, rounds=3).ranks[1]], rounds=3)
    with pytest.raises(ScheduleError, match=r"F4@s0 \(round 2\) comes before the last weight gradient of round 0"):
        simulate(prob, bad)
    with pytest.raises(ScheduleError, match="rounds must be a whole number from 1"):
        Schedule.from_lists("x", [[]], rounds=0)
    dp = problem(p=2, m=2, data_parallel={"degree": 2, "reduce": 1})
    assert "asynchronous" in solvers.get("2bw").why_not(dp)
    with pytest.raises(ScheduleError, match="cannot run a problem with data_parallel"):
        simulate(dp, two_bw(prob))
    assert "at least p - 1 = 3 microbatches" in solvers.get("2bw").why_not(problem(p=4, m=2))


def test_the_program_steps_each_stage_per_round_and_check_refuses_a_mix():
    prob = problem(p=3, m=3)
    schedule = two_bw(prob, rounds=4)
    program = lower(prob, schedule)
    check(prob, program, schedule)
    for r, instrs in enumerate(program.ranks):
        updates = [(i.stage, i.mb) for i in instrs if i.op is Opcode.UPDATE]
        assert updates == [(r, k) for k in range(4)] and instrs[-1] == Instr("STEP")
        # each right after its round's last fused backward (and that backward's send)
        for k, i in enumerate(instrs):
            if i.op is Opcode.UPDATE:
                last = max(j for j, x in enumerate(instrs) if x.op == "BW" and x.mb // 3 == i.mb)
                assert all(x.op in ("SEND", "RECV") for x in instrs[last + 1:k])

    def edited(r, move_from, move_to):
        ranks = [list(instrs) for instrs in program.ranks]
        ranks[r].insert(move_to, ranks[r].pop(move_from))
        return Program.from_lists(ranks, program.header)

    first_update = next(k for k, i in enumerate(program.ranks[0]) if i.op is Opcode.UPDATE)
    with pytest.raises(ProgramError, match="UPDATE s0 round 0 comes before 1 weight gradient"):
        check(prob, edited(0, first_update, first_update - 3))
    round2 = next(k for k, i in enumerate(program.ranks[0]) if i.op == "F" and i.mb == 6)
    with pytest.raises(ProgramError, match=r"F6@s0 \(round 2\) comes before UPDATE s0 round 0"):
        check(prob, edited(0, first_update, round2 + 1))
    sync = lower(prob, solvers.build("1f1b", prob))
    ranks = [list(instrs) for instrs in sync.ranks]
    ranks[0].insert(-1, Instr(Opcode.UPDATE, 0, 0))
    with pytest.raises(ProgramError, match="this one is synchronous .* do not mix"):
        check(prob, Program.from_lists(ranks, sync.header))
    with pytest.raises(ProgramError, match="runs 4 round.* has 1: a synchronous and an asynchronous one do not mix"):
        check(prob, program, solvers.build("1f1b", prob))


def test_the_file_says_asynchronous_and_refuses_a_mix(tmp_path):
    prob = problem(p=2, m=2, objective="steady", memory={"weights": 1})
    compiled = schedc.compile(prob, "2bw")
    compiled.save(tmp_path / "a.json")
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["version"] == 6 and data["schedule"]["synchronous"] is False and data["schedule"]["rounds"] == 8
    back = schedc.load(tmp_path / "a.json")
    assert back.schedule == compiled.schedule and back.program == compiled.program
    for edit, message in (({"synchronous": True}, "says synchronous: true but runs 8 round"),
                          ({"rounds": 1}, "says synchronous: false but runs 1 round")):
        bad = {**data, "schedule": {**data["schedule"], **edit}}
        (tmp_path / "b.json").write_text(json.dumps(bad))
        with pytest.raises(ScheduleFileError, match=message):
            schedc.load(tmp_path / "b.json")
    (tmp_path / "c.json").write_text(json.dumps({**data, "version": 5}))
    with pytest.raises(ScheduleFileError, match="version 5 cannot hold an asynchronous schedule"):
        schedc.load(tmp_path / "c.json")
    sync = schedc.compile(problem(p=2, m=2), "1f1b")  # a plain synchronous file keeps its old version
    sync.save(tmp_path / "d.json")
    assert json.loads((tmp_path / "d.json").read_text())["version"] == 1


def test_solve_under_the_steady_objective_searches_synchronous_schedules():
    prob = problem(p=4, m=8, objective="steady", memory={"limit": 4})
    r = solve(prob, time_limit=20, threads=1)
    flat = solve(prob.with_changes(objective="makespan"), time_limit=20, threads=1)
    assert r.timeline.schedule.synchronous and "2bw" not in dict(r.registry)
    assert r.objective == pytest.approx(flat.objective / 8) == r.timeline.objective_value()
    assert r.bound == pytest.approx(flat.bound / 8) and r.gap == pytest.approx(flat.gap)
    assert r.summary()["objective_kind"] == "steady"


def test_the_cli_states_the_semantics(tmp_path):
    from click.testing import CliRunner

    from schedc.app.cli import main

    def run(*args, code=0):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == code, result.output
        return result.output

    listed = {line.split()[0]: line.split()[3] for line in run("schedules").splitlines()[2:] if line.strip()
              and line.split()[0] in solvers.REGISTRY}
    assert listed["2bw"] == "asynchronous" and listed["1f1b"] == "synchronous"
    path = tmp_path / "p.yaml"
    path.write_text("ranks: 4\nmicrobatches: 8\ncosts: {F: 1, B: 1, W: 1}\n")
    table = run("compare", path, "--objective", "steady", "--schedules", "1f1b,2bw")
    assert "per microbatch" in table and "bubble% (steady)" in table
    row = next(line for line in table.splitlines() if line.startswith("2bw"))
    assert row.split()[:7] == ["2bw", "(async,", "8", "rounds)", "201", "201", "3"]
    data = json.loads(run("compare", path, "--schedules", "1f1b,2bw", "--json"))
    assert [(r["synchronous"], r["per_microbatch"]) for r in data["results"]] == [(True, 33 / 8), (False, 3.0)]
    assert "asynchronous: 8 rounds of 8 microbatches" in run("simulate", path, "-s", "2bw")
    run("compile", path, "-s", "2bw", "-o", tmp_path / "a.json")
    run("check", tmp_path / "a.json")
    refused = run("export", path, "-s", "2bw", "--format", "torch-csv", "-o", tmp_path / "a.csv", code=2)
    assert "torch.distributed.pipelining runs synchronous schedules only" in refused


def test_the_plotted_memory_counts_the_second_weight_copy():
    from schedc.app.plot import memory_steps

    prob = problem(p=3, m=3, memory={"F": 1, "static": 2, "weights": 1.5})
    t = simulate(prob, two_bw(prob))
    assert [max(level for _, level in points) for points in memory_steps(t)] == pytest.approx(t.peak_memory)
    assert memory_steps(t)[0][-1][1] == 3.5  # static memory and the second copy, once every activation is freed
