"""Conversions between torch, numpy and ONNX element types."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

if TYPE_CHECKING:
    import torch

__all__ = [
    "feed_arrays",
    "numpy_to_onnx",
    "onnx_to_numpy",
    "onnx_to_torch",
    "onnx_type_name",
    "output_name_list",
    "tensor_to_numpy",
    "torch_to_onnx",
]

_ONNX_TO_NUMPY: dict[int, Any] = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.UINT32: np.uint32,
    onnx.TensorProto.UINT64: np.uint64,
    onnx.TensorProto.BOOL: np.bool_,
}

_TORCH_NAMES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.COMPLEX64: "complex64",
    onnx.TensorProto.COMPLEX128: "complex128",
    onnx.TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    onnx.TensorProto.FLOAT8E5M2: "float8_e5m2",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
}
if hasattr(onnx.TensorProto, "FLOAT8E8M0"):  # (onnx 1.18 on; torch.float8_e8m0fnu since torch 2.7)
    _TORCH_NAMES[onnx.TensorProto.FLOAT8E8M0] = "float8_e8m0fnu"


def onnx_type_name(elem_type: int) -> str:
    """``onnx.TensorProto.FLOAT`` -> ``"float32"`` (numpy-style names)."""
    if elem_type in _TORCH_NAMES:
        return _TORCH_NAMES[elem_type]
    return onnx.TensorProto.DataType.Name(elem_type).lower()


def onnx_to_numpy(elem_type: int) -> np.dtype:
    try:
        return np.dtype(_ONNX_TO_NUMPY[elem_type])
    except KeyError:
        raise TypeError(f"ONNX element type {onnx_type_name(elem_type)} has no numpy equivalent") from None


def numpy_to_onnx(dtype: Any) -> int:
    dt = np.dtype(dtype)
    for k, v in _ONNX_TO_NUMPY.items():
        if np.dtype(v) == dt:
            return k
    raise TypeError(f"numpy dtype {dt} has no ONNX equivalent")


def torch_to_onnx(dtype: torch.dtype) -> int:
    name = str(dtype).removeprefix("torch.")
    for k, v in _TORCH_NAMES.items():
        if v == name:
            return k
    raise TypeError(f"torch dtype {dtype} has no ONNX equivalent supported by opbridge")


def onnx_to_torch(elem_type: int) -> torch.dtype:
    import torch

    dtype = getattr(torch, _TORCH_NAMES.get(elem_type, ""), None)
    if not isinstance(dtype, torch.dtype):  # (an older torch lacks some of the names)
        raise TypeError(
            f"ONNX element type {onnx_type_name(elem_type)} has no torch equivalent in torch {torch.__version__}"
        )
    return dtype


def tensor_to_numpy(t: Any) -> np.ndarray:
    """A tensor as a numpy array on the CPU (a negated or conjugated view resolved first); a bfloat16 one
    as ml_dtypes' bfloat16 (the dtype onnx uses), bit for bit."""
    import torch

    t = t.detach().cpu().resolve_neg().resolve_conj()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def feed_arrays(input_feed: Any) -> dict[str, Any]:
    """A session's ``input_feed`` as ``{name: array}``: torch tensors as numpy arrays (on the CPU,
    detached), numpy scalars (``np.float32(1.5)``) as 0-d arrays, arrays of the other byte order in native
    order (ONNX Runtime reads them as native: wrong values), bytes arrays (dtype ``S``) as str arrays
    (ONNX Runtime misreads those too), other values as they are; a ValueError where it is not a mapping
    or bytes are not UTF-8."""
    from collections.abc import Mapping

    if not isinstance(input_feed, Mapping):
        raise ValueError(
            f"input_feed is a {type(input_feed).__name__}; give a dict of input name to array, e.g. {{'x': array}}."
        )
    out = dict(input_feed)
    for name, value in out.items():
        if not isinstance(value, np.ndarray) and type(value).__module__.startswith("torch"):
            out[name] = tensor_to_numpy(value)
        elif isinstance(value, np.generic):  # (ONNX Runtime takes no numpy scalar: "Unable to handle object")
            out[name] = np.asarray(value)
            value = out[name]
        if isinstance(value, np.ndarray) and value.dtype.kind == "S":
            # (ONNX Runtime reads a fixed-width bytes element that fills its width on into the next one:
            # [b"abc", b"d"] arrived as ["abcd", "d"]; ONNX's strings are UTF-8 text)
            try:
                out[name] = np.char.decode(value, "utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"input {name!r} holds bytes that are not UTF-8 ({exc.reason} at byte {exc.start} of an element), "
                    "and ONNX's strings are UTF-8 text: decode them to str first (an array of dtype str or object)."
                ) from None
            value = out[name]
        if isinstance(value, np.ndarray) and not value.dtype.isnative:
            out[name] = value.astype(value.dtype.newbyteorder("="))
    return out


def output_name_list(output_names: Any) -> list[str] | None:
    """A session's ``output_names`` as a list (one string is one name, not its letters; None all)."""
    if output_names is None:
        return None
    return [output_names] if isinstance(output_names, str) else list(output_names)
