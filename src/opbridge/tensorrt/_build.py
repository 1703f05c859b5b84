"""Parsing ONNX models and building engines with the generated plugins.

The work runs in a child process by default (``isolate=True``): TensorRT can end
a process natively (``std::terminate``) on some faults, and the caller's process
must survive that. The child imports the built-in ops, the ``ops`` targets and
the modules that defined the caller's ops, registers the plugins, and returns a
JSON report. It does not outlive the call: it is killed when the call ends by an
exception (Ctrl-C, or a SIGTERM to a caller whose main thread waits for it), and
on Linux it ends itself when its caller is gone.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbridge._terminate import sigterm_unwinds
from opbridge.errors import BackendUnavailableError, ModelLoadError, OpbridgeError
from opbridge.tensorrt._fields import PARSER_ATTRIBUTES

if TYPE_CHECKING:
    from opbridge.definition import OpDef

__all__ = ["BuildReport", "ParseReport", "Profile", "build_engine", "check_profiles", "parse_with_tensorrt"]

logger = logging.getLogger(__name__)

Profile = Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[int]]]
ErrorEntry = tuple[str, str, str]

# TensorRT-RTX without a GPU adds this line to every error; it says nothing about the model.
_NOISE = ("cudaError 35",)


@dataclass(frozen=True)
class ParseReport:
    """Outcome of parsing a model with TensorRT's ONNX parser.

    ``errors`` holds ``(node_name, op_type, message)``; opbridge's own messages start with ``opbridge:``.
    """

    ok: bool
    backend: str
    errors: list[ErrorEntry] = field(default_factory=list)
    output_shapes: dict[str, list[int]] = field(default_factory=dict)  # -1 marks a dynamic dim


@dataclass(frozen=True)
class BuildReport:
    """Outcome of building an engine: ``engine_path`` is set (and written) only when ``ok``."""

    ok: bool
    backend: str
    errors: list[ErrorEntry] = field(default_factory=list)
    engine_path: str | None = None
    engine_bytes: int = 0
    log: list[str] = field(default_factory=list)
    # node -> {"op", "inputs", "outputs"}: (min, max) shapes TensorRT gave configure_plugin over the profile
    plugin_shapes: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """Human-readable summary (what ``opbridge trt-build`` prints)."""
        if self.ok:
            where = self.engine_path or "an engine (not written)"
            return f"built {where} ({self.engine_bytes} bytes) with {self.backend}"
        lines = [f"build failed with {self.backend}:"]
        for node, op_type, message in self.errors:
            where = f"{node} ({op_type}): " if node or op_type else ""
            lines.append(f"  {where}{message}")
        return "\n".join(lines)


def _model_inputs(model_path: Path) -> dict[str, tuple[int | str | None, ...]]:
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:
        raise ModelLoadError(f"{model_path}: cannot read it as an ONNX model ({exc}).") from exc
    initializers = {i.name for i in model.graph.initializer}
    out: dict[str, tuple[int | str | None, ...]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            raise OpbridgeError(
                f"{model_path}: input {value.name!r} has no shape in the model (not even a rank), which TensorRT "
                "needs to build; declare it (export with its shape, or set the graph input's dims)."
            )
        dims = []
        for d in value.type.tensor_type.shape.dim:
            dims.append(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None))
        out[value.name] = tuple(dims)
    return out


def _fmt(dims: Sequence[Any]) -> str:
    return "x".join(str(d) if isinstance(d, int) else "N" for d in dims)


def _profile_argument(profiles: Any) -> dict[str, tuple[tuple[int, ...], ...]]:
    """``profiles`` as ``{input: (min, opt, max)}`` of int tuples, or an OpbridgeError showing the form."""
    import numbers

    example = (
        "e.g. profiles={'x': ((1, 3, 8, 8), (1, 3, 64, 64), (4, 3, 256, 256))} "
        "(on the command line: --profile x:1x3x8x8,1x3x64x64,4x3x256x256)"
    )
    if profiles is None:
        return {}
    if not isinstance(profiles, Mapping):
        raise OpbridgeError(
            f"profiles is a {type(profiles).__name__}; give a dict of input name to (min, opt, max), {example}."
        )
    out: dict[str, tuple[tuple[int, ...], ...]] = {}
    for name, triple in profiles.items():
        ok = isinstance(triple, (tuple, list)) and all(
            isinstance(shape, (tuple, list))
            and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in shape)
            for shape in triple
        )
        if not ok:
            raise OpbridgeError(f"profile of {name!r}: {triple!r}; give three shapes of whole numbers, {example}.")
        out[str(name)] = tuple(tuple(int(v) for v in shape) for shape in triple)
    return out


def check_profiles(model_path: str | os.PathLike[str], profiles: Profile | None) -> dict[str, Any]:
    """The profiles for the model's inputs, checked (names, ranks, static dims, ``min <= opt <= max``)
    and completed; an :class:`OpbridgeError` naming the problem otherwise.

    Every input with a dynamic dim needs a profile ``(min, opt, max)``. An input whose dynamic dims
    are all named dims (``batch``) that another input's profile sets gets its profile from there;
    two profiles that give one named dim different ranges are refused.
    """
    return _check_profiles(model_path, profiles, cli=False)


def _check_profiles(model_path: str | os.PathLike[str], profiles: Profile | None, *, cli: bool) -> dict[str, Any]:
    """:func:`check_profiles`; its messages name a profile as ``trt-build`` takes it (``--profile x``) with
    ``cli``, else as :func:`build_engine` does (``profiles['x']``)."""

    def where(name: str) -> str:
        return f"--profile {name}" if cli else f"profiles[{name!r}]"

    def shape_text(dims: Sequence[Any]) -> str:
        return _fmt(dims) if cli else str(tuple(dims))

    order = "MIN <= OPT <= MAX" if cli else "min <= opt <= max"
    path = Path(model_path)
    inputs = _model_inputs(path)
    given = _profile_argument(profiles)
    for name in given:
        if name not in inputs:
            raise OpbridgeError(f"{where(name)}: the model has no input {name!r}; its inputs are {sorted(inputs)}.")
    named: dict[str, tuple[tuple[int, int, int], str]] = {}  # dim name -> (min, opt, max), the input setting it
    for name, triple in given.items():
        dims = inputs[name]
        if len(triple) != 3:
            three = "MIN,OPT,MAX" if cli else "(min, opt, max)"
            raise OpbridgeError(f"{where(name)}: give three shapes {three}.")
        for label, shape in zip(("min", "opt", "max"), triple):
            if any(not 0 <= v <= _INT32[1] for v in shape):  # TensorRT's dims are int32
                raise OpbridgeError(
                    f"{where(name)}: the {label} shape {shape_text(shape)} has a dim outside 0..{_INT32[1]}, the "
                    "sizes TensorRT's dims hold."
                )
            if len(shape) != len(dims):
                raise OpbridgeError(
                    f"{where(name)}: the {label} shape {shape_text(shape)} has rank {len(shape)}, "
                    f"but input {name!r} is {_fmt(dims)} (rank {len(dims)})."
                )
            for axis, (d, s) in enumerate(zip(dims, shape)):
                if isinstance(d, int) and d != s:
                    raise OpbridgeError(
                        f"{where(name)}: the {label} shape {shape_text(shape)} sets axis {axis} to {s}, "
                        f"but the model fixes it at {d}."
                    )
        lo, mid, hi = triple
        if not all(a <= b <= c for a, b, c in zip(lo, mid, hi)):
            raise OpbridgeError(f"{where(name)}: need {order} on every axis, got {lo}, {mid}, {hi}.")
        for axis, d in enumerate(dims):
            if isinstance(d, str):
                span = (lo[axis], mid[axis], hi[axis])
                if d in named and named[d][0] != span:
                    other_span, other = named[d]
                    raise OpbridgeError(
                        f"{where(name)}: axis {axis} is the named dim {d!r}, which {where(other)} gives the "
                        f"range {other_span} (min, opt, max); inputs that share a named dim need one range: give "
                        f"{d!r} {span} or {other_span} in both."
                    )
                named.setdefault(d, (span, name))
    out: dict[str, Any] = dict(given)
    missing: dict[str, tuple[tuple[int, ...], ...]] = {}  # input -> the profile suggested for it
    for name, dims in inputs.items():
        if name in out or all(isinstance(d, int) for d in dims):
            continue
        if all(isinstance(d, int) or (isinstance(d, str) and d in named) for d in dims):
            out[name] = tuple(tuple(d if isinstance(d, int) else named[str(d)][0][k] for d in dims) for k in range(3))
            logger.info("profile of %s from its named dims: %s", name, out[name])
            continue
        # (dims another profile sets keep its range: a different one would be refused)
        missing[name] = tuple(
            tuple(d if isinstance(d, int) else named[d][0][k] if isinstance(d, str) and d in named else 1 for d in dims)
            for k in range(3)
        )
        if len(missing) == 1:
            first = f"input {name!r} has dynamic dims ({'x'.join(str(d) if d is not None else '?' for d in dims)})"
    if missing:
        others = f" and {len(missing) - 1} other input(s)" if len(missing) > 1 else ""
        if cli:
            example = " ".join(f"--profile {n}:{','.join(_fmt(s) for s in t)}" for n, t in missing.items())
            how = f"give each its range as --profile NAME:MIN,OPT,MAX, e.g. {example}"
        else:
            how = f"give each its range in profiles as {{input: (min, opt, max)}}, e.g. profiles={missing!r}"
        raise OpbridgeError(
            f"{first}{others}: {how} (an input whose dynamic dims are all named dims another profile sets takes "
            "their range)."
        )
    return out


# --------------------------------------------------------------------------- in-process work


def _run_in_process(
    model_path: str, engine_path: str | None, profiles: dict[str, list[list[int]]], build: bool, echo: bool = False
) -> dict[str, Any]:
    """Parse (and build) in this process; returns the JSON-able report. With ``echo``, each step and
    TensorRT's log lines also go to stderr as they happen (the worker process's last words)."""
    from opbridge.tensorrt._loader import in_process_plugin_problem, load_tensorrt
    from opbridge.tensorrt._plugin import (
        clear_errors,
        configured_ranges,
        recorded_errors,
    )
    from opbridge.tensorrt._registry import register_plugins

    trt, backend = load_tensorrt()
    register_plugins()
    clear_errors()

    class _Collect(trt.ILogger):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.lines: list[tuple[str, str]] = []

        def log(self, severity: Any, msg: str) -> None:
            if any(n in msg for n in _NOISE):
                return
            self.lines.append((severity.name, msg))
            if echo:  # the calling process shows the tail if TensorRT ends this one before it reports
                print(f"[{severity.name}] {msg}", file=sys.stderr, flush=True)

    def stage(text: str) -> None:
        if echo:
            print(f"opbridge: {text}", file=sys.stderr, flush=True)

    pre, tagged, kernelless = _prepare(model_path)
    problem = in_process_plugin_problem()
    if problem is not None:
        plugin = _plugin_node(model_path)
        if plugin is not None:
            raise BackendUnavailableError(
                f"{problem} ({plugin} in {model_path}). Parse or build with isolate=True (the default), or call "
                "opbridge.tensorrt.load_tensorrt() before anything imports tensorrt_rtx."
            )
    if pre:
        return {
            "backend": backend,
            "ok": False,
            "engine_bytes": 0,
            "engine_path": None,
            "errors": [list(e) for e in pre],
            "log": [],
        }
    tlog = _Collect()
    builder = trt.Builder(tlog)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, tlog)
    if tagged is None:
        with open(model_path, "rb") as fh:
            tagged = fh.read()
    data = tagged
    stage(f"parsing {model_path}")
    parsed = bool(parser.parse(data, model_path)) if _takes_path(parser) else bool(parser.parse(data))
    errors: list[ErrorEntry] = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        desc = str(err.desc())
        if "Plugin not found" in desc:
            desc += f" (opbridge: {_plugin_not_found(str(err.node_operator()))})"
        errors.append((str(err.node_name()), str(err.node_operator()), desc))
    report: dict[str, Any] = {
        "backend": backend,
        "version": str(getattr(trt, "__version__", "")),
        "ok": parsed,
        "parsed": parsed,
        "engine_bytes": 0,
        "engine_path": None,
        "kernelless": kernelless,
    }
    report["output_shapes"] = (
        {network.get_output(i).name: [int(d) for d in network.get_output(i).shape] for i in range(network.num_outputs)}
        if parsed
        else {}
    )
    if parsed and build:
        config = builder.create_builder_config()
        dynamic = [
            network.get_input(i) for i in range(network.num_inputs) if any(d < 0 for d in network.get_input(i).shape)
        ]
        if dynamic or profiles:
            profile = builder.create_optimization_profile()
            for tensor in dynamic:
                if tensor.name not in profiles:
                    errors.append(
                        ("", "", f"opbridge: input {tensor.name!r} {tuple(tensor.shape)} is dynamic; give a profile")
                    )
            for name, (lo, mid, hi) in profiles.items():
                profile.set_shape(name, tuple(lo), tuple(mid), tuple(hi))
            config.add_optimization_profile(profile)
        if not errors:
            stage("building the engine")
        engine = None if errors else builder.build_serialized_network(network, config)
        if engine is None:
            report["ok"] = False
        else:
            blob = bytes(memoryview(engine))
            report["engine_bytes"] = len(blob)
            if engine_path:
                from opbridge._files import write_atomic

                report["engine_path"] = str(write_atomic(engine_path, lambda fh: fh.write(blob)))
    ours = recorded_errors()
    if parsed and not report["ok"] and not errors:
        errors = [("", "", msg) for sev, msg in tlog.lines if sev in ("ERROR", "INTERNAL_ERROR")]
    errors = ours + [(node, op, _clean(msg)) for node, op, msg in errors if (node, op, msg) not in ours]
    if not report["ok"] and not errors:
        errors.append(("", "", "TensorRT reported a failure without a message"))
    report["errors"] = [list(e) for e in errors if e[2]]
    report["log"] = [f"[{sev}] {msg}" for sev, msg in tlog.lines]
    report["plugin_shapes"] = configured_ranges()
    return report


_INT32 = (-(2**31), 2**31 - 1)


def _plugin_not_found(op_type: str) -> str:
    """Why no plugin serves ``op_type``: ops of that name in another domain or at another version than the
    model imports, or none."""
    from opbridge.definition import all_ops
    from opbridge.legacy_domain import is_standard_op

    versions = sorted({f"{d.spec.qualname} v{d.spec.version}" for d in all_ops() if d.spec.name == op_type})
    if is_standard_op(op_type) and not versions:
        return (
            f"{op_type} is an ONNX op this TensorRT's parser has no importer for; where it comes from an op's "
            "function body, export with functions=False (--no-functions): the node then reaches TensorRT as that "
            "op, which opbridge's plugin runs"
        )
    if versions:
        return (
            f"the ops named {op_type} defined here are {versions}, none of the node's domain at the version the "
            "model imports for it (its opset_import); export again, or define the op the node names"
        )
    return (
        f"no op named {op_type} is defined and no other library registered a plugin for it; define it with "
        "@opbridge.op and pass its file in ops (--ops on the command line)"
    )


def _plugin_node(model_path: str) -> str | None:
    """The first node TensorRT's parser would import as a plugin (``node 'name' (domain::op)``), or None:
    a node of an op outside ONNX's default domain, or of no ONNX op in it, that is no local function."""
    import onnx

    from opbridge.graph._model import labelled_nodes
    from opbridge.legacy_domain import is_standard_op

    model = onnx.load(model_path, load_external_data=False)
    local = {(f.domain, f.name) for f in model.functions}
    called = _called_functions(model)
    for path, name, node, fn in labelled_nodes(model):
        if fn is not None and (fn.domain, fn.name) not in called:
            continue
        standard = node.domain in ("", "ai.onnx") and is_standard_op(node.op_type)
        if not standard and (node.domain, node.op_type) not in local:
            return f"node {path + name!r} ({node.domain}::{node.op_type})"
    return None


def _called_functions(model: Any) -> set[tuple[str, str]]:
    """``(domain, name)`` of the local functions the graph calls, directly or through other functions. Not
    told apart by overload: TensorRT's parser finds a local function by its op type, so any overload of a
    called name may be the body it imports."""
    from opbridge.model_io import walk_nodes

    bodies = {(f.domain, f.name): f for f in model.functions}
    called: set[tuple[str, str]] = set()
    todo = [n for n in walk_nodes(model.graph.node) if (n.domain, n.op_type) in bodies]
    while todo:
        node = todo.pop()
        key = (node.domain, node.op_type)
        if key not in called:
            called.add(key)
            todo += [n for n in walk_nodes(bodies[key].node) if (n.domain, n.op_type) in bodies]
    return called


def _shapes(model: Any, wanted: set[str]) -> dict[str, tuple[int | str | None, ...]]:
    """The dims of each value of the graph and its subgraphs that declares a shape (its name, else None,
    where a dim is not a fixed size); where a ``wanted`` one declares none (a custom node's output), ONNX shape inference
    with opbridge's schemas may give it."""
    from opbridge.model_io import value_types

    shaped = value_types(model, sorted(wanted), lambda t: t.tensor_type.HasField("shape"))
    return {
        name: tuple(
            d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
            for d in t.tensor_type.shape.dim
        )
        for name, t in shaped.items()
    }


def _prepare(model_path: str) -> tuple[list[ErrorEntry], bytes | None, list[str]]:
    """Faults the parser would hide, and the model as the parser should read it.

    - INT/INTS attributes of opbridge ops beyond int32, in the main graph, in If/Loop/Scan bodies and in
      the bodies of the local functions it calls:
      TensorRT's ONNX parser narrows INT attributes to int32 plugin fields without a word (2**40
      arrives as 0), so opbridge refuses such a model before parsing.
    - Each node of an opbridge op without a model-local function body gets, in memory,
      ``plugin_namespace`` = its domain and ``plugin_version`` = its op's version (from the model's
      opset import), unless it sets them: the parser otherwise looks for version "1" under namespace
      "", where an op of another domain with the same name, or the op's other version, may be
      registered. Nodes with a body are left as they are: the parser imports the body (a
      ``plugin_namespace`` attribute would make it take the plugin instead). A node named like a local
      function of another domain is tagged too (the parser finds local functions by op type alone); inside
      a function body the parser takes that function even so, and such a node is refused.
    - Attributes the op does not declare (the parser passes a plugin only the fields its creator names:
      a misspelt one would vanish), ops declaring an attribute the parser takes for itself
      (``plugin_namespace``, ``plugin_version``), more inputs than the op takes and required inputs left
      out are refused. Trailing empty input names (optional inputs left out) are dropped in memory: the
      parser would hand the plugin a null tensor for each.

    - The plugin nodes' inputs' shapes (declared, else from ONNX shape inference) go to the plugins
      (:func:`~opbridge.tensorrt._plugin.set_input_shapes`): TensorRT asks for output dtypes before shapes.

    Returns the errors, the tagged model's bytes (None where no node was tagged) and the plugin
    ops without a GPU kernel (an engine holding them builds, and each enqueue runs the op's PyTorch
    reference on the GPU).
    """
    import onnx

    from opbridge.definition import all_ops, find_op
    from opbridge.graph._model import bound_attributes, labelled_nodes
    from opbridge.legacy_domain import is_standard_op
    from opbridge.onnx_schema import attribute_values
    from opbridge.onnxruntime.bridge import check_attribute_values

    names = {op.spec.name for op in all_ops()}
    model = onnx.load(model_path, load_external_data=False)
    opset = {o.domain: o.version for o in model.opset_import}
    local = {(f.domain, f.name) for f in model.functions}
    errors: list[ErrorEntry] = []
    kernelless: set[str] = set()
    plugin_inputs: dict[str, list[str]] = {}
    tagged = False
    called = _called_functions(model)
    # the graph, its If/Loop/Scan bodies and the bodies of the local functions it calls, which the parser
    # imports too
    for _, _, node, fn in labelled_nodes(model):
        if fn is not None and (fn.domain, fn.name) not in called:
            continue
        if "\x00" in node.name:
            errors.append(
                (
                    node.name.split("\x00")[0],
                    node.op_type,
                    f"opbridge: node name {node.name!r} holds a NUL character; TensorRT cuts names there (two nodes "
                    "may then share one, or a node's errors go under another's name): rename the node.",
                )
            )
        versions = opset if fn is None else {**opset, **{o.domain: o.version for o in fn.opset_import}}
        if node.domain not in ("", "ai.onnx"):
            opdef = find_op(node.domain, node.op_type, versions.get(node.domain, 1))
        else:  # the op whose plugin a default-domain node finds under namespace '' (not an ONNX op's node)
            opdef = None if is_standard_op(node.op_type) else _default_domain_op(node)
        if opdef is None and node.op_type not in names:
            continue
        # (an attribute a body's node takes from its function's call: the values the calls give it)
        for attr_name, attr, via in bound_attributes(model, node, fn):
            texts = [attr.s] if attr.type == onnx.AttributeProto.STRING else list(attr.strings)
            if any(b"\x00" in t for t in texts):
                errors.append(
                    (
                        node.name,
                        node.op_type,
                        f"opbridge: attribute {attr_name!r}{via} holds a string with a NUL character; TensorRT passes "
                        "string fields NUL-terminated, so the plugin would see it cut or split. Keep NUL out of "
                        "attributes of ops meant for TensorRT.",
                    )
                )
            values = [attr.i] if attr.type == onnx.AttributeProto.INT else list(attr.ints)
            bad = [v for v in values if not _INT32[0] <= v <= _INT32[1]]
            if bad:
                message = (
                    f"opbridge: attribute {attr_name!r}{via} holds {bad[0]}, outside int32; TensorRT's ONNX parser "
                    "narrows INT attributes to int32 plugin fields, so the plugin would see a different value. "
                    "Keep INT attributes of ops meant for TensorRT within int32."
                )
                errors.append((node.name, node.op_type, message))
        if opdef is None:
            continue
        spec = opdef.spec
        outputs = list(node.output)
        if len(outputs) != len(spec.outputs):
            errors.append(
                (
                    node.name,
                    node.op_type,
                    f"opbridge: the node has {len(outputs)} output(s), but {spec.qualname} has {len(spec.outputs)} "
                    f"({[o.name for o in spec.outputs]}), which its plugin writes; give the node every output "
                    "(unused ones may have any name).",
                )
            )
        inputs = list(node.input)
        while inputs and not inputs[-1]:
            inputs.pop()
        given = inputs + [""] * (len(spec.inputs) - len(inputs))
        missing = [p.name for p, name in zip(spec.inputs, given) if not p.optional and not name]
        if missing:
            errors.append(
                (
                    node.name,
                    node.op_type,
                    f"opbridge: the node gives no {', '.join(repr(m) for m in missing)}, which {spec.qualname} "
                    f"requires (it takes {', '.join(p.name for p in spec.inputs)}): re-export the model or fix the "
                    "node.",
                )
            )
        skipped = [p.name for p, name in zip(spec.inputs, inputs) if p.optional and not name]
        if skipped:
            errors.append(
                (
                    node.name,
                    node.op_type,
                    f"opbridge: optional input(s) {skipped} are skipped before a given one; TensorRT hands a "
                    "plugin its inputs by position without gaps, so the plugin cannot tell which are missing. "
                    "Give them, or reorder the op's inputs so that optional ones come last.",
                )
            )
        declared = {a.name for a in spec.attributes}
        taken = sorted(declared & PARSER_ATTRIBUTES)
        if taken:  # the parser reads them for itself (the plugin's lookup) and passes them to no plugin
            errors.append(
                (
                    node.name,
                    node.op_type,
                    f"opbridge: {spec.qualname} declares attribute(s) {taken}, which TensorRT's ONNX parser takes "
                    "for the plugin's lookup and never passes to a plugin; rename them in the op.",
                )
            )
        stray = sorted(a.name for a in node.attribute if a.name not in declared | PARSER_ATTRIBUTES)
        if stray:  # the parser hands the plugin only the fields its creator names: these would vanish
            errors.append(
                (
                    node.name,
                    node.op_type,
                    f"opbridge: the node has attribute(s) {stray} that {spec.qualname} does not declare (it takes "
                    f"{sorted(declared)}); TensorRT would drop them and the plugin use its defaults. Fix the names.",
                )
            )
        try:  # each attribute of the type the op declares (a TENSOR or GRAPH one fails in the plugin's creator)
            # (a body's node may take one from its call)
            read = attribute_values(spec, node, references=fn is not None)
            check_attribute_values(opdef, node, "the node", read)  # (and of a value the op takes)
        except ValueError as exc:
            errors.append((node.name, node.op_type, f"opbridge: {exc}"))
        if len(inputs) > len(spec.inputs):
            errors.append(
                (
                    node.name,
                    node.op_type,
                    f"opbridge: the node has {len(inputs)} inputs, but {spec.qualname} takes {len(spec.inputs)} "
                    f"({[i.name for i in spec.inputs]}).",
                )
            )
        if (node.domain, node.op_type) in local:
            continue  # the parser imports the function body (a plugin_namespace would override it)
        if len(inputs) < len(node.input):  # trailing empty names: the parser would hand the plugin null tensors
            del node.input[len(inputs) :]
            tagged = True
        twins = sorted(f"{d}::{n}" for d, n in local if n == node.op_type)
        if fn is not None and twins:
            # inside a function body the parser takes the local function of that op type even over a
            # plugin_namespace (TensorRT-RTX 1.7): the node would run another op's body
            errors.append(
                (
                    node.name,
                    node.op_type,
                    f"opbridge: this {spec.qualname} node sits in the body of {fn.domain}::{fn.name}, and the model "
                    f"has a local function {twins[0]} of that name, which TensorRT's parser would import in its "
                    "place; export without function bodies (functions=False) or give the ops different names.",
                )
            )
            continue
        # (a node named like another domain's local function is tagged: the parser finds local functions by
        # op type alone, and would import that function's body in its place)
        if opdef.gpu_kernel is None:
            kernelless.add(spec.qualname)
        if fn is None and node.name:
            plugin_inputs[node.name] = inputs
        present = {a.name for a in node.attribute}
        for key, value in (("plugin_namespace", node.domain), ("plugin_version", str(opdef.spec.version))):
            if key not in present:
                node.attribute.append(onnx.helper.make_attribute(key, value))
                tagged = True
    if plugin_inputs and not errors:
        from opbridge.tensorrt._plugin import set_input_shapes

        shapes = _shapes(model, {name for names in plugin_inputs.values() for name in names})
        set_input_shapes({node: [shapes.get(name) for name in names] for node, names in plugin_inputs.items()})
    return errors, (model.SerializeToString() if tagged and not errors else None), sorted(kernelless)


def _default_domain_op(node: Any) -> Any:
    """The opbridge op whose plugin TensorRT's parser finds for ``node`` of the default domain: the one
    registered under namespace ``""`` for its op type and ``plugin_version`` (unless the node names
    another namespace), or None."""
    from opbridge.graph.compat.tensorrt import empty_namespace_op

    fields = {a.name: a.s.decode("utf-8", "replace") for a in node.attribute if a.name in PARSER_ATTRIBUTES}
    if fields.get("plugin_namespace", ""):
        return None
    return empty_namespace_op(node.op_type, fields.get("plugin_version", "1"))


def _clean(message: str) -> str:
    """Drop the lines TensorRT-RTX adds to every error on a machine without a GPU."""
    return "\n".join(line for line in message.splitlines() if not any(n in line for n in _NOISE)).strip()


def _takes_path(parser: Any) -> bool:
    doc = getattr(parser.parse, "__doc__", "") or ""
    return "path" in doc


# --------------------------------------------------------------------------- child process


def _op_modules(model_path: str) -> list[str]:
    """Modules defining the caller's ops that the model uses, as targets the child can import."""
    import onnx

    from opbridge.definition import all_ops
    from opbridge.graph._model import labelled_nodes

    used = {n.op_type for _, _, n, _ in labelled_nodes(onnx.load(model_path, load_external_data=False))}
    targets: list[str] = []
    for opdef in all_ops():
        if opdef.spec.name not in used:
            continue
        if opdef._defining_module() == "__main__":
            logger.warning(
                "%s is defined in __main__, which a TensorRT child process cannot import; "
                "move it to a module or pass isolate=False.",
                opdef.spec.qualname,
            )
            _MAIN_OPS[opdef.spec.name] = opdef.spec.qualname
            continue
        target = _op_target(opdef)
        if target is not None and target not in targets:
            targets.append(target)
    return targets


# op type -> qualified name of the ops of the model that the calling process defined in __main__
_MAIN_OPS: dict[str, str] = {}


def _name_main_ops(result: dict[str, Any]) -> dict[str, Any]:
    """Where the child found no plugin for an op the caller defined in ``__main__``, say why."""
    for entry in result.get("errors", []):
        qualname = _MAIN_OPS.get(entry[1])
        if qualname and "Plugin not found" in entry[2]:
            entry[2] = entry[2].split(" (opbridge: no op named", 1)[0] + (
                f" (opbridge: {qualname} is defined in __main__, which the TensorRT child process cannot import: "
                "define it in a module, or pass isolate=False)"
            )
    return result


def _raise_usage_error(result: dict[str, Any]) -> None:
    """Raise in this process the opbridge error the child raised (TensorRT not installed, a model it
    cannot read): a usage error, not a parse or build failure."""
    from opbridge import errors

    kind = getattr(errors, str(result.get("error_type", "")), None)
    if not (isinstance(kind, type) and issubclass(kind, errors.OpbridgeError)):
        kind = errors.OpbridgeError
    raise kind(result["errors"][0][2])


_IN_WORKER = "OPBRIDGE_TENSORRT_WORKER"


def _run_isolated(request: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    if os.environ.get(_IN_WORKER):
        # an --ops module that parses or builds when imported would start workers without end
        raise OpbridgeError(
            "TensorRT's worker process was asked to start another one: a module it imports for its ops "
            f"({', '.join(request.get('ops', [])) or 'an ops target'}) parses or builds a model when imported; "
            "put that code under `if __name__ == '__main__':`"
        )
    _MAIN_OPS.clear()
    with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="opbridge_trt_") as tmp:
        req_path, res_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request = dict(request, auto_ops=_op_modules(request["model"]))
        req_path.write_text(json.dumps(request))
        env = dict(os.environ)
        env[_IN_WORKER] = str(os.getpid())  # the worker ends itself when this process is gone (_worker.py)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        ended = _run_worker(
            [sys.executable, "-m", "opbridge.tensorrt._worker", str(req_path), str(res_path)], env, timeout
        )
        if ended is None:
            return {
                "ok": False,
                "backend": _ENDED_BACKEND,
                "errors": [["", "", f"TensorRT did not finish within {timeout:.0f} s"]],
            }
        if res_path.exists():
            result = json.loads(res_path.read_text())
            if result.get("usage_error"):
                _raise_usage_error(result)
            return _name_main_ops(result)
        return {"ok": False, "backend": _ENDED_BACKEND, "errors": [["", "", _ended_early(*ended)]]}


def _run_worker(argv: list[str], env: dict[str, str], timeout: float | None) -> tuple[int, str] | None:
    """Run the worker to its end: its exit code and stderr, or None where it did not finish within
    ``timeout`` s. It does not outlive the call: an exception here (a timeout, Ctrl-C, :class:`~opbridge._terminate.Terminated`)
    kills it first."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env
    ) as proc:
        try:
            _, stderr = proc.communicate(timeout=timeout)
            return proc.returncode, stderr
        except subprocess.TimeoutExpired:
            return None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# the backend of a worker that ended before it reported which TensorRT it loaded
_ENDED_BACKEND = "TensorRT (its process ended before it reported)"


def _ended_early(code: int, stderr: str | None) -> str:
    """What to say of a worker that ended without writing its result: how it ended, and its last lines
    (the steps it began and TensorRT's log, which the worker echoes to stderr)."""

    how = f"exit code {code}"
    if code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}, exit code {code}"
        except ValueError:
            pass
    lines = (stderr or "").strip().splitlines()
    if not lines:
        return (
            f"TensorRT's process ended ({how}) before parsing the model, and printed nothing: it ended while "
            "importing TensorRT, the ops modules or the plugins' registration"
        )
    tail = lines[-15:]
    steps = [line for line in lines if line.startswith("opbridge: ")]
    if steps and steps[-1] not in tail:  # the step it was in, ahead of TensorRT's last words
        tail = [steps[-1], "..."] + tail
    shown = "\n".join(tail)
    return f"TensorRT's process ended ({how}) before reporting; its last lines:\n{shown}"


def _check_timeout(timeout: Any) -> None:
    """Raise where ``timeout`` is not a positive finite number of seconds or None (no limit)."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 < float(timeout) < math.inf:
        raise OpbridgeError(
            f"timeout must be a positive finite number of seconds (or None for no limit), got {timeout!r}."
        )


def _op_target(opdef: OpDef) -> str | None:
    """The target (module name, or file for an op file loaded by path) the child imports for ``opdef``;
    None where it needs none (a built-in op) or cannot import it (``__main__``, named when the model uses
    the op: :func:`_op_modules`)."""
    name = opdef._defining_module() or ""
    module = sys.modules.get(name)
    if not name or name == "__main__" or name.startswith("opbridge.") or module is None:
        return None
    file = getattr(module, "__file__", None)
    return file if name.startswith("_opbridge_user_") and file else name


def _ops_targets(ops: Any) -> list[str]:
    """``ops`` (op files, module names or OpDefs, or one of them) as targets the child can import."""
    from opbridge.definition import OpDef

    if ops is None:
        return []
    if isinstance(ops, (str, os.PathLike, OpDef)):  # one target, not its letters
        ops = [ops]
    if not isinstance(ops, Iterable):
        ops = [ops]
    targets: list[str] = []
    for item in ops:
        if isinstance(item, OpDef):
            target = _op_target(item)
        elif isinstance(item, (str, os.PathLike)):
            target = os.fspath(item)
        else:
            raise OpbridgeError(
                f"ops: {item!r} is a {type(item).__name__}; give op files (path/to/ops.py), module names "
                "(package.ops) or ops defined with @opbridge.op."
            )
        if target is not None and target not in targets:
            targets.append(str(target))
    return targets


def _request(model_path: str | os.PathLike[str], ops: Any) -> dict[str, Any]:
    from opbridge._loading import load_ops
    from opbridge.model_io import load_model

    if not isinstance(model_path, (str, os.PathLike)):
        raise OpbridgeError(
            f"TensorRT builds from a file, got a {type(model_path).__name__}; save the model first "
            "(onnx.save(model, 'model.onnx')) and give its path."
        )
    targets = _ops_targets(ops)
    path = Path(model_path)
    from opbridge.model_io import native_path

    if native_path(path.resolve()) is None:
        raise OpbridgeError(
            f"{os.fspath(model_path)!r}: the path holds bytes that are not UTF-8 text, which TensorRT's parser "
            "cannot open; rename the file (or its folder)."
        )
    # a missing, foreign or empty file is named as by the other commands, and so are data files that are
    # missing, cut or out of the model's folder (their sizes and places checked; no weight read here)
    load_model(path, caller="TensorRT", external_data=1)

    load_ops(targets)  # a bad target is the caller's usage error: raise it here, not in the child
    return {"model": str(path.resolve()), "ops": targets}


def parse_with_tensorrt(
    path: str | os.PathLike[str],
    *,
    ops: OpDef | str | os.PathLike[str] | Iterable[OpDef | str | os.PathLike[str]] = (),
    isolate: bool = True,
    timeout: float | None = 600.0,
) -> ParseReport:
    """Parse ``path`` with TensorRT's ONNX parser after registering opbridge's plugins.

    Args:
        path: the .onnx model.
        ops: extra ``--ops`` targets (files or modules) that define ops used by the model, or the ops
            (``OpDef``) themselves, whose defining modules the child imports.
        isolate: parse in a child process, so a native abort cannot end the caller.
        timeout: seconds before the child is stopped (positive; None: no limit).

    Example:
        >>> report = parse_with_tensorrt("model.onnx")  # doctest: +SKIP
        >>> report.ok, report.errors  # doctest: +SKIP
        (True, [])
    """
    _check_timeout(timeout)
    request = dict(_request(path, ops), build=False, engine=None, profiles={})
    result = _run_isolated(request, timeout) if isolate else _work(request)
    return ParseReport(
        bool(result["ok"]),
        str(result["backend"]),
        [tuple(e) for e in result["errors"]],
        dict(result.get("output_shapes", {})),
    )


def build_engine(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    profiles: Profile | None = None,
    ops: OpDef | str | os.PathLike[str] | Iterable[OpDef | str | os.PathLike[str]] = (),
    isolate: bool = True,
    timeout: float | None = 600.0,
) -> BuildReport:
    """Build a serialized engine from an ONNX model with opbridge's plugins (strongly typed network).

    Args:
        path: the .onnx model.
        output: where to write the engine (written only on success, atomically); ``None`` to only build.
        profiles: ``{input: (min, opt, max)}`` shapes; required for every input with dynamic dims.
        ops: extra ``--ops`` targets (files or modules) defining ops used by the model, or the ops
            (``OpDef``) themselves, whose defining modules the child imports.
        isolate: build in a child process, so a native abort cannot end the caller.
        timeout: seconds before the child is stopped (positive; None: no limit).

    Raises:
        OpbridgeError: bad profiles, ops or timeout, or a missing or unreadable model (usage errors).

    Example:
        >>> r = build_engine("srcnn.onnx", "srcnn.engine",
        ...                  profiles={"input": ((1, 3, 8, 8), (1, 3, 16, 16), (2, 3, 32, 32))})  # doctest: +SKIP
        >>> r.ok  # doctest: +SKIP
        True
    """
    return _build_engine(path, output, profiles=profiles, ops=ops, isolate=isolate, timeout=timeout, cli=False)


def _build_engine(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None,
    *,
    profiles: Profile | None,
    ops: Any,
    isolate: bool,
    timeout: float | None,
    cli: bool,
) -> BuildReport:
    """:func:`build_engine`; its usage errors name the arguments as ``trt-build`` takes them with ``cli``."""
    _check_timeout(timeout)
    request = _request(path, ops)
    profiles = _check_profiles(request["model"], profiles, cli=cli)
    if output is not None and Path(output).resolve() == Path(request["model"]):
        where = f"-o {output}" if cli else f"output {os.fspath(output)!r}"
        raise OpbridgeError(f"{where}: that is the input model; choose another path for the engine.")
    if output is not None and Path(output).suffix.lower() == ".onnx" and Path(output).is_file():
        # (another model, which an engine's bytes would replace: a slip of -o, not a wish)
        where = f"-o {output}" if cli else f"output {os.fspath(output)!r}"
        raise OpbridgeError(
            f"{where}: that is an ONNX model, which the engine would replace; write the engine to a file of its own "
            "(model.engine), or remove that file first."
        )
    if output is not None:
        from opbridge._files import prepare_output
        from opbridge.model_io import external_files

        # the model's external data files: an engine written over one corrupts the model
        prepare_output(output, protected=external_files(Path(request["model"])))
    request.update(
        build=True,
        engine=None if output is None else str(Path(output).resolve()),
        profiles={k: [list(map(int, s)) for s in v] for k, v in (profiles or {}).items()},
    )
    result = _explained(request, _run_isolated(request, timeout) if isolate else _work(request))
    if result.get("ok") and result.get("kernelless"):
        logger.warning(
            "the engine holds plugins of %s, which have no GPU kernel: each enqueue runs the op's PyTorch "
            "reference on the GPU (right, but not fast, and a reference that synchronizes keeps the engine out "
            "of CUDA graphs); register one with <op>.register_gpu_kernel(fn, dtypes=...)",
            ", ".join(result["kernelless"]),
        )
    built = _built_model(request["model"]) if result.get("ok") else None  # (read once for the notes below)
    narrowed = _float64_plugin_inputs(built) if built is not None else []
    if narrowed:
        logger.warning(
            "%s: float64 in the model, float32 in the engine. TensorRT has no float64 tensors, and its ONNX parser "
            "narrows them to float32 without a word, so these plugins compute in float32 (and the engine's float64 "
            "inputs take float32 data); where the other runtimes should compute as the engine does, cast to float32 "
            "before the op in the model",
            ", ".join(narrowed),
        )
    bodied = _ops_with_bodies(built) if built is not None else []
    if bodied:
        logger.warning(
            "%s ran as the model's ONNX function bodies, not as opbridge's plugins: TensorRT's parser imports a "
            "model-local function in place of a plugin. For the plugins, leave the bodies out of the model "
            "(export with functions=False, --no-functions)",
            ", ".join(bodied),
        )
    return BuildReport(
        bool(result["ok"]),
        str(result["backend"]),
        [tuple(e) for e in result["errors"]],
        result.get("engine_path"),
        int(result.get("engine_bytes", 0)),
        list(result.get("log", [])),
        dict(result.get("plugin_shapes", {})),
    )


def _explained(request: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with :func:`_static_explanations` added to its errors where the parse failed, or where
    TensorRT's process ended (or ran out of time) before it reported: the parser crashes on some models
    the static rules name (a local function that calls itself)."""
    if result.get("parsed") is False or result.get("backend") == _ENDED_BACKEND:
        result["errors"] = list(result["errors"]) + _static_explanations(request["model"], result)
    return result


def _static_explanations(model_path: str, result: dict[str, Any]) -> list[list[str]]:
    """Error entries for a failed parse from the static rules of ``opbridge compat --target tensorrt``,
    which name the cause and the fix where TensorRT's parser gives an internal assertion: the verdicts of
    the nodes the parser names, of the If/Loop/Scan nodes holding them, and of the calls of the local
    functions whose bodies hold them; of every node the rules fail where the parser names no node. Nodes
    that already have opbridge's explanation are left out."""
    import onnx

    from opbridge.graph._model import labelled_nodes
    from opbridge.graph.compat import check_compat

    version = result.get("version") if result.get("backend") == "tensorrt" else None  # RTX: the newest rules
    try:
        report = check_compat(model_path, "tensorrt", real=False, trt_version=version or None)
    except OpbridgeError as exc:  # (the parser's own errors stand; these only add to them)
        logger.info("the static TensorRT rules could not judge %s: %s", model_path, exc)
        return []
    errors = result.get("errors", [])
    covered = {e[0] for e in errors if "opbridge:" in e[2]}
    failing = [v for v in report.nodes if v.verdict == "fail" and v.node not in covered]
    named = {e[0] for e in errors if e[0]}
    if named and failing:
        places: list[tuple[str, str]] = []  # (path, label) of the named nodes of the graph and its subgraphs
        functions: set[tuple[str, str]] = set()  # local functions whose bodies hold a named node
        for prefix, label, node, fn in labelled_nodes(onnx.load(model_path, load_external_data=False)):
            if node.name in named:
                if fn is None:
                    places.append((prefix, prefix + label))
                else:
                    functions.add((fn.domain, fn.name))
        failing = [
            v
            for v in failing
            if (v.domain, v.op_type) in functions
            or any(v.node == label or prefix.startswith(v.node + "/") for prefix, label in places)
        ]
    return [[v.node, v.op_type, f"opbridge: {v.reason} (compat rule {', '.join(v.rules)})"] for v in failing]


def _built_model(model_path: str) -> Any:
    """The model a build read, without its external data; None where it cannot be read now (read by the
    build just before: nothing to add then)."""
    import onnx

    try:
        return onnx.load(model_path, load_external_data=False)
    except Exception:
        return None


def _float64_plugin_inputs(model: Any) -> list[str]:
    """``node 'name' input 'x'`` for each input of an opbridge op's node (of the graph and its If/Loop/Scan
    bodies, without a model-local function) that the model types float64: the parser hands it over as
    float32."""
    import onnx

    from opbridge.definition import find_op
    from opbridge.model_io import value_types, walk_nodes

    local = {(f.domain, f.name) for f in model.functions}
    opset = {o.domain: o.version for o in model.opset_import}
    nodes = [
        n
        for n in walk_nodes(model.graph.node)
        if n.domain not in ("", "ai.onnx")
        and (n.domain, n.op_type) not in local
        and find_op(n.domain, n.op_type, opset.get(n.domain, 1)) is not None
    ]
    wanted = sorted({i for n in nodes for i in n.input if i})
    types = value_types(model, wanted) if wanted else {}
    double = onnx.TensorProto.DOUBLE
    return [
        f"node {n.name or n.op_type!r} input {i!r}"
        for n in nodes
        for i in n.input
        if i in types and types[i].tensor_type.elem_type == double
    ]


def _ops_with_bodies(model: Any) -> list[str]:
    """The opbridge ops whose nodes in ``model`` TensorRT's parser runs as the model's function bodies:
    nodes of the graph and its If/Loop/Scan bodies with a model-local function."""
    from opbridge.definition import all_ops
    from opbridge.model_io import walk_nodes

    local = {(f.domain, f.name) for f in model.functions}
    known = {(d.spec.domain, d.spec.name) for d in all_ops()}
    return sorted(
        {
            f"{n.domain}::{n.op_type}"
            for n in walk_nodes(model.graph.node)
            if (n.domain, n.op_type) in local & known
            and not any(a.name == "plugin_namespace" for a in n.attribute)  # (the parser takes the plugin then)
        }
    )


def _work(request: dict[str, Any], *, echo: bool = False) -> dict[str, Any]:
    """Load ops, then parse/build; failures become error entries, not exceptions. ``echo`` (the worker
    process only): each step and TensorRT's log also go to stderr, for its caller to show if it dies; in the
    calling process TensorRT's log stays in the report."""
    from opbridge._loading import load_module

    errors: list[list[str]] = []
    for target in request.get("ops", []):
        load_module(target)  # the caller named it: its failure is the caller's usage error
    for target in request.get("auto_ops", []):
        try:
            load_module(target)
        except Exception as exc:
            logger.warning("could not import %s, which defines ops of the calling process: %s", target, exc)
    report = _run_in_process(
        request["model"], request.get("engine"), request.get("profiles", {}), request["build"], echo=echo
    )
    report["errors"] = errors + report["errors"]
    return report
