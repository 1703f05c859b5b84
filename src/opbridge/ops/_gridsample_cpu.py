"""grid_sample on the CPU with opbridge's native kernel (``opbridge.ops._cpu_kernels``): bilinear,
nearest and bicubic, float32.

ATen's CPU kernel gathers every tap again for every channel (bicubic also recomputes each of its
16 taps' padded coordinate, bounds mask and offset). The native kernel computes the taps once
per output point and reads them for all channels from a channels-last copy of the image (up to 8
channels padded to a vector of 4 or 8, so that a tap is one vector load; more by
:func:`channel_stride`), with the arithmetic of
ATen's vectorized kernel: bilinear and bicubic within a few float32 ulps of F.grid_sample (ATen's
build may fuse some products), nearest bit for bit. It writes straight into a caller's output
(ONNX Runtime's buffer through the bridge). With one channel (two for nearest) the copy costs more
than it saves: on CPUs with AVX2 the kernel then takes eight points per vector and gathers their
taps from the input planes themselves (the same bits as the channels-last path; 1.1-2.0x faster
there). ATen's kernel, vectorized across points the same way, is as fast with few channels and
needs no Python per call: :func:`applies` takes the native kernel from :data:`MIN_CHANNELS`
channels per mode (``benchmarks/cpu_ops.py --only grid-channels``).

Example:
    >>> import torch
    >>> x = torch.arange(16.0).reshape(1, 4, 2, 2)
    >>> grid = torch.zeros(1, 1, 1, 2)
    >>> grid_sample(x, grid, 2, padding_mode=1, align_corners=True).flatten()
    tensor([ 1.5000,  5.5000,  9.5000, 13.5000])
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np
import torch

from opbridge.ops import _cpu_native

__all__ = ["MIN_CHANNELS", "NATIVE_MIN_CHANNELS", "applies", "grid_sample", "native_kernel"]

# The fewest channels the native kernel is faster for, per interpolation mode (benchmarks/cpu_ops.py
# --only grid-channels on the 2-core development machine, 128 x 128 planes: bilinear 1.1-1.2x ATen at
# 3 channels, 0.9x at 2; nearest 1.0-1.3x at 4, 0.7-0.8x at 3; bicubic 1.3-1.4x at 2, 0.8x at 1).
MIN_CHANNELS = {0: 3, 1: 4, 2: 2}
# The same inside opbridge's ONNX Runtime session, where the native kernel runs without Python's cost
# per call and the alternative is ATen's kernel through the bridge's Python side (benchmarks/cpu_ops.py
# --only grid-session, 128 x 128 planes, against the Python kernel: bilinear 1.5x at 2 channels,
# 0.8-1.1x at 1 over two runs; nearest 1.2-2.0x from 1 channel; bicubic 1.15x at 2, 1.0x at 1). The
# native kernel takes fewer channels too where it reads them from the planes (AVX2: bilinear 1.3x,
# bicubic 1.15x the Python kernel at one channel).
NATIVE_MIN_CHANNELS = {0: 2, 1: 1, 2: 2}
# Outputs (channels x points) per image below which one thread does the work.
_SPLIT_MIN = 1 << 16


def applies(x: torch.Tensor, grid: torch.Tensor, interpolation_mode: int) -> bool:
    """Whether :func:`grid_sample` is the faster CPU path for ``x`` (N, C, H, W) in this mode:
    float32 on the CPU with at least ``MIN_CHANNELS[mode]`` channels, a float grid, and the
    extension built."""
    return (
        interpolation_mode in MIN_CHANNELS
        and x.is_cpu
        and x.dtype == torch.float32
        and x.dim() == 4
        and x.shape[1] >= MIN_CHANNELS[interpolation_mode]
        and grid.is_floating_point()
        and _cpu_native.available()
    )


def grid_sample(
    x: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int = 0,
    align_corners: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.grid_sample`` of float32 CPU ``x`` (N, C, H, W) at ``grid`` (N, Ho, Wo, 2): mode 0
    bilinear, 1 nearest or 2 bicubic, padding 0 zeros, 1 border, 2 reflection; into ``out`` (N, C, Ho, Wo)
    where given, else a new tensor. Uses up to ``torch.get_num_threads()`` threads."""
    module = _cpu_native.require()
    if interpolation_mode not in MIN_CHANNELS:
        raise ValueError(
            f"grid_sample (native): interpolation_mode {interpolation_mode}; 0 (bilinear), 1 (nearest) or 2 (bicubic)."
        )
    if padding_mode not in (0, 1, 2):
        raise ValueError(f"grid_sample (native): padding_mode {padding_mode}; 0 (zeros), 1 (border) or 2 (reflection).")
    if x.dtype != torch.float32 or not x.is_cpu:
        raise ValueError(f"grid_sample (native): a float32 CPU input expected, got {x.dtype} on {x.device}.")
    xs, gs = _array(x), _array(grid if grid.dtype == torch.float32 else grid.to(torch.float32))
    if xs.ndim != 4 or gs.ndim != 4 or gs.shape[0] != xs.shape[0] or gs.shape[3] != 2:
        raise ValueError(
            f"grid_sample (native): input (N, C, H, W) and grid (N, Ho, Wo, 2) expected, "
            f"got {tuple(x.shape)} and {tuple(grid.shape)}."
        )
    n, c, h, w = xs.shape
    ho, wo = gs.shape[1], gs.shape[2]
    target = _cpu_native.output_buffer("grid_sample (native)", out, (n, c, ho, wo))
    if h * w == 0 and n * c * ho * wo:
        raise ValueError(f"grid_sample (native): the input's planes are empty ({h}x{w}); pass H, W >= 1.")
    if n * c * ho * wo:
        _sample(module, xs, gs, target.numpy(), interpolation_mode, padding_mode, bool(align_corners))
    return _cpu_native.deliver(out, target)


def native_kernel(attrs: Mapping[str, Any]) -> Any:
    """The native kernel of a grid_sampler node with these attributes, for ONNX Runtime's bridge (a
    capsule, ``opbridge/_native_kernel.h``): the kernel of :func:`grid_sample`, run without Python,
    for float32 inputs from :data:`NATIVE_MIN_CHANNELS` channels (from one where it reads the input
    planes directly, on CPUs with AVX2); None where the extension is not
    built or an attribute is out of range (the Python kernel names it)."""
    module = _cpu_native.module()
    mode, padding = attrs.get("interpolation_mode", 0), attrs.get("padding_mode", 0)
    if module is None or mode not in MIN_CHANNELS or padding not in (0, 1, 2):
        return None
    align = bool(attrs.get("align_corners", False))
    return module.grid_sample_native(mode, padding, align, NATIVE_MIN_CHANNELS[mode])


def _array(t: torch.Tensor) -> Any:
    """A contiguous, aligned numpy array over ``t`` (a CPU tensor), its memory where it is both (a
    caller's feed may start at any address; the C kernels read whole floats)."""
    if t.requires_grad:
        t = t.detach()
    return np.require((t if t.is_contiguous() else t.contiguous()).numpy(), requirements=("C", "A"))


def channel_stride(channels: int) -> int:
    """Values per pixel of the channels-last copy (the extension's rule, which its native kernel
    uses too): up to 8 channels are padded to a vector of 4 or 8 (each tap one vector load); more
    are rounded up to a multiple of 4, plus 4 where a pixel's values would take a multiple of 256
    bytes (pixels that far apart share few L1 cache sets: at 256 channels the layout copy ran 5x
    slower).

    >>> [channel_stride(c) for c in (3, 5, 9, 64, 100, 256)]
    [4, 8, 12, 68, 100, 260]
    """
    return int(_cpu_native.require().channel_stride(channels))


def _sample(module: ModuleType, xs: Any, gs: Any, os_: Any, mode: int, pad: int, align: bool) -> None:
    """xs (N, C, H, W), gs (N, Ho, Wo, 2) into os_ (N, C, Ho, Wo): contiguous float32 arrays."""
    n, c, h, w = xs.shape
    hw, p = h * w, gs.shape[1] * gs.shape[2]
    xs, gs, os_ = xs.reshape(n, c, hw), gs.reshape(n, p, 2), os_.reshape(n, c, p)
    threads = _cpu_native.threads_for(c * p, _SPLIT_MIN)
    if module.planes_apply(c, h, w, mode):  # few channels: gathered from the planes, no layout copy
        for i in range(n):
            _cpu_native.split(
                module.grid_sample_planes, (xs[i], gs[i], os_[i], c, h, w, p, mode, pad, align), p, threads
            )
        return
    stride = channel_stride(c)
    xt = _cpu_native.scratch((hw + 1) * stride).reshape(hw + 1, stride)  # one image channels-last, a zero row
    for i in range(n):
        _cpu_native.split(module.to_channels_last, (xs[i], xt, c, stride, hw), hw, threads)
        _cpu_native.split(module.grid_sample, (xt, gs[i], os_[i], c, stride, h, w, p, mode, pad, align), p, threads)
