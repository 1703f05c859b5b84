"""Loading ONNX files and answering small questions about their nodes and values.

These helpers work on any model, including ones opbridge did not export:
which domains are standard, which opset a node runs under, whether a value is
an initializer, a Constant or computable from constants alone (and its value).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from opbridge.model_io import load_model
from opbridge.spec import ONNX_DOMAINS

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnx_ir as ir

__all__ = [
    "SMALL_TENSOR_BYTES",
    "STANDARD_DOMAINS",
    "bound_attributes",
    "call_bindings",
    "const_array",
    "ensure_builtin_ops",
    "evaluate_constant",
    "function_key",
    "function_keys",
    "is_custom_node",
    "labelled_bodies",
    "labelled_nodes",
    "load_model",
    "node_label",
    "opset_version",
    "resize_input_slots",
]

logger = logging.getLogger(__name__)

STANDARD_DOMAINS = ONNX_DOMAINS

#: the external tensors the graph tools read from a model file: shapes, scales and other small
#: constants; the weights stay in their files
SMALL_TENSOR_BYTES = 1 << 20


def ensure_builtin_ops() -> None:
    """Define opbridge's built-in ops (:mod:`opbridge.ops`) so that lookups by name find them."""
    import importlib

    importlib.import_module("opbridge.ops")


def _node_bodies(node: onnx.NodeProto, index: int, prefix: str) -> list[tuple[str, onnx.GraphProto]]:
    """``(path, graph)`` for the If/Loop/Scan bodies of ``node`` (at ``index`` in a graph at ``prefix``), each
    path as the labels of its nodes start (``cond/then_branch/``, ``scan/body[0]/``)."""
    import onnx

    owner = node_label(node, index)
    bodies: list[tuple[str, onnx.GraphProto]] = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            bodies.append((f"{prefix}{owner}/{attr.name}/", attr.g))
        elif attr.type == onnx.AttributeProto.GRAPHS:
            bodies += [(f"{prefix}{owner}/{attr.name}[{i}]/", g) for i, g in enumerate(attr.graphs)]
    return bodies


def labelled_bodies(nodes: Iterable[onnx.NodeProto], prefix: str = "") -> Iterator[tuple[str, onnx.GraphProto]]:
    """``(path, graph)`` for the If/Loop/Scan bodies of ``nodes`` and, depth first, theirs: ``path`` is where
    the body's nodes' labels start (:func:`labelled_nodes`)."""
    for index, node in enumerate(nodes):
        for path, graph in _node_bodies(node, index, prefix):
            yield path, graph
            yield from labelled_bodies(graph.node, path)


def _walk(nodes: Iterable[onnx.NodeProto], prefix: str) -> Iterator[tuple[str, onnx.NodeProto, int]]:
    """``(prefix, node, index in its own graph)`` for ``nodes`` and, recursively, their subgraphs' nodes."""
    for index, node in enumerate(nodes):
        yield prefix, node, index
        for path, graph in _node_bodies(node, index, prefix):
            yield from _walk(graph.node, path)


def labelled_nodes(model: onnx.ModelProto) -> Iterator[tuple[str, str, onnx.NodeProto, onnx.FunctionProto | None]]:
    """``(path, name, node, function)`` for every node of the main graph and its subgraphs (function None),
    then of the model-local functions' bodies. ``path`` is the node's place (``""`` in the main graph,
    ``loop/body/``, ``domain::Function/``), ``name`` its name, or ``op_type#index`` (its place in its own
    graph) where it has none; ``path + name`` labels it (a name may itself hold slashes)."""
    for prefix, node, index in _walk(model.graph.node, ""):
        yield prefix, node_label(node, index), node, None
    for fn in model.functions:
        for prefix, node, index in _walk(fn.node, f"{function_label(fn)}/"):
            yield prefix, node_label(node, index), node, fn


def function_label(fn: onnx.FunctionProto) -> str:
    """``domain::name``, with ``:overload`` where the function is one overload of several."""
    overload = getattr(fn, "overload", "")
    return f"{fn.domain}::{fn.name}" + (f":{overload}" if overload else "")


def is_custom_node(node: onnx.NodeProto, opset: int | None = None) -> bool:
    """Whether ``node`` is outside ONNX's standard domains, or an op ONNX does not define in the default domain
    (at ``opset`` of it, the model's; in any opset where None) or in another of its domains (``ai.onnx.ml``...:
    in any opset)."""
    from opbridge.legacy_domain import first_versions, is_standard_op

    if node.domain in ("", "ai.onnx"):
        return not is_standard_op(node.op_type, opset)
    return node.domain not in STANDARD_DOMAINS or node.op_type not in first_versions(node.domain)


def node_label(node: onnx.NodeProto, index: int | None = None) -> str:
    """A name to show for ``node``: its name, else ``op_type#index``."""
    if node.name:
        return node.name
    return f"{node.op_type}#{index}" if index is not None else node.op_type


def opset_version(model: onnx.ModelProto | onnx.FunctionProto, domain: str) -> int | None:
    """The version the model (or function) imports for ``domain`` (``""`` and ``"ai.onnx"`` are the
    same), or None."""
    aliases = {"", "ai.onnx"} if domain in ("", "ai.onnx") else {domain}
    versions = [o.version for o in model.opset_import if o.domain in aliases]
    return max(versions) if versions else None


def function_key(item: onnx.NodeProto | onnx.FunctionProto) -> tuple[str, str, str]:
    """``(domain, name, overload)`` that a node calls, or that a model-local function defines (IR 10 tells
    a function's overloads apart by ``overload``; "" elsewhere)."""
    name = item.op_type if hasattr(item, "op_type") else item.name
    return item.domain, name, getattr(item, "overload", "")


def function_keys(model: onnx.ModelProto) -> set[tuple[str, str, str]]:
    """``(domain, name, overload)`` of every model-local function (see :func:`function_key`)."""
    return {function_key(f) for f in model.functions}


def bound_attributes(
    model: onnx.ModelProto, node: onnx.NodeProto, fn: onnx.FunctionProto | None
) -> Iterator[tuple[str, onnx.AttributeProto, str]]:
    """``(name, attribute, via)`` for each attribute of ``node``: as written, or, for one a function body's
    node takes from its function's call (``ref_attr_name``), the attribute each call of ``fn`` binds it
    to (the function's default where a call gives none), followed through calls inside other functions'
    bodies; ``via`` is ``""`` or `` (from call LABEL)``. A reference no call binds yields nothing."""
    for attr in node.attribute:
        if not attr.ref_attr_name or fn is None:
            yield attr.name, attr, ""
            continue
        for label, bound in _bindings(model, fn, attr.ref_attr_name, set()):
            yield attr.name, bound, f" (from call {label})"


def call_bindings(model: onnx.ModelProto, fn: onnx.FunctionProto, name: str) -> list[tuple[str, onnx.AttributeProto]]:
    """``(call label, attribute)`` for each call of ``fn`` (followed through calls inside other bodies):
    the attribute it binds ``fn``'s attribute ``name`` to, or the function's default where it gives none."""
    return list(_bindings(model, fn, name, set()))


def _bindings(
    model: onnx.ModelProto, fn: onnx.FunctionProto, name: str, seen: set[tuple[str, str, str, str]]
) -> Iterator[tuple[str, onnx.AttributeProto]]:
    """``(call label, attribute)`` that the calls of ``fn`` bind its attribute ``name`` to."""
    called = function_key(fn)
    if (*called, name) in seen:  # (recursive functions, which the checker refuses)
        return
    seen = seen | {(*called, name)}
    default = next((a for a in getattr(fn, "attribute_proto", ()) if a.name == name), None)
    for path, label, call, caller in labelled_nodes(model):
        if function_key(call) != called:
            continue
        given = next((a for a in call.attribute if a.name == name), default)
        if given is None:
            continue
        if given.ref_attr_name and caller is not None:
            yield from _bindings(model, caller, given.ref_attr_name, seen)
        elif not given.ref_attr_name:
            yield path + label, given


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The numpy value of an initializer or Constant output, else None."""
    import onnx_ir as ir

    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    # (a large tensor left in its data file by load_model(external_data=N) is not read here)
    return None if tensor is None or isinstance(tensor, ir.ExternalTensor) else tensor.numpy()


def _static_shape(value: ir.Value) -> list[int] | None:
    shape = value.shape
    if shape is None:
        return None
    dims = [d for d in shape if isinstance(d, int)]
    return dims if len(dims) == len(shape) else None


# ops whose outputs differ from run to run, whatever their inputs
_RANDOM_OPS = frozenset(
    {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial", "Bernoulli"}
)


def evaluate_constant(
    value: ir.Value | None, *, max_nodes: int = 64, opset: int | None = None
) -> tuple[np.ndarray | None, str]:
    """Compute ``value`` if it depends only on constants (and static shapes); else say why not.

    Returns ``(array, "")`` or ``(None, reason)``. ``Shape`` of a value whose
    shape is fully static counts as a constant. Other nodes are run with
    ``onnx.reference``, under their graph's ONNX opset, else ``opset`` (the model's, for nodes of a
    subgraph, which imports none of its own).
    """
    import numpy as np

    if value is None:
        return None, "the input is absent"
    cache: dict[int, np.ndarray] = {}
    count = [0]

    def ev(v: ir.Value) -> tuple[np.ndarray | None, str]:
        if id(v) in cache:
            return cache[id(v)], ""
        if v.is_graph_input():  # (an initializer that is also an input is only its default: a feed replaces it)
            return None, f"it depends on graph input {v.name!r}"
        arr = const_array(v)
        if arr is not None:
            cache[id(v)] = arr
            return arr, ""
        node = v.producer()
        if node is None:
            return None, f"{v.name!r} has no producer"
        count[0] += 1
        if count[0] > max_nodes:
            return None, f"it depends on more than {max_nodes} nodes"
        if node.op_type == "Shape" and node.domain in ("", "ai.onnx"):
            dims = _static_shape(node.inputs[0]) if node.inputs[0] is not None else None
            if dims is None:
                name = node.inputs[0].name if node.inputs[0] is not None else "?"
                return None, f"it depends on the run-time shape of {name!r} (via {node.name or 'Shape'})"
            start = node.attributes.get_int("start", 0)
            end = node.attributes.get_int("end", len(dims))
            out = np.array(dims, dtype=np.int64)[slice(start, end)]
            cache[id(v)] = out
            return out, ""
        if node.domain not in ("", "ai.onnx"):
            return None, f"it is computed by custom node {node.name or node.op_type!r}"
        if node.op_type in _RANDOM_OPS:
            return None, f"it is drawn at random by {node.name or node.op_type!r} on every run"
        inputs: list[np.ndarray | None] = []
        for x in node.inputs:
            if x is None:
                inputs.append(None)
                continue
            arr, why = ev(x)
            if arr is None:
                return None, why
            inputs.append(arr)
        outs = _run_node(node, inputs, opset)
        if outs is None:
            return None, f"node {node.name or node.op_type!r} could not be evaluated"
        for out_value, arr in zip(node.outputs, outs):
            cache[id(out_value)] = arr
        return cache.get(id(v)), ""

    return ev(value)


def _run_node(node: ir.Node, inputs: list[Any], opset: int | None = None) -> list[Any] | None:
    """Run one standard node with onnx.reference on numpy inputs, under its own ONNX opset, its graph's,
    else ``opset``."""
    import onnx
    import onnx_ir as ir

    from opbridge.onnx_schema import import_onnx_reference

    ReferenceEvaluator = import_onnx_reference().ReferenceEvaluator
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    outs = [f"o{k}" for k in range(len(node.outputs))]
    attrs = [ir.serde.serialize_attribute(a) for a in node.attributes.values()]
    proto = onnx.helper.make_node(node.op_type, names, outs, domain=node.domain)
    proto.attribute.extend(attrs)
    imports = node.graph.opset_imports if node.graph is not None else {}
    version = node.version or imports.get("", imports.get("ai.onnx")) or opset or 21
    graph = onnx.helper.make_graph(
        [proto],
        "eval",
        [
            onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
            for n, x in zip(names, inputs)
            if x is not None
        ],
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in outs],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", int(version))])
    try:
        feeds = {n: x for n, x in zip(names, inputs) if x is not None}
        return list(ReferenceEvaluator(model).run(None, feeds))
    except Exception as exc:
        logger.debug("cannot evaluate %s: %s", node.op_type, exc)
        return None


def resize_input_slots(version: int | None) -> tuple[tuple[int, str], ...]:
    """(input index, name) of a Resize's scales and sizes under opset ``version``: Resize-10 takes
    (X, scales), Resize-11 and later (X, roi, scales, sizes)."""
    return ((1, "scales"),) if version is not None and version < 11 else ((2, "scales"), (3, "sizes"))
