"""The fast paths that read, check and simulate large schedules (issue 40, point 4): each is held
to the slow, exact path it stands in for, on inputs built to reach both."""

from __future__ import annotations

import gc
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schedc import schedfile
from schedc.bulk import paused_collector
from schedc.errors import SchedcError
from schedc.inputs import MAX_DEPTH, _nesting, parse_json
from schedc.program import Instr, Opcode, rank_from_data
from schedc.schedule import Op, _ops

# JSON values whose strings hold what the text walk must step over: brackets, quotes, backslashes
TEXT = st.text(alphabet='[]{}"\\:,ab é\n', max_size=6)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)


def depth(value) -> int:
    """Nesting of mappings and lists, as the old walk over the parsed values counted it."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(VALUES, st.booleans())
def test_the_text_walk_counts_the_nesting_of_the_values(value, indent):
    text = json.dumps(value, indent=1 if indent else None, ensure_ascii=False)
    assert _nesting(text.encode()) == depth(value)


@pytest.mark.parametrize("levels", [MAX_DEPTH, MAX_DEPTH + 1, 500])
def test_nesting_is_bounded_with_strings_of_brackets_beside_it(levels):
    text = '{"a": "[[[\\"{{", "b": ' + "[" * levels + '"]]]\\\\"' + "]" * levels + "}"
    if levels + 1 > MAX_DEPTH:
        with pytest.raises(SchedcError, match=f"nested deeper than {MAX_DEPTH} levels"):
            parse_json(text, source="x")
    else:
        assert depth(parse_json(text, source="x")) == levels + 1


@pytest.mark.parametrize("text, refused", [
    ("[12345678901234567]", True),  # 17 digits: refused by name, as the hook always did
    ('{"a": -123456789012345678}', True),
    ("123456789012345678901234567890", True),
    ("[1234567890123456]", False),  # 16 digits: read (the models bound it)
    ("[0.12345678901234567890]", False),  # a long fraction is a float's, not an integer
    ('["12345678901234567890"]', False),  # digits in a string
])
def test_long_integers_are_refused_wherever_they_are(text, refused):
    if refused:
        with pytest.raises(SchedcError, match="digits is out of range"):
            parse_json(text, source="x")
    else:
        assert parse_json(text, source="x") == json.loads(text)


def test_duplicate_keys_are_refused_and_repeated_strings_kept_once():
    with pytest.raises(SchedcError, match="duplicate key 'op'"):
        parse_json('[{"op": "F", "op": "B"}]', source="x")
    first, second = parse_json('[{"op": "SEND"}, {"op": "SEND"}]', source="x")
    assert first["op"] is second["op"]


FIELD = st.sampled_from(["op", "stage", "mb", "tensor", "peer", "peer_stage", "other"])
ANY = st.one_of(st.sampled_from(["F", "B", "SEND", "RECV", "STEP", "act", "grad", "", "X"]), st.integers(-3, 5),
                st.booleans(), st.none(), st.floats(-2, 5), st.lists(st.integers(0, 2), max_size=2))
WRITTEN = st.fixed_dictionaries({"op": st.sampled_from(["F", "W", "SEND", "RECV", "LOCAL", "STEP"])}, optional={
    "stage": st.integers(-1, 9), "mb": st.integers(-1, 9), "tensor": st.sampled_from(["", "act", "grad"]),
    "peer": st.integers(-1, 9), "peer_stage": st.integers(-1, 9)})


MISWRITTEN = st.tuples(WRITTEN, FIELD, ANY).map(lambda t: {**t[0], t[1]: t[2]})  # one field off


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(WRITTEN, MISWRITTEN, st.dictionaries(FIELD, ANY, max_size=4), st.integers()), max_size=5))
def test_a_rank_read_at_c_speed_is_what_the_model_reads(rank):
    """Where the fast reading takes a rank, the model takes it too and reads the same instructions;
    where the model refuses it, so does the fast reading (it then leaves the rank to the model). The
    columns it keeps compare equal to those instructions and to no others."""
    columns = schedfile._as_written(rank)
    try:
        slow = rank_from_data(schedfile._RANK.validate_python(rank))
    except (ValidationError, SchedcError):
        assert columns is None
        return
    if columns is not None:  # (the same values of the same types: True == 1 and 2.0 == 2 in a tuple's ==)
        fast = schedfile._instrs(columns)
        assert [list(map(type, i)) for i in fast] == [list(map(type, i)) for i in slow] and fast == slow
        assert schedfile._same_rank(slow, columns)
        assert not schedfile._same_rank((*slow, Instr(Opcode.STEP)), columns)
        for i, instr in enumerate(slow):  # (one field of one instruction off)
            for other in (instr._replace(mb=instr.mb + 1), instr._replace(tensor="grad" if instr.tensor == "act" else "act"),
                          instr._replace(op=Opcode.RECV if instr.op != Opcode.RECV else Opcode.SEND)):
                assert not schedfile._same_rank((*slow[:i], other, *slow[i + 1:]), columns)


def test_ops_read_at_c_speed_or_one_by_one():
    assert _ops([("F", 0, 1), Op("B", 0, 1), ["W", 0, 1]]) == (Op("F", 0, 1), Op("B", 0, 1), Op("W", 0, 1))
    assert _ops([]) == ()
    with pytest.raises(SchedcError, match="unknown op kind 'X'"):
        _ops([("F", 0, 0), ("X", 0, 1)])
    with pytest.raises(TypeError):
        _ops([("F", 0, 1), ("F", 0)])


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_inside_and_as_it_was_after(enabled):
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with paused_collector():
            with paused_collector():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError), paused_collector():
            raise RuntimeError
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
