"""A small GPT-style language model given as an ordered list of blocks, for tests, benchmarks
and examples/train_gpt.py: token + position embedding first, transformer blocks, then the head.

``dropout`` (default 0: none) adds dropout as GPT-2 has it: on the embedding's output, on the
attention weights (inside ``AttentionCore``, the part a selective recompute drops) and on each
residual branch.

``CausalConv`` (not in ``gpt_blocks``): a causal convolution over the sequence that sequence
chunks carry from chunk to chunk, as they do ``Embedding``'s positions and ``AttentionCore``.

``cut`` and ``stages`` (blocks into stages) are ``schedc.runtime.model``'s, any model's; they are
importable from here too, as the tests and benchmarks written before them do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from schedc.runtime.model import cut, stages  # noqa: F401  (here for the callers that import them from gpt)


def _dropout(p: float) -> nn.Module:
    return nn.Dropout(p) if p > 0 else nn.Identity()


class Embedding(nn.Module):
    def __init__(self, vocab: int, d_model: int, seq_len: int, dropout: float = 0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.drop = _dropout(dropout)

    def forward(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """``start``: the position of the first token (a later chunk of the sequence, ``seqchunk``)."""
        positions = torch.arange(start, start + tokens.shape[-1], device=tokens.device)
        return self.drop(self.tok(tokens) + self.pos(positions))


class AttentionCore(nn.Module):
    """Causal softmax(q k^T / sqrt(d)) v over heads, with dropout on the attention weights: the
    part whose activations grow with the square of the sequence, which Megatron-LM's selective
    recompute drops. ``schedc_selective`` marks it for the runtime's selective recompute (S,
    ``schedc.runtime.policies``).

    Given more keys than queries (a later chunk of the sequence attending to the earlier chunks'
    keys too, ``schedc.runtime.seqchunk``), the queries are the last positions: query i sees keys
    0 .. i + (keys - queries)."""

    schedc_selective = True

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        t, s = q.shape[-2], k.shape[-2]
        if s == t:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        later = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)  # causal, aligned at the end
        return F.scaled_dot_product_attention(q, k, v, attn_mask=later, dropout_p=p)


class CausalConv(nn.Module):
    """A causal convolution over the sequence on (batch, sequence, features): position i sees
    positions i - kernel + 1 .. i (zeros before the sequence's start), as the short convolutions of
    state-space and Hyena-style blocks. ``context``: the kernel - 1 positions before ``x`` (a later
    chunk of the sequence, ``schedc.runtime.seqchunk``, which carries them from the chunk before)."""

    def __init__(self, features: int, kernel: int, groups: int = 1):
        super().__init__()
        self.kernel = kernel
        self.conv = nn.Conv1d(features, features, kernel, groups=groups)

    def window(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` with the kernel - 1 positions before it in front (``context``, else zeros)."""
        if context is None:
            context = x.new_zeros(x.shape[0], self.kernel - 1, x.shape[2])
        return torch.cat([context, x], dim=1)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        return self.conv(self.window(x, context).transpose(1, 2)).transpose(1, 2)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP, each with a residual."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.core = AttentionCore(dropout)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, 4 * d_model)
        self.down = nn.Linear(4 * d_model, d_model)
        self.drop1, self.drop2 = _dropout(dropout), _dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        heads = lambda z: z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)  # noqa: E731
        att = self.core(heads(q), heads(k), heads(v))
        x = x + self.drop1(self.proj(att.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop2(self.down(F.gelu(self.up(self.ln2(x)))))


class Head(nn.Module):
    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def gpt_blocks(vocab: int = 64, d_model: int = 32, n_layers: int = 4, n_heads: int = 2, seq_len: int = 16,
               seed: int = 0, dropout: float = 0.0, tied: bool = False) -> list[nn.Module]:
    """[Embedding, Block x n_layers, Head], initialised from ``seed`` (the same on every rank);
    ``tied``: the head's output weight is the token embedding (one Parameter)."""
    torch.manual_seed(seed)
    blocks = [Embedding(vocab, d_model, seq_len, dropout), *(Block(d_model, n_heads, dropout) for _ in range(n_layers)),
              Head(d_model, vocab)]
    if tied:
        blocks[-1].out.weight = blocks[0].tok.weight
    return blocks


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, mean over every token."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def token_batches(n: int, batch: int, seq_len: int = 16, vocab: int = 64, seed: int = 0):
    """``n`` (inputs, targets) batches of a learnable synthetic language: each sequence counts
    upward from a random start with a random stride (mod vocab), targets are the next tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 4, (batch, 1), generator=g)
        seq = (start + stride * torch.arange(seq_len + 1)) % vocab
        out.append((seq[:, :-1], seq[:, 1:]))
    return out
