"""Memory for time as users choose it today: a schedule plus a policy per (stage, microbatch).

One transform serves every baseline here (``with_policies``): it takes any schedule and a map
(stage, microbatch) -> policy op (R full recompute, S selective recompute, O offload) and puts
the ops of each policy where the frameworks run them:

- R or S (or RG, SG) right before the backward (B or fused BW) of its (stage, microbatch) on the
  compute lane: the forward again, just before the backward that needs it. RG and SG are Megatron-LM's
  ``--recompute-granularity full|selective``, which recomputes inside the backward once the output
  gradient has arrived; R and S run as soon as the rank gets to them, into the wait for that
  gradient (Mario's prefetch);
- O on the rank's copy lane after its forward, L before its backward; the copy lane's order
  follows the times the simulator gives the schedule without the copies: each O when its forward
  ends, the reloads packed as late as they can end before their backwards (as the zero-bubble
  authors' offload scheduler places them), merged by time. Each copy is issued after the last
  compute op that ends by then (``Schedule.after``), so a reload waits there rather than running
  as soon as the copy lane is free, and the memory between offload and reload stays free.

The registry schedules built on it are the baselines of issues 25 and 39: 1F1B and interleaved 1F1B
with full and with selective recompute as Megatron-LM runs them (RG, SG), the same with the full
recompute prefetched (``-prefetch``, R), ZB-H1 with full recompute, 1F1B with per-stage recompute sized
so that each rank just fits the limit (AdaPipe's idea), and ZB-V with the offloads its copy lane
can hide (in the spirit of PipeOffload). The simulator judges each, as every schedule.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping

from schedc.errors import ScheduleError
from schedc.kinds import BACKWARDS, OPTIONAL, RECOMPUTES, ROWS, Kind, check_supported, kind_of
from schedc.problem import Problem
from schedc.schedule import Op, Schedule
from schedc.simulate import simulate
from schedc.solvers.families import heuristics, vshape  # noqa: F401  (register the schedules built on here)
from schedc.solvers.registry import REGISTRY, Builder, register

Policy = Mapping[tuple[int, int], Kind]  # (stage, microbatch) -> R, S or O; absent: kept
_OFFLOAD = next(k for k, row in ROWS.items() if row.policy == "offload")  # O
_RELOAD = next(k for k, row in ROWS.items() if row.comes_with is _OFFLOAD)  # L


def plain(schedule: Schedule) -> Schedule:
    """``schedule`` without any policy op (every (stage, microbatch) kept, no copy lane)."""
    return Schedule(schedule.name, tuple(tuple(op for op in ops if op.kind not in OPTIONAL) for ops in schedule.ranks),
                    rounds=schedule.rounds)


def with_policies(problem: Problem, schedule: Schedule, policy: Policy, name: str | None = None) -> Schedule:
    """``schedule`` with each (stage, microbatch) of ``policy`` recomputed or offloaded (any policy
    ops ``schedule`` held are replaced): R or S right before its backward on the compute lane; O
    after its forward and L before its backward on the copy lane, ordered by the times the
    simulator gives the schedule without copies. A policy the problem does not declare is a
    ScheduleError naming it."""
    name = name or schedule.name
    try:
        policy = {key: kind_of(kind) for key, kind in policy.items()}  # "R" as written in files and tests
        check_supported(set(policy.values()), f"schedule {name!r}", [k for k in problem.kinds if ROWS[k].policy])
    except ValueError as e:
        raise ScheduleError(f"{e}: declare its section in the problem (recompute, recompute.selective, offload)") from None
    base = plain(schedule)
    ranks = tuple(_with_recomputes(ops, policy) for ops in base.ranks)
    offloaded = {key for key, kind in policy.items() if kind is _OFFLOAD}
    if not offloaded:
        return Schedule(name, ranks, rounds=base.rounds)
    times = simulate(problem, Schedule(name, ranks, rounds=base.rounds)).op_times()  # without the copies
    lanes = [_copy_lane(problem, ops, offloaded, times) for ops in ranks]
    return Schedule(name, ranks, tuple(copy for copy, _ in lanes), tuple(after for _, after in lanes),
                    rounds=base.rounds)


def _with_recomputes(ops: tuple[Op, ...], policy: Policy) -> tuple[Op, ...]:
    out: list[Op] = []
    for op in ops:
        kind = policy.get((op.stage, op.mb))
        if op.kind in BACKWARDS and kind in RECOMPUTES:
            out.append(Op(kind, op.stage, op.mb))
        out.append(op)
    return tuple(out)


def _copy_lane(problem: Problem, ops: tuple[Op, ...], offloaded: set[tuple[int, int]],
               times) -> tuple[tuple[Op, ...], tuple[Op | None, ...]]:
    """One rank's copy lane and issue points: each offload O when its forward ends; the reloads L
    packed backwards from the last, each ending by its backward's start (or by the next reload's
    start); the two merged by time, an offload first at a tie and every L after its own O. Each is
    issued after the last compute op that ends by its time (an O after its forward)."""
    cost = problem.cost
    sends: dict[tuple[int, int], float] = {}
    for op in ops:
        if op.kind is Kind.F and (op.stage, op.mb) in offloaded:
            sends[op.stage, op.mb] = times[op][2]
    keyed = [(t, 0, Op(_OFFLOAD, s, i)) for (s, i), t in sends.items()]
    latest = float("inf")
    for op in reversed(ops):
        if op.kind in BACKWARDS and (op.stage, op.mb) in offloaded:
            latest = min(latest, times[op][1]) - cost[_RELOAD][op.stage]
            keyed.append((max(latest, sends[op.stage, op.mb]), 1, Op(_RELOAD, op.stage, op.mb)))
    tol = problem.time_tol
    keyed.sort(key=lambda item: (tol.key(item[0]), item[1]))
    ends = [times[op][2] for op in ops]
    after: list[Op | None] = []
    at = -1
    for t, _, op in keyed:
        at = max(at, bisect.bisect_right(ends, t + tol.eps) - 1)
        after.append(ops[at] if at >= 0 else None)
    return tuple(op for _, _, op in keyed), tuple(after)


# ---- policies ----


def everywhere(problem: Problem, kind: Kind) -> dict[tuple[int, int], Kind]:
    """Every (stage, microbatch) under the policy ``kind`` (what the frameworks' flags do)."""
    return {(s, i): kind for s in range(problem.n_stages) for i in range(problem.microbatches)}


def one_at_a_time(problem: Problem) -> Schedule:
    """The order that holds the least: one microbatch (with sequence chunks, one sequence) at a
    time through every stage and back, in each pipeline in turn: its forwards ascending (chunk by
    chunk), then each stage's B and W descending (the last chunk first); the next only once the
    last is done. Every rank's list is the projection of one global order in which each op comes
    after what it waits for, so it cannot deadlock. Slow: the pipeline holds one microbatch."""
    per_rank: list[list[Op]] = [[] for _ in range(problem.ranks)]
    length, k = problem.pipeline_stages, problem.seq_chunks
    for i in range(problem.microbatches):
        units = range(i * k, (i + 1) * k)
        for q in range(problem.pipelines):
            chain = range(q * length, (q + 1) * length)
            order = [Op(Kind.F, s, u) for u in units for s in chain]
            order += [Op(kind, s, u) for u in reversed(units) for s in reversed(chain) for kind in (Kind.B, Kind.W)]
            for op in order:
                per_rank[problem.stage_rank[op.stage]].append(op)
    return Schedule.from_lists("one-at-a-time", per_rank)


def least_memory(problem: Problem) -> Schedule:
    """``one_at_a_time`` with each stage under the policy that keeps least between its forward and
    its backward (``Problem.least_kept``; a recompute before an offload that keeps as little): the
    least peak memory of the orders schedc builds, the warm start ``solve`` falls back on where no
    other fits. A recompute runs right before its backward; an offload's O is issued after its
    forward and its L after the compute op just before its backward, so the backward waits for the
    reload and the rank holds nothing more meanwhile. Where a rank's forwards of one microbatch
    are at least ``offload.time`` apart (their stages on different ranks), each rank then holds at
    most what ``Problem.min_memory`` counts; a rank holding consecutive stages starts the next
    forward while the offload of the last still runs, and holds both meanwhile."""
    order = one_at_a_time(problem)
    kinds = [k for k in RECOMPUTES if k in problem.policies] + [k for k in (_OFFLOAD,) if k in problem.policies]
    policy: dict[tuple[int, int], Kind] = {}
    for s in range(problem.n_stages):
        kept = {k: problem.delta(Kind.F, s, k) if ROWS[k].lightens else 0.0 for k in kinds}
        lightest = min(kinds, key=lambda k: kept[k], default=None)  # (the first of equals: recompute)
        if lightest is not None and kept[lightest] < problem.mem[Kind.F][s]:
            policy.update(((s, i), lightest) for i in range(problem.units))
    if not policy:
        return order
    ranks = tuple(_with_recomputes(ops, policy) for ops in order.ranks)
    name = "one-at-a-time+" + "+".join(sorted({ROWS[k].policy for k in policy.values()}))
    offloaded = {key for key, kind in policy.items() if kind is _OFFLOAD}
    if not offloaded:
        return Schedule(name, ranks)
    lanes = [_latest_copies(ops, offloaded) for ops in ranks]
    return Schedule(name, ranks, tuple(copy for copy, _ in lanes), tuple(after for _, after in lanes))


def _latest_copies(ops: tuple[Op, ...],
                   offloaded: set[tuple[int, int]]) -> tuple[tuple[Op, ...], tuple[Op | None, ...]]:
    """One rank's copy lane for the ``offloaded`` (stage, microbatch) of ``ops``, each brought back
    as late as it can: O issued after its forward, L after the compute op just before its backward
    (slower than ``_copy_lane``'s, which reloads behind earlier compute, but the rank holds
    nothing more while the reload runs)."""
    copy: list[Op] = []
    after: list[Op | None] = []
    for k, op in enumerate(ops):
        if op.kind is Kind.F and (op.stage, op.mb) in offloaded:
            copy.append(Op(_OFFLOAD, op.stage, op.mb))
            after.append(op)
        following = ops[k + 1] if k + 1 < len(ops) else None
        if following is not None and following.kind in BACKWARDS and (following.stage, following.mb) in offloaded:
            copy.append(Op(_RELOAD, following.stage, following.mb))
            after.append(op)
    return tuple(copy), tuple(after)


def fit_recompute(problem: Problem, schedule: Schedule, kind: Kind = Kind.R, name: str | None = None) -> Schedule:
    """``schedule`` with, per rank, the fewest microbatches recomputed (policy ``kind``, greedily)
    that bring the rank within its memory limit: walk the rank's ops in order and, where the level
    first passes the limit, recompute the microbatch held there whose backward comes last (it frees
    the most of what is left); repeat until the rank fits. The rest stay kept. A rank that cannot fit
    so recomputes all its microbatches (the least it can hold; the simulator then says it is over). Without a limit nothing is recomputed. (AdaPipe chooses recompute per stage; here the
    unit is the microbatch, as for every policy of schedc.)

    With a compute lane only, a rank's memory is the running sum of its ops' deltas in order, so
    this walk is the simulator's verdict on each rank."""
    base = plain(schedule)
    rooms = problem.activation_room
    policy: dict[tuple[int, int], Kind] = {}
    if rooms is not None:
        for r, ops in enumerate(base.ranks):
            while True:
                held = _held_at_first_over(problem, _with_recomputes(ops, policy), policy, rooms[r])
                if held is None:
                    break
                kept = [key for key in held if key not in policy]
                if not kept:  # recomputing more cannot fit it: the least it can hold, and the simulator says
                    policy.update((key, kind) for key in everywhere(problem, kind) if problem.stage_rank[key[0]] == r)
                    break
                policy[kept[-1]] = kind
    return with_policies(problem, base, policy, name)


def _held_at_first_over(problem: Problem, ops: tuple[Op, ...], policy: Policy, room: float) -> list[tuple[int, int]] | None:
    """Where the level of ``ops`` (one rank's compute lane, in order) first passes ``room``: the
    (stage, microbatch) whose forward ran and whose backward has not yet, by their backward's order
    (the last backward last). None when the rank fits."""
    tol = problem.memory_tol
    level = 0.0
    for j, op in enumerate(ops):
        d = problem.delta(op.kind, op.stage, policy.get((op.stage, op.mb)))
        if tol.gt(max(level, level + d), room):
            started = {(x.stage, x.mb) for x in ops[: j + 1] if x.kind is Kind.F}
            later = [(x.stage, x.mb) for x in ops[j:] if x.kind in BACKWARDS]
            return [key for key in later if key in started]
        level += d
    return None


OFFLOAD_TRIALS = 64  # hidden_offloads: at most this many trial simulations


def hidden_offloads(problem: Problem, schedule: Schedule, name: str | None = None) -> Schedule:
    """``schedule`` with the offloads its copy lanes can hide: candidates are the (stage,
    microbatch) whose wait from forward to backward can hold an offload and a reload (the zero-
    bubble authors' offload scheduler skips the others), longest wait first; a group of them is
    kept offloaded when the simulator finds the objective no worse than without any offload and no
    rank's peak memory higher than before the group (a copy lane one rank shares between its
    offloads and reloads may delay a reload past its target, or an offload past a peak).
    Groups are tried whole and halved where they fail, down to one candidate, for at most
    ``OFFLOAD_TRIALS`` simulations (each replays the whole schedule: on large problems the halving
    would otherwise cost thousands); what is accepted by then is kept."""
    base = plain(schedule)
    name = name or schedule.name
    if _OFFLOAD not in problem.policies:
        raise ScheduleError(f"schedule {name!r} offloads: the problem needs an 'offload' section")
    t0 = simulate(problem, base)
    times = t0.op_times()
    tol, mtol, goal, cost = problem.time_tol, problem.memory_tol, t0.objective_value(), problem.cost
    waits = []
    for op in base.ops():
        if op.kind in BACKWARDS:
            s, i = op.stage, op.mb
            wait = times[op][1] - times[Op(Kind.F, s, i)][2]
            if tol.ge(wait, cost[_OFFLOAD][s] + cost[_RELOAD][s]):
                waits.append((-tol.key(wait), s, i))
    candidates = [(s, i) for _, s, i in sorted(waits)]
    policy: dict[tuple[int, int], Kind] = {}
    best, peaks = base, t0.peak_activation

    trials = 0

    def accept(group: list[tuple[int, int]]) -> None:
        nonlocal best, peaks, trials
        if not group or trials >= OFFLOAD_TRIALS:
            return
        trials += 1
        trial_policy = {**policy, **{key: _OFFLOAD for key in group}}
        trial = with_policies(problem, base, trial_policy, name)
        t = simulate(problem, trial)
        if tol.le(t.objective_value(), goal) and all(mtol.le(a, b) for a, b in zip(t.peak_activation, peaks)):
            policy.update(trial_policy)
            best, peaks = trial, t.peak_activation
        elif len(group) > 1:
            half = len(group) // 2
            accept(group[:half])
            accept(group[half:])

    accept(candidates)
    return best.renamed(name)


# ---- registry ----


def _needs(kind: Kind, base: str) -> Callable[[Problem], str | None]:
    """The requirement of a schedule that uses policy ``kind`` on the registry schedule ``base``:
    the problem declares the section the policy's cost comes from, and ``base`` applies."""
    section = ROWS[kind].cost.rsplit(".", 1)[0]

    def requires(problem: Problem) -> str | None:
        if kind not in problem.kinds:
            return f"needs the problem's '{section}' section ({ROWS[kind].title}), which it does not give"
        return REGISTRY[base].why_not(problem)

    return requires


def _everywhere(name: str, base: str, kind: Kind) -> Builder:
    def schedule(problem: Problem) -> Schedule:
        return with_policies(problem, REGISTRY[base].build(problem), everywhere(problem, kind), name)

    return schedule


_UNIFORM = [  # name, the registry schedule it recomputes, the policy, what it is
    ("1f1b-recompute", "1f1b", Kind.RG,
     "1F1B with full recompute of every microbatch, as Megatron-LM runs it (--recompute-granularity full:"
     " inside the backward, once the gradient has arrived)"),
    ("1f1b-selective", "1f1b", Kind.SG,
     "1F1B with selective recompute of every microbatch, as Megatron-LM runs it (--recompute-granularity"
     " selective: inside the backward, once the gradient has arrived)"),
    ("interleaved-1f1b-recompute", "interleaved-1f1b", Kind.RG,
     "interleaved 1F1B with full recompute of every microbatch, as Megatron-LM runs it (once the gradient is in)"),
    ("interleaved-1f1b-selective", "interleaved-1f1b", Kind.SG,
     "interleaved 1F1B with selective recompute of every microbatch, as Megatron-LM runs it (once the gradient"
     " is in)"),
    ("1f1b-recompute-prefetch", "1f1b", Kind.R,
     "1F1B with full recompute of every microbatch run as soon as the rank is free, into the wait for the"
     " gradient (Mario-style prefetch)"),
    ("interleaved-1f1b-recompute-prefetch", "interleaved-1f1b", Kind.R,
     "interleaved 1F1B with full recompute of every microbatch run into the wait for the gradient (Mario-style)"),
    ("zb-h1-recompute", "zb-h1", Kind.R,
     "zero bubble H1 with full recompute of every microbatch (R before B, held until its W)"),
]
for _name, _base, _kind, _summary in _UNIFORM:
    register(_name, _summary, split_backward=REGISTRY[_base].split_backward, requires=_needs(_kind, _base))(
        _everywhere(_name, _base, _kind))


@register(
    "1f1b-recompute-fit",
    "1F1B recomputing per rank the fewest microbatches that fit the memory limit (AdaPipe's idea), each inside"
    " its backward once the gradient is in, as Megatron-LM (on which AdaPipe builds) runs it",
    split_backward=False,
    requires=_needs(Kind.RG, "1f1b"),
)
def one_f_one_b_recompute_fit(problem: Problem) -> Schedule:
    return fit_recompute(problem, REGISTRY["1f1b"].build(problem), Kind.RG, "1f1b-recompute-fit")


@register(
    "zb-v-offload",
    "ZB-V offloading what its copy lanes hide behind compute (in the spirit of PipeOffload)",
    split_backward=True,
    requires=_needs(Kind.O, "zb-v"),
)
def zb_v_offload(problem: Problem) -> Schedule:
    """ZB-V with ``hidden_offloads``: each reload issued after the compute op that ends just in time
    for it (as the zero-bubble authors' runtime issues it at a point of the compute stream), so
    the offloaded activations stay off the device through the cool-down too."""
    return hidden_offloads(problem, REGISTRY["zb-v"].build(problem), "zb-v-offload")
