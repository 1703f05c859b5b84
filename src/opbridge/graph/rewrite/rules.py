"""The shipped rewrite rules.

* ``resize-cubic-to-dynamic-resize``: ``Resize(X, roi, scales|sizes)`` with mode cubic and
  scales/sizes computed at run time -> ``Test::DynamicTRTResize(X, size_tensor)``, where
  ``size_tensor = ConstantOfShape(Concat([1, 1], out_hw))`` keeps the computed output size.
  With ``scale_input=NAME``, a Resize whose scale was frozen to a constant reads its scale
  from graph input NAME instead: ``out_hw = Floor(Shape(X)[2:4] * NAME)``. With
  ``size_input=NAME``, one whose scale or sizes were frozen takes graph input NAME, of shape
  (1, 1, H, W), as its size tensor (the form TensorRT builds: no float shape tensor).
* ``fold-resize-scales``: Resize scales/sizes computable from constants -> initializers.
* ``replace-op``: ``Old`` -> ``domain::New`` with attribute renames.
* ``legacy-domain``: custom ops of the default domain -> a named domain with its opset import.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from opbridge.graph._model import evaluate_constant
from opbridge.graph.rewrite._base import Check, IRRule, RewriteError, RewriteRule, RuleOutcome, every_node

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

__all__ = ["FoldResizeScales", "LegacyDomain", "ReplaceOp", "ResizeCubicToDynamicResize"]

logger = logging.getLogger(__name__)


def _is_resize(node: ir.Node) -> bool:
    return node.op_type == "Resize" and node.domain in ("", "ai.onnx")


def _opset(node: ir.Node, root: ir.Graph | None = None) -> int | None:
    """The default-domain opset ``node`` runs under: its own, its graph's, else the main graph ``root``'s
    (a subgraph imports none of its own)."""
    if node.version is not None:
        return node.version
    for graph in (node.graph, root):
        if graph is not None:
            version = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx"))
            if version is not None:
                return version
    return None


def _resize_slots(node: ir.Node, root: ir.Graph | None = None) -> tuple[tuple[int, str], ...]:
    """(input index, name) of a Resize node's scales and sizes, under its opset (``root``: the main graph,
    whose opset a subgraph's node runs under)."""
    from opbridge.graph._model import resize_input_slots

    return resize_input_slots(_opset(node, root))


def _is_empty_constant(value: ir.Value) -> bool:
    """Whether ``value`` is a constant with no elements: a placeholder (the empty scales exporters write
    beside sizes), not a value to fold."""
    from opbridge.graph._model import const_array

    array = const_array(value)
    return array is not None and array.size == 0


def _input(node: ir.Node, index: int) -> ir.Value | None:
    """Input ``index`` of ``node``, or None when absent."""
    return node.inputs[index] if len(node.inputs) > index else None


def _graph_values(graph: ir.Graph) -> list[ir.Value]:
    """The graph's inputs, initializers and node outputs (subgraphs' too)."""
    import onnx_ir as ir

    values = [*graph.inputs, *graph.initializers.values()]
    for node in ir.traversal.RecursiveGraphIterator(graph):
        values.extend(node.outputs)
    return values


def _taken_names(graph: ir.Graph) -> set[str]:
    """The names of the graph's values and nodes (subgraphs' too)."""
    import onnx_ir as ir

    names = {v.name for v in _graph_values(graph)} | {n.name for n in ir.traversal.RecursiveGraphIterator(graph)}
    return {n for n in names if n}


def _names_in_use(rule: Any) -> set[str]:
    """The names in use in the graph ``rule`` rewrites (:func:`_taken_names` of its root), gathered once
    per application of the rule; names :func:`_unique` hands out join them."""
    taken = getattr(rule, "_taken", None)
    if taken is None:
        taken = rule._taken = _taken_names(rule.root)
    return taken


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name_1``, ``name_2``... where ``taken`` holds it; the name returned is added."""
    base, k = name, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _const(
    graph: ir.Graph, array: np.ndarray, name: str, taken: set[str] | None = None, *, model: ir.Model | None = None
) -> ir.Value:
    """A new initializer holding ``array``, under a name the graph does not use yet (``taken``: the names
    in use, when the caller keeps them). In a ``model`` of IR version 3 or older, where every initializer
    is also a graph input, it is an initializer and an input of the main graph (which a subgraph reads from
    the outer scope: its own inputs are fixed by its node)."""
    import onnx_ir as ir

    name = _unique(name, _taken_names(graph) if taken is None else taken)
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.shape = ir.Shape(array.shape)
    value.dtype = ir.DataType.from_numpy(array.dtype)
    if model is not None and model.ir_version < 4:
        model.graph.register_initializer(value)
        model.graph.inputs.append(value)
    else:
        graph.register_initializer(value)
    return value


def _holds_one_factor(value: ir.Value) -> bool:
    """Whether graph input ``value`` can be a scale factor: a number (no string or bool) of shape
    [] or [1] (a symbolic dim counts as 1: the feed decides)."""
    import onnx_ir as ir

    if value.dtype is not None and (value.dtype == ir.DataType.STRING or value.dtype == ir.DataType.BOOL):
        return False
    if value.shape is None:
        return True
    dims = list(value.shape)
    return len(dims) == 0 or (len(dims) == 1 and (not isinstance(dims[0], int) or dims[0] == 1))


def _dims_text(value: ir.Value) -> str:
    return "unknown" if value.shape is None else str([d if isinstance(d, int) else str(d) for d in value.shape])


def _set_opset(model: ir.Model, domain: str, version: int) -> None:
    current = model.opset_imports.get(domain)
    if current is None or current < version:
        model.opset_imports[domain] = version


def _declared_shapes(graph: onnx.GraphProto) -> dict[str, list[int | str | None]]:
    """The dims the value infos, inputs and outputs of ``graph`` and its subgraphs declare, by name."""
    from opbridge.model_io import subgraphs

    shapes: dict[str, list[int | str | None]] = {}
    for g in [graph, *subgraphs(graph)]:
        for info in [*g.input, *g.value_info, *g.output]:
            tensor = info.type.tensor_type
            if info.type.HasField("tensor_type") and tensor.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
                shapes.setdefault(info.name, dims)
    return shapes


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, ir.Shape]:
    """The shapes ONNX shape inference gives the values of ``model`` (``{}`` where it fails); the names it
    makes up for unknown dims (``unk__0``, which another value's unknown dim may get too) are left unknown."""
    import onnx
    import onnx_ir as ir

    import opbridge

    opbridge.register_onnx_schemas()
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # (the checks after the rewrite name what is wrong with the model)
        logger.debug("shape inference of the model before the rewrite failed: %s", exc)
        return {}
    named = {d for dims in _declared_shapes(model.graph).values() for d in dims if isinstance(d, str)}
    return {
        name: ir.Shape([d if not isinstance(d, str) or d in named else None for d in dims])
        for name, dims in _declared_shapes(inferred.graph).items()
    }


def _rename_dims(start: ir.Value, old: list[Any], new: list[Any]) -> None:
    """Give ``start`` (a 4-D value) new height and width dims, and the values computed from it dims that
    are not stale: a symbolic ``old[i]`` becomes ``new[i]`` anywhere in their shapes; a symbolic dim written
    in terms of an old one (``floor(H/2)``) and a static dim equal to a static old one become unknown (after
    a Transpose or Reshape, which axis holds the old height or width cannot be told from the shape; shape
    inference fills them in again)."""
    import onnx_ir as ir

    renamed = {d.value: n for d, n in zip(old, new) if isinstance(d, ir.SymbolicDim) and d.value}
    static = {d for d in old if isinstance(d, int)}
    seen, todo = {id(start)}, [start]
    while todo:
        value = todo.pop()
        if value.shape is not None:
            dims: list[Any] = list(value.shape.dims)
            for axis, dim in enumerate(dims):
                if isinstance(dim, ir.SymbolicDim) and dim.value in renamed:
                    dims[axis] = renamed[dim.value]
                elif isinstance(dim, ir.SymbolicDim) and any(n in (dim.value or "") for n in renamed):
                    dims[axis] = None
                elif value is not start and isinstance(dim, int) and dim in static:
                    dims[axis] = None
            if value is start:
                dims[2:4] = new
            value.shape = ir.Shape(dims)
        for use in value.uses():
            for output in use.node.outputs:
                if id(output) not in seen:
                    seen.add(id(output))
                    todo.append(output)


# Resize with scales samples at (x + 0.5) / scale - 0.5 (PyTorch's scale_factor too); DynamicResize, like
# F.interpolate(size=...), at (x + 0.5) * in / out - 0.5: the same points where in * scale is whole.
_SCALES_CAVEAT = (
    "; WARNING: exact where height and width times the scale are whole numbers (x2, x3, x4 on any input); "
    "elsewhere DynamicResize samples with the in/out size ratio (F.interpolate(size=...)) where Resize with "
    "scales uses 1/scale, and the values differ (check with opbridge verify at the scales you run)"
)

# ONNX's pytorch_half_pixel samples index 0 along an axis resized to length 1; DynamicResize, like
# F.interpolate, samples that axis's centre (half_pixel): the two agree at every length above 1.
_PYTORCH_HALF_PIXEL_CAVEAT = (
    "; WARNING: coordinate_transformation_mode 'pytorch_half_pixel' samples input index 0 where the output "
    "height or width is 1, DynamicResize (like F.interpolate) the input's centre: the values differ at such a "
    "size and agree at any size above 1 (the output size is not a known static size above 1 here)"
)


class ResizeCubicToDynamicResize(IRRule):
    """Cubic ``Resize`` with run-time scales/sizes -> opbridge ``DynamicResize`` (``Test::DynamicTRTResize``)."""

    name: ClassVar[str] = "resize-cubic-to-dynamic-resize"
    summary: ClassVar[str] = "cubic Resize with run-time scales/sizes -> Test::DynamicTRTResize(input, size_tensor)"
    options: ClassVar[Mapping[str, str]] = {
        "scale_input": "graph input holding the scale factor, for a Resize whose scale was frozen to a constant "
        "(added as a float32 [1] input when the graph has none of that name)",
        "size_input": "graph input whose shape (1, 1, H, W) gives the output size, for a Resize whose scale or "
        "sizes were frozen to constants (added, of the input's dtype, when the graph has none of that name; only "
        "its shape is read): the form TensorRT builds, exact at any size",
    }
    looks_for = "Resize node"
    #: whether a rewrite of this application read ``scale_input``/``size_input``
    _option_used: bool = False
    #: the model of this application, and the shapes shape inference gives its values (once asked for)
    _source: onnx.ModelProto
    _inferred: dict[str, ir.Shape] | None = None

    def apply(self, model: onnx.ModelProto, options: Mapping[str, Any]) -> tuple[onnx.ModelProto, list[RuleOutcome]]:
        """:meth:`IRRule.apply`, with one more outcome where ``scale_input``/``size_input`` is given and no
        node used it (each node's outcome says why)."""
        self._option_used = False
        self._source, self._inferred = model, None
        out, outcomes = super().apply(model, options)
        given = [f"{k}={options[k]!r}" for k in ("scale_input", "size_input") if options.get(k)]
        if given and not self._option_used and any(o.node for o in outcomes):
            outcomes.append(
                self.outcome(
                    "",
                    False,
                    f"option {' and '.join(given)} used by no Resize node: it applies to a cubic Resize whose scale "
                    "or sizes were frozen to constants (each node's line says why it did not use it)",
                )
            )
        return out, outcomes

    def candidates(self, graph: ir.Graph, options: Mapping[str, Any]) -> list[ir.Node]:
        return [n for n in every_node(graph) if _is_resize(n)]

    def check(self, node: ir.Node, options: Mapping[str, Any]) -> Check:
        attrs = node.attributes
        mode = attrs.get_string("mode", "nearest")
        if mode != "cubic":
            return Check.fail(f"mode is {mode!r}, not 'cubic'")
        version = _opset(node, self.root)
        if version is not None and version < 11:
            # Resize-10 defines nearest and linear only, without coordinate_transformation_mode; ONNX Runtime
            # runs its cubic mode as Resize-11's cubic with asymmetric coordinates and cubic_coeff_a -0.75
            return Check.fail(
                f"a Resize-10 node (opset {version}): ONNX defines cubic from Resize-11 on, and ONNX Runtime runs "
                "Resize-10's cubic with asymmetric coordinates (x_in = x_out / scale), which DynamicResize has no "
                "equivalent of (it samples as half_pixel or align_corners); export the model at opset 11 or later "
                "with the coordinate_transformation_mode meant"
            )
        coord = attrs.get_string("coordinate_transformation_mode", "half_pixel")
        if coord in ("half_pixel", "pytorch_half_pixel"):
            align = 0
        elif coord == "align_corners":
            align = 1
        else:
            return Check.fail(
                f"coordinate_transformation_mode {coord!r} has no DynamicResize equivalent "
                "(it supports half_pixel/pytorch_half_pixel and align_corners)"
            )
        coeff = attrs.get_float("cubic_coeff_a", -0.75)
        if abs(coeff + 0.75) > 1e-7:
            return Check.fail(f"cubic_coeff_a is {coeff}; DynamicResize is PyTorch's bicubic with -0.75")
        if attrs.get_int("exclude_outside", 0) or attrs.get_int("antialias", 0):
            return Check.fail("exclude_outside/antialias is set; DynamicResize supports neither")
        if attrs.get_ints("axes", None) is not None:
            return Check.fail("the axes attribute is set; DynamicResize resizes the last two dims of a 4-D input")
        policy = attrs.get_string("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            return Check.fail(
                f"keep_aspect_ratio_policy is {policy!r}: the output size is not the given sizes, which "
                "DynamicResize takes as they are"
            )
        x = node.inputs[0]
        if x is not None and x.shape is not None and len(x.shape) != 4:
            return Check.fail(f"input {x.name!r} has rank {len(x.shape)}; DynamicResize takes (N, C, H, W)")
        given = [(what, _input(node, index)) for index, what in reversed(_resize_slots(node, self.root))]
        what, source = next(((w, v) for w, v in given if v is not None and v.name), ("scales", None))
        if source is None:
            return Check.fail("the Resize has neither scales nor sizes")
        scale_input, size_input = options.get("scale_input"), options.get("size_input")
        frozen, _ = evaluate_constant(source, opset=_opset(node, self.root))
        if frozen is None:
            unused = [f"{k}={v!r}" for k, v in (("scale_input", scale_input), ("size_input", size_input)) if v]
            note = (
                f"; option {' and '.join(unused)} not used: the output size is already computed at run time by "
                f"{what} {source.name!r}"
                if unused
                else ""
            )
            return Check.success(
                f"{what} {source.name!r} computed at run time{note}" + (_SCALES_CAVEAT if what == "scales" else ""),
                {"align": align, "coord": coord, "kind": what, "src": source},
            )
        if scale_input and size_input:
            return Check.fail("scale_input and size_input both given; give one (size_input for TensorRT)")
        if not scale_input and not size_input:
            return Check.fail(
                f"{what} are the constant {frozen.tolist()}: nothing computes them at run time, so there is nothing "
                "to keep dynamic; pass --option size_input=NAME (the output size from a graph input's shape) or "
                "scale_input=NAME (the scale from a graph input), or use --rule fold-resize-scales if a fixed "
                "scale is intended"
            )
        option, name = ("size_input", size_input) if size_input else ("scale_input", scale_input)
        flat = [float(v) for v in frozen.ravel()]
        if what == "sizes" and scale_input:
            return Check.fail("sizes are constants; scale_input applies to a frozen scale (size_input to both)")
        if what == "scales" and scale_input and (len(flat) != 4 or flat[:2] != [1.0, 1.0] or flat[2] != flat[3]):
            return Check.fail(f"frozen scales {flat} are not (1, 1, s, s); scale_input gives one factor for H and W")
        if what == "scales" and (len(flat) != 4 or flat[:2] != [1.0, 1.0]):
            return Check.fail(f"frozen scales {flat} change dims other than H and W, which DynamicResize keeps")
        graph = self.root
        existing = next((v for v in graph.inputs if v.name == name), None)
        if existing is None:
            # a value of that name that is not a graph input: an initializer or a node's output, which
            # other nodes read; a graph input of that name would shadow it (or be shadowed by it)
            values = getattr(self, "_values", None)
            if values is None:  # (gathered once per application: a check runs per Resize node)
                values = self._values = {v.name: v for v in reversed(_graph_values(graph))}
            clash = values.get(name)
            if clash is not None:
                kind = "an initializer" if clash.is_initializer() else "a value computed in the graph"
                readers = "a graph output" if clash.is_graph_output() and not clash.uses() else "read by other nodes"
                return Check.fail(
                    f"{option} {name!r} names {kind} ({readers}), which a new graph input of that name would "
                    "shadow; choose a name the graph does not use (or an existing graph input)"
                )
        elif size_input and existing.shape is not None and len(existing.shape) != 4:
            return Check.fail(f"size_input {name!r} is a graph input of rank {len(existing.shape)}, not (1, 1, H, W)")
        elif scale_input and not _holds_one_factor(existing):
            return Check.fail(
                f"scale_input {name!r} is a graph input of shape {_dims_text(existing)}, not one scale factor "
                "(shape [] or [1]); choose a name the graph does not use, and the rule adds that input"
            )
        if size_input:
            return Check.success(
                f"frozen {what} {flat} replaced by the shape of graph input {name!r} (1, 1, H, W)",
                {"align": align, "coord": coord, "kind": "size_input", "name": str(name)},
            )
        return Check.success(
            f"frozen scales {flat} replaced by graph input {name!r}{_SCALES_CAVEAT}",
            {"align": align, "coord": coord, "kind": "scale_input", "name": str(name)},
        )

    def rewrite(self, model: ir.Model, node: ir.Node, check: Check, options: Mapping[str, Any]) -> str:
        import onnx_ir as ir

        from opbridge.ops import DynamicResize

        graph = node.graph or model.graph  # (a subgraph's node is rewritten in its subgraph)
        x = node.inputs[0]
        assert x is not None
        data = check.data
        self._option_used = self._option_used or data["kind"] in ("scale_input", "size_input")
        prefix = (node.name or "resize").strip("/").replace("/", "_")
        new_nodes: list[ir.Node] = []

        # names of their own: two rewritten Resize nodes without names (or of one name) would collide
        taken = _names_in_use(self)

        def op(op_type: str, inputs: list[ir.Value], **attrs: Any) -> ir.Value:
            name = _unique(f"{prefix}/{op_type}_{len(new_nodes)}", taken)
            n = ir.node(op_type, inputs, attributes=attrs or None, name=name)
            n.outputs[0].name = _unique(f"{name}_out", taken)
            new_nodes.append(n)
            return n.outputs[0]

        def const(array: np.ndarray, name: str) -> ir.Value:
            return _const(graph, array, name, taken, model=model)

        def hw_from_scale(scale: ir.Value) -> ir.Value:
            shape = op("Shape", [x])
            hw_in = op(
                "Slice",
                [
                    shape,
                    const(np.array([2], np.int64), f"{prefix}_start"),
                    const(np.array([4], np.int64), f"{prefix}_end"),
                ],
            )
            scaled = op("Mul", [op("Cast", [hw_in], to=ir.DataType.FLOAT), scale])
            return op("Cast", [op("Floor", [scaled])], to=ir.DataType.INT64)

        if data["kind"] == "sizes":
            hw = op(
                "Slice",
                [
                    data["src"],
                    const(np.array([-2], np.int64), f"{prefix}_start"),
                    const(np.array([2**62], np.int64), f"{prefix}_end"),
                ],
            )
        elif data["kind"] == "scales":
            scales_hw = op(
                "Slice",
                [
                    data["src"],
                    const(np.array([2], np.int64), f"{prefix}_sstart"),
                    const(np.array([4], np.int64), f"{prefix}_send"),
                ],
            )
            hw = hw_from_scale(scales_hw)
        elif data["kind"] == "scale_input":
            scale = next((v for v in model.graph.inputs if v.name == data["name"]), None)
            if scale is None:  # (an input of the model, which a subgraph reads from the outer scope)
                scale = ir.Value(name=data["name"], shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.FLOAT))
                model.graph.inputs.append(scale)
            if scale.dtype != ir.DataType.FLOAT:
                scale = op("Cast", [scale], to=ir.DataType.FLOAT)
            hw = hw_from_scale(scale)
        if data["kind"] == "size_input":
            # the size tensor itself: a graph input whose shape is the output size (DynamicResize reads only
            # its shape), as seed 001's model takes it; TensorRT builds it with a profile for that input
            size_tensor = next((v for v in model.graph.inputs if v.name == data["name"]), None)
            if size_tensor is None:
                dims = [_unique(f"{data['name']}_{d}", taken) for d in ("height", "width")]
                size_tensor = ir.Value(
                    name=data["name"],
                    shape=ir.Shape([1, 1, *dims]),
                    type=ir.TensorType(x.dtype or ir.DataType.FLOAT),
                )
                model.graph.inputs.append(size_tensor)
        else:
            shape4 = op("Concat", [const(np.array([1, 1], np.int64), f"{prefix}_nc"), hw], axis=0)
            dtype = x.dtype or ir.DataType.FLOAT
            if dtype == ir.DataType.BFLOAT16 and model.opset_imports.get("", 20) < 20:
                dtype = ir.DataType.FLOAT  # (ConstantOfShape makes bfloat16 from opset 20; only the shape is read)
            fill = ir.tensor(np.zeros(1, dtype=dtype.numpy()))
            size_tensor = op("ConstantOfShape", [shape4], value=fill)
        spec = DynamicResize.spec
        resize = ir.node(
            spec.name,
            [x, size_tensor],
            attributes={"align_corners": int(data["align"])},
            domain=spec.domain,
            name=node.name or _unique(f"{prefix}/DynamicResize", taken),
        )
        new_nodes.append(resize)
        resized = node.outputs[0]
        if resized.shape is None:  # (a file from elsewhere declares no shape for it: inferred)
            resized.shape = self._inferred_shape(resized.name)
            if resized.shape is not None and resized.type is None and x.dtype is not None:
                resized.type = ir.TensorType(x.dtype)
        ir.convenience.replace_nodes_and_values(graph, node, [node], new_nodes, node.outputs[:1], resize.outputs[:1])
        out = resize.outputs[0]
        sized = size_tensor.shape if data["kind"] == "size_input" else None
        # the output's height and width as the rewritten model computes them, where known
        out_hw: list[Any] = [None, None]
        if sized is not None and len(sized) == 4:
            out_hw = [sized[2], sized[3]]  # the size input's own H and W
        elif data["kind"] in ("sizes", "scales") and out.shape is not None and len(out.shape) == 4:
            out_hw = [out.shape[2], out.shape[3]]  # computed as before
        if out.shape is not None and len(out.shape) == 4:
            # the output's height and width now follow the run-time size: the dims declared for them (and
            # for the values computed from them, a graph output's too) would be stale
            if sized is not None and len(sized) == 4 and all(d is not None for d in (sized[2], sized[3])):
                new_hw = [sized[2], sized[3]]
            else:
                new_hw = [ir.SymbolicDim(_unique(f"{prefix}_{d}", taken)) for d in ("height", "width")]
            _rename_dims(out, [out.shape[2], out.shape[3]], new_hw)
        _set_opset(model, spec.domain, spec.version)
        caveat = ""
        if data["coord"] == "pytorch_half_pixel" and not all(isinstance(d, int) and d > 1 for d in out_hw):
            caveat = _PYTORCH_HALF_PIXEL_CAVEAT
        return (
            f"{check.reason}; now {spec.qualname}(align_corners={data['align']}) with a size tensor of shape "
            f"(1, 1, H, W){caveat}"
        )

    def _inferred_shape(self, name: str | None) -> ir.Shape | None:
        """The shape ONNX shape inference gives value ``name`` of the model before the rewrite (inferred once
        per application of the rule), or None where it infers none."""
        if self._inferred is None:
            self._inferred = _inferred_shapes(self._source)
        return self._inferred.get(name or "")


class FoldResizeScales(IRRule):
    """Resize scales/sizes that are computable from constants -> initializers (what TensorRT requires)."""

    name: ClassVar[str] = "fold-resize-scales"
    summary: ClassVar[str] = "fold constant-computable Resize scales/sizes into initializers"
    looks_for = "Resize node"

    def candidates(self, graph: ir.Graph, options: Mapping[str, Any]) -> list[ir.Node]:
        return [n for n in every_node(graph) if _is_resize(n)]

    def check(self, node: ir.Node, options: Mapping[str, Any]) -> Check:
        folds: list[tuple[int, str, np.ndarray]] = []
        placeholders: list[tuple[int, str, np.ndarray]] = []  # empty tensors: folded only beside a real input
        reasons, empty = [], []
        for index, what in _resize_slots(node, self.root):
            value = _input(node, index)
            if value is None or not value.name:
                continue
            if value.is_initializer():
                if not _is_empty_constant(value):
                    reasons.append(f"{what} {value.name!r} are already an initializer")
                continue
            arr, why = evaluate_constant(value, opset=_opset(node, self.root))
            if arr is None:
                reasons.append(f"{what} {value.name!r} cannot be folded: {why}")
                continue
            if arr.size == 0:
                placeholders.append((index, what, arr))
                empty.append(f"{what} {value.name!r} is an empty placeholder")
            else:
                folds.append((index, what, arr))
        if not folds:
            return Check.fail("; ".join((reasons or ["the Resize has neither scales nor sizes"]) + empty))
        return Check.success("; ".join(reasons), folds + placeholders)

    def rewrite(self, model: ir.Model, node: ir.Node, check: Check, options: Mapping[str, Any]) -> str:
        done = []
        for index, what, arr in check.data:
            old = node.inputs[index]
            assert old is not None
            new = _const(
                node.graph or model.graph,
                arr,
                f"{(node.name or 'resize').strip('/').replace('/', '_')}_{what}",
                _names_in_use(self),
                model=model,
            )
            node.replace_input_with(index, new)
            if arr.size:
                done.append(f"{what} {old.name!r} -> initializer {new.name!r} = {arr.tolist()}")
            else:
                done.append(f"empty {what} {old.name!r} (a placeholder, folded alongside) -> initializer {new.name!r}")
        return "; ".join(done + ([check.reason] if check.reason else []))


def _split_op(text: str) -> tuple[str | None, str]:
    if "::" in text:
        domain, name = text.split("::", 1)
        return domain, name
    return None, text


class ReplaceOp(IRRule):
    """Nodes of one op type -> another op (usually a custom one), with attribute renames."""

    name: ClassVar[str] = "replace-op"
    summary: ClassVar[str] = "swap an op for another: --map Old=domain::New [--rename old=new ...]"
    options: ClassVar[Mapping[str, str]] = {
        "map": "Old=domain::New (Old may be domain::Old); repeatable (Python: a list, or a dict {Old: New})",
        "rename": "old=new attribute renames; repeatable (Python: a list, or a dict {old: new})",
        "version": "opset version of the new domain when opbridge does not know the op (default 1)",
    }

    @staticmethod
    def _pairs(options: Mapping[str, Any], key: str) -> list[str]:
        """The ``map``/``rename`` option ``key`` as ``"a=b"`` items: a list of them, one, or a dict ``{a: b}``."""
        value = options.get(key)
        if isinstance(value, Mapping):
            return [f"{k}={v}" for k, v in value.items()]
        if isinstance(value, str):
            return [value]
        if value is None or isinstance(value, (list, tuple)):
            return list(value or ())
        example = "Resize=acme::BicubicResize" if key == "map" else "beta=alpha"
        raise RewriteError(
            f"option {key} is a {type(value).__name__}; give 'a=b' strings, a list of them or a dict {{a: b}}, "
            f"e.g. {{'{key}': ['{example}']}}."
        )

    def _maps(self, options: Mapping[str, Any]) -> list[tuple[str | None, str, str, str]]:
        from opbridge.errors import OpbridgeError

        maps: list[tuple[str | None, str, str, str]] = []
        for item in self._pairs(options, "map"):
            old, sep, new = str(item).partition("=")
            new_domain, new_name = _split_op(new)
            old_domain, old_name = _split_op(old)
            if not sep or not old or not new_name or new_domain is None or "::" in new_name or "::" in old_name:
                raise OpbridgeError(f"--map {item!r}: write Old=domain::New (e.g. Resize=acme::BicubicResize)")
            same = next((m for m in maps if (m[0], m[1]) == (old_domain, old_name)), None)
            if same is not None:
                raise OpbridgeError(
                    f"--map {item!r}: {old} is mapped twice (to {same[2] or 'ai.onnx'}::{same[3]} too); give one "
                    "target per op"
                )
            maps.append((old_domain, old_name, "" if new_domain == "ai.onnx" else new_domain, new_name))
        if not maps:
            raise OpbridgeError(
                'rule replace-op needs --map Old=domain::New (in Python: options={"map": ["Old=domain::New"]})'
            )
        if options.get("version") is not None and all(m[2] == "" for m in maps):
            raise OpbridgeError(
                f"--option version={options['version']}: the version is that of the new op's custom domain; an "
                "ONNX op runs at the model's ONNX opset (leave version out)"
            )
        return maps

    @staticmethod
    def _version(options: Mapping[str, Any]) -> int:
        from opbridge.errors import OpbridgeError

        raw = options.get("version")
        if raw is None:
            return 1
        try:
            version = int(raw)
        except (TypeError, ValueError):
            version = 0
        if not 1 <= version < 2**31:
            raise OpbridgeError(f"--option version={raw}: the opset version is a whole number from 1, e.g. version=1")
        return version

    def _renames(self, options: Mapping[str, Any]) -> dict[str, str]:
        from opbridge.errors import OpbridgeError

        out: dict[str, str] = {}
        for item in self._pairs(options, "rename"):
            old, sep, new = str(item).partition("=")
            if not sep or not old or not new:
                raise OpbridgeError(f"--rename {item!r}: write old_attribute=new_attribute")
            if old in out and out[old] != new:
                raise OpbridgeError(f"--rename {item!r}: {old!r} is renamed to {out[old]!r} already; rename it once.")
            out[old] = new
        return out

    def candidates(self, graph: ir.Graph, options: Mapping[str, Any]) -> list[ir.Node]:
        maps = self._maps(options)
        self._version(options)  # (a bad version is refused whether or not a node matches)
        self.looking_for = "node of type " + " or ".join(f"{d + '::' if d else ''}{n}" for d, n, _, _ in maps)
        found = [n for n in every_node(graph) if self._target(n, maps) is not None]
        # nodes of the op inside model-local function bodies, which this rule does not enter: named, not skipped
        # silently
        in_bodies = [
            (node, f"{fn.domain}::{fn.name}")
            for fn in self.model.functions.values()
            for node in every_node(fn.graph)
            if self._target(node, maps) is not None
        ]
        self.left_out = [
            (node.name or node.op_type, f"sits in the body of function {fn}, which replace-op does not enter")
            for node, fn in in_bodies
        ]
        targets = {(d, n) for _, _, d, n in maps}
        there = sorted({f"{n.domain}::{n.op_type}" for n in every_node(graph) if (n.domain, n.op_type) in targets})
        self.none_found = ""
        if not found and self.left_out:
            self.none_found = (
                f"no {self.looking_for} in the graph: the {len(in_bodies)} node(s) of that type sit in the bodies of "
                f"model-local functions ({', '.join(sorted({fn for _, fn in in_bodies}))}), which replace-op does not "
                "enter; export the model "
                "without function bodies (functions=False, --no-functions) to rewrite them"
            )
        elif not found and there:  # (the map's target is there already: "no node of type Foo" read as a lie)
            self.none_found = (
                f"no {self.looking_for} to move in the graph: its nodes of that name are {', '.join(there)} already, "
                "which replace-op leaves as they are (--rename renames the attributes of the nodes a map moves)"
            )
        return found

    @staticmethod
    def _target(node: ir.Node, maps: list[tuple[str | None, str, str, str]]) -> tuple[str, str] | None:
        for old_domain, old_name, new_domain, new_name in maps:
            domain_ok = old_domain is None or node.domain == old_domain or {node.domain, old_domain} <= {"", "ai.onnx"}
            if node.op_type == old_name and domain_ok and (node.domain, node.op_type) != (new_domain, new_name):
                return new_domain, new_name
        return None

    def check(self, node: ir.Node, options: Mapping[str, Any]) -> Check:
        import opbridge

        domain, name = self._target(node, self._maps(options)) or ("", "")
        renames = self._renames(options)
        attrs = [renames.get(a, a) for a in node.attributes]
        clashes = sorted({a for a in attrs if attrs.count(a) > 1})
        if clashes:
            sources = [a for a in node.attributes if renames.get(a, a) == clashes[0]]
            if clashes[0] in sources:  # an attribute the renames leave as it is holds the name
                fix = f"rename the attribute that holds that name already too (--rename {clashes[0]}=OTHER), "
                fix += "or leave the rename out"
            else:  # two renames to one name
                fix = "give each rename a name of its own"
            return Check.fail(
                f"the renames would give attributes {sources} of the node one name, {clashes[0]!r}, and one of them "
                f"would be lost; {fix}"
            )
        opdef = opbridge.find_op(domain, name)
        conflict = self._version_conflict(
            node, domain, self._version(options) if opdef is None else opdef.spec.version, self._maps(options)
        )
        if conflict:
            return Check.fail(conflict)
        if opdef is None:
            return Check.success(
                f"{domain + '::' if domain else ''}{name} is not an opbridge op; its attributes are not checked",
                (domain, name, None),
            )
        spec = opdef.spec
        declared = {a.name for a in spec.attributes}
        unknown = sorted(set(attrs) - declared)
        if unknown:
            hint = f" (rename with --rename {unknown[0]}=NEW)" if unknown else ""
            return Check.fail(f"{spec.qualname} has no attribute(s) {unknown}; it takes {sorted(declared)}{hint}")
        missing = sorted(a.name for a in spec.attributes if a.required and a.name not in attrs)
        if missing:
            return Check.fail(f"{spec.qualname} requires attribute(s) {missing} the node lacks")
        given_by = {renames.get(a, a): a for a in node.attributes}
        for a in spec.attributes:
            held = node.attributes.get(given_by.get(a.name, ""))
            if a.choices is None or held is None or held.is_ref():
                continue
            outside = a.outside_choices(tuple(held.value) if a.type.is_list else held.value)
            if outside:
                return Check.fail(
                    f"attribute {given_by[a.name]!r} holds {outside[0]!r}, where {spec.qualname}'s {a.name!r} takes "
                    f"{list(a.choices)} (its backends would refuse the node)"
                )
        if len(node.inputs) > len(spec.inputs):
            return Check.fail(f"the node has {len(node.inputs)} inputs, {spec.qualname} takes {len(spec.inputs)}")
        given = [bool(v is not None and v.name) for v in node.inputs]
        missing_inputs = [
            p.name for i, p in enumerate(spec.inputs) if not p.optional and not (i < len(given) and given[i])
        ]
        if missing_inputs:
            return Check.fail(
                f"the node gives no {missing_inputs} input(s), which {spec.qualname} requires (it takes "
                f"{[p.name for p in spec.inputs]})"
            )
        if len(node.outputs) != len(spec.outputs):
            return Check.fail(f"the node has {len(node.outputs)} outputs, {spec.qualname} has {len(spec.outputs)}")
        return Check.success(f"matches {spec.qualname}'s signature", (domain, name, spec.version))

    def _version_conflict(
        self, node: ir.Node, domain: str, version: int, maps: list[tuple[str | None, str, str, str]]
    ) -> str | None:
        """Why ``domain`` cannot be imported at ``version``: the model imports it at another version, which
        other nodes of it (in the graphs or the model's functions) run under, and which this rewrite does not
        move into the domain too; None where it can."""
        current = self.root.opset_imports.get(domain) if domain else None
        if current is None and domain:  # imported by the model's functions alone: at their version only
            functions = self.model.functions.values()
            others = [f for f in functions if f.opset_imports.get(domain, version) != version]
            if others:
                return (
                    f"the model's function(s) {', '.join(f'{f.domain}::{f.name}' for f in others[:3])}"
                    f"{', ...' if len(others) > 3 else ''} import domain {domain!r} at version "
                    f"{others[0].opset_imports[domain]}; the new op is version {version}, and runtimes refuse a "
                    "domain imported at more than one version: map to another domain, or give "
                    f"--option version={others[0].opset_imports[domain]} (for an op opbridge does not know)"
                )
        if current is None or current == version:
            return None
        nodes = [
            n
            for n in every_node(self.root)
            if n is not node and n.domain == domain and (self._target(n, maps) or ("", ""))[0] != domain
        ]
        users = [n.name or n.op_type for n in nodes]
        users += [f"function {f.domain}::{f.name}" for f in self.model.functions.values() if domain in f.opset_imports]
        if not users:
            return None  # (an import nothing uses: it takes the new version)
        return (
            f"the model imports domain {domain!r} at version {current}, which {len(users)} other node(s) or "
            f"function(s) run under ({', '.join(users[:3])}{', ...' if len(users) > 3 else ''}); the new op is "
            f"version {version}, and a model imports one version per domain, so those nodes would silently change "
            f"version: map to another domain, or give --option version={current} (for an op opbridge does not know)"
        )

    def rewrite(self, model: ir.Model, node: ir.Node, check: Check, options: Mapping[str, Any]) -> str:
        import onnx_ir as ir

        domain, name, version = check.data
        old = f"{node.domain + '::' if node.domain else ''}{node.op_type}"
        renames = self._renames(options)
        renamed, absent = [], []
        moved: list[tuple[str, Any]] = []
        for old_name, new_name in renames.items():  # all taken out first: a swap (a=b, b=a) keeps both
            attr = node.attributes.pop(old_name, None)
            if attr is not None:
                moved.append((new_name, attr))
                renamed.append(f"{old_name}->{new_name}")
            else:
                absent.append(old_name)
        for new_name, attr in moved:
            node.attributes[new_name] = ir.Attr(new_name, attr.type, attr.value)
        node.domain, node.op_type, node.version = domain, name, None
        if domain:  # an ONNX op keeps the model's own opset; a custom domain takes the op's version (check: no
            # other node runs under another one)
            model.opset_imports[domain] = int(version or self._version(options))
        extra = f", renamed {', '.join(renamed)}" if renamed else ""
        if absent:
            extra += f", no attribute {' or '.join(repr(a) for a in absent)} to rename (--rename not applied)"
        return f"{old} -> {domain + '::' if domain else ''}{name}{extra} ({check.reason})"


class LegacyDomain(RewriteRule):
    """Custom ops in the default domain -> a named domain with its opset import."""

    name: ClassVar[str] = "legacy-domain"
    summary: ClassVar[str] = "move custom ops out of the default domain (--option domain=NAME)"
    options: ClassVar[Mapping[str, str]] = {"domain": "target domain (default opbridge.legacy)"}

    def apply(self, model: onnx.ModelProto, options: Mapping[str, Any]) -> tuple[onnx.ModelProto, list[RuleOutcome]]:
        from opbridge.legacy_domain import (
            DEFAULT_LEGACY_DOMAIN,
            default_domain_custom_nodes,
            default_domain_functions,
            move_default_domain_ops,
        )

        given = options.get("domain")
        if given is not None and not str(given).strip():
            raise RewriteError(
                "--option domain= names no domain; give the target domain, e.g. domain=acme.legacy, or leave "
                f"the option out for {DEFAULT_LEGACY_DOMAIN}."
            )
        domain = DEFAULT_LEGACY_DOMAIN if given is None else str(given)
        if domain in ("ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training") or domain.startswith("ai.onnx."):
            raise RewriteError(
                f"--option domain={domain}: that is one of ONNX's own domains, which has no custom ops; name a "
                "domain of your own, e.g. domain=acme.legacy."
            )
        names = [n.name or n.op_type for n in default_domain_custom_nodes(model)]
        moving = default_domain_functions(model)
        names += [f"function {f.name}" for f in moving]
        there = {(f.name, f.overload) for f in model.functions if f.domain == domain}
        clash = sorted({f.name for f in moving if (f.name, f.overload) in there})
        if clash:
            raise RewriteError(
                f"the model has function(s) {clash} in domain {domain!r} already, and in the default domain too: "
                "moving the latter there would give two functions of one name; move them to another domain with "
                "--option domain=NAME"
            )
        if not names:
            return model, [self.outcome("", False, "no custom op in the default domain")]
        fixed, moved = move_default_domain_ops(model, domain=domain)
        return fixed, [self.outcome(n, True, f"moved to domain {domain!r} (ops {moved})") for n in names]
