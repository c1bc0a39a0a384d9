"""``plan``: the layer split, the chunks per rank and the placement chosen with the schedule.

For each pipeline shape the layer-level problem allows (chunks v, placement), the cut of the
blocks into ``ranks x v`` contiguous stages is searched, each cut judged by the best schedule of
the registry's quick families on its stage problem (``quick_best``: built and simulated in
milliseconds at these sizes; the greedy's own searches and the exact search are kept for the end):

1. seeds: uniform block counts, the time-balanced cut (``schedc.partition.balanced`` over each
   block's F + B + W), and with one chunk the cut that minimises ``partition_bound``'s one-chunk
   term (it counts the start each rank waits for, which a heavy first block or head changes);
2. a descent from the best seed: move one block from one stage to another (the stages between
   pass one block on), the moves that leave the busiest rank lightest first; keep the first that
   shortens the best quick schedule, until none of the most promising does or the shape's share
   of the time runs out; a cut whose stage problem's lower bound is no shorter than the best
   found is skipped.

The shape and cut with the shortest quick schedule go to ``solve`` for the rest of the time:
memory for time, the greedy's searches and the exact search, as for any stage problem. The
answer's bound is the least over the shapes of ``partition_bound``: valid for every cut of every
shape the plan was allowed, so ``(objective - bound) / objective`` is a proven gap over the layout
as well as the order. Partial: with two chunks or more the bound counts the busiest rank (whole
blocks) and the critical path, not a cut's fill and drain nor the recompute a limit forces, so the
gap there can be loose. Where the layer file sets ``empty_stages``, the moves may leave a stage
with no block (and the one-chunk term counts such cuts too). The bidirectional placement (two
pipelines in opposite directions) is one more shape where the layer file allows it: its stage
problem has ``replicas`` 2, which the registry's two-direction families (DualPipe, Chimera) and
the search schedule as any such problem.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from schedc.errors import ProblemError, ScheduleError
from schedc.layers import LayerProblem
from schedc.partition import balanced, uniform
from schedc.problem import Problem
from schedc.schedfile import CompiledSchedule
from schedc.simulate import simulate
from schedc.solvers.bounds import lower_bound, one_chunk_cut, partition_bound
from schedc.solvers.deadline import Budget
from schedc.solvers.families import greedy
from schedc.solvers.registry import REGISTRY
from schedc.solvers.search.solve import ANYTIME, SolveResult, solve

SEARCH_SHARE = 0.4  # of the time limit, for the cuts (over all shapes); the rest for solve on the chosen one
GREEDY_PASS = "zb-greedy-pass"  # quick_best's one pass of the greedy scheduler
MOVES_TRIED = 12  # the descent judges at most this many moves per step, the most promising first


@dataclass
class Candidate:
    """A cut of one shape and the best quick schedule of its stage problem."""

    chunks: int
    placement: str
    sizes: list[int]
    objective: float  # inf where no quick schedule fits
    schedule: str  # its name
    seed: str  # which seed the descent started from ("uniform", "balanced", "bound"), "+moves" after moves


@dataclass
class PlanResult:
    layers: LayerProblem
    problem: Problem  # the chosen cut's stage problem
    chosen: Candidate
    result: SolveResult  # solve on it
    bound: float  # over every shape and cut the plan was allowed
    bound_reason: str
    seeds: list[Candidate] = field(default_factory=list)  # each shape's seeds as judged (the baselines)
    best_per_shape: list[Candidate] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def objective(self) -> float:
        return self.result.objective

    @property
    def gap(self) -> float:
        return (self.objective - self.bound) / self.objective if self.objective > 0 else 0.0

    def compiled(self) -> CompiledSchedule:
        """The plan as a schedule file's contents: the chosen cut's stage problem (its
        ``stage_blocks`` the cut, which ``local_stages`` follows) and solve's schedule."""
        return CompiledSchedule.build(self.problem, self.result.schedule, self.result.summary(),
                                      timeline=self.result.timeline)

    def summary(self) -> dict:
        def row(c: Candidate) -> dict:
            return {"chunks": c.chunks, "placement": c.placement, "stage_blocks": c.sizes,
                    "quick_objective": None if c.objective == math.inf else c.objective, "schedule": c.schedule,
                    "seed": c.seed}

        return {
            "chunks": self.chosen.chunks, "placement": self.chosen.placement, "stage_blocks": self.chosen.sizes,
            "objective": self.objective, "bound": self.bound, "gap": self.gap, "bound_reason": self.bound_reason,
            "solve": self.result.summary(), "seconds": self.seconds,
            "seeds": [row(c) for c in self.seeds], "best_per_shape": [row(c) for c in self.best_per_shape],
        }


def plan(layers: LayerProblem, *, time_limit: float | Budget = 60.0, solver: str = "auto", threads: int | None = None,
         say: Callable[[str], None] = lambda _: None, progress=None) -> PlanResult:
    """Choose the shape, the cut and the schedule for ``layers`` within ``time_limit`` (wall-clock
    seconds for the whole call, or a Budget); ``say`` gets a line per step."""
    started = time.perf_counter()
    budget = time_limit if isinstance(time_limit, Budget) else Budget.seconds(time_limit)
    search = budget.share(SEARCH_SHARE)
    shapes = layers.shapes
    seeds: list[Candidate] = []
    best: list[Candidate] = []
    for k, (v, placement) in enumerate(shapes):
        share = search.share(1 / (len(shapes) - k))  # (what earlier shapes left over goes to the later ones)
        shape_seeds = _seeds(layers, v, placement)
        seeds += shape_seeds
        start = min(shape_seeds, key=lambda c: c.objective)
        found = _descend(layers, start, share)
        best.append(found)
        say(f"{v} chunk(s), {placement}: {_show(found)} (from the {start.seed} cut, {_show(start)})")
    fitting = [c for c in best if c.objective < math.inf]
    chosen = min(fitting or best, key=lambda c: c.objective)
    try:
        problem = layers.stage_problem(chosen.sizes, chosen.chunks, chosen.placement,
                                       name=f"{layers.name or 'plan'}-v{chosen.chunks}-{chosen.placement}")
    except ProblemError as e:
        raise ProblemError(f"{layers.name or 'layers'}: no cut of any shape tried makes a stage problem schedc"
                           f" accepts (a memory limit below what any schedule needs, say); the best cut's: {e}") from None
    say(f"solving the chosen cut {chosen.sizes} ({chosen.chunks} chunk(s), {chosen.placement})")
    result = solve(problem, solver=solver, time_limit=budget, threads=threads, progress=progress)
    bounds = [partition_bound(layers, v, placement) for v, placement in shapes]
    least = min(bounds, key=lambda b: b.value)
    return PlanResult(layers, problem, chosen, result, least.value, least.reason, seeds, best,
                      time.perf_counter() - started)


def _show(c: Candidate) -> str:
    return f"{c.sizes}: {c.schedule} {c.objective:g}" if c.objective < math.inf else f"{c.sizes}: nothing fits"


def _seeds(layers: LayerProblem, chunks: int, placement: str) -> list[Candidate]:
    """The shape's seed cuts, judged; the same cut from two rules is judged once."""
    n = layers.ranks * chunks
    work = [b.F + b.B + b.W for b in layers.blocks]
    if len(work) >= n:
        cuts = {"uniform": uniform(len(work), n), "balanced": balanced(work, n)}
    else:  # (fewer blocks than stages, where empty stages are allowed: one block a stage, the last ones empty)
        cuts = {"uniform": [1] * len(work) + [0] * (n - len(work))}
    if chunks == 1:
        cuts["bound"] = one_chunk_cut(layers)[1]
    out, seen = [], {}
    for seed, sizes in cuts.items():
        key = tuple(sizes)
        if key not in seen:
            seen[key] = _judge(layers, chunks, placement, sizes, seed)
        out.append(Candidate(chunks, placement, list(sizes), seen[key].objective, seen[key].schedule, seed))
    return out


def _judge(layers: LayerProblem, chunks: int, placement: str, sizes: list[int], seed: str) -> Candidate:
    problem = _stage_problem(layers, chunks, placement, sizes)
    objective, name = quick_best(problem) if problem is not None else (math.inf, "")
    return Candidate(chunks, placement, list(sizes), objective, name, seed)


def _stage_problem(layers: LayerProblem, chunks: int, placement: str, sizes: list[int]) -> Problem | None:
    """The cut's stage problem, or None where the stage problem refuses it (its memory limit below
    what any schedule of it needs, say)."""
    try:
        return layers.stage_problem(sizes, chunks, placement)
    except ProblemError:
        return None


def quick_best(problem: Problem) -> tuple[float, str]:
    """The shortest objective among the registry's schedules that apply, build without a search
    of their own (not ``ANYTIME``'s) and fit, and one pass of the memory-aware greedy scheduler
    with its default switches (``GREEDY_PASS``: zero-bubble on any placement, where the registry's
    other multi-chunk loop schedules are not); where none fits, the greedy's whole search
    (``zb-greedy``, slower: only then); (inf, "") where that does not fit either."""
    best = _shortest(problem, [name for name in REGISTRY if name not in ANYTIME])
    if REGISTRY["zb-greedy"].why_not(problem) is None:
        try:
            t = simulate(problem, greedy.greedy_schedule(problem, greedy.Policy(), GREEDY_PASS))
        except RuntimeError:  # (a pass that stalls: the search skips such variants too)
            t = None
        if t is not None and t.fits and t.objective_value() < best[0]:
            best = (t.objective_value(), GREEDY_PASS)
    return best if best[0] < math.inf else _shortest(problem, ["zb-greedy"])


def _shortest(problem: Problem, names: list[str]) -> tuple[float, str]:
    best = (math.inf, "")
    for name in names:
        spec = REGISTRY[name]
        if spec.why_not(problem) is not None:
            continue
        try:
            t = simulate(problem, spec.build(problem))
        except (ScheduleError, ProblemError, ValueError):  # (a family that cannot build this shape)
            continue
        if t.fits and t.objective_value() < best[0]:
            best = (t.objective_value(), name)
    return best


def _descend(layers: LayerProblem, start: Candidate, budget: Budget) -> Candidate:
    """Move one block from one stage to another (the stages between pass one block on, so only
    the two change size) while a move shortens the best quick schedule. The moves are tried in
    the order of the busiest rank's work after them (then the number of ranks that busy), those
    that do not lighten it last, at most MOVES_TRIED per step."""
    best = start
    work = [b.F + b.B + b.W for b in layers.blocks]
    rank_of = layers.stage_ranks(best.chunks, best.placement)
    improved = True
    while improved and not budget.expired():
        improved = False
        for sizes in _moves(best.sizes, work, rank_of, layers.ranks, layers.empty_stages)[:MOVES_TRIED]:
            problem = _stage_problem(layers, best.chunks, best.placement, sizes)
            if problem is None or lower_bound(problem).value >= best.objective:
                continue  # (no schedule of this cut can be shorter)
            objective, name = quick_best(problem)
            if objective < best.objective:
                seed = best.seed if best.seed.endswith("+moves") else best.seed + "+moves"
                best, improved = Candidate(best.chunks, best.placement, sizes, objective, name, seed), True
                break
            if budget.expired():
                break
    return best


def _moves(sizes: list[int], work: list[float], rank_of: tuple[int, ...], ranks: int,
           empty: bool = False) -> list[list[int]]:
    """Every cut one block away (a block from stage a to stage b; a stage keeps one at least unless
    ``empty``), the lightest busiest rank first."""
    def loads(cut: list[int]) -> tuple[float, int]:
        per_stage, at = [], 0
        for k in cut:
            per_stage.append(sum(work[at:at + k]))
            at += k
        per_rank = [0.0] * ranks
        for s, r in enumerate(rank_of):  # (bidirectional: both directions' copies of each stage)
            per_rank[r] += per_stage[s % len(cut)]
        top = max(per_rank)
        return round(top, 9), sum(1 for x in per_rank if x >= top * (1 - 1e-9))

    out = []
    for a in range(len(sizes)):
        if sizes[a] < (1 if empty else 2):
            continue
        for b in range(len(sizes)):
            if b != a:
                cut = list(sizes)
                cut[a] -= 1
                cut[b] += 1
                out.append((loads(cut), cut))
    return [cut for _, cut in sorted(out, key=lambda x: x[0])]
