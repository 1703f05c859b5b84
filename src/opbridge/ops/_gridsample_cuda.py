"""grid_sample's "plane" variant: a CUDA kernel that stages whole input planes in shared memory.

On a grid that scatters its points (the uniformly random grid of benchmarks/gpu_ops.py), every
corner read from global memory fetches a 32-byte L2 sector of its own for 2-4 useful bytes, and the
Triton kernels are bound by L2 bandwidth (benchmarks/OPLIB.md). Here one thread block copies CK
channel planes of one image into shared memory, interleaved (element i of the CK planes side by side),
then computes a range of output pixels of those CK channels from shared memory: each input byte
is read from global memory once per block, and one shared-memory load fetches a corner of CK channels.
Triton cannot index shared memory with per-lane addresses, so this variant is CUDA C, compiled by
NVRTC through ``torch.cuda._compile_kernel`` on first use (one module per specialization) and
launched on the current stream (:mod:`opbridge.ops._nvrtc`). With small planes, persistent blocks
take several work items each and load the next item's planes into registers while they compute
the current one. Bilinear and bicubic with zeros padding stage the planes inside a border of
zeros, so that the taps of a point read shared memory without bounds checks (a quarter fewer
instructions per bilinear output; bicubic 1.1-1.6x faster than without the border).

It applies when CK planes fit in a block's shared memory (:func:`plane_fits`). Its outputs equal
those of PyTorch's CUDA grid_sampler_2d bit for bit: the same formulas, with that kernel's roundings
written out (F.grid_sample runs bilinear with zeros padding and ``align_corners=True`` through cuDNN
where cuDNN is enabled, whose roundings differ in the last bits).

Example:
    >>> from opbridge.ops import _gridsample_cuda as gc  # doctest: +SKIP
    >>> gc.grid_sample_plane(x, grid, out, 0, 0, False)  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from opbridge.ops._nvrtc import PRELUDE, Kernel, compile_kernel, nvrtc_available, sm_count, smem_limit

__all__ = [
    "BORDER_ITEM_BUDGET",
    "PERSISTENT_BUDGET",
    "PLANE_BUDGET",
    "available",
    "default_config",
    "grid_sample_plane",
    "is_default",
    "plane_fits",
    "smem_bytes",
    "smem_limit",
    "uses_border",
]

logger = logging.getLogger(__name__)

# The default tiling, from benchmarks/gpu_tiling_sweep.py --only grid-plane on the H200 (OPLIB.md):
# for bilinear with zeros padding (planes inside a zero border), two channels per block where their
# planes take at most BORDER_ITEM_BUDGET bytes; else persistent blocks of 512 threads with four or
# two channels where their planes take at most PERSISTENT_BUDGET bytes (the plain layout: the border
# made them slower); else two channels per block where their planes take at most PLANE_BUDGET bytes,
# with 512 threads and up to 16384 output pixels per block; else one channel, 1024 threads and up to
# 16384 pixels; the output loop unrolled 4 times.
BORDER_ITEM_BUDGET = 16 * 1024
PERSISTENT_BUDGET = 32 * 1024
PLANE_BUDGET = 64 * 1024
# Where a launch has fewer than SPLIT_BELOW work items per SM, each plane's outputs are split over
# more parts, at least a block's threads each. Each part stages the plane again: one item per SM and
# fewer parts beat two items per SM by 1.04-1.5x in GPU time where the two differ (OPLIB.md).
SPLIT_BELOW = 1
# Interpolation modes "plane" is the default for (bilinear, nearest; bicubic with zeros padding and
# rows of whole 16-byte vectors only), and the largest plane, in bytes, it is the default up to:
# the measured sizes. Bicubic, with 16 shared-memory loads per output, is 1.02-1.10x faster than
# the channels-last kernel event-timed there, and slower on 128 x 128 planes without the border.
PLANE_MODES = (0, 1)
PLANE_DEFAULT_MAX = 64 * 1024

_SOURCE = (
    PRELUDE
    + r"""
#if GRID_HALF
typedef h16 grid_t;
struct __align__(4) grid2_t { h16 x, y; };
#else
typedef float grid_t;
struct __align__(8) grid2_t { float x, y; };
#endif

struct __align__(CK * sizeof(scalar_t)) vec_t { scalar_t v[CK]; };

// PyTorch's grid_sampler_unnormalize with its CUDA build's roundings, explicit so that no
// specialization fuses them differently: with align_corners the product rounded, without it the
// multiply-add fused
__device__ __forceinline__ float unnormalize(float coord, float size) {
#if ALIGN
    return __fmul_rn((coord + 1.0f) * 0.5f, size - 1.0f);
#else
    return __fmaf_rn(coord + 1.0f, size, -1.0f) * 0.5f;
#endif
}

// PyTorch's reflect_coordinates; twice_low == twice_high (size 1) gives 0
__device__ __forceinline__ float reflect(float x, float twice_low, float twice_high) {
    float lo = twice_low * 0.5f;
    float span = (twice_high - twice_low) * 0.5f;
    if (!(span > 0.0f)) return 0.0f;
    float d = fabsf(x - lo);
    float flips = floorf(__fdiv_rn(d, span));
    float extra = fmodf(d, span);
    bool odd = (flips - 2.0f * floorf(flips * 0.5f)) != 0.0f;
    return odd ? span - extra + lo : extra + lo;
}

// PyTorch's compute_coordinates (CUDA): 0 zeros (unchanged), 1 border, 2 reflection
__device__ __forceinline__ float pad_coord(float x, float size) {
#if PAD == 1
    x = fminf(fmaxf(x, 0.0f), size - 1.0f);
#elif PAD == 2
#if ALIGN
    x = reflect(x, 0.0f, 2.0f * (size - 1.0f));
#else
    x = reflect(x, -1.0f, 2.0f * size - 1.0f);
#endif
    x = fminf(fmaxf(x, 0.0f), size - 1.0f);
#endif
    return x;
}


// the CK channels of smem element o, or zeros where ok is false
__device__ __forceinline__ vec_t load(const vec_t* s, int o, bool ok) {
    vec_t v;
    if (ok) {
        v = s[o];
    } else {
#pragma unroll
        for (int k = 0; k < CK; ++k) v.v[k] = (scalar_t)0;
    }
    return v;
}

// acc (+)= w * the CK channels of smem element o, or of zeros where ok is false
__device__ __forceinline__ void tap(float* acc, const vec_t* s, int o, bool ok, float w, bool first) {
    const vec_t v = load(s, o, ok);
    // PyTorch's order: the first product rounded, each next one fused into the sum (explicit, so
    // that the compiler does not fuse a different product of the chain)
#pragma unroll
    for (int k = 0; k < CK; ++k) acc[k] = first ? __fmul_rn(to_f(v.v[k]), w) : __fmaf_rn(to_f(v.v[k]), w, acc[k]);
}

// the kernel's arguments in one struct: one launch parameter (a ctypes.Structure of the same layout)
struct Args {
    const scalar_t* x;
    const grid_t* g;
    scalar_t* out;
    int C, H, W, HWo, groups, parts, chunk, vec_ok, items;
};

// work item `item` (a channel group of one image and a part of its outputs): n, first channel, part
__device__ __forceinline__ void item_of(const Args& a, int item, int& n, int& c0, int& part) {
    part = item % a.parts;
    const int grp = item / a.parts;  // n * groups + channel group
    n = grp / a.groups;
    c0 = (grp - n * a.groups) * CK;
}

#if BORDER
// Zeros padding, bilinear or bicubic: the planes are staged inside a border of zeros BW elements
// wide (BW = 1 for bilinear's taps x0..x0+1, 3 for bicubic's x0-1..x0+2). Row y lies at (y + BW)
// * P + BW with the pitch P = W + BW, after BW zero rows; the BW zero columns before each row also
// end the previous one; then zero rows and elements (BOTTOM in all). Every tap of a point whose
// taps overlap the plane reads the plane or a zero, and any other point reads a block of zeros
// past the last row, so the taps need no bounds checks. Vector staging needs W a multiple of VEC
// (the host's rule).
#if MODE == 0
#define BW 1
#define BOTTOM(P) ((P) + 2)
#else
#define BW 3
#define BOTTOM(P) (4 * (P))
#endif
__device__ __forceinline__ int slot(int W, int i) {
    const int y = i / W;
    return (y + BW) * (W + BW) + (i - y * W) + BW;
}

__device__ __forceinline__ void zero_border(const Args& a, vec_t* s) {
    const int P = a.W + BW, top = BW * P, side = a.H * BW, n = top + side + BOTTOM(P);
    vec_t z;
#pragma unroll
    for (int k = 0; k < CK; ++k) z.v[k] = (scalar_t)0;
    for (int k = threadIdx.x; k < n; k += NT) {
        int idx = k;  // the top rows
        if (k >= top + side) {
            idx = (BW + a.H) * P + (k - top - side);  // the bottom rows
        } else if (k >= top) {
            const int r = (k - top) / BW;
            idx = (BW + r) * P + (k - top - r * BW);  // the columns before row r
        }
        s[idx] = z;
    }
}
#define SLOT(i) slot(a.W, (i))
#else
#define SLOT(i) (i)
#endif

// stage the CK planes of image n from channel c0 into s, interleaved; channels past C read as zeros
__device__ __forceinline__ void stage(const Args& a, vec_t* s, int n, int c0) {
    const int HW = a.H * a.W, C = a.C;
    const scalar_t* __restrict__ xp = a.x + ((long long)n * C + c0) * HW;
#if BORDER
    zero_border(a, s);
#endif
    if (a.vec_ok) {
        const int nv = HW / VEC;
#pragma unroll 4
        for (int j = threadIdx.x; j < nv; j += NT) {
            uint4 raw[CK];
#pragma unroll
            for (int k = 0; k < CK; ++k)
                raw[k] = (c0 + k < C) ? reinterpret_cast<const uint4*>(xp + (long long)k * HW)[j] : make_uint4(0, 0, 0, 0);
            const int d = SLOT(j * VEC);  // the VEC elements lie in one row
#pragma unroll
            for (int t = 0; t < VEC; ++t) {
                vec_t v;
#pragma unroll
                for (int k = 0; k < CK; ++k) v.v[k] = reinterpret_cast<const scalar_t*>(&raw[k])[t];
                s[d + t] = v;
            }
        }
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < HW; i += NT) {
            vec_t v;
#pragma unroll
            for (int k = 0; k < CK; ++k) v.v[k] = (c0 + k < C) ? xp[(long long)k * HW + i] : (scalar_t)0;
            s[SLOT(i)] = v;
        }
    }
}

// the outputs of part `part` of the CK channels from c0 of image n, read from the planes in s
__device__ __forceinline__ void sample(const Args& a, const vec_t* s, int n, int c0, int part) {
    const int C = a.C, H = a.H, W = a.W, HWo = a.HWo;
    const grid2_t* __restrict__ gp = reinterpret_cast<const grid2_t*>(a.g) + (long long)n * HWo;  // 2-element aligned
    scalar_t* __restrict__ op = a.out + ((long long)n * C + c0) * HWo;
    const int q_end = min(HWo, (part + 1) * a.chunk);
    const float Wf = (float)W, Hf = (float)H;
#if UNR
#pragma unroll UNR
#endif
    for (int q = part * a.chunk + threadIdx.x; q < q_end; q += NT) {
        const grid2_t gq = gp[q];
        float ix = unnormalize(to_f(gq.x), Wf);
        float iy = unnormalize(to_f(gq.y), Hf);
        float acc[CK];
#if MODE == 0
        ix = pad_coord(ix, Wf);
        iy = pad_coord(iy, Hf);
        float x0f = floorf(ix), y0f = floorf(iy);
        int x0 = (int)x0f, y0 = (int)y0f;
        float w_nw = ((x0f + 1.0f) - ix) * ((y0f + 1.0f) - iy);
        float w_ne = (ix - x0f) * ((y0f + 1.0f) - iy);
        float w_sw = ((x0f + 1.0f) - ix) * (iy - y0f);
        float w_se = (ix - x0f) * (iy - y0f);
        // Bounds are compared in float: NaN, infinite and huge coordinates fall outside, and such a
        // point gives 0 whatever its weights (PyTorch's CUDA kernel moves these coordinates outside
        // the plane: safe_downgrade_to_int_range)
#if BORDER
        // taps outside the plane read the zero border (the same zeros the checks below give)
        const int P = W + 1;
        const bool in = x0f >= -1.0f && x0f < Wf && y0f >= -1.0f && y0f < Hf;
        const int o = in ? (y0 + 1) * P + x0 + 1 : (H + 1) * P;
        tap(acc, s, o, true, w_nw, true);
        tap(acc, s, o + 1, true, w_ne, false);
        tap(acc, s, o + P, true, w_sw, false);
        tap(acc, s, o + P + 1, true, w_se, false);
#else
        bool okx0 = x0f >= 0.0f && x0f < Wf, okx1 = x0f >= -1.0f && x0f < Wf - 1.0f;
        bool oky0 = y0f >= 0.0f && y0f < Hf, oky1 = y0f >= -1.0f && y0f < Hf - 1.0f;
        const bool in = (okx0 || okx1) && (oky0 || oky1);
        int o = in ? y0 * W + x0 : 0;
        tap(acc, s, o, okx0 && oky0, w_nw, true);
        tap(acc, s, o + 1, okx1 && oky0, w_ne, false);
        tap(acc, s, o + W, okx0 && oky1, w_sw, false);
        tap(acc, s, o + W + 1, okx1 && oky1, w_se, false);
#endif
#pragma unroll
        for (int k = 0; k < CK; ++k) acc[k] = in ? acc[k] : 0.0f;
#elif MODE == 1
        ix = pad_coord(ix, Wf);
        iy = pad_coord(iy, Hf);
        // bounds compared in float: NaN, infinite and huge coordinates read zeros, as in PyTorch
        const float rx = rintf(ix), ry = rintf(iy);
        const bool ok = rx >= 0.0f && rx < Wf && ry >= 0.0f && ry < Hf;
        const int xx = (int)rx, yy = (int)ry;
        // the input's values themselves (no round trip through float), zeros outside
        const vec_t v = s[ok ? yy * W + xx : 0];
#pragma unroll
        for (int k = 0; k < CK; ++k)
            if (c0 + k < C) op[(long long)k * HWo + q] = ok ? v.v[k] : (scalar_t)0;
        continue;
#else
        float x0f = floorf(ix), y0f = floorf(iy);
        float tx = ix - x0f, ty = iy - y0f;
        float wx[4] = {cc2(tx + 1.0f), cc1(tx), cc1(1.0f - tx), cc2((1.0f - tx) + 1.0f)};
        float wy[4] = {cc2(ty + 1.0f), cc1(ty), cc1(1.0f - ty), cc2((1.0f - ty) + 1.0f)};
#if BORDER
        // zeros padding: taps outside the plane read the zero border; a point whose 4 x 4 taps miss
        // the plane reads the zeros past the last row (NaN or infinite weights still make NaN)
        const int x0 = (int)x0f, y0 = (int)y0f, P = W + BW;
        const bool in = x0 >= -2 && x0 <= W && y0 >= -2 && y0 <= H;
        const int o = in ? (y0 + 2) * P + x0 + 2 : (H + BW) * P;
#else
        int xi[4], yi[4];
        bool okx[4], oky[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            float xs = pad_coord(x0f + (float)(t - 1), Wf);
            float ys = pad_coord(y0f + (float)(t - 1), Hf);
            okx[t] = xs >= 0.0f && xs <= Wf - 1.0f;
            oky[t] = ys >= 0.0f && ys <= Hf - 1.0f;
            xi[t] = okx[t] ? (int)xs : 0;
            yi[t] = oky[t] ? (int)ys : 0;
        }
#endif
        // each row's four taps along x, then the four rows along y
        float row[4][CK];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            vec_t v[4];
#pragma unroll
            for (int t = 0; t < 4; ++t) {
#if BORDER
                v[t] = s[o + j * P + t];
#else
                v[t] = load(s, yi[j] * W + xi[t], oky[j] && okx[t]);
#endif
            }
#pragma unroll
            for (int k = 0; k < CK; ++k)
                row[j][k] = taps4(to_f(v[0].v[k]), to_f(v[1].v[k]), to_f(v[2].v[k]), to_f(v[3].v[k]), wx[0], wx[1], wx[2], wx[3]);
        }
#pragma unroll
        for (int k = 0; k < CK; ++k) acc[k] = taps4(row[0][k], row[1][k], row[2][k], row[3][k], wy[0], wy[1], wy[2], wy[3]);
#endif
#pragma unroll
        for (int k = 0; k < CK; ++k)
            if (c0 + k < C) op[(long long)k * HWo + q] = from_f(acc[k]);
    }
}

#if PF
// Persistent blocks (PF > 0: vec_ok planes of at most PF * NT * VEC elements): block b takes work
// items b, b + gridDim.x, ...; while it computes one item's outputs from shared memory, the next
// item's planes are in flight into registers (PF 16-byte loads per thread and channel), so the
// block's memory reads overlap its shared-memory work instead of alternating with it.
__device__ __forceinline__ void prefetch(const Args& a, uint4 (&raw)[CK][PF], int item) {
    int n, c0, part;
    item_of(a, item, n, c0, part);
    const int HW = a.H * a.W, nv = HW / VEC;
    const uint4* xp = reinterpret_cast<const uint4*>(a.x + ((long long)n * a.C + c0) * HW);
#pragma unroll
    for (int k = 0; k < CK; ++k)
#pragma unroll
        for (int p = 0; p < PF; ++p) {
            const int j = threadIdx.x + p * NT;
            raw[k][p] = (c0 + k < a.C && j < nv) ? xp[(long long)k * (HW / VEC) + j] : make_uint4(0, 0, 0, 0);
        }
}

__device__ __forceinline__ void unpack(const Args& a, const uint4 (&raw)[CK][PF], vec_t* s) {
    const int nv = a.H * a.W / VEC;
#pragma unroll
    for (int p = 0; p < PF; ++p) {
        const int j = threadIdx.x + p * NT;
        if (j < nv) {
            const int d = SLOT(j * VEC);
#pragma unroll
            for (int t = 0; t < VEC; ++t) {
                vec_t v;
#pragma unroll
                for (int k = 0; k < CK; ++k) v.v[k] = reinterpret_cast<const scalar_t*>(&raw[k][p])[t];
                s[d + t] = v;
            }
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds__(NT, MINB) KNAME(const Args a)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    vec_t* s = reinterpret_cast<vec_t*>(smem_raw);
    int n, c0, part;
#if PF
    int item = blockIdx.x;  // the host launches at most a.items blocks
    uint4 raw[CK][PF];
    prefetch(a, raw, item);
#if BORDER
    zero_border(a, s);  // unpack writes only the planes' own elements
#endif
    for (;;) {
        __syncthreads();  // the previous item's outputs no longer read s
        unpack(a, raw, s);
        __syncthreads();
        const int next = item + gridDim.x;
        if (next < a.items) prefetch(a, raw, next);
        item_of(a, item, n, c0, part);
        sample(a, s, n, c0, part);
        if (next >= a.items) break;
        item = next;
    }
#else
    item_of(a, blockIdx.x, n, c0, part);
    stage(a, s, n, c0);
    __syncthreads();
    sample(a, s, n, c0, part);
#endif
}
"""
)


@functools.cache
def available() -> bool:
    """Whether this process can build and launch the variant: a CUDA device, PyTorch's NVRTC
    wrapper (``torch.cuda._compile_kernel``) and a kernel that compiles with it (tried once)."""
    if not nvrtc_available():
        return False
    try:
        _kernel(torch.cuda.current_device(), False, False, 0, 0, False, 1, 128, 0, 1)
    except Exception as err:  # any failure to build: the Triton kernels run instead
        logger.warning("grid_sample 'plane' is unavailable (%s); the Triton kernels run instead.", err)
        return False
    return True


def default_config(x: torch.Tensor, interpolation_mode: int = 0, padding_mode: int = 0) -> tuple[int, ...]:
    """The default (channels per block, threads, output pixels per block at most, unroll[, blocks
    per SM, persistent[, border]]) for ``x`` in this mode and padding: see :func:`grid_sample_plane`.

    >>> default_config(torch.empty(8, 64, 128, 128))
    (1, 1024, 16384, 4)
    >>> default_config(torch.empty(8, 64, 128, 128, dtype=torch.float16))
    (2, 512, 16384, 4)
    >>> default_config(torch.empty(4, 256, 64, 64))
    (2, 512, 8192, 4, 0, 1, 0)
    >>> default_config(torch.empty(4, 256, 64, 64, dtype=torch.float16))
    (2, 512, 8192, 4)
    >>> default_config(torch.empty(4, 256, 64, 64, dtype=torch.float16), interpolation_mode=1)
    (4, 512, 8192, 4, 0, 1, 0)
    >>> default_config(torch.empty(8, 64, 128, 128, dtype=torch.float16), interpolation_mode=1)
    (2, 512, 16384, 4)
    >>> default_config(torch.empty(4, 256, 64, 64, dtype=torch.float16), interpolation_mode=2)
    (4, 512, 8192, 4, 0, 1)
    """
    plane = x.shape[2] * x.shape[3] * x.element_size()
    if interpolation_mode == 2:  # the sweep's bicubic picks (16 shared-memory loads per output)
        if x.element_size() == 2 and 4 * plane <= PERSISTENT_BUDGET:
            return 4, 512, 8192, 4, 0, 1
        if 2 * plane <= PERSISTENT_BUDGET:
            return 2, 512, 8192, 4, 0, 1, 0
        return (2, 512, 16384, 4) if 2 * plane <= PLANE_BUDGET else (1, 1024, 16384, 4)
    if _border_layout(x, interpolation_mode, padding_mode) and 2 * plane <= BORDER_ITEM_BUDGET:
        return 2, 512, 8192, 4
    for ck in (4, 2):
        if ck * plane <= PERSISTENT_BUDGET:
            return ck, 512, 8192, 4, 0, 1, 0
    if 2 * plane <= PLANE_BUDGET:
        return 2, 512, 16384, 4
    return 1, 1024, 16384, 4


def is_default(x: torch.Tensor, interpolation_mode: int, padding_mode: int = 0) -> bool:
    """Whether "plane" is grid_sample's default for ``x`` (N, C, H, W) in this mode and padding: an
    NCHW-contiguous input (a channels-last one is read in place by "nhwc") whose plane takes at most
    ``PLANE_DEFAULT_MAX`` bytes, the variant :func:`available`, and bilinear or nearest, or bicubic
    where its default tiling's planes can be staged inside the zero border (:func:`uses_border`:
    zeros padding, rows of whole 16-byte vectors)."""
    if not (
        x.is_cuda
        and x.is_contiguous()
        and x.shape[2] * x.shape[3] * x.element_size() <= PLANE_DEFAULT_MAX
        and interpolation_mode in (*PLANE_MODES, 2)
        and available()
    ):
        return False
    if interpolation_mode in PLANE_MODES:
        return True
    return uses_border(x, default_config(x, 2, padding_mode)[0], 2, padding_mode)


def smem_bytes(x: torch.Tensor, channels: int, border: bool = False, interpolation_mode: int = 0) -> int:
    """The shared memory a block takes for ``channels`` planes of ``x`` (N, C, H, W), staged inside
    a border of zeros where ``border``: for bilinear one column and two rows more, and two elements;
    for bicubic three columns and seven rows more."""
    h, w = x.shape[2], x.shape[3]
    if not border:
        elements = h * w
    elif interpolation_mode == 2:
        elements = (h + 7) * (w + 3)
    else:
        elements = (h + 2) * (w + 1) + 2
    return elements * x.element_size() * channels


def _border_layout(x: torch.Tensor, interpolation_mode: int, padding_mode: int) -> bool:
    # bilinear or bicubic with zeros padding, rows a whole number of 16-byte vectors (the staging's rule)
    return interpolation_mode in (0, 2) and padding_mode == 0 and x.shape[3] * x.element_size() % 16 == 0


def uses_border(x: torch.Tensor, channels: int, interpolation_mode: int, padding_mode: int) -> bool:
    """Whether "plane" stages ``x``'s planes inside a border of zeros: bilinear or bicubic with zeros
    padding, rows a whole number of 16-byte vectors, and the bordered planes fit in shared memory."""
    return _border_layout(x, interpolation_mode, padding_mode) and smem_bytes(
        x, channels, True, interpolation_mode
    ) <= smem_limit(x.device.index or 0)


def plane_fits(x: torch.Tensor, channels: int) -> bool:
    """Whether ``channels`` planes of ``x`` (N, C, H, W) fit in one block's shared memory."""
    return smem_bytes(x, channels) <= smem_limit(x.device.index or 0)


@functools.cache
def _resident_blocks(device: int, threads: int, smem: int, extra_registers: int = 0) -> int:
    """How many blocks of ``threads`` threads and ``smem`` bytes of shared memory one SM can hold
    by threads and shared memory, and by registers where each thread holds ``extra_registers``
    besides the 32 the kernel needs (the kernel's registers are then budgeted for that many)."""
    props = torch.cuda.get_device_properties(device)
    per_sm = int(getattr(props, "shared_memory_per_multiprocessor", smem_limit(device)))
    by_threads = int(getattr(props, "max_threads_per_multi_processor", 2048)) // threads
    blocks = min(by_threads, per_sm // (smem + 1024))
    if extra_registers:
        registers = int(getattr(props, "regs_per_multiprocessor", 65536))
        blocks = min(blocks, registers // (threads * (32 + extra_registers)))
    return max(1, blocks)


class _Args(ctypes.Structure):
    # the kernel's struct Args
    _fields_ = [
        ("x", ctypes.c_uint64),
        ("g", ctypes.c_uint64),
        ("out", ctypes.c_uint64),
        ("C", ctypes.c_int32),
        ("H", ctypes.c_int32),
        ("W", ctypes.c_int32),
        ("HWo", ctypes.c_int32),
        ("groups", ctypes.c_int32),
        ("parts", ctypes.c_int32),
        ("chunk", ctypes.c_int32),
        ("vec_ok", ctypes.c_int32),
        ("items", ctypes.c_int32),
    ]


@functools.cache
def _kernel(
    device: int,
    half: bool,
    grid_half: bool,
    mode: int,
    pad: int,
    align: bool,
    ck: int,
    threads: int,
    unroll: int,
    min_blocks: int,
    prefetch: int = 0,
    border: bool = False,
) -> Kernel:
    """The compiled specialization, loaded on ``device`` (compiled once per process and device).
    ``min_blocks``: the blocks per SM its registers are budgeted for (``__launch_bounds__``);
    ``prefetch``: 0 for one work item per block, else persistent blocks that load the next item's
    planes with this many 16-byte loads per thread and channel while they compute the current one;
    ``border``: bilinear with zeros padding, planes staged inside a border of zeros (no bounds checks)."""
    name = (
        f"grid_sample_plane_{'h' if half else 'f'}{'h' if grid_half else 'f'}_m{mode}p{pad}a{int(align)}"
        f"_c{ck}_t{threads}_u{unroll}_b{min_blocks}_pf{prefetch}{'_zb' if border else ''}"
    )
    defines = {
        "SCALAR_HALF": int(half),
        "GRID_HALF": int(grid_half),
        "MODE": mode,
        "PAD": pad,
        "ALIGN": int(align),
        "CK": ck,
        "NT": threads,
        "UNR": unroll,
        "MINB": min_blocks,
        "PF": prefetch,
        "BORDER": int(border),
        "KNAME": name,
    }
    return compile_kernel(device, _SOURCE, name, defines, "grid_sample 'plane'")


def grid_sample_plane(
    x: torch.Tensor,
    grid: torch.Tensor,
    out: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
    config: tuple[int, ...] | None = None,
) -> None:
    """F.grid_sample of NCHW ``x`` into contiguous ``out`` (N, C, Ho, Wo) on the current stream.

    ``config``: (channels per block, threads per block, output pixels per block at most[, unroll of
    the output loop (0: the compiler's choice)[, blocks per SM to budget registers for (0: as many
    as threads, shared memory and the prefetch registers allow)[, persistent[, border]]]]); default
    :func:`default_config`. Persistent (1): that many blocks per SM at most, as many as the SMs hold
    at once, each loading its next work item's planes while it computes the current one (planes
    that take 16-byte loads only; others run one item per block). Border (default 1): stage the
    planes inside a border of zeros where :func:`uses_border` (bilinear or bicubic with zeros
    padding), so the taps need no bounds checks; 0 keeps the plain layout (the same results, bit for bit).
    A work item is a channel group of one image and a part of its outputs; where there are fewer
    than ``SPLIT_BELOW`` times the SM count, each plane's outputs are split over more parts (each
    stages the plane). Raises ValueError when the planes do not fit in shared memory (:func:`plane_fits`).
    """
    want = (x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]) if x.dim() == 4 and grid.dim() == 4 else None
    if want is None or grid.shape[0] != x.shape[0] or grid.shape[-1] != 2 or tuple(out.shape) != want:
        raise ValueError(
            f"grid_sample 'plane': input (N, C, H, W), grid (N, Ho, Wo, 2) and output (N, C, Ho, Wo) expected, "
            f"got {tuple(x.shape)}, {tuple(grid.shape)} and {tuple(out.shape)}."
        )
    if x.dtype not in (torch.float32, torch.float16) or grid.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"grid_sample 'plane': float32 or float16 tensors, got {x.dtype} and {grid.dtype}.")
    if out.dtype != x.dtype:
        raise ValueError(f"grid_sample 'plane': the output's dtype must be the input's, {x.dtype}; got {out.dtype}.")
    if not (x.is_cuda and grid.is_cuda and out.is_cuda):
        raise ValueError("grid_sample 'plane' runs on CUDA tensors; on the CPU use the registered CPU kernel.")
    if not x.device == grid.device == out.device:
        raise ValueError(
            f"grid_sample 'plane': input, grid and output on {x.device}, {grid.device} and {out.device}; "
            "pass all three on one device."
        )
    cfg = tuple(config or default_config(x, interpolation_mode, padding_mode))
    ck, threads, chunk_max = cfg[:3]
    unroll = cfg[3] if len(cfg) > 3 else 0
    min_blocks_cfg = cfg[4] if len(cfg) > 4 else 0
    persistent = bool(cfg[5]) if len(cfg) > 5 else False
    border_cfg = bool(cfg[6]) if len(cfg) > 6 else True
    if ck not in (1, 2, 4) or threads not in (128, 256, 512, 1024) or chunk_max < 1:
        raise ValueError(
            f"grid_sample 'plane': config ({ck}, {threads}, {chunk_max}) needs 1, 2 or 4 channels per block, "
            "128-1024 threads (a power of 2) and at least one output pixel per block."
        )
    n, c, h, w = x.shape
    device = x.device.index or 0
    border = border_cfg and uses_border(x, ck, interpolation_mode, padding_mode)
    smem = smem_bytes(x, ck, border, interpolation_mode)
    if smem > smem_limit(device):
        raise ValueError(
            f"grid_sample 'plane': {ck} plane(s) of {h}x{w} {x.dtype} take {smem} bytes of shared "
            f"memory, more than this device's {smem_limit(device)}; use the 'nhwc' or 'loop' variant."
        )
    if not out.is_contiguous():
        raise ValueError("grid_sample 'plane': `out` must be contiguous (N, C, Ho, Wo); pass a contiguous tensor.")
    if not out.numel():
        return
    x = x.contiguous()
    grid = grid.contiguous()
    if grid.data_ptr() % (2 * grid.element_size()):
        grid = grid.clone()  # the kernel reads each (x, y) pair in one load
    hwo = grid.shape[1] * grid.shape[2]
    groups = -(-c // ck)
    parts = -(-hwo // chunk_max)
    blocks_wanted = SPLIT_BELOW * sm_count(device)
    if n * groups * parts < blocks_wanted:  # few planes: more blocks per plane, at least a block's threads each
        parts = max(parts, min(-(-blocks_wanted // (n * groups)), -(-hwo // threads)))
    chunk = -(-hwo // parts)
    if hwo >= 2**31 or n * groups * parts >= 2**31:
        raise ValueError(
            f"grid_sample 'plane': {n}x{c} planes of {hwo} outputs take more than 2**31 blocks or outputs "
            "per plane; use the 'nhwc' or 'loop' variant."
        )
    per_vector = 16 // x.element_size()
    vec_ok = int((h * w) % per_vector == 0 and x.data_ptr() % 16 == 0)
    items = n * groups * parts
    prefetch = -(-(h * w // per_vector) // threads) if persistent and vec_ok else 0
    min_blocks = min_blocks_cfg or _resident_blocks(device, threads, smem, 4 * ck * prefetch)
    half, grid_half = x.dtype == torch.float16, grid.dtype == torch.float16
    kernel = _kernel(
        device,
        half,
        grid_half,
        interpolation_mode,
        padding_mode,
        bool(align_corners),
        ck,
        threads,
        unroll,
        min_blocks,
        prefetch,
        border,
    )
    blocks = min(items, sm_count(device) * min(min_blocks, kernel.occupancy(threads, smem))) if prefetch else items
    args = _Args(x.data_ptr(), grid.data_ptr(), out.data_ptr(), c, h, w, hwo, groups, parts, chunk, vec_ok, items)
    kernel(blocks, threads, smem, torch._C._cuda_getCurrentRawStream(device), args)
