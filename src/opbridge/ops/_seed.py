"""Definitions of the seed articles' ops (see :mod:`opbridge.ops`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import opbridge
from opbridge.ops._seed_functions import dynamic_resize_body, myselu_body, strange_op2_body, strange_op_body
from opbridge.shape import TensorInfo
from opbridge.spec import Tolerance

__all__ = ["DynamicResize", "MySELU", "MyStrangeOp", "MyStrangeOp2"]


def _selu_shape(x, *_, **__):
    # exp of an integer tensor is of the default floating-point dtype
    return TensorInfo(x.shape, x.dtype if x.dtype.is_floating_point else torch.get_default_dtype())


def _promoted(*infos) -> torch.dtype:
    """The dtype PyTorch's type promotion gives an elementwise op of tensors of ``infos``' dtypes and ranks
    (a 0-d tensor yields to one with dims of its category, as in x + weight)."""
    meta = [torch.empty((0,) * len(i.shape), dtype=i.dtype, device="meta") for i in infos]
    result = meta[0]
    for other in meta[1:]:
        dtype = torch.result_type(result, other)
        result = torch.empty((0,) * max(result.dim(), other.dim()), dtype=dtype, device="meta")
    return result.dtype


@opbridge.op("opbridge::MySELU", shape=_selu_shape)
def MySELU(
    x: torch.Tensor,
    p: torch.Tensor,
    c: torch.Tensor,
    attr1: str = "这是字符串属性",
    attr2: list[int] = [1, 2, 3],  # noqa: B006 - defaults are normalised to tuples
    attr3: float = 222.0,
) -> torch.Tensor:
    """SiLU, x * sigmoid(x); p, c and the attributes ride along as in the seed model."""
    return 1.0 / (1.0 + torch.exp(-x)) * x


@opbridge.op("opbridge::MyStrangeOp", outputs=("sum", "affine"))
def MyStrangeOp(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    float_attr: list[float] = [0.1, 0.5],  # noqa: B006
    int_attr: list[int] = [2, 2],  # noqa: B006
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two outputs: x + weight and x * weight + bias."""
    return x + weight, x * weight + bias


@MyStrangeOp.register_shape
def _strange_shape(x, weight, bias, **_):
    first = _broadcast(x.shape, weight.shape)
    summed = TensorInfo(first, _promoted(x, weight))
    return summed, TensorInfo(_broadcast(first, bias.shape), _promoted(summed, bias))


def _broadcast(a: tuple, b: tuple) -> tuple:
    """Numpy broadcasting over dims that may be symbolic (a dim of 1 yields to the other)."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(db if isinstance(da, int) and da == 1 else da for da, db in zip(a, b))


@opbridge.op("opbridge::MyStrangeOp2")
def MyStrangeOp2(
    input1: torch.Tensor,
    input2: torch.Tensor,
    bias: torch.Tensor,
    int_attr1: int = 10,
    int_attr2: list[int] = [3, 5],  # noqa: B006
    str_attr3: str = "",
) -> torch.Tensor:
    """input1 + input2 - bias."""
    return input1 + input2 - bias


@MyStrangeOp2.register_shape
def _strange2_shape(a, b, bias, **_):
    return TensorInfo(_broadcast(_broadcast(a.shape, b.shape), bias.shape), _promoted(a, b, bias))


# In float32 ONNX Runtime's cubic Resize (the body) rounds the source coordinates otherwise than PyTorch:
# on standard-normal data up to 2.6e-4 from F.interpolate at 500 x 400 (down to 64 x 48, or up to 1000 x
# 800 with align_corners), 5e-5 on [0, 1) data (2026-12-02), against an absolute default of 1e-5.
@opbridge.op(
    "Test::DynamicTRTResize",
    tolerances={"float16": Tolerance(rtol=1e-2, atol=1e-2), "float32": Tolerance(rtol=1e-3, atol=5e-4)},
)
def DynamicResize(input: torch.Tensor, size_tensor: torch.Tensor, align_corners: bool = False) -> torch.Tensor:
    """Bicubic resize of input (N, C, H, W) to size_tensor's last two dims."""
    _check_resize_ranks(input.shape, size_tensor.shape)
    size = [size_tensor.size(-2), size_tensor.size(-1)]
    return F.interpolate(input, size=size, mode="bicubic", align_corners=align_corners)


def _check_resize_ranks(x_shape: Any, size_shape: Any) -> None:
    """A ValueError naming the input whose rank DynamicTRTResize cannot take (torch said only
    "Dimension out of range")."""
    if len(x_shape) != 4:
        raise ValueError(f"Test::DynamicTRTResize: input must be (N, C, H, W); got shape {tuple(x_shape)}.")
    if len(size_shape) < 2:
        raise ValueError(
            "Test::DynamicTRTResize: size_tensor gives the output size by its last two dims, so it needs at "
            f"least 2 dims (e.g. (1, 1, H_out, W_out)); got shape {tuple(size_shape)}."
        )


@DynamicResize.register_shape
def _resize_shape(x, size_tensor, **_):
    _check_resize_ranks(x.shape, size_tensor.shape)
    return TensorInfo((x.shape[0], x.shape[1], size_tensor.shape[-2], size_tensor.shape[-1]), x.dtype)


def _resize_kernel(
    x: torch.Tensor, size_tensor: torch.Tensor, *, align_corners: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """CPU kernel (torch kind), written into ``out`` where given (ONNX Runtime's preallocated output
    through the bridge: no copy of the result): float32 runs opbridge's native separable kernel
    (:mod:`opbridge.ops._resize_cpu`), other dtypes ATen's bicubic upsampling, the op F.interpolate calls."""
    from opbridge.ops import _resize_cpu

    _check_resize_ranks(x.shape, size_tensor.shape)
    size = [size_tensor.size(-2), size_tensor.size(-1)]
    if _resize_cpu.applies(x):
        return _resize_cpu.resize_bicubic(x, size[0], size[1], bool(align_corners), out=out)
    if out is None:
        return F.interpolate(x, size=size, mode="bicubic", align_corners=align_corners)
    return torch.ops.aten.upsample_bicubic2d.out(x, size, bool(align_corners), None, None, out=out)


def _resize_native(attrs: Any) -> Any:
    from opbridge.ops import _resize_cpu

    return _resize_cpu.native_kernel(attrs)


DynamicResize.register_kernel(_resize_kernel, kind="torch", native=_resize_native)


# ONNX function bodies (model-local functions at export; see _seed_functions).
MySELU.register_function(myselu_body)
MyStrangeOp.register_function(strange_op_body)
MyStrangeOp2.register_function(strange_op2_body)
# ONNX Runtime's cubic Resize runs 7-9x slower than F.interpolate on CPU (benchmarks/cpu_ops.py):
# opbridge's session runs the kernel (PyTorch's op into ONNX Runtime's output); the body stays for
# other runtimes.
DynamicResize.register_function(dynamic_resize_body, prefer_kernel=True)
