"""ONNX reference evaluator backend, through :class:`opbridge.reference.ReferenceSession`.

``opbridge.reference.ReferenceSession(model)`` runs custom nodes with their
opbridge kernels (or their function bodies) inside ``onnx.reference``.

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
from opbridge.backends.onnxruntime_backend import node_arg_meta
from opbridge.errors import ModelLoadError, OpbridgeError

__all__ = ["ReferenceRunner"]


class ReferenceRunner(OnnxRunner):
    """Runs an ONNX model with ONNX's Python reference evaluator (slow, exact semantics)."""

    name = "reference"
    requires = ("onnx",)
    install = "pip install onnx"

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self._session: Any = None

    def _load(self) -> None:
        from opbridge.reference import ReferenceSession

        try:
            self._session = ReferenceSession(self.model)
        except OpbridgeError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"reference evaluator could not load the model: {' '.join(str(exc).split())[:400]}"
            ) from None

    def _inputs(self) -> Sequence[TensorMeta]:
        return self._rank_as_declared([node_arg_meta(a) for a in self._session.get_inputs()])

    def _outputs(self) -> Sequence[str]:
        return [o.name for o in self._session.get_outputs()]

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(None, feed)
        return {n: np.asarray(v) for n, v in zip(self._outputs(), values)}

    def _close(self) -> None:
        self._session = None

    @property
    def custom_ops(self) -> list[str]:
        """How each custom op of the model ran: ``"acme::Op (numpy kernel)"``, ``"(function)"``..."""
        found = self._session.implementations.items() if self._session is not None else []
        return sorted(f"{domain}::{op} ({how})" for (domain, op), how in found)
