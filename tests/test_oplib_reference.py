"""The detection ops' PyTorch references against cases worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from opbridge.errors import OpCallError
from opbridge.ops import _detection_ref as ref
from opbridge.ops import detection as d

# --------------------------------------------------------------------------- grid_sampler

SQUARE = torch.tensor([[[[0.0, 1.0], [2.0, 3.0]]]])


def _at(gx: float, gy: float) -> torch.Tensor:
    return torch.tensor([[[[gx, gy]]]])


@pytest.mark.parametrize(
    ("gx", "gy", "attrs", "expected"),
    [
        (0.0, 0.0, {"align_corners": True}, 1.5),  # centre: mean of the four pixels
        (-1.0, -1.0, {"align_corners": True}, 0.0),  # corner pixel centre
        (1.0, -1.0, {"align_corners": True}, 1.0),  # top-right pixel
        (
            -1.0,
            -1.0,
            {"align_corners": False},
            0.0,
        ),  # pixel (-0.5, -0.5): 0.25 * 0 + zeros
        (
            -1.0,
            -1.0,
            {"align_corners": False, "padding_mode": 1},
            0.0,
        ),  # border: clamps to pixel (0, 0)
        (
            1.0,
            1.0,
            {"align_corners": False},
            0.75,
        ),  # (1.5, 1.5): 0.25 * 3, the rest is zero padding
        (1.0, 1.0, {"align_corners": False, "padding_mode": 1}, 3.0),
        (
            0.4,
            0.0,
            {"align_corners": True, "interpolation_mode": 1},
            1.0,
        ),  # x 0.7 -> 1, y 0.5 -> 0 (half to even)
        (
            1.0,
            1.0,
            {"align_corners": True, "interpolation_mode": 2},
            3.0,
        ),  # bicubic at a pixel centre is exact
        (
            1.5,
            -1.0,
            {"align_corners": True, "padding_mode": 2},
            0.75,
        ),  # x 1.25 reflects to 0.75 on row 0
    ],
    ids=[
        "centre",
        "corner",
        "top-right",
        "half-pixel-zeros",
        "half-pixel-border",
        "far-corner-zeros",
        "far-corner-border",
        "nearest-half-even",
        "bicubic-exact",
        "reflection",
    ],
)
def test_grid_sample_hand_cases(gx: float, gy: float, attrs: dict, expected: float) -> None:
    out = d.GridSample.run_reference(SQUARE, _at(gx, gy), **attrs)
    assert out.shape == (1, 1, 1, 1)
    assert out.item() == pytest.approx(expected, abs=1e-6)


def test_grid_sample_bad_mode_is_named() -> None:
    # a call checks the op's choices (Literal[0, 1, 2]); the reference's code names the modes for a direct call
    with pytest.raises(OpCallError, match=r"'interpolation_mode' = 3 is not one of the values it takes, \[0, 1, 2\]"):
        d.GridSample.run_reference(SQUARE, _at(0, 0), interpolation_mode=3)
    with pytest.raises(OpCallError, match=r"'padding_mode' = -1 is not one of the values it takes"):
        d.GridSample.run_reference(SQUARE, _at(0, 0), padding_mode=-1)
    with pytest.raises(
        ValueError,
        match=r"interpolation_mode.*0 \(bilinear\), 1 \(nearest\), 2 \(bicubic\); got 3",
    ):
        ref.grid_sample(SQUARE, _at(0, 0), 3, 0, False)
    with pytest.raises(ValueError, match=r"padding_mode.*got -1"):
        ref.grid_sample(SQUARE, _at(0, 0), 0, -1, False)


def test_grid_sampler_shapes_are_named() -> None:
    """The op samples 2-D planes: a 5-D input (F.grid_sample's volumetric form) or a grid of another
    batch is named, eagerly and by the shape rule."""
    match = r"input must be \(N, C, H, W\) and grid \(N, Ho, Wo, 2\) with the same N"
    for x, grid in (
        (torch.zeros(1, 1, 3, 3, 3), torch.zeros(1, 3, 3, 3, 3)),
        (torch.zeros(2, 1, 3, 3), torch.zeros(1, 3, 3, 2)),
    ):
        with pytest.raises(ValueError, match=match):
            d.GridSample(x, grid)
        with pytest.raises(ValueError, match=match):
            d.GridSample.kernel(x, grid)
    ref.check_grid_shapes((1, 3, "h", "w"), ("n", 5, 5, 2))  # symbolic sizes are not compared


# --------------------------------------------------------------------------- DCNv2


def _dcn(x, off, mask, w, b=None, **attrs):
    return d.ModulatedDeformConv2d.run_reference(x, off, mask, w, b, **attrs)


def test_dcn_half_pixel_offset_by_hand() -> None:
    x = torch.arange(9.0).view(1, 1, 3, 3)  # x[i, j] = 3i + j
    w = torch.ones(1, 1, 1, 1)
    off = torch.zeros(1, 2, 3, 3)
    off[:, 0] = 0.5  # dy = 0.5 for the single tap
    mask = torch.full((1, 1, 3, 3), 0.5)
    out = _dcn(x, off, mask, w)[0, 0]
    assert out[0, 0].item() == pytest.approx(0.5 * (0 + 3) / 2)  # halfway between rows 0 and 1
    assert out[2, 1].item() == pytest.approx(0.5 * (0.5 * 7 + 0.5 * 0))  # row 3 is outside: zero
    assert out[1, 2].item() == pytest.approx(0.5 * (5 + 8) / 2)


def test_dcn_integer_shift_by_hand() -> None:
    x = torch.arange(16.0).view(1, 1, 4, 4)
    off = torch.zeros(1, 2, 4, 4)
    off[:, 0], off[:, 1] = 1.0, -1.0  # sample x[i + 1, j - 1]
    out = _dcn(
        x,
        off,
        torch.ones(1, 1, 4, 4),
        torch.full((1, 1, 1, 1), 2.0),
        torch.tensor([1.0]),
    )[0, 0]
    expected = torch.zeros(4, 4)
    expected[:3, 1:] = x[0, 0, 1:, :3]
    torch.testing.assert_close(out, 2 * expected + 1, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"stride": [2, 2], "padding": [1, 1]},
        {"dilation": [2, 2], "padding": [2, 2]},
        {"groups": 2, "padding": [1, 1]},
    ],
    ids=["plain", "stride2-pad1", "dilation2", "groups2"],
)
def test_dcn_zero_offset_unit_mask_is_conv2d(attrs: dict) -> None:
    g = torch.Generator().manual_seed(0)
    groups = attrs.get("groups", 1)
    x = torch.randn(2, 4, 7, 6, generator=g)
    w = torch.randn(6, 4 // groups, 3, 3, generator=g)
    b = torch.randn(6, generator=g)
    conv = F.conv2d(
        x,
        w,
        b,
        stride=attrs.get("stride", [1, 1]),
        padding=attrs.get("padding", [0, 0]),
        dilation=attrs.get("dilation", [1, 1]),
        groups=groups,
    )
    ho, wo = conv.shape[2:]
    out = _dcn(x, torch.zeros(2, 18, ho, wo), torch.ones(2, 9, ho, wo), w, b, **attrs)
    torch.testing.assert_close(out, conv, rtol=1e-4, atol=1e-5)


def test_dcn_deform_groups_use_their_own_offsets() -> None:
    x = torch.arange(32.0).view(1, 2, 4, 4)
    w = torch.ones(2, 1, 1, 1)
    off = torch.zeros(1, 4, 4, 4)
    off[:, 3] = 1.0  # deform group 1 (channel 1) samples one pixel to the right
    out = _dcn(x, off, torch.ones(1, 2, 4, 4), w, groups=2, deform_groups=2)
    torch.testing.assert_close(out[0, 0], x[0, 0])
    expected = torch.zeros(4, 4)
    expected[:, :3] = x[0, 1, :, 1:]
    torch.testing.assert_close(out[0, 1], expected)


def test_dcn_bad_offset_shape_is_named() -> None:
    with pytest.raises(ValueError, match=r"expected offset \(1, 18, 3, 3\) and mask \(1, 9, 3, 3\)"):
        _dcn(
            torch.zeros(1, 1, 3, 3),
            torch.zeros(1, 9, 3, 3),
            torch.zeros(1, 9, 3, 3),
            torch.zeros(1, 1, 3, 3),
            padding=[1, 1],
        )


@pytest.mark.parametrize("name", ["stride", "padding", "dilation"])
def test_dcn_spatial_attributes_take_two_ints(name: str) -> None:
    """One int ran eagerly (as a pair) but failed the export and every runtime running the op's function
    body (ONNX DeformConv takes two); four pads reached ONNX Runtime's own error. Both are refused here,
    with the pair to write."""
    args = (torch.zeros(1, 1, 3, 3), torch.zeros(1, 2, 3, 3), torch.ones(1, 1, 3, 3), torch.ones(1, 1, 1, 1))
    with pytest.raises(ValueError, match=rf"attribute '{name}' takes 2 ints \(H, W\); got \[1\]; write \[1, 1\]"):
        d.ModulatedDeformConv2d(*args, **{name: [1]})
    with pytest.raises(ValueError, match=rf"attribute '{name}' takes 2 ints \(H, W\); got \[1, 1, 1, 1\]\.$"):
        _dcn(*args, **{name: [1, 1, 1, 1]})


@pytest.mark.parametrize("value", [math.inf, -math.inf, 1e30], ids=["inf", "-inf", "1e30"])
def test_dcn_offsets_past_the_input_sample_zero(value: float) -> None:
    """torchvision's rule: a sample outside (-1, H) x (-1, W) is 0, an infinite one too (its weights
    are NaN); the output equals that of a finite offset far outside. A NaN offset gives NaN."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(1, 4, 5, 5, generator=g), torch.randn(2, 4, 3, 3, generator=g)
    mask = torch.rand(1, 9, 5, 5, generator=g)
    off, far = torch.zeros(1, 18, 5, 5), torch.zeros(1, 18, 5, 5)
    off[0, 0, 2, 2], off[0, 3, 1, 4] = value, value  # tap 0's dy and tap 1's dx
    far[0, 0, 2, 2], far[0, 3, 1, 4] = 100.0, 100.0
    got = _dcn(x, off, mask, w, padding=[1, 1])
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, _dcn(x, far, mask, w, padding=[1, 1]), rtol=0, atol=0)
    off[0, 0, 2, 2] = math.nan
    assert torch.isnan(_dcn(x, off, mask, w, padding=[1, 1])[0, :, 2, 2]).all()


def test_dcn_corner_outside_does_not_read_the_clamped_pixel() -> None:
    """A corner outside the input adds nothing (torchvision), not 0 times the edge pixel it would
    clamp to: with inf in row 0, samples a quarter row into the input are inf, not NaN."""
    x = torch.ones(1, 1, 3, 3)
    x[0, 0, 0] = math.inf
    off = torch.zeros(1, 2, 3, 3)
    off[0, 0], off[0, 1] = -0.75, 0.5  # y = i - 0.75, x = j + 0.5: every corner weight is nonzero
    out = _dcn(x, off, torch.ones(1, 1, 3, 3), torch.ones(1, 1, 1, 1))[0, 0]
    assert torch.isposinf(out[:2]).all()
    assert out[2].tolist() == [1.0, 1.0, 0.5]


def test_dcn_empty_input_gives_the_bias() -> None:
    out = _dcn(
        torch.zeros(1, 2, 0, 3),
        torch.zeros(1, 18, 2, 3),
        torch.ones(1, 9, 2, 3),
        torch.ones(4, 2, 3, 3),
        torch.arange(4.0),
        padding=[2, 1],
    )
    torch.testing.assert_close(out, torch.arange(4.0).view(1, 4, 1, 1).expand(1, 4, 2, 3))


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({"stride": [0, 1]}, r"stride and dilation must be >= 1 and padding >= 0; got stride=\[0, 1\]"),
        ({"padding": [-1, 0]}, r"padding=\[-1, 0\]"),
        ({"dilation": [1, 0]}, r"dilation=\[1, 0\]"),
        ({"bias": torch.zeros(3)}, r"bias must be \(2,\), one value per output channel; got \(3,\)"),
        ({"input": torch.zeros(4, 5, 5)}, r"input must be \(N, C, H, W\).*got input \(4, 5, 5\)"),
        ({"dilation": [3, 3]}, r"the dilated kernel \(7 x 7\) is larger than the padded input \(5 x 5\)"),
    ],
    ids=["stride0", "negative-padding", "dilation0", "bias-length", "3d-input", "kernel-too-large"],
)
def test_dcn_bad_attributes_are_named(attrs: dict, match: str) -> None:
    x = attrs.pop("input", torch.zeros(1, 4, 5, 5))
    b = attrs.pop("bias", None)
    with pytest.raises(ValueError, match=match):
        _dcn(x, torch.zeros(1, 18, 5, 5), torch.ones(1, 9, 5, 5), torch.zeros(2, 4, 3, 3), b, **attrs)


# --------------------------------------------------------------------------- RoIAlign

# f(y, x) = x + 4y: bilinear interpolation reproduces it exactly inside the map
LINEAR = (torch.arange(4.0).view(1, 4) + 4 * torch.arange(4.0).view(4, 1)).view(1, 1, 4, 4)


def _roi(*box: float) -> torch.Tensor:
    return torch.tensor([[0.0, *box]])


@pytest.mark.parametrize(
    ("box", "attrs", "expected"),
    [
        (
            (0.5, 0.5, 2.5, 2.5),
            {"sampling_ratio": 2},
            [[5.0]],
        ),  # samples at 0.5, 1.5 each way
        (
            (0.5, 0.5, 2.5, 2.5),
            {"sampling_ratio": 2, "aligned": False},
            [[7.5]],
        ),  # samples at 1.0, 2.0
        (
            (0.5, 0.5, 2.5, 2.5),
            {"sampling_ratio": 2, "aligned": False, "mode": "max"},
            [[10.0]],
        ),  # max at (2, 2)
        (
            (0.5, 0.5, 2.5, 2.5),
            {"sampling_ratio": 0, "output_height": 2, "output_width": 2},
            [[2.5, 3.5], [6.5, 7.5]],
        ),
        ((1.0, 1.0, 5.0, 5.0), {"sampling_ratio": 2, "spatial_scale": 0.5}, [[5.0]]),
        (
            (3.5, 3.5, 4.5, 4.5),
            {"sampling_ratio": 1},
            [[15.0]],
        ),  # sample (3.5, 3.5) clamps to the last pixel
        (
            (10.0, 10.0, 12.0, 12.0),
            {"sampling_ratio": 2},
            [[0.0]],
        ),  # every sample beyond H: zero
        (
            (1.5, 1.5, 1.5, 1.5),
            {"sampling_ratio": 0},
            [[0.0]],
        ),  # empty RoI, adaptive grid 0: count clamps to 1
        (
            (1.5, 1.5, 1.5, 1.5),
            {"sampling_ratio": 0, "aligned": False},
            [[10.0]],
        ),  # legacy: size 1, sample (2, 2)
    ],
    ids=[
        "aligned",
        "legacy",
        "max",
        "adaptive-2x2",
        "spatial-scale",
        "last-pixel",
        "outside",
        "empty-aligned",
        "empty-legacy",
    ],
)
def test_roi_align_hand_cases(box: tuple, attrs: dict, expected: list) -> None:
    attrs = {"output_height": 1, "output_width": 1, **attrs}
    out = d.RoIAlign.run_reference(LINEAR, _roi(*box), **attrs)
    torch.testing.assert_close(out[0, 0], torch.tensor(expected), rtol=0, atol=1e-5)


def test_roi_align_max_of_empty_bin_is_lowest_float() -> None:
    out = d.RoIAlign.run_reference(LINEAR, _roi(1.5, 1.5, 1.5, 1.5), output_height=1, output_width=1, mode="max")
    assert out.item() == -3.4028234663852886e38  # MMCV: no sample, max starts at -FLT_MAX


def test_roi_align_errors_are_named() -> None:
    with pytest.raises(ValueError, match=r"rois must be \(num_rois, 5\).*got \(1, 4\)"):
        d.RoIAlign.run_reference(LINEAR, torch.zeros(1, 4))
    with pytest.raises(OpCallError, match=r"'mode' = 'mean' is not one of the values it takes, \['avg', 'max'\]"):
        d.RoIAlign.run_reference(LINEAR, _roi(0, 0, 1, 1), mode="mean")
    with pytest.raises(ValueError, match=r"'mode' must be 'avg' or 'max'; got 'mean'"):
        ref.roi_align(LINEAR, _roi(0, 0, 1, 1), 7, 7, 1.0, 0, "mean", True)
    with pytest.raises(ValueError, match=r"batch index 3.0, outside the feature batch of 1"):
        d.RoIAlign.run_reference(LINEAR, torch.tensor([[3.0, 0, 0, 1, 1]]))


def test_roi_align_of_no_rois_over_empty_features_is_empty_in_every_path() -> None:
    """No images and no RoIs (a batch of 0): the kernels gave an empty output, the reference raised "the
    features are empty"; an output size below 1 was the shape rule's "a dim 2 of -1" in a session."""
    from opbridge.ops import _detection_cpu as cpu

    attrs = {"output_height": 2, "output_width": 3}
    for shape in ((0, 3, 8, 8), (1, 3, 0, 8)):
        feat, rois = torch.zeros(shape), torch.zeros(0, 5)
        assert tuple(d.RoIAlign(feat, rois, **attrs).shape) == (0, 3, 2, 3)
        assert cpu.roi_align(
            feat.numpy(), rois.numpy(), spatial_scale=1.0, sampling_ratio=0, mode="avg", aligned=True, **attrs
        ).shape == (0, 3, 2, 3)
        with pytest.raises(ValueError, match=r"the features .* are empty; pass N, H, W >= 1"):
            d.RoIAlign(feat, _roi(0, 0, 1, 1), **attrs)
    for op, args in ((d.RoIAlign, (LINEAR, _roi(0, 0, 1, 1))), (d.MultiLevelRoiAlign, (_roi(0, 0, 1, 1), LINEAR))):
        with pytest.raises(ValueError, match=r"output_height and output_width must be >= 1; got -1x2"):
            op.shape_rule(*args, **op.spec.bind_attributes({"output_height": -1, "output_width": 2}))


# --------------------------------------------------------------------------- MultiLevelRoiAlign


@pytest.mark.parametrize(
    ("side", "level"),
    [
        (55.9, 0),
        (56.0, 0),
        (111.0, 0),
        (112.0, 1),
        (224.0, 2),
        (448.0, 3),
        (1000.0, 3),
        (1.0, 0),
    ],
    ids=lambda v: str(v),
)
def test_level_mapping(side: float, level: int) -> None:
    rois = torch.tensor([[0.0, 10.0, 10.0, 10.0 + side, 10.0 + side]])
    assert ref.map_roi_levels(rois, 4, 56).item() == level


def _pyramid() -> list[torch.Tensor]:
    # level l is the constant l + 1, so each RoI's output names the level it was pooled from
    return [torch.full((1, 2, 512 // s, 512 // s), float(i + 1)) for i, s in enumerate((4, 8, 16, 32))]


def test_multi_level_picks_the_level_by_scale() -> None:
    rois = torch.tensor(
        [
            [0.0, 8, 8, 48, 48],
            [0.0, 100, 100, 220, 220],
            [0.0, 50, 50, 290, 290],
            [0.0, 0, 0, 500, 500],
        ]
    )
    out = d.MultiLevelRoiAlign.run_reference(rois, *_pyramid())
    torch.testing.assert_close(out[:, 0, 3, 3], torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_multi_level_rescales_after_mapping() -> None:
    feat0 = torch.arange(128.0).view(1, 1, 1, 128).expand(1, 1, 128, 128).contiguous()  # value = x
    feats = [feat0] + [torch.zeros(1, 1, 512 // s, 512 // s) for s in (8, 16, 32)]
    rois = torch.tensor([[0.0, 100, 100, 110, 110]])
    plain = d.MultiLevelRoiAlign.run_reference(rois, *feats, output_height=1, output_width=2, sampling_ratio=2)
    scaled = d.MultiLevelRoiAlign.run_reference(
        rois,
        *feats,
        output_height=1,
        output_width=2,
        sampling_ratio=2,
        roi_scale_factor=2.0,
    )
    # feature x spans 24.5..27 unscaled (bin centres 25.125, 26.375), 23.25..28.25 scaled (24.5, 27.0)
    torch.testing.assert_close(plain[0, 0, 0], torch.tensor([25.125, 26.375]))
    torch.testing.assert_close(scaled[0, 0, 0], torch.tensor([24.5, 27.0]))


def test_multi_level_errors_name_the_ops_roi_not_a_levels() -> None:
    """RoI 2 (level 1) with batch index 1 was reported as "mmdeploy::MMCVRoiAlign: RoI 0 ...": its number
    among level 1's RoIs, under another op's name. Both the reference and the CPU kernel name RoI 2."""
    rois = torch.tensor([[0, 0, 0, 10, 10], [0, 5, 5, 20, 20], [1, 0, 0, 200, 200]], dtype=torch.float32)
    feats = [torch.zeros(1, 2, 64 // s, 64 // s) for s in (4, 8)]
    attrs = {"output_height": 2, "output_width": 2, "featmap_strides": [4.0, 8.0]}
    message = r"mmdeploy::MMCVMultiLevelRoiAlign: RoI 2 has batch index 1.0, outside the feature batch of 1"
    with pytest.raises(ValueError, match=message):
        d.MultiLevelRoiAlign.run_reference(rois, *feats, **attrs)
    with pytest.raises(ValueError, match=message):
        d.MultiLevelRoiAlign.kernel(rois.numpy(), *(f.numpy() for f in feats), **attrs)


def test_multi_level_stride_count_must_match() -> None:
    with pytest.raises(ValueError, match=r"2 feature map\(s\) given but featmap_strides has 4 entries"):
        d.MultiLevelRoiAlign.run_reference(_roi(0, 0, 8, 8), *_pyramid()[:2])
    with pytest.raises(OpCallError, match=r"'pool_mode' = 2 is not one of the values it takes, \[0, 1\]"):
        d.MultiLevelRoiAlign.run_reference(_roi(0, 0, 8, 8), *_pyramid(), pool_mode=2)
    with pytest.raises(ValueError, match=r"'pool_mode' must be 0 \(max\) or 1 \(avg\); got 2"):
        ref.multi_level_roi_align(_roi(0, 0, 8, 8), list(_pyramid()), 7, 7, (4.0, 8.0, 16.0, 32.0), 0, 2, 1.0, 56, True)
    rois = _roi(0, 0, 8, 8)
    for strides in ([4.0, 0.0, 16.0, 32.0], [4.0, 8.0, -16.0, 32.0], [4.0, 8.0, 16.0, float("nan")]):
        with pytest.raises(ValueError, match=r"featmap_strides must be finite and > 0 .* got \[4\.0, "):
            d.MultiLevelRoiAlign.run_reference(rois, *_pyramid(), featmap_strides=strides)
        bound = d.MultiLevelRoiAlign.spec.bind_attributes({"featmap_strides": strides})
        with pytest.raises(ValueError, match=r"featmap_strides must be finite and > 0"):
            d.MultiLevelRoiAlign.kernel(rois.numpy(), *(f.numpy() for f in _pyramid()), **bound)


# --------------------------------------------------------------------------- BatchedNMS

# A and B overlap with IoU 81/119 = 0.68; C is apart
BOXES = torch.tensor([[0.0, 0, 10, 10], [1.0, 1, 11, 11], [20.0, 20, 30, 30]]).view(1, 3, 1, 4)
SCORES = torch.tensor([[0.9, 0.2], [0.8, 0.75], [0.1, 0.6]]).view(1, 3, 2)  # [box, class]


def _nms(boxes=BOXES, scores=SCORES, **attrs):
    attrs = {
        "num_classes": scores.shape[-1],
        "score_threshold": 0.15,
        "iou_threshold": 0.5,
        "keep_topk": 5,
        **attrs,
    }
    return d.BatchedNMS.run_reference(boxes, scores, **attrs)


def _rows(dets: torch.Tensor, labels: torch.Tensor) -> list[tuple]:
    return [(round(float(r[4]), 4), int(lab), [float(v) for v in r[:4]]) for r, lab in zip(dets[0], labels[0])]


A, B, C = [0.0, 0, 10, 10], [1.0, 1, 11, 11], [20.0, 20, 30, 30]
PAD = (0.0, -1, [0.0, 0, 0, 0])


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({}, [(0.9, 0, A), (0.75, 1, B), (0.6, 1, C), PAD, PAD]),
        ({"keep_topk": 2}, [(0.9, 0, A), (0.75, 1, B)]),
        ({"topk": 1}, [(0.9, 0, A), (0.75, 1, B), PAD, PAD, PAD]),
        ({"background_label_id": 0}, [(0.75, 1, B), (0.6, 1, C), PAD, PAD, PAD]),
        (
            {"iou_threshold": 0.7, "keep_topk": 6},
            [(0.9, 0, A), (0.8, 0, B), (0.75, 1, B), (0.6, 1, C), (0.2, 1, A), PAD],
        ),
        ({"score_threshold": 0.95}, [PAD] * 5),
    ],
    ids=["default", "keep-topk", "pre-topk", "background", "loose-iou", "nothing-kept"],
)
def test_batched_nms_hand_cases(attrs: dict, expected: list) -> None:
    dets, labels = _nms(**attrs)
    assert dets.shape == (1, len(expected), 5) and labels.dtype == torch.int32
    assert _rows(dets, labels) == expected


def test_batched_nms_ties_and_touching_boxes() -> None:
    boxes = torch.tensor([[0.0, 0, 1, 1], [1.0, 0, 2, 1], [0.0, 0, 1, 1]]).view(1, 3, 1, 4)  # 0 and 1 touch
    scores = torch.tensor([[0.5, 0.5], [0.5, 0.0], [0.5, 0.0]]).view(1, 3, 2)
    dets, labels = _nms(boxes, scores, score_threshold=0.1, keep_topk=4)
    # class 0: box 0 (lower index first), box 1 (touching: IoU 0), box 2 suppressed (IoU 1); class 1: box 0
    assert _rows(dets, labels) == [
        (0.5, 0, [0, 0, 1, 1]),
        (0.5, 0, [1, 0, 2, 1]),
        (0.5, 1, [0, 0, 1, 1]),
        PAD,
    ]


def test_batched_nms_per_class_boxes_and_clip() -> None:
    boxes = torch.tensor([[[-0.1, 0.2, 1.3, 0.9], [0.1, 0.1, 0.5, 0.5]]]).view(1, 1, 2, 4)
    scores = torch.tensor([[[0.3, 0.8]]])
    dets, labels = _nms(boxes, scores, keep_topk=2, clip_boxes=True)
    assert labels.tolist() == [[1, 0]]
    torch.testing.assert_close(dets[0, :, :4], torch.tensor([[0.1, 0.1, 0.5, 0.5], [0.0, 0.2, 1.0, 0.9]]))


def test_batched_nms_keeps_infinite_scores() -> None:
    """+inf passes any threshold and ranks first: A (inf) suppresses B in class 0."""
    scores = SCORES.clone()
    scores[0, 0, 0] = math.inf
    assert _rows(*_nms(scores=scores))[:3] == [(math.inf, 0, A), (0.75, 1, B), (0.6, 1, C)]


def test_batched_nms_errors_are_named() -> None:
    with pytest.raises(ValueError, match=r"num_classes=3 but scores \(1, 3, 2\)"):
        _nms(num_classes=3)
    with pytest.raises(ValueError, match=r"return_index=1 \(a third output\) is not supported"):
        _nms(return_index=True)
    for keep in (0, -1):
        with pytest.raises(ValueError, match=rf"keep_topk must be >= 1 \(the fixed output size\); got {keep}"):
            d.BatchedNMS(BOXES, SCORES, num_classes=2, keep_topk=keep)
    with pytest.raises(TypeError, match=r"boxes and scores must be floating-point"):
        d.BatchedNMS(BOXES.int(), SCORES, num_classes=2)


# --------------------------------------------------------------------------- DynamicResize (seed op)


@pytest.mark.parametrize(("size", "factor"), [((8, 12), 2), ((2, 3), 0.5)], ids=["up-x2", "down-x0.5"])
def test_dynamic_resize_reference_covers_up_and_down(size: tuple, factor: float) -> None:
    from opbridge.ops import DynamicResize

    x = torch.arange(24.0).view(1, 1, 4, 6)
    out = DynamicResize.run_reference(x, torch.empty(1, 1, *size))
    assert out.shape == (1, 1, *size)
    # a linear ramp survives bicubic resampling away from the borders: centre value = centre of the input
    torch.testing.assert_close(out.mean(), x.mean(), rtol=0, atol=0.2)
    torch.testing.assert_close(out, F.interpolate(x, scale_factor=factor, mode="bicubic"), rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["bilinear", "nearest", "bicubic"])
def test_half_precision_grid_sample_is_sampled_in_float32_on_the_cpu(mode: int) -> None:
    """PyTorch's CPU kernel rounds every intermediate of a float16 grid_sample to float16 (up to 0.04 off
    near 1, beyond the op's own float16 tolerance, so that verify failed the runtimes that were right):
    the reference samples in float32 and rounds once, as PyTorch's CUDA kernel does."""
    g = torch.Generator().manual_seed(11)
    x = torch.rand(2, 4, 9, 11, generator=g).half()
    grid = (torch.rand(2, 5, 6, 2, generator=g) * 2.2 - 1.1).half()
    got = d.GridSample(x, grid, interpolation_mode=mode)
    exact = F.grid_sample(x.double(), grid.double(), mode=ref.GRID_MODES[mode], align_corners=False)
    assert got.dtype == torch.float16
    # one rounding to float16 (plus float32's own error), where ATen's half kernel was 0.02-0.04 off
    torch.testing.assert_close(got.double(), exact, rtol=2**-10, atol=2e-3)


def test_roi_align_names_features_that_are_not_4d() -> None:
    with pytest.raises(
        ValueError, match=r"mmdeploy::MMCVRoiAlign: input must be \(N, C, H, W\) features; got \(2, 8, 8\)"
    ):
        d.RoIAlign(torch.rand(2, 8, 8), torch.tensor([[0.0, 1, 1, 4, 4]]), output_height=2, output_width=2)
