"""opbridge: define a custom op once in Python; export, run and verify it everywhere.

Example:
    >>> import torch, opbridge
    >>> @opbridge.op("doc.init::ScaledSwish")
    ... def scaled_swish(x: torch.Tensor, beta: float = 1.0, tag: str = "") -> torch.Tensor:
    ...     return x * torch.sigmoid(beta * x)
    >>> scaled_swish.spec.qualname
    'doc.init::ScaledSwish'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opbridge.definition import BackwardContext, OpDef, all_ops, find_op, op
from opbridge.errors import (
    BackendUnavailableError,
    ExportError,
    KernelResultError,
    ModelLoadError,
    NodeMismatchError,
    OpbridgeError,
    OpCallError,
    OpDefinitionError,
    OutputPathError,
    UnknownOpError,
)
from opbridge.export import ExportResult, export
from opbridge.kernels import KernelDef, all_kernels, find_kernel, kernel
from opbridge.onnx_schema import register_onnx_schemas
from opbridge.shape import SymDim, TensorInfo
from opbridge.spec import AttrSpec, AttrType, InputSpec, OpSpec, OutputSpec, Tolerance
from opbridge.verify import VerifyRecord, verify  # imports no runtime; see opbridge.backends

__version__ = "0.1.0"

if TYPE_CHECKING:  # the lazy names below, as type checkers see them
    from opbridge.onnxruntime.session import InferenceSession
    from opbridge.reference import ReferenceSession


# Names whose modules import heavy dependencies (onnxruntime, onnx.reference, ...):
# resolved on first access so that ``import opbridge`` stays light.
_LAZY = {
    "InferenceSession": "opbridge.onnxruntime.session",
    "ReferenceSession": "opbridge.reference",
}


def __dir__() -> list[str]:
    """The public names (the lazy ones too), and the module's dunders; not the helpers it imports."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})


if not TYPE_CHECKING:  # (hidden from type checkers, which would take every misspelt name for a lazy one)

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'opbridge' has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(module), name)


__all__ = [
    "AttrSpec",
    "AttrType",
    "BackwardContext",
    "BackendUnavailableError",
    "ExportError",
    "KernelResultError",
    "ExportResult",
    "InferenceSession",
    "InputSpec",
    "KernelDef",
    "ModelLoadError",
    "NodeMismatchError",
    "OpDef",
    "OpCallError",
    "OpDefinitionError",
    "OpSpec",
    "OpbridgeError",
    "OutputPathError",
    "OutputSpec",
    "ReferenceSession",
    "SymDim",
    "TensorInfo",
    "Tolerance",
    "UnknownOpError",
    "VerifyRecord",
    "__version__",
    "all_kernels",
    "all_ops",
    "export",
    "find_kernel",
    "find_op",
    "kernel",
    "op",
    "register_onnx_schemas",
    "verify",
]
