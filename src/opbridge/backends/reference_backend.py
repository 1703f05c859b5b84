"""ONNX reference evaluator backend, through :class:`opbridge.reference.ReferenceSession`.

``opbridge.reference.ReferenceSession(model)`` runs custom nodes with their
opbridge kernels inside ``onnx.reference``. When that module is absent, plain
``onnx.reference.ReferenceEvaluator`` is used; it runs standard ops and custom
nodes that carry a model-local function body, and any other custom node is
reported as an error naming the op.

Example:
    >>> from opbridge.backends.reference_backend import ReferenceRunner
    >>> with ReferenceRunner("model.onnx") as runner:   # doctest: +SKIP
    ...     outputs = runner.infer({"x": x})
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from opbridge.backends.base import OnnxRunner, TensorMeta
from opbridge.backends.onnxruntime_backend import node_arg_meta, require_bodies
from opbridge.errors import ModelLoadError, OpbridgeError

__all__ = ["ReferenceRunner"]


def _kernel_session() -> Any:
    """``opbridge.reference.ReferenceSession``, or None where that module is absent."""
    try:
        from opbridge.reference import ReferenceSession
    except ImportError:
        return None
    return ReferenceSession


class ReferenceRunner(OnnxRunner):
    """Runs an ONNX model with ONNX's Python reference evaluator (slow, exact semantics)."""

    name = "reference"
    requires = ("onnx",)

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self._session: Any = None
        self._plain = False

    def _load(self) -> None:
        session_cls = _kernel_session()
        try:
            if session_cls is not None:
                self._session = session_cls(self.model)
                return
            from onnx.reference import ReferenceEvaluator

            require_bodies(self.model, self.name, "opbridge.reference")
            self._session = ReferenceEvaluator(self.model)
            self._plain = True
        except OpbridgeError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"reference evaluator could not load the model: {' '.join(str(exc).split())[:400]}"
            ) from None

    def _inputs(self) -> Sequence[TensorMeta]:
        if self._plain:
            return super()._inputs()
        return [node_arg_meta(a) for a in self._session.get_inputs()]

    def _outputs(self) -> Sequence[str]:
        if self._plain:
            return super()._outputs()
        return [o.name for o in self._session.get_outputs()]

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(None, feed)
        return {n: np.asarray(v) for n, v in zip(self._outputs(), values)}

    def _close(self) -> None:
        self._session = None
