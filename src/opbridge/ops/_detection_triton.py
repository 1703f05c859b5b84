"""Triton kernels of the detection ops. Imported on first GPU call only (needs triton).

Conventions: NCHW inputs (made contiguous), float32 arithmetic whatever the
storage dtype, results stored in the output's dtype. Each host function writes
into a preallocated output on the current CUDA stream.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from opbridge.ops._detection_ref import (
    ROI_MAX_SAMPLES,
    check_nms_inputs,
    check_strides,
    deform_conv_geometry,
    map_roi_levels,
    rescale_rois,
)
from opbridge.ops._seed_triton import _cubic_weights, _tile_of
from opbridge.ops._triton_launch import cdiv, launch, next_power_of_2

__all__ = [
    "as_channels_last",
    "batched_nms",
    "deform_conv2d",
    "grid_sample",
    "multi_level_roi_align",
    "roi_align",
]

_FLT_MAX = 3.4028234663852886e38
# Kernel variants ("loop": one lane per pixel of an NCHW plane, channels in an unrolled loop;
# "nhwc": a channels-last copy of the input first, then pixel x channel tiles whose corner reads are
# contiguous runs of channels). Both are tested; benchmarks/gpu_ops.py times the registered one
# against the other. grid_sample's default per (interpolation mode, element size) is the variant
# with the lower total GPU time in benchmarks/gpu_graph_timing.py's nine cases (three sizes, each on
# a jittered, an affine and a uniformly random grid; within 5%, the single launch) on the H200
# (benchmarks/OPLIB.md). The "loop" kernel is fastest on smooth grids, but on random ones every
# lane's gather fetches its own cache sectors and it becomes L2-bound; "nhwc" costs a layout copy
# and one more launch whatever the grid. Bilinear and nearest on NCHW planes of at most 64 KiB take
# the CUDA "plane" kernel instead (opbridge.ops._gridsample_cuda: planes staged in shared memory,
# so a scattered grid costs shared-memory bank conflicts instead of L2 sectors). DCN im2col: "nhwc"
# for groups = 1 ("loop" otherwise), except that large float16 or TF32 convolutions with at most
# 128 output channels take "fused" (_dcn_default_variant).
GRID_VARIANT = {(0, 4): "nhwc", (0, 2): "nhwc", (1, 4): "loop", (1, 2): "nhwc", (2, 4): "nhwc", (2, 2): "nhwc"}
DCN_VARIANT = "nhwc"
# "loop" kernel tiling by interpolation mode: (tile rows, tile columns, channels per program,
# channel unroll, num_warps).
GRID_LOOP_CONFIG = {0: (32, 32, 8, 4, 8), 1: (32, 32, 8, 4, 8), 2: (4, 32, 16, 2, 4)}
# "nhwc" kernel tiling by (interpolation mode, element size): (output pixels, channels at most,
# num_warps) per program; within 2% of the lowest total time of the kernel alone on the three grids
# of benchmarks/gpu_tiling_sweep.py (benchmarks/OPLIB.md).
GRID_NHWC_CONFIG = {
    (0, 4): (16, 64, 4),
    (1, 4): (32, 64, 4),
    (2, 4): (16, 32, 4),
    (0, 2): (32, 64, 4),
    (1, 2): (32, 64, 4),
    (2, 2): (32, 64, 4),
}


# --------------------------------------------------------------------------- layout


@triton.jit
def _to_channels_last_kernel(x_ptr, y_ptr, C, HW, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    # (N, C, HW) -> (N, HW, C), one BLOCK_C x BLOCK_S tile per program
    n = tl.program_id(2).to(tl.int64)
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m = (c[:, None] < C) & (s[None, :] < HW)
    v = tl.load(x_ptr + n * C * HW + c.to(tl.int64)[:, None] * HW + s[None, :], mask=m)
    tl.store(y_ptr + n * HW * C + s.to(tl.int64)[None, :] * C + c[:, None], v, mask=m)


def as_channels_last(x: torch.Tensor) -> torch.Tensor:
    """``x`` (N, C, H, W) as a contiguous (N, H, W, C) tensor: a view when its memory already is
    channels-last (``torch.channels_last``), else a copy by :func:`to_channels_last`."""
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return x.permute(0, 2, 3, 1)
    return to_channels_last(x.contiguous())


def to_channels_last(x: torch.Tensor) -> torch.Tensor:
    """A contiguous (N, H, W, C) copy of a contiguous (N, C, H, W) tensor, tile by tile."""
    n, c, h, w = x.shape
    y = torch.empty((n, h, w, c), dtype=x.dtype, device=x.device)
    if y.numel():
        launch(
            _to_channels_last_kernel,
            (cdiv(h * w, 64), cdiv(c, 64), n),
            x,
            y,
            c,
            h * w,
            BLOCK_C=64,
            BLOCK_S=64,
            num_warps=4,
        )
    return y


# --------------------------------------------------------------------------- grid_sample


# Compiled kernels round align_corners' product on its own with libdevice; Triton's interpreter (the
# CPU tests) has no libdevice, and rounds every operation on its own anyway.
_ROUND_PRODUCT = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))


@triton.jit
def _unnormalize(coord, size, ALIGN: tl.constexpr):
    # PyTorch's formulas and roundings: with align_corners a product rounded on its own (mul_rn: the
    # compiler would fuse a plain product into bicubic's ix - floor(ix), 3e-5 off PyTorch's CUDA
    # kernel); without, (coord + 1) * size - 1 fused, as PyTorch's build does
    if ALIGN:
        if _ROUND_PRODUCT:
            return libdevice.mul_rn((coord + 1.0) * 0.5, size - 1)
        else:
            return (coord + 1.0) * 0.5 * (size - 1)
    else:
        return ((coord + 1.0) * size - 1.0) * 0.5


@triton.jit
def _reflect(x, twice_low, twice_high):
    # PyTorch's reflect_coordinates; twice_low == twice_high (size 1) gives 0
    lo = twice_low * 0.5
    span = (twice_high - twice_low) * 0.5
    safe = tl.where(span > 0, span, 1.0)
    d = tl.abs(x - lo)
    flips = tl.floor(tl.div_rn(d, safe))
    extra = d % safe
    odd = (flips - 2.0 * tl.floor(flips * 0.5)) != 0
    r = tl.where(odd, safe - extra + lo, extra + lo)
    return tl.where(span > 0, r, 0.0)


@triton.jit
def _pad_coord(x, size, PAD: tl.constexpr, ALIGN: tl.constexpr):
    # PyTorch's compute_coordinates (CUDA): 0 zeros (unchanged), 1 border, 2 reflection; then its
    # safe_downgrade_to_int_range: NaN, infinite and out-of-int-range coordinates become -100,
    # outside any plane (bilinear and nearest give 0 there, with finite weights)
    if PAD == 1:
        x = tl.minimum(tl.maximum(x, 0.0), size - 1.0)
    elif PAD == 2:
        if ALIGN:
            x = _reflect(x, 0.0, 2.0 * (size - 1.0))
        else:
            x = _reflect(x, -1.0, 2.0 * size - 1.0)
        x = tl.minimum(tl.maximum(x, 0.0), size - 1.0)
    return tl.where((x >= -2147483648.0) & (x <= 2147483648.0), x, -100.0)


@triton.jit
def _cubic_taps(f, size, PAD: tl.constexpr, ALIGN: tl.constexpr):
    # the padded coordinates of taps -1, 0, 1, 2 around floor f; outside [0, size - 1]: no sample
    return (
        _pad_coord(f - 1.0, size, PAD, ALIGN),
        _pad_coord(f, size, PAD, ALIGN),
        _pad_coord(f + 1.0, size, PAD, ALIGN),
        _pad_coord(f + 2.0, size, PAD, ALIGN),
    )


@triton.jit
def _cubic_row(rowp, oky, xs0, xs1, xs2, xs3, wx0, wx1, wx2, wx3, Wf):
    # one input row of a bicubic sample from an NCHW plane: its four taps along x, in order; a tap
    # outside the row (or a row outside the image, oky false) reads zero
    row = tl.load(rowp + xs0.to(tl.int32), mask=oky & (xs0 >= 0.0) & (xs0 <= Wf - 1.0), other=0.0).to(tl.float32) * wx0
    row += tl.load(rowp + xs1.to(tl.int32), mask=oky & (xs1 >= 0.0) & (xs1 <= Wf - 1.0), other=0.0).to(tl.float32) * wx1
    row += tl.load(rowp + xs2.to(tl.int32), mask=oky & (xs2 >= 0.0) & (xs2 <= Wf - 1.0), other=0.0).to(tl.float32) * wx2
    row += tl.load(rowp + xs3.to(tl.int32), mask=oky & (xs3 >= 0.0) & (xs3 <= Wf - 1.0), other=0.0).to(tl.float32) * wx3
    return row


@triton.jit
def _bilinear_setup(ix, iy, W, H, pm):
    # PyTorch's bilinear corners: top-left index, the four weights and in-bounds masks (nw, ne, sw, se)
    x0f = tl.floor(ix)
    y0f = tl.floor(iy)
    x0 = x0f.to(tl.int32)
    y0 = y0f.to(tl.int32)
    w_nw = ((x0f + 1.0) - ix) * ((y0f + 1.0) - iy)
    w_ne = (ix - x0f) * ((y0f + 1.0) - iy)
    w_sw = ((x0f + 1.0) - ix) * (iy - y0f)
    w_se = (ix - x0f) * (iy - y0f)
    okx0 = (x0 >= 0) & (x0 < W)
    okx1 = (x0 + 1 >= 0) & (x0 + 1 < W)
    oky0 = (y0 >= 0) & (y0 < H)
    oky1 = (y0 + 1 >= 0) & (y0 + 1 < H)
    m_nw = pm & okx0 & oky0
    m_ne = pm & okx1 & oky0
    m_sw = pm & okx0 & oky1
    m_se = pm & okx1 & oky1
    return x0, y0, w_nw, w_ne, w_sw, w_se, m_nw, m_ne, m_sw, m_se


@triton.jit
def _nearest_setup(ix, iy, W, H, pm):
    # nearbyint (round half to even) of both coordinates, and whether the pixel is in bounds
    rx = tl.floor(ix + 0.5)
    rx = tl.where(((rx - ix) == 0.5) & ((rx - 2.0 * tl.floor(rx * 0.5)) != 0), rx - 1.0, rx)
    ry = tl.floor(iy + 0.5)
    ry = tl.where(((ry - iy) == 0.5) & ((ry - 2.0 * tl.floor(ry * 0.5)) != 0), ry - 1.0, ry)
    xx = rx.to(tl.int32)
    yy = ry.to(tl.int32)
    return xx, yy, pm & (xx >= 0) & (xx < W) & (yy >= 0) & (yy < H)


@triton.jit
def _grid_sample_loop_kernel(
    x_ptr,
    g_ptr,
    out_ptr,
    C,
    H,
    W,
    HO,
    WO,
    n_tx,
    n_ty,
    CPG,
    MODE: tl.constexpr,
    PAD: tl.constexpr,
    ALIGN: tl.constexpr,
    TH: tl.constexpr,
    TW: tl.constexpr,
    CU: tl.constexpr,
):
    """One lane per output pixel of a TH x TW tile of one image, CPG channels in an unrolled loop.

    The sample coordinates, corner offsets and weights are computed once per pixel and reused for
    every channel; a 2-D tile keeps the input rows it reads in L1 across its pixels. PyTorch's
    formulas and accumulation order.
    """
    tx, ty, n = _tile_of(tl.program_id(0), n_tx, n_ty)
    r = tl.arange(0, TH * TW)
    oy = ty * TH + r // TW
    ox = tx * TW + r % TW
    pm = (oy < HO) & (ox < WO)
    q = oy * WO + ox
    HWo = HO * WO
    gp = g_ptr + (n * HWo + q) * 2
    gx = tl.load(gp, mask=pm, other=0.0).to(tl.float32)
    gy = tl.load(gp + 1, mask=pm, other=0.0).to(tl.float32)
    Wf = W * 1.0
    Hf = H * 1.0
    ix = _unnormalize(gx, Wf, ALIGN)
    iy = _unnormalize(gy, Hf, ALIGN)
    hw = (H * W).to(tl.int64)
    HWo64 = HWo.to(tl.int64)
    c_first = tl.program_id(1) * CPG
    in0 = x_ptr + (n * C + c_first) * hw
    out0 = out_ptr + (n * C + c_first) * HWo64 + q
    c_count = tl.minimum(CPG, C - c_first)
    if MODE == 0:
        ix = _pad_coord(ix, Wf, PAD, ALIGN)
        iy = _pad_coord(iy, Hf, PAD, ALIGN)
        x0, y0, w_nw, w_ne, w_sw, w_se, m_nw, m_ne, m_sw, m_se = _bilinear_setup(ix, iy, W, H, pm)
        o_nw = y0 * W + x0
        for c0 in range(0, CPG, CU):
            for cu in tl.static_range(CU):
                c = c0 + cu
                cm = c < c_count
                src = in0 + c * hw + o_nw
                acc = tl.load(src, mask=m_nw & cm, other=0.0).to(tl.float32) * w_nw
                acc += tl.load(src + 1, mask=m_ne & cm, other=0.0).to(tl.float32) * w_ne
                acc += tl.load(src + W, mask=m_sw & cm, other=0.0).to(tl.float32) * w_sw
                acc += tl.load(src + W + 1, mask=m_se & cm, other=0.0).to(tl.float32) * w_se
                tl.store(
                    out0 + c * HWo64,
                    acc.to(out_ptr.dtype.element_ty),
                    mask=pm & cm,
                )
    elif MODE == 1:
        ix = _pad_coord(ix, Wf, PAD, ALIGN)
        iy = _pad_coord(iy, Hf, PAD, ALIGN)
        xx, yy, ok = _nearest_setup(ix, iy, W, H, pm)
        o = yy * W + xx
        for c0 in range(0, CPG, CU):
            for cu in tl.static_range(CU):
                c = c0 + cu
                cm = c < c_count
                v = tl.load(in0 + c * hw + o, mask=ok & cm, other=0.0)
                tl.store(
                    out0 + c * HWo64,
                    v.to(out_ptr.dtype.element_ty),
                    mask=pm & cm,
                )
    else:
        x0f = tl.floor(ix)
        y0f = tl.floor(iy)
        tx = ix - x0f
        ty = iy - y0f
        wx0, wx1, wx2, wx3 = _cubic_weights(tx)
        wy0, wy1, wy2, wy3 = _cubic_weights(ty)
        xs0, xs1, xs2, xs3 = _cubic_taps(x0f, Wf, PAD, ALIGN)
        ys0, ys1, ys2, ys3 = _cubic_taps(y0f, Hf, PAD, ALIGN)
        for c0 in range(0, CPG, CU):
            for cu in tl.static_range(CU):
                c = c0 + cu
                cm = c < c_count
                plane = in0 + c * hw
                acc = tl.zeros([TH * TW], tl.float32)
                for j in tl.static_range(4):
                    if j == 0:
                        yj = ys0
                        wy = wy0
                    elif j == 1:
                        yj = ys1
                        wy = wy1
                    elif j == 2:
                        yj = ys2
                        wy = wy2
                    else:
                        yj = ys3
                        wy = wy3
                    oky = pm & cm & (yj >= 0.0) & (yj <= Hf - 1.0)
                    rowp = plane + yj.to(tl.int32) * W
                    row = _cubic_row(rowp, oky, xs0, xs1, xs2, xs3, wx0, wx1, wx2, wx3, Wf)
                    if j == 0:
                        acc = row * wy
                    else:
                        acc += row * wy
                tl.store(
                    out0 + c * HWo64,
                    acc.to(out_ptr.dtype.element_ty),
                    mask=pm & cm,
                )


@triton.jit
def _grid_sample_nhwc_kernel(
    x_ptr,
    g_ptr,
    out_ptr,
    C,
    H,
    W,
    HWo,
    MODE: tl.constexpr,
    PAD: tl.constexpr,
    ALIGN: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """grid_sample from a channels-last input (N, H, W, C) into the NCHW output.

    One program: BLOCK_P output pixels of one image x BLOCK_C channels. Every corner read is a
    contiguous run of channels (one cache line per pixel for up to 128 bytes of channels) instead
    of one gather per channel plane. PyTorch's formulas and accumulation order.
    """
    n = tl.program_id(1).to(tl.int64)
    q = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = q < HWo
    gp = g_ptr + (n * HWo + q) * 2
    gx = tl.load(gp, mask=pm, other=0.0).to(tl.float32)
    gy = tl.load(gp + 1, mask=pm, other=0.0).to(tl.float32)
    Wf = W * 1.0
    Hf = H * 1.0
    ix = _unnormalize(gx, Wf, ALIGN)
    iy = _unnormalize(gy, Hf, ALIGN)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    cm2 = cm[None, :]
    base = x_ptr + n * H * W * C + c[None, :]
    if MODE == 0:
        ix = _pad_coord(ix, Wf, PAD, ALIGN)
        iy = _pad_coord(iy, Hf, PAD, ALIGN)
        x0, y0, w_nw, w_ne, w_sw, w_se, m_nw, m_ne, m_sw, m_se = _bilinear_setup(ix, iy, W, H, pm)
        src = base + (y0 * W + x0).to(tl.int64)[:, None] * C
        acc = tl.load(src, mask=m_nw[:, None] & cm2, other=0.0).to(tl.float32) * w_nw[:, None]
        acc += tl.load(src + C, mask=m_ne[:, None] & cm2, other=0.0).to(tl.float32) * w_ne[:, None]
        acc += tl.load(src + W * C, mask=m_sw[:, None] & cm2, other=0.0).to(tl.float32) * w_sw[:, None]
        acc += tl.load(src + (W + 1) * C, mask=m_se[:, None] & cm2, other=0.0).to(tl.float32) * w_se[:, None]
    elif MODE == 1:
        ix = _pad_coord(ix, Wf, PAD, ALIGN)
        iy = _pad_coord(iy, Hf, PAD, ALIGN)
        xx, yy, ok = _nearest_setup(ix, iy, W, H, pm)
        acc = tl.load(base + (yy * W + xx).to(tl.int64)[:, None] * C, mask=ok[:, None] & cm2, other=0.0)
    else:
        x0f = tl.floor(ix)
        y0f = tl.floor(iy)
        tx = ix - x0f
        ty = iy - y0f
        wx0, wx1, wx2, wx3 = _cubic_weights(tx)
        wx0, wx1, wx2, wx3 = wx0[:, None], wx1[:, None], wx2[:, None], wx3[:, None]
        wy0, wy1, wy2, wy3 = _cubic_weights(ty)
        xs0, xs1, xs2, xs3 = _cubic_taps(x0f, Wf, PAD, ALIGN)
        ys0, ys1, ys2, ys3 = _cubic_taps(y0f, Hf, PAD, ALIGN)
        okx0 = (xs0 >= 0.0) & (xs0 <= Wf - 1.0)
        okx1 = (xs1 >= 0.0) & (xs1 <= Wf - 1.0)
        okx2 = (xs2 >= 0.0) & (xs2 <= Wf - 1.0)
        okx3 = (xs3 >= 0.0) & (xs3 <= Wf - 1.0)
        xi0 = xs0.to(tl.int32)
        xi1 = xs1.to(tl.int32)
        xi2 = xs2.to(tl.int32)
        xi3 = xs3.to(tl.int32)
        acc = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
        for j in tl.static_range(4):
            if j == 0:
                yj = ys0
                wy = wy0
            elif j == 1:
                yj = ys1
                wy = wy1
            elif j == 2:
                yj = ys2
                wy = wy2
            else:
                yj = ys3
                wy = wy3
            oky = pm & (yj >= 0.0) & (yj <= Hf - 1.0)
            rowi = yj.to(tl.int32) * W
            row = tl.load(base + (rowi + xi0).to(tl.int64)[:, None] * C, mask=(oky & okx0)[:, None] & cm2, other=0.0)
            row = row.to(tl.float32) * wx0
            v = tl.load(base + (rowi + xi1).to(tl.int64)[:, None] * C, mask=(oky & okx1)[:, None] & cm2, other=0.0)
            row += v.to(tl.float32) * wx1
            v = tl.load(base + (rowi + xi2).to(tl.int64)[:, None] * C, mask=(oky & okx2)[:, None] & cm2, other=0.0)
            row += v.to(tl.float32) * wx2
            v = tl.load(base + (rowi + xi3).to(tl.int64)[:, None] * C, mask=(oky & okx3)[:, None] & cm2, other=0.0)
            row += v.to(tl.float32) * wx3
            if j == 0:
                acc = row * wy[:, None]
            else:
                acc += row * wy[:, None]
    dst = out_ptr + (n * C + c)[None, :] * HWo + q[:, None]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=pm[:, None] & cm2)


def grid_sample(
    x: torch.Tensor,
    grid: torch.Tensor,
    out: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
    variant: str | None = None,
    config: tuple[int, ...] | None = None,
) -> None:
    """F.grid_sample into ``out`` (N, C, Ho, Wo). ``variant``: "loop", "nhwc" or "plane" (the
    CUDA kernel of :mod:`opbridge.ops._gridsample_cuda`, input planes staged in shared memory).
    Default: "plane" where ``_gridsample_cuda.is_default`` (bilinear or nearest, and bicubic with
    zeros padding, on NCHW planes of at most 64 KiB), else ``GRID_VARIANT[mode, element size]``.
    "nhwc" reads an input whose memory is already channels-last (``torch.channels_last``) in place,
    without the layout copy.

    ``config`` overrides the tiling: (TH, TW, channels per program, channel unroll, num_warps) for
    "loop" (default ``GRID_LOOP_CONFIG[mode]``), (pixels, channels, num_warps) per program for
    "nhwc" (default ``GRID_NHWC_CONFIG[mode, element size]``), (channels, threads, pixels per block
    [, unroll[, blocks per SM[, persistent[, zero border]]]]) for "plane"; benchmarks use it to
    compare tilings.
    Inputs and ``out`` of other shapes than (N, C, H, W), (N, Ho, Wo, 2) and (N, C, Ho, Wo) are refused.
    """
    if interpolation_mode not in (0, 1, 2) or padding_mode not in (0, 1, 2):
        raise ValueError(
            f"mmdeploy::grid_sampler: interpolation_mode {interpolation_mode} / padding_mode {padding_mode} "
            "must be 0, 1 or 2."
        )
    if x.dim() != 4 or grid.dim() != 4 or grid.shape[-1] != 2 or grid.shape[0] != x.shape[0]:
        raise ValueError(
            f"mmdeploy::grid_sampler: input (N, C, H, W) and grid (N, Ho, Wo, 2) expected, got {tuple(x.shape)} "
            f"and {tuple(grid.shape)}."
        )
    want = (x.shape[0], x.shape[1], grid.shape[1], grid.shape[2])
    if tuple(out.shape) != want:
        raise ValueError(f"mmdeploy::grid_sampler: output must be {want} for these inputs, got {tuple(out.shape)}.")
    grid = grid.contiguous()
    n, c, h, w = x.shape
    ho, wo = grid.shape[1], grid.shape[2]
    size = 2 if x.element_size() == 2 else 4
    chosen = variant
    if chosen is None:
        from opbridge.ops import _gridsample_cuda

        plane = _gridsample_cuda.is_default(x, interpolation_mode, padding_mode)
        chosen = "plane" if plane else GRID_VARIANT[interpolation_mode, size]
    if chosen == "nhwc":
        if config:
            bp, bc, warps = config[:3]
        else:
            bp, bc_max, warps = GRID_NHWC_CONFIG[interpolation_mode, size]
            bc = min(bc_max, next_power_of_2(c))
        xt = as_channels_last(x)
        launch(
            _grid_sample_nhwc_kernel,
            (cdiv(ho * wo, bp), n, cdiv(c, bc)),
            xt,
            grid,
            out,
            c,
            h,
            w,
            ho * wo,
            MODE=interpolation_mode,
            PAD=padding_mode,
            ALIGN=bool(align_corners),
            BLOCK_P=bp,
            BLOCK_C=bc,
            num_warps=warps,
        )
        return
    if chosen == "plane":
        from opbridge.ops._gridsample_cuda import grid_sample_plane

        grid_sample_plane(x, grid, out, interpolation_mode, padding_mode, align_corners, config)
        return
    if chosen == "loop":
        x = x.contiguous()
        th, tw, cpg, cu, warps = config or GRID_LOOP_CONFIG[interpolation_mode]
        tw = min(tw, next_power_of_2(wo))
        th = min(th, next_power_of_2(ho))
        cpg = min(cpg, c)
        n_tx, n_ty = cdiv(wo, tw), cdiv(ho, th)
        launch(
            _grid_sample_loop_kernel,
            (n * n_ty * n_tx, cdiv(c, cpg)),
            x,
            grid,
            out,
            c,
            h,
            w,
            ho,
            wo,
            n_tx,
            n_ty,
            cpg,
            MODE=interpolation_mode,
            PAD=padding_mode,
            ALIGN=bool(align_corners),
            TH=th,
            TW=tw,
            CU=cu,
            num_warps=warps,
        )
        return
    raise ValueError(f"grid_sample: unknown variant {chosen!r}; use 'loop', 'nhwc' or 'plane'.")


# --------------------------------------------------------------------------- DCNv2


@triton.jit
def _dcn_samples(off_ptr, mask_ptr, n, dg, k, p, pm, Wo, P, K, KW, DG, H, W, SH, SW, PH, PW, DH, DW):
    # tap k of deform group dg at output pixels p: the sample's top-left corner, the four corner
    # weights and in-bounds masks (torchvision's bilinear rules), and the modulation mask's value
    oh = p // Wo
    ow = p - oh * Wo
    ky = k // KW
    kx = k - ky * KW
    off_base = (n * DG * 2 * K + dg * 2 * K + 2 * k) * P
    dy = tl.load(off_ptr + off_base + p, mask=pm, other=0.0).to(tl.float32)
    dx = tl.load(off_ptr + off_base + P + p, mask=pm, other=0.0).to(tl.float32)
    mval = tl.load(mask_ptr + (n * DG * K + dg * K + k) * P + p, mask=pm, other=0.0).to(tl.float32)
    y = (oh * SH - PH + ky * DH).to(tl.float32) + dy
    x = (ow * SW - PW + kx * DW).to(tl.float32) + dx
    # torchvision's test, as written there: a sample outside (-1, H) x (-1, W) is 0, an infinite
    # one included (its weights, NaN, are not used); a NaN coordinate passes and gives NaN
    inside = ~((y <= -1.0) | (y >= H) | (x <= -1.0) | (x >= W)) & pm
    y0f = tl.floor(y)
    x0f = tl.floor(x)
    ly = tl.where(inside, y - y0f, 0.0)
    lx = tl.where(inside, x - x0f, 0.0)
    hy = tl.where(inside, 1.0 - ly, 0.0)
    hx = tl.where(inside, 1.0 - lx, 0.0)
    y0 = tl.where(inside, y0f, 0.0).to(tl.int32)
    x0 = tl.where(inside, x0f, 0.0).to(tl.int32)
    m00 = inside & (y0 >= 0) & (x0 >= 0)
    m01 = inside & (y0 >= 0) & (x0 + 1 < W)
    m10 = inside & (y0 + 1 < H) & (x0 >= 0)
    m11 = inside & (y0 + 1 < H) & (x0 + 1 < W)
    return y0, x0, hy * hx, hy * lx, ly * hx, ly * lx, m00, m01, m10, m11, mval


@triton.jit
def _dcn_block(pid_p, pid_t, K, DG, P, BLOCK_P: tl.constexpr):
    # axis-1 program index pid_t as (image, deform group, tap), and the output pixels of block pid_p
    k = pid_t % K
    ndg = pid_t // K
    n = (ndg // DG).to(tl.int64)
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    return n, ndg % DG, k, p, p < P


@triton.jit
def _dcn_im2col_loop_kernel(
    x_ptr,
    off_ptr,
    mask_ptr,
    col_ptr,
    Cin,
    H,
    W,
    Wo,
    P,
    K,
    KW,
    DG,
    CDG,
    SH,
    SW,
    PH,
    PW,
    DH,
    DW,
    BLOCK_P: tl.constexpr,
    CB: tl.constexpr,
    CU: tl.constexpr,
):
    """One lane per output pixel of one (image, deform group, tap); CB channels in an unrolled loop."""
    c_start = tl.program_id(2) * CB
    n, dg, k, p, pm = _dcn_block(tl.program_id(0), tl.program_id(1), K, DG, P, BLOCK_P)
    y0, x0, w00, w01, w10, w11, m00, m01, m10, m11, mval = _dcn_samples(
        off_ptr, mask_ptr, n, dg, k, p, pm, Wo, P, K, KW, DG, H, W, SH, SW, PH, PW, DH, DW
    )
    o00 = y0 * W + x0
    hw = H * W
    for c0 in range(0, CB, CU):
        for cu in tl.static_range(CU):
            c = c_start + c0 + cu
            cm = c < CDG
            ch = dg * CDG + c
            src = x_ptr + (n.to(tl.int64) * Cin + ch) * hw + o00
            v = w00 * tl.load(src, mask=m00 & cm, other=0.0).to(tl.float32)
            v += w01 * tl.load(src + 1, mask=m01 & cm, other=0.0).to(tl.float32)
            v += w10 * tl.load(src + W, mask=m10 & cm, other=0.0).to(tl.float32)
            v += w11 * tl.load(src + W + 1, mask=m11 & cm, other=0.0).to(tl.float32)
            row = (n.to(tl.int64) * Cin + ch) * K + k
            tl.store(
                col_ptr + row * P + p,
                (v * mval).to(col_ptr.dtype.element_ty),
                mask=pm & cm,
            )


@triton.jit
def _dcn_im2col_nhwc_kernel(
    x_ptr,
    off_ptr,
    mask_ptr,
    col_ptr,
    Cin,
    H,
    W,
    Wo,
    P,
    K,
    KW,
    DG,
    CDG,
    SH,
    SW,
    PH,
    PW,
    DH,
    DW,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Bilinear im2col from a channels-last input (N, H, W, Cin) into cols (N, P, K * Cin).

    Column k * Cin + c holds tap k of channel c.

    One program: BLOCK_P output pixels of one (image, deform group, tap), the group's channels in
    blocks of BLOCK_C. A sample position is shared by all channels of its deform group, and channels
    are the contiguous axis of both the input and the column buffer, so each corner read and each
    store is a contiguous run of channels per pixel (NCHW gathers touch one cache line per lane).
    torchvision's formulas and order: the four weighted corners, then the mask.
    """
    n, dg, k, p, pm = _dcn_block(tl.program_id(0), tl.program_id(1), K, DG, P, BLOCK_P)
    y0, x0, w00, w01, w10, w11, m00, m01, m10, m11, mval = _dcn_samples(
        off_ptr, mask_ptr, n, dg, k, p, pm, Wo, P, K, KW, DG, H, W, SH, SW, PH, PW, DH, DW
    )
    w00, w01, w10, w11 = w00[:, None], w01[:, None], w10[:, None], w11[:, None]
    m00, m01, m10, m11 = m00[:, None], m01[:, None], m10[:, None], m11[:, None]
    c_first = dg * CDG
    src0 = x_ptr + ((n * H + y0) * W + x0).to(tl.int64)[:, None] * Cin + c_first
    row_step = W * Cin
    dst0 = col_ptr + (n * P + p).to(tl.int64)[:, None] * (K * Cin) + k * Cin + c_first
    m = mval[:, None]
    sm = pm[:, None]
    for c0 in range(0, CDG, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)[None, :]
        cm = c < CDG
        src = src0 + c
        v = w00 * tl.load(src, mask=m00 & cm, other=0.0).to(tl.float32)
        v += w01 * tl.load(src + Cin, mask=m01 & cm, other=0.0).to(tl.float32)
        v += w10 * tl.load(src + row_step, mask=m10 & cm, other=0.0).to(tl.float32)
        v += w11 * tl.load(src + row_step + Cin, mask=m11 & cm, other=0.0).to(tl.float32)
        tl.store(dst0 + c, (v * m).to(col_ptr.dtype.element_ty), mask=sm & cm)


@triton.jit
def _dcn_fused_kernel(
    x_ptr,
    off_ptr,
    mask_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    Cin,
    H,
    W,
    Wo,
    P,
    Cout,
    W_SK,
    W_SN,
    KW,
    SH,
    SW,
    PH,
    PW,
    DH,
    DW,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    TF32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Implicit GEMM from a channels-last input (N, H, W, Cin): out[n, co, p] = sum over (tap, c) of
    W[tap * Cin + c, co] * bilinear(x[n, :, :, c], p, tap) * mask.

    The A tile (pixels x channels of one tap) is sampled straight into registers, each corner read
    a contiguous run of channels per pixel; no column buffer. The weight's strides along the GEMM's
    K (tap, channel) and N (output channel) axes are W_SK and W_SN: one of them is 1, which Triton
    specializes on, so the B tile's layout is known when compiling (TF32's wgmma wants it K-major).
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    n = tl.program_id(2).to(tl.int64)
    p = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pm = p < P
    co = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    com = co < Cout
    row_step = W * Cin
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for tap in range(K):
        y0, x0, w00, w01, w10, w11, m00, m01, m10, m11, mv = _dcn_samples(
            off_ptr, mask_ptr, n, 0, tap, p, pm, Wo, P, K, KW, 1, H, W, SH, SW, PH, PW, DH, DW
        )
        w00, w01, w10, w11 = w00[:, None], w01[:, None], w10[:, None], w11[:, None]
        m00, m01, m10, m11 = m00[:, None], m01[:, None], m10[:, None], m11[:, None]
        mv = mv[:, None]
        src0 = x_ptr + ((n * H + y0) * W + x0).to(tl.int64)[:, None] * Cin
        for c0 in range(0, Cin, BLOCK_K):
            c = c0 + tl.arange(0, BLOCK_K)
            cm = c < Cin
            src = src0 + c[None, :]
            cm2 = cm[None, :]
            a = w00 * tl.load(src, mask=m00 & cm2, other=0.0).to(tl.float32)
            a += w01 * tl.load(src + Cin, mask=m01 & cm2, other=0.0).to(tl.float32)
            a += w10 * tl.load(src + row_step, mask=m10 & cm2, other=0.0).to(tl.float32)
            a += w11 * tl.load(src + row_step + Cin, mask=m11 & cm2, other=0.0).to(tl.float32)
            a = a * mv
            bt = tl.load(
                w_ptr + (tap * Cin + c)[:, None] * W_SK + co[None, :] * W_SN,
                mask=cm[:, None] & com[None, :],
                other=0.0,
            )
            if TF32:
                acc = tl.dot(a, bt.to(tl.float32), acc, input_precision="tf32")
            else:
                acc = tl.dot(a.to(bt.dtype), bt, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + co, mask=com, other=0.0).to(tl.float32)[None, :]
    dst = out_ptr + (n * Cout + co)[None, :] * P + p[:, None]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=pm[:, None] & com[None, :])


@triton.jit
def _channel_bias_kernel(out_ptr, b_ptr, C, P, BLOCK: tl.constexpr):
    # out (N, C, P) += bias[c]
    row = tl.program_id(1)
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = p < P
    b = tl.load(b_ptr + row % C).to(tl.float32)
    ptr = out_ptr + row.to(tl.int64) * P + p
    tl.store(ptr, (tl.load(ptr, mask=m).to(tl.float32) + b).to(out_ptr.dtype.element_ty), mask=m)


def _dcn_nhwc_config(cdg: int, element_size: int) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_C, num_warps) of the channels-last im2col: within 2% of the fastest tiling of
    benchmarks/gpu_tiling_sweep.py's DCNv2 sweep at ResNet-50 stages 2-4 on the H200."""
    return 32 if element_size == 2 else 16, min(64, next_power_of_2(cdg)), 4


def _dcn_default_variant(dot: bool, n: int, p: int, cout: int, groups: int, deform_groups: int) -> str:
    """The variant used when none is named: "fused" where ``tl.dot`` takes the inputs (``dot``:
    float16, or float32 with TF32 allowed), for at most 128 output channels and enough pixels to
    fill the GPU (at least 256 programs of 128 output pixels); else :data:`DCN_VARIANT`.

    There the implicit GEMM skips the column buffer (151 MB in float32 at ResNet-50 stage 2, more
    than the GEMM costs): on the H200, 0.71-0.89x the GPU time of "nhwc" in TF32 and 0.95-1.02x in
    float16, with two launches fewer. With more output channels the A tile is sampled once per 128
    of them and cuBLAS's GEMM wins; with fewer programs the fused kernel leaves SMs idle
    (benchmarks/OPLIB.md, ``gpu_tiling_sweep.py --only dcn-fused``).
    """
    if dot and (groups, deform_groups) == (1, 1) and cout <= 128 and n * p >= 256 * 128:
        return "fused"
    return DCN_VARIANT


def deform_conv2d(
    x: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
    deform_groups: int,
    variant: str | None = None,
    config: tuple[int, int, int] | None = None,
    fused_config: tuple[int, int, int, int, int] | None = None,
) -> None:
    """DCNv2 into ``out``.

    Variants (the default: :func:`_dcn_default_variant`): "nhwc" (groups = 1): a channels-last copy
    of the input, a Triton bilinear im2col (mask applied) whose reads and writes are contiguous runs
    of channels into a (N, P, K * Cin) column buffer, one batched cuBLAS matmul, then the bias;
    "loop": the same from the NCHW input into a (N, Cin * K, P) buffer (per-channel gathers; any groups);
    "fused": implicit GEMM with ``tl.dot`` from the channels-last input, no column buffer
    (groups = 1, deform_groups = 1, float16, or float32 when TF32 is allowed). A variant that does
    not apply falls back to "loop". "nhwc" and "fused" read an input whose memory is already
    channels-last in place, without the layout copy. ``config`` (BLOCK_P, BLOCK_C, num_warps)
    overrides the "nhwc" im2col tiling, ``fused_config`` (BLOCK_M, BLOCK_N, BLOCK_K, num_warps,
    num_stages) the "fused" one. float32 follows
    ``torch.backends.cuda.matmul.allow_tf32`` like every PyTorch matmul.
    """
    (sh, sw), (ph, pw), (dh, dw), ho, wo = deform_conv_geometry(
        tuple(x.shape),
        tuple(offset.shape),
        tuple(mask.shape),
        tuple(weight.shape),
        stride,
        padding,
        dilation,
        groups,
        deform_groups,
        None if bias is None else tuple(bias.shape),
    )
    if not out.is_contiguous():
        raise ValueError(
            f"deform_conv2d: out must be a contiguous (N, Cout, Ho, Wo) tensor; got strides {tuple(out.stride())}. "
            "Pass torch.empty(shape) and copy the result where it belongs."
        )
    offset, mask = offset.contiguous(), mask.contiguous()
    n, cin, h, w = x.shape
    cout, cin_g, kh, kw = weight.shape
    k, p = kh * kw, ho * wo
    cdg = cin // deform_groups
    tf32 = x.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    dot = tf32 or x.dtype == torch.float16
    chosen = variant or _dcn_default_variant(dot, n, p, cout, groups, deform_groups)
    if (chosen == "nhwc" and groups != 1) or (chosen == "fused" and (groups, deform_groups) != (1, 1)):
        chosen = "loop"  # a variant that does not apply (groups, deform groups)
    if chosen == "fused" and x.dtype == torch.float32 and not tf32:
        chosen = "loop"  # the fused variant's tl.dot needs TF32 (or float16) inputs
    if chosen == "loop":
        x = x.contiguous()
    if chosen == "fused":
        if tf32:
            # weights as (Cout, tap, Cin): the GEMM's B operand K-major, as TF32's wgmma reads it
            wt = weight.to(x.dtype).permute(0, 2, 3, 1).reshape(cout, k * cin).contiguous()
            w_sk, w_sn = 1, k * cin
        else:
            # weights as (tap, Cin, Cout): contiguous along Cout (float16's wgmma reads either layout)
            wt = weight.to(x.dtype).permute(2, 3, 1, 0).reshape(k * cin, cout).contiguous()
            w_sk, w_sn = cout, 1
        # 128 pixels x 128 output channels per program, 4 warps, 3 stages; 32 input channels per step
        # in float16, 16 in TF32: the fastest of the tilings in benchmarks/OPLIB.md on the H200
        bm, bn, bk, warps, stages = fused_config or (
            128,
            min(128, max(16, next_power_of_2(cout))),
            min(16 if tf32 else 32, max(16, next_power_of_2(cin))),
            4,
            3,
        )
        programs = (cdiv(p, bm), cdiv(cout, bn), n)
        launch(
            _dcn_fused_kernel,
            programs,
            as_channels_last(x),
            offset,
            mask,
            wt,
            bias if bias is not None else wt,
            out,
            cin,
            h,
            w,
            wo,
            p,
            cout,
            w_sk,
            w_sn,
            kw,
            sh,
            sw,
            ph,
            pw,
            dh,
            dw,
            K=k,
            HAS_BIAS=bias is not None,
            TF32=tf32,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            num_warps=warps,
            num_stages=stages,
        )
        return
    if chosen == "nhwc":
        bp, bc, warps = config or _dcn_nhwc_config(cdg, x.element_size())
        xt = as_channels_last(x)
        kc = k * cin
        cols = torch.empty((n, p, kc), dtype=x.dtype, device=x.device)
        launch(
            _dcn_im2col_nhwc_kernel,
            (cdiv(p, bp), n * deform_groups * k),
            xt,
            offset,
            mask,
            cols,
            cin,
            h,
            w,
            wo,
            p,
            k,
            kw,
            deform_groups,
            cdg,
            sh,
            sw,
            ph,
            pw,
            dh,
            dw,
            BLOCK_P=bp,
            BLOCK_C=bc,
            num_warps=warps,
        )
        # out[n] (Cout, P) = W (Cout, K * Cin) @ cols[n]^T, the weight's columns ordered (tap, channel)
        wt = weight.to(x.dtype).permute(0, 2, 3, 1).reshape(cout, kc)
        torch.matmul(wt, cols.transpose(1, 2), out=out.view(n, cout, p))
        if bias is not None:
            launch(
                _channel_bias_kernel,
                (cdiv(p, 1024), n * cout),
                out,
                bias.contiguous(),
                cout,
                p,
                BLOCK=1024,
                num_warps=4,
            )
        return
    if chosen != "loop":
        raise ValueError(f"deform_conv2d: unknown variant {chosen!r}; use 'nhwc', 'loop' or 'fused'.")
    cols = torch.empty((n, cin * k, p), dtype=x.dtype, device=x.device)
    block_p, cb = 128, min(32, next_power_of_2(cdg))
    programs = (cdiv(p, block_p), n * deform_groups * k, cdiv(cdg, cb))
    launch(
        _dcn_im2col_loop_kernel,
        programs,
        x,
        offset,
        mask,
        cols,
        cin,
        h,
        w,
        wo,
        p,
        k,
        kw,
        deform_groups,
        cdg,
        sh,
        sw,
        ph,
        pw,
        dh,
        dw,
        BLOCK_P=block_p,
        CB=cb,
        CU=4,
        num_warps=4,
    )
    wg = weight.to(x.dtype).reshape(groups, cout // groups, cin_g * k)
    res = out.view(n, groups, cout // groups, p)
    torch.matmul(wg, cols.view(n, groups, cin_g * k, p), out=res)
    if bias is not None:
        out.add_(bias.to(out.dtype).view(1, cout, 1, 1))


# --------------------------------------------------------------------------- RoIAlign


@triton.jit
def _roi_axis(v, size, NAN: tl.constexpr):
    # MMCV's bilinear rule along one axis: clamped at 0, the last pixel's rule; (low, high, fraction).
    # NAN: a NaN coordinate reads pixel 0 with NaN weights, as the CPU kernels (kept out of max(),
    # the int cast and the last-pixel rule)
    if NAN:
        vnan = v != v
        v = tl.where(vnan, v, tl.maximum(v, 0.0))
        lo = tl.where(vnan, 0.0, v).to(tl.int32)
        last = (lo >= size - 1) & ~vnan
        lo = tl.where(last, size - 1, lo)
        v = tl.where(last, lo.to(tl.float32), v)
        hi = tl.minimum(tl.where(last, lo, lo + 1), size - 1)
    else:
        v = tl.maximum(v, 0.0)
        lo = v.to(tl.int32)
        last = lo >= size - 1
        lo = tl.where(last, size - 1, lo)
        v = tl.where(last, lo.to(tl.float32), v)
        hi = tl.where(last, lo, lo + 1)
    return lo, hi, v - lo.to(tl.float32)


@triton.jit
def _roi_bins(
    feat_ptr, base, H, W, em, y1, bh, step_h, x1, bw, step_w, ph, pw, gh, gw, POOL_MAX: tl.constexpr, NAN: tl.constexpr
):
    # the bins' pooled samples: summed (avg) or maxed (max; NaN wins, as in the reference)
    Hf = H * 1.0
    Wf = W * 1.0
    if POOL_MAX:
        acc = tl.full(ph.shape, -3.4028234663852886e38, tl.float32)
    else:
        acc = tl.zeros(ph.shape, tl.float32)
    for iy in range(gh):
        y = y1 + ph.to(tl.float32) * bh + (iy + 0.5) * step_h
        youts = (y < -1.0) | (y > Hf)
        y0, y1i, ly = _roi_axis(y, H, NAN)
        hy = 1.0 - ly
        for ix in range(gw):
            x = x1 + pw.to(tl.float32) * bw + (ix + 0.5) * step_w
            outs = youts | (x < -1.0) | (x > Wf)
            x0, x1i, lx = _roi_axis(x, W, NAN)
            hx = 1.0 - lx
            lm = em & ~outs
            v00 = tl.load(feat_ptr + base + y0 * W + x0, mask=lm, other=0.0).to(tl.float32)
            v01 = tl.load(feat_ptr + base + y0 * W + x1i, mask=lm, other=0.0).to(tl.float32)
            v10 = tl.load(feat_ptr + base + y1i * W + x0, mask=lm, other=0.0).to(tl.float32)
            v11 = tl.load(feat_ptr + base + y1i * W + x1i, mask=lm, other=0.0).to(tl.float32)
            val = hy * hx * v00 + hy * lx * v01 + ly * hx * v10 + ly * lx * v11
            val = tl.where(outs, 0.0, val)
            if POOL_MAX:
                acc = tl.where((val != val) | (acc != acc), acc + val, tl.maximum(acc, val))
            else:
                acc += val
    return acc


@triton.jit
def _roi_align_kernel(
    feat_ptr,
    rois_ptr,
    lvl_ptr,
    out_ptr,
    N,
    C,
    H,
    W,
    spatial_scale,
    sampling_ratio,
    level,
    max_side,
    max_grid,
    PH: tl.constexpr,
    PW: tl.constexpr,
    POOL_MAX: tl.constexpr,
    ALIGNED: tl.constexpr,
    USE_LEVEL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    em = e < C * PH * PW
    bf = tl.load(rois_ptr + r * 5).to(tl.float32)
    rx1 = tl.load(rois_ptr + r * 5 + 1).to(tl.float32)
    ry1 = tl.load(rois_ptr + r * 5 + 2).to(tl.float32)
    rx2 = tl.load(rois_ptr + r * 5 + 3).to(tl.float32)
    ry2 = tl.load(rois_ptr + r * 5 + 4).to(tl.float32)
    run = (bf > -1.0) & (bf < N)  # the index truncates, as int(); NaN fails
    b = tl.where(run, bf, 0.0).to(tl.int32)
    if USE_LEVEL:
        run = run & (tl.load(lvl_ptr + r) == level)
    off = 0.5 if ALIGNED else 0.0
    x1 = rx1 * spatial_scale - off
    y1 = ry1 * spatial_scale - off
    rw = rx2 * spatial_scale - off - x1
    rh = ry2 * spatial_scale - off - y1
    if not ALIGNED:
        rw = tl.maximum(rw, 1.0)
        rh = tl.maximum(rh, 1.0)
    # IEEE division where a ceil follows: an approximate quotient of 14 / 7 may land above 2
    bh = tl.div_rn(rh, PH * 1.0)
    bw = tl.div_rn(rw, PW * 1.0)
    if sampling_ratio > 0:
        gh = sampling_ratio
        gw = sampling_ratio
    else:
        # a grid that is NaN, infinite or over ROI_MAX_SAMPLES samples in all: the RoI is not run
        fh = tl.ceil(bh)
        fw = tl.ceil(bw)
        fh = tl.where(fh > 0.0, fh, tl.where(fh == fh, 0.0, fh))
        fw = tl.where(fw > 0.0, fw, tl.where(fw == fw, 0.0, fw))
        side = (fh <= max_side) & (fw <= max_side)
        gh = tl.where(side, fh, 0.0).to(tl.int32)
        gw = tl.where(side, fw, 0.0).to(tl.int32)
        run = run & side & (gh.to(tl.int64) * gw.to(tl.int64) <= max_grid)
    gh = tl.where(run, gh, 0)
    gw = tl.where(run, gw, 0)
    c = e // (PH * PW)
    rem = e - c * (PH * PW)
    ph = rem // PW
    pw = rem - ph * PW
    base = (b.to(tl.int64) * C + c) * (H * W)
    step_h = bh / tl.maximum(gh, 1).to(tl.float32)
    step_w = bw / tl.maximum(gw, 1).to(tl.float32)
    # NaN sample coordinates come only from a box whose geometry is not finite (with a fixed sampling
    # ratio: an adaptive grid is not run then); their handling costs 2-7% and runs only for such boxes
    finite = ((x1 - x1) == 0.0) & ((y1 - y1) == 0.0) & ((bw - bw) == 0.0) & ((bh - bh) == 0.0)
    if finite:
        acc = _roi_bins(feat_ptr, base, H, W, em, y1, bh, step_h, x1, bw, step_w, ph, pw, gh, gw, POOL_MAX, False)
    else:
        acc = _roi_bins(feat_ptr, base, H, W, em, y1, bh, step_h, x1, bw, step_w, ph, pw, gh, gw, POOL_MAX, True)
    if not POOL_MAX:
        acc = acc / tl.maximum(gh * gw, 1).to(tl.float32)
    tl.store(
        out_ptr + r.to(tl.int64) * (C * PH * PW) + e,
        acc.to(out_ptr.dtype.element_ty),
        mask=em & run,
    )


def _launch_roi(
    feat: torch.Tensor,
    rois: torch.Tensor,
    out: torch.Tensor,
    spatial_scale: float,
    sampling_ratio: int,
    pool_max: bool,
    aligned: bool,
    levels: torch.Tensor | None = None,
    level: int = 0,
) -> None:
    n, c, h, w = feat.shape
    r, _, ph, pw = out.shape
    if r == 0:
        return
    block = min(128, next_power_of_2(c * ph * pw))
    programs = (r, cdiv(c * ph * pw, block))
    launch(
        _roi_align_kernel,
        programs,
        feat,
        rois,
        levels if levels is not None else rois,
        out,
        n,
        c,
        h,
        w,
        float(spatial_scale),
        int(sampling_ratio),
        int(level),
        float(ROI_MAX_SAMPLES),
        ROI_MAX_SAMPLES // (ph * pw),
        PH=ph,
        PW=pw,
        POOL_MAX=bool(pool_max),
        ALIGNED=bool(aligned),
        USE_LEVEL=levels is not None,
        BLOCK=block,
        num_warps=4,
    )


def roi_align(
    feat: torch.Tensor,
    rois: torch.Tensor,
    out: torch.Tensor,
    spatial_scale: float,
    sampling_ratio: int,
    pool_max: bool,
    aligned: bool,
) -> None:
    """MMCV roi_align into ``out`` (R, C, PH, PW). RoIs with a batch index outside the input (NaN
    included), or with an adaptive sampling grid that is not finite or over ``ROI_MAX_SAMPLES`` samples,
    are left unwritten (a plugin cannot raise; the CPU kernels name them)."""
    _launch_roi(
        feat.contiguous(),
        rois.float().contiguous(),
        out,
        spatial_scale,
        sampling_ratio,
        pool_max,
        aligned,
    )


def multi_level_roi_align(
    rois: torch.Tensor,
    feats: list[torch.Tensor],
    out: torch.Tensor,
    featmap_strides: tuple[float, ...],
    sampling_ratio: int,
    pool_max: bool,
    roi_scale_factor: float,
    finest_scale: int,
    aligned: bool,
) -> None:
    """MMDet SingleRoIExtractor into ``out``: levels and rescale on the GPU, one RoIAlign launch per level."""
    check_strides("mmdeploy::MMCVMultiLevelRoiAlign", featmap_strides, len(feats))
    r32 = rois.float()
    levels = map_roi_levels(r32, len(feats), finest_scale).to(torch.int32)
    if roi_scale_factor > 0 and roi_scale_factor != 1.0:
        r32 = rescale_rois(r32, roi_scale_factor)
    r32 = r32.contiguous()
    for lvl, (feat, stride) in enumerate(zip(feats, featmap_strides)):
        _launch_roi(
            feat.contiguous(),
            r32,
            out,
            1.0 / stride,
            sampling_ratio,
            pool_max,
            aligned,
            levels,
            lvl,
        )


# --------------------------------------------------------------------------- batched NMS


@triton.jit
def _nms_kernel(boxes_ptr, valid_ptr, keep_ptr, K, thr, BLOCK: tl.constexpr):
    """Greedy NMS over one (image, class) segment of K score-sorted candidates."""
    seg = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    jm = j < K
    bb = boxes_ptr + seg * K * 4
    x1 = tl.load(bb + j * 4, mask=jm, other=0.0)
    y1 = tl.load(bb + j * 4 + 1, mask=jm, other=0.0)
    x2 = tl.load(bb + j * 4 + 2, mask=jm, other=0.0)
    y2 = tl.load(bb + j * 4 + 3, mask=jm, other=0.0)
    keep = tl.load(valid_ptr + seg * K + j, mask=jm, other=0) != 0
    nvalid = tl.sum(keep.to(tl.int32))
    aw = x2 - x1
    ah = y2 - y1
    area = tl.where((aw < 0) | (ah < 0), 0.0, aw * ah)
    for i in range(nvalid):
        ki = tl.sum(tl.where((j == i) & keep, 1, 0))
        if ki > 0:
            bx1 = tl.load(bb + i * 4)
            by1 = tl.load(bb + i * 4 + 1)
            bx2 = tl.load(bb + i * 4 + 2)
            by2 = tl.load(bb + i * 4 + 3)
            bw = bx2 - bx1
            bh = by2 - by1
            barea = tl.where((bw < 0) | (bh < 0), 0.0, bw * bh)
            iw = tl.minimum(x2, bx2) - tl.maximum(x1, bx1)
            ih = tl.minimum(y2, by2) - tl.maximum(y1, by1)
            inter = tl.where((iw > 0) & (ih > 0), iw * ih, 0.0)
            union = area + barea - inter
            iou = tl.where(inter > 0, tl.div_rn(inter, tl.where(inter > 0, union, 1.0)), 0.0)
            keep = keep & ~((iou > thr) & (j > i))
    tl.store(keep_ptr + seg * K + j, keep.to(tl.int8), mask=jm)


def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    dets: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    background_label_id: int,
    iou_threshold: float,
    score_threshold: float,
    topk: int,
    clip_boxes: bool,
    return_index: bool = False,
) -> None:
    """MMDeploy TRTBatchedNMS into ``dets`` (B, keep_topk, 5) and ``labels`` (B, keep_topk) int32.

    Per-class threshold + stable sort (torch), greedy NMS per (image, class) in one
    Triton program each, then a stable sort over the survivors of all classes.
    """
    check_nms_inputs(
        "mmdeploy::TRTBatchedNMS",
        tuple(boxes.shape),
        tuple(scores.shape),
        num_classes,
        return_index,
        dets.shape[1],
        boxes.is_floating_point() and scores.is_floating_point(),
    )
    b, n, c = scores.shape
    keep_topk = dets.shape[1]
    k = topk if 0 < topk <= n else n
    s = scores.float().transpose(1, 2)  # B, C, N
    key = torch.where(s > score_threshold, s, torch.full_like(s, -math.inf))
    if 0 <= background_label_id < c:
        key[:, background_label_id] = -math.inf
    sorted_scores, order = torch.sort(key, dim=2, descending=True, stable=True)
    sorted_scores, order = sorted_scores[:, :, :k].contiguous(), order[:, :, :k]
    bx = boxes.float()
    if bx.shape[2] == 1:
        cand = torch.gather(
            bx[:, :, 0].unsqueeze(1).expand(b, c, n, 4),
            2,
            order.unsqueeze(-1).expand(b, c, k, 4),
        )
    else:
        cand = torch.gather(bx.transpose(1, 2), 2, order.unsqueeze(-1).expand(b, c, k, 4))
    cand = cand.contiguous()
    # a score that passed the threshold (+inf included) sorts above -inf
    valid = (sorted_scores > -math.inf).to(torch.int8).contiguous()
    keep = torch.empty_like(valid)
    if k:
        launch(
            _nms_kernel,
            (b * c,),
            cand,
            valid,
            keep,
            k,
            float(iou_threshold),
            BLOCK=next_power_of_2(k),
            num_warps=8 if k > 1024 else 4,
        )
    flat = torch.where(keep.bool(), sorted_scores, torch.full_like(sorted_scores, -math.inf)).view(b, c * k)
    top_scores, top = torch.sort(flat, dim=1, descending=True, stable=True)
    m = min(keep_topk, c * k)
    top_scores, top = top_scores[:, :m], top[:, :m]
    found = top_scores > -math.inf
    sel_boxes = torch.gather(cand.view(b, c * k, 4), 1, top.unsqueeze(-1).expand(b, m, 4))
    if clip_boxes:
        sel_boxes = sel_boxes.clamp(0.0, 1.0)
    dets.zero_()
    labels.fill_(-1)
    dets[:, :m, :4] = torch.where(found.unsqueeze(-1), sel_boxes, 0.0).to(dets.dtype)
    dets[:, :m, 4] = torch.where(found, top_scores, 0.0).to(dets.dtype)
    labels[:, :m] = torch.where(found, (top // k).to(torch.int32), -1)
