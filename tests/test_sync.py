"""Data parallelism: the problem's ``data_parallel`` section, the gradient all-reduce AR on each
rank's communication lane (``schedule.comm_lane``), as the simulator times it, the bounds count
it, lowering issues it, the checker verifies it and the schedule file keeps it."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc
from schedc import Problem, solvers
from schedc.check import check
from schedc.errors import ProblemError, ProgramError, ScheduleFileError
from schedc.interop import torch_comms_rows
from schedc.kinds import Kind
from schedc.program import Instr, Program, lower
from schedc.schedule import Op, Schedule, comm_lane
from schedc.simulate import back_to_back, simulate
from schedc.solvers.bounds import lower_bound
from schedc.solvers.registry import REGISTRY
from schedc.solvers.search.solve import solve

from strategies import pipeline_problems

GRADS = (Kind.W, Kind.BW)


@st.composite
def dp_problems(draw):
    """The schedule zoo's problems (at most 8 microbatches) with a data_parallel section: a reduce
    time per stage or one for all, overlapped or at the end."""
    problem = draw(pipeline_problems(max_microbatches=8))
    n = problem.n_stages
    time = st.floats(0, 10, allow_nan=False)
    reduce = draw(st.one_of(time, st.lists(time, min_size=n, max_size=n)))
    return problem.with_changes(data_parallel=dict(degree=draw(st.integers(1, 8)), reduce=reduce,
                                                   overlap=draw(st.booleans())))


def applicable(problem: Problem) -> list[str]:
    return [name for name in REGISTRY if REGISTRY[name].why_not(problem) is None]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dp_problems(), st.data())
def test_the_reduces_run_after_their_stage_and_only_the_step_waits_for_them(problem, data):
    """Each stage's reduce starts no earlier than the end of its last weight gradient (with overlap
    off, than the rank's last compute op), one at a time on its rank's lane, each as soon as the
    lane and its issue point allow; the compute lanes are timed as without data parallelism, and
    the makespan and each rank's span end at its last reduce where that ends later."""
    name = data.draw(st.sampled_from(applicable(problem)))
    schedule = solvers.build(name, problem)
    t = simulate(problem, schedule)
    plain = simulate(problem.with_changes(data_parallel=None), schedule)
    assert t.start == plain.start and t.end == plain.end and t.peak_activation == plain.peak_activation
    reduce = problem.cost[Kind.AR]
    tol = problem.time_tol
    ends = {op: e for op, (_, _, e) in t.op_times().items()}
    for r, ops in enumerate(t.comm):
        assert sorted(op.stage for op in ops) == sorted(problem.rank_stages[r]) and all(op.mb == 0 for op in ops)
        free = 0.0
        for op, s, e in zip(ops, t.comm_start[r], t.comm_end[r]):
            last_grad = max(ends[Op(k, op.stage, i)] for k in GRADS for i in range(problem.microbatches)
                            if Op(k, op.stage, i) in ends)
            issue = last_grad if problem.data_parallel.overlap else t.end[r][-1]
            assert tol.eq(s, max(free, issue)) and tol.eq(e, s + reduce[op.stage])
            free = e
    assert tol.eq(t.makespan, max(plain.makespan, max(max(es) for es in t.comm_end)))
    for r in range(problem.ranks):
        assert tol.eq(t.rank_span[r], max(t.end[r][-1], t.comm_end[r][-1]) - t.start[r][0])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dp_problems(), st.sampled_from(["makespan", "span"]))
def test_the_bound_holds_for_every_registry_schedule_with_reduces(problem, objective):
    """The lower bound with data parallelism lies below every registry schedule's objective, and
    never below the bound without it (the reduces only add)."""
    problem = problem.with_changes(objective=objective)
    bound = lower_bound(problem).value
    assert problem.time_tol.ge(bound, lower_bound(problem.with_changes(data_parallel=None)).value)
    for name in applicable(problem):
        t = simulate(problem, solvers.build(name, problem))
        assert problem.time_tol.le(bound, t.objective_value()), name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dp_problems(), st.data())
def test_lowering_issues_the_reduces_where_the_simulator_does_and_the_checker_agrees(problem, data):
    """The program lists each reduce right after the compute op ``comm_lane`` issues it after, before
    the step; ``check`` passes it with the schedule, and back-to-back steps end no earlier than one."""
    schedule = solvers.build(data.draw(st.sampled_from(applicable(problem))), problem)
    program = lower(problem, schedule)
    check(problem, program, schedule)
    assert program.comm_order() == tuple(tuple(op for op, _ in lane) for lane in comm_lane(problem, schedule))
    for instrs in program.ranks:
        assert instrs[-1].op == "STEP"
    steps = back_to_back(problem, schedule, 2)
    assert problem.time_tol.ge(steps[0], simulate(problem, schedule).makespan)


def _dp(overlap: bool = True, **more) -> Problem:
    return Problem.parse(dict(ranks=2, microbatches=4, chunks=2, placement="v", costs=dict(F=1, B=1, W=1),
                              data_parallel=dict(degree=2, reduce=[3, 1, 1, 2], overlap=overlap), **more))


def test_overlap_hides_the_first_stages_reduce_and_the_end_adds_them_whole():
    """V placement on 2 ranks: rank 0 holds stages 0 and 3. Overlapped, stage 3's reduce (2) runs
    beside the rank's remaining work and only stage 0's (3) follows its last W; at the end both
    follow it, one after the other (3 + 2)."""
    schedule = solvers.build("zb-v", _dp())
    compute_end = simulate(_dp(), schedule).end[0][-1]
    overlapped, at_end = (simulate(_dp(overlap), schedule) for overlap in (True, False))
    assert overlapped.rank_end[0] == compute_end + 3 and overlapped.exposed_reduce[0] == 3
    assert at_end.rank_end[0] == compute_end + 3 + 2 and at_end.exposed_reduce[0] == 5
    assert at_end.summary()["exposed_reduce"] == list(at_end.exposed_reduce)
    assert [op.stage for op in at_end.comm[0]] == [3, 0]  # the later stage first
    assert lower_bound(_dp(False)).value >= lower_bound(_dp(True)).value


def test_the_schedule_file_keeps_the_reduces_and_refuses_edits(tmp_path):
    """A schedule of a problem with data parallelism is written as version 4; its program's
    reduces are checked on reading: one moved before its stage's last weight gradient, one
    missing, or the file relabelled version 3, each fail with one line."""
    compiled = schedc.compile(_dp(), "zb-v")
    path = tmp_path / "s.json"
    compiled.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 4 and data["problem"]["data_parallel"]["degree"] == 2
    loaded = schedc.load(path)
    assert loaded.timeline.makespan == compiled.timeline.makespan
    assert loaded.program.comm_order() == compiled.program.comm_order()

    def edited(change) -> str:
        copy = json.loads(path.read_text())
        change(copy)
        path.write_text(json.dumps(copy))
        with pytest.raises(ScheduleFileError) as e:
            schedc.load(path)
        compiled.save(path)
        assert "\n" not in str(e.value)
        return str(e.value)

    def first_reduce_to_front(d):
        rank = d["program"][0]
        k = next(k for k, i in enumerate(rank) if i["op"] == "AR")
        rank.insert(0, rank.pop(k))

    assert "before the last weight gradient" in edited(first_reduce_to_front)
    assert "no AR (gradient all-reduce) of stage" in edited(
        lambda d: d["program"][1].pop(next(k for k, i in enumerate(d["program"][1]) if i["op"] == "AR")))
    assert "version 3 cannot hold a problem with data_parallel" in edited(lambda d: d.__setitem__("version", 3))


def test_the_checker_refuses_reduces_without_data_parallel_and_twice():
    plain = _dp().with_changes(data_parallel=None)
    schedule = solvers.build("zb-v", plain)
    program = lower(plain, schedule)
    ranks = [list(instrs) for instrs in program.ranks]
    ranks[0].insert(len(ranks[0]) - 1, Instr("AR", 0, 0))
    with pytest.raises(ProgramError, match="needs the problem.s data_parallel section, which it does not give"):
        check(plain, Program.from_lists(ranks))
    program = lower(_dp(), schedule)
    ranks = [list(instrs) for instrs in program.ranks]
    ranks[0].insert(len(ranks[0]) - 1, Instr("AR", 0, 0))
    with pytest.raises(ProgramError, match="is listed twice"):
        check(_dp(), Program.from_lists(ranks))


def test_a_schedule_that_lists_a_reduce_is_refused():
    """Reduces are issued by the simulator and lowering, never listed in a schedule's lanes."""
    schedule = solvers.build("zb-v", _dp())
    bad = Schedule.from_lists("bad", [list(schedule.ranks[0]) + [("AR", 0, 0)], schedule.ranks[1]])
    with pytest.raises(schedc.ScheduleError, match="runs on the comm lane, not the compute lane"):
        simulate(_dp(), bad)


@pytest.mark.parametrize(
    "section, message",
    [
        (dict(degree=0, reduce=1), "data_parallel.degree"),
        (dict(degree=2.5, reduce=1), "data_parallel.degree"),
        (dict(degree=2, reduce=-1), "data_parallel.reduce"),
        (dict(degree=2, reduce=[1, 2, 3]), "data_parallel.reduce"),
        (dict(degree=2), "data_parallel.reduce"),
        (dict(degree=2, reduce=1, overlap="yes"), "data_parallel.overlap"),
        (dict(degree=2, reduce=1, bucket=3), "data_parallel.bucket"),
    ],
)
def test_a_bad_data_parallel_section_is_one_line_naming_the_field(section, message):
    with pytest.raises(ProblemError) as e:
        Problem.parse(dict(ranks=2, microbatches=4, costs=dict(F=1, B=1, W=1), data_parallel=section))
    assert message in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dp_problems(), st.sampled_from([0.001, 3.0, 1024.0]))
def test_the_reduces_scale_with_the_unit_of_time(problem, k):
    schedule = solvers.build(applicable(problem)[0], problem)
    t, u = simulate(problem, schedule), simulate(problem.scaled(time=k), schedule)
    assert math.isclose(u.makespan, k * t.makespan, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(lower_bound(problem.scaled(time=k)).value, k * lower_bound(problem).value,
                        rel_tol=1e-9, abs_tol=1e-12)


def test_solve_orders_for_the_reduces_and_meets_its_bound():
    """solve judges with the reduces: its schedule is no slower than the best registry schedule
    on the problem with them, within the proven bound."""
    problem = _dp()
    result = solve(problem, time_limit=20)
    best = min(simulate(problem, solvers.build(name, problem)).makespan for name in applicable(problem))
    assert result.timeline.comm and problem.time_tol.le(result.objective, best)
    assert problem.time_tol.le(result.bound, result.objective)


def test_torchs_compute_comms_csv_reduces_where_the_program_does():
    """torch's compute_comms format has REDUCE_GRAD: with data parallelism each stage's cell is
    where the program issues its all-reduce, once per stage, in the lane's order (without it,
    after the stage's last backward, as before)."""
    problem = _dp(overlap=False)
    program = lower(problem, solvers.build("zb-v", problem))
    rows = torch_comms_rows(program)
    for r, row in enumerate(rows):
        cells = [c for c in row if c.endswith("REDUCE_GRAD")]
        assert cells == [f"{op.stage}REDUCE_GRAD" for op in program.comm_order()[r]]
        assert row.index(cells[0]) > max(k for k, c in enumerate(row) if "W" in c)  # at the end: after every W
