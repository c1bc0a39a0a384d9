"""Selective recompute (S) is exact for any marked part (issue 37): parts with parameters, a
parameter used twice (and shared with a layer outside the part), a frozen parameter, buffers (a
constant one, and BatchNorm's running statistics, which each forward changes), a parameter of the
stage that the part reads without holding it; with a fused and with a split backward (the part's
linear layers' weight gradients deferred to W).

In one process: a marked part's gradients and buffers after three microbatches of F, S (one left
to its B), B and W against ordinary training. On gloo ranks: every registry schedule that
recomputes selectively, and zero-bubble schedules that a memory limit makes choose S beside R
(split backward), train a model of all five parts exactly like one process (SGD with momentum,
three steps, weights and buffers), on 2 and 4 ranks, one and two chunks per rank."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import schedc
import schedc.solvers as solvers
from schedc import Problem
from schedc.errors import SchedcError
from schedc.runtime import PipelineRuntime
from schedc.runtime.policies import dropping, enable_selective
from schedc.runtime.wgrad import SplitLinear, WeightGradStore, enable_split
from schedc.schedfile import CompiledSchedule
from tests.ranks import run_local
from tests.test_program import with_policies

D = 8  # features


class Residual(nn.Module):
    """Parameters: a residual MLP (LayerNorm, two linear layers, dropout)."""

    schedc_selective = True

    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.down(nn.functional.gelu(self.up(self.norm(x)))))


class Twice(nn.Module):
    """One linear layer called twice (the layer may be used outside the part too)."""

    schedc_selective = True

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.lin = lin

    def forward(self, x):
        return torch.tanh(self.lin(torch.tanh(self.lin(x))))


class Frozen(nn.Module):
    """A frozen parameter (requires_grad False) beside a trainable one."""

    schedc_selective = True

    def __init__(self):
        super().__init__()
        self.mix = nn.Parameter(torch.randn(D, D) / D ** 0.5, requires_grad=False)
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, D))

    def forward(self, x):
        return (x @ self.mix) * self.gain


class Buffered(nn.Module):
    """A constant buffer, and BatchNorm's running statistics (changed by every forward)."""

    schedc_selective = True

    def __init__(self):
        super().__init__()
        # buffers only, no parameter; eps 0.5: over the two rows of a microbatch the default eps
        # makes the output almost +-1 and its gradient rounding noise (1e-4 apart without S too)
        self.bn = nn.BatchNorm1d(D, eps=0.5, affine=False)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, D))

    def forward(self, x):
        return self.bn(x) * self.scale


def shared_twice() -> nn.Module:
    lin = nn.Linear(D, D)
    return nn.Sequential(Twice(lin), lin)  # the layer inside the part and after it


class Borrowed(nn.Module):
    """Reads a parameter it does not hold (not among its parameters(): a plain attribute)."""

    schedc_selective = True

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.borrowed = [lin]  # a list: not registered as a submodule

    def forward(self, x):
        return torch.tanh(x @ self.borrowed[0].weight)


def borrowed() -> nn.Module:
    lin = nn.Linear(D, D)
    return nn.Sequential(Borrowed(lin), lin)


FORMS = {"parameters": Residual, "used twice": shared_twice, "frozen": Frozen, "buffers": Buffered,
         "borrowed": borrowed}


def mse(y, target):
    return (y - target).square().mean()


# CUDA where there is one (dropout replayed from the CUDA generator); CI has no GPU: those skip there
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
@pytest.mark.parametrize("form", list(FORMS))
def test_a_marked_part_gets_the_gradients_and_buffers_of_ordinary_training(form, split, device):
    torch.manual_seed(0)
    plain = nn.Sequential(FORMS[form](), nn.Linear(D, D)).to(device)
    ours = copy.deepcopy(plain)
    data = [(torch.randn(4, D, device=device), torch.randn(4, D, device=device)) for _ in range(3)]
    torch.manual_seed(1)
    xs = [x.clone().requires_grad_(True) for x, _ in data]
    for x, (_, y) in zip(xs, data):
        mse(plain(x), y).backward()
    if split:
        enable_split(ours)
    parts = enable_selective(ours)
    assert parts
    store = WeightGradStore()
    torch.manual_seed(1)
    ins, losses, regions = [x.detach().clone().requires_grad_(True) for x, _ in data], [], []
    for x, (_, y) in zip(ins, data):  # F, keeping only the marked parts' inputs (and changed buffers)
        dropped = []
        with dropping(parts, dropped):
            losses.append(mse(ours(x), y))
        regions.append(dropped)
    for dropped in regions[:2]:  # S; the last microbatch's parts are recomputed in its B
        for region in dropped:
            region.recompute()
    params = [q for q in ours.parameters() if q.requires_grad]
    for i in reversed(range(3)):
        if split:
            store.backward_input(i, losses[i], None, [ins[i]], params)
        else:
            store.backward_full(losses[i], None, [ins[i]], params)
    assert regions[2][0].lazy and not regions[0][0].lazy
    if split:  # the split layers inside the part wait for W, as those outside it do
        deferred = [q for part in parts for m in part.modules() if isinstance(m, SplitLinear) for q in m.parameters()]
        assert all(q.grad is None for q in deferred)
        for i in (1, 0, 2):
            store.backward_weight(i)
    for x, y in zip(ins, xs):
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-7)
    want = dict(plain.named_parameters())
    for name, q in ours.named_parameters():
        if want[name].grad is None:
            assert q.grad is None, name
        else:
            torch.testing.assert_close(q.grad, want[name].grad, rtol=1e-5, atol=1e-7, msg=name)
    for name, b in plain.state_dict().items():  # BatchNorm's running statistics: one update per forward
        torch.testing.assert_close(ours.state_dict()[name], b, rtol=1e-6, atol=1e-7, msg=name)


class Pair(nn.Module):
    schedc_selective = True

    def forward(self, x):
        return x, x.sin()


class Sometimes(nn.Module):
    """Changes its buffer on its second call only."""

    schedc_selective = True

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.lin = nn.Linear(D, D)
        self.seen = 0

    def forward(self, x):
        self.seen += 1
        if self.seen == 2:
            self.calls += 1
        return self.lin(x)


@pytest.mark.parametrize("part, says", [
    (Pair, "selective recompute of Pair: its forward returns tuple, and a part marked schedc_selective must return"
           " one tensor"),
    (Sometimes, "selective recompute of Sometimes: its forward changed the buffer 'calls' of Sometimes, which its"
                " earlier forwards left alone"),
])
def test_a_part_that_cannot_be_recomputed_exactly_is_refused_in_one_line(part, says):
    module = part()
    parts = enable_selective(module)
    with pytest.raises(SchedcError) as e:
        for _ in range(2):
            with dropping(parts, []):
                module(torch.randn(4, D, requires_grad=True))
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


# ---- on gloo ranks, against one process ----

STEPS = 3


def model(n_stages: int) -> list[nn.Module]:
    """Every stage: each form of marked part once, and a plain linear layer."""
    torch.manual_seed(5)
    return [nn.Sequential(Residual(), shared_twice(), Frozen(), Buffered(), borrowed(), nn.Linear(D, D))
            for _ in range(n_stages)]


def batches(batch: int):
    g = torch.Generator().manual_seed(6)
    return [(torch.randn(batch, D, generator=g), torch.randn(batch, D, generator=g)) for _ in range(STEPS)]


def reference(n_stages: int, m: int, batch: int):
    """One process, the whole model, the mean loss over m microbatches (dropout's random numbers
    drawn in the order the pipeline draws them: every stage's dropout is off but the first's, whose
    rank runs its microbatches' forwards in order)."""
    parts = no_dropout_after_stage_0(model(n_stages))
    net = nn.Sequential(*parts)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(7)
    for x, y in batches(batch):
        opt.zero_grad()
        torch.stack([mse(net(a), b) for a, b in zip(x.chunk(m), y.chunk(m))]).mean().backward()
        opt.step()
    return {f"{s}.{k}": t for s, mod in enumerate(parts) for k, t in mod.state_dict().items()}


def no_dropout_after_stage_0(parts: list[nn.Module]) -> list[nn.Module]:
    for mod in parts[1:]:
        mod[0].drop = nn.Identity()
    return parts


def train(rank, world, paths, batch):
    out = {}
    for path in paths:
        compiled = schedc.load(path)
        prob = compiled.problem
        mine = {s: mod for s, mod in enumerate(no_dropout_after_stage_0(model(prob.n_stages)))
                if s in prob.rank_stages[rank]}
        params = list({id(q): q for mod in mine.values() for q in mod.parameters() if q.requires_grad}.values())
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        rt = PipelineRuntime(compiled, mine, mse, optimizer=opt, timeout=120)
        torch.manual_seed(7)
        for x, y in batches(batch):
            rt.step(x if 0 in mine else None, y if prob.n_stages - 1 in mine else None)
        out[compiled.name] = {f"{s}.{k}": t for s, mod in mine.items() for k, t in mod.state_dict().items()}
    return out


def selective_problem(p, v, placement, m, limit=None):
    memory = dict(F=4, B=-3) if limit is None else dict(F=4, B=-3, limit=limit)
    return Problem.parse(dict(ranks=p, microbatches=m, chunks=v, placement=placement, costs=dict(F=1, B=1, W=1),
                              comm=0.1, memory=memory, recompute=dict(keep=1, selective=dict(time=0.2, keep=2))))


CASES = [  # (p, v, placement, m, memory limit that makes the zero-bubble schedules recompute)
    (2, 1, "loop", 4, 6),
    (4, 2, "loop", 8, 16),
    (2, 2, "v", 4, 8),
]


@pytest.mark.parametrize("p, v, placement, m, limit", CASES, ids=lambda x: str(x))
def test_every_schedule_with_selective_recompute_trains_marked_parts_exactly(p, v, placement, m, limit, tmp_path):
    free, tight = selective_problem(p, v, placement, m), selective_problem(p, v, placement, m, limit)
    schedules = [solvers.build(s.name, free) for s in solvers.REGISTRY.values()
                 if s.name.endswith("-selective") and s.why_not(free) is None]
    # a split backward with S on every (stage, microbatch)
    order = "zb-v" if placement == "v" else "zb-h1" if v == 1 else "zb-2p"
    everywhere = {(s, i): "S" for s in range(p * v) for i in range(m)}
    schedules.append(with_policies(solvers.build(order, free), everywhere).renamed(f"{order}+S"))
    for name in ("zb-greedy", "zb-1p"):  # searched under the limit: S and R where they choose
        if solvers.REGISTRY[name].why_not(tight) is None:
            schedules.append(solvers.build(name, tight))
    paths = []
    for sched in schedules:
        assert any(op.kind in ("S", "SG") for ops in sched.ranks for op in ops), sched.name
        paths.append(str(tmp_path / f"{sched.name}.json"))
        CompiledSchedule.build(tight if sched.name in ("zb-greedy", "zb-1p") else free, sched).save(paths[-1])
    ranks = run_local(train, p, paths, 2 * m, timeout=900)
    want = reference(p * v, m, 2 * m)
    names = [schedc.load(path).name for path in paths]
    assert len(names) >= 3, names
    for name in names:
        got = {k: t for r in ranks for k, t in r[name].items()}
        assert got.keys() == want.keys()
        worst = max(float((got[k].float() - t.float()).abs().max()) for k, t in want.items())
        print(f"p={p} v={v} {placement} {name}: largest weight difference {worst:.1e}")
        for k, t in want.items():
            torch.testing.assert_close(got[k], t, rtol=1e-5, atol=1e-6, msg=f"{name}: {k}")
