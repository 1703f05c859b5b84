"""OpenVINO compatibility from its own ONNX frontend.

The model's local functions are inlined first (OpenVINO does not expand them),
then ``FrontEnd.convert_partially`` converts what it can and leaves an
``ONNXFrameworkNode`` for every op it has no conversion rule for. A node is
native when no framework node stands for it; a custom node with a body runs
when every op of its body converts; an opbridge op runs as an OpenVINO Python
op through opbridge's OpenVINO backend; anything else fails with the
frontend's "No conversion rule found".
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbridge.graph.compat._common import body_contexts, node_contexts
from opbridge.graph.compat._report import CompatReport, NodeVerdict

if TYPE_CHECKING:
    import onnx

__all__ = ["check_openvino", "unconverted_ops"]

logger = logging.getLogger(__name__)


def unconverted_ops(model: onnx.ModelProto, path: str | None = None) -> tuple[set[tuple[str, str]], str | None]:
    """``(domain, op_type)`` the OpenVINO ONNX frontend leaves unconverted, and a conversion error if it
    raised. ``path``: the model's file, converted as it is where the model has no local functions to
    inline (a model of 2 GiB or more cannot be written again in one piece)."""
    import onnx.inliner
    from openvino.frontend import FrontEndManager

    from opbridge.export import save_model_atomic

    tmp = tempfile.mkdtemp(prefix="opbridge_ov_")
    try:
        # an invalid model (a cycle, a dangling input, a recursive function) is a conversion error too
        try:
            if path is None or len(model.functions):
                inlined = onnx.inliner.inline_local_functions(model) if len(model.functions) else model
                path = str(save_model_atomic(inlined, Path(tmp) / "model.onnx"))
            fe = FrontEndManager().load_by_framework("onnx")
            # Keep the input model referenced while the converted one lives: the frontend does not own it.
            input_model = fe.load(str(path))
            converted = fe.convert_partially(input_model)
        except Exception as exc:
            return set(), str(exc).strip()
        missing = set()
        for op in converted.get_ordered_ops():
            if op.get_type_name() == "ONNXFrameworkNode":
                attrs = op.get_attributes()
                domain = attrs.get("ONNX_META_domain", "")
                missing.add(
                    ("" if domain == "ai.onnx" else domain, attrs.get("ONNX_META_type", op.get_friendly_name()))
                )
        del converted, input_model
        return missing, None
    finally:
        for f in Path(tmp).iterdir():
            f.unlink()
        os.rmdir(tmp)


def check_openvino(model: onnx.ModelProto, *, real: bool = True, path: str | None = None) -> CompatReport:
    """Per-node OpenVINO verdicts from a partial conversion by OpenVINO's ONNX frontend.

    ``real`` is accepted for symmetry: the verdicts already come from OpenVINO itself.
    """
    import openvino

    missing, error = unconverted_ops(model, path)
    nodes: list[NodeVerdict] = []
    for ctx in node_contexts(model):

        def add(verdict: Any, reason: str, ctx: Any = ctx) -> None:
            nodes.append(NodeVerdict(ctx.label, ctx.domain, ctx.op_type, verdict, reason))

        key = ("" if ctx.domain == "ai.onnx" else ctx.domain, ctx.op_type)
        no_rule = f"No conversion rule found for operations: {(ctx.domain + '.') if ctx.domain else ''}{ctx.op_type}"
        if ctx.opbridge_mismatch():
            no_rule += f" ({ctx.opbridge_mismatch()})"
        if ctx.has_function:
            # the body's ops, and those of the functions it calls, as inlined
            unconverted = [
                c
                for c in body_contexts(ctx)
                if ("" if c.domain == "ai.onnx" else c.domain, c.op_type) in missing and not c.has_function
            ]
            bad = sorted({c.op_type for c in unconverted})
            uncovered = [c for c in unconverted if c.opbridge_op() is None and c.opbridge_kernel() is None]
            if bad and (ctx.opbridge_op() is not None or ctx.opbridge_kernel() is not None):
                # opbridge's OpenVINO backend drops such a body and runs the op's Python kernel.
                add("opbridge", f"body ops without conversion rule: {bad}; OpenVINO Python op from opbridge's backend")
            elif bad and not uncovered:
                add("opbridge", f"body ops {bad} run as OpenVINO Python ops from opbridge's OpenVINO backend")
            elif bad:
                add("fail", f"body ops without conversion rule: {sorted({c.op_type for c in uncovered})}")
            else:
                add("function", "model-local function, inlined before conversion")
        elif ctx.index < 0 and ctx.custom:
            # the frontend's partial conversion does not list subgraph nodes: opbridge's Python ops serve
            # the ones it can run, in If/Loop bodies as in the main graph
            if ctx.opbridge_op() is not None or ctx.opbridge_kernel() is not None:
                add("opbridge", "OpenVINO Python op from opbridge's OpenVINO backend (inside a subgraph)")
            else:
                add("fail", no_rule)
        elif key in missing:
            if ctx.custom and ctx.opbridge_op() is not None:
                add("opbridge", "OpenVINO Python op from opbridge's OpenVINO backend")
            else:
                add("fail", no_rule)
        else:
            add("native", "converted by the ONNX frontend")
    report = CompatReport(
        "openvino", f"openvino {openvino.__version__} ONNX frontend", nodes, "OpenVINO ONNX frontend", None
    )
    if error is not None:
        report.real_ok = False
        report.notes.append(f"conversion raised: {error.splitlines()[0]}")
    return report
