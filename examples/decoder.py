"""Your own model with schedc: a decoder-only language model built as torchtitan's and Hugging
Face's are (a token embedding, an ``nn.ModuleList`` of blocks, a final norm, an output head),
profiled, solved and trained with the schedule. docs/your-model.md walks through it.

    schedc profile examples/decoder.py:spec -p 2 -m 8 -o out/decoder.yaml    # measure this machine
    schedc solve out/decoder.yaml -o out/decoder.json                         # the schedule file
    torchrun --nproc_per_node 2 examples/decoder.py out/decoder.json          # train with it

The model: RMSNorm before attention and MLP, rotary positions, torch's scaled_dot_product_attention
(causal), a SwiGLU MLP, no biases. ``Decoder.blocks()`` is the same model as a list of blocks.
``spec()`` is what ``schedc profile`` takes; ``main()`` runs on each rank under torchrun (gloo on
CPU, NCCL with one GPU per rank), trains with the schedule and prints the loss, and the measured
time of each step (on the last stage's rank, optimizer included) against the schedule's simulated one.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import schedc
from schedc.runtime import ModelSpec, PipelineRuntime, init_distributed, local_stages
from schedc.runtime.gpt import lm_loss, token_batches  # the example's synthetic data and loss: yours go here

VOCAB, DIM, LAYERS, HEADS, SEQ = 256, 96, 6, 4, 32
BATCH = 16  # sequences per iteration, split into the schedule's microbatches


class Rotary(nn.Module):
    """Rotary position embedding of queries and keys (the cos and sin tables are buffers)."""

    def __init__(self, head_dim: int, seq_len: int, base: float = 10000.0):
        super().__init__()
        freqs = base ** (-torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(seq_len).float(), freqs)  # (seq, head_dim / 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, heads, seq, head_dim)
        a, b = x[..., 0::2], x[..., 1::2]
        cos, sin = self.cos[: x.shape[-2]], self.sin[: x.shape[-2]]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, seq_len: int):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.rotary = Rotary(dim // heads, seq_len)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (w(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(self.rotary(q), self.rotary(k), v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, seq_len: int):
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(dim), Attention(dim, heads, seq_len)
        self.ffn_norm, self.feed_forward = nn.RMSNorm(dim), FeedForward(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Decoder(nn.Module):
    """tokens (batch, seq) -> logits (batch, seq, vocab), laid out as torchtitan's Transformer."""

    def __init__(self, vocab: int = VOCAB, dim: int = DIM, layers: int = LAYERS, heads: int = HEADS,
                 seq_len: int = SEQ):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, heads, seq_len) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))

    def blocks(self) -> list[nn.Module]:
        """The same computation as a list of blocks, each taking the one before's output: the
        embedding, each layer, then the norm and the head together (the modules themselves)."""
        return [self.tok_embeddings, *self.layers, nn.Sequential(self.norm, self.output)]


def spec() -> ModelSpec:
    torch.manual_seed(0)  # the same weights on every rank
    (batch,) = token_batches(1, BATCH, seq_len=SEQ, vocab=VOCAB, seed=0)
    return ModelSpec(blocks=Decoder().blocks(), batch=batch, loss_fn=lm_loss)


def main(schedule: str, steps: int = 30) -> dict[int, nn.Module]:
    rank, world, device = init_distributed()
    compiled, model = schedc.load(schedule), spec()
    stages = local_stages(compiled, model.blocks, device=device)  # this rank's, cut as the profile chose
    runtime = PipelineRuntime(compiled, stages, model.loss_fn, device=device)
    optimizer = torch.optim.AdamW([p for s in stages.values() for p in s.parameters()], lr=1e-3)
    for step, (x, y) in enumerate(token_batches(steps, BATCH, seq_len=SEQ, vocab=VOCAB, seed=1)):
        start = time.perf_counter()
        loss = runtime.step(x, y)  # the mean loss on the last stage's rank, None elsewhere
        optimizer.step()
        optimizer.zero_grad()
        if loss is not None:
            print(f"step {step:3d}  loss {loss.item():.4f}  {1e3 * (time.perf_counter() - start):.1f} ms measured,"
                  f" {compiled.timeline.makespan:.1f} ms simulated", flush=True)
    return stages


if __name__ == "__main__":  # torchrun --nproc_per_node 2 examples/decoder.py SCHEDULE [--steps N] [--save PREFIX]
    ap = argparse.ArgumentParser(description="Train the decoder with a schedule file from `schedc solve`.")
    ap.add_argument("schedule")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--save", help="write each rank's trained weights to SAVE.RANK.pt")
    args = ap.parse_args()
    trained = main(args.schedule, args.steps)
    if args.save:
        weights = {f"{s}.{k}": t for s, m in trained.items() for k, t in m.state_dict().items()}
        torch.save(weights, f"{args.save}.{dist.get_rank()}.pt")
    dist.destroy_process_group()
