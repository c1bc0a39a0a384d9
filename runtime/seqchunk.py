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

A causal convolution (``gpt.CausalConv``) is carried the same way: each chunk keeps the last
kernel - 1 positions of its input (with the context in front, so a chunk shorter than that passes
older positions on) as computed and as a leaf, and the next chunk's convolution gets that leaf as
its ``context``.

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

Checked, not assumed: ``chunk_mismatch`` runs a stage module on one whole sequence and chunk by
chunk (a fresh ``ChunkedStage``), in eval mode (no dropout; batch norm is refused by type, since
its training statistics would be the chunk's) without autograd and from the same random state,
and compares the outputs; where they differ it names the first module (in the order their calls
end) whose output differs. ``chunk_failure`` names the module in which a chunk's forward raised
(e.g. a position table of the whole sequence's length added to a chunk). The runtime calls both
on each stage's first sequence of the first step (``PipelineRuntime``) and the profiler on each
stage's microbatch (``profile_stages(..., sequence_chunks=k)``), so a convolution over the
sequence, a learnable position table or any hand-written mixing is refused in one line instead of
training to other weights. What it cannot see: state a module carries between calls by itself
(its forward may agree while its gradient is cut).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from schedc.runtime.gpt import AttentionCore, CausalConv, Embedding
from schedc.runtime.memory import SavedBytes
from schedc.runtime.policies import capture_rng, replaying_rng
from schedc.runtime.wgrad import WeightGradStore


def split_sequence(x: Tensor, chunks: int) -> list[Tensor]:
    """``x`` (batch, sequence, ...) cut along the sequence into ``chunks`` equal contiguous pieces."""
    t = x.shape[1]
    if chunks < 1 or t % chunks:
        raise ValueError(f"a sequence of {t} tokens does not cut into {chunks} equal chunks: use a chunk count"
                         f" that divides {t}")
    return [c.contiguous() for c in x.split(t // chunks, dim=1)]


# torch modules that mix positions along the sequence themselves, which ChunkedStage cannot hook:
# chunk by chunk they would see only the chunk (attention) or restart their state (recurrence), or
# normalise over the chunk (batch norm in training, which chunk_mismatch's eval-mode run cannot see)
_MIXING = (nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder,
           nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.RNNBase, nn.modules.batchnorm._BatchNorm)


def chunk_refusal(module: nn.Module) -> str | None:
    """Why ``ChunkedStage`` cannot run ``module`` chunk by chunk (one line), or None. It chunks
    what is position-wise (embeddings of tokens, Linear, LayerNorm, ...) plus ``gpt.Embedding``'s
    positions, ``gpt.AttentionCore``'s causal attention and ``gpt.CausalConv``; a module of torch's
    that mixes the sequence otherwise (``nn.MultiheadAttention``, the ``nn.Transformer*`` layers,
    RNNs, batch norm) is refused, since it would silently attend within the chunk only. Other
    sequence mixing (torch's convolutions, hand-written code) is found by running it:
    ``chunk_mismatch``."""
    for name, m in module.named_modules():
        if isinstance(m, _MIXING):
            return (f"has {type(m).__name__} {name!r}, which mixes the sequence in a way sequence chunks cannot"
                    " run yet (of what mixes it, only schedc.runtime.gpt's AttentionCore and CausalConv are"
                    " chunked): use a schedule without sequence chunks, or those modules")
    return None


@dataclass
class KV:
    """What one hooked call of one chunk carries to the later chunks: an attention call's keys and
    values, a causal convolution's last kernel - 1 input positions. As computed (in the chunk's
    graph) and as the later chunks see them (detached leaves; their ``.grad`` collects what they
    send back)."""

    computed: tuple[Tensor, ...]
    leaves: tuple[Tensor, ...]

    @classmethod
    def of(cls, *computed: Tensor) -> "KV":
        return cls(computed, tuple(t.detach().requires_grad_(True) for t in computed))

    def roots(self) -> list[tuple[Tensor, Tensor]]:
        """(tensor, gradient) roots that the chunk's backward adds: where a later chunk sent one."""
        return [(t, leaf.grad) for t, leaf in zip(self.computed, self.leaves) if leaf.grad is not None]


@dataclass
class _Chunk:
    x: Tensor | None  # the stage input leaf (None: integer tokens, or one that needs no gradient)
    out: Tensor  # the output, or the loss on a stage with a loss_fn
    kv: list[KV]  # one per hooked call (attention, causal convolution), in call order (none for the last chunk)


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

        def call() -> int:
            nonlocal calls
            calls += 1
            return calls - 1  # which hooked call of this forward it is: the same in every chunk

        def attend(module, args):
            q, k, v = args
            i = call()
            if keep:
                kv.append(KV.of(k, v))
            if earlier:
                k = torch.cat([*(e[i].leaves[0] for e in earlier), k], dim=-2)
                v = torch.cat([*(e[i].leaves[1] for e in earlier), v], dim=-2)
            return q, k, v

        def convolve(module, args, kwargs):  # the chunk before's last positions (they hold older ones if it is short)
            x = args[0]
            i = call()
            context = earlier[-1][i].leaves[0] if earlier else None
            if keep:
                kv.append(KV.of(module.window(x, context)[:, x.shape[1]:]))  # the last kernel - 1 positions
            return args, {**kwargs, "context": context}

        handles = []
        try:
            for m in self.module.modules():
                if isinstance(m, Embedding):
                    handles.append(m.register_forward_pre_hook(positions, with_kwargs=True))
                elif isinstance(m, AttentionCore):
                    handles.append(m.register_forward_pre_hook(attend))
                elif isinstance(m, CausalConv):
                    handles.append(m.register_forward_pre_hook(convolve, with_kwargs=True))
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
        leaves = [leaf for e in state.chunks[:-1] for kv in e.kv for leaf in kv.leaves]
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


# ---- checking a stage: chunk by chunk against the whole sequence ----

# How far a chunked output may lie from the whole sequence's, relative to the largest value of the
# latter: far above the rounding of another summation order, far below what a chunk boundary
# changes (a convolution tap, a position's offset: of the order of the values themselves).
TOLERANCE = {torch.float16: 3e-2, torch.bfloat16: 3e-2}
TOLERANCE_DEFAULT = 1e-3
TOLERANCE_TF32 = 1e-2  # float32 on CUDA where TF32 may round matmul or convolution inputs to 10 bits


def tolerance(t: Tensor) -> float:
    """``TOLERANCE`` for the values of ``t`` (its dtype, and TF32 for float32 on CUDA where allowed)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32
    if t.dtype == torch.float32 and t.is_cuda and tf32:
        return TOLERANCE_TF32
    return TOLERANCE.get(t.dtype, TOLERANCE_DEFAULT)

_ADVICE = ("sequence chunks carry state from chunk to chunk only for schedc.runtime.gpt's Embedding (positions),"
           " AttentionCore (causal attention) and CausalConv: use a schedule without sequence chunks, or those modules")


class ChunkError(RuntimeError):
    """A stage's forward raised on a sequence chunk, inside ``chunk_mismatch`` (which returns its
    message, ``chunk_failure``'s one line)."""


def chunk_mismatch(module: nn.Module, x: Tensor, chunks: int) -> str | None:
    """None if ``module`` run chunk by chunk (a fresh ``ChunkedStage``) gives its output on the
    whole sequence ``x`` (batch, sequence, ...), within ``tolerance`` of the output's largest value;
    else why not, one line starting with what differs, naming the first module (in the order
    their calls end, so the innermost) whose output differs. Run in eval mode, without autograd,
    each pass from the same random state; the module's modes and the random state are left as
    they were. Costs one forward of the sequence and one of its chunks (twice each if they differ).
    A chunk's forward that raises gives ``chunk_failure``'s line (out of memory is raised)."""
    try:
        whole, parts = _both_passes(module, x, chunks)
    except ChunkError as e:  # (the recording pass below runs the same chunks: it gets past them)
        return str(e)
    gap = _gap(whole, parts)
    if gap is None:
        return None
    whole_calls, chunk_calls = _both_passes(module, x, chunks, record=True)
    where = "first"
    for name in whole_calls:  # in the order the calls ended on the whole sequence
        runs = [calls.get(name, []) for calls in chunk_calls]
        if any(len(r) != len(whole_calls[name]) for r in runs):
            continue  # called another number of times per chunk: nothing to pair up
        if any(_gap(w, [r[i] for r in runs]) is not None for i, w in enumerate(whole_calls[name])):
            where = f"first at its module {_named(module, name)}"
            break
    return (f"'s forward over {chunks} sequence chunks differs from its forward on the whole sequence ({gap}),"
            f" {where}: it mixes positions along the sequence in a way the chunks cannot follow; {_ADVICE}")


def chunk_failure(module: nn.Module, error: BaseException, tokens: int, chunks: int) -> str:
    """What to say (one line) when ``module``'s forward on a sequence chunk of ``tokens`` tokens
    raised ``error``: the innermost of its modules on the traceback, torch's message (first 200
    characters, on one line)."""
    names = {id(m): n for n, m in module.named_modules()}
    found = None
    tb = error.__traceback__
    while tb is not None:  # the innermost frame of one of the stage's modules
        me = tb.tb_frame.f_locals.get("self")
        if isinstance(me, nn.Module) and id(me) in names:
            found = names[id(me)]
        tb = tb.tb_next
    where = f" in its module {_named(module, found)}" if found is not None else ""
    said = " ".join(str(error).split())
    said = said if len(said) <= 200 else said[:199] + "…"
    return (f" raised {type(error).__name__} on a sequence chunk ({tokens} tokens, one of {chunks}){where}: {said};"
            f" a module that needs the whole sequence cannot run on chunks: {_ADVICE}")


def _named(root: nn.Module, name: str) -> str:
    """A module of ``root`` as a message names it: 'name' (Class), or the stage's own forward."""
    if not name:
        return f"itself ({type(root).__name__}'s own forward)"
    return f"{name!r} ({type(root.get_submodule(name)).__name__})"


def _both_passes(module: nn.Module, x: Tensor, chunks: int, record: bool = False):
    """``module`` on the whole ``x``, then chunk by chunk: the outputs (the whole's, the chunks'),
    or with ``record`` every module's outputs by name ({name: [output per call]} for the whole
    sequence, in the order the calls ended, and one such dict per chunk)."""
    calls: list[dict[str, list]] = []

    def keep(name):
        def hook(mod, args, out):
            calls[-1].setdefault(name, []).append(out)
        return hook

    modes = [(m, m.training) for m in module.modules()]
    handles = [m.register_forward_hook(keep(n)) for n, m in module.named_modules()] if record else []
    rng = capture_rng(x.device)
    stage = ChunkedStage(module, chunks)
    try:
        module.eval()
        with torch.no_grad():
            calls.append({})
            with replaying_rng(rng, x.device):
                whole = module(x)
            parts = []
            for c, piece in enumerate(split_sequence(x, chunks)):
                calls.append({})
                try:
                    with replaying_rng(rng, x.device):
                        parts.append(stage.forward(piece, "check", c))
                except torch.OutOfMemoryError:
                    raise
                except Exception as e:
                    raise ChunkError(chunk_failure(module, e, piece.shape[1], chunks)) from e
    finally:
        stage.release("check")
        for h in handles:
            h.remove()
        for m, mode in modes:
            m.training = mode
    return (calls[0], calls[1:]) if record else (whole, parts)


def _tensors(out: Any) -> list[Tensor]:
    """The tensors of a module's output (a tensor, or a tuple or list of them, nested)."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def _gap(whole: Any, parts: list[Any]) -> str | None:
    """None if the chunks' outputs ``parts`` put together are ``whole`` (within ``tolerance``): joined
    along the one dimension where their shapes differ from the whole's, or each equal to it where
    none does; else what differs, a few words."""
    wholes, pieces = _tensors(whole), [_tensors(p) for p in parts]
    if any(len(p) != len(wholes) for p in pieces):
        return "another number of tensors per chunk"
    for i, w in enumerate(wholes):
        ps = [p[i] for p in pieces]
        shapes = {tuple(p.shape) for p in ps}
        if shapes == {tuple(w.shape)}:
            joined = None
        else:
            dims = {d for p in ps if p.dim() == w.dim() for d in range(w.dim()) if p.shape[d] != w.shape[d]}
            if len(shapes) > 1 or any(p.dim() != w.dim() for p in ps) or len(dims) != 1 or \
                    sum(p.shape[min(dims)] for p in ps) != w.shape[min(dims)]:
                return f"shape {tuple(ps[0].shape)} per chunk against {tuple(w.shape)} for the whole sequence"
            joined = torch.cat(ps, dim=min(dims))
        for got in ps if joined is None else [joined]:
            if not w.is_floating_point():
                if not torch.equal(got, w):
                    return "other values"
                continue
            diff = (got.float() - w.float()).abs().nan_to_num(nan=float("inf"))
            diff = diff.masked_fill(got.isnan() & w.isnan(), 0)
            top = w.float().abs().nan_to_num(nan=0, posinf=0, neginf=0).max().item() if w.numel() else 0.0
            worst = diff.max().item() if diff.numel() else 0.0
            if worst > tolerance(w) * max(top, 1e-12):
                return f"largest difference {worst:.3g} where the output's values reach {top:.3g}"
    return None
