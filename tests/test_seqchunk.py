"""Sequence chunks (schedc.runtime.seqchunk) against unchunked training of the example GPT."""

from __future__ import annotations

import torch

from schedc.runtime.gpt import AttentionCore, Embedding


def close(actual, expected) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


def test_attention_over_earlier_keys_is_the_end_of_causal_attention():
    """``AttentionCore`` given the keys of earlier positions first: the last rows of full causal
    attention. ``Embedding(start=...)``: the positions from ``start`` on."""
    q, k, v = torch.randn(3, 2, 2, 8, 4).unbind(0)
    full = AttentionCore()(q, k, v)
    close(AttentionCore()(q[:, :, 5:], k, v), full[:, :, 5:])
    emb = Embedding(10, 4, 8)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    close(emb(tokens[:, 5:], start=5), emb(tokens)[:, 5:])
