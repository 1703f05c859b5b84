"""Exceptions raised by opbridge. Each message names the op or file involved and the fix."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BackendUnavailableError",
    "ExportError",
    "KernelResultError",
    "ModelLoadError",
    "NodeMismatchError",
    "OpCallError",
    "OpbridgeError",
    "OpDefinitionError",
    "OutputPathError",
    "UnknownOpError",
    "default_domain_hint",
    "legacy_domain_hint",
    "raise_interrupt_behind",
    "unknown_ops_message",
]


class OpbridgeError(Exception):
    """Base class of every opbridge error."""


class OpDefinitionError(OpbridgeError, TypeError):
    """An op definition is invalid (bad name, unsupported annotation, bad shape rule...)."""


class OpCallError(OpbridgeError, TypeError):
    """An op was called with a wrong argument (attribute type, unknown or missing argument...)."""


class ExportError(OpbridgeError, RuntimeError):
    """Export failed, or would have produced a model without its custom nodes."""


class ModelLoadError(OpbridgeError, ValueError):
    """A model file could not be read or is not a valid ONNX model."""


class NodeMismatchError(OpDefinitionError, ModelLoadError):
    """A model's node does not fit its op's definition: an attribute of another type or one the op does
    not declare, more inputs than the op takes, a required input or an output left out. Every backend
    raises it when it loads such a model; it is both an :class:`OpDefinitionError` and a
    :class:`ModelLoadError`, as the fix can be on either side.

    Example:
        >>> issubclass(NodeMismatchError, OpDefinitionError) and issubclass(NodeMismatchError, ModelLoadError)
        True
    """


class OutputPathError(OpbridgeError, ValueError):
    """A path to write to cannot be used: empty, a folder, write-protected, in a folder that is a
    file or cannot be written, or one of the input's own files."""


class UnknownOpError(OpbridgeError, LookupError):
    """A model holds custom nodes that no op spec, function body or kernel covers."""


class KernelResultError(OpbridgeError, ValueError):
    """A kernel returned something its op does not give: another shape than the op's shape rule or
    reference, a list of numbers instead of an array, another number of outputs; or it kept a tensor over
    ONNX Runtime's memory past the call."""


class BackendUnavailableError(OpbridgeError, ImportError):
    """An optional backend (OpenVINO, TensorRT...) is not installed."""


def raise_interrupt_behind(exc: BaseException) -> None:
    """Raise the KeyboardInterrupt (or SystemExit, or another exception that is no Exception) behind ``exc``,
    if any: a Ctrl-C during an extension module's import comes back as ``ImportError: initialization failed``
    caused by it, which would read as the package missing."""
    seen: set[int] = set()
    cause: BaseException | None = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen:
        if not isinstance(cause, Exception):
            raise cause.with_traceback(None) from None
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


def unknown_ops_message(nodes: Iterable[tuple[str, str, int, str]], *, limit: int = 5) -> str:
    """The message of an :class:`UnknownOpError` for ``(domain, op_type, opset, node name)`` entries.

    Lists each op once with its opset version and (up to ``limit``) node names, and
    the three ways to provide it, spelled out for the first op.
    """
    by_op: dict[tuple[str, str, int], list[str]] = {}
    count = 0
    for domain, op_type, version, name in nodes:
        by_op.setdefault((domain, op_type, version), []).append(name or "<unnamed>")
        count += 1
    from opbridge.definition import later_op_note
    from opbridge.kernels import later_kernel_note

    lines = [f"the model has {count} custom node(s) that opbridge has no kernel for:"]
    for (domain, op_type, version), names in by_op.items():
        shown = ", ".join(repr(n) for n in names[:limit])
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        lines.append(f"  - {domain or '<default>'}::{op_type} (opset {version}), node(s) {shown}{more}")
        # (defined or registered here, but only for later versions: "define it" would mislead)
        later = (later_op_note(domain, op_type, version) if domain else None) or later_kernel_note(
            domain, op_type, version
        )
        if later is not None:
            lines.append(f"    {later}")
    domain, op_type, _ = next(iter(by_op))
    if domain == "":  # a node of ONNX's default domain
        lines.append(default_domain_hint(op_type))
        return "\n".join(lines)
    if domain == "opbridge.legacy":  # moved out of the default domain by opbridge rewrite --rule legacy-domain
        lines.append(legacy_domain_hint(op_type))
        return "\n".join(lines)
    lines.append(
        f'Provide one of: an op definition @opbridge.op("{domain}::{op_type}") (its PyTorch '
        "reference runs by default; import the module that defines it first, or pass it with --ops), a kernel "
        f'@opbridge.kernel("{op_type}", domain="{domain}"), or an ONNX function body for the op in the model '
        "(opbridge.export(..., functions=True) with opdef.register_function)."
    )
    return "\n".join(lines)


def legacy_domain_hint(op_type: str) -> str:
    """How to run a custom node of ``opbridge.legacy``, where ``opbridge rewrite --rule legacy-domain``
    moves the nodes of ONNX's default domain."""
    return (
        f'Provide a kernel @opbridge.kernel("{op_type}", domain="") (it also runs the nodes the legacy-domain '
        f'rewrite moved to opbridge.legacy), or an op definition @opbridge.op("opbridge.legacy::{op_type}"); '
        "import the module that defines it first, or pass it with --ops."
    )


def default_domain_hint(op_type: str) -> str:
    """How to run a custom node that sits in ONNX's default domain (TorchScript-era exports): an op
    definition needs a domain, so a kernel of the default domain, or the node moved into a domain."""
    return (
        f'Provide a kernel @opbridge.kernel("{op_type}", domain="") (import the module that defines it first, or '
        "pass it with --ops). An @opbridge.op needs a domain of its own, which this node lacks: move the node "
        "into one with opbridge rewrite MODEL -o OUT --rule legacy-domain --option domain=mydomain, then "
        f'@opbridge.op("mydomain::{op_type}") runs it.'
    )
