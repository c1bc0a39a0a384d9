"""The kinds table (schedc.kinds) and what reads it: Op's kind, printing and parsing, the
dependency rule, what an op sends, the torch letters, and the refusal of a kind a pass cannot
handle."""

import pickle

import pytest

import schedc.program as program
import schedc.solvers.bounds as bounds
from schedc.errors import ProgramError, ScheduleError
from schedc.kinds import BACKWARDS, FUSED, ROWS, SPLIT, Kind, check_supported, in_order
from schedc.problem import Problem
from schedc.program import OPCODES, Instr, Message, Opcode, consumed, lower, produced
from schedc.schedule import Op, Schedule, producers
from schedc.simulate import simulate

TWO = Problem.parse(dict(ranks=2, microbatches=2, costs=dict(F=1, B=2, W=1)))


def split_1f1b() -> Schedule:
    return Schedule.from_lists("s", [
        [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("W", 0, 0), ("B", 0, 1), ("W", 0, 1)],
        [("F", 1, 0), ("B", 1, 0), ("W", 1, 0), ("F", 1, 1), ("B", 1, 1), ("W", 1, 1)],
    ])


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("stage, mb", [(0, 0), (3, 12), (17, 5)])
def test_op_prints_what_it_parses(kind, stage, mb):
    op = Op(kind, stage, mb)
    assert str(op) == f"{kind.value}{mb}@s{stage}"
    assert Op.parse(str(op)) == op
    assert Op.parse(str(op)).kind is kind


@pytest.mark.parametrize("text", ["F0", "X1@s0", "F@s0", "f0@s1", "F0@1", "F-1@s0", ""])
def test_op_parse_refuses_what_it_does_not_print(text):
    with pytest.raises(ScheduleError):
        Op.parse(text)


def test_op_coerces_a_kind_name_and_refuses_an_unknown_one():
    op = Op("BW", 1, 2)
    assert op.kind is Kind.BW and op == Op(Kind.BW, 1, 2) and hash(op) == hash(("BW", 1, 2))
    assert op._replace(kind="W").kind is Kind.W
    assert pickle.loads(pickle.dumps(op)).kind is Kind.BW
    with pytest.raises(ScheduleError, match=r"unknown op kind 'X' in X2@s1 \(expected F, B, W, BW, R, S, RG, SG, O, L, AR, RS, TS\)"):
        Op("X", 1, 2)
    with pytest.raises(ScheduleError, match="unknown op kind"):
        Op(Kind.B, 0, 0)._replace(kind="Q")


def test_torch_letters_come_from_the_rows():
    assert [Op(k, 3, 0).to_torch() for k in Kind if ROWS[k].torch] == ["3F0", "3I0", "3W0", "3B0"]
    assert {ROWS[k].torch for k in Kind} == {"F", "I", "W", "B", None}
    for k in (Kind.R, Kind.S, Kind.O, Kind.L):  # torch's IR has no recompute or offload action
        with pytest.raises(ScheduleError, match=f"{k}0@s3: torch.distributed.pipelining has no action for {k}"):
            Op(k, 3, 0).to_torch()


def test_instr_coerces_opcode_names_and_refuses_unknown_ones():
    assert Instr("SEND", 0, 0, "act", 1, 1).op is Opcode.SEND
    assert Instr("W", 0, 0).op is Kind.W
    assert Instr("STEP")._replace(op="RECV").op is Opcode.RECV
    assert [str(o) for o in OPCODES] == ["F", "B", "W", "BW", "R", "S", "RG", "SG", "O", "L", "AR", "RS", "TS", "SEND", "RECV", "LOCAL", "STEP", "UPDATE"]
    with pytest.raises(ProgramError, match="unknown op 'NOP'"):
        Instr("NOP")


def test_producers_follow_the_rows_needs():
    n = 3
    assert producers(Op("F", 0, 1), n) == []
    assert producers(Op("F", 2, 1), n) == [Op("F", 1, 1)]
    assert producers(Op("W", 1, 1), n) == [Op("B", 1, 1)]
    assert producers(Op("B", 2, 0), n) == [Op("F", 2, 0)]
    assert producers(Op("B", 1, 0), n) == [Op("F", 1, 0), Op("B", 2, 0)]
    fused = {Op("BW", 2, 0): (0, 0)}
    assert producers(Op("BW", 1, 0), n, fused) == [Op("F", 1, 0), Op("BW", 2, 0)]
    assert producers(Op("BW", 1, 0), n, {Op("B", 2, 0): (0, 0)}) == [Op("F", 1, 0), Op("B", 2, 0)]
    for kind in Kind:  # every producer is an op kind, every dependency within the pipeline
        for s in range(n):
            assert all(isinstance(d.kind, Kind) and 0 <= d.stage < n for d in producers(Op(kind, s, 0), n))


def test_what_a_compute_op_sends_and_receives_is_its_rows_carries():
    n = 3
    assert produced(Op("F", 0, 1), n) == Message("act", 1, 0, 1)
    assert produced(Op("F", 2, 1), n) is None
    assert produced(Op("B", 2, 1), n) == Message("grad", 1, 2, 1)
    assert produced(Op("BW", 0, 1), n) is None
    assert produced(Op("W", 1, 1), n) is None
    assert consumed(Op("F", 1, 0), n) == Message("act", 0, 0, 1)
    assert consumed(Op("B", 1, 0), n) == Message("grad", 0, 2, 1)
    assert consumed(Op("W", 1, 0), n) is None


def test_the_derived_sets_and_orders():
    assert in_order(BACKWARDS) == (Kind.B, Kind.BW)
    assert in_order(SPLIT) == (Kind.B, Kind.W) and in_order(FUSED) == (Kind.BW,)
    assert in_order({Kind.BW, Kind.F}) == (Kind.F, Kind.BW)
    assert TWO.cost[Kind.BW] == (3.0, 3.0) and TWO.cost["BW"] == TWO.cost[Kind.BW]
    assert TWO.mem[Kind.BW] == tuple(b + w for b, w in zip(TWO.mem[Kind.B], TWO.mem[Kind.W]))
    assert set(TWO.cost) == {Kind.F, Kind.B, Kind.W, Kind.BW} == set(TWO.mem) == set(TWO.kinds)


def test_a_kind_a_pass_cannot_handle_is_refused_by_name(monkeypatch):
    with pytest.raises(ValueError, match="the thing cannot handle op kind 'W' \\(it handles F, B\\)"):
        check_supported([Kind.F, Kind.W], "the thing", frozenset({Kind.B, Kind.F}))
    check_supported([Kind.F], "the thing", (Kind.F,))

    monkeypatch.setattr(program, "LOWERED", frozenset({Kind.F, Kind.B, Kind.BW}))
    with pytest.raises(ValueError, match="lowering cannot handle op kind 'W'"):
        lower(TWO, split_1f1b())

    monkeypatch.setattr(bounds, "BOUNDED", (Kind.F, Kind.B, Kind.W))
    with pytest.raises(ValueError, match="the lower bounds cannot handle op kind 'BW'"):
        bounds.lower_bound(TWO)


def test_split_and_fused_schedules_still_simulate_and_lower():
    timeline = simulate(TWO, split_1f1b())
    assert timeline.makespan > 0 and split_1f1b().split_backward
    program = lower(TWO, split_1f1b(), timeline)
    assert program.compute_order() == split_1f1b().ranks
    assert all(isinstance(i.op, (Kind, Opcode)) for instrs in program.ranks for i in instrs)
