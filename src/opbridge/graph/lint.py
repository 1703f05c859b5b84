"""``opbridge lint``: problems a runtime would hit, named before the user meets them.

Each finding has a severity (``error``, ``warning``, ``info``), a stable code,
the node it concerns, a message and a fix hint. The codes:

* ``custom-op-default-domain`` (error): a custom op in ONNX's default domain.
* ``domain-without-opset`` (error): a node's domain has no opset import.
* ``duplicate-node-name`` (error): two nodes of one graph share a name; ONNX Runtime refuses
  the model (the checker does not look at node names).
* ``omitted-variadic-input`` (error): a node leaves out (name ``""``) one of a variadic list's
  inputs (``Sum(x, "")``), in the graph or once the function bodies are inlined (a body reading
  an optional input that a call leaves out); the checker passes it, and ONNX Runtime crashes on
  some.
* ``opset-too-new`` (error): the model imports an ONNX opset newer than the installed onnx
  knows; runtimes refuse it.
* ``unknown-custom-op`` (warning): a custom node with no ONNX schema (nor an ONNX Runtime
  contrib schema), model function, opbridge op or opbridge kernel behind it.
* ``frozen-resize-scale`` (warning with export context, info without): a
  ``Resize`` whose scales/sizes are constants although the PyTorch source
  computed them from a tensor (a TracerWarning was raised while tracing), or,
  for a bare file, a cubic ``Resize`` with constant scales/sizes.
* ``traced-python-value`` (warning): a TracerWarning that no node explains.
* ``trt-int-attr-overflow`` (warning): an INT/INTS attribute of a node that
  TensorRT imports as a plugin holds a value outside int32; the parser
  narrows plugin fields to int32.
* ``trt-tensor-attr-dtype`` (warning): a TENSOR attribute of int64, bool or
  uint8 on such a node; the parser rejects it.
* ``attribute-type`` (warning): an INT/INTS attribute where the opbridge op declares FLOAT/FLOATS
  (a hand-written ``spatial_scale=1``): opbridge's backends take it as that float, the checker refuses
  it.
* ``attribute-value`` (error): an attribute of an opbridge op's node holds a value outside those the op
  takes (a ``Literal`` in its signature: ``mode="bogus"`` where it takes ``"avg"`` or ``"max"``); the
  checker passes it, and opbridge's backends refuse the node when they load the model.
* ``invalid-model`` (error): ``onnx.checker`` (full check, opbridge's schemas
  registered) refuses the model: a graph cycle, a value nothing produces, an
  IR version ONNX does not know, a recursive function, duplicate
  names... Every runtime refuses such a model. A node the checker names inside an If/Loop/Scan
  body or a function body is given by its label and its place (``at If node 'cond_1' then_branch >
  node 'Relu_3'``).

Nodes inside If/Loop/Scan bodies and inside model-local functions' bodies are checked too
(labelled ``owner/attribute/node`` and ``domain::Function/node``).

Example:
    >>> from onnx import helper, TensorProto
    >>> node = helper.make_node("MYSELU", ["x"], ["y"], name="act")
    >>> g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    ...                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    >>> [f.code for f in lint_model(helper.make_model(g))]
    ['custom-op-default-domain']
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from opbridge.graph._model import (
    SMALL_TENSOR_BYTES,
    bound_attributes,
    ensure_builtin_ops,
    evaluate_constant,
    function_key,
    function_keys,
    is_custom_node,
    labelled_nodes,
    load_model,
    opset_version,
)

if TYPE_CHECKING:
    import onnx

__all__ = ["LINT_CODES", "Finding", "Severity", "has_errors", "lint_model"]

logger = logging.getLogger(__name__)

Severity = Literal["error", "warning", "info"]

LINT_CODES: dict[str, str] = {
    "custom-op-default-domain": "a custom op in ONNX's default domain",
    "domain-without-opset": "a node's domain has no opset import",
    "function-opset-mismatch": "a model-local function imports another ONNX opset than the model",
    "duplicate-node-name": "two nodes of one graph share a name",
    "omitted-variadic-input": "a node leaves out one of a variadic list's inputs",
    "opset-too-new": "an ONNX opset newer than the installed onnx knows",
    "unknown-custom-op": "a custom node with no schema, function body, opbridge op or kernel",
    "frozen-resize-scale": "Resize scales/sizes frozen to constants at export",
    "traced-python-value": "a tracer warning no node explains",
    "trt-int-attr-overflow": "INT/INTS attribute outside int32 on a TensorRT plugin node",
    "trt-tensor-attr-dtype": "TENSOR attribute of int64/bool/uint8 on a TensorRT plugin node",
    "attribute-type": "an INT/INTS attribute where the opbridge op declares FLOAT/FLOATS",
    "attribute-value": "an attribute value outside those the opbridge op takes",
    "invalid-model": "onnx.checker refuses the model",
}

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# ONNX's domains but the default one: ops of them that ONNX does not define are never custom ops
_ONNX_OWN_DOMAINS = frozenset({"ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training"})
# What the checker refuses and ONNX Runtime runs; the check goes on past it on a copy without it
# (:func:`_message_past_gaps`): its demand for a shape on every graph input and output; a standard op reading
# a call of a function whose body holds a custom node (its inference types the call's outputs "null"); an
# INT attribute where an opbridge op declares FLOAT (attribute-type names it)
_UNSHAPED = "Field 'shape' of 'type' is required"
_NULL_TYPED = "expected to have type but instead is null"
_MISMATCHED_TYPE = "Mismatched attribute type"
# the checker's words (and protobuf's) for a model over 2 GiB in memory; not a word a model's names hold
_TOO_LARGE = re.compile(r"This protobuf of onnx model is too large \(>2GiB\)|exceeds maximum protobuf size of 2GB")
# checker messages left out: what custom-op-default-domain, domain-without-opset and the later-opset finding
# name already, and the demand for a shape that the copy past the gaps still meets
_COVERED = re.compile(
    r"No Op registered for .* with domain_version|No opset import for domain|No Opset registered for domain"
    r"|must specify opset_import|FunctionOp imports version|" + _UNSHAPED
)
_TRACER_VALUE = re.compile(
    r"Python (number|float|integer|boolean|index|value)|\.item\(\)|constant in the future", re.IGNORECASE
)


@dataclass(frozen=True)
class Finding:
    """One lint finding."""

    severity: Severity
    code: str
    node: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = f" [{self.node}]" if self.node else ""
        hint = f" (fix: {self.hint})" if self.hint else ""
        return f"{self.severity}: {self.code}{where}: {self.message}{hint}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def has_errors(findings: Iterable[Finding]) -> bool:
    """Whether any finding (of :func:`lint_model`) is an error."""
    findings = list(findings)
    stray = next((f for f in findings if not isinstance(f, Finding)), None)
    if stray is not None:
        raise TypeError(f"has_errors takes lint_model()'s findings, got a {type(stray).__name__}.")
    return any(f.severity == "error" for f in findings)


def _known_schema(domain: str, op_type: str, version: int | None) -> bool:
    import onnx

    try:
        return onnx.defs.has(op_type, version or 1, domain) if version else onnx.defs.has(op_type, domain)
    except TypeError:  # older onnx: has(op_type, domain) only
        return onnx.defs.has(op_type, domain)


def _coverage(model: onnx.ModelProto, node: onnx.NodeProto, functions: set[tuple[str, str, str]]) -> str | None:
    """What covers a custom node (schema, function of ``functions``, opbridge op, kernel), or None."""
    import opbridge

    version = opset_version(model, node.domain)
    if function_key(node) in functions:
        return "model function"
    if opbridge.find_op(node.domain, node.op_type, version) is not None:
        return "opbridge op"
    if opbridge.find_kernel(node.domain, node.op_type, version) is not None:
        return "opbridge kernel"
    from opbridge.legacy_domain import runs_default_domain_kernel

    if runs_default_domain_kernel(node.domain, node.op_type, version):  # (a node the legacy-domain rule moved)
        return "opbridge kernel"
    if node.domain not in ("", "ai.onnx") and _known_schema(node.domain, node.op_type, version):
        return "ONNX schema"
    if node.domain not in ("", "ai.onnx") and _ort_schema(node.domain, node.op_type):
        return "ONNX Runtime schema"
    return None


def _ort_schema(domain: str, op_type: str) -> bool:
    """Whether the installed onnxruntime defines ``domain::op_type`` (its contrib ops; False without it)."""
    try:
        from opbridge.graph.compat.onnxruntime import ort_schemas

        return (domain, op_type) in ort_schemas()
    except ImportError:
        return False


def _check_valid(model: onnx.ModelProto, path: str | None = None) -> list[Finding]:
    """``invalid-model``: the full checker with opbridge's schemas (custom ops without one are
    skipped by it; the other codes name those), on the file at ``path`` where the model is one (its
    weights are not read into memory, and a model of 2 GiB or more is checked too)."""
    import onnx

    import opbridge
    from opbridge.model_io import has_external_data, native_path

    opbridge.register_onnx_schemas()
    if path is not None and native_path(path) is None and not has_external_data(model):
        path = None  # (a file name that is not UTF-8, which the checker cannot open: the model in memory)
    message = _checker_message(lambda: onnx.checker.check_model(path if path is not None else model, full_check=True))
    if _UNSHAPED in message or _NULL_TYPED in message or _MISMATCHED_TYPE in message:
        message = _message_past_gaps(model)
    if message:
        if _COVERED.search(message) or _TOO_LARGE.search(message):
            # what other codes name, or a model over 2 GiB, which the checker cannot take in memory
            return []
        label, where = _checker_node(model, message)
        if "sparse_tensor(" in message and len(model.graph.sparse_initializer):
            # onnx's shape inference types a sparse initializer as sparse_tensor, which ONNX Runtime densifies
            # at load and runs
            return [
                Finding(
                    "warning",
                    "invalid-model",
                    label,
                    f"onnx.checker refuses the model: {message}{where}; the cause is its sparse initializer(s), which "
                    "onnx's shape inference types as sparse_tensor: ONNX Runtime densifies them and runs the model, "
                    "tools that follow the checker (and opbridge's rewrite rules) do not",
                    "make the sparse initializers dense (numpy_helper.to_array of each, as a plain initializer) "
                    "where another runtime or tool must load the model",
                )
            ]
        return [
            Finding(
                "error",
                "invalid-model",
                label,
                f"onnx.checker refuses the model: {message}{where}",
                "fix the graph (or re-export it); runtimes refuse what the checker refuses",
            )
        ]
    return []


def _check_attribute_types(model: onnx.ModelProto) -> list[Finding]:
    """``attribute-type``: an INT/INTS attribute where the opbridge op declares FLOAT/FLOATS (a whole
    number written by hand, as in MMDeploy's files). The checker refuses it; opbridge's sessions,
    the reference evaluator, OpenVINO and the TensorRT build take it as that float."""
    import onnx

    return [
        Finding(
            "warning",
            "attribute-type",
            label,
            f"attribute {attr.name!r} of {node.domain}::{node.op_type} is "
            f"{onnx.AttributeProto.AttributeType.Name(attr.type)} where the op declares {declared}; opbridge's "
            "backends take it as that float, and onnx.checker (and tools that follow it) refuse the model",
            f"store it as {declared} (helper.make_attribute({attr.name!r}, "
            f"{'[float(v) for v in values]' if declared == 'FLOATS' else 'float(value)'}))",
        )
        for label, node, attr, declared in _int_for_float_attributes(model)
    ]


def _check_attribute_values(model: onnx.ModelProto) -> list[Finding]:
    """``attribute-value``: an attribute of an opbridge op's node (in any graph or function body; one a body
    takes from its function's call, as each call binds it) holding a value outside the choices the op
    declares for it. An attribute of another type than declared is the checker's (``invalid-model``)."""
    import opbridge
    from opbridge.onnx_schema import attribute_values

    findings = []
    for path, name, node, fn in labelled_nodes(model):
        if node.domain in ("", "ai.onnx"):
            continue
        op = opbridge.find_op(node.domain, node.op_type, opset_version(fn if fn is not None else model, node.domain))
        declared = {a.name: a for a in op.spec.attributes if a.choices is not None} if op is not None else {}
        if op is None or not declared:
            continue
        for attr_name, proto, via in bound_attributes(model, node, fn):
            spec_attr = declared.get(attr_name)
            if spec_attr is None:
                continue
            given = {a.name: a for a in node.attribute} | {attr_name: proto}
            try:  # (typed and decoded as the backends read it)
                value = attribute_values(op.spec, getter=given.get, references=True)[attr_name]
            except ValueError:  # (another type than declared, or a required attribute missing: the checker's)
                continue
            outside = spec_attr.outside_choices(value)
            if not outside:
                continue
            shown = list(value) if spec_attr.type.is_list else value
            findings.append(
                Finding(
                    "error",
                    "attribute-value",
                    path + name,
                    f"attribute {attr_name!r} of {node.domain}::{node.op_type} is {shown!r}{via}"
                    + (f", holding {outside[0]!r}," if spec_attr.type.is_list else "")
                    + f" where the op takes {list(spec_attr.choices or ())}; opbridge's backends refuse the node "
                    "when they load the model",
                    f"set {attr_name!r} to one of {list(spec_attr.choices or ())} (re-export the model, or edit the "
                    "node's attribute)",
                )
            )
    return findings


def _check_tensor_types(model: onnx.ModelProto) -> list[Finding]:
    """``invalid-model`` for an initializer (of any graph) of a data type ONNX does not define, which the
    checker lets pass and ONNX Runtime refuses ("does not have valid data type")."""
    import onnx

    from opbridge.model_io import subgraphs

    known = set(onnx.TensorProto.DataType.values())
    graphs = [model.graph, *subgraphs(model.graph)]
    return [
        Finding(
            "error",
            "invalid-model",
            tensor.name,
            f"initializer {tensor.name!r} has data type {tensor.data_type}, which ONNX does not define (ONNX Runtime "
            "refuses the model)",
            "give it one of onnx.TensorProto.DataType's types (re-export the model)",
        )
        for graph in graphs
        for tensor in graph.initializer
        if tensor.data_type not in known
    ]


def _checker_message(check: Any) -> str:
    """What ``check()`` raises, as one line ("" where it passes): the checker's message runs over lines
    ("... input 'q' of node: \nname: n OpType: Relu\n is not output of any previous nodes.")."""
    try:
        check()
    except Exception as exc:
        return (" ".join(str(exc).split()) or type(exc).__name__)[:400]
    return ""


def _message_past_gaps(model: onnx.ModelProto) -> str:
    """The full checker's message on a copy of ``model`` (without the data of its large tensors) past what
    the checker refuses and ONNX Runtime runs ("" where the copy passes); the checker stops at the first
    error, and these hid every error after them:

    * a graph input or output without a shape: given ONNX shape inference's, or one of unknown dims where
      it gives none;
    * a call of a model-local function whose body holds a node without a schema (a custom op): its
      outputs come out of the checker's inference typed "null", which a standard op reading them refuses
      ("expected to have type but instead is null"), where a custom node outside a body is left untyped;
      the call is left as a custom node without a schema;
    * an INT/INTS attribute where an opbridge op declares FLOAT/FLOATS (``attribute-type`` names it).
    """
    import onnx

    from opbridge.model_io import on_files, strip_tensors

    light, held = strip_tensors(model, 1024)
    opaque = _opaque_functions(light)
    for _, _, node, _ in labelled_nodes(light):
        if function_key(node) in opaque:
            node.op_type += "__opaque_body"  # (no schema and no function of that name: the checker skips it)
    for _, _, attr, _ in _int_for_float_attributes(light):
        values = [float(v) for v in attr.ints] if attr.type == onnx.AttributeProto.INTS else None
        kind = onnx.AttributeProto.FLOATS if values is not None else onnx.AttributeProto.FLOAT
        number = float(attr.i)
        attr.ClearField("ints")
        attr.ClearField("i")
        attr.type = kind
        if values is not None:
            attr.floats.extend(values)
        else:
            attr.f = number
    try:
        inferred = {v.name: v.type for v in onnx.shape_inference.infer_shapes(light).graph.output}
    except Exception:  # (an inference error: the full check below names it)
        inferred = {}
    for value in [*light.graph.input, *light.graph.output]:
        tensor = value.type.tensor_type if value.type.HasField("tensor_type") else None
        if tensor is None or tensor.HasField("shape"):
            continue
        found = inferred.get(value.name)
        if found is not None and found.tensor_type.HasField("shape"):
            tensor.shape.CopyFrom(found.tensor_type.shape)
        else:  # (shape inference gave it no rank: the full check's own inference gives none either)
            tensor.shape.dim.add()
    message = on_files(
        light, held, lambda path: _checker_message(lambda: onnx.checker.check_model(path, full_check=True))
    )
    return "" if _UNSHAPED in message else message


def _opaque_functions(model: onnx.ModelProto) -> set[tuple[str, str, str]]:
    """The model-local functions whose bodies (their If/Loop/Scan bodies too, and the functions they call)
    hold a node of no ONNX schema (opbridge's registered) and no model-local function."""
    from opbridge.model_io import walk_nodes

    functions = {function_key(f): f for f in model.functions}

    def schemaless(node: onnx.NodeProto) -> bool:
        return function_key(node) not in functions and not _known_schema(node.domain, node.op_type, None)

    opaque = {key for key, fn in functions.items() if any(schemaless(n) for n in walk_nodes(fn.node))}
    grown = True
    while grown:  # (a body calling an opaque function is opaque)
        grown = False
        for key, fn in functions.items():
            if key not in opaque and any(function_key(n) in opaque for n in walk_nodes(fn.node)):
                opaque.add(key)
                grown = True
    return opaque


def _int_for_float_attributes(
    model: onnx.ModelProto,
) -> Iterator[tuple[str, onnx.NodeProto, onnx.AttributeProto, str]]:
    """``(label, node, attribute, declared)`` for each INT/INTS attribute of a node of an opbridge op (in any
    graph or function body) that the op declares FLOAT/FLOATS (``declared``)."""
    import onnx

    import opbridge

    kinds = {onnx.AttributeProto.INT: "FLOAT", onnx.AttributeProto.INTS: "FLOATS"}
    for path, name, node, fn in labelled_nodes(model):
        if node.domain in ("", "ai.onnx") or not any(a.type in kinds and not a.ref_attr_name for a in node.attribute):
            continue
        op = opbridge.find_op(node.domain, node.op_type, opset_version(fn if fn is not None else model, node.domain))
        if op is None:
            continue
        declared = {a.name: a.type.onnx_name for a in op.spec.attributes}
        for attr in node.attribute:
            if attr.type in kinds and not attr.ref_attr_name and declared.get(attr.name) == kinds[attr.type]:
                yield path + name, node, attr, kinds[attr.type]


def _body_nodes(model: onnx.ModelProto) -> list[tuple[str, str, onnx.NodeProto]]:
    """``(label, place, node)`` for each node of a subgraph or a model-local function's body: its lint label
    (``cond_1/then_branch/Relu_3``) and its place in words (``If node 'cond_1' then_branch``), outermost first."""
    from opbridge.graph._model import function_label, node_label

    found: list[tuple[str, str, onnx.NodeProto]] = []

    def walk(nodes: Any, prefix: str, place: str) -> None:
        for index, node in enumerate(nodes):
            label = prefix + node_label(node, index)
            if place:
                found.append((label, place, node))
            for attr in node.attribute:
                graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
                for k, sub in enumerate(graphs):
                    name = attr.name if len(graphs) == 1 else f"{attr.name}[{k}]"
                    here = f"{node.op_type} node {node_label(node, index)!r} {name}"
                    walk(sub.node, f"{label}/{name}/", f"{place} > {here}" if place else here)

    walk(model.graph.node, "", "")
    for fn in model.functions:
        walk(fn.node, f"{function_label(fn)}/", f"function {function_label(fn)}")
    return found


def _checker_node(model: onnx.ModelProto, message: str) -> tuple[str, str]:
    """The label of the subgraph or function-body node a checker message names (``name: Relu_3 OpType:
    Relu``; the checker names only that node and, for a subgraph, the outermost If/Loop/Scan), and a clause
    saying where it lives; ``("", "")`` for a node of the main graph or one the message does not name."""
    named = re.findall(r"[Nn]ame: (\S+) OpType: (\S+)", message)
    if not named:
        return "", ""
    body = _body_nodes(model)
    main = {(n.name, n.op_type) for n in model.graph.node}
    for name, op_type in named:  # innermost first
        places = [(label, place) for label, place, node in body if (node.name, node.op_type) == (name, op_type)]
        if (name, op_type) in main:
            places.insert(0, (name, "the main graph"))
        if len(places) > 1:
            return "", f" (node {name!r} is one of {', '.join(repr(label) for label, _ in places)})"
        if places:
            label, place = places[0]
            return (
                ("", "") if label == name and place == "the main graph" else (label, f" (at {place} > node {name!r})")
            )
    return "", ""


def _not_an_op_there(
    owner: onnx.ModelProto | onnx.FunctionProto, label: str, node: onnx.NodeProto, domain: str
) -> Finding | None:
    """The finding for a node of one of ONNX's domains whose op that domain does not define at the version
    ``owner`` (the model, or the function the node is in) imports: an op of a later opset of it
    (``invalid-model``), or, outside the default domain (whose ops ONNX does not define at all
    custom-op-default-domain names), no op of it at all (``custom-op-default-domain``). None where it is
    defined there."""
    from opbridge.legacy_domain import first_versions

    version = opset_version(owner, domain)
    since = first_versions(domain).get(node.op_type)
    if version is None or (since is not None and since <= version):
        return None
    where = f"ONNX's {domain} domain" if domain else "ONNX"
    if since is None:
        return Finding(
            "error",
            "custom-op-default-domain",
            label,
            f"{node.op_type} is not an op of {where}, a domain ONNX reserves for its own ops; the checker "
            "and every runtime reject it.",
            f"give the op a domain of its own (@opbridge.op('mydomain::{node.op_type}')) and export again, or "
            f"opbridge rewrite MODEL -o OUT --rule replace-op --map {domain}::{node.op_type}=mydomain::{node.op_type}",
        )
    if domain:
        return Finding(
            "error",
            "invalid-model",
            label,
            f"{node.op_type} is an op of {where} from opset {since} on, but the model imports {domain} "
            f"opset {version}: no runtime runs it there",
            f"import {domain} at opset {since} or later, or replace {node.op_type} by ops of opset {version}",
        )
    return Finding(
        "error",
        "invalid-model",
        label,
        f"{node.op_type} is an ONNX op from opset {since} on, but the model imports opset {version}: no "
        "runtime runs it there as ONNX's op",
        f"export at opset {since} or later (opset_version=...), or replace {node.op_type} by ops of opset "
        f"{version}; where it is a custom op of its own (a TorchScript-era g.op('{node.op_type}')), move it out of "
        "the default domain with opbridge rewrite MODEL -o OUT --rule legacy-domain",
    )


def _import_to_add(model: onnx.ModelProto, domain: str, default: int | None) -> int:
    """The version to import ``domain`` at, for a hint: the model's own import of it (a function must
    agree with the model), for ONNX's domain else the newest opset onnx knows, for an opbridge op's
    domain the op's version, else 1."""
    import opbridge

    theirs = next((o.version for o in model.opset_import if o.domain == domain), None)
    if domain == "":
        return default or _newest_onnx_opset() or 1
    if theirs is not None:
        return theirs
    versions = [op.spec.version for op in opbridge.all_ops() if op.spec.domain == domain]
    return max(versions, default=1)


def _check_domains(model: onnx.ModelProto) -> list[Finding]:
    from opbridge.legacy_domain import default_domain_functions, is_standard_op

    findings: list[Finding] = []

    def imports(owner: Any) -> set[str]:
        return {"" if o.domain == "ai.onnx" else o.domain for o in owner.opset_import}

    def key(fn: Any) -> Any:
        return None if fn is None else (fn.domain, fn.name, getattr(fn, "overload", ""))

    imported = {None: imports(model)} | {key(f): imports(f) for f in model.functions}
    local = function_keys(model)
    missing: dict[tuple[str, str], list[str]] = {}
    for path, name, node, fn in labelled_nodes(model):
        label = path + name
        domain = "" if node.domain == "ai.onnx" else node.domain
        if (
            domain == ""
            and not is_standard_op(node.op_type)  # (one of a later opset: invalid-model names it, with both fixes)
            and ("", node.op_type, getattr(node, "overload", "")) not in local
        ):
            findings.append(
                Finding(
                    "error",
                    "custom-op-default-domain",
                    label,
                    f"{node.op_type} is not an ONNX op but sits in the default domain; the checker and every "
                    'runtime reject it ("No Op registered for ...").',
                    "opbridge rewrite MODEL -o OUT --rule legacy-domain, or define the op as @opbridge.op('domain::Name')",
                )
            )
        if domain not in imported[key(fn)]:
            owner = "the model" if fn is None else f"function {fn.domain}::{fn.name}"
            missing.setdefault((owner, domain), []).append(label)
        elif (domain in _ONNX_OWN_DOMAINS or (domain == "" and is_standard_op(node.op_type))) and (
            domain,
            node.op_type,
            getattr(node, "overload", ""),
        ) not in local:
            finding = _not_an_op_there(model if fn is None else fn, label, node, domain)
            if finding is not None:
                findings.append(finding)
    for fn in default_domain_functions(model):
        findings.append(
            Finding(
                "error",
                "custom-op-default-domain",
                f"::{fn.name}",
                f"the model-local function {fn.name} is in the default domain, where the checker, ONNX Runtime and "
                f'onnx\'s reference evaluator look up no function: its calls fail ("No Op registered for {fn.name}").',
                "opbridge rewrite MODEL -o OUT --rule legacy-domain (it moves the function and its calls to a domain "
                "of their own)",
            )
        )
    default = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    for (owner, domain), labels in missing.items():
        findings.append(
            Finding(
                "error",
                "domain-without-opset",
                labels[0],
                f"domain {domain or 'ai.onnx'!r} is used by {len(labels)} node(s) but {owner} has no opset import "
                "for it.",
                f"add opset_import {{domain: {domain!r}, version: {_import_to_add(model, domain, default)}}} to "
                f"{owner} (opbridge.export adds it for opbridge ops)",
            )
        )
    for fn in model.functions:
        theirs = next((o.version for o in fn.opset_import if o.domain in ("", "ai.onnx")), None)
        if default is not None and theirs is not None and theirs != default:
            findings.append(
                Finding(
                    "error",
                    "function-opset-mismatch",
                    f"{fn.domain}::{fn.name}",
                    f"the function imports ONNX opset {theirs}, the model {default}: ONNX Runtime runs its body's "
                    "ops at the model's opset (where they may not exist or differ), and onnx's inliner, which "
                    "OpenVINO's path uses, leaves the function out; the checker refuses it only where an op of "
                    "the body changed between the two opsets.",
                    f"build the body for opset {default} (opbridge.export does), or export the model at opset {theirs}",
                )
            )
    newest = _newest_onnx_opsets()
    for entry in model.opset_import:
        domain = "" if entry.domain == "ai.onnx" else entry.domain
        known = newest.get(domain)
        if known is not None and entry.version > known:
            name = f"{domain} opset" if domain else "ONNX opset"
            findings.append(
                Finding(
                    "error",
                    "opset-too-new",
                    f"opset_import {domain or 'ai.onnx'}",
                    f"the model imports {name} {entry.version}; the installed onnx knows {domain or 'ONNX'} opsets up "
                    f"to {known}, and runtimes refuse opsets they do not know.",
                    f"export with opset_version <= {known}, or update onnx and the runtimes"
                    if not domain
                    else f"import {domain} at opset {known} or below, or update onnx and the runtimes",
                )
            )
    return findings


def _newest_onnx_opsets() -> dict[str, int]:
    """The newest opset of each of ONNX's domains that the installed onnx knows."""
    import onnx

    newest = {"ai.onnx.ml": int(onnx.defs.onnx_ml_opset_version())}
    newest.update({domain: 1 for domain in ("ai.onnx.preview", "ai.onnx.preview.training")})
    default = _newest_onnx_opset()
    if default is not None:
        newest[""] = default
    return newest


def _newest_onnx_opset() -> int | None:
    import onnx

    try:
        return int(onnx.defs.onnx_opset_version())
    except Exception:  # pragma: no cover - every onnx release has it
        return None


def _check_node_names(model: onnx.ModelProto) -> list[Finding]:
    """``duplicate-node-name``: two nodes of one graph (the main graph, a subgraph or a function body) with
    one name. ONNX Runtime refuses such a model ("two nodes with same node name")."""
    from collections import Counter

    # a node's path names its graph
    seen = Counter((path, node.name) for path, _, node, _ in labelled_nodes(model) if node.name)
    return [
        Finding(
            "error",
            "duplicate-node-name",
            where + name,
            f"{count} nodes{' of ' + where.rstrip('/') if where else ''} are named {name!r}; ONNX Runtime "
            "refuses the model (the ONNX checker does not check node names).",
            "give each node a name of its own (or clear the names)",
        )
        for (where, name), count in seen.items()
        if count > 1
    ]


def _check_omitted_inputs(model: onnx.ModelProto) -> list[Finding]:
    """``omitted-variadic-input``: ``Sum(x, "")`` and the like, in a graph or in a function body that reads
    an input a call leaves out."""
    from opbridge.model_io import omitted_variadic_inputs

    return [
        Finding(
            "error",
            "omitted-variadic-input",
            label,
            f"{found}; onnx.checker "
            "passes it, and ONNX Runtime may crash on it (Sum of an input left out ends the process).",
            "give the input, or make the function body handle a call that leaves the op's optional input out",
        )
        for label, found in omitted_variadic_inputs(model)
    ]


def _check_unknown(model: onnx.ModelProto) -> list[Finding]:
    findings = []
    functions = function_keys(model)
    opset = opset_version(model, "")
    for path, name, node, fn in labelled_nodes(model):
        # (an op ONNX does not define in one of its own domains is custom-op-default-domain's)
        if node.domain in ("", "ai.onnx", *_ONNX_OWN_DOMAINS) or not is_custom_node(node, opset):
            continue
        if _coverage(model, node, functions) is None:
            from opbridge.definition import later_op_note

            imports = {o.domain: o.version for o in model.opset_import}
            imports.update({o.domain: o.version for o in (fn.opset_import if fn is not None else ())})
            later = later_op_note(node.domain, node.op_type, imports.get(node.domain, 1))
            if later is not None:  # (the op is defined, at another version: "load its definition" would mislead)
                findings.append(
                    Finding(
                        "warning",
                        "unknown-custom-op",
                        path + name,
                        later,
                        "export the model again, or define the op at the model's version",
                    )
                )
                continue
            findings.append(
                Finding(
                    "warning",
                    "unknown-custom-op",
                    path + name,
                    f"{node.domain}::{node.op_type} has no ONNX schema, no function body in the model, and no "
                    "opbridge op or kernel; no runtime can run it without a plugin of its own.",
                    "load the op's definition with --ops FILE, attach a function body, or register @opbridge.kernel",
                )
            )
    return findings


def _resize_const_input(node_ir: Any, opset: int | None) -> tuple[str, Any] | None:
    """``(what, value)`` of the constant sizes or scales of an IR Resize node of ONNX ``opset``, if constant."""
    from opbridge.graph._model import resize_input_slots

    for idx, what in reversed(resize_input_slots(opset)):
        if len(node_ir.inputs) > idx and node_ir.inputs[idx] is not None:
            value = node_ir.inputs[idx]
            arr, _ = evaluate_constant(value, opset=opset)
            if arr is not None and arr.size > 0:
                return what, arr
    return None


def _resize_nodes(model: onnx.ModelProto) -> Iterator[tuple[str, Any, int | None, onnx.FunctionProto | None]]:
    """``(label, IR node, ONNX opset, the function whose body holds it or None)`` for each standard Resize node of
    ``model``'s graph, its If/Loop/Scan bodies and its model-local functions' bodies (labels as
    :func:`labelled_nodes` gives them)."""
    import onnx_ir as ir

    from opbridge.graph._model import function_label

    if not any(n.op_type == "Resize" and n.domain in ("", "ai.onnx") for _, _, n, _ in labelled_nodes(model)):
        return
    serde = logging.getLogger("onnx_ir.serde")
    level = serde.level
    serde.setLevel(logging.ERROR)  # (a model onnx_ir calls invalid is named by invalid-model)
    try:
        converted = ir.from_proto(model)
    except Exception as exc:
        logger.debug("resize check skipped: %s", exc)
        return
    finally:
        serde.setLevel(level)

    def walk(
        nodes: Iterable[Any], prefix: str, opset: int | None, fn: onnx.FunctionProto | None
    ) -> Iterator[tuple[str, Any, int | None, onnx.FunctionProto | None]]:
        for index, node in enumerate(nodes):
            label = prefix + (node.name or f"{node.op_type}#{index}")
            if node.op_type == "Resize" and node.domain in ("", "ai.onnx"):
                yield label, node, opset, fn
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.GRAPH:
                    yield from walk(attr.value, f"{label}/{attr.name}/", opset, fn)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for k, graph in enumerate(attr.value):
                        yield from walk(graph, f"{label}/{attr.name}[{k}]/", opset, fn)

    yield from walk(converted.graph, "", opset_version(model, ""), None)
    for fn in model.functions:
        body = converted.functions.get((fn.domain, fn.name, getattr(fn, "overload", "")))
        if body is not None:
            yield from walk(body, f"{function_label(fn)}/", opset_version(fn, "") or opset_version(model, ""), fn)


def _resize_mode(model: onnx.ModelProto, node: Any, fn: onnx.FunctionProto | None) -> str:
    """An IR Resize node's mode; in a function body, one taken from the function's attribute is what its
    calls bind it to: "cubic" where one of them does (the mode the findings are about), else the first."""
    from opbridge.graph._model import call_bindings

    attr = node.attributes.get("mode")
    if attr is None:
        return "nearest"
    if not attr.is_ref():
        return str(attr.as_string())
    bound = [a.s.decode("utf-8", "replace") for _, a in call_bindings(model, fn, attr.ref_attr_name)] if fn else []
    return "cubic" if "cubic" in bound else (bound[0] if bound else "nearest")


def _resize_hint(mode: str, what: str, in_function: bool) -> str:
    """How to make a frozen Resize follow its input again: the rewrite takes cubic Resize only, outside
    function bodies, its ``size_input`` any frozen scales or sizes, ``scale_input`` frozen scales only."""
    keep = "keep the scale a tensor in forward() (no .item()/float()) and export again"
    if mode != "cubic" or in_function:
        return keep
    option = "size_input=NAME" if what == "sizes" else "scale_input=NAME (or size_input=NAME)"
    return f"{keep}, or run opbridge rewrite --rule resize-cubic-to-dynamic-resize --option {option}"


def _check_resize(model: onnx.ModelProto, warnings: Sequence[Any] | None) -> list[Finding]:
    tracer = [
        w for w in (warnings or ()) if "TracerWarning" in str(getattr(w, "category", "")) or "TracerWarning" in str(w)
    ]
    value_warnings = [w for w in tracer if _TRACER_VALUE.search(str(getattr(w, "message", w)))]
    findings: list[Finding] = []
    explained = False
    for label, node, opset, fn in _resize_nodes(model):
        found = _resize_const_input(node, opset)
        if found is None:
            continue
        what, arr = found
        mode = _resize_mode(model, node, fn)
        in_function = fn is not None
        values = arr.tolist()
        if value_warnings:
            explained = True
            where = "; ".join(str(w) for w in value_warnings[:3])
            findings.append(
                Finding(
                    "warning",
                    "frozen-resize-scale",
                    label,
                    f"Resize ({mode}) has constant {what} {values}, and tracing warned that a tensor was turned "
                    f"into a Python value: the {what} were frozen at export and will not follow the input. "
                    f"Tracer warning: {where}",
                    _resize_hint(mode, what, in_function),
                )
            )
        elif mode == "cubic":
            findings.append(
                Finding(
                    "info",
                    "frozen-resize-scale",
                    label,
                    f"cubic Resize with constant {what} {values}: if the source computed them from a tensor "
                    "(e.g. interpolate(scale_factor=t.item())), they were frozen at export.",
                    "if the scale must vary, " + _resize_hint(mode, what, in_function),
                )
            )
    if value_warnings and not explained:
        for w in value_warnings:
            findings.append(
                Finding(
                    "warning",
                    "traced-python-value",
                    "",
                    f"tracing turned a tensor into a Python value; the exported graph holds a constant there: {w}",
                    "keep the value a tensor in forward(), or make it an attribute of a custom op",
                )
            )
    return findings


def _check_trt_attributes(model: onnx.ModelProto) -> list[Finding]:
    """Attributes the TensorRT ONNX parser narrows or rejects when it turns a node into plugin fields."""
    import onnx

    findings: list[Finding] = []
    opset = opset_version(model, "")
    local = {(f.domain, f.name) for f in model.functions}
    for path, name, node, fn in labelled_nodes(model):
        if not is_custom_node(node, opset) or (node.domain, node.op_type) in local:
            continue  # (TensorRT 10 imports a model-local function's body: its attributes become no plugin fields)
        # (an attribute a body's node takes from its function's call: the values the calls give it)
        for attr_name, attr, via in bound_attributes(model, node, fn):
            label = path + name + via
            if attr.type == onnx.AttributeProto.INT:
                bad = [attr.i] if not _INT32_MIN <= attr.i <= _INT32_MAX else []
            elif attr.type == onnx.AttributeProto.INTS:
                bad = [v for v in attr.ints if not _INT32_MIN <= v <= _INT32_MAX]
            elif attr.type == onnx.AttributeProto.TENSOR:
                if attr.t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.BOOL, onnx.TensorProto.UINT8):
                    dtype = onnx.TensorProto.DataType.Name(attr.t.data_type).lower()
                    findings.append(
                        Finding(
                            "warning",
                            "trt-tensor-attr-dtype",
                            label,
                            f"TENSOR attribute {attr_name!r} is {dtype}; TensorRT's ONNX parser rejects TENSOR plugin "
                            "fields of int64, bool and uint8.",
                            "store it as an int32/float32 tensor, or as an INTS/FLOATS attribute",
                        )
                    )
                continue
            else:
                continue
            if bad:
                findings.append(
                    Finding(
                        "warning",
                        "trt-int-attr-overflow",
                        label,
                        f"{'INT' if attr.type == onnx.AttributeProto.INT else 'INTS'} attribute {attr_name!r} holds "
                        f"{bad[0]}, outside int32; TensorRT's ONNX parser narrows "
                        "plugin fields to int32, so the plugin would see a wrong value.",
                        "keep the value within int32, or pass it as a FLOAT/STRING attribute or a tensor input",
                    )
                )
    return findings


def lint_model(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    *,
    warnings: Sequence[Any] | None = None,
    builtin_ops: bool = True,
) -> list[Finding]:
    """Lint ``model`` and return its findings, errors first.

    Args:
        model: a path, a serialized model (bytes) or a loaded ``onnx.ModelProto``.
        warnings: warnings captured while exporting the model
            (``ExportResult.warnings``); TracerWarnings are reported against
            the node they explain.
        builtin_ops: define opbridge's built-in ops (:mod:`opbridge.ops`) first, so that
            their nodes count as known.
    """
    path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    # (from a file: its weights stay there; the checker reads the file itself)
    proto = load_model(model, external_data=SMALL_TENSOR_BYTES) if path is not None else load_model(model)
    if path is None:  # (tensors in data files a ModelProto does not hold: named, not taken for a faulty graph)
        from opbridge.model_io import refuse_unread_external_data

        refuse_unread_external_data(proto, "lint_model")
    if builtin_ops:
        ensure_builtin_ops()
    findings = _check_valid(proto, path)
    findings += _check_tensor_types(proto)
    findings += _check_attribute_types(proto)
    findings += _check_attribute_values(proto)
    findings += _check_domains(proto)
    findings += _check_node_names(proto)
    findings += _check_omitted_inputs(proto)
    findings += _check_unknown(proto)
    findings += _check_resize(proto, warnings)
    findings += _check_trt_attributes(proto)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.severity])
