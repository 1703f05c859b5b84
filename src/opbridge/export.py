"""Export PyTorch models with opbridge ops to ONNX, through either PyTorch exporter.

``opbridge.export`` wraps ``torch.onnx.export`` and makes both exporters emit
every opbridge op as a custom node ``domain::Name`` with typed attributes and
an ``opset_import`` for its domain:

* ``exporter="dynamo"`` (torch's default): each op is a ``torch.library`` op,
  translated by a generated ``custom_translation_table`` entry; the ONNX schema
  that translation needs is registered first.
* ``exporter="torchscript"``: each op gets a generated symbolic function
  (``torch.onnx.register_custom_op_symbolic``) and its domain goes into
  ``custom_opsets``.

After export the model is checked: every op that was called while tracing must
be in the graph (an exporter that inlined or dropped one is an error, never a
silent fallback), ONNX shape inference runs with the ops' schemas, and
``onnx.checker.check_model(full_check=True)`` must pass. The file is written
atomically.

Example:
    >>> import torch, opbridge, tempfile, os
    >>> @opbridge.op("doc.export::Swish")
    ... def swish(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    ...     return x * torch.sigmoid(beta * x)
    >>> class M(torch.nn.Module):
    ...     def forward(self, x):
    ...         return swish(x, beta=2.0)
    >>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
    >>> result = opbridge.export(M(), (torch.randn(2, 3),), path, exporter="torchscript")
    >>> [(n.domain, n.op_type) for n in result.custom_nodes]
    [('doc.export', 'Swish')]
"""

from __future__ import annotations

import collections
import inspect
import logging
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from opbridge._loading import forward_signature
from opbridge._locks import ForkSafeLock
from opbridge.definition import OpDef, _decode_attr, all_ops, tracing_calls
from opbridge.errors import ExportError, raise_interrupt_behind
from opbridge.legacy_domain import default_domain_custom_nodes
from opbridge.model_io import walk_nodes
from opbridge.onnx_schema import register_onnx_schemas
from opbridge.spec import AttrType

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = ["CapturedWarning", "ExportResult", "export", "save_model_atomic"]

logger = logging.getLogger(__name__)

Exporter = Literal["dynamo", "torchscript"]

_TS_LOCK = ForkSafeLock()
_EXPORT_LOCK = ForkSafeLock(reentrant=True)
_TS_REGISTERED: dict[str, OpDef] = {}
# the ops (domain, name, version) whose nodes the running export's translations wrote, per thread: also
# those in control flow's bodies and in scripted code, which the call count does not see
_EMITTED = threading.local()


def _note_emitted(key: tuple[str, str, int]) -> None:
    emitted = getattr(_EMITTED, "keys", None)
    if emitted is not None:
        emitted.add(key)


@contextmanager
def _recording_emitted() -> Iterator[set[tuple[str, str, int]]]:
    previous = getattr(_EMITTED, "keys", None)
    keys: set[tuple[str, str, int]] = set()
    _EMITTED.keys = keys
    try:
        yield keys
    finally:
        _EMITTED.keys = previous


@dataclass(frozen=True)
class CapturedWarning:
    """A warning raised while tracing (e.g. a TracerWarning), kept instead of printed and lost."""

    category: str
    message: str
    filename: str
    lineno: int

    def __str__(self) -> str:
        return f"{self.category} at {os.path.basename(self.filename)}:{self.lineno}: {self.message}"


@dataclass
class ExportResult:
    """What :func:`export` wrote and checked."""

    path: Path
    model: onnx.ModelProto
    exporter: str
    custom_nodes: list[onnx.NodeProto] = field(default_factory=list)
    warnings: list[CapturedWarning] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)

    def summary(self) -> str:
        ops = sorted({f"{n.domain}::{n.op_type}" for n in self.custom_nodes})
        return f"{self.path} ({self.exporter}): {len(self.custom_nodes)} custom node(s) {ops}"


# --------------------------------------------------------------------------- dynamo


def _attr_value(attr: Any, value: Any) -> Any:
    """An attribute's value for onnxscript; an empty list as a typed attribute (onnxscript would type
    a bare ``[]`` as INTS, wrong for FLOATS and STRINGS)."""
    onnx_value = attr.to_onnx_value(value)
    if isinstance(onnx_value, (list, tuple)) and not onnx_value:
        import onnx_ir as ir

        return ir.Attr(attr.name, ir.AttributeType[attr.type.onnx_name], [])
    return onnx_value


def _translation(opdef: OpDef) -> Any:
    """The dynamo exporter's translation for one op: emit ``domain::Name`` via onnxscript."""
    from onnxscript import values

    spec = opdef.spec
    opset = values.Opset(spec.domain, spec.version)
    n = len(spec.inputs)

    def translate(*args: Any, **kwargs: Any) -> Any:
        inputs = list(args[:n])
        raw = list(args[n:])
        for a in spec.attributes[len(raw) :]:
            raw.append(kwargs[a.name])
        attrs = {a.name: _attr_value(a, _decode_attr(a, v)) for a, v in zip(spec.attributes, raw)}
        while inputs and inputs[-1] is None:
            inputs.pop()
        _note_emitted(spec.key)
        # (by item: an op named like an Opset attribute, 'domain' or 'version', is no attribute lookup)
        node = opset[spec.name]
        return (node if node is not None else values.Op(opset, spec.name))(*inputs, **attrs)

    translate.__name__ = f"translate_{spec.domain.replace('.', '_')}_{spec.name}"
    return translate


def _dims_from_axes(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    input_names: Sequence[str] | None,
    dynamic_axes: Mapping[str, Any],
) -> Any:
    """Convert TorchScript-style ``dynamic_axes`` into ``dynamic_shapes`` for torch.export (a tuple for
    positional inputs; with keyword inputs a dict by the forward's parameter names)."""
    import torch

    names = _positional_names(model, args, input_names)
    dims: dict[str, Any] = {}

    def entry(name: str, value: Any) -> Any:
        axes = dynamic_axes.get(name)
        if axes is None or not isinstance(value, torch.Tensor):
            return None
        if not isinstance(axes, Mapping):
            axes = {int(a): f"{name}_dim{a}" for a in axes}
        out = {}
        for axis, dim_name in axes.items():
            if dim_name not in dims:
                dims[dim_name] = torch.export.Dim(str(dim_name))
            out[int(axis)] = dims[dim_name]
        return out

    positional = [entry(names[i], arg) if i < len(names) else None for i, arg in enumerate(args)]
    params = _forward_names(model, len(args))
    star = _var_positional(model)
    if star is not None and len(args) > star[0]:  # torch.export binds *args' inputs as one tuple, as forward does
        positional = [*positional[: star[0]], tuple(positional[star[0] :])]
        params = [*params[: star[0]], star[1]]
    if not kwargs:
        return tuple(positional)
    shapes = dict(zip(params, positional))
    renamed = dict(zip(_tensor_keywords(model, kwargs), names[len(args) :]))  # (by input_names, in the graph)
    shapes.update({k: entry(renamed.get(k, k), kwargs[k]) for k in _keyword_order(model, kwargs)})
    return shapes


def _training_modules() -> tuple[type, ...]:
    """Modules that compute otherwise in training mode."""
    import torch

    nn = torch.nn
    return (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm, nn.AlphaDropout)


def _normalized_axes(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    input_names: Sequence[str] | None,
    dynamic_axes: Mapping[str, Any],
    argument: str = "dynamic_axes",
) -> dict[str, Any]:
    """``dynamic_axes`` with each input's negative axis as ``axis % rank`` (torch's TorchScript exporter
    corrupts its heap on a negative axis); an ExportError naming an axis beyond the input's rank, a
    negative axis of an output (whose rank is not known before export), or one dim name given to
    example inputs' axes of different sizes."""
    import torch

    names = _input_names(model, args, kwargs, input_names)
    values = list(args) + [kwargs[k] for k in _keyword_order(model, kwargs) if isinstance(kwargs[k], torch.Tensor)]  # type: ignore[index]
    ranks = {n: v.dim() for n, v in zip(names, values) if isinstance(v, torch.Tensor)}
    sizes: dict[str, tuple[int, str, int]] = {}  # a dim name's example size, and where it was first seen
    out: dict[str, Any] = {}
    for name, axes in dynamic_axes.items():
        rank = ranks.get(name)
        fixed: dict[int, Any] = {}
        for axis, dim_name in axes.items() if isinstance(axes, Mapping) else ((a, None) for a in axes):
            axis = int(axis)
            if rank is None:
                if axis < 0:
                    raise ExportError(
                        f"{argument} gives {name!r} axis {axis}, a negative axis of a value that is no example input, "
                        "whose rank is not known before export: name the axis by its non-negative index."
                    )
            elif not -rank <= axis < rank:
                raise _axis_beyond(argument, name, axis, values[names.index(name)])
            else:
                axis %= rank
                if isinstance(dim_name, str):
                    size = int(values[names.index(name)].shape[axis])
                    seen = sizes.setdefault(dim_name, (size, name, axis))
                    if seen[0] != size:
                        raise ExportError(
                            f"{argument} names input {name!r} axis {axis} and input {seen[1]!r} axis {seen[2]} both "
                            f"{dim_name!r}, one dim, but the example inputs give them sizes {size} and {seen[0]}: "
                            "give them names of their own, or example inputs where they are equal."
                        )
            fixed[axis] = dim_name
        out[name] = fixed if isinstance(axes, Mapping) else list(fixed)
    return out


def _axis_beyond(argument: str, name: str, axis: int, value: Any) -> ExportError:
    """The error for an ``argument`` (``dynamic_axes``, ``dynamic_shapes``) naming an axis the example input
    ``value`` does not have."""
    rank = value.dim()
    return ExportError(
        f"{argument} gives input {name!r} axis {axis}, but the example input has {rank} dim(s) (shape "
        f"{list(value.shape)}): name an axis in 0..{rank - 1}."
    )


def _check_argument_types(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Any,
    opset_version: Any,
    dynamic_axes: Any,
) -> None:
    """An ExportError naming an argument of a type export cannot take, before torch.onnx runs."""
    import torch

    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ExportError(
            f"kwargs is a {type(kwargs).__name__}; give a dict of the forward's parameter name to example input, "
            "e.g. kwargs={'mask': mask} (positional inputs go in args)."
        )
    if opset_version is not None and (isinstance(opset_version, bool) or not isinstance(opset_version, int)):
        raise ExportError(
            f"opset_version is {opset_version!r} (a {type(opset_version).__name__}); give an int, e.g. opset_version=17."
        )
    if dynamic_axes is not None:
        if not isinstance(dynamic_axes, Mapping):
            raise ExportError(
                f"dynamic_axes is a {type(dynamic_axes).__name__}; give a dict of input (or output) name to its "
                "dynamic axes, {axis: dim name} or a list of axes, e.g. dynamic_axes={'x': {0: 'batch'}}."
            )
        for name, axes in dynamic_axes.items():
            keys = list(axes) if isinstance(axes, (Mapping, list, tuple)) else None
            if keys is None or any(isinstance(a, bool) or not isinstance(a, int) for a in keys):
                raise ExportError(
                    f"dynamic_axes[{name!r}] is {axes!r}; give {{axis: dim name}} with int axes, or a list of int "
                    f"axes, e.g. dynamic_axes={{{name!r}: {{0: 'batch'}}}}."
                )
    if isinstance(model, torch.nn.Module):
        return
    if inspect.isclass(model):
        raise ExportError(
            f"model is the class {model.__name__}; give the torch.nn.Module instance to export, e.g. {model.__name__}()."
        )
    if not callable(model):
        raise ExportError(f"model is a {type(model).__name__}; give the torch.nn.Module to export.")
    try:
        signature = inspect.signature(model)
    except (TypeError, ValueError):  # (a scripted function or a builtin: torch.onnx decides)
        return
    try:
        signature.bind(*args, **(kwargs or {}))
    except TypeError as exc:
        called = (
            f"{getattr(model, '__name__', type(model).__name__)}{signature.replace(return_annotation=signature.empty)}"
        )
        raise ExportError(
            f"model {called} is no torch.nn.Module and cannot "
            f"take the example inputs ({exc}): give the module to export (a function that builds one: call it, "
            "and pass the module it returns)."
        ) from None
    if inspect.isfunction(model) or inspect.ismethod(model):  # (torch.onnx exports modules and scripted code)
        name = getattr(model, "__name__", "the function")
        raise ExportError(
            f"model {name} is a Python function, which torch.onnx does not export; wrap it in a torch.nn.Module "
            f"whose forward calls it (def forward(self, *inputs): return {name}(*inputs))."
        )


def _check_names(input_names: Sequence[str] | None, output_names: Sequence[str] | None) -> None:
    """An ExportError naming a name given twice in ``input_names`` or ``output_names``, or in both (the
    TorchScript exporter renames such an input, ``x.1``, and the file's input is not the name asked for)."""
    for label, names in (("input_names", input_names), ("output_names", output_names)):
        if names is not None and (isinstance(names, str) or not all(isinstance(n, str) and n for n in names)):
            raise ExportError(
                f"{label} is {names!r}: give a list of non-empty strings, one per graph {label.split('_')[0]}, "
                "e.g. ['x', 'mask']."
            )
        repeated = sorted({n for n in names or [] if list(names or []).count(n) > 1})
        if repeated:
            raise ExportError(
                f"{label} {list(names or [])} gives {repeated} more than once: give each a name of its own."
            )
    both = sorted(set(input_names or []) & set(output_names or []))
    if both:
        raise ExportError(
            f"{both} are both in input_names and in output_names: an ONNX graph's values have one name each, "
            "give the outputs names of their own."
        )


_SCALAR_TYPES = {"complexfloat": "complex64", "complexdouble": "complex128"}


def _unexported_dtype_hint(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None, text: str) -> str:
    """Where the TorchScript exporter rejects a dtype (``ScalarType UInt16 is an unexpected tensor scalar
    type``): which example inputs have it, and the fix; empty for other messages."""
    import torch

    found = re.search(r"ScalarType (\w+) is an unexpected tensor scalar type", text)
    if found is None:
        return ""
    scalar = found.group(1).lower()
    dtype = _SCALAR_TYPES.get(scalar, scalar)
    names = _input_names(model, args, kwargs, None)
    values = list(args) + [kwargs[k] for k in _keyword_order(model, kwargs) if isinstance(kwargs[k], torch.Tensor)]  # type: ignore[index]
    having = [
        n
        for n, v in zip(names, values)
        if isinstance(v, torch.Tensor)
        and str(v.dtype).removeprefix("torch.").replace("_", "") == dtype.replace("_", "")
    ]
    where = f"input(s) {having}" if having else "a tensor the model makes"
    if dtype.startswith("uint") and dtype != "uint8":
        fix = f"cast {where} to int32 or int64 in the model, or export with exporter='dynamo', which writes {dtype}"
    else:
        fix = f"cast {where} to a dtype it takes (e.g. float32, int64) in the model, or try exporter='dynamo'"
    return f"the TorchScript exporter cannot write tensors of dtype {dtype} ({where}): {fix}. "


def _complex_input_hint(text: str) -> str:
    """Where the dynamo exporter found no function for an opbridge op given a complex tensor: the fix; empty
    for other messages."""
    found = re.search(r"No ONNX function found for <OpOverload\(op='opbridge\.(\w+)'", text)
    if found is None or "complex-valued input" not in text:
        return ""
    from opbridge.definition import _TORCH_IMPLS

    opdef = _TORCH_IMPLS.get(f"opbridge::{found.group(1)}")
    name = opdef.spec.qualname if opdef is not None else found.group(1)
    return (
        f"the op {name} is given a complex tensor, which an ONNX custom node cannot take (torch.onnx "
        "writes complex tensors as real ones with a last dim of 2, and has no such form for custom ops): give the "
        "op real inputs, e.g. torch.view_as_real(z) or z.real and z.imag as two inputs, and build the complex "
        "result outside it with torch.complex. torch's message: "
    )


def _number_input_hint(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None, text: str) -> str:
    """Where an attribute got a tensor in a TorchScript export of a model given Python numbers as example
    inputs: which inputs the exporter made tensors, and the fix; empty otherwise."""
    if not re.search(r"attribute '\w+' expects \w+, got Tensor", text):
        return ""
    names = _positional_names(model, args, None)
    numbers = [n for n, a in zip(names, args) if isinstance(a, (bool, int, float))]
    numbers += [k for k in _keyword_order(model, kwargs) if isinstance(kwargs[k], (bool, int, float))]  # type: ignore[index]
    if not numbers:
        return ""
    return (
        f"the TorchScript exporter makes example inputs that are Python numbers ({numbers}) tensor inputs, "
        "which an op's attribute, a constant of the ONNX node, cannot take: make such a number a constant of "
        "the model (an attribute of the module, or a default of forward left out of the example inputs), or "
        "export with exporter='dynamo', which keeps it a constant. "
    )


def _axes_from_dims(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    input_names: Sequence[str] | None,
    dynamic_shapes: Any,
) -> dict[str, dict[int, str]]:
    """Convert torch.export-style ``dynamic_shapes`` into TorchScript ``dynamic_axes`` (keyword inputs'
    by their names)."""
    import torch

    names = _input_names(model, args, kwargs, input_names)
    keywords = _tensor_keywords(model, kwargs)
    items = _shape_entries(model, args, names, dynamic_shapes, keywords)
    values = list(args) + [kwargs[k] for k in keywords]  # type: ignore[index]
    axes: dict[str, dict[int, str]] = {}
    for i, entry in enumerate(items):
        if not entry:
            continue
        if i < len(values) and not isinstance(values[i], torch.Tensor):
            kind = type(values[i]).__name__
            raise ExportError(
                f"dynamic_shapes gives dims for input {names[i]!r}, a {kind}: the TorchScript exporter takes "
                f"dynamic axes of tensor inputs only (it flattens a {kind} into inputs of its own). Export with "
                f"exporter='dynamo', which takes dims for the {kind}'s tensors, or pass them as inputs of their own."
            )
        pairs = list(entry.items() if isinstance(entry, Mapping) else enumerate(entry))
        if i < len(values):
            _check_dim_bounds(names[i], values[i], pairs)
        axes[names[i]] = {
            int(a): str(getattr(d, "__name__", None) or f"{names[i]}_dim{a}")
            for a, d in pairs
            if d is not None and not _is_static_hint(d)
        }
    return axes


def _check_axes_in_range(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None, input_names: Sequence[str] | None, shapes: Any
) -> None:
    """An ExportError where ``dynamic_shapes`` names an axis a tensor input does not have (torch.onnx's own
    error says only "tuple index out of range"); a form this cannot align with the inputs is left to torch."""
    import torch

    try:
        names = _input_names(model, args, kwargs, input_names)
        keywords = _tensor_keywords(model, kwargs)
        items = _shape_entries(model, args, names, shapes, keywords)
    except Exception:
        return
    values = list(args) + [(kwargs or {}).get(k) for k in keywords]
    for name, value, entry in zip(names, values, items):
        if not isinstance(value, torch.Tensor) or not isinstance(entry, (Mapping, list, tuple)):
            continue
        rank = value.dim()
        for axis in entry.keys() if isinstance(entry, Mapping) else range(len(entry)):
            if isinstance(axis, int) and not -rank <= axis < rank:
                raise _axis_beyond("dynamic_shapes", name, axis, value)


def _check_dim_bounds(name: str, value: Any, pairs: Iterable[tuple[Any, Any]]) -> None:
    """An ExportError where an example input's size is outside the ``min``/``max`` of the ``torch.export.Dim``
    given for it, which torch.export refuses and TorchScript's ``dynamic_axes``, which carry no bounds, do not."""
    for axis, dim in pairs:
        low, high = getattr(dim, "min", None), getattr(dim, "max", None)
        if not isinstance(low, int) or -value.dim() > int(axis) or int(axis) >= value.dim():
            continue
        size = int(value.shape[int(axis)])
        if size < low or (isinstance(high, int) and size > high):
            bounds = f"{low}..{high}" if isinstance(high, int) else f">= {low}"
            raise ExportError(
                f"dynamic_shapes gives input {name!r} dim {axis} the Dim {getattr(dim, '__name__', dim)!r} of "
                f"{bounds}, but the example input's size is {size}: give an example inside the bounds, or widen "
                "them (torch.export refuses such an example; an ONNX file's dims carry no bounds either way)."
            )


def _shape_entries(
    model: Any,
    args: tuple[Any, ...],
    names: Sequence[str],
    dynamic_shapes: Any,
    keywords: Sequence[str] | None = None,
) -> list[Any]:
    """``dynamic_shapes``' entry for each of the graph inputs ``names`` (positional ones first): a tuple's in
    order, a dict's by the input's name or by the forward's parameter name in its place (``keywords``: the
    tensor keyword inputs' parameter names, where ``names`` renames them); the inputs of a ``*args``
    parameter from its one entry, a tuple, as torch.export takes them."""
    star = _var_positional(model)
    grouped = star is not None and len(args) > star[0]
    if not isinstance(dynamic_shapes, Mapping):
        entries = list(dynamic_shapes)
        if star is not None and grouped and len(entries) == star[0] + 1:  # *args' entries as one tuple
            entries = [*entries[: star[0]], *(entries[star[0]] or [None] * (len(args) - star[0]))]
        return entries
    params = _forward_names(model, len(args)) + list(names[len(args) :] if keywords is None else keywords)
    entries = [dynamic_shapes.get(n, dynamic_shapes.get(p)) for n, p in zip(names, params)]
    if star is not None and grouped and dynamic_shapes.get(star[1]):
        for i, value in enumerate(dynamic_shapes[star[1]]):
            if star[0] + i < len(args) and entries[star[0] + i] is None:
                entries[star[0] + i] = value
    return entries


def _is_static_hint(dim: Any) -> bool:
    """Whether ``dim`` is ``torch.export.Dim.STATIC`` (a dim kept static, as None)."""
    return str(getattr(getattr(dim, "type", None), "name", "")) == "STATIC"


def _check_dims_kept(
    proto: onnx.ModelProto,
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    input_names: Sequence[str] | None,
    shapes: Any,
) -> None:
    """An ExportError where a dim ``shapes`` names with a ``torch.export.Dim`` came out static: torch.onnx
    falls back to a strict trace, which specializes dims, when the first trace fails. Positional and
    keyword inputs are checked, and the tensors of a dict input (graph inputs ``<name>_<key>``)."""
    import torch

    keywords = _keyword_order(model, kwargs)
    positional = _positional_names(model, args, input_names)
    renamed = iter(positional[len(args) :])  # (input_names beyond the positional inputs name tensor keyword ones)
    names = positional[: len(args)] + keywords
    values = list(args) + [kwargs[k] for k in keywords]  # type: ignore[index]
    items = _shape_entries(model, args, names, shapes)
    graph_inputs = {i.name: i for i in proto.graph.input}
    checked: list[tuple[str, Any]] = []
    for name, value, entry in zip(names, values, items):
        if isinstance(value, torch.Tensor):
            checked.append((next(renamed, name) if name in keywords else name, entry))
        elif isinstance(value, Mapping) and isinstance(entry, Mapping):
            checked += [(f"{name}_{key}", entry.get(key)) for key in value]
    for name, entry in checked:
        if not entry or name not in graph_inputs:
            continue
        dims = graph_inputs[name].type.tensor_type.shape.dim
        pairs = entry.items() if isinstance(entry, Mapping) else enumerate(entry)
        for axis, dim in pairs:
            axis = int(axis)
            if isinstance(dim, torch.export.Dim) and axis < len(dims) and dims[axis].HasField("dim_value"):
                raise ExportError(
                    f"input {name!r} dim {axis} ({dim.__name__}) was asked to be dynamic, but the exported model "
                    f"has it static ({dims[axis].dim_value}): the traced model fixed its size. Causes: a size passed "
                    "to an op's int attribute (attributes are constants in the file: pass it as a tensor input, or "
                    "read it from a tensor inside the op's reference), or an operation with a fixed-size tensor "
                    f"(adding a torch.ones(4, 3), say){_derived_shape_cause(proto)}; torch.export's own message "
                    "names the line where it specializes: export with torch.export.export(..., dynamic_shapes=...) "
                    "to see it."
                )


def _bounded(shapes: Any) -> bool:
    """Whether a ``torch.export.Dim`` in ``shapes`` has bounds of its own (a ``min`` above 2 or a finite
    ``max``): sizes outside them, which a reference is probed at, are not the model's."""
    import torch

    if isinstance(shapes, Mapping):
        return any(_bounded(v) for v in shapes.values())
    if isinstance(shapes, (list, tuple)):
        return any(_bounded(v) for v in shapes)
    if isinstance(shapes, torch.export.Dim):
        high = getattr(shapes, "max", None)
        return int(getattr(shapes, "min", 0) or 0) > 2 or (high is not None and str(high) != "int_oo")
    return False


def _check_derived_output_dims(proto: onnx.ModelProto, shapes: Any = None) -> None:
    """An ExportError where a custom node of an op without a shape rule has an output dim the file declares
    static, which its reference gives other sizes at other sizes of the inputs' dynamic dims: torch.export
    fixed the size while tracing (a ``min(k, x.shape[0])`` on a dynamic dim takes the example's branch and
    guards nothing), and the file would declare a wrong size elsewhere. Where ``shapes`` bounds a dim, the
    reference ran at sizes the bounds may exclude: a warning then, not an error."""
    from opbridge.backends._custom import STANDARD_DOMAINS, domain_versions
    from opbridge.definition import find_op
    from opbridge.model_io import value_types, walk_nodes
    from opbridge.onnx_schema import attribute_values
    from opbridge.shape import infer_onnx

    versions = domain_versions(proto)
    types: dict[str, onnx.TypeProto] | None = None
    for node in walk_nodes(proto.graph.node):  # (an If/Loop body's too: torch.cond, torch.while_loop)
        op = (
            find_op(node.domain, node.op_type, versions.get(node.domain))
            if node.domain not in STANDARD_DOMAINS
            else None
        )
        if op is None or op.shape_rule is not None:
            continue
        types = value_types(proto) if types is None else types
        given = [types.get(name) if name else None for name in node.input]
        given += [None] * (len(op.spec.inputs) - len(given))
        if not any(t is not None and any(not d.HasField("dim_value") for d in t.tensor_type.shape.dim) for t in given):
            continue  # (every input static: so is every output)
        try:
            derived = infer_onnx(op.spec, None, op.reference, given, attribute_values(op.spec, node))
        except Exception as exc:  # (the checks after export name a reference that cannot run)
            logger.debug("%s: output shapes not derived to check the file's: %s", op.spec.qualname, exc)
            continue
        # the inputs' named dims: an output dim the file names after one must follow it
        named = {d.dim_param for t in given if t is not None for d in t.tensor_type.shape.dim if d.dim_param}
        for i, (name, found) in enumerate(zip(node.output, derived)):
            declared = types.get(name)
            if found is None or declared is None:
                continue
            dims, derived_dims = declared.tensor_type.shape.dim, found.tensor_type.shape.dim
            for k, (d, g) in enumerate(zip(dims, derived_dims)):
                if len(dims) != len(derived_dims):
                    break
                if d.HasField("dim_value") and not g.HasField("dim_value"):
                    size = f"the size {d.dim_value}, which torch.export fixed while tracing"
                elif d.dim_param in named and not (g.HasField("dim_param") and g.dim_param == d.dim_param):
                    size = (
                        f"the size of the input dim {d.dim_param!r}, which it equals at the sizes torch.export traced"
                    )
                else:
                    continue
                message = (
                    f"{op.spec.qualname} declares no shape rule, and the exported file gives its output {i} "
                    f"({op.spec.outputs[i].name!r}) dim {k} {size}, "
                    "but its reference gives that dim other sizes at other sizes of the inputs' dynamic "
                    "dims (it branches on one: min(k, x.shape[0]), max, an if), so the file would be wrong there. "
                    f"Declare the output shapes with @{op.spec.name}.register_shape, giving that dim as "
                    "opbridge.SymDim() (a size known at run time), or export the input dims static."
                )
                if not _bounded(shapes):
                    raise ExportError(message)
                logger.warning(
                    "%s (The reference ran at small and large sizes, which the Dims' bounds may exclude; an ONNX "
                    "file's dims carry no bounds, so a runtime may still be given such sizes.)",
                    message,
                )
                return


def _derived_shape_cause(proto: onnx.ModelProto) -> str:
    """The third cause of a dim made static, where the model's custom ops include some without a shape
    rule: their references run on the trace's fake tensors, and one that makes a size a value fixes it."""
    from opbridge.backends._custom import STANDARD_DOMAINS, domain_versions
    from opbridge.definition import find_op
    from opbridge.model_io import walk_nodes

    versions = domain_versions(proto)
    derived: dict[str, str] = {}
    for node in walk_nodes(proto.graph.node):
        if node.domain in STANDARD_DOMAINS:
            continue
        op = find_op(node.domain, node.op_type, versions.get(node.domain))
        if op is not None and op.shape_rule is None:
            derived.setdefault(op.spec.qualname, op.spec.name)
    if not derived:
        return ""
    names = ", ".join(derived)
    first = next(iter(derived.values()))
    return (
        f", or an op that declares no shape rule ({names}): its reference runs on the trace's fake tensors to "
        "give its output shapes, and one that turns a size into a value (torch.tensor(x.numel()), "
        f"int(x.shape[0])) fixes it; declare the output shapes with @{first}.register_shape"
    )


def _note_output_dim_names(
    proto: onnx.ModelProto, dynamic_axes: Mapping[str, Any], output_names: Sequence[str]
) -> None:
    """Name the output dims ``dynamic_axes`` asks for where the dynamo exporter named them after a size that
    depends on the data (torch.export's unbacked symbols ``u0``, ``u1``: equal to no input dim), in the
    outputs and the graph's value infos alike; log where it named one otherwise: it names an output dim
    after the input dim it equals (torch.export's symbols), and drops the output's names."""
    outputs = {o.name: o for o in proto.graph.output}
    input_dims = {d.dim_param for i in proto.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    asked: list[tuple[str, int, str, str]] = []  # (output, axis, name in the file, name asked for)
    for name in output_names:
        axes = dynamic_axes.get(name)
        if not isinstance(axes, Mapping) or name not in outputs:
            continue
        dims = outputs[name].type.tensor_type.shape.dim
        for axis, wanted in axes.items():
            axis = int(axis)
            if axis < len(dims) and dims[axis].dim_param and dims[axis].dim_param != str(wanted):
                asked.append((name, axis, dims[axis].dim_param, str(wanted)))
    renames: dict[str, str] = {}
    clashing: set[str] = set()
    for _, _, found, wanted in asked:
        if re.fullmatch(r"u\d+", found) and found not in input_dims:
            if renames.setdefault(found, wanted) != wanted:
                clashing.add(found)  # (asked for under two names: left as it is)
    renames = {k: v for k, v in renames.items() if k not in clashing}
    if renames:
        for graph_value in [*proto.graph.output, *proto.graph.value_info]:
            for d in graph_value.type.tensor_type.shape.dim:
                if d.dim_param in renames:
                    d.dim_param = renames[d.dim_param]
    for name, axis, found, wanted in asked:
        if found in renames:
            continue
        why = (
            "a size that depends on the data, which the dynamo exporter names uN, asked for under other names too"
            if found in clashing
            else "the dynamo exporter names an output dim after the input dim it equals (use that name, or "
            "exporter='torchscript', which keeps the given names)"
        )
        logger.warning(
            "output %r dim %d is named %r in the file, not %r as dynamic_axes asks: %s", name, axis, found, wanted, why
        )


def _input_names(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None, input_names: Sequence[str] | None
) -> list[str]:
    """The graph's input names: ``input_names`` or the forward's parameter names for ``args``, then the
    tensor keyword inputs by name, in the forward's parameter order (as both exporters take them); names
    ``input_names`` gives beyond the positional inputs rename those keyword inputs, in order."""
    names = _positional_names(model, args, input_names)
    keywords = _tensor_keywords(model, kwargs)
    renamed = names[len(args) :]  # (input_names beyond the positional inputs name the tensor keyword ones)
    return names[: len(args)] + renamed + keywords[len(renamed) :]


def _tensor_keywords(model: Any, kwargs: Mapping[str, Any] | None) -> list[str]:
    """The keyword arguments that are tensor inputs of the graph, in the forward's parameter order."""
    import torch

    return [k for k in _keyword_order(model, kwargs) if isinstance(kwargs[k], torch.Tensor)]  # type: ignore[index]


def _traced_input_names(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None, input_names: Sequence[str] | None
) -> list[str]:
    """The TorchScript graph's input names: as :func:`_input_names`, without the names of positional
    arguments given as None (the traced graph has no input for them), and a dict of tensors' as
    ``<name>_<key>``, one input each; forward's names for the inputs ``input_names`` does not reach."""
    import torch

    if input_names:
        given = _input_names(model, args, kwargs, input_names)
        given = [n for i, n in enumerate(given) if i >= len(args) or args[i] is not None]  # (None: no input)
        # the inputs input_names leaves unnamed take forward's names, as dynamo names them (torch's own
        # names, such as "Test::DynamicTRTResize_1", otherwise), unless one of those is taken already
        rest = _traced_input_names(model, args, kwargs, None)[len(given) :]
        return given if set(rest) & set(given) else given + rest
    names = _input_names(model, args, kwargs, None)
    positional: list[str] = []
    for name, arg in zip(names, args):
        if isinstance(arg, Mapping) and arg and all(isinstance(v, torch.Tensor) for v in arg.values()):
            positional += [f"{name}_{key}" for key in arg]  # (traced in the dict's order; named as dynamo names them)
        elif arg is not None:
            positional.append(name)
    return positional + names[len(args) :]


def _positional_names(model: Any, args: tuple[Any, ...], input_names: Sequence[str] | None) -> list[str]:
    """The names of the positional inputs: ``input_names``, else (for those it leaves unnamed) the forward's
    parameter names; names ``input_names`` gives beyond them follow."""
    names = list(input_names or [])
    return names + _forward_names(model, len(args))[len(names) :]


def _keyword_order(model: Any, kwargs: Mapping[str, Any] | None) -> list[str]:
    if not kwargs:
        return []
    params = list(forward_signature(model).parameters)
    return [p for p in params if p in kwargs] + [k for k in kwargs if k not in params]


def _var_positional(model: Any) -> tuple[int, str] | None:
    """How many positional parameters come before the forward's ``*args``, and its name; None without one."""
    fixed = 0
    for p in forward_signature(model).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return fixed, p.name
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            fixed += 1
    return None


def _forward_names(model: Any, count: int) -> list[str]:
    from opbridge._loading import forward_parameters

    params = forward_parameters(model)
    params += [f"input{i}" for i in range(len(params), count)]
    return params[:count]


class _DropTorchvisionNotice(logging.Filter):
    """Drops torch's "torchvision is not installed. Skipping torchvision::..." notices.

    The dynamo exporter logs one per torchvision op at every export; they say
    nothing about the user's model.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "torchvision is not installed" not in record.getMessage()


class _NoTraceback(logging.Filter):
    """Keeps a record's message and drops its traceback: onnxscript's version converter logs one when
    it cannot reach the asked opset, which export then names in its own error."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


@contextmanager
def _quiet_exporter_logs() -> Iterator[None]:
    filters = [
        (logging.getLogger("torch.onnx._internal.exporter._registration"), _DropTorchvisionNotice()),
        (logging.getLogger("onnxscript.version_converter"), _NoTraceback()),
    ]
    for target, notice in filters:
        target.addFilter(notice)
    try:
        yield
    finally:
        for target, notice in filters:
            target.removeFilter(notice)


def _export_dynamo(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    ops: list[OpDef],
    opset_version: int | None,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    dynamic_shapes: Any,
) -> onnx.ModelProto:
    import torch

    table = {opdef.torch_op(): _translation(opdef) for opdef in ops}
    options: dict[str, Any] = {}
    if opset_version is not None:
        options["opset_version"] = opset_version
    with _quiet_exporter_logs():
        program = torch.onnx.export(
            model,
            _passed_args(args, kwargs),
            kwargs=kwargs,
            dynamo=True,
            custom_translation_table=table,
            dynamic_shapes=dynamic_shapes,
            optimize=False,
            verbose=False,
            **options,
        )
        if program is None:
            raise ExportError("torch.onnx.export returned no program")
        _optimize_keeping_calls(program, ops)
    _name_dims_beside_none(program, _passed_args(args, kwargs), kwargs, dynamic_shapes)
    _rename_graph_values(program.model.graph.inputs, input_names)
    _rename_graph_values(program.model.graph.outputs, output_names)
    proto = program.model_proto
    _distinct_outputs(proto)
    return proto


def _is_axes(entry: Any) -> bool:
    """Whether ``entry`` of ``dynamic_shapes`` is one input's axes (``{axis: dim}`` or a list of dims), as
    torch.onnx tells them apart when it flattens ``dynamic_shapes``."""
    import torch

    def is_dim(value: Any) -> bool:
        return value is None or isinstance(value, (torch.export.Dim, str, int)) or _is_dim_hint(value)

    if isinstance(entry, dict):
        return all(isinstance(k, int) and is_dim(v) for k, v in entry.items())
    return isinstance(entry, (list, tuple)) and all(is_dim(v) for v in entry)


def _is_dim_hint(value: Any) -> bool:
    """Whether ``value`` is a ``torch.export.Dim.DYNAMIC``, ``AUTO`` or ``STATIC`` hint (no name of its own)."""
    import torch

    return isinstance(value, type(torch.export.Dim.DYNAMIC))


def _name_dims_beside_none(program: Any, args: tuple[Any, ...], kwargs: Any, dynamic_shapes: Any) -> None:
    """Name the graph inputs' dynamic dims as ``dynamic_shapes`` names them where an example input is None.

    torch.onnx pairs the flattened ``dynamic_shapes`` with the graph's inputs to give the dims their names;
    a None argument has an entry there and no graph input, and it kept torch's names (``s17``) with a
    warning. The same pairing is made here without the None arguments' entries.
    """
    from torch.utils import _pytree

    if dynamic_shapes is None:
        return
    leaves = _pytree.tree_leaves((args, kwargs or {}))  # (None is a leaf, as torch.onnx flattens the inputs)
    if not any(v is None for v in leaves):
        return  # torch.onnx named the dims itself
    entries = _pytree.tree_leaves(dynamic_shapes, is_leaf=_is_axes)
    inputs = list(program.model.graph.inputs)
    if len(entries) != len(leaves):
        logger.debug("dynamic_shapes has %d entries for %d inputs: dims keep torch's names", len(entries), len(leaves))
        return
    entries = [entry for entry, leaf in zip(entries, leaves) if leaf is not None]
    if len(entries) != len(inputs):
        logger.debug(
            "%d dynamic_shapes entries for %d graph inputs: dims keep torch's names", len(entries), len(inputs)
        )
        return
    mapping: dict[str, str] = {}
    for value, axes in zip(inputs, entries):
        pairs = axes.items() if isinstance(axes, dict) else enumerate(axes) if isinstance(axes, (list, tuple)) else ()
        for axis, dim in pairs:
            name = dim if isinstance(dim, str) else getattr(dim, "__name__", None)
            if not isinstance(name, str) or _is_dim_hint(dim) or value.shape is None or int(axis) >= len(value.shape):
                continue
            old = getattr(value.shape[int(axis)], "value", None)
            if isinstance(old, str):  # (a dim torch.export made static is an int: it keeps its size)
                mapping.setdefault(old, name)  # (dims torch found equal take the first name, as torch.onnx does)
    if mapping and hasattr(program, "rename_axes"):  # (ONNXProgram.rename_axes: torch 2.7 and later)
        program.rename_axes(mapping)


# the overload that sets each opbridge node apart while torch.onnx's optimizer runs
_CALL_OVERLOAD = "opbridge_call_"


def _ir_nodes(model: Any) -> Iterator[Any]:
    """Every node of an onnx_ir model: its graph's, its subgraphs' and its functions'."""
    import onnx_ir as ir

    yield from ir.traversal.RecursiveGraphIterator(model.graph)
    for function in model.functions.values():
        yield from ir.traversal.RecursiveGraphIterator(function)


def _optimize_keeping_calls(program: Any, ops: list[OpDef]) -> None:
    """Optimize ``program`` as torch.onnx's ``optimize=True`` does, keeping each call of an opbridge op
    a node of its own: the optimizer's common subexpression elimination takes every node but ONNX's
    Random* ones as pure, and merged two calls of one op on one input (an op that draws random numbers
    gave both outputs one draw; attributes 0.0 and -0.0 compare equal). Each node has an overload of
    its own meanwhile (an attribute would fail the op schema's shape inference)."""
    keys = {(d.spec.domain, d.spec.name) for d in ops}
    functions = set(program.model.functions)  # (a node that calls a function, or has an overload, is left as is)
    nodes = [
        n
        for n in _ir_nodes(program.model)
        if (n.domain, n.op_type) in keys and not n.overload and n.op_identifier() not in functions
    ]
    for i, node in enumerate(nodes):
        node.overload = f"{_CALL_OVERLOAD}{i}"
    try:
        program.optimize()
    finally:
        for node in _ir_nodes(program.model):
            if node.overload.startswith(_CALL_OVERLOAD):
                node.overload = ""


def _rename_graph_values(values: Sequence[Any], names: Sequence[str] | None) -> None:
    """Name the graph's inputs or outputs ``names`` in order, as torch.onnx's ``input_names`` and
    ``output_names`` do (after its optimizer, which export runs itself)."""
    for value, name in zip(values, names or []):
        value.metadata_props["pkg.torch.onnx.original_node_name"] = str(value.name)
        value.name = name


def _distinct_outputs(model: onnx.ModelProto) -> None:
    """Make the graph's outputs single static assignment, as the checker wants; both exporters' graphs
    go through it, so that a value returned twice comes out alike from either.

    Where a model returns an input (``return x, x``) and the input is named, torch.onnx's dynamo
    exporter writes ``Identity(x) -> x``, a second value called ``x``: such a node is dropped (the
    output is the input itself). A graph output name listed again (the TorchScript exporter lists a
    value returned twice, ``return y, y``, twice under one name) gets a name of its own through an
    Identity node, ``<name>_alias_<k>``, as torch.onnx's dynamo exporter names repeats of a computed value.
    """
    import onnx

    graph_inputs = {i.name for i in model.graph.input}
    self_copies = [
        i
        for i, n in enumerate(model.graph.node)
        if n.op_type == "Identity" and list(n.input) == list(n.output) and n.output[0] in graph_inputs
    ]
    for i in reversed(self_copies):
        del model.graph.node[i]
    taken = {v.name for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]}
    taken |= {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.initializer}
    seen: set[str] = set()
    for value in model.graph.output:
        if value.name not in seen:
            seen.add(value.name)
            continue
        k = 1
        while f"{value.name}_alias_{k}" in taken:
            k += 1
        alias = f"{value.name}_alias_{k}"
        taken.add(alias)
        model.graph.node.append(onnx.helper.make_node("Identity", [value.name], [alias], name=f"node_{alias}"))
        value.name = alias


# --------------------------------------------------------------------------- torchscript


def _symbolic_helper() -> Any:
    try:
        from torch.onnx import symbolic_helper
    except ImportError:  # pragma: no cover - moved in some torch versions
        from torch.onnx._internal.torchscript_exporter import symbolic_helper  # type: ignore[no-redef]
    return symbolic_helper


_TS_SUFFIX = {
    AttrType.FLOAT: ("f", "f"),
    AttrType.INT: ("i", "i"),
    AttrType.BOOL: ("i", "b"),
    AttrType.STRING: ("s", "s"),
    AttrType.FLOATS: ("f", "fs"),
    AttrType.INTS: ("i", "is"),
    AttrType.STRINGS: ("s", "s"),
}


def _symbolic(opdef: OpDef) -> Any:
    """A TorchScript-exporter symbolic function for one op."""
    spec = opdef.spec
    helper = _symbolic_helper()
    n = len(spec.inputs)

    def symbolic(g: Any, *args: Any) -> Any:
        inputs = list(args[:n])
        kwargs: dict[str, Any] = {}
        for attr, value in zip(spec.attributes, args[n:]):
            suffix, desc = _TS_SUFFIX[attr.type]
            const = helper._maybe_get_const(value, desc)
            if not isinstance(const, (int, float, str, bool, list, tuple)):
                raise ExportError(
                    f"{spec.qualname}: attribute {attr.name!r} is computed from a tensor at run time; "
                    "attributes must be Python constants. Pass a plain Python value."
                )
            kwargs[f"{attr.name}_{suffix}"] = attr.to_onnx_value(attr.normalize(_decode_attr(attr, const)))
        while inputs and helper._is_none(inputs[-1]):
            inputs.pop()
        _note_emitted(spec.key)
        outputs = g.op(f"{spec.domain}::{spec.name}", *inputs, outputs=len(spec.outputs), **kwargs)
        values = _attribute_values_from_kwargs(spec, kwargs)
        _set_output_types(opdef, inputs, outputs if len(spec.outputs) > 1 else (outputs,), values)
        return outputs

    return symbolic


def _attribute_values_from_kwargs(spec: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The typed attribute values back from a symbolic's ``name_suffix=value`` keywords."""
    by_name = {key.rsplit("_", 1)[0]: value for key, value in kwargs.items()}
    return {a.name: a.normalize(a.from_onnx_value(by_name[a.name])) for a in spec.attributes}


def _set_output_types(opdef: OpDef, inputs: list[Any], outputs: Sequence[Any], attrs: dict[str, Any]) -> None:
    """Type the TorchScript graph's custom outputs from the op's shape rule.

    The TorchScript exporter cannot infer a custom node's outputs (and says so on
    stderr); the ONNX shape inference after export is what the file relies on.
    """
    import torch

    from opbridge.shape import SymDim, TensorInfo, output_infos

    def tensor_type(value: Any) -> Any:
        """The value's TensorType, or None (an omitted optional input is a value of NoneType)."""
        kind = value.type() if value is not None else None
        return kind if isinstance(kind, torch._C.TensorType) else None

    template = next((t for t in map(tensor_type, inputs) if t is not None), None)
    if template is None:
        return
    infos: list[TensorInfo | None] = []
    for value in inputs:
        kind = tensor_type(value)
        if kind is None:
            infos.append(None)
            continue
        sizes, dtype = kind.varyingSizes(), kind.dtype()
        if sizes is None or dtype is None:
            infos.append(None)
            continue
        infos.append(TensorInfo(tuple(SymDim(None) if d is None else int(d) for d in sizes), dtype))
    infos += [None] * (len(opdef.spec.inputs) - len(infos))
    try:
        results = output_infos(opdef.spec, opdef.shape_rule, opdef.reference, infos, attrs)
    except Exception as exc:  # typing the trace is best effort; ONNX shape inference decides
        logger.debug("%s: no TorchScript output types (%s)", opdef.spec.qualname, exc)
        return
    for value, info in zip(outputs, results):
        sizes = [d if isinstance(d, int) else None for d in info.shape]
        value.setType(template.with_dtype(info.dtype).with_sizes(sizes))


def _register_torchscript(ops: list[OpDef], opset: int) -> None:
    import torch

    with _TS_LOCK:
        for opdef in ops:
            name = opdef.torch_op_name
            opdef.torch_op()
            if _TS_REGISTERED.get(name) is opdef:
                continue
            torch.onnx.register_custom_op_symbolic(name, _symbolic(opdef), 1)
            _TS_REGISTERED[name] = opdef


def _export_torchscript(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    ops: list[OpDef],
    opset_version: int | None,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    dynamic_axes: Mapping[str, Any] | None,
) -> onnx.ModelProto:
    import onnx
    import torch

    opset = opset_version or 17
    if opset < 9:
        # torch's registry of custom symbolics is searched from opset 9 up: below, every custom op reads as
        # "not supported" with advice to export at opset 1
        raise ExportError(
            f"opset {opset}: the TorchScript exporter writes custom ops from opset 9 on; export at opset 9 or newer."
        )
    _register_torchscript(ops, opset)
    # Domains get their opset import (with the op's version) in _fix_opset_imports after
    # export: passing every known domain as custom_opsets here would warn about unused ones.
    export_args: Any = args + (kwargs,) if kwargs else _passed_args(args, kwargs)
    with tempfile.TemporaryDirectory(prefix="opbridge_ts_") as workdir:
        raw_path = os.path.join(workdir, "model.onnx")
        torch.onnx.export(
            model,
            export_args,
            raw_path,
            dynamo=False,
            opset_version=opset,
            input_names=_traced_input_names(model, args, kwargs, input_names),
            output_names=list(output_names) if output_names else None,
            dynamic_axes=dict(dynamic_axes) if dynamic_axes else None,
            do_constant_folding=True,
        )
        proto = onnx.load(raw_path)
    keep = {str(name) for axes in (dynamic_axes or {}).values() for name in _axis_names(axes)}
    _reset_generated_dims(proto, keep)
    _distinct_outputs(proto)
    return proto


def _axis_names(axes: Any) -> list[Any]:
    return list(axes.values()) if isinstance(axes, Mapping) else []


def _reset_generated_dims(model: onnx.ModelProto, keep: set[str]) -> None:
    """Forget dim names the TorchScript exporter invented for values it could not infer.

    It names them after the node (``MySELUoutput_dim_0``); ONNX shape inference with
    the ops' schemas then gives these dims the names of the input dims they follow.
    """
    del model.graph.value_info[:]
    for value in model.graph.output:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param not in keep:
                dim.ClearField("dim_param")


# --------------------------------------------------------------------------- checks


def custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes of ``model``'s graph and of its If/Loop/Scan bodies outside the standard ONNX domains."""
    return [n for n in walk_nodes(model.graph.node) if n.domain not in ("", "ai.onnx", "ai.onnx.ml")]


def _check_ops_present(model: onnx.ModelProto, calls: Mapping[tuple[str, str, int], int], exporter: str) -> None:
    from opbridge.definition import find_op

    present = collections.Counter((n.domain, n.op_type) for n in walk_nodes(model.graph.node))
    lost = [key for key in calls if (key[0], key[1]) not in present]
    if lost:
        names = ", ".join(f"{d}::{n} v{v}" for d, n, v in lost)
        ops = [(f"{d}::{n}", op) for d, n, v in lost if (op := find_op(d, n, v)) is not None]
        constant = [name for name, op in ops if not op.spec.inputs]
        # (an op whose tensor inputs may all be None, called without any, is a constant to the tracer too)
        bare = [name for name, op in ops if op.spec.inputs and all(i.optional for i in op.spec.inputs)]
        if exporter == "torchscript" and (constant or bare):
            said = [f"{', '.join(constant)} takes no tensor inputs"] if constant else []
            said += [f"{', '.join(bare)} takes only optional tensor inputs (a call may give none)"] if bare else []
            hint = (
                f"{'; '.join(said)}: a call without a tensor is recorded by the TorchScript tracer as a constant. "
                "Export with exporter='dynamo', or give the op a tensor input in each call."
            )
        elif exporter == "torchscript":
            hint = (
                "The TorchScript tracer folds an op whose inputs are all constants at trace time (tensors made "
                "inside forward, such as torch.arange(3)) into a constant: export with exporter='dynamo', or "
                "feed such tensors as model inputs; else make sure the model calls the op object returned by "
                "@opbridge.op, not its reference function."
            )
        else:
            hint = "Make sure the model calls the op object returned by @opbridge.op, not its reference function."
        raise ExportError(
            f"the {exporter} exporter dropped or inlined custom op(s) {names}: they were called while "
            f"tracing but are not in the exported graph. {hint} (A call whose result the model's outputs do not "
            "depend on is removed as dead code: use its result, or leave the call out.)"
        )
    _check_each_call_present(present, calls, exporter)
    stray = default_domain_custom_nodes(model)
    if stray:
        raise ExportError(
            f"the {exporter} exporter wrote op(s) {sorted({n.op_type for n in stray})} in the default domain, "
            "which no runtime accepts; define them with @opbridge.op('domain::Name')."
        )


def _check_each_call_present(
    nodes: Mapping[tuple[str, str], int], calls: Mapping[tuple[str, str, int], int], exporter: str
) -> None:
    """An ExportError where an op has fewer ``nodes`` (by domain and op type, in the graph and its bodies)
    than the export traced calls of it: a call folded into a constant or removed as dead code beside calls
    that stayed, or, for an op drawing random numbers, two equal calls the TorchScript exporter merged into
    one node (one draw for two; for other ops a merge computes the same values and is let be)."""
    distinct: Mapping[tuple[str, str, int], set[Any]] = getattr(calls, "distinct", {})
    random: set[tuple[str, str, int]] = getattr(calls, "random", set())
    for key, count in calls.items():
        have = nodes.get((key[0], key[1]), 0)
        if have == 0 or have >= count:
            continue  # (none: _check_ops_present names it)
        name = f"{key[0]}::{key[1]} v{key[2]}"
        unequal = len(distinct.get(key, ())) or count
        if have < unequal:
            folded = (
                "A call on tensors made inside forward (torch.arange(3)) is computed at trace time by the "
                "TorchScript tracer (export with exporter='dynamo', or feed such tensors as model inputs); a call"
                if exporter == "torchscript"
                else "A call"
            )
            raise ExportError(
                f"the {exporter} exporter wrote {have} node(s) of {name} for the {count} calls traced: a call was "
                f"dropped{' or folded into a constant' if exporter == 'torchscript' else ''}. {folded} whose result "
                "the model's outputs do not depend on is removed as dead code (use its result, or leave the call out)."
            )
        if key in random:
            raise ExportError(
                f"the {exporter} exporter merged equal calls of {name} (the same inputs and attributes) into one "
                f"node: {have} node(s) for {count} calls. Its reference draws random numbers, so the model would "
                "give one draw where PyTorch gives one per call: export with exporter='dynamo', which keeps each "
                "call a node of its own."
            )


def _fix_opset_imports(model: onnx.ModelProto, ops: list[OpDef]) -> None:
    """Import each custom domain of the graph at the highest version of ``ops`` (the ops the model
    called) in it; an ExportError where a called op would then resolve to another version of itself."""
    from opbridge.definition import find_op

    used = {n.domain for n in walk_nodes(model.graph.node)}
    wanted: dict[str, int] = {}
    for opdef in ops:
        domain = opdef.spec.domain
        if domain in used:
            wanted[domain] = max(wanted.get(domain, 0), opdef.spec.version)
    for opdef in ops:
        version = wanted.get(opdef.spec.domain)
        if version is None:
            continue
        resolved = find_op(opdef.spec.domain, opdef.spec.name, version)
        if resolved is not opdef:
            other = "another definition" if resolved is None else f"v{resolved.spec.version}"
            raise ExportError(
                f"the model calls {opdef.spec.qualname} v{opdef.spec.version}, but its domain is imported at "
                f"version {version} (for the other ops of {opdef.spec.domain!r} it calls), where runtimes would "
                f"run {other} of it: a model imports one version of a domain, so call the versions of its ops "
                "that belong together."
            )
    have = {o.domain: o for o in model.opset_import}
    for domain, version in wanted.items():
        if domain in have:
            have[domain].version = max(have[domain].version, version)
        else:
            entry = model.opset_import.add()
            entry.domain, entry.version = domain, version
            have[domain] = entry


def save_model_atomic(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    *,
    protected: Iterable[str | os.PathLike[str]] = (),
    data_name: str | None = None,
) -> Path:
    """Write ``model`` to ``path`` through a temporary file and a rename (``protected``: files the
    path must not be, such as the input's own); an :class:`~opbridge.errors.OutputPathError` names a
    path that cannot be written. With ``data_name``, or for a model too large for one protobuf message
    (then ``<name>.data``), its tensors of 1 KiB or more go to that data file beside it (ONNX's external
    data), written the same way and first; ``model`` keeps its tensors."""
    from opbridge._files import write_atomic
    from opbridge.model_io import save_with_data_file, too_large

    if data_name is None and too_large(model):
        data_name = f"{Path(path).name}.data"
    if data_name is not None:
        return save_with_data_file(model, Path(path), protected=protected, data_name=data_name)
    data = model.SerializeToString()
    return write_atomic(path, lambda fh: fh.write(data), protected=protected)


def _called_ops(model: onnx.ModelProto) -> list[OpDef]:
    """The defined ops of the graph's custom nodes, at the highest version each domain's import allows."""
    from opbridge.definition import find_op

    opset = {o.domain: o.version for o in model.opset_import}
    found = {}
    for node in custom_nodes(model):
        opdef = find_op(node.domain, node.op_type, opset.get(node.domain))
        if opdef is not None:
            found[opdef.spec.key] = opdef
    return list(found.values())


def _bodies_failing(model: onnx.ModelProto, message: str) -> list[str]:
    """The model-local functions whose own check fails with ``message`` (the model's checker error), by
    ``domain::name``: the op whose body is at fault."""
    import onnx

    found = []
    for function in model.functions:
        try:
            onnx.checker.check_function(function)
        except Exception as exc:
            if str(exc).strip() and str(exc).strip() in message:
                found.append(f"{function.domain}::{function.name}")
    return found


def finalize_model(model: onnx.ModelProto, ops: list[OpDef] | None = None, *, check: bool = True) -> onnx.ModelProto:
    """Run opbridge's post-export steps on a model: opset imports (each custom domain at the version
    of ``ops``, the ops the model called; by default those its nodes name), shape inference, full check."""
    import onnx

    from opbridge.model_io import infer_and_check_as_files, too_large

    register_onnx_schemas(all_ops() if ops is None else ops)
    _fix_opset_imports(model, _called_ops(model) if ops is None else ops)
    versions = {o.domain: o.version for o in model.opset_import}
    for function in model.functions:  # (one version per domain in a model: the checker's words name no op)
        for entry in function.opset_import:
            have = versions.get(entry.domain)
            if entry.domain not in ("", "ai.onnx") and have is not None and have != entry.version:
                raise ExportError(
                    f"the function body of {function.domain}::{function.name} imports domain {entry.domain!r} at "
                    f"version {entry.version}, and the model at version {have}, for the ops it calls there; a "
                    "model imports one version per domain: have the body call the version the model calls "
                    f"(its extra_opsets={{{entry.domain!r}: {have}}}), or call one version of the op throughout."
                )
    if too_large(model):  # inferred and checked through files: onnx takes no such message in one piece
        try:
            return infer_and_check_as_files(model)
        except Exception as exc:
            raise ExportError(f"the exported model fails ONNX shape inference or onnx.checker: {exc}") from exc
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise ExportError(f"ONNX shape inference failed on the exported model: {exc}{_unrun_type_hint(exc)}") from exc
    if check:
        try:
            onnx.checker.check_model(inferred, full_check=True)
        except Exception as exc:
            bodies = _bodies_failing(inferred, str(exc))
            where = f" in the function body of {', '.join(bodies)}" if bodies else ""
            raise ExportError(f"the exported model fails onnx.checker (full_check){where}: {exc}") from exc
        if inferred.functions:
            _check_inlined(inferred)
    return inferred


def _unrun_type_hint(exc: Exception) -> str:
    """Advice where shape inference refused a custom node's tensor type that opbridge's op schemas leave
    out (float8: no runtime opbridge bridges passes it to a Python kernel or reference)."""
    found = re.search(r"\(op_type:(\w+).*has unsupported type: tensor\((float8\w*)\)", str(exc))
    if found is None:
        return ""
    op, dtype = found.groups()
    return (
        f". opbridge ops take no {dtype} tensors ({op} is given or returns one): no runtime opbridge runs "
        "kernels on (ONNX Runtime's bridge, onnx.reference, OpenVINO) passes float8 to Python; cast to "
        "float16 or float32 around the op (e.g. x.to(torch.float16) before it, .to(torch.float8_e4m3fn) after)."
    )


def _check_inlined(model: onnx.ModelProto) -> None:
    """An ExportError where the model, valid as written, is not once its function bodies are inlined,
    as runtimes run them (a body reading an optional input that a node omits, say)."""
    import onnx

    from opbridge.model_io import inline_functions, omitted_variadic_inputs

    def checked(inline: Callable[[], onnx.ModelProto]) -> None:
        inlined = inline()
        onnx.checker.check_model(inlined, full_check=True)
        omitted = omitted_variadic_inputs(inlined)  # (the checker passes them; ONNX Runtime crashes on some)
        if omitted:
            raise ValueError(f"{omitted[0][1]} (an optional input of the op that a call leaves out)")

    try:
        checked(lambda: inline_functions(model))
    except Exception as exc:
        message = " ".join(str(exc).split())
        bodies = []  # the bodies that fail inlined on their own: where the fault is
        for function in model.functions:
            key = (function.domain, function.name)
            try:
                checked(lambda key=key: inline_functions(model, [key]))  # type: ignore[misc]
            except Exception:
                bodies.append(f"{key[0]}::{key[1]}")
        which = f"the function body of {', '.join(bodies)}" if bodies else "its function bodies"
        raise ExportError(
            f"the exported model is valid as written, but not once {which} {'is' if len(bodies) == 1 else 'are'} "
            f"inlined, as ONNX Runtime runs them: {message}. A body must work for every call of its op: for the "
            "dtypes its calls give it (cast inside the body, or call the op with the dtypes the body takes), and "
            "for optional inputs a call leaves out (a body that reads one must handle its absence); or export "
            "without function bodies (functions=False, --no-functions) and let the op's kernel run it."
        ) from exc


# --------------------------------------------------------------------------- API


def _split_keyword_dict(model: Any, args: tuple[Any, ...], kwargs: Any) -> tuple[tuple[Any, ...], Any]:
    """``args`` and ``kwargs`` with a dict last in ``args`` taken as keyword inputs, as torch.onnx takes it,
    where ``kwargs`` is not given and the dict's keys name parameters that the other arguments leave open
    (``(x, {'mask': m})``, ``(d, {})``); any other dict there is a positional input (a forward taking a dict)."""
    if kwargs or not args or not isinstance(args[-1], dict):
        return args, kwargs
    try:
        params = list(forward_signature(model).parameters.values())
    except (TypeError, ValueError):  # (no signature: as torch.onnx takes it)
        return args[:-1], dict(args[-1])
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    open_names = {p.name for p in positional[len(args) - 1 :] if p.kind is not p.POSITIONAL_ONLY}
    open_names |= {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    if set(args[-1]) <= open_names:
        return args[:-1], dict(args[-1])
    return args, kwargs


def _passed_args(args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """``args`` as torch.onnx is to take them: an empty keyword dict after a dict that is a positional
    input (torch.onnx takes a dict last in ``args`` as keyword inputs where ``kwargs`` is empty)."""
    if not kwargs and args and isinstance(args[-1], dict):
        return (*args, {})
    return args


def _distinct_examples(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[tuple[Any, ...], Any]:
    """``args`` and ``kwargs`` with each example tensor that shares memory with an earlier one as a copy:
    torch.export makes tensors that alias one graph input, and the model's other input is left unread
    (a custom op given ``(x, x)`` read one input twice), silently."""
    import torch

    seen: set[int] = set()

    def own(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.is_meta or value.layout != torch.strided:
            return value
        try:
            key = value.untyped_storage().data_ptr()
        except Exception:  # (a tensor subclass without storage)
            return value
        if key in seen and value.numel():
            return value.clone()
        seen.add(key)
        return value

    return tuple(own(a) for a in args), None if kwargs is None else {k: own(v) for k, v in kwargs.items()}


def export(
    model: torch.nn.Module,
    args: tuple[Any, ...] | Any,
    f: str | os.PathLike[str],
    *,
    exporter: Exporter = "dynamo",
    kwargs: dict[str, Any] | None = None,
    input_names: str | Sequence[str] | None = None,
    output_names: str | Sequence[str] | None = None,
    dynamic_shapes: Any = None,
    dynamic_axes: Mapping[str, Any] | None = None,
    opset_version: int | None = None,
    functions: bool = True,
    check: bool = True,
) -> ExportResult:
    """Export ``model`` to ``f`` with every opbridge op as a valid ONNX custom node.

    Args:
        model: the PyTorch module (put it in eval mode first).
        args: example positional inputs (one tensor is one input).
        f: output path; written atomically.
        exporter: ``"dynamo"`` (torch.export based, the default) or ``"torchscript"``.
        kwargs: example keyword inputs.
        input_names, output_names: graph input/output names.
        dynamic_shapes: torch.export-style dynamic dims (converted for torchscript).
        dynamic_axes: TorchScript-style dynamic axes (converted for dynamo).
        opset_version: default ONNX opset (torch's default when None).
        functions: attach ONNX function bodies for ops that declare one.
        check: run ``onnx.checker.check_model(full_check=True)``.

    Returns:
        An :class:`ExportResult` with the checked model, its custom nodes and the
        warnings captured while tracing.

    Raises:
        ExportError: the exporter failed, lost a custom op, or the result is invalid.

    Example:
        >>> import os, tempfile, torch, opbridge
        >>> @opbridge.op("doc.export::Twice")
        ... def twice(x: torch.Tensor) -> torch.Tensor:
        ...     return x * 2
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x):
        ...         return twice(x) + 1
        >>> path = os.path.join(tempfile.mkdtemp(), "model.onnx")
        >>> result = opbridge.export(Model(), (torch.randn(2, 3),), path, exporter="torchscript")
        >>> [(n.domain, n.op_type) for n in result.custom_nodes]
        [('doc.export', 'Twice')]
    """
    import torch

    if exporter not in ("dynamo", "torchscript"):
        raise ExportError(f"unknown exporter {exporter!r}; use 'dynamo' or 'torchscript'.")
    if not isinstance(args, tuple):
        args = (args,)
    args, kwargs = _split_keyword_dict(model, args, kwargs)
    _check_argument_types(model, args, kwargs, opset_version, dynamic_axes)
    if exporter == "torchscript" and isinstance(model, torch.export.ExportedProgram):
        raise ExportError(
            "model is a torch.export ExportedProgram, which the TorchScript exporter cannot take: export it with "
            "exporter='dynamo' (or export the torch.nn.Module with either exporter)."
        )
    if exporter == "dynamo" and isinstance(model, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
        raise ExportError(
            f"model is a {type(model).__name__} (torch.jit.trace or torch.jit.script made it), which torch.export, "
            "and so the dynamo exporter, cannot take: export the torch.nn.Module itself, or this one with "
            "exporter='torchscript'."
        )
    if kwargs:  # in the forward's parameter order, which both exporters then give the graph's inputs
        kwargs = {k: kwargs[k] for k in _keyword_order(model, kwargs)}
    from opbridge._files import prepare_output

    prepare_output(f)  # a path that cannot be written is named before the export runs
    args, kwargs = _distinct_examples(args, kwargs)
    if isinstance(input_names, str):  # one name, not its letters
        input_names = [input_names]
    if isinstance(output_names, str):
        output_names = [output_names]
    _check_names(input_names, output_names)
    given = len(args) + sum(1 for v in (kwargs or {}).values() if isinstance(v, torch.Tensor))
    if input_names is not None and len(input_names) > given:  # (TorchScript dropped the extra names)
        raise ExportError(
            f"input_names {list(input_names)} name {len(input_names)} inputs, and the example gives {given}: "
            "one name per positional input (then tensor keyword inputs), in order."
        )
    ops = all_ops()
    register_onnx_schemas(ops)
    if dynamic_axes and dynamic_shapes is not None:
        raise ExportError("give either dynamic_shapes or dynamic_axes, not both.")
    if dynamic_axes and (exporter == "dynamo" or output_names):
        # (TorchScript's outputs without output_names have names of its own, which axes may name)
        inputs = _input_names(model, args, kwargs, input_names)
        unknown = sorted(set(dynamic_axes) - set(inputs) - set(output_names or []))
        if unknown:
            raise ExportError(
                f"dynamic_axes names {unknown}, which the model has no input (or named output) of; "
                f"its inputs are {inputs}: name one of them (or pass input_names)."
            )
    if dynamic_axes:
        dynamic_axes = _normalized_axes(model, args, kwargs, input_names, dynamic_axes)
    if exporter == "torchscript" and kwargs:
        # (every one of them, given or not: torch passes the parameters after the inputs their defaults, in order)
        keyword_only = [p.name for p in forward_signature(model).parameters.values() if p.kind is p.KEYWORD_ONLY]
        if keyword_only:
            raise ExportError(
                f"the TorchScript exporter passes kwargs to forward by position, which keyword-only parameter(s) "
                f"{keyword_only} cannot take: export with exporter='dynamo', or make them positional."
            )
    if exporter == "dynamo" and (output_names or input_names) and isinstance(model, torch.nn.Module):
        weights = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        for label, names in (("output_names", output_names), ("input_names", input_names)):
            clash = sorted(set(names or []) & weights)
            if clash:  # the dynamo exporter writes the value and the initializer under one name
                raise ExportError(
                    f"{label} {clash} are also the names of the model's parameters or buffers, which the dynamo "
                    f"exporter keeps as the initializers' names: name the {label.split('_')[0]}s otherwise."
                )
    if isinstance(model, torch.nn.Module) and model.training:
        moded = sorted({type(m).__name__ for m in model.modules() if isinstance(m, _training_modules())})
        if moded and exporter == "dynamo":
            logger.warning(
                "exporting %s in training mode: its %s export as in training (active dropout, batch statistics); "
                "call model.eval() before exporting for inference",
                type(model).__name__,
                ", ".join(moded),
            )
        elif moded:  # (torch.onnx's TorchScript exporter traces in eval mode by default)
            logger.warning(
                "exporting %s in training mode: the TorchScript exporter exports its %s as in eval mode (no "
                "dropout, running batch statistics), unlike the model's training-mode forward; call model.eval() "
                "before exporting so that the model and the file agree",
                type(model).__name__,
                ", ".join(moded),
            )
    captured: list[CapturedWarning] = []
    # one export at a time in a process: torch's exporters keep global state (two at once failed), and
    # catching the warnings swaps the process's warning state
    with (
        _EXPORT_LOCK,
        tracing_calls() as calls,
        _recording_emitted() as emitted,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        try:
            if exporter == "dynamo":
                shapes = dynamic_shapes
                if dynamic_axes:
                    shapes = _dims_from_axes(model, args, kwargs, input_names, dynamic_axes)
                names = input_names
                if names and any(a is None for a in args):  # (a None argument is no input of the graph)
                    names = [n for n, a in zip(names, args) if a is not None] + list(names[len(args) :])
                if not names and not kwargs and all(isinstance(a, torch.Tensor) for a in args):
                    # the forward's parameter names, as written (torch.onnx would lower-case them)
                    names = _forward_names(model, len(args))
                if dynamic_shapes is not None:
                    _check_axes_in_range(model, args, kwargs, input_names, dynamic_shapes)
                proto = _export_dynamo(model, args, kwargs, ops, opset_version, names, output_names, shapes)
                if output_names and len(output_names) > len(proto.graph.output):  # (torch drops the extra names)
                    raise ExportError(
                        f"output_names {list(output_names)} name {len(output_names)} outputs, and the model returns "
                        f"{len(proto.graph.output)}: one name per output, in order."
                    )
                if shapes is not None:  # (input_names as given: one per positional argument, None's too)
                    _check_dims_kept(proto, model, args, kwargs, input_names, shapes)
                    _check_derived_output_dims(proto, shapes)
                if dynamic_axes and output_names:
                    _note_output_dim_names(proto, dynamic_axes, output_names)
            else:
                axes = dynamic_axes
                if dynamic_shapes is not None:
                    converted = _axes_from_dims(model, args, kwargs, input_names, dynamic_shapes)
                    axes = _normalized_axes(model, args, kwargs, input_names, converted, "dynamic_shapes")
                proto = _export_torchscript(model, args, kwargs, ops, opset_version, input_names, output_names, axes)
                if axes:
                    graph_names = [i.name for i in proto.graph.input] + [o.name for o in proto.graph.output]
                    unknown = sorted(set(axes) - set(graph_names))
                    if unknown:  # torch only warns, and writes those dims static
                        raise ExportError(
                            f"dynamic_axes names {unknown}, which the exported graph has no input or output of; "
                            f"its inputs are {[i.name for i in proto.graph.input]} and outputs "
                            f"{[o.name for o in proto.graph.output]} (name outputs with output_names)."
                        )
        except ExportError:
            raise
        except Exception as exc:
            raise_interrupt_behind(exc)  # (a Ctrl-C inside torch's lazy imports comes back as another error)
            text = _uncoloured(exc)
            if "UncapturedHigherOrderOpError" in text and "opbridge/definition.py" in text.replace(os.sep, "/"):
                raise ExportError(
                    f"{exporter} export of {type(model).__name__} failed: torch.export could not capture the "
                    "control flow (torch.cond, torch.while_loop, torch.map) around a custom op call; its message "
                    "names what it could not trace. If that is the op itself, call it outside the control flow "
                    "(e.g. on both branches' inputs, then select the result with torch.where). torch.export's "
                    f"message: {text}"
                ) from exc
            if exporter == "torchscript" and "dynamo-optimized function" in text:
                raise ExportError(
                    f"torchscript export of {type(model).__name__} failed: the model uses torch.cond, "
                    "torch.while_loop or another compiled region, which the TorchScript exporter cannot trace; "
                    f"export it with exporter='dynamo' (--exporter dynamo). torch's message: {text}"
                ) from exc
            if isinstance(exc, ImportError) and "onnxscript" in (exc.name or str(exc)):
                raise ExportError(
                    f"{exporter} export of {type(model).__name__} needs onnxscript (torch.onnx's dynamo exporter "
                    "writes the graph with it), which is not installed: pip install 'onnxscript>=0.6', or export "
                    "with exporter='torchscript' (--exporter torchscript)."
                ) from exc
            own = _opbridge_cause(exc)
            if own is not None:  # (torch.onnx wraps it in its own words, which name neither the op nor the fix)
                raise ExportError(
                    f"{exporter} export of {type(model).__name__} failed: {_uncoloured(own)} (torch.onnx's message: "
                    f"{text})"
                ) from exc
            hint = (
                _unexported_dtype_hint(model, args, kwargs, text) + _number_input_hint(model, args, kwargs, text)
                if exporter == "torchscript"
                else _complex_input_hint(text)
            )
            raise ExportError(
                f"{exporter} export of {type(model).__name__} failed: {hint}{text}{_causes(exc)}"
            ) from exc
    for w in caught:
        category = w.category.__name__
        if issubclass(w.category, (DeprecationWarning, FutureWarning)) or "torch/onnx" in w.filename:
            continue
        cw = CapturedWarning(category, str(w.message), w.filename, w.lineno)
        captured.append(cw)
        if issubclass(w.category, torch.jit.TracerWarning):
            logger.warning("%s", cw)
    written = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset_version is not None and written != opset_version:
        raise ExportError(
            f"opset {opset_version} was asked for, but the {exporter} exporter wrote opset {written} (it could not "
            f"convert the model to {opset_version}); nothing was written: pick an opset it supports, e.g. {written}."
        )
    _check_ops_present(proto, calls, exporter)
    # the ops called while tracing, and those whose nodes the exporter wrote where tracing does not count
    # (control flow's branches under dynamo, scripted code under TorchScript)
    used = [d for d in ops if d.spec.key in calls or d.spec.key in emitted]
    counted = {(d.spec.domain, d.spec.name) for d in used}
    for node in walk_nodes(proto.graph.node):  # (any other node of an op: its highest version)
        if (node.domain, node.op_type) not in counted:
            same = [d for d in ops if (d.spec.domain, d.spec.name) == (node.domain, node.op_type)]
            if same:
                used.append(max(same, key=lambda d: d.spec.version))
                counted.add((node.domain, node.op_type))
    if exporter == "dynamo":
        _check_rules_eagerly(model, args, kwargs, used)
    if functions:
        from opbridge.functions import attach_functions

        attach_functions(proto, used)
    try:
        final = finalize_model(proto, used, check=check)
    except ExportError as exc:
        wrote = {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")}
        if exporter == "dynamo" and wrote and max(wrote) < 18:  # (torch.onnx writes 18 and converts down)
            raise ExportError(
                f"{exc} The dynamo exporter writes opset 18 and converts the model down to {max(wrote)}, which can "
                "leave nodes in their opset 18 form: export at opset_version 18 or later, or with "
                "exporter='torchscript'."
            ) from exc
        raise
    path = save_model_atomic(final, f)
    result = ExportResult(
        path=path, model=final, exporter=exporter, custom_nodes=custom_nodes(final), warnings=captured
    )
    _lint_result(result)
    logger.info("%s", result.summary())
    return result


def _check_rules_eagerly(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, used: list[OpDef]) -> None:
    """Call ``model`` once on the example inputs so that each called op's shape rule is checked against its
    reference, as an eager call checks it (the dynamo exporter traces with fake tensors, which only the rule
    shapes): a rule that contradicts the reference is an ExportError naming the op, not a runtime's dtype error.

    The call also meets what only an eager call sees, such as a reference that writes its input in place.
    It calls a copy of the model, in eval mode (batch norm and dropout change no op's shapes or dtypes), on
    copies of the inputs; the copy shares the model's parameters (a forward under no_grad does not write
    them; the weights are not held twice), and the call leaves the random number generator as it was."""
    import torch

    from opbridge.errors import OpDefinitionError

    if not used:
        return
    import copy

    shared: dict[int, Any] = {id(p): p for p in model.parameters()} if isinstance(model, torch.nn.Module) else {}
    try:  # (on copies: the call must change neither the model's buffers nor the caller's example inputs)
        model, args, kwargs = copy.deepcopy((model, args, kwargs or {}), shared)
    except Exception as exc:  # (a model that cannot be copied is not called)
        ruled = any(d.spec.shape_rule is not None for d in used)
        logger.log(
            logging.WARNING if ruled else logging.DEBUG,
            "the ops were not checked against their references before the export (their shape rules, inputs "
            "written in place): %s cannot be copied (%s); call the model once eagerly to check them",
            type(model).__name__,
            exc,
        )
        return
    if isinstance(model, torch.nn.Module):
        model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(*args, **kwargs)
    except OpDefinitionError as exc:
        raise ExportError(f"dynamo export of {type(model).__name__} failed: {exc}") from exc
    except Exception as exc:  # (the exported graph stands; a model that fails eagerly is its own business)
        logger.debug("eager call of %s to check its ops' shape rules failed: %s", type(model).__name__, exc)


def _uncoloured(exc: BaseException) -> str:
    """``exc``'s message without terminal colour codes (torch.onnx colours its messages for a terminal),
    with its notes (a shape rule's exception names the op's rule in one)."""
    notes = "".join(f" {n}" for n in getattr(exc, "__notes__", ()) if isinstance(n, str))
    return re.sub(r"\x1b\[[0-9;]*m", "", str(exc) + notes)


def _opbridge_cause(exc: BaseException, limit: int = 8) -> BaseException | None:
    """The first of opbridge's own errors among the exceptions behind ``exc`` (an op's error that torch
    raised again in its words), else None."""
    from opbridge.errors import OpbridgeError

    seen: set[int] = set()
    cause: BaseException | None = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen and len(seen) < limit:
        if isinstance(cause, OpbridgeError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _causes(exc: BaseException, limit: int = 4) -> str:
    """`` (caused by: ...)`` for the exceptions behind ``exc`` whose text it does not already hold
    (torch.onnx's pass errors name only the pass: the cause is in their ``__cause__``)."""
    text, seen = str(exc), {id(exc)}
    chain: list[str] = []
    cause = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen and len(chain) < limit:
        seen.add(id(cause))
        message = _uncoloured(cause).strip()
        if message and message not in text:
            chain.append(f"{type(cause).__name__}: {message}")
            text += message
        cause = cause.__cause__ or cause.__context__
    return f" (caused by: {' <- '.join(chain)})" if chain else ""


def _lint_result(result: ExportResult) -> None:
    """Lint the exported model with the warnings captured while tracing; keep and log the findings."""
    from opbridge.graph.lint import lint_model

    try:
        result.findings = lint_model(result.model, warnings=result.warnings, builtin_ops=False)
    except Exception as exc:
        logger.warning("lint of %s failed: %s: %s", result.path, type(exc).__name__, exc)
        return
    for finding in result.findings:
        if finding.severity in ("error", "warning"):
            logger.warning("%s", finding)
