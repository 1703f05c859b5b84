"""``opbridge demo``: the seed models, exported both ways, verified on every backend.

With no network and no arguments: each model of
:data:`opbridge.examples.seeds.SEED_MODELS` is exported with the dynamo and
the TorchScript exporter, then :func:`opbridge.verify` runs it on every
installed backend at the export shape and at the model's two further shapes,
against the PyTorch model. One table sums it up: model x exporter x backend x
shape, with the largest absolute error and the verdict.

Example:
    >>> from opbridge.demo import run_demo
    >>> result = run_demo(models=["myselu"], exporters=["torchscript"], quick=True)  # doctest: +SKIP
    >>> result.exit_code  # doctest: +SKIP
    0
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opbridge.errors import OpbridgeError, OutputPathError

__all__ = ["DemoResult", "DemoRow", "run_demo"]

logger = logging.getLogger(__name__)

EXPORTERS: tuple[str, ...] = ("dynamo", "torchscript")


@dataclass(frozen=True)
class DemoRow:
    """One line of the demo table."""

    model: str
    exporter: str
    backend: str
    shape: str
    max_abs: float | None
    result: str  # PASS | FAIL | ERROR
    note: str = ""


@dataclass
class DemoResult:
    """The demo's rows, the verify records behind them and the time it took."""

    rows: list[DemoRow] = field(default_factory=list)
    records: list[Any] = field(default_factory=list)
    skipped_backends: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 all passed, 1 a mismatch, 2 an error (export or backend)."""
        if not self.rows or any(r.result == "ERROR" for r in self.rows):
            return 2
        return 1 if any(r.result == "FAIL" for r in self.rows) else 0

    def table(self) -> str:
        header = ("model", "exporter", "backend", "shape", "max abs err", "result")
        body = [
            (r.model, r.exporter, r.backend, r.shape, "-" if r.max_abs is None else f"{r.max_abs:.3g}", r.result)
            for r in self.rows
        ]
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines = [fmt.format(*header).rstrip(), *(fmt.format(*row).rstrip() for row in body)]
        notes = sorted({f"{r.model}/{r.exporter}/{r.backend}: {r.note}" for r in self.rows if r.note})
        lines += [f"  {n}" for n in notes]
        for name, why in self.skipped_backends.items():
            lines.append(f"{name}: not installed ({why})")
        passed = sum(r.result == "PASS" for r in self.rows)
        verdict = {0: "PASS", 1: "FAIL", 2: "ERROR"}[self.exit_code]
        lines.append(f"{verdict}: {passed} of {len(self.rows)} runs within tolerance in {self.seconds:.1f} s")
        return "\n".join(lines)


def _shape_label(kind: str, shapes: dict[str, tuple[int, ...]]) -> str:
    return f"{kind} " + ",".join("x".join(str(d) for d in dims) for dims in shapes.values())


def run_demo(
    models: Sequence[str] | None = None,
    exporters: Sequence[str] | None = None,
    backends: Sequence[str] | None = None,
    *,
    quick: bool = False,
    workdir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> DemoResult:
    """Export and verify the seed models; see the module doc.

    Args:
        models: seed model names (default: all four).
        exporters: ``"dynamo"`` and/or ``"torchscript"`` (default: both).
        backends: backend names (default: every installed one).
        quick: the export shape and one further shape only (instead of two).
        workdir: where the exported models go (default: a temporary folder, removed after).
        progress: called with a short message at each step.
    """
    import opbridge
    from opbridge.backends import get_backend
    from opbridge.examples.seeds import SEED_MODELS

    say = progress or (lambda _m: None)
    if workdir is not None and not os.fspath(workdir).strip():
        raise OutputPathError("--keep is empty; give a folder to keep the models in (it is created where missing).")
    by_name = {m.name: m for m in SEED_MODELS}
    chosen = list(models) if models else list(by_name)
    unknown = [m for m in chosen if m not in by_name]
    if unknown:
        raise OpbridgeError(f"demo: unknown model {unknown[0]!r}; choose from {', '.join(by_name)}.")
    exps = list(exporters) if exporters else list(EXPORTERS)
    bad = [e for e in exps if e not in EXPORTERS]
    if bad:
        raise OpbridgeError(f"demo: unknown exporter {bad[0]!r}; choose from {', '.join(EXPORTERS)}.")
    result = DemoResult()
    names = list(backends) if backends else None  # None: every installed backend, as verify picks them
    for name in names or ():  # (named before the first export)
        get_backend(name)
        if name == "torch":
            raise OpbridgeError(
                "demo: backend 'torch' is the PyTorch model every backend is compared with, which demo always runs, "
                "not a backend to compare: leave it out of --backend."
            )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="opbridge_demo_") as tmp:
        root = Path(workdir) if workdir is not None else Path(tmp)
        if root.exists() and not root.is_dir():
            raise OutputPathError(f"{root} is a file; give --keep a folder (it is created where missing).")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputPathError(
                f"cannot create the folder {root} for --keep: {exc.strerror or exc}; give a folder that can be written."
            ) from None
        if not os.access(root, os.W_OK | os.X_OK):
            raise OutputPathError(f"cannot write in {root} (--keep): no permission; give a folder that can be written.")
        for seed in (by_name[m] for m in chosen):
            for exporter in exps:
                say(f"{seed.name}: exporting with {exporter}")
                model, args = seed.factory()
                extra: dict[str, Any] = (
                    {"dynamic_shapes": seed.dynamic_shapes()}
                    if exporter == "dynamo"
                    else {"dynamic_axes": seed.dynamic_axes()}
                )
                path = root / f"{seed.name}_{exporter}.onnx"
                try:
                    opbridge.export(
                        model,
                        args,
                        path,
                        exporter=exporter,  # type: ignore[arg-type]
                        input_names=seed.input_names,
                        output_names=seed.output_names,
                        **extra,
                    )
                except Exception as exc:
                    note = f"export failed: {' '.join(str(exc).split())[:300]}"
                    result.rows.append(DemoRow(seed.name, exporter, "-", "-", None, "ERROR", note))
                    continue
                example = {n: tuple(int(d) for d in a.shape) for n, a in zip(seed.input_names, args)}
                extra_sets = list(seed.shapes[:1] if quick else seed.shapes)
                record = opbridge.verify(
                    path,
                    (model, args),
                    backends=names,
                    shapes=[example, *extra_sets],
                    progress=_prefixed(say, f"{seed.name} ({exporter})"),
                )
                result.records.append(record)
                _rows(result, seed.name, exporter, record)
                for b in record.backends:
                    if b.status == "not installed":
                        result.skipped_backends.setdefault(b.name, b.message)
    result.seconds = time.perf_counter() - start
    return result


def _prefixed(say: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    def report(message: str) -> None:
        say(f"{prefix}: {message}")

    return report


def _rows(result: DemoResult, model: str, exporter: str, record: Any) -> None:
    for b in record.backends:
        if b.status in ("error", "unavailable"):
            result.rows.append(DemoRow(model, exporter, b.name, "-", None, "ERROR", b.message))
    for run in record.runs:
        kind = "export" if run.shape_set == 0 else f"shape {run.shape_set + 1}"
        label = _shape_label(kind, record.shape_sets[run.shape_set])
        if run.status == "error":
            result.rows.append(DemoRow(model, exporter, run.backend, label, None, "ERROR", run.error))
            continue
        failed = [o for o in run.outputs if not o.passed]
        note = "; ".join(f"{o.name}: {o.reason}" for o in failed)
        result.rows.append(
            DemoRow(model, exporter, run.backend, label, run.max_abs, "PASS" if not failed else "FAIL", note)
        )
