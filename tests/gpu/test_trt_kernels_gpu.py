"""The generated plugins' runtime path (KernelLauncher) against the PyTorch references, on a CUDA GPU.

Runs only where CUDA is available; the same checks as ``check_trt_kernels.py`` (see its docstring).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import opbridge

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)

import check_trt_kernels as checks  # noqa: E402 - after the skip marker, as the module needs CUDA

CASES = [(i, c) for i, c in enumerate(checks.cases())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(("index", "case"), CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[3][0]))}" for _, c in CASES])
def test_kernel_through_launcher_matches_reference(index: int, case: Any, dtype: torch.dtype) -> None:
    _, opdef, attrs, shapes, kind, tol = case
    ok, worst, _, _ = checks.run_case(opdef, attrs, shapes, kind, dtype, seed=100 + index, tol=tol)
    assert ok, f"max abs error {worst} beyond rtol/atol {tol[dtype]}"


def test_launcher_reuses_wrapped_buffers_without_stale_results() -> None:
    """Buffers wrapped once are reused per pointer; new pointers, new contents and a full cache stay correct."""
    from opbridge import ops
    from opbridge.tensorrt._runtime import KernelLauncher

    checked = ops.DynamicResize.spec.bind_attributes({"align_corners": False})
    launcher = KernelLauncher(ops.DynamicResize, checked)
    g = torch.Generator(device="cuda").manual_seed(7)
    size = torch.empty(2, 1, 24, 34, device="cuda")
    a, b = (torch.rand(2, 3, 12, 17, device="cuda", generator=g) for _ in range(2))
    out_a, out_b = torch.full((2, 2, 3, 24, 34), float("nan"), device="cuda").unbind(0)
    stream = torch.cuda.current_stream().cuda_stream

    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        launcher.launch(
            [checks.ref_of(x, x.dtype), checks.ref_of(size, x.dtype)], [checks.ref_of(out, x.dtype)], stream
        )
        want = ops.DynamicResize.run_reference(x, size, **checked)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)

    run(a, out_a)
    run(b, out_b)  # other pointers, same shapes
    a.mul_(-2.0)  # same pointer, new contents
    run(a, out_a)
    assert len(launcher._views) == 5  # a, b, size, out_a, out_b
    kept = [torch.rand(2, 3, 12, 17, device="cuda", generator=g) + i for i in range(launcher.VIEW_CACHE_SIZE)]
    for x in kept:  # more distinct buffers than the cache keeps
        run(x, out_b)
    assert len(launcher._views) == launcher.VIEW_CACHE_SIZE
    run(a, out_a)  # evicted long ago: wrapped again


def test_an_op_without_a_gpu_kernel_runs_its_reference_in_the_plugin() -> None:
    """A plugin of an op without register_gpu_kernel failed at its first enqueue; it now runs the op's
    PyTorch reference on TensorRT's buffers and stream."""
    from opbridge.tensorrt._runtime import KernelLauncher

    @opbridge.op("tests.gpu::SoftplusPair")
    def softplus_pair(x: torch.Tensor, scale: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.nn.functional.softplus(x) * scale, x.amax(-1, keepdim=True)

    attrs = softplus_pair.spec.bind_attributes({"scale": 0.5})
    launcher = KernelLauncher(softplus_pair, attrs)
    stream = torch.cuda.Stream()
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(3, 7, device="cuda", dtype=dtype)
        a, b = (
            torch.full((3, 7), float("nan"), device="cuda", dtype=dtype),
            torch.empty(3, 1, device="cuda", dtype=dtype),
        )
        launcher.launch([checks.ref_of(x)], [checks.ref_of(a), checks.ref_of(b)], stream.cuda_stream)
        stream.synchronize()
        want = softplus_pair.run_reference(x, **attrs)
        torch.testing.assert_close(a, want[0], rtol=0, atol=0)
        torch.testing.assert_close(b, want[1], rtol=0, atol=0)
    short = torch.empty(3, 6, device="cuda")
    with pytest.raises(opbridge.OpDefinitionError, match=r"gave output 0 the shape \(3, 7\), TensorRT's buffer is"):
        launcher.launch([checks.ref_of(x.float())], [checks.ref_of(short), checks.ref_of(b.float())], 0)


def test_the_reference_kernel_takes_an_int64_index() -> None:
    from opbridge.tensorrt._runtime import KernelLauncher, dtype_supported

    @opbridge.op("tests.gpu::TakeRows")
    def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, index)

    assert dtype_supported(take_rows, "int64")
    launcher = KernelLauncher(take_rows, {})
    x = torch.randn(6, 4, device="cuda")
    index = torch.tensor([5, 0, 5], device="cuda")
    out = torch.full((3, 4), float("nan"), device="cuda")
    launcher.launch([checks.ref_of(x), checks.ref_of(index)], [checks.ref_of(out)], 0)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x[[5, 0, 5]], rtol=0, atol=0)
