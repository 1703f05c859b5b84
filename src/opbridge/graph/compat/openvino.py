"""OpenVINO compatibility from its own ONNX frontend.

The model's local functions are inlined first (OpenVINO does not expand them),
then ``FrontEnd.convert_partially`` converts what it can, in the graph and the
If/Loop/Scan bodies, and leaves an ``ONNXFrameworkNode`` for every op it has no
conversion rule for, and a ``NotSupportedONNXNode`` for every node whose rule
failed on it (a Scan whose body reads an outer-scope value). A node is native
when no such node stands for it; one whose rule failed fails with the
frontend's message; a custom node with a body runs when every op of its body
converts; an opbridge op runs as an OpenVINO Python op through opbridge's
OpenVINO backend; anything else fails with the frontend's "No conversion rule
found".
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbridge.graph.compat._common import FunctionIndex, body_contexts, node_contexts
from opbridge.graph.compat._report import CompatReport, NodeVerdict
from opbridge.model_io import walk_nodes

if TYPE_CHECKING:
    import onnx

__all__ = ["Conversion", "check_openvino", "convert_partially", "unconverted_ops"]

logger = logging.getLogger(__name__)


@dataclass
class Conversion:
    """What OpenVINO's partial conversion left: ``no_rule``, the ``(domain, op_type)`` of the
    ``ONNXFrameworkNode`` s (no conversion rule); ``failed``, the output names of the nodes whose rule
    failed (a ``NotSupportedONNXNode``), and ``failed_ops`` the ``(domain, op_type)`` of those that come
    from an inlined function body; ``messages``, the
    frontend's message for each failed node, by the name it gives the node (its name, or its first
    output's); ``error``, a conversion error if it raised; ``compile_error``, what OpenVINO's CPU plugin
    raised compiling a model that converted whole (no node left unconverted), where it was asked to."""

    no_rule: set[tuple[str, str]] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    failed_ops: set[tuple[str, str]] = field(default_factory=set)
    messages: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    compile_error: str | None = None

    def failure(self, node: onnx.NodeProto) -> str | None:
        """The frontend's message where its conversion rule failed on ``node`` ("" when it gave none), or None."""
        if not any(name in self.failed for name in node.output):
            return None
        for name in (node.name, *node.output):
            if name and name in self.messages:
                return self.messages[name]
        return ""


def _bodies(op: Any) -> list[Any]:
    """The bodies of an OpenVINO If, Loop or TensorIterator (where the frontend converts ONNX subgraphs)."""
    if hasattr(op, "get_then_body"):
        return [b for b in (op.get_then_body(), op.get_else_body()) if b is not None]
    if not hasattr(op, "get_function"):
        return []
    try:
        body = op.get_function()
    except TypeError:  # (If-like ops take the body's index)
        body = op.get_function(0)
    return [] if body is None else [body]


def _after_unconverted(op: Any) -> bool:
    """Whether ``op`` computes on what an unconverted node gives (whose element type the frontend does not
    know: "Unsupported input type dynamic"); that node, which opbridge's OpenVINO backend may run as a
    Python op of known type, decides then, not this one's failed rule."""
    pending = [value.get_node() for value in op.input_values()]
    seen: set[str] = set()
    while pending:
        node = pending.pop()
        if node.get_name() in seen:
            continue
        seen.add(node.get_name())
        if node.get_type_name() in ("ONNXFrameworkNode", "NotSupportedONNXNode"):
            return True
        pending += [value.get_node() for value in node.input_values()]
    return False


def _failure_messages(text: str) -> dict[str, str]:
    """The node -> message of each "-- Op-N with a message:" block of a failed full conversion (the node
    as the frontend names it in "<Node(Op): name>": its name, or its first output's)."""
    out = {}
    for block in re.finditer(r"^-- (\S+?)-\d+ with a message:\n(.*?)(?=^-- |^Summary:|\Z)", text, re.M | re.S):
        lines = [line.strip() for line in block.group(2).splitlines() if line.strip()]
        named = re.search(r"<Node\((?:[^)]*)\): ([^>]*)>", block.group(2))
        if lines:
            out[named.group(1) if named else block.group(1)] = lines[-1]
    return out


def convert_partially(model: onnx.ModelProto, path: str | None = None, *, compile: bool = False) -> Conversion:
    """What the OpenVINO ONNX frontend leaves unconverted, in the graph and the If/Loop/Scan bodies.
    ``path``: the model's file, converted as it is where the model has no local functions to inline (a
    model of 2 GiB or more cannot be written again in one piece). With ``compile``, a model that converts
    whole is compiled for the CPU too (its plugin refuses some converted models: an If whose branches
    give outputs of different rank)."""
    from openvino.frontend import FrontEndManager

    from opbridge.export import save_model_atomic

    tmp = tempfile.mkdtemp(prefix="opbridge_ov_")
    try:
        # an invalid model (a cycle, a dangling input, a recursive function) is a conversion error too
        try:
            if path is None or len(model.functions):
                from opbridge.model_io import inline_functions

                inlined = inline_functions(model) if len(model.functions) else model
                path = str(save_model_atomic(inlined, Path(tmp) / "model.onnx"))
            fe = FrontEndManager().load_by_framework("onnx")
            # Keep the input model referenced while the converted one lives: the frontend does not own it.
            input_model = fe.load(str(path))
            converted = fe.convert_partially(input_model)
        except Exception as exc:
            return Conversion(error=str(exc).strip())
        result = Conversion()
        # a failed node that gives none of the graph's values comes from inside an inlined body (the
        # inliner renames a body's values, but the outputs of a body's last nodes are the call's, by which
        # check_openvino finds the call); only those are known by their op type alone
        own = {o for n in walk_nodes(model.graph.node) for o in n.output}
        pending = [converted]
        while pending:
            for op in pending.pop().get_ordered_ops():
                pending += _bodies(op)
                kind = op.get_type_name()
                if kind not in ("ONNXFrameworkNode", "NotSupportedONNXNode"):
                    continue
                attrs = op.get_attributes()
                domain = attrs.get("ONNX_META_domain", "")
                key = ("" if domain == "ai.onnx" else domain, attrs.get("ONNX_META_type", op.get_friendly_name()))
                if kind == "ONNXFrameworkNode":
                    result.no_rule.add(key)
                elif not _after_unconverted(op):  # a conversion rule that raised on this node, known by its outputs
                    names = {name for output in op.outputs() for name in output.get_names()}
                    result.failed.update(names)
                    if not names & own:  # a node of an inlined function body (the inliner renamed its outputs)
                        result.failed_ops.add(key)
        if compile and not result.no_rule and not result.failed:
            import openvino

            try:
                openvino.Core().compile_model(converted, "CPU")
            except Exception as exc:
                from opbridge.backends.openvino_backend import _first_line

                result.compile_error = _first_line(exc)
        del converted, input_model
        if result.failed:
            # the messages are only in the full conversion's error (a second conversion, of a model that fails)
            try:
                fe.convert(fe.load(str(path)))
            except Exception as exc:
                result.messages = _failure_messages(str(exc))
            logger.debug("OpenVINO conversion rules failed on %s: %s", sorted(result.failed_ops), result.messages)
        return result
    finally:
        for f in Path(tmp).iterdir():
            f.unlink()
        os.rmdir(tmp)


def unconverted_ops(model: onnx.ModelProto, path: str | None = None) -> tuple[set[tuple[str, str]], str | None]:
    """``(domain, op_type)`` the OpenVINO ONNX frontend has no conversion rule for, and a conversion error
    if it raised (:func:`convert_partially` has the nodes whose rule failed too)."""
    conversion = convert_partially(model, path)
    return conversion.no_rule, conversion.error


def _numpy_type(elem: int) -> bool:
    """Whether the ONNX element type ``elem`` has a numpy type (what OpenVINO's Python ops are handed)."""
    from opbridge._dtypes import onnx_to_numpy

    try:
        onnx_to_numpy(elem)
    except TypeError:
        return False
    return True


def check_openvino(model: onnx.ModelProto, *, real: bool = True, path: str | None = None) -> CompatReport:
    """Per-node OpenVINO verdicts from a partial conversion by OpenVINO's ONNX frontend.

    The verdicts come from OpenVINO itself; with ``real``, a model that converts whole is also compiled
    for the CPU, whose plugin refuses some converted models (its nodes of the op it names fail).
    """
    import openvino

    conversion = convert_partially(model, path, compile=real)
    missing, error = conversion.no_rule, conversion.error
    nodes: list[NodeVerdict] = []
    for ctx in node_contexts(model):

        def add(verdict: Any, reason: str, ctx: Any = ctx) -> None:
            untaken = ctx.untaken_outputs(_numpy_type) if verdict == "opbridge" else []
            if untaken:  # (opbridge's OpenVINO backend refuses the model at load)
                verdict, reason = (
                    "fail",
                    f"output {untaken[0][0]!r} is {untaken[0][1]}, which OpenVINO's Python ops do not take (numpy has "
                    "no such type): cast to float32 around the op for OpenVINO",
                )
            nodes.append(NodeVerdict(ctx.label, ctx.domain, ctx.op_type, verdict, reason))

        key = ("" if ctx.domain == "ai.onnx" else ctx.domain, ctx.op_type)
        no_rule = f"No conversion rule found for operations: {(ctx.domain + '.') if ctx.domain else ''}{ctx.op_type}"
        if ctx.opbridge_mismatch():
            no_rule += f" ({ctx.opbridge_mismatch()})"
        if ctx.unimported():  # (opbridge's OpenVINO backend refuses it as ONNX Runtime does)
            add("fail", ctx.unimported())
        elif ctx.has_function and key in missing:
            # onnx's inliner left the call in place (a function importing another opset version than the model,
            # or one that calls itself): OpenVINO meets the call itself, which it has no rule for
            left = (
                "onnx's inliner left this call of a model-local function in place (its opset imports differ from "
                "the model's, or it calls itself)"
            )
            if ctx.opbridge_op() is not None or ctx.opbridge_kernel() is not None:
                add("opbridge", f"{left}; OpenVINO Python op from opbridge's backend")
            else:
                add("fail", f"{left}: {no_rule}")
        elif ctx.has_function:
            # the body's ops, and those of the functions it calls, as inlined
            unconverted = [
                c
                for c in body_contexts(ctx)
                if ("" if c.domain == "ai.onnx" else c.domain, c.op_type) in missing and not c.has_function
            ]
            # a body node whose rule failed: one that gives the call's outputs is known by them; one inside
            # the body, whose outputs the inliner renamed, by its op type only
            function = (ctx.functions or FunctionIndex.of(ctx.model, ctx.ir_model)).by_key.get(
                (ctx.domain, ctx.op_type, getattr(ctx.proto, "overload", ""))
            )
            last = set(function.output) if function is not None and set(ctx.proto.output) & conversion.failed else set()
            broken = sorted(
                {
                    c.op_type
                    for c in body_contexts(ctx)
                    if ("" if c.domain == "ai.onnx" else c.domain, c.op_type) in conversion.failed_ops
                    or (c.function == f"{ctx.domain}::{ctx.op_type}" and set(c.proto.output) & last)
                }
            )
            bad = sorted({c.op_type for c in unconverted})
            uncovered = [c for c in unconverted if c.opbridge_op() is None and c.opbridge_kernel() is None]
            if (bad or broken) and (ctx.opbridge_op() is not None or ctx.opbridge_kernel() is not None):
                # opbridge's OpenVINO backend drops such a body and runs the op's Python kernel.
                why = f"body ops without conversion rule: {bad}" if bad else f"body ops {broken} fail to convert"
                add("opbridge", f"{why}; OpenVINO Python op from opbridge's backend")
            elif broken:
                add(
                    "fail",
                    f"OpenVINO's conversion rule failed on body op(s) {broken} (the full conversion refuses the model)",
                )
            elif bad and not uncovered:
                add("opbridge", f"body ops {bad} run as OpenVINO Python ops from opbridge's OpenVINO backend")
            elif bad:
                add("fail", f"body ops without conversion rule: {sorted({c.op_type for c in uncovered})}")
            else:
                add("function", "model-local function, inlined before conversion")
        elif (message := conversion.failure(ctx.proto)) is not None:
            # a rule exists but raised on this node (a Scan whose body reads an outer-scope value, say)
            add(
                "fail",
                f"OpenVINO's conversion rule for {ctx.op_type} failed on this node"
                + (f": {message}" if message else "")
                + " (the full conversion refuses the model)",
            )
        elif ctx.index < 0 and ctx.custom:
            # the frontend's partial conversion does not list subgraph nodes: opbridge's Python ops serve
            # the ones it can run, in If/Loop bodies as in the main graph
            if ctx.opbridge_op() is not None or ctx.opbridge_kernel() is not None:
                add("opbridge", "OpenVINO Python op from opbridge's OpenVINO backend (inside a subgraph)")
            else:
                add("fail", no_rule)
        elif key in missing:
            if ctx.custom and (ctx.opbridge_op() is not None or ctx.opbridge_kernel() is not None):
                add("opbridge", "OpenVINO Python op from opbridge's OpenVINO backend")
            else:
                add("fail", no_rule)
        else:
            add("native", "converted by the ONNX frontend")
    if conversion.compile_error is not None:
        # (the plugin names the op, "doesn't support If operation with dynamic rank": its nodes fail)
        named = {n.op_type for n in nodes if f"{n.op_type} operation" in conversion.compile_error}
        nodes = [
            replace(n, verdict="fail", reason=f"OpenVINO's CPU plugin refuses it: {conversion.compile_error}")
            if n.op_type in named
            else n
            for n in nodes
        ]
    report = CompatReport(
        "openvino",
        f"openvino {openvino.__version__} ONNX frontend",
        nodes,
        "OpenVINO ONNX frontend" + (" and CPU plugin" if real else ""),
        None,
    )
    if conversion.compile_error is not None:
        report.real_ok = False
        report.notes.append(f"compiling for the CPU raised: {conversion.compile_error}")
    if error is not None:
        from opbridge.backends.openvino_backend import _first_line

        report.real_ok = False
        # (its first line is often only "Check 'false' failed at src/frontends/...": the cause follows)
        report.notes.append(f"conversion raised: {_first_line(error)}")
    return report
