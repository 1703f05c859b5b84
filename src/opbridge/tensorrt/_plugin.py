"""IPluginV3 plugins and IPluginCreatorV3One creators generated from op specs."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from opbridge._locks import ForkSafeLock
from opbridge.errors import OpDefinitionError
from opbridge.shape import SymDim, TensorInfo, output_infos
from opbridge.tensorrt._fields import decode_fields, encode_attrs, field_names
from opbridge.tensorrt._runtime import (
    INDEX_DTYPES,
    TRT_DTYPE_NAMES,
    KernelLauncher,
    TensorRef,
    dtype_supported,
    kernel_dtypes,
)
from opbridge.tensorrt._shapes import DynamicDimError, TrtDim, evaluate, input_dim, to_expr, wrap_dim

__all__ = ["clear_errors", "configured_ranges", "make_classes", "recorded_errors", "set_input_shapes"]

logger = logging.getLogger(__name__)

_ERRORS_LOCK = ForkSafeLock()
# (node name, op type, message): what generated plugins raised inside TensorRT's callbacks.
# TensorRT reports a failed Python callback only vaguely, so opbridge keeps the message.
_ERRORS: list[tuple[str, str, str]] = []


# node name -> (op type, [(min, max) per input], [(min, max) per output]) as TensorRT configured it:
# the output ranges are TensorRT's evaluation of the shape rule's expressions over the profile.
_RANGES: dict[
    str, tuple[str, list[tuple[tuple[int, ...], tuple[int, ...]]], list[tuple[tuple[int, ...], tuple[int, ...]]]]
] = {}


# node name -> its inputs' dims in the model (an int where fixed, the dim's name or None where dynamic;
# None for an input of unknown rank): TensorRT asks a plugin for its output dtypes before it gives it any
# shape.
_INPUT_SHAPES: dict[str, tuple[tuple[int | str | None, ...] | None, ...]] = {}


def set_input_shapes(shapes: dict[str, Sequence[Sequence[int | str | None] | None]]) -> None:
    """Record each node's inputs' dims (from the model) for the plugins' output dtypes."""
    with _ERRORS_LOCK:
        _INPUT_SHAPES.update(
            {node: tuple(None if s is None else tuple(s) for s in inputs) for node, inputs in shapes.items()}
        )


def configured_ranges() -> dict[str, Any]:
    """``{node: {"op", "inputs", "outputs"}}`` shape ranges seen in ``configure_plugin`` since :func:`clear_errors`."""
    with _ERRORS_LOCK:
        return {
            node: {"op": op, "inputs": [list(map(list, r)) for r in ins], "outputs": [list(map(list, r)) for r in outs]}
            for node, (op, ins, outs) in _RANGES.items()
        }


def _record(node: str, op_type: str, message: str) -> None:
    with _ERRORS_LOCK:
        entry = (node, op_type, message)
        if entry not in _ERRORS:
            _ERRORS.append(entry)
    logger.error("%s (%s): %s", node, op_type, message)


def recorded_errors() -> list[tuple[str, str, str]]:
    """The errors generated plugins raised in this process since :func:`clear_errors`."""
    with _ERRORS_LOCK:
        return list(_ERRORS)


def clear_errors() -> None:
    with _ERRORS_LOCK:
        _ERRORS.clear()
        _RANGES.clear()
        _INPUT_SHAPES.clear()


def _guard(method: Any) -> Any:
    """Record an exception's message (naming the node) before TensorRT sees it, then re-raise."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any) -> Any:
        try:
            return method(self, *args)
        except Exception as exc:
            _record(self.layer_name, self.opdef.spec.name, f"opbridge: {method.__name__}: {exc}")
            raise

    return wrapper


def _span(lo: Sequence[int], hi: Sequence[int]) -> str:
    """``(1, 3, 8)..(4, 3, 64)`` as ``[1..4, 3, 8..64]``."""
    return "[" + ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in zip(lo, hi)) + "]"


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


@functools.cache
def make_classes(trt: Any) -> tuple[type, type]:
    """The plugin and creator classes for the TensorRT module ``trt`` (made once per module)."""
    to_trt = {v: getattr(trt.DataType, k) for k, v in TRT_DTYPE_NAMES.items() if hasattr(trt.DataType, k)}

    def from_trt(dtype: Any) -> str:
        return TRT_DTYPE_NAMES.get(dtype.name, dtype.name.lower())

    max_dims = int(getattr(trt.Dims, "MAX_DIMS", 8))  # (the rank a TensorRT tensor can have)

    class OpbridgePlugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        """A TensorRT plugin running one opbridge op (built from its spec)."""

        def __init__(self, opdef: Any, attrs: dict[str, Any], layer_name: str, namespace: str) -> None:
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            spec = opdef.spec
            self.opdef, self.attrs, self.layer_name = opdef, dict(attrs), layer_name
            self.num_outputs = len(spec.outputs)
            self.plugin_namespace = namespace
            self.plugin_name = spec.name
            self.plugin_version = str(spec.version)
            self.launcher = KernelLauncher(opdef, attrs)
            self.input_dtypes: list[str] | None = None
            self._serialized: Any = None
            self._dtype_cache: dict[tuple[str, ...], list[str]] = {}
            # per output, per dim: an int, or the function giving the dim's expression's value from input shapes
            self._symbolic: list[tuple[Any, ...]] | None = None

        # -- core
        def get_capability_interface(self, kind: Any) -> Any:
            return self

        def clone(self) -> Any:
            other = OpbridgePlugin(self.opdef, self.attrs, self.layer_name, self.plugin_namespace)
            other.input_dtypes = self.input_dtypes
            other.launcher.shapes = self.launcher.shapes
            other._symbolic = self._symbolic
            return other

        # -- build
        def _rule_dtypes(self, dtypes: list[str]) -> list[str]:
            key = tuple(dtypes)
            known = self._dtype_cache.get(key)
            if known is None:
                known = self._dtype_cache[key] = self._probe_dtypes(dtypes)
            return list(known)

        def _outputs(self, rule: Any, shapes: Sequence[Sequence[Any]], dtypes: Sequence[str]) -> list[TensorInfo]:
            """The outputs ``rule`` gives (the reference on meta tensors without one) for inputs of ``shapes``
            and ``dtypes``, absent optional ones after them."""
            spec = self.opdef.spec
            infos: list[Any] = [TensorInfo(tuple(s), _torch_dtype(d)) for s, d in zip(shapes, dtypes)]
            infos += [None] * (len(spec.inputs) - len(infos))
            return output_infos(spec, rule, self.opdef.reference, infos, dict(self.attrs))

        def _probe_dtypes(self, dtypes: list[str]) -> list[str]:
            spec, rule = self.opdef.spec, self.opdef.shape_rule
            if rule is None and not dtypes:
                raise OpDefinitionError(
                    f"{spec.qualname} has no inputs and no shape rule, so its outputs' dtypes are unknown; "
                    f"declare them with @{spec.name}.register_shape returning opbridge.TensorInfo(shape, dtype) "
                    "per output."
                )
            # TensorRT asks for types before shapes: the inputs' dims come from the model where the build
            # found them (fixed ones as ints, so that a rule may branch on them; named ones as SymDims of that
            # name, equal where the names are). Else a rule gets unknown dims,
            # rank 8 first, then the ranks a rule that unpacks its inputs' shapes (n, c = x.shape) takes;
            # without one, the reference runs on meta tensors of size 2 (dtypes rarely depend on sizes), rank 4
            # first.
            with _ERRORS_LOCK:
                known = _INPUT_SHAPES.get(self.layer_name)
            tries: list[list[tuple[Any, ...]]] = []
            if known is not None and len(known) == len(dtypes) and None not in known:
                tries.append(
                    [
                        tuple(d if isinstance(d, int) else SymDim(d) if rule is not None else 2 for d in dims)
                        for dims in known
                        if dims is not None
                    ]
                )
            ranks = (8, 4, 2, 3, 1, 5, 6, 7, 0) if rule is not None else (4, 2, 3, 1, 5, 0, 6, 7, 8)
            tries += [[(SymDim(None),) * rank if rule is not None else (2,) * rank] * len(dtypes) for rank in ranks]
            for shapes in tries:
                try:
                    results = self._outputs(rule, shapes, dtypes)
                except OpDefinitionError:
                    if rule is not None:
                        raise
                    continue
                except Exception:
                    continue
                return [_dtype_name(r.dtype) for r in results]
            return [dtypes[0]] * self.num_outputs

        @_guard
        def get_output_data_types(self, input_types: Sequence[Any]) -> list[Any]:
            dtypes = [from_trt(t) for t in input_types]
            self.launcher.check_dtypes(dtypes, "input")
            if len({d for d in dtypes if d not in INDEX_DTYPES}) > 1:
                names = [p.name for p in self.opdef.spec.inputs]
                raise OpDefinitionError(
                    f"{self.opdef.spec.qualname}: floating-point inputs of different dtypes "
                    f"({', '.join(f'{n}={d}' for n, d in zip(names, dtypes))}); the generated plugin runs its "
                    "GPU kernel in one floating-point dtype: cast them to one dtype in the model."
                )
            self.input_dtypes = dtypes
            out = self._rule_dtypes(dtypes)
            if "uint8" in out:  # (TensorRT's own refusal names neither the op nor a way out)
                raise OpDefinitionError(
                    f"{self.opdef.spec.qualname}: output {out.index('uint8')} is uint8, which TensorRT lets no "
                    "plugin make (a uint8 tensor is a network input, or the output of a Cast or Identity); return "
                    "bool or int32 from the op for TensorRT."
                )
            self.launcher.check_dtypes(out, "output")
            return [to_trt[d] for d in out]

        @_guard
        def get_output_shapes(self, inputs: Sequence[Any], shape_inputs: Sequence[Any], builder: Any) -> list[Any]:
            spec, rule = self.opdef.spec, self.opdef.shape_rule
            ops = trt.DimensionOperation
            dtypes = self.input_dtypes or [kernel_dtypes(self.opdef)[0]] * len(inputs)
            names = [p.name for p in spec.inputs]
            shapes = [
                tuple(
                    wrap_dim(d, builder, ops, f"{names[i] if i < len(names) else i}.shape[{k}]", input_dim(i, k))
                    for k, d in enumerate(dims)
                )
                for i, dims in enumerate(inputs)
            ]
            try:
                if rule is None:
                    results = self._derived(shapes, dtypes, builder)
                else:
                    results = self._outputs(rule, shapes, dtypes)
            except DynamicDimError as exc:
                raise OpDefinitionError(f"{spec.qualname}: {exc}") from None
            out = []
            declared = self._rule_dtypes(dtypes) if self.input_dtypes else None
            for i, info in enumerate(results):
                expected = declared[i] if declared else None
                if expected is not None and _dtype_name(info.dtype) != expected:
                    if rule is None:
                        raise OpDefinitionError(
                            f"{spec.qualname} declares no shape rule, and TensorRT asks for output dtypes before it "
                            f"gives the inputs' ranks: output {i} was taken to be {expected}, but the reference "
                            f"gives {_dtype_name(info.dtype)} at these ranks; declare the dtypes with "
                            f"@{spec.name}.register_shape returning opbridge.TensorInfo(shape, dtype) per output."
                        )
                    raise OpDefinitionError(
                        f"{spec.qualname}: the shape rule gives output {i} dtype {_dtype_name(info.dtype)} here but "
                        f"{expected} when ranks are unknown; make the dtype independent of the ranks."
                    )
                if len(info.shape) > max_dims:
                    raise OpDefinitionError(
                        f"{spec.qualname}: the {'shape rule' if rule else 'reference'} gives output {i} "
                        f"{len(info.shape)} dims, and a TensorRT "
                        f"tensor has at most {max_dims}; reshape to fewer dims around the op for TensorRT."
                    )
                dims = trt.DimsExprs(len(info.shape))
                for k, d in enumerate(info.shape):
                    try:
                        dims[k] = to_expr(d, builder)
                    except TypeError as exc:
                        raise OpDefinitionError(f"{spec.qualname}: shape rule output {i} dim {k}: {exc}") from None
                out.append(dims)
            self._symbolic = [tuple(d.value if isinstance(d, TrtDim) else d for d in info.shape) for info in results]
            return out

        def _derived(self, shapes: list[tuple[Any, ...]], dtypes: list[str], builder: Any) -> list[TensorInfo]:
            """Without a declared rule, the outputs' shapes the reference gives on meta tensors, where each
            dim is a constant or one of the inputs' dims (``[in0_d0, 3, in1_d2, in1_d3]``, say).

            Dynamic dims TensorRT proves equal (``EQUAL`` folds to 1) share one symbol; the reference then
            runs on meta tensors (see :mod:`opbridge.shape`) to see where output dims come from, and each
            symbol goes back to its input dim's expression. A dim computed from dims (``h * 2``) needs a
            declared rule, which says how.
            """
            spec = self.opdef.spec
            groups: list[tuple[Any, SymDim, TrtDim]] = []
            symbolic: list[list[Any]] = []
            for i, shape in enumerate(shapes):
                dims: list[Any] = []
                for k, d in enumerate(shape):
                    if not isinstance(d, TrtDim):
                        dims.append(d)
                        continue
                    for expr, symbol, _ in groups:
                        same = builder.operation(trt.DimensionOperation.EQUAL, expr, d.expr)
                        if same.is_constant() and same.get_constant_value() == 1:
                            dims.append(symbol)
                            break
                    else:
                        groups.append((d.expr, SymDim(f"in{i}_d{k}"), d))
                        dims.append(groups[-1][1])
                symbolic.append(dims)
            derived = self._outputs(None, symbolic, dtypes)
            back = {symbol: dim for _, symbol, dim in groups}
            out = []
            for i, info in enumerate(derived):
                dims = []
                for k, d in enumerate(info.shape):
                    if isinstance(d, SymDim) and d in back:
                        dims.append(back[d])
                    elif isinstance(d, int) and not isinstance(d, bool):
                        dims.append(d)
                    else:
                        raise OpDefinitionError(
                            f"{spec.qualname} declares no shape rule, and dim {k} of its output {i} "
                            f"({[getattr(x, 'name', x) for x in info.shape]}) is neither a constant nor one of its "
                            "inputs' dims, which a plugin needs as an expression of the inputs' dims: declare one "
                            f"with @{spec.name}.register_shape returning opbridge.TensorInfo(shape, dtype) per output."
                        )
                out.append(TensorInfo(tuple(dims), info.dtype))
            return out

        @_guard
        def supports_format_combination(self, pos: int, in_out: Sequence[Any], num_inputs: int) -> bool:
            """LINEAR tensors of dtypes the kernel takes: floating-point inputs of one dtype, and each
            output of the dtype the shape rule gives for the inputs' dtypes (TensorRT settles the
            positions before ``pos`` first)."""
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            dtype = from_trt(desc.type)
            if not dtype_supported(self.opdef, dtype, output=pos >= num_inputs):
                return False
            if pos >= num_inputs:
                wanted = self._rule_dtypes([from_trt(in_out[i].desc.type) for i in range(num_inputs)])
                return dtype == wanted[pos - num_inputs]
            floats = [from_trt(in_out[i].desc.type) for i in range(pos)]
            return dtype in INDEX_DTYPES or all(d == dtype for d in floats if d not in INDEX_DTYPES)

        @_guard
        def configure_plugin(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
            def ranges(descs: Sequence[Any]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
                return [(tuple(int(v) for v in d.min), tuple(int(v) for v in d.max)) for d in descs]

            given, made = ranges(inputs), ranges(outputs)
            with _ERRORS_LOCK:
                _RANGES[self.layer_name] = (self.opdef.spec.name, given, made)
            spec, rule = self.opdef.spec, self.opdef.shape_rule
            shown = ", ".join(f"{p.name} {_span(lo, hi)}" for p, (lo, hi) in zip(spec.inputs, given))
            for i, (lo, hi) in enumerate(made):
                if min((*lo, *hi), default=0) < 0:
                    raise OpDefinitionError(
                        f"{spec.qualname}: output {i} takes sizes below 0 ({_span(lo, hi)}) for inputs in the "
                        f"profile ({shown}); narrow the profile to inputs the op takes, or fix the shape rule."
                    )
            if rule is None or self.input_dtypes is None:
                return
            # the rule saw TensorRT's symbolic dims while building: at the profile's own corners, it may refuse,
            # or give other shapes than the expressions it gave TensorRT (a branch on a dynamic dim)
            for corner, pick in (("smallest", 0), ("largest", 1)):
                at = [r[pick] for r in given]
                where = ", ".join(f"{p.name} {_span(s, s)}" for p, s in zip(spec.inputs, at))
                try:
                    results = self._outputs(rule, at, self.input_dtypes)
                except OpDefinitionError:
                    raise
                except Exception as exc:
                    raise OpDefinitionError(
                        f"{spec.qualname}: the shape rule refuses the profile's {corner} inputs ({where}): "
                        f"{type(exc).__name__}: {exc}; narrow the profile to inputs the op takes."
                    ) from exc
                self._check_corner(corner, where, at, results, made)

        def _check_corner(
            self,
            corner: str,
            where: str,
            at: list[tuple[int, ...]],
            results: list[TensorInfo],
            made: list[tuple[tuple[int, ...], tuple[int, ...]]],
        ) -> None:
            """Refuse outputs of the rule at a profile corner (``at``) other than its expressions give there."""
            spec = self.opdef.spec
            for i, (info, dims) in enumerate(zip(results, self._symbolic or [])):
                try:
                    concrete: list[int | None] = [int(d) for d in info.shape]
                except TypeError:
                    continue  # (a size that depends on the data: refused as an expression already)
                symbolic = [evaluate(d, at) for d in dims]
                if len(concrete) == len(symbolic) and all(s is None or s == c for s, c in zip(symbolic, concrete)):
                    continue
                name = spec.outputs[i].name if i < len(spec.outputs) else str(i)
                bounds = f" (TensorRT's range for it: {_span(*made[i])})" if i < len(made) else ""
                raise OpDefinitionError(
                    f"{spec.qualname}: at the profile's {corner} inputs ({where}) the shape rule gives output {i} "
                    f"({name!r}) the shape {concrete}, but the expressions it gave TensorRT for the dynamic dims make "
                    f"it {['?' if s is None else s for s in symbolic]}{bounds}: the rule branches on a dynamic dim "
                    "(an isinstance(dim, int) test, say). Compute output dims with + - * // from input dims, or make "
                    "the dims it branches on static in the model (a fixed size at export)."
                )

        def get_workspace_size(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> int:
            return 0

        def get_valid_tactics(self) -> list[int]:
            return []

        # -- runtime
        def set_tactic(self, tactic: int) -> None:
            pass

        @_guard
        def on_shape_change(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
            self.launcher.on_shape_change(
                [(tuple(d.dims), from_trt(d.type)) for d in inputs],
                [(tuple(d.dims), from_trt(d.type)) for d in outputs],
            )

        @_guard
        def enqueue(
            self,
            input_desc: Sequence[Any],
            output_desc: Sequence[Any],
            inputs: Sequence[int],
            outputs: Sequence[int],
            workspace: int,
            stream: int,
        ) -> None:
            self.launcher.launch(
                [TensorRef(int(p), tuple(d.dims), from_trt(d.type)) for d, p in zip(input_desc, inputs)],
                [TensorRef(int(p), tuple(d.dims), from_trt(d.type)) for d, p in zip(output_desc, outputs)],
                int(stream),
            )

        def attach_to_context(self, context: Any) -> Any:
            return self.clone()

        @_guard
        def get_fields_to_serialize(self) -> Any:
            fields = encode_attrs(self.opdef.spec, self.attrs)
            self._serialized = [  # TensorRT reads the arrays after this returns: keep them alive
                trt.PluginField(name, data, getattr(trt.PluginFieldType, kind)) for name, kind, data in fields
            ]
            return trt.PluginFieldCollection(self._serialized)

    class OpbridgeCreator(trt.IPluginCreatorV3One):
        """Creates :class:`OpbridgePlugin` instances for one op under one namespace."""

        def __init__(self, opdef: Any, namespace: str) -> None:
            trt.IPluginCreatorV3One.__init__(self)
            spec = opdef.spec
            self.opdef = opdef
            self.name = spec.name
            self.plugin_version = str(spec.version)
            self.plugin_namespace = namespace
            self._field_list = [
                trt.PluginField(name, np.array([], dtype=np.int8), getattr(trt.PluginFieldType, kind))
                for name, kind in field_names(spec)
            ]
            self.field_names = trt.PluginFieldCollection(self._field_list)

        def create_plugin(self, name: str, fields: Any, phase: Any) -> Any:
            try:
                decoded = decode_fields(self.opdef.spec, [(f.name, f.type.name, np.asarray(f.data)) for f in fields])
            except Exception as exc:
                _record(name, self.name, f"opbridge: create_plugin: {exc}")
                raise
            return OpbridgePlugin(self.opdef, decoded, name, self.plugin_namespace)

    return OpbridgePlugin, OpbridgeCreator
