"""Graph tools for ONNX files with custom ops: inspect, lint, compat, rewrite, view.

They work on any ``.onnx`` file, including ones opbridge did not export.

Example:
    >>> from onnx import helper, TensorProto
    >>> node = helper.make_node("Foo", ["x"], ["y"], domain="acme", name="foo")
    >>> g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    ...                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    >>> [c.op_type for c in inspect_model(m).custom_nodes], [f.code for f in lint_model(m)]
    (['Foo'], ['unknown-custom-op'])
"""

from __future__ import annotations

from opbridge.graph.compat import CompatReport, NodeVerdict, check_compat
from opbridge.graph.inspect import ModelReport, inspect_model
from opbridge.graph.lint import Finding, has_errors, lint_model
from opbridge.graph.rewrite import RULES, RewriteReport, RuleOutcome, rewrite_model
from opbridge.graph.view import serve_model

__all__ = [
    "RULES",
    "CompatReport",
    "Finding",
    "ModelReport",
    "NodeVerdict",
    "RewriteReport",
    "RuleOutcome",
    "check_compat",
    "has_errors",
    "inspect_model",
    "lint_model",
    "rewrite_model",
    "serve_model",
]
