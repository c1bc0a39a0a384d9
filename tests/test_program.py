"""Lowering (Schedule -> Program), the independent check of a Program, and the schedule file."""

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc
import schedc.solvers as solvers
from schedc import Instr, Problem, Program, ProgramError, ScheduleFileError, check, lower, simulate
from schedc.app.cli import main
from schedc.program import COMPUTE
from tests.strategies import pipeline_problems

EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "problems").glob("*.yaml"))
GPT = next(p for p in EXAMPLES if p.stem == "gpt-h200")  # one chunk per rank: every loop schedule applies


def applicable(problem):
    return [s.name for s in solvers.REGISTRY.values() if s.why_not(problem) is None]


def channels(program):
    """(src, dst) -> (the messages src sends to dst, in order; those dst receives from src, in order),
    read off the instructions directly."""
    out = {}
    for r, instrs in enumerate(program.ranks):
        for i in instrs:
            if i.op == "SEND":
                out.setdefault((r, i.peer), ([], []))[0].append((i.tensor, i.mb, i.stage, i.peer_stage))
            elif i.op == "RECV":
                out.setdefault((i.peer, r), ([], []))[1].append((i.tensor, i.mb, i.peer_stage, i.stage))
    return out


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_problems(max_microbatches=16))
def test_lowering_every_registry_schedule_gives_a_checked_program(problem):
    for name in applicable(problem):
        schedule = solvers.build(name, problem)
        program = lower(problem, schedule)
        report = check(problem, program, schedule)
        assert program.compute_order() == schedule.ranks
        for (src, dst), (sent, received) in channels(program).items():
            assert sent == received, (name, src, dst)
            assert src != dst and all(problem.stage_rank[s] == src for _, _, s, _ in sent)
        # Every cross-rank dependency is one message; every same-rank one is a LOCAL hand-off.
        crossing = sum(
            problem.stage_rank[s] != problem.stage_rank[s + 1] for s in range(problem.n_stages - 1)
        )
        units = problem.microbatches * schedule.rounds
        assert sum(report.sends) == sum(report.receives) == 2 * crossing * units
        assert sum(report.local) == 2 * (problem.n_stages - 1 - crossing) * units
        assert all(instrs[-1] == Instr("STEP") for instrs in program.ranks)
        updates = [i for instrs in program.ranks for i in instrs if i.op == "UPDATE"]
        assert len(updates) == (0 if schedule.synchronous else problem.n_stages * schedule.rounds)


def test_receives_are_posted_before_their_consumer_and_overlap_an_op():
    problem = schedc.load_problem(EXAMPLES[-1])
    for name in applicable(problem):
        program = lower(problem, solvers.build(name, problem))
        for instrs in program.ranks:
            computes = [k for k, i in enumerate(instrs) if i.op in COMPUTE]
            for k, i in enumerate(instrs):
                if i.op != "RECV":
                    continue
                user = next(j for j, u in enumerate(instrs) if u.op in ("F", "B", "BW") and u.stage == i.stage
                            and u.mb == i.mb and (u.op == "F") == (i.tensor == "act"))
                assert k < user
                # posted before the compute op that precedes its user (when there is one)
                before = [j for j in computes if j < user]
                if before:
                    assert k < before[-1], (name, str(i))


def p2(*ranks):
    return Program.from_lists(ranks)


TWO = Problem.parse(dict(ranks=2, microbatches=2, costs=dict(F=1, B=1, W=1)))


def one_f_one_b(rank1_sends_grad0_before_posting_act1: bool):
    """1F1B on two ranks, written by hand. With the flag, each rank sends before it posts the
    receive the other is about to need: a cycle under blocking sends."""
    r0 = [
        ("F", 0, 0), ("SEND", 0, 0, "act", 1, 1), ("F", 0, 1),
        ("SEND", 0, 1, "act", 1, 1), ("RECV", 0, 0, "grad", 1, 1), ("B", 0, 0), ("W", 0, 0),
        ("RECV", 0, 1, "grad", 1, 1), ("B", 0, 1), ("W", 0, 1), ("STEP",),
    ]
    if not rank1_sends_grad0_before_posting_act1:  # post the gradient receive before sending act1
        r0[3], r0[4] = r0[4], r0[3]
    r1 = [
        ("RECV", 1, 0, "act", 0, 0), ("F", 1, 0), ("B", 1, 0), ("SEND", 1, 0, "grad", 0, 0),
        ("RECV", 1, 1, "act", 0, 0), ("W", 1, 0), ("F", 1, 1), ("B", 1, 1), ("SEND", 1, 1, "grad", 0, 0),
        ("W", 1, 1), ("STEP",),
    ]
    if not rank1_sends_grad0_before_posting_act1:
        r1[3], r1[4] = r1[4], r1[3]
    return p2(r0, r1)


def test_a_send_recv_cycle_is_rejected_with_the_cycle_named():
    check(TWO, one_f_one_b(False))
    with pytest.raises(ProgramError) as e:
        check(TWO, one_f_one_b(True))
    msg = str(e.value)
    assert msg.startswith("deadlock: ")
    assert "rank 0 at instruction 3 (SEND act1 s0->s1 to rank 1) waits for rank 1 to post RECV act1 s0->s1" in msg
    assert "rank 1 at instruction 3 (SEND grad0 s1->s0 to rank 0) waits for rank 0 to post RECV grad0 s1->s0" in msg
    assert "a cycle of 2 ranks" in msg and "\n" not in msg


def test_a_cycle_through_a_waiting_compute_is_named():
    # Rank 1 waits in F0@s1 for act0, which rank 0 sends only after its own receive of grad0 arrives.
    r0 = [("F", 0, 0), ("RECV", 0, 0, "grad", 1, 1), ("B", 0, 0), ("SEND", 0, 0, "act", 1, 1), ("W", 0, 0),
          ("F", 0, 1), ("SEND", 0, 1, "act", 1, 1), ("RECV", 0, 1, "grad", 1, 1), ("B", 0, 1), ("W", 0, 1), ("STEP",)]
    with pytest.raises(ProgramError) as e:
        check(TWO, p2(r0, one_f_one_b(False).ranks[1]))
    assert str(e.value) == (
        "deadlock: rank 0 at instruction 2 (B0@s0) waits for rank 1 to run SEND grad0 s1->s0 to rank 0;"
        " rank 1 at instruction 1 (F0@s1) waits for rank 0 to run SEND act0 s0->s1 to rank 1 (a cycle of 2 ranks)"
    )


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r0, r1: r0.insert(4, r0.pop(1)),  # rank 0 sends act1 before act0; rank 1 expects act0 first
         "rank 0's send #0 to rank 1 is act1 s0->s1 but rank 1's receive #0 from rank 0 is act0 s0->s1"),
        (lambda r0, r1: r0.pop(1), "act0 s0->s1 is computed but never sent"),
        (lambda r0, r1: r1.insert(6, r1.pop(3)), "F1@s1 needs act1 s0->s1, which no earlier RECV or LOCAL on rank 1"),
        (lambda r0, r1: r0.insert(0, r0.pop(1)), "comes before the op that computes it"),
        (lambda r0, r1: r0.pop(), "must end with exactly one STEP"),
        (lambda r0, r1: r0.__setitem__(1, ("SEND", 0, 0, "act", 0, 1)), "the peer must be 1"),
        (lambda r0, r1: r0.__setitem__(0, ("F", 1, 0)), "stage 1 is placed on rank 1, not 0"),
        (lambda r0, r1: r0.__setitem__(0, ("X", 0, 0)), "unknown op 'X'"),
        (lambda r0, r1: r0.__setitem__(6, ("BW", 0, 0)), "has both BW and B/W|runs before"),
        (lambda r0, r1: r1.__setitem__(5, ("B", 1, 1)), "scheduled twice|missing"),
        (lambda r0, r1: r1.insert(0, r1.pop(2)), "B0@s1 runs before F0@s1"),
        # fields found good once on a rank hold for every microbatch in range, and only then
        (lambda r0, r1: r0.__setitem__(5, ("F", 0, 99)), "stage or microbatch outside 2 stages x"),
        (lambda r0, r1: r0.__setitem__(6, ("SEND", 0, -1, "act", 1, 1)), "stage or microbatch outside"),
    ],
)
def test_malformed_programs_are_rejected_with_what_is_wrong(edit, message):
    r0, r1 = (list(instrs) for instrs in one_f_one_b(False).ranks)
    edit(r0, r1)
    with pytest.raises(ProgramError, match=message):
        check(TWO, p2(r0, r1))


def test_program_must_follow_the_schedule_it_comes_with():
    schedule = solvers.build("1f1b", TWO)
    program = lower(TWO, schedule)
    other = solvers.build("gpipe", TWO)
    with pytest.raises(ProgramError, match="rank 0: compute op 2 is B0@s0 but the schedule 'gpipe' has F1@s0|compute op"):
        check(TWO, program, other)


# ---- the schedule file ----


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_save_load_round_trips_exactly(path, tmp_path):
    problem = schedc.load_problem(path)
    for name in applicable(problem):
        compiled = schedc.compile(problem, name)
        compiled.save(tmp_path / "s.json")
        loaded = schedc.load(tmp_path / "s.json")
        assert loaded == compiled
        assert loaded.program.for_rank(0) == compiled.program.ranks[0]
        assert loaded.timeline.summary() == simulate(problem, compiled.schedule).summary()


def test_solved_schedule_round_trips_with_its_statistics(tmp_path):
    problem = Problem.parse(dict(ranks=2, microbatches=3, costs=dict(F=[1, 2], B=[2, 1], W=[1, 1]), name="small"))
    compiled = schedc.compile(problem, "ilp", time_limit=30)
    assert compiled.solver["status"] == "optimal"
    compiled.save(tmp_path / "s.json")
    assert schedc.load(tmp_path / "s.json") == compiled


def test_a_save_stopped_mid_write_leaves_the_old_file(tmp_path, monkeypatch):
    """The file is written beside and renamed over: stopped half way (Ctrl-C, SIGTERM), the old
    file stays whole and no part is left behind."""
    problem = schedc.load_problem(next(p for p in EXAMPLES if p.stem == "uniform"))
    path = tmp_path / "s.json"
    first = schedc.compile(problem, "1f1b")
    first.save(path)
    real = Path.write_text

    def stopped(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", stopped)
    with pytest.raises(KeyboardInterrupt):
        schedc.compile(problem, "gpipe").save(path)
    monkeypatch.undo()
    assert schedc.load(path) == first
    assert [f.name for f in tmp_path.iterdir()] == ["s.json"]
    link = tmp_path / "link.json"  # (a link is written through, not replaced by a file)
    link.symlink_to(path)
    schedc.compile(problem, "gpipe").save(link)
    assert link.is_symlink() and schedc.load(path).name == "gpipe"


@pytest.fixture
def saved(tmp_path):
    problem = schedc.load_problem(next(p for p in EXAMPLES if p.stem == "v_shape"))
    path = tmp_path / "s.json"
    schedc.compile(problem, "zb-v").save(path)
    return path


def edited(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def first(instrs, op):
    return next(i for i in instrs if i["op"] == op)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["timeline"].__setitem__("makespan", 1.0), "inconsistent: timeline.makespan is 1.0 but the schedule simulates to"),
        (lambda d: d["timeline"]["peak_memory"].__setitem__(0, 0.5), "inconsistent: timeline.peak_memory"),
        (lambda d: d["problem"].__setitem__("microbatches", 7), "inconsistent: zb-v: F7@s0 is outside"),
        (lambda d: d["problem"]["costs"].__setitem__("F", 0.75), "inconsistent: timeline.makespan"),
        (lambda d: d["problem"].__setitem__("ranks", -1), "problem.ranks"),
        (lambda d: d["schedule"]["ranks"][0].reverse(), "inconsistent: zb-v: deadlock"),
        (lambda d: first(d["program"][1], "SEND").__setitem__("peer", 3), "inconsistent: rank 1 instruction"),
        (lambda d: d["program"][1][0].__setitem__("stag", 0),
         r"unknown field 'program\[1\]\[0\].stag' \(did you mean 'stage'\?\)"),
        (lambda d: d["program"][1][0].__setitem__("mb", -2), r"program\[1\]\[0\].mb: Input should be greater than or equal to -1"),
        (lambda d: d["program"][0].reverse(), "inconsistent: rank 0: the program must end with exactly one STEP"),
        (lambda d: d["program"][0].pop(0), "inconsistent: compute ops: 1 ops missing: F0@s0"),
        (lambda d: d["program"][2].insert(0, d["program"][2].pop(d["program"][2].index(first(d["program"][2], "SEND")))),
         "inconsistent: rank 2: SEND .* comes before the op that computes it"),
        (lambda d: d.__setitem__("version", 7), "written by a newer schedc \\(schedule format version 7"),
        (lambda d: d.__setitem__("version", "1"), "version must be a positive integer"),
        (lambda d: d.pop("program"), "program: Field required"),
        (lambda d: d.__setitem__("progam", []), "unknown field 'progam' \\(did you mean 'program'\\?\\)"),
        (lambda d: d.__setitem__("format", "other"), "not a schedc schedule file"),
        (lambda d: d["program"][0][0].__setitem__("op", "JUMP"), "program\\[0\\]\\[0\\].op"),
    ],
)
def test_edited_files_fail_with_one_line(saved, change, message):
    edited(saved, change)
    with pytest.raises(ScheduleFileError, match=message) as e:
        schedc.load(saved)
    assert "\n" not in str(e.value) and str(e.value).startswith(str(saved))
    result = CliRunner().invoke(main, ["check", str(saved)])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and result.output.startswith("error: ")


def test_truncated_binary_and_missing_files_fail_with_one_line(saved, tmp_path):
    text = saved.read_text()
    for cut in (10, len(text) // 2, len(text) - 3):
        saved.write_text(text[:cut])
        with pytest.raises(ScheduleFileError, match="not valid JSON, truncated or corrupt"):
            schedc.load(saved)
    import pickle

    saved.write_bytes(pickle.dumps({"format": "schedc.schedule"}))
    with pytest.raises(ScheduleFileError, match="not UTF-8|not valid JSON"):
        schedc.load(saved)
    with pytest.raises(ScheduleFileError, match="cannot read"):
        schedc.load(tmp_path / "nope.json")


def test_file_is_readable_one_instruction_per_line(saved):
    lines = saved.read_text().splitlines()
    assert '   {"op":"F","stage":0,"mb":0},' in lines
    assert any(ln.strip().startswith('{"op":"SEND","stage":0,"mb":0,"tensor":"act","peer":1,"peer_stage":1}') for ln in lines)
    data = json.loads(saved.read_text())
    assert data["format"] == "schedc.schedule" and data["version"] == 1
    assert set(data["provenance"]) == {"schedc", "command", "created"}


# ---- CLI ----


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def test_compile_check_show_simulate_export_read_the_file(tmp_path):
    problem = next(p for p in EXAMPLES if p.stem == "interleaved")
    out = tmp_path / "s.json"
    assert "wrote" in run("compile", problem, "-s", "interleaved-1f1b", "-o", out)
    report = run("check", out)
    assert "ok: interleaved-1f1b" in report and "max receive buffers" in report
    data = json.loads(run("check", out, "--json"))
    compiled = schedc.load(out)
    assert data["sends"] == list(check(compiled.problem, compiled.program).sends)
    listing = run("check", out, "--print", "--rank", "1")
    assert "rank 1:" in listing and "rank 0:" not in listing and "STEP" in listing
    by_file = json.loads(run("simulate", out, "--json"))
    by_name = json.loads(run("simulate", problem, "-s", "interleaved-1f1b", "--json"))
    assert by_file == by_name
    run("show", out, "-o", tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 0
    run("export", out, "-o", tmp_path / "s.csv")
    assert (tmp_path / "s.csv").read_text().count("\n") >= compiled.problem.ranks - 1
    schema = json.loads(run("schema"))
    assert {"format", "version", "problem", "schedule", "program", "timeline"} <= set(schema["properties"])


def test_input_kind_mistakes_are_usage_errors(tmp_path):
    problem = GPT
    out = tmp_path / "s.json"
    run("compile", problem, "-s", "1f1b", "-o", out)
    for args in (["simulate", problem], ["simulate", out, "-s", "1f1b"]):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 2 and "Traceback" not in result.output


def test_check_names_the_cycle_of_a_hand_made_program_file(tmp_path):
    import dataclasses

    program = one_f_one_b(True)
    schedule = schedc.Schedule.from_lists("by-hand", program.compute_order())
    compiled = dataclasses.replace(schedc.CompiledSchedule.build(TWO, schedule), program=program)
    compiled.save(tmp_path / "s.json")
    result = CliRunner().invoke(main, ["check", str(tmp_path / "s.json")])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "inconsistent: deadlock: rank 0 at instruction 3 (SEND act1 s0->s1 to rank 1) waits for rank 1" in result.output


# ---- recompute and offload (issue 25): R and S on the compute lane, O and L on the copy lane ----


def with_policies(schedule, policy, prefetch=1):
    """``schedule`` with ``policy`` ((stage, mb) -> "R", "S" or "O") applied: R or S right before
    the B (or BW) of its (stage, microbatch); O on the copy lane right after its F's turn, L when
    the walk of the compute lane is ``prefetch`` ops before the B (so the reload can overlap), and
    never before its O."""
    ranks, copy = [], []
    for ops in schedule.ranks:
        out, lane = [], []
        for k, op in enumerate(ops):
            if op.kind == "F" and policy.get((op.stage, op.mb)) == "O":
                lane.append(schedc.Op("O", op.stage, op.mb))
            for o in ops[k:k + prefetch + 1]:
                reload = schedc.Op("L", o.stage, o.mb)
                if o.kind in ("B", "BW") and schedc.Op("O", o.stage, o.mb) in lane and reload not in lane:
                    lane.append(reload)
            if op.kind in ("B", "BW") and policy.get((op.stage, op.mb)) in ("R", "S"):
                out.append(schedc.Op(policy[op.stage, op.mb], op.stage, op.mb))
            out.append(op)
        ranks.append(out)
        copy.append(lane)
    return schedc.Schedule.from_lists(f"{schedule.name}+policies", ranks, copy)


def with_sections(problem, keep=0.25, selective=0.5, copy_time=0.5):
    """``problem`` with recompute (full and selective) and offload sections."""
    f = problem.mem_deltas[0]
    return problem.with_changes(recompute=dict(keep=[keep * a for a in f],
                                               selective=dict(time=0.3, keep=[selective * a for a in f])),
                                offload=dict(time=copy_time))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_problems(max_microbatches=8), st.randoms(use_true_random=False))
def test_lowering_with_recompute_and_offload_gives_a_checked_program(problem, rnd):
    plain = problem
    problem = with_sections(problem)
    for name in applicable(plain)[:4]:
        base = solvers.build(name, plain)  # the registry's order, then the policies inserted
        policy = {(s, i): rnd.choice("RSO-") for s in range(problem.n_stages) for i in range(problem.microbatches)}
        schedule = with_policies(base, {k: v for k, v in policy.items() if v != "-"}, prefetch=rnd.randint(0, 2))
        timeline = simulate(problem, schedule)
        program = lower(problem, schedule, timeline)
        check(problem, program, schedule)
        assert program.compute_order() == schedule.ranks and program.copy_order() == schedule.copy
        times = timeline.op_times()
        for r, instrs in enumerate(program.ranks):
            ops = [i.compute for i in instrs if i.op in schedc.kinds.Kind]
            pos = {op: k for k, op in enumerate(ops)}
            for op, k in pos.items():
                if op.kind == "O":
                    assert pos[schedc.Op("F", op.stage, op.mb)] < k < pos[schedc.Op("L", op.stage, op.mb)]
                if op.kind == "L":
                    user = next(o for o in ops if o.kind in ("B", "BW") and (o.stage, o.mb) == (op.stage, op.mb))
                    assert k < pos[user]
                # each copy listed right after the compute op it is issued after, and starting
                # no earlier than that op's end
                if op.kind in ("O", "L"):
                    anchor = next((o for o in reversed(ops[:k]) if o.kind in COMPUTE), None)
                    assert anchor == schedule.anchors().get(op)
                    assert anchor is None or times[op][1] >= times[anchor][2] - 1e-9
        assert program.issued_after() == schedule.after
        # a schedule without policies lowers as it did before the problem allowed them
        assert lower(problem, base).ranks == lower(plain, base).ranks


def _recompute_program():
    plain = TWO.with_changes(memory=dict(F=2, B=-1))
    problem = with_sections(plain)
    schedule = with_policies(solvers.build("1f1b", plain), {(0, 0): "R", (1, 1): "S", (0, 1): "O"}, prefetch=0)
    return problem, schedule, lower(problem, schedule)


def test_lowering_places_recomputes_and_copies():
    problem, schedule, program = _recompute_program()
    listing = [str(i) for i in program.ranks[0]]
    assert listing.index("F1@s0") < listing.index("O1@s0") < listing.index("L1@s0") < listing.index("BW1@s0")
    between = listing[listing.index("R0@s0") + 1:listing.index("BW0@s0")]
    assert not [x for x in between if x.split("@")[0].rstrip("0123456789") in ("F", "B", "W", "BW", "R", "S")], between  # the R right before its BW
    assert [str(i) for i in program.ranks[1]].count("S1@s1") == 1


def _move(instrs, what, after=None, before=None):
    """Move ``what`` right after ``after`` (or right before ``before``) in the list ``instrs``."""
    instrs.remove(what)
    k = instrs.index(after) + 1 if after is not None else instrs.index(before)
    instrs.insert(k, what)


@pytest.mark.parametrize("edit, message", [
    # the B of a recomputed microbatch after its F but before its R: the program holds R, so B needs it
    (lambda r: _move(r, Instr("R", 0, 0), after=Instr("BW", 0, 0)), "BW0@s0 runs before R0@s0"),
    (lambda r: _move(r, Instr("R", 0, 0), before=Instr("F", 0, 0)), "R0@s0 runs before F0@s0"),
    (lambda r: _move(r, Instr("L", 0, 1), after=Instr("BW", 0, 1)), "L1@s0 is issued after BW1@s0, which waits for it"),
    (lambda r: _move(r, Instr("L", 0, 1), before=Instr("O", 0, 1)), "L1@s0 runs before O1@s0"),
    (lambda r: _move(r, Instr("O", 0, 1), before=Instr("F", 0, 0)), "O1@s0 is issued before F1@s0, which it needs"),
    (lambda r: r.__setitem__(r.index(Instr("O", 0, 1)), Instr("O", 1, 1)), "stage 1 is placed on rank 1, not 0"),
    (lambda r: r.remove(Instr("L", 0, 1)), "O1@s0 has no L1@s0"),
])
def test_the_checker_holds_recompute_and_offload_to_their_rules(edit, message):
    problem, schedule, program = _recompute_program()
    check(problem, program, schedule)
    r0 = list(program.ranks[0])
    edit(r0)
    with pytest.raises(ProgramError, match=message):
        check(problem, Program((tuple(r0), program.ranks[1]), program.header))


def test_the_checker_refuses_a_kind_it_does_not_know_by_name(monkeypatch):
    checker = sys.modules["schedc.check"]  # the module (schedc.check is also the function's name)
    problem, schedule, program = _recompute_program()
    monkeypatch.setattr(checker, "CHECKED", frozenset({"F", "B", "W", "BW", "R", "O", "L"}))
    with pytest.raises(ProgramError, match="the checker cannot handle op kind 'S'"):
        check(problem, program)


def test_load_checks_a_program_unlike_the_one_it_would_lower(saved):
    """A program equal to the one schedc lowers from the file's schedule cannot deadlock (the
    argument in schedc/program.py's notes): load takes it unchecked (no report); verify=True, as
    ``schedc check`` does, checks it anyway. Any other program, even a valid one, is checked in full."""
    fast, full = schedc.load(saved), schedc.load(saved, verify=True)
    assert fast.report is None and fast.program == full.program == lower(fast.problem, fast.schedule)
    assert full.report is not None and sum(full.report.sends) > 0

    def post_earlier(d):  # rank 1's first receive after a compute op posted before that op: valid, not as lowered
        instrs = d["program"][1]
        k = next(k for k in range(1, len(instrs)) if instrs[k]["op"] == "RECV" and instrs[k - 1]["op"] in COMPUTE)
        instrs[k - 1], instrs[k] = instrs[k], instrs[k - 1]

    edited(saved, post_earlier)
    moved = schedc.load(saved)
    assert moved.report is not None and moved.program != full.program
    assert moved.report.summary() == full.report.summary() and moved.timeline.summary() == full.timeline.summary()
