"""GPU check of the generated TensorRT plugins' runtime path, without TensorRT.

For every built-in op, at two shapes, in float32 and float16: allocate CUDA
buffers, describe them as TensorRT does (raw pointer, dims, dtype name), run
``KernelLauncher.on_shape_change`` and ``KernelLauncher.launch`` on a
non-default stream (the code a generated plugin's ``on_shape_change`` and
``enqueue`` delegate to), and compare with the op's PyTorch reference.

float32 results are compared with the reference run in float32; float16 results
with the reference run in float32 on the same (float16-rounded) inputs.

Usage (on a CUDA machine; needs torch, numpy, optionally triton):
    PYTHONPATH=src python3 tests/gpu/check_trt_kernels.py [--bench] [--markdown OUT.md]
Exit code 0 when every comparison is within tolerance.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import Any

import torch

from opbridge import ops
from opbridge.tensorrt._runtime import KernelLauncher, TensorRef

TOL = {torch.float32: (1e-5, 1e-6), torch.float16: (2e-3, 4e-3)}  # (rtol, atol)


def cases() -> list[tuple[str, Any, dict[str, Any], list[tuple[int, ...]], str]]:
    out = []
    for shape in ((2, 1, 8, 8), (3, 4, 37, 53)):
        out.append(("MySELU", ops.MySELU, {}, [shape, (3,), (3,)], "randn"))
    for shape in ((2, 3, 4, 4), (5, 16, 33, 17)):
        out.append(("MyStrangeOp", ops.MyStrangeOp, {}, [shape, (1, *shape[1:]), (1, *shape[1:])], "randn"))
        out.append(("MyStrangeOp2", ops.MyStrangeOp2, {}, [shape, shape, (1, *shape[1:])], "randn"))
    for inp, size in (((2, 3, 16, 16), (2, 1, 32, 32)), ((1, 3, 12, 20), (1, 1, 17, 13))):
        for align in (False, True):
            out.append(
                (
                    f"DynamicResize(align_corners={align})",
                    ops.DynamicResize,
                    {"align_corners": align},
                    [inp, size],
                    "rand",
                )
            )
    return out


def ref_of(t: torch.Tensor, dtype: torch.dtype) -> TensorRef:
    return TensorRef(t.data_ptr(), tuple(t.shape), str(dtype).removeprefix("torch."))


def run_case(
    opdef: Any, attrs: dict[str, Any], shapes: list[tuple[int, ...]], kind: str, dtype: torch.dtype, seed: int
):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = torch.randn if kind == "randn" else torch.rand
    inputs = [(make(s, generator=g, device="cuda") * (3.0 if kind == "randn" else 1.0)).to(dtype) for s in shapes]
    checked = opdef.spec.bind_attributes(attrs)
    with torch.no_grad():
        expected = opdef.run_reference(*[t.float() for t in inputs], **checked)
        native = opdef.run_reference(*inputs, **checked)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    native = list(native) if isinstance(native, tuple) else [native]
    outputs = [torch.full(e.shape, float("nan"), dtype=dtype, device="cuda") for e in expected]
    launcher = KernelLauncher(opdef, checked)
    name = str(dtype).removeprefix("torch.")
    launcher.on_shape_change([(tuple(t.shape), name) for t in inputs], [(tuple(t.shape), name) for t in outputs])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    launcher.launch([ref_of(t, dtype) for t in inputs], [ref_of(t, dtype) for t in outputs], stream.cuda_stream)
    stream.synchronize()
    rtol, atol = TOL[dtype]
    worst, worst_native, ok = 0.0, 0.0, True
    for got, exp, nat in zip(outputs, expected, native):
        diff = (got.float() - exp).abs()
        worst = max(worst, float(diff.max()))
        worst_native = max(worst_native, float((got.float() - nat.float()).abs().max()))
        ok = ok and bool(torch.all(diff <= atol + rtol * exp.abs())) and not bool(torch.isnan(got).any())
    return ok, worst, worst_native, [tuple(o.shape) for o in outputs]


def bench(fn: Any, reps: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def benchmarks() -> list[str]:
    import torch.nn.functional as F

    rows = []
    for dtype in (torch.float32, torch.float16):
        x = torch.rand(8, 64, 128, 128, device="cuda", dtype=dtype)
        size = torch.empty(8, 1, 256, 256, device="cuda", dtype=dtype)
        out = torch.empty(8, 64, 256, 256, device="cuda", dtype=dtype)
        launcher = KernelLauncher(ops.DynamicResize, {"align_corners": False})
        s = torch.cuda.current_stream().cuda_stream
        name = str(dtype).removeprefix("torch.")
        ins, outs = [ref_of(x, dtype), ref_of(size, dtype)], [ref_of(out, dtype)]
        plugin_ms = bench(functools.partial(launcher.launch, ins, outs, s))
        torch_ms = bench(functools.partial(F.interpolate, x, size=(256, 256), mode="bicubic", align_corners=False))
        moved = (x.numel() + out.numel()) * x.element_size()
        rows.append(
            f"| DynamicResize 8x64x128x128 -> 256x256 | {name} | {plugin_ms:.3f} | {torch_ms:.3f} | "
            f"{torch_ms / plugin_ms:.2f}x | {moved / plugin_ms / 1e6:.0f} GB/s |"
        )
        y = torch.randn(8, 64, 256, 256, device="cuda", dtype=dtype)
        o = torch.empty_like(y)
        sl = KernelLauncher(ops.MySELU, ops.MySELU.spec.bind_attributes({}))
        p = torch.empty(3, device="cuda", dtype=dtype)
        ins, outs = [ref_of(y, dtype), ref_of(p, dtype), ref_of(p, dtype)], [ref_of(o, dtype)]
        plugin_ms = bench(functools.partial(sl.launch, ins, outs, s))
        torch_ms = bench(functools.partial(ops.MySELU.reference, y, p, p))
        moved = 2 * y.numel() * y.element_size()
        rows.append(
            f"| MySELU 8x64x256x256 | {name} | {plugin_ms:.3f} | {torch_ms:.3f} | {torch_ms / plugin_ms:.2f}x | "
            f"{moved / plugin_ms / 1e6:.0f} GB/s |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent (torch fallbacks)"
    lines = [
        (
            f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton_version}; "
            f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        ),
        "",
        (
            "| op | input shapes | dtype | output shapes | max abs err vs fp32 reference "
            "| vs reference in same dtype | rtol/atol | result |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    failures = 0
    for i, (label, opdef, attrs, shapes, kind) in enumerate(cases()):
        for dtype in (torch.float32, torch.float16):
            ok, worst, worst_native, out_shapes = run_case(opdef, attrs, shapes, kind, dtype, seed=100 + i)
            failures += not ok
            rtol, atol = TOL[dtype]
            lines.append(
                f"| {label} | {' '.join('x'.join(map(str, s)) for s in shapes)} | {str(dtype)[6:]} | "
                f"{' '.join('x'.join(map(str, s)) for s in out_shapes)} | {worst:.3g} | {worst_native:.3g} | "
                f"{rtol:g}/{atol:g} | {'ok' if ok else 'MISMATCH'} |"
            )
    # The launcher refuses dtypes the kernel does not declare, with opbridge's message.
    try:
        KernelLauncher(ops.MySELU, {}).on_shape_change([((2,), "float64")] * 3, [((2,), "float64")])
        lines.append("\nfloat64 refusal: NOT refused (failure)")
        failures += 1
    except Exception as exc:
        lines.append(f"\nfloat64 refusal: {type(exc).__name__}: {exc}")
    if args.bench:
        lines += [
            "",
            "| kernel (through KernelLauncher) | dtype | plugin path ms | PyTorch ms | speed-up | effective bandwidth |",
            "|---|---|---|---|---|---|",
            *benchmarks(),
        ]
    lines.append(f"\nfailures: {failures}")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
