"""``opbridge export FACTORY -o OUT.onnx``: export a model factory's model with both or one exporter."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from opbridge._loading import load_factory, load_ops
from opbridge.cli._common import FlagRule, add_ops_argument, arguments_as_flags, json_for_stdout, user_files
from opbridge.errors import OpbridgeError

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a model (from a factory) to ONNX with its custom ops")
    p.add_argument("reference", help="model factory: path/to/file.py:factory or package.module:factory")
    p.add_argument("-o", "--output", required=True, help="output .onnx path")
    p.add_argument(
        "--exporter", choices=("dynamo", "torchscript"), default="dynamo", help="PyTorch's exporter (default dynamo)"
    )
    p.add_argument(
        "--opset", type=int, default=None, help="default-domain opset version (default: dynamo 20, torchscript 17)"
    )
    p.add_argument("--input-names", nargs="+", default=None, help="graph input names (default: forward's parameters)")
    p.add_argument("--output-names", nargs="+", default=None, help="graph output names (default: the exporter's)")
    p.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="INPUT:AXIS=NAME[,AXIS=NAME]",
        help="dynamic axes, e.g. --dynamic x:0=batch,2=height (repeatable)",
    )
    p.add_argument("--no-functions", action="store_true", help="do not attach ONNX function bodies")
    p.add_argument(
        "--json", action="store_true", help="print the result as JSON (path, exporter, custom nodes, warnings)"
    )
    add_ops_argument(p)
    p.set_defaults(run=run)


def _parse_dynamic(items: list[str]) -> dict[str, dict[int, str]]:
    axes: dict[str, dict[int, str]] = {}
    for item in items:
        name, sep, rest = item.partition(":")
        if not sep or not rest:
            raise OpbridgeError(f"--dynamic {item!r}: write INPUT:AXIS=NAME[,AXIS=NAME]")
        for pair in rest.split(","):
            axis, eq, dim = pair.partition("=")
            if not eq or not axis.strip().isdigit() or not dim:
                raise OpbridgeError(f"--dynamic {item!r}: write INPUT:AXIS=NAME[,AXIS=NAME]")
            given = axes.setdefault(name, {})
            if given.get(int(axis), dim) != dim:
                raise OpbridgeError(
                    f"--dynamic {item!r}: axis {int(axis)} of {name!r} is named {given[int(axis)]!r} already; name it once."
                )
            given[int(axis)] = dim
    return axes


# export()'s arguments that this command sets from flags, and the flags
_FLAG_OF = {"dynamic_axes": "--dynamic", "input_names": "--input-names", "output_names": "--output-names"}
_FLAGS: list[FlagRule] = [(rf"(?<![\w-]){name}(?![\w-])", flag) for name, flag in _FLAG_OF.items()]


def run(args: argparse.Namespace) -> int:
    import opbridge
    from opbridge._files import prepare_output

    prepare_output(args.output, protected=user_files(args))  # named before the export
    # with --json, stdout holds the JSON alone: what the user's modules print goes to stderr
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        load_ops(args.ops)
        model, inputs = load_factory(args.reference, label="factory")
        with arguments_as_flags(_FLAGS):  # the API's argument names, as this command's flags
            result = opbridge.export(
                model,
                inputs,
                args.output,
                exporter=args.exporter,
                opset_version=args.opset,
                input_names=args.input_names,
                output_names=args.output_names,
                dynamic_axes=_parse_dynamic(args.dynamic) or None,
                functions=not args.no_functions,
            )
    if args.json:
        record = {
            "path": str(result.path),
            "exporter": result.exporter,
            "custom_nodes": [{"name": n.name, "domain": n.domain, "op_type": n.op_type} for n in result.custom_nodes],
            "warnings": [str(w) for w in result.warnings],
        }
        print(json_for_stdout(json.dumps(record, indent=2, ensure_ascii=False)))
        return 0
    print(result.summary())
    for w in result.warnings:
        print(f"  warning: {w}")
    return 0
