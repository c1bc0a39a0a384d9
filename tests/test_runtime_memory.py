"""The runtime holds a microbatch's tensors exactly as long as its Program says: a stage's input
until its W (B for a fused BW), its output until its B, and a sent tensor only until the
transfer has completed (not until the optimizer step).

Each stage is wrapped in a probe that keeps weak references to the storage of every
microbatch's input and output. Before each forward it counts how many of them are still alive
and compares with what the Program allows at that instruction: F done and W (or BW) not yet,
for inputs; F done and B not yet, for outputs. A sent output also lives until its transfer is
done: on gloo a helper thread drops the buffer once it sees the send complete, which on a busy
machine can come after the next forward, so the sends still in flight then (the transport's
``in_flight()``, read before the count) are allowed on top.
"""

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

import schedc
from schedc import Problem
from schedc.runtime import PipelineRuntime
from tests.ranks import run_local

D = 64


class Probe(nn.Module):
    """A stage that records which of its microbatches' tensors are alive before each forward."""

    def __init__(self, stage: int, allowed: list[tuple[int, int]]):
        super().__init__()
        torch.manual_seed(stage)
        self.inner = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D))
        self.allowed = allowed  # per F of this stage in program order: (inputs, outputs) alive allowed
        self.refs: list[tuple[StorageWeakRef, StorageWeakRef]] = []
        self.calls = 0
        self.seen: list[tuple[int, int, int, int]] = []  # (F number, inputs alive, outputs alive, sends in flight)
        self.transport = None  # the runtime's, set once it is built

    def forward(self, x):
        if not torch.is_grad_enabled():  # the runtime's shape probe on the first step
            return self.inner(x)
        k = self.calls % len(self.allowed)
        if k == 0:
            self.refs = []
        self.calls += 1
        sending = self.transport.in_flight()  # first: a send that completes after it only lowers the count
        inputs = sum(not a.expired() for a, _ in self.refs)
        outputs = sum(not b.expired() for _, b in self.refs)
        self.seen.append((k, inputs, outputs, sending))
        y = self.inner(x)
        self.refs.append((StorageWeakRef(x.untyped_storage()), StorageWeakRef(y.untyped_storage())))
        return y


def allowed_alive(program, stage: int) -> list[tuple[int, int]]:
    """Before each F of ``stage`` in ``program`` (one rank's instructions): how many microbatches
    of the stage have run F and not yet W or BW (inputs), and F and not yet B or BW (outputs)."""
    out, f, b, w = [], 0, 0, 0
    for instr in program:
        if instr.stage != stage:
            continue
        if instr.op == "F":
            out.append((f - w, f - b))
            f += 1
        elif instr.op in ("B", "BW"):
            b += 1
            w += instr.op == "BW"
        elif instr.op == "W":
            w += 1
    return out


def run(rank, world, path, steps):
    compiled = schedc.load(path)
    prob = compiled.problem
    program = compiled.program.for_rank(rank)
    mine = {s: Probe(s, allowed_alive(program, s)) for s in prob.rank_stages[rank]}
    opt = torch.optim.SGD([q for mod in mine.values() for q in mod.parameters()], lr=0.01)
    rt = PipelineRuntime(compiled, mine, lambda y, t: ((y - t) ** 2).mean(), optimizer=opt, timeout=120)
    for mod in mine.values():
        mod.transport = rt.comm
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(2 * prob.microbatches, D, generator=gen)
        rt.step(x, torch.zeros_like(x))
    over = {}
    for s, mod in mine.items():
        over[s] = [
            f"before F #{k}: {i} inputs alive (allowed {mod.allowed[k][0]}), {o} outputs (allowed"
            f" {mod.allowed[k][1]} + {sending} sends in flight)"
            for k, i, o, sending in mod.seen
            # stage 0's input is a view of the caller's batch, alive by design
            if (s > 0 and i > mod.allowed[k][0]) or o > mod.allowed[k][1] + sending
        ]
    return over


@pytest.mark.parametrize("name, p, v, placement, m", [
    ("1f1b", 2, 1, "loop", 8),  # fused BW
    ("zb-h1", 2, 1, "loop", 8),
    ("zb-v", 2, 2, "v", 8),
    ("1f1b", 4, 1, "loop", 16),
])
def test_tensors_are_freed_when_the_program_says(name, p, v, placement, m, tmp_path):
    prob = Problem.parse(dict(ranks=p, microbatches=m, chunks=v, placement=placement, costs=dict(F=1, B=1, W=1)))
    path = tmp_path / "s.json"
    schedc.compile(prob, name).save(path)
    for r, per_stage in enumerate(run_local(run, p, str(path), 2, timeout=300)):
        for s, over in per_stage.items():
            assert not over, f"rank {r} stage {s}: " + "; ".join(over[:5])
