"""Mixed recompute policies for the warm start: any order made to fit the memory limit by choosing,
per (stage, microbatch), to keep its activation, recompute it selectively (S) or fully (R), and
where no policy can help, by running a pending W earlier.

``memtime.fit_recompute`` (AdaPipe's idea) recomputes the fewest microbatches with one policy. Where
selective recompute is cheap but keeps much and full recompute keeps little but costs a forward,
neither alone is good: selective everywhere may not fit, full recompute where needed costs a
forward each. ``fit_mixed`` walks each rank's order once and, wherever the level would pass the
room, takes the cheapest memory there is: among the microbatches held at that point (forward run,
backward not yet), the policy change with the least added time per unit of memory it frees (kept
to S, kept to R, or S to R; the one whose backward comes last among equals, as it frees for
longest). Memory a policy cannot free (what a B leaves until its W) is freed by moving the pending
W whose B ran first to that point (``pull_w`` first or only when no policy change helps).
``relax`` then gives back what the fit took too much of: each recompute, the dearest first, is
dropped (or R made S) where the rank's level leaves room for what it keeps more.

``policy_orders`` adds orders built with a policy in mind: for each recompute kind, the memory-aware
greedy scheduler's best order on the problem as if every microbatch took that policy (its forward
keeps only the policy's keep, its backward costs the recompute more), fitted and relaxed as above.
So where most microbatches must be recomputed selectively, the order's warm-up depth is the one
selective memory allows, not the one a kept activation does.

Every schedule here is a candidate only: the simulator judges it (``solve``). Policy ops sit right
before their backward, as ``memtime.with_policies`` puts them.
"""

from __future__ import annotations

from typing import Callable, Iterator

from schedc.errors import SchedcError
from schedc.kinds import BACKWARDS, RECOMPUTES, Kind
from schedc.problem import Problem
from schedc.schedule import Op, Schedule
from schedc.solvers.lazyw import lazy_w
from schedc.solvers.memtime import everywhere, plain, with_policies

Key = tuple[int, int]  # (stage, microbatch)


def _policy_of(ops: list[Op]) -> dict[Key, Kind]:
    return {(op.stage, op.mb): op.kind for op in ops if op.kind in RECOMPUTES}


def fit_mixed(
    problem: Problem, schedule: Schedule, name: str | None = None, pull_w: bool = False,
    kinds: tuple[Kind, ...] | None = None,
) -> Schedule | None:
    """``schedule``'s compute order with per rank the recompute policies (beyond those it holds;
    of ``kinds``, by default every one the problem allows) and earlier W that bring it within the
    memory limit (see the module's docstring); None when a rank cannot be brought within it so
    (nothing held can be recomputed more and no W is pending), or where the schedule has a copy
    lane or the problem no limit or recompute. With one kind it chooses as ``memtime.
    fit_recompute`` does (where the level first passes the room, the microbatch held there whose
    backward comes last), in one pass over each rank instead of one per microbatch recomputed."""
    rooms = problem.activation_room
    kinds = problem.recomputes if kinds is None else tuple(k for k in kinds if k in problem.recomputes)
    if schedule.copy or rooms is None or not kinds:
        return None
    ranks = []
    for r, ops in enumerate(schedule.ranks):
        fitted = _fit_rank(problem, list(ops), rooms[r], pull_w, kinds)
        if fitted is None:
            return None
        ranks.append(fitted)
    return Schedule.from_lists(name or schedule.name, ranks)


def _fit_rank(problem: Problem, seq: list[Op], room: float, pull_w: bool, kinds: tuple[Kind, ...]) -> list[Op] | None:
    """One rank's order made to fit ``room``: policy ops of ``kinds`` inserted before their
    backward (or changed), W moved earlier; None when it cannot fit."""
    tol, cost = problem.memory_tol, problem.cost
    policy = _policy_of(seq)
    last = {(op.stage, op.mb): x for x, op in enumerate(seq) if op.kind in BACKWARDS}  # (their order never changes)
    held: dict[Key, None] = {}  # forward run, backward not yet (insertion order: forward order)
    pending: dict[Key, None] = {}  # backward run, W not yet (in the order the backwards ran)
    level = 0.0
    j = 0
    while j < len(seq):
        op = seq[j]
        key = (op.stage, op.mb)
        if op.kind is Kind.F:
            held[key] = None
        d = problem.delta(op.kind, op.stage, policy.get(key))
        if not tol.gt(max(level, level + d), room):
            level += d
            if op.kind in BACKWARDS:
                held.pop(key, None)
                if op.kind is Kind.B:
                    pending[key] = None
            elif op.kind is Kind.W:
                pending.pop(key, None)
            j += 1
            continue
        # Over the room at op j: free memory held across it.
        change = _cheapest_change(problem, policy, held, op, kinds, cost, last)
        if pending and (pull_w or change is None):
            s, i = next(iter(pending))
            w = Op(Kind.W, s, i)
            seq.remove(w)  # (it is later than j: its key is still pending)
            seq.insert(j, w)
            continue
        if change is None:
            return None
        k, new = change
        old = policy.get(k)
        if not (op.kind is Kind.F and (op.stage, op.mb) == k):  # held since before op j: the level drops
            level -= problem.delta(Kind.F, k[0], old) - problem.delta(Kind.F, k[0], new)
        policy[k] = new
        if old is None:
            seq.insert(seq.index(_backward_of(seq, k, j)), Op(new, *k))
        else:
            seq[seq.index(Op(old, *k), j)] = Op(new, *k)
    return seq


def _backward_of(seq: list[Op], key: Key, after: int) -> Op:
    s, i = key
    return next(op for op in seq[after:] if op.kind in BACKWARDS and op.stage == s and op.mb == i)


def _cheapest_change(problem: Problem, policy: dict[Key, Kind], held, op: Op, kinds, cost, last) -> tuple[Key, Kind] | None:
    """Among the (stage, microbatch) held across op (and op's own, when it is a forward), the policy
    change that frees memory there at the least added time per unit freed; among equals, the one
    whose backward (position in ``last``) comes last. None when none frees any."""
    own_recompute = (op.stage, op.mb) if op.kind in RECOMPUTES else None  # it brings back at op: no help
    best, best_score = None, None
    for key in held:
        if key == own_recompute:
            continue
        s = key[0]
        old = policy.get(key)
        keep = problem.delta(Kind.F, s, old)
        for k in kinds:
            freed = keep - problem.delta(Kind.F, s, k)
            if k == old or not problem.memory_tol.gt(freed, 0.0):
                continue
            extra = cost[k][s] - (cost[old][s] if old is not None else 0.0)
            score = (extra / freed, -last[key])
            if best_score is None or score < best_score:
                best, best_score = (key, k), score
    return best


def relax(problem: Problem, schedule: Schedule, name: str | None = None) -> Schedule:
    """``schedule`` with each recompute, the dearest first, dropped or made cheaper (R to S) where
    its rank's level, raised by what that keeps more from the forward to the recompute, stays
    within the room. The compute lane only: a schedule with a copy lane is returned as given."""
    rooms = problem.activation_room
    if schedule.copy or rooms is None or not schedule.policies():
        return schedule if name is None else schedule.renamed(name)
    ranks = [_relax_rank(problem, list(ops), rooms[r]) for r, ops in enumerate(schedule.ranks)]
    return Schedule.from_lists(name or schedule.name, ranks)


def _relax_rank(problem: Problem, seq: list[Op], room: float) -> list[Op]:
    """One rank's relax: one pass over its recomputes, the dearest first (a dropped one leaves a
    hole until the end, so positions stay put; what a change raises is the level from its forward
    to its recompute, each op's own level elsewhere does not change)."""
    tol, cost = problem.memory_tol, problem.cost
    policy = _policy_of(seq)
    if not policy:
        return seq
    peak = _peaks(problem, seq, policy)
    where_f = {(op.stage, op.mb): x for x, op in enumerate(seq) if op.kind is Kind.F}
    where_rc = {(op.stage, op.mb): x for x, op in enumerate(seq) if op.kind in RECOMPUTES}
    holes = set()
    for key in sorted(policy, key=lambda key: (-cost[policy[key]][key[0]], where_rc[key])):
        s, old = key[0], policy[key]
        lo, hi = where_f[key], where_rc[key]
        options = [None] + sorted((k for k in problem.recomputes if cost[k][s] < cost[old][s]), key=lambda k: cost[k][s])
        for new in options:
            more = problem.delta(Kind.F, s, new) - problem.delta(Kind.F, s, old)
            if tol.le(max(peak[lo:hi]) + more, room):
                peak[lo:hi] = [x + more for x in peak[lo:hi]]
                if new is None:
                    holes.add(hi)
                    peak[hi] = float("-inf")
                else:
                    seq[hi] = Op(new, *key)
                break
    return [op for x, op in enumerate(seq) if x not in holes]


def _peaks(problem: Problem, seq: list[Op], policy: dict[Key, Kind]) -> list[float]:
    """Per position of one rank's order, the level the op holds (an allocation from its start)."""
    out, level = [], 0.0
    for op in seq:
        d = problem.delta(op.kind, op.stage, policy.get((op.stage, op.mb)))
        out.append(max(level, level + d))
        level += d
    return out


# ---- orders built for a policy ----


def as_if(problem: Problem, kind: Kind, transient: bool = True) -> Problem:
    """``problem`` as if every (stage, microbatch) took recompute policy ``kind``, for a list
    scheduler that does not choose policies: each forward keeps only what ``kind`` keeps, each
    backward costs ``kind``'s recompute more, and (``transient``) what the recompute brings back is
    working memory (the transient over the level at the recompute; without it the scheduler may go
    deeper and the fit after the build repairs the peaks). What a backward leaves until its W is
    counted at most as the forward's keep (the fit sees the rest). No policy sections: nothing
    more to choose."""
    n = problem.n_stages
    a, b = problem.mem[Kind.F], problem.mem[Kind.B]
    keep = [problem.delta(Kind.F, s, kind) for s in range(n)]
    costs = {"F": list(problem.cost[Kind.F]), "B": [problem.cost[Kind.B][s] + problem.cost[kind][s] for s in range(n)],
             "W": list(problem.cost[Kind.W])}
    if problem.costs.BW is not None:
        costs["BW"] = [problem.cost[Kind.BW][s] + problem.cost[kind][s] for s in range(n)]
    freed = [max(-keep[s], min(0.0, b[s] + a[s] - keep[s])) for s in range(n)]
    memory = {"F": keep, "B": freed, "W": [-(k + f) for k, f in zip(keep, freed)]}
    if transient:
        memory["working"] = [w + x - k for w, x, k in zip(problem.stage_working, a, keep)]
    return problem.with_changes(costs=costs, memory=memory, recompute=None, offload=None)


def policy_orders(problem: Problem, build: Callable[[Problem], Schedule]) -> Iterator[tuple[str, Schedule]]:
    """For each recompute kind the problem allows (and with and without its transient counted),
    ``build``'s order on ``as_if(problem, kind)`` with that kind everywhere, relaxed, and fitted
    (``fit_mixed``, both ways) then relaxed: (name, schedule) pairs to judge, built lazily."""
    for kind in problem.recomputes:
        for transient in (True, False):
            try:
                order = plain(build(as_if(problem, kind, transient)))
            except (SchedcError, RuntimeError, ValueError):
                continue
            name = f"greedy-as-{kind.value}{'' if transient else '-deep'}"
            uniform = with_policies(problem, order, everywhere(problem, kind), name)
            yield name, relax(problem, uniform)
            for pull in (False, True):
                fitted = fit_mixed(problem, uniform, f"{name}+fit{'-w' if pull else ''}", pull_w=pull)
                if fitted is not None:
                    yield fitted.name, relax(problem, fitted)


def fitted_orders(problem: Problem, schedule: Schedule, name: str) -> Iterator[tuple[str, Schedule]]:
    """``schedule`` fitted (both ways) and relaxed: the (name, schedule) pairs to judge."""
    seen = set()
    for pull in (False, True):
        fitted = fit_mixed(problem, schedule, f"{name}+mix{'-w' if pull else ''}", pull_w=pull)
        if fitted is not None:
            out = relax(problem, fitted)
            if out.ranks not in seen:
                seen.add(out.ranks)
                yield out.name, out


def lightened(problem: Problem, schedule: Schedule, kind: Kind, name: str | None = None) -> Schedule:
    """``schedule`` with every (stage, microbatch) it keeps recomputed with ``kind`` (right before
    its backward); those it recomputes already keep their policy."""
    policy = {(s, i): kind for s in range(problem.n_stages) for i in range(problem.microbatches)}
    policy.update(schedule.policies())
    return with_policies(problem, schedule, policy, name)


def polished(problem: Problem, schedule: Schedule) -> Iterator[Schedule]:
    """Variants of a schedule that fits, to judge: its W re-placed into the gaps (``lazyw.lazy_w``,
    both ways), and where the problem allows recompute, first every kept microbatch recomputed
    with the quickest recompute (what frees memory for W held longer) and then relaxed."""
    bases = [schedule]
    if problem.recomputes and problem.activation_room is not None and not schedule.copy:
        quick = min(problem.recomputes, key=lambda k: sum(problem.cost[k]))
        bases.append(lightened(problem, schedule, quick))
    for base in bases:
        for fill in (True, False):
            out = lazy_w(problem, base, f"{schedule.name}+lazy-w", fill=fill)
            if out is not None:
                yield relax(problem, out)
