"""Deferred weight gradients: a stage's backward split into B (input gradient) and W (weights).

Zero-bubble schedules run B as soon as the next stage's gradient arrives, because the previous
stage waits for it, and run W later, wherever the rank would otherwise idle. The interpreter
calls, for one stage and one microbatch ``key``: F (the module's ordinary forward), then
``store.backward_input(key, ...)`` (B), then ``store.backward_weight(key)`` (W). Many keys may
sit between B and W at once, and their W may run in any order. A fused BW is
``store.backward_full(...)``, which is also what an ordinary ``loss.backward()`` does.

What is deferred: the weight and bias of every plain ``nn.Linear`` that ``enable_split`` has
switched to ``SplitLinear`` -- almost all of a transformer's parameters and weight-gradient
FLOPs. In B, such a layer returns its input gradient at once and queues a small closure
holding its input and output gradient (all that ``dW = g^T x`` and ``db = sum g`` need); W runs
the closures. What is not (the generic fallback): every other parameter -- LayerNorm, Embedding,
convolutions, ``nn.Linear`` subclasses such as the projections inside ``nn.MultiheadAttention``,
which never call their own forward -- gets its gradient from autograd during B. Those gradients
are cheap, and splitting them would need one autograd Function per layer type.

How a layer knows where to queue: before running B, ``backward_input`` walks this microbatch's
autograd graph from its outputs and tags each ``SplitLinear`` node with the key's queue; an
untagged node (ordinary training, ``backward_full``) computes its weight gradient on the spot.
There is no global or thread-local state: the tag lives on the graph of one microbatch, so
stores do not interfere, and it is still seen when CUDA runs backward in autograd's own device
threads (where a thread-local or a context variable set by the caller would not be). A graph that
an autograd Function builds and runs inside its own backward (a selective recompute's region,
``schedc.runtime.policies``) is not below the outputs when B walks them: such a Function says so
(``wgrad_inside = True``), B tags its node too, and its backward passes the tag on to its own
graph (``gradients_within``).

Stages under ``torch.compile``: a compiled region is one autograd node, whose backward (traced
when the region is compiled, before any tag exists) would compute the weight gradients in B. So a
``SplitLinear`` that the compiler traces breaks the graph (``torch.compiler.disable``): the layer
runs eagerly as its own ``_LinearFn`` node, which B tags as above, and the code between two
linear layers is compiled as usual. Where no graph break is allowed (``fullgraph=True``),
``enable_split`` leaves that module's linear layers plain and names it in ``fullgraph_compiled``:
their weight gradients are then computed at B (the runtime warns, naming the stage). Where it
cannot tell (a ``forward`` compiled by itself), the compiler refuses the graph break at the first
forward; ``refused_graph_break`` recognises that error (the runtime makes it one line naming the
stage).

Memory: B does not retain the graph, so the activations autograd saved are freed as usual,
except for what the queued closures keep for W (each split linear layer's input and output
gradient), which W frees.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence

import torch
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable

Tensors = Tensor | Sequence[Tensor]
WeightGrad = Callable[[], None]  # one queued weight-gradient computation of one linear layer


def _weight_grads(x: Tensor, g: Tensor, weight: bool, bias: bool) -> tuple[Tensor | None, Tensor | None]:
    """dW = g^T x and db = sum(g) over every leading dim of ``y = x W^T + b``; ``None`` where not wanted."""
    g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1]).to(g.dtype)  # .to: autocast
    return (g2.t() @ x2 if weight else None), (g2.sum(0) if bias else None)


def _accumulate(param: Tensor | None, grad: Tensor | None) -> None:
    """``param.grad += grad`` as autograd would: create ``.grad`` when absent, in the parameter's dtype."""
    if param is None or grad is None:
        return
    grad = grad.to(dtype=param.dtype, device=param.device)
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad


class _LinearFn(torch.autograd.Function):
    """``y = x W^T + b`` whose backward queues the weight gradient when its node is tagged.

    ``backward_input`` sets ``wgrad_queue`` (a list) on the node; otherwise it is absent or
    ``None`` and the weight gradient is returned like any autograd function's.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)  # saved, not held, so autograd checks in-place changes
        ctx.params = (weight, bias)  # leaves that live anyway: for the W closure and the graph walk
        return nn.functional.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        needs_x, needs_w, needs_b = ctx.needs_input_grad
        grad_x = g @ weight.to(g.dtype) if needs_x else None  # .to: under autocast g is in the low dtype
        queue: list[WeightGrad] | None = getattr(ctx, "wgrad_queue", None)
        if queue is None:
            return grad_x, *_weight_grads(x, g, needs_w, needs_b)
        if needs_w or needs_b:
            queue.append(_deferred(x.detach(), g, ctx.params, needs_w, needs_b))
        return grad_x, None, None


def _deferred(x: Tensor, g: Tensor, params: tuple[Tensor, Tensor | None], needs_w: bool, needs_b: bool) -> WeightGrad:
    """The W of one linear layer for one microbatch; holds only ``x``, ``g`` and the parameters."""

    def run() -> None:
        grad_w, grad_b = _weight_grads(x, g, needs_w, needs_b)
        _accumulate(params[0], grad_w)
        _accumulate(params[1], grad_b)

    return run


def _apply(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return _LinearFn.apply(x, weight, bias)


# ``_apply`` behind a graph break, for SplitLinear under torch.compile. Made on first use outside
# any tracing (``_graph_break``), because torch.compiler.disable imports torch._dynamo (seconds).
_apply_eagerly: Callable[[Tensor, Tensor, Tensor | None], Tensor] | None = None


def _graph_break() -> None:
    global _apply_eagerly
    if _apply_eagerly is None:
        _apply_eagerly = torch.compiler.disable(_apply, recursive=True, reason=_GRAPH_BREAK)


_GRAPH_BREAK = "schedc's B/W split runs each split nn.Linear outside the compiled graph"


def refused_graph_break(error: BaseException) -> bool:
    """Is ``error`` torch.compile refusing the graph break at a split linear layer (a part compiled
    with ``fullgraph=True`` that ``fullgraph_compiled`` cannot see, e.g. a compiled ``forward``)?"""
    return _GRAPH_BREAK in str(error)


class SplitLinear(nn.Linear):
    """An ``nn.Linear`` whose weight gradient can be deferred to W (see ``enable_split``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _graph_break()

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            # Traced by torch.compile: break the graph, so that this layer stays an autograd node
            # of its own that B can tag (inside a compiled region, its weight gradient would be
            # computed with the region's backward, in B).
            assert _apply_eagerly is not None  # made by enable_split or __init__, before any tracing
            return _apply_eagerly(x, self.weight, self.bias)
        return _LinearFn.apply(x, self.weight, self.bias)


def _compiled_fullgraph(m: nn.Module) -> bool:
    """Is ``m`` compiled (``torch.compile(m)`` or ``m.compile()``) with ``fullgraph=True``?

    Read from the compile context torch keeps (``OptimizedModule.dynamo_ctx``, or the one in the
    closure of ``m._compiled_call_impl``) without importing torch._dynamo; False where absent.
    """
    contexts = [getattr(m, "dynamo_ctx", None)] if hasattr(m, "_orig_mod") else []
    call = getattr(m, "_compiled_call_impl", None)
    contexts += [c.cell_contents for c in getattr(call, "__closure__", None) or () if _filled(c)]
    return any(getattr(ctx, "fullgraph", False) is True for ctx in contexts)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def fullgraph_compiled(module: nn.Module) -> list[str]:
    """The names (``""``: ``module`` itself) of the parts of ``module`` compiled with
    ``fullgraph=True``, outermost only: ``enable_split`` leaves their linear layers plain."""
    found: list[str] = []
    for name, m in module.named_modules(remove_duplicate=False):
        if _compiled_fullgraph(m) and not any(name == f or name.startswith(f + ".") or f == "" for f in found):
            found.append(name)
    return found


def enable_split(module: nn.Module) -> list[nn.Parameter]:
    """Make every plain ``nn.Linear`` in ``module`` (itself included) a ``SplitLinear``; idempotent.

    The instances change class in place, so parameters, state_dict, hooks, ``isinstance(m,
    nn.Linear)`` and ordinary training are untouched; the gradient is deferred only inside
    ``WeightGradStore.backward_input``. Subclasses of ``nn.Linear`` are left alone: they may not
    compute through their forward (``nn.MultiheadAttention``'s ``out_proj`` does not). So are
    (made plain again) the linear layers inside a part compiled with ``fullgraph=True``
    (``fullgraph_compiled``), which allows no graph break at them.
    Returns the parameters whose gradients W computes; every other parameter of ``module``
    gets its gradient in B.
    """
    _graph_break()
    whole = set()
    for name in fullgraph_compiled(module):
        whole.update(id(m) for m in module.get_submodule(name).modules())
    params: dict[int, nn.Parameter] = {}
    for m in module.modules():
        if id(m) in whole:
            if type(m) is SplitLinear:
                m.__class__ = nn.Linear
            continue
        if type(m) is nn.Linear:
            m.__class__ = SplitLinear
        if isinstance(m, SplitLinear):
            params.update((id(p), p) for p in m.parameters(recurse=False))
    return list(params.values())


def _as_tuple(t: Tensors | None) -> tuple[Tensor, ...] | None:
    return None if t is None else (t,) if isinstance(t, Tensor) else tuple(t)


def _graph(outputs: Sequence[Tensor]) -> Iterator:
    """Every autograd node of the graph below ``outputs``, each once."""
    seen: set[object] = set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(n for n, _ in node.next_functions if n is not None)


def _tag_linears(outputs: Sequence[Tensor], queue: list[WeightGrad] | None) -> list[Tensor]:
    """Set ``wgrad_queue`` on every split linear node of the graph below ``outputs``, and on every
    node of an autograd Function that runs a graph of its own in its backward and says so with the
    class attribute ``wgrad_inside = True`` (a selective recompute's region: it passes the tag on
    to its own graph, ``gradients_within``).

    Returns the parameters of the linear layers: autograd must be asked for them, or it would skip
    a layer whose input needs no gradient (the first layer of the first stage), and its W with it.
    """
    params: list[Tensor] = []
    for node in _graph(outputs):
        cls = getattr(node, "_forward_cls", None)
        if cls is _LinearFn:
            node.wgrad_queue = queue
            params.extend(p for p in node.params if p is not None)
        elif getattr(cls, "wgrad_inside", False):
            node.wgrad_queue = queue
    return params


def gradients_within(ctx: FunctionCtx, output: Tensor, grad_output: Tensor,
                     wrt: Sequence[Tensor]) -> tuple[Tensor | None, ...]:
    """For the backward of an autograd Function with ``wgrad_inside = True`` (see ``_tag_linears``)
    whose ``output`` is a graph of its own: the gradients of ``wrt`` (None where none), with the
    split linear layers of that graph deferred to the W of the B that runs this backward (the queue
    ``ctx`` was tagged with; none in a fused backward or in ordinary training: computed here).
    Every other leaf of that graph that wants a gradient (a tensor the Function's inner code reached
    without taking it as an input) gets it in its ``.grad`` here, as autograd would give it."""
    queue: list[WeightGrad] | None = getattr(ctx, "wgrad_queue", None)
    found = _tag_linears((output,), queue)
    asked = {id(t) for t in wrt}
    others = {id(t): t for t in found if t.requires_grad}
    for node in _graph((output,)):
        leaf = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf that wants a gradient
        if leaf is not None:
            others.setdefault(id(leaf), leaf)
    others = [t for i, t in others.items() if i not in asked]
    if not wrt and not others:
        return ()
    grads = torch.autograd.grad(output, (*wrt, *others), grad_output, allow_unused=True)
    for t, g in zip(others, grads[len(wrt):]):
        _accumulate(t, g)
    return grads[:len(wrt)]


def _backward(
    outputs: Tensors, grad_outputs: Tensors | None, targets: Iterable[Tensor], queue: list[WeightGrad] | None
) -> None:
    """Autograd from ``outputs`` into ``.grad`` of ``targets`` (and the split layers found), graph freed."""
    outs = _as_tuple(outputs)
    assert outs is not None
    found = _tag_linears(outs, queue)
    unique = {id(t): t for t in (*targets, *found) if t.requires_grad}
    if unique:  # empty: nothing below outputs wants a gradient (inputs=[] would mean "all leaves")
        torch.autograd.backward(outs, _as_tuple(grad_outputs), inputs=list(unique.values()))


class WeightGradStore:
    """The weight-gradient closures queued by B, per key (e.g. ``(stage, microbatch)``), until W.

    One store per interpreter. Keys are registered by B even when nothing was queued, so that
    every B has its W and ``pending()`` is empty exactly when every W has run.
    """

    def __init__(self) -> None:
        self._queues: dict[Hashable, list[WeightGrad]] = {}
        self._lock = threading.Lock()

    def backward_input(
        self,
        key: Hashable,
        outputs: Tensors,
        grad_outputs: Tensors | None,
        inputs: Sequence[Tensor] = (),
        params: Iterable[Tensor] = (),
    ) -> None:
        """B: accumulate the gradients of ``inputs`` and ``params`` into their ``.grad``, queue W.

        ``outputs``: the stage output(s) of microbatch ``key``, with ``grad_outputs`` from the next
        stage, or a scalar loss with ``grad_outputs=None`` on the last stage. ``inputs``: the stage
        input leaves (those that do not require grad are skipped). ``params``: the stage's
        parameters (passing all of them is fine: split linear layers get theirs in W, not here).
        """
        with self._lock:
            if key in self._queues:
                raise RuntimeError(f"B for {key!r} ran twice without its W: run backward_weight({key!r}) in between")
        queue: list[WeightGrad] = []
        _backward(outputs, grad_outputs, (*inputs, *params), queue)
        with self._lock:
            self._queues[key] = queue

    def backward_weight(self, key: Hashable) -> None:
        """W: run and drop the weight-gradient closures that B of ``key`` queued."""
        with self._lock:
            queue = self._queues.pop(key, None)
        if queue is None:
            raise RuntimeError(
                f"W for {key!r} has no B before it: run backward_input({key!r}, ...) first (pending: {self.pending()})"
            )
        with torch.no_grad():
            for run in queue:
                run()
        # The autograd graph's split nodes still point at this list (their tag) for as long as
        # anything keeps the graph alive (the caller's output tensor): empty it, so that the
        # inputs and output gradients it held are freed now.
        queue.clear()

    def backward_full(
        self,
        outputs: Tensors,
        grad_outputs: Tensors | None,
        inputs: Sequence[Tensor] = (),
        params: Iterable[Tensor] = (),
    ) -> None:
        """Fused BW: B and W at once, with the arguments of ``backward_input``; queues nothing."""
        _backward(outputs, grad_outputs, (*inputs, *params), None)

    def pending(self) -> list[Hashable]:
        """Keys whose B ran and whose W has not, in B order: must be empty at the optimizer step."""
        with self._lock:
            return list(self._queues)
