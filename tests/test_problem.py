from pathlib import Path

import pytest

from schedc import Problem, ProblemError, load_problem

EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "problems").glob("*.yaml"))


def base(**changes):
    data = dict(ranks=4, microbatches=8, costs=dict(F=1.0, B=1.0, W=1.0))
    data.update(changes)
    return data


def error_of(data) -> str:
    with pytest.raises(ProblemError) as e:
        Problem.parse(data)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_examples_cover_the_required_cases():
    problems = {p.stem: load_problem(p) for p in EXAMPLES}
    assert {"uniform", "uniform_comm", "heterogeneous", "memory_tight", "v_shape"} <= set(problems)
    assert problems["uniform_comm"].comm > 0
    f = problems["heterogeneous"].cost["F"]
    assert f[0] > f[1] and f[-1] > f[1]
    assert problems["memory_tight"].memory_limit is not None
    v = problems["v_shape"]
    assert v.chunks == 2 and v.stage_rank == (0, 1, 2, 3, 3, 2, 1, 0)


def test_scalars_broadcast_and_defaults():
    p = Problem.parse(base(chunks=2))
    assert p.n_stages == 8
    assert p.cost["BW"] == (2.0,) * 8
    assert p.mem["F"] == (1.0,) * 8 and p.mem["B"] == (-0.5,) * 8 and p.mem["W"] == (-0.5,) * 8
    assert p.stage_rank == (0, 1, 2, 3, 0, 1, 2, 3)
    assert p.rank_stages[1] == (1, 5)


@pytest.mark.parametrize(
    "placement, expected",
    [
        ("v", (0, 1, 2, 3, 3, 2, 1, 0)),
        ([0, 1, 2, 3, 3, 2, 1, 0], (0, 1, 2, 3, 3, 2, 1, 0)),
        ([[0, 7], [1, 6], [2, 5], [3, 4]], (0, 1, 2, 3, 3, 2, 1, 0)),
    ],
)
def test_placements(placement, expected):
    assert Problem.parse(base(chunks=2, placement=placement)).stage_rank == expected


@pytest.mark.parametrize(
    "data, words",
    [
        (base(microbatchs=8), ["unknown field 'microbatchs'", "did you mean 'microbatches'"]),
        (base(costs=dict(F=1, B=1, W=1, X=2)), ["unknown field 'costs.X'"]),
        (base(memory=dict(limt=3)), ["unknown field 'memory.limt'", "limit"]),
        (base(costs=dict(F=1, B=-2, W=1)), ["costs.B", "must be > 0", "-2"]),
        (base(costs=dict(F=[1, 1, 0, 1], B=1, W=1)), ["costs.F", "must be > 0", "index 2"]),
        (base(costs=dict(F="fast", B=1, W=1)), ["costs.F", "'fast'"]),
        (base(costs=dict(F=[1, 1], B=1, W=1)), ["costs.F has 2 values", "4 stages"]),
        (base(microbatches=0), ["microbatches", "got 0"]),
        (base(comm=-1), ["comm", "got -1"]),
        (base(placement="zigzag"), ["placement", "'zigzag'"]),
        (base(chunks=2, placement=[[0, 7], [1, 6], [2, 5], [3]]), ["misses stages [4]"]),
        (base(chunks=2, placement=[[0, 7], [1, 6], [2, 5], [3, 3]]), ["stage 3 appears twice"]),
        (base(chunks=2, placement=[0, 1, 2, 3, 3, 2, 1]), ["7 entries", "8 stages", "misses"]),
        (base(chunks=2, placement=[0, 0, 0, 3, 3, 2, 1, 1]), ["rank 0 3 stages"]),
        (base(placement=[0, 1, 2, 9]), ["stage 3 on rank 9"]),
        (base(memory=dict(F=2, static=10, limit=11)), ["memory.limit of rank 0 is 11", "12"]),
        (base(memory=dict(F=1, B=-0.5, W=-0.2)), ["stage 0 sum to 0.3", "memory.W to -0.5"]),
        (base(memory=dict(F=-1)), ["memory.F of stage 0 is -1"]),
        (base(memory=dict(F=1, B=-1.5)), ["B -1.5, W 0.5", "in [-1, 0]"]),
        (base(memory=dict(F=1, B=0.5)), ["B 0.5", "in [-1, 0]"]),
        (base(objective="throughput"), ["objective"]),
        (base(memory=dict(working=-0.5)), ["memory.working", "must be >= 0", "-0.5"]),
        (base(memory=dict(working=[0.1, 0.1, float("nan"), 0.1])), ["memory.working", "finite", "index 2"]),
        (base(memory=dict(working=[0.1, 0.1])), ["memory.working has 2 values", "4 stages"]),
        (base(memory=dict(working="lots")), ["memory.working", "'lots'"]),
        (base(memory=dict(F=2, static=10, working=0.5, limit=12.25)),
         ["memory.limit of rank 0 is 12.25", "12.5", "working memory 0.5"]),
        ([1, 2], ["expected a mapping"]),
    ],
)
def test_bad_input_gives_one_line_naming_the_field(data, words):
    msg = error_of(data)
    for w in words:
        assert w in msg, (w, msg)


def test_memory_limit_must_hold_every_local_stage_of_one_microbatch():
    # v = 2: rank 0 holds stages 0 and 4; one microbatch through both needs 2 activations.
    ok = Problem.parse(base(chunks=2, memory=dict(F=1, limit=2)))
    assert ok.min_memory(0) == 2
    assert "below the 2" in error_of(base(chunks=2, memory=dict(F=1, limit=1.5)))


def test_load_errors(tmp_path):
    with pytest.raises(ProblemError, match="cannot read"):
        load_problem(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("ranks: [4\n")
    with pytest.raises(ProblemError, match="not valid YAML"):
        load_problem(bad)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    with pytest.raises(ProblemError, match="not valid JSON"):
        load_problem(bad_json)


def test_json_and_yaml_load_the_same(tmp_path):
    import json

    data = base(costs=dict(F=[1, 2, 3, 4], B=2, W=1), comm=0.5)
    (tmp_path / "a.json").write_text(json.dumps(data))
    p = load_problem(tmp_path / "a.json")
    assert p.name == "a" and p.cost["F"] == (1, 2, 3, 4) and p.comm == 0.5


def test_with_changes_revalidates():
    p = Problem.parse(base(memory=dict(F=1, static=2)))
    q = p.with_changes(memory={"limit": 8}, objective="span")
    assert q.memory_limit == (8.0,) * 4 and q.memory.static == 2 and q.objective == "span"
    with pytest.raises(ProblemError, match="memory.limit"):
        p.with_changes(memory={"limit": 2.5})


def test_working_memory_per_rank_room_and_least_memory():
    # v = 2, loop: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3.
    p = Problem.parse(base(ranks=2, microbatches=4, chunks=2,
                           memory=dict(F=1, static=[3, 4], working=[0.5, 0.25, 0.125, 1], limit=10)))
    assert p.stage_working == (0.5, 0.25, 0.125, 1)
    assert p.working_memory == (0.5, 1)  # the largest of the rank's stages
    assert p.activation_room == (10 - 3 - 0.5, 10 - 4 - 1)
    assert p.activation_room_for((20, 30)) == (20 - 3 - 0.5, 30 - 4 - 1)
    assert (p.min_memory(0), p.min_memory(1)) == (3 + 0.5 + 2, 4 + 1 + 2)
    assert p.memory_scale == 1  # the largest of the deltas and working amounts
    assert p.scaled(memory=4).stage_working == tuple(4 * w for w in p.stage_working)
    assert p.scaled(memory=4).activation_room == tuple(4 * r for r in p.activation_room)


def test_working_memory_defaults_to_nothing():
    p = Problem.parse(base(memory=dict(F=2, static=1, limit=9)))
    assert p.memory.working is None and p.stage_working == (0.0,) * 4 and p.working_memory == (0.0,) * 4
    assert p.activation_room == (8.0,) * 4 and p.min_memory(0) == 3
    assert "working" not in p.model_dump(exclude_none=True)["memory"]  # files stay as they were
    assert Problem.parse(base()).activation_room is None
    assert Problem.parse(base(memory=dict(working=0.75))).working_memory == (0.75,) * 4


def test_a_copy_with_changes_is_validated_and_derives_its_views_again():
    """pydantic's model_copy(update=...) copies fields unchecked and keeps the original's cached
    views; a Problem's is validated, so its stage_rank follows the new ranks."""
    p = Problem.parse({"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": 1, "W": 1}})
    assert p.stage_rank == (0, 1)
    assert p.model_copy(update={"ranks": 3}).stage_rank == (0, 1, 2)
    assert p.model_copy() == p and p.model_copy(deep=True) == p
    with pytest.raises(ProblemError, match=r"^problem: ranks: .*greater than or equal to 1"):
        p.model_copy(update={"ranks": 0})
    with pytest.raises(ProblemError, match=r"^problem: ranks: a Problem cannot be changed in place"):
        p.ranks = 3
    assert p.ranks == 2


def test_problem_built_directly_raises_problem_error_which_is_a_value_error():
    data = {"ranks": 2, "microbatches": 4, "costs": {"F": 1, "B": -1, "W": 1}}
    with pytest.raises(ValueError) as built:
        Problem(**data)
    assert type(built.value) is ProblemError
    with pytest.raises(ProblemError) as parsed:
        Problem.parse(data)
    assert str(built.value) == str(parsed.value) == "problem: costs.B: must be > 0, got -1"
