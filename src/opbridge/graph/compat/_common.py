"""What every target needs to know about a node: its opset, its coverage by opbridge, constants."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

__all__ = ["NodeContext", "body_contexts", "node_contexts", "resize_constants"]

logger = logging.getLogger(__name__)


@dataclass
class NodeContext:
    """One node (of the main graph, a subgraph or a function body) with what the rules look at;
    ``index``: its place in the main graph, -1 elsewhere. ``node`` is None where onnx-ir cannot read
    the model (sparse tensors); ``function``: ``domain::name`` of the function body it sits in;
    ``owners``: the labels of the If/Loop/Scan nodes whose subgraphs hold it, outermost first."""

    index: int
    label: str
    proto: onnx.NodeProto
    node: ir.Node | None
    model: onnx.ModelProto
    version: int | None
    has_function: bool
    custom: bool
    function: str = ""
    ir_model: ir.Model | None = None
    functions: FunctionIndex | None = field(default=None, repr=False)
    owners: tuple[str, ...] = ()
    #: whether the node's domain has an opset import where it sits (the model's, or its function's)
    imported: bool = True
    #: what the contexts of one model share, computed once (:meth:`elem_types`)
    shared: dict[str, Any] = field(default_factory=dict, repr=False)

    def elem_types(self) -> Mapping[str, int]:
        """Element types of the values of the model's graphs (as declared, else from shape inference),
        computed once for all the contexts of the model (and shared by them: not to be changed)."""
        if "elem_types" not in self.shared:
            from opbridge.model_io import elem_types, walk_nodes

            names = [n for node in walk_nodes(self.model.graph.node) for n in (*node.input, *node.output) if n]
            self.shared["elem_types"] = MappingProxyType(elem_types(self.model, list(dict.fromkeys(names))))
        return self.shared["elem_types"]  # type: ignore[no-any-return]

    def unimported(self) -> str:
        """Why a runtime that checks opset imports (ONNX Runtime, opbridge's sessions and OpenVINO backend)
        refuses the node's domain, or "" where it is imported."""
        if self.imported:
            return ""
        owner = f"function {self.function}" if self.function else "the model"
        return (
            f"{owner} has no opset import for domain {self.domain!r} ('No opset import for domain'): add "
            f"opset_import {{domain: {self.domain!r}, version: 1}} (opbridge lint names each such domain)"
        )

    @property
    def domain(self) -> str:
        return self.proto.domain

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def opbridge_op(self) -> Any:
        """The opbridge op that runs this node, or None (none defined, or one this node does not fit:
        see :meth:`opbridge_mismatch`)."""
        import opbridge

        opdef = opbridge.find_op(self.domain, self.op_type, self.version)
        return None if opdef is None or _node_mismatch(self.proto, opdef) else opdef

    def opbridge_mismatch(self) -> str:
        """Why the opbridge op of this node's name cannot run it ("" where none is defined or it fits)."""
        import opbridge

        opdef = opbridge.find_op(self.domain, self.op_type, self.version)
        return "" if opdef is None else _node_mismatch(self.proto, opdef)

    def opbridge_kernel(self) -> Any:
        """The kernel opbridge runs the node with: registered for its domain, or for the default domain
        where the legacy-domain rewrite moved the node (:func:`~opbridge.legacy_domain.runs_default_domain_kernel`)."""
        import opbridge
        from opbridge.legacy_domain import runs_default_domain_kernel

        found = opbridge.find_kernel(self.domain, self.op_type, self.version)
        if found is None and runs_default_domain_kernel(self.domain, self.op_type, self.version):
            found = opbridge.find_kernel("", self.op_type)
        return found

    def untaken_outputs(self, taken: Callable[[int], bool]) -> list[tuple[str, str]]:
        """``(name, type)`` of the node's outputs whose declared element type ``taken`` refuses (bfloat16, which
        a Python kernel cannot be handed: numpy has no such type)."""
        import onnx

        types = self.elem_types()
        return [
            (name, onnx.TensorProto.DataType.Name(types[name]).lower())
            for name in self.proto.output
            if name and types.get(name) and not taken(types[name])
        ]

    def attr(self, name: str, default: Any = None) -> Any:
        """The node's attribute ``name``, else ``default``. In a function body, one that refers to the
        function's attribute (``ref_attr_name``) is the value the first call binds it to (the function's
        default where the call gives none), ``default`` where no call binds it."""
        import onnx

        from opbridge.graph._model import bound_attributes, function_label

        for a in self.proto.attribute:
            if a.name != name:
                continue
            if a.ref_attr_name:
                fn = next((f for f in self.model.functions if function_label(f) == self.function), None)
                bound = next((b for n, b, _ in bound_attributes(self.model, self.proto, fn) if n == name), None)
                if bound is None or bound.ref_attr_name:
                    return default
                a = bound
            value = onnx.helper.get_attribute_value(a)
            return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
        return default


@dataclass(frozen=True)
class FunctionIndex:
    """A model's local functions, looked up by the key a call names (domain, name, overload), in
    the proto and the onnx-ir model; built once per model, not once per call."""

    names: frozenset[tuple[str, str, str]]
    by_key: dict[tuple[str, str, str], Any]
    ir_by_key: dict[tuple[str, str, str], Any]

    @classmethod
    def of(cls, model: onnx.ModelProto, ir_model: ir.Model | None) -> FunctionIndex:
        from opbridge.graph._model import function_keys

        def key(f: Any) -> tuple[str, str, str]:
            return (f.domain, f.name, getattr(f, "overload", ""))

        return cls(
            frozenset(function_keys(model)),
            {key(f): f for f in model.functions},
            {} if ir_model is None else {key(f): f for f in ir_model.functions.values()},
        )


def _ir_model(model: onnx.ModelProto) -> ir.Model | None:
    import onnx_ir as ir

    try:
        return ir.from_proto(model)
    except Exception as exc:  # e.g. sparse tensors, which onnx-ir does not read
        logger.info("onnx-ir cannot read the model (%s); rules that evaluate constants are skipped", exc)
        return None


def _node_mismatch(node: onnx.NodeProto, opdef: Any) -> str:
    """Why ``opdef`` cannot run ``node`` ("" where it fits): the check opbridge's session makes
    (:func:`opbridge.onnxruntime.bridge.check_arity`) and the values of attributes with choices
    (:func:`~opbridge.onnxruntime.bridge.check_attribute_values`), so compat and the session agree."""
    from opbridge.errors import OpDefinitionError
    from opbridge.onnxruntime.bridge import check_arity, check_attribute_values

    spec = opdef.spec
    try:
        check_arity(opdef, node, "the node")
        check_attribute_values(opdef, node, "the node")
    except OpDefinitionError as exc:
        return f"opbridge's {spec.qualname} v{spec.version} does not run it: {exc}"
    return ""


def _walk(
    out: list[NodeContext],
    model: onnx.ModelProto,
    irm: ir.Model | None,
    protos: Any,
    nodes: Any,
    prefix: str,
    owner: Any,
    function: str,
    functions: FunctionIndex,
    owners: tuple[str, ...] = (),
    shared: dict[str, Any] | None = None,
) -> None:
    """Contexts for ``protos`` (with their onnx-ir twins ``nodes``, or None) and their subgraphs' nodes."""
    from opbridge.graph._model import function_key, is_custom_node, node_label, opset_version

    for index, (proto, node) in enumerate(zip(protos, nodes if nodes is not None else [None] * len(protos))):
        label = prefix + node_label(proto, index)
        version = opset_version(owner, proto.domain)
        out.append(
            NodeContext(
                index=index if not prefix else -1,
                label=label,
                proto=proto,
                node=node,
                model=model,
                version=version if version is not None else opset_version(model, proto.domain),
                has_function=function_key(proto) in functions.names,
                custom=is_custom_node(proto),
                function=function,
                ir_model=irm,
                functions=functions,
                owners=owners,
                imported=proto.domain in ("", "ai.onnx") or version is not None,
                shared=shared if shared is not None else {},
            )
        )
        for attr in proto.attribute:
            subgraphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            if not subgraphs:
                continue
            value = node.attributes[attr.name].value if node is not None else None
            subs_ir = value if isinstance(value, list) else [value] * len(subgraphs)
            for k, (sub, sub_ir) in enumerate(zip(subgraphs, subs_ir)):
                name = attr.name if len(subgraphs) == 1 else f"{attr.name}[{k}]"
                _walk(
                    out,
                    model,
                    irm,
                    sub.node,
                    None if sub_ir is None else list(sub_ir),
                    f"{label}/{name}/",
                    owner,
                    function,
                    functions,
                    (*owners, label),
                    shared,
                )


def node_contexts(model: onnx.ModelProto) -> list[NodeContext]:
    """A context for every node of the main graph, in graph order, each followed by the nodes of
    its subgraphs (If branches, Loop and Scan bodies; labelled ``owner/attribute/node``), which a
    runtime must run too. Function bodies: :func:`body_contexts`."""
    irm = _ir_model(model)
    out: list[NodeContext] = []
    functions = FunctionIndex.of(model, irm)
    shared: dict[str, Any] = {}
    _walk(
        out,
        model,
        irm,
        model.graph.node,
        None if irm is None else list(irm.graph),
        "",
        model,
        "",
        functions,
        (),
        shared,
    )
    return out


def body_contexts(ctx: NodeContext) -> list[NodeContext]:
    """Contexts for the nodes of the model-local function ``ctx`` calls, and of the functions those
    call in turn (labelled ``<ctx label>/<domain::function>/<node>``): what a runtime runs where it
    expands the function. Each function's body is listed once, under the first call that reaches it
    (functions calling one another twice would otherwise list 2**depth copies)."""
    from opbridge.graph._model import function_label

    functions = ctx.functions or FunctionIndex.of(ctx.model, ctx.ir_model)
    out: list[NodeContext] = []
    expanded: set[tuple[str, str, str]] = set()  # (also ends a cycle, which the checker names)
    # depth first, as calls nest, without recursion: a chain of a thousand calls is one loop
    pending: list[Iterator[NodeContext]] = [iter([ctx])]
    while pending:
        caller = next(pending[-1], None)
        if caller is None:
            pending.pop()
            continue
        key = (caller.domain, caller.op_type, getattr(caller.proto, "overload", ""))
        fn = functions.by_key.get(key)
        if fn is None or key in expanded:
            continue
        expanded.add(key)
        fn_ir = functions.ir_by_key.get(key) if caller.ir_model is not None else None
        start = len(out)
        _walk(
            out,
            ctx.model,
            caller.ir_model,
            fn.node,
            None if fn_ir is None else list(fn_ir),
            f"{caller.label}/{function_label(fn)}/",
            fn,
            function_label(fn),
            functions,
            (),
            ctx.shared,
        )
        pending.append(iter([inner for inner in out[start:] if inner.has_function]))
    return out


def resize_constants(ctx: NodeContext) -> dict[str, Any]:
    """The scales and sizes a Resize node is given (``{"scales": array, "sizes": array}``; Resize-10's scales
    too) that depend only on constants, computed (:func:`~opbridge.graph._model.evaluate_constant`); those
    not given, empty or computed at run time are left out."""
    from opbridge.graph._model import evaluate_constant, resize_input_slots

    if ctx.node is None:  # (onnx-ir could not read the model)
        return {}
    inputs = ctx.node.inputs
    found: dict[str, Any] = {}
    for index, what in resize_input_slots(ctx.version):
        value = inputs[index] if len(inputs) > index else None
        if value is None or not value.name:
            continue
        arr, _ = evaluate_constant(value, opset=ctx.version)
        if arr is not None and arr.size:
            found[what] = arr
    return found
