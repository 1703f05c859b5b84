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

The body declares the op's attributes with the spec's defaults
(``FunctionProto.attribute_proto``; attributes without a default stay required,
in ``FunctionProto.attribute``), so a node that omits an attribute gets the
op's default in every runtime, not the default of the ONNX op inside the body.

A body's default-domain opset must agree with the model's: the ONNX checker
rejects a function whose ops resolve to another schema version than the
model's. A body written for another opset is moved to the model's opset, up or
down, when every op it uses has the same definition in both, or another one
that accepts the node as written with the same meaning (a wider type list, new
optional attributes: e.g. Constant 13 -> 19, Resize 13 -> 19); otherwise
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
    >>> fn.domain, fn.name, list(fn.input), [a.name for a in fn.attribute_proto], fn.opset_import[0].version
    ('doc.fn', 'Twice', ['x'], ['tag'], 17)
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opbridge.errors import OpbridgeError, OpDefinitionError
from opbridge.model_io import walk_nodes

if TYPE_CHECKING:
    import onnx

    from opbridge.definition import OpDef
    from opbridge.spec import AttrSpec, OpSpec

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
    the spec is declared, so nodes of the op may carry any of them: those with
    a default as ``attribute_proto`` entries holding the spec's default (a node
    that omits one gets the op's default), the others by name (required).

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
        attributes=[a.name for a in spec.attributes if a.required],
        attribute_protos=[_default_attribute(a) for a in spec.attributes if not a.required],
        doc_string=doc or spec.doc,
    )


def _default_attribute(attr: AttrSpec) -> onnx.AttributeProto:
    """``attr``'s default as an ONNX attribute of its declared type."""
    import onnx
    from onnx import helper

    kind = onnx.AttributeProto.AttributeType.Value(attr.type.onnx_name)
    return helper.make_attribute(attr.name, attr.to_onnx_value(attr.default), attr_type=kind)


def _attribute_value(attr: onnx.AttributeProto) -> Any:
    """An attribute's value, lists as lists (comparable across containers)."""
    from onnx import helper

    value = helper.get_attribute_value(attr)
    return list(value) if isinstance(value, (list, tuple)) else value


def _declare_defaults(fn: onnx.FunctionProto, spec: OpSpec) -> None:
    """Declare every attribute of ``fn`` that has a default in ``spec`` with that default.

    Names in ``fn.attribute`` (no default) move to ``fn.attribute_proto``;
    defaults ``fn`` declares itself must equal the spec's.
    """
    by_name = {a.name: a for a in spec.attributes}
    for given in fn.attribute_proto:
        attr = by_name[given.name]
        if attr.required:
            continue
        want = _default_attribute(attr)
        if given.type != want.type or _attribute_value(given) != _attribute_value(want):
            raise OpDefinitionError(
                f"{spec.qualname}: the function body declares attribute {given.name!r} with default "
                f"{_attribute_value(given)!r}, the op's default is {_attribute_value(want)!r} "
                f"({attr.type.value}); give the body the op's default, or none."
            )
    with_default = {a.name for a in fn.attribute_proto}
    plain = list(fn.attribute)
    del fn.attribute[:]
    for name in plain:
        attr = by_name[name]
        if attr.required:
            fn.attribute.append(name)
        elif name not in with_default:
            fn.attribute_proto.append(_default_attribute(attr))


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


# Versions at which an op's meaning changed while a node written for the previous version stays
# valid: a body is not moved across them, in either direction. Default changes of an existing
# attribute and deprecated versions are read from onnx's schema history instead (see _meaning_change).
_MEANING_CHANGED: dict[str, dict[int, str]] = {
    "Softmax": {13: "it normalises along 'axis' alone, no longer over all dims from 'axis' on"},
    "LogSoftmax": {13: "it normalises along 'axis' alone, no longer over all dims from 'axis' on"},
    "Hardmax": {13: "it takes the max along 'axis' alone, no longer over all dims from 'axis' on"},
    "GroupNormalization": {21: "scale and bias are per channel, no longer per group"},
    "RoiAlign": {16: "its new coordinate_transformation_mode defaults to half_pixel, unlike version 10"},
    "GridSample": {20: "its modes are named linear/cubic, no longer bilinear/bicubic"},
    "DFT": {20: "the axis moved from an attribute (default 1) to an input (default -2)"},
    "Split": {18: "splitting into equal parts needs the num_outputs attribute"},
    "Scan": {9: "the batch axis and the sequence_lens input were removed"},
}


def _default(attr: Any) -> Any:
    """The default of a schema attribute as a Python value (None: no default)."""
    value = attr.default_value
    return _attribute_value(value) if value.type else None


def _meaning_change(node: onnx.NodeProto, here: Any, there: Any) -> str | None:
    """Why ``node`` (valid under schema ``here``) would compute something else under ``there``; None if it would not."""
    low, high = sorted((here.since_version, there.since_version))
    for version, why in sorted(_MEANING_CHANGED.get(node.op_type, {}).items()):
        if low < version <= high:
            return f"it changed at version {version}: {why}"
    for schema in (here, there):
        if schema.deprecated:
            return f"version {schema.since_version} is deprecated in onnx's schema history"
    given = {a.name for a in node.attribute}
    for name in sorted((set(here.attributes) & set(there.attributes)) - given):
        before, after = _default(here.attributes[name]), _default(there.attributes[name])
        if before != after:
            return (
                f"the node leaves attribute {name!r} unset, whose default is {before!r} in version "
                f"{here.since_version} and {after!r} in version {there.since_version}"
            )
    return None


def _node_fits(node: onnx.NodeProto, opset: int) -> bool:
    """Whether ``node`` is valid as written under ``opset``'s schema of its op.

    That schema must accept the node as written: every attribute it sets
    exists there with the same type, every required attribute is set, its
    input and output counts are allowed, and no required input is left empty.
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
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for name, formal in zip(node.input, schema.inputs):
        if formal.option != single:
            break
        if not name:
            return False
    return True


def _first_fitting_opset(node: onnx.NodeProto, after: int) -> int | None:
    """The version of the first schema of ``node``'s op newer than opset ``after`` that accepts the node
    as written; None when no newer one does."""
    import onnx

    for version in range(after + 1, onnx.defs.onnx_opset_version() + 1):
        try:
            if _node_fits(node, version):
                return int(onnx.defs.get_schema(node.op_type, version, "").since_version)
        except onnx.defs.SchemaError:
            continue
    return None


def _check_ops_in_opset(fn: onnx.FunctionProto, opset: int, qualname: str, builds_for_opset: bool) -> None:
    """An OpDefinitionError naming the first node of ``fn`` that ``opset`` has no schema for, or none that
    accepts it as written, while a newer opset does (an op, or an input, that ONNX added later). A body
    written for another opset whose op ``opset`` has in another version is left to :func:`_adapt_opset`."""
    import onnx

    written = next((e.version for e in fn.opset_import if e.domain in _DEFAULT_DOMAINS), opset)
    for node in walk_nodes(fn.node):
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        if not onnx.defs.has(node.op_type):
            import difflib

            names = sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == ""})
            close = difflib.get_close_matches(node.op_type, names, n=1)
            raise OpDefinitionError(
                f"{qualname}: the function body has a node of op type {node.op_type!r} in ONNX's domain, where "
                f"ONNX defines no such op{f' (did you mean {close[0]!r}?)' if close else ''}; correct the op type, "
                "or give a custom op its own domain (and an opset import for it in the body)."
            )
        try:
            if _node_fits(node, opset):
                continue
            present: int | None = int(onnx.defs.get_schema(node.op_type, opset, "").since_version)
        except onnx.defs.SchemaError:
            present = None
        if present is not None and written != opset:
            continue
        first = _first_fitting_opset(node, opset)
        if first is None:  # valid in no newer opset either: another check names it
            continue
        if present is None:
            what = f"ONNX op {node.op_type}, which exists from opset {first} on ({node.op_type}-{first})"
        else:
            attrs = sorted(a.name for a in node.attribute)
            what = (
                f"ONNX op {node.op_type} as {node.op_type}-{first} (opset {first} on) defines it, which "
                f"{node.op_type}-{present} does not accept (the node has {len(node.input)} input(s)"
                f"{f', attribute(s) {attrs}' if attrs else ''})"
            )
        other = (
            f" (the builder is given the opset: below {first} it may build the body otherwise)"
            if builds_for_opset
            else ""
        )
        raise OpDefinitionError(
            f"{qualname}: the function body uses {what}, but the model uses opset {opset}. Export at "
            f"opset_version={first} or later, or write the body without {node.op_type}-{first}{other}."
        )


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
    fix = (
        "Register a builder with an 'opset' parameter that builds the body for the model's opset, "
        f"or export with opset_version={written}."
    )
    for node in walk_nodes(fn.node):
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        try:
            here = onnx.defs.get_schema(node.op_type, written, "")
        except onnx.defs.SchemaError:
            here = None
        try:
            there = onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            there = None
        if here is None or there is None or (here.since_version != there.since_version and not _node_fits(node, opset)):
            raise OpDefinitionError(
                f"{qualname}: the function body is written for ONNX opset {written}, but the model uses opset "
                f"{opset}, and {node.op_type} is defined differently there (version "
                f"{here.since_version if here else None} vs {there.since_version if there else None}). {fix}"
            )
        if here.since_version != there.since_version:
            why = _meaning_change(node, here, there)
            if why is not None:
                raise OpDefinitionError(
                    f"{qualname}: the function body is written for ONNX opset {written}, but the model uses opset "
                    f"{opset}, and {node.op_type} means something else there (version {here.since_version} vs "
                    f"{there.since_version}): {why}. {fix}"
                )
    logger.debug("%s: body moved from opset %d to the model's opset %d", qualname, written, opset)
    entry.version = opset


def _check_ref_attrs(
    fn: onnx.FunctionProto, qualname: str, declared: set[str], types: Mapping[str, str] | None = None
) -> None:
    """An OpDefinitionError for a body node that refers to an attribute the op does not declare, or, with
    ``types`` (ONNX type name per attribute), as another type than the op declares it."""
    import onnx

    for node in walk_nodes(fn.node):
        for attr in node.attribute:
            if attr.ref_attr_name and attr.ref_attr_name not in declared:
                raise OpDefinitionError(
                    f"{qualname}: function body node {node.op_type} ({node.name or 'unnamed'}) refers to "
                    f"attribute {attr.ref_attr_name!r}, which the op does not declare; declare it as a "
                    "parameter of the op or remove the reference."
                )
            want = (types or {}).get(attr.ref_attr_name) if attr.ref_attr_name else None
            if want is not None and attr.type and onnx.AttributeProto.AttributeType.Name(attr.type) != want:
                got = onnx.AttributeProto.AttributeType.Name(attr.type)
                raise OpDefinitionError(
                    f"{qualname}: function body node {node.op_type} ({node.name or 'unnamed'}) takes the op's "
                    f"attribute {attr.ref_attr_name!r} as its {attr.name} ({got}), but the op declares it {want}; "
                    f"refer to it from an attribute of type {want} (ref_attr(name, {attr.ref_attr_name!r}, "
                    f"onnx.AttributeProto.{want})), or declare the parameter with the type the node needs."
                )


def _undefined_inputs(nodes: Sequence[onnx.NodeProto], defined: set[str]) -> Iterator[tuple[onnx.NodeProto, str]]:
    """``(node, name)`` for each input that no earlier value in scope defines (subgraphs included).

    ``defined`` grows by the outputs of ``nodes``.
    """
    import onnx

    for node in nodes:
        for name in node.input:
            if name and name not in defined:
                yield node, name
        for attr in node.attribute:
            graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for graph in graphs:
                inner = defined | {v.name for v in graph.input} | {t.name for t in graph.initializer}
                yield from _undefined_inputs(graph.node, inner)
                for out in graph.output:
                    if out.name not in inner:
                        yield node, out.name
        defined.update(name for name in node.output if name)


def _check_dataflow(fn: onnx.FunctionProto, qualname: str) -> None:
    """Every node input is defined before it is read, and every output of ``fn`` is produced."""
    defined = set(fn.input)
    for node, name in _undefined_inputs(fn.node, defined):
        raise OpDefinitionError(
            f"{qualname}: function body node {node.op_type} ({node.name or 'unnamed'}) reads {name!r}, which is "
            f"neither a function input {list(fn.input)} nor the output of an earlier node; write the nodes in "
            "order and name the value as the node that computes it does (or '' for an omitted optional input)."
        )
    missing = [name for name in fn.output if name not in defined]
    if missing:
        read = {name for node in walk_nodes(fn.node) for name in node.input}
        unused = sorted(name for node in fn.node for name in node.output if name and name not in read)
        raise OpDefinitionError(
            f"{qualname}: function body output(s) {missing} are never produced: no node writes them "
            f"(values computed but never read: {unused}); name the output of the node that computes it "
            "after the body's output."
        )


def _script_callees_inlined(builder: Any, proto: onnx.FunctionProto) -> onnx.FunctionProto:
    """``proto`` (an onnxscript function's) with the other ``@script`` functions it calls inlined: onnxscript
    writes those calls as nodes of its own domain (``this::helper``), whose bodies ``to_function_proto``
    leaves out, so the exported model would call functions it does not hold."""
    import onnx
    from onnx import helper

    from opbridge.model_io import inline_functions

    try:
        callees = list(builder.to_model_proto().functions)
    except Exception:  # (onnxscript cannot make a model of it: the body as it is, checked at export)
        return proto
    called = {(n.domain, n.op_type) for n in proto.node}
    if not any((f.domain, f.name) in called for f in callees):
        return proto
    untyped = [helper.make_value_info(name, onnx.TypeProto()) for name in proto.input]
    graph = helper.make_graph(
        list(proto.node), proto.name, untyped, [helper.make_value_info(n, onnx.TypeProto()) for n in proto.output]
    )
    imports = {o.domain: o.version for f in [proto, *callees] for o in f.opset_import}
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in imports.items()], functions=callees
    )
    inlined = inline_functions(model)
    out = onnx.FunctionProto()
    out.CopyFrom(proto)
    del out.node[:]
    out.node.extend(inlined.graph.node)
    used = {n.domain for n in out.node}
    del out.opset_import[:]
    out.opset_import.extend(helper.make_opsetid(d, v) for d, v in imports.items() if d in used or d == "")
    return out


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
            the op's spec (attribute defaults included), a node reads a value that
            nothing defines before it, an output is never produced, or the body
            cannot be expressed in ``opset``.
    """
    import onnx

    builder: Any = opdef.function_builder
    if builder is None:
        return None
    spec: OpSpec = opdef.spec
    try:
        if hasattr(builder, "to_function_proto"):
            proto = _script_callees_inlined(builder, builder.to_function_proto())
        elif _wants_opset(builder):
            proto = builder(spec, opset=opset if opset is not None else DEFAULT_BODY_OPSET)
        else:
            proto = builder(spec)
    except OpbridgeError:
        raise
    except Exception as exc:  # the user's builder
        raise OpDefinitionError(
            f"{spec.qualname}: its function body's builder {getattr(builder, '__name__', builder)!r} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
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
    _check_ref_attrs(fn, spec.qualname, names, {a.name: a.type.onnx_name for a in spec.attributes})
    _check_dataflow(fn, spec.qualname)
    _declare_defaults(fn, spec)
    if opset is not None:
        _check_ops_in_opset(fn, opset, spec.qualname, _wants_opset(builder))
        _adapt_opset(fn, opset, spec.qualname)
    return fn


def _model_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), None)


def attach_functions(model: onnx.ModelProto, ops: Iterable[OpDef]) -> list[str]:
    """Attach the bodies of ``ops`` to ``model`` as local functions (in place).

    Ops without a body, and ops whose function is already in the model, are
    skipped. A body that calls other opbridge ops brings their bodies along. Bodies
    are built for (or moved to) the model's default opset, and opset imports they
    need in other domains are added. Returns the qualified names of the functions
    attached.
    """
    from opbridge.definition import find_op

    have = {(f.domain, f.name) for f in model.functions}
    imports = {o.domain: o for o in model.opset_import}
    opset = _model_opset(model)
    attached: list[str] = []
    pending = list(ops)
    while pending:
        opdef = pending.pop(0)
        if (opdef.spec.domain, opdef.spec.name) in have:
            continue
        fn = function_proto(opdef, opset)
        if fn is None:
            continue
        versions = {o.domain: o.version for o in fn.opset_import}
        for node in walk_nodes(fn.node):
            if node.domain in _DEFAULT_DOMAINS or (node.domain, node.op_type) in have:
                continue
            callee = find_op(node.domain, node.op_type, versions.get(node.domain))
            if callee is not None and callee not in pending:
                pending.append(callee)
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
