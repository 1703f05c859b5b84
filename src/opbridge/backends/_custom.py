"""Custom nodes of an ONNX model and the Python code that computes them.

A backend that runs custom ops in Python (OpenVINO here) asks
:func:`find_custom_kernel` for each custom node: an op defined with
``@opbridge.op`` runs its registered kernel (numpy or torch) or else its PyTorch
reference; an op known only through ``@opbridge.kernel`` runs that kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from opbridge._dtypes import tensor_to_numpy
from opbridge.errors import KernelResultError, NodeMismatchError, UnknownOpError
from opbridge.spec import ONNX_DOMAINS

if TYPE_CHECKING:
    import onnx

    from opbridge.definition import OpDef
    from opbridge.kernels import KernelDef

__all__ = [
    "CustomKernel",
    "KernelResultError",
    "custom_nodes",
    "custom_op_nodes",
    "domain_versions",
    "find_custom_kernel",
    "is_custom_node",
]


STANDARD_DOMAINS = ONNX_DOMAINS


def domain_versions(model: onnx.ModelProto) -> dict[str, int]:
    """The model's opset import per domain (``"ai.onnx"`` folded into ``""``)."""
    out = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    return out


def is_custom_node(
    node: onnx.NodeProto, local_functions: set[tuple[str, str]] | None = None, opset: int | None = None
) -> bool:
    """Whether ``node`` is neither a standard op (at ``opset`` of the default domain, the model's; in any
    opset where None) nor a call of a model-local function."""
    if local_functions and (node.domain, node.op_type) in local_functions:
        return False
    if node.domain in STANDARD_DOMAINS:
        from opbridge.legacy_domain import is_standard_op

        return not is_standard_op(node.op_type, opset)
    return True


def custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Main-graph nodes that no runtime knows by itself (local-function calls excluded)."""
    from opbridge.legacy_domain import default_domain_opset

    local = {(f.domain, f.name) for f in model.functions}
    opset = default_domain_opset(model)
    return [n for n in model.graph.node if is_custom_node(n, local, opset)]


def custom_op_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node of a non-standard op anywhere in the model: the main graph, subgraphs and
    model-local function bodies, calls of model-local functions included (an op exported with
    its ONNX body is such a call)."""
    from opbridge.legacy_domain import default_domain_opset
    from opbridge.model_io import walk_nodes

    nodes = list(walk_nodes(model.graph.node))
    for fn in model.functions:
        nodes.extend(walk_nodes(fn.node))
    opset = default_domain_opset(model)
    return [n for n in nodes if is_custom_node(n, opset=opset)]


def _attrs_generic(node: onnx.NodeProto) -> dict[str, Any]:
    import onnx

    out: dict[str, Any] = {}
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8") for v in value]
        out[attr.name] = value
    return out


@dataclass(frozen=True)
class CustomKernel:
    """The Python code behind one custom op: an ``OpDef`` or a registered ``KernelDef``, or both (an op
    with no kernel of its own and a kernel registered by its name: that kernel runs, as in ONNX Runtime's
    bridge, and the op's spec types the node)."""

    domain: str
    name: str
    version: int
    opdef: OpDef | None = None
    kerneldef: KernelDef | None = None

    @property
    def qualname(self) -> str:
        return f"{self.domain or '<default>'}::{self.name}"

    @property
    def source(self) -> str:
        """What runs: ``"numpy kernel"``, ``"torch kernel"`` or ``"PyTorch reference"``."""
        if self.opdef is not None and self.opdef.kernel is not None:
            return f"{self.opdef.kernel_kind} kernel"
        if self.kerneldef is not None:
            return f"{self.kerneldef.kind} kernel"
        return "PyTorch reference"

    def attributes(self, node: onnx.NodeProto, skip: Sequence[str] = ()) -> dict[str, Any]:
        """The node's attribute values as the kernel expects them; a node that does not fit the op
        (more inputs, an attribute it does not declare) is refused as ONNX Runtime's bridge refuses it."""
        if self.opdef is not None:
            from opbridge.onnx_schema import attribute_values
            from opbridge.onnxruntime.bridge import check_node

            label = f"{self.qualname} node {node.name!r}"
            check_node(self.opdef, node, label)
            try:
                return attribute_values(self.opdef.spec, node)
            except ValueError as exc:
                raise NodeMismatchError(f"{label}: {exc}") from None
        attrs = _attrs_generic(node)
        for name in skip:
            attrs.pop(name, None)
        return attrs

    def run(self, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any], num_outputs: int) -> list[np.ndarray]:
        """Compute the op on numpy arrays; returns one array per output."""
        if self.opdef is not None and self.opdef.kernel is not None:
            result = _call(self.opdef.kernel, self.opdef.kernel_kind or "numpy", inputs, attrs)
        elif self.kerneldef is not None:
            inputs = self.kerneldef.pad_inputs(inputs, attrs)
            result = _call(self.kerneldef.fn, self.kerneldef.kind, inputs, attrs)
        else:
            assert self.opdef is not None
            result = _call(self.opdef.run_reference, "torch", inputs, attrs)
        if isinstance(result, list) and any(not isinstance(v, (np.ndarray, np.generic)) for v in result):
            # (.tolist(): its rows would be read as outputs)
            kinds = sorted({type(v).__name__ for v in result if not isinstance(v, (np.ndarray, np.generic))})
            raise KernelResultError(
                f"{self.qualname}: the {self.source} returned a list (of {', '.join(kinds)}), not an array; return "
                "a numpy array (e.g. np.asarray(result, dtype=...)), or a tuple of arrays for several outputs."
            )
        items = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(items) != num_outputs:
            raise KernelResultError(
                f"{self.qualname}: the {self.source} returned {len(items)} output(s), the node has {num_outputs}."
            )
        return [_to_numpy(v, i, f"{self.qualname}: the {self.source}") for i, v in enumerate(items)]


def _to_numpy(value: Any, index: int, label: str) -> np.ndarray:
    """A result as a numpy array; anything but an array or a tensor is refused by name."""
    if hasattr(value, "detach"):
        return tensor_to_numpy(value)
    if not isinstance(value, (np.ndarray, np.generic)) or np.asarray(value).dtype == object:
        raise KernelResultError(
            f"{label} returned a {type(value).__name__} for output {index}, not an array; return numpy arrays"
        )
    return np.asarray(value)


def _call(fn: Any, kind: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any]) -> Any:
    if kind == "numpy":
        return fn(*inputs, **attrs)
    import torch

    tensors = [
        None if a is None else torch.from_numpy(a if a.flags.writeable and a.flags.c_contiguous else a.copy())
        for a in inputs
    ]
    with torch.no_grad():
        return fn(*tensors, **attrs)


def find_custom_kernel(domain: str, name: str, version: int | None) -> CustomKernel:
    """The kernel for ``domain::name``, or :class:`~opbridge.errors.UnknownOpError` saying how to add one."""
    from opbridge.definition import find_op
    from opbridge.kernels import find_kernel, later_kernel_note

    opdef = find_op(domain, name, version) if domain else None
    kdef = find_kernel(domain, name, version)
    if opdef is not None:  # (a kernel registered by its name runs where the op has none of its own)
        named = kdef if opdef.kernel is None else None
        return CustomKernel(domain, name, opdef.spec.version, opdef=opdef, kerneldef=named)
    if kdef is not None:
        return CustomKernel(domain, name, kdef.since_version, kerneldef=kdef)
    qual = f"{domain or '<default domain>'}::{name}"
    later = None if version is None else later_kernel_note(domain, name, version)
    if later is not None:  # (registered, but only for later versions than the model's)
        raise UnknownOpError(f"custom op {qual} has no opbridge kernel for opset {version}: {later}")
    if not domain:
        from opbridge.errors import default_domain_hint

        raise UnknownOpError(f"custom op {qual} has no opbridge kernel in this process. {default_domain_hint(name)}")
    if domain == "opbridge.legacy":
        from opbridge.errors import legacy_domain_hint

        raise UnknownOpError(f"custom op {qual} has no opbridge kernel in this process. {legacy_domain_hint(name)}")
    raise UnknownOpError(
        f"custom op {qual} has no opbridge definition or kernel in this process; define it with "
        f'@opbridge.op("{domain}::{name}") or @opbridge.kernel("{name}", domain="{domain}") '
        "in a file and pass it with --ops FILE."
    )
