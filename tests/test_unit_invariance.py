"""Answers do not depend on the unit of time or of memory (issue 14).

The same problem written in seconds instead of milliseconds (every cost, comm, recompute, copy and
reduce and replica-sync time times c), or in other memory units (every delta, static memory, limit and kept amount
times k), must give every registry
schedule the same order on every rank, with every time (or memory amount) scaled by c (or k),
and the solver the same objective scaled: no comparison may use an absolute epsilon.
"""

import math
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import schedc.solvers as solvers
from schedc import Problem, load_problem, simulate
from schedc.solvers import solve
from tests.strategies import pipeline_problems

PROBLEMS = Path(__file__).parent.parent / "examples" / "problems"
# Seconds for milliseconds and back, a tenth, and an awkward factor; one more is drawn per example.
FACTORS = (1e-3, 1e3, 0.1, 3.7e-2)
REL = 1e-9
LIMITS = ("none", "least", "peak")  # no limit; each rank's min_memory; a handcrafted schedule's peak

drawn_factor = st.floats(-3, 3).map(lambda e: 10.0**e)


def _times(value, c):
    return [x * c for x in value] if isinstance(value, list) else value * c


def _policies(problem: Problem, what: str, c: float) -> dict:
    """The recompute and offload sections with their times (``what`` "time") or kept amounts
    ("keep") times c: they are in the problem's units too."""
    out = {}
    for section in ("recompute", "offload"):
        data = getattr(problem, section)
        if data is not None:
            data = data.model_dump(exclude_none=True)
            out[section] = {key: ({k: _times(x, c) if k == what else x for k, x in v.items()} if key == "selective"
                                  else _times(v, c) if key == what else v) for key, v in data.items()}
    return out


def in_time_unit(problem: Problem, c: float) -> Problem:
    costs = {kind: _times(v, c) for kind, v in problem.costs.model_dump(exclude_none=True).items()}
    dp = problem.data_parallel
    sync = {} if dp is None else {"data_parallel": {"reduce": _times(dp.reduce, c)}}
    if problem.replicas is not None:
        sync["replicas"] = {"sync": _times(problem.replicas.sync, c)}
    return problem.with_changes(costs=costs, comm=problem.comm * c, **_policies(problem, "time", c), **sync)


def in_memory_unit(problem: Problem, k: float) -> Problem:
    memory = {key: _times(v, k) for key, v in problem.memory.model_dump(exclude_none=True).items()}
    return problem.with_changes(memory=memory, **_policies(problem, "keep", k))


def with_limit(problem: Problem, which: str) -> Problem:
    """``problem`` with no limit, each rank's least possible peak, or the peak of the first of
    zb-h1 / zb-v that applies (a limit some schedule meets exactly, where ties matter)."""
    if which == "none":
        return problem
    limit = [problem.min_memory(r) for r in range(problem.ranks)]
    if which == "peak":
        for name in ("zb-h1", "zb-v"):
            if solvers.REGISTRY[name].why_not(problem) is None:
                limit = list(simulate(problem, solvers.build(name, problem)).peak_memory)
                break
    return problem.with_changes(memory={"limit": limit})


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=0.0)


def applicable(problem: Problem) -> list[str]:
    return [name for name, spec in solvers.REGISTRY.items() if spec.why_not(problem) is None]


def built(problem: Problem) -> dict:
    return {name: solvers.build(name, problem) for name in applicable(problem)}


def check_time_unit(problem: Problem, c: float, base: dict) -> None:
    scaled = in_time_unit(problem, c)
    assert applicable(scaled) == list(base)
    for name, (schedule, t) in base.items():
        other = solvers.build(name, scaled)
        assert other.ranks == schedule.ranks, f"{name}: another order with times x {c:g}"
        u = simulate(scaled, other)
        assert u.fits == t.fits, name
        for what in ("makespan", "span"):
            assert close(getattr(u, what), c * getattr(t, what)), (name, what, c)
        assert close(u.objective_value(), c * t.objective_value()), (name, c)
        assert u.peak_memory == t.peak_memory


def check_memory_unit(problem: Problem, k: float, base: dict) -> None:
    scaled = in_memory_unit(problem, k)
    assert applicable(scaled) == list(base)
    for name, (schedule, t) in base.items():
        other = solvers.build(name, scaled)
        assert other.ranks == schedule.ranks, f"{name}: another order with memory x {k:g}"
        u = simulate(scaled, other)
        assert u.fits == t.fits, (name, k)
        assert u.makespan == t.makespan and u.span == t.span
        assert all(close(a, k * b) for a, b in zip(u.peak_memory, t.peak_memory)), (name, k)


def judged(problem: Problem) -> dict:
    return {name: (s, simulate(problem, s)) for name, s in built(problem).items()}


SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(pipeline_problems(max_microbatches=10), drawn_factor, st.sampled_from(LIMITS))
def test_registry_schedules_do_not_depend_on_the_unit_of_time(problem, c, limit):
    problem = with_limit(problem, limit)
    base = judged(problem)
    for factor in FACTORS + (c,):
        check_time_unit(problem, factor, base)


@SETTINGS
@given(pipeline_problems(max_microbatches=10), drawn_factor, st.sampled_from(LIMITS), st.sampled_from([None, 0.25, 1.5]))
def test_registry_schedules_do_not_depend_on_the_unit_of_memory(problem, k, limit, working):
    # Subnormal activations (the strategy may draw 5e-324) vanish when scaled: not another unit.
    assume(problem.memory_scale == 0 or problem.memory_scale > 1e-200)
    if working is not None:  # working memory scales with the other amounts
        problem = problem.with_changes(memory={"working": working})
    problem = with_limit(problem, limit)
    base = judged(problem)
    for factor in FACTORS + (k,):
        check_memory_unit(problem, factor, base)


@pytest.mark.parametrize("path", sorted(PROBLEMS.glob("*.yaml")), ids=lambda p: p.stem)
def test_example_problems_in_seconds_and_in_other_memory_units(path):
    problem = load_problem(path)
    base = judged(problem)
    check_time_unit(problem, 1e-3, base)
    check_memory_unit(problem, 1e-3, base)
    check_memory_unit(problem, 2.0**30, base)  # GiB to bytes


# ---- the README's and docs' claims, in every unit ----


@pytest.mark.parametrize("c", (1.0,) + FACTORS)
def test_memory_tight_zb_greedy_is_no_worse_than_zb_h1_in_any_unit(c):
    problem = in_time_unit(load_problem(PROBLEMS / "memory_tight.yaml"), c)
    greedy = simulate(problem, solvers.build("zb-greedy", problem))
    h1 = simulate(problem, solvers.build("zb-h1", problem))
    assert greedy.fits and h1.fits
    assert greedy.makespan <= h1.makespan * (1 + REL)
    assert close(greedy.makespan, 39.3 * c)  # the README's table, in its unit


@pytest.mark.parametrize("c", (0.1, 1e-3))
def test_skewed_solver_win_holds_in_any_unit(c):
    """README: on skewed.yaml the solver proves 71 where the best heuristic that fits takes 78."""
    problem = load_problem(PROBLEMS / "skewed.yaml")
    scaled = in_time_unit(problem, c)
    one, other = solve(problem, time_limit=60), solve(scaled, time_limit=60)
    assert one.status == other.status == "optimal"
    assert close(one.objective, 71.0) and close(other.objective, 71.0 * c)
    assert close(other.bound, c * one.bound)
    greedy = simulate(scaled, solvers.build("zb-greedy", scaled))
    assert greedy.fits and close(greedy.makespan, 78.0 * c)  # the heuristic is not optimal there
    assert close(other.warm_objective, 78.0 * c) and other.warm_objective > other.objective * 1.05


# ---- the solver ----


def seeded_problem(seed: int, objective: str) -> Problem:
    """Three ranks, three microbatches, room for two activations: small enough for the solve to
    end proven optimal well inside its time limit, and (for the seeds used) the search beats
    its warm start (every registry schedule, and those with their W re-placed or held past the last
    backward: seed 20's is optimal, and seed 69's since the warm start holds W back)."""
    rng = random.Random(seed)
    costs = {kind: [rng.randint(1, 4) for _ in range(3)] for kind in ("F", "B", "W")}
    return Problem.parse(
        dict(ranks=3, microbatches=3, costs=costs, comm=rng.choice([0, 0.5]), objective=objective,
             memory=dict(F=1, B=-0.5, limit=2))
    )


@pytest.mark.parametrize("objective", ["makespan", "span"])
@pytest.mark.parametrize("seed", [4, 56, 104])
def test_solver_objective_does_not_depend_on_the_unit(seed, objective):
    problem = seeded_problem(seed, objective)
    one = solve(problem, time_limit=60)
    assert one.status == "optimal" and one.objective < one.warm_objective  # the search found it
    for c in (1e-3, 3.7e-2, 1e3):
        other = solve(in_time_unit(problem, c), time_limit=60)
        assert other.status == "optimal"  # the same search ends proven optimal, well inside the limit
        assert other.timeline.fits
        # The search may find another order of the same value: the values, and neither worse.
        assert close(other.objective, c * one.objective), (c, other.objective, one.objective)
        assert close(other.warm_objective, c * one.warm_objective)
        assert math.isclose(other.bound, c * one.bound, rel_tol=1e-7)  # solvers' bounds carry their tolerances
    for k in (1e-3, 1e3):
        other = solve(in_memory_unit(problem, k), time_limit=60)
        assert other.status == "optimal" and close(other.objective, one.objective)
