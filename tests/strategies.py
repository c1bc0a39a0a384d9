"""Hypothesis strategies shared by the solver tests."""

from hypothesis import strategies as st

from schedc import Problem


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
