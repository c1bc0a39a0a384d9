"""draw_gantt writes figures in the asked format; write_trace matches the Timeline op for op."""

import json

import pytest

import schedc.solvers as S
from schedc import Problem, SchedcError, simulate
from schedc.app.plot import draw_gantt, memory_steps, write_trace

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _timeline(name: str, **changes):
    data = dict(ranks=4, microbatches=6, costs=dict(F=1, B=1, W=1), memory=dict(F=1, limit=6, static=0.5))
    problem = Problem.parse({**data, **changes})
    return simulate(problem, S.build(name, problem))


@pytest.fixture(scope="module")
def timelines():
    return [
        _timeline("zb-h1"),
        _timeline("1f1b"),
        _timeline("interleaved-1f1b", chunks=2, microbatches=8, memory=dict(F=0.5, limit=6)),
    ]


@pytest.mark.parametrize("count", [1, 3])
def test_draw_gantt_png(timelines, tmp_path, count):
    path = tmp_path / "sub" / "gantt.png"  # parent directory created on the way
    draw_gantt(timelines[:count], path, title="test")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000


def test_draw_gantt_svg(timelines, tmp_path):
    path = tmp_path / "gantt.svg"
    draw_gantt(timelines, path)
    text = path.read_text()
    assert "<svg" in text


def test_draw_gantt_unknown_suffix(timelines, tmp_path):
    with pytest.raises(SchedcError, match=r"\.png"):
        draw_gantt(timelines, tmp_path / "gantt.jpg")
    assert not (tmp_path / "gantt.jpg").exists()


@pytest.mark.parametrize("index", [0, 2])
def test_write_trace_matches_timeline(timelines, tmp_path, index):
    tl = timelines[index]
    path = tmp_path / "trace.json"
    write_trace(tl, path)
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]

    ops = [e for e in events if e["ph"] == "X"]
    assert len(ops) == tl.schedule.n_ops
    by_op = {(e["tid"], e["args"]["kind"], e["args"]["stage"], e["args"]["microbatch"]): e for e in ops}
    assert len(by_op) == len(ops)
    for r, rank_ops in enumerate(tl.schedule.ranks):
        for op, s, e in zip(rank_ops, tl.start[r], tl.end[r]):
            event = by_op[(r, op.kind, op.stage, op.mb)]
            assert event["name"] == f"{op.kind}{op.mb}" and event["cat"] == op.kind and event["pid"] == 0
            assert event["ts"] == pytest.approx(s * 1000)
            assert event["dur"] == pytest.approx((e - s) * 1000)

    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {r: f"rank {r}" for r in range(tl.problem.ranks)}
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == [tl.schedule.name]

    for r in range(tl.problem.ranks):
        counters = [e for e in events if e["ph"] == "C" and e["name"] == f"memory rank {r}"]
        assert [c["ts"] for c in counters] == sorted(c["ts"] for c in counters)
        final = tl.problem.static_memory[r] + tl.memory[r][-1]
        assert counters[-1]["args"]["memory"] == pytest.approx(final)
        assert final == pytest.approx(tl.problem.static_memory[r])  # a complete schedule frees everything


def test_memory_steps_peak_matches_simulator(timelines):
    for tl in timelines:
        for r, points in enumerate(memory_steps(tl)):
            assert max(level for _, level in points) == pytest.approx(tl.peak_memory[r])


@pytest.mark.parametrize("working", [0, 0.5])
def test_the_memory_panel_draws_the_room_working_memory_leaves(working):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from schedc.app import plot

    t = _timeline("1f1b", memory=dict(F=1, limit=6, static=0.5, working=[working, 0, working, 0]))
    fig, ax = plt.subplots()
    try:
        plot._draw_memory(ax, t)
        labelled = {line.get_label(): line for line in ax.get_lines()}
    finally:
        plt.close(fig)
    assert labelled["limit"].get_ydata()[0] == 6
    if working:  # ranks 0 and 2 (one stage each) have 0.5, the others none: one line at 5.5
        assert labelled["limit - working memory"].get_ydata()[0] == pytest.approx(5.5)
        assert t.peak_memory[0] == pytest.approx(max(level for _, level in memory_steps(t)[0]) + 0.5)
    else:
        assert "limit - working memory" not in labelled


@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_the_critical_path_is_outlined_with_a_line_for_each_rank_change(objective, tmp_path):
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.figure import Figure

    from schedc.app import plot
    from schedc.critical import critical_path

    t = _timeline("zb-h1", comm=0.25, objective=objective)
    c = critical_path(t)
    ax = Figure().subplots()
    plot._draw_critical(ax, c)
    (boxes,) = [x for x in ax.collections if isinstance(x, PolyCollection)]
    (hops,) = [x for x in ax.collections if isinstance(x, LineCollection)]
    drawn = sorted((round(min(v[:, 0]), 9), round(max(v[:, 0]), 9), round(v[:, 1].mean())) for v in
                   (p.vertices for p in boxes.get_paths()))
    assert drawn == sorted((round(max(s, c.window[0]), 9), round(e, 9), r) for r, s, e in c.times)
    assert len(hops.get_segments()) == len(c.runs()) - 1 > 0
    path = tmp_path / "critical.png"
    draw_gantt([t], path, critical={0: c})
    assert path.read_bytes().startswith(PNG_SIGNATURE)
