"""``schedc plan`` (issue 41, first steps): the layer-level problem, the layouts users paste, the
bound over every cut, and the plan itself."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedc import load, simulate
from schedc.app.cli import main
from schedc.app.cli_plan import layout_exports
from schedc.errors import ProblemError
from schedc.layers import LayerProblem, load_layers
from schedc.layout import deepspeed_parts, megatron_layout, parse_megatron_layout, torchtitan_modules
from schedc.solvers import REGISTRY
from schedc.solvers.bounds import WHOLE_SINGLES, one_chunk_cut, partition_bound, whole_blocks
from schedc.solvers.search.plan import _moves, plan
from tests.exhaustive import exhaustive_optimum

HEAVY_HEAD = dict(
    name="heavy-head", ranks=2, microbatches=4, chunks=[1, 2], placements=["loop", "v"], comm=0.05,
    layers=[dict(type="E", F=0.3, B=0.3, W=0.1, activation=0.2, static=8),
            dict(type="t", count=6, F=1.0, B=1.1, W=0.9, activation=1.0, held_for_w=0.3, static=3.5),
            dict(type="L", F=3.0, B=3.3, W=2.7, activation=4.0, static=8)],
)


def test_a_stage_is_its_blocks_sums():
    lp = LayerProblem.validated(HEAVY_HEAD)
    assert len(lp.blocks) == 8 and lp.shapes == ((1, "loop"), (2, "loop"), (2, "v"))
    problem = lp.stage_problem([1, 3, 3, 1], 2, "v")
    assert problem.stage_blocks == [1, 3, 3, 1] and problem.stage_rank == (0, 1, 1, 0)
    assert problem.cost[problem.kinds[0]] == pytest.approx((0.3, 3.0, 3.0, 3.0))
    mem = problem.mem
    assert [mem[k][1] for k in ("F", "B", "W")] == pytest.approx([3.0, -2.1, -0.9])
    assert problem.static_memory == pytest.approx((8 + 8, 3.5 * 6))  # rank 0: E and L; rank 1: six t
    assert lp.module_names[1] == ("layers.0",) and lp.module_names[-1] == ("norm", "output")


@pytest.mark.parametrize("change, message", [
    (dict(layrs=[]), "unknown field 'layrs' (did you mean 'layers'?)"),
    (dict(layers=[dict(type="t", F=1, B=1, W=0)]), "layers[0].W: must be > 0, got 0"),
    (dict(layers=[dict(type="t", F=1, B=1, W=1, activation=1, held_for_w=2)]), "held_for_w 2 is above activation 1"),
    (dict(chunks=1), "the V placement holds 2 chunks per rank"),
    (dict(ranks=9), "no pipeline shape fits 8 blocks on 9 ranks"),
    (dict(placements=["bidirectional"], chunks=2), "holds one stage of each direction per rank (1 chunk)"),
    (dict(placements=["bidirectional"], chunks=1, microbatches=5), "half the microbatches: 5 is odd"),
    (dict(placements=["bidirectional"], chunks=1, ranks=3), "two ranks only where p is even, not 3"),
])
def test_a_mistake_in_the_file_is_one_line(change, message):
    with pytest.raises(ProblemError, match=None) as e:
        LayerProblem.validated({**HEAVY_HEAD, **change})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_megatron_layout_writes_deepseek_v3s_published_string():
    """Megatron-LM's own example for DeepSeek-V3 on PP16 x VPP2 (its docs, 'Custom Pipeline Model
    Parallel Layout'): embedding and 3 decoder layers, 29 stages of two decoder layers, the MTP
    layer, the loss; stage k on pipeline rank k mod 16."""
    types = ["E"] + ["t"] * 61 + ["m", "L"]
    sizes = [4] + [2] * 29 + [1, 1]
    assert megatron_layout(sizes, types) == "Et*3|(tt|)*29,m|L"
    stages = parse_megatron_layout("Et*3|(tt|)*29,m|L")
    assert [len(s) for s in stages] == sizes and "".join(stages) == "".join(types)
    assert parse_megatron_layout("E||t|L") == ["E", "", "t", "L"]  # an empty stage
    assert parse_megatron_layout("E|(t|)*3,m|m||L") == ["E", "t", "t", "t", "m", "m", "", "L"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from("EtmL"), max_size=7), min_size=1, max_size=12))
def test_megatron_layout_reads_back_what_it_writes(stages):
    """Any stages, empty ones included: the string names the same symbols per stage."""
    types = [t for stage in stages for t in stage]
    text = megatron_layout([len(s) for s in stages], types)
    assert parse_megatron_layout(text) == ["".join(s) for s in stages]
    assert set(text) <= set("EtmL|(),*0123456789")


@pytest.mark.parametrize("text, where", [("E|x", "unexpected 'x' at position 2"), ("(tt|", "'(' without its ')'"),
                                         ("t*", "'*' takes a count"), (")", "unexpected ')'")])
def test_a_layout_string_it_cannot_read_is_named(text, where):
    with pytest.raises(ProblemError, match=None) as e:
        parse_megatron_layout(text)
    assert where in str(e.value)


def test_two_directions_are_a_stage_problem_with_replicas():
    """Each direction runs half the step's microbatches; rank r holds model stage r of one and
    p - 1 - r of the other, both copies' weights; each stage's copies sum their gradients for its
    blocks' sync."""
    layers = [dict(HEAVY_HEAD["layers"][0], sync=0.1), dict(HEAVY_HEAD["layers"][1], sync=0.2),
              dict(HEAVY_HEAD["layers"][2], sync=0.4)]
    lp = LayerProblem.validated({**HEAVY_HEAD, "placements": ["loop", "bidirectional"], "layers": layers})
    assert lp.shapes == ((1, "loop"), (1, "bidirectional"), (2, "loop"))
    problem = lp.stage_problem([3, 5], 1, "bidirectional")
    assert problem.pipelines == 2 and problem.microbatches == 2 and problem.stage_blocks == [3, 5]
    assert problem.stage_rank == (0, 1, 1, 0)
    assert problem.static_memory == pytest.approx((8 + 2 * 3.5 + 4 * 3.5 + 8,) * 2)  # (both stages' weights)
    assert problem.replicas.sync == pytest.approx([0.1 + 2 * 0.2, 4 * 0.2 + 0.4])
    assert problem.cost[problem.kinds[0]] == pytest.approx((2.3, 7.0) * 2)
    exports = layout_exports(lp, [3, 5], 1, "bidirectional")
    assert exports["stage_blocks"] == [3, 5]
    assert all(exports[name].startswith("n/a: ") for name in ("megatron", "torchtitan", "deepspeed"))


def test_exports_each_framework_can_hold():
    assert deepspeed_parts([3, 2, 2]) == [0, 3, 5, 7]
    with pytest.raises(ProblemError, match="one stage per rank"):
        deepspeed_parts([3, 2, 2, 1], chunks=2)
    assert torchtitan_modules([1, 2], [("a",), ("b",), ("c", "d")]) == [["a"], ["b", "c", "d"]]
    with pytest.raises(ProblemError, match="loop placement"):
        megatron_layout([1, 1], ["E", "L"], placement="v")
    with pytest.raises(ProblemError, match="not X"):
        megatron_layout([1, 1], ["E", "X"])


def _cuts(n: int, k: int, empty: bool = False):
    """Every cut of n blocks into k contiguous stages (``empty``: stages of no block too)."""
    points = itertools.combinations_with_replacement(range(n + 1), k - 1) if empty else \
        itertools.combinations(range(1, n), k - 1)
    for cut in points:
        edges = (0, *cut, n)
        yield [b - a for a, b in zip(edges, edges[1:])]


@st.composite
def layer_problems(draw):
    p = draw(st.integers(1, 3))
    n = draw(st.integers(p * 2, p * 2 + 3))
    cost = st.floats(0.1, 3)
    layers = [dict(type=draw(st.sampled_from("EtmL")), F=draw(cost), B=draw(cost), W=draw(cost)) for _ in range(n)]
    m = draw(st.integers(1, 4))
    two = ["bidirectional"] if m % 2 == 0 and p % 2 == 0 else []  # (half the microbatches each way; p even)
    return LayerProblem.validated(dict(ranks=p, microbatches=m, chunks=[1, 2],
                                       placements=["loop", "v", *two], comm=draw(st.sampled_from([0.0, 0.3])),
                                       objective=draw(st.sampled_from(["makespan", "span"])), layers=layers))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_problems())
def test_the_bound_over_every_cut_is_below_every_cuts_schedules(lp):
    """For every shape and every cut of it: the partition bound is at most every registry
    schedule of that cut's stage problem (each an upper bound on that cut's optimum)."""
    for v, placement in lp.shapes:
        bound = partition_bound(lp, v, placement).value
        for sizes in _cuts(len(lp.blocks), lp.ranks * v):
            problem = lp.stage_problem(sizes, v, placement)
            for spec in REGISTRY.values():
                if spec.why_not(problem) is None:
                    t = simulate(problem, spec.build(problem))
                    assert bound <= t.objective_value() + 1e-9, (v, placement, sizes, spec.name)


@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_the_bound_over_every_cut_is_below_every_cuts_optimum(objective):
    """Exhaustively, on a problem small enough: p = 2, m = 2, five blocks of unequal costs."""
    lp = LayerProblem.validated(dict(ranks=2, microbatches=2, comm=0.1, objective=objective, layers=[
        dict(type="E", F=0.5, B=0.4, W=0.2), dict(type="t", F=1, B=1.2, W=0.8), dict(type="t", F=1, B=1.2, W=0.8),
        dict(type="t", F=1, B=1.2, W=0.8), dict(type="L", F=2, B=2.5, W=1.5)]))
    bound = partition_bound(lp, 1, "loop").value
    best = min(exhaustive_optimum(lp.stage_problem(sizes, 1, "loop"), time_budget=60)[0] for sizes in _cuts(5, 2))
    assert bound <= best + 1e-9


@settings(max_examples=60, deadline=None)
@given(layer_problems(), st.booleans())
def test_the_one_chunk_cut_is_the_least_over_every_cut(lp, empty):
    """The dynamic program's value is the brute-force least over the cuts of the largest stage
    term (with ``empty_stages``, over the cuts with empty stages too), and its cut attains it."""
    lp = lp.model_copy(update={"empty_stages": empty})
    blocks, m, c, p = lp.blocks, lp.microbatches, lp.comm, lp.ranks

    def largest(sizes):
        out, at = 0.0, 0
        for k, size in enumerate(sizes):
            before, mine = blocks[:at], blocks[at:at + size]
            work = m * sum(b.F + b.B + b.W for b in mine)
            if lp.objective == "span":
                out = max(out, work)
            else:
                head = sum(b.F for b in before) + k * c
                down = sum(b.B for b in before) + k * c + (max(0.0, blocks[0].W - k * c) if empty else blocks[0].W)
                out = max(out, head + work, head + m * sum(b.F + b.B for b in mine) + down)
            at += size
        return out

    value, sizes = one_chunk_cut(lp)
    assert value == pytest.approx(min(largest(s) for s in _cuts(len(blocks), p, empty)), rel=1e-12)
    assert largest(sizes) == pytest.approx(value, rel=1e-12)


@st.composite
def small_layer_problems(draw):
    p = draw(st.integers(1, 2))
    cost = st.floats(0.1, 3)
    layers = [dict(type=draw(st.sampled_from("EtmL")), F=draw(cost), B=draw(cost), W=draw(cost))
              for _ in range(draw(st.integers(1, p * 2 + 1)))]
    return LayerProblem.validated(dict(ranks=p, microbatches=draw(st.integers(1, 3)), chunks=[1, 2],
                                       placements=["loop", "v"], comm=draw(st.sampled_from([0.0, 0.3])),
                                       objective=draw(st.sampled_from(["makespan", "span"])), empty_stages=True,
                                       layers=layers))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_layer_problems())
def test_the_bound_over_every_cut_with_empty_stages_is_below_every_cuts_schedules(lp):
    """With ``empty_stages``, the cuts with stages of no block count too: the partition bound is at
    most every registry schedule of every such cut (fewer blocks than stages included)."""
    for v in (1, 2):
        for placement in ("loop", "v") if v == 2 else ("loop",):
            bound = partition_bound(lp, v, placement).value
            for sizes in _cuts(len(lp.blocks), lp.ranks * v, empty=True):
                problem = lp.stage_problem(sizes, v, placement)
                for spec in REGISTRY.values():
                    if spec.why_not(problem) is None:
                        t = simulate(problem, spec.build(problem))
                        assert bound <= t.objective_value() + 1e-9, (v, placement, sizes, spec.name)


def test_plan_moves_leave_a_stage_empty_only_where_allowed():
    work, rank_of = [1.0, 1.0, 5.0], (0, 1)  # (three blocks, two stages on two ranks)
    assert _moves([2, 1], work, rank_of, 2) == [[1, 2]]
    assert sorted(_moves([2, 1], work, rank_of, 2, empty=True)) == [[1, 2], [3, 0]]
    assert sorted(_moves([3, 0], work, rank_of, 2, empty=True)) == [[2, 1]]


def test_an_empty_stage_is_exported_where_the_format_holds_one():
    sizes, names = [2, 0, 1], [["embed"], ["layers.0"], ["norm", "output"]]
    assert [len(s) for s in parse_megatron_layout(megatron_layout(sizes, ["E", "t", "L"]))] == sizes
    with pytest.raises(ProblemError, match="stage 1 is empty: torchtitan"):
        torchtitan_modules(sizes, names)
    with pytest.raises(ProblemError, match="stage 1 is empty: DeepSpeed"):
        deepspeed_parts(sizes)


def test_plan_is_never_slower_than_its_seeds_and_its_bound_holds():
    lp = LayerProblem.validated(HEAVY_HEAD)
    result = plan(lp, time_limit=20, threads=1)
    assert result.objective <= min(c.objective for c in result.seeds) + 1e-9
    assert result.bound <= result.objective + 1e-9
    assert result.problem.stage_blocks == result.chosen.sizes
    assert {(c.chunks, c.placement, c.seed) for c in result.seeds} >= {(1, "loop", "uniform"), (2, "v", "balanced")}


def test_plan_in_two_directions_is_an_ordinary_schedule_file(tmp_path):
    lp = LayerProblem.validated({**HEAVY_HEAD, "chunks": 1, "placements": ["bidirectional"]})
    result = plan(lp, time_limit=10, threads=1)
    assert result.problem.pipelines == 2 and result.chosen.placement == "bidirectional"
    assert result.bound <= result.objective + 1e-9
    result.compiled().save(tmp_path / "plan.json")
    assert load(tmp_path / "plan.json", verify=True).timeline.objective_value() == pytest.approx(result.objective)


def test_the_cli_writes_a_schedule_file_and_the_layouts(tmp_path):
    layers = tmp_path / "layers.yaml"
    layers.write_text(yaml.safe_dump({**HEAVY_HEAD, "chunks": 1, "placements": ["loop"]}))
    out, stage = tmp_path / "plan.json", tmp_path / "stage.yaml"
    run = CliRunner().invoke(main, ["plan", str(layers), "-o", str(out), "--problem-out", str(stage),
                                    "--time-limit", "10", "--threads", "1", "--json", "-q"])
    assert run.exit_code == 0, run.output
    data = json.loads(run.output)
    compiled = load(out)
    assert compiled.problem.stage_blocks == data["stage_blocks"] == data["exports"]["stage_blocks"]
    assert data["exports"]["deepspeed"] == [0, *itertools.accumulate(data["stage_blocks"])]
    assert "".join(parse_megatron_layout(data["exports"]["megatron"])) == "E" + "t" * 6 + "L"
    assert yaml.safe_load(stage.read_text())["stage_blocks"] == data["stage_blocks"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**HEAVY_HEAD, "layers": [dict(type="t", F=1, B=1, W=-1)]}))
    run = CliRunner().invoke(main, ["plan", str(bad), "-o", str(out)])
    assert run.exit_code == 2 and "layers[0].W: must be > 0, got -1" in run.output
    stage_problem = Path(__file__).resolve().parent.parent / "examples" / "problems" / "uniform.yaml"
    run = CliRunner().invoke(main, ["plan", str(stage_problem), "-o", str(out)])
    assert run.exit_code == 2 and "a stage problem (costs per stage), not a layer-level one" in run.output


def test_the_docs_excerpt_is_the_example_file():
    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "plan.md").read_text()
    excerpt = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    example = root / "examples" / "layers" / "heavy-head.yaml"
    assert yaml.safe_load(excerpt) == yaml.safe_load(example.read_text())
    assert load_layers(example).shapes == ((1, "loop"), (2, "loop"), (2, "v"))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.lists(st.tuples(st.sampled_from([0.5, 1.0, 1.7, 2.5, 4.0]), st.integers(1, 4)),
                                   min_size=1, max_size=4))
def test_whole_blocks_is_the_least_busiest_rank_over_every_assignment(p, kinds):
    """Brute force over every assignment of the blocks to the ranks: whole_blocks is never above
    the least largest load, and equals it where nothing is merged or dropped (one repeated kind
    at most, at most WHOLE_SINGLES other blocks)."""
    layers = [dict(type="t", count=c, F=w / 3, B=w / 3, W=w / 3) for w, c in kinds]
    if sum(c for _, c in kinds) > 8 or sum(c for _, c in kinds) < p:
        return
    lp = LayerProblem.validated(dict(ranks=p, microbatches=1, layers=layers))
    works = [b.F + b.B + b.W for b in lp.blocks]
    least = min(max(sum(w for w, r in zip(works, pick) if r == q) for q in range(p))
                for pick in itertools.product(range(p), repeat=len(works)))
    value = whole_blocks(lp)
    assert value <= least + 1e-9
    counts: dict[float, int] = {}
    for w in works:
        counts[round(w, 9)] = counts.get(round(w, 9), 0) + 1
    repeated = [w for w, c in counts.items() if c >= p]
    singles = sum(c for w, c in counts.items() if c < p)
    if len(repeated) <= 1 and singles <= WHOLE_SINGLES:
        assert value == pytest.approx(least, rel=1e-9)


def test_schedc_profile_layers_writes_what_plan_reads(tmp_path):
    """Each block of the example GPT profiled alone, written as a layer-level problem, planned."""
    example = Path(__file__).resolve().parent.parent / "examples" / "train_gpt.py"
    out = tmp_path / "gpt-layers.yaml"
    run = CliRunner().invoke(main, ["profile", f"{example}:gpt", "-p", "2", "-m", "2", "--comm", "0.1", "--repeats",
                                    "1", "--layers", "-o", str(out)])
    assert run.exit_code == 0, run.output
    lp = load_layers(out)
    assert [b.type for b in lp.blocks] == ["E"] + ["t"] * (len(lp.blocks) - 2) + ["L"]
    assert all(b.F > 0 and b.B > 0 and b.W > 0 and b.static > 0 for b in lp.blocks)
    result = plan(lp, time_limit=5, threads=1)
    assert sum(result.chosen.sizes) == len(lp.blocks) and result.bound <= result.objective + 1e-9
    run = CliRunner().invoke(main, ["profile", f"{example}:gpt", "-p", "2", "-m", "2", "--layers", "-v", "2",
                                    "-o", str(out)])
    assert run.exit_code == 2 and "--layers leaves the cut, chunks and placement to `schedc plan`" in run.output


def test_a_limit_no_cut_can_meet_is_named():
    """Static memory alone above the limit on any cut: plan says so in one line, not a traceback."""
    lp = LayerProblem.validated({**HEAVY_HEAD, "memory": {"limit": 10}})  # rank 0 holds E (8) and more
    with pytest.raises(ProblemError, match="no cut of any shape tried makes a stage problem schedc accepts"):
        plan(lp, time_limit=5, threads=1)


def test_plan_with_empty_stages_cuts_fewer_blocks_than_stages(tmp_path):
    """Seven blocks on eight stages (4 ranks, 2 chunks): only a cut with an empty stage exists; the
    plan's file is checked on reading, and its bound holds over the cuts with empty stages."""
    lp = LayerProblem.validated(dict(ranks=4, microbatches=8, chunks=[2], placements=["loop"], comm=0.05,
                                     empty_stages=True, layers=[dict(type="E", F=0.3, B=0.3, W=0.1),
                                                                dict(type="t", count=5, F=1.0, B=1.1, W=0.9),
                                                                dict(type="L", F=3.0, B=3.3, W=2.7)]))
    result = plan(lp, time_limit=10, threads=1)
    assert 0 in result.chosen.sizes and sum(result.chosen.sizes) == 7
    assert result.bound <= result.objective + 1e-9
    path = tmp_path / "plan.json"
    result.compiled().save(path)
    assert load(path).problem.empty_stages == {s for s, k in enumerate(result.chosen.sizes) if k == 0}
    c = result.chosen
    exports = layout_exports(lp, c.sizes, c.chunks, c.placement)
    assert "is empty" in exports["torchtitan"] and exports["stage_blocks"] == c.sizes
    if c.placement == "loop":
        assert [len(x) for x in parse_megatron_layout(exports["megatron"])] == c.sizes
