"""Run opbridge custom ops inside ONNX Runtime (CPU) through a Python-kernel bridge.

:class:`InferenceSession` mirrors ``onnxruntime.InferenceSession`` and registers,
per session, a kernel for every custom node the model's own function bodies do
not cover: the op's opbridge kernel, a kernel registered with
``@opbridge.kernel``, or the op's PyTorch reference. See
:mod:`opbridge.onnxruntime.bridge` for the choice and
``src/opbridge/onnxruntime/_bridge.c`` for the native half.

Modules: ``_ort_abi.h`` (our declarations of the ONNX Runtime C ABI),
``_bridge.c`` (the native bridge), :mod:`~opbridge.onnxruntime.bridge` (which
kernel each node runs), :mod:`~opbridge.onnxruntime.session` (the session).
Importing this package does not import onnxruntime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opbridge.onnxruntime.bridge import NodeKernel
    from opbridge.onnxruntime.session import InferenceSession

__all__ = ["InferenceSession", "NodeKernel"]


def __getattr__(name: str) -> Any:
    if name == "InferenceSession":
        from opbridge.onnxruntime.session import InferenceSession

        return InferenceSession
    if name == "NodeKernel":
        from opbridge.onnxruntime.bridge import NodeKernel

        return NodeKernel
    raise AttributeError(f"module 'opbridge.onnxruntime' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (loaded lazily by ``__getattr__``) and the module's dunders; not the helpers it imports."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})
