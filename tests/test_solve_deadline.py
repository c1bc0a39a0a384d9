"""`schedc solve --time-limit` is a limit on the whole call: the registry evaluation stops at the
deadline (keeping a schedule that fits), a CBC that overruns is killed (the warm start is then
returned, status "time limit"), CP-SAT's model building stops, and progress is reported from the
first step on. No test here asserts on wall-clock time; benchmarks/solve_time.py measures it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedc.solvers.search.cbc as cbc
import schedc.solvers.deadline as deadline
import schedc.solvers.search.ilp as ilp
import schedc.solvers.registry as registry
import schedc.solvers.search.solve as driver
from schedc import Problem, simulate
from schedc.app.cli import main
from schedc.errors import SchedcError
from schedc.solvers.bounds import lower_bound
from schedc.solvers.search.common import Progress, Settings
from schedc.solvers.deadline import END, LATE, Budget, Worker, can_fork
from schedc.solvers.search.solve import best_registry_schedule, evaluate_registry, solve
from schedc.kinds import Kind
from schedc.solvers.families.memtime import everywhere, with_policies
from schedc.solvers.search.mixed import fitted_orders
from tests.strategies import pipeline_problems, small_problems

# gpipe and looped-bfs hold every microbatch's activations: they do not fit here, 1f1b does.
TIGHT = dict(ranks=3, microbatches=6, costs=dict(F=[1, 2, 1], B=[2, 2, 1], W=[1, 1, 2]),
             memory=dict(F=1, B=-0.5, limit=3))
# The memory limit binds and the independent bound stays below the optimum (25 against a bound
# below it): no schedule meets the bound, so solve() always runs its search.
BINDING = dict(ranks=3, microbatches=4, costs=dict(F=[1, 2, 1], B=[2, 2, 1], W=[1, 1, 2]),
               memory=dict(F=[2, 1.5, 1], B=[-1, -0.5, -0.5], static=[1, 0.5, 0], limit=[5, 4, 2]))



def alive(pid: int) -> bool:
    """The process runs (a zombie, killed and waiting for its parent to reap it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def slow_down(monkeypatch, module, name: str, seconds: float, calls: list | None = None) -> None:
    """``module.name``, a generator function, made slow: each item after its first comes ``seconds``
    later; ``calls`` (if given) records each call's arguments."""
    real = getattr(module, name)

    def slow(*args):
        if calls is not None:
            calls.append(args)
        for k, item in enumerate(real(*args)):
            if k:
                time.sleep(seconds)
            yield item

    monkeypatch.setattr(module, name, slow)


def gone(pid: int) -> bool:
    """Whether ``pid`` ends within 5 s (a kill may take a moment to land); killed here if not."""
    for _ in range(100):
        if not alive(pid):
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return False


@pytest.fixture
def where(monkeypatch, request):
    """Run the registry builds and the model in a child process (as for large problems) or here."""
    if request.param:
        if not can_fork():
            pytest.skip("no fork on this platform")
        monkeypatch.setattr(deadline, "WORKER_OPS", 0)
    return request.param


@pytest.mark.parametrize("where", [False, True], ids=["here", "child process"], indirect=True)
def test_the_deadline_stops_registry_evaluation_but_a_fitting_schedule_is_returned(where):
    problem = Problem.parse(TIGHT)
    everything = evaluate_registry(problem)
    assert not everything.not_evaluated
    first_fit = min(everything.fitting, key=lambda nt: driver._warm_rank(nt[0]))[0]  # (judged first that fits)
    notes = []
    run = evaluate_registry(problem, Budget(time.perf_counter() - 1), say=notes.append)  # already run out
    assert [name for name, _ in run.fitting] == [first_fit]  # judged past the deadline: nothing fitted before
    assert run.not_evaluated and first_fit not in run.not_evaluated
    assert run.fitting[0][1].fits
    assert notes[0].startswith("warm start: evaluating") and "not evaluated" in notes[-1]

    events = []
    result = solve(problem, time_limit=1e-6, progress=events.append)
    assert result.timeline.fits
    # (shown as what it is: with its fused backwards split, NAME+split)
    assert result.warm_start == registry.shown_name(first_fit, run.fitting[0][1])
    assert result.not_evaluated == run.not_evaluated
    assert result.status in ("time limit", "optimal")
    assert result.objective <= result.warm_objective + 1e-9
    assert result.summary()["not_evaluated"] == run.not_evaluated
    assert any("not evaluated" in e.note for e in events)


@pytest.mark.parametrize("where", [False, True], ids=["here", "child process"], indirect=True)
def test_a_killed_cbc_falls_back_to_the_warm_start_with_status_time_limit(where, tmp_path, monkeypatch):
    # A "cbc" that ignores the interrupt and never finishes: only the kill stops it.
    fake = tmp_path / "cbc"
    pids = tmp_path / "pids"
    fake.write_text(f"#!/bin/sh\ntrap '' INT\necho $$ >> {pids}\nexec sleep 600\n")
    fake.chmod(0o755)
    real_cbc = cbc.cbc

    def fake_cbc(**options):
        cmd = real_cbc(**options)
        cmd.path = str(fake)
        return cmd

    monkeypatch.setattr(cbc, "cbc", fake_cbc)
    problem = Problem.parse(BINDING)
    assert lower_bound(problem).value < best_registry_schedule(problem)[1].objective_value()
    result = solve(problem, time_limit=2.0)
    assert result.status == "time limit"
    assert result.timeline.fits
    assert result.objective <= result.warm_objective + 1e-9
    assert result.bound <= result.objective
    started = [int(x) for x in pids.read_text().split()]
    assert started  # the search did start CBC
    assert not any(alive(pid) for pid in started)  # and it is gone

    # The search alone: no schedule from a killed CBC, and the reason says so.
    _, warm = best_registry_schedule(problem)
    out = ilp.solve_pulp(problem, warm, Settings(Budget.seconds(1.5), 1e-4, None, lower_bound(problem).value), "cbc")
    found, bound, reason = out.schedule, out.bound, out.note
    assert found is None and bound is None and "time limit" in reason


def test_progress_hears_of_the_warm_start_before_any_solver_runs(monkeypatch):
    events: list[Progress] = []
    calls = []
    real = ilp.solve_pulp

    def spy(*args, **kwargs):
        calls.append(len(events))
        return real(*args, **kwargs)

    monkeypatch.setattr(ilp, "solve_pulp", spy)
    problem = Problem.parse(BINDING)
    result = solve(problem, time_limit=30, progress=events.append)
    assert calls and calls[0] > 0  # events had arrived when the search began
    assert events[0].note.startswith("warm start: evaluating")
    assert any(e.note.startswith("search:") for e in events[: calls[0]])
    assert [e.seconds for e in events] == sorted(e.seconds for e in events)  # one clock: since solve() began
    assert result.status == "optimal" or result.bound < result.objective


def test_cpsat_stops_building_its_model_at_the_deadline():
    pytest.importorskip("ortools")
    from schedc.solvers.search.cpsat import solve_cpsat

    problem = Problem.parse(BINDING)
    _, warm = best_registry_schedule(problem)
    out = solve_cpsat(problem, warm, Settings(Budget.seconds(1e-9), 0.0, 1, 0.0, None))
    found, bound, history, result = out.schedule, out.bound, out.history, out.note
    assert found is None and bound is None and history == []
    assert "time limit" in result


def test_solve_cli_reports_the_warm_start_as_it_goes(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(Problem.parse(dict(TIGHT, name="tight")).model_dump_json())
    out = tmp_path / "s.json"
    result = CliRunner().invoke(main, ["solve", str(path), "-o", str(out), "--time-limit", "20"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith("solving tight with cbc (auto) (time limit 20 s)")  # no recompute: CBC
    assert "warm start: evaluating" in lines[1] and "warm start: 1f1b+split makespan" in result.stderr
    assert "zb-h2 does not fit the memory limit" in result.stderr
    assert "(gpipe, looped-bfs not built: every microbatch in flight passes the limit)" in lines[1]
    assert "not evaluated" not in result.output  # 20 s is plenty here


def _sleeper(seconds):
    yield "first"
    time.sleep(seconds)
    yield "never"


def _failing():
    yield 1
    raise SchedcError("what is wrong and what to do")


@pytest.mark.skipif(not can_fork(), reason="no fork on this platform")
def test_a_worker_is_killed_at_its_deadline_and_hands_errors_over():
    with Worker(_sleeper, (600,), child=True) as worker:
        assert worker.in_child
        assert worker.next(Budget.seconds(30)) == "first"
        pid = worker._proc.pid
        assert worker.next(Budget.seconds(0.2)) is LATE
        assert not alive(pid)
        assert worker.next(None) is END
    for child in (True, False):
        with Worker(_failing, (), child=child) as worker:
            assert worker.next(None) == 1
            with pytest.raises(SchedcError, match="what is wrong"):
                worker.next(None)


@pytest.mark.skipif(not can_fork(), reason="no fork on this platform")
def test_a_worker_group_is_killed_with_the_processes_it_started():
    def starts_a_process():
        proc = subprocess.Popen(["sleep", "600"])
        yield proc.pid
        proc.wait()
        yield "never"

    with Worker(starts_a_process, (), child=True) as worker:
        grandchild = worker.next(Budget.seconds(30))
        assert worker.next(Budget.seconds(0.2)) is LATE
    assert gone(grandchild), "the grandchild outlived its worker"  # (killed with the worker's group)


def test_fitting_registry_schedules_still_judges_every_schedule():
    problem = Problem.parse(TIGHT)
    names = [name for name, _ in driver.fitting_registry_schedules(problem)]
    assert "1f1b" in names and "gpipe" not in names
    for name, t in driver.fitting_registry_schedules(problem):
        assert t.fits and t.objective_value() == simulate(problem, t.schedule).objective_value()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems())
def test_the_quick_memory_test_only_rejects_schedules_the_simulator_rejects(problem):
    for spec in registry.REGISTRY.values():
        if spec.why_not(problem) is None:
            schedule = registry.unfuse(spec.build(problem))
            if registry._cannot_fit(problem, schedule):
                assert not simulate(problem, schedule).fits, spec.name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_problems(max_microbatches=12), st.floats(0.2, 3), st.booleans())
def test_a_schedule_left_unbuilt_for_holding_every_microbatch_cannot_fit(problem, limit, recompute):
    """The warm start does not build gpipe or looped-bfs where a rank cannot hold every microbatch
    of its stages (``registry._holds_too_much``): each such schedule, built anyway, runs every
    forward of a rank before its first backward, and does not fit, not even with every microbatch
    recomputed under any policy the problem allows."""
    f = max(problem.mem[Kind.F])
    if recompute:
        problem = problem.with_changes(recompute={"keep": 0.1 * f, "selective": {"time": 0.2, "keep": 0.5 * f}})
    problem = problem.with_changes(memory={"limit": [max(limit * problem.ranks * f, problem.min_memory(r))
                                                     for r in range(problem.ranks)]})
    for spec in registry.REGISTRY.values():
        if not spec.holds_every_microbatch or spec.why_not(problem) is not None:
            continue
        schedule = registry.unfuse(spec.build(problem))
        for ops in schedule.ranks:
            first_backward = next(k for k, op in enumerate(ops) if op.kind is not Kind.F)
            assert all(op.kind is not Kind.F for op in ops[first_backward:]), spec.name
        if registry._holds_too_much(problem):
            assert not simulate(problem, schedule).fits, spec.name
            for kind in problem.recomputes:
                assert not simulate(problem, with_policies(problem, schedule, everywhere(problem, kind))).fits


def test_the_warm_start_judges_the_zero_bubble_schedules_first():
    """Under a budget that leaves time for few schedules, those judged first are the ones that are
    good on most problems (``WARM_FIRST``), not the registry's listing order, which starts with gpipe."""
    problem = Problem.parse(dict(ranks=4, microbatches=16, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=-0.5, limit=6)))
    said = []
    evaluate_registry(problem, Budget.seconds(60), said.append, greedy_budget=lambda: Budget.seconds(60))
    judged = [line.split()[2].removesuffix("+split") for line in said[1:]]
    assert judged[:4] == ["zb-h1", "zb-h2", "1f1b", "interleaved-1f1b"]
    assert "gpipe" not in judged and "looped-bfs" not in judged
    assert said[0] == ("warm start: evaluating 6 registry schedules (gpipe, looped-bfs not built: every microbatch"
                       " in flight passes the limit)")


def test_a_greedy_search_cut_short_joins_the_warm_start_as_partial(monkeypatch):
    """In a solve's warm start the greedy's searches run as they go: where the budget ends one
    (here a search whose every later step is slow), its best so far is a candidate named
    NAME+partial and the registry names are not evaluated."""
    import schedc.solvers.families.greedy as greedy  # (the search the warm start runs, slowed down here)

    slow_down(monkeypatch, greedy, "greedy_search", 0.5)
    problem = Problem.parse(TIGHT)
    run = evaluate_registry(problem, Budget.seconds(60), greedy_budget=lambda: Budget.seconds(0.2))
    names = [name for name, _ in run.fitting]
    assert "zb-greedy+partial" in names and "zb-greedy" not in names
    assert {"zb-greedy", "zb-1p", "zb-2p"} <= set(run.not_evaluated)
    assert run.derived == {"zb-greedy+partial"}
    [searches] = run.paused  # paused, for solve to resume
    assert not searches.over
    searches.stop()
    whole = evaluate_registry(problem)  # without a budget: every search to its end, as compare runs them
    assert "zb-greedy" in [name for name, _ in whole.fitting] and not whole.not_evaluated
    assert not whole.paused


@pytest.mark.parametrize("where", [False, True], ids=["here", "child process"], indirect=True)
def test_greedy_searches_cut_short_go_on_where_they_stopped_once_the_backend_is_done(where, monkeypatch):
    """The searches the warm start paused are resumed after the backend (``_resume``), not
    restarted: they end with the registry's own schedules, judged under their names, and the best
    is taken where it is shorter than the solve's."""
    import schedc.solvers.families.greedy as greedy

    calls = []
    slow_down(monkeypatch, greedy, "greedy_search", 0.3, calls)
    problem = Problem.parse(TIGHT)
    run = evaluate_registry(problem, Budget.seconds(60), greedy_budget=lambda: Budget.seconds(0.1))
    assert "zb-greedy+partial" in [name for name, _ in run.fitting] and len(run.paused) == 1
    worst = max((t for _, t in run.fitting), key=lambda t: t.objective_value())
    out = driver._Outcome(worst, ("w", worst))
    call = driver._Call(problem, "cbc", run, driver._Clock(None))
    driver._resume(call, Budget.seconds(120), 0.0, out)
    assert not run.paused  # every search ended, and the worker with them
    if not where:  # (here, each search started once: the resumed generator went on)
        assert [name for _, name in calls].count("zb-greedy") == 1
    whole = evaluate_registry(problem)
    assert not set(driver.ANYTIME) & set(run.not_evaluated)
    ended = {name: t.objective_value() for name, t in run.fitting if name in driver.ANYTIME}
    assert ended == {name: t.objective_value() for name, t in whole.fitting if name in driver.ANYTIME}
    assert out.best.objective_value() == min(ended.values()) < worst.objective_value()
    assert out.from_registry == (out.best.schedule.name in driver.ANYTIME)


@pytest.mark.skipif(not can_fork(), reason="no fork on this platform")
def test_greedy_searches_cut_short_go_on_beside_the_rest(monkeypatch):
    """With a core to spare, the greedy's searches that the warm start cut short go on in their
    child process through the rest of the warm start and the backend's search (``_GreedyBeside``,
    instead of the local search beside the backend), and what they found counts as soon as the
    backend is done: here the time the slowed searches take to end with the registry's own
    schedules, in which the rest finds nothing else. (They start beside the other registry
    schedules too, so they are slowed more than the others take.)"""
    import schedc.solvers.families.greedy as greedy

    monkeypatch.setattr(deadline, "WORKER_OPS", 0)  # (the searches in a child process, as on a large problem)
    monkeypatch.setattr(driver, "_cores", lambda: 2)
    slow_down(monkeypatch, greedy, "greedy_search", 1.0)
    problem = Problem.parse(TIGHT)
    run = evaluate_registry(problem, Budget.seconds(60), greedy_budget=lambda: Budget.seconds(0.1),
                            beside=Budget.seconds(60))
    [searches] = run.paused
    assert searches.fitted and "zb-greedy+partial" in [name for name, _ in run.fitting]
    assert run.beside is not None and run.beside.search is searches  # going on, not paused
    worst = max((t for _, t in run.fitting), key=lambda t: t.objective_value())
    out = driver._Outcome(worst, ("w", worst))
    call = driver._Call(problem, "cbc", run, driver._Clock(None))
    waited = time.perf_counter()
    while not searches.over and time.perf_counter() - waited < 60:  # (the rest of the warm start and the
        time.sleep(0.1)  # backend's turn: they find nothing)
    run.beside.finish(call, out)
    assert searches.over and not run.paused and run.beside is None  # they ended beside, the worker with them
    whole = evaluate_registry(problem)
    ended = {name: t.objective_value() for name, t in run.fitting if name in driver.ANYTIME}
    assert ended == {name: t.objective_value() for name, t in whole.fitting if name in driver.ANYTIME}
    assert not set(driver.ANYTIME) & set(run.not_evaluated)
    assert out.best.objective_value() == min(ended.values()) < worst.objective_value()
    # No core to spare: the searches are paused, for ``_resume`` after the backend.
    monkeypatch.setattr(driver, "_cores", lambda: 1)
    run = evaluate_registry(problem, Budget.seconds(60), greedy_budget=lambda: Budget.seconds(0.1),
                            beside=Budget.seconds(60))
    assert run.beside is None and len(run.paused) == 1
    run.paused[0].stop()


@pytest.mark.skipif(not can_fork(), reason="no fork on this platform")
def test_greedy_searches_start_beside_the_other_registry_schedules(monkeypatch):
    """With a core to spare, the greedy's searches (the registry's slowest to build) start when the
    warm start does, beside the other registry schedules, not after them: here those take 2 s, and
    by then the searches have ended, though their own share of the warm start is nothing. Without
    a spare core they start after the others, and with no share they are not evaluated."""
    monkeypatch.setattr(deadline, "WORKER_OPS", 0)  # (the searches in a child process, as on a large problem)
    monkeypatch.setattr(driver, "_cores", lambda: 2)
    real = driver.evaluate

    def slow(*args, **kwargs):
        time.sleep(2.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "evaluate", slow)
    problem = Problem.parse(TIGHT)
    run = evaluate_registry(problem, Budget.seconds(60), greedy_budget=lambda: Budget.seconds(0.0),
                            beside=Budget.seconds(60))
    for search in run.paused:
        search.stop()
    ended = {name: t.objective_value() for name, t in run.fitting if name in driver.ANYTIME}
    whole = evaluate_registry(problem)
    assert ended == {name: t.objective_value() for name, t in whole.fitting if name in driver.ANYTIME}
    assert not set(driver.ANYTIME) & set(run.not_evaluated)
    monkeypatch.setattr(driver, "_cores", lambda: 1)
    run = evaluate_registry(problem, Budget.seconds(60), greedy_budget=lambda: Budget.seconds(0.0),
                            beside=Budget.seconds(60))
    for search in run.paused:
        search.stop()
    assert set(driver.ANYTIME) <= set(run.not_evaluated)


def _counting():
    yield 0
    for k in range(1, 5):
        time.sleep(0.3)
        yield k


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state T in /proc) within 5 s (a signal may take a moment to land)."""
    for _ in range(100):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not can_fork(), reason="no fork on this platform")
def test_a_paused_worker_is_stopped_and_goes_on_where_it_was():
    with Worker(_counting, (), child=True) as worker:
        pid = worker._proc.pid
        assert worker.next(Budget.seconds(30)) == 0
        assert worker.next(Budget.seconds(0.01), pause=True) is LATE
        assert stopped(pid)
        assert [worker.next(Budget.seconds(30)) for _ in range(4)] == [1, 2, 3, 4]
        assert worker.next(None) is END
    assert gone(pid)
    worker = Worker(_counting, (), child=True)  # never stopped: paused, then dropped
    pid = worker._proc.pid
    assert worker.next(Budget.seconds(0.01), pause=True) in (0, LATE)
    del worker
    assert gone(pid)


@pytest.mark.skipif(not can_fork(), reason="no fork on this platform")
def test_a_paused_worker_dies_with_its_parent():
    script = (
        "import os, signal, time\n"
        "from schedc.solvers.deadline import Budget, Worker\n"
        "def gen():\n"
        "    yield 0\n"
        "    time.sleep(600)\n"
        "    yield 1\n"
        "w = Worker(gen, (), child=True)\n"
        "w.next(Budget.seconds(30))\n"
        "w.next(Budget.seconds(0.01), pause=True)\n"
        "print(w._proc.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert gone(int(run.stdout.split()[0])), "a paused worker outlived its parent"


def _recomputing(limit: float) -> Problem:
    """Three ranks, six microbatches, full and selective recompute, under ``limit``."""
    return Problem.parse(dict(ranks=3, microbatches=6, costs=dict(F=1, B=1, W=1), memory=dict(F=1, B=-0.5, limit=limit),
                              recompute=dict(keep=0.1, selective=dict(time=0.3, keep=0.4))))


def test_a_re_solve_under_a_lower_limit_starts_from_the_old_order_with_policies_fitted():
    """A start that no longer fits (the limit lowered below what it holds) is not dropped where the
    problem allows recompute: its order with mixed policies fitted is judged next, as "start+mix"
    and "start+mix-w", and the result is never worse than the best of them."""
    roomy = _recomputing(limit=3)
    old = solve(roomy, time_limit=2)
    tight = roomy.with_changes(memory=dict(F=1, B=-0.5, limit=1.5))
    assert not simulate(tight, old.schedule).fits
    events = []
    again = solve(tight, time_limit=2, start=old.schedule, progress=events.append)
    notes = [e.note for e in events if e.note]
    assert notes[0] == "warm start: start does not fit"
    fitted = {name: simulate(tight, s) for name, s in fitted_orders(tight, old.schedule, "start")}
    assert fitted and all(t.fits for t in fitted.values())
    for name, t in fitted.items():  # (judged next, each under its name)
        assert f"warm start: {name} {tight.objective} {t.objective_value():.6g}" in notes[1:3]
    assert again.timeline.fits and again.objective <= min(t.objective_value() for t in fitted.values()) + 1e-9

def test_policy_candidates_cut_short_go_on_where_they_stopped(monkeypatch):
    """The warm start's orders with policies (``recomputed_candidates``) that its budget cuts short
    are paused in ``run.paused``; resumed turn by turn, they end with exactly the candidates an
    unlimited run judges."""
    slow_down(monkeypatch, driver, "_policy_candidates", 0.05)
    problem = _recomputing(limit=1.5)
    whole = driver.recomputed_candidates(problem, evaluate_registry(problem), Budget.unlimited(), lambda note: None)
    run = evaluate_registry(problem)
    first = driver.recomputed_candidates(problem, run, Budget.seconds(0.01), lambda note: None)
    [search] = run.paused
    assert first and len(first) < len(whole) and isinstance(search, driver.PolicyCandidates)
    call, found = driver._Call(problem, "cbc", run, driver._Clock(None)), list(first)
    while not search.over:
        found += search.resume(call, Budget.seconds(0.2))
    assert [(name, t.objective_value()) for name, t in found] == [(name, t.objective_value()) for name, t in whole]
    assert search.best == min(t.objective_value() for _, t in whole)


def _polish_budgets(monkeypatch) -> list[tuple[float, float]]:
    """Each call of ``polished_candidates`` from now on, as (the seconds its budget has left, when:
    ``time.perf_counter()``)."""
    seen = []
    real = driver.polished_candidates

    def spy(problem, run, budget, say, *args):
        seen.append((budget.left(), time.perf_counter()))
        return real(problem, run, budget, say, *args)

    monkeypatch.setattr(driver, "polished_candidates", spy)
    return seen


def test_the_polish_has_time_where_the_candidates_with_policies_do_not_end(monkeypatch):
    """Where the stream of candidates with policies outlasts the warm start (large problems), it
    stops at POLICY_SHARE of what is left, so that the polish of the best schedules found
    (``polished_candidates``) still has time; before, it was called with none left."""
    slow_down(monkeypatch, driver, "_policy_candidates", 0.5)  # (never ends within this warm start)
    seen = _polish_budgets(monkeypatch)
    problem = _recomputing(limit=1.5)
    solve(problem, time_limit=8, threads=1)
    assert seen and seen[0][0] > 0.2, seen


def test_the_polish_has_its_share_where_the_steps_before_took_the_warm_start(monkeypatch):
    """However much of the warm start the steps before the polish took (on large problems the
    registry's greedy and the candidates with policies can take all of it), the polish has at least
    POLISH_SHARE of the budget left then; before, it had what the warm start had left, nothing here."""
    limit, began = 11.0, time.perf_counter()  # (a warm start of half of it: at least WINDOW_MIN_SECONDS after)

    def periodic(problem, run, budget, say):  # (a step that runs to the end of the warm start and past it)
        time.sleep(max(0.0, 0.6 * limit - (time.perf_counter() - began)))
        return []

    monkeypatch.setattr(driver, "periodic_candidates", periodic)
    seen = _polish_budgets(monkeypatch)
    problem = _recomputing(limit=1.5)
    solve(problem, time_limit=limit, threads=1)
    (given, at), *_ = seen
    left = limit - (at - began)  # (of the whole budget, then)
    assert given >= 0.9 * driver.POLISH_SHARE * left > 0, seen


def test_policy_candidates_come_likeliest_first():
    """A budget that ends early has judged the likeliest candidates: every registry order without a
    policy fitted with mixed policies, then the greedy's orders as if every microbatch took one
    recompute, then the registry's recomputing schedules refitted, then the one-policy fits."""
    problem = _recomputing(limit=1.5)
    run = evaluate_registry(problem)
    names = [s.name for s in driver._policy_candidates(problem, run.built, {name for name, _ in run.fitting})]
    recomputing = {s.name for _, s in run.built if s.policies()}  # (e.g. 1f1b-recompute+split)

    def step(name: str) -> int:
        if name.startswith("greedy-as-"):
            return 1
        if "+fit-" in name or name.endswith("+offload"):
            return 3
        return 2 if name.split("+mix")[0] in recomputing else 0

    steps = [step(name) for name in names]
    assert set(steps) == {0, 1, 2, 3}, names
    assert steps == sorted(steps), names


def test_the_local_search_beside_the_backend_sends_each_better_schedule():
    """Run here (its generator), the search beside the backend starts from the schedule given
    (1F1B, which fits here and is far from the best) and yields only schedules that fit and are
    each shorter than the last, none shorter than the bound."""
    problem = Problem.parse(TIGHT)
    start = simulate(problem, registry.REGISTRY["1f1b"].build(problem))
    assert start.fits
    lower = lower_bound(problem).value
    found = list(driver._searching_beside(problem, start.schedule, Budget.seconds(3.0), lower))
    spans = [simulate(problem, s).objective_value() for s in found]
    assert found and all(simulate(problem, s).fits for s in found)
    assert spans == sorted(spans, reverse=True) and len(set(spans)) == len(spans)
    assert spans[0] < start.objective_value() and spans[-1] >= lower - 1e-9


def test_every_other_turn_beside_the_backend_searches_as_if_every_microbatch_took_the_quickest_recompute(
        monkeypatch):
    """Where the problem chooses recompute under a limit, the search beside the backend gives every
    other turn to ``mixed.AsIfSearch`` (started from the schedule given), and a schedule it maps
    back is sent when it is shorter; without policies to choose, every turn is the plain
    search."""
    import schedc.solvers.search.mixed as mixed

    problem = Problem.parse(dict(TIGHT, recompute=dict(keep=0.1, selective=dict(time=0.2, keep=0.4))))
    start = simulate(problem, registry.REGISTRY["1f1b"].build(problem))
    lower = lower_bound(problem).value
    shorter = driver.improve(problem, start, Budget.seconds(1.0))
    assert shorter.fits and shorter.objective_value() < start.objective_value()
    seeds, plain_seeds = [], []

    def idle_improve(problem, best, budget, **kw):  # the plain turns find nothing
        plain_seeds.append(kw["seed"])
        return best

    def turn(self, budget, seed):
        seeds.append(seed)
        return shorter if len(seeds) == 2 else None

    monkeypatch.setattr(driver, "improve", idle_improve)
    monkeypatch.setattr(mixed.AsIfSearch, "turn", turn)
    found = list(driver._searching_beside(problem, start.schedule, Budget.seconds(0.3), lower - 100))
    assert len(seeds) >= 2 and all(seed % 2 for seed in seeds) and plain_seeds
    assert all(seed % 2 == 0 for seed in plain_seeds)
    assert [s.ranks for s in found] == [shorter.schedule.ranks]
    seeds.clear()
    list(driver._searching_beside(Problem.parse(TIGHT), start.schedule, Budget.seconds(0.1), lower - 100))
    assert not seeds


def test_the_search_beside_the_backend_runs_only_with_a_core_to_spare(monkeypatch):
    """It takes a core of its own: not where this process may run on one core, nor where the
    caller named the backend's threads; where it runs, its child is gone once collected."""
    from types import SimpleNamespace

    problem = Problem.parse(TIGHT)
    call = SimpleNamespace(problem=problem)
    best = simulate(problem, registry.REGISTRY["1f1b"].build(problem))
    lower = lower_bound(problem).value
    monkeypatch.setattr(driver, "_cores", lambda: 4)
    assert driver._beside(call, Settings(Budget.seconds(10), 1e-4, 2, lower), best) is None  # threads named
    assert driver._beside(call, Settings(Budget.seconds(1), 1e-4, None, lower), best) is None  # too little time
    monkeypatch.setattr(driver, "_cores", lambda: 1)
    assert driver._beside(call, Settings(Budget.seconds(10), 1e-4, None, lower), best) is None
    if not can_fork():
        return
    monkeypatch.setattr(driver, "_cores", lambda: 2)
    worker = driver._beside(call, Settings(Budget.seconds(10), 1e-4, None, lower), best)
    assert worker is not None and worker.in_child
    pid = worker._proc.pid
    time.sleep(1.0)
    last = driver._collected(worker)
    assert last is None or simulate(problem, last).objective_value() < best.objective_value()
    assert not alive(pid)


def _session(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process in session ``sid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append((int(entry.name), cmdline))
    return out


@pytest.mark.skipif(not can_fork() or not Path("/proc/self/stat").exists(), reason="needs Linux")
@pytest.mark.parametrize("in_worker", [False, True], ids=["cbc from the solve", "cbc from its worker"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["TERM", "INT", "KILL"])
def test_a_solve_ended_from_outside_leaves_no_process_behind(tmp_path, signum, in_worker):
    """`schedc solve` ended while CBC runs (a stand-in that sleeps), by SIGTERM (as `timeout` ends
    it), Ctrl-C or SIGKILL: no process it started outlives it, whether CBC runs from the solve's
    process (a small problem) or from a worker (a large one, where the workers' own children are
    CBC's parents), with the local search beside it on another core where there is one."""
    fake = tmp_path / "cbc"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    problem = tmp_path / "binding.json"
    problem.write_text(Problem.parse(BINDING).model_dump_json(exclude_none=True))
    script = (
        "import schedc.solvers.search.cbc as cbc, schedc.solvers.deadline as deadline, schedc.solvers.search.solve as driver\n"
        "real = cbc.cbc\n"
        "def stand_in(**options):\n"
        "    cmd = real(**options)\n"
        f"    cmd.path = {str(fake)!r}\n"
        "    return cmd\n"
        "cbc.cbc = stand_in\n"
        "driver.LOCAL_SEARCH_SHARE = 0.0\n"  # (to the backend at once)
        + ("deadline.WORKER_OPS = 0\n" if in_worker else "")
        + f"import sys; sys.argv = ['schedc', 'solve', {str(problem)!r}, '--time-limit', '300', '-o', 'out.json']\n"
        "from schedc.app.cli import program\n"
        "program()\n"
    )
    log = tmp_path / "solve.log"
    with open(log, "w") as out:
        solve_proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=out, stderr=out,
                                      start_new_session=True)
    try:
        for _ in range(1200):  # until the stand-in runs
            if any("sleep 600" in cmd for _, cmd in _session(solve_proc.pid)) or solve_proc.poll() is not None:
                break
            time.sleep(0.05)
        assert solve_proc.poll() is None, log.read_text()[-2000:]
        assert any("sleep 600" in cmd for _, cmd in _session(solve_proc.pid)), log.read_text()[-2000:]
        os.kill(solve_proc.pid, signum)
        code = solve_proc.wait(timeout=60)
        assert code == {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 1, signal.SIGKILL: -signal.SIGKILL}[signum]
        for _ in range(100):
            if not _session(solve_proc.pid):
                break
            time.sleep(0.05)
        assert _session(solve_proc.pid) == [], "left behind"
    finally:
        for pid, _ in _session(solve_proc.pid):
            os.kill(pid, signal.SIGKILL)
        solve_proc.kill()
        solve_proc.wait()
    if signum != signal.SIGKILL:
        assert not list(tmp_path.glob(".out.json*")) and not (tmp_path / "out.json").exists()


def test_a_re_solve_starts_from_the_schedule_solved_before_the_costs_changed(tmp_path):
    """``solve(start=...)`` and ``schedc solve --start OLD.json``: the old schedule is judged first
    (as "start") and the result is never worse than it on the new costs; a schedule of another
    shape is refused with one line that says what differs."""
    old_problem = Problem.parse(dict(BINDING, name="before"))
    old = solve(old_problem, time_limit=3)
    new_problem = old_problem.with_changes(
        name="after", costs={k: [round(x * f, 3) for x, f in zip(old_problem.cost[k], (1.04, 0.96, 1.05))]
                             for k in ("F", "B", "W")})
    events = []
    again = solve(new_problem, time_limit=3, start=old.schedule, progress=events.append)
    on_new = simulate(new_problem, old.schedule).objective_value()
    assert again.objective <= on_new + 1e-9 and again.timeline.fits
    notes = [e.note for e in events if e.note]
    assert notes[0] == f"warm start: start {new_problem.objective} {on_new:.6g}"  # (judged first, as "start")
    other = Problem.parse(dict(TIGHT))
    with pytest.raises(SchedcError, match="is not a schedule of this problem"):
        solve(other, time_limit=5, start=old.schedule)

    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(old_problem.model_dump_json())
    after.write_text(new_problem.model_dump_json())
    first = CliRunner().invoke(main, ["solve", str(before), "-o", str(tmp_path / "old.json"), "--time-limit", "3"])
    assert first.exit_code == 0, first.output
    result = CliRunner().invoke(main, ["solve", str(after), "-o", str(tmp_path / "new.json"), "--time-limit", "3",
                                       "--start", str(tmp_path / "old.json"), "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[1].split()[1:4] == ["warm", "start:", "start"]
    uniform = str(Path(__file__).resolve().parent.parent / "examples/problems/uniform.yaml")
    refused = CliRunner().invoke(main, ["solve", uniform, "-o", str(tmp_path / "u.json"), "--start",
                                        str(tmp_path / "old.json")])
    assert refused.exit_code == 2
    assert refused.stderr.splitlines()[-1].startswith("error: the start schedule 'ilp' is not a schedule of this problem")
