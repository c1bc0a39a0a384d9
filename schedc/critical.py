"""critical_path(timeline) -> CriticalPath: which chain of ops sets a timeline's objective.

The ops of a schedule form a DAG: an edge from each producer to its consumer (the data
dependencies of ``schedc.schedule.producers``, plus ``comm`` when they sit on different ranks:
``schedc.simulate.dependencies``) and from each op to the next one on its lane (each lane of a rank,
the compute lane and the copy lane of its offloads and reloads, runs its ops in order).
``simulate`` starts every op as soon as its predecessors in that DAG allow, so the end of an op
is the longest path into it, weighted by op durations and latencies, and the makespan is the
DAG's longest path. ``waits_of`` gives each op's predecessors; ``critical_path`` walks back from
the op that ends the objective, each step to a predecessor that held the op until its start (so
the chain is a longest path into that op, found in one pass over it, no graph library needed):

- makespan: the op that ends last (the lowest rank among ties), so the chain starts at time 0 and
  its durations and latencies add up to the makespan;
- span: the last op of the rank whose span is the longest (the lowest rank among ties); the chain
  is the part of the longest path into that op that lies in the rank's window, from its first
  op's start (clipped: the first op listed, or the latency before it, may begin earlier).

Each op on the chain says how it waited for the op before it: ``"data"``, for that op's result
(``latency``: ``comm`` when it came from another rank); ``"rank"``, for its rank's lane, busy with
the op before it (an op whose previous op on its lane is also its producer waited for "data");
``"issue"``, a copy op for the compute op it is issued after (``Schedule.after``); ``"together"``,
a collective (RS) for a member on another rank to come to it (``together``); or ``"pair"``, an
overlapped pair's backward for its forward (``Schedule.pairs``): the pair runs as one op, from when
the inputs of both halves have arrived, so the chain reaches it through the forward, which waits
for the backward's producers too and carries the pair's time. The chain may run through the copy
lane: a backward that waited for its reload L, the reload for the copy lane busy with other copies.
``compute`` counts the chain's time on compute lanes (a pair once), ``copy`` on copy lanes. Where
both bound at once (the rank got free the moment a producer's result arrived) the chain takes the
rank's order (the lane's predecessor comes first), so it stays on a busy rank rather than hopping
between ranks for a tie; float noise in sums of costs can tip such a tie either way, and either
choice is a critical chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from schedc.kinds import ROWS
from schedc.schedule import Op
from schedc.simulate import Timeline, dependencies, durations, together

@dataclass(frozen=True)
class Wait:
    """How an op on the chain waited for the op before it."""

    kind: str  # "data": for that op's result; "rank": for its rank, busy with that op; "issue": a copy op
    # for the compute op it is issued after; "together": a collective for a member on another rank;
    # "pair": an overlapped pair's backward for its forward, with which it starts (and ends)
    latency: float  # between that op's end and this op's start (comm across ranks, else 0)


@dataclass(frozen=True)
class CriticalPath:
    timeline: Timeline
    objective: str  # "makespan" or "span"
    rank: int  # the rank whose last op ends the chain
    ops: tuple[Op, ...]  # in time order
    waits: tuple[Wait | None, ...]  # per op, how it waited for the one before (None: the first, at 0)
    window: tuple[float, float]  # the time the objective measures: (0, makespan) or the rank's span
    times: tuple[tuple[int, float, float], ...]  # per op: (rank, start, end) in the timeline

    @property
    def value(self) -> float:
        """The objective's value the chain explains: the window's length."""
        return self.window[1] - self.window[0]

    def _lane_time(self, lane: str) -> tuple[float, ...]:
        t0, t1 = self.window
        out = [0.0] * self.timeline.problem.ranks
        for op, (r, s, e), w in zip(self.ops, self.times, self.waits):
            if ROWS[op.kind].lane == lane and not (w is not None and w.kind == "pair"):  # (a pair: once)
                out[r] += max(0.0, min(e, t1) - max(s, t0))
        return tuple(out)

    def compute(self) -> tuple[float, ...]:
        """Per rank, the time its compute ops on the chain run within the window."""
        return self._lane_time("compute")

    def copy(self) -> tuple[float, ...]:
        """Per rank, the time its copy ops (offload O, reload L) on the chain run within the window."""
        return self._lane_time("copy")

    def reduce(self) -> tuple[float, ...]:
        """Per rank, the time its gradient all-reduces (AR, the comm lane) on the chain run within the window."""
        return self._lane_time("comm")

    def comm(self) -> float:
        """The time within the window that the chain spends in transfers between ranks (the
        latencies of its data waits)."""
        t0, t1 = self.window
        return sum(
            (max(0.0, min(s, t1) - max(s - w.latency, t0))
             for (_, s, _), w in zip(self.times, self.waits) if w is not None and w.latency > 0),
            0.0,
        )

    def runs(self) -> list[tuple[int, list[Op]]]:
        """The chain cut where it changes rank or lane: (rank, its consecutive ops on the chain on
        one lane)."""
        out: list[tuple[int, list[Op]]] = []
        for op, (r, _, _) in zip(self.ops, self.times):
            if out and out[-1][0] == r and ROWS[out[-1][1][-1].kind].lane == ROWS[op.kind].lane:
                out[-1][1].append(op)
            else:
                out.append((r, [op]))
        return out

    def describe(self, max_runs: int = 7) -> str:
        """Two lines: what the chain's time goes to (``headline``), and the chain as runs of ops on
        one rank (the middle left out past ``max_runs`` runs)."""
        runs = [
            f"rank {r}{'' if (lane := ROWS[ops[0].kind].lane) == 'compute' else ' ' + lane} "
            + (f"{ops[0]}" if len(ops) == 1 else f"{ops[0]} .. {ops[-1]} ({len(ops)} ops)")
            for r, ops in self.runs()
        ]
        if len(runs) > max_runs:
            head = (max_runs + 1) // 2
            tail = max_runs - head
            runs = [*runs[:head], f"... {len(runs) - max_runs} more ...", *runs[len(runs) - tail:]]
        return self.headline() + "\n  " + " -> ".join(runs)

    def headline(self) -> str:
        """One line: what the chain's time goes to (compute per rank, transfers)."""
        value = self.value
        pct = lambda x: f"{100 * x / value:.1f}%" if value > 0 else "-"  # noqa: E731
        compute = self.compute()
        top = sorted((r for r, c in enumerate(compute) if c > 0), key=lambda r: -compute[r])
        shown = [r for r in top[:3] if compute[r] >= 0.05 * value] or top[:1]
        parts = ", ".join(f"rank {r} {pct(compute[r])}" for r in shown)
        what = (f"the makespan {value:.6g}" if self.objective == "makespan" else
                f"rank {self.rank}'s span {value:.6g} ({self.window[0]:.6g} to {self.window[1]:.6g})")
        comm, copy, reduce = self.comm(), sum(self.copy()), sum(self.reduce())
        return (f"critical path: {len(self.ops)} ops set {what}: compute {pct(sum(compute))} ({parts})"
                + (f", copy {pct(copy)}" if copy > 0 else "") + (f", all-reduce {pct(reduce)}" if reduce > 0 else "")
                + (f", comm {pct(comm)}" if comm > 0 else ""))

    def summary(self) -> dict:
        """Plain data for --json: the window, compute time per rank and comm time within it, and
        every op of the chain with its times and how it waited for the one before; where the
        schedule has a copy lane, also the copy time per rank, where the problem has gradient
        all-reduces, their time per rank, and then each op's lane."""
        copy, reduces = bool(self.timeline.schedule.copy), bool(self.timeline.comm)
        return {
            "objective": self.objective,
            "rank": self.rank,
            "window": list(self.window),
            "compute": list(self.compute()),
            **({"copy": list(self.copy())} if copy else {}),
            **({"all_reduce": list(self.reduce())} if reduces else {}),
            "comm": self.comm(),
            "ops": [
                {"rank": r, "kind": op.kind.value, "stage": op.stage, "mb": op.mb, "start": s, "end": e,
                 "wait": None if w is None else w.kind, "latency": 0.0 if w is None else w.latency,
                 **({"lane": ROWS[op.kind].lane} if copy or reduces else {})}
                for op, (r, s, e), w in zip(self.ops, self.times, self.waits)
            ],
        }


class _Itself(dict):
    """An index that maps each op to itself: ``dependencies`` then names the ops, not positions
    (an Op also where it looks one up by a plain tuple)."""

    def __missing__(self, op: tuple) -> Op:
        return Op._make(op)


def waits_of(timeline: Timeline) -> Callable[[Op], dict[Op, Wait]]:
    """``before(op)``: the ops ``op`` waits for in the timeline's DAG, each with how: the op before
    it on its rank's lane ("rank"), the compute op a copy op is issued after ("issue"), a
    collective's members on other ranks ("together"), and its producers ("data", ``latency`` comm
    across ranks; an edge that is both is "data"), in that order, the lane's first (among
    predecessors that bind at once the chain takes the first); an overlapped pair's backward waits
    for its forward alone ("pair"), and the forward for the backward's producers too. Worked out
    per op when asked, so a chain costs what it is long, not what the schedule is."""
    problem, schedule = timeline.problem, timeline.schedule
    where = schedule.locate()
    lanes = [lane_ops for per_rank in timeline.lanes.values() for lane_ops in per_rank]
    previous = {b: a for lane_ops in lanes for a, b in zip(lane_ops, lane_ops[1:])}
    paired = schedule.paired() if schedule.pairs else {}
    forward_of = {b: f for f, b in paired.items()}
    anchors = timeline.anchors()
    joint = together(problem, timeline.comm, anchors)  # a collective waits for its members

    def data(op: Op) -> list[tuple[Op, float]]:
        return dependencies(problem, [op], _Itself(), where, {}, paired=paired)[0]

    def before(op: Op) -> dict[Op, Wait]:
        if op in forward_of:  # a pair runs as one op, from when both halves may start: its forward's
            return {forward_of[op]: Wait("pair", 0.0)}  # waits hold the backward's too (below)
        out = {previous[op]: Wait("rank", 0.0)} if op in previous else {}
        if op in anchors:
            out[anchors[op]] = Wait("issue", 0.0)
        for d in joint.get(op, ()):
            out.setdefault(d, Wait("together", 0.0))
        for d, latency in data(op) + (data(paired[op]) if op in paired else []):
            if d != op:
                out[d] = Wait("data", latency)  # (a lane's edge keeps its place)
        return out

    return before


def critical_path(timeline: Timeline, objective: str | None = None) -> CriticalPath:
    """The chain of ops that sets ``timeline``'s objective (the problem's unless given; "steady",
    the time per microbatch of iterations run back to back, as the makespan of those the timeline
    ran, as ``Timeline.rank_time`` takes it): see the module's docstring. ``timeline`` must come
    from ``simulate`` (measured times do not follow the DAG)."""
    objective = objective or timeline.problem.objective
    if objective == "steady":
        objective = "makespan"
    if objective not in ("makespan", "span"):
        raise ValueError(f"objective must be 'makespan' or 'span', not {objective!r}")
    # Every rank holds a stage, so runs compute ops; its last compute op ends it, since every copy
    # op (an offload, its reload) comes before the backward that waits for the reload, unless a
    # gradient all-reduce ends after it (``Timeline.last_op``).
    rank = timeline.objective_rank(objective)
    window = timeline.window(rank, objective)
    before = waits_of(timeline)
    times = timeline.op_times()
    tol = timeline.problem.time_tol
    # ``simulate`` starts each op when the last of its predecessors lets it: back from the last op,
    # each step to a predecessor that ends (plus its latency) just as the op starts is a longest
    # path, and it reaches an op that starts at 0.
    chain, waits = [timeline.last_op(rank)], []
    while not tol.eq(start := times[chain[-1]][1], 0.0):
        step = next(((op, w) for op, w in before(chain[-1]).items()
                     if tol.eq(times[op][1 if w.kind == "pair" else 2] + w.latency, start)), None)
        if step is None:
            raise ValueError(f"{timeline.schedule.name}: {chain[-1]} starts at {start:g}, when none of the ops it waits"
                             " for lets it: critical_path needs the times simulate() gives, not measured ones")
        chain.append(step[0])
        waits.append(step[1])
    chain.reverse()
    waits = [None, *reversed(waits)]
    paired = timeline.schedule.paired() if timeline.schedule.pairs else {}
    length = sum(durations(timeline.problem, chain, paired)) + sum(w.latency for w in waits[1:])
    if not tol.eq(length, window[1]):
        raise ValueError(f"{timeline.schedule.name}: the chain into {chain[-1]} takes {length:g} but it ends at"
                         f" {window[1]:g}: critical_path needs the times simulate() gives, not measured ones")
    # Keep what lies in the window: ops, or the transfer before them, that end after it opens.
    keep = next(k for k, op in enumerate(chain) if tol.gt(times[op][2], window[0]))
    chain = chain[keep:]
    return CriticalPath(timeline, objective, rank, tuple(chain), tuple(waits[keep:]), window,
                        tuple(times[op] for op in chain))
