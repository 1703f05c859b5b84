"""GPU kernels of the built-in ops, for generated TensorRT plugins.

Contract (every GPU kernel in opbridge): ``fn(inputs, outputs, attrs, stream)``
gets CUDA torch tensors, writes into the preallocated ``outputs`` and issues its
work on the CUDA stream whose handle is ``stream`` (it is also the current torch
stream while the kernel runs). MySELU and DynamicResize use Triton when it is
installed, else torch ops; the others use torch ops. Nothing here imports torch's
CUDA parts or Triton until a kernel first runs.
"""

from __future__ import annotations

import functools
from typing import Any

from opbridge.ops._seed import DynamicResize, MySELU, MyStrangeOp, MyStrangeOp2

__all__ = ["dynamic_resize_gpu", "myselu_gpu", "strange_op2_gpu", "strange_op_gpu"]

_BLOCK = 1024


@functools.cache
def _triton_kernels() -> dict[str, Any] | None:
    """The Triton kernels, compiled on first use; ``None`` when Triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def silu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        y = x / (1.0 + tl.exp(-x))
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    # Cubic convolution weights with A = -0.75 (PyTorch's), for |x| <= 1 and 1 < |x| < 2.
    @triton.jit
    def _cc1(x):
        return ((-0.75 + 2.0) * x - (-0.75 + 3.0)) * x * x + 1.0

    @triton.jit
    def _cc2(x):
        return ((-0.75 * x - 5.0 * -0.75) * x + 8.0 * -0.75) * x - 4.0 * -0.75

    @triton.jit
    def _row(base, y, x0, x1, x2, x3, w0, w1, w2, w3, W, mask):
        row = base + y * W
        v0 = tl.load(row + x0, mask=mask, other=0.0).to(tl.float32)
        v1 = tl.load(row + x1, mask=mask, other=0.0).to(tl.float32)
        v2 = tl.load(row + x2, mask=mask, other=0.0).to(tl.float32)
        v3 = tl.load(row + x3, mask=mask, other=0.0).to(tl.float32)
        return v0 * w0 + v1 * w1 + v2 * w2 + v3 * w3

    @triton.jit
    def bicubic_kernel(
        in_ptr,
        out_ptr,
        NC,
        H,
        W,
        HO,
        WO,
        scale_h,
        scale_w,
        ALIGN: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        total = NC * HO * WO
        mask = offs < total
        ox = offs % WO
        oy = (offs // WO) % HO
        plane = offs // (WO * HO)
        if ALIGN:
            sy = scale_h * oy.to(tl.float32)
            sx = scale_w * ox.to(tl.float32)
        else:
            sy = scale_h * (oy.to(tl.float32) + 0.5) - 0.5
            sx = scale_w * (ox.to(tl.float32) + 0.5) - 0.5
        fy = tl.floor(sy)
        fx = tl.floor(sx)
        ty = sy - fy
        tx = sx - fx
        iy = fy.to(tl.int64)
        ix = fx.to(tl.int64)
        x0 = tl.minimum(tl.maximum(ix - 1, 0), W - 1)
        x1 = tl.minimum(tl.maximum(ix, 0), W - 1)
        x2 = tl.minimum(tl.maximum(ix + 1, 0), W - 1)
        x3 = tl.minimum(tl.maximum(ix + 2, 0), W - 1)
        wx0 = _cc2(tx + 1.0)
        wx1 = _cc1(tx)
        wx2 = _cc1(1.0 - tx)
        wx3 = _cc2(2.0 - tx)
        base = in_ptr + plane * H * W
        r0 = _row(base, tl.minimum(tl.maximum(iy - 1, 0), H - 1), x0, x1, x2, x3, wx0, wx1, wx2, wx3, W, mask)
        r1 = _row(base, tl.minimum(tl.maximum(iy, 0), H - 1), x0, x1, x2, x3, wx0, wx1, wx2, wx3, W, mask)
        r2 = _row(base, tl.minimum(tl.maximum(iy + 1, 0), H - 1), x0, x1, x2, x3, wx0, wx1, wx2, wx3, W, mask)
        r3 = _row(base, tl.minimum(tl.maximum(iy + 2, 0), H - 1), x0, x1, x2, x3, wx0, wx1, wx2, wx3, W, mask)
        y = r0 * _cc2(ty + 1.0) + r1 * _cc1(ty) + r2 * _cc1(1.0 - ty) + r3 * _cc2(2.0 - ty)
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    return {"triton": triton, "silu": silu_kernel, "bicubic": bicubic_kernel}


def _grid(n: int) -> tuple[int]:
    return ((n + _BLOCK - 1) // _BLOCK,)


def myselu_gpu(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    """MySELU: ``x * sigmoid(x)`` (p, c and the attributes do not change the result)."""
    import torch

    x, out = inputs[0].contiguous(), outputs[0]
    kernels = _triton_kernels()
    if kernels is None or x.numel() == 0:
        torch.mul(x, torch.sigmoid(x), out=out)
        return
    with torch.cuda.device(x.device):
        kernels["silu"][_grid(x.numel())](x, out, x.numel(), BLOCK=_BLOCK)


def strange_op_gpu(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    """MyStrangeOp: ``(x + weight, x * weight + bias)`` with broadcasting."""
    import torch

    x, w, b = inputs
    torch.add(x, w, out=outputs[0])
    torch.add(torch.mul(x, w), b, out=outputs[1])


def strange_op2_gpu(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    """MyStrangeOp2: ``input1 + input2 - bias`` with broadcasting."""
    import torch

    a, b, bias = inputs
    torch.sub(torch.add(a, b), bias, out=outputs[0])


def dynamic_resize_gpu(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    """DynamicResize: bicubic (A = -0.75, borders clamped) of input (N, C, H, W) to the output's H, W."""
    import torch
    import torch.nn.functional as F

    x, out = inputs[0].contiguous(), outputs[0]
    align = bool(attrs.get("align_corners", False))
    n, c, h, w = x.shape
    ho, wo = out.shape[-2], out.shape[-1]
    kernels = _triton_kernels()
    if kernels is None or out.numel() == 0 or x.numel() == 0:
        out.copy_(F.interpolate(x, size=(ho, wo), mode="bicubic", align_corners=align))
        return
    if align:
        sh = (h - 1) / (ho - 1) if ho > 1 else 0.0
        sw = (w - 1) / (wo - 1) if wo > 1 else 0.0
    else:
        sh, sw = h / ho, w / wo
    with torch.cuda.device(x.device):
        kernels["bicubic"][_grid(out.numel())](x, out, n * c, h, w, ho, wo, sh, sw, ALIGN=align, BLOCK=_BLOCK)


MySELU.register_gpu_kernel(myselu_gpu, dtypes=("float32", "float16"))
MyStrangeOp.register_gpu_kernel(strange_op_gpu, dtypes=("float32", "float16"))
MyStrangeOp2.register_gpu_kernel(strange_op2_gpu, dtypes=("float32", "float16"))
DynamicResize.register_gpu_kernel(dynamic_resize_gpu, dtypes=("float32", "float16"))
