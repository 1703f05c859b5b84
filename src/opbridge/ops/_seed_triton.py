"""Triton kernels of the seed ops' GPU entry points (opbridge.ops._seed_gpu).

Imported on the first GPU call only (needs triton). Every kernel computes in float32
whatever the storage dtype and stores in the output's dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["bicubic_int_kernel", "bicubic_kernel", "silu_kernel"]


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
def _cubic_weights(t):
    # the weights of taps -1, 0, 1, 2 at fraction t (PyTorch's get_cubic_upsample_coefficients)
    return _cc2(t + 1.0), _cc1(t), _cc1(1.0 - t), _cc2((1.0 - t) + 1.0)


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
def _tile_of(pid, n_tx, n_ty):
    # program pid's tile column, tile row and plane (int64), planes of n_ty x n_tx tiles in a row
    tx = pid % n_tx
    t = pid // n_tx
    return tx, t % n_ty, (t // n_ty).to(tl.int64)


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
    tx, ty, plane = _tile_of(tl.program_id(0), n_tx, n_ty)
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


# ---------------------------------------------------------------- integer upscaling factors
#
# Upscaling by an integer factor K (2 or 4) with half-pixel centres: output column K*i + p samples
# at i + (p + 0.5) / K - 0.5, so every output "phase" p has the same fractional offset and the
# same four weights on every row and column, and its taps are input columns i-2..i+1 (p < K/2)
# or i-1..i+2. A lane owns input column i and its K output columns; it reads the five columns
# i-2..i+2 of each input row (coalesced across the warp) once for K x K outputs per row step.
# The weights equal PyTorch's (scale 1/K is exact for K = 2 and 4, so are the offsets).


@triton.jit
def _phase(m2, m1, c0, p1, p2, P: tl.constexpr, K: tl.constexpr):
    # phase P of K interpolated from the five neighbours -2..2: taps -2..1 (P < K/2) or -1..2;
    # the offset and weights are compile-time constants, by PyTorch's formulas
    s = (tl.full([], P, tl.float32) + 0.5) * (1.0 / K) - 0.5
    w0, w1, w2, w3 = _cubic_weights(s - tl.floor(s))
    if P < K // 2:
        return m2 * w0 + m1 * w1 + c0 * w2 + p1 * w3
    else:
        return m1 * w0 + c0 * w1 + p1 * w2 + p2 * w3


@triton.jit
def _load5(base, r, H, W, xm2, xm1, x0, xp1, xp2):
    # the five neighbouring columns of input row r (clamped, as every column index is)
    row = base + tl.minimum(tl.maximum(r, 0), H - 1) * W
    return tl.load(row + xm2), tl.load(row + xm1), tl.load(row + x0), tl.load(row + xp1), tl.load(row + xp2)


@triton.jit
def _hrow2(v0, v1, v2, v3, v4):
    # one input row interpolated along x at the two output phases of K = 2
    m2, m1, c0 = v0.to(tl.float32), v1.to(tl.float32), v2.to(tl.float32)
    p1, p2 = v3.to(tl.float32), v4.to(tl.float32)
    return _phase(m2, m1, c0, p1, p2, 0, 2), _phase(m2, m1, c0, p1, p2, 1, 2)


@triton.jit
def _hrow4(v0, v1, v2, v3, v4):
    # one input row interpolated along x at the four output phases of K = 4
    m2, m1, c0 = v0.to(tl.float32), v1.to(tl.float32), v2.to(tl.float32)
    p1, p2 = v3.to(tl.float32), v4.to(tl.float32)
    return (
        _phase(m2, m1, c0, p1, p2, 0, 4),
        _phase(m2, m1, c0, p1, p2, 1, 4),
        _phase(m2, m1, c0, p1, p2, 2, 4),
        _phase(m2, m1, c0, p1, p2, 3, 4),
    )


@triton.jit
def bicubic_int_kernel(
    in_ptr,
    out_ptr,
    H,
    W,
    n_tx,
    n_ty,
    K: tl.constexpr,
    BI: tl.constexpr,
    RI: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    # One program: one plane, BI input columns, RI input rows; output (K*H, K*W). Five input rows'
    # x-interpolations (rows r-2..r+2, each at the K phases) slide down as r advances; each row
    # step writes K output rows of K*BI contiguous values. Same order of operations as PyTorch
    # (x first, then y). PREFETCH loads the next row's neighbours one step ahead.
    tx, ty, plane = _tile_of(tl.program_id(0), n_tx, n_ty)
    i = tx * BI + tl.arange(0, BI)
    xm2 = tl.minimum(tl.maximum(i - 2, 0), W - 1)
    xm1 = tl.minimum(tl.maximum(i - 1, 0), W - 1)
    x0 = tl.minimum(i, W - 1)
    xp1 = tl.minimum(i + 1, W - 1)
    xp2 = tl.minimum(i + 2, W - 1)
    WO = W * K
    cols = (i * K)[:, None] + tl.arange(0, K)[None, :]
    cmask = cols < WO
    base = in_ptr + plane * H * W
    obase = out_ptr + plane * H * W * (K * K) + cols
    r0 = ty * RI
    r1 = tl.minimum(r0 + RI, H)
    if K == 2:
        v0, v1, v2, v3, v4 = _load5(base, r0 - 2, H, W, xm2, xm1, x0, xp1, xp2)
        a0, a1 = _hrow2(v0, v1, v2, v3, v4)
        v0, v1, v2, v3, v4 = _load5(base, r0 - 1, H, W, xm2, xm1, x0, xp1, xp2)
        b0, b1 = _hrow2(v0, v1, v2, v3, v4)
        v0, v1, v2, v3, v4 = _load5(base, r0, H, W, xm2, xm1, x0, xp1, xp2)
        c0, c1 = _hrow2(v0, v1, v2, v3, v4)
        v0, v1, v2, v3, v4 = _load5(base, r0 + 1, H, W, xm2, xm1, x0, xp1, xp2)
        d0, d1 = _hrow2(v0, v1, v2, v3, v4)
        v0, v1, v2, v3, v4 = _load5(base, r0 + 2, H, W, xm2, xm1, x0, xp1, xp2)
        for r in range(r0, r1):
            if PREFETCH:
                e0, e1 = _hrow2(v0, v1, v2, v3, v4)
                v0, v1, v2, v3, v4 = _load5(base, r + 3, H, W, xm2, xm1, x0, xp1, xp2)
            else:
                v0, v1, v2, v3, v4 = _load5(base, r + 2, H, W, xm2, xm1, x0, xp1, xp2)
                e0, e1 = _hrow2(v0, v1, v2, v3, v4)
            orow = obase + (r * K) * WO
            y0 = tl.join(_phase(a0, b0, c0, d0, e0, 0, 2), _phase(a1, b1, c1, d1, e1, 0, 2))
            tl.store(orow, y0.to(out_ptr.dtype.element_ty), mask=cmask)
            y1 = tl.join(_phase(a0, b0, c0, d0, e0, 1, 2), _phase(a1, b1, c1, d1, e1, 1, 2))
            tl.store(orow + WO, y1.to(out_ptr.dtype.element_ty), mask=cmask)
            a0, a1 = b0, b1
            b0, b1 = c0, c1
            c0, c1 = d0, d1
            d0, d1 = e0, e1
    else:
        v0, v1, v2, v3, v4 = _load5(base, r0 - 2, H, W, xm2, xm1, x0, xp1, xp2)
        a0, a1, a2, a3 = _hrow4(v0, v1, v2, v3, v4)
        v0, v1, v2, v3, v4 = _load5(base, r0 - 1, H, W, xm2, xm1, x0, xp1, xp2)
        b0, b1, b2, b3 = _hrow4(v0, v1, v2, v3, v4)
        v0, v1, v2, v3, v4 = _load5(base, r0, H, W, xm2, xm1, x0, xp1, xp2)
        c0, c1, c2, c3 = _hrow4(v0, v1, v2, v3, v4)
        v0, v1, v2, v3, v4 = _load5(base, r0 + 1, H, W, xm2, xm1, x0, xp1, xp2)
        d0, d1, d2, d3 = _hrow4(v0, v1, v2, v3, v4)
        v0, v1, v2, v3, v4 = _load5(base, r0 + 2, H, W, xm2, xm1, x0, xp1, xp2)
        for r in range(r0, r1):
            if PREFETCH:
                e0, e1, e2, e3 = _hrow4(v0, v1, v2, v3, v4)
                v0, v1, v2, v3, v4 = _load5(base, r + 3, H, W, xm2, xm1, x0, xp1, xp2)
            else:
                v0, v1, v2, v3, v4 = _load5(base, r + 2, H, W, xm2, xm1, x0, xp1, xp2)
                e0, e1, e2, e3 = _hrow4(v0, v1, v2, v3, v4)
            orow = obase + (r * K) * WO
            for q in tl.static_range(4):
                # output row K*r + q; its four phases joined so that each lane stores K contiguous values
                y = tl.join(
                    tl.join(_phase(a0, b0, c0, d0, e0, q, 4), _phase(a2, b2, c2, d2, e2, q, 4)),
                    tl.join(_phase(a1, b1, c1, d1, e1, q, 4), _phase(a3, b3, c3, d3, e3, q, 4)),
                )
                tl.store(orow + q * WO, tl.reshape(y, (BI, 4)).to(out_ptr.dtype.element_ty), mask=cmask)
            a0, a1, a2, a3 = b0, b1, b2, b3
            b0, b1, b2, b3 = c0, c1, c2, c3
            c0, c1, c2, c3 = d0, d1, d2, d3
            d0, d1, d2, d3 = e0, e1, e2, e3
