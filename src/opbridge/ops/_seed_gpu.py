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
    def _load_row(base, y, H, W, x0, x1, x2, x3):
        # the four taps of one input row (clamped) at every output column of the tile; the column
        # indices are clamped too, so every address is in bounds and no mask is needed
        row = base + tl.minimum(tl.maximum(y, 0), H - 1) * W
        return tl.load(row + x0), tl.load(row + x1), tl.load(row + x2), tl.load(row + x3)

    @triton.jit
    def _combine(v0, v1, v2, v3, w0, w1, w2, w3):
        # one input row interpolated along x
        return v0.to(tl.float32) * w0 + v1.to(tl.float32) * w1 + v2.to(tl.float32) * w2 + v3.to(tl.float32) * w3

    @triton.jit
    def _hrow(base, y, H, W, x0, x1, x2, x3, w0, w1, w2, w3):
        v0, v1, v2, v3 = _load_row(base, y, H, W, x0, x1, x2, x3)
        return _combine(v0, v1, v2, v3, w0, w1, w2, w3)

    @triton.jit
    def _source(o, scale, align):
        # source coordinate of output index o (align is a compile-time constant)
        if align:
            return scale * o
        else:
            return scale * (o + 0.5) - 0.5

    @triton.jit
    def bicubic_kernel(
        in_ptr,
        out_ptr,
        H,
        W,
        HO,
        WO,
        n_tx,
        n_ty,
        scale_h,
        scale_w,
        ALIGN: tl.constexpr,
        ROWS: tl.constexpr,
        BW: tl.constexpr,
        PREFETCH: tl.constexpr,
    ):
        # One program: one plane, BW output columns, ROWS output rows. The column indices and
        # weights are computed once; the four input rows' x-interpolations live in registers
        # (h0..h3) and slide down as the output row advances, so each input row is interpolated
        # along x once per program instead of once per output row. PREFETCH loads the taps of the
        # row that slides in next (p0..p3) one step ahead, so their latency overlaps the current
        # row's arithmetic and store. Same formulas and order of operations as PyTorch's
        # upsample_bicubic2d (x first, then y).
        pid = tl.program_id(0)
        tx = pid % n_tx
        t = pid // n_tx
        ty = t % n_ty
        plane = (t // n_ty).to(tl.int64)
        ox = tx * BW + tl.arange(0, BW)
        xm = ox < WO
        sx = _source(ox.to(tl.float32), scale_w, ALIGN)
        fx = tl.floor(sx)
        tx_f = sx - fx
        ix = fx.to(tl.int32)
        x0 = tl.minimum(tl.maximum(ix - 1, 0), W - 1)
        x1 = tl.minimum(tl.maximum(ix, 0), W - 1)
        x2 = tl.minimum(tl.maximum(ix + 1, 0), W - 1)
        x3 = tl.minimum(tl.maximum(ix + 2, 0), W - 1)
        wx0 = _cc2(tx_f + 1.0)
        wx1 = _cc1(tx_f)
        wx2 = _cc1(1.0 - tx_f)
        wx3 = _cc2(2.0 - tx_f)
        base = in_ptr + plane * H * W
        obase = out_ptr + plane * HO * WO
        oy0 = ty * ROWS
        cur = tl.floor(_source(oy0.to(tl.float32), scale_h, ALIGN)).to(tl.int32)
        h0 = _hrow(base, cur - 1, H, W, x0, x1, x2, x3, wx0, wx1, wx2, wx3)
        h1 = _hrow(base, cur, H, W, x0, x1, x2, x3, wx0, wx1, wx2, wx3)
        h2 = _hrow(base, cur + 1, H, W, x0, x1, x2, x3, wx0, wx1, wx2, wx3)
        h3 = _hrow(base, cur + 2, H, W, x0, x1, x2, x3, wx0, wx1, wx2, wx3)
        if PREFETCH:
            p0, p1, p2, p3 = _load_row(base, cur + 3, H, W, x0, x1, x2, x3)
        for r in range(ROWS):  # rows past HO: computed, not stored
            oy = oy0 + r
            sy = _source(oy.to(tl.float32), scale_h, ALIGN)
            fy = tl.floor(sy)
            ty_f = sy - fy
            iy = fy.to(tl.int32)
            if iy - cur > 3:  # downscaling by more than 4: start the window afresh
                h0 = _hrow(base, iy - 1, H, W, x0, x1, x2, x3, wx0, wx1, wx2, wx3)
                h1 = _hrow(base, iy, H, W, x0, x1, x2, x3, wx0, wx1, wx2, wx3)
                h2 = _hrow(base, iy + 1, H, W, x0, x1, x2, x3, wx0, wx1, wx2, wx3)
                h3 = _hrow(base, iy + 2, H, W, x0, x1, x2, x3, wx0, wx1, wx2, wx3)
                cur = iy
                if PREFETCH:
                    p0, p1, p2, p3 = _load_row(base, cur + 3, H, W, x0, x1, x2, x3)
            else:
                while cur < iy:
                    h0 = h1
                    h1 = h2
                    h2 = h3
                    if PREFETCH:
                        h3 = _combine(p0, p1, p2, p3, wx0, wx1, wx2, wx3)
                        p0, p1, p2, p3 = _load_row(base, cur + 4, H, W, x0, x1, x2, x3)
                    else:
                        h3 = _hrow(base, cur + 3, H, W, x0, x1, x2, x3, wx0, wx1, wx2, wx3)
                    cur += 1
            y = h0 * _cc2(ty_f + 1.0) + h1 * _cc1(ty_f) + h2 * _cc1(1.0 - ty_f) + h3 * _cc2(2.0 - ty_f)
            tl.store(obase + oy * WO + ox, y.to(out_ptr.dtype.element_ty), mask=xm & (oy < HO))

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


def _resize_config(nc: int, ho: int, wo: int) -> tuple[int, int, int, bool]:
    """(ROWS, BW, num_warps, PREFETCH) for nc planes of ho x wo outputs.

    Columns in blocks of up to 256; the most rows per program (32, 16 or 8) that still gives
    at least 1024 programs, so that small images fill the GPU too.
    """
    bw = 256 if wo > 128 else max(32, 1 << max(0, wo - 1).bit_length())
    n_tx = -(-wo // bw)
    rows = next((r for r in (32, 16) if nc * n_tx * -(-ho // r) >= 1024), 8)
    return rows, bw, 2 if bw >= 64 else 1, True


def dynamic_resize_gpu(
    inputs: list[Any],
    outputs: list[Any],
    attrs: dict[str, Any],
    stream: int,
    config: tuple[int, int, int, bool] | None = None,
) -> None:
    """DynamicResize: bicubic (A = -0.75, borders clamped) of input (N, C, H, W) to the output's H, W.

    ``config`` (ROWS, BW, num_warps, PREFETCH) overrides ``_resize_config``; benchmarks use it to
    compare tilings.
    """
    import torch
    import torch.nn.functional as F

    x, out = inputs[0].contiguous(), outputs[0]
    align = bool(attrs.get("align_corners", False))
    n, c, h, w = x.shape
    ho, wo = out.shape[-2], out.shape[-1]
    kernels = _triton_kernels()
    if kernels is None or out.numel() == 0 or x.numel() == 0 or max(h * w, ho * wo) >= 2**31:
        out.copy_(F.interpolate(x, size=(ho, wo), mode="bicubic", align_corners=align))
        return
    if align:
        sh = (h - 1) / (ho - 1) if ho > 1 else 0.0
        sw = (w - 1) / (wo - 1) if wo > 1 else 0.0
    else:
        sh, sw = h / ho, w / wo
    rows, bw, warps, prefetch = config or _resize_config(n * c, ho, wo)
    n_tx, n_ty = -(-wo // bw), -(-ho // rows)
    with torch.cuda.device(x.device):
        kernels["bicubic"][(n * c * n_ty * n_tx,)](
            x, out, h, w, ho, wo, n_tx, n_ty, sh, sw, ALIGN=align, ROWS=rows, BW=bw, PREFETCH=prefetch, num_warps=warps
        )


MySELU.register_gpu_kernel(myselu_gpu, dtypes=("float32", "float16"))
MyStrangeOp.register_gpu_kernel(strange_op_gpu, dtypes=("float32", "float16"))
MyStrangeOp2.register_gpu_kernel(strange_op2_gpu, dtypes=("float32", "float16"))
DynamicResize.register_gpu_kernel(dynamic_resize_gpu, dtypes=("float32", "float16"))
