"""Python side of the ONNX Runtime kernel bridge: which kernel each custom node runs, and how.

The native half (``_bridge.c``, a CPython extension that is also an ONNX
Runtime custom-op library) calls, for every bridged node, a Python callable
``fn(*arrays) -> array | tuple`` with numpy views of ONNX Runtime's input
buffers. This module decides, per node, where that callable comes from, in
this order:

1. ``function``: the model carries a local function for the op; ONNX Runtime
   runs the body natively and the bridge is not involved.
2. ``kernel``: the op's ``@opbridge.op`` definition has a kernel
   (``opdef.register_kernel``, numpy or torch). Where the op also gives a
   native C kernel (``register_kernel(..., native=factory)``), the bridge runs
   that first, without Python or the GIL, and calls the Python kernel only for
   the runs the C kernel declines (``opbridge/_native_kernel.h``).
3. ``registered``: a kernel registered with ``@opbridge.kernel`` for the
   node's domain and op type (for models exported elsewhere).
4. ``reference``: the op's PyTorch reference, run on CPU tensors that share
   memory with the numpy views (``torch.from_numpy``).

Results are copied once into outputs that ONNX Runtime allocates with the
result's shape (from 1 MiB with the GIL released; see ``_bridge.c`` for how
large copies are done). A numpy kernel of an op with a shape rule may instead take an
``out`` parameter: the outputs are then allocated first (shapes from the rule)
and passed as ``out=`` (one array, or a tuple for several outputs), so a kernel
that writes into them costs no copy at all.

Attributes are read from the node proto once, when ONNX Runtime creates the
kernel, and bound to the callable: exact values and types (FLOAT as the stored
float32, INT, INTS, FLOATS, STRING and STRINGS decoded as UTF-8), defaults
filled in from the op spec. Torch is imported only for torch kernels and
references.

Example:
    >>> import numpy as np, opbridge
    >>> from opbridge.onnxruntime.bridge import kernel_for_node
    >>> from onnx import helper
    >>> @opbridge.kernel("doc.bridge::Twice")
    ... def twice(x):
    ...     return 2 * x
    >>> node = helper.make_node("Twice", ["x"], ["y"], domain="doc.bridge", name="n0")
    >>> bound = kernel_for_node(node, version=1)
    >>> bound.path, bound.fn(np.ones(2, np.float32)).tolist()
    ('registered', [2.0, 2.0])
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opbridge._locks import ForkSafeLock
from opbridge.definition import OpDef, _version, find_op
from opbridge.errors import KernelResultError, NodeMismatchError
from opbridge.kernels import KernelDef, find_kernel
from opbridge.shape import SymDim, result_check, rule_failed, run_rule_on_arrays

if TYPE_CHECKING:
    import onnx

__all__ = [
    "NODE_ATTRIBUTE",
    "BoundKernel",
    "NodeKernel",
    "check_arity",
    "check_attribute_names",
    "check_attribute_values",
    "check_node",
    "kernel_for_node",
    "library_path",
    "node_attributes",
    "register_ops",
    "spec_attributes",
]

logger = logging.getLogger(__name__)

#: Name of the int attribute that tells the native bridge which node a kernel serves.
NODE_ATTRIBUTE = "__opbridge_node"

_REGISTER_LOCK = ForkSafeLock()

KernelFn = Callable[..., Any]


@dataclass(frozen=True)
class NodeKernel:
    """Which path one custom node takes in ONNX Runtime.

    Attributes:
        node: the node's name.
        domain: the node's domain (as the model has it, or opbridge.legacy for a legacy default-domain op).
        op_type: the node's op type.
        version: the domain's opset version in the model.
        path: ``"function"``, ``"kernel"``, ``"registered"`` or ``"reference"``.
        kind: ``"numpy"`` or ``"torch"`` for bridged paths, ``None`` for function bodies.
        writes_outputs: whether the kernel writes ONNX Runtime's preallocated outputs (its ``out``
            parameter) instead of returning results the bridge copies.
        native: whether the node runs the op's native C kernel (no Python) where it takes the
            inputs (``register_kernel(native=...)``).
    """

    node: str
    domain: str
    op_type: str
    version: int
    path: str
    kind: str | None
    writes_outputs: bool = False
    native: bool = False

    @property
    def qualname(self) -> str:
        return f"{self.domain or '<default>'}::{self.op_type}"


@dataclass
class BoundKernel:
    """A node's kernel callable with its attributes bound, ready for the native bridge."""

    path: str
    kind: str
    fn: KernelFn
    label: str
    attributes: dict[str, Any] = field(default_factory=dict)
    #: ``shapes(*arrays) -> [shape, ...] | None``: when set, ONNX Runtime's outputs are
    #: allocated first and passed to ``fn`` as ``out=`` (no copy of the results).
    shapes: Callable[..., Any] | None = None
    #: the node's native C kernel (a capsule, see ``opbridge/_native_kernel.h``), tried before ``fn``.
    native: Any = None

    @property
    def writable_inputs(self) -> bool:
        # torch.from_numpy warns on read-only arrays; torch ignores the flag anyway.
        return self.kind == "torch"


# --------------------------------------------------------------------------- attributes


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """All attributes of ``node`` as Python values (strings decoded, lists as lists).

    FLOAT gives the stored float32 value as a Python float (exact), TENSOR a
    numpy array; the bridge's own node-id attribute is left out.
    """
    import onnx
    from onnx import numpy_helper

    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.name == NODE_ATTRIBUTE:
            continue
        if attr.type == onnx.AttributeProto.TENSOR:
            out[attr.name] = numpy_helper.to_array(attr.t)
            continue
        value = onnx.helper.get_attribute_value(attr)
        if attr.type == onnx.AttributeProto.STRING:
            value = value.decode("utf-8")
        elif attr.type == onnx.AttributeProto.STRINGS:
            value = [v.decode("utf-8") for v in value]
        elif attr.type in (onnx.AttributeProto.FLOATS, onnx.AttributeProto.INTS):
            value = list(value)
        out[attr.name] = value
    return out


def check_attribute_names(opdef: OpDef, node: onnx.NodeProto) -> None:
    """Refuse a node attribute ``opdef`` does not declare: the op would run with its default in its
    place (a misspelt name)."""
    spec = opdef.spec
    known = {a.name for a in spec.attributes}
    unknown = sorted(a.name for a in node.attribute if a.name not in known and a.name != NODE_ATTRIBUTE)
    if unknown:
        raise NodeMismatchError(
            f"{spec.qualname} node {node.name!r} has attribute(s) {unknown} that the op does not declare "
            f"(it takes {sorted(known)}); re-export the model or fix the op definition."
        )


def check_attribute_values(
    opdef: OpDef, node: onnx.NodeProto, label: str, values: Mapping[str, Any] | None = None
) -> None:
    """Refuse a node attribute holding a value outside the choices ``opdef`` declares for it (a ``Literal``
    in its signature), which the op's code would meet only when it runs. ``values``: the node's attribute
    values (:func:`~opbridge.onnx_schema.attribute_values`) where the caller has read them. An attribute a
    function body's node takes from its call is the call's to check; one of another type than declared is
    left to the backend that reads it."""
    from opbridge.onnx_schema import attribute_values

    spec = opdef.spec
    chosen = [a for a in spec.attributes if a.choices is not None]
    if not chosen:
        return
    if values is None:
        try:
            values = attribute_values(spec, node, references=True)
        except ValueError:
            return
    for attr in chosen:
        outside = attr.outside_choices(values[attr.name]) if attr.name in values else []
        if outside:
            value = list(values[attr.name]) if attr.type.is_list else values[attr.name]
            holding = f", holding {outside[0]!r}," if attr.type.is_list else ""
            raise NodeMismatchError(
                f"{label} has attribute {attr.name!r} = {value!r}{holding} where {spec.qualname} takes "
                f"{list(attr.choices or ())}: set it to one of them (re-export the model, or edit the node)."
            )


def check_node(opdef: OpDef, node: onnx.NodeProto, label: str) -> None:
    """What every backend running ``opbridge``'s code for a node checks when it loads the model: the
    node's inputs and outputs (:func:`check_arity`), its attribute names and the values of those with
    choices (:func:`check_attribute_values`)."""
    check_arity(opdef, node, label)
    check_attribute_names(opdef, node)
    check_attribute_values(opdef, node, label)


def spec_attributes(opdef: OpDef, node: onnx.NodeProto) -> dict[str, Any]:
    """``node``'s attribute values as ``opdef`` declares them (defaults filled in, types checked)."""
    from opbridge.onnx_schema import attribute_values

    spec = opdef.spec
    label = f"{spec.qualname} node {node.name!r}"
    check_attribute_names(opdef, node)
    try:
        values = attribute_values(spec, node)
    except ValueError as exc:
        raise NodeMismatchError(f"{label}: {exc}") from None
    check_attribute_values(opdef, node, label, values)
    try:
        return spec.bind_attributes(values)
    except (TypeError, ValueError) as exc:
        raise NodeMismatchError(f"{label}: {exc}") from None


# --------------------------------------------------------------------------- adapters


def _pad(arrays: tuple[Any, ...], n: int) -> tuple[Any, ...]:
    """The op's ``n`` inputs: absent ones None; past ``n`` only empty names can come (the arity check)."""
    if len(arrays) < n:
        return arrays + (None,) * (n - len(arrays))
    return arrays[:n]


def _required_check(opdef: OpDef, label: str) -> Callable[[tuple[Any, ...]], None] | None:
    required = [i for i, p in enumerate(opdef.spec.inputs) if not p.optional]
    if not required:
        return None
    names = [p.name for p in opdef.spec.inputs]

    def check(arrays: tuple[Any, ...]) -> None:
        for i in required:
            if i >= len(arrays) or arrays[i] is None:
                raise TypeError(f"{label}: input {i} ({names[i]!r}) is required but the node gives none")

    return check


def _no_plain_list(result: Any, label: str) -> None:
    """Raise where a numpy kernel returned a list of numbers or lists (``.tolist()``), which would read
    as one output per row."""
    import numpy as np

    if isinstance(result, list) and any(not isinstance(v, (np.ndarray, np.generic)) for v in result):
        kinds = sorted({type(v).__name__ for v in result if not isinstance(v, (np.ndarray, np.generic))})
        raise KernelResultError(
            f"{label}: the kernel returned a list (of {', '.join(kinds)}), not an array; return a numpy array "
            "(e.g. np.asarray(result, dtype=...)), or a tuple of arrays for several outputs"
        )


def _numpy_adapter(fn: KernelFn, attrs: dict[str, Any], n_inputs: int, checks: tuple[Any, Any], label: str) -> KernelFn:
    required, shape = checks
    if required is None and shape is None:

        def call(*arrays: Any) -> Any:
            result = fn(*_pad(arrays, n_inputs), **attrs)
            if isinstance(result, list):
                _no_plain_list(result, label)
            return result

        return call

    def checked(*arrays: Any) -> Any:
        arrays = _pad(arrays, n_inputs)
        if required is not None:
            required(arrays)
        result = fn(*arrays, **attrs)
        if isinstance(result, list):
            _no_plain_list(result, label)
        if shape is not None:
            shape(arrays, result)
        return result

    return checked


def _accepts_out(fn: KernelFn) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "out" in params and params["out"].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def _output_shapes(
    opdef: OpDef, attrs: dict[str, Any], n_inputs: int, required: Any, label: str
) -> Callable[..., list[tuple[int, ...]] | None]:
    """``shapes(*arrays)``: the op's output shapes from its shape rule, which sizes ONNX Runtime's
    outputs before the kernel runs; ``None`` (results copied) where the rule does not run on arrays."""
    rule = opdef.shape_rule
    assert rule is not None
    state = {"usable": True, "ran": False}

    def shapes(*arrays: Any) -> list[tuple[int, ...]] | None:
        if not state["usable"]:
            return None
        arrays = _pad(arrays, n_inputs)
        if required is not None:
            required(arrays)
        try:
            infos = run_rule_on_arrays(rule, arrays, attrs, state)
            items = list(infos) if isinstance(infos, (tuple, list)) else [infos]
            if any(isinstance(d, SymDim) for info in items for d in info.shape):
                return None  # a size that depends on the data: the kernel's result is copied
            found = [tuple(int(d) for d in info.shape) for info in items]
        except Exception as exc:
            rule_failed(state, exc, label, "out= path (results copied)")
            return None
        state["ran"] = True
        return found

    return shapes


def _out_adapter(
    opdef: OpDef, fn: KernelFn, attrs: dict[str, Any], n_inputs: int, required: Any, label: str
) -> tuple[KernelFn, Callable[..., Any]]:
    """A numpy kernel taking ``out=`` plus the shape function that sizes ONNX Runtime's outputs."""

    def call(*arrays: Any, out: Any = None) -> Any:
        arrays = _pad(arrays, n_inputs)
        if required is not None:
            required(arrays)
        return fn(*arrays, out=out, **attrs)

    return call, _output_shapes(opdef, attrs, n_inputs, required, label)


def _torch_out_adapter(
    opdef: OpDef, fn: KernelFn, attrs: dict[str, Any], n_inputs: int, checks: tuple[Any, Any], label: str
) -> tuple[KernelFn, Callable[..., Any]]:
    """A torch kernel taking ``out=``: ONNX Runtime's preallocated outputs go to it as CPU tensors
    over the same memory, and come back as the arrays themselves (no copy) where it wrote them.
    Where the shape rule does not run on arrays (no ``out``), it runs as any torch kernel."""
    import torch

    required = checks[0]
    plain = _torch_adapter(fn, attrs, n_inputs, checks, label)
    from_numpy = torch.from_numpy

    def call(*arrays: Any, out: Any = None) -> Any:
        if out is None:
            return plain(*arrays)
        arrays = _pad(arrays, n_inputs)
        if required is not None:
            required(arrays)
        tensors = [None if a is None else from_numpy(a) for a in arrays]
        outs = out if isinstance(out, tuple) else (out,)
        wrapped = tuple(from_numpy(o) for o in outs)
        storages = _storages(tensors), _storages(wrapped)
        try:
            # (as handed over: the kernel may resize, re-point or re-type the very tensors it got)
            layouts = [(w.data_ptr(), tuple(w.shape), w.stride(), w.dtype) for w in wrapped]
            result = fn(*tensors, out=wrapped if isinstance(out, tuple) else wrapped[0], **attrs)
            _inputs_unchanged(tensors, label)
            results = result if isinstance(result, (tuple, list)) else (result,)
            if len(results) != len(outs):
                return result  # the bridge reports the count mismatch
            # an output written in place (the whole of it) comes back as ONNX Runtime's own array; any
            # other is copied into it
            given = [
                o
                if isinstance(r, torch.Tensor) and (r.data_ptr(), tuple(r.shape), r.stride(), r.dtype) == layout
                else _to_numpy(r, label, i)
                for i, (r, o, layout) in enumerate(zip(results, outs, layouts))
            ]
        except BaseException:
            del tensors, wrapped
            _mend_kept(storages[0])  # (held by the exception's frames until it is handled)
            _mend_kept(storages[1])
            raise
        del tensors, wrapped, result, results
        if _held(storages[0]) or _held(storages[1]):
            given = [g if g is o else _unaliased(g, (*arrays, *outs)) for g, o in zip(given, outs)]
            _raise_kept(label, _mend_kept(storages[0]), _mend_kept(storages[1]))
        return tuple(given) if isinstance(out, tuple) else given[0]

    return call, _output_shapes(opdef, attrs, n_inputs, required, label)


def _inputs_unchanged(tensors: list[Any], label: str) -> None:
    """Raise where a torch kernel wrote one of its inputs in place.

    The inputs are views of ONNX Runtime's buffers: an initializer (the next run would see the
    changed weight) or the caller's own array. torch counts every in-place write to a tensor and
    its views (``_version``), so a write is seen without copying the inputs.
    """
    for i, t in enumerate(tensors):
        if _version(t):  # (None for an inference tensor, which keeps no count)
            raise RuntimeError(
                f"{label}: the kernel wrote input {i} in place; its inputs are ONNX Runtime's buffers (an "
                "initializer or the caller's array) and must stay unchanged: compute into a new tensor "
                "(x + 1, not x.add_(1)) or clone the input first"
            )


def _storages(tensors: Sequence[Any]) -> list[Any]:
    """The storages of a torch kernel's tensors over ONNX Runtime's memory (None for an absent input)."""
    return [None if t is None else t.untyped_storage() for t in tensors]


@functools.cache
def _use_count() -> Any:
    """torch's count of a storage's holders, or None where torch cannot count them or swap a storage's memory."""
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    return count if hasattr(torch.UntypedStorage, "_swap_data_ptr_") else None


def _held(storages: Sequence[Any]) -> bool:
    """Whether something other than ``storages`` holds one of them (after the call dropped its tensors)."""
    count = _use_count()
    return count is not None and any(s is not None and count(s._cdata) > 1 for s in storages)


def _unaliased(array: Any, given: Sequence[Any]) -> Any:
    """``array`` (a kernel's result), or a copy of it where it shares memory with one of the arrays ``given``
    to the kernel: a result that views an input holds the input's storage, which must be let go of before
    the call ends (the bridge copies every result into ONNX Runtime's output anyway)."""
    import numpy as np

    if any(g is not None and np.may_share_memory(array, g) for g in given):
        return array.copy()
    return array


def _mend_kept(storages: Sequence[Any]) -> list[int]:
    """The indices of ``storages`` that something other than this list still holds once the call's own
    tensors are dropped: a tensor the kernel kept, or a view of one. ONNX Runtime reuses or frees that memory
    after the call, so each such storage gets a copy of it in its place (the kept tensors then read the
    values they had, not freed memory) and lets ONNX Runtime's go. The native half judges kept numpy arrays."""
    use_count = _use_count()
    kept = []
    for i, storage in enumerate(storages):
        if storage is None or use_count is None:
            continue
        if use_count(storage._cdata) > 1:
            copy = storage.clone()
            storage._swap_data_ptr_(copy)
            kept.append(i)
    return kept


def _raise_kept(label: str, inputs: Sequence[int], outs: Sequence[int]) -> None:
    """A KernelResultError naming the first input (or out= array) a torch kernel kept, after :func:`_mend_kept`."""
    if inputs or outs:
        what = f"input {inputs[0]}" if inputs else f"out= array {outs[0]}"
        raise KernelResultError(
            f"{label}: the kernel kept its {what} after returning; it views ONNX Runtime's memory, valid during "
            "the call only (reused after it): keep a copy instead (x.clone()). The kept tensor was given a copy "
            "of its values."
        )


def _to_numpy(value: Any, label: str, index: int) -> Any:
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{label}: output {index} is a {type(value).__name__}, expected a torch.Tensor")
    return value.detach().cpu().resolve_conj().resolve_neg().numpy()


def _torch_adapter(fn: KernelFn, attrs: dict[str, Any], n_inputs: int, checks: tuple[Any, Any], label: str) -> KernelFn:
    import torch

    required, shape = checks
    from_numpy = torch.from_numpy

    def call(*arrays: Any) -> Any:
        arrays = _pad(arrays, n_inputs)
        if required is not None:
            required(arrays)
        tensors = [None if a is None else from_numpy(a) for a in arrays]
        storages = _storages(tensors)
        try:
            result = fn(*tensors, **attrs)
            _inputs_unchanged(tensors, label)
            if isinstance(result, (tuple, list)):
                out: Any = tuple(_to_numpy(r, label, i) for i, r in enumerate(result))
            else:
                out = _to_numpy(result, label, 0)
            if shape is not None:
                shape(arrays, out)
        except BaseException:
            del tensors
            _mend_kept(storages)  # (held by the exception's frames until it is handled)
            raise
        del tensors, result
        if _held(storages):  # (rarely: a kept tensor, or a result that views an input)
            if isinstance(out, tuple):
                out = tuple(_unaliased(o, arrays) for o in out)
            else:
                out = _unaliased(out, arrays)
            _raise_kept(label, _mend_kept(storages), [])
        return out

    return call


def _rule_checked(opdef: OpDef) -> KernelFn:
    """The op's reference, its results checked against its shape rule as an eager call checks them: a rule
    that contradicts the reference (a dtype, say) is named as such, not as a kernel returning the wrong
    dtype (the node's output types come from the rule)."""
    reference = opdef.reference
    if opdef.shape_rule is None:
        return reference

    def call(*tensors: Any, **attrs: Any) -> Any:
        result = reference(*tensors, **attrs)
        opdef._check_rule(list(tensors), attrs, tuple(result) if isinstance(result, list) else result)
        return result

    return call


# --------------------------------------------------------------------------- choosing a kernel


def check_arity(opdef: OpDef, node: onnx.NodeProto, label: str) -> None:
    """The node's inputs and outputs against the op's: more inputs than the op takes, a required one
    left out, or an output left out (opbridge's kernels produce every output), are named when the
    session is created."""
    spec = opdef.spec
    named = list(node.input)
    while named and not named[-1]:  # trailing empty names: optional inputs left out
        named.pop()
    if len(named) > len(spec.inputs):
        raise NodeMismatchError(
            f"{label} has {len(named)} inputs; the op takes at most {len(spec.inputs)} "
            f"({', '.join(i.name for i in spec.inputs)}): re-export the model or fix the node."
        )
    given = list(node.input) + [""] * (len(spec.inputs) - len(node.input))
    missing = [i.name for i, name in zip(spec.inputs, given) if not i.optional and not name]
    if missing:
        raise NodeMismatchError(
            f"{label} gives no {', '.join(repr(m) for m in missing)}, which the op requires "
            f"(it takes {', '.join(i.name for i in spec.inputs)}): re-export the model or fix the node."
        )
    outputs = list(node.output)
    if len(outputs) > len(spec.outputs) or "" in outputs or len(outputs) < len(spec.outputs):
        names = ", ".join(o.name for o in spec.outputs)
        raise NodeMismatchError(
            f"{label} lists outputs {outputs}; the op has {len(spec.outputs)} ({names}), each produced by its "
            "kernel: name every one of them in the node (an unused one may go unread)."
        )


def kernel_for_node(
    node: onnx.NodeProto,
    version: int,
    *,
    lookup_domain: str | None = None,
    native: bool = True,
) -> BoundKernel | None:
    """The kernel opbridge would run for ``node`` (``None`` when it knows none).

    ``lookup_domain`` is the domain to look the op up in when it differs from
    the node's (a legacy default-domain op moved to a domain of its own).
    ``native``: attach the op's native C kernel where it has one.
    Function bodies are not considered here (see :class:`NodeKernel`).
    """
    domain = node.domain if lookup_domain is None else lookup_domain
    opdef = find_op(domain, node.op_type, version) if domain else None
    registered: KernelDef | None = find_kernel(domain, node.op_type, version)
    label = f"{domain or '<default>'}::{node.op_type} node {node.name!r}"
    if opdef is not None and (opdef.kernel is not None or registered is None):
        check_arity(opdef, node, label)
        attrs = spec_attributes(opdef, node)
        checks = (_required_check(opdef, label), result_check(opdef, attrs, label))
        n_inputs = len(opdef.spec.inputs)
        if opdef.kernel is not None:
            kind = opdef.kernel_kind or "numpy"
            capsule = opdef.native_kernel(attrs) if native and opdef.native_kernel is not None else None
            if opdef.shape_rule is not None and _accepts_out(opdef.kernel):
                if kind == "numpy":
                    fn, shapes = _out_adapter(opdef, opdef.kernel, attrs, n_inputs, checks[0], label)
                else:
                    fn, shapes = _torch_out_adapter(opdef, opdef.kernel, attrs, n_inputs, checks, label)
                return BoundKernel("kernel", kind, fn, label, attrs, shapes, capsule)
            fn = (
                _numpy_adapter(opdef.kernel, attrs, n_inputs, checks, label)
                if kind == "numpy"
                else _torch_adapter(opdef.kernel, attrs, n_inputs, checks, label)
            )
            return BoundKernel("kernel", kind, fn, label, attrs, native=capsule)
        # (the reference's own results: checked against a declared rule only)
        checks = (checks[0], result_check(opdef, attrs, label, derive=False))
        fn = _torch_adapter(_rule_checked(opdef), attrs, n_inputs, checks, label)
        return BoundKernel("reference", "torch", fn, label, attrs)
    if registered is not None:
        if "" in node.output:
            raise NodeMismatchError(
                f"{label} leaves output(s) {[i for i, o in enumerate(node.output) if not o]} unnamed; the kernel "
                "produces every output of the node: name each of them (an unused one may go unread)."
            )
        attrs = node_attributes(node)
        n_inputs = len(registered.pad_inputs(node.input, attrs))
        no_checks: tuple[Any, Any] = (None, None)
        if registered.kind == "torch":
            fn = _torch_adapter(registered.fn, attrs, n_inputs, no_checks, label)
        else:
            fn = _numpy_adapter(registered.fn, attrs, n_inputs, no_checks, label)
        return BoundKernel("registered", registered.kind, fn, label, attrs)
    return None


# --------------------------------------------------------------------------- registration


def library_path() -> str:
    """Path of the native bridge library (also the CPython extension module)."""
    from opbridge.onnxruntime import _native

    return _native.module().__file__ or ""


def register_ops(
    options: Any,
    ops: Sequence[tuple[str, str, int, Sequence[int]]],
    resolver: Callable[[int], tuple[KernelFn, str, bool, Any, Any, int]],
) -> list[Any]:
    """Register custom ops with an ``onnxruntime.SessionOptions`` through the bridge library.

    Args:
        options: the session options (each may receive the bridge only once).
        ops: ``(domain, op_type, n_inputs, output_element_types)`` per op type;
            an element type of 0 lets ONNX Runtime take the output type from the inputs.
        resolver: ``resolver(node_id) -> (callable, label, writable_inputs, shapes, native, threads)``,
            called when ONNX Runtime creates the kernel of a node (``native``: a native kernel
            capsule or None; ``threads``: the session's intra-op threads, for the native kernel).

    Returns:
        The native op descriptors. Keep them until the session is created, then
        call ``release()`` on each so the resolver can be freed. ``options`` keeps
        them from then on: ONNX Runtime reads their ops through it when it creates a
        session, and they (and their custom op domains) are freed with it.
    """
    import weakref

    from opbridge.onnxruntime import _native

    native = _native.module()
    descriptors = [native.OpDescriptor(d, name, n_in, list(types), resolver) for d, name, n_in, types in ops]
    with _REGISTER_LOCK:
        native.set_pending(descriptors)
        try:
            options.register_custom_ops_library(native.__file__)
        finally:
            native.clear_pending()
        error = native.registration_error()
    # (also after a failure: the domains registered before it are in options)
    kept = weakref.finalize(options, descriptors.clear)
    kept.atexit = False
    if error or not all(d.registered for d in descriptors):
        from opbridge.errors import BackendUnavailableError

        raise BackendUnavailableError(f"opbridge could not register its kernels with ONNX Runtime: {error}")
    return descriptors
