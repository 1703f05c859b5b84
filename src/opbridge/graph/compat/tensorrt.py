"""TensorRT compatibility from static rules that follow the TensorRT ONNX parser's documented behaviour.

No TensorRT is needed. Each rule names the TensorRT versions it applies to and
its source. When ``opbridge.tensorrt`` and a TensorRT library are importable,
:func:`check_tensorrt` also runs the real parser
(``opbridge.tensorrt.parse_with_tensorrt``) and puts its verdict next to the
static one.

How the parser treats a node (onnx-tensorrt ``ModelImporter.cpp``):

1. an importer registered for the node's ``op_type`` (the domain is not consulted);
2. TensorRT >= 10: else a model-local function of that name (preferred over a plugin
   unless plugin override is enabled);
3. else the plugin path (``FallbackPluginImporter``): "No importer registered for op: X.
   Attempting to import as plugin." The plugin creator is looked up by name = ``op_type``,
   version = the ``plugin_version`` attribute (default ``"1"``) and namespace = the
   ``plugin_namespace`` attribute (default ``""``; since 10.10 the node's domain).
   Attributes become plugin fields: INT narrowed to int32, TENSOR of int64/bool/uint8 rejected.

Example:
    >>> from onnx import helper, TensorProto
    >>> n = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic", name="up")
    >>> g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4]),
    ...     helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    >>> [(v.verdict, v.rules) for v in check_tensorrt(m, version="8.4", real=False).nodes]
    [('fail', ('trt-resize-cubic-unsupported', 'trt-resize-scales-not-initializer'))]
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbridge.graph.compat._common import NodeContext, _node_mismatch, body_contexts, node_contexts, resize_constants
from opbridge.graph.compat._report import CompatReport, NodeVerdict, Verdict

if TYPE_CHECKING:
    import onnx

__all__ = ["TRT_RULES", "TrtRule", "check_tensorrt", "parse_trt_version", "plugin_lookup"]

logger = logging.getLogger(__name__)

Version = tuple[int, int]
LATEST: Version = (99, 0)

# Default-domain ops with no TensorRT importer: the "N" rows of onnx-tensorrt docs/operators.md for
# TensorRT 8.5. Later releases added importers for some of them, so the list is applied to 8.x only.
_NO_IMPORTER_8X = frozenset(
    "Bernoulli BitShift BlackmanWindow Compress ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear "
    "HammingWindow HannWindow Hardmax LayerNormalization MatMulInteger MaxRoiPool MaxUnpool MelWeightMatrix "
    "Multinomial NegativeLogLikelihoodLoss Optional OptionalGetElement OptionalHasElement QLinearConv "
    "QLinearMatMul STFT SequenceAt SequenceConstruct SequenceEmpty SequenceErase SequenceInsert SequenceLength "
    "SequenceMap SoftmaxCrossEntropyLoss SplitToSequence StringNormalizer TfIdfVectorizer Unique".split()
)
# Ops on sequence, optional or string values: TensorRT networks have no such types, in any version.
_NO_IMPORTER_ANY = frozenset(
    "ConcatFromSequence Optional OptionalGetElement OptionalHasElement SequenceAt SequenceConstruct SequenceEmpty "
    "SequenceErase SequenceInsert SequenceLength SequenceMap SplitToSequence StringConcat StringNormalizer "
    "StringSplit RegexFullMatch".split()
)
# Default-domain ops TensorRT-RTX 1.7's parser sends to the plugin path ("No importer registered for op"),
# measured with one node of each ONNX op. TensorRT itself imports DeformConv from 10.1 (onnx-tensorrt
# 10.1 release notes, "Added support for DeformConv"; docs/operators.md for 10.15), and lists DFT as "N".
_NO_IMPORTER_RTX = frozenset("BitCast CumProd DFT DeformConv SwiGLU".split())
_DEFORMCONV_SINCE: Version = (10, 1)
# Default-domain ops TensorRT-RTX 1.7's parser has an importer for but refuses outright (its op checker
# fails the node, UNSUPPORTED_NODE, with the message "false"), measured with a valid node of each; most
# are "N" rows of docs/operators.md. BitShift fails first on its unsigned inputs, which TensorRT has no
# type for. (Sequence, optional and string ops: _NO_IMPORTER_ANY.)
_REFUSED_RTX = frozenset(
    "AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor CenterCropPad Col2Im Compress "
    "ConvInteger Det DynamicQuantizeLinear ImageDecoder MatMulInteger MaxRoiPool MaxUnpool MelWeightMatrix "
    "Multinomial NegativeLogLikelihoodLoss QLinearConv QLinearMatMul SoftmaxCrossEntropyLoss TfIdfVectorizer "
    "Unique".split()
)
_INT32 = (-(2**31), 2**31 - 1)


def parse_trt_version(text: str | int | None) -> Version:
    """``"10.13.1"`` -> ``(10, 13)`` (``10`` -> ``(10, 0)``); ``None`` or ``"latest"`` -> the newest
    behaviour known here."""
    if text is None or text == "latest":
        return LATEST
    from opbridge.errors import OpbridgeError

    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise OpbridgeError(f"TensorRT version {text!r}: write it as a string MAJOR.MINOR, e.g. '10.13'")
    parts = str(text).split(".")
    try:
        version = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise OpbridgeError(f"TensorRT version {text!r}: write it as MAJOR.MINOR, e.g. 10.13") from None
    if version < (7, 0) or version[1] < 0:
        # the rules here start at TensorRT 7's ONNX parser: an older one would pass every node
        raise OpbridgeError(f"TensorRT version {text!r}: the rules cover TensorRT 7.0 and later; give 7.0 or newer.")
    return version


@dataclass(frozen=True)
class Hit:
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class TrtRule:
    """One static rule: applies to TensorRT versions in ``[since, until)``; ``check`` returns a Hit or None."""

    code: str
    since: Version
    until: Version | None
    source: str
    check: Callable[[NodeContext, Version], Hit | None]

    def applies(self, version: Version) -> bool:
        return self.since <= version and (self.until is None or version < self.until)

    @property
    def versions(self) -> str:
        lo = f"{self.since[0]}.{self.since[1]}"
        return f">= {lo}" if self.until is None else f"{lo} to < {self.until[0]}.{self.until[1]}"

    @property
    def doc(self) -> str:
        return (self.check.__doc__ or "").strip().splitlines()[0]


def _is_resize(ctx: NodeContext) -> bool:
    return ctx.op_type == "Resize" and ctx.domain in ("", "ai.onnx")


def _resize_scales(ctx: NodeContext) -> Any:
    """The scales value of a Resize when used (no sizes input), else None."""
    from opbridge.graph._model import resize_input_slots

    if ctx.node is None:  # (onnx-ir could not read the model)
        return None
    inputs = ctx.node.inputs
    given = {what: inputs[i] if len(inputs) > i else None for i, what in resize_input_slots(ctx.version)}
    sizes = given.get("sizes")
    if sizes is not None and sizes.name:
        return None
    return given["scales"]


def _rule_cubic_unsupported(ctx: NodeContext, version: Version) -> Hit | None:
    """Resize with mode cubic is refused by parsers before 8.5.

    The importer asserts ``mode != "cubic" && "This version of TensorRT does not
    support cubic interpolation!"`` (onnx-tensorrt builtin_op_importers.cpp
    importResize; seed 001's first error). onnx-tensorrt docs/operators.md for
    TensorRT 8.4 and 8.5 lists resize modes ``nearest`` and ``linear`` only;
    cubic came with IResizeLayer's cubic mode (``getCubicCoeff``, TensorRT 8.5 API).
    """
    if _is_resize(ctx) and ctx.attr("mode", "nearest") == "cubic":
        return Hit("fail", 'mode "cubic": "This version of TensorRT does not support cubic interpolation!"')
    return None


def _rule_cubic_outer_dims(ctx: NodeContext, version: Version) -> Hit | None:
    """Resize with mode cubic resizes only the two innermost dims (TensorRT >= 8.5).

    The current parser maps cubic to IResizeLayer's cubic interpolation, which
    covers a 2-D resize of the last two dims; scaling any other dim fails
    (onnx-tensorrt importResize; docs/operators.md still lists nearest/linear only).
    """
    if not (_is_resize(ctx) and ctx.attr("mode", "nearest") == "cubic") or ctx.node is None:
        return None
    found = resize_constants(ctx)
    if "sizes" in found:
        arr = found["sizes"]
        data = ctx.node.inputs[0]
        dims = list(data.shape) if data is not None and data.shape is not None else None
        if dims and all(isinstance(d, int) for d in dims[:-2]) and list(arr.ravel()[:-2]) != dims[:-2]:
            return Hit("fail", f"cubic resize sizes {arr.tolist()} change dims other than the last two")
    elif "scales" in found:
        arr = found["scales"]
        if any(float(s) != 1.0 for s in arr.ravel()[:-2]):
            return Hit("fail", f"cubic resize scales {arr.tolist()} change dims other than the last two")
    return None


def _rule_scales_not_initializer(ctx: NodeContext, version: Version) -> Hit | None:
    """Resize scales that are not an initializer are refused (before TensorRT 10), or with ``axes`` (from 10).

    Before 10 the importer asserts ``scales.is_weights() && "Resize scales must be an
    initializer!"`` (seed 001's second error; onnx-tensorrt#398 and #483 on
    TensorRT 7, NVIDIA/TensorRT#2803 on 8.5 in 2023, where scales coming from an
    Identity of an initializer failed). A Constant node counts as weights. From 10
    (onnx-tensorrt onnxOpImporters.cpp importResize, and TensorRT-RTX 1.7's parser,
    measured: Identity, Cast, Concat, Mul of initializers and Shape arithmetic pass)
    tensor scales give the output shape at run time, unless the node's ``axes`` are
    not ``0..rank-1``: "Currently, `axes` attribute is supported with `scales` tensor
    only when it's trivial". The 10.0 boundary is inferred (8.6 and 9.x are judged
    as 8.5). Fix: fold-resize-scales when the scales are constant-computable.
    """
    if not _is_resize(ctx):
        return None
    scales = _resize_scales(ctx)
    if scales is None or not scales.name:
        return None
    if scales.is_initializer() or scales.const_value is not None:
        return None
    producer = scales.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
        return None
    axes = ctx.attr("axes", None)
    if version >= (10, 0) and axes is None:
        return None  # (the output shape is computed from the scales at run time)
    if version >= (10, 0):
        data = ctx.node.inputs[0] if ctx.node is not None and ctx.node.inputs else None
        rank = len(data.shape) if data is not None and data.shape is not None else len(axes)
        if list(axes) == list(range(rank)):
            return None
    from opbridge.graph._model import evaluate_constant

    arr, why = evaluate_constant(scales, opset=ctx.version)
    if ctx.function:  # (the rewrite rules work on graphs, not on function bodies)
        hint = (
            f"in the body of the model-local function {ctx.function}, which the rewrite rules do not enter: "
            "inline the model's functions (onnx.inliner.inline_local_functions), then "
            + ("run --rule fold-resize-scales" if arr is not None else "use sizes")
        )
    elif arr is not None:
        hint = "constant-computable: run --rule fold-resize-scales"
    else:
        hint = f"computed at run time ({why}): use sizes, or --rule resize-cubic-to-dynamic-resize"
    if version >= (10, 0):
        return Hit(
            "fail",
            f"scales {scales.name!r} are not an initializer and the node's axes {list(axes)} are not 0..rank-1: "
            '"Currently, `axes` attribute is supported with `scales` tensor only when it\'s trivial"; '
            f"{hint}, or give scales for every dim without axes",
        )
    return Hit(
        "fail", f'scales {scales.name!r} are not an initializer: "Resize scales must be an initializer!"; {hint}'
    )


def _no_importer_reason(ctx: NodeContext, version: Version) -> str | None:
    """Why the parser of ``version`` has no importer for the standard op of ``ctx``, or None (it has one,
    or ``ctx`` is a custom node)."""
    from opbridge.graph._model import STANDARD_DOMAINS

    if ctx.domain in STANDARD_DOMAINS and ctx.domain not in ("", "ai.onnx"):
        # (the parser looks importers up by op type and has none of these domains' ops: they take the plugin
        # path; TensorRT-RTX 1.7, measured with ai.onnx.ml Binarizer, Normalizer and Scaler)
        return f"TensorRT's parser has no importer for ops of ONNX's {ctx.domain} domain"
    if ctx.custom:
        return None
    if ctx.op_type in _NO_IMPORTER_ANY or (version < (9, 0) and ctx.op_type in _NO_IMPORTER_8X):
        return "no TensorRT importer for this ONNX op"
    if ctx.op_type == "DeformConv" and version < _DEFORMCONV_SINCE:
        return "no TensorRT importer for DeformConv before 10.1 (onnx-tensorrt 10.1 release notes)"
    if version == LATEST and ctx.op_type in _NO_IMPORTER_RTX:
        reason = f"TensorRT-RTX's parser has no {ctx.op_type} importer (TensorRT-RTX 1.7, measured)"
        if ctx.op_type == "DeformConv":
            reason += (
                "; TensorRT 10.1 and later, unlike TensorRT-RTX, import DeformConv (onnx-tensorrt 10.1 release "
                "notes; docs/operators.md for 10.15: 1-D or 2-D spatial dims, equal begin and end pads): give "
                "--trt-version 10.1 or later to judge TensorRT itself"
            )
        return reason
    return None


def plugin_lookup(ctx: NodeContext, version: Version) -> tuple[str, str, str]:
    """``(name, version, namespace)`` the parser asks the plugin registry for."""
    plugin_version = ctx.attr("plugin_version", "1")
    namespace = ctx.attr("plugin_namespace", None)
    if namespace is None:
        namespace = ctx.domain if version >= (10, 10) and ctx.domain not in ("", "ai.onnx") else ""
    return ctx.op_type, str(plugin_version), str(namespace)


def empty_namespace_op(name: str, plugin_version: str) -> Any:
    """The opbridge op (an ``OpDef``) whose plugin ``register_plugins`` puts under namespace ``""`` for
    ``name`` and ``plugin_version`` (the first of its name, as opbridge.tensorrt registers them), or None:
    the plugin TensorRT's parser finds for a node of the default domain."""
    from opbridge.definition import all_ops

    for opdef in all_ops():
        if opdef.spec.name == name and str(opdef.spec.version) == plugin_version:
            return opdef
    return None


def _empty_namespace_plugin(name: str, plugin_version: str) -> str | None:
    """The qualified name of :func:`empty_namespace_op`'s op, or None."""
    opdef = empty_namespace_op(name, plugin_version)
    return None if opdef is None else str(opdef.spec.qualname)


def _shadowed(ctx: NodeContext) -> bool:
    """A custom-domain node named like an ONNX op, which that op's importer takes (by op type alone)."""
    from opbridge.legacy_domain import is_standard_op

    return ctx.domain not in ("", "ai.onnx", "ai.onnx.ml") and is_standard_op(ctx.op_type)


def _rule_plugin_path(ctx: NodeContext, version: Version) -> Hit | None:
    """An op with no importer goes to the plugin path, looked up by op_type, plugin_version and namespace.

    onnx-tensorrt ModelImporter.cpp: "No importer registered for op: X. Attempting to
    import as plugin." FallbackPluginImporter searches the registry for creator name
    = op_type, version = ``plugin_version`` attribute (default "1"), namespace =
    ``plugin_namespace`` attribute (default ""); from TensorRT 10.10 the node's
    domain is the namespace fallback. From TensorRT 10 a model-local function of the
    same name is imported instead (LocalFunctionImporter, preferred over plugins unless
    plugin override is on). Unsupported standard ops: docs/operators.md (8.5) "N" rows; DeformConv
    before 10.1 (onnx-tensorrt 10.1 release notes); with no version given, the ops TensorRT-RTX 1.7's
    parser has no importer for (BitCast, CumProd, DFT, DeformConv, SwiGLU; measured). The ops of ONNX's
    other domains (``ai.onnx.ml``...) have no importer in any version (measured with TensorRT-RTX 1.7).
    """
    no_importer = _no_importer_reason(ctx, version)
    if not (ctx.custom or no_importer):
        return None
    if _shadowed(ctx):  # an ONNX op's importer takes it (trt-op-type-shadows-importer): no plugin path
        return None
    if ctx.custom and ctx.has_function and version >= (10, 0):
        return Hit("function", "no importer; imported through the model-local function body (LocalFunctionImporter)")
    name, pversion, namespace = plugin_lookup(ctx, version)
    key = f"creator {name!r} version {pversion!r} namespace {namespace!r}"
    opdef = ctx.opbridge_op() if ctx.custom else None
    if opdef is not None:
        wanted = str(opdef.spec.version)
        if ctx.attr("plugin_version") is None and wanted != pversion:
            # (the node's op is another version than the parser's default "1": trt-build names it on the node)
            return Hit(
                "opbridge",
                f"plugin path: creator {name!r} version {wanted!r} namespace {namespace!r}; opbridge.tensorrt "
                f"registers a plugin for this op, and opbridge's trt-build adds plugin_version={wanted!r} to the "
                f"node (without it the parser looks up version {pversion!r}): another builder needs that attribute "
                "on it",
            )
        return Hit("opbridge", f"plugin path: {key}; opbridge.tensorrt registers a plugin for this op")
    # TensorRT-RTX 1.7 looks up namespace '' where the domain's namespace has no such creator, unless the node
    # names its plugin_namespace (measured: acme::grid_sampler builds with mmdeploy::grid_sampler's plugin)
    after_domain = version == LATEST and ctx.domain not in ("", "ai.onnx") and ctx.attr("plugin_namespace") is None
    default_domain = ctx.domain in ("", "ai.onnx") and namespace == ""
    namesake = empty_namespace_op(name, pversion) if ctx.custom and (default_domain or after_domain) else None
    if namesake is not None:
        found = (
            f"opbridge.tensorrt registers {namesake.spec.qualname}'s plugin under namespace '' too, which this node "
        )
        mismatch = _node_mismatch(ctx.proto, namesake)
        if mismatch:
            return Hit("fail", f"plugin path: {key}; {found}finds by its name, but {mismatch}")
        how = (
            "of the default domain finds by its name"
            if default_domain
            else f"finds by its name where namespace {namespace!r} has none (TensorRT-RTX 1.7, measured): the "
            "plugin of another op, unless that is the op meant"
        )
        return Hit("opbridge", f"plugin path: {key}; {found}{how}")
    why = no_importer or "no importer"
    mismatch = f" ({ctx.opbridge_mismatch()})" if ctx.opbridge_mismatch() else ""
    return Hit("fail", f"{why}; plugin path looks up {key}: fails unless such a plugin is registered{mismatch}")


def _rule_plugin_namespace(ctx: NodeContext, version: Version) -> Hit | None:
    """Before TensorRT 10.10 the plugin namespace is "" unless the node sets plugin_namespace.

    A creator registered under the op's domain (as TensorRT >= 10.10's fallback
    expects) is not found by older parsers unless the node carries
    ``plugin_namespace`` (onnx-tensorrt FallbackPluginImporter). opbridge.tensorrt
    registers each op's plugin under "" too (the first op of a name and version),
    and its trt-build adds ``plugin_namespace``: an opbridge op is found.
    """
    if not ctx.custom or ctx.domain in ("", "ai.onnx") or ctx.attr("plugin_namespace") is not None:
        return None
    if (ctx.has_function and version >= (10, 0)) or _shadowed(ctx):
        return None
    where = f"parser looks in namespace '' (before 10.10 the domain {ctx.domain!r} is not used)"
    opdef = ctx.opbridge_op()
    if opdef is None:
        return Hit("fail", f"{where}: register the creator in '' or add attribute plugin_namespace={ctx.domain!r}")
    # opbridge.tensorrt registers each op's plugin under '' too (the first op of a name and version), and
    # its parse and trt-build add plugin_namespace=<domain> to the node before parsing
    holder = _empty_namespace_plugin(ctx.op_type, plugin_lookup(ctx, version)[1])
    if holder == opdef.spec.qualname:
        return Hit(
            "opbridge",
            f"{where}: opbridge.tensorrt registers {holder}'s plugin under '' too, so it is found there "
            f"(opbridge's trt-build also adds plugin_namespace={ctx.domain!r})",
        )
    held = f"namespace '' holds {holder}'s plugin of that name" if holder else "namespace '' holds no plugin for it"
    return Hit(
        "opbridge",
        f"{where}: {held}, not {opdef.spec.qualname}'s; opbridge's trt-build adds plugin_namespace={ctx.domain!r} "
        "to the node, another builder needs that attribute on it",
    )


def _rule_int_narrowing(ctx: NodeContext, version: Version) -> Hit | None:
    """INT and INTS attributes become int32 plugin fields: values outside int32 are narrowed.

    FallbackPluginImporter converts attributes to PluginFields: INT -> kINT32,
    FLOAT -> kFLOAT32, STRING -> kCHAR, lists likewise (onnx-tensorrt
    onnxOpImporters.cpp / importerUtils).
    """
    import onnx

    if not ctx.custom or (ctx.has_function and version >= (10, 0)) or _shadowed(ctx):
        return None  # (a function's body is imported: its attributes bind there and become no plugin fields)
    found = []
    for name, a, via in _plugin_attributes(ctx):
        values = (
            [a.i] if a.type == onnx.AttributeProto.INT else list(a.ints) if a.type == onnx.AttributeProto.INTS else []
        )
        bad = [v for v in values if not _INT32[0] <= v <= _INT32[1]]
        if bad:
            found.append(f"{name!r} = {bad[0]}{via}")
    if not found:
        return None
    fields = "the int32 plugin field it becomes" if len(found) == 1 else "the int32 plugin fields they become"
    return Hit("fail", f"attribute(s) {', '.join(found)} do not fit {fields}")


def _rule_input_gap(ctx: NodeContext, version: Version) -> Hit | None:
    """An opbridge op's node that leaves out an optional input before one it gives cannot become its plugin.

    TensorRT hands a plugin its inputs by position, without the names, so the plugin cannot tell which
    inputs are missing; opbridge's trt-build refuses such a node before parsing.
    """
    if not ctx.custom or (ctx.has_function and version >= (10, 0)) or _shadowed(ctx):
        return None
    opdef = ctx.opbridge_op()
    if opdef is None:
        return None
    given = list(ctx.proto.input)
    while given and not given[-1]:
        given.pop()
    skipped = [p.name for p, name in zip(opdef.spec.inputs, given) if p.optional and not name]
    if not skipped:
        return None
    return Hit(
        "fail",
        f"optional input(s) {skipped} of {opdef.spec.qualname} are left out before a given one; TensorRT hands a "
        "plugin its inputs by position, so its plugin cannot tell which are missing (give them, or reorder the "
        "op's inputs so that optional ones come last)",
    )


def _rule_tensor_attr(ctx: NodeContext, version: Version) -> Hit | None:
    """TENSOR attributes of int64, bool or uint8 are rejected as plugin fields.

    FallbackPluginImporter supports TENSOR attributes only of types it can map to
    a PluginFieldType; int64, bool and uint8 are refused (onnx-tensorrt importer).
    """
    import onnx

    if not ctx.custom or (ctx.has_function and version >= (10, 0)) or _shadowed(ctx):
        return None  # (a function's body is imported: its attributes bind there and become no plugin fields)
    bad = {onnx.TensorProto.INT64: "int64", onnx.TensorProto.BOOL: "bool", onnx.TensorProto.UINT8: "uint8"}
    for name, a, via in _plugin_attributes(ctx):
        if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in bad:
            return Hit("fail", f"TENSOR attribute {name!r}{via} of {bad[a.t.data_type]} is rejected as a plugin field")
    return None


def _plugin_attributes(ctx: NodeContext) -> list[tuple[str, Any, str]]:
    """The node's attributes as its plugin gets them: one a function body's node takes from the function's
    call (``ref_attr_name``) as each call binds it (see :func:`~opbridge.graph._model.bound_attributes`)."""
    from opbridge.graph._model import bound_attributes, function_label

    fn = next((f for f in ctx.model.functions if function_label(f) == ctx.function), None) if ctx.function else None
    return list(bound_attributes(ctx.model, ctx.proto, fn))


def _rule_op_type_shadows(ctx: NodeContext, version: Version) -> Hit | None:
    """A custom-domain node named like an ONNX op is imported by that op's importer.

    The parser looks importers up by ``op_type`` only (ModelImporter.cpp:
    ``opImporters.count(node.op_type())``), so ``acme::Resize`` is imported as ONNX Resize.
    """
    if not _shadowed(ctx):
        return None
    return Hit("fail", f"{ctx.domain}::{ctx.op_type} would be imported by the built-in {ctx.op_type} importer")


def _rule_constant_attributes(ctx: NodeContext, version: Version) -> Hit | None:
    """A Constant given by ``sparse_value``, ``value_string`` or ``value_strings`` is refused.

    The Constant importer asserts that none of these attributes is present ("This version of
    TensorRT does not support the sparse_value, value_string and value_strings attributes.").
    """
    if ctx.op_type != "Constant" or ctx.domain not in ("", "ai.onnx"):
        return None
    found = [a.name for a in ctx.proto.attribute if a.name in ("sparse_value", "value_string", "value_strings")]
    if found:
        return Hit("fail", f"Constant with {found[0]!r}: TensorRT supports none of sparse_value, value_string(s)")
    return None


_AXES_MESSAGE = "Axis input must resolve to a build-time constant (an initializer or a constant-foldable subgraph)!"
# Inputs that were attributes in earlier versions of their op and that TensorRT needs at build time:
# op type -> (the ONNX opset the input comes with, its index, its name, the parser's message). Messages
# from TensorRT-RTX 1.7's parser on each op with the input computed from a graph input; the same op with
# the attribute (the opset before) parses. onnx-tensorrt docs/operators.md (10.15): Reduce* "`axes` must be
# an initializer", Dropout "`is_training` must be an initializer"; (8.4) Squeeze, Unsqueeze "`axes` must be
# a constant tensor".
_CONSTANT_INPUTS: dict[str, tuple[int, int, str, str]] = {
    "Squeeze": (13, 1, "axes", "squeeze axis is not a constant"),
    "Unsqueeze": (13, 1, "axes", "unsqueeze axis is not a constant"),
    "ReduceSum": (13, 1, "axes", _AXES_MESSAGE),
    **{
        f"Reduce{kind}": (18, 1, "axes", _AXES_MESSAGE)
        for kind in "L1 L2 LogSum LogSumExp Max Mean Min Prod SumSquare".split()
    },
    "Upsample": (9, 1, "scales", "Internal Error (Assertion !isInFlight(p.second.symbolicRep) failed."),
    "Dropout": (
        12,
        2,
        "training_mode",
        "This Version of TensorRT only supports the training_mode input as an initializer.",
    ),
}


def _rule_input_not_constant(ctx: NodeContext, version: Version) -> Hit | None:
    """An input that replaced an attribute at a later opset (Squeeze/Unsqueeze-13 axes, ReduceSum-13 and
    Reduce*-18 axes, Upsample-9 scales, Dropout-12 training_mode) must be a build-time constant.

    The node's opset decides whether the value is an attribute (always known) or an input: given as an
    input computed at run time, TensorRT-RTX 1.7's parser refuses it (measured; messages in
    ``_CONSTANT_INPUTS``), as onnx-tensorrt docs/operators.md says for Reduce*, Dropout, Squeeze, Unsqueeze.
    """
    spec = _CONSTANT_INPUTS.get(ctx.op_type)
    if spec is None or ctx.domain not in ("", "ai.onnx") or ctx.node is None:
        return None
    since, slot, what, message = spec
    if ctx.version is None or ctx.version < since:
        return None
    inputs = ctx.node.inputs
    value = inputs[slot] if len(inputs) > slot else None
    if value is None or not value.name:
        return None
    from opbridge.graph._model import evaluate_constant

    arr, why = evaluate_constant(value, opset=ctx.version)
    if arr is not None:
        return None
    return Hit(
        "fail",
        f"{ctx.op_type} of opset {ctx.version} takes {what} as input {slot} (an attribute before opset {since}), "
        f'here {value.name!r}, computed at run time ({why}): "{message}"; make {value.name!r} an initializer, or '
        f"export at an opset before {since}",
    )


# coordinate_transformation_mode values the Resize importer refuses (TensorRT-RTX 1.7, measured in every
# mode; it checks for "tf_half_pixel_for_nn", which is no ONNX name, so tf_half_pixel_for_nearest fails too)
_RESIZE_COORDINATES = frozenset({"half_pixel_symmetric", "tf_crop_and_resize", "tf_half_pixel_for_nearest"})


def _rule_resize_attributes(ctx: NodeContext, version: Version) -> Hit | None:
    """Resize attributes the importer refuses: ``antialias`` on, ``keep_aspect_ratio_policy`` other than
    ``stretch`` (both Resize-18), ``coordinate_transformation_mode`` ``half_pixel_symmetric``,
    ``tf_crop_and_resize`` or ``tf_half_pixel_for_nearest``.

    Measured with TensorRT-RTX 1.7's parser ("Antialiasing is not supported currently.", "Only `stretch` is
    supported currently as `keep_aspect_ratio_policy`.", "TensorRT only supports half_pixel, ...").
    """
    if not _is_resize(ctx):
        return None
    said: list[str] = []
    if int(ctx.attr("antialias", 0) or 0):
        said.append('antialias=1: "Antialiasing is not supported currently."')
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        said.append(f'keep_aspect_ratio_policy {policy!r}: "Only `stretch` is supported currently"')
    coordinates = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if coordinates in _RESIZE_COORDINATES:
        said.append(f"coordinate_transformation_mode {coordinates!r}, which the Resize importer does not take")
    if not said:
        return None
    return Hit(
        "fail",
        "; ".join(said) + " (export F.interpolate without antialias, with the default coordinate mode, or resize "
        "in a custom op with a plugin)",
    )


# ONNX ops whose importer builds a TensorRT plugin that TensorRT-RTX does not ship (measured, 1.7): its
# message, and what to export instead
_PLUGIN_BACKED_RTX = {
    "RoiAlign": (
        "ROIAlign plugin was not found in the plugin registry!",
        "export the model with a custom op that has a plugin of its own there (opbridge.ops.RoIAlign, "
        "mmdeploy::MMCVRoiAlign, for torchvision's roi_align)",
    ),
    "NonZero": (
        "NonZero plugin creator version 1 was not found in plugin registry.",
        "keep the indices out of the engine (a mask, or a custom op with a plugin of its own)",
    ),
}


def _rule_plugin_backed_op(ctx: NodeContext, version: Version) -> Hit | None:
    """Without ``--trt-version``: an ONNX op whose importer builds one of TensorRT's own plugins, which
    TensorRT-RTX does not ship (RoiAlign: "ROIAlign plugin was not found in the plugin registry!").

    TensorRT ships such plugins in libnvinfer_plugin, and releases whose parser has the importer take the node
    (not judged here); TensorRT-RTX 1.7 fails it (measured).
    """
    known = _PLUGIN_BACKED_RTX.get(ctx.op_type)
    if version != LATEST or ctx.custom or known is None or ctx.domain not in ("", "ai.onnx"):
        return None
    message, instead = known
    return Hit(
        "fail",
        f'TensorRT-RTX imports {ctx.op_type} as a TensorRT plugin it does not ship: "{message}"; {instead}, or give '
        "--trt-version to judge a TensorRT release",
    )


def _rule_importer_attributes(ctx: NodeContext, version: Version) -> Hit | None:
    """Without ``--trt-version``: attributes and input forms of ONNX ops that TensorRT-RTX 1.7's importers
    refuse (measured, with the importers' messages): ScatterND and ScatterElements with a reduction;
    MaxPool with its indices output or dilations other than 1; LpPool with p other than 1 and 2; Slice without
    ``axes`` whose ``starts`` leave dims out (ONNX takes the leading ones); QuantizeLinear and
    DequantizeLinear with a constant zero point other than 0. TensorRT releases are not judged."""
    if version != LATEST or ctx.custom or ctx.domain not in ("", "ai.onnx"):
        return None
    op = ctx.op_type
    said = ""
    if op in ("ScatterND", "ScatterElements") and ctx.attr("reduction", "none") != "none":
        message = "ScatterND with reduction is not supported." if op == "ScatterND" else "Unsupported reduction type"
        said = f'reduction {ctx.attr("reduction")!r} ("{message}")'
    elif op == "MaxPool" and len([o for o in ctx.proto.output if o]) > 1:
        said = 'its second output, the indices ("doesn\'t support mode than 1 outputs for MaxPool nodes")'
    elif op == "MaxPool" and any(d != 1 for d in ctx.attr("dilations", []) or []):
        said = f'dilations {list(ctx.attr("dilations"))} ("does not support dilations other than 1")'
    elif op == "LpPool" and int(ctx.attr("p", 2)) not in (1, 2):
        said = f'p={ctx.attr("p")} ("Only L1 and L2 normalization are supported.")'
    elif (
        op == "Slice"
        and ctx.node is not None
        and len(ctx.proto.input) >= 3
        and (
            len(ctx.proto.input) == 3 or not ctx.proto.input[3]  # (no axes)
        )
    ):
        starts = ctx.node.inputs[1] if len(ctx.node.inputs) > 1 else None
        data = ctx.node.inputs[0]
        length = starts.shape[0] if starts is not None and starts.shape is not None and len(starts.shape) == 1 else None
        rank = len(data.shape) if data is not None and data.shape is not None else None
        if isinstance(length, int) and rank is not None and length < rank:
            said = (
                f'no axes, and {length} starts for a {rank}-D input ("The shape of input starts misaligns with the '
                'shape of input axes"; give axes'
            )
    elif op in ("QuantizeLinear", "DequantizeLinear") and ctx.node is not None and len(ctx.node.inputs) > 2:
        from opbridge.graph._model import evaluate_constant

        zero = ctx.node.inputs[2]
        if zero is not None and zero.name:
            arr, _ = evaluate_constant(zero, opset=ctx.version)
            if arr is not None and arr.size and bool((arr.astype("float64") != 0).any()):
                said = 'a zero point other than 0 ("Non-zero zero point is not supported.")'
    if not said:
        return None
    return Hit(
        "fail",
        f"TensorRT-RTX's {op} importer refuses {said}; TensorRT-RTX 1.7, measured. Export the model without it, or "
        "give --trt-version to judge a TensorRT release",
    )


def _rule_refused_op(ctx: NodeContext, version: Version) -> Hit | None:
    """Without ``--trt-version``: an ONNX op TensorRT-RTX 1.7's parser refuses outright (``_REFUSED_RTX``).

    The parser has an importer for the op, so the node does not go to the plugin path: its op checker fails
    it (UNSUPPORTED_NODE, message "false"; measured with a valid node of each op). With a TensorRT version
    given, 8.x judges them by docs/operators.md's "N" rows (trt-plugin-path), later releases are not judged.
    """
    if version != LATEST or ctx.custom or ctx.op_type not in _REFUSED_RTX or ctx.op_type in _NO_IMPORTER_ANY:
        return None
    return Hit(
        "fail",
        f"TensorRT-RTX's parser refuses {ctx.op_type} (its op checker: unsupported node; TensorRT-RTX 1.7, "
        "measured); replace the node with supported ops (e.g. opbridge rewrite --rule replace-op to a custom op "
        "with a plugin), or give --trt-version to judge a TensorRT release",
    )


def _rule_loop_empty_condition(ctx: NodeContext, version: Version) -> Hit | None:
    """A Loop with no condition input (``Loop(M, "", ...)``) whose body reads its condition fails.

    The parser registers no tensor for the body's condition input then, and the body node reading it
    fails with "Node input was not registered." (TensorRT-RTX 1.7, measured: the parser's own message
    names that body node, not the Loop). A body that does not read its condition parses.
    """
    if ctx.op_type != "Loop" or ctx.domain not in ("", "ai.onnx"):
        return None
    if len(ctx.proto.input) > 1 and ctx.proto.input[1]:
        return None
    body = next((a.g for a in ctx.proto.attribute if a.name == "body" and a.HasField("g")), None)
    if body is None or len(body.input) < 2:
        return None
    cond = body.input[1].name
    readers = [n.name or n.op_type for n in body.node if cond in n.input]
    if not readers and cond not in [o.name for o in body.output]:
        return None
    where = f"body node {readers[0]!r}" if readers else "the body's outputs"
    return Hit(
        "fail",
        f'Loop {ctx.proto.name or ctx.label!r} has no condition input (Loop(M, "", ...)) and its body reads the '
        f'condition {cond!r} ({where}): TensorRT\'s parser fails there with "Node input was not registered"; give '
        "the Loop a constant true condition (a bool initializer holding True as its second input)",
    )


# Inputs TensorRT takes as shape tensors (dims, starts, counts): Reshape's shape, Expand's and
# ConstantOfShape's shape, Tile's repeats, Slice's starts/ends/axes/steps, Pad's pads, Range's bounds,
# TopK's k, OneHot's depth (Resize's sizes: _shape_slots). Checked with TensorRT-RTX 1.7's parser.
_SHAPE_SLOTS = {
    "Reshape": (1,),
    "ConstantOfShape": (0,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Pad": (1,),
    "Range": (0, 1, 2),
    "TopK": (1,),
    "OneHot": (1,),
}
# Ops through which a shape tensor's value is computed: their inputs are shape tensors too.
_SHAPE_ARITHMETIC = frozenset(
    "Abs Add Cast CastLike Ceil Clip Concat Div Expand Floor Gather Identity Max Min Mod Mul Neg Pow ReduceMax "
    "ReduceMin ReduceProd ReduceSum Reshape Round Slice Sqrt Squeeze Sub Unsqueeze Where".split()
)


def _shape_slots(ctx: NodeContext, version: Version) -> tuple[int, ...]:
    """The input indices of ``ctx`` that TensorRT ``version`` takes as shape tensors."""
    if ctx.domain not in ("", "ai.onnx"):
        return ()
    if _is_resize(ctx):  # (scales before 10: trt-resize-scales-not-initializer)
        from opbridge.graph._model import resize_input_slots

        # from 10, tensor scales are multiplied into the output shape: a shape computation too
        shapes = ("sizes", "scales") if version >= (10, 0) else ("sizes",)
        return tuple(i for i, what in resize_input_slots(ctx.version) if what in shapes)
    return _SHAPE_SLOTS.get(ctx.op_type, ())


def _float_graph_inputs(value: Any, graph_inputs: list[Any]) -> list[tuple[Any, list[str]]]:
    """The floating-point inputs of the main graph (not initializers) whose values ``value`` is computed
    from through :data:`_SHAPE_ARITHMETIC`, each with the op types on the way (from the input on)."""
    found: list[tuple[Any, list[str]]] = []
    seen: set[int] = set()
    pending: list[tuple[Any, list[str]]] = [(value, [])]
    while pending:
        v, path = pending.pop()
        if v is None or id(v) in seen or v.is_initializer() or v.const_value is not None:
            continue
        seen.add(id(v))
        producer = v.producer()
        if producer is None:
            if any(v is i for i in graph_inputs) and v.dtype is not None and v.dtype.is_floating_point():
                found.append((v, path))
        elif producer.domain in ("", "ai.onnx") and producer.op_type in _SHAPE_ARITHMETIC:
            pending += [(i, [producer.op_type, *path]) for i in producer.inputs]
    return found


def _rule_float_input_shape_tensor(ctx: NodeContext, version: Version) -> Hit | None:
    """A floating-point graph input that reaches a shape-tensor input is refused.

    TensorRT takes the shape input of Reshape, ConstantOfShape, Expand, Tile repeats, Slice
    starts/ends/axes/steps, Pad pads, Range, TopK k, OneHot depth and Resize sizes as a shape tensor,
    and so every network input it is computed from (through Mul, Floor, Cast, Concat, Slice, Gather...):
    "Network input X is a shape tensor and must have type Int32 or Int64" (TensorRT-RTX 1.7 on a
    Resize rewritten with resize-cubic-to-dynamic-resize and a float ``scale_input``).
    """
    slots = _shape_slots(ctx, version)
    if not slots or ctx.node is None or ctx.ir_model is None:  # (onnx-ir could not read the model)
        return None
    graph_inputs = list(ctx.ir_model.graph.inputs)
    inputs = ctx.node.inputs
    for slot in slots:
        value = inputs[slot] if len(inputs) > slot else None
        if value is None or not value.name:
            continue
        for source, path in _float_graph_inputs(value, graph_inputs):
            chain = " -> ".join([repr(source.name), *path, ctx.op_type])
            return Hit(
                "fail",
                f"{source.dtype.name.lower()} graph input {source.name!r} reaches shape input {slot} ({chain}), "
                f'which TensorRT makes a shape tensor: "Network input {source.name} is a shape tensor and must have '
                f'type Int32 or Int64"; feed an int64 size instead, or make {source.name!r} an initializer',
            )
    return None


_DOCS = "onnx-tensorrt docs/operators.md"
_IMPORTER = "onnx-tensorrt builtin_op_importers.cpp importResize"
TRT_RULES: tuple[TrtRule, ...] = (
    TrtRule("trt-op-type-shadows-importer", (7, 0), None, "onnx-tensorrt ModelImporter.cpp", _rule_op_type_shadows),
    TrtRule(
        "trt-constant-attribute",
        (7, 0),
        None,
        "onnx-tensorrt builtin_op_importers.cpp importConstant",
        _rule_constant_attributes,
    ),
    TrtRule(
        "trt-resize-cubic-unsupported",
        (7, 0),
        (8, 5),
        f"{_IMPORTER}; {_DOCS} (8.4, 8.5); seed 001",
        _rule_cubic_unsupported,
    ),
    TrtRule(
        "trt-resize-cubic-outer-dims",
        (8, 5),
        None,
        f"{_IMPORTER}; IResizeLayer cubic mode (TensorRT 8.5 API)",
        _rule_cubic_outer_dims,
    ),
    TrtRule(
        "trt-resize-scales-not-initializer",
        (7, 0),
        None,
        f"{_IMPORTER}; onnx-tensorrt#398, #483; NVIDIA/TensorRT#2803; seed 001",
        _rule_scales_not_initializer,
    ),
    TrtRule(
        "trt-float-input-shape-tensor",
        (7, 0),
        None,
        "TensorRT shape tensors (network inputs used as shapes must be Int32/Int64); TensorRT-RTX 1.7 parser",
        _rule_float_input_shape_tensor,
    ),
    TrtRule(
        "trt-input-not-constant",
        (7, 0),
        None,
        f"TensorRT-RTX 1.7 parser (measured, per op version); {_DOCS} (8.4, 10.15)",
        _rule_input_not_constant,
    ),
    TrtRule(
        "trt-resize-attributes",
        (7, 0),
        None,
        f"{_IMPORTER}; TensorRT-RTX 1.7 parser (measured)",
        _rule_resize_attributes,
    ),
    TrtRule(
        "trt-importer-attributes",
        (7, 0),
        None,
        "TensorRT-RTX 1.7 parser (measured: its importers refuse these attributes and input forms)",
        _rule_importer_attributes,
    ),
    TrtRule(
        "trt-plugin-backed-op",
        (7, 0),
        None,
        "TensorRT-RTX 1.7 parser (measured: the importer's plugin is not in its registry)",
        _rule_plugin_backed_op,
    ),
    TrtRule(
        "trt-refused-op",
        (7, 0),
        None,
        "TensorRT-RTX 1.7 parser (measured: its op checker refuses the node)",
        _rule_refused_op,
    ),
    TrtRule(
        "trt-loop-empty-condition",
        (7, 0),
        None,
        'TensorRT-RTX 1.7 parser (measured: "Node input was not registered" in the body)',
        _rule_loop_empty_condition,
    ),
    TrtRule(
        "trt-plugin-path",
        (7, 0),
        None,
        "onnx-tensorrt ModelImporter.cpp FallbackPluginImporter; " + _DOCS,
        _rule_plugin_path,
    ),
    TrtRule(
        "trt-plugin-namespace",
        (7, 0),
        (10, 10),
        "onnx-tensorrt FallbackPluginImporter (namespace fallback since 10.10)",
        _rule_plugin_namespace,
    ),
    TrtRule(
        "trt-plugin-int-narrowing",
        (7, 0),
        None,
        "onnx-tensorrt FallbackPluginImporter attribute conversion",
        _rule_int_narrowing,
    ),
    TrtRule(
        "trt-plugin-input-gap",
        (7, 0),
        None,
        "IPluginV3 enqueue (inputs by position); opbridge's trt-build refuses the node",
        _rule_input_gap,
    ),
    TrtRule(
        "trt-plugin-tensor-attr-dtype",
        (7, 0),
        None,
        "onnx-tensorrt FallbackPluginImporter attribute conversion",
        _rule_tensor_attr,
    ),
)

_SEVERITY = {"fail": 3, "opbridge": 2, "function": 1, "native": 0}


def _static_verdict(ctx: NodeContext, version: Version) -> NodeVerdict:
    hits: list[tuple[str, Hit]] = []
    for rule in TRT_RULES:
        if rule.applies(version):
            hit = rule.check(ctx, version)
            if hit is not None:
                hits.append((rule.code, hit))
    if not hits:
        return NodeVerdict(ctx.label, ctx.domain, ctx.op_type, "native", "has a TensorRT importer")
    worst = max(hits, key=lambda h: _SEVERITY[h[1].verdict])[1].verdict
    reason = "; ".join(h.reason for _, h in hits if h.verdict == worst)
    if worst == "function" and not ctx.function:
        # the parser imports the body's nodes (body_contexts: nested calls' too): the node fails where one does
        failed = [v for v in (_static_verdict(c, version) for c in body_contexts(ctx)) if v.verdict == "fail"]
        if failed:
            worst = "fail"
            reason = f"{reason}; but its body's node {failed[0].node} fails: {failed[0].reason}"
    return NodeVerdict(ctx.label, ctx.domain, ctx.op_type, worst, reason, tuple(code for code, _ in hits))


def _real_parse(
    model: onnx.ModelProto, path: str | None, contexts: list[NodeContext] | None = None
) -> tuple[str, bool | None, dict[str, str], list[str]]:
    """Run ``opbridge.tensorrt.parse_with_tensorrt``; returns (backend, ok, per-node messages keyed by
    label, notes): the parser's errors attributed to the nodes of ``contexts`` by :func:`_attribute_errors`."""
    try:
        from opbridge.tensorrt import parse_with_tensorrt  # type: ignore[import-not-found]
    except ImportError as exc:
        return "not available", None, {}, [f"real parser not available: opbridge.tensorrt cannot be imported ({exc})"]
    from opbridge.errors import BackendUnavailableError

    tmp = None
    if path is None:
        from opbridge.export import save_model_atomic

        tmp = tempfile.mkdtemp(prefix="opbridge_compat_")
        path = str(save_model_atomic(model, Path(tmp) / "model.onnx"))
    try:
        report = parse_with_tensorrt(path)
    except (BackendUnavailableError, ImportError) as exc:
        return "not available", None, {}, [f"real parser not available: {exc}"]
    finally:
        if tmp is not None:
            for f in Path(tmp).iterdir():
                f.unlink()
            os.rmdir(tmp)
    per_node, notes = _attribute_errors(report.errors, contexts or [])
    if not report.ok and not report.errors:
        notes.append("real parser: failed without naming a node or giving a message")
    return str(report.backend), bool(report.ok), per_node, notes


def _attribute_errors(
    errors: list[tuple[str, str, str]], contexts: list[NodeContext]
) -> tuple[dict[str, str], list[str]]:
    """The parser's ``(node_name, op_type, message)`` errors as messages per node label, and notes for
    those that name no node of ``contexts``. The parser names a node of an If/Loop/Scan body or of a
    function body by its own name, while the verdicts are keyed by label (``if/then_branch/node``): a name
    goes to every node of that name; one only a function body holds goes to the calls of that function;
    an unnamed node's message, to the one unnamed node of its op type."""
    by_name: dict[str, list[str]] = {}
    unnamed: dict[str, list[str]] = {}
    for c in contexts:
        if c.proto.name:
            by_name.setdefault(c.proto.name, []).append(c.label)
        else:
            unnamed.setdefault(c.op_type, []).append(c.label)
    in_bodies: dict[str, list[str]] = {}  # body node name -> the calls whose bodies hold it
    callers: dict[str, list[str]] = {}  # op type -> the calls whose bodies hold it (and no graph node does)
    graph_types = {c.op_type for c in contexts if not c.function}
    for c in contexts:
        if c.has_function and not c.function:
            body = body_contexts(c)
            for b in body:
                if b.proto.name and c.label not in in_bodies.get(b.proto.name, []):
                    in_bodies.setdefault(b.proto.name, []).append(c.label)
            for inner in {b.op_type for b in body} - graph_types:
                callers.setdefault(inner, []).append(c.label)
    messages: dict[str, list[str]] = {}
    notes = []
    for node_name, op_type, message in errors:
        message = " | ".join(line for line in message.splitlines() if line.strip())  # (one line per verdict and note)
        # every message of the node, in order: opbridge's reason first, then TensorRT's own
        if node_name in by_name:
            targets = [(label, message) for label in by_name[node_name]]
        elif node_name in in_bodies:
            text = f"its function body's {op_type} {node_name!r}: {message}"
            targets = [(call, text) for call in in_bodies[node_name]]
        elif not node_name and len(unnamed.get(op_type, [])) == 1:
            targets = [(unnamed[op_type][0], message)]
        elif not node_name and op_type in callers:
            targets = [(label, f"its function body's {op_type}: {message}") for label in callers[op_type]]
        else:
            where = f"node {node_name!r} ({op_type})" if node_name else op_type or ""
            notes.append(f"real parser: {where}: {message}" if where else f"real parser: {message}")
            continue
        for label, text in targets:
            messages.setdefault(label, []).append(text)
    return {label: " / ".join(found) for label, found in messages.items()}, notes


# The opset ranges onnx-tensorrt docs/operators.md gives: "TensorRT 10.0 supports operators in the inclusive
# range of opset 9 to opset 20", 10.15: 9 to 24 (the newest release it documents here).
_DOCUMENTED_OPSETS: tuple[tuple[Version, int], ...] = (((10, 0), 20), ((10, 15), 24))
_OLDEST_OPSET_WARNING = (
    "TensorRT supports ONNX graphs generated with at least opset 7. Models using older opsets are not guaranteed "
    "to work."
)


def _opset_notes(model: onnx.ModelProto, version: Version) -> list[str]:
    """Notes on the model's ONNX opset against the parser's: its warning below opset 7 (ModelImporter.cpp;
    TensorRT-RTX 1.7, measured) and the range docs/operators.md gives for TensorRT 10. The parser checks no
    upper bound: TensorRT-RTX 1.7 imports a Relu of opset 28 (measured), each op by its type."""
    from opbridge.graph._model import opset_version

    opset = opset_version(model, "")
    if opset is None:
        return []
    fix = "convert it with onnx.version_converter.convert_version (or export at a documented opset)"
    if opset < 7:
        return [
            f'the model imports ONNX opset {opset}: TensorRT\'s parser warns "{_OLDEST_OPSET_WARNING}" (it still '
            f"imports Pad-2, Slice-1 and Squeeze-1: TensorRT-RTX 1.7, measured); {fix}"
        ]
    documented = [(since, top) for since, top in _DOCUMENTED_OPSETS if since <= version]
    if not documented:
        return []
    since, top = documented[-1]
    docs = f"docs/operators.md for TensorRT {since[0]}.{since[1]} documents opsets 9 to {top}"
    if opset < 9:
        return [
            f"the model imports ONNX opset {opset}, below the range {docs}; TensorRT-RTX 1.7's parser imports it "
            "without a warning (Relu and Upsample-7 at opset 7, measured)"
        ]
    if opset > top:
        return [
            f"the model imports ONNX opset {opset}, above the range {docs}; the parser checks no upper bound and "
            "imports each op by its type (TensorRT-RTX 1.7 parses a Relu of opset 28, measured); ops it has no "
            "importer for are named by trt-plugin-path"
        ]
    return []


def check_tensorrt(
    model: onnx.ModelProto, *, version: str | int | None = None, real: bool = True, path: str | None = None
) -> CompatReport:
    """Per-node TensorRT verdicts from :data:`TRT_RULES`, plus the real parser's when available.

    Args:
        model: the model.
        version: TensorRT version to evaluate the rules for (``"8.6"``); the newest behaviour when None.
        real: also run ``opbridge.tensorrt.parse_with_tensorrt`` when it can be imported.
        path: the model's file, handed to the real parser (a temporary copy is written otherwise).
    """
    v = parse_trt_version(version)
    contexts = node_contexts(model)
    nodes = [_static_verdict(ctx, v) for ctx in contexts]
    backend, ok, per_node, notes = ("not run", None, {}, []) if not real else _real_parse(model, path, contexts)
    notes = _opset_notes(model, v) + notes
    by_label = {ctx.label: ctx for ctx in contexts}
    for n in nodes:  # (the parser names the body node where an If/Loop fails for a reason of its own)
        inner = [
            label
            for label in per_node
            if label.startswith(f"{n.node}/") and by_label.get(label) and f"'{by_label[label].proto.name}'" in n.reason
        ]
        if n.verdict == "fail" and n.node not in per_node and inner:
            per_node[n.node] = f"{per_node[inner[0]]} (at its body's node {inner[0]})"
    if ok is not None:
        nodes = [
            replace(
                n, real=f"fail: {per_node[n.node]}" if n.node in per_node else ("ok" if ok else "no error reported")
            )
            for n in nodes
        ]
    elif real:
        nodes = [NodeVerdict(n.node, n.domain, n.op_type, n.verdict, n.reason, n.rules, "not available") for n in nodes]
    label = "latest parser rules" if v == LATEST else f"TensorRT {v[0]}.{v[1]} rules"
    return CompatReport("tensorrt", label, nodes, backend, ok, notes)
