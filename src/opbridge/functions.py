"""ONNX function bodies: decompositions of custom ops into standard ONNX ops.

An op may register a body with ``@my_op.register_function``. The registered
object is one of:

* an onnxscript function (``@onnxscript.script()``, anything with
  ``to_function_proto()``), written at module level;
* a callable ``builder(spec) -> onnx.FunctionProto``;
* a callable ``builder(spec, opset) -> onnx.FunctionProto`` (it has a parameter
  named ``opset``): it is given the exporting model's default ONNX opset and
  builds the body for it. :func:`make_body` helps write such builders.

At export the body is attached to the model as a model-local function named
``domain::Name``, so ONNX Runtime and the ONNX reference evaluator run the
custom node with no registration at all (``opbridge.export(...,
functions=False)`` leaves bodies out, e.g. for a TensorRT plugin target).

A body's default-domain opset must agree with the model's: the ONNX checker
rejects a function whose ops resolve to another schema version than the
model's. A body written for another opset is moved to the model's opset when
every op it uses has the same definition in both, or a later one that accepts
the node as written with the same meaning (a wider type list, new optional
attributes: e.g. Constant 13 -> 19, Resize 13 -> 19); otherwise
:func:`function_proto` raises :class:`~opbridge.errors.OpDefinitionError`
naming the op (write the builder with an ``opset`` parameter instead).

Example:
    >>> import torch, opbridge
    >>> from onnx import helper
    >>> @opbridge.op("doc.fn::Twice")
    ... def twice(x: torch.Tensor, tag: str = "") -> torch.Tensor:
    ...     return 2 * x
    >>> @twice.register_function
    ... def _twice_body(spec, opset):
    ...     return make_body(spec, [helper.make_node("Add", ["x", "x"], ["output"])], opset)
    >>> fn = function_proto(twice, opset=17)
    >>> fn.domain, fn.name, list(fn.input), list(fn.attribute), fn.opset_import[0].version
    ('doc.fn', 'Twice', ['x'], ['tag'], 17)
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opbridge.errors import OpDefinitionError
from opbridge.model_io import walk_nodes

if TYPE_CHECKING:
    import onnx

    from opbridge.definition import OpDef
    from opbridge.spec import OpSpec

__all__ = ["DEFAULT_BODY_OPSET", "attach_functions", "function_proto", "make_body", "ref_attr"]

logger = logging.getLogger(__name__)

#: The opset a builder with an ``opset`` parameter gets when no model is given.
DEFAULT_BODY_OPSET = 18

_DEFAULT_DOMAINS = ("", "ai.onnx")


def make_body(
    spec: OpSpec,
    nodes: Sequence[onnx.NodeProto],
    opset: int,
    *,
    extra_opsets: dict[str, int] | None = None,
    doc: str = "",
) -> onnx.FunctionProto:
    """A FunctionProto for ``spec`` from ``nodes``: the spec's inputs, outputs and attributes.

    The nodes read the op's inputs and write its outputs by their spec names,
    and refer to the op's attributes with :func:`ref_attr`. Every attribute of
    the spec is declared, so nodes of the op may carry any of them.

    Args:
        spec: the op's spec (``opdef.spec``).
        nodes: the body's nodes, in topological order.
        opset: the default-domain opset the nodes are written for.
        extra_opsets: further ``{domain: version}`` imports the nodes use.
        doc: the function's doc string.

    Example:
        >>> import torch, opbridge
        >>> from onnx import helper
        >>> @opbridge.op("doc.body::Neg")
        ... def neg(x: torch.Tensor) -> torch.Tensor:
        ...     return -x
        >>> fn = make_body(neg.spec, [helper.make_node("Neg", ["x"], ["output"])], 18)
        >>> [n.op_type for n in fn.node]
        ['Neg']
    """
    from onnx import helper

    imports = [helper.make_opsetid("", opset)]
    imports += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    return helper.make_function(
        spec.domain,
        spec.name,
        [p.name for p in spec.inputs],
        [o.name for o in spec.outputs],
        list(nodes),
        imports,
        attributes=[a.name for a in spec.attributes],
        doc_string=doc or spec.doc,
    )


def ref_attr(name: str, ref: str, attr_type: onnx.AttributeProto.AttributeType) -> onnx.AttributeProto:
    """An attribute that takes its value from the calling node's attribute ``ref``.

    ``attr_type`` is an ``onnx.AttributeProto`` type, e.g. ``AttributeProto.INT``.

    Example:
        >>> import onnx
        >>> from onnx import helper
        >>> node = helper.make_node("Constant", [], ["flag"])
        >>> node.attribute.extend([ref_attr("value_int", "align_corners", onnx.AttributeProto.INT)])
        >>> node.attribute[0].ref_attr_name
        'align_corners'
    """
    import onnx

    attr = onnx.AttributeProto()
    attr.name, attr.ref_attr_name, attr.type = name, ref, attr_type
    return attr


def _wants_opset(builder: Any) -> bool:
    try:
        return "opset" in inspect.signature(builder).parameters
    except (TypeError, ValueError):
        return False


_MEANING_CHANGED = frozenset({("GroupNormalization", 18, 21)})


def _node_fits(node: onnx.NodeProto, written: int, opset: int) -> bool:
    """Whether ``node`` is valid, with unchanged meaning, under ``opset``'s schema of its op.

    The later schema must accept the node as written: every attribute it sets
    exists there with the same type, every required attribute is set, and its
    input and output counts are allowed. Versions that only widen the type list
    or add optional attributes pass; the few known changes of meaning under an
    unchanged signature are refused.
    """
    import onnx

    schema = onnx.defs.get_schema(node.op_type, opset, "")
    attrs = schema.attributes
    for attr in node.attribute:
        declared = attrs.get(attr.name)
        if declared is None or int(declared.type) != attr.type:  # type: ignore[call-overload]  # a pybind11 enum
            return False
    if any(a.required and a.name not in {x.name for x in node.attribute} for a in attrs.values()):
        return False
    if not (schema.min_input <= len(node.input) <= schema.max_input):
        return False
    if not (schema.min_output <= len(node.output) <= schema.max_output):
        return False
    return (node.op_type, written, schema.since_version) not in _MEANING_CHANGED


def _adapt_opset(fn: onnx.FunctionProto, opset: int, qualname: str) -> None:
    """Move ``fn``'s default-domain import to ``opset`` if every op it uses means the same there."""
    import onnx

    entries = [e for e in fn.opset_import if e.domain in _DEFAULT_DOMAINS]
    if not entries:
        return
    entry = entries[0]
    written = entry.version
    if written == opset:
        return
    for node in walk_nodes(fn.node):
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        try:
            here = onnx.defs.get_schema(node.op_type, written, "").since_version
        except onnx.defs.SchemaError:
            here = None
        try:
            there = onnx.defs.get_schema(node.op_type, opset, "").since_version
        except onnx.defs.SchemaError:
            there = None
        if here is None or there is None or (here != there and not _node_fits(node, here, opset)):
            raise OpDefinitionError(
                f"{qualname}: the function body is written for ONNX opset {written}, but the model uses opset "
                f"{opset}, and {node.op_type} is defined differently there (version {here} vs {there}). "
                "Register a builder with an 'opset' parameter that builds the body for the model's opset, "
                f"or export with opset_version={written}."
            )
    logger.debug("%s: body moved from opset %d to the model's opset %d", qualname, written, opset)
    entry.version = opset


def _check_ref_attrs(fn: onnx.FunctionProto, qualname: str, declared: set[str]) -> None:
    for node in walk_nodes(fn.node):
        for attr in node.attribute:
            if attr.ref_attr_name and attr.ref_attr_name not in declared:
                raise OpDefinitionError(
                    f"{qualname}: function body node {node.op_type} ({node.name or 'unnamed'}) refers to "
                    f"attribute {attr.ref_attr_name!r}, which the op does not declare; declare it as a "
                    "parameter of the op or remove the reference."
                )


def function_proto(opdef: OpDef, opset: int | None = None) -> onnx.FunctionProto | None:
    """The FunctionProto of ``opdef``'s registered body, named after its domain and op type.

    Args:
        opdef: the op.
        opset: the default ONNX opset of the model the body goes into; the body is
            built for it (builders with an ``opset`` parameter) or moved to it.

    Returns:
        The checked body, or None when the op has none (or its builder returns
        None for this opset).

    Raises:
        OpDefinitionError: the body's inputs, outputs or attributes do not match
            the op's spec, or it cannot be expressed in ``opset``.
    """
    import onnx

    builder: Any = opdef.function_builder
    if builder is None:
        return None
    spec: OpSpec = opdef.spec
    if hasattr(builder, "to_function_proto"):
        proto = builder.to_function_proto()
    elif _wants_opset(builder):
        proto = builder(spec, opset=opset if opset is not None else DEFAULT_BODY_OPSET)
    else:
        proto = builder(spec)
    if proto is None:
        # The builder has no body for this opset (e.g. the ONNX op it needs is newer):
        # the node then runs through the op's kernel.
        return None
    if not isinstance(proto, onnx.FunctionProto):
        raise OpDefinitionError(
            f"{spec.qualname}: the registered function body gave {type(proto).__name__}; "
            "return an onnx.FunctionProto or register an onnxscript function."
        )
    fn = onnx.FunctionProto()
    fn.CopyFrom(proto)
    fn.domain, fn.name = spec.domain, spec.name
    if len(fn.input) != len(spec.inputs) or len(fn.output) != len(spec.outputs):
        raise OpDefinitionError(
            f"{spec.qualname}: function body has {len(fn.input)} input(s) / {len(fn.output)} output(s), the op "
            f"declares {len(spec.inputs)} / {len(spec.outputs)}."
        )
    declared = {a.name for a in spec.attributes}
    names = set(fn.attribute) | {a.name for a in fn.attribute_proto}
    if not names <= declared:
        raise OpDefinitionError(
            f"{spec.qualname}: function body uses attribute(s) {sorted(names - declared)} the op does not declare."
        )
    _check_ref_attrs(fn, spec.qualname, names)
    if opset is not None:
        _adapt_opset(fn, opset, spec.qualname)
    return fn


def _model_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), None)


def attach_functions(model: onnx.ModelProto, ops: Iterable[OpDef]) -> list[str]:
    """Attach the bodies of ``ops`` to ``model`` as local functions (in place).

    Ops without a body, and ops whose function is already in the model, are
    skipped. Bodies are built for (or moved to) the model's default opset, and
    opset imports they need in other domains are added. Returns the qualified
    names of the functions attached.
    """
    have = {(f.domain, f.name) for f in model.functions}
    imports = {o.domain: o for o in model.opset_import}
    opset = _model_opset(model)
    attached: list[str] = []
    for opdef in ops:
        if (opdef.spec.domain, opdef.spec.name) in have:
            continue
        fn = function_proto(opdef, opset)
        if fn is None:
            continue
        for entry in fn.opset_import:
            if entry.domain in _DEFAULT_DOMAINS and opset is not None:
                continue
            if entry.domain not in imports:
                new = model.opset_import.add()
                new.domain, new.version = entry.domain, entry.version
                imports[entry.domain] = new
            elif imports[entry.domain].version != entry.version:
                raise OpDefinitionError(
                    f"{opdef.spec.qualname}: the function body imports domain {entry.domain!r} version "
                    f"{entry.version}, the model imports version {imports[entry.domain].version}."
                )
        model.functions.append(fn)
        have.add((fn.domain, fn.name))
        attached.append(opdef.spec.qualname)
    return attached
