"""``opbridge rewrite``: named pattern/check/rewrite rules that say why they did not match.

Rules run in order on a copy of the model; onnx-ir does the graph edits. The
result is checked (opbridge schemas registered, strict shape inference,
``onnx.checker.check_model(full_check=True)``) before anything is written, the
write is atomic, and the input file is never overwritten unless asked. The rules
and the checks see the graph without the data of its weights (tensors of 1 MiB or
more), which are neither copied nor converted: a rewrite of a file holds its weights
about once.

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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbridge.graph.rewrite._base import Check, IRRule, RewriteError, RewriteRule, RuleOutcome
from opbridge.graph.rewrite.rules import FoldResizeScales, LegacyDomain, ReplaceOp, ResizeCubicToDynamicResize
from opbridge.model_io import (
    approximate_size,
    infer_and_check_as_files,
    restore_tensors,
    strip_tensors,
    too_large,
)

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
    from opbridge.model_io import walk_nodes

    used = {(n.domain, n.op_type) for n in walk_nodes(model.graph.node)}  # (If/Loop/Scan bodies too)
    ops = [d for d in opbridge.all_ops() if (d.spec.domain, d.spec.name) in used]
    return attach_functions(model, ops)


#: the size from which check_rewritten checks a model through files rather than in memory
CHECK_AS_FILES_BYTES = 16 << 20

#: initializers of this many bytes or more are left out of what the rules and checks read (the
#: rules read shapes, scales and other small constants)
HELD_TENSOR_BYTES = 1 << 20


def check_rewritten(model: onnx.ModelProto, shapeless: Collection[str] = ()) -> onnx.ModelProto:
    """Strict shape inference and the full checker, with opbridge's schemas registered; the inferred model.

    ``shapeless``: graph outputs the model had no shape for before it was rewritten (the checker requires
    one, ONNX Runtime does not); those that shape inference gives none either are left out of the checker's
    view rather than refused.

    A model of 16 MiB or more (its tensors in memory) is checked as files: its graph written to a
    temporary folder without the data of its tensors (:func:`opbridge.model_io.infer_and_check_as_files`),
    checked there, and its inferred value infos read back (in memory, inference and the checker would
    each hold copies of every tensor; one of 2 GiB or more cannot even be serialized).
    """
    import onnx

    import opbridge

    opbridge.register_onnx_schemas()
    inferred = model
    try:
        if too_large(model) or approximate_size(model) >= CHECK_AS_FILES_BYTES:
            return _check_as_files(model, shapeless)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        kept = _set_aside_outputs(inferred, shapeless)
        try:
            onnx.checker.check_model(inferred, full_check=True)
        finally:
            del inferred.graph.output[:]
            inferred.graph.output.extend(kept)
    except RewriteError:
        raise
    except Exception as exc:
        raise _invalid(inferred, shapeless, exc) from exc
    return inferred


def _check_as_files(model: onnx.ModelProto, shapeless: Collection[str] = ()) -> onnx.ModelProto:
    """:func:`check_rewritten` for a model too large for one protobuf message (see
    :func:`opbridge.model_io.infer_and_check_as_files`)."""
    kept = _set_aside_outputs(model, shapeless)
    aside = {o.name for o in kept} - {o.name for o in model.graph.output}
    try:
        checked = infer_and_check_as_files(model)
    except Exception as exc:
        raise _invalid(model, shapeless, exc) from exc
    finally:
        del model.graph.output[:]
        model.graph.output.extend(kept)
    # what inference found for an output set aside (as a value of the graph) is that output's type
    found = {v.name: v for v in checked.graph.value_info if v.name in aside}
    for output in checked.graph.output:
        if output.name in found:
            output.type.CopyFrom(found[output.name].type)
    if found:
        infos = [v for v in checked.graph.value_info if v.name not in found]
        del checked.graph.value_info[:]
        checked.graph.value_info.extend(infos)
    return checked


def _shapeless_outputs(model: onnx.ModelProto) -> list[str]:
    """The main graph's tensor outputs declared without a shape (which ONNX's checker refuses)."""
    return [
        o.name
        for o in model.graph.output
        if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape")
    ]


def _set_aside_outputs(model: onnx.ModelProto, shapeless: Collection[str]) -> list[onnx.ValueInfoProto]:
    """Remove from ``model``'s graph outputs those named in ``shapeless`` that still have no shape; returns
    (copies of) all the outputs, to put back after the check."""
    import onnx

    kept = [onnx.ValueInfoProto() for _ in model.graph.output]
    for copy, output in zip(kept, model.graph.output):
        copy.CopyFrom(output)
    aside = set(shapeless) & set(_shapeless_outputs(model))
    if aside:
        logger.debug("graph output(s) %s had no shape before the rewrite either: not checked for one", sorted(aside))
        rest = [o for o in kept if o.name not in aside]
        del model.graph.output[:]
        model.graph.output.extend(rest)
    return kept


def _invalid(model: onnx.ModelProto, shapeless: Collection[str], exc: Exception) -> RewriteError:
    """The RewriteError for a rewritten model that fails the checks, naming the graph outputs the rewrite
    left without a shape where that is what the checker refused (those of ``shapeless`` are not checked)."""
    message = f"the rewritten model is not valid, nothing was written: {exc}"
    missing = [n for n in _shapeless_outputs(model) if n not in shapeless]
    if "Field 'shape' of 'type' is required" in str(exc) and missing:
        message += (
            f" (graph output(s) {missing} declare no shape, which the input model declared; declare one for "
            "each, e.g. with onnx.shape_inference.infer_shapes or their dims as far as known)"
        )
    sparse = [t.values.name for t in model.graph.sparse_initializer]
    if "sparse_tensor(" in str(exc) and sparse:  # (ONNX Runtime densifies them and runs the model)
        message += (
            f" (the cause is the sparse initializer(s) {sparse}, which onnx's checker types as sparse_tensor, and no "
            "standard op takes one: make them dense, numpy_helper.to_array of each as a plain initializer, before "
            "rewriting)"
        )
    return RewriteError(message)


def rewrite_model(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    rules: Sequence[str] | str,
    options: Mapping[str, Any] | None = None,
    *,
    check: bool = True,
) -> RewriteReport:
    """Apply ``rules`` (names from :data:`RULES`) in order to a copy of ``model``.

    Args:
        model: a path, a serialized model (bytes) or a loaded model (never modified).
        rules: rule names, e.g. ``["fold-resize-scales"]`` (or one name).
        options: rule options (``map``, ``rename``, ``scale_input``, ``domain``, ``version``).
        check: run :func:`check_rewritten` on the result.

    Raises:
        RewriteError: an unknown rule, or a result that fails the checks.
    """
    import onnx

    from opbridge.graph._model import load_model

    rules = _check_rules(rules, options)
    loaded = load_model(model)
    if loaded is model:  # the caller's ModelProto, which stays as it is (one read from a file is ours)
        current = onnx.ModelProto()
        current.CopyFrom(loaded)
    else:
        current = loaded
    return _rewrite(current, rules, options or {}, check=check)


def _rewrite(model: onnx.ModelProto, rules: Sequence[str], options: Mapping[str, Any], *, check: bool) -> RewriteReport:
    """:func:`rewrite_model` of a model of its own, which becomes the result (its weights not copied)."""
    shapeless = _shapeless_outputs(model)
    light, _ = strip_tensors(model, HELD_TENSOR_BYTES)
    before, _ = strip_tensors(model, HELD_TENSOR_BYTES)  # (checked where the result fails: was the input valid?)
    outcomes: list[RuleOutcome] = []
    for name in rules:
        light, done = RULES[name]().apply(light, options)
        outcomes += done
        for o in done:
            logger.info("%s", o)
    if not any(o.applied for o in outcomes):
        return RewriteReport(model, outcomes)
    _attach_bodies(light)
    current = restore_tensors(model, light)
    if check:
        try:
            current = check_rewritten(current, shapeless)
        except RewriteError as exc:
            # (legacy-domain exists to repair an input the checker refuses: the result's own error stands)
            repairs = any(o.applied and o.rule == "legacy-domain" for o in outcomes)
            cause = "" if repairs else _input_invalid(before, shapeless)
            if cause:
                raise RewriteError(
                    f"the input model is not valid, before any rule ran ({cause}); nothing was written: fix the "
                    f"input first (opbridge lint MODEL names what is wrong). The rewritten model: {exc}"
                ) from exc
            raise
    return RewriteReport(current, outcomes)


def _input_invalid(light: onnx.ModelProto, shapeless: Collection[str]) -> str:
    """Why the checks refuse the input model itself (``light``: it without the data of its large
    tensors), or ""."""
    try:
        _check_as_files(light, shapeless)
    except Exception as exc:
        return str(exc.__cause__ or exc)
    return ""


def _check_rules(rules: Sequence[str] | str, options: Mapping[str, Any] | None) -> list[str]:
    """The rules named (one name given as such), checked with their options: a RewriteError names an
    unknown rule or an option none of them reads."""
    if isinstance(rules, str):  # one rule by name, not its letters
        rules = [rules]
    if not isinstance(rules, Sequence):
        raise RewriteError(
            f"rules is a {type(rules).__name__}; give a rule name or a list of them, e.g. ['fold-resize-scales'] "
            f"(rules: {', '.join(RULES)})."
        )
    if options is not None and not isinstance(options, Mapping):
        raise RewriteError(
            f"options is a {type(options).__name__}; give a dict of option name to value, e.g. "
            "{'map': ['Resize=acme::BicubicResize']}."
        )
    unknown = [r for r in rules if r not in RULES]
    if unknown or not rules:
        raise RewriteError(f"unknown rule(s) {unknown or '(none given)'}; choose from {', '.join(RULES)}.")
    # an option no chosen rule reads (a typo, or --map/--rename without replace-op) would be dropped
    # silently; empty ones are the CLI's defaults
    accepted = {k for r in rules for k in getattr(RULES[r], "options", {})}
    stray = sorted(k for k, v in (options or {}).items() if k not in accepted and v not in (None, [], ()))
    if stray:
        raise RewriteError(
            f"option(s) {stray} are not read by rule(s) {list(rules)}; they take {sorted(accepted)}"
            " (see opbridge rewrite --help)."
        )
    return list(rules)


def rewrite_file(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str] | None,
    rules: Sequence[str],
    options: Mapping[str, Any] | None = None,
    *,
    in_place: bool = False,
) -> RewriteReport:
    """Rewrite the file ``source`` into ``output`` (atomically); ``in_place`` to replace ``source``.
    Where no rule changes anything, nothing is written and the report's ``path`` is None. The model is
    read once and written without a second copy of its weights: where it is written with a data file,
    the report's model refers to that file for its tensors.

    Raises:
        RewriteError: ``output`` is the input path without ``in_place``, or neither is given.

    Example:
        >>> r = rewrite_file("model.onnx", "fixed.onnx", ["fold-resize-scales"])  # doctest: +SKIP
        >>> r.path  # doctest: +SKIP
        PosixPath('fixed.onnx')
    """
    from opbridge._files import prepare_output, write_atomic
    from opbridge.graph._model import load_model
    from opbridge.model_io import external_files, read_external_data, save_with_data_file, write_model

    if not isinstance(source, (str, os.PathLike)):
        raise RewriteError(
            f"rewrite_file rewrites a file, got a {type(source).__name__}; give its path, or use "
            "rewrite_model() for a loaded model."
        )

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
    model = load_model(src, external_data=False)
    external = external_files(src, model)
    if not in_place and os.fspath(target) and Path(target).is_symlink():
        # written through the link, its data file named after the link beside the real file: a model that
        # loaded by neither path; both now follow the file the link leads to
        real = Path(os.path.realpath(target))
        if real.parent != Path(target).absolute().parent and external:
            logger.warning(
                "%s is a link to %s: the model and its data file are written there; load it by that path (ONNX "
                "looks for data files beside the path it is given)",
                target,
                real,
            )
        target = real
    protected = [] if in_place else [src, *external]
    prepare_output(target, protected=protected)  # a bad path is named before the rules run
    data_name = f"{Path(target).name}.data"  # the output keeps its weights beside it, in <output>.data
    if external and in_place:
        data_name = _in_place_data_name(src, external)
    if external:
        prepare_output(Path(target).with_name(data_name), protected=protected)
        _refuse_shared_data(Path(target).with_name(data_name), Path(target), in_place)
    rules = _check_rules(rules, options)
    read_external_data(model, src)
    report = _rewrite(model, rules, options or {}, check=True)
    if report.changed:
        # the output keeps the input's layout: its tensors beside it in one data file where the input had any
        data = data_name if external or too_large(report.model) else None  # (no 2 GiB message in one piece)
        if data is not None:
            if not external:  # (a model that grew past 2 GiB: its data file is new, checked now)
                _refuse_shared_data(Path(target).with_name(data), Path(target), in_place)
            report.path = save_with_data_file(
                report.model, target, protected=protected, data_name=data, keep_tensors=False
            )
        else:
            report.path = write_atomic(target, lambda fh: write_model(report.model, fh), protected=protected)
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


def _refuse_shared_data(data: Path, target: Path, in_place: bool) -> None:
    """A RewriteError where another model in ``data``'s folder keeps tensors in ``data``, the data file that
    writing ``target`` replaces: that model's weights would change."""
    if not data.exists():
        return
    others = _other_readers(data, target)
    if others:
        writing = f"an in-place rewrite of {target.name}" if in_place else f"writing {target.name}"
        raise RewriteError(
            f"{data} is also the data file of {', '.join(str(o) for o in others)}: {writing} would replace it "
            f"and change {'that model' if len(others) == 1 else 'those models'}'s weights; write the result "
            f"elsewhere{' with -o' if in_place else ' (another -o)'}."
        )


#: model files beside a data file larger than this are not read to see whether they share it (a model
#: that keeps its weights in a data file is small)
_SHARING_SCAN_BYTES = 64 << 20


def _other_readers(data: Path, source: Path) -> list[Path]:
    """The other model files in ``data``'s folder (``*.onnx``) that keep tensors in ``data``."""
    from opbridge.model_io import external_files

    found = []
    for candidate in sorted(data.parent.glob("*.onnx")):
        try:
            if (source.exists() and candidate.samefile(source)) or candidate.stat().st_size > _SHARING_SCAN_BYTES:
                continue
        except OSError:
            continue
        if any(f.exists() and f.samefile(data) for f in external_files(candidate)):
            found.append(candidate)
    return found
