"""PyTorch eager backend: the reference every other backend is compared with.

The model comes from a factory (``path/to/file.py:factory`` or
``package.module:factory`` returning ``(model, example_inputs)``, see
:func:`opbridge._loading.load_factory`), or is given directly. Inputs are passed
positionally, in the order of ``inputs`` (the ONNX model's input order in
``opbridge verify``). Where the model has fewer inputs than the examples (an exporter dropped one the
outputs do not use, or folded a number into a constant) and its input names are parameter names of
the module's ``forward``, the inputs go to those parameters and the others get their example values.
Outputs are flattened (tensor, tuple/list, dict values) and
named after ``output_names``.

Example:
    >>> import numpy as np
    >>> from opbridge.backends.torch_backend import TorchRunner
    >>> with TorchRunner("opbridge.examples.seeds:myselu_model") as r:
    ...     out = r.infer({"input0": np.zeros((1, 1, 4, 4), np.float32)})
    >>> list(out), out["output0"].shape
    (['output0'], (1, 1, 4, 4))
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opbridge._dtypes import tensor_to_numpy
from opbridge.backends.base import ReferenceMismatchError, Runner, TensorMeta
from opbridge.errors import BackendUnavailableError, OpbridgeError, raise_interrupt_behind

__all__ = ["TorchRunner"]

logger = logging.getLogger(__name__)


class TorchRunner(Runner):
    """Runs a PyTorch module eagerly on CPU, under ``torch.no_grad()``.

    Args:
        reference: a factory path (``file.py:fn`` / ``module:fn``) or a ``(model, example_inputs)`` pair.
        inputs: input metadata (names, dtypes, shapes) in call order; default: the
            example inputs' dtypes with every dim dynamic, named ``input0``, ``input1``...
        output_names: names for the flattened outputs; default ``output0``, ``output1``...
    """

    name = "torch"
    requires = ("torch",)
    install = "pip install torch (a CPU-only build: pip install torch --index-url https://download.pytorch.org/whl/cpu)"

    def __init__(
        self,
        reference: str | tuple[Any, Any],
        inputs: Sequence[TensorMeta] | None = None,
        output_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.reference = reference
        self._given_inputs = list(inputs) if inputs is not None else None
        self._given_outputs = list(output_names) if output_names is not None else None
        self.module: Any = None
        self.example_inputs: tuple[Any, ...] = ()
        self._was_training: bool | None = None
        # per forward position: the model input's name, None where the example value is passed, or, for a
        # dict of tensors the exporters flattened into inputs <parameter>_<key>, {key: input name}
        self._positions: list[str | dict[str, str] | None] = []

    def _load(self) -> None:
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            raise_interrupt_behind(exc)  # (a Ctrl-C during the import: no missing package)
            raise BackendUnavailableError(f"torch backend is not installed ({exc}); {self.install}.") from None
        if isinstance(self.reference, str):
            from opbridge._loading import load_factory

            self.module, self.example_inputs = load_factory(self.reference, label="reference")
        else:
            if not (isinstance(self.reference, (tuple, list)) and len(self.reference) == 2):
                raise OpbridgeError(
                    f"torch: the reference is a {type(self.reference).__name__}; give (model, example_inputs), e.g. "
                    "reference=(model, (x,)), or a factory 'file.py:fn' returning that pair."
                )
            model, example = self.reference
            # one tensor is one example input (as a factory may return it), not its rows
            self.module = model
            self.example_inputs = tuple(example) if isinstance(example, (tuple, list)) else (example,)
        # the reference runs in eval mode; the caller's model gets its own mode back on close
        self._was_training = getattr(self.module, "training", None)
        if hasattr(self.module, "eval"):
            self.module.eval()
        names = [m.name for m in self._inputs()]
        self._positions = list(names)
        flattened = self._by_dict_keys(names)
        if flattened is not None:
            self._positions = flattened
        elif len(names) != len(self.example_inputs):
            positions = self._by_parameter_name(names)
            if positions is None:
                raise OpbridgeError(
                    f"torch: the reference takes {len(self.example_inputs)} example input(s), the model has "
                    f"{len(names)} input(s) {names}; the factory must return one example per model input, in the "
                    "model's input order. Where the exporter dropped an input the outputs do not use, name the "
                    "model's inputs after forward's parameters (input_names=) so that the others keep their "
                    "example values."
                )
            kept = [p for p, n in zip(self._parameters(), positions) if n is None]
            logger.info("torch: the model has no input %s; the reference gets their example values", kept)
            self._positions = positions

    def _parameters(self) -> list[str]:
        """The names of the positional parameters of the module's forward (none where they cannot be read)."""
        from opbridge._loading import forward_parameters

        try:
            return forward_parameters(self.module)
        except (TypeError, ValueError):
            return []

    def _by_dict_keys(self, names: list[str]) -> list[str | dict[str, str] | None] | None:
        """Per example position, the model input (or ``{key: input}`` for a dict of tensors, which both
        exporters flatten into inputs ``<parameter>_<key>``, in the dict's order), where the example holds
        such a dict and the model's inputs are these; None elsewhere."""
        import torch

        def tensors(value: Any) -> bool:
            return (
                isinstance(value, Mapping) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())
            )

        if not any(tensors(v) for v in self.example_inputs):
            return None
        parameters = self._parameters()[: len(self.example_inputs)]
        if len(parameters) < len(self.example_inputs):
            return None
        positions: list[str | dict[str, str] | None] = []
        flat: list[str] = []
        for parameter, value in zip(parameters, self.example_inputs):
            if tensors(value):
                keys = {str(k): f"{parameter}_{k}" for k in value}
                positions.append(keys)
                flat += keys.values()
            else:
                positions.append(parameter)
                flat.append(parameter)
        return positions if flat == names else None

    def _by_parameter_name(self, names: list[str]) -> list[str | dict[str, str] | None] | None:
        """Per example position, the model input of the parameter's name (None: none, the example is
        passed); None where the model's inputs are not parameters of forward, in their order."""
        parameters = self._parameters()[: len(self.example_inputs)]
        if len(parameters) < len(self.example_inputs) or len(names) > len(parameters):
            return None
        positions: list[str | dict[str, str] | None] = [p if p in names else None for p in parameters]
        if [p for p in positions if p is not None] != names:
            return None
        return positions

    def _close(self) -> None:
        if self._was_training and hasattr(self.module, "train"):
            self.module.train(True)

    def _inputs(self) -> Sequence[TensorMeta]:
        if self._given_inputs is not None:
            return self._given_inputs
        return [
            TensorMeta(f"input{i}", _np_dtype(t), tuple(None for _ in t.shape))
            for i, t in enumerate(self.example_inputs)
        ]

    def _outputs(self) -> Sequence[str]:
        if self._given_outputs is not None:
            return self._given_outputs
        return []  # known only after a run

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        def tensor(name: str) -> Any:
            return torch.from_numpy(np.array(feed[name], copy=True))

        args = [
            self.example_inputs[i]
            if name is None
            else {k: tensor(n) for k, n in name.items()}
            if isinstance(name, dict)
            else tensor(name)
            for i, name in enumerate(self._positions)
        ]
        with torch.no_grad():
            result = self.module(*args)
        flat = _flatten(result)
        names = self._given_outputs or [f"output{i}" for i in range(len(flat))]
        if len(flat) != len(names):
            raise ReferenceMismatchError(
                f"torch: the reference returned {len(flat)} tensor(s), the model has {len(names)} output(s) {names}; "
                "the ONNX file does not match the PyTorch model: give the model it was exported from, or export it "
                "again from this one."
            )
        out: dict[str, np.ndarray] = {}
        for i, (n, t) in enumerate(zip(names, flat)):
            if isinstance(t, (bool, int, float)):  # a Python number (a size): the exporters make it a 0-d output
                t = torch.tensor(t)
            # (bfloat16 as ml_dtypes' bfloat16, as the ONNX backends give it; a copy: a tensor the module keeps,
            # its state returned as it is, changes at the next call, and the values verify keeps with it)
            value = np.array(tensor_to_numpy(t), copy=True)
            if n in out and not _same(out[n], value):
                # the graph lists one value at both positions; the reference gives two different ones
                first = names.index(n)
                raise ReferenceMismatchError(
                    f"torch: the model lists output {n!r} at positions {first} and {i}, one value returned twice, "
                    f"but the reference returns different tensors there; the ONNX file does not match the "
                    "PyTorch model: export it again from this model."
                )
            out[n] = value
        return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shapes, dtypes and values (NaN equal to NaN where the dtype has it)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def _np_dtype(tensor: Any) -> np.dtype | None:
    try:
        return np.dtype(str(tensor.dtype).removeprefix("torch."))
    except TypeError:
        return None


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flatten(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flatten(v)]
    if value is None:
        return []
    return [value]
