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
    """One node (of the main graph or a subgraph) with what the rules look at; ``index``: its place
    in the main graph, -1 in a subgraph."""

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
    """A context for every node of the main graph, in graph order, each followed by the nodes of
    its subgraphs (If branches, Loop and Scan bodies; labelled ``owner/attribute/node``), which a
    runtime must run too."""
    import onnx_ir as ir

    from opbridge.graph._model import function_keys, is_custom_node, node_label, opset_version

    functions = function_keys(model)
    out: list[NodeContext] = []

    def walk(protos: Any, nodes: Any, prefix: str) -> None:
        for index, (proto, node) in enumerate(zip(protos, nodes)):
            label = prefix + node_label(proto, index)
            out.append(
                NodeContext(
                    index=index if not prefix else -1,
                    label=label,
                    proto=proto,
                    node=node,
                    model=model,
                    version=opset_version(model, proto.domain),
                    has_function=(proto.domain, proto.op_type) in functions,
                    custom=is_custom_node(proto),
                )
            )
            for attr in proto.attribute:
                subgraphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
                if not subgraphs:
                    continue
                value = node.attributes[attr.name].value
                for k, (sub, sub_ir) in enumerate(zip(subgraphs, value if isinstance(value, list) else [value])):
                    name = attr.name if len(subgraphs) == 1 else f"{attr.name}[{k}]"
                    walk(sub.node, sub_ir, f"{label}/{name}/")

    walk(model.graph.node, ir.from_proto(model).graph, "")
    return out
