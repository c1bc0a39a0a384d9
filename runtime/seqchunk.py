"""Sequence chunks (Seq1F1B, issue 27): one stage runs one chunk of a microbatch's sequence at a time.

Each microbatch's sequence is cut into ``chunks`` equal pieces that flow through the pipeline one
after another. Under causal attention chunk c needs the keys and values of chunks 0 .. c-1,
computed on the same stage, so a stage keeps them per microbatch until they are no longer needed:

    stage = ChunkedStage(module, chunks=k)            # module: the stage's nn.Sequential
    for c in range(k):  y = stage.forward(x[c], mb, c)
    for c in reversed(range(k)):  grad_x[c] = stage.backward(mb, c, grad_y[c])

Forward of chunk c: stage 0's embedding gets the chunk's absolute positions (``start``); each
attention core (``gpt.AttentionCore``) gets, before its own keys and values, those of the
earlier chunks as *detached leaves that require grad*, and attends with the causal mask aligned at
the end. The chunk's own keys and values are kept twice: as computed (inside the chunk's autograd
graph) and as a fresh leaf sharing their storage, which the later chunks see. Both hooks live only
for the call; the module is not changed.

Backward of chunk c, in reverse chunk order: by then every later chunk's backward has run and
accumulated, into the ``.grad`` of chunk c's key and value leaves, what their attention sent back.
So chunk c's backward is one autograd pass from several roots: its output with ``grad_y``, and
each of its keys and values (as computed) with the gradient accumulated on its leaf. It
accumulates in turn into the leaves of chunks 0 .. c-1. The sum over chunks is exactly the
gradient of the unchunked sequence: the graph of the whole sequence is the union of the chunk
graphs, cut only at the key/value leaves, and each cut edge carries its gradient across.

B/W split (``backward_input`` then ``backward_weight``): the same multi-root pass through
``wgrad.WeightGradStore``. It composes because the store tags the split Linear nodes it finds
below *all* the roots, and the detached leaves end each chunk's graph: chunk c's B tags and queues
only chunk c's layers, and its qkv layer's queued output gradient is the sum of what came from
the chunk's own attention and from the later chunks' (autograd sums them before the node runs).
So W of chunk c may run any time after B of chunk c, in any order with the other Ws.

Memory: a microbatch's state on a stage holds, per chunk not yet backwarded, its input, its output
and its keys and values (storage shared with what autograd saved for the chunk anyway). A chunk's
record goes at its backward; the whole state once chunk 0's backward is done (``release`` drops it
earlier, e.g. after a failed step). ``chunk_activation_bytes`` measures what each chunk's forward
makes autograd save, as the profiler measures a stage's activation on CPU (``memory.SavedBytes``).

Exactness needs dropout 0 (or eval mode): with dropout the chunks draw other random numbers than
the unchunked run, which is still a valid training run but not the same one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from schedc.runtime.gpt import AttentionCore, Embedding
from schedc.runtime.memory import SavedBytes
from schedc.runtime.wgrad import WeightGradStore


def split_sequence(x: Tensor, chunks: int) -> list[Tensor]:
    """``x`` (batch, sequence, ...) cut along the sequence into ``chunks`` equal contiguous pieces."""
    t = x.shape[1]
    if chunks < 1 or t % chunks:
        raise ValueError(f"a sequence of {t} tokens does not cut into {chunks} equal chunks: use a chunk count"
                         f" that divides {t}")
    return [c.contiguous() for c in x.split(t // chunks, dim=1)]


# torch modules that mix positions along the sequence themselves, which ChunkedStage cannot hook:
# chunk by chunk they would see only the chunk (attention) or restart their state (recurrence)
_MIXING = (nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder,
           nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.RNNBase)


def chunk_refusal(module: nn.Module) -> str | None:
    """Why ``ChunkedStage`` cannot run ``module`` chunk by chunk (one line), or None. It chunks
    what is position-wise (embeddings of tokens, Linear, LayerNorm, ...) plus ``gpt.Embedding``'s
    positions and ``gpt.AttentionCore``'s causal attention; a module of torch's that mixes the
    sequence otherwise (``nn.MultiheadAttention``, the ``nn.Transformer*`` layers, RNNs) is refused,
    since it would silently attend within the chunk only. Other sequence-mixing code it cannot see."""
    for name, m in module.named_modules():
        if isinstance(m, _MIXING):
            return (f"has {type(m).__name__} {name!r}, which mixes the sequence in a way sequence chunks cannot"
                    " run yet (only schedc.runtime.gpt.AttentionCore's causal attention is chunked): use a schedule"
                    " without sequence chunks, or AttentionCore")
    return None


@dataclass
class KV:
    """One attention call's keys and values for one chunk: as computed (in the chunk's graph) and
    as the later chunks see them (detached leaves; their ``.grad`` collects what they send back)."""

    k: Tensor
    v: Tensor
    k_leaf: Tensor
    v_leaf: Tensor

    def roots(self) -> list[tuple[Tensor, Tensor]]:
        """(tensor, gradient) roots that the chunk's backward adds: where a later chunk sent one."""
        return [(t, leaf.grad) for t, leaf in ((self.k, self.k_leaf), (self.v, self.v_leaf)) if leaf.grad is not None]


@dataclass
class _Chunk:
    x: Tensor | None  # the stage input leaf (None: integer tokens, or one that needs no gradient)
    out: Tensor  # the output, or the loss on a stage with a loss_fn
    kv: list[KV]  # one per attention call, in call order (empty for the last chunk: nobody reads it)


@dataclass
class KVState:
    """One microbatch on one stage: the chunks forwarded and not yet backwarded, and tokens so far."""

    chunks: list[_Chunk] = field(default_factory=list)
    tokens: int = 0
    forwarded: int = 0


class ChunkedStage:
    """A stage module run one sequence chunk at a time (see the module docstring).

    ``loss_fn`` (the last stage): ``forward`` then takes the chunk's ``target`` and returns
    ``loss_fn(y, target)``; the backward propagates it divided by ``chunks`` (the microbatch's
    loss is the mean of its equal chunks' per-token means), times ``grad_y`` if one is given (a
    scalar, e.g. the interpreter's 1/m). ``store``: the W queue to share (one per interpreter);
    keys are ``(name, mb, chunk)``.
    """

    def __init__(self, module: nn.Module, chunks: int, loss_fn: Callable[[Tensor, Any], Tensor] | None = None,
                 store: WeightGradStore | None = None, name: Hashable = None):
        if chunks < 1:
            raise ValueError(f"a sequence needs at least one chunk, not {chunks}")
        self.module, self.chunks, self.loss_fn, self.name = module, chunks, loss_fn, name
        self.store = store if store is not None else WeightGradStore()
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.states: dict[Hashable, KVState] = {}

    # ---- forward ----

    def forward(self, x: Tensor, mb: Hashable, chunk: int, target: Any = None) -> Tensor:
        """Chunk ``chunk`` of microbatch ``mb`` (chunks in order 0, 1, ...): the output (or loss)."""
        state = self.states.setdefault(mb, KVState())
        if chunk != state.forwarded or chunk >= self.chunks:
            raise RuntimeError(f"forward of chunk {chunk} of microbatch {mb!r}: expected chunk {state.forwarded}"
                               f" of {self.chunks} (chunks run forward in order)")
        if chunk and x.shape[1] * chunk != state.tokens:
            raise ValueError(f"chunk {chunk} of microbatch {mb!r} has {x.shape[1]} tokens, the earlier ones"
                             f" {state.tokens // chunk}: chunks must be equal (split_sequence)")
        if x.is_floating_point():
            x = x.detach().requires_grad_(True)
        kv: list[KV] = []
        with self._hooks(state, kv, keep=chunk < self.chunks - 1):
            y = self.module(x)
        out = self.loss_fn(y, target) if self.loss_fn is not None else y
        state.chunks.append(_Chunk(x if x.requires_grad else None, out, kv))
        state.tokens += x.shape[1]
        state.forwarded += 1
        return out

    @contextlib.contextmanager
    def _hooks(self, state: KVState, kv: list[KV], keep: bool) -> Iterator[None]:
        """For one forward: positions from ``state.tokens`` on, attention over the earlier chunks'
        keys and values as well; this chunk's appended to ``kv`` when a later chunk will read them."""
        earlier = [c.kv for c in state.chunks]

        def positions(module, args, kwargs):
            return args, {**kwargs, "start": state.tokens}

        calls = 0

        def attend(module, args):
            nonlocal calls
            q, k, v = args
            i, calls = calls, calls + 1  # which attention call of this forward it is
            if keep:
                kv.append(KV(k, v, k.detach().requires_grad_(True), v.detach().requires_grad_(True)))
            if earlier:
                k = torch.cat([*(e[i].k_leaf for e in earlier), k], dim=-2)
                v = torch.cat([*(e[i].v_leaf for e in earlier), v], dim=-2)
            return q, k, v

        handles = []
        try:
            for m in self.module.modules():
                if isinstance(m, Embedding):
                    handles.append(m.register_forward_pre_hook(positions, with_kwargs=True))
                elif isinstance(m, AttentionCore):
                    handles.append(m.register_forward_pre_hook(attend))
            yield
        finally:
            for h in handles:
                h.remove()

    # ---- backward ----

    def backward(self, mb: Hashable, chunk: int, grad_y: Tensor | None = None) -> Tensor | None:
        """Fused BW of chunk ``chunk`` of ``mb`` (chunks in reverse order): the input gradient."""
        return self._backward(mb, chunk, grad_y, split=False)

    def backward_input(self, mb: Hashable, chunk: int, grad_y: Tensor | None = None) -> Tensor | None:
        """B: as ``backward``, with the split Linear layers' weight gradients queued for W
        (``wgrad.enable_split(module)`` first, or every weight gradient is computed here)."""
        return self._backward(mb, chunk, grad_y, split=True)

    def backward_weight(self, mb: Hashable, chunk: int) -> None:
        """W of chunk ``chunk`` of ``mb``: any time after its B."""
        self.store.backward_weight((self.name, mb, chunk))

    def _backward(self, mb: Hashable, chunk: int, grad_y: Tensor | None, split: bool) -> Tensor | None:
        state = self.states.get(mb)
        last = len(state.chunks) - 1 if state else -1
        if state is None or state.forwarded < self.chunks or chunk != last:
            raise RuntimeError(
                f"backward of chunk {chunk} of microbatch {mb!r}: chunks run backward in reverse order after"
                f" all {self.chunks} forwards ({state.forwarded if state else 0} forwarded,"
                f" next backward: {last if last >= 0 else 'none'})")
        c = state.chunks[-1]
        out, grad = c.out, grad_y
        if self.loss_fn is not None:
            out = out / self.chunks
        roots = [(t, g) for e in c.kv for t, g in e.roots()]
        outputs, grads = [out, *(t for t, _ in roots)], [grad, *(g for _, g in roots)]
        if grad is None and out.numel() != 1:
            raise ValueError(f"backward of chunk {chunk} of microbatch {mb!r} needs the gradient of its output")
        leaves = [leaf for e in state.chunks[:-1] for kv in e.kv for leaf in (kv.k_leaf, kv.v_leaf)]
        inputs = [c.x, *leaves] if c.x is not None else leaves
        if split:
            self.store.backward_input((self.name, mb, chunk), outputs, grads, inputs, self.params)
        else:
            self.store.backward_full(outputs, grads, inputs, self.params)
        state.chunks.pop()
        if not state.chunks:
            del self.states[mb]
        return c.x.grad if c.x is not None else None

    def release(self, mb: Hashable) -> None:
        """Drop what is kept for ``mb`` (done by itself after chunk 0's backward)."""
        self.states.pop(mb, None)


def chunk_activation_bytes(module: nn.Module, xs: Sequence[Tensor], targets: Sequence[Any] | None = None,
                           loss_fn: Callable[[Tensor, Any], Tensor] | None = None) -> list[int]:
    """Bytes autograd saves for each chunk's forward of one microbatch (``xs``: its chunks in
    order) on the stage ``module``, parameters excluded, each storage counted once (a storage an
    earlier chunk's forward saved again is the earlier chunk's): the profiler's CPU measure."""
    stage = ChunkedStage(module, len(xs), loss_fn)
    saved = SavedBytes(module.parameters())
    out = []
    try:
        for c, x in enumerate(xs):
            before = saved.nbytes
            with saved.hooks():
                stage.forward(x, "measure", c, None if targets is None else targets[c])
            out.append(saved.nbytes - before)
    finally:
        stage.release("measure")
    return out
