"""GPU kernels of the built-in ops, for generated TensorRT plugins.

Contract (every GPU kernel in opbridge): ``fn(inputs, outputs, attrs, stream)``
gets CUDA torch tensors, writes into the preallocated ``outputs`` and issues its
work on the CUDA stream whose handle is ``stream`` (it is also the current torch
stream while the kernel runs). MySELU and DynamicResize use Triton when it is
installed, else torch ops; the others use torch ops. Nothing here imports torch's
CUDA parts or Triton until a kernel first runs.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from opbridge.ops._seed import DynamicResize, MySELU, MyStrangeOp, MyStrangeOp2

__all__ = ["dynamic_resize_gpu", "myselu_gpu", "strange_op2_gpu", "strange_op_gpu"]

_BLOCK = 1024


@functools.cache
def _triton_kernels() -> Any | None:
    """The Triton kernels' module (opbridge.ops._seed_triton), imported on first use; ``None`` without Triton."""
    try:
        from opbridge.ops import _seed_triton
    except ImportError:
        return None
    return _seed_triton


def _on_device(x: Any) -> Any:
    """The CUDA device context of ``x`` (none for CPU tensors, which Triton's interpreter runs, and
    none when ``x`` is on the current device already: entering one costs more than a launch)."""
    import torch

    if not x.is_cuda or x.device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(x.device)


def _grid(n: int) -> tuple[int]:
    return ((n + _BLOCK - 1) // _BLOCK,)


def myselu_gpu(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    """MySELU: ``x * sigmoid(x)`` (p, c and the attributes do not change the result)."""
    import torch

    x, out = inputs[0].contiguous(), outputs[0]
    kernels = _triton_kernels()
    if kernels is None or x.numel() == 0:
        torch.mul(x, torch.sigmoid(x), out=out)
        return
    from opbridge.ops._triton_launch import launch

    with _on_device(x):
        launch(kernels.silu_kernel, _grid(x.numel()), x, out, x.numel(), BLOCK=_BLOCK)


def strange_op_gpu(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    """MyStrangeOp: ``(x + weight, x * weight + bias)`` with broadcasting."""
    import torch

    x, w, b = inputs
    torch.add(x, w, out=outputs[0])
    torch.add(torch.mul(x, w), b, out=outputs[1])


def strange_op2_gpu(inputs: list[Any], outputs: list[Any], attrs: dict[str, Any], stream: int) -> None:
    """MyStrangeOp2: ``input1 + input2 - bias`` with broadcasting."""
    import torch

    a, b, bias = inputs
    torch.sub(torch.add(a, b), bias, out=outputs[0])


def _resize_config(nc: int, ho: int, wo: int) -> tuple[int, int, int, bool]:
    """(ROWS, BW, num_warps, PREFETCH) for nc planes of ho x wo outputs.

    Columns in blocks of up to 256; the most rows per program (32, 16 or 8) that still gives
    at least 1024 programs, so that small images fill the GPU too.
    """
    bw = 256 if wo > 128 else max(32, 1 << max(0, wo - 1).bit_length())
    n_tx = -(-wo // bw)
    rows = next((r for r in (32, 16) if nc * n_tx * -(-ho // r) >= 1024), 8)
    return rows, bw, 2 if bw >= 64 else 1, True


def _integer_factor(h: int, w: int, ho: int, wo: int, align: bool) -> int | None:
    """K when the output is exactly K times the input in both dimensions (K = 2 or 4, half-pixel
    centres): the case ``bicubic_int_kernel`` handles. ``None`` otherwise."""
    if align:
        return None
    return next((k for k in (2, 4) if ho == k * h and wo == k * w), None)


def _resize_int_config(nc: int, h: int, w: int) -> tuple[int, int, int, bool]:
    """(BI, RI, num_warps, PREFETCH) of ``bicubic_int_kernel`` for nc planes of h x w inputs.

    Input columns in blocks of up to 128 (one lane each); the most input rows per program
    (16, 8 or 4) that still gives at least 2048 programs (benchmarks/gpu_tiling_sweep.py); no
    prefetch (as fast or faster at every gpu_ops.py size, benchmarks/OPLIB.md).
    """
    bi = 128 if w > 64 else max(32, 1 << max(0, w - 1).bit_length())
    n_tx = -(-w // bi)
    ri = next((r for r in (16, 8) if nc * n_tx * -(-h // r) >= 2048), 4)
    return bi, ri, max(1, bi // 32), False


def dynamic_resize_gpu(
    inputs: list[Any],
    outputs: list[Any],
    attrs: dict[str, Any],
    stream: int,
    config: tuple[Any, ...] | None = None,
    variant: str | None = None,
) -> None:
    """DynamicResize: bicubic (A = -0.75, borders clamped) of input (N, C, H, W) to the output's H, W.

    ``variant``: "window" (``bicubic_kernel``, any sizes), "integer" (``bicubic_int_kernel``,
    outputs exactly 2 or 4 times the input with half-pixel centres) or "plane" (the CUDA kernel of
    :mod:`opbridge.ops._resize_cuda`: bands of rows in shared memory); by default "integer" where it
    applies, else "plane" where ``_resize_cuda.is_default``, else "window". ``config`` overrides the
    variant's tiling: (ROWS, BW, num_warps, PREFETCH) for "window" (default ``_resize_config``), (BI,
    RI, num_warps, PREFETCH) for "integer" (default ``_resize_int_config``), (rows per band, warps[,
    planes per block]) for "plane" (default ``_resize_cuda.default_config``), and needs ``variant``;
    benchmarks use them to compare.
    """
    import torch.nn.functional as F

    x, out = inputs[0].contiguous(), outputs[0]
    align = bool(attrs.get("align_corners", False))
    if x.dim() != 4 or out.dim() != 4 or tuple(out.shape[:2]) != tuple(x.shape[:2]):
        raise ValueError(
            f"DynamicResize: input (N, C, H, W) and output (N, C, Ho, Wo) expected, got {tuple(x.shape)} and "
            f"{tuple(out.shape)}."
        )
    n, c, h, w = x.shape
    ho, wo = out.shape[-2], out.shape[-1]
    if variant not in (None, "window", "integer", "plane"):
        raise ValueError(f"DynamicResize: unknown variant {variant!r}; use 'window', 'integer' or 'plane'.")
    if config is not None and variant is None:
        raise ValueError(
            "DynamicResize: a tiling config belongs to one kernel; name it with variant='window', 'integer' or 'plane'."
        )
    factor = _integer_factor(h, w, ho, wo, align)
    if variant == "integer" and factor is None:
        raise ValueError(
            f"DynamicResize: the 'integer' variant needs an output exactly 2 or 4 times the input with "
            f"align_corners=False; got {h}x{w} -> {ho}x{wo}, align_corners={align}."
        )
    if variant == "plane":
        from opbridge.ops._resize_cuda import resize_plane

        with _on_device(x):
            resize_plane(x, out, align, config)
        return
    kernels = _triton_kernels()
    if kernels is None or out.numel() == 0 or x.numel() == 0 or max(h * w, ho * wo) >= 2**31:
        out.copy_(F.interpolate(x, size=(ho, wo), mode="bicubic", align_corners=align))
        return
    from opbridge.ops._triton_launch import launch

    if factor is not None and variant != "window":
        bi, ri, warps, prefetch = config or _resize_int_config(n * c, h, w)
        n_tx, n_ty = -(-w // bi), -(-h // ri)
        with _on_device(x):
            launch(
                kernels.bicubic_int_kernel,
                (n * c * n_ty * n_tx,),
                x,
                out,
                h,
                w,
                n_tx,
                n_ty,
                K=factor,
                BI=bi,
                RI=ri,
                PREFETCH=prefetch,
                num_warps=warps,
            )
        return
    if variant is None and x.is_cuda:
        from opbridge.ops import _resize_cuda

        if _resize_cuda.is_default(x, ho, wo, align):
            with _on_device(x):
                _resize_cuda.resize_plane(x, out, align)
            return
    if align:
        sh = (h - 1) / (ho - 1) if ho > 1 else 0.0
        sw = (w - 1) / (wo - 1) if wo > 1 else 0.0
    else:
        sh, sw = h / ho, w / wo
    rows, bw, warps, prefetch = config or _resize_config(n * c, ho, wo)
    n_tx, n_ty = -(-wo // bw), -(-ho // rows)
    with _on_device(x):
        launch(
            kernels.bicubic_kernel,
            (n * c * n_ty * n_tx,),
            x,
            out,
            h,
            w,
            ho,
            wo,
            n_tx,
            n_ty,
            sh,
            sw,
            ALIGN=align,
            ROWS=rows,
            BW=bw,
            PREFETCH=prefetch,
            num_warps=warps,
        )


MySELU.register_gpu_kernel(myselu_gpu, dtypes=("float32", "float16"))
MyStrangeOp.register_gpu_kernel(strange_op_gpu, dtypes=("float32", "float16"))
MyStrangeOp2.register_gpu_kernel(strange_op2_gpu, dtypes=("float32", "float16"))
DynamicResize.register_gpu_kernel(dynamic_resize_gpu, dtypes=("float32", "float16"))
