"""``opbridge compat``: what a runtime will do with each node of a model.

One module per target behind one function shape, ``check_<target>(model, *, real) -> CompatReport``:

* :mod:`.tensorrt`: static rules from the TensorRT ONNX parser's documented behaviour, with
  the TensorRT versions each applies to; plus the real parser when available.
* :mod:`.onnxruntime`: the installed onnxruntime's op schemas, plus a real session attempt.
* :mod:`.openvino`: OpenVINO's ONNX frontend, converting the model partially.

Example:
    >>> from onnx import helper, TensorProto
    >>> n = helper.make_node("Relu", ["x"], ["y"], name="r")
    >>> g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    >>> [n.verdict for n in check_compat(m, "onnxruntime").nodes]
    ['native']
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from opbridge.errors import BackendUnavailableError, OpbridgeError
from opbridge.graph.compat._report import CompatReport, NodeVerdict, Verdict

if TYPE_CHECKING:
    import onnx

__all__ = ["TARGETS", "CompatReport", "NodeVerdict", "Verdict", "check_compat"]

TARGETS = ("tensorrt", "onnxruntime", "openvino")


def check_compat(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    target: str,
    *,
    real: bool = True,
    trt_version: str | int | None = None,
) -> CompatReport:
    """What ``target`` does with each node of ``model``.

    Args:
        model: a path, a serialized model (bytes) or a loaded model.
        target: ``"tensorrt"``, ``"onnxruntime"`` or ``"openvino"``.
        real: also ask the real backend when it is installed (OpenVINO's verdicts come from OpenVINO
            either way: it has no static rules).
        trt_version: TensorRT version the static rules are evaluated for (newest when None).

    Raises:
        OpbridgeError: unknown target. BackendUnavailableError: the target's package is not installed.
    """
    import onnx

    from opbridge.graph._model import SMALL_TENSOR_BYTES, ensure_builtin_ops, load_model

    ensure_builtin_ops()
    path = None if isinstance(model, (onnx.ModelProto, bytes, bytearray, memoryview)) else str(model)
    # from a file, its weights stay there and the real backends read the file itself; OpenVINO's check
    # (run with real=False too: it has no static rules) converts a copy with the local functions inlined,
    # which needs the weights
    whole = path is None or target == "openvino"
    proto = load_model(model) if whole else load_model(model, external_data=SMALL_TENSOR_BYTES)
    if path is None:  # (tensors in data files a ModelProto does not hold: named, not taken for a faulty graph)
        from opbridge.model_io import refuse_unread_external_data

        refuse_unread_external_data(proto, "check_compat")
    if target == "tensorrt":
        from opbridge.graph.compat.tensorrt import check_tensorrt

        report = check_tensorrt(proto, version=trt_version, real=real, path=path)
    elif target == "onnxruntime":
        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailableError("onnxruntime is not installed: pip install onnxruntime") from exc
        from opbridge.graph.compat.onnxruntime import check_onnxruntime

        report = check_onnxruntime(proto, real=real, path=path)
    elif target == "openvino":
        try:
            import openvino  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailableError("openvino is not installed: pip install 'opbridge[openvino]'") from exc
        from opbridge.graph.compat.openvino import check_openvino

        report = check_openvino(proto, real=real, path=path)
    else:
        raise OpbridgeError(f"unknown compat target {target!r}; choose one of {', '.join(TARGETS)}.")
    return _fail_recursive_calls(report, proto)


def _recursive_functions(model: onnx.ModelProto) -> dict[tuple[str, str, str], str]:
    """The model-local functions that call themselves, directly or through others, by (domain, name,
    overload), each with the cycle in words (``acme::A -> acme::B -> acme::A``): ONNX forbids them, and no
    runtime expands one (TensorRT's parser crashed on one). Overloads of one name are functions of their own."""
    from opbridge.graph._model import function_key
    from opbridge.model_io import walk_nodes

    calls: dict[tuple[str, str, str], list[tuple[str, str, str]]] = {}
    for fn in model.functions:
        callees = calls.setdefault(function_key(fn), [])
        callees += [function_key(n) for n in walk_nodes(fn.node)]
    found: dict[tuple[str, str, str], str] = {}
    for start in calls:
        path, stack, seen = [start], [iter(calls[start])], {start}
        while stack:  # depth first, without recursion
            callee = next(stack[-1], None)
            if callee is None:
                stack.pop()
                path.pop()
                continue
            if callee == start:
                found[start] = " -> ".join(f"{d}::{n}" + (f":{o}" if o else "") for d, n, o in [*path, start])
                break
            if callee in calls and callee not in seen:
                seen.add(callee)
                path.append(callee)
                stack.append(iter(calls[callee]))
    return found


def _fail_recursive_calls(report: CompatReport, model: onnx.ModelProto) -> CompatReport:
    """``report`` with every node that calls a recursive model-local function failed (the static rules
    took its body for one a runtime expands)."""
    import dataclasses

    from opbridge.graph._model import function_key, labelled_nodes

    recursive = _recursive_functions(model) if len(model.functions) else {}
    if not recursive:
        return report
    keys = {path + name: function_key(node) for path, name, node, _ in labelled_nodes(model)}
    for k, verdict in enumerate(report.nodes):
        cycle = recursive.get(keys.get(verdict.node, (verdict.domain, verdict.op_type, "")))
        if cycle is not None and verdict.verdict != "fail":
            report.nodes[k] = dataclasses.replace(
                verdict,
                verdict="fail",
                reason=f"model-local function {verdict.domain}::{verdict.op_type} calls itself ({cycle}): ONNX "
                "forbids recursive functions and no runtime expands one; define the op without recursion",
            )
    return report
