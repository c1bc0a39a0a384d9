"""The schedule file, versions 2 and 3 (issue 25): recompute and offload ops, the copy lane with
its issue points and the policy counts round-trip; a file of a schedule without them is still
version 1, as an older schedc wrote it (tests/data/schedule_v1.json was written by schedc before
version 2), and loads; so does a version 2 file with a copy lane (tests/data/schedule_v2_copy.json,
written before version 3), read as it was written then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc.solvers as solvers
from schedc.errors import ScheduleFileError
from schedc.problem import Problem
from schedc.schedule import Op
from schedc.schedfile import CompiledSchedule, dump, load, version_of
from schedc.simulate import simulate
from schedc.solvers.families.memtime import with_policies

DATA = Path(__file__).resolve().parent / "data"


def _problem(**changes) -> Problem:
    data = {"name": "policies", "ranks": 2, "microbatches": 4, "costs": {"F": 1.0, "B": 1.0, "W": 0.5},
            "memory": {"F": 2.0, "static": 1.0},
            "recompute": {"keep": 0.5, "selective": {"time": 0.25, "keep": 1.0}}, "offload": {"time": 0.5}}
    return Problem.parse({**data, **changes})


def _compiled(name="zb-h1", chosen=None, problem=None) -> CompiledSchedule:
    problem = problem or _problem()
    chosen = {(0, 0): "R", (0, 1): "O", (1, 2): "S", (0, 3): "O"} if chosen is None else chosen
    return CompiledSchedule.build(problem, with_policies(problem, solvers.build(name, problem), chosen))


def test_an_old_version_1_file_still_loads_and_is_written_the_same_way(tmp_path):
    old = DATA / "schedule_v1.json"
    loaded = load(old)
    data = json.loads(old.read_text())
    assert data["version"] == 1 and "copy" not in data["schedule"] and "policies" not in data["timeline"]
    assert loaded.schedule.copy == () and version_of(loaded.schedule) == 1
    # Written again: the same text, but for when and how it was written.
    again = CompiledSchedule(loaded.problem, loaded.schedule, loaded.program, loaded.timeline, loaded.solver,
                             json.loads(old.read_text())["provenance"])
    assert dump(again) + "\n" == old.read_text()


def test_a_version_2_file_with_a_copy_lane_still_loads_as_it_was_written():
    old = DATA / "schedule_v2_copy.json"
    data = json.loads(old.read_text())
    assert data["version"] == 2 and "after" not in data["schedule"]
    loaded = load(old)  # its timeline and program check against the file as written
    assert loaded.schedule.copy[0] == tuple(Op(*op) for op in data["schedule"]["copy"][0])
    # then, every copy ran as early as it could: issued with the forward it needs or the copy before it
    assert loaded.schedule.after[0] == (Op("F", 0, 1), Op("F", 0, 1), Op("F", 0, 3), Op("F", 0, 3))


def test_a_schedule_that_recomputes_and_offloads_round_trips_as_version_3(tmp_path):
    compiled = _compiled()
    compiled.save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["version"] == 3
    assert data["schedule"]["copy"][0] == [["O", 0, 1], ["L", 0, 1], ["O", 0, 3], ["L", 0, 3]]
    assert data["schedule"]["copy"][1] == []
    # each reload issued after a compute op that ends when it is due, later than its offload's forward
    after = data["schedule"]["after"][0]
    assert after[0] == ["F", 0, 1] and after[2] == ["F", 0, 3] and data["schedule"]["after"][1] == []
    assert after[1] not in (["F", 0, 1], None) and after[3] not in (["F", 0, 3], None)
    assert data["timeline"]["policies"] == {"recompute": 1, "selective": 1, "offload": 2}
    loaded = load(tmp_path / "p.json")
    assert loaded.schedule == compiled.schedule
    assert loaded.timeline == compiled.timeline
    assert loaded.program == compiled.program


def test_a_schedule_without_policies_on_a_problem_that_allows_them_is_version_1(tmp_path):
    problem = _problem()
    compiled = CompiledSchedule.build(problem, solvers.build("1f1b", problem))
    compiled.save(tmp_path / "plain.json")
    assert json.loads((tmp_path / "plain.json").read_text())["version"] == 1
    assert load(tmp_path / "plain.json").schedule == compiled.schedule


def _move(instrs: list[dict], op: str, behind: str) -> None:
    """Move the first instruction ``op`` right behind the first ``behind``."""
    moved = instrs.pop(next(k for k, i in enumerate(instrs) if i["op"] == op))
    instrs.insert(next(k for k, i in enumerate(instrs) if i["op"] == behind) + 1, moved)


def _edited(tmp_path, change) -> Path:
    _compiled().save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    change(data)
    (tmp_path / "e.json").write_text(json.dumps(data))
    return tmp_path / "e.json"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["timeline"]["policies"].__setitem__("offload", 1), "timeline.policies is .* simulates to"),
    (lambda d: d["timeline"].pop("policies"), "timeline.policies is None"),
    (lambda d: d.__setitem__("version", 1), "version 1 cannot hold 'after'"),
    (lambda d: d.__setitem__("version", 2), "version 2 cannot hold 'after'"),
    (lambda d: (d.__setitem__("version", 1), d["schedule"].pop("after")), "version 1 cannot hold op R0@s0 .* need version 3"),
    (lambda d: d["schedule"]["after"][0].reverse(), "issue points follow the lane's order"),
    (lambda d: d["schedule"]["after"][0].__setitem__(0, None), "O1@s0 is issued before F1@s0, which it needs"),
    (lambda d: d["schedule"]["after"][0].__setitem__(3, ["W", 0, 3]), "L3@s0 is issued after B3@s0, which waits for it"),
    (lambda d: d["schedule"]["after"][0].__setitem__(3, ["F", 1, 0]), "not a compute op of rank 0"),
    (lambda d: d["schedule"]["after"][0].pop(), "4 copy ops but 3 issue points"),
    (lambda d: _move(d["program"][0], "L", "O"), "copy op L1@s0 is issued after F1@s0 but the schedule 'zb-h1' issues"),
    (lambda d: [d["schedule"][k][0].pop() for k in ("copy", "after")], "L3@s0"),  # an offload without its reload
    (lambda d: (d["schedule"]["copy"][0].reverse(), d["schedule"].pop("after")), "L1@s0 is issued after B1@s0, which waits"),
    (lambda d: d["schedule"]["copy"][0].reverse(), "O3@s0 is issued before F3@s0, which it needs"),
    (lambda d: [d["schedule"][k][1].append(d["schedule"][k][0].pop()) for k in ("copy", "after")], "rank 1"),
    (lambda d: d["schedule"]["ranks"][0].insert(0, ["O", 0, 2]), "runs on the copy lane, not the compute lane"),
    (lambda d: d["schedule"]["copy"][0].append(["X", 0, 0]), "schedule.copy"),
    (lambda d: d["schedule"].__setitem__("copy", [[["O", 0, 1]]] * 3), "copy lane for 3 ranks"),
    (lambda d: d.__setitem__("version", 7), "written by a newer schedc \\(schedule format version 7"),
])
def test_an_edited_version_3_file_is_refused_with_one_line(tmp_path, change, message):
    path = _edited(tmp_path, change)
    with pytest.raises(ScheduleFileError, match=message) as e:
        load(path)
    assert "\n" not in str(e.value)


def test_a_problem_without_the_section_a_policy_needs_is_refused(tmp_path):
    path = _edited(tmp_path, lambda d: d["problem"].pop("offload"))
    with pytest.raises(ScheduleFileError, match="needs the problem's 'offload' section"):
        load(path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_choice_of_policies_round_trips(tmp_path_factory, data):
    p = data.draw(st.integers(1, 3), label="ranks")
    m = data.draw(st.integers(1, 5), label="microbatches")
    name = data.draw(st.sampled_from(["1f1b", "zb-h1", "gpipe"]), label="schedule")
    problem = _problem(ranks=p, microbatches=m)
    chosen = data.draw(st.dictionaries(st.tuples(st.integers(0, p - 1), st.integers(0, m - 1)),
                                       st.sampled_from("RSO")), label="policies")
    compiled = _compiled(name, chosen, problem)
    path = tmp_path_factory.mktemp("f") / "f.json"
    compiled.save(path)
    loaded = load(path)
    assert loaded.schedule == compiled.schedule and loaded.timeline == compiled.timeline
    assert json.loads(path.read_text())["version"] == (3 if "O" in chosen.values() else 2 if chosen else 1)
    assert loaded.schedule.policy_counts() == {
        "recompute": sum(k == "R" for k in chosen.values()), "selective": sum(k == "S" for k in chosen.values()),
        "offload": sum(k == "O" for k in chosen.values())}
    assert simulate(problem, loaded.schedule).summary() == compiled.timeline.summary()


def _solved(tmp_path, policies) -> Path:
    """A file of the solved schedule, its solver statistics as ``SolveResult.summary`` writes them
    (with ``policies`` where the problem allows recompute or offload)."""
    from schedc.solvers.search.solve import SolveResult

    compiled = _compiled()
    t = compiled.timeline
    result = SolveResult(compiled.schedule, t, "feasible", t.makespan, 1.0, "given", "zb-h1", t.makespan, "cbc", 0.5, 0)
    stats = {k: v for k, v in result.summary().items() if k != "policies"}  # as a solver before them wrote
    if policies is not None:
        stats["policies"] = policies
    CompiledSchedule.build(compiled.problem, compiled.schedule, stats, timeline=t).save(tmp_path / "s.json")
    return tmp_path / "s.json"


def test_the_solvers_policy_counts_are_kept_and_checked(tmp_path):
    counts = {"recompute": 1, "selective": 1, "offload": 2}
    loaded = load(_solved(tmp_path, counts))
    assert loaded.solver["policies"] == counts
    assert "policies" not in load(_solved(tmp_path, None)).solver  # an older solver's statistics
    data = json.loads(_solved(tmp_path, counts).read_text())
    data["solver"]["policies"]["offload"] = 3
    (tmp_path / "e.json").write_text(json.dumps(data))
    with pytest.raises(ScheduleFileError, match="solver.policies is .* but the schedule simulates to"):
        load(tmp_path / "e.json")
    data["solver"]["policies"] = {"remat": 1}
    (tmp_path / "e.json").write_text(json.dumps(data))
    with pytest.raises(ScheduleFileError, match="solver.policies.remat"):
        load(tmp_path / "e.json")
