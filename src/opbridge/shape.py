"""Output shape and dtype rules, shared by torch's fake kernels and ONNX shape inference.

A shape rule is a function called like the op itself, with tensor-like objects
(anything with ``.shape`` and ``.dtype``) in place of tensors and the attribute
values as keywords. It returns one :class:`TensorInfo` per output::

    @my_resize.register_shape
    def _(x, size, *, align_corners):
        return opbridge.TensorInfo((x.shape[0], x.shape[1], size.shape[2], size.shape[3]), x.dtype)

Under torch the dims are ints or SymInts; under ONNX shape inference they are
ints or :class:`SymDim` (a named dynamic dim, or an unknown one). Arithmetic on a
:class:`SymDim` gives an unknown dim, so rules written for torch also work for ONNX.

An op without a rule gets one derived from its reference: under torch the
reference runs on fake tensors; for ONNX it runs on ``meta`` tensors with three
sets of sizes for the dynamic dims (two large, one small), an output dim that
is the same in every run is static, and one that follows an input dim in every
run keeps that dim's name.
"""

from __future__ import annotations

import logging
import operator
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opbridge.errors import KernelResultError, OpbridgeError, OpDefinitionError

if TYPE_CHECKING:
    import onnx

    from opbridge.definition import OpDef
    from opbridge.spec import OpSpec

__all__ = ["ShapeRule", "SymDim", "TensorInfo"]

logger = logging.getLogger(__name__)

ShapeRule = Callable[..., Any]


class SymDim:
    """A dynamic dimension seen by a shape rule during ONNX shape inference.

    ``name`` is the ONNX ``dim_param`` (e.g. ``"batch"``), or ``None`` when unknown.
    Arithmetic with a SymDim yields an unknown dim, except the identities ``d + 0``
    and ``d * 1``.
    """

    __slots__ = ("name",)

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"SymDim({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymDim) and other.name is not None and other.name == self.name

    def __hash__(self) -> int:
        return hash(("SymDim", self.name))

    def _arith(self, other: Any, identity: int | None) -> SymDim:
        if identity is not None and isinstance(other, int) and other == identity:
            return self
        return SymDim(None)

    def __add__(self, other: Any) -> SymDim:
        return self._arith(other, 0)

    __radd__ = __add__

    def __sub__(self, other: Any) -> SymDim:
        return self._arith(other, 0)

    def __mul__(self, other: Any) -> SymDim:
        return self._arith(other, 1)

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> SymDim:
        return self._arith(other, 1)

    def _unknown(self, *_: Any) -> SymDim:
        return SymDim(None)

    __rsub__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = _unknown
    __neg__ = __pow__ = _unknown

    def __bool__(self) -> bool:
        raise TypeError(
            f"dim {self.name or '?'} is dynamic: a shape rule cannot branch on its value (max(), min(), "
            "torch.broadcast_shapes or an if compare dims). Compute output dims arithmetically from input dims, "
            "or give a size that depends on the values opbridge.SymDim()."
        )

    def __int__(self) -> int:
        raise TypeError(f"dim {self.name or '?'} is dynamic and has no int value at shape inference time.")

    __index__ = __int__

    def __lt__(self, other: Any) -> bool:
        return self.__bool__()

    __le__ = __gt__ = __ge__ = __lt__


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of a tensor, as given to and returned by shape rules.

    Example:
        >>> import torch
        >>> TensorInfo((2, 3), torch.float32).rank
        2
    """

    shape: tuple[Any, ...]
    dtype: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)


def _as_infos(result: Any, spec: OpSpec, where: str) -> list[Any]:
    """Normalise a rule's result into a list with one entry per output, or raise."""
    import torch

    if isinstance(result, torch.Size) or (
        isinstance(result, (tuple, list)) and result and all(isinstance(d, int) for d in result)
    ):
        raise OpDefinitionError(
            f"{spec.qualname}: {where} returned a shape ({type(result).__name__} {tuple(result)}), not the output's "
            "shape and dtype: return opbridge.TensorInfo(shape, dtype) per output, e.g. "
            "opbridge.TensorInfo(x.shape, x.dtype)."
        )
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(items) != len(spec.outputs):
        raise OpDefinitionError(
            f"{spec.qualname}: {where} returned {len(items)} output(s), but the op declares "
            f"{len(spec.outputs)} ({[o.name for o in spec.outputs]})."
        )
    for i, item in enumerate(items):
        if not (hasattr(item, "shape") and hasattr(item, "dtype")):
            raise OpDefinitionError(
                f"{spec.qualname}: {where} output {i} is {type(item).__name__}; return an "
                "opbridge.TensorInfo(shape, dtype) (or a tensor) per output."
            )
    return items


# --------------------------------------------------------------------------- torch side


def _reference_on_fakes(
    spec: OpSpec, reference: Callable[..., Any], args: Sequence[Any], attrs: dict[str, Any]
) -> list[Any]:
    """The reference's outputs run on fake tensors, its tensors as fresh fakes. A tensor the reference reads
    from outside its arguments (a module-level constant) is real: the fake mode is let to take it, as a
    constant, for this call, and so is one it returns as it is."""
    import torch
    from torch._guards import detect_fake_mode

    def outputs() -> list[Any]:
        items = _as_infos(reference(*args, **attrs), spec, "the reference")
        return [torch.empty_like(t) if isinstance(t, torch.Tensor) else t for t in items]

    mode = detect_fake_mode(args)
    if mode is None or mode.allow_non_fake_inputs:
        return outputs()
    mode.allow_non_fake_inputs = True
    try:
        return outputs()
    finally:
        mode.allow_non_fake_inputs = False


def note_raised_by(exc: BaseException, where: str) -> None:
    """Add ``(raised by WHERE)`` to the notes of ``exc``, an exception of a user's function (not an
    opbridge error, whose message names the op already), once: its traceback and opbridge's export
    errors show it."""
    note = f"(raised by {where})"
    if not isinstance(exc, OpbridgeError) and note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)


def call_shape_rule(rule: ShapeRule, spec: OpSpec, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """``rule(*args, **attrs)``; an exception of the rule's own carries a note naming the op's rule."""
    try:
        return rule(*args, **attrs)
    except Exception as exc:
        note_raised_by(exc, f"{spec.qualname}'s shape rule, @{spec.name}.register_shape")
        raise


def _check_fake_infos(spec: OpSpec, items: Sequence[Any]) -> None:
    """An OpDefinitionError naming the op where its rule gives fake tracing a dtype that is not torch's or
    a dim that is no size (torch's own error names neither the op nor the rule)."""
    import numbers

    import torch

    for i, info in enumerate(items):
        if not isinstance(info.dtype, torch.dtype):
            raise OpDefinitionError(
                f"{spec.qualname}: the shape rule gives output {i} the dtype {info.dtype!r} "
                f"({type(info.dtype).__name__}); give a torch dtype, e.g. torch.float32 or x.dtype."
            )
        for k, d in enumerate(info.shape):
            if isinstance(d, (SymDim, torch.SymInt)):
                continue
            if isinstance(d, bool) or not isinstance(d, numbers.Integral) or int(d) < 0:
                raise OpDefinitionError(
                    f"{spec.qualname}: the shape rule gives output {i} dim {k} as {d!r}; a dim is an int >= 0 (an "
                    "input's dim or arithmetic of dims), or opbridge.SymDim() for a size that depends on the data."
                )


def fake_outputs(
    spec: OpSpec, rule: ShapeRule | None, reference: Callable[..., Any], args: Sequence[Any], attrs: dict[str, Any]
) -> Any:
    """The fake (shape-only) outputs of the op for torch's FakeTensor tracing."""
    import torch

    if rule is None:
        try:
            out = _reference_on_fakes(spec, reference, args, attrs)
        except OpDefinitionError:
            raise
        except Exception as exc:
            from torch._subclasses.fake_tensor import FakeTensor

            tensors = (
                "the fake tensors of torch.compile and torch.export, which derive the op's output shapes from it"
                if any(isinstance(a, FakeTensor) for a in args)
                else "the meta tensors it was called with (only shapes: the output's come from the reference)"
            )
            raise OpDefinitionError(
                f"{spec.qualname} declares no shape rule, and its reference raised {type(exc).__name__} on "
                f"{tensors} ({str(exc)[:300]}). Where the reference raises that on real tensors of these shapes too, the "
                "reference is at fault (or its arguments); where it needs the data (.item(), .tolist(), numpy), "
                f"declare the output shapes and dtypes with @{spec.name}.register_shape (an output size that "
                "depends on the data as opbridge.SymDim())."
            ) from exc
    else:
        items = _as_infos(call_shape_rule(rule, spec, args, attrs), spec, "the shape rule")
        _check_fake_infos(spec, items)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))

        def size(d: Any) -> Any:
            # a SymDim from the rule (a size that depends on the data): a fresh size torch knows nothing of
            return torch.library.get_ctx().new_dynamic_size() if isinstance(d, SymDim) else d

        out = [torch.empty(tuple(size(d) for d in t.shape), dtype=t.dtype, device=device) for t in items]
    return out[0] if len(out) == 1 else tuple(out)


# --------------------------------------------------------------------------- ONNX side


# The names ONNX's shape inference gives dims it cannot name: unknown dims, not named ones.
_ONNX_MADE_UP = re.compile(r"unk__\d+")


def _dims_from_type(tp: onnx.TypeProto) -> tuple[Any, ...] | None:
    if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    dims: list[Any] = []
    for d in tp.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and not _ONNX_MADE_UP.fullmatch(d.dim_param):
            dims.append(SymDim(d.dim_param))
        else:
            dims.append(SymDim(None))
    return tuple(dims)


# Two runs with sizes far apart (so that a floor division or a clamp of a dim at 64 or 2048 differs
# between them), in opposite orders (so that the min or max of two dims is not one of them in both)
_PROBES = ((67, 79, 97, 107, 127, 137, 149, 163), (5939, 5387, 4831, 4271, 3719, 3163, 2609, 2053))
# A third run with small sizes: a dim equal in the first two runs but not here (min(16, batch)), or
# one that matched another input's probes by chance, is unknown. A reference that fails on sizes this
# small (a kernel larger than the input) keeps the first two runs' result.
_SMALL_PROBE = (2, 3, 5, 6, 7, 9, 10, 11)


def _derive_with_meta(
    spec: OpSpec, reference: Callable[..., Any], infos: list[TensorInfo | None], attrs: dict[str, Any]
) -> list[TensorInfo]:
    """Run the reference twice on meta tensors to recover output dims (see module doc)."""
    symbols: list[SymDim] = []
    for info in infos:
        for d in info.shape if info is not None else ():
            if isinstance(d, SymDim) and not any(s is d or s == d for s in symbols):
                symbols.append(d)
    if len(symbols) > len(_PROBES[0]):
        raise OpDefinitionError(f"{spec.qualname}: too many dynamic dims to derive a shape rule; declare one")

    def own(d: SymDim) -> int:
        # Identity first: unnamed dims are distinct even though they compare unequal.
        return next(i for i, s in enumerate(symbols) if s is d or s == d)

    try:
        return _derive_runs(spec, reference, infos, attrs, symbols, own)
    except _ProbeError as failed:
        # An unnamed dim (ONNX inference lost its name, e.g. after a Conv) may be one that a named dim
        # of another input equals: try again with each unnamed dim sized like the symbolic dim at its
        # place (counted from the right, as broadcasting aligns) in another input.
        shared = _shared_positions(infos, symbols, own)
        if shared is None:
            raise failed.error from None
        try:
            return _derive_runs(spec, reference, infos, attrs, symbols, shared)
        except _ProbeError:
            raise failed.error from None


class _ProbeError(Exception):
    def __init__(self, error: OpDefinitionError) -> None:
        super().__init__(str(error))
        self.error = error


def _shared_positions(
    infos: list[TensorInfo | None], symbols: list[SymDim], own: Callable[[SymDim], int]
) -> Callable[[SymDim], int] | None:
    """Probe positions where each unnamed dim takes the position of a symbolic dim at its place in
    another input (None when no unnamed dim has such a partner)."""
    merged: dict[int, int] = {}
    for i, info in enumerate(infos):
        if info is None:
            continue
        for k, d in enumerate(reversed(info.shape)):
            if not isinstance(d, SymDim) or d.name is not None:
                continue
            for j, other in enumerate(infos):
                if j == i or other is None or k >= len(other.shape):
                    continue
                partner = other.shape[len(other.shape) - 1 - k]
                if isinstance(partner, SymDim) and own(partner) != own(d):
                    merged.setdefault(own(d), merged.get(own(partner), own(partner)))
                    break
    if not merged:
        return None
    return lambda d: merged.get(own(d), own(d))


_QUIET = threading.local()
_FILTER_LOCK = threading.Lock()
_filter_installed = False


def _drop_while_probing(record: logging.LogRecord) -> bool:
    return not getattr(_QUIET, "depth", 0)


@contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """Torch's fake tensors log every op that fails on them, with its traceback, before raising; a probe
    run that fails (sizes a reference refuses) is expected here: not logged, in this thread."""
    global _filter_installed
    with _FILTER_LOCK:
        if not _filter_installed:
            logging.getLogger("torch._subclasses.fake_tensor").addFilter(_drop_while_probing)
            _filter_installed = True
    _QUIET.depth = getattr(_QUIET, "depth", 0) + 1
    try:
        yield
    finally:
        _QUIET.depth -= 1


def _derive_runs(
    spec: OpSpec,
    reference: Callable[..., Any],
    infos: list[TensorInfo | None],
    attrs: dict[str, Any],
    symbols: list[SymDim],
    position: Callable[[SymDim], int],
) -> list[TensorInfo]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opbridge.definition import inside_reference

    # Tensors without data (meta tensors under a fake mode, on the CPU): a real tensor the reference
    # reads from outside its arguments (a module-level constant) is taken as a constant.
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def run(probe: Sequence[int]) -> list[Any]:
        with mode, _quiet_fake_tensor_log():
            args = [
                None
                if info is None
                else torch.empty(
                    [probe[position(d)] if isinstance(d, SymDim) else int(d) for d in info.shape], dtype=info.dtype
                )
                for info in infos
            ]
            with inside_reference():
                return _as_infos(reference(*args, **attrs), spec, "the reference (on meta tensors)")

    probes: list[Sequence[int]] = list(_PROBES)
    merged = False  # every dynamic dim given one size (dims of other names the reference requires equal)
    try:
        runs = [run(probe) for probe in probes]
    except OpDefinitionError:
        raise
    except Exception as exc:
        runs = []
        if len(symbols) > 1:
            # dims of other names that the reference needs equal (broadcast, concatenated, matched): one
            # size for all of them; an output dim that follows them is then of unknown name
            equal: list[Sequence[int]] = [tuple([p[0]] * len(p)) for p in _PROBES]
            try:
                runs, probes, merged = [run(probe) for probe in equal], equal, True
            except Exception:
                runs = []
        if not runs:
            # (a reference whose output size depends on the data fails on meta tensors whatever the sizes)
            data_dependent = type(exc).__name__ in ("DynamicOutputShapeException", "DataDependentOutputException")
            fixed = (
                " The reference ran with the inputs' dynamic dims at other sizes than the example's: where the "
                "model fixes such a dim (it meets a weight or constant of one size, as in a broadcast), that dim "
                "cannot be dynamic: export it static."
                if symbols and not data_dependent
                else ""
            )
            raise _ProbeError(
                OpDefinitionError(
                    f"{spec.qualname} declares no shape rule, and its reference cannot run on meta tensors to "
                    f"derive one ({type(exc).__name__}: {str(exc)[:300]}); declare the output shapes and dtypes "
                    f"with @{spec.name}.register_shape (an output size that depends on the data as "
                    f"opbridge.SymDim()).{fixed}"
                )
            ) from None
    if symbols and not merged:
        try:
            small = run(_SMALL_PROBE)
        except Exception as exc:  # sizes too small for this reference: two runs decide
            small = None
            logger.debug("%s: the reference fails on small probe sizes (%s)", spec.qualname, exc)
        if small is not None and all(len(s.shape) == len(a.shape) for s, a in zip(small, runs[0])):
            probes.append(_SMALL_PROBE)
            runs.append(small)
    out: list[TensorInfo] = []
    for results in zip(*runs):
        dims: list[Any] = []
        if len({len(r.shape) for r in results[:2]}) != 1:
            raise OpDefinitionError(f"{spec.qualname}: output rank depends on input sizes; declare a shape rule")
        for values in zip(*(r.shape for r in results)):
            if len(set(values)) == 1:
                dims.append(int(values[0]))
                continue
            match = [
                s
                for s in symbols
                if not merged and all(p[position(s)] == v for p, v in zip(probes, values, strict=True))
            ]
            match.sort(key=lambda s: s.name is None)  # a named dim before an unnamed one it was sized like
            dims.append(SymDim(match[0].name) if match else SymDim(None))
        out.append(TensorInfo(tuple(dims), results[0].dtype))
    return out


def output_infos(
    spec: OpSpec,
    rule: ShapeRule | None,
    reference: Callable[..., Any],
    infos: list[TensorInfo | None],
    attrs: dict[str, Any],
) -> list[TensorInfo]:
    """Output shapes/dtypes from input TensorInfos (dims: ints or :class:`SymDim`).

    Uses the declared ``rule``, else derives the outputs from ``reference`` on meta tensors.
    """
    if rule is not None:
        return _as_infos(call_shape_rule(rule, spec, infos, attrs), spec, "the shape rule")
    return _derive_with_meta(spec, reference, infos, attrs)


def infer_onnx(
    spec: OpSpec,
    rule: ShapeRule | None,
    reference: Callable[..., Any],
    input_types: list[onnx.TypeProto | None],
    attrs: dict[str, Any],
) -> list[onnx.TypeProto | None]:
    """Output TypeProtos for an ONNX node of ``spec``; ``None`` where nothing can be said."""
    import onnx

    from opbridge._dtypes import onnx_to_torch, torch_to_onnx

    infos: list[TensorInfo | None] = []
    for tp in input_types:
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.elem_type:
            infos.append(None)
            continue
        dims = _dims_from_type(tp)
        infos.append(TensorInfo(dims if dims is not None else (), onnx_to_torch(tp.tensor_type.elem_type)))
    # an input of unknown rank runs the rule as a scalar: what it says of shapes then is void, and a
    # refusal of that scalar says nothing of the model
    unknown_rank = any(
        i is not None and _dims_from_type(t) is None for i, t in zip(infos, input_types) if t is not None
    )
    required_missing = unknown_rank or any(info is None for info, p in zip(infos, spec.inputs) if not p.optional)
    if required_missing and rule is None:
        return [None] * len(spec.outputs)
    try:
        results = output_infos(spec, rule, reference, infos, attrs)
    except OpDefinitionError:
        if unknown_rank:
            return [None] * len(spec.outputs)
        raise
    except Exception as exc:
        if unknown_rank or (required_missing and isinstance(exc, (TypeError, AttributeError, IndexError))):
            return [None] * len(spec.outputs)
        if rule is None:
            raise
        shown = ", ".join(
            "?"
            if i is None
            else "x".join(str(d.name or "?") if isinstance(d, SymDim) else str(d) for d in i.shape)
            + f" {str(i.dtype).removeprefix('torch.')}"
            for i in infos
        )
        raise OpDefinitionError(
            f"{spec.qualname}: its shape rule failed for inputs ({shown}): {type(exc).__name__}: {exc}"
        ) from exc
    # An input's dims keep their names. A SymDim the rule makes is a size that depends on the data (torch
    # gets a fresh one); one named like an input's dim would claim to equal it: it stays unnamed.
    given = [d for i in infos if i is not None for d in i.shape if isinstance(d, SymDim)]
    given_ids, given_names = {id(d) for d in given}, {d.name for d in given}
    out: list[onnx.TypeProto | None] = []
    for info in results:
        tp = onnx.TypeProto()
        tp.tensor_type.elem_type = torch_to_onnx(info.dtype)
        if unknown_rank:  # (the element type alone)
            out.append(tp)
            continue
        shape = tp.tensor_type.shape
        shape.SetInParent()  # (a scalar's shape is set and empty; no shape at all is an unknown rank)
        for d in info.shape:
            dim = shape.dim.add()
            if isinstance(d, SymDim):
                made = rule is not None and id(d) not in given_ids and d.name in given_names
                if d.name is not None and not made:
                    dim.dim_param = d.name
            else:
                dim.dim_value = operator.index(d)
        out.append(tp)
    return out


def run_rule_on_arrays(rule: ShapeRule, arrays: Sequence[Any], attrs: dict[str, Any], state: dict[str, bool]) -> Any:
    """``rule`` run on a kernel call's numpy ``arrays``; where it does not take them (a torch-only API
    on ``x.dtype``, such as ``torch.promote_types``), on :class:`TensorInfo` of their shapes and torch
    dtypes, as ONNX shape inference runs it (``state["infos"]`` remembers that)."""
    if not state.get("infos"):
        try:
            return rule(*arrays, **attrs)
        except ValueError:
            raise
        except Exception:
            if state["ran"]:
                raise
    found = rule(*_infos_of(arrays), **attrs)
    state["infos"] = True
    return found


def _infos_of(arrays: Sequence[Any]) -> list[TensorInfo | None]:
    """:class:`TensorInfo` of numpy ``arrays``' shapes and torch dtypes (None for an absent input)."""
    from opbridge._dtypes import numpy_to_onnx, onnx_to_torch

    return [None if a is None else TensorInfo(tuple(a.shape), onnx_to_torch(numpy_to_onnx(a.dtype))) for a in arrays]


def rule_failed(state: dict[str, bool], exc: Exception, label: str, what: str) -> None:
    """A shape rule raised on a call's arrays. A rule that ran on arrays before, or that raised a
    ValueError (an op's rules name inputs they refuse so), refused these inputs: skip it for this
    call only. Otherwise it does not run on numpy arrays: turn ``what`` off for the session."""
    if state["ran"] or isinstance(exc, ValueError):
        logger.debug("%s: the shape rule refused these inputs (%s); no %s for this call", label, exc, what)
        return
    logger.debug("%s: the shape rule does not run on numpy inputs (%s); %s off", label, exc, what)
    state["usable"] = False


def result_check(
    opdef: OpDef, attrs: dict[str, Any], label: str, *, derive: bool = True
) -> Callable[[tuple[Any, ...], Any], None] | None:
    """``check(arrays, result)``: raises ValueError where a kernel's result shapes (numpy inputs
    ``arrays``) are not what the op's shape rule gives, or, for an op without one and with ``derive``,
    what its reference gives on meta tensors of the inputs' sizes (derived once per input signature).
    ``None`` where there is nothing to check against (no rule, and ``derive`` off: the reference's own
    results)."""
    rule = opdef.shape_rule
    if rule is None and not derive:
        return None
    names = [p.name for p in opdef.spec.outputs]
    state = {"usable": True, "ran": False}
    # (input signature -> expected shapes: ints, or SymDim for a size that depends on the data)
    derived: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}

    def expected(arrays: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if rule is not None:
            found = run_rule_on_arrays(rule, arrays, attrs, state)
            items = list(found) if isinstance(found, (tuple, list)) else [found]
            return [tuple(d if isinstance(d, SymDim) else int(d) for d in getattr(w, "shape", ())) for w in items]
        key = tuple(None if a is None else (a.shape, a.dtype) for a in arrays)
        shapes = derived.get(key)
        if shapes is None:
            infos = _infos_of(arrays)
            if len(derived) >= 64:  # inputs of ever new sizes: keep the cache bounded
                derived.clear()
            shapes = [
                tuple(d if isinstance(d, SymDim) else int(d) for d in i.shape)
                for i in _derive_with_meta(opdef.spec, opdef.reference, infos, attrs)
            ]
            derived[key] = shapes
        return shapes

    def check(arrays: tuple[Any, ...], result: Any) -> None:
        if not state["usable"]:
            return
        try:
            want = expected(arrays)
        except Exception as exc:
            rule_failed(state, exc, label, "shape check")
            return
        state["ran"] = True
        got = result if isinstance(result, (tuple, list)) else (result,)
        for i, (wshape, g) in enumerate(zip(want, got)):
            shape = getattr(g, "shape", None)
            if shape is None or shape == wshape:
                continue
            # a SymDim (a size that depends on the data) matches any size
            if len(shape) == len(wshape) and all(isinstance(b, SymDim) or a == b for a, b in zip(shape, wshape)):
                continue
            shown = tuple("?" if isinstance(d, SymDim) else d for d in wshape)
            source = "the op's shape rule gives" if rule is not None else "the op's reference gives (on meta tensors)"
            raise KernelResultError(
                f"{label}: output {i} ({names[i]!r}) has shape {tuple(shape)}, but {source} {shown} for "
                "these inputs"
                + ("" if rule is not None else "; fix the kernel, or declare the shape with register_shape")
            )

    return check
