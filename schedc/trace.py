"""Traces of executed steps: what the runtime records, written as one JSON file that is both a
Chrome / Perfetto trace (``traceEvents``) and data for ``schedc show --measured``.

    {"traceEvents": [...], "displayTimeUnit": "ms",
     "schedc": {"format": "schedc.trace", "version": 1, "schedule": NAME, "step": K,
                "ranks": [[{"instr": "F0@s0", "op": "F", "stage": 0, "mb": 0, "start": ms, "end": ms}, ...], ...]}}

Times are milliseconds from the earliest instruction of the step on any rank (clocks of one
host; ranks on several hosts are only as aligned as their clocks). With
``PipelineRuntime(..., measure_memory=True)`` each event also has ``memory`` (MiB after the
instruction) and ``memory_peak`` (MiB during it): the rank's activation memory relative to the
start of the step; the Perfetto trace then has a counter per rank ("activation memory rank R").

The instructions of a rank's copy lane (offloads O and reloads L, on a side stream beside compute)
are a track of their own in the Perfetto trace ("rank R copy", right under the rank's track), and
``measured_timeline`` reads them as the copy lane's times.
"""

from __future__ import annotations

import json
from pathlib import Path

from schedc.errors import SchedcError
from schedc.inputs import MAX_DATA_BYTES, one_line, parse_json, read_text, shorten
from schedc.kinds import BY_NAME, ROWS
from schedc.schedule import Op, Schedule
from schedc.simulate import Timeline, with_times

FORMAT = "schedc.trace"


def write_trace_file(path: str | Path, schedule_name: str, step: int, ranks: list[list[dict]]) -> None:
    """``ranks``: per rank, the executed instructions as dicts with instr, op, stage, mb and
    start / end in seconds on a shared clock."""
    t0 = min((e["start"] for events in ranks for e in events), default=0.0)
    data = [
        [dict(e, start=1e3 * (e["start"] - t0), end=1e3 * (e["end"] - t0)) for e in events] for events in ranks
    ]
    trace = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{schedule_name} (measured)"}}]
    p = len(data)
    copy = any(_on_copy_lane(e) for events in data for e in events)
    for r, events in enumerate(data):
        trace.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        if copy:  # each rank's copy lane a track of its own, right under the rank's
            trace += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": p + r, "args": {"name": f"rank {r} copy"}},
                      {"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": r, "args": {"sort_index": 2 * r}},
                      {"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": p + r, "args": {"sort_index": 2 * r + 1}}]
        trace += [
            {"name": e["instr"], "cat": e["op"], "ph": "X", "pid": 0, "tid": p + r if _on_copy_lane(e) else r,
             "ts": 1e3 * e["start"], "dur": 1e3 * (e["end"] - e["start"]),
             "args": {"stage": e["stage"], "microbatch": e["mb"]}}
            for e in events
        ]
        trace += [
            {"name": f"activation memory rank {r} (MiB)", "ph": "C", "pid": 0, "ts": 1e3 * t, "args": {"MiB": level}}
            for t, level in _memory_points(events)
        ]
    doc = {
        "traceEvents": trace,
        "displayTimeUnit": "ms",
        "schedc": {"format": FORMAT, "version": 1, "schedule": schedule_name, "step": step, "ranks": data},
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _on_copy_lane(event: dict) -> bool:
    """Whether a traced instruction ran on its rank's copy lane (an offload or a reload)."""
    kind = BY_NAME.get(event["op"])
    return kind is not None and ROWS[kind].lane == "copy"


def _memory_points(events: list[dict]) -> list[tuple[float, float]]:
    """Step points (ms, MiB) of one rank's measured memory: at each instruction's start its
    peak, at its end the level after it, in time order (copies overlap compute); empty without
    measurements."""
    if not events or any("memory" not in e for e in events):
        return []
    points = [(0.0, 0.0)]
    for e in events:
        points += [(e["start"], e["memory_peak"]), (e["end"], e["memory"])]
    return sorted(points, key=lambda x: x[0])  # stable: an instruction's own points stay in order


def measured_memory(path: str | Path) -> list[list[tuple[float, float]]] | None:
    """Per rank, the measured activation memory of a trace file as step points (ms, MiB), as
    ``schedc.app.plot.memory_steps`` gives the simulated ones; None if the run did not measure it."""
    ranks = _read(path)["ranks"]
    points = [_memory_points(events) for events in ranks]
    return points if all(points) else None


def _read(path: str | Path) -> dict:
    """A trace file's "schedc" part, its structure checked (a malformed file is a one-line error)."""
    doc = parse_json(read_text(path, what="trace file", max_bytes=MAX_DATA_BYTES), source=str(path))
    data = doc.get("schedc") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SchedcError(f"{one_line(str(path), 120)}: not a schedc trace file (no \"schedc\" part of format {FORMAT})")
    ranks = data.get("ranks")
    if not isinstance(ranks, list) or not all(isinstance(events, list) for events in ranks):
        raise SchedcError(f"{one_line(str(path), 120)}: not a schedc trace file (\"ranks\" is not a list per rank)")
    for r, events in enumerate(ranks):
        for i, e in enumerate(events):
            problem = _bad_event(e)
            if problem:
                raise SchedcError(f"{one_line(str(path), 120)}: rank {r}, event {i}: {problem}")
    return data


def _bad_event(e) -> str:
    """What is wrong with one traced instruction, or ''."""
    if not isinstance(e, dict):
        return f"expected an object, got {shorten(e)}"
    for key, kind in (("op", str), ("stage", int), ("mb", int), ("start", (int, float)), ("end", (int, float))):
        if not isinstance(e.get(key), kind) or isinstance(e.get(key), bool):
            return f"{key} must be {'text' if kind is str else 'a number'}, got {shorten(e.get(key))}"
    if e["end"] < e["start"]:
        return f"ends ({e['end']}) before it starts ({e['start']})"
    for key in ("memory", "memory_peak"):
        if key in e and (isinstance(e[key], bool) or not isinstance(e[key], (int, float))):
            return f"{key} must be a number, got {shorten(e[key])}"
    return ""


def measured_timeline(path: str | Path, problem, schedule: Schedule) -> Timeline:
    """The ops' measured times from a trace file, every lane's (the compute ops, and the offloads
    and reloads of the copy lane where the schedule has one), as a Timeline of ``schedule`` (which
    must be the schedule that ran)."""
    data = _read(path)
    if data.get("schedule") != schedule.name:
        raise SchedcError(f"{path}: traces schedule {data.get('schedule')!r}, not {schedule.name!r}")
    ranks = data["ranks"]
    if len(ranks) != len(schedule.ranks):
        raise SchedcError(f"{path}: has {len(ranks)} ranks, the schedule {len(schedule.ranks)}")
    times: dict[str, tuple[list, list]] = {lane: ([], []) for lane in schedule.lanes}
    for r, events in enumerate(ranks):
        ops = [e for e in events if e["op"] in BY_NAME]  # the op instructions: the op kinds' names
        for lane, per_rank in schedule.lanes.items():
            ran = [e for e in ops if ROWS[BY_NAME[e["op"]]].lane == lane]
            if [Op(e["op"], e["stage"], e["mb"]) for e in ran] != list(per_rank[r]):
                raise SchedcError(f"{path}: rank {r} ran other {lane} ops than the schedule {schedule.name!r}")
            times[lane][0].append([e["start"] for e in ran])
            times[lane][1].append([e["end"] for e in ran])
        if not schedule.copy and any(_on_copy_lane(e) for e in ops):
            raise SchedcError(f"{path}: rank {r} ran copy ops, the schedule {schedule.name!r} has none")
    copy_start, copy_end = times.get("copy", ((), ()))
    return with_times(problem, schedule.renamed(f"{schedule.name} (measured)"), *times["compute"], copy_start, copy_end)
