"""GPU check of the generated TensorRT plugins' runtime path, without TensorRT.

For every built-in op, at two shapes, in float32 and float16: allocate CUDA
buffers, describe them as TensorRT does (raw pointer, dims, dtype name), run
``KernelLauncher.on_shape_change`` and ``KernelLauncher.launch`` on a
non-default stream (the code a generated plugin's ``on_shape_change`` and
``enqueue`` delegate to), and compare with the op's PyTorch reference.

float32 results are compared with the reference run in float32; float16 results
with the reference run in float32 on the same (float16-rounded) inputs. Integer
outputs (TRTBatchedNMS's int32 labels) keep their dtype and must be equal.

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
from opbridge.ops import detection
from opbridge.tensorrt._runtime import KernelLauncher, TensorRef

TOL = {torch.float32: (1e-5, 1e-6), torch.float16: (2e-3, 4e-3)}  # (rtol, atol)
# The detection ops' tolerances (as in tests/test_oplib_gpu.py): sums over many samples or taps
DETECTION_TOL = {torch.float32: (1e-3, 1e-4), torch.float16: (1e-2, 1e-2)}
EXACT = {torch.float32: (0.0, 0.0), torch.float16: (0.0, 0.0)}

Case = tuple[str, Any, dict[str, Any], list[tuple[int, ...]], Any, dict[Any, tuple[float, float]]]


def _rois(g: torch.Generator, n: int, images: int, span: float, size: float) -> torch.Tensor:
    xy = torch.rand(n, 2, device="cuda", generator=g) * span - 5
    batch = torch.randint(0, images, (n, 1), device="cuda", generator=g).float()
    return torch.cat([batch, xy, xy + torch.rand(n, 2, device="cuda", generator=g) * size], 1)


def _detection_cases() -> list[Case]:
    """Each detection op at two shapes; inputs made by the case (grids in range, valid RoIs, boxes)."""
    out: list[Case] = []
    for (n, c, h, w), (ho, wo), attrs in (
        ((2, 5, 9, 11), (7, 6), {"interpolation_mode": 0, "padding_mode": 0, "align_corners": False}),
        ((1, 16, 64, 64), (32, 48), {"interpolation_mode": 2, "padding_mode": 2, "align_corners": True}),
        ((2, 3, 17, 13), (9, 9), {"interpolation_mode": 1, "padding_mode": 1, "align_corners": False}),
    ):

        def grid_inputs(g: torch.Generator, n: int = n, c: int = c, h: int = h, w: int = w, ho: int = ho, wo: int = wo):
            x = torch.randn(n, c, h, w, device="cuda", generator=g) * 3
            return [x, torch.rand(n, ho, wo, 2, device="cuda", generator=g) * 2.6 - 1.3]

        out.append(
            ("grid_sampler", detection.GridSample, attrs, [(n, c, h, w), (n, ho, wo, 2)], grid_inputs, DETECTION_TOL)
        )
    for (n, c, h, w), cout, attrs in (
        (
            (1, 8, 12, 12),
            16,
            {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "deform_groups": 1},
        ),
        ((2, 8, 15, 11), 8, {"stride": [2, 1], "padding": [2, 1], "dilation": [2, 1], "groups": 2, "deform_groups": 2}),
    ):
        s, p, dl = attrs["stride"], attrs["padding"], attrs["dilation"]
        hout = (h + 2 * p[0] - dl[0] * 2 - 1) // s[0] + 1
        wout = (w + 2 * p[1] - dl[1] * 2 - 1) // s[1] + 1
        dg, groups = attrs["deform_groups"], attrs["groups"]
        shapes = [(n, c, h, w), (n, 18 * dg, hout, wout), (n, 9 * dg, hout, wout), (cout, c // groups, 3, 3), (cout,)]

        def dcn_inputs(g: torch.Generator, shapes: list[tuple[int, ...]] = shapes):
            x, off, mask, weight, bias = (torch.randn(s, device="cuda", generator=g) for s in shapes)
            return [x, off * 2, mask.sigmoid(), weight * 0.2, bias]

        out.append(
            ("MMCVModulatedDeformConv2d", detection.ModulatedDeformConv2d, attrs, shapes, dcn_inputs, DETECTION_TOL)
        )
    for attrs in (
        {
            "output_height": 3,
            "output_width": 4,
            "spatial_scale": 0.25,
            "sampling_ratio": 0,
            "mode": "avg",
            "aligned": True,
        },
        {
            "output_height": 2,
            "output_width": 2,
            "spatial_scale": 0.25,
            "sampling_ratio": 2,
            "mode": "max",
            "aligned": False,
        },
    ):

        def roi_inputs(g: torch.Generator):
            return [torch.randn(2, 4, 20, 24, device="cuda", generator=g), _rois(g, 25, 2, 90, 50)]

        out.append(("MMCVRoiAlign", detection.RoIAlign, attrs, [(2, 4, 20, 24), (25, 5)], roi_inputs, DETECTION_TOL))
    levels = [(2, 3, 256 // s, 256 // s) for s in (4, 8, 16, 32)]
    for pool in (0, 1):

        def level_inputs(g: torch.Generator):
            feats = [torch.randn(s, device="cuda", generator=g) for s in levels]
            return [_rois(g, 40, 2, 200, 250), *feats]

        out.append(
            (
                "MMCVMultiLevelRoiAlign",
                detection.MultiLevelRoiAlign,
                {"pool_mode": pool, "roi_scale_factor": 1.5},
                [(40, 5), *levels],
                level_inputs,
                DETECTION_TOL,
            )
        )
    for classes, attrs in ((1, {"topk": 40, "keep_topk": 30}), (4, {"topk": -1, "keep_topk": 300})):

        def nms_inputs(g: torch.Generator, classes: int = classes):
            xy = torch.rand(2, 150, classes, 2, device="cuda", generator=g) * 100
            boxes = torch.cat([xy, xy + 5 + torch.rand(xy.shape, device="cuda", generator=g) * 40], -1)
            return [boxes, torch.rand(2, 150, 4, device="cuda", generator=g)]

        out.append(
            (
                "TRTBatchedNMS",
                detection.BatchedNMS,
                {"num_classes": 4, **attrs},
                [(2, 150, classes, 4), (2, 150, 4)],
                nms_inputs,
                EXACT,
            )
        )
    return out


def cases() -> list[Case]:
    out: list[Case] = []
    for shape in ((2, 1, 8, 8), (3, 4, 37, 53)):
        out.append(("MySELU", ops.MySELU, {}, [shape, (3,), (3,)], "randn", TOL))
    for shape in ((2, 3, 4, 4), (5, 16, 33, 17)):
        out.append(("MyStrangeOp", ops.MyStrangeOp, {}, [shape, (1, *shape[1:]), (1, *shape[1:])], "randn", TOL))
        out.append(("MyStrangeOp2", ops.MyStrangeOp2, {}, [shape, shape, (1, *shape[1:])], "randn", TOL))
    for inp, size in (((2, 3, 16, 16), (2, 1, 32, 32)), ((1, 3, 12, 20), (1, 1, 17, 13))):
        for align in (False, True):
            out.append(
                (
                    f"DynamicResize(align_corners={align})",
                    ops.DynamicResize,
                    {"align_corners": align},
                    [inp, size],
                    "rand",
                    TOL,
                )
            )
    return out + _detection_cases()


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def ref_of(t: torch.Tensor, dtype: torch.dtype | None = None) -> TensorRef:
    return TensorRef(t.data_ptr(), tuple(t.shape), _name(dtype or t.dtype))


def run_case(
    opdef: Any,
    attrs: dict[str, Any],
    shapes: list[tuple[int, ...]],
    kind: Any,
    dtype: torch.dtype,
    seed: int,
    tol: dict[Any, tuple[float, float]] = TOL,
):
    """``kind``: "randn" or "rand" inputs of ``shapes``, or a function making the inputs from a generator."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if callable(kind):
        made = kind(g)
    else:
        make = torch.randn if kind == "randn" else torch.rand
        made = [make(s, generator=g, device="cuda") * (3.0 if kind == "randn" else 1.0) for s in shapes]
    inputs = [t.to(dtype) if t.is_floating_point() else t for t in made]
    checked = opdef.spec.bind_attributes(attrs)
    with torch.no_grad():
        expected = opdef.run_reference(*[t.float() if t.is_floating_point() else t for t in inputs], **checked)
        native = opdef.run_reference(*inputs, **checked)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    native = list(native) if isinstance(native, tuple) else [native]
    outputs = [
        torch.full(e.shape, float("nan"), dtype=dtype, device="cuda")
        if e.is_floating_point()
        else torch.full(e.shape, -7, dtype=e.dtype, device="cuda")
        for e in expected
    ]
    launcher = KernelLauncher(opdef, checked)
    launcher.on_shape_change(
        [(tuple(t.shape), _name(t.dtype)) for t in inputs], [(tuple(t.shape), _name(t.dtype)) for t in outputs]
    )
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    launcher.launch([ref_of(t) for t in inputs], [ref_of(t) for t in outputs], stream.cuda_stream)
    stream.synchronize()
    rtol, atol = tol[dtype]
    worst, worst_native, ok = 0.0, 0.0, True
    for got, exp, nat in zip(outputs, expected, native):
        if not exp.is_floating_point():
            ok = ok and got.dtype == exp.dtype and torch.equal(got, exp)
            worst = max(worst, float((got.long() - exp.long()).abs().max())) if got.numel() else worst
            continue
        diff = (got.float() - exp).abs()
        worst = max(worst, float(diff.max())) if diff.numel() else worst
        if nat.numel():
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
    if not torch.cuda.is_available():
        print(
            "check_trt_kernels.py: needs a CUDA GPU (torch.cuda.is_available() is False here); "
            "its recorded results are in docs/tensorrt_gpu_checks.md",
            file=sys.stderr,
        )
        return 2
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
    for i, (label, opdef, attrs, shapes, kind, tol) in enumerate(cases()):
        for dtype in (torch.float32, torch.float16):
            ok, worst, worst_native, out_shapes = run_case(opdef, attrs, shapes, kind, dtype, seed=100 + i, tol=tol)
            failures += not ok
            rtol, atol = tol[dtype]
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
