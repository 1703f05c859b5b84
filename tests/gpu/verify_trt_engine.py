"""Run a TensorRT engine built by ``opbridge trt-build`` and compare it with the PyTorch model.

For a machine with NVIDIA TensorRT (``import tensorrt``) and a CUDA GPU. It registers
opbridge's generated plugins (their ``enqueue`` runs the ops' GPU kernels), runs the
engine on the factory's example inputs, or on the seed's extra shapes with ``--seed``,
and compares every output with the PyTorch model: ``|trt - torch| <= atol + rtol * |torch|``.

Usage:
    python tests/gpu/verify_trt_engine.py ENGINE --reference opbridge.examples.seeds:super_resolution_net \
        [--ops my_ops.py] [--seed super_resolution] [--rtol 1e-3 --atol 1e-5]
Exit code 0 when every output matches.

Not run in opbridge's own checks: no machine there has a TensorRT runtime for a GPU it has.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from opbridge._loading import load_factory, load_ops


def run_engine(engine_bytes: bytes, inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run the engine once; ``inputs`` in the engine's input order. Returns outputs by name."""
    from opbridge.errors import OpbridgeError
    from opbridge.tensorrt import deserialize_engine, load_tensorrt

    trt, backend = load_tensorrt()
    if backend != "tensorrt":
        raise SystemExit(f"this needs NVIDIA TensorRT ('import tensorrt'); found only {backend}")
    try:
        engine = deserialize_engine(engine_bytes)  # (the plugins of the ops loaded so far registered first)
    except OpbridgeError as exc:
        raise SystemExit(str(exc)) from None
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    in_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    if len(in_names) != len(inputs):
        raise SystemExit(f"the engine takes {len(in_names)} inputs {in_names}, the factory gave {len(inputs)}")
    to_torch = {trt.float32: torch.float32, trt.float16: torch.float16, trt.int32: torch.int32, trt.int64: torch.int64}
    keep = []
    for name, tensor in zip(in_names, inputs):
        t = tensor.to("cuda", to_torch[engine.get_tensor_dtype(name)]).contiguous()
        keep.append(t)
        context.set_input_shape(name, tuple(t.shape))
        context.set_tensor_address(name, t.data_ptr())
    outputs: dict[str, torch.Tensor] = {}
    for name in names:
        if name in in_names:
            continue
        out = torch.empty(
            tuple(context.get_tensor_shape(name)), dtype=to_torch[engine.get_tensor_dtype(name)], device="cuda"
        )
        outputs[name] = out
        context.set_tensor_address(name, out.data_ptr())
    stream = torch.cuda.current_stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise SystemExit("execute_async_v3 failed (see TensorRT's log above)")
    stream.synchronize()
    return outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine")
    parser.add_argument("--reference", required=True, help="model factory, file.py:fn or module:fn")
    parser.add_argument("--ops", action="append", default=[])
    parser.add_argument("--seed", default=None, help="a seed model name: also run its extra input shapes")
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--atol", type=float, default=1e-5)
    args = parser.parse_args()
    load_ops(args.ops)
    model, example = load_factory(args.reference)
    input_sets: list[tuple[Any, ...]] = [example]
    if args.seed:
        from opbridge.examples.seeds import SEED_MODELS

        seed = next(s for s in SEED_MODELS if s.name == args.seed)
        g = torch.Generator().manual_seed(0)
        for shapes in seed.shapes:
            input_sets.append(tuple(torch.rand(shapes[n], generator=g) for n in seed.input_names))
    blob = Path(args.engine).read_bytes()
    failures = 0
    for inputs in input_sets:
        with torch.no_grad():
            expected = model(*inputs)
        expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
        got = list(run_engine(blob, list(inputs)).values())
        for i, (g_out, e_out) in enumerate(zip(got, expected)):
            e_out = e_out.to(g_out.device, torch.float32)
            diff = (g_out.float() - e_out).abs()
            ok = g_out.shape == e_out.shape and bool(torch.all(diff <= args.atol + args.rtol * e_out.abs()))
            failures += not ok
            shapes = " ".join("x".join(map(str, t.shape)) for t in inputs)
            print(
                f"inputs {shapes} output {i} {tuple(g_out.shape)}: max abs err {float(diff.max()):.3g} "
                f"{'ok' if ok else 'MISMATCH'} (rtol {args.rtol:g}, atol {args.atol:g})"
            )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
