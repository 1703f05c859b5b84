"""``opbridge rewrite MODEL -o OUT --rule NAME ...``: apply named rewrite rules; the result is checked first."""

from __future__ import annotations

import argparse

from opbridge.cli._common import add_ops_argument, user_files
from opbridge.errors import OpbridgeError

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    from opbridge.graph.rewrite import RULES

    p = sub.add_parser(
        "rewrite",
        help="rewrite an ONNX model with named rules",
        description="Exit codes: 0 model written, 1 no rule applied (nothing written), 2 usage or load error.",
    )
    p.add_argument("model", help="path of the .onnx file (never modified without --in-place)")
    p.add_argument("-o", "--output", default=None, help="output .onnx path")
    p.add_argument("--in-place", action="store_true", help="replace the input file (atomically)")
    p.add_argument(
        "--rule",
        action="append",
        default=[],
        choices=sorted(RULES),
        required=True,
        help="rule to apply, in order (repeatable): " + "; ".join(f"{n}: {r.summary}" for n, r in RULES.items()),
    )
    p.add_argument(
        "--map", action="append", default=[], metavar="OLD=DOMAIN::NEW", help="replace-op: op to swap (repeatable)"
    )
    p.add_argument(
        "--rename", action="append", default=[], metavar="OLD=NEW", help="replace-op: attribute rename (repeatable)"
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="rule option, e.g. scale_input=factor (resize-cubic-to-dynamic-resize), domain=acme (legacy-domain)",
    )
    add_ops_argument(p)
    p.set_defaults(run=run)


def _options(args: argparse.Namespace) -> dict[str, object]:
    options: dict[str, object] = {"map": args.map, "rename": args.rename}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise OpbridgeError(f"--option {item!r}: write KEY=VALUE")
        if not value.strip():
            raise OpbridgeError(
                f"--option {item!r} gives {key} no value; give one (e.g. {key}=NAME), or leave the option out for "
                "the rule's default."
            )
        if key in options and key not in ("map", "rename"):
            raise OpbridgeError(
                f"--option {key}= is given twice ({key}={options[key]} and {item}); give each option once."
            )
        options[key] = value
    return options


def run(args: argparse.Namespace) -> int:
    from opbridge._loading import load_ops
    from opbridge.graph.rewrite import rewrite_file

    load_ops(args.ops)
    if args.output is not None:  # (rewrite_file guards the model's own files)
        from opbridge._files import prepare_output

        prepare_output(args.output, protected=[o for o in user_files(args) if o != args.model])
    report = rewrite_file(args.model, args.output, args.rule, _options(args), in_place=args.in_place)
    for outcome in report.outcomes:
        print(outcome)
    if report.path is None:
        print("no rule applied; nothing written")
        return 1
    print(f"wrote {report.path}")
    return 0
