"""Hypothesis strategies shared by the solver tests."""

from hypothesis import strategies as st

from schedc import Problem


def working_memory(draw, n: int):
    """An optional ``memory.working``: None (left out), one amount, or one per stage."""
    amount = st.floats(0, 2)
    return draw(st.one_of(st.none(), amount, st.lists(amount, min_size=n, max_size=n)))


def with_working(memory: dict, working) -> dict:
    return memory if working is None else {**memory, "working": working}


def add_working(problem: Problem, working: float | None, same_room: bool) -> Problem:
    """``problem`` with working memory ``working`` on every stage (None: unchanged); a limit is
    raised by as much (``same_room``: the same room for the activations) or only as far as the
    least any schedule needs."""
    if working is None:
        return problem
    memory = {"working": working}
    if problem.memory_limit is not None:
        memory["limit"] = [x + working if same_room else max(x, problem.min_memory(r) + working)
                           for r, x in enumerate(problem.memory_limit)]
    return problem.with_changes(memory=memory)


@st.composite
def small_problems(draw, max_microbatches=lambda p: 4):
    """Problems small enough for tests/exhaustive.py: p <= 3, integer costs, optional limit."""
    p = draw(st.integers(1, 3))
    m = draw(st.integers(1, max_microbatches(p)))
    cost = st.lists(st.integers(1, 4), min_size=p, max_size=p)
    problem = Problem.parse(
        dict(
            ranks=p, microbatches=m, costs=dict(F=draw(cost), B=draw(cost), W=draw(cost)),
            comm=draw(st.sampled_from([0, 0.5])), objective=draw(st.sampled_from(["makespan", "span"])),
            memory=dict(F=1, B=-0.5),
        )
    )
    if draw(st.booleans()):
        problem = problem.with_changes(memory={"limit": draw(st.sampled_from([1, 1.5, 2, 3]))})
    return problem


@st.composite
def pipeline_problems(draw, max_microbatches: int = 24):
    """Problems for the schedule zoo: p <= 8, v in {1, 2}, loop, V or explicit placement, float costs."""
    p = draw(st.integers(1, 8))
    v = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, max_microbatches))
    n = p * v
    kind = draw(st.sampled_from(["loop", "v", "explicit"]))
    if kind == "explicit":
        placement = draw(st.permutations([s % p for s in range(n)]))
    else:
        placement = kind
    cost = st.floats(0.05, 20, allow_nan=False, allow_infinity=False)
    per_stage = lambda: draw(st.one_of(cost, st.lists(cost, min_size=n, max_size=n)))  # noqa: E731
    comm = draw(st.one_of(st.just(0.0), st.floats(0, 5)))
    return Problem.parse(
        dict(
            ranks=p,
            microbatches=m,
            chunks=v,
            placement=placement,
            costs=dict(F=per_stage(), B=per_stage(), W=per_stage()),
            comm=comm,
            memory=dict(F=(f := draw(st.floats(0, 4))), B=-f * draw(st.floats(0, 1))),
        )
    )
