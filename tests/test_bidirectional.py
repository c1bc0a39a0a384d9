"""Replicas: pipelines in opposite directions on the same ranks (Chimera, DualPipe), their gradient
sums RS (a collective of the ranks that hold a model stage's copies), and the schedules, bounds,
lowering, checker and schedule file that know them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedc
from schedc.check import check
from schedc.errors import ProblemError, ProgramError, ScheduleFileError
from schedc.kinds import Kind
from schedc.problem import Problem
from schedc.program import Instr, Program, lower
from schedc.schedule import Op, comm_lane, members
from schedc.simulate import simulate
from schedc.solvers.bounds import lower_bound
from schedc.solvers.registry import REGISTRY, build, evaluate
from tests.exhaustive import exhaustive_optimum
from tests.test_ilp_model import assert_models_meet_the_oracle, dualpipe_own


def _bidir(p=4, m=2, **extra) -> Problem:
    return Problem.parse({"ranks": p, "microbatches": m, "costs": {"F": 1, "B": 1, "W": 1}, "replicas": 2, **extra})


def test_replicas_place_the_second_pipeline_mirrored_and_tile_per_stage_lists():
    p = _bidir(costs={"F": [1, 2, 3, 4], "B": 1, "W": 1}, replicas={"count": 2, "sync": [1, 2, 3, 4]})
    assert p.n_stages == 8 and p.pipeline_stages == 4 and p.pipelines == 2
    assert p.stage_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert p.rank_stages[0] == (0, 7)  # model stage 0 of one direction, model stage 3 of the other
    assert p.cost["F"] == (1, 2, 3, 4) * 2 and p.cost["RS"] == (1, 2, 3, 4) * 2
    assert p.sync_groups["replicas"] == ((3, 7), (2, 6), (1, 5), (0, 4))  # in the one order: the later first
    v = Problem.parse({"ranks": 2, "microbatches": 2, "chunks": 2, "placement": "v", "replicas": 2,
                       "costs": {"F": 1, "B": 1, "W": 1}})
    assert v.stage_rank == (0, 1, 1, 0, 1, 0, 0, 1)  # the V, and the V mirrored
    # A microbatch holds the stages of its own pipeline only: the least memory is one pipeline's pass.
    assert _bidir().min_memory(0) == Problem.parse({"ranks": 4, "microbatches": 2, "costs": {"F": 1, "B": 1, "W": 1}}).min_memory(0)
    assert p.scaled(time=2).cost["RS"] == (2, 4, 6, 8) * 2


@pytest.mark.parametrize("change, message", [
    ({"ranks": 3}, "two copies of model stage 1 .stages 1, 4. on rank 1"),
    ({"replicas": 1}, "replicas.count: Input should be greater than or equal to 2"),
    ({"replicas": {"count": 2, "sync": -1}}, "replicas.sync: must be >= 0"),
    ({"replicas": {"count": 2, "snyc": 1}}, "unknown field 'replicas.snyc' .did you mean 'sync'"),
    ({"placement": [0, 1, 2, 3]}, "placement has 4 entries but there are 8 stages .ranks 4 x chunks 1 x replicas 2"),
    ({"costs": {"F": [1, 2, 3], "B": 1, "W": 1}}, "costs.F has 3 values but there are 8 stages"),
])
def test_bad_replicas_are_refused_in_one_line(change, message):
    data = {"ranks": 4, "microbatches": 2, "costs": {"F": 1, "B": 1, "W": 1}, "replicas": 2, **change}
    with pytest.raises(ProblemError, match=message) as e:
        Problem.parse(data)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("d", [2, 4, 6, 8])
@pytest.mark.parametrize("per_direction", [1, 2])
def test_chimera_meets_its_published_bubble(d, per_direction):
    """Chimera (Li and Hoefler, SC'21): D stages, N = k * D microbatches in all (N / 2 each way),
    forward and (fused) backward of equal cost: each rank idles D - 2 forward times, so the
    iteration takes 2N + D - 2, against 1F1B's 2N + 2(D - 1) on the same N."""
    n = per_direction * d
    both = Problem.parse({"ranks": d, "microbatches": n // 2, "costs": {"F": 1, "B": 0.5, "W": 0.5}, "replicas": 2})
    t = simulate(both, build("chimera", both))
    assert t.makespan == 2 * n + d - 2
    one = Problem.parse({"ranks": d, "microbatches": n, "costs": {"F": 1, "B": 0.5, "W": 0.5}})
    assert simulate(one, build("1f1b", one)).makespan == 2 * n + 2 * (d - 1)
    # Its memory: the p + 1 activations DualPipe and Chimera are known for (p where each way has fewer).
    assert max(t.peak_activation) == min(d + 1, d + n // 2 - 1) or max(t.peak_activation) <= d + 1
    assert simulate(both, build("bidir-zb", both)).makespan <= t.makespan


def test_one_pipeline_schedules_refuse_replicas_and_the_bidirectional_ones_need_them():
    both, one = _bidir(), Problem.parse({"ranks": 4, "microbatches": 2, "costs": {"F": 1, "B": 1, "W": 1}})
    reasons = {e.name: e.reason for e in evaluate(both)}
    assert reasons["chimera"] is None and reasons["bidir-zb"] is None
    assert reasons["1f1b"] == "runs one pipeline, and the problem has 2 (replicas)"
    assert all(REGISTRY[n].why_not(one) for n in ("chimera", "bidir-zb"))
    with pytest.raises(schedc.ScheduleError, match="needs replicas"):
        build("chimera", one)


def test_the_copies_of_a_stage_sum_their_gradients_together_after_both_weight_gradients():
    p = _bidir(replicas={"count": 2, "sync": [1, 2, 3, 4]})
    schedule = build("bidir-zb", p)
    t = simulate(p, schedule)
    times = t.op_times()
    ends = {op: e for op, (_, _, e) in times.items()}
    for group in p.sync_groups["replicas"]:
        starts = {times[Op("RS", s, 0)][1] for s in group}
        assert len(starts) == 1  # every member starts at once
        last_w = max(ends[Op("W", s, i)] for s in group for i in range(p.microbatches))
        assert starts.pop() >= last_w
    # On every rank the collectives come in one order (the model's later stage first).
    for ops in comm_lane(p, schedule):
        model = [op.stage % 4 for op, _ in ops]
        assert model == sorted(model, reverse=True)
    assert t.makespan == max(t.rank_end) and t.makespan > max(e[-1] for e in t.end)


def test_the_checker_refuses_collectives_issued_in_two_orders():
    p = _bidir(replicas={"count": 2, "sync": 1})
    schedule = build("chimera", p)
    program = lower(p, schedule)
    assert check(p, program, schedule).instructions
    ranks = [list(instrs) for instrs in program.ranks]
    # Rank 0 holds model stages 0 and 3, as rank 3 does: move its first sync (model stage 3's) after
    # its second, and the two ranks wait for each other forever.
    k = [i for i, instr in enumerate(ranks[0]) if instr.op == "RS"]
    ranks[0].insert(k[1], ranks[0].pop(k[0]))
    with pytest.raises(ProgramError, match="deadlock on the communication lanes"):
        check(p, Program.from_lists(ranks, program.header))
    ranks = [list(instrs) for instrs in program.ranks]
    ranks[1] = [i for i in ranks[1] if i.op != "RS"]
    with pytest.raises(ProgramError, match=r"no RS \(replica gradient sum\) of stage"):
        check(p, Program.from_lists(ranks, program.header))
    plain = Problem.parse({"ranks": 4, "microbatches": 2, "costs": {"F": 1, "B": 1, "W": 1}})
    one = lower(plain, build("1f1b", plain))
    ranks = [list(instrs) for instrs in one.ranks]
    ranks[0].insert(len(ranks[0]) - 1, Instr("RS", 0, 0))
    with pytest.raises(ProgramError, match="needs the problem's replicas section"):
        check(plain, Program.from_lists(ranks, one.header))


def test_the_schedule_file_keeps_replicas_as_version_5(tmp_path):
    compiled = schedc.compile(_bidir(replicas={"count": 2, "sync": 0.5}, data_parallel={"degree": 2, "reduce": 1}),
                              "bidir-zb")
    path = tmp_path / "b.json"
    compiled.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 5 and data["problem"]["replicas"] == {"count": 2, "sync": 0.5}
    loaded = schedc.load(path)
    assert loaded.timeline.makespan == compiled.timeline.makespan
    assert loaded.program.header.pipelines == 2 and loaded.program.header.pipeline_stages == 4
    data["version"] = 4
    path.write_text(json.dumps(data))
    with pytest.raises(ScheduleFileError, match="cannot hold a problem with replicas .version 5 does"):
        schedc.load(path)


def test_bounds_hold_against_the_exhaustive_optimum_of_small_bidirectional_problems():
    """Sync 0 (the oracle does not model RS): the bound never passes the optimum."""
    cases = [
        {"ranks": 2, "microbatches": 2, "costs": {"F": 1, "B": 1, "W": 1}},
        {"ranks": 2, "microbatches": 1, "costs": {"F": [1, 3], "B": [2, 1], "W": 1}, "comm": 1},
        {"ranks": 2, "microbatches": 2, "costs": {"F": [2, 1], "B": 1, "W": [1, 2]}, "memory": {"limit": 3}},
    ]
    for data in cases:
        p = Problem.parse({**data, "replicas": 2})
        best, _ = exhaustive_optimum(p, time_budget=60)
        bound = lower_bound(p).value
        assert bound <= best + 1e-9, (data, bound, best)
        found = min(simulate(p, build(n, p)).makespan for n in ("chimera", "bidir-zb"))
        assert best <= found + 1e-9


@settings(max_examples=25, deadline=None)
@given(p=st.sampled_from([2, 4]), m=st.integers(1, 4), f=st.lists(st.integers(1, 3), min_size=4, max_size=4),
       sync=st.sampled_from([0, 1]), reduce=st.sampled_from([None, 0.5, 2]), comm=st.sampled_from([0, 0.5]))
def test_bidirectional_schedules_lower_check_and_stay_above_the_bound(p, m, f, sync, reduce, comm):
    data = {"ranks": p, "microbatches": m, "costs": {"F": f[:p], "B": 1, "W": 1}, "comm": comm,
            "replicas": {"count": 2, "sync": sync}}
    if reduce is not None:
        data["data_parallel"] = {"degree": 2, "reduce": reduce}
    problem = Problem.parse(data)
    bound = lower_bound(problem).value
    # (dualpipe: its pairs without costs.FB, each lasting its two ops, lowered and checked as well)
    for name in ("chimera", "bidir-zb") + (("dualpipe",) if m >= p else ()):
        schedule = build(name, problem)
        t = simulate(problem, schedule)
        assert t.makespan >= bound - 1e-9
        check(problem, lower(problem, schedule, t), schedule)


def test_torch_export_refuses_two_directions_in_one_line(tmp_path):
    from click.testing import CliRunner

    from schedc.app.cli import main
    from schedc.interop import torch_comms_rows

    example = Path(__file__).resolve().parent.parent / "examples/problems/bidirectional.yaml"
    result = CliRunner().invoke(main, ["export", str(example), "-s", "chimera",
                                       "-o", str(tmp_path / "c.csv")])
    assert result.exit_code == 2 and not (tmp_path / "c.csv").exists()
    assert "chimera: torch.distributed.pipelining runs one pipeline, and this schedule runs 2 (replicas)" in result.output
    with pytest.raises(schedc.ScheduleError, match="runs one pipeline"):
        torch_comms_rows(schedc.compile(_bidir(), "chimera").program)


def tiny_replica_problems(count=8, seed=5):
    """Two directions on 2 ranks, one microbatch each way (with the sums the exhaustive search may
    not prune by dominance, and two microbatches take it minutes): random costs per model stage,
    gradient sums of 0 to 3, some with data-parallel reduces too."""
    rng = random.Random(seed)
    out = []
    for k in range(count):
        m = 1
        data = dict(ranks=2, microbatches=m, comm=rng.choice([0, 0.5, 1]),
                    costs={kind: [rng.randint(1, 3) for _ in range(2)] for kind in "FBW"},
                    replicas=dict(count=2, sync=[rng.choice([0, 1, 2, 3]) for _ in range(2)]))
        if k % 3 == 2:
            data["data_parallel"] = dict(degree=2, reduce=rng.choice([1, 2]), overlap=rng.random() < 0.7)
        out.append(pytest.param(Problem.parse(data), id=f"{k}-m{m}"))
    return out


@pytest.mark.parametrize("problem", tiny_replica_problems())
def test_the_models_with_replica_sums_equal_the_exhaustive_search(problem):
    """The exhaustive search times the sums on its own (every rank of a group at once, one order on
    every rank): see ``assert_models_meet_the_oracle``."""
    assert_models_meet_the_oracle(problem)


@pytest.mark.parametrize("d", [2, 4, 6, 8, 10])
@pytest.mark.parametrize("extra", [0, 1, "d"])
def test_dualpipe_meets_its_published_bubble_and_memory(d, extra):
    """DualPipe (DeepSeek-V3, its README's table): p ranks, m >= p microbatches per direction, each
    rank idles (p/2 - 1)(F&B + B - 3W), where DualPipe's B is the FULL backward and F&B a forward
    overlapped with a full backward. In schedc's notation (B the input gradient, FB a forward
    overlapped with a B: F&B = FB + W, full backward B + W) that is (p/2 - 1)(FB + B - W), FB = F + B
    by default (no overlap gain). On costs with F = B >= W, with and without costs.FB: the ranks
    with the most overlapped pairs idle exactly that (every rank without costs.FB, where a pair
    saves nothing), and every rank holds p + 1 microbatches' activations at most."""
    m = d + (d if extra == "d" else extra)
    for F, B, W, FB in ((2, 2, 1, None), (1, 1, 0.5, None), (1, 1, 1, None), (3, 3, 1, None),
                        (2, 2, 1, 3), (1, 1, 1, 1.5), (3, 3, 2, 4)):
        costs = {"F": F, "B": B, "W": W, **({"FB": FB} if FB is not None else {})}
        p = Problem.parse({"ranks": d, "microbatches": m, "costs": costs, "replicas": 2})
        t = simulate(p, build("dualpipe", p))
        published = (d / 2 - 1) * ((F + B if FB is None else FB) + B - W)
        assert max(t.idle()) == pytest.approx(published), (F, B, W, FB)
        if FB is None:  # no pair saves time: every rank busy 2m(F + B + W), idle the same
            assert t.makespan - 2 * m * (F + B + W) == pytest.approx(published)
            assert t.idle() == pytest.approx([published] * d)
        assert max(t.peak_activation) == d + 1
    assert "needs an even number of ranks" in REGISTRY["dualpipe"].why_not(_bidir(p=3, placement=[0, 1, 2, 1, 2, 0]))
    assert "at least as many microbatches per direction" in REGISTRY["dualpipe"].why_not(_bidir(p=4, m=3))


@pytest.mark.parametrize("m", [8, 9, 16])
def test_dualpipe_idles_as_its_figure_on_its_figures_costs(m):
    """DualPipe's figure (8 ranks; forward, backward and weight cells of one width: in schedc's
    notation F = B = W = 1, no costs.FB): each pair of a forward and a full backward waits for
    both inputs, as the reference's, so each rank idles (8/2 - 1)(F + B + B - W) = 6, not the 3
    of the same orders without pairs (a baseline flattered by half)."""
    p = Problem.parse({"ranks": 8, "microbatches": m, "costs": {"F": 1, "B": 1, "W": 1}, "replicas": 2})
    schedule = build("dualpipe", p)
    t = simulate(p, schedule)
    assert t.idle() == pytest.approx([6] * 8)
    # The reference's pairs: two per main-loop round (step 4; the middle ranks run their first apart)
    # and one per step 5.
    hr = [min(r, 7 - r) for r in range(8)]
    assert [len(x) for x in schedule.pairs] == [2 * (m - 8 + h + 1) - (r in (3, 4)) + (4 - h - 1)
                                                for r, h in enumerate(hr)]
    unpaired = simulate(p, schedc.Schedule.from_lists("unpaired", schedule.ranks))
    assert max(unpaired.idle()) == pytest.approx(3)


# BitPipe's published figure (its repository's BitPipe-v.svg): 4 ranks, microbatches 1 and 2 down,
# 3 and 4 up; "F13" is the forward of microbatch 3 on its first leg of the V, "B24" the backward on its
# second. Per rank, the order of the compute lane.
BITPIPE_FIGURE = (
    "F11 F12 F13 F23 F14 F24 F21 B21 F22 B22 B23 B13 B24 B14 B11 B12",
    "F11 F13 F12 F14 F23 F21 F24 F22 B21 B23 B22 B24 B13 B11 B14 B12",
    "F13 F11 F14 F12 F21 F23 F22 F24 B23 B21 B24 B22 B11 B13 B12 B14",
    "F13 F14 F11 F21 F12 F22 F23 B23 F24 B24 B21 B11 B22 B12 B13 B14",
)


def _bitpipe(d, m, **extra) -> Problem:
    return Problem.parse({"ranks": d, "microbatches": m, "chunks": 2, "placement": "v", "replicas": 2,
                          "costs": {"F": 1, "B": 1, "W": 1}, **extra})


@pytest.mark.parametrize("d", [2, 4, 6, 8, 16])
def test_bitpipe_reproduces_its_published_figure(d):
    """BitPipe (Wu et al. 2024): two V-shaped pipelines (each rank holds two chunks of each
    direction), fused backward twice the forward. With d microbatches in all (one round), the
    published figure's order on 4 ranks, and each rank idles 2 (d - 2) forward times (the figure:
    28 against 24 of work); the activations of 2d chunks at most."""
    p = _bitpipe(d, d // 2)
    schedule = build("bitpipe", p)
    t = simulate(p, schedule)
    work = 2 * 2 * (d // 2) * 3
    assert t.makespan - work == 2 * (d - 2)
    assert max(t.peak_activation) <= 2 * d
    if d == 4:
        def name(op):
            pipeline, j = divmod(op.stage, p.pipeline_stages)
            return f"{'F' if op.kind is Kind.F else 'B'}{1 + (j >= d)}{op.mb + 1 + 2 * pipeline}"
        assert tuple(" ".join(map(name, ops)) for ops in schedule.ranks) == BITPIPE_FIGURE
        assert t.makespan == 28


@pytest.mark.parametrize("d, m", [(2, 3), (4, 4), (4, 6), (6, 6)])
def test_bitpipe_lowers_checks_and_stays_above_the_bound(d, m):
    p = _bitpipe(d, m, comm=0.5, data_parallel={"degree": 2, "reduce": 1})
    schedule = build("bitpipe", p)
    t = simulate(p, schedule)
    assert t.makespan >= lower_bound(p).value - 1e-9
    check(p, lower(p, schedule, t), schedule)


def test_bitpipe_refuses_what_it_cannot_run():
    why = REGISTRY["bitpipe"].why_not
    assert "two chunks per rank" in why(_bidir())
    assert "multiple of ranks / 2" in why(_bitpipe(4, 3))
    assert "V placement" in why(_bitpipe(2, 2, placement="loop"))
    assert why(_bitpipe(4, 2)) is None


def test_the_critical_path_knows_that_a_sum_waits_for_its_copies():
    """The DAG the critical path is read from links each RS to what its members on other ranks wait
    for (their issue points and lane), so the chain explains the whole makespan."""
    from schedc.critical import critical_path, waits_of

    for sync in (0.5, [3, 0.5]):
        p = Problem.parse({"ranks": 2, "microbatches": 2, "costs": {"F": [1, 2], "B": 1, "W": 1},
                           "replicas": {"count": 2, "sync": sync}})
        for name in ("bidir-zb", "chimera"):
            t = simulate(p, build(name, p))
            before = waits_of(t)
            for op in (Op("RS", s, 0) for s in range(4)):
                partner = members(p, op)[0]
                together = [a for a, w in before(op).items() if w.kind == "together"]
                assert t.anchors()[partner] in together
            chain = critical_path(t)
            assert chain.value == pytest.approx(t.makespan) and chain.ops[-1].kind is Kind.RS


def _overlapped(fb, p=4, m=8, **extra):
    return Problem.parse({"ranks": p, "microbatches": m, "costs": {"F": 2, "B": 2, "W": 1, **({"FB": fb} if fb is not None else {})},
                          "replicas": 2, **extra})


def test_costs_fb_is_per_rank_and_scales_with_time():
    p = _overlapped([3, 3, 3.5, 3])
    assert p.overlap_time == (3, 3, 3.5, 3) and p.overlap_cheaper
    assert p.scaled(time=2).overlap_time == (6, 6, 7, 6)
    assert p.pair_time(0, Kind.B, 7) == 3 and p.pair_time(0, Kind.BW, 7) == 3 + 1
    assert _overlapped(None).pair_time(0, Kind.BW, 7) == 2 + 3
    assert not _overlapped(4).overlap_cheaper  # the pair as long as its two ops
    for fb, message in [([3, 3], "costs.FB has 2 values but there are 4 ranks"), (0, "costs.FB: must be > 0")]:
        with pytest.raises(ProblemError, match=message):
            _overlapped(fb)


def test_an_overlapped_pair_starts_when_both_may_and_ends_together():
    p = _overlapped(3)
    schedule = build("dualpipe", p)
    assert schedule.pairs and all(schedule.pairs)
    t = simulate(p, schedule)
    times = t.op_times()
    for forward, backward in schedule.paired().items():
        (_, fs, fe), (_, bs, be) = times[forward], times[backward]
        assert fs == bs and fe == be == pytest.approx(fs + p.pair_time(forward.stage, backward.kind, backward.stage))
    work = {r: sum(p.cost[op.kind][op.stage] for op in ops) for r, ops in enumerate(schedule.ranks)}
    saved = {r: sum(p.cost[Kind.F][f.stage] + p.cost[b.kind][b.stage] - p.pair_time(f.stage, b.kind, b.stage)
                    for f, b in schedule.paired().items() if f in schedule.ranks[r]) for r in work}
    assert t.busy == pytest.approx([work[r] - saved[r] for r in work])  # each pair counted once
    # Without costs.FB the same pairs, each waiting for both inputs and lasting its two ops (the
    # reference with a module that cannot overlap them: both received first, both sent after).
    plain = _overlapped(None)
    unoverlapped = build("dualpipe", plain)
    assert unoverlapped.pairs == schedule.pairs and unoverlapped.ranks == schedule.ranks
    times = simulate(plain, unoverlapped).op_times()
    for forward, backward in unoverlapped.paired().items():
        (_, fs, fe), (_, bs, be) = times[forward], times[backward]
        assert fs == bs and fe == be == pytest.approx(fs + plain.cost[Kind.F][forward.stage] + plain.cost[backward.kind][backward.stage])
    faster = [simulate(q, build("dualpipe", q)).makespan for q in (_overlapped(4), _overlapped(3), _overlapped(2))]
    assert faster == sorted(faster, reverse=True) and faster[0] > faster[-1]


def test_bounds_stay_below_schedules_with_overlapped_pairs():
    for fb in (4, 3, 2, 1):
        p = _overlapped(fb, replicas={"count": 2, "sync": 0.5})
        bound = lower_bound(p).value
        for name in ("dualpipe", "chimera", "bidir-zb"):
            assert bound <= simulate(p, build(name, p)).makespan + 1e-9
        assert bound <= lower_bound(_overlapped(None, replicas={"count": 2, "sync": 0.5})).value + 1e-9


def test_the_first_backward_term_proves_a_schedule_optimal_on_dualpipes_own_problem():
    """A middle rank waits a round trip of each direction for its first backward; the forwards it
    can run by then are unpaired, so at p = 4 no schedule ends before 70 (and at p = 8 before 142).
    The schedule in tests/data (CP-SAT's in 300 s) ends at 70: proven optimal, with 1.43 % of
    bubble against DualPipe's 5.48 % (73)."""
    problem = dualpipe_own(4)
    bound = lower_bound(problem)
    assert bound.value == 70 and "no backward reaches it before 10" in bound.reason
    assert lower_bound(dualpipe_own(8)).value == 142
    best = schedc.load(Path(__file__).parent / "data" / "dualpipe_p4_optimal.json")
    assert best.problem.model_dump(exclude={"name"}) == problem.model_dump(exclude={"name"})
    t = simulate(problem, best.schedule)
    dualpipe = simulate(problem, build("dualpipe", problem))
    assert t.fits and t.makespan == 70 and dualpipe.makespan == 73
    assert t.bubble_rate() < dualpipe.bubble_rate() / 2


@settings(max_examples=12, deadline=None)
@given(f=st.lists(st.sampled_from([1, 2, 3]), min_size=2, max_size=2), b=st.sampled_from([1, 2, 3]),
       w=st.sampled_from([1, 2]), fb=st.sampled_from([1, 2.5, 3, 4]), comm=st.sampled_from([0, 0.5]),
       limit=st.sampled_from([None, 2, 3]), objective=st.sampled_from(["makespan", "span"]))
def test_bounds_with_pairs_never_pass_the_exhaustive_optimum_of_two_directions(f, b, w, fb, comm, limit, objective):
    """Two directions on 2 ranks, one microbatch each way, overlapped pairs: every order and every
    choice of pairs enumerated (``pair_optimum``); the bound, the first-backward term among its
    terms, stays at or below the best."""
    from tests.exhaustive import pair_optimum

    data = {"ranks": 2, "microbatches": 1, "costs": {"F": f, "B": b, "W": w, "FB": fb}, "comm": comm,
            "replicas": 2, "objective": objective}
    if limit is not None:
        data["memory"] = {"F": 1, "limit": limit}
    problem = Problem.parse(data)
    best, _ = pair_optimum(problem)
    assert lower_bound(problem).value <= best + 1e-9


@settings(max_examples=20, deadline=None)
@given(p=st.sampled_from([2, 4]), m=st.integers(2, 6), f=st.lists(st.sampled_from([1, 2, 3]), min_size=4, max_size=4),
       fb=st.sampled_from([None, 1.5, 3, 5]), comm=st.sampled_from([0, 0.5]), objective=st.sampled_from(["makespan", "span"]))
def test_the_first_backward_term_stays_below_every_two_direction_schedule(p, m, f, fb, comm, objective):
    """On random two-direction problems, with and without overlapped pairs, the bound (the
    first-backward term among its terms) stays at or below every two-direction schedule."""
    costs = {"F": f[:p], "B": 2, "W": 1, **({"FB": fb} if fb is not None else {})}
    problem = Problem.parse({"ranks": p, "microbatches": m, "costs": costs, "comm": comm, "replicas": 2,
                             "objective": objective})
    bound = lower_bound(problem).value
    for name in ("chimera", "bidir-zb") + (("dualpipe",) if m >= p else ()):
        assert bound <= simulate(problem, build(name, problem)).objective_value() + 1e-9, name


def test_pairs_are_checked_and_kept_in_the_schedule_file(tmp_path):
    p = _overlapped(3)
    compiled = schedc.compile(p, "dualpipe")
    compiled.save(tmp_path / "d.json")
    loaded = schedc.load(tmp_path / "d.json")
    assert loaded.schedule.pairs == compiled.schedule.pairs and loaded.timeline.makespan == compiled.timeline.makespan
    plain = schedc.compile(_overlapped(None), "dualpipe")  # pairs without costs.FB: kept and timed alike
    plain.save(tmp_path / "plain.json")
    again = schedc.load(tmp_path / "plain.json")
    assert again.schedule.pairs == plain.schedule.pairs == compiled.schedule.pairs
    assert again.timeline.makespan == plain.timeline.makespan == 85
    ranks = compiled.schedule.ranks
    first = compiled.schedule.pairs[0][0]
    at = ranks[0].index(first)
    moved = [list(ops) for ops in ranks]
    moved[0].insert(0, moved[0].pop(at))  # the paired backward no longer after a forward
    with pytest.raises(schedc.ScheduleError, match="a pair is a backward .B or BW. right after a forward F"):
        simulate(p, schedc.Schedule.from_lists("x", moved, pairs=compiled.schedule.pairs))
    with pytest.raises(schedc.ScheduleError, match="has pairs for 1 ranks"):
        simulate(p, schedc.Schedule.from_lists("x", ranks, pairs=[[first]]))


def test_list_scheduled_directions_pair_a_forward_and_a_backward_ready_together():
    """Where an overlapped pair is faster (``costs.FB`` below F + B), chimera and bidir-zb run a
    forward and a backward that are ready at once as a pair: faster than without pairs here, and
    the program lowers and checks."""
    for name in ("chimera", "bidir-zb"):
        plain = Problem.parse({"ranks": 4, "microbatches": 8, "costs": {"F": 2, "B": 2, "W": 1}, "replicas": 2})
        paired = plain.with_changes(costs={"FB": 3.0})
        t = simulate(paired, build(name, paired))
        assert any(t.schedule.pairs) and not any(build(name, plain).pairs)
        assert t.makespan < simulate(plain, build(name, plain)).makespan
        check(paired, lower(paired, t.schedule, t), t.schedule)


def _table_rows(output: str) -> dict[str, str]:
    """A comparison table's rows (``compare``, ``solve``): schedule name -> its makespan cell."""
    return {cells[0]: cells[1] for cells in (line.split() for line in output.splitlines())
            if len(cells) > 2 and cells[1].replace(".", "", 1).isdigit()}


def test_solve_names_each_warm_start_row_for_what_it_is(tmp_path):
    """solve's table shows the warm starts it judged with their fused backwards split (DualPipe's
    pairs hold full backwards BW; 1F1B fuses every one) as NAME+split, with the split schedule's
    makespan, and no row under the registry name with a figure that ``compare`` contradicts: on
    DualPipe's own problem (p = 4), compare's dualpipe is 73 and the split one 72."""
    from click.testing import CliRunner

    from schedc.app.cli import main

    problem = tmp_path / "dualpipe.json"
    problem.write_text(dualpipe_own(4).model_dump_json())
    runner = CliRunner()
    compared = runner.invoke(main, ["compare", str(problem), "--schedules", "dualpipe,chimera"])
    assert compared.exit_code == 0, compared.output
    assert _table_rows(compared.output)["dualpipe"] == "73"
    solved = runner.invoke(main, ["solve", str(problem), "-o", str(tmp_path / "s.json"), "--time-limit", "2", "-q"])
    assert solved.exit_code == 0, solved.output
    rows = _table_rows(solved.output)
    assert rows["dualpipe+split"] == "72" and "dualpipe" not in rows and "chimera+split" in rows
    assert "bidir-zb" in rows  # (split already: its name unchanged)
    assert "started from dualpipe+split (72)" in solved.output
    one = tmp_path / "one.json"
    one.write_text(Problem.parse({"ranks": 4, "microbatches": 8, "costs": {"F": 1, "B": 1, "W": 1}}).model_dump_json())
    solved = runner.invoke(main, ["solve", str(one), "-o", str(tmp_path / "o.json"), "--time-limit", "2", "-q"])
    rows = _table_rows(solved.output)
    compared = _table_rows(runner.invoke(main, ["compare", str(one), "--schedules", "1f1b"]).output)
    assert compared["1f1b"] == "33" and rows["1f1b+split"] == "30" and "1f1b" not in rows  # (B's gradient leaves before W)
