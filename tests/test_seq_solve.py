"""solve on sequence-chunked problems (issue 27): the bounds proven for chunks, the ILP over units
(the chunk rule, per-unit costs and memory, symmetry breaking between sequences only), checked
against the exhaustive oracle (tests/exhaustive.py, which has its own timing model of chunks)."""

from __future__ import annotations

import random

import pytest

import schedc.solvers as solvers
from schedc import Problem
from schedc.kinds import Kind
from schedc.schedule import Op, Schedule, producers
from schedc.simulate import simulate
from schedc.solvers.bounds import all_bounds, lower_bound
from schedc.solvers.search.common import Settings, order_edges
from schedc.solvers.deadline import Budget
from schedc.solvers.search.ilp import _Model, _w_follow_b, search_cbc
from schedc.solvers.search.localsearch import renumbered
from schedc.solvers.registry import unfuse
from schedc.solvers.search.solve import solve

from tests.exhaustive import exhaustive_optimum

TOL = 1e-6


def chunked(rng: random.Random, p: int, m: int, k: int, objective: str = "makespan", limit: float | None = None,
            fused: bool = False, comm: float | None = None) -> Problem:
    def share() -> list[float]:  # random weights of the chunk positions, as shares (summing to 1)
        weights = [rng.choice([0.1, 0.3, 0.5, 0.9]) for _ in range(k)]
        return [x / sum(weights) for x in weights]

    costs = {"F": rng.choice([1, 2, 3]), "B": rng.choice([1, 2, 3]), "W": rng.choice([0.5, 1, 2])}
    if fused:
        costs["BW"] = 0.8 * (costs["B"] + costs["W"])
    memory = {"F": 1, **({"limit": limit} if limit is not None else {})}
    return Problem.parse({"ranks": p, "microbatches": m, "comm": rng.choice([0, 0.5, 1]) if comm is None else comm,
                          "costs": costs, "memory": memory, "objective": objective,
                          "sequence_chunks": {"count": k, "F": share(), "B": share(), "W": share(),
                                              "memory": share()}})


def random_order(prob: Problem, rng: random.Random, backward: tuple[Kind, ...]) -> Schedule:
    """A random deadlock-free schedule: a random topological order of every op (the chunk rule
    included), each rank's share of it in that order."""
    ops = [Op(kind, s, u) for s in range(prob.n_stages) for u in range(prob.units) for kind in (Kind.F, *backward)]
    where = set(ops)
    deps = {op: producers(op, prob.pipeline_stages, where, prob.seq_chunks) for op in ops}
    done: set[Op] = set()
    ranks: list[list[Op]] = [[] for _ in range(prob.ranks)]
    while len(done) < len(ops):
        op = rng.choice([op for op in ops if op not in done and all(d in done for d in deps[op])])
        done.add(op)
        ranks[prob.stage_rank[op.stage]].append(op)
    return Schedule.from_lists("random", ranks)


@pytest.mark.parametrize("seed", range(12))
def test_every_bound_holds_for_seq1f1b_and_random_orders(seed):
    rng = random.Random(seed)
    p, m, k = rng.randint(1, 4), rng.randint(1, 3), rng.randint(2, 4)
    objective = rng.choice(["makespan", "span"])
    prob = chunked(rng, p, m, k, objective, fused=seed % 3 == 0)
    bounds = all_bounds(prob)
    assert bounds and lower_bound(prob).value == pytest.approx(max(b.value for b in bounds))
    schedules = [solvers.build(name, prob) for name in ("seq1f1b", "seq1f1b-zb")]
    schedules += [random_order(prob, rng, (Kind.B, Kind.W)) for _ in range(4)]
    schedules += [random_order(prob, rng, (Kind.BW,)) for _ in range(2)]
    for schedule in schedules:
        value = simulate(prob, schedule).objective_value()
        for b in bounds:
            assert b.value <= value + TOL, (schedule.name, b, value)


# Small problems: p = 2, m 1-2, k 2-3, random shares, some under a memory limit (the least that
# seq1f1b-zb needs: it binds for other orders); makespan, which the ILP models exactly (its optimum
# is the simulator's as-soon-as-possible one).
CASES = [(2, 1, 2, False), (2, 1, 3, False), (2, 2, 2, False), (2, 2, 2, True), (2, 1, 3, True), (2, 2, 2, True)]


def case_problem(case: int) -> Problem:
    p, m, k, limited = CASES[case]
    prob = chunked(random.Random(100 + case), p, m, k, "makespan")
    if limited:
        peak = max(simulate(prob, solvers.build("seq1f1b-zb", prob)).peak_memory)
        prob = prob.with_changes(memory={**prob.memory.model_dump(exclude_none=True), "limit": peak})
    return prob


@pytest.mark.parametrize("case", range(len(CASES)))
def test_solve_finds_the_oracles_optimum_and_its_bound_lies_below(case):
    prob = case_problem(case)
    p = prob.ranks
    best, orders = exhaustive_optimum(prob, time_budget=60)
    # The oracle's orders, judged by schedc's simulator, give what it claims.
    assert simulate(prob, Schedule.from_lists("oracle", [orders[r] for r in range(p)])).makespan == pytest.approx(best)
    found = solve(prob, time_limit=60)
    assert found.bound <= best + TOL
    assert found.status == "optimal"
    assert found.objective == pytest.approx(best)
    assert found.timeline.fits
    for name in ("seq1f1b", "seq1f1b-zb"):
        t = simulate(prob, solvers.build(name, prob))
        if t.fits:
            assert found.objective <= t.makespan + TOL


@pytest.mark.parametrize("case", [0, 2, 3])
def test_the_ilp_alone_reaches_the_oracle_from_seq1f1b_zb(case):
    """The search backend on its own (no local search before it) from seq1f1b-zb: its schedule is
    the oracle's optimum and its proven bound lies below it."""
    prob = case_problem(case)
    best, _ = exhaustive_optimum(prob, time_budget=60)
    start = simulate(prob, solvers.build("seq1f1b-zb", prob))
    if not start.fits:
        pytest.skip("seq1f1b-zb does not fit")
    found = search_cbc(prob, start, Settings(Budget.seconds(60), 0.0, None, lower_bound(prob).value))
    assert found.bound is not None and found.bound <= best + TOL
    if found.schedule is None:  # nothing better than the start: it is the optimum
        assert start.makespan == pytest.approx(best)
    else:
        assert simulate(prob, found.schedule).makespan == pytest.approx(best)


def test_span_solve_bound_lies_below_the_oracle():
    prob = chunked(random.Random(7), 2, 2, 2, "span")
    best, _ = exhaustive_optimum(prob, time_budget=60)
    found = solve(prob, time_limit=30)
    assert found.bound <= best + TOL <= found.objective + 2 * TOL


# Stage 0 interleaving two sequences' chunks, F(seq 0 chunk 0), F(seq 1 chunk 0), F(seq 0 chunk 1),
# F(seq 1 chunk 1), is strictly better here (span 9.1 against 9.4 with each sequence's forwards
# together): F(0, last chunk of i) before F(0, first chunk of i+1) is no valid symmetry edge.
INTERLEAVED = {"ranks": 2, "microbatches": 2, "comm": 0, "costs": {"F": 1.2, "B": 1.2, "W": 2}, "memory": {"F": 1},
               "sequence_chunks": {"count": 2, "F": [0.25, 0.75], "B": [0.75, 0.25], "W": [0.5, 0.5],
                                   "memory": [0.9, 0.1]}, "objective": "span"}


def test_interleaving_sequences_on_stage_0_can_be_strictly_better():
    prob = Problem.parse(INTERLEAVED)
    best, orders = exhaustive_optimum(prob, time_budget=60)
    whole, _ = exhaustive_optimum(prob, time_budget=60, whole_sequences=True)
    assert best == pytest.approx(9.1) and whole == pytest.approx(9.4)
    stage0 = [op[2] for op in orders[0] if op[0] == "F"]
    assert stage0 != sorted(stage0)  # the optimum interleaves the two sequences
    found = solve(prob, time_limit=30)
    assert found.bound <= best + TOL


def test_symmetry_edges_order_sequences_first_chunks_and_w_twins_stay_in_one_chunk_position():
    prob = Problem.parse({**INTERLEAVED, "microbatches": 3, "sequence_chunks": 3, "objective": "makespan"})
    model = _Model(prob, horizon=100.0)
    index = model.index
    edges = {(a, b) for a, b, _ in order_edges(prob, model.ops, index)}
    F0 = lambda u: index[Op(Kind.F, 0, u)]  # noqa: E731
    assert (F0(0), F0(3)) in edges and (F0(3), F0(6)) in edges  # first chunks, sequence by sequence
    assert (F0(2), F0(3)) not in edges and (F0(5), F0(6)) not in edges  # not the last chunk before
    assert (F0(0), F0(1)) in edges  # the chunk rule
    twins = _w_follow_b(model.ops, index, prob.n_stages, prob.units, prob.seq_chunks)
    for wa, wb in twins:
        assert model.ops[wa].mb % 3 == model.ops[wb].mb % 3
    assert len(twins) == prob.n_stages * 3 * 3  # per stage and position, 3 pairs of 3 units


def test_renumbered_renumbers_whole_sequences():
    prob = Problem.parse({**INTERLEAVED, "objective": "makespan"})
    ranks = [list(ops) for ops in solvers.build("seq1f1b-zb", prob).ranks]
    swap = {0: 2, 1: 3, 2: 0, 3: 1}  # the two sequences swapped
    swapped = Schedule.from_lists("x", [[op._replace(mb=swap[op.mb]) for op in ops] for ops in ranks])
    back = renumbered(swapped, prob.seq_chunks)
    assert [list(ops) for ops in back.ranks] == ranks
    assert simulate(prob, back).makespan == simulate(prob, swapped).makespan


def test_a_limit_below_a_whole_sequence_is_allowed_where_the_chunks_hold_less():
    """min_memory with sequence chunks: every chunk's share of the stage's activation (a sequence's
    last chunk's backward waits for all its forwards), not one whole microbatch's."""
    data = {"ranks": 2, "microbatches": 1, "costs": {"F": 1, "B": 1, "W": 1},
            "sequence_chunks": {"count": 2, "memory": [0.3 / 0.7, 0.4 / 0.7]}}
    prob = Problem.parse({**data, "memory": {"F": 0.7, "limit": 0.7}})
    assert prob.min_memory(0) == pytest.approx(0.7)
    with pytest.raises(Exception, match="below the 0.7"):
        Problem.parse({**data, "memory": {"F": 0.7, "limit": 0.6}})
    found = solve(prob, time_limit=20)
    assert found.timeline.fits and max(found.timeline.peak_memory) <= 0.7 + TOL


def test_the_neighbourhood_search_windows_whole_sequences(monkeypatch):
    """Above FULL_MODEL_OPS the ILP searches windows of whole sequences (all their chunks): made
    small here so that a 2-rank, 3-sequence problem is searched one sequence at a time."""
    import schedc.solvers.search.ilp as ilp

    monkeypatch.setattr(ilp, "FULL_MODEL_OPS", 10)
    monkeypatch.setattr(ilp, "WINDOW_OPS", 9)  # one sequence of 3 chunks per window
    monkeypatch.setattr(ilp, "WINDOW_MIN_SECONDS", 0.5)
    monkeypatch.setattr(ilp, "WINDOW_SECONDS", 2.0)
    prob = chunked(random.Random(3), 2, 3, 3, "makespan")
    start = simulate(prob, unfuse(solvers.build("seq1f1b", prob)))  # (the driver hands the backend split ones)
    windows = []
    real = ilp.solve_pulp

    def spy(problem, incumbent, settings, solver="cbc", *, keep=None, window=None):
        windows.append({op for ops, w in zip(keep.ranks, window) for op in (ops[x] for x in w)})
        return real(problem, incumbent, settings, solver, keep=keep, window=window)

    monkeypatch.setattr(ilp, "solve_pulp", spy)
    found = ilp.search_cbc(prob, start, Settings(Budget.seconds(20), 0.0, None, lower_bound(prob).value))
    assert found.bound is None and windows
    for ops in windows:  # each holds every op of some sequence: all its chunks
        assert any(all(Op(kind, s, 3 * q + c) in ops for kind in (Kind.F, Kind.B, Kind.W) for s in range(2)
                       for c in range(3)) for q in range(3))
    if found.schedule is not None:
        assert simulate(prob, found.schedule).makespan <= start.makespan + TOL
