"""Gradients of opbridge ops: a registered formula, or the reference's own, by running it again.

Without a formula (``OpDef.register_autograd``) the backward runs the reference again with autograd
on and differentiates it, as activation checkpointing does: for a reference that drew random numbers in
an eager forward, from the random state the forward started from (autocast never reaches a reference:
see ``inside_reference``). Under ``torch.compile`` that run is an op of its own (``<op>_grad``), which compiled
code calls instead of tracing the reference (which may walk its data in Python).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from typing import Any

from opbridge.errors import OpDefinitionError

__all__ = [
    "BackwardContext",
    "define",
    "note_forward",
    "rng_before",
    "rng_states",
    "same_states",
    "shares_memory",
    "tracing",
    "watched",
    "watching_draws",
]


@dataclasses.dataclass(frozen=True)
class BackwardContext:
    """What a backward formula (:meth:`OpDef.register_autograd`) gets besides the gradients.

    ``inputs`` holds the op's tensor inputs (None for an omitted optional one), ``outputs`` its
    outputs (saved by the forward only while a formula is registered), ``attrs`` its attribute
    values by name, ``needs_input_grad`` one flag per tensor input.
    """

    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    attrs: Mapping[str, Any]
    needs_input_grad: tuple[bool, ...]


# ------------------------------------------------------------------ the forward's random state


class _ForwardState(threading.local):
    """Per thread: the states a forward that drew random numbers started from, with a weak reference to its
    first output (see :func:`note_forward`), and the active :func:`watching_draws`. (Defaults on the class:
    read at every call.)"""

    random: tuple[Any, dict[str, Any]] | None = None
    watches: list[Any] | None = None


_FORWARD = _ForwardState()


def rng_before(tensors: Sequence[Any]) -> dict[str, Any] | None:
    """The random states a forward starts from, where one of its inputs requires grad (else None)."""
    if not any(t is not None and t.requires_grad for t in tensors):
        return None
    return rng_states(tensors)


def note_forward(before: dict[str, Any] | None, drew: bool, output: Any) -> None:
    """After an eager forward: keep ``before`` for its backward where the reference drew random numbers."""
    if before is not None and drew:
        _FORWARD.random = (weakref.ref(output), before)


@functools.cache
def _draw_watch() -> type:
    """A TorchDispatchMode that notes an op drawing random numbers (tagged ``nondeterministic_seeded``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seeded = torch.Tag.nondeterministic_seeded

    class DrawWatch(TorchDispatchMode):
        drew = False

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if seeded in func.tags:
                self.drew = True
            return func(*args, **(kwargs or {}))

    return DrawWatch


def watched() -> bool:
    """Whether a :func:`watching_draws` is active in this thread (an op's forward then watches its
    reference too: the mode sees the op's call, not the ops its reference runs)."""
    return bool(_FORWARD.watches)


@contextmanager
def watching_draws(active: bool = True) -> Iterator[Any]:
    """While inside, note whether this thread's ops draw random numbers (``.drew`` of what it yields; a
    draw an op's forward notes inside counts for every enclosing watch). Per thread, unlike comparing the
    process's random state before and after: another thread's draws (a data-loading thread's
    augmentation) made a deterministic op look random."""
    if not active:
        yield SimpleNamespace(drew=False)
        return
    stack = _FORWARD.watches
    if stack is None:
        stack = _FORWARD.watches = []
    watch = _draw_watch()()
    stack.append(watch)
    try:
        with watch:
            yield watch
    finally:
        stack.pop()
        if watch.drew:
            for outer in stack:
                outer.drew = True


def _take_forward_rng(output: Any) -> dict[str, Any]:
    """The states :func:`note_forward` kept for ``output`` (a forward's first output), once."""
    kept = _FORWARD.random
    if kept is None or kept[0]() is not output:
        return {}
    _FORWARD.random = None
    return kept[1]


def tracing(tensors: Sequence[Any]) -> bool:
    """Whether the op runs traced (torch.compile, torch.export, a fake or meta tensor), where the random
    states are not the run's: nothing to compare or restore."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor  # (imported by torch itself)
    from torch._subclasses.functional_tensor import FunctionalTensor

    if torch.compiler.is_compiling() or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        return True
    return any(isinstance(t, (FakeTensor, FunctionalTensor)) or (t is not None and t.is_meta) for t in tensors)


def same_states(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    # (as bytes: the states are small CPU byte tensors, and torch.equal takes twice as long)
    return a.keys() == b.keys() and all(a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)


def rng_states(tensors: Sequence[Any]) -> dict[str, Any]:
    import torch

    states = {"cpu": torch.default_generator.get_state()}
    cuda = {str(t.device) for t in tensors if t is not None and t.is_cuda}
    for device in sorted(cuda):
        states[device] = torch.cuda.get_rng_state(device)
    return states


# ------------------------------------------------------------------ the forward's random state, again


@contextmanager
def _replaying(rng: Mapping[str, Any]) -> Iterator[None]:
    """The random states ``rng`` (restored afterwards); nothing where it is empty."""
    import torch

    with ExitStack() as stack:
        if rng:
            cuda = [k for k in rng if k != "cpu"]
            stack.enter_context(torch.random.fork_rng(devices=cuda))
            torch.set_rng_state(rng["cpu"])
            for device in cuda:
                torch.cuda.set_rng_state(rng[device], device)
        yield


# ------------------------------------------------------------------ registration


def define(
    lib: Any,
    qual: str,
    opname: str,
    attr_params: str,
    *,
    current: Callable[[], Any],
    definition: Callable[[int], Any],
    decode: Callable[[Any, tuple[Any, ...]], tuple[list[Any], dict[str, Any]]],
    inside: Callable[[], Any],
) -> None:
    """Register the backward of the torch op ``qual`` (defined in ``lib`` as ``opname``) and its
    ``<opname>_grad`` op. ``current()`` gives the OpDef the op runs now, ``definition(i)`` the one
    with index i, ``decode(opdef, args)`` splits the op's arguments into (tensors, attrs),
    ``inside()`` marks a reference's run."""
    import torch

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        opdef = current()
        n = len(opdef.spec.inputs)
        outputs = output if isinstance(output, tuple) else (output,)
        # the outputs only for a formula: the reference's own backward recomputes them
        ctx.save_for_backward(*inputs[:n], *(outputs if opdef.backward is not None else ()))
        ctx.opbridge_saved_outputs = opdef.backward is not None
        ctx.opbridge_attrs = inputs[n:]
        ctx.opbridge_definition = opdef._definition_index
        rng = _take_forward_rng(outputs[0])
        ctx.opbridge_rng = (",".join(rng), list(rng.values()))

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        opdef = definition(ctx.opbridge_definition)
        n = len(opdef.spec.inputs)
        saved = ctx.saved_tensors
        encoded = tuple(ctx.opbridge_attrs)
        tensors, attrs = decode(opdef, tuple(saved[:n]) + encoded)
        needs = tuple(bool(f) for f in ctx.needs_input_grad[:n])
        context = BackwardContext(tuple(tensors), tuple(saved[n:]), attrs, needs)
        devices, states = ctx.opbridge_rng
        if opdef.backward is not None and ctx.opbridge_saved_outputs:
            result = _checked_grads(opdef, opdef.backward(context, *grads), context)
        elif not _traced((*tensors, *grads)):
            rng = dict(zip(devices.split(","), states)) if devices else {}
            result = _recomputed_grads(opdef, context, grads, rng, inside)
        else:
            # traced (torch.compile): an op of its own, which compiled code calls (the reference may
            # walk its data in Python, which tracing cannot follow)
            found = iter(
                grad_op(
                    list(tensors),
                    list(grads),
                    list(needs),
                    devices,
                    list(states),
                    *encoded,
                )
            )
            result = [next(found) if need else None for need in needs]
        return (*result, *([None] * len(encoded)))

    def grad_impl(
        inputs: list[Any],
        grads: list[Any],
        needs: list[bool],
        devices: str,
        states: list[Any],
        *encoded: Any,
    ) -> list[Any]:
        # the op's current definition, looked up when the compiled code runs: a process-local index
        # baked into the traced graph would name another op in a process that loads that graph from
        # torch.compile's cache, and a redefined op's old definition in this one
        opdef = current()
        tensors, attrs = decode(opdef, (*inputs, *encoded))
        context = BackwardContext(tuple(tensors), (), attrs, tuple(needs))
        rng = dict(zip(devices.split(","), states)) if devices else {}
        with _recording():
            found = _recomputed_grads(opdef, context, tuple(grads), rng, inside)
        out: list[Any] = []
        for x, g, need in zip(inputs, found, needs):
            if not need:
                continue
            g = torch.zeros(x.shape, dtype=x.dtype, device=x.device) if g is None else g.contiguous()
            # an op's outputs alias neither its inputs nor each other (autograd may hand two inputs one
            # tensor, and compiled code then reuses one output's memory while the other is read)
            if any(shares_memory(g, t) for t in (*inputs, *grads, *out) if t is not None):
                g = g.clone()
            out.append(g)
        return out

    def grad_fake(inputs: list[Any], grads: list[Any], needs: list[bool], *_: Any) -> list[Any]:
        return [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x, need in zip(inputs, needs) if need]

    torch.library.register_autograd(qual, backward, setup_context=setup_context, lib=lib)
    grad_params = (
        "Tensor?[] inputs__, Tensor?[] grad_outputs__, bool[] needs__, str rng_devices__, Tensor[] rng_states__"
    )
    lib.define(f"{opname}_grad({grad_params}{', ' + attr_params if attr_params else ''}) -> Tensor[]")
    lib.impl(f"{opname}_grad", grad_impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{qual}_grad", grad_fake, lib=lib)
    namespace, _ = qual.split("::")
    grad_op = getattr(getattr(torch.ops, namespace), f"{opname}_grad").default


@contextmanager
def _recording() -> Iterator[None]:
    """Autograd's dispatch keys on again for a kernel called from a TorchDispatchMode, which runs below
    them: compiled autograd runs a graph's first call under AOTAutograd's custom-op aliasing check (a
    mode), and a user's mode (FlopCounterMode) may wrap a compiled backward. There the reference's second
    run recorded no graph to differentiate. Nothing changes elsewhere, nor in inference mode."""
    import torch

    key = torch._C.DispatchKey
    autograd = (key.AutogradFunctionality, key.AutogradOther, key.AutogradNestedTensor, key.ADInplaceOrView)
    exclude = torch._C._dispatch_tls_local_exclude_set()
    if torch.is_inference_mode_enabled() or not any(exclude.has(k) for k in autograd):
        yield
        return
    for k in autograd:
        exclude = exclude.remove(k)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude):
        yield


def _traced(tensors: Sequence[Any]) -> bool:
    """Whether a backward is being traced (torch.compile, AOT autograd, make_fx): its tensors are then
    fake or functional ones, where an eager backward (legacy vmap's batched tensors too) has plain ones."""
    import torch

    plain = (torch.Tensor, torch.nn.Parameter)
    return torch.compiler.is_compiling() or any(t is not None and type(t) not in plain for t in tensors)


def shares_memory(a: Any, b: Any) -> bool:
    """Whether tensors ``a`` and ``b`` are one tensor or their storages overlap: views of one storage, or
    storages over one buffer at different offsets (``torch.from_numpy`` of a numpy view), an empty view of
    a storage included. Tensors without storage (fake ones, under tracing) share nothing."""
    if a is b:
        return True
    try:
        sa, sb = a.untyped_storage(), b.untyped_storage()
        start_a, start_b = sa.data_ptr(), sb.data_ptr()
        size_a, size_b = sa.nbytes(), sb.nbytes()
    except (RuntimeError, NotImplementedError):  # no storage to ask (fake tensors, some subclasses)
        return False
    if start_a == start_b and (size_a or size_b):
        return True
    return size_a > 0 and size_b > 0 and start_a < start_b + size_b and start_b < start_a + size_a


def _checked_grads(opdef: Any, result: Any, ctx: BackwardContext) -> list[Any]:
    """A backward formula's result as one gradient (or None) per tensor input, checked."""
    import torch

    spec = opdef.spec
    n = len(spec.inputs)
    grads = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(grads) != n:
        raise OpDefinitionError(
            f"{spec.qualname}: the backward formula returned {len(grads)} value(s) for {n} tensor input(s) "
            f"{[p.name for p in spec.inputs]}; return one gradient (or None) per input."
        )
    for p, x, g in zip(spec.inputs, ctx.inputs, grads):
        if g is None:
            continue
        if not isinstance(g, torch.Tensor) or x is None or g.shape != x.shape:
            got = f"{list(g.shape)}" if isinstance(g, torch.Tensor) else type(g).__name__
            want = "None (the input was omitted)" if x is None else f"a tensor of shape {list(x.shape)}"
            raise OpDefinitionError(
                f"{spec.qualname}: the backward formula's gradient for input {p.name!r} is {got}; it must be {want}."
            )
    return grads


# Tensor methods that hand a tensor's values to numpy, which torch refuses on a tensor that requires grad.
# (.item(), .tolist() and float(x) are allowed: they give what autograd gives the plain function, a
# constant, which is right where the value is a count or an index, as in RoIAlign's sampling grid.)
_LEAVING_AUTOGRAD = ("numpy", "__array__")


@contextmanager
def _values_kept_tracked(spec: Any) -> Iterator[None]:
    """An OpDefinitionError where the reference, run again for its gradient, hands a tensor that autograd
    tracks to numpy: torch's own error names neither the op nor the backward formula it needs."""
    import torch
    from torch.overrides import TorchFunctionMode

    leaving = {getattr(torch.Tensor, name) for name in _LEAVING_AUTOGRAD}

    class _Refusing(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in leaving and args and isinstance(args[0], torch.Tensor) and args[0].requires_grad:
                name = getattr(func, "__name__", str(func))
                raise OpDefinitionError(
                    f"{spec.qualname}: its reference, run again for the gradient, hands a tensor that autograd "
                    f"tracks to numpy ({name}), where the gradient cannot follow; attach a backward formula "
                    f"with @{spec.name}.register_autograd, or, where the value is meant as a constant, read it "
                    "from a detached tensor (x.detach().numpy())."
                )
            return func(*args, **(kwargs or {}))

    with _Refusing():
        yield


def _captured_leaf(outputs: Sequence[Any], args: Sequence[Any]) -> Any | None:
    """A tensor that autograd would accumulate a gradient into, reached from ``outputs`` without passing
    through ``args`` (the reference's inputs for its second run): one the reference read from elsewhere."""
    own = {id(a) for a in args if a is not None}
    stops = {id(a.grad_fn) for a in args if a is not None and a.grad_fn is not None}
    seen: set[int] = set()
    todo = [o.grad_fn for o in outputs]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen or id(node) in stops:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)  # (an AccumulateGrad node: a leaf's)
        if variable is not None and id(variable) not in own:
            return variable
        todo.extend(f for f, _ in node.next_functions)
    return None


def _describe_tensor(t: Any) -> str:
    """``shape [3] float32`` and, for a parameter, ``nn.Parameter, ...``."""
    import torch

    kind = "nn.Parameter, " if isinstance(t, torch.nn.Parameter) else ""
    return f"{kind}shape {list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def _recomputed_grads(
    opdef: Any,
    ctx: BackwardContext,
    grads: tuple[Any, ...],
    rng: Mapping[str, Any],
    inside: Callable[[], Any],
) -> list[Any]:
    """Gradients of the tensor inputs by running the reference again with autograd on."""
    import torch

    spec = opdef.spec
    differentiable = [
        i for i, x in enumerate(ctx.inputs) if x is not None and (x.is_floating_point() or x.is_complex())
    ]
    wanted = [i for i in differentiable if ctx.needs_input_grad[i]]
    result: list[Any] = [None] * len(spec.inputs)
    if not wanted:
        return result
    # Every floating-point input takes part (an output that none of them reaches has left autograd).
    # With create_graph (grad mode on in a backward) the wanted inputs enter as views of themselves:
    # still in the outer graph, so that the gradients can be differentiated again, and apart from any
    # other input they feed (the same tensor given twice, one input computed from another).
    higher = torch.is_grad_enabled()
    args = list(ctx.inputs)
    for i in differentiable:
        x = args[i]
        args[i] = x.view_as(x) if higher and x.requires_grad and i in wanted else x.detach().requires_grad_(True)
    with torch.enable_grad(), _replaying(rng), inside(), watching_draws(not rng) as watch, _values_kept_tracked(spec):
        outputs = opdef.reference(*args, **ctx.attrs)
    if watch.drew:
        raise OpDefinitionError(
            f"{spec.qualname}: its reference draws random numbers, and its gradient by running it again would "
            "use other ones (the forward's random state is kept in eager mode only, not under torch.compile); "
            f"attach a backward formula with @{spec.name}.register_autograd."
        )
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    tracked = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
    if not tracked and any(isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()) for o in outputs):
        raise OpDefinitionError(
            f"{spec.qualname}: its reference gives no output that autograd can differentiate with respect to "
            f"its inputs (it leaves autograd, e.g. through numpy, .item() or .detach()); attach a backward "
            f"formula with @{spec.name}.register_autograd, or call the op under torch.no_grad()."
        )
    captured = _captured_leaf(tracked, args)
    if captured is not None:
        raise OpDefinitionError(
            f"{spec.qualname}: its reference reads a tensor that requires grad and is not one of its inputs "
            f"({_describe_tensor(captured)}): the op's gradient covers its tensor inputs only, so that tensor would "
            "get none. Pass it to the op as a tensor input, or read it detached (w.detach()) where it is meant as "
            "a constant."
        )
    pairs = [
        (o, g) for o, g in zip(outputs, grads) if g is not None and isinstance(o, torch.Tensor) and o.requires_grad
    ]
    found: Sequence[Any] = [None] * len(wanted)
    if pairs:
        found = torch.autograd.grad(
            [o for o, _ in pairs],
            [args[i] for i in wanted],
            [g for _, g in pairs],
            allow_unused=True,
            create_graph=higher,
        )
    # an input the outputs do not depend on gets zeros, eagerly as from the op torch.compile calls
    for i, g in zip(wanted, found):
        x = ctx.inputs[i]
        result[i] = g if g is not None else torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    return result
