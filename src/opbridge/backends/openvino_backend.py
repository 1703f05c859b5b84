"""OpenVINO (CPU) backend: custom ONNX nodes run as generated Python ``openvino.Op`` subclasses.

Loading a model:

1. Default-domain custom nodes (TorchScript-era exports) are moved into
   ``opbridge.legacy`` (:func:`opbridge.legacy_domain.move_default_domain_ops`),
   since OpenVINO's ONNX frontend needs a domain to map them.
2. Model-local functions are inlined (:func:`opbridge.model_io.inline_functions`: onnx's inliner, each
   call given the defaults of the function's attributes it leaves out, which onnx's inliner drops):
   OpenVINO does not expand them, and a custom node with a body becomes standard ops.
   A body using an op OpenVINO's ONNX frontend cannot convert (e.g. DeformConv) is
   dropped instead, and its custom nodes run through their Python kernels.
3. Every remaining custom node is resolved to Python code (its ``@opbridge.op``
   kernel, else its PyTorch reference, else an ``@opbridge.kernel``) and tagged
   with a node index; one ``openvino.Op`` subclass is generated per op type and
   mapped from ONNX with ``openvino.frontend.onnx.ConversionExtension``.
4. Output shapes and dtypes come from the op's shape rule (or its reference run
   on meta tensors) in ``validate_and_infer_types``; dims the rule cannot tell
   stay dynamic. Ops known only by a kernel get the dtype and rank ONNX shape
   inference recorded for them, with dynamic dims. A kernel result whose dtype
   differs from its output's is an error (never cast), as in the ONNX Runtime bridge.

OpenVINO's CPU plugin computes int64 and uint32 in int32, bool in uint8 and float64 in float32 (for any
model, custom ops or not): inputs it would change beyond that (int64 past int32, float64 past float32's range
or infinite) and custom ops' outputs past those (an infinite float64 result too) are refused, and
:attr:`OpenVINORunner.notes` names a model's float64 inputs and outputs.

Inputs are copied into the request (``share_inputs=False``): OpenVINO may keep a
shared input buffer after the call returns, and a freed one crashed the process.

Example:
    >>> from opbridge.backends.openvino_backend import OpenVINORunner
    >>> with OpenVINORunner("model.onnx") as runner:   # doctest: +SKIP
    ...     outputs = runner.infer({"x": x})
"""

from __future__ import annotations

import functools
import logging
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from opbridge.backends._custom import (
    CustomKernel,
    KernelResultError,
    domain_versions,
    find_custom_kernel,
    is_custom_node,
)
from opbridge.backends.base import BackendRunError, OnnxRunner
from opbridge.errors import BackendUnavailableError, ModelLoadError, raise_interrupt_behind
from opbridge.model_io import save_with_data_file, subgraphs, too_large, walk_nodes

if TYPE_CHECKING:
    import onnx

__all__ = ["OpenVINORunner", "prepare_model"]

logger = logging.getLogger(__name__)

_NODE_ATTR = "_opbridge_node"
# Marks the messages of errors raised inside generated ops, to find them in OpenVINO's wrapped error.
_MARK = "[opbridge] "
_INTERRUPTED = "KeyboardInterrupt in a kernel"
# A Ctrl-C, SIGTERM or sys.exit() that came inside a Python op's callback, which OpenVINO reports as an
# error of the node: kept per thread, and raised again once OpenVINO has returned (_raise_kept_exit)
_EXITS = threading.local()


def _keep_exit(exc: BaseException) -> None:
    """Keep ``exc`` where it is no Exception (KeyboardInterrupt, SystemExit, a SIGTERM's Terminated)."""
    if not isinstance(exc, Exception):
        _EXITS.kept = exc


def _keeping_exits(fn: Any) -> Any:
    """``fn``, a callback OpenVINO makes, keeping a Ctrl-C, SIGTERM or sys.exit() that comes inside it (see
    :func:`_keep_exit`): OpenVINO reports it as an error of the node, or drops it."""

    @functools.wraps(fn)
    def kept(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            _keep_exit(exc)
            raise

    return kept


def _raise_kept_exit() -> None:
    """Raise the exit a callback of this thread kept, if any (see :func:`_keep_exit`)."""
    kept = getattr(_EXITS, "kept", None)
    if kept is not None:
        _EXITS.kept = None
        raise kept.with_traceback(None)


_INT32 = np.iinfo(np.int32)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass
class _NodeInfo:
    """What a generated op needs to know about the ONNX node it stands for."""

    kernel: CustomKernel
    attrs: dict[str, Any]
    num_outputs: int
    # (numpy dtype or None, rank or None) per output, from ONNX shape inference.
    onnx_outputs: list[tuple[np.dtype | None, int | None]]
    # The op's input position of each input the OpenVINO node has (omitted optional inputs are left
    # out of it: OpenVINO's CPU plugin cannot compile an empty input).
    positions: list[int] = field(default_factory=list)
    # the ONNX node's name ("" where it has none), for messages
    name: str = ""

    def label(self) -> str:
        """The op and, where it has a name, the node: ``domain::Op node 'n'``."""
        return f"{self.kernel.qualname} node {self.name!r}" if self.name else self.kernel.qualname

    def expand(self, values: list[Any]) -> list[Any]:
        """``values`` of the node's inputs at the op's input positions, None where one was omitted."""
        if not self.positions:
            return list(values)
        out: list[Any] = [None] * (max(self.positions) + 1 if self.positions else 0)
        for pos, value in zip(self.positions, values):
            out[pos] = value
        return out


def prepare_model(
    model: onnx.ModelProto, drop_functions: frozenset[tuple[str, str]] = frozenset()
) -> tuple[onnx.ModelProto, list[_NodeInfo], list[str]]:
    """Repair, inline and tag a model for OpenVINO.

    Functions named in ``drop_functions`` (``(domain, name)``) are removed rather
    than inlined, so their nodes run through their kernels. Returns the prepared
    copy, one :class:`_NodeInfo` per tagged custom node (the tag is the index), and
    the default-domain op types that were moved.
    Raises :class:`~opbridge.errors.UnknownOpError` for a custom op with no kernel and
    :class:`~opbridge.errors.ModelLoadError` for a node of a domain the model does not import.
    """
    import onnx

    from opbridge._dtypes import onnx_to_numpy
    from opbridge.legacy_domain import DEFAULT_LEGACY_DOMAIN, move_default_domain_ops, runs_default_domain_kernel
    from opbridge.model_io import (
        adopt_function_domains,
        check_domain_imports,
        inline_functions,
        restore_tensors,
        strip_tensors,
    )

    original_versions = domain_versions(model)
    fixed, moved = move_default_domain_ops(model, DEFAULT_LEGACY_DOMAIN)
    # (OpenVINO's ONNX frontend runs nodes of domains the model does not import; ONNX Runtime refuses them)
    check_domain_imports(fixed, "openvino")
    adopt_function_domains(fixed, "openvino")
    if drop_functions:
        kept = [f for f in fixed.functions if (f.domain, f.name) not in drop_functions]
        del fixed.functions[:]
        fixed.functions.extend(kept)
    # A model over protobuf's 2 GiB limit cannot be serialized, which the inliner and shape inference do: they
    # run on a copy without the large tensors' bytes (the graph is all they read), put back after.
    large = too_large(fixed)
    light = strip_tensors(fixed, 1024)[0] if large else fixed
    if light.functions:
        light = inline_functions(light)
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except Exception:
        inferred = light
    fixed = restore_tensors(fixed, light) if large else light
    types: dict[str, tuple[np.dtype | None, int | None]] = {}
    untaken: dict[str, int] = {}  # values of an element type without numpy equivalent (bfloat16...)
    graphs = [inferred.graph, *subgraphs(inferred.graph)]
    for vi in [v for g in graphs for v in (*g.value_info, *g.output)]:
        tt = vi.type.tensor_type
        try:
            dtype = onnx_to_numpy(tt.elem_type) if tt.elem_type else None
        except TypeError:
            dtype = None
        types[vi.name] = (dtype, len(tt.shape.dim) if tt.HasField("shape") else None)
        if dtype is None and tt.elem_type:
            untaken[vi.name] = tt.elem_type
    versions = domain_versions(fixed)
    infos: list[_NodeInfo] = []
    # the main graph's custom nodes and those of its If/Loop/Scan bodies (torch.cond's branches)
    local = {(f.domain, f.name) for f in fixed.functions}
    for node in [n for n in walk_nodes(fixed.graph.node) if is_custom_node(n, local)]:
        if runs_default_domain_kernel(node.domain, node.op_type, versions.get(node.domain), moved):
            kernel = find_custom_kernel("", node.op_type, original_versions.get(""))
        else:
            kernel = find_custom_kernel(node.domain, node.op_type, versions.get(node.domain))
        for name in (n for n in node.output if n in untaken):
            raise ModelLoadError(
                f"{node.domain}::{node.op_type} node {node.name!r}: output {name!r} is "
                f"{onnx.TensorProto.DataType.Name(untaken[name]).lower()}, which OpenVINO's Python ops do not "
                "take (numpy has no such type): cast to float32 around the op for OpenVINO."
            )
        attributes = kernel.attributes(node)  # (checks the node's inputs too: before they are compacted)
        positions = [i for i, name in enumerate(node.input) if name]
        if len(positions) != len(node.input):  # omitted optional inputs: the node gets the given ones only
            given = [node.input[i] for i in positions]
            del node.input[:]
            node.input.extend(given)
        else:
            positions = []
        infos.append(
            _NodeInfo(
                kernel,
                attributes,
                len(node.output),
                [types.get(o, (None, None)) for o in node.output],
                positions,
                node.name,
            )
        )
        node.attribute.append(onnx.helper.make_attribute(_NODE_ATTR, len(infos) - 1))
    return fixed, infos, moved


def _ov_attr_value(value: Any) -> Any | None:
    """An attribute value OpenVINO can visit and serialize, or None (left out of the IR).

    The kernel always gets the exact values; these only label the node in a saved IR.
    Float lists go in as float32 arrays (a list of floats cannot be serialized) and
    empty lists are left out (they break IR reload).
    """
    if isinstance(value, (bool, int, float, str)):
        return value
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if all(isinstance(v, str) for v in value):
        return list(value)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return np.asarray(value, dtype=np.float32)
    return None


def _op_class(op_type: str, nodes: list[_NodeInfo]) -> type:
    """Generate the ``openvino.Op`` subclass that runs custom nodes of ``op_type``."""
    import openvino as ov

    from opbridge.shape import infer_onnx

    # Per node index: the (input, output) dtypes of the ONNX node, recorded when the node is
    # converted, before the CPU plugin lowers precisions (int64 -> int32, bool -> uint8).
    model_dtypes: dict[int, tuple[list[np.dtype | None], list[np.dtype | None]]] = {}
    # Per node index: output types and shapes by input types and shapes. Held here, not by the op
    # instances: OpenVINO clones a node whose output shape is dynamic at every inference and never
    # frees the clones of a Python op (openvino 2025), so each instance is kept as small as it can be.
    shape_caches: dict[int, dict[Any, list[tuple[Any, Any]]]] = {}
    # The instances made while the runner loads: the converted nodes and the plugin's clones at compile
    # time. OpenVINO never frees a Python op, and each holds its inputs, so the graph upstream of it (the
    # model's weights, a copy per load) would stay with it: the runner cuts them loose when it closes.
    # (The clones made at inference are not kept: their inputs are OpenVINO's views of its buffers.)
    loading: list[Any] = []
    state = {"loading": True}

    def node(index: int) -> _NodeInfo:
        if index >= len(nodes):  # (the runner emptied them when it closed)
            raise RuntimeError(f"{_MARK}opbridge: the OpenVINO runner of this {op_type} node was closed")
        return nodes[index]

    class _CustomOp(ov.Op):
        def __init__(self, inputs: Any = None, node_index: int = -1) -> None:
            # Set before Op.__init__, which may already call validate_and_infer_types.
            self._index = node_index
            super().__init__(self, inputs)
            if state["loading"]:
                loading.append(self)
            if node_index >= 0:
                self.set_output_size(node(node_index).num_outputs)
            if inputs is not None:
                self.constructor_validate_and_infer_types()

        # -- shape and type --------------------------------------------------
        def _input_types(self) -> list[tuple[Any, Any]]:
            return [
                (self.get_input_element_type(i), self.get_input_partial_shape(i)) for i in range(self.get_input_size())
            ]

        def _infer_outputs(self, input_types: list[tuple[Any, Any]] | None = None) -> list[tuple[Any, Any]]:
            """The outputs' types and shapes for ``input_types`` (default: the node's inputs as compiled)."""
            info = node(self._index)
            types = input_types if input_types is not None else self._input_types()
            key = tuple((str(t), str(s)) for t, s in types)
            cache = shape_caches.setdefault(self._index, {})
            if key in cache:
                return cache[key]
            result: list[tuple[Any, Any]] | None = None
            if info.kernel.opdef is not None:
                result = _spec_outputs(info, types, infer_onnx)
            if result is None:
                result = _fallback_outputs(info, types)
            if len(cache) >= 256:  # (evaluate asks per shape the inputs take: a server sees many)
                cache.clear()
            cache[key] = result
            return result

        def validate_and_infer_types(self) -> None:
            result = self._infer_outputs()
            for i, (etype, pshape) in enumerate(result):
                # int64, bool and float64 outputs are int32, uint8 and float32 ones behind a Convert or
                # NotEqual (see _converter): the plugins compute them so, converting the ops they know while
                # compiling but not this one, whose output then met the lowered type in the ops it feeds
                # (evaluate checks an int64 result's range)
                self.set_output_type(i, _plugin_type(etype) or etype, pshape)
            if self._index >= 0 and self._index not in model_dtypes:
                model_dtypes[self._index] = (
                    [_np_dtype(t) for t, _ in self._input_types()],
                    [_np_dtype(t) for t, _ in result],
                )

        def clone_with_new_inputs(self, new_inputs: Any) -> Any:
            return type(self)(new_inputs, self._index)

        def visit_attributes(self, visitor: Any) -> bool:
            attrs = {"opbridge_node": self._index}
            if self._index >= 0:
                for k, v in node(self._index).attrs.items():
                    value = _ov_attr_value(v)
                    if value is not None:
                        attrs[k] = value
            visitor.on_attributes(attrs)
            return True

        # -- evaluation ------------------------------------------------------
        def has_evaluate(self) -> bool:
            return True

        def evaluate(self, outputs: Any, inputs: Any) -> bool:
            info = node(self._index)
            kernel = info.kernel
            # OpenVINO's Python API hands bfloat16 buffers over as float16 ones (the bits would be misread)
            if any(t.get_element_type() == ov.Type.bf16 for t in (*inputs, *outputs)):
                raise RuntimeError(
                    f"{_MARK}{info.label()}: a bfloat16 input or output, which OpenVINO's Python API passes to "
                    "Python ops as float16 (other bits): opbridge does not run such nodes in OpenVINO; cast to "
                    "float32 around the op for OpenVINO."
                )
            in_types, out_types = model_dtypes.get(self._index, ([], []))
            arrays: list[np.ndarray | None] = info.expand(
                [_kernel_input(t.data, in_types[i] if i < len(in_types) else None) for i, t in enumerate(inputs)]
            )
            if kernel.opdef is not None:
                arrays += [None] * (len(kernel.opdef.spec.inputs) - len(arrays))
            try:
                results = kernel.run(arrays, dict(info.attrs), info.num_outputs)
            except KeyboardInterrupt:  # OpenVINO would report it as an error of the node: _infer raises it again
                raise RuntimeError(f"{_MARK}{_INTERRUPTED}") from None
            except KernelResultError as exc:  # (its message names the op)
                raise RuntimeError(f"{_MARK}{exc}") from exc
            except Exception as exc:  # reported through OpenVINO, marked for _infer
                raise RuntimeError(
                    f"{_MARK}{info.label()}: the {kernel.source} raised {type(exc).__name__}: {exc}"
                ) from exc
            except BaseException as exc:  # SystemExit, a SIGTERM's Terminated: _infer raises it again
                _keep_exit(exc)
                raise RuntimeError(f"{_MARK}{type(exc).__name__} in a kernel") from None
            # the shapes the op gives for these inputs' own shapes (the compiled ones may be dynamic: a
            # result of another size would then be taken, and OpenVINO hand on memory it never wrote)
            concrete = self._infer_outputs([(t.get_element_type(), ov.PartialShape(list(t.shape))) for t in inputs])
            for i, (out, value) in enumerate(zip(outputs, results)):
                if not value.dtype.isnative:  # (a byte-swapped array, >f4: native order, as ONNX Runtime gives it)
                    value = value.astype(value.dtype.newbyteorder("="))
                declared = concrete[i][1] if i < len(concrete) else self.get_output_partial_shape(i)
                # without a spec, and without ONNX shape inference's word, type and rank are its first input's
                guessed = kernel.opdef is None and i < len(info.onnx_outputs) and None in info.onnx_outputs[i]
                unknown = (
                    "the model gives no type or rank for it (no value_info) and the op no spec, so its first "
                    "input's were assumed: give the model value_info for it, or define the op with @opbridge.op "
                    "and a shape rule."
                )
                if not declared.compatible(ov.PartialShape(list(value.shape))):
                    ruled = kernel.opdef is not None and kernel.opdef.shape_rule is not None
                    raise RuntimeError(
                        f"{_MARK}{info.label()}: the {kernel.source} returned shape "
                        f"{'x'.join(map(str, value.shape)) or '() (a scalar)'} for output {i}, but "
                        + (
                            f"OpenVINO expects {declared}: {unknown}"
                            if guessed
                            else f"its shape rule gives {declared}; fix the kernel or the rule registered with "
                            "register_shape."
                            if ruled
                            else f"the shape derived from the op's reference is {declared}; fix the kernel, or "
                            "declare the shape with register_shape."
                        )
                    )
                buffer = np.dtype(out.get_element_type().to_dtype())
                want = out_types[i] if i < len(out_types) and out_types[i] is not None else buffer
                if value.dtype != want:
                    fix = unknown if guessed else f"return an array of dtype {want} (e.g. result.astype(np.{want}))."
                    raise RuntimeError(
                        f"{_MARK}{info.label()}: the {kernel.source} returned dtype {value.dtype} for output {i}, "
                        f"but the node's output type is {want}; {fix}"
                    )
                # The plugin's own buffer may hold a lowered precision (int32 for int64, float32 for float64).
                if buffer != value.dtype and value.dtype.kind == "f" and buffer.kind == "f" and value.size:
                    if np.isinf(value).any():  # (as for an infinite input: the plugin makes it the largest float32)
                        raise RuntimeError(
                            f"{_MARK}{info.label()}: output {i} holds "
                            f"{float(value[np.isinf(value)].flat[0])!r}, which OpenVINO's CPU plugin, computing "
                            f"{value.dtype} in {buffer}, turns into {buffer}'s largest value "
                            f"({float(np.finfo(buffer).max):.7g}); keep the op's {value.dtype} results finite for OpenVINO "
                            "(or compare it on the other backends)."
                        )
                    finite = np.abs(value[np.isfinite(value)])
                    limit = float(np.finfo(buffer).max)
                    if finite.size and float(finite.max()) > limit:
                        raise RuntimeError(
                            f"{_MARK}{info.label()}: output {i} holds values beyond {buffer} (e.g. "
                            f"{float(finite.max())!r}), which OpenVINO's CPU plugin computes {value.dtype} in; keep "
                            f"them within {buffer} for OpenVINO."
                        )
                if buffer != value.dtype and value.dtype.kind in "iu" and buffer.kind in "iu" and value.size:
                    info32 = np.iinfo(buffer)
                    if value.min() < info32.min or value.max() > info32.max:
                        raise RuntimeError(
                            f"{_MARK}{info.label()}: output {i} holds values beyond {buffer} (e.g. "
                            f"{int(value.max()) if value.max() > info32.max else int(value.min())}), which OpenVINO's "
                            f"CPU plugin computes {value.dtype} in; keep them within {buffer} for OpenVINO."
                        )
                value = np.asarray(value, dtype=buffer, order="C")  # (0-d stays 0-d)
                out.shape = value.shape
                out.data[...] = value
            return True

    _CustomOp.__name__ = _CustomOp.__qualname__ = f"opbridge_{op_type}"

    def loaded() -> None:
        """Stop keeping the instances made from now on (the runner has loaded)."""
        state["loading"] = False

    def forget() -> None:
        """Drop what the class holds of its runner, and cut the instances made while it loaded loose from
        the graphs upstream of them (when the runner closes)."""
        state["loading"] = False
        for op in loading:
            _cut_inputs(op)
        loading.clear()
        shape_caches.clear()
        model_dtypes.clear()

    _CustomOp.loaded = staticmethod(loaded)  # type: ignore[attr-defined]
    _CustomOp.forget = staticmethod(forget)  # type: ignore[attr-defined]
    # (a Ctrl-C or SIGTERM arriving while OpenVINO works is delivered at its next call into Python; evaluate
    # keeps its own)
    for name in ("__init__", "validate_and_infer_types", "clone_with_new_inputs", "visit_attributes"):
        setattr(_CustomOp, name, _keeping_exits(getattr(_CustomOp, name)))
    return _CustomOp


# One empty Parameter per element type, which the inputs of closed runners' op instances point at.
_EMPTY: dict[str, Any] = {}
_EMPTY_LOCK = threading.Lock()


def _cut_inputs(op: Any) -> None:
    """Point every input of ``op`` at an empty Parameter, so that ``op`` holds none of the graph upstream of it."""
    import openvino as ov

    with _EMPTY_LOCK:  # (connecting an output changes its list of targets)
        for i in range(op.get_input_size()):
            etype = op.input_value(i).get_element_type()
            empty = _EMPTY.get(str(etype))
            if empty is None:
                empty = _EMPTY[str(etype)] = ov.op.Parameter(etype, ov.PartialShape([0]))
            op.input(i).replace_source_output(empty.output(0))


def _np_dtype(etype: Any) -> np.dtype | None:
    """The numpy dtype of an OpenVINO element type, or None (dynamic or without numpy equivalent)."""
    try:
        return np.dtype(etype.to_dtype())
    except Exception:
        return None


def _kernel_input(array: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """An input as the kernel sees it: the ONNX model's dtype (a read-only copy where the plugin
    lowered it, e.g. int32 back to int64), else a read-only view of OpenVINO's buffer."""
    if dtype is None or array.dtype == dtype:
        return _readonly(array)
    restored = array.astype(dtype)
    restored.flags.writeable = False
    return restored


def _readonly(array: np.ndarray) -> np.ndarray:
    """A read-only view of an OpenVINO input buffer: kernels read it without a copy, and one
    that writes into its input (which other nodes may read too) fails loudly instead."""
    view = array.view()
    view.flags.writeable = False
    return view


def _type_proto(etype: Any, pshape: Any) -> Any:
    import onnx

    from opbridge._dtypes import numpy_to_onnx

    tp = onnx.TypeProto()
    tp.tensor_type.elem_type = numpy_to_onnx(etype.to_dtype())
    if pshape.rank.is_static:
        shape = tp.tensor_type.shape
        shape.SetInParent()  # (a scalar's shape is set and empty; no shape at all is an unknown rank)
        for d in pshape:
            dim = shape.dim.add()
            if d.is_static:
                dim.dim_value = d.get_length()
    return tp


def _spec_outputs(info: _NodeInfo, inputs: list[tuple[Any, Any]], infer_onnx: Any) -> list[tuple[Any, Any]] | None:
    """Output types from the op's shape rule (or reference on meta tensors), or None on failure."""
    import openvino as ov

    from opbridge._dtypes import onnx_to_numpy

    opdef = info.kernel.opdef
    assert opdef is not None
    try:
        types = info.expand([_type_proto(t, s) for t, s in inputs])
        types += [None] * (len(opdef.spec.inputs) - len(types))
        protos = infer_onnx(opdef.spec, opdef.shape_rule, opdef.reference, types, info.attrs)
    except Exception as exc:
        logger.debug("%s: shape rule failed on %s: %s", info.kernel.qualname, inputs, exc)
        return None
    out: list[tuple[Any, Any]] = []
    for tp in protos:
        if tp is None:
            return None
        dims = [
            ov.Dimension(d.dim_value) if d.HasField("dim_value") else ov.Dimension() for d in tp.tensor_type.shape.dim
        ]
        out.append((ov.Type(onnx_to_numpy(tp.tensor_type.elem_type)), ov.PartialShape(dims)))
    return out


def _fallback_outputs(info: _NodeInfo, inputs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Dtype and rank from ONNX shape inference (else the first input's: OpenVINO's CPU plugin takes
    no output of dynamic rank), every dim dynamic."""
    import openvino as ov

    first_type, first_shape = inputs[0] if inputs else (ov.Type.f32, ov.PartialShape([]))
    first_rank = first_shape.rank.get_length() if first_shape.rank.is_static else 0
    out = []
    for dtype, rank in info.onnx_outputs:
        etype = ov.Type(dtype) if dtype is not None else first_type
        r = rank if rank is not None else first_rank
        out.append((etype, ov.PartialShape([ov.Dimension() for _ in range(r)])))
    return out


class OpenVINORunner(OnnxRunner):
    """Runs an ONNX model with OpenVINO; custom nodes run their opbridge kernels.

    Args:
        model: path, serialized bytes or ``onnx.ModelProto``.
        device: OpenVINO device name (``"CPU"``).
        precision: ``INFERENCE_PRECISION_HINT``. ``"f32"`` by default: on CPUs with
            bf16 support OpenVINO otherwise computes float32 models in bf16
            (errors near 1e-2), which is not what a parity check should measure.
            ``None`` keeps OpenVINO's own choice.
    """

    name = "openvino"
    requires = ("openvino",)
    install = "pip install 'opbridge[openvino]'"

    def __init__(self, model: Any, device: str = "CPU", precision: str | None = "f32") -> None:
        super().__init__(model)
        self.device = device
        self.precision = precision
        self._compiled: Any = None
        self._request: Any = None
        self._lock = threading.Lock()
        self._running_in: int | None = None  # (the thread whose infer holds the lock)
        self._core: Any = None
        self._out_index: dict[str, int] = {}
        self._out_dtypes: dict[str, np.dtype] = {}
        #: The custom ops' Python code, one entry per custom node (after inlining).
        self.kernels: list[CustomKernel] = []
        #: The converted ``openvino.Model`` (set by ``load``), e.g. for ``openvino.save_model``.
        self.ov_model: Any = None
        self._node_lists: list[list[_NodeInfo]] = []
        self._op_classes: list[type] = []
        #: Notes on how OpenVINO computes this model (set by ``load``), e.g. float64 values in float32.
        self.notes: list[str] = []

    def _load(self) -> None:
        try:
            self._load_model()
        except BaseException:
            self._close()  # (the op instances the failed attempt made let go of its model)
            raise
        for cls in self._op_classes:
            cls.loaded()  # type: ignore[attr-defined]

    def _load_model(self) -> None:
        try:
            import openvino as ov
            from openvino.frontend.onnx import ConversionExtension
        except ImportError as exc:
            raise_interrupt_behind(exc)  # (a Ctrl-C during the import: no missing package)
            raise BackendUnavailableError(
                f"openvino backend is not installed ({exc}); install it with pip install 'opbridge[openvino]'."
            ) from None
        drop: frozenset[tuple[str, str]] = frozenset()
        _EXITS.kept = None  # (one an earlier call left, had OpenVINO raised it itself)
        while True:
            prepared, nodes, moved = prepare_model(self.model, drop)
            self._node_lists.append(nodes)
            try:
                self.ov_model = ov_model = self._read(ov, ConversionExtension, prepared, nodes)
                _raise_kept_exit()  # (one OpenVINO dropped)
            except RuntimeError as exc:
                _raise_kept_exit()  # (a Ctrl-C or SIGTERM inside an op's callback: not the model's fault)
                more = _bodies_using(self.model, _unconverted_ops(str(exc))) - drop
                if not more:  # not an op without a rule: the bodies of the ops opbridge can run, if any
                    more = frozenset((f.domain, f.name) for f in _model_functions(self.model)) - drop
                if not more:
                    raise ModelLoadError(f"openvino could not convert the model: {_first_line(exc)}") from None
                _say_fallback(more, f"the bodies do not convert: {_first_line(exc)}")
                drop |= more
                continue
            try:
                config = {"INFERENCE_PRECISION_HINT": self.precision} if self.precision else {}
                self._compiled = self._core.compile_model(ov_model, self.device, config)
                _raise_kept_exit()
                break
            except RuntimeError as exc:
                _raise_kept_exit()
                # a body that converts but does not compile (Resize-11's empty inputs, say): the ops' kernels
                bodies = frozenset((f.domain, f.name) for f in _model_functions(self.model)) - drop
                if not bodies:
                    raise ModelLoadError(f"openvino could not compile the model: {_first_line(exc)}") from None
                _say_fallback(bodies, f"the model with the bodies does not compile: {_first_line(exc)}")
                drop |= bodies
        if moved:
            logger.info("openvino: moved default-domain custom ops %s into a domain of their own", moved)
        import onnx

        self._out_dtypes = {}
        for vi in prepared.graph.output:
            elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
            if elem:
                try:
                    self._out_dtypes[vi.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
                except Exception:  # no numpy equivalent (bfloat16, float8...)
                    continue
        self.kernels = [n.kernel for n in nodes]
        self.notes = _float64_notes(prepared)
        self._request = self._compiled.create_infer_request()
        self._out_index = {}
        for i, port in enumerate(self._compiled.outputs):
            for name in port.get_names():
                self._out_index.setdefault(name, i)
        for i, name in enumerate(self._outputs()):
            self._out_index.setdefault(name, i)

    def _read(self, ov: Any, extension: Any, prepared: onnx.ModelProto, nodes: list[_NodeInfo]) -> Any:
        """Convert ``prepared`` with one generated op class per custom op type."""
        import onnx

        self._core = core = ov.Core()
        seen: dict[tuple[str, str], type] = {}
        for node in walk_nodes(prepared.graph.node):
            if not any(a.name == _NODE_ATTR for a in node.attribute):
                continue
            key = (node.domain, node.op_type)
            if key in seen:
                continue
            cls = seen[key] = _op_class(node.op_type, nodes)
            self._op_classes.append(cls)
            core.add_extension(extension(node.op_type, node.domain, _converter(cls)))
        with tempfile.TemporaryDirectory(prefix="opbridge_ov_") as tmp:
            path = Path(tmp) / "model.onnx"
            if too_large(prepared):  # (over protobuf's 2 GiB limit: its tensors in a data file beside it)
                save_with_data_file(prepared, path, data_name="model.data")
            else:
                onnx.save(prepared, str(path))
            return core.read_model(str(path))

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, value in feed.items():
            _check_narrowed(name, np.asarray(value))
        # one infer request: calls from several threads take turns (overlapping calls on one request
        # failed as "busy", or returned another call's result)
        if self._running_in == threading.get_ident():  # (the plugin runs a kernel in the calling thread)
            raise BackendRunError(
                "openvino: a kernel called infer() of the runner that is running it, which would wait for itself "
                "for ever; run the inner model on an OpenVINORunner of its own."
            )
        with self._lock:
            self._running_in = threading.get_ident()
            _EXITS.kept = None
            try:
                results = self._request.infer(feed, share_inputs=False, share_outputs=False)
                _raise_kept_exit()
            except RuntimeError as exc:
                _raise_kept_exit()
                marked = [ln.split(_MARK, 1)[1] for ln in str(exc).splitlines() if _MARK in ln]
                if marked and marked[0].startswith(_INTERRUPTED):
                    raise KeyboardInterrupt from None
                raise BackendRunError(f"openvino: {marked[0] if marked else _first_line(exc)}") from None
            finally:
                self._running_in = None
            values = list(results.values())
            out = {name: np.asarray(values[self._out_index[name]]) for name in self._outputs()}  # already copies
        # the CPU plugin computes int64 in int32: the model's outputs come back in their declared dtype
        for name, value in out.items():
            want = self._out_dtypes.get(name)
            if want is not None and value.dtype != want and value.dtype.kind in "iu" and want.kind in "iu":
                out[name] = value.astype(want)
        return out

    def _close(self) -> None:
        self._request = None
        self._compiled = None
        self._core = None
        self.ov_model = None
        # the op instances OpenVINO never frees hold their class, and it these lists: emptied, the kernels,
        # attributes and shape caches they reach are freed with the runner
        for nodes in self._node_lists:
            nodes.clear()
        for cls in self._op_classes:
            cls.forget()  # type: ignore[attr-defined]
        self._node_lists.clear()
        self._op_classes.clear()


def _check_narrowed(name: str, value: np.ndarray) -> None:
    """Refuse an input OpenVINO's CPU plugin would change: it computes int64 in int32 and float64 in
    float32, so larger values and infinities reach the graph (and opbridge's kernels) wrapped or as
    float32's limit."""
    if not value.size:
        return
    if value.dtype in (np.int64, np.uint64):
        low, high = int(value.min()), int(value.max())
        if low < _INT32.min or high > _INT32.max:
            shown = high if high > _INT32.max else low
            raise BackendRunError(
                f"openvino: input {name!r} holds {shown}, beyond int32, which OpenVINO's CPU plugin computes "
                f"{value.dtype} in (the value would arrive wrapped); keep {value.dtype} inputs within int32 for OpenVINO."
            )
    elif value.dtype == np.float64:
        infinite = value[np.isinf(value)]
        if infinite.size:
            raise BackendRunError(
                f"openvino: input {name!r} holds {float(infinite[0])!r}, which OpenVINO's CPU plugin, computing "
                "float64 in float32, turns into float32's largest finite value (3.4e38); feed such inputs as "
                "float32, which keeps infinities, or keep float64 inputs finite for OpenVINO."
            )
        finite = np.abs(value[np.isfinite(value)])
        if finite.size and float(finite.max()) > _FLOAT32_MAX:
            raise BackendRunError(
                f"openvino: input {name!r} holds {float(finite.max())!r}, beyond float32, which OpenVINO's CPU "
                "plugin computes float64 in (it would arrive as float32's limit); keep float64 inputs within "
                "float32 for OpenVINO."
            )


def _float64_notes(model: onnx.ModelProto) -> list[str]:
    """A note naming the model's float64 inputs and outputs, which OpenVINO's CPU plugin computes in float32."""
    import onnx

    def doubles(values: Any) -> list[str]:
        return [v.name for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE]

    inputs, outputs = doubles(model.graph.input), doubles(model.graph.output)
    if not inputs and not outputs:
        return []
    named = [
        f"{kind}{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"
        for kind, names in (("input", inputs), ("output", outputs))
        if names
    ]
    return [
        f"float64 {' and '.join(named)}: OpenVINO's CPU plugin computes float64 in float32, so the comparison is "
        "at float32 precision (about 7 significant digits; magnitudes below float32's become 0)"
    ]


def _model_functions(model: Any) -> list[Any]:
    """The model-local functions of ``model`` (a path, bytes or ModelProto) whose ops opbridge can run."""
    from opbridge.backends._custom import find_custom_kernel
    from opbridge.model_io import load_model

    proto = load_model(model)
    versions = {o.domain: o.version for o in proto.opset_import}
    out = []
    for f in proto.functions:
        try:
            find_custom_kernel(f.domain, f.name, versions.get(f.domain))
        except Exception:  # no kernel: the body is the only way to run it
            continue
        out.append(f)
    return out


# the ops whose fallback from their function bodies to their kernels this process has warned of
_FALLEN_BACK: set[tuple[str, str]] = set()
_FALLEN_BACK_LOCK = threading.Lock()


def _say_fallback(functions: frozenset[tuple[str, str]], why: str) -> None:
    """Log that the ops of ``functions`` (``(domain, name)``) run through their kernels, not their bodies,
    and ``why``: a WARNING the first time in this process for an op (the op runs as Python code on each
    call, slower than OpenVINO's own ops, and computes as its kernel does), INFO for one warned of before."""
    with _FALLEN_BACK_LOCK:
        new = functions - _FALLEN_BACK
        _FALLEN_BACK.update(functions)
    logger.log(
        logging.WARNING if new else logging.INFO,
        "openvino: %s run through their kernels (Python code on each call, slower than OpenVINO's own ops), not "
        "their ONNX function bodies: %s",
        ", ".join(f"{domain}::{name}" for domain, name in sorted(functions)),
        why,
    )


def _unconverted_ops(message: str) -> set[str]:
    """Op types named in OpenVINO's "No conversion rule found for operations: A-1, B-20" message."""
    marker = "No conversion rule found for operations:"
    if marker not in message:
        return set()
    listed = message.split(marker, 1)[1].split("|", 1)[0].split("\n", 1)[0]
    return {item.strip().rsplit("-", 1)[0].rsplit(".", 1)[-1] for item in listed.split(",") if item.strip()}


def _bodies_using(model: onnx.ModelProto, op_types: set[str]) -> frozenset[tuple[str, str]]:
    """The model-local functions whose nodes (or nested subgraphs) use one of ``op_types``."""
    return frozenset(
        (f.domain, f.name) for f in model.functions if any(n.op_type in op_types for n in walk_nodes(f.node))
    )


def _plugin_type(etype: Any) -> Any | None:
    """The type a custom op's output is made in where OpenVINO's CPU plugin lowers the graph's (int64 to
    int32, bool to uint8, float64 to float32: the ops the output feeds compile for those), else None."""
    import openvino as ov

    if etype == ov.Type.i64:
        return ov.Type.i32
    if etype == ov.Type.boolean:
        return ov.Type.u8
    if etype == ov.Type.f64:
        return ov.Type.f32
    return None


def _converter(cls: type) -> Any:
    import openvino as ov
    import openvino.opset13 as opset

    def convert(ctx: Any) -> Any:
        inputs = [ctx.get_input(i) for i in range(ctx.get_input_size())]
        node = cls(inputs, int(ctx.get_attribute(_NODE_ATTR, -1)))
        # an int64, bool or float64 output is made as int32, uint8 or float32 (validate_and_infer_types): an op
        # gives the graph its type, which the plugin's precision pass then lowers with the rest of the graph
        wanted = node._infer_outputs()
        outputs = []
        for i, out in enumerate(node.outputs()):
            etype = wanted[i][0] if i < len(wanted) else None
            if etype is not None and etype == ov.Type.boolean:
                # (uint8 != 0, not a Convert: the CPU plugin read a Convert to boolean of output i > 0 from
                # output 0, a float output truncated to uint8)
                outputs.append(opset.not_equal(out, opset.constant(np.uint8(0))).output(0))
            elif etype is not None and _plugin_type(etype):
                outputs.append(opset.convert(out, etype).output(0))
            else:
                outputs.append(out)
        return outputs

    return _keeping_exits(convert)


def _first_line(exc: BaseException | str, limit: int = 400) -> str:
    """OpenVINO errors (an exception or its text) span many lines; keep the informative ones, short."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Exception from", "Check ", "At:", "/"))]
    text = " | ".join(useful or lines)
    return text[:limit]
