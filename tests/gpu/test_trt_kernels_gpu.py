"""The generated plugins' runtime path (KernelLauncher) against the PyTorch references, on a CUDA GPU.

Runs only where CUDA is available; the same checks as ``check_trt_kernels.py`` (see its docstring).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)

import check_trt_kernels as checks  # noqa: E402 - after the skip marker, as the module needs CUDA

CASES = [(i, c) for i, c in enumerate(checks.cases())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(("index", "case"), CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[3][0]))}" for _, c in CASES])
def test_kernel_through_launcher_matches_reference(index: int, case: Any, dtype: torch.dtype) -> None:
    _, opdef, attrs, shapes, kind = case
    ok, worst, _, _ = checks.run_case(opdef, attrs, shapes, kind, dtype, seed=100 + index)
    assert ok, f"max abs error {worst} beyond rtol/atol {checks.TOL[dtype]}"
