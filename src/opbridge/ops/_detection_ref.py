"""PyTorch references of the detection ops (see :mod:`opbridge.ops.detection`).

Plain PyTorch, CPU or CUDA, any float dtype (computed in float32 where the
reference semantics need it). Each function states the reference it follows.
This module imports torch only: GPU scripts can import it without onnx.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "GRID_MODES",
    "GRID_PADDINGS",
    "ROI_MAX_SAMPLES",
    "batched_nms",
    "check_grid_shapes",
    "check_levels",
    "check_roi_batch",
    "check_rois",
    "deform_conv2d",
    "grid_sample",
    "level_rois",
    "map_roi_levels",
    "multi_level_roi_align",
    "nms_iou",
    "rescale_rois",
    "roi_align",
    "roi_grid",
]

GRID_MODES = ("bilinear", "nearest", "bicubic")
GRID_PADDINGS = ("zeros", "border", "reflection")
_FLT_MAX = 3.4028234663852886e38


def check_choice(op: str, name: str, value: int, names: tuple[str, ...]) -> str:
    """The name coded by the int attribute ``value``, or a ValueError naming the choices."""
    if not 0 <= value < len(names):
        choices = ", ".join(f"{i} ({n})" for i, n in enumerate(names))
        raise ValueError(f"{op}: attribute {name!r} must be one of {choices}; got {value}.")
    return names[value]


# --------------------------------------------------------------------------- grid_sampler


def _differ(a: Any, b: Any) -> bool:
    """Whether two sizes are known to differ: both ints. The shape rules run these checks on symbolic sizes
    too (torch.export's, a TensorRT build's dynamic dims, ONNX's named ones), which are not compared."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def check_grid_shapes(x_shape: tuple[int, ...], grid_shape: tuple[int, ...]) -> None:
    """A ValueError unless input is (N, C, H, W) and grid (N, Ho, Wo, 2) of the same N (sizes that
    are not ints, symbolic ones at export, are not compared)."""
    if len(x_shape) != 4 or len(grid_shape) != 4 or _differ(grid_shape[3], 2) or _differ(grid_shape[0], x_shape[0]):
        raise ValueError(
            f"mmdeploy::grid_sampler: input must be (N, C, H, W) and grid (N, Ho, Wo, 2) with the same N "
            f"(the op samples 2-D planes); got input {list(x_shape)} and grid {list(grid_shape)}."
        )


def grid_sample(
    x: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> torch.Tensor:
    """``F.grid_sample`` with MMDeploy's integer-coded mode attributes (4-D: the op is 2-D).

    Half-precision inputs on the CPU are sampled in float32 and rounded once, as PyTorch's CUDA kernel
    computes them (its CPU kernel rounds every intermediate to float16, up to 0.04 off on values near 1).
    """
    mode = check_choice("mmdeploy::grid_sampler", "interpolation_mode", interpolation_mode, GRID_MODES)
    pad = check_choice("mmdeploy::grid_sampler", "padding_mode", padding_mode, GRID_PADDINGS)
    check_grid_shapes(tuple(x.shape), tuple(grid.shape))
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
        wide = F.grid_sample(x.float(), grid.float(), mode=mode, padding_mode=pad, align_corners=align_corners)
        return wide.to(x.dtype)
    return F.grid_sample(x, grid.to(x.dtype), mode=mode, padding_mode=pad, align_corners=align_corners)


# --------------------------------------------------------------------------- deformable convolution


def _pair(name: str, value: tuple[int, ...]) -> tuple[int, int]:
    # two ints, as MMCV's node has them and ONNX DeformConv (the op's function body) takes them: one int
    # ran here but failed in the export and in every runtime that runs the body
    if len(value) != 2:
        fix = f"; write [{value[0]}, {value[0]}]" if len(value) == 1 else ""
        raise ValueError(
            f"mmdeploy::MMCVModulatedDeformConv2d: attribute {name!r} takes 2 ints (H, W); got {list(value)}{fix}."
        )
    return value[0], value[1]


def check_dcn_attributes(
    stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...], groups: int, deform_groups: int
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Check a DCNv2 call's attributes (those that need no input size); return (stride, padding, dilation)."""
    op = "mmdeploy::MMCVModulatedDeformConv2d"
    s, p, d = _pair("stride", tuple(stride)), _pair("padding", tuple(padding)), _pair("dilation", tuple(dilation))
    if min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise ValueError(
            f"{op}: stride and dilation must be >= 1 and padding >= 0; got stride={list(s)}, "
            f"padding={list(p)}, dilation={list(d)}."
        )
    if groups < 1 or deform_groups < 1:
        raise ValueError(f"{op}: groups and deform_groups must be >= 1; got {groups} and {deform_groups}.")
    return s, p, d


def deform_conv_geometry(
    x_shape: tuple[int, ...],
    offset_shape: tuple[int, ...],
    mask_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
    deform_groups: int,
    bias_shape: tuple[int, ...] | None = None,
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], int, int]:
    """Check a DCNv2 call's shapes; return (stride, padding, dilation, Hout, Wout)."""
    op = "mmdeploy::MMCVModulatedDeformConv2d"
    s, p, d = check_dcn_attributes(stride, padding, dilation, groups, deform_groups)
    if len(x_shape) != 4 or len(w_shape) != 4 or min(w_shape[2:]) < 1:
        raise ValueError(
            f"{op}: input must be (N, C, H, W) and weight (Cout, C / groups, kH, kW) with kH, kW >= 1; "
            f"got input {tuple(x_shape)} and weight {tuple(w_shape)}."
        )
    n, cin, h, w = x_shape
    cout, cin_g, kh, kw = w_shape
    if bias_shape is not None and tuple(bias_shape) != (cout,):
        raise ValueError(f"{op}: bias must be ({cout},), one value per output channel; got {tuple(bias_shape)}.")
    if cin != cin_g * groups or cout % groups:
        raise ValueError(
            f"{op}: input has {cin} channels and weight {tuple(w_shape)} with groups={groups}; "
            f"need input channels = weight.shape[1] * groups and weight.shape[0] divisible by groups."
        )
    if cin % deform_groups:
        raise ValueError(f"{op}: input channels {cin} are not divisible by deform_groups={deform_groups}.")
    ext_h, ext_w = d[0] * (kh - 1) + 1, d[1] * (kw - 1) + 1
    if h + 2 * p[0] < ext_h or w + 2 * p[1] < ext_w:
        raise ValueError(
            f"{op}: the dilated kernel ({ext_h} x {ext_w}) is larger than the padded input "
            f"({h + 2 * p[0]} x {w + 2 * p[1]}); use a larger padding or a smaller dilation."
        )
    hout = (h + 2 * p[0] - ext_h) // s[0] + 1
    wout = (w + 2 * p[1] - ext_w) // s[1] + 1
    k = kh * kw
    want_off = (n, 2 * deform_groups * k, hout, wout)
    want_mask = (n, deform_groups * k, hout, wout)
    if tuple(offset_shape) != want_off or tuple(mask_shape) != want_mask:
        raise ValueError(
            f"{op}: offset {tuple(offset_shape)} and mask {tuple(mask_shape)} do not fit input {tuple(x_shape)}, "
            f"weight {tuple(w_shape)}, deform_groups={deform_groups}: expected offset {want_off} and mask {want_mask}."
        )
    return s, p, d, hout, wout


def _bilinear_zero_pad(img: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Sample ``img`` [N, C, H, W] at (y, x) [N, P]: bilinear, zero outside (torchvision's deform_conv rule)."""
    n, c, h, w = img.shape
    # torchvision's test, as written there: outside (-1, H) x (-1, W) the sample is 0, an infinite
    # coordinate included; a NaN coordinate passes it and gives NaN
    if h == 0 or w == 0:  # an empty input: every sample is outside it
        return torch.zeros(n, c, y.shape[1], dtype=img.dtype, device=img.device)
    inside = ~((y <= -1) | (y >= h) | (x <= -1) | (x >= w))
    y0 = torch.floor(y)
    x0 = torch.floor(x)
    ly, lx = y - y0, x - x0
    y0i, x0i = y0.long(), x0.long()
    flat = img.reshape(n, c, h * w)
    out = torch.zeros(n, c, y.shape[1], dtype=img.dtype, device=img.device)
    for dy, dx, wgt in (
        (0, 0, (1 - ly) * (1 - lx)),
        (0, 1, (1 - ly) * lx),
        (1, 0, ly * (1 - lx)),
        (1, 1, ly * lx),
    ):
        yy, xx = y0i + dy, x0i + dx
        ok = (inside & (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)).unsqueeze(1)
        idx = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).unsqueeze(1).expand(n, c, -1)
        # a corner outside the input reads 0 (not the clamped pixel, which may be inf or NaN)
        val = torch.where(ok, torch.gather(flat, 2, idx), 0.0)
        out += val * torch.where(inside, wgt, 0.0).unsqueeze(1)
    return out


def deform_conv2d(
    x: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
    deform_groups: int,
) -> torch.Tensor:
    """Modulated deformable convolution (DCNv2), torchvision ``deform_conv2d(..., mask=mask)`` semantics.

    Offsets are laid out (deform group, kernel tap, [dy, dx]) along dim 1, mask
    (deform group, kernel tap); sampling is bilinear with zeros outside the input.
    """
    (sh, sw), (ph, pw), (dh, dw), hout, wout = deform_conv_geometry(
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
    dtype = x.dtype
    xf, off, m, wf = x.float(), offset.float(), mask.float(), weight.float()
    n, cin, _, _ = x.shape
    cout, cin_g, kh, kw = weight.shape
    k = kh * kw
    p = hout * wout
    dev = x.device
    base_y = (torch.arange(hout, device=dev) * sh - ph).view(1, hout, 1).float()
    base_x = (torch.arange(wout, device=dev) * sw - pw).view(1, 1, wout).float()
    tap_y = (torch.arange(kh, device=dev).repeat_interleave(kw) * dh).view(k, 1, 1).float()
    tap_x = (torch.arange(kw, device=dev).repeat(kh) * dw).view(k, 1, 1).float()
    cdg = cin // deform_groups
    cols = []
    for g in range(deform_groups):
        o = off[:, 2 * k * g : 2 * k * (g + 1)].reshape(n, k, 2, hout, wout)
        y = (base_y + tap_y).unsqueeze(0) + o[:, :, 0]
        xx = (base_x + tap_x).unsqueeze(0) + o[:, :, 1]
        vals = _bilinear_zero_pad(xf[:, g * cdg : (g + 1) * cdg], y.reshape(n, k * p), xx.reshape(n, k * p))
        vals = vals.reshape(n, cdg, k, p) * m[:, g * k : (g + 1) * k].reshape(n, 1, k, p)
        cols.append(vals)
    col = torch.cat(cols, 1).reshape(n, groups, cin_g * k, p)
    wg = wf.reshape(groups, cout // groups, cin_g * k)
    out = torch.einsum("gok,ngkp->ngop", wg, col).reshape(n, cout, hout, wout)
    if bias is not None:
        out = out + bias.float().view(1, cout, 1, 1)
    return out.to(dtype)


# --------------------------------------------------------------------------- RoIAlign


# Samples per RoI and channel (the bins times the samples of a bin) at most: a RoI of 4096 x 4096
# pixels of its feature map with an adaptive grid. A larger grid is refused by every RoIAlign
# implementation (one such box would take seconds to hours).
ROI_MAX_SAMPLES = 1 << 24


def check_rois(op: str, rois: Any) -> None:
    if len(rois.shape) != 2 or _differ(rois.shape[1], 5):
        raise ValueError(
            f"{op}: rois must be (num_rois, 5) rows [batch_index, x1, y1, x2, y2]; got {tuple(rois.shape)}."
        )


def check_roi_features(op: str, shape: tuple[int, ...]) -> None:
    """A ValueError unless the features are 4-D (N, C, H, W)."""
    if len(shape) != 4:
        raise ValueError(f"{op}: input must be (N, C, H, W) features; got {tuple(shape)}.")


def check_output_size(op: str, output_height: int, output_width: int) -> None:
    """A ValueError naming an output height or width below 1 (the reference's and the shape rules')."""
    if output_height < 1 or output_width < 1:
        raise ValueError(f"{op}: output_height and output_width must be >= 1; got {output_height}x{output_width}.")


def check_features(op: str, shape: tuple[int, ...], n_rois: int) -> None:
    """A ValueError where RoIs would sample an empty feature map (N, H or W is 0), as the native
    kernel says it (the loops failed with a bare IndexError); no RoIs sample nothing, and give an
    empty output whatever the features."""
    if n_rois and len(shape) == 4 and 0 in (shape[0], shape[2], shape[3]):
        raise ValueError(f"{op}: the features {tuple(shape)} are empty; pass N, H, W >= 1.")


def check_roi_batch(op: str, batch_index: Any, n: int) -> None:
    """A ValueError naming the first RoI whose batch index (a float, truncated as MMCV's int cast)
    lies outside [0, n): NaN and infinite ones included. ``batch_index``: the rois' column 0 (numpy)."""
    import numpy as np

    b = np.asarray(batch_index, dtype=np.float32)
    bad = ~((b > -1) & (b < n))
    if bad.any():
        r = int(np.argmax(bad))
        raise ValueError(f"{op}: RoI {r} has batch index {float(b[r])!r}, outside the feature batch of {n}.")


def roi_grid(op: str, boxes: Any, fh: Any, fw: Any, out_h: int, out_w: int, first: int = 0) -> tuple[Any, Any]:
    """The sampling grids (gh, gw) of a bin of each RoI from its float sizes ``fh``, ``fw`` (one per
    RoI; 0 for an empty box), as int64 arrays; a ValueError names the first RoI (numbered from
    ``first``; ``boxes``: their [x1, y1, x2, y2]) whose grid is not finite or over
    :data:`ROI_MAX_SAMPLES` samples in all."""
    import numpy as np

    fh, fw = (np.asarray(f, np.float64) for f in (fh, fw))
    fh, fw = (np.where((f > 0) | np.isnan(f), f, 0.0) for f in (fh, fw))
    with np.errstate(invalid="ignore"):
        bad = ~((fh <= ROI_MAX_SAMPLES) & (fw <= ROI_MAX_SAMPLES) & (fh * fw * (out_h * out_w) <= ROI_MAX_SAMPLES))
    if bad.any():
        r = int(np.argmax(bad))
        raise ValueError(
            f"{op}: RoI {first + r} {[float(v) for v in boxes[r]]} needs a sampling grid that is not finite or "
            f"over {ROI_MAX_SAMPLES} samples (the bins times the samples of a bin); pass finite boxes on the "
            "feature map's scale or a smaller sampling_ratio > 0."
        )
    return fh.astype(np.int64), fw.astype(np.int64)


def _mmcv_bilinear(flat: torch.Tensor, h: int, w: int, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """MMCV/torchvision RoIAlign bilinear rule. flat [C, H*W]; y, x broadcastable -> [C, *shape].

    A NaN coordinate (a NaN box with a fixed sampling ratio) reads pixel 0 with NaN weights: NaN."""
    y, x = torch.broadcast_tensors(y, x)
    outside = (y < -1.0) | (y > h) | (x < -1.0) | (x > w)
    y = y.clamp(min=0, max=h)  # beyond h the sample is outside; the bound keeps the index in range
    x = x.clamp(min=0, max=w)
    y0 = torch.floor(y).nan_to_num(0.0).long()
    x0 = torch.floor(x).nan_to_num(0.0).long()
    # a NaN coordinate keeps its NaN weights on a one-pixel axis too (the last-pixel rule would
    # replace it with pixel 0); its other tap is clamped into the plane
    ylast = (y0 >= h - 1) & ~y.isnan()
    xlast = (x0 >= w - 1) & ~x.isnan()
    y0 = torch.where(ylast, torch.full_like(y0, h - 1), y0)
    x0 = torch.where(xlast, torch.full_like(x0, w - 1), x0)
    y = torch.where(ylast, y0.to(y.dtype), y)
    x = torch.where(xlast, x0.to(x.dtype), x)
    y1 = torch.where(ylast, y0, y0 + 1).clamp(max=h - 1)
    x1 = torch.where(xlast, x0, x0 + 1).clamp(max=w - 1)
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    shape = y.shape

    def at(yy: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
        return flat[:, (yy * w + xx).reshape(-1)].reshape(flat.shape[0], *shape)

    val = hy * hx * at(y0, x0) + hy * lx * at(y0, x1) + ly * hx * at(y1, x0) + ly * lx * at(y1, x1)
    return torch.where(outside, torch.zeros_like(val), val)


def _roi_align_one(
    flat: torch.Tensor,
    h: int,
    w: int,
    box: list[float],
    out_h: int,
    out_w: int,
    spatial_scale: float,
    sampling_ratio: int,
    pool_max: bool,
    aligned: bool,
    index: int = 0,
) -> torch.Tensor:
    """RoIAlign of one RoI (number ``index``) over one image's features flat [C, H*W] -> [C, out_h, out_w]
    (MMCV rule)."""
    off = 0.5 if aligned else 0.0

    # float32 arithmetic, as the CUDA/CPU kernels do
    def f(v: Any) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.float32)

    x1 = f(box[0]) * spatial_scale - off
    y1 = f(box[1]) * spatial_scale - off
    rw = f(box[2]) * spatial_scale - off - x1
    rh = f(box[3]) * spatial_scale - off - y1
    if not aligned:
        rw = torch.clamp(rw, min=1.0)
        rh = torch.clamp(rh, min=1.0)
    bh, bw = rh / out_h, rw / out_w
    if sampling_ratio > 0:
        fh = fw = float(sampling_ratio)
    else:  # ceil in float32 (a NaN or infinite size stays so: roi_grid names the RoI)
        fh, fw = float(torch.ceil(rh / out_h)), float(torch.ceil(rw / out_w))
    grid_h, grid_w = roi_grid("mmdeploy::MMCVRoiAlign", [box], [fh], [fw], out_h, out_w, first=index)
    gh, gw = int(grid_h[0]), int(grid_w[0])
    dev = flat.device
    if gh <= 0 or gw <= 0:
        fill = -_FLT_MAX if pool_max else 0.0
        return torch.full((flat.shape[0], out_h, out_w), fill, dtype=torch.float32, device=dev)
    iy = torch.arange(gh, device=dev, dtype=torch.float32)
    ix = torch.arange(gw, device=dev, dtype=torch.float32)
    py = torch.arange(out_h, device=dev, dtype=torch.float32)
    px = torch.arange(out_w, device=dev, dtype=torch.float32)
    ys = y1 + py.view(-1, 1) * bh + (iy.view(1, -1) + 0.5) * bh / gh  # [out_h, gh]
    xs = x1 + px.view(-1, 1) * bw + (ix.view(1, -1) + 0.5) * bw / gw  # [out_w, gw]
    vals = _mmcv_bilinear(flat, h, w, ys.view(out_h, gh, 1, 1), xs.view(1, 1, out_w, gw))  # [C, oh, gh, ow, gw]
    if pool_max:
        return vals.amax(dim=(2, 4))
    return vals.sum(dim=(2, 4)) / max(gh * gw, 1)


def roi_align(
    feat: torch.Tensor,
    rois: torch.Tensor,
    output_height: int,
    output_width: int,
    spatial_scale: float,
    sampling_ratio: int,
    mode: str,
    aligned: bool,
) -> torch.Tensor:
    """MMCV ``roi_align`` (= torchvision ``roi_align`` for mode "avg"), one RoI at a time."""
    op = "mmdeploy::MMCVRoiAlign"
    check_rois(op, rois)
    check_roi_features(op, tuple(feat.shape))
    if mode not in ("avg", "max"):
        raise ValueError(f"{op}: attribute 'mode' must be 'avg' or 'max'; got {mode!r}.")
    check_output_size(op, output_height, output_width)
    check_features(op, tuple(feat.shape), rois.shape[0])
    n, c, h, w = feat.shape
    flat = feat.float().reshape(n, c, h * w)
    out = torch.empty(
        rois.shape[0],
        c,
        output_height,
        output_width,
        dtype=torch.float32,
        device=feat.device,
    )
    check_roi_batch(op, rois[:, 0].detach().float().cpu().numpy(), n)
    for r, row in enumerate(rois.float().tolist()):
        out[r] = _roi_align_one(
            flat[int(row[0])],
            h,
            w,
            row[1:],
            output_height,
            output_width,
            spatial_scale,
            sampling_ratio,
            mode == "max",
            aligned,
            r,
        )
    return out.to(feat.dtype)


def rescale_rois(rois: torch.Tensor, factor: float) -> torch.Tensor:
    """Scale each RoI about its centre by ``factor`` (MMDet's ``roi_rescale``)."""
    cx = (rois[:, 1] + rois[:, 3]) * 0.5
    cy = (rois[:, 2] + rois[:, 4]) * 0.5
    w = (rois[:, 3] - rois[:, 1]) * factor
    h = (rois[:, 4] - rois[:, 2]) * factor
    return torch.stack([rois[:, 0], cx - w * 0.5, cy - h * 0.5, cx + w * 0.5, cy + h * 0.5], dim=1)


def check_levels(op: str, shapes: list[tuple[int, ...]]) -> None:
    """A ValueError unless every feature level is (N, C, H, W) with feat0's C."""
    if any(len(s) != 4 or _differ(s[1], shapes[0][1]) for s in shapes):
        raise ValueError(
            f"{op}: the feature levels must be (N, C, H, W) with the same C; got {[list(s) for s in shapes]}."
        )


def check_strides(op: str, featmap_strides: tuple[float, ...], levels: int) -> None:
    """A ValueError unless ``featmap_strides`` gives each of the ``levels`` feature maps a finite stride > 0."""
    if len(featmap_strides) != levels:
        raise ValueError(
            f"{op}: {levels} feature map(s) given but featmap_strides has {len(featmap_strides)} "
            f"entries {list(featmap_strides)}; give one stride per feature map."
        )
    if not all(math.isfinite(s) and s > 0 for s in featmap_strides):
        raise ValueError(
            f"{op}: featmap_strides must be finite and > 0 (each feature map's stride in input pixels, "
            f"e.g. [4, 8, 16, 32]); got {list(featmap_strides)}."
        )


def map_roi_levels(rois: torch.Tensor, num_levels: int, finest_scale: int) -> torch.Tensor:
    """FPN level of each RoI: floor(log2(sqrt(area) / finest_scale + 1e-6)) clamped to [0, L-1] (MMDet).

    A RoI whose level is NaN (an area below 0, a NaN box) gets level -1, which no feature map has,
    and its output stays 0: MMDet's ``.long()`` of NaN on the CPU (its value on CUDA differs)."""
    scale = torch.sqrt((rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2]))
    lvl = torch.floor(torch.log2(scale / finest_scale + 1e-6)).clamp(min=0, max=num_levels - 1)
    return torch.where(lvl.isnan(), -1.0, lvl).long()


def level_rois(level: int, idx: Any) -> str:
    """Which of MultiLevelRoiAlign's RoIs one level's RoIAlign numbers 0, 1, ... (for its messages)."""
    shown = ", ".join(str(int(i)) for i in list(idx)[:8]) + (", ..." if len(idx) > 8 else "")
    return f"FPN level {level}, whose RoIs 0, 1, ... are the op's RoIs {shown}"


def multi_level_roi_align(
    rois: torch.Tensor,
    feats: list[torch.Tensor],
    output_height: int,
    output_width: int,
    featmap_strides: tuple[float, ...],
    sampling_ratio: int,
    pool_mode: int,
    roi_scale_factor: float,
    finest_scale: int,
    aligned: bool,
) -> torch.Tensor:
    """MMDet's ``SingleRoIExtractor``: map RoIs to levels, optionally rescale, RoIAlign on each level."""
    op = "mmdeploy::MMCVMultiLevelRoiAlign"
    check_rois(op, rois)
    check_strides(op, featmap_strides, len(feats))
    mode = {0: "max", 1: "avg"}.get(pool_mode)
    if mode is None:
        raise ValueError(f"{op}: attribute 'pool_mode' must be 0 (max) or 1 (avg); got {pool_mode}.")
    check_levels(op, [tuple(f.shape) for f in feats])
    check_roi_batch(op, rois[:, 0].detach().float().cpu().numpy(), feats[0].shape[0])  # (by this op and RoI number)
    r32 = rois.float()
    levels = map_roi_levels(r32, len(feats), finest_scale)
    if roi_scale_factor > 0 and roi_scale_factor != 1.0:
        r32 = rescale_rois(r32, roi_scale_factor)
    c = feats[0].shape[1]
    out = torch.zeros(
        rois.shape[0],
        c,
        output_height,
        output_width,
        dtype=torch.float32,
        device=rois.device,
    )
    for lvl, (feat, stride) in enumerate(zip(feats, featmap_strides)):
        idx = torch.nonzero(levels == lvl).flatten()
        if idx.numel():
            try:
                out[idx] = roi_align(
                    feat.float(),
                    r32[idx],
                    output_height,
                    output_width,
                    1.0 / stride,
                    sampling_ratio,
                    mode,
                    aligned,
                )
            except ValueError as exc:  # (its RoI numbers count the level's RoIs)
                raise ValueError(f"{op}: {level_rois(lvl, idx.tolist())}: {exc}") from None
    return out.to(feats[0].dtype)


# --------------------------------------------------------------------------- batched NMS


def nms_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of boxes a [..., 4] and b [..., 4] (broadcast), as MMDeploy's TRTBatchedNMS computes it.

    No +1 on widths; boxes that only touch have IoU 0; an inverted box has area 0.
    """
    ix1 = torch.maximum(a[..., 0], b[..., 0])
    iy1 = torch.maximum(a[..., 1], b[..., 1])
    ix2 = torch.minimum(a[..., 2], b[..., 2])
    iy2 = torch.minimum(a[..., 3], b[..., 3])
    iw, ih = ix2 - ix1, iy2 - iy1
    inter = torch.where((iw > 0) & (ih > 0), iw * ih, torch.zeros_like(iw))

    def area(t: torch.Tensor) -> torch.Tensor:
        w, h = t[..., 2] - t[..., 0], t[..., 3] - t[..., 1]
        return torch.where((w < 0) | (h < 0), torch.zeros_like(w), w * h)

    union = area(a) + area(b) - inter
    return torch.where(inter > 0, inter / union, torch.zeros_like(inter))


def check_nms_inputs(
    op: str,
    boxes_shape: tuple,
    scores_shape: tuple,
    num_classes: int,
    return_index: bool,
    keep_topk: int = 1,
    floating: bool = True,
) -> None:
    """Shape/attribute checks shared by every TRTBatchedNMS implementation.

    ``floating`` says whether boxes and scores are both floating-point (dets take the boxes' dtype).
    """
    if return_index:
        raise ValueError(f"{op}: return_index=1 (a third output) is not supported; export with return_index=0.")
    if keep_topk < 1:
        raise ValueError(f"{op}: keep_topk must be >= 1 (the fixed output size); got {keep_topk}.")
    if not floating:
        raise TypeError(
            f"{op}: boxes and scores must be floating-point (dets take the boxes' dtype and hold the scores); "
            "cast them with .float() first."
        )
    if len(boxes_shape) != 4 or _differ(boxes_shape[-1], 4) or len(scores_shape) != 3:
        raise ValueError(
            f"{op}: boxes must be (B, N, 1 or num_classes, 4) and scores (B, N, num_classes); "
            f"got boxes {tuple(boxes_shape)} and scores {tuple(scores_shape)}."
        )
    if any(_differ(a, b) for a, b in zip(boxes_shape[:2], scores_shape[:2])):
        raise ValueError(
            f"{op}: boxes {tuple(boxes_shape)} and scores {tuple(scores_shape)} must agree in their first two dims "
            "(B images, N boxes each)."
        )
    if _differ(scores_shape[2], num_classes) or (_differ(boxes_shape[2], 1) and _differ(boxes_shape[2], num_classes)):
        raise ValueError(
            f"{op}: num_classes={num_classes} but scores {tuple(scores_shape)} and boxes {tuple(boxes_shape)}; "
            "scores' last dim must equal num_classes and boxes' third dim must be 1 or num_classes."
        )


def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    num_classes: int,
    background_label_id: int,
    iou_threshold: float,
    score_threshold: float,
    topk: int,
    keep_topk: int,
    clip_boxes: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MMDeploy TRTBatchedNMS: per-class NMS over a batch, fixed-size padded outputs.

    Per image and class (background class skipped): keep scores > score_threshold,
    sort descending (ties: lower box index first), keep the first ``topk``
    (all when topk <= 0 or > N), greedy NMS suppressing IoU > iou_threshold. Then
    the survivors of all classes are sorted by score (ties: lower class, then
    higher rank first) and the first ``keep_topk`` returned as dets [B, keep_topk, 5]
    (x1, y1, x2, y2, score) and labels [B, keep_topk] int32; unused rows are
    zeros with label -1. ``clip_boxes`` clamps output boxes to [0, 1].
    """
    b, n, c = scores.shape
    k = topk if 0 < topk <= n else n
    dets = torch.zeros(b, keep_topk, 5, dtype=torch.float32, device=boxes.device)
    labels = torch.full((b, keep_topk), -1, dtype=torch.int32, device=boxes.device)
    bx, sc = boxes.float(), scores.float()
    for i in range(b):
        kept_scores, kept_labels, kept_boxes = [], [], []
        for cls in range(c):
            if cls == background_label_id:
                continue
            s = sc[i, :, cls]
            key = torch.where(s > score_threshold, s, torch.full_like(s, -math.inf))
            order = torch.sort(key, descending=True, stable=True).indices[:k]
            order = order[key[order] > -math.inf]
            cand = bx[i, order, 0 if bx.shape[2] == 1 else cls]
            keep = torch.ones(order.numel(), dtype=torch.bool, device=boxes.device)
            for j in range(order.numel()):
                if keep[j]:
                    later = torch.arange(order.numel(), device=boxes.device) > j
                    keep &= ~(later & (nms_iou(cand[j], cand) > iou_threshold))
            kept_scores.append(s[order[keep]])
            kept_labels.append(torch.full((int(keep.sum()),), cls, dtype=torch.int32, device=boxes.device))
            kept_boxes.append(cand[keep])
        if not kept_scores:
            continue
        ks, kl, kb = (
            torch.cat(kept_scores),
            torch.cat(kept_labels),
            torch.cat(kept_boxes),
        )
        sel = torch.sort(ks, descending=True, stable=True).indices[:keep_topk]
        m = sel.numel()
        out_boxes = kb[sel].clamp(0.0, 1.0) if clip_boxes else kb[sel]
        dets[i, :m, :4] = out_boxes
        dets[i, :m, 4] = ks[sel]
        labels[i, :m] = kl[sel]
    return dets.to(boxes.dtype), labels
