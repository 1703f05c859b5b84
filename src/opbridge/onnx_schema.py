"""ONNX operator schemas generated from op specs.

A registered schema lets ONNX's checker reject a mistyped attribute, lets ONNX
shape inference give each custom output its dtype and shape, and lets the
dynamo exporter's translation emit the custom node. Registration is global to
the process (that is how ``onnx.defs`` works), so it happens only through
:func:`register_onnx_schemas`, an explicit and idempotent call that
:func:`opbridge.export` makes for you.

Example:
    >>> import torch, opbridge, onnx
    >>> @opbridge.op("doc.schema::Twice")
    ... def twice(x: torch.Tensor) -> torch.Tensor:
    ...     return 2 * x
    >>> opbridge.register_onnx_schemas([twice])
    ['doc.schema::Twice']
    >>> onnx.defs.has("Twice", "doc.schema")
    True
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from opbridge._locks import ForkSafeLock
from opbridge.spec import AttrType, OpSpec

if TYPE_CHECKING:
    import onnx

    from opbridge.definition import OpDef

__all__ = ["attribute_values", "import_onnx_reference", "make_schema", "register_onnx_schemas"]

logger = logging.getLogger(__name__)

_LOCK = ForkSafeLock()
# (domain, name, version) -> the spec whose schema is registered in onnx.defs.
_REGISTERED: dict[tuple[str, str, int], OpSpec] = {}
# The schema objects registered, to put them back after import_onnx_reference().
_SCHEMAS: dict[tuple[str, str, int], Any] = {}

_ALL_TENSOR_TYPES = [
    "tensor(float)",
    "tensor(float16)",
    "tensor(bfloat16)",
    "tensor(double)",
    "tensor(int8)",
    "tensor(int16)",
    "tensor(int32)",
    "tensor(int64)",
    "tensor(uint8)",
    "tensor(uint16)",
    "tensor(uint32)",
    "tensor(uint64)",
    "tensor(bool)",
    "tensor(string)",
]


# The ONNX attribute types each declared attribute type accepts (AttributeProto's codes: FLOAT 1,
# INT 2, STRING 3, FLOATS 6, INTS 7, STRINGS 8). ONNX writes BOOL as INT; a FLOAT(S) attribute written
# as INT(S) is read as its float value.
_PROTO_KINDS: dict[AttrType, tuple[int, ...]] = {
    AttrType.FLOAT: (1, 2),
    AttrType.INT: (2,),
    AttrType.BOOL: (2,),
    AttrType.STRING: (3,),
    AttrType.FLOATS: (6, 7),
    AttrType.INTS: (7,),
    AttrType.STRINGS: (8,),
}


def attribute_values(
    spec: OpSpec, node: onnx.NodeProto | None = None, getter: Any = None, *, references: bool = False
) -> dict[str, Any]:
    """Attribute values of an ONNX node as Python values typed by ``spec``.

    Missing attributes take their defaults; BOOL comes back as bool, lists as tuples.
    Pass either a ``node`` or a ``getter(name) -> AttributeProto | None``. With ``references``, an
    attribute a function body's node takes from its call (``ref_attr_name``) is checked for its type
    and left out (its value is the call's).
    """
    import onnx

    if getter is None:
        by_name = {a.name: a for a in node.attribute} if node is not None else {}
        getter = by_name.get
    out: dict[str, Any] = {}
    for attr in spec.attributes:
        proto = getter(attr.name)
        if proto is None:
            if attr.required:
                raise ValueError(f"{spec.qualname}: node lacks required attribute {attr.name!r}")
            out[attr.name] = attr.default
            continue
        kinds = _PROTO_KINDS[attr.type]
        if proto.type not in kinds:
            got = onnx.AttributeProto.AttributeType.Name(proto.type)
            want = " or ".join(onnx.AttributeProto.AttributeType.Name(k) for k in kinds)
            raise ValueError(
                f"{spec.qualname}: attribute {attr.name!r} is {got} in the node; the op declares it "
                f"{attr.type.value} (ONNX {want}): re-export the model or fix the attribute's type."
            )
        if references and proto.ref_attr_name:
            continue
        value = onnx.helper.get_attribute_value(proto)
        try:
            if attr.type is AttrType.STRING:
                value = value.decode("utf-8")
            elif attr.type is AttrType.STRINGS:
                value = [v.decode("utf-8") for v in value]
        except UnicodeDecodeError:
            raise ValueError(f"{spec.qualname}: attribute {attr.name!r} holds bytes that are not UTF-8 text") from None
        out[attr.name] = attr.from_onnx_value(value)
    return out


def make_schema(opdef: OpDef) -> onnx.defs.OpSchema:
    """The ``onnx.defs.OpSchema`` for an op, with its type and shape inference function."""
    from onnx import defs

    from opbridge.shape import infer_onnx

    spec = opdef.spec
    param = defs.OpSchema.FormalParameter
    option = defs.OpSchema.FormalParameterOption
    inputs = [
        param(p.name, f"T{i}", param_option=option.Optional if p.optional else option.Single)
        for i, p in enumerate(spec.inputs)
    ]
    outputs = [param(o.name, f"O{i}") for i, o in enumerate(spec.outputs)]
    constraints = [(f"T{i}", _ALL_TENSOR_TYPES, "") for i in range(len(spec.inputs))]
    constraints += [(f"O{i}", _ALL_TENSOR_TYPES, "") for i in range(len(spec.outputs))]
    attr_type = defs.OpSchema.AttrType
    attributes = [
        defs.OpSchema.Attribute(
            a.name,
            getattr(attr_type, a.type.onnx_name),
            f"one of {list(a.choices)}" if a.choices is not None else "",
            required=a.required,
        )
        for a in spec.attributes
    ]
    schema = defs.OpSchema(
        spec.name,
        spec.domain,
        spec.version,
        spec.doc,
        inputs=inputs,
        outputs=outputs,
        type_constraints=constraints,
        attributes=attributes,
    )

    def infer(ctx: Any) -> None:
        attrs = attribute_values(spec, getter=ctx.get_attribute)
        types = [ctx.get_input_type(i) if ctx.has_input(i) else None for i in range(ctx.get_num_inputs())]
        types += [None] * (len(spec.inputs) - len(types))
        results = infer_onnx(spec, opdef.shape_rule, opdef.reference, types, attrs)
        for i, tp in enumerate(results):
            if tp is not None and i < ctx.get_num_outputs():
                ctx.set_output_type(i, tp)

    schema.set_type_and_shape_inference_function(infer)
    return schema


def register_onnx_schemas(ops: OpDef | str | Iterable[OpDef | str] | None = None) -> list[str]:
    """Register ONNX schemas for ``ops`` (default: every op defined in this process).

    Idempotent: an op whose schema is already registered from the same spec is
    skipped; a redefined op replaces its earlier schema. Returns the qualified
    names of the ops whose schemas are now registered. ``onnx.reference`` (which
    onnxscript, and so the dynamo exporter, imports) is imported first, without
    opbridge's schemas (:func:`import_onnx_reference`).
    """
    from onnx import defs

    from opbridge.definition import ops_argument

    selected = ops_argument(ops, "register_onnx_schemas")
    import_onnx_reference()
    done: list[str] = []
    with _LOCK:
        for opdef in selected:
            spec = opdef.spec
            current = _REGISTERED.get(spec.key)
            if current is not spec:
                if current is not None or defs.has(spec.name, spec.version, spec.domain):
                    try:
                        defs.deregister_schema(spec.name, spec.version, spec.domain)
                    except Exception:
                        logger.debug("no schema to deregister for %s", spec.qualname)
                schema = make_schema(opdef)
                defs.register_schema(schema)
                _REGISTERED[spec.key], _SCHEMAS[spec.key] = spec, schema
            done.append(spec.qualname)
    return done


def import_onnx_reference() -> ModuleType:
    """Import ``onnx.reference`` with opbridge's schemas out of ONNX's registry meanwhile.

    On its first import, ``onnx.reference`` indexes every registered schema by op
    name and refuses two ops of one name in different domains (``acme::Swish``
    beside ``other::Swish``, or a custom op named like a standard one). opbridge's
    schemas are only for export-time checking, so they step aside for that import.
    """
    import importlib
    import sys

    from onnx import defs

    if "onnx.reference.op_run" in sys.modules:
        return importlib.import_module("onnx.reference")
    with _LOCK:
        hidden = list(_SCHEMAS.items())
        for (domain, name, version), _ in hidden:
            defs.deregister_schema(name, version, domain)
        try:
            return importlib.import_module("onnx.reference")
        finally:
            for _, schema in hidden:
                defs.register_schema(schema)
