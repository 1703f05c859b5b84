"""The runner interface every backend implements, and the input checks they share.

A runner loads one model, reports its inputs (:class:`TensorMeta`: name, dtype,
shape with symbolic dims), runs it on a dict of named numpy arrays and returns
a dict of named arrays. Backends fill in ``_load`` / ``_inputs`` / ``_outputs``
/ ``_infer`` / ``_close``; :meth:`Runner.infer` checks the feed against the
input metadata first, so every backend rejects a missing input, a wrong dtype
or a shape that breaks a static dim with the same message.

Example:
    >>> import numpy as np
    >>> from opbridge.backends.base import TensorMeta, check_feed
    >>> meta = [TensorMeta("x", np.dtype("float32"), ("batch", 3))]
    >>> check_feed(meta, {"x": np.zeros((2, 3), np.float32)}, "demo")
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from opbridge.errors import OpbridgeError
from opbridge.model_io import load_model

if TYPE_CHECKING:
    import onnx

__all__ = [
    "BackendRunError",
    "Dim",
    "InputError",
    "OnnxRunner",
    "ReferenceMismatchError",
    "Runner",
    "TensorMeta",
    "check_feed",
    "format_shape",
    "onnx_io_meta",
]

logger = logging.getLogger(__name__)

# A dim: an int when static, a name (ONNX dim_param) or None when dynamic.
Dim = int | str | None


class InputError(OpbridgeError, ValueError):
    """A feed does not match the model's inputs (missing input, wrong dtype or shape)."""


class ReferenceMismatchError(InputError):
    """The PyTorch reference does not match the ONNX file: another number of outputs, say. No input values
    can mend it."""


class BackendRunError(OpbridgeError, RuntimeError):
    """A backend failed while running a model (e.g. a custom op's kernel raised)."""


@dataclass(frozen=True)
class TensorMeta:
    """A model input or output: its name, numpy dtype (``None`` if unknown) and shape.

    ``shape`` is ``None`` when even the rank is unknown; each dim is an int
    (static), a string (a named dynamic dim) or ``None`` (an unnamed dynamic dim).
    """

    name: str
    dtype: np.dtype | None
    shape: tuple[Dim, ...] | None

    @property
    def dynamic(self) -> bool:
        return self.shape is None or any(not isinstance(d, int) for d in self.shape)

    def describe(self) -> str:
        dtype = str(self.dtype) if self.dtype is not None else "?"
        return f"{self.name}: {dtype}[{format_shape(self.shape)}]"


def format_shape(shape: Sequence[Any] | None) -> str:
    """``(1, "batch", None)`` -> ``"1xbatchx?"``; ``None`` -> ``"?"`` (unknown rank)."""
    if shape is None:
        return "?"
    return "x".join("?" if d is None else str(d) for d in shape) or "scalar"


def check_feed(meta: Sequence[TensorMeta], feed: Mapping[str, Any], backend: str) -> None:
    """Raise :class:`InputError` when ``feed`` does not fit the inputs described by ``meta``."""
    expected = [m.name for m in meta]
    missing = [n for n in expected if n not in feed]
    if missing:
        raise InputError(
            f"{backend}: input {missing[0]!r} is missing; the model takes {expected}. Pass an array for every input."
        )
    extra = sorted(set(feed) - set(expected))
    if extra:
        raise InputError(f"{backend}: the model has no input {extra[0]!r}; its inputs are {expected}.")
    for m in meta:
        value = feed[m.name]
        if not isinstance(value, np.ndarray):
            raise InputError(f"{backend}: input {m.name!r} must be a numpy array, got {type(value).__name__}.")
        if m.dtype is not None and value.dtype != m.dtype:
            raise InputError(
                f"{backend}: input {m.name!r} has dtype {value.dtype}, the model expects {m.dtype}; "
                f"convert it with .astype(np.{m.dtype.name})."
            )
        if m.shape is None:
            continue
        if value.ndim != len(m.shape):
            raise InputError(
                f"{backend}: input {m.name!r} has shape {format_shape(value.shape)} (rank {value.ndim}), "
                f"the model expects rank {len(m.shape)} ({format_shape(m.shape)})."
            )
        for axis, (got, want) in enumerate(zip(value.shape, m.shape)):
            if isinstance(want, int) and got != want:
                raise InputError(
                    f"{backend}: input {m.name!r} has shape {format_shape(value.shape)}, but dim {axis} is "
                    f"static {want} in the model ({format_shape(m.shape)}); only dynamic dims may change."
                )


class Runner(abc.ABC):
    """A loaded model on one backend. Use it as a context manager.

    Subclasses set :attr:`name` and implement the underscored hooks; heavy
    dependencies are imported inside those hooks only, and a missing one raises
    :class:`~opbridge.errors.BackendUnavailableError`.

    Example:
        >>> from opbridge.backends import get_backend
        >>> runner_cls = get_backend("openvino")   # doctest: +SKIP
        >>> with runner_cls("model.onnx") as r:    # doctest: +SKIP
        ...     outputs = r.infer({"x": x})
    """

    name: ClassVar[str] = "?"
    #: The Python module whose presence makes this backend available.
    requires: ClassVar[tuple[str, ...]] = ()
    #: how to install what ``requires`` names (shown where it is missing)
    install: ClassVar[str] = ""

    def __init__(self) -> None:
        self._loaded = False
        self._input_meta: list[TensorMeta] | None = None
        # one load at a time: the first infer() of several threads each loaded the model, and one's load
        # replaced the state another was running with
        self._load_lock = threading.RLock()

    # ------------------------------------------------------------------ availability

    @classmethod
    def available(cls) -> bool:
        """Whether the backend's dependencies are installed (nothing is imported)."""
        return cls.unavailable_reason() is None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why the backend cannot run here, or ``None`` when it can."""
        import importlib.util

        for module in cls.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                hint = f"; {cls.install}" if cls.install else ""
                return f"{cls.name} backend is not installed: Python module {module!r} not found{hint}"
        return None

    # ------------------------------------------------------------------ lifecycle

    def load(self) -> Runner:
        """Load the model (idempotent, and once where threads call it together). Returns ``self``."""
        if not self._loaded:
            with self._load_lock:
                if not self._loaded:
                    self._load()
                    self._loaded = True
        return self

    def close(self) -> None:
        """Release the backend's resources (idempotent)."""
        with self._load_lock:
            if self._loaded:
                self._close()
                self._loaded = False

    def __enter__(self) -> Runner:
        return self.load()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ metadata and inference

    def input_metadata(self) -> list[TensorMeta]:
        """The model's inputs in order (initializers excluded)."""
        self.load()
        if self._input_meta is None:
            self._input_meta = list(self._inputs())
        return self._input_meta

    def output_names(self) -> list[str]:
        """The model's output names in order."""
        self.load()
        return list(self._outputs())

    def infer(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on ``feed`` (input name -> array); returns output name -> array."""
        self.load()
        check_feed(self.input_metadata(), feed, self.name)
        return self._infer(dict(feed))

    # ------------------------------------------------------------------ hooks

    @abc.abstractmethod
    def _load(self) -> None: ...

    @abc.abstractmethod
    def _inputs(self) -> Sequence[TensorMeta]: ...

    @abc.abstractmethod
    def _outputs(self) -> Sequence[str]: ...

    @abc.abstractmethod
    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def _close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources; the default drops nothing."""


def onnx_io_meta(model: onnx.ModelProto) -> tuple[list[TensorMeta], list[TensorMeta]]:
    """Inputs (without initializers) and outputs of an ONNX model's main graph."""
    from opbridge._dtypes import onnx_to_numpy

    initializers = {t.name for t in model.graph.initializer}

    def meta(vi: Any) -> TensorMeta:
        tt = vi.type.tensor_type
        try:
            dtype = onnx_to_numpy(tt.elem_type) if tt.elem_type else None
        except TypeError:
            dtype = None
        shape: tuple[Dim, ...] | None = None
        if tt.HasField("shape"):
            shape = tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        return TensorMeta(vi.name, dtype, shape)

    inputs = [meta(vi) for vi in model.graph.input if vi.name not in initializers]
    outputs = [meta(vi) for vi in model.graph.output]
    return inputs, outputs


class OnnxRunner(Runner):
    """A runner over an ONNX model: keeps the ModelProto and reads I/O metadata from its graph."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self._source = model
        self.model: onnx.ModelProto = load_model(model)
        self._graph_inputs, self._graph_outputs = onnx_io_meta(self.model)

    def _inputs(self) -> Sequence[TensorMeta]:
        return self._graph_inputs

    def _outputs(self) -> Sequence[str]:
        return [m.name for m in self._graph_outputs]

    def _rank_as_declared(self, metas: Sequence[TensorMeta]) -> list[TensorMeta]:
        """A session's input metadata, with the rank unknown where the graph declares no shape (ONNX
        Runtime reports such an input with shape ``[]``, which reads as a scalar)."""
        unknown = {m.name for m in self._graph_inputs if m.shape is None}
        return [TensorMeta(m.name, m.dtype, None) if m.name in unknown else m for m in metas]
