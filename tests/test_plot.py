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


# ---- recompute and offload: R and S on the compute lanes, the copy lane a thin row per rank ----


def _policy_timeline(**changes):
    from schedc.solvers.families.memtime import with_policies

    data = dict(ranks=2, microbatches=4, costs=dict(F=1, B=1, W=1), memory=dict(F=2, static=1),
                recompute=dict(keep=0.5, selective=dict(time=0.25, keep=1)), offload=dict(time=0.5))
    problem = Problem.parse({**data, **changes})
    chosen = {(0, 0): "R", (0, 1): "O", (1, 2): "S", (0, 3): "O", (1, 0): "O"}
    return simulate(problem, with_policies(problem, S.build("zb-h1", problem), chosen))


def test_write_trace_puts_the_copy_lane_on_its_own_track(tmp_path):
    t = _policy_timeline()
    write_trace(t, tmp_path / "trace.json")
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 0 copy", 3: "rank 1 copy"}
    order = {e["tid"]: e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"}
    assert sorted(order, key=order.get) == [0, 2, 1, 3]
    ops = {(e["tid"], e["args"]["kind"], e["args"]["stage"], e["args"]["microbatch"]): e
           for e in events if e["ph"] == "X"}
    assert len(ops) == t.schedule.n_ops
    for op, (r, s, e) in t.op_times().items():
        tid = r if op.kind in ("F", "B", "W", "BW", "R", "S") else 2 + r
        event = ops[(tid, op.kind, op.stage, op.mb)]
        assert event["ts"] == pytest.approx(s * 1000) and event["dur"] == pytest.approx((e - s) * 1000)


def test_memory_steps_follow_the_simulated_levels_with_recompute_and_offload():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from schedc.solvers.families.memtime import with_policies
    from tests.strategies import pipeline_problems
    from tests.test_critical import random_schedule

    @settings(max_examples=40, deadline=None)
    @given(st.data(), pipeline_problems(max_microbatches=5))
    def check(data, problem):
        f = problem.mem[problem.kinds[0]]
        keep = [data.draw(st.floats(0, 1)) * a for a in f]
        problem = problem.with_changes(recompute=dict(keep=keep, selective=dict(time=0.1, keep=[0.5 * a for a in f])),
                                       offload=dict(time=data.draw(st.floats(0.05, 5))))
        pairs = st.tuples(st.integers(0, problem.n_stages - 1), st.integers(0, problem.microbatches - 1))
        chosen = data.draw(st.dictionaries(pairs, st.sampled_from("RSO")))
        t = simulate(problem, with_policies(problem, random_schedule(problem, data.draw(st.randoms())), chosen))
        for r, points in enumerate(memory_steps(t)):
            assert max(level for _, level in points) + problem.working_memory[r] == pytest.approx(t.peak_memory[r])
            assert points[-1][1] == pytest.approx(problem.static_memory[r])  # everything freed
            assert [x for x, _ in points] == sorted(x for x, _ in points)

    check()


def test_the_gantt_chart_draws_recompute_boxes_and_a_thin_copy_row(tmp_path):
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure

    from schedc.app import plot
    from schedc.critical import critical_path

    t = _policy_timeline()
    ax = Figure().subplots()
    plot._draw_ops(ax, t, pt_per_unit=50.0, row_pt=40.0)
    (boxes,) = [x for x in ax.collections if isinstance(x, PolyCollection)]
    drawn = sorted((round(min(v[:, 0]), 9), round(min(v[:, 1]), 3), round(max(v[:, 1]), 3))
                   for v in (p.vertices for p in boxes.get_paths()))
    want = sorted((round(s, 9), round(r + (0.26 if op.kind in ("O", "L") else -0.4), 3),
                   round(r + (0.44 if op.kind in ("O", "L") else 0.22), 3)) for op, (r, s, e) in t.op_times().items())
    assert drawn == want
    colors = {tuple(round(c, 6) for c in rgba[:3]) for rgba in boxes.get_facecolors()}
    from matplotlib.colors import to_rgb

    for kind in ("R", "S", "O", "L"):
        assert tuple(round(c, 6) for c in to_rgb(plot.KIND_COLORS[kind])) in colors
    c = critical_path(t)
    path = tmp_path / "policies.png"
    draw_gantt([t], path, critical={0: c})
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert "recomputes 1, selectively recomputes 1, offloads 3 (stage, microbatch)s" in plot._block_title(t)
    assert "recomputes" not in plot._block_title(_timeline("zb-h1"))


def test_a_measured_trace_with_a_copy_lane_reads_back_as_its_timeline(tmp_path):
    from schedc.trace import measured_timeline, write_trace_file

    t = _policy_timeline()
    events = [[] for _ in range(t.problem.ranks)]
    for op, (r, s, e) in sorted(t.op_times().items(), key=lambda x: x[1][1]):
        events[r].append({"instr": str(op), "op": op.kind.value, "stage": op.stage, "mb": op.mb,
                          "start": s / 1e3, "end": e / 1e3})  # seconds; the file keeps ms
    write_trace_file(tmp_path / "run.json", t.schedule.name, 0, events)
    run = measured_timeline(tmp_path / "run.json", t.problem, t.schedule)
    for field in ("start", "end", "copy_start", "copy_end"):
        assert len(getattr(run, field)) == len(getattr(t, field)) == 2
        for a, b in zip(getattr(run, field), getattr(t, field)):
            assert a == pytest.approx(b)
    assert run.peak_memory == pytest.approx(t.peak_memory)
    trace = json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    assert {e["args"]["name"] for e in trace if e["name"] == "thread_name"} == {
        "rank 0", "rank 1", "rank 0 copy", "rank 1 copy"}
    assert {e["tid"] for e in trace if e["ph"] == "X" and e["cat"] in ("O", "L")} == {2, 3}
    # A trace of the plain schedule is not a run of this one: its copy ops are missing.
    plain = [[e for e in rank if e["op"] not in ("O", "L")] for rank in events]
    write_trace_file(tmp_path / "plain.json", t.schedule.name, 0, plain)
    with pytest.raises(SchedcError, match="rank 0 ran other copy ops than the schedule"):
        measured_timeline(tmp_path / "plain.json", t.problem, t.schedule)


def _drawn(monkeypatch, timelines, **kw):
    """The figure draw_gantt saves, rendered (Agg): per Gantt chart (axes with boxes), its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection

    from schedc.app import plot

    saved = []
    monkeypatch.setattr(plot, "_save", lambda fig, path: saved.append(fig))
    draw_gantt(timelines, "unused.png", **kw)
    (fig,) = saved
    FigureCanvasAgg(fig).draw()
    charts = [ax for ax in fig.axes if any(isinstance(c, PolyCollection) for c in ax.collections)]
    assert len(charts) == len(timelines)
    return fig, charts


def _compare_timelines():
    """Schedules of one problem as `schedc compare` draws them: 2bw's 8 rounds take 201 units, the
    others 27-33; a DualPipe with pairs run together; an interleaved one with 64 ops per rank."""
    uniform = Problem.parse(dict(ranks=4, microbatches=8, costs=dict(F=1, B=1, W=1), memory=dict(F=2, B=-1, W=-1)))
    bidir = Problem.parse(dict(ranks=4, microbatches=8, costs=dict(F=1, B=1, W=0.8), comm=0.05,
                               replicas=dict(count=2, sync=0.5), memory=dict(F=1, static=4)))
    big = Problem.parse(dict(ranks=8, microbatches=32, chunks=2, costs=dict(F=1, B=1, W=0.5), memory=dict(F=1, B=-0.5)))
    return [simulate(p, S.build(name, p)) for p, name in
            ((uniform, "1f1b"), (uniform, "zb-h1"), (uniform, "2bw"), (bidir, "dualpipe"), (big, "interleaved-1f1b"))]


def test_each_chart_has_its_own_time_axis_and_an_asynchronous_one_says_its_rounds(monkeypatch):
    """compare.png put all charts on one 0-200 axis set by 2bw's 8 rounds: the others filled 15 %
    of its width. Now each its own: the whole timeline, or 2bw's first round (its title says so)."""
    timelines = _compare_timelines()
    fig, charts = _drawn(monkeypatch, timelines)
    for t, ax in zip(timelines, charts):
        end = t.makespan if t.schedule.synchronous else t.round_ends()[0]
        assert ax.get_xlim() == pytest.approx((0, end * 1.02))
    two_bw = charts[2].get_title(loc="left")
    assert "8 rounds of 8 microbatches; round 1 shown, 0-33 of 201" in two_bw, two_bw
    # The simulated and a measured run of one schedule share theirs when asked (schedc show --measured).
    _, charts = _drawn(monkeypatch, timelines[:2], shared_axis=True)
    assert charts[0].get_xlim() == charts[1].get_xlim() == pytest.approx((0, 33 * 1.02))


def test_every_box_carries_its_microbatch_inside_it(monkeypatch):
    """Every compute op shown has a label, its microbatch, at 6 points or more, drawn inside its
    own box (so no two labels overlap): F boxes had none in compare.png, and DualPipe's pairs, drawn
    over each other, had their two numbers printed on top of one another."""
    from schedc.app import plot

    timelines = _compare_timelines()
    fig, charts = _drawn(monkeypatch, timelines)
    renderer = fig.canvas.get_renderer()
    for t, ax in zip(timelines, charts):
        x0, x1 = ax.get_xlim()
        x1 /= 1.02  # the time shown; the axis leaves 2 % of margin after it
        boxes = [path.vertices for c in ax.collections for path in c.get_paths()]
        texts = list(ax.texts)
        shown = [(op, s, e) for op, (r, s, e) in t.op_times().items()
                 if op.kind in ("F", "B", "W", "BW") and min(e, x1) > max(s, x0)]
        assert len(texts) == len(shown), t.schedule.name
        assert sorted(tx.get_text() for tx in texts) == sorted(str(op.mb) for op, _, _ in shown)
        for tx in texts:
            assert tx.get_fontsize() >= plot.MIN_FONT
            x, y = tx.get_position()
            (inside,) = [v for v in boxes
                         if v[:, 0].min() <= x <= v[:, 0].max() and v[:, 1].min() <= y <= v[:, 1].max()]
            corners = ax.transData.transform([(max(inside[:, 0].min(), x0), inside[:, 1].min()),
                                              (min(inside[:, 0].max(), x1), inside[:, 1].max())])
            extent = tx.get_window_extent(renderer)
            assert corners[:, 0].min() - 0.5 <= extent.x0 and extent.x1 <= corners[:, 0].max() + 0.5, tx.get_text()
            assert corners[:, 1].min() - 0.5 <= extent.y0 and extent.y1 <= corners[:, 1].max() + 0.5, tx.get_text()
