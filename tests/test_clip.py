"""Gradient clipping and the non-finite check in PipelineRuntime (``clip_grad_norm``), on CPU with
gloo in spawned processes: both modes (``sync``, and ``post`` with its rollback) on 2 and 4 ranks
with zb-h1, zb-v and an ILP-solved schedule train exactly like one process that calls
``torch.nn.utils.clip_grad_norm_`` and skips a step whose norm is not finite; bad arguments fail
at construction with one line."""

import math

import pytest
import torch

import schedc
from schedc.runtime import PipelineError, PipelineRuntime
from schedc.runtime.gpt import lm_loss, token_batches
from tests.ranks import run_local
from tests.test_runtime import model, problem

STEPS = 3
INF_STEP = 1  # this step's gradients of stage 0 are made infinite: the step is skipped
MODES = ["sync", "post"]
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    # eps: the attention's key bias has a zero gradient up to rounding noise (~1e-10), which Adam
    # would blow up to +-lr differently with every summation order
    "adam": lambda params: torch.optim.Adam(params, lr=0.01, eps=1e-4),
}


class InfGrad(torch.autograd.Function):
    """The identity whose backward multiplies the gradient by inf (the loss stays finite)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * math.inf


def blow_up_on(module, when):
    """On the steps where ``when[0]`` is true, stage 0's output gradient becomes inf."""
    module.register_forward_hook(lambda mod, args, out: InfGrad.apply(out) if when[0] else None)


def schedule_lr(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 ** i)  # a new lr after every step


def train(rank, world, runs, batch):
    """For each (schedule file, max norm by optimizer): every mode and optimizer in turn, a fresh model and 3
    steps; this rank's losses, weights and what the runtime said of each step's norm."""
    out = {}
    for path, max_norms in runs:
        compiled = schedc.load(path)
        prob = compiled.problem
        for mode in MODES:
            for opt_name, make in OPTIMIZERS.items():
                max_norm = max_norms[opt_name]
                mine = {s: mod for s, mod in enumerate(model(prob.n_stages)) if s in prob.rank_stages[rank]}
                inf = [False]
                if 0 in mine:
                    blow_up_on(mine[0], inf)
                opt = make([q for mod in mine.values() for q in mod.parameters()])
                lr = schedule_lr(opt)
                rt = PipelineRuntime(compiled, mine, lm_loss, optimizer=opt, clip_grad_norm=max_norm, clip_mode=mode,
                                     timeout=120)
                losses, said = [], []
                for i, (x, y) in enumerate(token_batches(STEPS, batch, seed=2)):
                    inf[0] = i == INF_STEP
                    loss = rt.step(x if 0 in mine else None, y if prob.n_stages - 1 in mine else None)
                    lr.step()
                    losses.append(None if loss is None else loss.item())
                    said.append((rt.last_grad_norm, rt.last_step_clipped, rt.last_step_skipped))
                rt.synchronize()
                said.append((rt.last_grad_norm, rt.last_step_clipped, rt.last_step_skipped))
                weights = {f"{s}.{k}": t for s, mod in mine.items() for k, t in mod.state_dict().items()}
                # sync: each step's own; post: the previous step's until synchronize()
                said = said[:STEPS] if mode == "sync" else said[1:]
                out[(compiled.name, mode, opt_name)] = {"losses": losses, "weights": weights, "said": said}
    return out


def reference(n_stages, m, batch, opt_name, max_norm):
    """One process: clip_grad_norm_ over the whole model, skip the step if the norm is not finite."""
    parts = model(n_stages)
    inf = [False]
    blow_up_on(parts[0], inf)
    net = torch.nn.Sequential(*parts)
    opt = OPTIMIZERS[opt_name](net.parameters())
    lr = schedule_lr(opt)
    losses, said = [], []
    for i, (x, y) in enumerate(token_batches(STEPS, batch, seed=2)):
        inf[0] = i == INF_STEP
        opt.zero_grad()
        loss = torch.stack([lm_loss(net(a), b) for a, b in zip(x.chunk(m), y.chunk(m))]).mean()
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm))
        if math.isfinite(norm):
            opt.step()
        lr.step()
        losses.append(loss.item())
        said.append((norm, math.isfinite(norm) and max_norm / (norm + 1e-6) < 1, not math.isfinite(norm)))
    return losses, said, {f"{s}.{k}": t for s, mod in enumerate(parts) for k, t in mod.state_dict().items()}


def clipping_once(n_stages, m, batch, opt_name):
    """A max norm between the two finite steps' norms (without clipping): one step is clipped."""
    _, said, _ = reference(n_stages, m, batch, opt_name, 1e9)
    finite = [norm for norm, _, _ in said if math.isfinite(norm)]
    return (min(finite) + max(finite)) / 2


@pytest.mark.parametrize("p", [2, 4])
def test_clipping_and_skipping_match_one_process(p, tmp_path):
    m = 4
    batch = 2 * m
    loop, vshape = problem(p, 1, "loop", m), problem(p, 2, "v", m)
    compiled = [
        schedc.compile(loop, "zb-h1"),
        schedc.compile(vshape, "zb-v"),
        schedc.compile(loop.with_changes(memory={"F": 1, "limit": p}), "ilp", time_limit=20),
    ]
    runs = []
    for c in compiled:
        path = tmp_path / f"{c.name}.json"
        c.save(path)
        # the models differ with the number of stages: a max norm for each, and each optimizer
        runs.append((str(path), {name: clipping_once(c.problem.n_stages, m, batch, name) for name in OPTIMIZERS}))
    ranks = run_local(train, p, runs, batch, timeout=600)
    for c, (_, max_norms) in zip(compiled, runs):
        for opt_name in OPTIMIZERS:
            ref_losses, ref_said, ref_weights = reference(c.problem.n_stages, m, batch, opt_name, max_norms[opt_name])
            # the setting exercises all three cases: clipped, skipped, neither
            assert sorted((clipped, skipped) for _, clipped, skipped in ref_said) == [
                (False, False), (False, True), (True, False)], (c.name, opt_name, ref_said)
            for mode in MODES:
                key = (c.name, mode, opt_name)
                losses = next(r[key]["losses"] for r in ranks if r[key]["losses"][0] is not None)
                torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0, msg=str(key))
                for r in ranks:
                    for (norm, clipped, skipped), (ref_norm, ref_clipped, ref_skipped) in zip(r[key]["said"], ref_said):
                        assert (clipped, skipped) == (ref_clipped, ref_skipped), key
                        assert norm == pytest.approx(ref_norm, rel=1e-5, nan_ok=True), key
                weights = {k: t for r in ranks for k, t in r[key]["weights"].items()}
                assert weights.keys() == ref_weights.keys()
                for k, t in ref_weights.items():
                    torch.testing.assert_close(weights[k], t, rtol=1e-5, atol=1e-6, msg=f"{key}: {k}")
            for r in ranks:  # post's rollback and redo give exactly sync's parameters
                sync, post = r[(c.name, "sync", opt_name)]["weights"], r[(c.name, "post", opt_name)]["weights"]
                assert all(torch.equal(sync[k], post[k]) for k in sync), (c.name, opt_name)


def test_bad_clip_arguments_fail_at_construction_with_one_line():
    compiled = schedc.compile(problem(2, 1, "loop", 4), "zb-h1")
    stages = {0: torch.nn.Linear(2, 2)}
    opt = torch.optim.SGD(stages[0].parameters(), lr=0.1)
    cases = [
        (dict(clip_grad_norm=0.0, optimizer=opt), "clip_grad_norm must be a positive finite number"),
        (dict(clip_grad_norm=-1, optimizer=opt), "got -1"),
        (dict(clip_grad_norm=math.inf, optimizer=opt), "got inf"),
        (dict(clip_grad_norm="big", optimizer=opt), "got 'big'"),
        (dict(clip_grad_norm=1.0, clip_mode="later", optimizer=opt), "clip_mode must be 'sync' or 'post', got 'later'"),
        (dict(clip_grad_norm=1.0), "clip_grad_norm needs the optimizer"),
    ]
    for kwargs, says in cases:
        with pytest.raises(PipelineError) as e:
            PipelineRuntime(compiled, stages, lm_loss, **kwargs)
        assert says in str(e.value) and "\n" not in str(e.value), kwargs
