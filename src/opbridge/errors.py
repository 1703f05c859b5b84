"""Exceptions raised by opbridge. Each message names the op or file involved and the fix."""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ExportError",
    "ModelLoadError",
    "OpCallError",
    "OpbridgeError",
    "OpDefinitionError",
    "UnknownOpError",
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


class UnknownOpError(OpbridgeError, LookupError):
    """A model holds custom nodes that no op spec, function body or kernel covers."""


class BackendUnavailableError(OpbridgeError, ImportError):
    """An optional backend (OpenVINO, TensorRT...) is not installed."""
