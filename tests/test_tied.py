"""Tied weights (``tied``: an embedding shared by the first and last stage): where the stages sit
on different ranks, their gradients are summed (TS) by a collective of those ranks before the
step; the simulator, checker, bounds, the ILP and CP-SAT (against the exhaustive oracle, which
times the sums on its own) and the schedule file know it."""

from __future__ import annotations

import random

import pytest

import schedc
from schedc.check import check
from schedc.errors import ProblemError, ProgramError
from schedc.problem import Problem
from schedc.program import Program, lower
from schedc.schedule import Op
from schedc.simulate import simulate
from schedc.solvers.registry import build
from tests.test_ilp_model import assert_models_meet_the_oracle


def _tied(p=4, m=4, **extra) -> Problem:
    data = {"ranks": p, "microbatches": m, "costs": {"F": 1, "B": 1, "W": 1}, "tied": {"groups": [[0, p - 1]], "sync": 2}}
    return Problem.parse({**data, **extra})


@pytest.mark.parametrize("tied, message", [
    ([[0, 9]], r"tied.groups\[0\]: stage 9 is out of range 0..3"),
    ([[0, 0]], r"tied.groups\[0\] is \[0, 0\]: a group is two or more distinct stages"),
    ([[0, 3], [3, 1]], "tied: stage 3 is in groups 0 and 1; merge them into one"),
    ({"groups": [[0, 3]], "sync": -1}, "tied.sync: must be >= 0"),
    ({"groups": [[0, 3]], "snyc": 1}, "unknown field 'tied.snyc' .did you mean 'sync'"),
])
def test_bad_tied_groups_are_refused_in_one_line(tied, message):
    with pytest.raises(ProblemError, match=message) as e:
        Problem.parse({"ranks": 4, "microbatches": 2, "costs": {"F": 1, "B": 1, "W": 1}, "tied": tied})
    assert "\n" not in str(e.value)
    both = {"ranks": 2, "microbatches": 2, "costs": {"F": 1, "B": 1, "W": 1}, "replicas": 2}
    with pytest.raises(ProblemError, match=r"tied.groups\[0\]: model stage 3 is out of range 0..1"):
        Problem.parse({**both, "tied": [[0, 3]]})
    with pytest.raises(ProblemError, match="with replicas each pipeline's stages of a tied group must sit on"
                                           r" different ranks \(stages \[0, 3\] share a rank\): not supported yet"):
        Problem.parse({**both, "chunks": 2, "placement": "v", "tied": [[0, 3]]})


def test_tied_stages_on_two_ranks_sum_together_and_on_one_rank_need_nothing():
    p = _tied()
    assert p.sync_groups["tied"] == ((0, 3),)
    t = simulate(p, build("zb-h1", p))
    times = t.op_times()
    (_, a, _), (_, b, _) = times[Op("TS", 0, 0)], times[Op("TS", 3, 0)]
    assert a == b >= max(e for op, (_, _, e) in times.items() if op.kind == "W" and op.stage in (0, 3))
    assert [len(ops) for ops in t.comm] == [1, 0, 0, 1]
    v = Problem.parse({"ranks": 2, "microbatches": 4, "chunks": 2, "placement": "v",
                       "costs": {"F": 1, "B": 1, "W": 1}, "tied": [[0, 3]]})
    assert v.sync_groups["tied"] == () and not any(simulate(v, build("zb-v", v)).comm)
    # A program that drops one side of the sum, or sums a stage that shares nothing, is refused.
    schedule = build("1f1b", p)
    program = lower(p, schedule)
    ranks = [[i for i in instrs if i.op != "TS" or r != 3] for r, instrs in enumerate(program.ranks)]
    with pytest.raises(ProgramError, match=r"rank 3: no TS \(tied gradient sum\) of stage 3"):
        check(p, Program.from_lists(ranks, program.header))
    ranks = [list(instrs) for instrs in program.ranks]
    ranks[1].insert(len(ranks[1]) - 1, ranks[0][[i.op for i in ranks[0]].index("TS")]._replace(stage=1))
    with pytest.raises(ProgramError, match="stage 1 has no TS"):
        check(p, Program.from_lists(ranks, program.header))


def test_the_schedule_file_keeps_tied_groups(tmp_path):
    compiled = schedc.compile(_tied(), "zb-h1")
    compiled.save(tmp_path / "t.json")
    loaded = schedc.load(tmp_path / "t.json")
    assert loaded.problem.tied == compiled.problem.tied and loaded.program.header.tied == ((0, 3),)
    assert loaded.timeline.makespan == compiled.timeline.makespan
    assert _tied().scaled(time=3).cost["TS"] == (6.0,) * 4


def tiny_tied_problems(count=8, seed=3):
    """2 or 3 ranks, one or two microbatches (the oracle may not prune by dominance with the sums):
    the first and last stage tied, sums of 0 to 3, some with data-parallel reduces too."""
    rng = random.Random(seed)
    out = []
    for k in range(count):
        p, m = (2, 2) if k % 2 else (3, 1)
        data = dict(ranks=p, microbatches=m, comm=rng.choice([0, 0.5]),
                    costs={kind: [rng.randint(1, 3) for _ in range(p)] for kind in "FBW"},
                    tied=dict(groups=[[0, p - 1]], sync=rng.choice([0, 1, 2, 3])))
        if k % 3 == 2:
            data["data_parallel"] = dict(degree=2, reduce=rng.choice([1, 2]), overlap=rng.random() < 0.7)
        out.append(pytest.param(Problem.parse(data), id=f"{k}-p{p}m{m}"))
    return out


@pytest.mark.parametrize("problem", tiny_tied_problems())
def test_the_models_with_tied_sums_equal_the_exhaustive_search(problem):
    """The exhaustive search times the sums on its own (every rank of a group at once, one order on
    every rank): see ``assert_models_meet_the_oracle``."""
    assert_models_meet_the_oracle(problem)

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_models_with_tied_sums_and_two_directions_equal_the_exhaustive_search(seed):
    """Replicas and tied weights together, 2 ranks, one microbatch each way: each pipeline's first
    and last stage sum their tied weights (TS) after each copy's sum with its copies (RS), on the
    same two ranks' lanes in one order; the ILP and CP-SAT meet the oracle, which times them on
    its own."""
    rng = random.Random(seed)
    problem = Problem.parse(dict(ranks=2, microbatches=1, comm=rng.choice([0, 0.5]),
                                 costs={kind: [rng.randint(1, 3) for _ in range(2)] for kind in "FBW"},
                                 replicas=dict(count=2, sync=[rng.choice([0, 1, 2]) for _ in range(2)]),
                                 tied=dict(groups=[[0, 1]], sync=rng.choice([1, 2]))))
    assert problem.sync_groups["tied"] == ((0, 1), (2, 3))
    assert_models_meet_the_oracle(problem)
