"""The Triton GPU kernels, run by Triton's interpreter on the CPU, against the PyTorch references.

No GPU is needed: the interpreter executes every program with numpy on CPU tensors, which checks
the kernels' indexing, masks and arithmetic on every run of the suite (their compiled code and
speed are checked on a GPU by tests/test_oplib_gpu.py). Triton reads TRITON_INTERPRET when the
kernels are defined, so they run in a child process: tests/_interpreted_kernels.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import start_interpreted_kernels

pytest.importorskip("triton", reason="triton is not installed (make test installs the kernel-tests extra)")

CASES = [
    "resize-half-pixel",
    "resize-align-corners",
    "resize-integer-factor",
    "silu",
    *(f"grid-{v}-{m}" for v in ("loop", "nhwc") for m in ("bilinear", "nearest", "bicubic")),
    "dcn-nhwc",
    "dcn-loop",
    "grid-loop-channels-last-input",
    "grid-nhwc-channels-last-input",
    "dcn-nhwc-channels-last-input",
    "dcn-fused",
    "roi-align-avg",
    "roi-align-max",
    "roi-align-bad-rois",
    "roi-align-non-finite",
    "multi-level-roi-align",
    "batched-nms",
]


@pytest.fixture(scope="module")
def interpreted() -> dict[str, list[float]]:
    """Case -> [max abs error, allowed], from one child process running every case (started when the
    session started: conftest.start_interpreted_kernels)."""
    child = start_interpreted_kernels()
    try:
        returncode = child["process"].wait(timeout=900)
    except subprocess.TimeoutExpired:
        child["process"].kill()
        raise
    child["stdout"].seek(0)
    child["stderr"].seek(0)
    stdout, stderr = child["stdout"].read(), child["stderr"].read()
    assert returncode == 0, f"the interpreted kernels failed:\n{stderr[-6000:]}"
    return json.loads(stdout.strip().splitlines()[-1])


def test_every_case_ran(interpreted: dict[str, list[float]]) -> None:
    assert sorted(interpreted) == sorted(CASES)


@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(interpreted: dict[str, list[float]], case: str) -> None:
    err, allowed = interpreted[case]
    assert err <= allowed, f"{case}: max abs error {err:.3g} against the reference, allowed {allowed:.3g}"


def test_unknown_variant_is_refused() -> None:
    import torch

    from opbridge.ops import _detection_triton as tk

    x, grid = torch.zeros(1, 2, 4, 4), torch.zeros(1, 3, 3, 2)
    with pytest.raises(ValueError, match="unknown variant 'tile'; use 'loop', 'nhwc' or 'plane'"):
        tk.grid_sample(x, grid, torch.empty(1, 2, 3, 3), 0, 0, False, variant="tile")
    with pytest.raises(ValueError, match="'plane' runs on CUDA tensors"):
        tk.grid_sample(x, grid, torch.empty(1, 2, 3, 3), 0, 0, False, variant="plane")
    w = torch.zeros(3, 2, 3, 3)
    off, mask = torch.zeros(1, 18, 4, 4), torch.zeros(1, 9, 4, 4)
    with pytest.raises(ValueError, match="unknown variant 'tile'; use 'nhwc', 'loop' or 'fused'"):
        tk.deform_conv2d(x, off, mask, w, None, torch.empty(1, 3, 4, 4), (1, 1), (1, 1), (1, 1), 1, 1, variant="tile")


def test_resize_variant_errors() -> None:
    import torch

    from opbridge.ops import _seed_gpu as sg

    x = torch.zeros(1, 2, 4, 4)
    with pytest.raises(ValueError, match="unknown variant 'tile'; use 'window', 'integer' or 'plane'"):
        sg.dynamic_resize_gpu([x, None], [torch.empty(1, 2, 8, 8)], {}, 0, variant="tile")
    with pytest.raises(ValueError, match=r"exactly 2 or 4 times the input .* got 4x4 -> 8x12"):
        sg.dynamic_resize_gpu([x, None], [torch.empty(1, 2, 8, 12)], {}, 0, variant="integer")
    with pytest.raises(ValueError, match="align_corners=True"):
        sg.dynamic_resize_gpu([x, None], [torch.empty(1, 2, 8, 8)], {"align_corners": True}, 0, variant="integer")
    with pytest.raises(ValueError, match="'plane' runs on CUDA tensors"):
        sg.dynamic_resize_gpu([x, None], [torch.empty(1, 2, 8, 8)], {}, 0, variant="plane")
    with pytest.raises(ValueError, match="belongs to one kernel; name it with variant='window', 'integer' or 'plane'"):
        sg.dynamic_resize_gpu([x, None], [torch.empty(1, 2, 8, 8)], {}, 0, config=(8, 4))
    for out in (torch.empty(1, 3, 8, 8), torch.empty(2, 2, 8, 8), torch.empty(2, 8, 8)):
        with pytest.raises(ValueError, match=r"output \(N, C, Ho, Wo\) expected"):
            sg.dynamic_resize_gpu([x, None], [out], {}, 0)


def test_cuda_kernels_check_shapes_and_dtypes_first() -> None:
    """The CUDA kernels' entry points refuse mismatched shapes and dtypes before anything else."""
    import torch

    from opbridge.ops import _gridsample_cuda as gc
    from opbridge.ops import _resize_cuda as rc

    x, grid = torch.zeros(2, 3, 4, 4), torch.zeros(2, 5, 6, 2)
    with pytest.raises(ValueError, match="output \\(N, C, Ho, Wo\\) expected"):
        gc.grid_sample_plane(x, grid, torch.empty(2, 3, 6, 5), 0, 0, False)
    with pytest.raises(ValueError, match="output's dtype must be the input's"):
        gc.grid_sample_plane(x, grid, torch.empty(2, 3, 5, 6, dtype=torch.float16), 0, 0, False)
    with pytest.raises(ValueError, match="output \\(N, C, Ho, Wo\\) expected"):
        rc.resize_plane(x, torch.empty(2, 4, 8, 8), False)
    with pytest.raises(ValueError, match="of one dtype"):
        rc.resize_plane(x, torch.empty(2, 3, 8, 8, dtype=torch.float16), False)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        rc.resize_plane(x, torch.empty(2, 3, 8, 8), False)


@pytest.mark.parametrize("variant", [None, "loop", "nhwc", "plane"])
def test_grid_sample_shapes_are_checked(variant: str | None) -> None:
    """Every variant refuses an output or grid that does not match the input before it launches."""
    import torch

    from opbridge.ops import _detection_triton as tk

    x, grid = torch.zeros(2, 3, 4, 4), torch.zeros(2, 5, 6, 2)
    cases = [
        (grid, torch.empty(2, 3, 6, 5), "output must be"),
        (grid, torch.empty(2, 4, 5, 6), "output must be"),
        (torch.zeros(1, 5, 6, 2), torch.empty(2, 3, 5, 6), "grid \\(N, Ho, Wo, 2\\) expected"),
        (torch.zeros(2, 5, 6, 3), torch.empty(2, 3, 5, 6), "grid \\(N, Ho, Wo, 2\\) expected"),
    ]
    for g, out, message in cases:
        with pytest.raises(ValueError, match=message):
            tk.grid_sample(x, g, out, 0, 0, False, variant=variant)


def test_channels_last_input_is_read_in_place() -> None:
    import torch

    from opbridge.ops import _detection_triton as tk

    x = torch.randn(2, 5, 4, 3).to(memory_format=torch.channels_last)
    view = tk.as_channels_last(x)
    assert view.data_ptr() == x.data_ptr() and view.is_contiguous()
    assert torch.equal(view, x.permute(0, 2, 3, 1))
