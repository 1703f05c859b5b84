"""MMCV roi_align on the CPU with opbridge's native kernel (``opbridge.ops._cpu_kernels``).

The features are copied channels-last once per call; then every sample of a bin reads its four
corner pixels' channels as contiguous rows, and the channel loop runs vectorized, in MMCV's
arithmetic and order (float32 sample positions, its bilinear rule at the edges, sums over rows then
columns, divided by the sample count for "avg"; the maximum for "max", a sample outside counting as
0). RoIs are split over ``torch.get_num_threads()`` threads. The result is written into a caller's
output where given (ONNX Runtime's buffer through the bridge).

Example:
    >>> import numpy as np
    >>> feat = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    >>> rois = np.array([[0, 0, 0, 4, 4]], np.float32)
    >>> roi_align(feat, rois, 1, 1, 1.0, 2, False, True).ravel()
    array([7.5], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from opbridge.ops import _cpu_native

__all__ = ["native_kernel", "roi_align"]

# RoIs per thread below which one thread does the work.
_SPLIT_MIN = 8


def native_kernel(attrs: Mapping[str, Any]) -> Any:
    """The native kernel of an MMCVRoiAlign node with these attributes, for ONNX Runtime's bridge (a
    capsule, ``opbridge/_native_kernel.h``): :func:`roi_align` for float32 features and RoIs, run
    without Python (RoIs it refuses go to the Python kernel, which names them); None where the
    extension is not built or an attribute is out of range (the Python kernel names it)."""
    module = _cpu_native.module()
    height, width = attrs.get("output_height", 7), attrs.get("output_width", 7)
    mode = attrs.get("mode", "avg")
    if module is None or mode not in ("avg", "max") or not (isinstance(height, int) and isinstance(width, int)):
        return None
    sampling = attrs.get("sampling_ratio", 0)
    if height < 1 or width < 1 or height * width >= 2**31 - 1 or not -(2**31) <= int(sampling) < 2**31:
        return None
    return module.roi_align_native(
        height,
        width,
        float(attrs.get("spatial_scale", 1.0)),
        int(sampling),
        mode == "max",
        bool(attrs.get("aligned", True)),
    )


def roi_align(
    feat: np.ndarray,
    rois: np.ndarray,
    output_height: int,
    output_width: int,
    spatial_scale: float,
    sampling_ratio: int,
    pool_max: bool,
    aligned: bool,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """MMCV roi_align of ``feat`` (N, C, H, W) at ``rois`` (R, 5) [batch index, x1, y1, x2, y2] into
    ``out`` (R, C, output_height, output_width) where given (float32, contiguous), else a new float32
    array. A ValueError names a RoI whose batch index lies outside the batch or whose sampling grid
    is not finite."""
    module = _cpu_native.require()
    if feat.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5:
        raise ValueError(
            f"roi_align (native): feat (N, C, H, W) and rois (R, 5) expected, got {feat.shape} and {rois.shape}."
        )
    n, c, h, w = feat.shape
    r, ph, pw = rois.shape[0], output_height, output_width
    want = (r, c, ph, pw)
    if out is not None and (out.shape != want or out.dtype != np.float32 or not out.flags.c_contiguous):
        raise ValueError(
            f"roi_align (native): `out` must be a contiguous float32 array of shape {want}, got {out.shape} {out.dtype}."
        )
    target = out if out is not None else np.empty(want, np.float32)
    if target.size == 0:
        return target
    if n * h * w == 0:
        raise ValueError(f"roi_align (native): the features {feat.shape} are empty; pass N, H, W >= 1.")
    # contiguous and aligned (a caller's feed may start at any address; the C kernels read whole floats)
    xs = np.require(feat, np.float32, ("C", "A")).reshape(n, c, h * w)
    boxes = np.require(rois, np.float32, ("C", "A"))
    hw = h * w
    xt = _cpu_native.scratch(n * (hw + 1) * c).reshape(n, hw + 1, c)  # each image channels-last (last row unused)
    threads = _cpu_native.threads_for(n * hw * c, 1 << 16)
    for i in range(n):
        _cpu_native.split(module.to_channels_last, (xs[i], xt[i], c, c, hw), hw, threads)
    # a ratio past int32 means the same as 2**31 - 1: a grid over ROI_MAX_SAMPLES, named per RoI
    scale, sampling = float(spatial_scale), max(-(2**31), min(int(sampling_ratio), 2**31 - 1))
    args = (xt, boxes, target, n, c, h, w, r, ph, pw, scale, sampling, bool(pool_max), bool(aligned))
    _cpu_native.split(module.roi_align, args, r, _cpu_native.threads_for(r, _SPLIT_MIN))
    return target
