"""ONNX Runtime compatibility from the installed onnxruntime's own op schemas, plus a real session.

Standard and contrib nodes are checked against the operator schemas of the
installed onnxruntime (``get_all_operator_schema``, the schemas its kernels are
registered against) at the model's opset. Custom nodes run when the model
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
from typing import TYPE_CHECKING

from opbridge.graph.compat._common import NodeContext, body_contexts, node_contexts
from opbridge.graph.compat._report import CompatReport, NodeVerdict

if TYPE_CHECKING:
    import onnx

__all__ = ["check_onnxruntime", "ort_schemas"]

logger = logging.getLogger(__name__)


@functools.cache
def ort_schemas() -> dict[tuple[str, str], tuple[int, ...]]:
    """``(domain, op_type) -> since_versions`` known to the installed onnxruntime."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    out: dict[tuple[str, str], list[int]] = {}
    for s in C.get_all_operator_schema():
        out.setdefault((s.domain, s.name), []).append(int(s.since_version))
    return {k: tuple(sorted(v)) for k, v in out.items()}


def _verdict(ctx: NodeContext) -> NodeVerdict:
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
    inferencing failed: ..."): a container is blamed only where nothing its subgraphs hold is."""
    found = set()
    for ctx in contexts:
        name = ctx.proto.name
        quoted = bool(name) and any(
            q in error for q in (f"({name})", f"'{name}'", f'"{name}"', f"Name: {name} ", f"Name:{name} ")
        )
        if quoted or any(f"{c}{ctx.op_type}(" in error for c in ": ") or f" {ctx.op_type} " in error:
            found.add(ctx.label)
    carriers = {owner for ctx in contexts if ctx.label in found for owner in ctx.owners}
    return found - carriers


def check_onnxruntime(model: onnx.ModelProto, *, real: bool = True, path: str | None = None) -> CompatReport:
    """Per-node ONNX Runtime verdicts; with ``real``, an ``InferenceSession`` attempt (without opbridge's
    bridge) on ``path``, the model's file, where given."""
    import onnxruntime as ort

    contexts = node_contexts(model)
    nodes = [_verdict(ctx) for ctx in contexts]
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
    first = "" if error is None else error.splitlines()[0]
    report.nodes = [
        replace(n, real="ok" if error is None else f"fail: {_clip(first)}" if n.node in blamed else "no error reported")
        for n in nodes
    ]
    if error is not None and (not blamed or _clip(first) != first):
        report.notes.append(f"session failed: {first}")  # (whole, where a cell cut it)
    return report
