"""DynamicResize's "plane" variant: bicubic resize by a CUDA kernel that works on bands of rows in shared memory.

One thread block takes a band of up to RB output rows of one plane, or of two planes side by side
(float16 by default: a staged element and a table element hold both planes' values, so each
column's and row's weights, offsets and loop serve two outputs). It copies the input rows the
band reads (contiguous in memory: one 16-byte-vector copy) into shared memory, interpolates each of
them along x at every output column into a float32 table in shared memory (each lane one column,
walking the rows), then interpolates that table along y into the band's outputs (each warp whole
output rows, with the row's y weights and table rows from a small table the block fills first).
Every input byte is read from memory once per band (plus three rows of halo), and the per-row work
(y weights, the choice of rows) is done once per block instead of once per lane.
The formulas, accumulation order and roundings are PyTorch's upsample_bicubic2d (A = -0.75, taps
clamped to the border, x first, then y, in float32 whatever the storage dtype): the outputs equal
F.interpolate's on CUDA bit for bit.

Compiled by NVRTC through ``torch.cuda._compile_kernel`` on first use (one module per dtype,
align_corners, block size and planes per block, its registers budgeted for that size) and launched
on the current stream (:mod:`opbridge.ops._nvrtc`).

Example:
    >>> from opbridge.ops import _resize_cuda as rc  # doctest: +SKIP
    >>> rc.resize_plane(x, out, align_corners=False)  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math

import torch

from opbridge.ops._nvrtc import PRELUDE, Kernel, compile_kernel, nvrtc_available, sm_count, smem_limit

__all__ = ["available", "default_config", "is_default", "resize_plane", "smem_bytes"]

logger = logging.getLogger(__name__)

# The default band: the most output rows (of ROWS_CHOICES) whose block takes at most SMEM_BUDGET
# bytes of shared memory and that still gives MIN_BLOCKS_PER_SM blocks per SM (else the fewest
# rows); WARPS warps per block (benchmarks/gpu_tiling_sweep.py --only resize-plane, OPLIB.md).
ROWS_CHOICES = (64, 32, 16, 8)
SMEM_BUDGET = 36 * 1024
MIN_BLOCKS_PER_SM = 4
WARPS = 8
# "plane" is the default where bands of the fewest rows fit SMEM_BUDGET (wider rows leave too few
# blocks: 1x3x540x960 to 720x1280 runs 1.9x faster on the "window" kernel) and for at most
# MAX_DEFAULT_ROW_STEP input rows per output row (downscaling further interpolates rows along x
# that no output reads).
MAX_DEFAULT_ROW_STEP = 2.0

_SOURCE = (
    PRELUDE
    + r"""
// PyTorch's area_pixel_compute_source_index for cubic (not clamped at 0)
__device__ __forceinline__ float source(float scale, int o) {
#if ALIGN
    return scale * (float)o;
#else
    return scale * ((float)o + 0.5f) - 0.5f;
#endif
}

// CK planes side by side: a staged input element and a table element hold the CK planes' values
struct __align__(CK * sizeof(scalar_t)) vec_t { scalar_t v[CK]; };
struct __align__(CK * sizeof(float)) acc_t { float v[CK]; };

struct Args {
    const scalar_t* x;
    scalar_t* out;
    int H, W, Ho, Wo, bands, rb, rows_max, wo_pad, col_warps, vec_ok, planes;
    float sh, sw;
};

__device__ __forceinline__ unsigned word(const uint4& q, int i) { return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w; }

// word w (0 .. 4 CK - 1) of VEC elements of CK planes interleaved, from one 16-byte vector per plane
__device__ __forceinline__ unsigned interleaved(const uint4 (&raw)[CK], int w) {
#if CK == 1
    return word(raw[0], w);
#elif SCALAR_HALF
    const int t = w / (CK / 2), k = 2 * (w % (CK / 2));  // element t, planes k and k + 1
    return __byte_perm(word(raw[k], t / 2), word(raw[k + 1], t / 2), t % 2 ? 0x7632 : 0x5410);
#else
    return word(raw[w % CK], w / CK);
#endif
}

extern "C" __global__ void __launch_bounds__(NT) KNAME(const Args a)
{
    const int H = a.H, W = a.W, Ho = a.Ho, Wo = a.Wo, WP = a.wo_pad;
    const int group = blockIdx.x / a.bands;  // planes group * CK .. group * CK + nk - 1
    const int p0 = group * CK, nk = min(CK, a.planes - p0);
    const int oy0 = (blockIdx.x - group * a.bands) * a.rb;
    const int nrows = min(Ho, oy0 + a.rb) - oy0;
    // the input rows the band reads, clamped to the image: r_lo .. r_lo + R - 1 (R <= rows_max)
    const int r_lo = max(0, (int)floorf(source(a.sh, oy0)) - 1);
    const int r_hi = min(H - 1, (int)floorf(source(a.sh, oy0 + nrows - 1)) + 2);
    const int R = r_hi - r_lo + 1;

    // shared memory: y weights (rb float4), the four rows' byte offsets into tmp (rb int4),
    // tmp (rows_max x WP acc_t: the input rows interpolated along x), the staged rows (rows_max x W vec_t)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float4* wy = reinterpret_cast<float4*>(smem_raw);
    int4* ry = reinterpret_cast<int4*>(wy + a.rb);
    acc_t* tmp = reinterpret_cast<acc_t*>(ry + a.rb);
    vec_t* rows = reinterpret_cast<vec_t*>(tmp + a.rows_max * WP);

    const int tid = threadIdx.x, nt = blockDim.x;
    for (int i = tid; i < nrows; i += nt) {
        const float sy = source(a.sh, oy0 + i);
        const float fy = floorf(sy);
        const float t = sy - fy;
        const int iy = (int)fy;
        wy[i] = make_float4(cc2(t + 1.0f), cc1(t), cc1(1.0f - t), cc2((1.0f - t) + 1.0f));
        const int rb = WP * (int)sizeof(acc_t);  // offsets in bytes: one add per tap in the y pass
        ry[i] = make_int4((min(max(iy - 1, 0), H - 1) - r_lo) * rb, (min(max(iy, 0), H - 1) - r_lo) * rb,
                          (min(max(iy + 1, 0), H - 1) - r_lo) * rb, (min(max(iy + 2, 0), H - 1) - r_lo) * rb);
    }
    const long long HW = (long long)H * W;
    const scalar_t* __restrict__ xp = a.x + ((long long)p0 * H + r_lo) * W;  // plane p0 + k at xp + k * HW
    const int count = R * W;
    if (a.vec_ok) {  // W a multiple of VEC and x 16-byte aligned: every row starts 16-byte aligned
        uint4* dst = reinterpret_cast<uint4*>(rows);
#pragma unroll 4
        for (int v = tid; v < count / VEC; v += nt) {
            uint4 raw[CK];
#pragma unroll
            for (int k = 0; k < CK; ++k)
                raw[k] = k < nk ? reinterpret_cast<const uint4*>(xp + k * HW)[v] : make_uint4(0, 0, 0, 0);
            // the VEC elements of the CK planes, interleaved: CK whole 16-byte chunks
#pragma unroll
            for (int m = 0; m < CK; ++m)
                dst[v * CK + m] = make_uint4(interleaved(raw, 4 * m), interleaved(raw, 4 * m + 1),
                                             interleaved(raw, 4 * m + 2), interleaved(raw, 4 * m + 3));
        }
    } else {
#pragma unroll 4
        for (int e = tid; e < count; e += nt) {
            vec_t v;
#pragma unroll
            for (int k = 0; k < CK; ++k) v.v[k] = k < nk ? xp[k * HW + e] : (scalar_t)0;
            rows[e] = v;
        }
    }
    __syncthreads();

    // x pass: col_warps columns of 32 output columns side by side, the rest of the block over rows;
    // each lane walks its rows with pointers (no index arithmetic per row)
    const int warp = tid >> 5, lane = tid & 31;
    const int cw = warp % a.col_warps, rw = warp / a.col_warps, nrw = (nt >> 5) / a.col_warps;
    for (int ox = cw * 32 + lane; ox - lane < Wo; ox += a.col_warps * 32) {
        if (ox < Wo) {
            const float sx = source(a.sw, ox);
            const float fx = floorf(sx);
            const float t = sx - fx;
            const int ix = (int)fx;
            const float w0 = cc2(t + 1.0f), w1 = cc1(t), w2 = cc1(1.0f - t), w3 = cc2((1.0f - t) + 1.0f);
            const int x0 = min(max(ix - 1, 0), W - 1), x1 = min(max(ix, 0), W - 1);
            const int x2 = min(max(ix + 1, 0), W - 1), x3 = min(max(ix + 2, 0), W - 1);
            const vec_t* row = rows + rw * W;
            acc_t* dst = tmp + rw * WP + ox;
#pragma unroll 4
            for (int r = rw; r < R; r += nrw, row += nrw * W, dst += nrw * WP) {
                const vec_t v0 = row[x0], v1 = row[x1], v2 = row[x2], v3 = row[x3];
                acc_t res;
#pragma unroll
                for (int k = 0; k < CK; ++k)
                    res.v[k] = taps4(to_f(v0.v[k]), to_f(v1.v[k]), to_f(v2.v[k]), to_f(v3.v[k]), w0, w1, w2, w3);
                *dst = res;
            }
        }
    }
    __syncthreads();

    scalar_t* __restrict__ op = a.out + ((long long)p0 * Ho + oy0) * Wo;  // plane p0 + k at op + k * Ho * Wo
    const long long HWo = (long long)Ho * Wo;
    // each warp takes whole output rows (the row's weights and table rows loaded once), its lanes
    // walking the columns
    for (int i = warp; i < nrows; i += nt >> 5) {
        const float4 w = wy[i];
        const int4 r = ry[i];
        const char* col = reinterpret_cast<const char*>(tmp + lane);
        scalar_t* dst = op + i * Wo + lane;
#pragma unroll 4
        for (int ox = lane; ox < Wo; ox += 32, col += 32 * sizeof(acc_t), dst += 32) {
            const acc_t v0 = *reinterpret_cast<const acc_t*>(col + r.x), v1 = *reinterpret_cast<const acc_t*>(col + r.y);
            const acc_t v2 = *reinterpret_cast<const acc_t*>(col + r.z), v3 = *reinterpret_cast<const acc_t*>(col + r.w);
#pragma unroll
            for (int k = 0; k < CK; ++k)
                if (k < nk) dst[k * HWo] = from_f(taps4(v0.v[k], v1.v[k], v2.v[k], v3.v[k], w.x, w.y, w.z, w.w));
        }
    }
}
"""
)


class _Args(ctypes.Structure):
    # the kernel's struct Args
    _fields_ = [
        ("x", ctypes.c_uint64),
        ("out", ctypes.c_uint64),
        ("H", ctypes.c_int32),
        ("W", ctypes.c_int32),
        ("Ho", ctypes.c_int32),
        ("Wo", ctypes.c_int32),
        ("bands", ctypes.c_int32),
        ("rb", ctypes.c_int32),
        ("rows_max", ctypes.c_int32),
        ("wo_pad", ctypes.c_int32),
        ("col_warps", ctypes.c_int32),
        ("vec_ok", ctypes.c_int32),
        ("planes", ctypes.c_int32),
        ("sh", ctypes.c_float),
        ("sw", ctypes.c_float),
    ]


@functools.cache
def _kernel(device: int, half: bool, align: bool, threads: int = WARPS * 32, planes: int = 1) -> Kernel:
    """The compiled specialization, loaded on ``device`` (once per process, device, dtype,
    align_corners, block size and planes per block: registers are budgeted for blocks of
    ``threads`` threads)."""
    name = f"resize_bicubic_plane_{'h' if half else 'f'}_a{int(align)}_t{threads}_c{planes}"
    defines = {"SCALAR_HALF": int(half), "ALIGN": int(align), "NT": threads, "CK": planes, "KNAME": name}
    return compile_kernel(device, _SOURCE, name, defines, "DynamicResize 'plane'")


@functools.cache
def available() -> bool:
    """Whether this process can build and launch the variant (a CUDA device, PyTorch's NVRTC wrapper
    and a kernel that compiles with it; tried once, a failure logged)."""
    if not nvrtc_available():
        return False
    try:
        _kernel(torch.cuda.current_device(), False, False)
    except Exception as err:  # any failure to build: the Triton kernels run instead
        logger.warning("DynamicResize 'plane' is unavailable (%s); the Triton kernels run instead.", err)
        return False
    return True


def scales(h: int, w: int, ho: int, wo: int, align: bool) -> tuple[float, float]:
    """PyTorch's source-index scales (y, x) of a resize from h x w to ho x wo.

    >>> scales(128, 128, 200, 200, False)
    (0.64, 0.64)
    >>> scales(5, 9, 1, 3, True)
    (0.0, 4.0)
    """
    if align:
        return ((h - 1) / (ho - 1) if ho > 1 else 0.0), ((w - 1) / (wo - 1) if wo > 1 else 0.0)
    return h / ho, w / wo


def rows_max(h: int, ho: int, sh: float, rows: int) -> int:
    """The most input rows a band of ``rows`` output rows reads (a bound on the kernel's R,
    float rounding included), at most ``h``.

    >>> rows_max(128, 200, 0.64, 32)
    25
    """
    return min(h, math.ceil(sh * (rows - 1)) + 5)


def _smem(h: int, w: int, ho: int, wo: int, itemsize: int, align: bool, rows: int, planes: int = 1) -> int:
    sh, _ = scales(h, w, ho, wo, align)
    r = rows_max(h, ho, sh, rows)
    staged = -(-(r * w * itemsize * planes) // 16) * 16
    return rows * 32 + r * _wo_pad(wo) * 4 * planes + staged


def smem_bytes(x: torch.Tensor, ho: int, wo: int, align: bool, rows: int, planes: int = 1) -> int:
    """The shared memory one block takes for bands of ``rows`` output rows of ``planes`` planes of
    ``x`` (N, C, H, W) resized to ho x wo."""
    return _smem(x.shape[-2], x.shape[-1], ho, wo, x.element_size(), align, rows, planes)


def _wo_pad(wo: int) -> int:
    return -(-wo // 4) * 4  # each tmp row starts 16-byte aligned


def _rows_for(
    device: int, groups: int, h: int, w: int, ho: int, wo: int, itemsize: int, align: bool, planes: int
) -> int:
    """The most rows of ROWS_CHOICES that fit SMEM_BUDGET and give MIN_BLOCKS_PER_SM blocks per SM, or 0."""
    for rows in ROWS_CHOICES:
        fits = _smem(h, w, ho, wo, itemsize, align, rows, planes) <= SMEM_BUDGET
        if fits and groups * -(-ho // rows) >= MIN_BLOCKS_PER_SM * sm_count(device):
            return rows
    return 0


@functools.lru_cache(maxsize=256)
def _default_plan(
    device: int, planes: int, h: int, w: int, ho: int, wo: int, itemsize: int, align: bool
) -> tuple[int, int]:
    """(rows, planes per block): float16 pairs of planes where such bands fill the GPU."""
    if itemsize == 2:
        rows = _rows_for(device, -(-planes // 2), h, w, ho, wo, itemsize, align, 2)
        if rows:
            return rows, 2
    return _rows_for(device, planes, h, w, ho, wo, itemsize, align, 1) or ROWS_CHOICES[-1], 1


def default_config(x: torch.Tensor, ho: int, wo: int, align: bool) -> tuple[int, int, int]:
    """The default (output rows per band, warps per block, planes per block) for ``x`` (N, C, H, W)
    resized to ho x wo: the most rows of ``ROWS_CHOICES`` that fit ``SMEM_BUDGET`` and give
    ``MIN_BLOCKS_PER_SM`` blocks per SM (else the fewest rows), ``WARPS`` warps; two planes per block
    in float16 where such bands exist (half the instructions per output: the weights, offsets and
    loop are shared, and one 4-byte load brings a tap of both planes), else one."""
    n, c, h, w = x.shape
    rows, planes = _default_plan(x.device.index or 0, n * c, h, w, ho, wo, x.element_size(), align)
    return rows, WARPS, planes


@functools.lru_cache(maxsize=256)
def _is_default(h: int, w: int, ho: int, wo: int, itemsize: int, align: bool) -> bool:
    sh, _ = scales(h, w, ho, wo, align)
    smem = _smem(h, w, ho, wo, itemsize, align, ROWS_CHOICES[-1])
    return sh <= MAX_DEFAULT_ROW_STEP and smem <= SMEM_BUDGET and available()


def is_default(x: torch.Tensor, ho: int, wo: int, align: bool) -> bool:
    """Whether "plane" is DynamicResize's default for ``x`` resized to ho x wo: a CUDA input, at most
    ``MAX_DEFAULT_ROW_STEP`` input rows per output row, bands of 8 rows within ``SMEM_BUDGET``, and
    the variant :func:`available`."""
    return x.is_cuda and _is_default(x.shape[-2], x.shape[-1], ho, wo, x.element_size(), align)


@functools.lru_cache(maxsize=256)
def _launch_plan(
    device: int,
    n: int,
    c: int,
    h: int,
    w: int,
    ho: int,
    wo: int,
    itemsize: int,
    align: bool,
    rows: int,
    warps: int,
    planes: int = 1,
) -> tuple[int, int, int, int, int, int, int, float, float]:
    """(blocks, threads, shared bytes, bands, input rows per band at most, tmp row pitch, column
    warps, sh, sw), or ValueError."""
    if rows < 1 or not 1 <= warps <= 32 or planes not in (1, 2):
        raise ValueError(
            f"DynamicResize 'plane': config ({rows}, {warps}, {planes}) needs at least one row, 1-32 warps and "
            "1 or 2 planes per block."
        )
    smem = _smem(h, w, ho, wo, itemsize, align, rows, planes)
    if smem > smem_limit(device):
        raise ValueError(
            f"DynamicResize 'plane': bands of {rows} rows of a {h}x{w} -> {ho}x{wo} resize take {smem} bytes of "
            f"shared memory, more than this device's {smem_limit(device)}; pass fewer rows or use the 'window' variant."
        )
    bands = -(-ho // rows)
    groups = -(-(n * c) // planes)
    if groups * bands >= 2**31 or max(h * w, ho * wo) >= 2**31:
        raise ValueError(
            f"DynamicResize 'plane': {n}x{c} planes of {ho}x{wo} outputs need 32-bit indices; use the 'window' variant."
        )
    col_warps = min(warps, -(-wo // 32))
    warps = max(col_warps, warps // col_warps * col_warps)  # whole groups of column warps
    sh, sw = scales(h, w, ho, wo, align)
    return groups * bands, 32 * warps, smem, bands, rows_max(h, ho, sh, rows), _wo_pad(wo), col_warps, sh, sw


def resize_plane(
    x: torch.Tensor, out: torch.Tensor, align_corners: bool, config: tuple[int, ...] | None = None
) -> None:
    """Bicubic resize of NCHW ``x`` into contiguous ``out`` (N, C, Ho, Wo) on the current stream.

    ``config``: (output rows per band, warps per block[, planes per block: 1 or 2, side by side in
    shared memory, sharing each column's and row's weights]); default :func:`default_config`. Raises
    ValueError for CPU tensors, other dtypes than float32 and float16, a strided ``out`` and bands
    whose rows do not fit in one block's shared memory.
    """
    if x.dim() != 4 or out.dim() != 4 or tuple(out.shape[:2]) != tuple(x.shape[:2]):
        raise ValueError(
            f"DynamicResize 'plane': input (N, C, H, W) and output (N, C, Ho, Wo) expected, got {tuple(x.shape)} "
            f"and {tuple(out.shape)}."
        )
    if x.dtype not in (torch.float32, torch.float16) or out.dtype != x.dtype:
        raise ValueError(
            f"DynamicResize 'plane': float32 or float16 tensors of one dtype, got {x.dtype} and {out.dtype}."
        )
    if not (x.is_cuda and out.is_cuda):
        raise ValueError("DynamicResize 'plane' runs on CUDA tensors; on the CPU use the registered CPU kernel.")
    if out.device != x.device:
        raise ValueError(
            f"DynamicResize 'plane': input on {x.device}, output on {out.device}; pass both on one device."
        )
    if not out.is_contiguous():
        raise ValueError("DynamicResize 'plane': `out` must be contiguous (N, C, Ho, Wo); pass a contiguous tensor.")
    n, c, h, w = x.shape
    ho, wo = out.shape[-2:]
    if not out.numel() or not x.numel():
        return
    align = bool(align_corners)
    device = x.device.index or 0
    itemsize = x.element_size()
    cfg = tuple(config or default_config(x, ho, wo, align))
    rows, warps = cfg[:2]
    planes = cfg[2] if len(cfg) > 2 else 1
    blocks, threads, smem, bands, band_rows, wo_pad, col_warps, sh, sw = _launch_plan(
        device, n, c, h, w, ho, wo, itemsize, align, rows, warps, planes
    )
    x = x.contiguous()
    vec_ok = int(w % (16 // itemsize) == 0 and x.data_ptr() % 16 == 0)
    args = _Args(
        x.data_ptr(),
        out.data_ptr(),
        h,
        w,
        ho,
        wo,
        bands,
        rows,
        band_rows,
        wo_pad,
        col_warps,
        vec_ok,
        n * c,
        sh,
        sw,
    )
    kernel = _kernel(device, itemsize == 2, align, threads, planes)
    kernel(blocks, threads, smem, torch._C._cuda_getCurrentRawStream(device), args)
