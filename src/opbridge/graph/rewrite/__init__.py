"""``opbridge rewrite``: named pattern/check/rewrite rules that say why they did not match.

Rules run in order on a copy of the model; onnx-ir does the graph edits. The
result is checked (opbridge schemas registered, strict shape inference,
``onnx.checker.check_model(full_check=True)``) before anything is written, the
write is atomic, and the input file is never overwritten unless asked.

Example:
    >>> from onnx import helper, TensorProto
    >>> node = helper.make_node("MYSELU", ["x"], ["y"], name="act")
    >>> g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    ...                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    >>> report = rewrite_model(helper.make_model(g), ["legacy-domain"])
    >>> report.model.graph.node[0].domain, [str(o) for o in report.outcomes]
    ('opbridge.legacy', ["legacy-domain: rewrote act: moved to domain 'opbridge.legacy' (ops ['MYSELU'])"])
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbridge.graph.rewrite._base import Check, IRRule, RewriteError, RewriteRule, RuleOutcome
from opbridge.graph.rewrite.rules import FoldResizeScales, LegacyDomain, ReplaceOp, ResizeCubicToDynamicResize

if TYPE_CHECKING:
    import onnx

__all__ = [
    "RULES",
    "Check",
    "IRRule",
    "RewriteError",
    "RewriteReport",
    "RewriteRule",
    "RuleOutcome",
    "check_rewritten",
    "rewrite_file",
    "rewrite_model",
]

logger = logging.getLogger(__name__)

RULES: dict[str, type[RewriteRule]] = {
    rule.name: rule for rule in (ResizeCubicToDynamicResize, FoldResizeScales, ReplaceOp, LegacyDomain)
}


@dataclass
class RewriteReport:
    """The rewritten (and checked) model and what each rule did."""

    model: onnx.ModelProto
    outcomes: list[RuleOutcome] = field(default_factory=list)
    path: Path | None = None

    @property
    def changed(self) -> bool:
        return any(o.applied for o in self.outcomes)


def _attach_bodies(model: onnx.ModelProto) -> list[str]:
    """Attach the function bodies of opbridge ops the model now uses (when they have one)."""
    import opbridge
    from opbridge.functions import attach_functions

    used = {(n.domain, n.op_type) for n in model.graph.node}
    ops = [d for d in opbridge.all_ops() if (d.spec.domain, d.spec.name) in used]
    return attach_functions(model, ops)


#: protobuf serializes messages below 2 GiB only; larger models are checked through files
_PROTO_LIMIT = 2**31 - 2**24


def check_rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    """Strict shape inference and the full checker, with opbridge's schemas registered; the inferred model.

    A model of 2 GiB or more (its tensors in memory) is checked as files: written to a temporary
    folder with its tensors in an external data file, checked there, and read back.
    """
    import onnx

    import opbridge

    opbridge.register_onnx_schemas()
    try:
        if _too_large(model):
            return _check_as_files(model)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        onnx.checker.check_model(inferred, full_check=True)
    except RewriteError:
        raise
    except Exception as exc:
        raise RewriteError(f"the rewritten model is not valid, nothing was written: {exc}") from exc
    return inferred


def _too_large(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is too large for one protobuf message (whose size protobuf will not even count)."""
    try:
        return model.ByteSize() >= _PROTO_LIMIT
    except Exception:  # EncodeError: "Failed to serialize proto"
        return True


def _check_as_files(model: onnx.ModelProto) -> onnx.ModelProto:
    """:func:`check_rewritten` for a model too large for one protobuf message. ``model`` is left as it
    was (its tensors go out to the file and are read back); it is returned with the inferred value infos."""
    import shutil
    import tempfile

    import onnx
    from onnx.external_data_helper import convert_model_to_external_data, load_external_data_for_model

    folder = tempfile.mkdtemp(prefix="opbridge-check-")
    try:
        path = os.path.join(folder, "model.onnx")
        convert_model_to_external_data(
            model, all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024
        )
        try:
            onnx.save_model(model, path)
        finally:
            load_external_data_for_model(model, folder)  # the caller's model holds its tensors again
        inferred_path = os.path.join(folder, "inferred.onnx")
        try:
            onnx.shape_inference.infer_shapes_path(
                path, inferred_path, check_type=True, strict_mode=True, data_prop=True
            )
            onnx.checker.check_model(inferred_path, full_check=True)
        except Exception as exc:
            raise RewriteError(f"the rewritten model is not valid, nothing was written: {exc}") from exc
        light = onnx.load(inferred_path, load_external_data=False)
        del model.graph.value_info[:]
        model.graph.value_info.extend(light.graph.value_info)
        return model
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def rewrite_model(
    model: str | os.PathLike[str] | onnx.ModelProto,
    rules: Sequence[str] | str,
    options: Mapping[str, Any] | None = None,
    *,
    check: bool = True,
) -> RewriteReport:
    """Apply ``rules`` (names from :data:`RULES`) in order to a copy of ``model``.

    Args:
        model: a path or a loaded model (never modified).
        rules: rule names, e.g. ``["fold-resize-scales"]`` (or one name).
        options: rule options (``map``, ``rename``, ``scale_input``, ``domain``, ``version``).
        check: run :func:`check_rewritten` on the result.

    Raises:
        RewriteError: an unknown rule, or a result that fails the checks.
    """
    import onnx

    from opbridge.graph._model import load_model

    if isinstance(rules, str):  # one rule by name, not its letters
        rules = [rules]
    unknown = [r for r in rules if r not in RULES]
    if unknown or not rules:
        raise RewriteError(f"unknown rule(s) {unknown or '(none given)'}; choose from {', '.join(RULES)}.")
    # an option no chosen rule reads (a typo) would be dropped silently; empty ones are the CLI's defaults
    accepted = {"map", "rename"} | {k for r in rules for k in getattr(RULES[r], "options", {})}
    stray = sorted(k for k, v in (options or {}).items() if k not in accepted and v not in (None, [], ()))
    if stray:
        raise RewriteError(
            f"option(s) {stray} are not read by rule(s) {list(rules)}; they take {sorted(accepted - {'map', 'rename'})}"
            " (see opbridge rewrite --help)."
        )
    current = onnx.ModelProto()
    current.CopyFrom(load_model(model))
    outcomes: list[RuleOutcome] = []
    for name in rules:
        current, done = RULES[name]().apply(current, options or {})
        outcomes += done
        for o in done:
            logger.info("%s", o)
    if any(o.applied for o in outcomes):
        _attach_bodies(current)
        if check:
            current = check_rewritten(current)
    return RewriteReport(current, outcomes)


def rewrite_file(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str] | None,
    rules: Sequence[str],
    options: Mapping[str, Any] | None = None,
    *,
    in_place: bool = False,
) -> RewriteReport:
    """Rewrite the file ``source`` into ``output`` (atomically); ``in_place`` to replace ``source``.

    Raises:
        RewriteError: ``output`` is the input path without ``in_place``, or neither is given.
    """
    from opbridge._files import prepare_output
    from opbridge.export import save_model_atomic
    from opbridge.model_io import external_files

    src = Path(source)
    target: str | os.PathLike[str] = src
    if in_place:
        if output is not None and Path(output).resolve() != src.resolve():
            raise RewriteError("give either -o OUT or --in-place, not both.")
    else:
        if output is None:
            raise RewriteError("give -o OUT.onnx (or --in-place to replace the input).")
        if Path(output).exists() and Path(output).resolve() == src.resolve():
            raise RewriteError(f"{output} is the input file; write elsewhere or pass --in-place to replace it.")
        target = output  # as given: an empty path is named as such
    external = external_files(src)
    protected = [] if in_place else [src, *external]
    prepare_output(target, protected=protected)  # a bad path is named before the rules run
    data_name = f"{Path(target).name}.data"  # the output keeps its weights beside it, in <output>.data
    if external and in_place:
        data_name = _in_place_data_name(src, external)
    if external:
        prepare_output(Path(target).with_name(data_name), protected=protected)
    report = rewrite_model(src, rules, options)
    if report.changed:
        if external:
            report.path = _save_with_external_data(report.model, target, protected, data_name)
        else:
            report.path = save_model_atomic(report.model, target, protected=protected)
    return report


def _in_place_data_name(source: Path, external: Sequence[Path]) -> str:
    """The data file an in-place rewrite of ``source`` writes: the one file the model keeps its tensors
    in (beside it), else ``<source>.data``, which must then be free or one of the model's own files:
    an unrelated file of that name is not overwritten."""
    if len(external) == 1 and external[0].parent.resolve() == source.parent.resolve():
        return external[0].name
    data = source.with_name(f"{source.name}.data")
    own = any(data.exists() and f.exists() and os.path.samefile(data, f) for f in external)
    if data.exists() and not own:
        raise RewriteError(
            f"{data} exists and is not one of {source.name}'s data files ({', '.join(str(f) for f in external)}), "
            "which an in-place rewrite would write there; move it away, or write the result elsewhere with -o."
        )
    return data.name


def _save_with_external_data(
    model: onnx.ModelProto, target: str | os.PathLike[str], protected: Sequence[Path], data_name: str
) -> Path:
    """Write ``model`` as the input was laid out: the graph in ``target``, its tensors of 1 KiB or more
    in one external data file ``data_name`` beside it. Both are written to a temporary folder
    there, then moved into place, the data file first."""
    import shutil
    import tempfile

    import onnx
    from onnx.external_data_helper import convert_model_to_external_data

    from opbridge._files import _mode_for, prepare_output

    path = prepare_output(target, protected=protected, create=True)
    data = prepare_output(path.with_name(data_name), protected=protected, create=True)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # the report keeps its model with the tensors in it
    convert_model_to_external_data(copy, all_tensors_to_one_file=True, location=data.name, size_threshold=1024)
    modes = (_mode_for(path), _mode_for(data))
    folder = tempfile.mkdtemp(prefix=".opbridge-rewrite-", dir=path.parent)
    try:
        staged = Path(folder) / path.name
        onnx.save_model(copy, staged)
        staged_data = Path(folder) / data.name
        os.chmod(staged, modes[0])
        if staged_data.exists():  # (every tensor under the size threshold: nothing to put beside it)
            os.chmod(staged_data, modes[1])
            os.replace(staged_data, data)
        os.replace(staged, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return path
