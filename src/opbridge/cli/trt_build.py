"""``opbridge trt-build MODEL.onnx -o MODEL.engine``: build a TensorRT engine with opbridge's plugins."""

from __future__ import annotations

import argparse

from opbridge.cli._common import add_ops_argument, parse_dims, user_files
from opbridge.errors import OpbridgeError

__all__ = ["add_parser", "parse_profile", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trt-build",
        help="build a TensorRT engine from an ONNX model, with plugins generated from the op specs",
        description="Exit codes: 0 engine built, 1 build failed (parser/builder errors shown), 2 usage error.",
    )
    p.add_argument("model", help="the .onnx model")
    p.add_argument("-o", "--output", required=True, help="where to write the serialized engine")
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="INPUT:MIN,OPT,MAX",
        help="shape range of a dynamic input, e.g. --profile input:1x3x64x64,1x3x256x256,4x3x512x512 (repeatable)",
    )
    p.add_argument("--in-process", action="store_true", help="build in this process (default: a child process)")
    add_ops_argument(p)
    p.set_defaults(run=run)


def parse_profile(text: str) -> tuple[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """``"x:1x3x8x8,1x3x16x16,2x3x32x32"`` -> ``("x", (min, opt, max))``."""
    name, sep, rest = text.rpartition(":")
    shapes = rest.split(",")
    if not sep or not name or len(shapes) != 3:
        raise OpbridgeError(f"--profile {text!r}: write INPUT:MIN,OPT,MAX with dims like 1x3x256x256.")
    lo, mid, hi = (parse_dims(s, f"--profile {name}") for s in shapes)
    return name, (lo, mid, hi)


def run(args: argparse.Namespace) -> int:
    from opbridge._files import prepare_output
    from opbridge._loading import load_ops
    from opbridge.tensorrt._build import _build_engine

    profiles: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    for item in args.profile:
        name, triple = parse_profile(item)
        if name in profiles:
            raise OpbridgeError(f"--profile {name}: given twice; give one MIN,OPT,MAX per input.")
        profiles[name] = triple
    # a bad path is named before the build (build_engine guards the model and its data files)
    prepare_output(args.output, protected=[f for f in user_files(args) if f != args.model])
    load_ops(args.ops)
    # usage errors name --profile and -o, not build_engine's arguments
    report = _build_engine(
        args.model, args.output, profiles=profiles, ops=args.ops, isolate=not args.in_process, timeout=600.0, cli=True
    )
    print(report.describe())
    return 0 if report.ok else 1
