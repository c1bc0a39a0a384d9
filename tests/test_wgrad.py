"""Deferred weight gradients (schedc.runtime.wgrad) against plain ``loss.backward()``.

A three-stage transformer-ish pipeline (embedding + block | block | block + head + loss) runs
in one process the way the interpreter will: stage inputs are detached leaves, F of every
microbatch first, then B of each microbatch in some order and W of each (stage, microbatch) in
another, interleaved with the Bs. Every parameter's gradient, and every stage input's, must
equal those of the same model trained the ordinary way.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from schedc.runtime.wgrad import SplitLinear, WeightGradStore, enable_split, fullgraph_compiled

VOCAB = 23


def close(actual: Tensor | None, expected: Tensor | None) -> None:
    assert actual is not None and expected is not None
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


class Block(nn.Module):
    """Pre-norm causal self-attention (projections are plain Linear) and a GELU MLP."""

    def __init__(self, d: int, heads: int, bias: bool) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=bias), nn.Linear(d, d, bias=bias)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d, bias=bias), nn.Linear(2 * d, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, -1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        x = x + self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def make_stages(d: int = 8, heads: int = 2, bias: bool = True, seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList(
        [
            nn.Sequential(nn.Embedding(VOCAB, d), Block(d, heads, bias)),
            Block(d, heads, bias),
            nn.Sequential(Block(d, heads, bias), nn.LayerNorm(d), nn.Linear(d, VOCAB, bias=bias)),
        ]
    )


def make_microbatches(m: int, batch: int = 2, seq: int = 5, seed: int = 1) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(VOCAB, (2, batch, seq), generator=g)) for _ in range(m)]  # (tokens, targets)


def loss_fn(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def reference(stages: nn.ModuleList, mbs: list[tuple[Tensor, Tensor]]) -> tuple[dict[str, Tensor], list[list[Tensor]]]:
    """Ordinary training of an untouched copy: parameter grads, and each stage input's grad per microbatch."""
    ref = copy.deepcopy(stages)
    input_grads = []
    for tokens, targets in mbs:
        h1 = ref[0](tokens)
        h2 = ref[1](h1)
        h1.retain_grad(), h2.retain_grad()
        loss_fn(ref[2](h2), targets).backward()
        input_grads.append([h1.grad, h2.grad])
    return {n: p.grad for n, p in ref.named_parameters()}, input_grads


class Pipeline:
    """The three stages run as the interpreter will run them, with one store."""

    def __init__(self, stages: nn.ModuleList, mbs: list[tuple[Tensor, Tensor]]) -> None:
        self.stages, self.mbs, self.store = stages, mbs, WeightGradStore()
        self.inputs: dict[int, list[Tensor | None]] = {}
        self.outputs: dict[int, list[Tensor]] = {}

    def forward(self, i: int) -> None:
        tokens, targets = self.mbs[i]
        out0 = self.stages[0](tokens)
        x1 = out0.detach().requires_grad_()
        out1 = self.stages[1](x1)
        x2 = out1.detach().requires_grad_()
        self.inputs[i], self.outputs[i] = [None, x1, x2], [out0, out1, loss_fn(self.stages[2](x2), targets)]

    def backward(self, i: int, fused_stages: tuple[int, ...] = ()) -> None:
        """B (or fused BW for the stages named) of microbatch ``i``, last stage first."""
        grad = None
        for s in (2, 1, 0):
            x = self.inputs[i][s]
            args = (self.outputs[i][s], grad, [] if x is None else [x], list(self.stages[s].parameters()))
            if s in fused_stages:
                self.store.backward_full(*args)
            else:
                self.store.backward_input((s, i), *args)
            grad = None if x is None else x.grad

    def check(self, mbs_ref: tuple[dict[str, Tensor], list[list[Tensor]]]) -> None:
        param_grads, input_grads = mbs_ref
        assert self.store.pending() == []
        for name, p in self.stages.named_parameters():
            close(p.grad, param_grads[name])
        for i in range(len(self.mbs)):
            close(self.inputs[i][1].grad, input_grads[i][0])
            close(self.inputs[i][2].grad, input_grads[i][1])


def run_interleaved(stages: nn.ModuleList, m: int, seed: int, batch: int = 2, seq: int = 5) -> None:
    """F of all, B in a random order of microbatches, W of random pending keys between and after the Bs."""
    mbs = make_microbatches(m, batch, seq, seed)
    expected = reference(stages, mbs)
    enable_split(stages)
    pipe, rng = Pipeline(stages, mbs), random.Random(seed)
    for i in range(m):
        pipe.forward(i)
    for i in rng.sample(range(m), m):
        pipe.backward(i)
        pending = pipe.store.pending()
        for key in rng.sample(pending, rng.randint(0, len(pending))):
            pipe.store.backward_weight(key)
    for key in rng.sample(pipe.store.pending(), len(pipe.store.pending())):
        pipe.store.backward_weight(key)
    pipe.check(expected)


@pytest.mark.parametrize("bias", [True, False])
def test_split_equals_ordinary_backward(bias: bool) -> None:
    run_interleaved(make_stages(bias=bias), m=4, seed=3)


def test_fused_and_mixed_equal_ordinary_backward() -> None:
    stages = make_stages()
    mbs = make_microbatches(3)
    expected = reference(stages, mbs)
    enable_split(stages)
    pipe = Pipeline(stages, mbs)
    for i in range(3):
        pipe.forward(i)
    pipe.backward(0, fused_stages=(0, 1, 2))  # all fused
    pipe.backward(2, fused_stages=(1,))  # split and fused stages in one microbatch
    pipe.backward(1)
    assert sorted(pipe.store.pending()) == [(0, 1), (0, 2), (1, 1), (2, 1), (2, 2)]
    for key in [(2, 2), (0, 1), (1, 1), (0, 2), (2, 1)]:
        pipe.store.backward_weight(key)
    pipe.check(expected)


def test_weight_grads_wait_for_w() -> None:
    stages = make_stages()
    deferred = {id(p) for p in enable_split(stages)}
    pipe = Pipeline(stages, make_microbatches(2))
    for i in range(2):
        pipe.forward(i)
        pipe.backward(i)
    for s, stage in enumerate(stages):
        for name, p in stage.named_parameters():
            assert (p.grad is None) == (id(p) in deferred), f"stage {s} {name}"
    assert stages[0][0].weight.grad is not None  # the embedding: generic fallback, in B
    assert pipe.inputs[0][1].grad is not None and pipe.inputs[1][2].grad is not None
    pipe.store.backward_weight((1, 0))
    assert all(p.grad is not None for p in stages[1].parameters())
    assert stages[2][0].qkv.weight.grad is None
    before = stages[1].qkv.weight.grad.clone()
    pipe.store.backward_weight((1, 1))
    assert not torch.equal(stages[1].qkv.weight.grad, before)  # microbatch 1 accumulated on top
    assert sorted(pipe.store.pending()) == [(0, 0), (0, 1), (2, 0), (2, 1)]


def test_w_without_b_and_b_twice_raise() -> None:
    stages = make_stages()
    enable_split(stages)
    pipe = Pipeline(stages, make_microbatches(1))
    with pytest.raises(RuntimeError, match=r"W for \(1, 0\) has no B"):
        pipe.store.backward_weight((1, 0))
    pipe.forward(0)
    pipe.backward(0)
    pipe.store.backward_weight((1, 0))
    with pytest.raises(RuntimeError, match="no B"):
        pipe.store.backward_weight((1, 0))
    pipe.forward(0)
    with pytest.raises(RuntimeError, match=r"B for \(2, 0\) ran twice"):
        pipe.backward(0)


def test_b_frees_the_graph() -> None:
    stages = make_stages()
    enable_split(stages)
    pipe = Pipeline(stages, make_microbatches(1))
    pipe.forward(0)
    pipe.backward(0)
    with pytest.raises(RuntimeError, match="second time"):
        pipe.outputs[0][1].sum().backward()


def test_enable_split_is_idempotent_and_keeps_the_module() -> None:
    stages = make_stages()
    plain = copy.deepcopy(stages)
    first = enable_split(stages)
    second = enable_split(stages)
    assert [id(p) for p in first] == [id(p) for p in second]
    assert len(first) == 3 * 7 + 2  # 3 blocks x (3 Linear with bias + fc2 without) + the head
    assert all(isinstance(m, SplitLinear) for m in stages.modules() if isinstance(m, nn.Linear))
    assert stages.state_dict().keys() == plain.state_dict().keys()
    clone = copy.deepcopy(stages)
    clone.load_state_dict(plain.state_dict())
    tokens, targets = make_microbatches(1)[0]
    for model in (plain, stages):  # ordinary training of a split module: nothing deferred
        loss_fn(model[2](model[1](model[0](tokens))), targets).backward()
    for (name, p), q in zip(plain.named_parameters(), stages.parameters()):
        close(q.grad, p.grad)
    stages.zero_grad()  # (deepcopy in reference() does not copy .grad)
    run_interleaved(stages, m=2, seed=5)  # split twice (again inside): still exact


def test_leading_dims_frozen_weights_and_fallback_layers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3, bias=False), nn.Linear(3, 5))
    attn = nn.MultiheadAttention(5, 1, batch_first=True)  # its Linear subclass is not split
    model[0].weight.requires_grad_(False)
    plain_model, plain_attn = copy.deepcopy(model), copy.deepcopy(attn)
    deferred = enable_split(model) + enable_split(attn)
    linears = [model[0].weight, model[0].bias, model[2].weight, model[3].weight, model[3].bias]
    assert {id(p) for p in deferred} == {id(p) for p in linears}
    store = WeightGradStore()
    shapes = [(2, 3, 4, 4), (3, 4)]  # extra leading dims; the first layer's input needs no grad
    for i, shape in enumerate(shapes):
        x = torch.randn(shape)
        h = plain_model(x).view(-1, 1, 5) if i else plain_model(x).flatten(0, 1)
        plain_attn(h, h, h)[0].square().sum().backward()
        h = model(x).view(-1, 1, 5) if i else model(x).flatten(0, 1)
        store.backward_input(i, attn(h, h, h)[0].square().sum(), None, [], [*model.parameters(), *attn.parameters()])
    assert model[3].weight.grad is None and attn.out_proj.weight.grad is not None
    store.backward_weight(1)
    store.backward_weight(0)
    assert model[0].weight.grad is None
    for p, q in zip([*plain_model.parameters(), *plain_attn.parameters()], [*model.parameters(), *attn.parameters()]):
        if p.requires_grad:
            close(q.grad, p.grad)


@settings(max_examples=12, deadline=None)
@given(
    heads=st.integers(1, 3),
    head_dim=st.integers(1, 4),
    m=st.integers(1, 5),
    batch=st.integers(1, 3),
    seq=st.integers(1, 4),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_and_orders(
    heads: int, head_dim: int, m: int, batch: int, seq: int, bias: bool, seed: int
) -> None:
    run_interleaved(make_stages(heads * head_dim, heads, bias, seed), m, seed, batch, seq)


def test_parts_compiled_with_fullgraph_stay_plain_and_others_are_split() -> None:
    stages = make_stages()
    enable_split(stages)  # every Linear split, then compiled (lazily: nothing is traced here)
    stages[0] = torch.compile(stages[0], fullgraph=True)
    stages[1].compile()
    stages[2][0] = torch.compile(stages[2][0], fullgraph=True)
    assert fullgraph_compiled(stages) == ["0", "2.0"]
    assert fullgraph_compiled(stages[0]) == [""] and fullgraph_compiled(stages[1]) == []
    deferred = {id(p) for p in enable_split(stages)}
    split = {id(p) for m in [stages[1], stages[2][2]] for p in m.parameters() if p.dim() == 2}
    assert split and split <= deferred
    assert not deferred & {id(p) for m in [stages[0], stages[2][0]] for p in m.parameters()}
    assert all(type(m) is nn.Linear for part in [stages[0], stages[2][0]] for m in part.modules()
               if isinstance(m, nn.Linear))
