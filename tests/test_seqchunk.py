"""Sequence chunks (schedc.runtime.seqchunk) against unchunked training of the example GPT.

One process, CPU: the stages of a cut of ``gpt_blocks`` run each microbatch's chunks forward in
order through every stage, then the backwards in reverse chunk order, last stage first (the order
a Seq1F1B pipeline runs them in), fused or split into B and W with every W at the end. The loss
and every parameter's gradient must equal those of the same model trained on whole sequences.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from schedc.runtime import seqchunk
from schedc.runtime.gpt import AttentionCore, CausalConv, Embedding, Head, cut, gpt_blocks, lm_loss, token_batches
from schedc.runtime.memory import SavedBytes
from schedc.runtime.seqchunk import ChunkedStage, chunk_activation_bytes, split_sequence
from schedc.runtime.wgrad import enable_split

SEQ, D = 16, 32
CUTS = {2: [3, 3], 4: [2, 1, 1, 2]}  # gpt_blocks(n_layers=4): Embedding, 4 Blocks, Head


def close(actual, expected) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


def reference(blocks: list[nn.Module], batches) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss (mean over microbatches) and gradients of ordinary training on whole sequences."""
    model = nn.Sequential(*copy.deepcopy(blocks))
    loss = sum(lm_loss(model(x), y) for x, y in batches) / len(batches)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def chunked(blocks: list[nn.Module], sizes: list[int], batches, k: int, split: bool = False):
    """The same, each microbatch in ``k`` chunks through the stages of ``cut(blocks, sizes)``."""
    model = nn.Sequential(*copy.deepcopy(blocks))
    if split:
        enable_split(model)
    parts = cut(list(model), sizes)
    stages = [ChunkedStage(m, k, lm_loss if s == len(parts) - 1 else None) for s, m in enumerate(parts)]
    m = len(batches)
    losses = []
    for mb, (x, y) in enumerate(batches):  # F: chunk by chunk, each through every stage
        for c, (xc, yc) in enumerate(zip(split_sequence(x, k), split_sequence(y, k))):
            for st in stages[:-1]:
                xc = st.forward(xc, mb, c)
            losses.append(stages[-1].forward(xc, mb, c, yc).detach())
    for mb in range(m):  # B: chunks in reverse order, each from the last stage to the first
        for c in reversed(range(k)):
            grad = torch.tensor(1.0 / m)
            for st in reversed(stages):
                grad = st.backward_input(mb, c, grad) if split else st.backward(mb, c, grad)
    if split:
        assert all(p.grad is None for s in parts for n, p in s.named_parameters() if n.endswith("qkv.weight"))
        for mb in reversed(range(m)):  # every W at the end, in another order
            for c in range(k):
                for st in stages:
                    st.backward_weight(mb, c)
    assert all(not st.states and not st.store.pending() for st in stages)
    loss = torch.stack(losses).sum() / (k * m)
    return loss, {n: p.grad for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def setup():
    blocks = gpt_blocks(d_model=D, seq_len=SEQ, n_layers=4)
    batches = token_batches(2, batch=3, seq_len=SEQ)
    return blocks, batches, reference(blocks, batches)


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
@pytest.mark.parametrize("n_stages", [2, 4])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_chunked_training_equals_unchunked(setup, k, n_stages, split):
    blocks, batches, (loss, grads) = setup
    got_loss, got = chunked(blocks, CUTS[n_stages], batches, k, split)
    close(got_loss, loss)
    assert got.keys() == grads.keys()
    for name in grads:
        close(got[name], grads[name])


def test_without_the_kv_gradients_the_gradients_differ(setup, monkeypatch):
    """The equality above is sensitive: a backward that drops what later chunks sent back to the
    earlier chunks' keys and values gives other gradients (those of the attention's qkv layers)."""
    blocks, batches, (_, grads) = setup
    monkeypatch.setattr(seqchunk.KV, "roots", lambda self: [])
    _, got = chunked(blocks, CUTS[2], batches, 2)
    assert not torch.allclose(got["1.qkv.weight"], grads["1.qkv.weight"], atol=1e-4)
    close(got["5.out.weight"], grads["5.out.weight"])  # the head's does not depend on them


def test_a_chunk_count_that_does_not_divide_the_sequence_is_refused():
    with pytest.raises(ValueError, match="a sequence of 16 tokens does not cut into 3 equal chunks") as e:
        split_sequence(torch.zeros(2, SEQ, dtype=torch.long), 3)
    assert "\n" not in str(e.value)


def test_chunks_out_of_order_are_refused_and_state_is_freed():
    stage = ChunkedStage(nn.Sequential(*gpt_blocks(d_model=D, seq_len=SEQ, n_layers=1)[:2]), 2)
    x0, x1 = split_sequence(token_batches(1, batch=1, seq_len=SEQ)[0][0], 2)
    with pytest.raises(RuntimeError, match="expected chunk 0 of 2"):
        stage.forward(x1, 0, 1)
    y0 = stage.forward(x0, 0, 0)
    with pytest.raises(RuntimeError, match="reverse order after all 2 forwards"):
        stage.backward(0, 0, torch.ones_like(y0))
    y1 = stage.forward(x1, 0, 1)
    with pytest.raises(RuntimeError, match="next backward: 1"):
        stage.backward(0, 0, torch.ones_like(y0))
    stage.backward(0, 1, torch.ones_like(y1))
    assert len(stage.states[0].chunks) == 1
    stage.backward(0, 0, torch.ones_like(y0))
    assert not stage.states  # freed after chunk 0's backward
    stage.forward(x0, 1, 0)
    stage.release(1)
    assert not stage.states


def test_attention_over_earlier_keys_is_the_end_of_causal_attention():
    """``AttentionCore`` given the keys of earlier positions first: the last rows of full causal
    attention. ``Embedding(start=...)``: the positions from ``start`` on."""
    q, k, v = torch.randn(3, 2, 2, 8, 4).unbind(0)
    full = AttentionCore()(q, k, v)
    close(AttentionCore()(q[:, :, 5:], k, v), full[:, :, 5:])
    emb = Embedding(10, 4, 8)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    close(emb(tokens[:, 5:], start=5), emb(tokens)[:, 5:])


def saved_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """The profiler's CPU activation of ``module`` on the whole sequence ``x``."""
    saved = SavedBytes(module.parameters())
    with saved.hooks():
        module(x.detach().requires_grad_(True))
    return saved.nbytes


def test_chunk_activation_bytes_as_the_profiler_measures():
    """One chunk: exactly the profiler's activation of the stage. A stage without attention (the
    head): every chunk saves the same bytes, 1/k of the whole sequence's."""
    blocks = gpt_blocks(d_model=D, seq_len=SEQ, n_layers=2)
    x = torch.randn(3, SEQ, D)
    middle = nn.Sequential(*blocks[1:3])
    assert chunk_activation_bytes(middle, [x]) == [saved_bytes(middle, x)]
    head = nn.Sequential(blocks[3])
    assert chunk_activation_bytes(head, split_sequence(x, 4)) == [saved_bytes(head, x) // 4] * 4
    assert saved_bytes(head, x) % 4 == 0


# ---- a causal convolution carried from chunk to chunk ----

class ConvBlock(nn.Module):
    """Pre-norm residual block around ``gpt.CausalConv`` (kernel ``kernel``, ``groups``): no attention."""

    def __init__(self, kernel: int, groups: int = 1):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.conv = CausalConv(D, kernel, groups)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        return x + self.out(torch.nn.functional.gelu(self.conv(self.ln(x))))


def conv_blocks(seed: int = 4) -> list[nn.Module]:
    """Token embedding (no positions), three convolution blocks (kernels 6, 3 depthwise, 6: a chunk
    of 4 tokens is shorter than the 5 positions a kernel of 6 needs before it), the GPT's head."""
    torch.manual_seed(seed)
    return [nn.Embedding(64, D), ConvBlock(6), ConvBlock(3, groups=D), ConvBlock(6), Head(D, 64)]


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
@pytest.mark.parametrize("k", [2, 4])
def test_a_causal_convolution_is_carried_exactly(k, split):
    """``gpt.CausalConv`` over chunks: the last kernel - 1 positions of each chunk are the next one's
    context (through a chunk shorter than that, older ones too), and their gradient comes back:
    the loss and every gradient equal training on whole sequences; each stage passes the check."""
    blocks, batches = conv_blocks(), token_batches(2, batch=3, seq_len=SEQ)
    loss, grads = reference(blocks, batches)
    got_loss, got = chunked(blocks, [3, 2], batches, k, split)
    close(got_loss, loss)
    for name in grads:
        close(got[name], grads[name])
    first, rest = cut(blocks, [3, 2])
    x = batches[0][0]
    assert seqchunk.chunk_mismatch(first, x, k) is None and seqchunk.chunk_mismatch(rest, first(x).detach(), k) is None


def test_without_the_carried_context_the_convolution_differs(monkeypatch):
    """The check and the equality above are sensitive: without its context each chunk starts from
    zeros, and the check names the convolution inside the first block (the innermost that differs)."""
    first = cut(conv_blocks(), [3, 2])[0]
    x = token_batches(1, batch=3, seq_len=SEQ)[0][0]
    original = CausalConv.forward
    monkeypatch.setattr(CausalConv, "forward", lambda self, x, context=None: original(self, x))
    why = seqchunk.chunk_mismatch(first, x, 2)
    assert why is not None and "first at its module '1.conv.conv' (Conv1d)" in why


# ---- chunk_mismatch: a stage's chunked forward against its forward on the whole sequence ----

class Shared(nn.Module):
    """Position-wise, unlike the example GPT: one Linear used twice and a scale buffer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.register_buffer("scale", torch.full((D,), 0.5))

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x))) * self.scale


class RunningMean(nn.Module):
    """Hand-written mixing: the mean of the positions so far (a cumulative sum), weighted by a buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.linspace(0.5, 1.5, D))

    def forward(self, x):
        steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype).view(1, -1, 1)
        return x + x.cumsum(1) / steps * self.weight


class Transpose(nn.Module):
    """(batch, sequence, features) to (batch, features, sequence) and back."""

    def forward(self, x):
        return x.transpose(1, 2)


class Inline(nn.Module):
    """Mixing in the stage module's own forward: each position plus the one before it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        y = self.lin(x)
        return y + torch.nn.functional.pad(y, (0, 0, 1, 0))[:, :-1]


def test_what_the_chunks_follow_passes_the_check_and_leaves_modes_and_random_state_alone():
    """The example GPT (with dropout, in training mode: the check runs without it) and a
    position-wise stage with a weight used twice and a buffer agree chunk by chunk; the check
    leaves every module's mode and the random state as they were."""
    blocks = gpt_blocks(d_model=D, seq_len=SEQ, n_layers=2, dropout=0.2)
    first, rest = nn.Sequential(*blocks[:2]), nn.Sequential(*blocks[2:])
    rest[0].drop1.eval()  # a mode of its own, kept
    x = token_batches(1, batch=3, seq_len=SEQ)[0][0]
    h = first(x).detach()
    shared = nn.Sequential(Shared(), nn.LayerNorm(D))
    state = torch.get_rng_state()
    for k in (2, 4):
        assert seqchunk.chunk_mismatch(first, x, k) is None
        assert seqchunk.chunk_mismatch(rest, h, k) is None
        assert seqchunk.chunk_mismatch(shared, h, k) is None
    assert torch.equal(torch.get_rng_state(), state)
    assert first.training and rest.training and not rest[0].drop1.training and rest[0].drop2.training


@pytest.mark.parametrize("stage, module", [
    (lambda: nn.Sequential(nn.Linear(D, D), RunningMean(), nn.LayerNorm(D)), "'1' (RunningMean)"),
    (lambda: nn.Sequential(nn.Linear(D, D), nn.Sequential(Transpose(), nn.Conv1d(D, D, 3, padding=1), Transpose())),
     "'1.1' (Conv1d)"),
    (Inline, "itself (Inline's own forward)"),
])
def test_mixing_is_found_at_the_first_module_whose_output_differs(stage, module):
    """Hand-written mixing with a buffer, a Conv1d over the sequence (between two transposes, whose
    outputs join along the sequence's dimension 2), the stage's own forward: each named, in one
    line, with how far the outputs lie apart."""
    torch.manual_seed(0)
    why = seqchunk.chunk_mismatch(stage(), torch.randn(2, SEQ, D), 2)
    assert why is not None and "\n" not in why
    assert why.startswith("'s forward over 2 sequence chunks differs from its forward on the whole sequence")
    assert f"first at its module {module}:" in why


def test_a_failure_on_a_chunk_names_the_innermost_module_and_batch_norm_is_refused_by_type():
    table = nn.Parameter(torch.randn(SEQ, D))

    class Table(nn.Module):
        def forward(self, x):
            return x + table

    stage = nn.Sequential(nn.Linear(D, D), nn.Sequential(Table()))
    with pytest.raises(RuntimeError) as e:
        ChunkedStage(stage, 2).forward(torch.randn(2, SEQ // 2, D), 0, 0)
    said = seqchunk.chunk_failure(stage, e.value, SEQ // 2, 2)
    assert said.startswith(" raised RuntimeError on a sequence chunk (8 tokens, one of 2) in its module '1.0' (Table):")
    assert "\n" not in said
    assert "has BatchNorm1d '1'" in seqchunk.chunk_refusal(nn.Sequential(nn.Linear(D, D), nn.BatchNorm1d(SEQ)))
