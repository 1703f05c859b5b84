"""One small call of each detection op, for the export and TensorRT build tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import opbridge
from opbridge.ops import detection as d

__all__ = ["CASES", "_Call"]


class _Call(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any], attrs: dict[str, Any]) -> None:
        super().__init__()
        self.fn, self.attrs = fn, attrs

    def forward(self, *args: torch.Tensor) -> Any:
        return self.fn(*args, **self.attrs)


def _cases() -> list[tuple[str, opbridge.OpDef, tuple[torch.Tensor, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    rois = torch.tensor([[0.0, 1, 2, 20, 24], [1.0, 30, 10, 90, 60], [0.0, 5, 5, 250, 200]])
    feats = tuple(torch.randn(2, 3, 256 // s, 256 // s, generator=g) for s in (4, 8, 16, 32))
    boxes = torch.rand(2, 20, 1, 4, generator=g) * 10
    boxes[..., 2:] += boxes[..., :2]
    return [
        (
            "grid_sampler",
            d.GridSample,
            (
                torch.randn(2, 3, 5, 6, generator=g),
                torch.rand(2, 4, 7, 2, generator=g) * 2 - 1,
            ),
            {"interpolation_mode": 2, "padding_mode": 2, "align_corners": True},
        ),
        (
            "MMCVModulatedDeformConv2d",
            d.ModulatedDeformConv2d,
            (
                torch.randn(1, 4, 6, 6, generator=g),
                torch.randn(1, 36, 3, 3, generator=g),
                torch.rand(1, 18, 3, 3, generator=g),
                torch.randn(8, 2, 3, 3, generator=g),
                torch.randn(8, generator=g),
            ),
            {
                "stride": [2, 2],
                "padding": [1, 1],
                "dilation": [1, 1],
                "groups": 2,
                "deform_groups": 2,
            },
        ),
        (
            "MMCVRoiAlign",
            d.RoIAlign,
            (torch.randn(2, 3, 16, 16, generator=g), rois[:2] / 4),
            {
                "output_height": 3,
                "output_width": 2,
                "spatial_scale": 0.5,
                "sampling_ratio": 2,
                "mode": "max",
                "aligned": False,
            },
        ),
        (
            "MMCVMultiLevelRoiAlign",
            d.MultiLevelRoiAlign,
            (rois, *feats),
            {
                "output_height": 5,
                "output_width": 4,
                "featmap_strides": [4.0, 8.0, 16.0, 32.0],
                "sampling_ratio": 0,
                "pool_mode": 1,
                "roi_scale_factor": 1.5,
                "finest_scale": 56,
                "aligned": True,
            },
        ),
        (
            "TRTBatchedNMS",
            d.BatchedNMS,
            (boxes, torch.rand(2, 20, 3, generator=g)),
            {
                "num_classes": 3,
                "background_label_id": -1,
                "iou_threshold": 0.45,
                "score_threshold": 0.1,
                "topk": 10,
                "keep_topk": 7,
            },
        ),
    ]


CASES = _cases()
