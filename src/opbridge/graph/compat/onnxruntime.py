"""ONNX Runtime compatibility from the installed onnxruntime's own op schemas, plus a real session.

Standard and contrib nodes are checked against the operator schemas of the
installed onnxruntime (``get_all_operator_schema``, the schemas its kernels are
registered against) at the model's opset, then against the kernels of its CPU
provider (``get_all_opkernel_def``) for the node's value types, with what ONNX
Runtime does where none fits: float16 runs in float32, an ONNX op's function
body is expanded (and its nodes checked). Custom nodes run when the model
carries their function body (ONNX Runtime expands model-local functions), or
through opbridge's kernel for an opbridge op or ``@opbridge.kernel``; else they
fail with ORT's "is not a registered function/op". With ``real=True`` an
``InferenceSession`` is created on the model and its error, if any, is
attributed to the node it names.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opbridge.graph.compat._common import NodeContext, body_contexts, node_contexts, resize_constants
from opbridge.graph.compat._report import CompatReport, NodeVerdict

if TYPE_CHECKING:
    import onnx

__all__ = ["check_onnxruntime", "ort_cpu_kernels", "ort_schemas"]

logger = logging.getLogger(__name__)


@functools.cache
def ort_schemas() -> dict[tuple[str, str], tuple[int, ...]]:
    """``(domain, op_type) -> since_versions`` known to the installed onnxruntime."""
    out: dict[tuple[str, str], list[int]] = {}
    for domain, name, since in _ort_schema_index():
        out.setdefault((domain, name), []).append(since)
    return {k: tuple(sorted(v)) for k, v in out.items()}


@functools.cache
def ort_cpu_kernels() -> dict[tuple[str, str], tuple[tuple[int, int, dict[str, frozenset[str]]], ...]]:
    """``(domain, op_type) -> ((first, last version, {type parameter: types}), ...)``: the kernels the
    installed onnxruntime's CPU provider registers (``get_all_opkernel_def``)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    out: dict[tuple[str, str], list[tuple[int, int, dict[str, frozenset[str]]]]] = {}
    for k in C.get_all_opkernel_def():
        if k.provider == "CPUExecutionProvider":
            first, last = k.version_range
            types = {name: frozenset(allowed) for name, allowed in k.type_constraints.items()}
            out.setdefault((k.domain, k.op_name), []).append((int(first), int(last), types))
    return {key: tuple(v) for key, v in out.items()}


@functools.cache
def _ort_schema_index() -> dict[tuple[str, str, int], Any]:
    """``(domain, op_type, since_version) -> schema`` of the installed onnxruntime (read once)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    return {(s.domain, s.name, int(s.since_version)): s for s in C.get_all_operator_schema()}


def _ort_schema(domain: str, op_type: str, since: int) -> Any:
    """The installed onnxruntime's schema of ``domain::op_type`` since version ``since`` (None if none)."""
    return _ort_schema_index().get((domain, op_type, since))


def _function_body(ctx: NodeContext, domain: str, since: int, opset: int | None) -> tuple[int, Any] | None:
    """``(version, body)``: the function body ONNX gives ``ctx``'s op (schema since ``since``) for a model
    importing ``opset``, which ONNX Runtime expands where its CPU provider has no kernel for the node
    (``body`` None where it cannot be made here: a context-dependent body of inputs of unknown types);
    None where ONNX gives none, or a body (not context-dependent) whose ops ONNX changed between the body's
    opset and ``opset``, which ONNX Runtime does not expand (measured: Elu's body, written for opset 18, at 19;
    Gelu-20's context-dependent body expands at 21)."""
    import onnx

    if domain not in ("", "ai.onnx.ml") or opset is None:
        return None
    try:  # (Any: onnx's stubs lack the function methods its binding has)
        schema: Any = onnx.defs.get_schema(ctx.op_type, since, domain)
    except onnx.defs.SchemaError:
        return None
    plain = [v for v in schema.function_opset_versions if v <= opset]
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not plain and not dependent:
        return None
    version = max(plain + dependent)
    names = [n for n in ctx.proto.input if n]
    known = ctx.elem_types()
    try:
        if version in plain:
            raw = schema.get_function_with_opset_version(opset)
        elif all(known.get(n) for n in names):
            types = [onnx.helper.make_tensor_type_proto(known[n], None).SerializeToString() for n in names]
            raw = schema.get_context_dependent_function_with_opset_version(
                version, ctx.proto.SerializeToString(), types
            )
        else:
            return version, None
        body = onnx.FunctionProto.FromString(raw)
    except Exception as exc:  # (a body onnx cannot make for this node: the real session judges it)
        logger.debug("no function body of %s for %s: %s", ctx.op_type, ctx.label, exc)
        return version, None
    for node in body.node if version in plain else ():  # (a context-dependent body is taken as made: Gelu-20's at 21)
        if node.domain in ("", "ai.onnx"):
            try:
                changed = onnx.defs.get_schema(node.op_type, version).since_version != (
                    onnx.defs.get_schema(node.op_type, opset).since_version
                )
            except onnx.defs.SchemaError:
                changed = True
            if changed:
                return None
    return version, body


def _body_failure(ctx: NodeContext, body: Any, depth: int) -> NodeVerdict | None:
    """The verdict on the first node of the function ``body`` of ``ctx``'s op that fails, the body expanded
    for the node's attributes and input types; None where none fails or it cannot be expanded."""
    import onnx

    from opbridge.model_io import inline_functions

    names = [n for n in ctx.proto.input if n]
    known = ctx.elem_types()
    if any(not known.get(n) for n in names):
        return None
    body = onnx.FunctionProto.FromString(body.SerializeToString())
    body.domain, body.name = "opbridge.expand", ctx.op_type
    call = onnx.NodeProto()
    call.CopyFrom(ctx.proto)
    call.domain = "opbridge.expand"
    graph = onnx.helper.make_graph(
        [call],
        "expanded",
        [onnx.helper.make_tensor_value_info(n, known[n], None) for n in dict.fromkeys(names)],
        [onnx.helper.make_tensor_value_info(n, known.get(n, 0), None) for n in ctx.proto.output if n],
    )
    # (ONNX Runtime runs the body's nodes at the model's opsets: nested bodies too)
    model_versions = {o.domain: o.version for o in ctx.model.opset_import}
    for entry in body.opset_import:
        entry.version = model_versions.get(entry.domain, entry.version)
    imports = [*body.opset_import, onnx.helper.make_opsetid("opbridge.expand", 1)]
    try:
        expanded = inline_functions(onnx.helper.make_model(graph, opset_imports=imports, functions=[body]))
    except Exception as exc:
        logger.debug("cannot expand the function body of %s for %s: %s", ctx.op_type, ctx.label, exc)
        return None
    return next((v for v in (_verdict(c, depth + 1) for c in node_contexts(expanded)) if v.verdict == "fail"), None)


def _type_names(types: Any) -> list[str]:
    """``{"tensor(float)", ...}`` -> ``["float", ...]``, sorted."""
    return sorted({t[len("tensor(") : -1] if t.startswith("tensor(") and t.endswith(")") else t for t in types})


def _kernel_gap(ctx: NodeContext, domain: str, since: int, depth: int = 0) -> NodeVerdict | None:
    """The verdict on a node whose op ONNX Runtime defines (schema since ``since``) where its CPU provider
    registers no kernel for the node's version and value types, else None. A float16 node without a kernel
    runs in float32 (ONNX Runtime casts around it), an ONNX op with a function body runs that body; an op
    the CPU provider has no kernel of in any version is left to the real session."""
    import onnx

    kernels = ort_cpu_kernels().get((domain, ctx.op_type), ())
    schema = _ort_schema(domain, ctx.op_type, since)
    if schema is None:
        return None
    # (ONNX Runtime takes a kernel registered from the schema's own version on, or one of a closed range that
    # covers it: an open-ended kernel from an earlier version does not run a later schema's node, as
    # RandomUniformLike-1's does not run RandomUniformLike-22's)
    here = [types for first, last, types in kernels if first == since or (first < since <= last < 2**31 - 1)]
    known = ctx.elem_types()
    bound: dict[str, set[str]] = {}
    for params, names in ((schema.inputs, ctx.proto.input), (schema.outputs, ctx.proto.output)):
        for i, name in enumerate(names):
            variadic = params and params[-1].option == params[-1].option.Variadic and i >= len(params) - 1
            param = params[-1] if variadic else params[i] if i < len(params) else None
            if param is not None and name and known.get(name):
                elem = onnx.TensorProto.DataType.Name(known[name]).lower()
                bound.setdefault(param.typeStr, set()).add(f"tensor({elem})")

    def fits(kernel: dict[str, frozenset[str]], values: dict[str, set[str]]) -> bool:
        return all(p not in kernel or types <= kernel[p] for p, types in values.items())

    if any(fits(k, bound) for k in here):
        return None
    as_float = {p: {"tensor(float)" if t == "tensor(float16)" else t for t in types} for p, types in bound.items()}
    name = f"{ctx.op_type}-{since}"
    if here and as_float != bound and any(fits(k, as_float) for k in here):
        return NodeVerdict(
            ctx.label,
            ctx.domain,
            ctx.op_type,
            "native",
            f"onnxruntime schema since opset {since}; its CPU provider has no float16 {name} kernel and runs it in "
            "float32, casting around it",
        )
    from opbridge.graph._model import opset_version

    given = _type_names(t for types in bound.values() for t in types)
    found = _function_body(ctx, domain, since, opset_version(ctx.model, domain))
    if found is not None:
        body_version, body = found
        which = f" for {', '.join(given)}" if given and kernels else ""
        runs = f"onnxruntime's CPU provider has no {name} kernel{which} and runs ONNX's function body"
        failed = _body_failure(ctx, body, depth) if body is not None and depth < 4 else None
        if failed is not None:
            return NodeVerdict(
                ctx.label,
                ctx.domain,
                ctx.op_type,
                "fail",
                f"{runs} of the op, whose {failed.op_type} node fails: {failed.reason}",
            )
        return NodeVerdict(
            ctx.label, ctx.domain, ctx.op_type, "function", f"{runs} of the op (written for opset {body_version})"
        )
    if not kernels:  # (no kernel in any version: an op ONNX Runtime handles otherwise, or not at all)
        return None
    if not here:
        spans = ", ".join(f"{first}-{last}" if last < 2**31 - 1 else f"{first} on" for first, last, _ in kernels)
        reason = f"onnxruntime's CPU provider has no {name} kernel (its {ctx.op_type} kernels cover opsets {spans})"
    else:
        offered = _type_names(t for k in here for p in bound for t in k.get(p, ()))
        reason = (
            f"onnxruntime's CPU provider has no {name} kernel for {', '.join(given)} (its kernels take "
            f"{', '.join(offered)}): cast around the node"
        )
    return NodeVerdict(ctx.label, ctx.domain, ctx.op_type, "fail", reason + ' ("Could not find an implementation")')


def _resize_refusal(ctx: NodeContext) -> str:
    """Why onnxruntime's CPU Resize refuses a linear or cubic node's constant scales (when the session is made)
    or sizes of a static input (when it runs) ("" where it takes them, or they are not known before): its
    ScalesValidation, as its message states it (onnxruntime 1.32, measured). Linear: 2-D and 3-D inputs; 4-D
    ones whose outermost two scales are 1, or the outermost and innermost; 5-D ones whose outermost two are
    1. Cubic: 2-D inputs; 4-D ones whose outermost two scales are 1, or the outermost and innermost with
    antialias or with the others >= 1. Also, whatever the scales: nearest with antialias (refused when the session
    is made), cubic without antialias on int8, uint8 and int32 data (fails when it runs)."""
    mode = ctx.attr("mode", "nearest")
    if ctx.op_type != "Resize":
        return ""
    antialias = bool(ctx.attr("antialias", 0))
    if mode == "nearest" and antialias:
        return (
            'onnxruntime\'s Resize refuses antialias=1 with mode "nearest" when the session is made ("when '
            'anti-aliasing is set, Resize only supports mode LINEAR and CUBIC"): set antialias=0'
        )
    if mode == "cubic" and not antialias and not ctx.function and ctx.proto.input:
        import onnx

        elem = ctx.elem_types().get(ctx.proto.input[0])
        if elem in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT32):
            name = onnx.TensorProto.DataType.Name(elem).lower()
            return (
                f"onnxruntime's cubic Resize fails on {name} data when it runs (its kernel writes float results: "
                '"Tensor type mismatch"; only with antialias=1 does it take them): cast the input to float first'
            )
    if mode not in ("linear", "cubic") or ctx.node is None or not ctx.node.inputs:
        return ""
    data = ctx.node.inputs[0]
    dims = list(data.shape) if data is not None and data.shape is not None else None
    if not dims:
        return ""
    rank = len(dims)
    axes = ctx.attr("axes")
    listed = [a % rank for a in axes] if axes is not None else list(range(rank))  # (scales of these; others 1)
    found = resize_constants(ctx)
    if "scales" in found:
        given, when = [float(v) for v in found["scales"].ravel()], "when the session is made"
    elif "sizes" in found:
        static = [d for a in listed if isinstance(d := dims[a], int) and d > 0]
        if len(static) != len(listed):  # (a dim known only when it runs)
            return ""
        given = [float(size) / d for size, d in zip(found["sizes"].ravel(), static)]
        when = "when it runs (from its sizes)"
    else:
        return ""
    if len(given) != len(listed):
        return ""
    scales = [1.0] * rank
    for axis, scale in zip(listed, given):
        scales[axis] = scale
    outer = rank >= 2 and scales[0] == scales[1] == 1.0
    ends = rank >= 2 and scales[0] == scales[-1] == 1.0
    if mode == "linear":
        taken = rank in (2, 3) or (rank == 4 and (outer or ends)) or (rank == 5 and outer)
        supports = "2-D and 3-D inputs, and 4-D ones whose outermost two (or outermost and innermost) scales are 1"
        supports += ", and 5-D ones whose outermost two are 1"
    else:
        taken = rank == 2 or (rank == 4 and (outer or (ends and (antialias or all(v >= 1 for v in scales)))))
        supports = "2-D inputs, and 4-D ones whose outermost two scales are 1 (or the outermost and innermost)"
    if taken:
        return ""
    return (
        f"onnxruntime's {mode} Resize refuses scales {scales} on a {rank}-D input {when} (ScalesValidation: it "
        f"takes {supports}): resize the innermost dims only"
    )


def _grid_sample_refusal(ctx: NodeContext) -> str:
    """Why onnxruntime's CPU GridSample refuses a node when it runs ("" where it does not): cubic mode on a
    5-D input ("Only support GridSample Cubic mode in 4-D cases", onnxruntime 1.32, measured)."""
    if ctx.op_type != "GridSample" or ctx.attr("mode", "linear") != "cubic" or ctx.node is None:
        return ""
    data = ctx.node.inputs[0] if ctx.node.inputs else None
    if data is None or data.shape is None or len(data.shape) != 5:
        return ""
    return (
        'onnxruntime\'s GridSample refuses mode "cubic" on a 5-D input when it runs ("Only support GridSample Cubic '
        'mode in 4-D cases"): sample volumes with mode "linear" or "nearest"'
    )


def _verdict(ctx: NodeContext, depth: int = 0) -> NodeVerdict:
    if ctx.unimported():
        return NodeVerdict(ctx.label, ctx.domain, ctx.op_type, "fail", ctx.unimported())
    domain = "" if ctx.domain == "ai.onnx" else ctx.domain
    versions = ort_schemas().get((domain, ctx.op_type))
    if versions and not (ctx.custom and domain == ""):
        version = ctx.version
        if ctx.function and domain == "":  # ONNX Runtime runs a body's ONNX ops at the model's opset
            from opbridge.graph._model import opset_version

            version = opset_version(ctx.model, "") or version
        usable = [v for v in versions if version is None or v <= version]
        if usable:
            gap = _kernel_gap(ctx, domain, max(usable), depth)
            if gap is not None and gap.verdict == "fail":
                return gap
            refusal = (_resize_refusal(ctx) or _grid_sample_refusal(ctx)) if domain == "" else ""
            if refusal:
                return NodeVerdict(ctx.label, ctx.domain, ctx.op_type, "fail", refusal)
            if gap is not None:
                return gap
            return NodeVerdict(
                ctx.label, ctx.domain, ctx.op_type, "native", f"onnxruntime schema since opset {max(usable)}"
            )
        return NodeVerdict(
            ctx.label,
            ctx.domain,
            ctx.op_type,
            "fail",
            f"onnxruntime defines {ctx.op_type} only from opset {versions[0]}, the model imports {version}"
            + (" (and runs the function body's ops at it)" if version != ctx.version else ""),
        )
    if ctx.has_function:
        if not ctx.function:  # ONNX Runtime expands the body (body_contexts: nested calls' too)
            failed = [v for v in map(_verdict, body_contexts(ctx)) if v.verdict == "fail"]
            if failed:
                return NodeVerdict(
                    ctx.label,
                    ctx.domain,
                    ctx.op_type,
                    "fail",
                    f"model-local function body, whose node {failed[0].node} fails: {failed[0].reason}",
                )
        if domain == "":
            return NodeVerdict(
                ctx.label,
                ctx.domain,
                ctx.op_type,
                "opbridge",
                f"model-local function {ctx.op_type} of the default domain, where ONNX Runtime looks up no function "
                '("is not a registered function/op"): opbridge.InferenceSession moves it into a domain of its own '
                "(in memory); for plain ONNX Runtime: opbridge rewrite MODEL -o OUT --rule legacy-domain",
            )
        return NodeVerdict(ctx.label, ctx.domain, ctx.op_type, "function", "model-local function body")
    if ctx.opbridge_op() is not None or ctx.opbridge_kernel() is not None:
        from opbridge.onnxruntime.session import _BRIDGED_TYPES

        untaken = ctx.untaken_outputs(lambda elem: elem in _BRIDGED_TYPES)
        if untaken:
            name, dtype = untaken[0]
            return NodeVerdict(
                ctx.label,
                ctx.domain,
                ctx.op_type,
                "fail",
                f"output {name!r} is {dtype}, which opbridge's ONNX Runtime bridge does not pass to kernels (numpy "
                "has no such type): cast to float32 around the op for ONNX Runtime",
            )
        what = "opbridge op" if ctx.opbridge_op() is not None else "@opbridge.kernel"
        return NodeVerdict(
            ctx.label, ctx.domain, ctx.op_type, "opbridge", f"{what}: runs through opbridge's ORT bridge"
        )
    where = ctx.domain or "the default domain"
    mismatch = ctx.opbridge_mismatch()
    return NodeVerdict(
        ctx.label,
        ctx.domain,
        ctx.op_type,
        "fail",
        f"{where}:{ctx.op_type} is not a registered function/op: no schema, function body or opbridge kernel"
        + (f" ({mismatch})" if mismatch else ""),
    )


def _clip(text: str, limit: int = 300) -> str:
    """``text`` for a table cell: cut at ``limit`` characters, with a mark where it was cut (the report's
    notes keep it whole)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _session_error(model: onnx.ModelProto, path: str | None) -> str | None:
    """The error of a plain session on the model (its file where given: a model of 2 GiB or more cannot
    be serialized in one piece, and ONNX Runtime reads its external data from beside the file)."""
    import onnxruntime as ort

    from opbridge.model_io import has_external_data, native_path

    if path is not None and native_path(path) is None:  # (a file name that is not UTF-8 text)
        if has_external_data(model):
            return (
                f"{path!r}: the file name holds bytes that are not UTF-8 text, which ONNX Runtime cannot open, and "
                "its external data is read from beside it: rename the file"
            )
        path = None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        source = path if path is not None else model.SerializeToString()
        ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return str(exc).strip()
    return None


def _blamed(error: str, contexts: list[NodeContext]) -> set[str]:
    """Labels of the nodes ``error`` names: by their own name as ONNX Runtime quotes it ("Node (name)",
    "Name:'name'", "Name: name "), or by op type (":Op(", " Op(", " Op "; "an implementation for Relu(14) node
    with name ''"). ONNX Runtime reports a failing node of
    an If/Loop/Scan body under the container too ("Node (if) Op (If) [TypeInferenceError] Graph attribute
    inferencing failed: ..."): a container is blamed only where nothing its subgraphs hold is. Where the
    error quotes nodes other than such containers, only those are blamed, not every node of their op type
    (two Identity nodes, one named in "an implementation for Identity(21) node with name 'a'")."""
    found: set[str] = set()
    quoted: set[str] = set()
    for ctx in contexts:
        name = ctx.proto.name
        if name and any(q in error for q in (f"({name})", f"'{name}'", f'"{name}"', f"Name: {name} ", f"Name:{name} ")):
            quoted.add(ctx.label)
        elif any(f"{c}{ctx.op_type}(" in error for c in ": ") or f" {ctx.op_type} " in error:
            found.add(ctx.label)
    carriers = {owner for ctx in contexts if ctx.label in found | quoted for owner in ctx.owners}
    if quoted - carriers:
        found = quoted
    return (found | quoted) - carriers


def _named_ops(error: str) -> set[str]:
    """The op types an ONNX Runtime error names as ``Op(version)`` ("an implementation for Max(13) node")."""
    import re

    return set(re.findall(r"\b([A-Z][A-Za-z0-9]*)\(\d+\)", error))


def _omitted_variadic(
    model: onnx.ModelProto, contexts: list[NodeContext], nodes: list[NodeVerdict]
) -> list[NodeVerdict]:
    """``nodes``, with those that leave out an input of a variadic list (``Sum(x, "")``) failed, and the calls
    of a function whose body does so (for every call, or for the calls that leave out what it reads there).
    onnx's checker passes them, and ONNX Runtime makes the session but crashes when it runs (Sum, Max, Mean
    end the process; Concat fails): the real column cannot see it."""
    from opbridge.graph._model import function_label
    from opbridge.model_io import omitted_variadic_inputs

    found = omitted_variadic_inputs(model)
    if not found:
        return nodes
    direct = dict(found)
    out = []
    for ctx, verdict in zip(contexts, nodes):
        words = direct.get(ctx.label)
        key = (ctx.domain, ctx.op_type, getattr(ctx.proto, "overload", ""))
        fn = ctx.functions.by_key.get(key) if ctx.functions is not None else None
        if words is None and fn is not None:
            inside = f"{function_label(fn)}/"
            words = next(
                (
                    w
                    for label, w in found
                    if label.startswith(inside) and (" where " not in w or f"{ctx.label!r} calls" in w)
                ),
                None,
            )
        if words is not None:
            reason = (
                f"{words}; ONNX Runtime makes the session, but crashes or fails when it runs (Sum, Max, Mean: the "
                "process ends)"
            )
            verdict = NodeVerdict(ctx.label, ctx.domain, ctx.op_type, "fail", reason)
        out.append(verdict)
    return out


def check_onnxruntime(model: onnx.ModelProto, *, real: bool = True, path: str | None = None) -> CompatReport:
    """Per-node ONNX Runtime verdicts; with ``real``, an ``InferenceSession`` attempt (without opbridge's
    bridge) on ``path``, the model's file, where given."""
    import onnxruntime as ort

    contexts = node_contexts(model)
    nodes = _omitted_variadic(model, contexts, [_verdict(ctx) for ctx in contexts])
    report = CompatReport("onnxruntime", f"onnxruntime {ort.__version__}", nodes)
    if not real:
        report.real_backend = "not run"
        return report
    error = _session_error(model, path)
    report.real_backend = f"InferenceSession (onnxruntime {ort.__version__}, no opbridge bridge)"
    report.real_ok = error is None
    report.real_includes_opbridge = False
    # ONNX Runtime quotes node names; a bare substring blamed a node named "error" or "const" for any
    # message holding that word
    blamed = set() if error is None else _blamed(error, contexts)
    if error is not None and not blamed:  # (an op of a function body the session expanded: "for Max(13) node")
        blamed = {n.node for n in nodes if any(f"whose {op} node fails" in n.reason for op in _named_ops(error))}
    first = "" if error is None else error.splitlines()[0]
    report.nodes = [
        replace(n, real="ok" if error is None else f"fail: {_clip(first)}" if n.node in blamed else "no error reported")
        for n in nodes
    ]
    if error is not None and (not blamed or _clip(first) != first):
        report.notes.append(f"session failed: {first}")  # (whole, where a cell cut it)
    return report
