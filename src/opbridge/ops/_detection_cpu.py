"""Vectorized CPU kernels of the detection ops (see :mod:`opbridge.ops.detection`).

Signature of each: ``fn(*arrays, **attrs)`` with numpy arrays in and out (grid_sample and
deform_conv2d: CPU torch tensors), the attributes as the op declares them. Arithmetic runs
in float32 and results come back in the input's dtype. No per-element Python loops: loops
run over deform groups, RoI chunks, pyramid levels and the NMS sweep (one step per rank,
all classes at once).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "batched_nms",
    "deform_conv2d",
    "grid_sample",
    "multi_level_roi_align",
    "roi_align",
]

_FLT_MAX = np.float32(3.4028234663852886e38)


# --------------------------------------------------------------------------- grid_sampler


def grid_sample(
    x: Any,
    grid: Any,
    *,
    interpolation_mode: int = 0,
    padding_mode: int = 0,
    align_corners: bool = False,
    out: Any = None,
) -> Any:
    """Torch-kind kernel (CPU tensors in and out), written into ``out`` where given (ONNX
    Runtime's output through the bridge).

    float32 inputs with enough channels (2 for bicubic, 3 for bilinear, 4 for nearest) run opbridge's
    native kernel (:mod:`opbridge.ops._gridsample_cpu`: each point's taps computed once for all
    channels, the result written in place); everything else runs PyTorch's own vectorized CPU grid_sample,
    F.grid_sample being the op's definition. The standard ONNX GridSample matches it in bilinear and
    bicubic (see the tests); its nearest rounds before it reflects, so the op's body writes nearest out.

    >>> import torch
    >>> x = torch.arange(4.0).reshape(1, 1, 2, 2)
    >>> grid_sample(x, torch.zeros(1, 1, 1, 2), align_corners=True).flatten()
    tensor([1.5000])
    """
    from opbridge.ops import _gridsample_cpu
    from opbridge.ops._detection_ref import GRID_MODES, GRID_PADDINGS, check_choice
    from opbridge.ops._detection_ref import grid_sample as reference

    check_choice("mmdeploy::grid_sampler", "interpolation_mode", interpolation_mode, GRID_MODES)
    check_choice("mmdeploy::grid_sampler", "padding_mode", padding_mode, GRID_PADDINGS)
    if _gridsample_cpu.applies(x, grid, interpolation_mode):
        return _gridsample_cpu.grid_sample(x, grid, interpolation_mode, padding_mode, align_corners, out=out)
    result = reference(x, grid, interpolation_mode, padding_mode, align_corners)
    return result if out is None else out.copy_(result)


# --------------------------------------------------------------------------- DCNv2


def deform_conv2d(
    x: Any,
    offset: Any,
    mask: Any,
    weight: Any,
    bias: Any = None,
    *,
    stride: tuple[int, ...] = (1, 1),
    padding: tuple[int, ...] = (0, 0),
    dilation: tuple[int, ...] = (1, 1),
    groups: int = 1,
    deform_groups: int = 1,
    out: Any = None,
) -> Any:
    """Torch-kind kernel (CPU tensors): DCNv2 as torchvision's deform_conv2d with mask, written into
    ``out`` where given (ONNX Runtime's output through the bridge).

    The bilinear im2col is one grid_sample per deform group over every kernel tap at once (opbridge's
    native sampler where a deform group has enough channels, ``_gridsample_cpu.MIN_CHANNELS``, else
    ATen's; zeros outside, torchvision's corner rule), the columns scaled by the mask, then one
    batched matmul for all groups. In float32 whatever the storage dtype.

    >>> import torch
    >>> x = torch.arange(9.0).reshape(1, 1, 3, 3)
    >>> zero = torch.zeros(1, 2, 3, 3)
    >>> deform_conv2d(x, zero, torch.ones(1, 1, 3, 3), torch.ones(1, 1, 1, 1))[0, 0, 0]
    tensor([0., 1., 2.])
    """
    import torch
    import torch.nn.functional as F

    from opbridge.ops import _gridsample_cpu
    from opbridge.ops._detection_ref import deform_conv_geometry

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
    n, cin, h, w = x.shape
    cout, cin_g, kh, kw = weight.shape
    k, cdg = kh * kw, cin // deform_groups
    xf = x.float()
    off = offset.float().view(n, deform_groups, k, 2, hout, wout)
    m = mask.float().view(n, deform_groups, k, hout, wout)
    # sampling positions in input pixels, then grid_sample's coordinates (align_corners=False: any
    # size, a 1-pixel-wide input included)
    tap_y = (torch.arange(kh, dtype=torch.float32) * dh).repeat_interleave(kw).view(k, 1, 1)
    tap_x = (torch.arange(kw, dtype=torch.float32) * dw).repeat(kh).view(k, 1, 1)
    base_y = (torch.arange(hout, dtype=torch.float32) * sh - ph).view(1, hout, 1)
    base_x = (torch.arange(wout, dtype=torch.float32) * sw - pw).view(1, 1, wout)
    py = off[:, :, :, 0] + (base_y + tap_y)
    px = off[:, :, :, 1] + (base_x + tap_x)
    # torchvision's test: a sample outside (-1, H) x (-1, W) is 0, an infinite one included, so it
    # moves to a point whose four corners are all outside (grid_sample would give NaN for inf); a
    # NaN coordinate stays NaN, as in torchvision
    outside = (py <= -1) | (py >= h) | (px <= -1) | (px >= w)
    py, px = py.masked_fill(outside, -2.0), px.masked_fill(outside, -2.0)
    cols = torch.empty(n, cin, k, hout, wout)
    if h == 0 or w == 0:  # an empty input: every sample is outside it
        cols.zero_()
    else:
        # in float64, rounded once: float32 arithmetic here would add errors of about H * 2**-24 pixels
        gy = py.double() * (2.0 / h) + (1.0 / h - 1.0)
        gx = px.double() * (2.0 / w) + (1.0 / w - 1.0)
        grid = torch.stack((gx, gy), dim=-1).float()  # n, deform groups, k, hout, wout, 2
        for g in range(deform_groups):
            xg, gg = xf[:, g * cdg : (g + 1) * cdg], grid[:, g].reshape(n, k * hout, wout, 2)
            if _gridsample_cpu.applies(xg, gg, 0):  # opbridge's native bilinear sampler, enough channels
                sampled = _gridsample_cpu.grid_sample(xg, gg, 0)
            else:
                sampled = F.grid_sample(xg, gg, mode="bilinear", padding_mode="zeros", align_corners=False)
            torch.mul(sampled.view(n, cdg, k, hout, wout), m[:, g : g + 1], out=cols[:, g * cdg : (g + 1) * cdg])
    wmat = weight.float().reshape(groups, cout // groups, cin_g * k)
    lhs = cols.view(n, groups, cin_g * k, hout * wout)
    direct = out is not None and out.dtype == torch.float32 and out.is_contiguous()
    res = out.view(n, groups, cout // groups, hout * wout) if direct else None
    res = torch.matmul(wmat, lhs, out=res)
    res = res.view(n, cout, hout, wout)
    if bias is not None:
        res += bias.float().view(1, cout, 1, 1)
    if direct:
        return out
    if out is not None:
        return out.copy_(res)
    return res.to(x.dtype)


# --------------------------------------------------------------------------- RoIAlign


def _axis_samples(
    start: np.ndarray,
    size: np.ndarray,
    pooled: int,
    grid: np.ndarray,
    gmax: int,
    limit: int,
) -> tuple:
    """Separable sample positions and bilinear terms along one axis, per RoI.

    Returns (low index, high index, low weight, high weight, in-range flag), each
    [R, pooled, gmax], following MMCV's bilinear rule (clamp at 0, last pixel).
    """
    bin_size = size / pooled
    g = np.maximum(grid, 1).astype(np.float32)
    with np.errstate(invalid="ignore"):  # an infinite box: NaN positions, as in the other paths
        pos = (
            start[:, None, None]
            + np.arange(pooled, dtype=np.float32)[None, :, None] * bin_size[:, None, None]
            + (np.arange(gmax, dtype=np.float32)[None, None, :] + 0.5) * (bin_size / g)[:, None, None]
        ).astype(np.float32)
    inside = ~((pos < -1.0) | (pos > limit))  # a NaN position is not outside (MMCV's test)
    # beyond `limit` the sample is outside; the bound keeps the index in range. A NaN position (a NaN
    # box with a fixed sampling ratio) reads pixel 0 with NaN weights: NaN
    pos = np.minimum(np.maximum(pos, 0), np.float32(limit))
    with np.errstate(invalid="ignore"):
        low = np.nan_to_num(np.floor(pos)).astype(np.int64)
    last = (low >= limit - 1) & ~np.isnan(pos)  # NaN keeps its weights on a one-pixel axis too
    low = np.where(last, limit - 1, low)
    pos = np.where(last, low.astype(np.float32), pos)
    high = np.minimum(np.where(last, low, low + 1), limit - 1)
    frac = (pos - low).astype(np.float32)
    return low, high, 1 - frac, frac, inside


def _grid_sizes(
    rois: np.ndarray,
    oh: int,
    ow: int,
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Sampling grid (gh, gw) of each RoI: sampling_ratio, or ceil(roi size / bins) when <= 0; a
    ValueError names a RoI whose grid is not finite or over ``ROI_MAX_SAMPLES`` samples."""
    from opbridge.ops._detection_ref import roi_grid

    fh: np.ndarray
    fw: np.ndarray
    if sampling_ratio > 0:
        fh = fw = np.full(rois.shape[0], sampling_ratio, np.float32)
    else:
        off = np.float32(0.5 if aligned else 0.0)
        sc = np.float32(spatial_scale)
        x1, y1 = rois[:, 1] * sc - off, rois[:, 2] * sc - off
        rw, rh = rois[:, 3] * sc - off - x1, rois[:, 4] * sc - off - y1
        if not aligned:  # np.where keeps NaN as NaN
            rw, rh = np.where(rw < 1, np.float32(1), rw), np.where(rh < 1, np.float32(1), rh)
        fh, fw = np.ceil(rh / np.float32(oh)), np.ceil(rw / np.float32(ow))
    return roi_grid("mmdeploy::MMCVRoiAlign", rois[:, 1:], fh, fw, oh, ow)


def _roi_align_chunk(
    feat_nhwc: np.ndarray,
    h: int,
    w: int,
    rois: np.ndarray,
    oh: int,
    ow: int,
    spatial_scale: float,
    sampling_ratio: int,
    pool_max: bool,
    aligned: bool,
) -> np.ndarray:
    r = rois.shape[0]
    c = feat_nhwc.shape[-1]
    off = np.float32(0.5 if aligned else 0.0)
    sc = np.float32(spatial_scale)
    bidx = rois[:, 0].astype(np.int64)
    x1 = rois[:, 1] * sc - off
    y1 = rois[:, 2] * sc - off
    rw = rois[:, 3] * sc - off - x1
    rh = rois[:, 4] * sc - off - y1
    if not aligned:
        rw, rh = np.maximum(rw, 1.0), np.maximum(rh, 1.0)
    gh, gw = _grid_sizes(rois, oh, ow, spatial_scale, sampling_ratio, aligned)
    ghm, gwm = max(int(gh.max(initial=0)), 1), max(int(gw.max(initial=0)), 1)
    ylo, yhi, wyl, wyh, yin = _axis_samples(y1, rh, oh, gh, ghm, h)
    xlo, xhi, wxl, wxh, xin = _axis_samples(x1, rw, ow, gw, gwm, w)
    # [R, oh, ghm, ow, gwm]
    valid = (np.arange(ghm)[None, None, :, None, None] < gh[:, None, None, None, None]) & (
        np.arange(gwm)[None, None, None, None, :] < gw[:, None, None, None, None]
    )
    inside = yin[:, :, :, None, None] & xin[:, None, None, :, :]
    base = bidx[:, None, None, None, None] * (h * w)
    val = np.zeros((r, oh, ghm, ow, gwm, c), np.float32)
    for yi, wy in ((ylo, wyl), (yhi, wyh)):
        for xi, wx in ((xlo, wxl), (xhi, wxh)):
            idx = base + yi[:, :, :, None, None] * w + xi[:, None, None, :, :]
            wgt = wy[:, :, :, None, None] * wx[:, None, None, :, :]
            val += feat_nhwc[idx] * wgt[..., None]
    val = np.where(inside[..., None], val, np.float32(0))
    if pool_max:
        val = np.where(valid[..., None], val, -_FLT_MAX)
        out = val.max(axis=(2, 4))
    else:
        val = np.where(valid[..., None], val, np.float32(0))
        out = val.sum(axis=(2, 4)) / np.maximum(gh * gw, 1).astype(np.float32)[:, None, None, None]
    return out.transpose(0, 3, 1, 2)  # R, C, oh, ow


def roi_align(
    feat: np.ndarray,
    rois: np.ndarray,
    *,
    output_height: int = 7,
    output_width: int = 7,
    spatial_scale: float = 1.0,
    sampling_ratio: int = 0,
    mode: str = "avg",
    aligned: bool = True,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """MMCV roi_align, written into ``out`` where given (ONNX Runtime's output through the bridge).

    opbridge's native kernel (:mod:`opbridge.ops._roialign_cpu`: channels-last rows, MMCV's
    arithmetic and order) where the extension is built and the output is float32; else vectorized
    numpy over RoIs (in chunks of similar sampling-grid size).

    >>> feat = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    >>> roi_align(feat, np.array([[0, 0, 0, 4, 4]], np.float32), output_height=1, output_width=1).ravel()
    array([7.5], dtype=float32)
    """
    from opbridge.ops import _cpu_native, _roialign_cpu
    from opbridge.ops._detection_ref import check_roi_batch, check_rois

    op = "mmdeploy::MMCVRoiAlign"
    check_rois(op, rois)
    if mode not in ("avg", "max"):
        raise ValueError(f"{op}: attribute 'mode' must be 'avg' or 'max'; got {mode!r}.")
    if output_height < 1 or output_width < 1:
        raise ValueError(f"{op}: output_height and output_width must be >= 1; got {output_height}x{output_width}.")
    if feat.ndim != 4:
        raise ValueError(f"{op}: input must be (N, C, H, W); got {feat.shape}.")
    check_roi_batch(op, rois[:, 0], feat.shape[0])
    if _cpu_native.available() and np.issubdtype(feat.dtype, np.floating):
        # the reference computes in float32 whatever the dtype: the native kernel's arithmetic
        native_out = out if out is not None and out.dtype == np.float32 and out.flags.c_contiguous else None
        result = _roialign_cpu.roi_align(
            feat, rois, output_height, output_width, spatial_scale, sampling_ratio, mode == "max", aligned, native_out
        )
        if native_out is not None:
            return native_out
    else:
        result = _roi_align_numpy(feat, rois, output_height, output_width, spatial_scale, sampling_ratio, mode, aligned)
    result = result.astype(feat.dtype, copy=False)
    if out is None:
        return result
    out[...] = result
    return out


def _roi_align_numpy(
    feat: np.ndarray,
    rois: np.ndarray,
    output_height: int,
    output_width: int,
    spatial_scale: float,
    sampling_ratio: int,
    mode: str,
    aligned: bool,
) -> np.ndarray:
    from opbridge.ops._detection_ref import ROI_MAX_SAMPLES, check_features, check_roi_batch

    check_features("mmdeploy::MMCVRoiAlign", feat.shape, rois.shape[0])
    n, c, h, w = feat.shape
    r32 = rois.astype(np.float32)
    check_roi_batch("mmdeploy::MMCVRoiAlign", r32[:, 0], n)
    out = np.empty((rois.shape[0], c, output_height, output_width), np.float32)
    gh, gw = _grid_sizes(r32, output_height, output_width, spatial_scale, sampling_ratio, aligned)
    if out.size == 0:
        return out.astype(feat.dtype)
    nhwc = np.ascontiguousarray(feat.astype(np.float32, copy=False).transpose(0, 2, 3, 1)).reshape(n * h * w, c)
    # RoIs with the same sampling grid (gh, gw) go together, in chunks that bound the memory used
    key = gh * (ROI_MAX_SAMPLES + 1) + gw
    for k in np.unique(key):
        members = np.nonzero(key == k)[0]
        g = max(int(gh[members[0]]), 1) * max(int(gw[members[0]]), 1)
        step = max(1, (1 << 22) // (c * output_height * output_width * g))
        for s0 in range(0, len(members), step):
            idx = members[s0 : s0 + step]
            out[idx] = _roi_align_chunk(
                nhwc,
                h,
                w,
                r32[idx],
                output_height,
                output_width,
                spatial_scale,
                sampling_ratio,
                mode == "max",
                aligned,
            )
    return out.astype(feat.dtype, copy=False)


def multi_level_roi_align(
    rois: np.ndarray,
    feat0: np.ndarray,
    feat1: np.ndarray | None = None,
    feat2: np.ndarray | None = None,
    feat3: np.ndarray | None = None,
    feat4: np.ndarray | None = None,
    *,
    output_height: int = 7,
    output_width: int = 7,
    featmap_strides: tuple[float, ...] = (4.0, 8.0, 16.0, 32.0),
    sampling_ratio: int = 0,
    pool_mode: int = 1,
    roi_scale_factor: float = 1.0,
    finest_scale: int = 56,
    aligned: bool = True,
) -> np.ndarray:
    """MMDet SingleRoIExtractor: level by sqrt(area), optional rescale, RoIAlign per level."""
    from opbridge.ops._detection_ref import check_levels, check_roi_batch, check_rois, check_strides, level_rois

    op = "mmdeploy::MMCVMultiLevelRoiAlign"
    feats = [f for f in (feat0, feat1, feat2, feat3, feat4) if f is not None]
    check_rois(op, rois)
    check_levels(op, [f.shape for f in feats])
    check_roi_batch(op, rois[:, 0], feats[0].shape[0])  # (by this op and RoI number, not a level's)
    check_strides(op, featmap_strides, len(feats))
    mode = {0: "max", 1: "avg"}.get(pool_mode)
    if mode is None:
        raise ValueError(f"{op}: attribute 'pool_mode' must be 0 (max) or 1 (avg); got {pool_mode}.")
    r32 = rois.astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.sqrt((r32[:, 3] - r32[:, 1]) * (r32[:, 4] - r32[:, 2]))
        lvl = np.clip(
            np.floor(np.log2(scale / np.float32(finest_scale) + np.float32(1e-6))),
            0,
            len(feats) - 1,
        )
    lvl = np.where(np.isnan(lvl), -1, lvl).astype(np.int64)  # a NaN level: no level, the output stays 0
    if roi_scale_factor > 0 and roi_scale_factor != 1.0:
        f = np.float32(roi_scale_factor)
        cx, cy = (r32[:, 1] + r32[:, 3]) * 0.5, (r32[:, 2] + r32[:, 4]) * 0.5
        hw, hh = (r32[:, 3] - r32[:, 1]) * f * 0.5, (r32[:, 4] - r32[:, 2]) * f * 0.5
        r32 = np.stack([r32[:, 0], cx - hw, cy - hh, cx + hw, cy + hh], axis=1).astype(np.float32)
    out = np.zeros((rois.shape[0], feats[0].shape[1], output_height, output_width), np.float32)
    for level, (feat, stride) in enumerate(zip(feats, featmap_strides)):
        idx = np.nonzero(lvl == level)[0]
        if len(idx):
            try:
                out[idx] = roi_align(
                    feat.astype(np.float32, copy=False),
                    r32[idx],
                    output_height=output_height,
                    output_width=output_width,
                    spatial_scale=1.0 / stride,
                    sampling_ratio=sampling_ratio,
                    mode=mode,
                    aligned=aligned,
                )
            except ValueError as exc:  # (its RoI numbers count the level's RoIs)
                raise ValueError(f"{op}: {level_rois(level, idx)}: {exc}") from None
    return out.astype(feats[0].dtype, copy=False)


# --------------------------------------------------------------------------- batched NMS


def _iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU [..., Ka, Kb] of boxes a [..., Ka, 4] against boxes b [..., Kb, 4], MMDeploy's TRTBatchedNMS rule."""
    ax1, ay1, ax2, ay2 = (a[..., :, None, i] for i in range(4))
    bx1, by1, bx2, by2 = (b[..., None, :, i] for i in range(4))
    iw = np.minimum(ax2, bx2) - np.maximum(ax1, bx1)
    ih = np.minimum(ay2, by2) - np.maximum(ay1, by1)
    inter = np.where((iw > 0) & (ih > 0), iw * ih, np.float32(0))
    aw, ah, bw, bh = ax2 - ax1, ay2 - ay1, bx2 - bx1, by2 - by1
    area_a = np.where((aw < 0) | (ah < 0), np.float32(0), aw * ah)
    area_b = np.where((bw < 0) | (bh < 0), np.float32(0), bw * bh)
    union = area_a + area_b - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inter > 0, inter / union, np.float32(0)).astype(np.float32)


# Elements of one IoU block (classes x rows x candidates): the greedy pass works through each class's
# candidates in blocks of rows, so its memory stays about 16 MB per temporary whatever topk is.
_IOU_BLOCK = 1 << 22


def _greedy(cand: np.ndarray, keep: np.ndarray, thr: np.float32) -> None:
    """Greedy NMS in place: keep [C, K] (candidates sorted by score) loses what a kept earlier one overlaps."""
    c, kmax = keep.shape
    ranks = np.arange(kmax)
    chunk = max(1, _IOU_BLOCK // (kmax * kmax))
    for c0 in range(0, c, chunk):
        kp = keep[c0 : c0 + chunk]
        boxes = cand[c0 : c0 + chunk, :kmax]
        rows = max(1, _IOU_BLOCK // (kp.shape[0] * kmax))
        for r0 in range(0, kmax, rows):
            r1 = min(kmax, r0 + rows)
            iou = _iou_matrix(boxes[:, r0:r1], boxes)  # cc, r1 - r0, kmax
            for j in range(r0, r1):
                sup = kp[:, j : j + 1] & (iou[:, j - r0, :] > thr) & (ranks > j)[None, :]
                kp &= ~sup


def _floating(dtype: np.dtype) -> bool:
    """A floating-point dtype: numpy's, or ml_dtypes' (bfloat16, the float8s), which numpy files as kind 'V'."""
    return bool(np.issubdtype(dtype, np.floating) or (dtype.kind == "V" and "float" in dtype.name))


def batched_nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    *,
    num_classes: int = 80,
    background_label_id: int = -1,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.05,
    topk: int = 1000,
    keep_topk: int = 100,
    is_normalized: bool = False,
    clip_boxes: bool = False,
    return_index: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """MMDeploy TRTBatchedNMS (see the reference in :mod:`opbridge.ops._detection_ref`)."""
    from opbridge.ops._detection_ref import check_nms_inputs

    check_nms_inputs(
        "mmdeploy::TRTBatchedNMS",
        boxes.shape,
        scores.shape,
        num_classes,
        return_index,
        keep_topk,
        _floating(boxes.dtype) and _floating(scores.dtype),
    )
    bsz, n, c = scores.shape
    k = topk if 0 < topk <= n else n
    dets = np.zeros((bsz, keep_topk, 5), np.float32)
    labels = np.full((bsz, keep_topk), -1, np.int32)
    bx = boxes.astype(np.float32, copy=False)
    thr = np.float32(iou_threshold)
    for i in range(bsz):
        s = scores[i].astype(np.float32, copy=False).T  # C, N
        key = np.where(s > np.float32(score_threshold), s, -np.inf)
        if 0 <= background_label_id < c:
            key[background_label_id] = -np.inf
        order = np.argsort(-key, axis=1, kind="stable")[:, :k]  # C, k
        cand_scores = np.take_along_axis(key, order, axis=1)
        valid = cand_scores > -np.inf  # a score that passed the threshold (+inf included)
        if bx.shape[2] == 1:
            cand = bx[i, :, 0][order]  # C, k, 4
        else:
            cand = bx[i].transpose(1, 0, 2)[np.arange(c)[:, None], order]
        kmax = int(valid.sum(axis=1).max(initial=0))
        keep = valid.copy()
        if kmax:
            kp = np.ascontiguousarray(keep[:, :kmax])
            _greedy(cand, kp, thr)
            keep[:, :kmax] = kp
        flat_scores = np.where(keep, cand_scores, -np.inf).reshape(-1)
        sel = np.argsort(-flat_scores, kind="stable")[:keep_topk]
        sel = sel[flat_scores[sel] > -np.inf]
        m = len(sel)
        cls, rank = np.divmod(sel, k)
        out_boxes = cand[cls, rank]
        if clip_boxes:
            out_boxes = np.clip(out_boxes, 0.0, 1.0)
        dets[i, :m, :4] = out_boxes
        dets[i, :m, 4] = flat_scores[sel]
        labels[i, :m] = cls
    return dets.astype(boxes.dtype, copy=False), labels
