"""CUDA C kernels compiled at run time: NVRTC through ``torch.cuda._compile_kernel``, launched with
one ``cuLaunchKernel`` through ctypes and the arguments in one struct.

PyTorch's ``_CudaKernel.__call__`` converts each argument on every call and takes several times the
CPU time of a launch; here a kernel takes one ``ctypes.Structure`` whose layout matches the kernel's
single struct parameter. Used by grid_sample's and DynamicResize's CUDA variants.

Example:
    >>> from opbridge.ops._nvrtc import compile_kernel  # doctest: +SKIP
    >>> kernel = compile_kernel(0, source, "my_kernel", {"NT": 256})  # doctest: +SKIP
    >>> kernel(blocks, 256, 0, stream, args)  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["PRELUDE", "Kernel", "compile_kernel", "nvrtc_available", "sm_count", "smem_limit"]

logger = logging.getLogger(__name__)

# The CUDA C every built-in kernel source starts with (``SCALAR_HALF`` defined 0 or 1): float16
# storage as raw 16-bit values converted with PTX (no cuda_fp16.h, which NVRTC may not find),
# ``scalar_t`` and ``VEC`` (elements per 16-byte load) for the storage dtype, and PyTorch's cubic
# convolution weights (A = -0.75) and four-tap sums with its CUDA roundings.
PRELUDE = r"""
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

// PyTorch's cubic convolution weights, A = -0.75: ((A + 2) x - (A + 3)) x x + 1 and
// ((A x - 5 A) x + 8 A) x - 4 A, with the roundings of its CUDA build written out (every product
// fused into the sum that follows it; cc1's product before its last multiplication rounded), so
// that no kernel's compilation contracts them differently
__device__ __forceinline__ float cc1(float x) { return __fmaf_rn(__fmul_rn(__fmaf_rn(1.25f, x, -2.25f), x), x, 1.0f); }
__device__ __forceinline__ float cc2(float x) { return __fmaf_rn(__fmaf_rn(__fmaf_rn(-0.75f, x, 3.75f), x, -6.0f), x, 3.0f); }

// v0 w0 + v1 w1 + v2 w2 + v3 w3 rounded as PyTorch's cubic_interp1d is on CUDA: the second product
// rounded, the first fused into it, then the third and the fourth (explicit, so that every
// specialization compiles to the same roundings)
__device__ __forceinline__ float taps4(float v0, float v1, float v2, float v3, float w0, float w1, float w2, float w3) {
    return __fmaf_rn(v3, w3, __fmaf_rn(v2, w2, __fmaf_rn(v0, w0, __fmul_rn(v1, w1))));
}
"""

# CUresult cuLaunchKernel(CUfunction, grid x, y, z, block x, y, z, shared bytes, CUstream, params, extra)
_LAUNCH_PROTOTYPE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
)


def nvrtc_available() -> bool:
    """Whether this process has a CUDA device and PyTorch's NVRTC wrapper (``torch.cuda._compile_kernel``)."""
    return torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel")


@functools.cache
def sm_count(device: int) -> int:
    """The number of SMs of ``device``."""
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


@functools.cache
def smem_limit(device: int) -> int:
    """The most dynamic shared memory one block of ``device`` may take, in bytes."""
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))


class Kernel:
    """A compiled kernel and its launch: ``kernel(blocks, threads, smem, stream, args)`` with
    ``args`` a ``ctypes.Structure`` laid out as the kernel's one struct parameter. ``name`` labels errors."""

    def __init__(self, compiled: Any, name: str) -> None:
        self.compiled = compiled  # keeps the module loaded
        self.func = compiled.func
        self.name = name
        self.smem = 0
        lib = torch.cuda._utils._get_gpu_runtime_library()
        # a prototype of our own over the same entry point: PyTorch's function object keeps its settings
        address = ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value
        if not address:
            raise RuntimeError(f"{name}: the CUDA driver has no cuLaunchKernel.")
        self.launch_fn = _LAUNCH_PROTOTYPE(address)
        self.lib = lib
        self.occupancy_cache: dict[tuple[int, int], int] = {}

    def _configure(self, smem: int) -> None:
        if smem > self.smem:
            self.compiled.set_shared_memory_config(smem)
            self.smem = smem

    def occupancy(self, threads: int, smem: int) -> int:
        """Blocks of ``threads`` threads and ``smem`` bytes one SM holds at once (the driver's count,
        registers included)."""
        key = (threads, smem)
        if key not in self.occupancy_cache:
            self._configure(smem)
            blocks = ctypes.c_int(0)
            rc = self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(blocks), self.func, ctypes.c_int(threads), ctypes.c_size_t(smem)
            )
            if rc:
                raise RuntimeError(f"{self.name}: cuOccupancyMaxActiveBlocksPerMultiprocessor failed ({rc}).")
            self.occupancy_cache[key] = max(1, blocks.value)
        return self.occupancy_cache[key]

    def __call__(self, blocks: int, threads: int, smem: int, stream: int, args: ctypes.Structure) -> None:
        self._configure(smem)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        rc = self.launch_fn(self.func, blocks, 1, 1, threads, 1, 1, smem, stream, params, None)
        if rc:
            raise RuntimeError(f"{self.name}: cuLaunchKernel failed with CUDA error {rc}.")


def compile_kernel(device: int, source: str, name: str, defines: Mapping[str, object], label: str) -> Kernel:
    """``source`` compiled with ``defines`` (``#define`` lines before it) and kernel ``name``, loaded
    on ``device``; ``label`` names the kernel in errors."""
    header = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    logger.debug("compiling %s", name)
    with torch.cuda.device(device):
        return Kernel(torch.cuda._compile_kernel(header + source, name), label)
