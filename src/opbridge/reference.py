"""Run ONNX models with custom ops on the ONNX reference evaluator (numpy).

:class:`ReferenceSession` wraps ``onnx.reference.ReferenceEvaluator`` behind
ONNX Runtime's session interface (``run``, ``get_inputs``, ``get_outputs``), so
tools that drive ONNX Runtime drive it too. Custom nodes run through, per
``(domain, op_type)``:

1. an op defined with ``@opbridge.op`` (looked up with :func:`opbridge.find_op`
   at the model's opset version of the domain): its numpy kernel when
   ``opdef.kernel_kind == "numpy"``, its torch kernel, else its PyTorch
   reference, fed with ``torch.from_numpy`` views of the inputs (no copy);
2. a kernel registered with ``@opbridge.kernel`` for an op without spec
   (:func:`opbridge.find_kernel`);
3. the model-local function of that name, run by the evaluator's own
   function support (attribute references included).

When a node has both a spec (or kernel) and a function body in the model,
``prefer="spec"`` (the default) runs the op's own implementation: it is the
definition the body decomposes, so comparing this session with ONNX Runtime
(which runs the body) checks the body too. ``prefer="function"`` runs the
body instead, as ONNX Runtime does.

Custom ops written in ONNX's default domain by legacy exports are moved into
``opbridge.legacy`` on a copy of the model first (one warning is logged); the
kernels registered for them under domain ``""`` (or ``opbridge.legacy``) run
them.

Example:
    >>> import numpy as np, torch, opbridge
    >>> from onnx import helper, TensorProto
    >>> @opbridge.op("doc.ref::AddOne")
    ... def add_one(x: torch.Tensor) -> torch.Tensor:
    ...     return x + 1
    >>> g = helper.make_graph(
    ...     [helper.make_node("AddOne", ["x"], ["y"], domain="doc.ref")], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("doc.ref", 1)])
    >>> sess = ReferenceSession(m)
    >>> [(i.name, i.shape, i.type) for i in sess.get_inputs()]
    [('x', [2], 'tensor(float)')]
    >>> sess.run(None, {"x": np.zeros(2, np.float32)})[0].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from opbridge._dtypes import tensor_to_numpy
from opbridge._feeds import FeedCheck
from opbridge.definition import _version
from opbridge.errors import (
    KernelResultError,
    ModelLoadError,
    NodeMismatchError,
    OpbridgeError,
    UnknownOpError,
    unknown_ops_message,
)
from opbridge.model_io import (
    adopt_function_domains,
    check_domain_imports,
    check_graph_order,
    elem_types,
    load_model,
    refuse_unread_external_data,
    walk_nodes,
)
from opbridge.shape import result_check
from opbridge.spec import ONNX_DOMAINS

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from opbridge.definition import OpDef
    from opbridge.kernels import KernelDef

__all__ = ["ReferenceSession", "ValueInfo"]

logger = logging.getLogger(__name__)

_STANDARD_DOMAINS = ONNX_DOMAINS

Prefer = Literal["spec", "function"]

_UNSET = object()


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output as ONNX Runtime describes it.

    ``shape`` holds an int per static dim, the dim's name (str) per named dim
    and None per unknown dim; ``type`` is e.g. ``"tensor(float)"``.
    """

    name: str
    shape: list[int | str | None]
    type: str


def _value_info(value: onnx.ValueInfoProto) -> ValueInfo:
    import onnx

    tensor = value.type.tensor_type
    dims: list[int | str | None] = []
    for d in tensor.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    if value.type.HasField("tensor_type"):
        kind = f"tensor({onnx.TensorProto.DataType.Name(tensor.elem_type).lower()})"
    else:
        kind = value.type.WhichOneof("value") or "unknown"
    return ValueInfo(value.name, dims, kind)


def _onnx_type_name(dtype: Any) -> str | None:
    """``'tensor(float)'`` for float32 and so on; None for dtypes ONNX does not name."""
    import onnx

    if dtype.kind in ("U", "S", "O"):
        return "tensor(string)"
    try:
        code = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    except (KeyError, TypeError, ValueError):
        return None
    return f"tensor({onnx.TensorProto.DataType.Name(code).lower()})"


def _plain(value: Any) -> Any:
    """An attribute value as a Python value (strings decoded, arrays as lists)."""
    import onnx

    if isinstance(value, onnx.AttributeProto):
        value = onnx.helper.get_attribute_value(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return value


def _kernel_attributes(node: onnx.NodeProto, linked: Mapping[str, Any]) -> dict[str, Any]:
    """Every attribute of ``node`` as Python values; references take the calling function's values."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.ref_attr_name:
            if attr.name in linked and linked[attr.name] is not None:
                out[attr.name] = _plain(linked[attr.name])
        else:
            out[attr.name] = _plain(attr)
    return out


def _spec_attributes(opdef: OpDef, node: onnx.NodeProto, linked: Mapping[str, Any]) -> dict[str, Any]:
    from opbridge.onnx_schema import attribute_values

    spec = opdef.spec
    direct = {a.name: a for a in node.attribute if not a.ref_attr_name}
    try:
        values = attribute_values(spec, getter=direct.get)
    except ValueError as exc:  # (onnx.reference wraps it in a TypeError of its own: unwrapped at load)
        raise NodeMismatchError(f"{spec.qualname} node {node.name!r}: {exc}") from None
    for attr in node.attribute:
        if attr.ref_attr_name and linked.get(attr.name) is not None:
            values[attr.name] = spec.attribute(attr.name).from_onnx_value(_plain(linked[attr.name]))
    return values


def _to_torch(arrays: Sequence[Any]) -> list[Any]:
    import numpy as np
    import torch

    out: list[Any] = []
    with warnings.catch_warnings():
        # Read-only arrays (initializers) are only read by the kernel.
        warnings.filterwarnings("ignore", message=".*non-writable.*", category=UserWarning)
        for a in arrays:
            if a is None:
                out.append(None)
                continue
            # (np.ascontiguousarray would make a 0-d array 1-d)
            a = np.asarray(a, order="C")
            if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16, which torch.from_numpy does not take: its bits
                out.append(torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16))
            else:
                out.append(torch.from_numpy(a))
    return out


def _to_numpy(values: Any) -> tuple[Any, ...]:
    import numpy as np

    items = values if isinstance(values, (tuple, list)) else (values,)
    out = []
    for i, v in enumerate(items):
        if hasattr(v, "detach"):
            v = tensor_to_numpy(v)
        if not isinstance(v, (np.ndarray, np.generic)):
            # (ONNX Runtime's bridge refuses these too; numpy would make an object array of None)
            raise TypeError(f"output {i} is a {type(v).__name__}, not an array; return numpy arrays")
        v = np.asarray(v)
        if not v.dtype.isnative:  # (a byte-swapped array, >f4: native order, as ONNX Runtime's bridge gives it)
            v = v.astype(v.dtype.newbyteorder("="))
        if v.dtype == object and not all(isinstance(e, (str, bytes)) for e in v.flat):
            # an object array holds strings (ONNX's string tensors) or nothing opbridge can pass on
            kinds = sorted({type(e).__name__ for e in v.flat if not isinstance(e, (str, bytes))})
            raise TypeError(
                f"output {i} is an object array holding {', '.join(kinds)}; return an array of numbers, or of "
                "str for a string output"
            )
        out.append(v)
    return tuple(out)


def _own(results: tuple[Any, ...], inputs: Sequence[Any]) -> tuple[Any, ...]:
    """``results`` with a copy of each one that shares memory with an input (the caller's array or a weight
    of the model, which the caller could then change through the output)."""
    import numpy as np

    arrays = [a for a in inputs if isinstance(a, np.ndarray)]
    return tuple(
        r.copy() if isinstance(r, np.ndarray) and any(np.may_share_memory(r, a) for a in arrays) else r for r in results
    )


def _unchanged(label: str, tensors: Sequence[Any], versions: Sequence[int | None]) -> None:
    """Raise where a torch kernel or reference wrote an input in place (torch counts such writes, see
    :func:`~opbridge.definition._version`): the input is the caller's array or a weight of the model,
    which every later run would see changed."""
    for i, (t, v) in enumerate(zip(tensors, versions)):
        if v is not None and _version(t) != v:
            raise OpbridgeError(
                f"{label} wrote input {i} in place; its inputs are the caller's arrays and the model's weights, "
                "which must stay unchanged: compute into a new tensor (x + 1, not x.add_(1)) or clone the input "
                "first."
            )


def _spec_runner(opdef: OpDef) -> Callable[..., tuple[Any, ...]]:
    """Run a node with the op's numpy kernel, torch kernel or PyTorch reference, as the op has them when
    the session is made (a kernel registered later runs in later sessions, as in ONNX Runtime's)."""

    checks: dict[tuple[str, str], Any] = {}  # result checks per node and attribute values
    kernel, kind = opdef.kernel, opdef.kernel_kind

    def run(node: onnx.NodeProto, inputs: Sequence[Any], linked: Mapping[str, Any]) -> tuple[Any, ...]:
        attrs = _spec_attributes(opdef, node, linked)
        args = list(inputs) + [None] * (len(opdef.spec.inputs) - len(inputs))
        if kernel is not None and kind == "numpy":
            results = _to_numpy(kernel(*args, **attrs))
        else:
            import torch

            tensors = _to_torch(args)
            versions = [_version(t) for t in tensors]
            with torch.no_grad():
                found = kernel(*tensors, **attrs) if kernel is not None else opdef.run_reference(*tensors, **attrs)
            _unchanged(f"{opdef.spec.qualname} node {node.name!r}", tensors, versions)
            results = _to_numpy(found)
        results = _own(results, args)
        key = (node.name, repr(sorted(attrs.items())))
        check = checks.get(key, _UNSET)
        if check is _UNSET:
            if len(checks) >= 256:
                checks.clear()
            label = f"{opdef.spec.qualname} node {node.name!r}"
            check = checks[key] = result_check(opdef, attrs, label, derive=kernel is not None)
        if check is not None:
            check(tuple(args), results)
        return results

    return run


def _kernel_runner(kernel: KernelDef) -> Callable[..., tuple[Any, ...]]:
    """Run a node with a kernel registered by ``@opbridge.kernel``."""

    def run(node: onnx.NodeProto, inputs: Sequence[Any], linked: Mapping[str, Any]) -> tuple[Any, ...]:
        attrs = _kernel_attributes(node, linked)
        inputs = kernel.pad_inputs(inputs, attrs)
        if kernel.kind == "numpy":
            return _own(_to_numpy(kernel.fn(*inputs, **attrs)), inputs)
        import torch

        tensors = _to_torch(inputs)
        versions = [_version(t) for t in tensors]
        with torch.no_grad():
            found = kernel.fn(*tensors, **attrs)
        _unchanged(f"{kernel.qualname} node {node.name!r}", tensors, versions)
        return _own(_to_numpy(found), inputs)

    return run


def _check_dtypes(results: Sequence[Any], node: onnx.NodeProto, types: Mapping[str, int], label: str) -> None:
    """Raise where a result's dtype is not the element type the model gives the node's output."""
    import onnx

    for i, (name, result) in enumerate(zip(node.output, results)):
        want = types.get(name) if name else None
        if not want:
            continue
        got = _onnx_type_name(result.dtype)
        want_name = f"tensor({onnx.TensorProto.DataType.Name(want).lower()})"
        if got is None or got == want_name:
            continue
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(want)
            np_name = dtype.name
        except (KeyError, TypeError, ValueError):
            dtype, np_name = None, want_name
        # numpy's own dtypes by numpy's name; bfloat16 and the float8 types are ml_dtypes'
        module = "np" if dtype is not None and dtype.type.__module__.startswith("numpy") else "ml_dtypes"
        raise OpbridgeError(
            f"{label}: output {i} ({name!r}) has dtype {result.dtype}, but the node's output type is {want_name}; "
            f"return an array of dtype {np_name} (e.g. result.astype({module}.{np_name}))."
        )


class _NodeValueError(OpbridgeError, ValueError):
    """A kernel's ValueError, named by op and node."""


class _NodeRuntimeError(OpbridgeError, RuntimeError):
    """A kernel's RuntimeError, named by op and node."""


class _NodeArithmeticError(OpbridgeError, ArithmeticError):
    """A kernel's ArithmeticError, named by op and node."""


class _NodeLookupError(OpbridgeError, LookupError):
    """A kernel's LookupError, named by op and node."""


def _node_error(exc: Exception) -> type[OpbridgeError]:
    """The OpbridgeError to raise for a kernel's ``exc``, of its kind where that is a common one, so that
    an ``except ValueError`` around ``run`` still catches a kernel's ValueError (a TypeError stays an
    OpbridgeError only: onnx.reference would report that as "Issues with types")."""
    kinds: tuple[tuple[type[Exception], type[OpbridgeError]], ...] = (
        (ValueError, _NodeValueError),
        (RuntimeError, _NodeRuntimeError),
        (ArithmeticError, _NodeArithmeticError),
        (LookupError, _NodeLookupError),
    )
    return next((ours for base, ours in kinds if isinstance(exc, base)), OpbridgeError)


def _load_node_only(self: Any) -> None:
    """``OpRun._load_attributes`` for opbridge's op classes: onnx.reference sets each attribute of the node on
    the op object, where one named like its members (``run``, ``output``, ``domain``, ``onnx_node``)
    replaced them; these classes read the node's attributes themselves."""
    self.has_linked_attribute = any(a.ref_attr_name for a in self.onnx_node.attribute)
    self.attributes_names_ = set()


def _linked(node: onnx.NodeProto, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The values of ``node``'s attributes that reference the calling function's, by the node's names;
    one the call leaves out is None (absent, as ONNX defines it)."""
    return {a.name: (given or {}).get(a.ref_attr_name) for a in node.attribute if a.ref_attr_name}


def _refers(nodes: Iterable[onnx.NodeProto]) -> bool:
    """Whether a node of ``nodes`` (or of their subgraphs) takes an attribute by reference."""
    return any(a.ref_attr_name for node in walk_nodes(nodes) for a in node.attribute)


def _substituted(function: onnx.FunctionProto, values: Mapping[str, onnx.AttributeProto]) -> onnx.FunctionProto:
    """A copy of ``function`` whose attribute references (in its subgraphs too) hold the call's ``values``;
    one the call leaves out is dropped (absent, as ONNX defines it)."""
    import onnx

    copy = onnx.FunctionProto()
    copy.CopyFrom(function)
    for node in walk_nodes(copy.node):
        kept = []
        for a in node.attribute:
            if not a.ref_attr_name:
                kept.append(a)
            elif a.ref_attr_name in values:
                value = onnx.AttributeProto()
                value.CopyFrom(values[a.ref_attr_name])
                value.name = a.name
                kept.append(value)
        del node.attribute[:]
        node.attribute.extend(kept)
    return copy


def _call_class(function: onnx.FunctionProto, body: Any, build: Callable[[onnx.FunctionProto], Any]) -> type:
    """An ``OpFunction`` subclass that runs calls of the model-local ``function`` on ``body``, its
    evaluator: onnx.reference's own sets the call's attributes on the op object, which failed for one
    named like its members (``output``, ``domain``). A body that takes attributes by reference runs on an
    evaluator of a copy holding the call's values (``build`` makes one per set of values): onnx.reference
    hands the references' values to its nodes as ``linked_attributes``, which its unary and binary ops
    (``LeakyRelu``, ``Elu``, ``Mod``) do not take."""
    import onnx
    from onnx.reference.op_run import OpFunction, OpRun

    refers = _refers(function.node)
    defaults = {a.name: a for a in function.attribute_proto}
    evaluators: dict[tuple[tuple[str, bytes], ...], Any] = {}

    def init(self: Any, onnx_node: onnx.NodeProto, run_params: dict[str, Any]) -> None:
        OpRun.__init__(self, onnx_node, run_params)
        self.impl_ = body
        self.attributes_ = {
            a.name: self._extract_attribute_value(a) for a in onnx_node.attribute if not a.ref_attr_name
        }

    def evaluator(self: Any, linked: Mapping[str, Any]) -> Any:
        """The evaluator of this call's values (the function's defaults, the node's own, and the values of
        the references it takes from a caller that still holds them)."""
        values = {**defaults, **{a.name: a for a in self.onnx_node.attribute if not a.ref_attr_name}}
        values.update({name: onnx.helper.make_attribute(name, value) for name, value in linked.items()})
        key = tuple(sorted((name, a.SerializeToString()) for name, a in values.items()))
        if key not in evaluators:
            evaluators[key] = build(_substituted(function, values))
        return evaluators[key]

    def run(self: Any, *inputs: Any, linked_attributes: Mapping[str, Any] | None = None, **_: Any) -> tuple[Any, ...]:
        if len(inputs) != len(body.input_names):
            raise RuntimeError(
                f"{function.domain}::{function.name} takes {len(body.input_names)} input(s), the node gives "
                f"{len(inputs)}."
            )
        linked = {k: v for k, v in _linked(self.onnx_node, linked_attributes).items() if v is not None}
        feeds = dict(zip(body.input_names, inputs))
        if refers:
            results = evaluator(self, linked).run(None, feeds, attributes={})  # (the values are in the copy)
        else:
            results = body.run(None, feeds, attributes={**self.attributes_, **linked})
        return self._check_and_fix_outputs(tuple(results))

    members = {"__init__": init, "_load_attributes": _load_node_only, "run": run}
    return type(function.name, (OpFunction,), {"op_domain": function.domain, "op_schema": None, **members})


def _op_class(
    domain: str,
    op_type: str,
    runner: Callable[..., tuple[Any, ...]],
    source: str,
    types: Mapping[str, int],
) -> type:
    """An ``OpRun`` subclass for ``domain::op_type`` that calls ``runner``; ``types`` are the element
    types the model gives the outputs of its nodes (where known), which the results must have."""
    from onnx.reference.op_run import OpRun

    def run(self: Any, *inputs: Any, linked_attributes: Mapping[str, Any] | None = None, **_: Any) -> tuple[Any, ...]:
        return self._check_and_fix_outputs(_run(self, inputs, _linked(self.onnx_node, linked_attributes)))

    def _run(self: Any, inputs: Sequence[Any], linked: Mapping[str, Any]) -> tuple[Any, ...]:
        node = self.onnx_node
        try:
            results = runner(node, inputs, linked)
        except OpbridgeError:
            raise
        except ValueError as exc:
            if "read-only" not in str(exc):
                raise _node_error(exc)(
                    f"{domain}::{op_type} ({source}) node {node.name!r} raised ValueError: {exc}"
                ) from exc
            raise OpbridgeError(
                f"{domain}::{op_type} ({source}) node {node.name!r} wrote into one of its inputs ({exc}), which "
                "other nodes and the caller may still read; write the result into a new array (e.g. x = x.copy())."
            ) from None
        except Exception as exc:
            # named by op and node, as ONNX Runtime's bridge and OpenVINO name them (onnx.reference reports a
            # TypeError as "Issues with types ...", without the kernel's message)
            raise _node_error(exc)(
                f"{domain}::{op_type} ({source}) node {node.name!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        if len(results) != len(node.output):
            raise OpbridgeError(
                f"{domain}::{op_type} ({source}) returned {len(results)} output(s) for a node with "
                f"{len(node.output)}; return one array per output."
            )
        _check_dtypes(results, node, types, f"{domain}::{op_type} ({source}) node {node.name!r}")
        return results

    # op_schema = None: attribute defaults come from the op spec, not from onnx.defs.
    members = {"_load_attributes": _load_node_only, "run": run, "_run": _run}
    return type(op_type, (OpRun,), {"op_domain": domain, "op_schema": None, **members, "__doc__": source})


def _callees_first(functions: Sequence[onnx.FunctionProto]) -> list[onnx.FunctionProto]:
    """``functions`` ordered so that every function comes after the local functions it calls.

    Raises:
        ValueError: the functions call each other in a cycle (ONNX functions cannot recurse).
    """
    by_key = {(f.domain, f.name): f for f in functions}
    order: list[onnx.FunctionProto] = []
    done: set[tuple[str, str]] = set()

    def visit(key: tuple[str, str], path: list[tuple[str, str]]) -> None:
        if key in done:
            return
        if key in path:
            cycle = " -> ".join(f"{d}::{n}" for d, n in [*path[path.index(key) :], key])
            raise ValueError(
                f"the model's local functions call each other in a cycle ({cycle}); ONNX functions cannot "
                "recurse: remove the call that closes the cycle."
            )
        fn = by_key[key]
        for node in walk_nodes(fn.node):
            callee = (node.domain, node.op_type)
            if callee in by_key:
                visit(callee, [*path, key])
        done.add(key)
        order.append(fn)

    for fn in functions:
        visit((fn.domain, fn.name), [])
    return order


def _default_domain_spelt_empty(proto: onnx.ModelProto) -> None:
    """Spell ONNX's default domain ``""`` where the model (its imports, nodes and functions) spells it
    ``"ai.onnx"``, in place: the reference evaluator tells the two apart ("Domain '' ... is not specified.
    Known opsets: {'ai.onnx': 13}"), where ONNX, its checker and ONNX Runtime take them as one."""
    holders = [proto, *proto.functions]
    for holder in holders:
        for o in holder.opset_import:
            if o.domain == "ai.onnx":
                o.domain = ""
    for nodes in [proto.graph.node, *(f.node for f in proto.functions)]:
        for node in walk_nodes(nodes):
            if node.domain == "ai.onnx":
                node.domain = ""


def _fill_function_defaults(proto: onnx.ModelProto, skip: set[tuple[str, str]]) -> None:
    """Write each local function's attribute defaults into the nodes calling it that omit them (in place).

    The reference evaluator ignores ``FunctionProto.attribute_proto``; ONNX Runtime
    applies these defaults. Nodes of ops in ``skip`` (run by a spec or kernel,
    which apply their own defaults) are left as they are.
    """
    defaults = {
        (f.domain, f.name): list(f.attribute_proto)
        for f in proto.functions
        if f.attribute_proto and (f.domain, f.name) not in skip
    }
    if not defaults:
        return
    bodies = [fn.node for fn in proto.functions]
    for nodes in [proto.graph.node, *bodies]:
        for node in walk_nodes(nodes):
            wanted = defaults.get((node.domain, node.op_type))
            if not wanted:
                continue
            given = {a.name for a in node.attribute}
            node.attribute.extend(a for a in wanted if a.name not in given)


def _fill_loop_conditions(proto: onnx.ModelProto) -> int:
    """Give each Loop with a trip count but no condition (``Loop(M, "", ...)``, valid ONNX: run M times)
    a constant true condition, in place: onnx.reference runs such a loop zero times (onnx 1.23). Returns
    how many it filled."""
    import onnx

    names = {v for n in walk_nodes(proto.graph.node) for v in (*n.input, *n.output)}
    names |= {v for f in proto.functions for n in walk_nodes(f.node) for v in (*n.input, *n.output)}
    names |= {i.name for i in proto.graph.initializer} | {i.name for i in proto.graph.input}
    filled = 0

    def fill(nodes: Any) -> None:
        nonlocal filled
        for position in range(len(nodes) - 1, -1, -1):  # (inserting before a node leaves earlier ones in place)
            node = nodes[position]
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    fill(sub.node)
            if node.op_type == "Loop" and node.domain in ("", "ai.onnx") and len(node.input) > 1:
                if node.input[0] and not node.input[1]:
                    name = f"opbridge_loop_condition_{filled}"
                    while name in names:
                        name += "_"
                    names.add(name)
                    true = onnx.helper.make_tensor(name, onnx.TensorProto.BOOL, [], [True])
                    nodes.insert(position, onnx.helper.make_node("Constant", [], [name], value=true))
                    node.input[1] = name
                    filled += 1

    fill(proto.graph.node)
    for function in proto.functions:
        fill(function.node)
    return filled


def _resize_asymmetric(x: np.ndarray, scales: Any, mode: str, label: str, upsample: bool) -> np.ndarray:
    """``x`` resized by ``scales`` as Upsample (opsets 7-9) and Resize-10 define it, as ONNX Runtime computes
    it: each output dim is ``floor(dim * scale)`` and output index ``i`` reads input coordinate ``i / scale``
    (float32), ``"nearest"`` taking its floor (its ceiling where the axis shrinks), ``"linear"`` weighting
    the two inputs around it, the last input repeating past the edge, ``"cubic"`` (which ONNX Runtime runs
    too) as Resize-11 does with those coordinates; an output of the input's shape is the input."""
    import numpy as np

    scales = np.asarray(scales, dtype=np.float32).reshape(-1)
    if scales.size != x.ndim or not np.all(scales > 0) or (upsample and not np.all(scales >= 1)):
        least = "at least 1" if upsample else "positive"
        raise OpbridgeError(
            f"{label}: scales {scales.tolist()} must hold one value per dim of the input (rank {x.ndim}), each "
            f"{least}; give the node such scales."
        )
    sizes = (scales * np.asarray(x.shape, dtype=np.float32)).astype(np.int64)
    if tuple(sizes) == x.shape:  # (ONNX Runtime then returns the input as it is, whatever the scales)
        return x.copy()
    out: np.ndarray = x
    for axis, (scale, size) in enumerate(zip(scales, sizes)):
        n = x.shape[axis]
        if scale == 1:
            continue
        coords = np.arange(size, dtype=np.float32) / scale
        if mode == "nearest":
            index = np.ceil(coords) if scale < 1 else np.floor(coords)
            out = np.take(out, np.clip(index.astype(np.int64), 0, n - 1), axis=axis)
            continue
        shape = [1] * out.ndim
        shape[axis] = -1
        if mode == "cubic":  # (ONNX Runtime runs it too, as Resize-11's cubic: a = -0.75, edge taps repeated)
            base = np.floor(coords)
            t = (coords - base).astype(np.float64)
            a = -0.75
            weights = [
                ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                ((a + 2) * t - (a + 3)) * t * t + 1,
                ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
                ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
            ]
            taps = [np.clip(base.astype(np.int64) + k, 0, n - 1) for k in (-1, 0, 1, 2)]
            out = sum(np.take(out, i, axis=axis) * w.reshape(shape) for i, w in zip(taps, weights))
            continue
        coords = np.minimum(coords, np.float32(n - 1))
        low = np.floor(coords).astype(np.int64)
        high = np.minimum(low + 1, n - 1)
        weight = (coords - low.astype(np.float32)).astype(np.float64).reshape(shape)
        out = np.take(out, low, axis=axis) * (1 - weight) + np.take(out, high, axis=axis) * weight
    return out.astype(x.dtype, copy=False)


#: The opsets at which the session runs these resize ops itself (onnx.reference's fail or differ, onnx 1.23).
_OLD_RESIZE_OPS = {"Upsample": range(7, 10), "Resize": range(10, 11)}


def _resize_runner(op_type: str, version: int) -> Callable[..., tuple[Any, ...]]:
    """Run an Upsample (opsets 7-9) or Resize-10 node with :func:`_resize_asymmetric`."""

    scales_input = op_type == "Resize" or version >= 9  # (Upsample-7 has a scales attribute)

    def run(node: onnx.NodeProto, inputs: Sequence[Any], linked: Mapping[str, Any]) -> tuple[Any, ...]:
        attrs = {a.name: _plain(a) for a in node.attribute}
        scales = inputs[1] if scales_input else attrs.get("scales")
        label = f"{op_type}-{version} node {node.name!r}"
        return (_resize_asymmetric(inputs[0], scales, attrs.get("mode", "nearest"), label, op_type == "Upsample"),)

    return run


def _old_resize_ops(proto: onnx.ModelProto) -> list[type]:
    """``OpRun`` classes for the model's Upsample and Resize-10 nodes, whose onnx.reference implementations
    fail (Upsample-7's scales attribute, Resize-10's scales input) or take only whole nearest scales.

    Raises:
        ModelLoadError: an Upsample at an opset where ONNX Runtime has none (10 and later: deprecated),
            a mode other than nearest, linear or cubic, or an Upsample before opset 9 without scales.
    """
    opsets = {o.domain: o.version for o in proto.opset_import}
    bodies = [n for f in proto.functions for n in walk_nodes(f.node)]
    classes: list[type] = []
    for domain in ("", "ai.onnx"):
        version = opsets.get(domain)
        if version is None:
            continue
        nodes = [n for n in [*walk_nodes(proto.graph.node), *bodies] if n.domain == domain]
        for op_type, versions in _OLD_RESIZE_OPS.items():
            found = [n for n in nodes if n.op_type == op_type]
            if not found or (op_type == "Resize" and version not in versions):
                continue
            if version not in versions:
                raise ModelLoadError(
                    f"Upsample node {found[0].name!r} (opset {version}): ONNX Runtime runs Upsample at opsets 7-9 "
                    "only (it is deprecated from opset 10); use Resize (opset 10 and later), or export at opset 9."
                )
            for node in found:
                attrs = {a.name: _plain(a) for a in node.attribute}
                label = f"{op_type} node {node.name!r} (opset {version})"
                if attrs.get("mode", "nearest") not in ("nearest", "linear", "cubic"):
                    raise ModelLoadError(
                        f"{label}: mode {attrs['mode']!r} is not one this opset defines; use 'nearest' or "
                        "'linear' (or 'cubic', which ONNX Runtime also runs)."
                    )
                if op_type == "Upsample" and version < 9 and "scales" not in attrs:
                    raise ModelLoadError(f"{label}: Upsample before opset 9 needs a scales attribute; give it one.")
            classes.append(_op_class(domain, op_type, _resize_runner(op_type, version), f"opset {version}", {}))
    return classes


def _flatten_runner(version: int) -> Callable[..., tuple[Any, ...]]:
    """Run a Flatten node as ONNX defines it: onnx.reference's (onnx 1.23) reshapes to ``(n, -1)``, which
    numpy cannot resolve where ``n`` is 0 (an input of size 0, e.g. no boxes), while ONNX Runtime flattens
    ``(0, 16, 7, 7)`` to ``(0, 784)``."""

    def run(node: onnx.NodeProto, inputs: Sequence[Any], linked: Mapping[str, Any]) -> tuple[Any, ...]:
        x = inputs[0]
        axis = int(_kernel_attributes(node, linked).get("axis", 1))
        if not -x.ndim <= axis <= x.ndim:
            raise OpbridgeError(
                f"Flatten node {node.name!r} (opset {version}): axis {axis} is outside [-{x.ndim}, {x.ndim}] for an "
                f"input of rank {x.ndim}; give an axis within that range."
            )
        axis += x.ndim if axis < 0 else 0
        return (x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])),)

    return run


def _own_standard_ops(proto: onnx.ModelProto) -> list[type]:
    """``OpRun`` classes for the standard ops the session runs itself: the old resize ops
    (:func:`_old_resize_ops`) and Flatten (:func:`_flatten_runner`)."""
    classes = _old_resize_ops(proto)
    opsets = {o.domain: o.version for o in proto.opset_import}
    nodes = [*walk_nodes(proto.graph.node), *(n for f in proto.functions for n in walk_nodes(f.node))]
    for domain in ("", "ai.onnx"):
        version = opsets.get(domain)
        if version is not None and any(n.domain == domain and n.op_type == "Flatten" for n in nodes):
            classes.append(_op_class(domain, "Flatten", _flatten_runner(version), f"opset {version}", {}))
    return classes


def _failed_node(exc: BaseException) -> Any:
    """The innermost node (an ``OpRun``) whose run raised ``exc`` in the evaluator, or None."""
    from onnx.reference.op_run import OpRun

    found = None
    tb = exc.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, OpRun) and getattr(candidate, "onnx_node", None) is not None:
            found = candidate
        tb = tb.tb_next
    return found


def _evaluator(proto: onnx.ModelProto, new_ops: list[type], verbose: int) -> Any:
    """A ReferenceEvaluator whose model-local functions also see ``new_ops``.

    ``ReferenceEvaluator(model, new_ops=...)`` gives the custom ops to the main
    graph only; a function body calling a custom op would not find it. The
    functions are built here, callees first, each with the ops and the calls of
    the functions built before it (:func:`_call_class`), and the main graph is
    evaluated with them. The functions'
    attribute defaults are first written into the nodes that call them (in
    place: ``proto`` is the session's own copy).
    """
    from onnx.reference import ReferenceEvaluator

    _fill_function_defaults(proto, {(getattr(cls, "op_domain", ""), cls.__name__) for cls in new_ops})
    calls: list[type] = []  # (after new_ops: where both cover a node, the evaluator takes the first)
    for fn in _callees_first(proto.functions):
        ops = [*new_ops, *calls]

        def build(function: onnx.FunctionProto, ops: list[type] = ops) -> Any:
            return ReferenceEvaluator(function, new_ops=ops, verbose=verbose)

        calls.append(_call_class(fn, build(fn), build))
    opsets = {o.domain: o.version for o in proto.opset_import}
    return ReferenceEvaluator(proto.graph, opsets=opsets, new_ops=[*new_ops, *calls], verbose=verbose)


class ReferenceSession:
    """ONNX Runtime-like session on the ONNX reference evaluator, with opbridge's custom ops.

    Args:
        model: a path, serialized bytes or an ``onnx.ModelProto`` (copied; never modified).
        prefer: for nodes that both a spec/kernel and a model-local function cover,
            ``"spec"`` runs the op's own kernel or reference, ``"function"`` its body.
        verbose: the evaluator's verbosity (0 = silent).

    Attributes:
        implementations: ``{(domain, op_type): how}`` for every custom op in the model,
            ``how`` being ``"numpy kernel"``, ``"torch kernel"``, ``"PyTorch reference"``,
            ``"kernel"`` (``@opbridge.kernel``) or ``"function"`` (the model-local body).

    Raises:
        ModelLoadError: the model cannot be read or parsed, or the evaluator rejects it.
        UnknownOpError: custom nodes that no spec, kernel or function covers.

    Example:
        >>> sess = ReferenceSession("model.onnx")  # doctest: +SKIP
        >>> outputs = sess.run(None, {"image": image})  # doctest: +SKIP
    """

    def __init__(self, model: Any, *, prefer: Prefer = "spec", verbose: int = 0) -> None:
        from opbridge.legacy_domain import (
            DEFAULT_LEGACY_DOMAIN,
            move_default_domain_ops,
        )
        from opbridge.onnx_schema import import_onnx_reference

        import_onnx_reference()
        if prefer not in ("spec", "function"):
            raise ValueError(f"prefer must be 'spec' or 'function', got {prefer!r}")
        proto = load_model(model, copy=True, caller="ReferenceSession")
        refuse_unread_external_data(proto, "ReferenceSession")
        check_graph_order(proto, "ReferenceSession")
        _default_domain_spelt_empty(proto)
        proto, moved = move_default_domain_ops(proto, DEFAULT_LEGACY_DOMAIN, copy=False)
        if moved:
            logger.warning(
                "model has custom op(s) %s in ONNX's default domain (a legacy export); running a copy with them "
                "moved to domain %r",
                moved,
                DEFAULT_LEGACY_DOMAIN,
            )
        self._legacy = {(DEFAULT_LEGACY_DOMAIN, name) for name in moved}
        check_domain_imports(proto, "ReferenceSession")
        adopt_function_domains(proto, "ReferenceSession")
        _fill_loop_conditions(proto)
        self.prefer: Prefer = prefer
        self.implementations: dict[tuple[str, str], str] = {}
        new_ops = self._custom_ops(proto) + _own_standard_ops(proto)
        try:
            self._evaluator = _evaluator(proto, new_ops, verbose)
        except Exception as exc:  # the evaluator raises many kinds
            if isinstance(exc.__cause__, OpbridgeError):  # (ours, wrapped by the evaluator's op loading)
                raise exc.__cause__ from None
            raise ModelLoadError(f"the ONNX reference evaluator cannot load the model: {exc}") from exc
        self._model = proto
        init_names = {i.name for i in proto.graph.initializer}
        self._inputs = [_value_info(v) for v in proto.graph.input if v.name not in init_names]
        self._check_feed = FeedCheck(
            "ReferenceSession.run",
            proto.graph,
            [v.name for v in proto.graph.input if v.name not in init_names],
            [v.name for v in proto.graph.input if v.name in init_names],
        )
        self._outputs = [_value_info(v) for v in proto.graph.output]
        # the numeric dtypes the model declares for its outputs, which the results must have (a node inside a
        # function body, whose output types the model does not give, is checked there)
        from opbridge._dtypes import onnx_to_numpy
        from opbridge.compare import ml_float

        self._output_dtypes: dict[str, Any] = {}
        for v in proto.graph.output:
            try:
                dtype = onnx_to_numpy(v.type.tensor_type.elem_type) if v.type.tensor_type.elem_type else None
            except TypeError:
                dtype = None
            if dtype is not None and (dtype.kind in "biufc" or ml_float(dtype)):
                self._output_dtypes[v.name] = dtype

    # ------------------------------------------------------------------ resolution

    def _custom_ops(self, proto: onnx.ModelProto) -> list[type]:
        from opbridge.definition import find_op
        from opbridge.kernels import find_kernel, later_kernel_note
        from opbridge.legacy_domain import DEFAULT_LEGACY_DOMAIN, default_domain_opset, runs_default_domain_kernel
        from opbridge.onnxruntime.bridge import check_node

        opsets = {o.domain: o.version for o in proto.opset_import}
        default_opset = default_domain_opset(proto) or 1
        functions = {(f.domain, f.name) for f in proto.functions}
        nodes = list(walk_nodes(proto.graph.node))
        for fn in proto.functions:
            nodes.extend(walk_nodes(fn.node))
        seen: dict[tuple[str, str], int] = {}
        by_op: dict[tuple[str, str], list[onnx.NodeProto]] = {}
        for node in nodes:
            if node.domain not in _STANDARD_DOMAINS:
                seen.setdefault((node.domain, node.op_type), opsets.get(node.domain, 1))
                by_op.setdefault((node.domain, node.op_type), []).append(node)
        # Element types of the custom-node outputs of the main graph and its If/Loop/Scan bodies, where
        # the model or shape inference gives them; a name several nodes produce (a function body's local
        # names) is left out.
        produced = Counter(name for node in nodes for name in node.output if name)
        wanted = [
            name
            for node in walk_nodes(proto.graph.node)
            if node.domain not in _STANDARD_DOMAINS
            for name in node.output
            if name and produced[name] == 1
        ]
        known = elem_types(proto, wanted) if wanted else {}
        types = {name: known[name] for name in wanted if name in known}
        classes: list[type] = []
        unknown: list[tuple[str, str, int]] = []
        moved = {name for _, name in self._legacy}  # (op types this session moved out of the default domain)
        for (domain, op_type), version in sorted(seen.items()):
            has_body = (domain, op_type) in functions
            if has_body and self.prefer == "function":
                self.implementations[domain, op_type] = "function"
                continue
            opdef = None if (domain, op_type) in self._legacy else find_op(domain, op_type, version)
            kern = find_kernel(domain, op_type, version)
            if opdef is not None:
                for node in by_op[domain, op_type]:  # (as ONNX Runtime's bridge refuses them)
                    check_node(opdef, node, f"{opdef.spec.qualname} node {node.name!r}")
            # (a kernel registered by the op's name runs where the op has none of its own, as in ONNX Runtime)
            if opdef is not None and (opdef.kernel is not None or kern is None):
                how = (
                    "numpy kernel"
                    if opdef.kernel_kind == "numpy" and opdef.kernel
                    else ("torch kernel" if opdef.kernel is not None else "PyTorch reference")
                )
                classes.append(_op_class(domain, op_type, _spec_runner(opdef), how, types))
                self.implementations[domain, op_type] = how
                continue
            if kern is None and runs_default_domain_kernel(domain, op_type, version, moved):
                # the default domain's kernel for the model's opset of that domain, as ONNX Runtime's bridge picks
                kern = find_kernel("", op_type, default_opset)
            if kern is not None:
                classes.append(_op_class(domain, op_type, _kernel_runner(kern), f"kernel {kern.qualname}", types))
                self.implementations[domain, op_type] = "kernel"
                continue
            if has_body:
                self.implementations[domain, op_type] = "function"
                continue
            unknown.append((domain, op_type, version))
        if unknown:
            # a node this session moved out of ONNX's default domain is named as the model has it
            given = [("", n, default_opset) if (d, n) in self._legacy else (d, n, v) for d, n, v in unknown]
            message = unknown_ops_message(
                (g[0], n, g[2], node.name) for g, (d, n, _) in zip(given, unknown) for node in by_op[d, n]
            )
            notes = [
                later_kernel_note(d, n, v) if d != DEFAULT_LEGACY_DOMAIN else later_kernel_note("", n, default_opset)
                for d, n, v in given
            ]
            raise UnknownOpError("\n".join([message, *dict.fromkeys(n for n in notes if n)]))
        return classes

    # ------------------------------------------------------------------ ORT-like API

    def get_inputs(self) -> list[ValueInfo]:
        """The graph inputs to feed (initializers excluded), like ONNX Runtime's ``get_inputs()``."""
        return list(self._inputs)

    def get_outputs(self) -> list[ValueInfo]:
        """The graph outputs, like ONNX Runtime's ``get_outputs()``."""
        return list(self._outputs)

    def run(
        self, output_names: str | Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None
    ) -> list[np.ndarray]:
        """Run the model: ``output_names`` (None = all) from ``input_feed`` ({input name: array}).

        ``run_options`` is accepted for ONNX Runtime compatibility and ignored. Kernels get
        read-only views of the input arrays: a numpy kernel that writes into its input raises
        numpy's read-only error (torch kernels share the memory, see the module doc). Outputs
        are arrays of their own, never views of an input.

        Raises:
            InputError: an input is missing, unknown, or has another dtype, rank or fixed dim than the
                model declares, or an output name is unknown (a ValueError, as :class:`~opbridge.InferenceSession`
                raises).
        """
        import numpy as np

        from opbridge._dtypes import feed_arrays, output_name_list

        input_feed = feed_arrays(input_feed)
        output_names = output_name_list(output_names)
        empty = self._check_feed.omittable  # (optional inputs left out, or given as None: empty optionals)
        feed: dict[str, Any] = {name: None for name in empty}
        for name, value in input_feed.items():
            if value is None and name in empty:
                continue
            # A read-only view, no copy: the evaluator hands graph inputs to kernels as they are,
            # and a numpy kernel that writes into its input fails instead of changing the caller's array.
            array = self._check_feed.as_array(name, value).view()
            array.flags.writeable = False
            feed[name] = array
        self._check_feed({name: value for name, value in feed.items() if name in input_feed})
        names = list(output_names) if output_names else [o.name for o in self._outputs]
        bad = [n for n in names if n not in {o.name for o in self._outputs}]
        if bad:
            from opbridge.backends.base import InputError

            raise InputError(
                f"unknown output name(s) {bad}; the model's outputs are {[o.name for o in self._outputs]}."
            )
        try:
            results = self._evaluator.run(names, feed)
        except OpbridgeError:
            raise
        except Exception as exc:
            failed = _failed_node(exc)
            if failed is None:
                raise
            node = failed.onnx_node
            raise _node_error(exc)(
                f"{node.domain or 'ai.onnx'}::{node.op_type} node {node.name!r} raised {type(exc).__name__} in "
                f"the ONNX reference evaluator: {exc}"
            ) from exc
        out = [np.asarray(r) for r in results]
        for name, result in zip(names, out):
            want = self._output_dtypes.get(name)
            if want is not None and result.dtype != want:
                raise KernelResultError(
                    f"output {name!r} came out {result.dtype}, but the model declares it {want}: a node computing it "
                    "gave another dtype (a kernel's result inside a function body, say, where the model gives no "
                    "type to check it against); return arrays of the op's output dtype."
                )
        return [r if r.flags.writeable else r.copy() for r in out]
