"""grid_sample's "plane" variant: a CUDA kernel that stages whole input planes in shared memory.

On a grid that scatters its points (the uniformly random grid of benchmarks/gpu_ops.py), every
corner read from global memory fetches a 32-byte L2 sector of its own for 2-4 useful bytes, and the
Triton kernels are bound by L2 bandwidth (benchmarks/OPLIB.md). Here one thread block copies CK
channel planes of one image into shared memory, interleaved (element i of the CK planes side by side),
then computes a range of output pixels of those CK channels from shared memory: each input byte
is read from global memory once per block, and one shared-memory load fetches a corner of CK channels.
Triton cannot index shared memory with per-lane addresses, so this variant is CUDA C, compiled by
NVRTC through ``torch.cuda._compile_kernel`` on first use (one module per specialization) and
launched on the current stream.

It applies when CK planes fit in a block's shared memory (:func:`plane_fits`). The formulas and
accumulation order are those of the Triton kernels and of PyTorch's grid_sampler_2d.

Example:
    >>> from opbridge.ops import _gridsample_cuda as gc  # doctest: +SKIP
    >>> gc.grid_sample_plane(x, grid, out, 0, 0, False)  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any

import torch

__all__ = [
    "PLANE_BUDGET",
    "available",
    "default_config",
    "grid_sample_plane",
    "is_default",
    "plane_fits",
    "smem_bytes",
    "smem_limit",
]

logger = logging.getLogger(__name__)

# The default tiling, from benchmarks/gpu_tiling_sweep.py --only grid-plane on the H200 (OPLIB.md):
# two channels per block where their planes take at most PLANE_BUDGET bytes of shared memory, with
# 512 threads and up to 8192 output pixels per block; else one channel, 1024 threads and up to
# 16384 pixels; the output loop unrolled 4 times.
PLANE_BUDGET = 64 * 1024
# Interpolation modes "plane" is the default for (bilinear, nearest), and the largest plane, in
# bytes, it is the default up to: the measured sizes. Bicubic, with 16 shared-memory loads per
# output, stays faster on the channels-last kernel at 8x64x128x128.
PLANE_MODES = (0, 1)
PLANE_DEFAULT_MAX = 64 * 1024

_SOURCE = r"""
typedef unsigned short h16;
__device__ __forceinline__ float h2f(h16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ h16 f2h(float f) { h16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(h16 v) { return h2f(v); }

#if SCALAR_HALF
typedef h16 scalar_t;
__device__ __forceinline__ scalar_t from_f(float v) { return f2h(v); }
#define VEC 8
#else
typedef float scalar_t;
__device__ __forceinline__ scalar_t from_f(float v) { return v; }
#define VEC 4
#endif
#if GRID_HALF
typedef h16 grid_t;
struct __align__(4) grid2_t { h16 x, y; };
#else
typedef float grid_t;
struct __align__(8) grid2_t { float x, y; };
#endif

struct __align__(CK * sizeof(scalar_t)) vec_t { scalar_t v[CK]; };

__device__ __forceinline__ float unnormalize(float coord, float size) {
#if ALIGN
    return (coord + 1.0f) * 0.5f * (size - 1.0f);
#else
    return ((coord + 1.0f) * size - 1.0f) * 0.5f;
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

// PyTorch's compute_coordinates: 0 zeros (unchanged), 1 border, 2 reflection
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

__device__ __forceinline__ float cc1(float x) { return ((-0.75f + 2.0f) * x - (-0.75f + 3.0f)) * x * x + 1.0f; }
__device__ __forceinline__ float cc2(float x) {
    return ((-0.75f * x - 5.0f * -0.75f) * x + 8.0f * -0.75f) * x - 4.0f * -0.75f;
}

// acc (+)= w * the CK channels of smem element o, or of zeros where ok is false
__device__ __forceinline__ void tap(float* acc, const vec_t* s, int o, bool ok, float w, bool first) {
    vec_t v;
    if (ok) {
        v = s[o];
    } else {
#pragma unroll
        for (int k = 0; k < CK; ++k) v.v[k] = (scalar_t)0;
    }
#pragma unroll
    for (int k = 0; k < CK; ++k) acc[k] = first ? to_f(v.v[k]) * w : acc[k] + to_f(v.v[k]) * w;
}

// the kernel's arguments in one struct: one launch parameter (a ctypes.Structure of the same layout)
struct Args {
    const scalar_t* x;
    const grid_t* g;
    scalar_t* out;
    int C, H, W, HWo, groups, parts, chunk, vec_ok;
};

extern "C" __global__ void __launch_bounds__(NT, MINB) KNAME(const Args a)
{
    const scalar_t* __restrict__ x = a.x;
    const grid_t* __restrict__ g = a.g;
    scalar_t* __restrict__ out = a.out;
    const int C = a.C, H = a.H, W = a.W, HWo = a.HWo, groups = a.groups, parts = a.parts, chunk = a.chunk;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    vec_t* s = reinterpret_cast<vec_t*>(smem_raw);
    const int item = blockIdx.x;
    const int part = item % parts;
    const int grp = item / parts;           // n * groups + channel group
    const int n = grp / groups;
    const int c0 = (grp - n * groups) * CK;
    const int HW = H * W;
    const scalar_t* xp = x + ((long long)n * C + c0) * HW;

    // stage CK planes, interleaved; channels past C read as zeros
    if (a.vec_ok) {
        const int nv = HW / VEC;
#pragma unroll 4
        for (int j = threadIdx.x; j < nv; j += NT) {
            uint4 raw[CK];
#pragma unroll
            for (int k = 0; k < CK; ++k)
                raw[k] = (c0 + k < C) ? reinterpret_cast<const uint4*>(xp + (long long)k * HW)[j] : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int t = 0; t < VEC; ++t) {
                vec_t v;
#pragma unroll
                for (int k = 0; k < CK; ++k) v.v[k] = reinterpret_cast<const scalar_t*>(&raw[k])[t];
                s[j * VEC + t] = v;
            }
        }
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < HW; i += NT) {
            vec_t v;
#pragma unroll
            for (int k = 0; k < CK; ++k) v.v[k] = (c0 + k < C) ? xp[(long long)k * HW + i] : (scalar_t)0;
            s[i] = v;
        }
    }
    __syncthreads();

    const grid2_t* gp = reinterpret_cast<const grid2_t*>(g) + (long long)n * HWo;  // 2-element aligned
    scalar_t* op = out + ((long long)n * C + c0) * HWo;
    const int q_end = min(HWo, (part + 1) * chunk);
    const float Wf = (float)W, Hf = (float)H;
#if UNR
#pragma unroll UNR
#endif
    for (int q = part * chunk + threadIdx.x; q < q_end; q += NT) {
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
        bool okx0 = x0 >= 0 && x0 < W, okx1 = x0 >= -1 && x0 < W - 1;
        bool oky0 = y0 >= 0 && y0 < H, oky1 = y0 >= -1 && y0 < H - 1;
        int o = (okx0 || okx1) && (oky0 || oky1) ? y0 * W + x0 : 0;
        tap(acc, s, o, okx0 && oky0, w_nw, true);
        tap(acc, s, o + 1, okx1 && oky0, w_ne, false);
        tap(acc, s, o + W, okx0 && oky1, w_sw, false);
        tap(acc, s, o + W + 1, okx1 && oky1, w_se, false);
#elif MODE == 1
        ix = pad_coord(ix, Wf);
        iy = pad_coord(iy, Hf);
        int xx = (int)rintf(ix), yy = (int)rintf(iy);
        bool ok = xx >= 0 && xx < W && yy >= 0 && yy < H;
        tap(acc, s, ok ? yy * W + xx : 0, ok, 1.0f, true);
#else
        float x0f = floorf(ix), y0f = floorf(iy);
        float tx = ix - x0f, ty = iy - y0f;
        float wx[4] = {cc2(tx + 1.0f), cc1(tx), cc1(1.0f - tx), cc2((1.0f - tx) + 1.0f)};
        float wy[4] = {cc2(ty + 1.0f), cc1(ty), cc1(1.0f - ty), cc2((1.0f - ty) + 1.0f)};
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
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float row[CK];
            const int r = yi[j] * W;
#pragma unroll
            for (int t = 0; t < 4; ++t) tap(row, s, r + xi[t], oky[j] && okx[t], wx[t], t == 0);
#pragma unroll
            for (int k = 0; k < CK; ++k) acc[k] = j == 0 ? row[k] * wy[0] : acc[k] + row[k] * wy[j];
        }
#endif
#pragma unroll
        for (int k = 0; k < CK; ++k)
            if (c0 + k < C) op[(long long)k * HWo + q] = from_f(acc[k]);
    }
}
"""


@functools.cache
def available() -> bool:
    """Whether this process can build and launch the variant: a CUDA device, PyTorch's NVRTC
    wrapper (``torch.cuda._compile_kernel``) and a kernel that compiles with it (tried once)."""
    if not (torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel")):
        return False
    try:
        _kernel(torch.cuda.current_device(), False, False, 0, 0, False, 1, 128, 0, 1)
    except Exception as err:  # any failure to build: the Triton kernels run instead
        logger.warning("grid_sample 'plane' is unavailable (%s); the Triton kernels run instead.", err)
        return False
    return True


def default_config(x: torch.Tensor) -> tuple[int, int, int, int]:
    """The default (channels per block, threads, output pixels per block at most, unroll) for ``x``.

    >>> default_config(torch.empty(8, 64, 128, 128))
    (1, 1024, 16384, 4)
    >>> default_config(torch.empty(8, 64, 128, 128, dtype=torch.float16))
    (2, 512, 8192, 4)
    """
    if 2 * x.shape[2] * x.shape[3] * x.element_size() <= PLANE_BUDGET:
        return 2, 512, 8192, 4
    return 1, 1024, 16384, 4


def is_default(x: torch.Tensor, interpolation_mode: int) -> bool:
    """Whether "plane" is grid_sample's default for ``x`` (N, C, H, W) in this mode: bilinear or
    nearest, an NCHW-contiguous input (a channels-last one is read in place by "nhwc") whose plane
    takes at most ``PLANE_DEFAULT_MAX`` bytes, and the variant :func:`available`."""
    return (
        interpolation_mode in PLANE_MODES
        and x.is_cuda
        and x.is_contiguous()
        and x.shape[2] * x.shape[3] * x.element_size() <= PLANE_DEFAULT_MAX
        and available()
    )


@functools.cache
def smem_limit(device: int) -> int:
    """The most dynamic shared memory one block of ``device`` may take, in bytes."""
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))


def smem_bytes(x: torch.Tensor, channels: int) -> int:
    """The shared memory a block takes for ``channels`` planes of ``x`` (N, C, H, W)."""
    return x.shape[2] * x.shape[3] * x.element_size() * channels


def plane_fits(x: torch.Tensor, channels: int) -> bool:
    """Whether ``channels`` planes of ``x`` (N, C, H, W) fit in one block's shared memory."""
    return smem_bytes(x, channels) <= smem_limit(x.device.index or 0)


@functools.cache
def _sm_count(device: int) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


@functools.cache
def _resident_blocks(device: int, threads: int, smem: int) -> int:
    """How many blocks of ``threads`` threads and ``smem`` bytes of shared memory one SM can hold
    by threads and shared memory alone (the kernel's registers are then budgeted for that many)."""
    props = torch.cuda.get_device_properties(device)
    per_sm = int(getattr(props, "shared_memory_per_multiprocessor", smem_limit(device)))
    by_threads = int(getattr(props, "max_threads_per_multi_processor", 2048)) // threads
    return max(1, min(by_threads, per_sm // (smem + 1024)))


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
    ]


# CUresult cuLaunchKernel(CUfunction, grid x, y, z, block x, y, z, shared bytes, CUstream, params, extra)
_LAUNCH_PROTOTYPE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
)


class _Kernel:
    """A compiled specialization and its launch: one ``cuLaunchKernel`` through ctypes with the
    arguments in one struct (PyTorch's ``_CudaKernel.__call__`` converts each argument on every call
    and takes several times the CPU time)."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled  # keeps the module loaded
        self.func = compiled.func
        self.smem = 0
        lib = torch.cuda._utils._get_gpu_runtime_library()
        # a prototype of our own over the same entry point: PyTorch's function object keeps its settings
        address = ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value
        if not address:
            raise RuntimeError("grid_sample 'plane': the CUDA driver has no cuLaunchKernel.")
        self.launch_fn = _LAUNCH_PROTOTYPE(address)

    def __call__(self, blocks: int, threads: int, smem: int, stream: int, args: _Args) -> None:
        if smem > self.smem:
            self.compiled.set_shared_memory_config(smem)
            self.smem = smem
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        rc = self.launch_fn(self.func, blocks, 1, 1, threads, 1, 1, smem, stream, params, None)
        if rc:
            raise RuntimeError(f"grid_sample 'plane': cuLaunchKernel failed with CUDA error {rc}.")


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
) -> _Kernel:
    """The compiled specialization, loaded on ``device`` (compiled once per process and device).
    ``min_blocks``: the blocks per SM its registers are budgeted for (``__launch_bounds__``)."""
    name = (
        f"grid_sample_plane_{'h' if half else 'f'}{'h' if grid_half else 'f'}_m{mode}p{pad}a{int(align)}"
        f"_c{ck}_t{threads}_u{unroll}_b{min_blocks}"
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
        "KNAME": name,
    }
    header = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    logger.debug("compiling %s", name)
    with torch.cuda.device(device):
        return _Kernel(torch.cuda._compile_kernel(header + _SOURCE, name))


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
    as threads and shared memory allow)]]); default :func:`default_config`. Where that leaves fewer
    blocks than twice the SM count, each plane's outputs are split over more blocks (each stages
    the plane). Raises ValueError when the planes do not fit in shared memory (:func:`plane_fits`).
    """
    if not (x.is_cuda and grid.is_cuda and out.is_cuda):
        raise ValueError("grid_sample 'plane' runs on CUDA tensors; on the CPU use the registered CPU kernel.")
    if x.dtype not in (torch.float32, torch.float16) or grid.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"grid_sample 'plane': float32 or float16 tensors, got {x.dtype} and {grid.dtype}.")
    cfg = tuple(config or default_config(x))
    ck, threads, chunk_max = cfg[:3]
    unroll = cfg[3] if len(cfg) > 3 else 0
    min_blocks_cfg = cfg[4] if len(cfg) > 4 else 0
    if ck not in (1, 2, 4) or threads not in (128, 256, 512, 1024) or chunk_max < 1:
        raise ValueError(
            f"grid_sample 'plane': config ({ck}, {threads}, {chunk_max}) needs 1, 2 or 4 channels per block, "
            "128-1024 threads (a power of 2) and at least one output pixel per block."
        )
    n, c, h, w = x.shape
    device = x.device.index or 0
    smem = smem_bytes(x, ck)
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
    blocks_wanted = 2 * _sm_count(device)
    if n * groups * parts < blocks_wanted:  # few planes: more blocks per plane, at least a block's threads each
        parts = max(parts, min(-(-blocks_wanted // (n * groups)), -(-hwo // threads)))
    chunk = -(-hwo // parts)
    if hwo >= 2**31 or n * groups * parts >= 2**31:
        raise ValueError(
            f"grid_sample 'plane': {n}x{c} planes of {hwo} outputs take more than 2**31 blocks or outputs "
            "per plane; use the 'nhwc' or 'loop' variant."
        )
    vec_ok = int((h * w) % (16 // x.element_size()) == 0 and x.data_ptr() % 16 == 0)
    half, grid_half = x.dtype == torch.float16, grid.dtype == torch.float16
    min_blocks = min_blocks_cfg or _resident_blocks(device, threads, smem)
    kernel = _kernel(
        device, half, grid_half, interpolation_mode, padding_mode, bool(align_corners), ck, threads, unroll, min_blocks
    )
    args = _Args(x.data_ptr(), grid.data_ptr(), out.data_ptr(), c, h, w, hwo, groups, parts, chunk, vec_ok)
    kernel(n * groups * parts, threads, smem, torch._C._cuda_getCurrentRawStream(device), args)
