"""GPU kernels of the detection ops, in the ``register_gpu_kernel`` calling convention.

``fn(inputs, outputs, attrs, stream)``: ``inputs`` and ``outputs`` are CUDA tensors
(outputs preallocated with the shapes the op's shape rule gives), ``attrs`` the
op's attribute values by name, ``stream`` a ``cudaStream_t`` as an int. Each
function runs its Triton kernels (:mod:`opbridge.ops._detection_triton`,
imported on first call: importing this module needs torch only) on that stream
and writes the outputs in place. float32 and float16 inputs; arithmetic in float32.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = [
    "batched_nms",
    "deform_conv2d",
    "grid_sampler",
    "multi_level_roi_align",
    "roi_align",
]


def _kernels() -> Any:
    from opbridge.ops import _detection_triton

    return _detection_triton


# Wrappers of the raw streams seen so far: making one per launch costs more than a small kernel.
_STREAMS: dict[int, Any] = {}


def _on(stream: int) -> Any:
    """Run on ``stream`` (a cudaStream_t as int; 0 or the current stream: no switch). The current
    stream's handle is read as Triton's launcher reads it: ``torch.cuda.current_stream()`` builds a
    Stream object and costs about as much CPU time as a launch."""
    if not stream or torch._C._cuda_getCurrentRawStream(torch.cuda.current_device()) == stream:
        return contextlib.nullcontext()
    wrapper = _STREAMS.get(stream)
    if wrapper is None:
        wrapper = _STREAMS[stream] = torch.cuda.ExternalStream(stream)
    return torch.cuda.stream(wrapper)


def grid_sampler(
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    attrs: dict[str, Any],
    stream: int,
) -> None:
    """mmdeploy::grid_sampler on the GPU."""
    with _on(stream):
        _kernels().grid_sample(
            inputs[0],
            inputs[1],
            outputs[0],
            int(attrs.get("interpolation_mode", 0)),
            int(attrs.get("padding_mode", 0)),
            bool(attrs.get("align_corners", False)),
        )


def deform_conv2d(
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    attrs: dict[str, Any],
    stream: int,
) -> None:
    """mmdeploy::MMCVModulatedDeformConv2d on the GPU (Triton im2col + cuBLAS matmul)."""
    x, offset, mask, weight = inputs[:4]
    bias = inputs[4] if len(inputs) > 4 else None
    with _on(stream):
        _kernels().deform_conv2d(
            x,
            offset,
            mask,
            weight,
            bias,
            outputs[0],
            tuple(attrs.get("stride", (1, 1))),
            tuple(attrs.get("padding", (0, 0))),
            tuple(attrs.get("dilation", (1, 1))),
            int(attrs.get("groups", 1)),
            int(attrs.get("deform_groups", 1)),
        )


def roi_align(
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    attrs: dict[str, Any],
    stream: int,
) -> None:
    """mmdeploy::MMCVRoiAlign on the GPU."""
    with _on(stream):
        _kernels().roi_align(
            inputs[0],
            inputs[1],
            outputs[0],
            float(attrs.get("spatial_scale", 1.0)),
            int(attrs.get("sampling_ratio", 0)),
            attrs.get("mode", "avg") == "max",
            bool(attrs.get("aligned", True)),
        )


def multi_level_roi_align(
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    attrs: dict[str, Any],
    stream: int,
) -> None:
    """mmdeploy::MMCVMultiLevelRoiAlign on the GPU."""
    feats = [f for f in inputs[1:] if f is not None]
    with _on(stream):
        _kernels().multi_level_roi_align(
            inputs[0],
            feats,
            outputs[0],
            tuple(attrs.get("featmap_strides", (4.0, 8.0, 16.0, 32.0))),
            int(attrs.get("sampling_ratio", 0)),
            int(attrs.get("pool_mode", 1)) == 0,
            float(attrs.get("roi_scale_factor", 1.0)),
            int(attrs.get("finest_scale", 56)),
            bool(attrs.get("aligned", True)),
        )


def batched_nms(
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    attrs: dict[str, Any],
    stream: int,
) -> None:
    """mmdeploy::TRTBatchedNMS on the GPU."""
    with _on(stream):
        _kernels().batched_nms(
            inputs[0],
            inputs[1],
            outputs[0],
            outputs[1],
            int(attrs.get("num_classes", inputs[1].shape[-1])),
            int(attrs.get("background_label_id", -1)),
            float(attrs.get("iou_threshold", 0.5)),
            float(attrs.get("score_threshold", 0.05)),
            int(attrs.get("topk", 1000)),
            bool(attrs.get("clip_boxes", False)),
            bool(attrs.get("return_index", False)),
        )
