"""Backends behind one runner interface, and the registry of their names.

Each backend is a :class:`~opbridge.backends.base.Runner` subclass in a module
of its own that imports its runtime lazily, so a missing optional backend is
reported (:class:`~opbridge.errors.BackendUnavailableError`, or ``available()``
being false), never an import error.

=================== ============================================ =====================================
name                runs                                         custom nodes run by
=================== ============================================ =====================================
torch               the PyTorch model from a factory (reference) the ops' PyTorch code
onnxruntime         ONNX Runtime, CPU                            their bodies, else opbridge's kernels
onnxruntime-kernels ONNX Runtime, CPU                            opbridge's kernels (native or Python)
reference           ``onnx.reference``                           opbridge.reference
openvino            OpenVINO, CPU                                generated ``openvino.Op``
=================== ============================================ =====================================

Example:
    >>> from opbridge.backends import backend_names, get_backend
    >>> "openvino" in backend_names()
    True
    >>> get_backend("openvino").name
    'openvino'
"""

from __future__ import annotations

from opbridge.backends.base import BackendRunError, InputError, Runner, TensorMeta
from opbridge.backends.onnxruntime_backend import OnnxRuntimeKernelsRunner, OnnxRuntimeRunner
from opbridge.backends.openvino_backend import OpenVINORunner
from opbridge.backends.reference_backend import ReferenceRunner
from opbridge.backends.torch_backend import TorchRunner
from opbridge.errors import OpbridgeError

__all__ = [
    "BACKENDS",
    "ONNX_BACKENDS",
    "BackendRunError",
    "InputError",
    "Runner",
    "TensorMeta",
    "available_backends",
    "backend_names",
    "get_backend",
]

#: Runners by name. ``torch`` runs the PyTorch reference; the others run ONNX models.
BACKENDS: dict[str, type[Runner]] = {
    "torch": TorchRunner,
    "onnxruntime": OnnxRuntimeRunner,
    "onnxruntime-kernels": OnnxRuntimeKernelsRunner,
    "reference": ReferenceRunner,
    "openvino": OpenVINORunner,
}

#: Backends that run ONNX models, in the order ``opbridge verify`` runs them.
ONNX_BACKENDS: tuple[str, ...] = ("onnxruntime", "onnxruntime-kernels", "reference", "openvino")


def backend_names() -> list[str]:
    """Every ONNX backend name opbridge knows, installed or not."""
    return [n for n in ONNX_BACKENDS if n in BACKENDS] + [
        n for n in BACKENDS if n not in ONNX_BACKENDS and n != "torch"
    ]


def get_backend(name: str) -> type[Runner]:
    """The runner class registered as ``name``; a clear error for an unknown name."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise OpbridgeError(f"unknown backend {name!r}; choose from {', '.join(backend_names())}.") from None


def available_backends() -> list[str]:
    """The ONNX backends whose runtime is installed here, in run order."""
    return [n for n in backend_names() if BACKENDS[n].available()]
