"""ONNX Runtime backend (CPU), through :class:`opbridge.onnxruntime.InferenceSession`.

``opbridge.onnxruntime.InferenceSession(model, providers=None)`` runs each
custom node through its model-local function body or its opbridge kernel. The
``onnxruntime`` runner runs every body the model carries (``bodies="always"``),
as any ONNX Runtime does with the file; the ``onnxruntime-kernels`` runner runs
opbridge's kernel for every op opbridge knows (``bodies="never"``: the native C
kernels, the Python kernels, else the PyTorch reference), the paths
``opbridge.InferenceSession`` takes in place of bodies. Together they check both.

Example:
    >>> from opbridge.backends.onnxruntime_backend import OnnxRuntimeRunner
    >>> with OnnxRuntimeRunner("model.onnx") as runner:   # doctest: +SKIP
    ...     outputs = runner.infer({"x": x})
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from opbridge.backends.base import OnnxRunner, TensorMeta
from opbridge.errors import (
    BackendUnavailableError,
    ModelLoadError,
    OpbridgeError,
    UnknownOpError,
    raise_interrupt_behind,
)

__all__ = ["OnnxRuntimeKernelsRunner", "OnnxRuntimeRunner", "node_arg_meta"]

_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}


def node_arg_meta(arg: Any) -> TensorMeta:
    """An ONNX Runtime ``NodeArg`` (``.name``, ``.type``, ``.shape``) as :class:`TensorMeta`."""
    name = _TYPES.get(str(arg.type))
    shape = arg.shape
    dims = None if shape is None else tuple(d if isinstance(d, (int, str)) else None for d in shape)
    return TensorMeta(arg.name, np.dtype(name) if name else None, dims)


class OnnxRuntimeRunner(OnnxRunner):
    """Runs an ONNX model with ONNX Runtime.

    Args:
        model: path, serialized bytes or ``onnx.ModelProto``.
        providers: execution providers (default: CPU).
        bodies: which function bodies run natively, as for ``opbridge.InferenceSession``
            (default ``"always"``: every body in the model).
    """

    name = "onnxruntime"
    requires = ("onnxruntime",)
    install = "pip install onnxruntime"

    def __init__(self, model: Any, providers: Sequence[str] | None = None, bodies: str = "always") -> None:
        if bodies not in ("auto", "always", "never"):
            raise ValueError(f"OnnxRuntimeRunner: bodies must be 'auto', 'always' or 'never', got {bodies!r}.")
        super().__init__(model)
        self.providers = list(providers) if providers else None
        self.bodies = bodies
        self._session: Any = None

    def _load(self) -> None:
        try:
            import onnxruntime  # noqa: F401  (the session imports it when created)

            from opbridge.onnxruntime import InferenceSession
        except ImportError as exc:
            raise_interrupt_behind(exc)  # (a Ctrl-C during the import: no missing package)
            raise BackendUnavailableError(
                f"onnxruntime backend is not installed ({exc}); pip install onnxruntime."
            ) from None
        try:
            self._session = InferenceSession(self.model, providers=self.providers, bodies=self.bodies)
        except OpbridgeError:
            raise
        except Exception as exc:
            if "not a registered function/op" in str(exc) or "No Op registered" in str(exc):
                raise UnknownOpError(f"onnxruntime: {_short(exc)}") from None
            raise ModelLoadError(f"onnxruntime could not load the model: {_short(exc)}") from None

    def _inputs(self) -> Sequence[TensorMeta]:
        return self._rank_as_declared([node_arg_meta(a) for a in self._session.get_inputs()])

    def _outputs(self) -> Sequence[str]:
        return [o.name for o in self._session.get_outputs()]

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import onnxruntime

        names = self._outputs()
        quiet = onnxruntime.RunOptions()
        quiet.log_severity_level = 4  # (a failing node is raised, with ONNX Runtime's message: not logged too)
        values = self._session.run(None, feed, quiet)
        return {n: np.asarray(v) for n, v in zip(names, values)}

    def _close(self) -> None:
        self._session = None

    @property
    def custom_ops(self) -> list[str]:
        """How each custom op of the model ran: ``"acme::Op (function body)"``, ``"(numpy kernel)"``..."""
        how = {"function": "function body", "registered": "@opbridge.kernel", "reference": "PyTorch reference"}
        found = set()
        for k in (self._session.kernels if self._session is not None else {}).values():
            what = how.get(k.path) or f"{k.kind} kernel{', native' if k.native else ''}"
            found.add(f"{k.domain}::{k.op_type} ({what})")
        return sorted(found)

    @property
    def notes(self) -> list[str]:
        """What a user should know about the paths taken (none here)."""
        return []


class OnnxRuntimeKernelsRunner(OnnxRuntimeRunner):
    """ONNX Runtime with opbridge's kernel for every custom node opbridge knows, bodies or not.

    Args:
        model: path, serialized bytes or ``onnx.ModelProto``.
        providers: execution providers (default: CPU).
    """

    name = "onnxruntime-kernels"

    def __init__(self, model: Any, providers: Sequence[str] | None = None) -> None:
        super().__init__(model, providers, bodies="never")

    @property
    def notes(self) -> list[str]:
        """The ops that ran their function body here because no @opbridge.op is defined for them in this
        process for them: this backend then checks nothing the ``onnxruntime`` one does not."""
        kernels = self._session.kernels.values() if self._session is not None else []
        bodies = sorted({f"{k.domain}::{k.op_type}" for k in kernels if k.path == "function"})
        if not bodies:
            return []
        return [
            f"{', '.join(bodies)}: no @opbridge.op is defined for it in this process, so its function body "
            "ran here too (load its definition, e.g. with --ops FILE, to check its kernel)"
        ]


def _short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    return text[:limit]
