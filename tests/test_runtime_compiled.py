"""Stages the user compiled with torch.compile, on 2 gloo ranks: they train exactly like
uncompiled single-process training, and under a split schedule (zb-h1) their W does the weight
work -- counted, not timed: at each B none of the stage's linear weights gets a gradient; at
each W every one does, with one weight-gradient matmul per linear layer. Under a fused schedule
(1f1b) BW does it all. A stage compiled with fullgraph=True (no graph break allowed) cannot
defer: the runtime warns, naming the stage, and its B does the weight work; where the runtime
cannot see the fullgraph=True (a compiled ``forward``), the first forward fails with one line
naming the stage.

The backend is aot_eager: it goes through dynamo and AOTAutograd as inductor does (the compiled
region's backward is traced at the first F), without building C++ kernels (slow on CPU).
"""

import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import schedc
from schedc import Problem
from schedc.runtime import PipelineError, PipelineRuntime
from schedc.runtime.gpt import gpt_blocks, lm_loss, stages, token_batches
from tests.ranks import run_local

BACKEND = "aot_eager"
STEPS, M, BATCH = 2, 4, 8
MATMULS = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm}


def model():
    return stages(gpt_blocks(n_layers=2, d_model=16, seed=1), 2)  # [embedding, block] [block, head]


def linear_weights(module):
    return [m.weight for m in module.modules() if isinstance(m, nn.Linear)]


class Matmuls(TorchDispatchMode):
    """Counts the matrix multiplications executed while it is active (compiled code included)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.overloadpacket in MATMULS
        return func(*args, **(kwargs or {}))


def train(rank, world, path, how):
    """Compile this rank's stage (``how``), train STEPS steps; per B/BW/W of the last step: (op,
    stage, matmuls run, linear weights whose gradient changed, linear weights of the stage)."""
    compiled = schedc.load(path)
    parts = model()
    (s,) = compiled.problem.rank_stages[rank]
    stage = parts[s]
    if how == "fullgraph":
        stage = torch.compile(stage, backend=BACKEND, fullgraph=True)
    elif rank == 0:  # both ways a user compiles a module
        stage = torch.compile(stage, backend=BACKEND)
    else:
        stage.compile(backend=BACKEND)
    opt = torch.optim.SGD(stage.parameters(), lr=0.1, momentum=0.9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt = PipelineRuntime(compiled, {s: stage}, lm_loss, optimizer=opt, timeout=300)
    weights = linear_weights(parts[s])
    log = []

    def watched(name):
        run = getattr(rt.store, name)

        def call(*args, **kwargs):
            before = [None if w.grad is None else w.grad.clone() for w in weights]
            with Matmuls() as count:
                run(*args, **kwargs)
            changed = sum(a is None and w.grad is not None or a is not None and not torch.equal(a, w.grad)
                          for a, w in zip(before, weights))
            log.append(({"backward_input": "B", "backward_weight": "W", "backward_full": "BW"}[name], s,
                        count.n, changed, len(weights)))

        return call

    for name in ("backward_input", "backward_weight", "backward_full"):
        setattr(rt.store, name, watched(name))
    for x, y in token_batches(STEPS, BATCH, seed=2):
        log.clear()
        rt.step(x if s == 0 else None, y if s == 1 else None)
    return {"log": log, "warnings": [str(w.message) for w in caught],
            "weights": {f"{s}.{k}": t for k, t in parts[s].state_dict().items()}}


def reference():
    parts = model()
    net = nn.Sequential(*parts)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for x, y in token_batches(STEPS, BATCH, seed=2):
        opt.zero_grad()
        torch.stack([lm_loss(net(a), b) for a, b in zip(x.chunk(M), y.chunk(M))]).mean().backward()
        opt.step()
    return {f"{s}.{k}": t for s, mod in enumerate(parts) for k, t in mod.state_dict().items()}


def run(schedule, how, tmp_path):
    prob = Problem.parse(dict(ranks=2, microbatches=M, costs=dict(F=1, B=1, W=1), comm=0.1))
    path = tmp_path / f"{schedule}.json"
    schedc.compile(prob, schedule).save(path)
    ranks = run_local(train, 2, str(path), how, timeout=600, threads=1)
    weights = {k: t for r in ranks for k, t in r["weights"].items()}
    expected = reference()
    assert weights.keys() == expected.keys()
    for k, t in expected.items():
        torch.testing.assert_close(weights[k], t, rtol=1e-5, atol=1e-6, msg=f"{schedule}, {how}: {k}")
    return ranks


@pytest.mark.parametrize("schedule", ["zb-h1", "1f1b"])
def test_a_compiled_stage_trains_exactly_and_its_w_does_the_weight_work(schedule, tmp_path):
    ranks = run(schedule, "compiled", tmp_path)
    for r in ranks:
        assert r["warnings"] == []
        log = r["log"]
        assert len(log) == (2 if schedule == "zb-h1" else 1) * M
        for op, s, matmuls, changed, n in log:
            if op == "B":  # the input gradient only: no linear weight touched
                assert changed == 0, (op, s)
            else:  # W (or fused BW): every linear weight, W with one matmul per layer
                assert changed == n, (op, s)
                if op == "W":
                    assert matmuls == n, (op, s)
        assert {op for op, *_ in log} == ({"B", "W"} if schedule == "zb-h1" else {"BW"})


def test_a_stage_compiled_with_fullgraph_is_named_in_one_warning_and_trains_exactly(tmp_path):
    ranks = run("zb-h1", "fullgraph", tmp_path)
    for s, r in enumerate(ranks):
        assert r["warnings"] == [
            f"stage {s} is compiled with fullgraph=True, so its nn.Linear weight gradients are computed at B"
            " and its W does not do them: compile it without fullgraph=True to keep them deferred to W"
        ]
        for op, stage, matmuls, changed, n in r["log"]:
            assert (changed, matmuls) == ((n, matmuls) if op == "B" else (0, 0)), (op, stage)


def refused(rank, world, path):
    """Stage 0's forward alone compiled with fullgraph=True: this rank's error."""
    compiled = schedc.load(path)
    (s,) = compiled.problem.rank_stages[rank]
    stage = model()[s]
    if s == 0:
        stage.forward = torch.compile(stage.forward, backend=BACKEND, fullgraph=True)
    rt = PipelineRuntime(compiled, {s: stage}, lm_loss, timeout=120)
    x, y = token_batches(1, BATCH)[0]
    try:
        rt.step(x, y)
    except PipelineError as e:
        return str(e), e.culprit
    return None, None


def test_a_fullgraph_compile_the_runtime_cannot_see_fails_with_one_line_naming_the_stage(tmp_path):
    path = tmp_path / "zb-h1.json"
    schedc.compile(Problem.parse(dict(ranks=2, microbatches=M, costs=dict(F=1, B=1, W=1))), "zb-h1").save(path)
    (first, _), (second, culprit) = run_local(refused, 2, str(path), timeout=300, threads=1)
    message = ("stage 0 is compiled in a way that allows no graph break (fullgraph=True), but the B/W split of"
               " 'zb-h1' runs each nn.Linear outside the compiled graph: compile the stage module"
               " (torch.compile(module) or module.compile()) without fullgraph=True, or use a schedule without a"
               " split backward")
    assert first == message
    assert culprit == 0 and message in second, second
