"""``opbridge inspect``: what an ONNX file holds, with its custom nodes in detail.

Example:
    >>> import onnx
    >>> from onnx import helper, TensorProto
    >>> node = helper.make_node("Foo", ["x"], ["y"], domain="acme", alpha=0.5)
    >>> g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
    ...                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    >>> report = inspect_model(m)
    >>> report.opsets, report.inputs[0].shape
    ({'': 17, 'acme': 1}, ['N', 3])
    >>> c = report.custom_nodes[0]
    >>> (c.domain, c.op_type, c.version, c.attributes[0].type, c.attributes[0].value)
    ('acme', 'Foo', 1, 'FLOAT', 0.5)
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from opbridge.graph._model import (
    function_key,
    function_keys,
    function_label,
    is_custom_node,
    labelled_bodies,
    labelled_nodes,
    load_model,
    opset_version,
)

if TYPE_CHECKING:
    import onnx

__all__ = ["AttributeInfo", "CustomNodeInfo", "InitializerInfo", "ModelReport", "ValueInfo", "inspect_model"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output: name, element type and dims (ints, symbolic names, or None when unknown)."""

    name: str
    dtype: str
    shape: list[int | str | None] | None


@dataclass(frozen=True)
class AttributeInfo:
    """One attribute of a node: its ONNX type name and its value as plain Python data."""

    name: str
    type: str
    value: Any


@dataclass(frozen=True)
class CustomNodeInfo:
    """A node outside ONNX's standard ops."""

    name: str
    domain: str
    op_type: str
    version: int | None
    attributes: list[AttributeInfo]
    num_inputs: int
    num_outputs: int
    has_function: bool
    graph_path: str = ""


@dataclass(frozen=True)
class InitializerInfo:
    """An initializer's name, dtype, dims and size in bytes (external data counted too; a sparse one's
    values and indices as stored)."""

    name: str
    dtype: str
    shape: list[int]
    nbytes: int
    sparse: bool = False


@dataclass
class ModelReport:
    """Everything ``opbridge inspect`` prints."""

    path: str
    ir_version: int
    producer: str
    opsets: dict[str, int]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    custom_nodes: list[CustomNodeInfo]
    op_counts: dict[str, int]
    functions: list[str]
    initializers: list[InitializerInfo] = field(default_factory=list)

    @property
    def initializer_bytes(self) -> int:
        return sum(i.nbytes for i in self.initializers)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["initializer_bytes"] = self.initializer_bytes
        return data

    def to_json(self) -> str:
        from opbridge.compare import jsonable

        return json.dumps(jsonable(self.to_dict()), indent=2, ensure_ascii=False, allow_nan=False)

    def format_text(self, *, max_initializers: int = 10) -> str:
        """A readable multi-line summary."""
        lines = [f"model: {self.path or '<in memory>'} (IR {self.ir_version}, producer {self.producer or '?'})"]
        lines.append("opsets: " + ", ".join(f"{d or 'ai.onnx'} v{v}" for d, v in sorted(self.opsets.items())))
        for title, values in (("inputs", self.inputs), ("outputs", self.outputs)):
            lines.append(f"{title}:")
            for v in values:
                dims = "?" if v.shape is None else "x".join("?" if d is None else str(d) for d in v.shape) or "scalar"
                lines.append(f"  {v.name}: {v.dtype}[{dims}]")
        lines.append(f"custom nodes: {len(self.custom_nodes)}")
        for c in self.custom_nodes:
            body = "function body in model" if c.has_function else "no function body"
            version = "?" if c.version is None else c.version
            lines.append(
                f"  {c.graph_path}{c.name}: {c.domain or '<default domain>'}::{c.op_type} v{version}, "
                f"{c.num_inputs} input(s), {c.num_outputs} output(s), {body}"
            )
            for a in c.attributes:
                shown = repr(a.value)
                if len(shown) > _LONGEST_VALUE:  # (the whole value is in --json)
                    shown = f"{shown[:_LONGEST_VALUE]}... ({len(shown)} characters)"
                lines.append(f"    {a.name}: {a.type} = {shown}")
        lines.append("node counts: " + ", ".join(f"{k} {v}" for k, v in sorted(self.op_counts.items())))
        if self.functions:
            lines.append("functions: " + ", ".join(self.functions))
        lines.append(f"initializers: {len(self.initializers)}, {_human(self.initializer_bytes)}")
        for i in sorted(self.initializers, key=lambda i: -i.nbytes)[:max_initializers]:
            lines.append(f"  {i.name}: {i.dtype}{i.shape} {_human(i.nbytes)}{' (sparse)' if i.sparse else ''}")
        from opbridge._text import printable

        return "\n".join(printable(line) for line in lines)


# the longest attribute value the text report shows whole
_LONGEST_VALUE = 200


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _dtype_name(elem_type: int) -> str:
    import onnx

    if not elem_type:
        return "undefined"
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:  # a number ONNX does not define (the checker lets some through)
        return f"unknown({elem_type})"


def _value_info(v: onnx.ValueInfoProto) -> ValueInfo:
    t = v.type.tensor_type
    if not v.type.HasField("tensor_type"):
        return ValueInfo(v.name, v.type.WhichOneof("value") or "unknown", None)
    shape: list[int | str | None] | None = None
    if t.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    return ValueInfo(v.name, _dtype_name(t.elem_type), shape)


def attribute_info(attr: onnx.AttributeProto) -> AttributeInfo:
    """An attribute's type name and a JSON-friendly value (tensors summarized, bytes decoded)."""
    import onnx
    from onnx import numpy_helper

    kind = onnx.AttributeProto.AttributeType.Name(attr.type)
    value: Any
    if attr.ref_attr_name:
        value = f"<ref {attr.ref_attr_name}>"
    elif attr.type == onnx.AttributeProto.TENSOR:
        value = {"dtype": _dtype_name(attr.t.data_type), "shape": list(attr.t.dims)}
        count = _element_count(attr.t)
        if count <= 16 and not attr.t.external_data and attr.t.data_type == onnx.TensorProto.STRING:
            # (bytes that are not UTF-8, which numpy_helper refuses, shown with replacement characters)
            texts = [t.decode("utf-8", errors="replace") for t in attr.t.string_data]
            value["value"] = _nested(texts, list(attr.t.dims)) if len(texts) == count else texts
        elif count <= 16 and not attr.t.external_data:
            try:
                value["value"] = numpy_helper.to_array(attr.t).tolist()
            except (ValueError, TypeError) as exc:  # (data that does not fit its dims: summarized only)
                logger.debug("attribute %s: its tensor's values cannot be read: %s", attr.name, exc)
    elif attr.type == onnx.AttributeProto.TENSORS:
        value = [{"dtype": _dtype_name(t.data_type), "shape": list(t.dims)} for t in attr.tensors]
    elif attr.type in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS):
        sparse = [attr.sparse_tensor] if attr.type == onnx.AttributeProto.SPARSE_TENSOR else list(attr.sparse_tensors)
        items = [{"dtype": _dtype_name(t.values.data_type), "shape": list(t.dims), "sparse": True} for t in sparse]
        value = items[0] if attr.type == onnx.AttributeProto.SPARSE_TENSOR else items
    elif attr.type in (onnx.AttributeProto.TYPE_PROTO, onnx.AttributeProto.TYPE_PROTOS):
        protos = [attr.tp] if attr.type == onnx.AttributeProto.TYPE_PROTO else list(attr.type_protos)
        names = [onnx.helper.printable_type(tp) for tp in protos]
        value = names[0] if attr.type == onnx.AttributeProto.TYPE_PROTO else names
    elif attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        value = f"<{kind.lower()}>"
    else:
        raw = onnx.helper.get_attribute_value(attr)
        if isinstance(raw, bytes):
            value = raw.decode("utf-8", errors="replace")
        elif isinstance(raw, list):
            value = [x.decode("utf-8", errors="replace") if isinstance(x, bytes) else x for x in raw]
        else:
            value = raw
    return AttributeInfo(attr.name, kind, value)


def _nested(flat: list[Any], dims: list[int]) -> Any:
    """``flat`` (row-major) as nested lists of ``dims``; a scalar's one value where ``dims`` is empty."""
    if not dims:
        return flat[0]
    step = len(flat) // dims[0] if dims[0] else 0
    return [_nested(flat[i * step : (i + 1) * step], dims[1:]) for i in range(dims[0])]


def _element_count(t: onnx.TensorProto) -> int:
    count = 1
    for d in t.dims:
        count *= max(int(d), 0)  # (a negative dim, which the checker refuses, holds nothing)
    return count


def _tensor_nbytes(t: onnx.TensorProto) -> int:
    """The tensor's size in bytes as stored: types below a byte packed (int4 two to a byte, float6 four to
    three bytes), strings by their lengths, unknown types a byte per element."""
    import onnx

    from opbridge.model_io import data_nbytes

    if t.data_type == onnx.TensorProto.STRING:
        return sum(len(v) for v in t.string_data)
    return data_nbytes(t)


def inspect_model(model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> ModelReport:
    """Summarize ``model``: opsets, I/O, custom nodes, op counts, initializers.

    Args:
        model: a path, a serialized model (bytes) or a loaded ``onnx.ModelProto``.
    """
    import onnx

    path = "" if isinstance(model, (onnx.ModelProto, bytes, bytearray, memoryview)) else str(model)
    proto = load_model(model, external_data=False)  # (sizes come from the dims: no weights read)
    default_opset = opset_version(proto, "")
    functions = function_keys(proto)
    counts: Counter[str] = Counter()
    custom: list[CustomNodeInfo] = []
    # the graphs' nodes (counted), then the local functions' bodies (their custom nodes listed too)
    for graph_path, name, node, fn in labelled_nodes(proto):
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        if fn is None:
            counts[key] += 1
        if is_custom_node(node, default_opset):
            version = opset_version(fn, node.domain) if fn is not None else None
            custom.append(
                CustomNodeInfo(
                    name=name,
                    domain=node.domain,
                    op_type=node.op_type,
                    version=version if version is not None else opset_version(proto, node.domain),
                    attributes=[attribute_info(a) for a in node.attribute],
                    num_inputs=len(node.input),
                    num_outputs=len(node.output),
                    has_function=function_key(node) in functions,
                    graph_path=graph_path,
                )
            )
    opsets: dict[str, int] = {}
    for o in proto.opset_import:
        domain = "" if o.domain == "ai.onnx" else o.domain
        opsets[domain] = max(opsets.get(domain, 0), o.version)
    weights = {i.name for i in proto.graph.initializer} | {s.values.name for s in proto.graph.sparse_initializer}
    return ModelReport(
        path=path,
        ir_version=proto.ir_version,
        producer=" ".join(x for x in (proto.producer_name, proto.producer_version) if x),
        opsets=opsets,
        inputs=[_value_info(v) for v in proto.graph.input if v.name not in weights],
        outputs=[_value_info(v) for v in proto.graph.output],
        custom_nodes=custom,
        op_counts=dict(counts),
        functions=[function_label(f) for f in proto.functions],
        initializers=[
            info
            for path, graph in [
                ("", proto.graph),
                *labelled_bodies(proto.graph.node),
                *(body for f in proto.functions for body in labelled_bodies(f.node, f"{function_label(f)}/")),
            ]
            for info in _initializers(graph, path)
        ],
    )


def _initializers(graph: onnx.GraphProto, path: str) -> list[InitializerInfo]:
    """The initializers of ``graph``, named after its place (``path``: ``""`` for the main graph)."""
    return [
        InitializerInfo(path + t.name, _dtype_name(t.data_type), list(t.dims), _tensor_nbytes(t))
        for t in graph.initializer
    ] + [
        InitializerInfo(
            path + s.values.name,
            _dtype_name(s.values.data_type),
            list(s.dims),
            _tensor_nbytes(s.values) + _tensor_nbytes(s.indices),
            sparse=True,
        )
        for s in graph.sparse_initializer
    ]
