"""Bicubic resize on the CPU with opbridge's native kernel (``opbridge.ops._cpu_kernels``).

``F.interpolate(mode="bicubic")``'s CPU kernel computes each output from its 16 taps. An output
is a weighted sum of four row sums, and each row sum (four taps of one input row at one output
column) is shared by every output row that reads that input row: the native kernel computes the
row sums once per input row (a horizontal pass over the rows an output band reads), then the
weighted sums across whole output rows, vectorized. The sums are ATen's, in ATen's order; the
source index is rounded once, as ATen's build computes it. Results lie within 2e-6 of
F.interpolate relative to the input's largest value (ATen's build fuses some other products). It writes
into a caller's output (ONNX Runtime's buffer through the bridge), and splits planes, or the
output rows of few planes, over ``torch.get_num_threads()`` threads.

Example:
    >>> import torch
    >>> x = torch.arange(4.0).reshape(1, 1, 2, 2)
    >>> resize_bicubic(x, 3, 3, align_corners=True)
    tensor([[[[0.0000, 0.5000, 1.0000],
              [1.0000, 1.5000, 2.0000],
              [2.0000, 2.5000, 3.0000]]]])
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from opbridge.ops import _cpu_native

__all__ = ["applies", "native_kernel", "resize_bicubic"]

# Outputs per thread below which a call is not split further.
_SPLIT_MIN = 1 << 16


def applies(x: torch.Tensor) -> bool:
    """Whether :func:`resize_bicubic` runs ``x``: a float32 CPU tensor (N, C, H, W) with the
    extension built (other dtypes run ATen's kernel)."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 4 and _cpu_native.available()


def native_kernel(attrs: Mapping[str, Any]) -> Any:
    """DynamicResize's native kernel for ONNX Runtime's bridge (a capsule, ``opbridge/_native_kernel.h``):
    :func:`resize_bicubic` for float32 inputs, run without Python; None where the extension is not built."""
    module = _cpu_native.module()
    return None if module is None else module.resize_bicubic_native(bool(attrs.get("align_corners", False)))


def resize_bicubic(
    x: torch.Tensor, height: int, width: int, align_corners: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.interpolate(x, size=(height, width), mode="bicubic", align_corners=...)`` of float32 CPU
    ``x`` (N, C, H, W), into ``out`` (N, C, height, width) where given, else a new tensor."""
    module = _cpu_native.require()
    if x.dim() != 4 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(
            f"resize_bicubic: a float32 CPU input (N, C, H, W) expected, got {tuple(x.shape)} {x.dtype} on {x.device}."
        )
    n, c, h, w = x.shape
    if n and not c:  # F.interpolate takes an empty batch, not empty images
        raise ValueError(
            f"resize_bicubic: the input {list(x.shape)} has no channels (F.interpolate refuses it too); pass C >= 1."
        )
    if height < 1 or width < 1:
        raise ValueError(f"resize_bicubic: output size {height}x{width}; both must be at least 1.")
    target = _cpu_native.output_buffer("resize_bicubic", out, (n, c, height, width))
    if h * w == 0 and n * c:
        raise ValueError(f"resize_bicubic: the input's planes are empty ({h}x{w}); pass H, W >= 1.")
    planes = n * c
    if planes:
        # (aligned: a caller's feed may start at any address; the C kernel reads whole floats)
        xs, os_ = np.require(x.detach().contiguous().numpy(), requirements=("C", "A")), target.numpy()
        threads = _cpu_native.threads_for(planes * height * width, _SPLIT_MIN)
        call = functools.partial(module.resize_bicubic, xs, os_, planes, h, w, height, width, bool(align_corners))
        if planes >= threads:  # whole planes per thread
            calls = [functools.partial(call, a, b, 0, height) for a, b in _cpu_native.ranges(planes, threads)]
        else:  # few planes: bands of output rows (each band reads its own input rows)
            calls = [functools.partial(call, 0, planes, a, b) for a, b in _cpu_native.ranges(height, threads)]
        _cpu_native.run(calls)
    return _cpu_native.deliver(out, target)
