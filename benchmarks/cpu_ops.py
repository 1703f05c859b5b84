"""CPU speed of the detection ops' CPU paths against their PyTorch references, measured in one run.

For each op and size: the op's CPU path (its registered kernel; for resize, ONNX
Runtime's standard Resize) against the PyTorch reference on CPU, and, where ONNX
has the op, ONNX Runtime's standard op on the same inputs. When opbridge's ONNX
Runtime bridge is importable, the exported model is also timed through
``opbridge.onnxruntime.InferenceSession``.

Usage:
    PYTHONPATH=src python benchmarks/cpu_ops.py [--quick] [--threads N]
        [--only resize,resize-kernel,grid,grid-channels,grid-planes,grid-wide,grid-session,dcn,roi,nms]

``resize-kernel`` times DynamicResize's native CPU kernel (``opbridge.ops._resize_cpu``) alone against
ATen's ``upsample_bicubic2d.out`` into the same output, up and down. ``grid-channels`` times
grid_sampler's native CPU kernel (``opbridge.ops._gridsample_cpu``) alone against F.grid_sample per
interpolation mode and channel count, the measurement behind its ``MIN_CHANNELS`` thresholds.
``grid-planes`` times that kernel's two ways to read an image of one to four channels (its planes,
with gathers, and a channels-last copy) side by side. ``grid-wide`` times that kernel on feature maps
of 128-512 channels with its channel stride and with the plain one side by side. ``grid-session``
times one grid_sampler node in opbridge's session with its native kernel (no Python per run; also
forced below ``NATIVE_MIN_CHANNELS``) and with its Python kernel (``native=False``) against
F.grid_sample.

Times are medians of repeated wall-clock runs (time.perf_counter) in one process;
"ratio" is reference time / path time (> 1: the path is faster). Every path runs on
``--threads`` threads (default 1: torch, ONNX Runtime and numpy alike; numpy kernels
are single-threaded, and spinning torch/ORT thread pools would otherwise steal
the cores the numpy kernels run on).
"""

# ruff: noqa: B023 - the lambdas built in loops are timed at once, inside the same iteration

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opbridge.ops import DynamicResize
from opbridge.ops import detection as d

ROWS: list[tuple[str, str, str, float, str, float]] = []
THREADS = 1


def timeit(fn: Callable[[], Any], reps: int) -> float:
    # warm up for at least 50 ms: the first calls in a process ran up to 2x slower (page faults,
    # caches, clocks) and skewed the first rows
    start = time.perf_counter()
    fn()
    while time.perf_counter() - start < 0.05:
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def row(op: str, shape: str, path: str, ms: float, base: str, base_ms: float) -> None:
    ROWS.append((op, shape, path, ms, base, base_ms))
    print(
        f"{op:26s} {shape:30s} {path:34s} {ms:9.4f} ms   {base:22s} {base_ms:9.4f} ms   ratio {base_ms / ms:6.2f}",
        flush=True,
    )


def ort_session(nodes: list, inputs: dict[str, np.ndarray], opset: int, inits: list | None = None) -> Callable[[], Any]:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    types = {
        np.dtype(np.float32): TensorProto.FLOAT,
        np.dtype(np.int64): TensorProto.INT64,
    }
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info(k, types[v.dtype], None) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=inits or [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, inputs)


def bridged(opdef: Any, args: tuple, attrs: dict) -> list[tuple[str, Callable[[], Any]]]:
    """The op exported by each exporter and run through opbridge's ONNX Runtime session.

    Returns one ``(label, run)`` per distinct path the session took: the op's ONNX
    function body where the export's opset has one, else its kernel; where the op
    prefers its kernel to the body (the session's default ``bodies="auto"``), the
    body too, with ``bodies="always"``.
    """
    import opbridge
    from opbridge.onnxruntime import InferenceSession

    class Call(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> Any:
            return opdef(*xs, **attrs)

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS  # native kernels run on the session's threads, Python ones on torch's
    runs: dict[str, Callable[[], Any]] = {}
    for exporter in ("torchscript", "dynamo"):
        path = Path(tempfile.mkdtemp()) / "m.onnx"
        result = opbridge.export(Call(), args, path, exporter=exporter)
        opset = next(o.version for o in result.model.opset_import if o.domain == "")
        for bodies, native in (("auto", True), ("auto", False), ("always", True)):
            sess = InferenceSession(str(path), bodies=bodies, sess_options=opts, native=native)
            paths = sorted({k.path + (" native" if k.native else "") for k in sess.kernels.values()})
            if bodies == "always" and "function" not in paths:
                continue
            feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
            suffix = "" if bodies == "auto" else ", bodies=always"
            label = f"opbridge ORT session ({'/'.join(paths)}, opset {opset}{suffix})"
            if not any(key.startswith(f"opbridge ORT session ({'/'.join(paths)},") for key in runs):
                runs[label] = lambda sess=sess, feeds=feeds: sess.run(None, feeds)
    return list(runs.items())


def bench_resize(quick: bool, reps: int) -> None:
    from onnx import helper, numpy_helper

    sizes = [(1, 3, 128, 128, 2), (1, 3, 256, 256, 4)] + ([] if quick else [(8, 64, 64, 64, 2)])
    for n, c, h, w, s in sizes:
        x = torch.randn(n, c, h, w)
        size_t = torch.empty(1, 1, h * s, w * s)
        ref = timeit(lambda: DynamicResize.run_reference(x, size_t), reps)
        node = helper.make_node(
            "Resize",
            ["x", "", "", "sizes"],
            ["y"],
            mode="cubic",
            cubic_coeff_a=-0.75,
            coordinate_transformation_mode="pytorch_half_pixel",
        )
        sizes_init = numpy_helper.from_array(np.array([n, c, h * s, w * s], np.int64), "sizes")
        run = ort_session([node], {"x": x.numpy()}, 17, [sizes_init])
        got = run()[0]
        err = float(np.abs(got - DynamicResize.run_reference(x, size_t).numpy()).max())
        row(
            "DynamicResize (bicubic)",
            f"{n}x{c}x{h}x{w} x{s}",
            f"ORT Resize cubic (err {err:.0e})",
            timeit(run, reps),
            "F.interpolate",
            ref,
        )
        for label, fn in bridged(DynamicResize, (x, size_t), {}):
            row("DynamicResize (bicubic)", f"{n}x{c}x{h}x{w} x{s}", label, timeit(fn, reps), "F.interpolate", ref)


def affine_grid(n: int, h: int, w: int) -> torch.Tensor:
    """A rotated (0.3 rad), slightly zoomed and shifted sampling grid: neighbouring outputs read
    neighbouring pixels, as in warps, flows and deformable sampling."""
    import math

    import torch.nn.functional as F

    c, s = math.cos(0.3), math.sin(0.3)
    theta = torch.tensor([[1.1 * c, -s, 0.05], [s, 1.1 * c, -0.03]]).expand(n, 2, 3)
    return F.affine_grid(theta, [n, 1, h, w], align_corners=False).contiguous()


GRID_MODES = ((0, "bilinear"), (1, "nearest"), (2, "bicubic"))


def bench_grid(quick: bool, reps: int) -> None:
    from onnx import helper

    from opbridge.ops import _gridsample_cpu

    for n, c, h in [(1, 16, 64), (2, 64, 128), (1, 3, 128)][: 1 if quick else 3]:
        x = torch.randn(n, c, h, h)
        for kind, grid in (("random", torch.rand(n, h, h, 2) * 2.2 - 1.1), ("affine", affine_grid(n, h, h))):
            for mode, name in GRID_MODES:
                attrs = {
                    "interpolation_mode": mode,
                    "padding_mode": 0,
                    "align_corners": False,
                }
                op, shape = f"grid_sampler {name}", f"{n}x{c}x{h}x{h} {kind}"
                ref = timeit(lambda: d.GridSample.run_reference(x, grid, **attrs), reps)
                native = _gridsample_cpu.applies(x, grid, mode)
                row(
                    op,
                    shape,
                    "kernel (opbridge native)" if native else "kernel (ATen)",
                    timeit(lambda: d.GridSample.kernel(x, grid, **attrs), reps),
                    "reference",
                    ref,
                )
                node = helper.make_node(
                    "GridSample",
                    ["x", "g"],
                    ["y"],
                    mode=name,
                    padding_mode="zeros",
                    align_corners=0,
                )
                run = ort_session([node], {"x": x.numpy(), "g": grid.numpy()}, 16)
                row(op, shape, "ORT GridSample-16 (standard op)", timeit(run, reps), "reference", ref)
                for label, fn in bridged(d.GridSample, (x, grid), attrs):
                    row(op, shape, label, timeit(fn, reps), "reference", ref)


def bench_resize_kernel(quick: bool, reps: int) -> None:
    from opbridge.ops import _resize_cpu

    sizes = [
        ((1, 3, 128, 128), (256, 256)),
        ((1, 3, 256, 256), (1024, 1024)),
        ((8, 64, 64, 64), (128, 128)),
        ((1, 3, 540, 960), (720, 1280)),
        ((8, 64, 128, 128), (200, 200)),
        ((2, 16, 256, 256), (96, 96)),
        ((4, 1, 60000, 8), (2, 4000)),  # a strong downscale: four input rows read of each 30000
    ]
    for shape, (ho, wo) in sizes[:2] if quick else sizes:
        x = torch.randn(*shape)
        out = torch.empty(shape[0], shape[1], ho, wo)
        row(
            "DynamicResize (bicubic)",
            f"{'x'.join(map(str, shape))} -> {ho}x{wo}",
            "native kernel alone",
            timeit(lambda: _resize_cpu.resize_bicubic(x, ho, wo, out=out), reps),
            "upsample_bicubic2d.out",
            timeit(lambda: torch.ops.aten.upsample_bicubic2d.out(x, [ho, wo], False, None, None, out=out), reps),
        )


def bench_grid_channels(quick: bool, reps: int) -> None:
    import torch.nn.functional as F

    from opbridge.ops import _gridsample_cpu

    shapes = [
        (1, 1, 128),
        (1, 2, 128),
        (1, 3, 128),
        (1, 4, 128),
        (1, 8, 128),
        (1, 16, 64),
        (1, 16, 128),
        (2, 64, 128),
    ]
    for mode, name in GRID_MODES:
        for n, c, h in shapes[:4] if quick else shapes:
            x, grid = torch.randn(n, c, h, h), torch.rand(n, h, h, 2) * 2.2 - 1.1
            row(
                "grid_sampler " + name,
                f"{n}x{c}x{h}x{h}",
                "native kernel alone" + ("" if _gridsample_cpu.applies(x, grid, mode) else " (ATen runs)"),
                timeit(lambda: _gridsample_cpu.grid_sample(x, grid, mode), 3 * reps),
                "F.grid_sample",
                timeit(lambda: F.grid_sample(x, grid, mode=name, align_corners=False), 3 * reps),
            )


def bench_grid_planes(quick: bool, reps: int) -> None:
    """The native kernel's two ways to read an image of few channels, called on the extension
    directly: its planes, eight points per vector with the taps gathered (AVX2), against the
    channels-last copy and its tiles (the measurement behind ``planes_max`` in _cpu_kernels.c), and
    with one channel against F.grid_sample."""
    import torch.nn.functional as F

    from opbridge.ops import _cpu_native

    module = _cpu_native.require()
    if not module.planes_apply(1, 8, 8, 0):
        print("grid-planes: skipped, this CPU has no AVX2 and FMA (the planes path needs them)", flush=True)
        return
    for mode, name in GRID_MODES:
        for c, h in [(1, 128), (2, 128), (3, 128)] if quick else [(c, h) for h in (64, 128) for c in (1, 2, 3, 4)]:
            x = torch.randn(c, h * h).numpy()
            theta = torch.tensor([[[0.9, -0.2, 0.05], [0.25, 0.95, -0.1]]])
            grid = F.affine_grid(theta, [1, 1, h, h], align_corners=False).reshape(-1, 2).contiguous().numpy()
            p, stride = grid.shape[0], module.channel_stride(c)
            xt, out = np.empty((h * h + 1, stride), np.float32), np.empty((c, p), np.float32)

            def channels_last() -> None:
                module.to_channels_last(x, xt, c, stride, h * h, 0, h * h)
                module.grid_sample(xt, grid, out, c, stride, h, h, p, mode, 0, False, 0, p)

            planes = timeit(
                lambda: module.grid_sample_planes(x, grid, out, c, h, h, p, mode, 0, False, 0, p), 10 * reps
            )
            shape = f"1x{c}x{h}x{h} affine"
            label = "planes" + (" (the default)" if module.planes_apply(c, h, h, mode) else "")
            row("grid_sampler " + name, shape, label, planes, "channels-last copy", timeit(channels_last, 10 * reps))
            if c == 1:
                xt_, gt_ = torch.from_numpy(x).view(1, 1, h, h), torch.from_numpy(grid).view(1, h, h, 2)
                aten = timeit(lambda: F.grid_sample(xt_, gt_, mode=name, align_corners=False), 10 * reps)
                row("grid_sampler " + name, shape, label, planes, "F.grid_sample", aten)


def bench_grid_wide(quick: bool, reps: int) -> None:
    """grid_sample on feature maps of many channels: the native kernel alone with its channel stride
    (``channel_stride``: padded past multiples of 256 bytes) and with each pixel's C values side by
    side (the plain stride), against F.grid_sample."""
    import torch.nn.functional as F

    from opbridge.ops import _gridsample_cpu

    padded = _gridsample_cpu.channel_stride
    shapes = [(1, 128, 64), (1, 256, 32), (1, 256, 64), (4, 256, 16), (1, 512, 32)]
    for mode, name in GRID_MODES:
        for n, c, h in shapes[:2] if quick else shapes:
            x, grid = torch.randn(n, c, h, h), torch.rand(n, h, h, 2) * 2.2 - 1.1
            base = timeit(lambda: F.grid_sample(x, grid, mode=name, align_corners=False), 3 * reps)
            shape = f"{n}x{c}x{h}x{h}"
            label = f"native kernel, stride {padded(c)}"
            ms = timeit(lambda: _gridsample_cpu.grid_sample(x, grid, mode), 3 * reps)
            row("grid_sampler " + name, shape, label, ms, "F.grid_sample", base)
            try:
                _gridsample_cpu.channel_stride = lambda k: padded(k) if k <= 8 else k
                ms = timeit(lambda: _gridsample_cpu.grid_sample(x, grid, mode), 3 * reps)
            finally:
                _gridsample_cpu.channel_stride = padded
            row("grid_sampler " + name, shape, f"native kernel, stride {c}", ms, "F.grid_sample", base)


def bench_grid_session(quick: bool, reps: int) -> None:
    """One grid_sampler node in opbridge's session: its native kernel (no Python per run; also below
    its channel thresholds, forced) and its Python kernel, against F.grid_sample."""
    import onnxruntime as ort
    import torch.nn.functional as F
    from onnx import TensorProto, helper

    from opbridge.onnxruntime import InferenceSession
    from opbridge.ops import _cpu_native, _gridsample_cpu

    module = _cpu_native.require()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    shapes = [(1, 1, 128), (1, 2, 128), (1, 3, 128), (1, 4, 128), (1, 16, 64), (2, 64, 128)]
    for mode, name in GRID_MODES:
        node = helper.make_node(
            "grid_sampler", ["x", "g"], ["y"], domain="mmdeploy", interpolation_mode=mode, padding_mode=0
        )
        graph = helper.make_graph(
            [node],
            "grid",
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in ("x", "g")],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mmdeploy", 1)]
        )
        kept = dict(_gridsample_cpu.NATIVE_MIN_CHANNELS)
        try:
            _gridsample_cpu.NATIVE_MIN_CHANNELS.update({0: 1, 1: 1, 2: 1})
            forced = InferenceSession(model, sess_options=opts)
        finally:
            _gridsample_cpu.NATIVE_MIN_CHANNELS.update(kept)
        python = InferenceSession(model, sess_options=opts, native=False)
        for n, c, h in shapes[:3] if quick else shapes:
            x, grid = torch.randn(n, c, h, h), affine_grid(n, h, h)
            feeds = {"x": x.numpy(), "g": grid.numpy()}
            base = timeit(lambda: F.grid_sample(x, grid, mode=name, align_corners=False), reps)
            below = c < kept[mode] and not module.planes_apply(c, h, h, mode)  # else the planes path takes it
            native = "native kernel" + (" (below its threshold)" if below else "")
            for label, sess in ((f"session, {native}", forced), ("session, Python kernel", python)):
                row(
                    f"grid_sampler {name}",
                    f"{n}x{c}x{h}x{h} affine",
                    label,
                    timeit(lambda: sess.run(None, feeds), reps),
                    "F.grid_sample",
                    base,
                )


def bench_dcn(quick: bool, reps: int) -> None:
    from onnx import helper

    for n, c, h in [(1, 16, 32), (1, 64, 64)][: 1 if quick else 2]:
        g = torch.Generator().manual_seed(0)
        x, off = (
            torch.randn(n, c, h, h, generator=g),
            torch.randn(n, 18, h, h, generator=g),
        )
        mask, w, b = (
            torch.rand(n, 9, h, h, generator=g),
            torch.randn(c, c, 3, 3, generator=g),
            torch.randn(c, generator=g),
        )
        attrs = {
            "stride": [1, 1],
            "padding": [1, 1],
            "dilation": [1, 1],
            "groups": 1,
            "deform_groups": 1,
        }
        ref = timeit(
            lambda: d.ModulatedDeformConv2d.run_reference(x, off, mask, w, b, **attrs),
            reps,
        )
        arrays = [t.numpy() for t in (x, off, mask, w, b)]
        shape = f"{n}x{c}x{h}x{h} 3x3->{c}"
        row(
            "MMCVModulatedDeformConv2d",
            shape,
            "kernel (torch CPU)",
            timeit(lambda: d.ModulatedDeformConv2d.kernel(x, off, mask, w, b, **attrs), reps),
            "reference",
            ref,
        )
        node = helper.make_node("DeformConv", ["x", "w", "o", "b", "m"], ["y"], pads=[1, 1, 1, 1])
        run = ort_session([node], dict(zip("xomwb", arrays)), 19)
        row(
            "MMCVModulatedDeformConv2d",
            shape,
            "ORT DeformConv-19 (opset >= 19 only)",
            timeit(run, reps),
            "reference",
            ref,
        )
        for label, fn in bridged(d.ModulatedDeformConv2d, (x, off, mask, w, b), attrs):
            row(
                "MMCVModulatedDeformConv2d",
                shape,
                label,
                timeit(fn, reps),
                "reference",
                ref,
            )


def _rois(n: int, extent: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * extent
    side = torch.exp(torch.empty(n, 2).uniform_(np.log(16), np.log(extent / 2), generator=g))
    return torch.cat([torch.zeros(n, 1), xy, xy + side], 1)


def bench_roi(quick: bool, reps: int) -> None:
    from onnx import helper

    from opbridge.ops import _detection_cpu

    for n_rois, c in [(100, 64), (300, 256)][: 1 if quick else 2]:
        feat, rois = torch.randn(1, c, 100, 168), _rois(n_rois, 400.0)
        attrs = {
            "output_height": 7,
            "output_width": 7,
            "spatial_scale": 0.25,
            "sampling_ratio": 2,
            "mode": "avg",
            "aligned": True,
        }
        ref = timeit(lambda: d.RoIAlign.run_reference(feat, rois, **attrs), max(1, reps // 2))
        shape = f"{n_rois} RoIs on 1x{c}x100x168"
        row(
            "MMCVRoiAlign",
            shape,
            "kernel (opbridge native)",
            timeit(lambda: d.RoIAlign.kernel(feat.numpy(), rois.numpy(), **attrs), reps),
            "reference",
            ref,
        )
        row(
            "MMCVRoiAlign",
            shape,
            "numpy kernel (without the extension)",
            timeit(lambda: _detection_cpu._roi_align_numpy(feat.numpy(), rois.numpy(), *attrs.values()), reps),
            "reference",
            ref,
        )
        node = helper.make_node(
            "RoiAlign",
            ["x", "r", "b"],
            ["y"],
            mode="avg",
            output_height=7,
            output_width=7,
            sampling_ratio=2,
            spatial_scale=0.25,
            coordinate_transformation_mode="half_pixel",
        )
        run = ort_session(
            [node],
            {
                "x": feat.numpy(),
                "r": rois[:, 1:].contiguous().numpy(),
                "b": rois[:, 0].long().numpy(),
            },
            16,
        )
        row(
            "MMCVRoiAlign",
            shape,
            "ORT RoiAlign-16 (avg only)",
            timeit(run, reps),
            "reference",
            ref,
        )
        for label, fn in bridged(d.RoIAlign, (feat, rois), attrs):
            row(
                "MMCVRoiAlign",
                shape,
                label,
                timeit(fn, reps),
                "reference",
                ref,
            )
        feats = [torch.randn(1, c, 400 // s, 672 // s) for s in (4, 8, 16, 32)]
        mattrs = {"sampling_ratio": 2}
        mref = timeit(
            lambda: d.MultiLevelRoiAlign.run_reference(rois, *feats, **mattrs),
            max(1, reps // 2),
        )
        arrays = [rois.numpy()] + [f.numpy() for f in feats]
        bound = d.MultiLevelRoiAlign.spec.bind_attributes(mattrs)
        row(
            "MMCVMultiLevelRoiAlign",
            f"{n_rois} RoIs, 4 levels, {c}ch",
            "kernel (opbridge native)",
            timeit(lambda: d.MultiLevelRoiAlign.kernel(*arrays, **bound), reps),
            "reference",
            mref,
        )


def bench_nms(quick: bool, reps: int) -> None:
    for b, n, c in [(1, 500, 10), (2, 1000, 20)][: 1 if quick else 2]:
        g = torch.Generator().manual_seed(0)
        xy = torch.rand(b, n, 1, 2, generator=g) * 500
        boxes = torch.cat([xy, xy + 16 + torch.rand(b, n, 1, 2, generator=g) * 150], -1)
        scores = torch.rand(b, n, c, generator=g)
        attrs = {"num_classes": c, "topk": 200, "keep_topk": 100}
        ref = timeit(lambda: d.BatchedNMS.run_reference(boxes, scores, **attrs), 1)
        bound = d.BatchedNMS.spec.bind_attributes(attrs)
        shape = f"{b}x{n} boxes, {c} classes, topk 200"
        row(
            "TRTBatchedNMS",
            shape,
            "kernel (numpy)",
            timeit(
                lambda: d.BatchedNMS.kernel(boxes.numpy(), scores.numpy(), **bound),
                reps,
            ),
            "reference",
            ref,
        )
        for label, fn in bridged(d.BatchedNMS, (boxes, scores), attrs):
            row(
                "TRTBatchedNMS",
                shape,
                label,
                timeit(fn, reps),
                "reference",
                ref,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument(
        "--only",
        default="resize,grid,dcn,roi,nms",
        help="comma-separated sections (also resize-kernel, grid-channels, grid-planes, grid-wide, grid-session)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads for torch and ONNX Runtime (default 1)",
    )
    args = parser.parse_args(argv)
    sections = {
        "resize": bench_resize,
        "resize-kernel": bench_resize_kernel,
        "grid": bench_grid,
        "grid-channels": bench_grid_channels,
        "grid-planes": bench_grid_planes,
        "grid-wide": bench_grid_wide,
        "grid-session": bench_grid_session,
        "dcn": bench_dcn,
        "roi": bench_roi,
        "nms": bench_nms,
    }
    only = args.only.split(",")
    unknown = [name for name in only if name and name not in sections]
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; valid: {', '.join(sections)}")
    global THREADS
    THREADS = args.threads
    torch.set_num_threads(args.threads)
    reps = 3 if args.quick else 7
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    for name, fn in sections.items():
        if name in only:
            fn(args.quick, reps)
    print("\n| op | shape | CPU path | ms | baseline | baseline ms | ratio |\n|---|---|---|---|---|---|---|")
    for op, shape, path, ms, base, base_ms in ROWS:
        print(f"| {op} | {shape} | {path} | {ms:.4f} | {base} | {base_ms:.4f} | {base_ms / ms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
