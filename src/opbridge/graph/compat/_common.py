"""What every target needs to know about a node: its opset, its coverage by opbridge, constants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

__all__ = ["NodeContext", "node_contexts"]


@dataclass
class NodeContext:
    """One main-graph node with what the rules look at."""

    index: int
    label: str
    proto: onnx.NodeProto
    node: ir.Node
    model: onnx.ModelProto
    version: int | None
    has_function: bool
    custom: bool

    @property
    def domain(self) -> str:
        return self.proto.domain

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def opbridge_op(self) -> Any:
        import opbridge

        return opbridge.find_op(self.domain, self.op_type, self.version)

    def opbridge_kernel(self) -> Any:
        import opbridge

        return opbridge.find_kernel(self.domain, self.op_type, self.version)

    def attr(self, name: str, default: Any = None) -> Any:
        import onnx

        for a in self.proto.attribute:
            if a.name == name:
                value = onnx.helper.get_attribute_value(a)
                return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
        return default


def node_contexts(model: onnx.ModelProto) -> list[NodeContext]:
    """A context for every node of the main graph, in graph order."""
    import onnx_ir as ir

    from opbridge.graph._model import function_keys, is_custom_node, node_label, opset_version

    functions = function_keys(model)
    graph = ir.from_proto(model).graph
    out = []
    for index, (proto, node) in enumerate(zip(model.graph.node, graph)):
        out.append(
            NodeContext(
                index=index,
                label=node_label(proto, index),
                proto=proto,
                node=node,
                model=model,
                version=opset_version(model, proto.domain),
                has_function=(proto.domain, proto.op_type) in functions,
                custom=is_custom_node(proto),
            )
        )
    return out
