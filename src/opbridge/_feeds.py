"""The checks a session makes of a feed before its runtime sees it: input names, element types, ranks
and fixed dims, with one wording for every session.

>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> graph = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])], [])
>>> check = FeedCheck("Session.run", graph, ["x"])
>>> check({"x": np.ones((2, 3), np.float32)})
>>> check({"x": np.ones((2, 4), np.float32)})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
opbridge.backends.base.InputError: Session.run: input 'x' has shape (2, 4), but the model declares nx3; ...
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

import numpy as np
import onnx

__all__ = ["FeedCheck"]

# Element types whose numpy dtype a fed array must have (strings take any numpy string or object array):
# bfloat16 and the float8 types as ml_dtypes names them, as onnx and the runtimes give them; the 4-bit
# types are not checked.
_NUMERIC_TYPES = frozenset(range(1, 21)) - {onnx.TensorProto.STRING}

# What a fed array of one input is checked against: numpy dtype (None: not checked), ONNX type name
# ("" where the type is not checked), declared dims (an int where fixed, the name where named, else None;
# None for all: no shape declared) and the fixed ones as (axis, size).
_Spec = tuple["np.dtype | None", str, "tuple[int | str | None, ...] | None", tuple[tuple[int, int], ...]]


class FeedCheck:
    """Refuse a feed that names an input the model does not have, leaves out one it needs, or gives an
    array of another element type, rank or fixed dim than the model declares.

    ``who`` starts every message (``"InferenceSession.run"``); ``feedable`` names what a feed may
    give, in the order messages list them: the graph inputs, then the initializers a feed may
    override. An input of optional type may be left out, as may those initializers. With
    ``check_scalars=False`` an input declared as a scalar takes an array of any shape, as ONNX Runtime
    allows. Values other than numpy arrays (lists and the like, which a runtime converts) are checked
    by name only.
    """

    def __init__(
        self,
        who: str,
        graph: onnx.GraphProto,
        feedable: Iterable[str],
        overridable: Iterable[str] = (),
        *,
        check_scalars: bool = True,
    ) -> None:
        declared = {v.name: v.type for v in graph.input}
        self._who = who
        self._overridable = list(overridable)
        inputs = [n for n in feedable if n not in set(self._overridable)]
        self._optional = [n for n in inputs if n in declared and declared[n].HasField("optional_type")]
        self._required = [n for n in inputs if n not in set(self._optional)]
        self._specs = {n: self._spec(declared.get(n), check_scalars) for n in [*inputs, *self._overridable]}

    @staticmethod
    def _spec(value_type: onnx.TypeProto | None, check_scalars: bool) -> _Spec:
        dtype, type_name, dims = None, "", None
        if value_type is not None and value_type.HasField("optional_type"):  # (the tensor it holds, if any)
            value_type = value_type.optional_type.elem_type
        if value_type is not None and value_type.HasField("tensor_type"):
            tensor_type = value_type.tensor_type
            elem = tensor_type.elem_type
            if elem in _NUMERIC_TYPES or elem == onnx.TensorProto.STRING:
                type_name = f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
                dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
            if tensor_type.HasField("shape") and (check_scalars or tensor_type.shape.dim):
                dims = tuple(
                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim
                )
        fixed = tuple((axis, n) for axis, n in enumerate(dims or ()) if isinstance(n, int))
        return dtype, type_name, dims, fixed

    def as_array(self, name: str, value: Any) -> np.ndarray:
        """``value`` as an array: a list, tuple or Python number of the input's kind as an array of its
        element type (as ONNX Runtime converts one: ``[[1.0, 2.0]]`` for a float32 input is float32, not
        numpy's float64), any other value as numpy makes it."""
        if isinstance(value, np.ndarray):
            return value
        array = np.asarray(value)
        dtype = self._specs[name][0] if name in self._specs else None
        if (
            isinstance(value, (list, tuple, int, float, bool))
            and dtype is not None
            and dtype.kind in "biuf"
            and array.dtype.kind in "biuf"
            and np.can_cast(array.dtype, dtype, "same_kind")
        ):
            return array.astype(dtype)
        return array

    @property
    def omittable(self) -> list[str]:
        """The inputs of optional type, which a feed may leave out."""
        return list(self._optional)

    def __call__(self, feed: Mapping[str, Any]) -> None:
        """Check ``feed`` ({input name: value}).

        Raises:
            InputError: naming the input and what the model expects (a ValueError).
        """
        specs = self._specs
        if len(feed) < len(self._required) or any(n not in specs for n in feed):
            self._mismatch(feed)
        for name, value in feed.items():
            if not isinstance(value, np.ndarray):
                continue
            dtype, type_name, dims, fixed = specs[name]
            if dtype is not None and not _same_type(value.dtype, dtype):
                fix = (
                    "feed an array of str or object dtype"
                    if dtype.kind == "O"
                    else f"cast it with .astype(np.{dtype.name})"
                    if dtype.kind != "V"
                    else "ONNX Runtime's Python API takes no such arrays: give the model a float32 input and a Cast "
                    "to it, or run it with opbridge.ReferenceSession"
                    if self._who.startswith("InferenceSession")
                    else f"cast it with .astype(ml_dtypes.{dtype.name})"  # (bfloat16, float8: not numpy's own)
                )
                self._refuse(
                    f"input {name!r} expects {type_name}"
                    + ("" if dtype.kind == "O" else f" (numpy {dtype})")
                    + f", got numpy {value.dtype}; {fix}."
                )
            if dims is None:
                continue
            shape = value.shape
            if len(shape) != len(dims) or any(shape[axis] != n for axis, n in fixed):
                shown = "x".join(str(d) if d is not None else "?" for d in dims) or "a scalar"
                self._refuse(
                    f"input {name!r} has shape {tuple(shape)}, but the model declares {shown}; "
                    + (
                        "feed a 0-d array (np.asarray(value), or array.reshape(()) for one of a single element)."
                        if not dims
                        else "feed an array of that shape (named dims may take any size)."
                    )
                )
        if any(n not in feed for n in self._required):
            self._mismatch(feed)

    def _mismatch(self, feed: Mapping[str, Any]) -> NoReturn:
        missing = [n for n in self._required if n not in feed]
        unknown = sorted(n for n in feed if n not in self._specs)
        inputs = f"the model's inputs are {self._required}"
        if self._optional:
            inputs += f" (and {self._optional}, of optional type, which may be left out)"
        if unknown and self._overridable:
            inputs += f"; initializers a feed may override: {self._overridable}"
        what = ", ".join(
            part for part in (f"missing {missing}" if missing else "", f"unknown {unknown}" if unknown else "") if part
        )
        self._refuse(f"input feed mismatch: {what}; {inputs}.")

    def _refuse(self, message: str) -> NoReturn:
        from opbridge.backends.base import InputError

        raise InputError(f"{self._who}: {message}")


def _same_type(got: np.dtype, want: np.dtype) -> bool:
    """Whether an array of ``got`` feeds an input of ``want``: the same dtype in either byte order; any
    numpy string or object array for a string input."""
    if want.kind == "O":
        return got.kind in ("U", "S", "O")
    return got == want or got.newbyteorder("=") == want
