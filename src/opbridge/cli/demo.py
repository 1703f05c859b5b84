"""``opbridge demo``: export the seed models both ways and verify them on every installed backend."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opbridge.cli._common import print_json_and_table
from opbridge.cli.verify import _Progress

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="export the built-in seed models with both exporters and verify them on every backend",
        description="Export the four seed models with the dynamo and TorchScript exporters, run them on "
        "every installed backend at the export shape and two other shapes, and compare with PyTorch. "
        "Needs no network and no arguments.",
    )
    p.add_argument("--quick", action="store_true", help="the export shape and one other shape only")
    p.add_argument(
        "--model", action="append", default=[], metavar="NAME", help="seed model to run (repeatable; default all)"
    )
    p.add_argument(
        "--exporter",
        action="append",
        default=[],
        choices=("dynamo", "torchscript"),
        help="exporter (repeatable; default both)",
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME",
        help="backend (repeatable; default every installed one)",
    )
    p.add_argument("--keep", metavar="DIR", default=None, help="write the exported models into DIR and keep them")
    p.add_argument(
        "--json",
        metavar="FILE",
        default=None,
        help="write every verify record as a JSON list to FILE ('-': stdout, the table to stderr); the records' "
        "model paths are those of --keep, or of a temporary folder removed at the end",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from opbridge._files import prepare_output
    from opbridge.demo import run_demo
    from opbridge.verify import write_json_atomic

    if args.json not in (None, "-"):
        prepare_output(args.json)  # a bad path is named before the run
        if args.keep:  # (and one the run writes a model to: found before the run, not after it)
            from opbridge.demo import EXPORTERS
            from opbridge.errors import OutputPathError
            from opbridge.examples.seeds import SEED_MODELS

            models = args.model or [m.name for m in SEED_MODELS]
            to_keep = {
                (Path(args.keep) / f"{m}_{e}.onnx{tail}").resolve()
                for m in models
                for e in args.exporter or EXPORTERS
                for tail in ("", ".data")
            }
            if Path(args.json).resolve() in to_keep:
                raise OutputPathError(
                    f"--json {args.json}: demo writes one of its exported models there (--keep {args.keep}); "
                    "give the records another path."
                )
    progress = _Progress(not args.quiet)
    try:
        result = run_demo(
            args.model or None,
            args.exporter or None,
            args.backend or None,
            quick=args.quick,
            workdir=args.keep,
            progress=progress,
        )
    finally:
        progress.done()
    if args.json == "-":
        print_json_and_table([r.to_dict() for r in result.records], result.table())
        return result.exit_code
    written = None
    if args.json is not None:  # before any output can fail, and never over a model the run kept
        kept = [r.model for r in result.records if Path(r.model).is_file()]
        written = write_json_atomic(args.json, [r.to_dict() for r in result.records], protected=kept)
    print(result.table())
    if written is not None:
        print(f"records written to {written}", file=sys.stderr)
    return result.exit_code
