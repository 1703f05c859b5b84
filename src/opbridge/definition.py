"""``@opbridge.op``: turn a typed Python function into a custom op.

The decorated function's signature is the op's signature and its body is the
PyTorch reference implementation. The result, an :class:`OpDef`, is callable
like the function (eagerly, inside any ``nn.Module``, under either ONNX
exporter) and carries a frozen :class:`~opbridge.spec.OpSpec`. Further facets
attach by method, as with ``torch.library``: ``register_shape``,
``register_kernel`` (a numpy/CPU kernel for runtimes), ``register_function``
(an ONNX decomposition), ``register_gpu_kernel`` and ``register_autograd`` (a
backward formula; without one, gradients come from the reference, run again).

Example:
    >>> import torch, opbridge
    >>> @opbridge.op("doc::ScaledSwish")
    ... def scaled_swish(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    ...     return x * torch.sigmoid(beta * x)
    >>> scaled_swish.spec.attributes[0].type
    <AttrType.FLOAT: 'float'>
    >>> scaled_swish(torch.zeros(2), beta=2.0).tolist()
    [0.0, 0.0]
"""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
import inspect
import itertools
import logging
import os
import struct
import sys
import threading
import types
import typing
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Generic, ParamSpec, TypeVar, overload

from opbridge._autograd import BackwardContext, shares_memory
from opbridge._locks import ForkSafeLock
from opbridge.errors import OpCallError, OpDefinitionError
from opbridge.shape import ShapeRule, fake_outputs, note_raised_by
from opbridge.spec import AttrSpec, AttrType, InputSpec, OpSpec, OutputSpec, Tolerance, parse_qualname

__all__ = ["BackwardContext", "OpDef", "all_ops", "find_op", "op"]

logger = logging.getLogger(__name__)

_TORCH_NAMESPACE = "opbridge"
_LOCK = ForkSafeLock(reentrant=True)
# (domain, name, version) -> OpDef: the ops defined in this process, for runtimes
# and exporters to look up. Only opbridge reads it.
_OPS: dict[tuple[str, str, int], OpDef] = {}
# torch op name -> the OpDef whose reference the torch op currently runs.
_TORCH_IMPLS: dict[str, OpDef] = {}
# The OpDefs a torch op has run, by their _definition_index (a backward runs the forward's definition):
# the current ones, which _TORCH_IMPLS holds, and the last _SUPERSEDED_KEPT that a redefinition replaced
# (older ones are freed with everything their references hold: a notebook cell re-run a thousand times).
_DEFINITIONS: weakref.WeakValueDictionary[int, OpDef] = weakref.WeakValueDictionary()
_SUPERSEDED_KEPT = 32
_SUPERSEDED: collections.deque[OpDef] = collections.deque(maxlen=_SUPERSEDED_KEPT)
_DEFINED_COUNT = itertools.count()


class _TraceState(threading.local):
    """Per thread: the calls seen while an export is tracing, op key -> count (see ``tracing_calls``), and
    how many op references run (see ``inside_reference``). (Defaults on the class: read at every call.)"""

    counts: TracedCalls | None = None
    inside = 0


class TracedCalls(dict[tuple[str, str, int], int]):
    """The op calls an export traced: op key -> count, plus per op the distinct calls (its inputs and
    attributes: two equal ones may become one node) and the ops whose reference drew random numbers.

    Only the last trace counts: torch.onnx may trace the model again after a failed attempt (with
    refined dynamic shapes), each time in a fake tensor mode of its own, and a call in a new mode
    starts the count anew."""

    def __init__(self) -> None:
        super().__init__()
        self.distinct: dict[tuple[str, str, int], set[tuple[Any, ...]]] = {}
        self.random: set[tuple[str, str, int]] = set()
        self._mode: Any = None  # the fake tensor mode of the trace being counted

    def begin(self, tensors: Sequence[Any]) -> None:
        """Before a call on ``tensors`` is counted: start anew where they belong to another trace."""
        mode = next((m for m in (getattr(t, "fake_mode", None) for t in tensors) if m is not None), None)
        if mode is None or mode is self._mode:
            return
        if self._mode is not None:
            self.clear()
            self.distinct.clear()
            self.random.clear()
        self._mode = mode


_TRACE_STATE = _TraceState()


def _call_key(encoded: Sequence[Any]) -> str:
    """A call's encoded attributes as the TorchScript exporter tells calls apart: -0.0 as 0.0 (it writes
    both as 0.0, so two calls that differ only there are one node in its graph)."""

    def plain(value: Any) -> Any:
        if isinstance(value, float):
            return value + 0.0  # (-0.0 + 0.0 is 0.0)
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return repr([plain(a) for a in encoded])


def _literal_choices(qualname: str, name: str, annotation: Any) -> tuple[Any, tuple[Any, ...] | None]:
    """``Literal["avg", "max"]`` -> ``(str, ("avg", "max"))`` (of a list's elements too: ``list[Literal[0, 1]]``
    -> ``(list[int], (0, 1))``); any other annotation comes back as given, with no choices."""
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, collections.abc.Sequence):
        args = typing.get_args(annotation)
        if args and typing.get_origin(args[0]) is typing.Literal:
            element, choices = _literal_choices(qualname, name, args[0])
            return origin[(element, *args[1:])], choices
        return annotation, None
    if origin is not typing.Literal:
        return annotation, None
    values = typing.get_args(annotation)
    kinds = {type(v) for v in values}
    if len(kinds) != 1 or not kinds <= {int, str}:
        raise OpDefinitionError(
            f"{qualname}: parameter {name!r} is annotated {annotation!r}; a Literal attribute takes values of one "
            "type, int or str, e.g. Literal['avg', 'max'] or Literal[0, 1, 2]."
        )
    return kinds.pop(), tuple(values)


def _attr_type(annotation: Any) -> AttrType | None:
    mapping = {
        float: AttrType.FLOAT,
        int: AttrType.INT,
        bool: AttrType.BOOL,
        str: AttrType.STRING,
    }
    if annotation in mapping:
        return mapping[annotation]
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, collections.abc.Sequence):
        args = typing.get_args(annotation)
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = args[:1]
        if len(args) == 1:
            return {float: AttrType.FLOATS, int: AttrType.INTS, str: AttrType.STRINGS}.get(args[0])
    return None


def _is_tensor(annotation: Any) -> bool:
    import torch

    return annotation is torch.Tensor


def _optional_inner(annotation: Any) -> Any:
    """``Optional[X]`` / ``X | None`` -> X, else None."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0]
    return None


def _outputs_from_return(qualname: str, annotation: Any, names: tuple[str, ...] | None) -> tuple[OutputSpec, ...]:
    if _is_tensor(annotation):
        count = 1
    elif typing.get_origin(annotation) is tuple and len(typing.get_args(annotation)) == 1:
        raise OpDefinitionError(
            f"{qualname}: the return annotation {annotation!r} declares one output in a tuple, but an op with "
            "one output returns the tensor itself (op(x)[0] would be its first row, not the output); "
            "annotate '-> torch.Tensor' and return the tensor."
        )
    elif (
        typing.get_origin(annotation) is tuple
        and typing.get_args(annotation)
        and all(_is_tensor(a) for a in typing.get_args(annotation))
    ):
        count = len(typing.get_args(annotation))
    else:
        raise OpDefinitionError(
            f"{qualname}: the return annotation {annotation!r} is not supported; annotate "
            "'-> torch.Tensor' or '-> tuple[torch.Tensor, torch.Tensor]' (one entry per output)."
        )
    if names is not None:
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise OpDefinitionError(
                f"{qualname}: outputs= takes a tuple of names, one per output, e.g. outputs=('y',) or "
                f"outputs=('boxes', 'labels'); got {names!r}."
            )
        if len(names) != count:
            raise OpDefinitionError(
                f"{qualname}: {len(names)} output name(s) given for {count} output(s) in the return annotation."
            )
        return tuple(OutputSpec(n) for n in names)
    if count == 1:
        return (OutputSpec("output"),)
    return tuple(OutputSpec(f"output{i}") for i in range(count))


# Parameter names an op cannot use, and why.
_RESERVED_PARAMETERS = {
    "out": "the name is reserved: a CPU kernel's parameter 'out' receives ONNX Runtime's preallocated outputs "
    "(see register_kernel); rename it.",
    "self": "the name is reserved: the op's call and PyTorch's op call take 'self' as their own first "
    "parameter, so a call by name (and dynamo's export) would give it twice; rename it, e.g. to 'x' or 'k'.",
}


def spec_from_function(
    fn: Callable[..., Any],
    qualname: str,
    version: int = 1,
    output_names: tuple[str, ...] | None = None,
    tolerances: Mapping[str, Tolerance] | None = None,
) -> OpSpec:
    """Build an :class:`OpSpec` from a typed function (see :func:`op`)."""
    domain, name = parse_qualname(qualname)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # NameError for unresolved forward refs and the like
        raise OpDefinitionError(f"{qualname}: cannot read the type hints of {fn.__name__}: {exc}") from exc
    inputs: list[InputSpec] = []
    attrs: list[AttrSpec] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise OpDefinitionError(f"{qualname}: *args/**kwargs are not supported; name every parameter.")
        if param.name not in hints:
            raise OpDefinitionError(
                f"{qualname}: parameter {param.name!r} has no type annotation; annotate it as "
                "torch.Tensor, Optional[torch.Tensor], float, int, bool, str, list[float], list[int] or list[str]."
            )
        if not param.name.isascii():
            raise OpDefinitionError(
                f"{qualname}: parameter {param.name!r} is not an ASCII name; PyTorch's op schemas take ASCII "
                "names only (they become the ONNX input and attribute names): rename it."
            )
        if param.name in _RESERVED_PARAMETERS:
            raise OpDefinitionError(f"{qualname}: parameter {param.name!r}: {_RESERVED_PARAMETERS[param.name]}")
        if param.name.endswith("__"):
            raise OpDefinitionError(
                f"{qualname}: parameter {param.name!r}: names ending in '__' are reserved for the parameters "
                "opbridge adds to the op's gradient op (which takes the attributes beside them); rename it."
            )
        ann = hints[param.name]
        tensor = _is_tensor(ann) or ((inner := _optional_inner(ann)) is not None and _is_tensor(inner))
        if tensor and param.kind is param.KEYWORD_ONLY:
            raise OpDefinitionError(
                f"{qualname}: tensor parameter {param.name!r} is keyword-only (after '*'); an op's tensor inputs "
                "are passed by position (to its PyTorch op and as the ONNX node's inputs): put it before the '*'."
            )
        if not tensor and param.kind is param.POSITIONAL_ONLY:
            raise OpDefinitionError(
                f"{qualname}: attribute {param.name!r} is positional-only (before '/'); an op's attributes reach "
                "its reference, shape rule and kernels by name: put it after the '/'."
            )
        if _is_tensor(ann):
            if attrs:
                raise OpDefinitionError(
                    f"{qualname}: tensor parameter {param.name!r} comes after attribute "
                    f"{attrs[-1].name!r}; put all tensor inputs first."
                )
            if param.default is not inspect.Parameter.empty:
                raise OpDefinitionError(
                    f"{qualname}: tensor parameter {param.name!r} has a default ({param.default!r}), which a "
                    "required input cannot take; annotate it Optional[torch.Tensor] = None for an optional input."
                )
            inputs.append(InputSpec(param.name))
            continue
        inner = _optional_inner(ann)
        if inner is not None and _is_tensor(inner):
            if attrs:
                raise OpDefinitionError(f"{qualname}: put optional tensor input {param.name!r} before the attributes.")
            inputs.append(InputSpec(param.name, optional=True))
            continue
        plain, choices = _literal_choices(qualname, param.name, ann)
        kind = _attr_type(plain)
        if kind is None:
            raise OpDefinitionError(
                f"{qualname}: parameter {param.name!r} has unsupported annotation {ann!r}; use "
                "torch.Tensor, Optional[torch.Tensor], float, int, bool, str, list[float], list[int], list[str] "
                "or a Literal of int or str values (Literal['avg', 'max'])."
            )
        attr = AttrSpec(param.name, kind, choices=choices)
        if param.default is not inspect.Parameter.empty:
            try:
                default = attr.normalize(param.default, qualname)
            except TypeError as exc:
                raise OpDefinitionError(f"{qualname}: default of {param.name!r}: {exc}") from None
            attr = AttrSpec(param.name, kind, default, choices)
        attrs.append(attr)
    if "return" not in hints:
        raise OpDefinitionError(f"{qualname}: add a return annotation, e.g. '-> torch.Tensor'.")
    outputs = _outputs_from_return(qualname, hints["return"], output_names)
    doc = inspect.getdoc(fn) or ""
    return OpSpec(
        domain=domain,
        name=name,
        version=version,
        inputs=tuple(inputs),
        outputs=outputs,
        attributes=tuple(attrs),
        tolerances=_checked_tolerances(qualname, tolerances),
        doc=doc.splitlines()[0] if doc else "",
    )


# dtype names a tolerance can be declared for: the floating-point types verify compares with tolerances
_TOLERANCE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _checked_tolerances(qualname: str, tolerances: Mapping[str, Any] | None) -> dict[str, Tolerance]:
    """``tolerances`` as ``{dtype name: Tolerance}``; an ``(rtol, atol)`` pair is taken as one, and a
    dtype name verify never looks up (a typo such as ``"fp32"``) is refused."""
    out: dict[str, Tolerance] = {}
    for key, value in (tolerances or {}).items():
        if key not in _TOLERANCE_DTYPES:
            raise OpDefinitionError(
                f"{qualname}: tolerances are declared per floating-point dtype name, one of {list(_TOLERANCE_DTYPES)}; "
                f"got {key!r} (integer and bool outputs are compared exactly)."
            )
        if isinstance(value, Tolerance):
            out[key] = value
            continue
        try:
            rtol, atol = value
            out[key] = Tolerance(float(rtol), float(atol))
        except (TypeError, ValueError) as exc:
            raise OpDefinitionError(
                f"{qualname}: the tolerance for {key} is {value!r}; give opbridge.Tolerance(rtol, atol) or an "
                f"(rtol, atol) pair ({exc})."
            ) from None
    return out


def _torch_type(attr: AttrSpec) -> str:
    return {
        AttrType.FLOAT: "float",
        AttrType.INT: "int",
        AttrType.BOOL: "bool",
        AttrType.STRING: "str",
        AttrType.FLOATS: "float[]",
        AttrType.INTS: "int[]",
        # torch.library has no str[]: string lists travel as one string (_encode_strings).
        AttrType.STRINGS: "str",
    }[attr.type]


def _torch_schema(spec: OpSpec) -> str:
    params = [f"Tensor? {p.name}" if p.optional else f"Tensor {p.name}" for p in spec.inputs]
    params += [f"{_torch_type(a)} {a.name}" for a in spec.attributes]
    rets = "Tensor" if len(spec.outputs) == 1 else "(" + ", ".join("Tensor" for _ in spec.outputs) + ")"
    return f"({', '.join(params)}) -> {rets}"


def _torch_op_name(spec: OpSpec) -> str:
    return f"{spec.domain.replace('.', '_')}__{spec.name}_v{spec.version}"


def _encode_attr(attr: AttrSpec, value: Any) -> Any:
    if attr.type is AttrType.STRINGS:
        return _encode_strings(tuple(value))
    if attr.type.is_list:
        return list(value)
    return value


def _encode_strings(value: tuple[str, ...]) -> str:
    """Strings as one: each as ``<length>:<text>``, in string operations torch.compile traces as
    constants (``("a", "")`` is ``"1:a0:"``)."""
    out = ""
    for text in value:
        out += str(len(text)) + ":" + text
    return out


def _decode_strings(encoded: str) -> tuple[str, ...]:
    """The strings :func:`_encode_strings` joined; a ValueError naming the first bad part."""
    if not isinstance(encoded, str):
        raise ValueError(f"got {type(encoded).__name__}, not str")
    out: list[str] = []
    at = 0
    while at < len(encoded):
        colon = encoded.find(":", at)
        length = encoded[at:colon] if colon >= 0 else ""
        if not length.isascii() or not length.isdigit():
            raise ValueError(f"at character {at}, {encoded[at : at + 12]!r} does not start with '<length>:'")
        end = colon + 1 + int(length)
        if end > len(encoded):
            raise ValueError(f"at character {at}, a length of {length} runs past the end")
        out.append(encoded[colon + 1 : end])
        at = end
    return tuple(out)


def _decode_attr(attr: AttrSpec, value: Any) -> Any:
    if attr.type is AttrType.STRINGS:
        return _decode_strings(value)
    if attr.type.is_list:
        return tuple(value)
    return value


def _float32_attributes(spec: OpSpec, attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` with FLOAT and FLOATS values rounded to float32, the values an ONNX node carries:
    the reference then computes with what every runtime is given (0.7 is 0.699999988 there, and
    ``int(step * 10)`` 6, not 7)."""
    out = dict(attrs)
    for a in spec.attributes:
        if a.type is AttrType.FLOAT:
            out[a.name] = _float32(out[a.name])
        elif a.type is AttrType.FLOATS:
            out[a.name] = tuple(_float32(v) for v in out[a.name])
    return out


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


@dataclasses.dataclass(frozen=True)
class _CallPlan:
    """What every call of an op takes from its spec, computed once per spec."""

    #: the parameters' names in call order
    names: tuple[str, ...]
    #: the checked attribute values of a call that gives none: as traced, and with FLOAT and FLOATS values
    #: rounded to float32 as an eager call hands them to the reference (None: an attribute is required)
    defaults: tuple[dict[str, Any], dict[str, Any]] | None
    #: whether an attribute is FLOAT or FLOATS (values given to a call are rounded)
    rounds: bool
    #: how many parameters a call may give by position (those before the definition's keyword-only ones)
    positional: int

    @classmethod
    def of(cls, spec: OpSpec, reference: Callable[..., Any]) -> _CallPlan:
        names = tuple(p.name for p in spec.inputs) + tuple(a.name for a in spec.attributes)
        defaults = None
        if not any(a.required for a in spec.attributes):
            given = spec.bind_attributes({})
            defaults = (given, _float32_attributes(spec, given))
        rounds = any(a.type in (AttrType.FLOAT, AttrType.FLOATS) for a in spec.attributes)
        try:
            keyword_only = {
                p.name for p in inspect.signature(reference).parameters.values() if p.kind is p.KEYWORD_ONLY
            }
        except (TypeError, ValueError):  # (a reference without a readable signature: every name by position)
            keyword_only = set()
        positional = next((i for i, n in enumerate(names) if n in keyword_only), len(names))
        return cls(names, defaults, rounds, positional)


# Signatures an op keeps whose outputs its shape rule was found to give (OpDef._check_rule).
_RULE_FITS_KEPT = 256

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])


class OpDef(Generic[P, R]):
    """A custom op: its spec, its PyTorch reference, and the facets attached to it.

    Created by :func:`op`; call it like the decorated function (type checkers see its signature).
    """

    def __init__(
        self,
        spec: OpSpec,
        reference: Callable[P, R],
        *,
        shape: ShapeRule | None = None,
    ) -> None:
        if shape is not None and not callable(shape):
            raise OpDefinitionError(
                f"{spec.qualname}: shape takes a function rule(*inputs, **attrs) -> TensorInfo, got "
                f"{type(shape).__name__}."
            )
        self.spec = spec if shape is None else dataclasses.replace(spec, shape_rule=shape)
        self._plan = _CallPlan.of(spec, reference)
        # the signatures (inputs' and outputs' shapes, dtypes and devices, attribute values) whose outputs
        # the shape rule was found to give: a call of one of them again needs no second look
        self._rule_fits: set[Any] = set()
        self.reference = reference
        self.kernel: Callable[..., Any] | None = None
        self.kernel_kind: str | None = None
        self.native_kernel: Callable[[Mapping[str, Any]], Any] | None = None
        self.function_builder: Callable[..., Any] | None = None
        self.function_prefers_kernel: bool | Callable[[Mapping[str, Any]], bool] = False
        self.gpu_kernel: Callable[..., Any] | None = None
        self.gpu_kernel_dtypes: tuple[str, ...] = ()
        self.backward: Callable[..., Any] | None = None
        self._definition_index = -1
        self._digest: bytes | None = None
        #: the module that defined the op (applied @opbridge.op), which unpickling imports
        self._defined_in: str | None = None
        self.__doc__ = reference.__doc__
        self.__name__ = getattr(reference, "__name__", spec.name)
        self.__wrapped__ = reference
        self._torch_op: Any = None

    def __repr__(self) -> str:
        return f"<opbridge op {self.spec.qualname} v{self.spec.version}>"

    def _fingerprint(self) -> bytes:
        """The digest of what decides this definition's traced graphs (see :func:`_definition_digest`)."""
        if self._digest is None:
            self._digest = _definition_digest(self.spec, (self.reference, self.spec.shape_rule, self.backward))
        return self._digest

    def _definition_changed(self) -> None:
        """A shape rule or backward formula came after the op was defined: the cache keys follow it, and code
        torch.compile compiled with the op as it was is dropped (its graphs, the backward's too, hold the old
        rule or formula, which no guard checks)."""
        self._digest = None
        with _LOCK:
            if _TORCH_IMPLS.get(f"{_TORCH_NAMESPACE}::{_torch_op_name(self.spec)}") is self:
                _forget_compiled_code()
                _tag_compile_caches()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by name (a module holding the op can be saved): loading imports the module that
        defined it and takes the op defined there."""
        return (_op_by_name, (self._defining_module(), *self.spec.key))

    def _defining_module(self) -> str | None:
        """The name of the module that defined the op (applied the decorator), else its reference's."""
        return self._defined_in or getattr(self.reference, "__module__", None)

    # ------------------------------------------------------------------ facets

    @property
    def shape_rule(self) -> ShapeRule | None:
        """The declared output shape/dtype rule (``spec.shape_rule``), or None when derived."""
        return self.spec.shape_rule

    @shape_rule.setter
    def shape_rule(self, rule: ShapeRule | None) -> None:
        # The spec is frozen: a new rule makes a new spec (schemas keyed on it re-register).
        self.spec = dataclasses.replace(self.spec, shape_rule=rule)
        self._rule_fits = set()
        self._definition_changed()

    def register_shape(self, rule: ShapeRule) -> ShapeRule:
        """Declare the output shape/dtype rule (see :mod:`opbridge.shape`). Usable as a decorator."""
        self._need_callable("register_shape", rule, "rule(*inputs, **attrs) -> TensorInfo")
        self.shape_rule = rule
        return rule

    def _need_callable(self, method: str, value: Any, form: str) -> None:
        if not callable(value):
            raise OpDefinitionError(
                f"{self.spec.qualname}: {method} takes a function {form}, got {type(value).__name__}."
            )

    @overload
    def register_kernel(
        self, fn: F, *, kind: str = ..., native: Callable[[Mapping[str, Any]], Any] | None = ...
    ) -> F: ...
    @overload
    def register_kernel(
        self, fn: None = None, *, kind: str = ..., native: Callable[[Mapping[str, Any]], Any] | None = ...
    ) -> Callable[[F], F]: ...
    def register_kernel(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        kind: str = "numpy",
        native: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> Any:
        """Attach a CPU kernel for runtimes: ``fn(*arrays, **attrs) -> array | tuple``.

        ``kind`` is ``"numpy"`` (numpy arrays in and out) or ``"torch"`` (CPU tensors).
        Usable as ``@op.register_kernel`` or ``@op.register_kernel(kind="torch")``.
        Without a kernel, runtimes run the PyTorch reference. A kernel with a parameter
        named ``out``, on an op with a shape rule, gets ONNX Runtime's preallocated
        output(s) there (arrays, or CPU tensors over them for a torch kernel; a tuple for
        several outputs) and writes them directly (no copy of the result).

        ``native``: ``native(attrs)`` gives a node's C kernel (a capsule of opbridge's native kernel
        ABI, ``opbridge/_native_kernel.h``) or None. :class:`opbridge.InferenceSession` runs it inside
        ONNX Runtime without Python; calls it declines run ``fn``.

        Example:
            >>> import numpy as np, torch, opbridge
            >>> @opbridge.op("doc.kernel::Silu", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
            ... def silu(x: torch.Tensor) -> torch.Tensor:
            ...     return x * torch.sigmoid(x)
            >>> @silu.register_kernel
            ... def _(x, out=None):
            ...     return np.divide(x, 1.0 + np.exp(-x), out=out)
            >>> silu.kernel_kind
            'numpy'
        """
        if kind not in ("numpy", "torch"):
            raise OpDefinitionError(f"{self.spec.qualname}: kernel kind must be 'numpy' or 'torch', got {kind!r}")

        def attach(f: Callable[..., Any]) -> Callable[..., Any]:
            if not callable(f):
                raise OpDefinitionError(
                    f"{self.spec.qualname}: register_kernel takes a function fn(*arrays, **attrs), got "
                    f"{type(f).__name__}."
                )
            try:
                out = inspect.signature(f).parameters.get("out")
            except (TypeError, ValueError):  # (a builtin without a signature)
                out = None
            if out is not None and out.default is inspect.Parameter.empty and out.kind != out.VAR_KEYWORD:
                raise OpDefinitionError(
                    f"{self.spec.qualname}: the kernel's parameter 'out' has no default, but only ONNX Runtime "
                    "(on an op with a shape rule) passes it; the reference evaluator and OpenVINO call the kernel "
                    "without it: give it a default of None (def kernel(x, ..., out=None)) and return a new result "
                    "when it is None."
                )
            self.kernel, self.kernel_kind, self.native_kernel = f, kind, native
            return f

        return attach(fn) if fn is not None else attach

    @overload
    def register_function(
        self, builder: F, *, prefer_kernel: bool | Callable[[Mapping[str, Any]], bool] = ...
    ) -> F: ...
    @overload
    def register_function(
        self, builder: None = None, *, prefer_kernel: bool | Callable[[Mapping[str, Any]], bool] = ...
    ) -> Callable[[F], F]: ...
    def register_function(
        self,
        builder: Callable[..., Any] | None = None,
        *,
        prefer_kernel: bool | Callable[[Mapping[str, Any]], bool] = False,
    ) -> Any:
        """Attach an ONNX decomposition, attached to exported models as a model-local function.

        ``prefer_kernel``: where ONNX Runtime runs the body slower than the op's CPU kernel (or its
        PyTorch reference), ``True`` or a predicate over a node's attribute values.
        :class:`opbridge.InferenceSession` then runs those nodes through the bridge; the body stays in
        the exported model for every other runtime. Usable as ``@op.register_function`` or
        ``@op.register_function(prefer_kernel=...)``.

        Example:
            >>> import torch, opbridge
            >>> @opbridge.op("doc.prefer::Halve", shape=lambda x: opbridge.TensorInfo(x.shape, x.dtype))
            ... def halve(x: torch.Tensor) -> torch.Tensor:
            ...     return x / 2
            >>> @halve.register_function(prefer_kernel=True)
            ... def _(spec, opset):
            ...     return None  # a body builder: an onnx.FunctionProto, or None for no body at this opset
            >>> halve.prefers_kernel({})
            True
        """

        def attach(f: Callable[..., Any]) -> Callable[..., Any]:
            self._need_callable("register_function", f, "builder(spec, opset) -> onnx.FunctionProto | None")
            self.function_builder = f
            self.function_prefers_kernel = prefer_kernel
            return f

        return attach(builder) if builder is not None else attach

    def prefers_kernel(self, attrs: Mapping[str, Any]) -> bool:
        """Whether ONNX Runtime should run this op's kernel instead of its body for a node with
        attribute values ``attrs`` (see :meth:`register_function`)."""
        rule = self.function_prefers_kernel
        if not callable(rule):
            return bool(rule)
        try:
            return bool(rule(attrs))
        except Exception as exc:
            raise OpDefinitionError(
                f"{self.spec.qualname}: the prefer_kernel rule of its function body raised {type(exc).__name__}: "
                f"{exc} for the node's attributes {dict(attrs)}; it is called with the attribute values by name "
                f"({[a.name for a in self.spec.attributes]}): fix the rule (register_function(prefer_kernel=...))."
            ) from exc

    @overload
    def register_gpu_kernel(self, fn: F, *, dtypes: str | Sequence[str] = ...) -> F: ...
    @overload
    def register_gpu_kernel(self, fn: None = None, *, dtypes: str | Sequence[str] = ...) -> Callable[[F], F]: ...
    def register_gpu_kernel(
        self, fn: Callable[..., Any] | None = None, *, dtypes: str | Sequence[str] = ("float32", "float16")
    ) -> Any:
        """Attach a GPU kernel ``fn(inputs, outputs, attrs, stream)`` working on CUDA tensors, for
        inputs of ``dtypes`` (torch dtype names; one name is one dtype)."""
        import torch

        names = (dtypes,) if isinstance(dtypes, str) else tuple(dtypes)
        bad = [d for d in names if not isinstance(getattr(torch, str(d), None), torch.dtype)]
        if bad or not names:
            raise OpDefinitionError(
                f"{self.spec.qualname}: register_gpu_kernel dtypes {dtypes!r}: give torch dtype names, "
                "e.g. dtypes=('float32', 'float16')."
            )

        def attach(f: Callable[..., Any]) -> Callable[..., Any]:
            self._need_callable("register_gpu_kernel", f, "fn(inputs, outputs, attrs, stream)")
            self.gpu_kernel, self.gpu_kernel_dtypes = f, names
            return f

        return attach(fn) if fn is not None else attach

    def register_autograd(self, backward: Callable[..., Any]) -> Callable[..., Any]:
        """Attach a backward formula ``backward(ctx, *grad_outputs)``, one gradient per output.

        ``ctx`` is a :class:`BackwardContext`; return one gradient (a tensor or None) per tensor
        input, a single value where the op has one input. Without a formula the op is still
        differentiable: its backward runs the reference again with autograd on (as activation
        checkpointing does) and differentiates that, so a formula saves that second forward and
        is needed where the reference leaves autograd (numpy, ``.item()``, ``.detach()``).
        Usable as a decorator; the formula must be traceable for ``torch.compile``.

        Example:
            >>> import torch, opbridge
            >>> @opbridge.op("doc.grad::Cube")
            ... def cube(x: torch.Tensor) -> torch.Tensor:
            ...     return x * x * x
            >>> @cube.register_autograd
            ... def _(ctx, grad):
            ...     (x,) = ctx.inputs
            ...     return grad * 3 * x * x
            >>> x = torch.tensor([2.0], requires_grad=True)
            >>> cube(x).sum().backward()
            >>> x.grad.tolist()
            [12.0]
        """
        if not callable(backward):
            raise OpDefinitionError(
                f"{self.spec.qualname}: register_autograd takes a function backward(ctx, *grad_outputs), "
                f"got {type(backward).__name__}."
            )
        self.backward = backward
        self._definition_changed()
        return backward

    # ------------------------------------------------------------------ calling

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Split a call into (tensor inputs, checked attribute values)."""
        import torch

        plan = self._plan
        if not kwargs and len(args) == len(self.spec.inputs) <= plan.positional and plan.defaults is not None:
            # every input given in order and no attribute (the common call): only the inputs to check
            if all(isinstance(t, torch.Tensor) for t in args):
                return list(args), dict(plan.defaults[0] if torch.compiler.is_compiling() else plan.defaults[1])
        names = plan.names
        if len(args) > plan.positional:
            if plan.positional == len(names):
                raise OpCallError(f"{self.spec.qualname}: takes {len(names)} arguments, got {len(args)}.")
            raise OpCallError(
                f"{self.spec.qualname}: takes {plan.positional} positional argument(s), got {len(args)}; give "
                f"{', '.join(names[plan.positional :])} by name (keyword-only in the definition)."
            )
        given = dict(zip(names, args))
        for key, value in kwargs.items():
            if key in given:
                raise OpCallError(f"{self.spec.qualname}: got multiple values for {key!r}.")
            given[key] = value
        tensors: list[Any] = []
        for p in self.spec.inputs:
            value = given.pop(p.name, None)
            if value is None and not p.optional:
                raise OpCallError(f"{self.spec.qualname}: missing tensor input {p.name!r}.")
            if value is not None and not isinstance(value, (torch.Tensor, torch.fx.Proxy)):
                raise OpCallError(
                    f"{self.spec.qualname}: input {p.name!r} expects a torch.Tensor, got "
                    f"{type(value).__name__}; wrap it with torch.as_tensor(...)."
                )
            tensors.append(value)
        if not torch.compiler.is_compiling() or torch.compiler.is_exporting():
            self._refuse_symbolic(given)
        attrs = self.spec.bind_attributes(given)
        if plan.rounds and not torch.compiler.is_compiling():  # (a float traced by dynamo may be symbolic)
            attrs = _float32_attributes(self.spec, attrs)
        return tensors, attrs

    def _refuse_symbolic(self, given: Mapping[str, Any]) -> None:
        """An OpCallError for an attribute given a symbolic value: a size that torch.export traces as a
        variable (``k=x.shape[0]`` with a dynamic dim), which an attribute, a constant of the op and of its
        ONNX node, cannot follow. (torch.compile specializes it instead: compiled again for each value.)"""
        import torch

        symbolic = (torch.SymInt, torch.SymFloat, torch.SymBool)
        for name, value in given.items():
            if isinstance(value, (list, tuple)):
                found = next((v for v in value if isinstance(v, symbolic)), None)
            else:
                found = value if isinstance(value, symbolic) else None
            if found is None:
                continue
            raise OpCallError(
                f"{self.spec.qualname}: attribute {name!r} is given {found!r}, a {type(found).__name__}: a size "
                "torch.export traces as a variable (a dynamic dim). An attribute is a constant of the op and of "
                "its ONNX node, so it cannot follow the input's shape: pass a constant (int(...) of it makes "
                "that dim static), or take the value from a tensor input of the op (e.g. an input whose shape "
                "carries the size)."
            )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        import torch

        tensors, attrs = self.bind(args, kwargs)
        counts = _TRACE_STATE.counts
        if counts is not None and (_TRACE_STATE.inside or _dynamo_tracing()):
            # (a call inside another op's reference is that op's business, not a node of the graph; under
            # dynamo, which traces control flow's branches, a write here is a side effect it refuses there:
            # export finds those calls in the graph it wrote)
            counts = None
        if counts is not None:
            counts.begin(tensors)
            counts[self.spec.key] = counts.get(self.spec.key, 0) + 1
        if any(isinstance(t, torch.fx.Proxy) for t in tensors):  # torch.fx.symbolic_trace: a call_function node
            encoded = [_encode_attr(a, attrs[a.name]) for a in self.spec.attributes]
            return self.torch_op()(*tensors, *encoded)
        forward_ad = _forward_mode_ad(tensors)
        if forward_ad:
            raise OpCallError(
                f"{self.spec.qualname}: called under forward-mode AD ({forward_ad}), which opbridge ops do not "
                "carry: the tangents would come out as zeros or None. Differentiate in reverse mode with "
                "torch.autograd.grad or torch.autograd.functional.jacobian instead."
            )
        if _func_grad_transform():
            raise OpCallError(
                f"{self.spec.qualname}: called under torch.func.grad / vjp / jacrev, whose transforms PyTorch "
                "does not run through torch.library ops (its own error asks for an autograd.Function's "
                "setup_context). Differentiate with torch.autograd.grad, or torch.autograd.functional.jacobian "
                "/ vjp, which do; torch.func.vmap works on the op."
            )
        encoded = [_encode_attr(a, attrs[a.name]) for a in self.spec.attributes]
        if counts is None:
            return self.torch_op()(*tensors, *encoded)
        # traced by an export: the call's inputs and attributes (the TorchScript exporter merges two equal
        # calls into one node) and whether its reference draws random numbers (then a merge is one draw for two)
        counts.distinct.setdefault(self.spec.key, set()).add((tuple(id(t) for t in tensors), _call_key(encoded)))
        before = torch.random.get_rng_state()
        result = self.torch_op()(*tensors, *encoded)
        if not torch.equal(before, torch.random.get_rng_state()):
            counts.random.add(self.spec.key)
        return result

    def run_reference(self, *tensors: Any, **attrs: Any) -> Any:
        """Run the PyTorch reference with checked attributes (no torch.library dispatch)."""
        checked = self.spec.bind_attributes(attrs)
        result = self.reference(*tensors, **checked)
        return self._check_result(result, "the reference")

    def _check_result(self, result: Any, what: str) -> Any:
        import torch

        n = len(self.spec.outputs)
        items = result if isinstance(result, (tuple, list)) else (result,)
        if len(items) != n or not all(isinstance(t, torch.Tensor) for t in items):
            got = f"{len(items)} value(s)" if isinstance(result, (tuple, list)) else type(result).__name__
            raise OpDefinitionError(
                f"{self.spec.qualname}: {what} returned {got}, but the op declares {n} tensor "
                f"output(s) {[o.name for o in self.spec.outputs]}; return "
                + ("one tensor." if n == 1 else f"a tuple of {n} tensors.")
            )
        return tuple(items) if n > 1 else items[0]

    def _check_unchanged(self, tensors: list[Any], versions: list[Any]) -> None:
        """An OpDefinitionError where the reference wrote one of its inputs in place (torch.library ops
        do not; a backward's second run of the reference would write it again)."""
        for p, t, v in zip(self.spec.inputs, tensors, versions):
            if t is not None and v is not None and _version(t) != v:
                raise OpDefinitionError(
                    f"{self.spec.qualname}: the reference changed its input {p.name!r} in place; an op must "
                    f"leave its inputs as they are: work on a copy ({p.name} = {p.name}.clone()) or use "
                    "out-of-place operations."
                )

    def _check_rule(self, tensors: list[Any], attrs: dict[str, Any], result: Any) -> None:
        """An OpDefinitionError where the reference's outputs are not what the shape rule declares
        for these inputs (the rule is what exports and runtimes see)."""
        rule = self.spec.shape_rule
        if rule is None:
            return
        results = result if isinstance(result, tuple) else (result,)
        key = (
            *[None if t is None else (t.shape, t.dtype, t.device) for t in tensors],
            *attrs.values(),
            *[(t.shape, t.dtype) for t in results],
        )
        if key in self._rule_fits:
            return
        import torch

        from opbridge.shape import SymDim, _as_infos, call_shape_rule

        spec = self.spec
        infos = _as_infos(call_shape_rule(rule, spec, tensors, attrs), spec, "the shape rule")
        for i, (info, tensor) in enumerate(zip(infos, results)):
            if not isinstance(info.dtype, torch.dtype):
                raise OpDefinitionError(
                    f"{spec.qualname}: the shape rule gives output {i} the dtype {info.dtype!r} "
                    f"({type(info.dtype).__name__}); give a torch dtype, e.g. torch.float32 or x.dtype."
                )
            shape = tuple(info.shape)
            same = len(shape) == tensor.dim() and all(
                isinstance(d, SymDim) or int(d) == n for d, n in zip(shape, tensor.shape)
            )
            if not same or info.dtype != tensor.dtype:
                declared = [d if not isinstance(d, SymDim) else "?" for d in shape]
                raise OpDefinitionError(
                    f"{spec.qualname}: the shape rule declares output {i} ({spec.outputs[i].name!r}) as "
                    f"{declared} {info.dtype}, but the reference returned {list(tensor.shape)} {tensor.dtype} for "
                    f"these inputs; exports and runtimes follow the rule, so make the two agree "
                    f"(@{spec.name}.register_shape)."
                )
        if len(self._rule_fits) >= _RULE_FITS_KEPT:
            self._rule_fits.clear()
        self._rule_fits.add(key)

    # ------------------------------------------------------------------ torch.library

    @property
    def torch_op_name(self) -> str:
        """The torch op's qualified name, e.g. ``"opbridge::acme__ScaledSwish_v1"``."""
        return f"{_TORCH_NAMESPACE}::{_torch_op_name(self.spec)}"

    def torch_op(self) -> Any:
        """The ``torch.ops`` overload for this op, defining it on first use."""
        if self._torch_op is None:
            self._torch_op = _define_torch_op(self)
        return self._torch_op


def _define_torch_op(opdef: OpDef) -> Any:
    """Define (or rebind) the torch.library op that runs ``opdef``'s reference."""
    import torch

    from opbridge import _autograd

    spec = opdef.spec
    opname = _torch_op_name(spec)
    qual = f"{_TORCH_NAMESPACE}::{opname}"
    schema = _torch_schema(spec)
    with _LOCK:
        previous = _TORCH_IMPLS.get(qual)
        if previous is not None:
            if _torch_schema(previous.spec) != schema:
                raise _signature_error(spec, previous.spec)
            _make_current(qual, opdef)
            return getattr(getattr(torch.ops, _TORCH_NAMESPACE), opname).default
        _make_current(qual, opdef)

        def decode(args: tuple[Any, ...]) -> tuple[list[Any], dict[str, Any]]:
            return _decode(_TORCH_IMPLS[qual], args)

        def impl(*args: Any) -> Any:
            current = _TORCH_IMPLS[qual]
            tensors, attrs = decode(args)
            versions = [_version(t) for t in tensors]
            rng = _autograd.rng_before(tensors)
            try:
                if _autograd.watched():  # (an enclosing watch counts this thread's draws only: so must this one)
                    with inside_reference(), _autograd.watching_draws() as watch:
                        result = current._check_result(current.reference(*tensors, **attrs), "the reference")
                    drew = watch.drew
                else:
                    with inside_reference():
                        result = current._check_result(current.reference(*tensors, **attrs), "the reference")
                    # (kept for the backward whether or not the states moved: a reference drawing under fork_rng
                    # leaves them as they were, and its backward must replay the same draws)
                    drew = rng is not None
            except Exception as exc:
                note_raised_by(exc, f"{current.spec.qualname}'s reference")
                raise
            current._check_unchanged(tensors, versions)
            current._check_rule(tensors, attrs, result)
            outputs = _fresh_outputs(result if isinstance(result, tuple) else (result,), tensors, current.shape_rule)
            _autograd.note_forward(rng, drew, outputs[0])
            return outputs if isinstance(result, tuple) else outputs[0]

        def fake(*args: Any) -> Any:
            _run_eagerly_after_graph_breaks(OpDef.__call__.__code__, impl.__code__)
            current = _TORCH_IMPLS[qual]
            tensors, attrs = decode(args)
            with inside_reference():
                return fake_outputs(current.spec, current.shape_rule, current.reference, tensors, attrs)

        lib = _library()
        lib.define(opname + schema)
        lib.impl(opname, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(qual, fake, lib=lib)
        torch.library.register_vmap(qual, _vmap_rule(qual, opname), lib=lib)
        _autograd.define(
            lib,
            qual,
            opname,
            ", ".join(f"{_torch_type(a)} {a.name}" for a in spec.attributes),
            current=lambda: _TORCH_IMPLS[qual],
            definition=_definition,
            decode=_decode,
            inside=inside_reference,
        )
        return getattr(getattr(torch.ops, _TORCH_NAMESPACE), opname).default


def _vmap_rule(qual: str, opname: str) -> Callable[..., Any]:
    """The op under ``torch.func.vmap``: one call per sample, as vmap's own fallback does, but under
    vmap's randomness mode (the fallback ignored it): ``"error"`` refuses a reference that draws random
    numbers, ``"same"`` gives every sample the same ones, ``"different"`` its own."""
    import torch

    from opbridge import _autograd

    def rule(info: Any, in_dims: tuple[Any, ...], *args: Any) -> tuple[Any, Any]:
        op = getattr(getattr(torch.ops, _TORCH_NAMESPACE), opname).default
        size = int(info.batch_size)
        if size == 0:
            return _empty_batch(qual, op, in_dims, args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        # traced (torch.compile, torch.export, fake tensors): no real random state to compare or restore
        traced = _autograd.tracing(tensors)
        start = {} if traced else _autograd.rng_states(tensors)
        results = []
        for b in range(size):
            if info.randomness == "same" and b:
                for device, state in start.items():
                    if device == "cpu":
                        torch.set_rng_state(state)
                    else:
                        torch.cuda.set_rng_state(state, device)
            sample = [
                a.select(d, b) if d is not None and isinstance(a, torch.Tensor) else a for a, d in zip(args, in_dims)
            ]
            results.append(op(*sample))
            # (by the process's random state: a dispatch mode does not see the ops under vmap's rule)
            if info.randomness == "error" and start and not _autograd.same_states(start, _autograd.rng_states(tensors)):
                raise RuntimeError(
                    f"vmap: {_TORCH_IMPLS[qual].spec.qualname}'s reference drew random numbers while in randomness "
                    "error mode; use vmap(..., randomness='same') or 'different', or draw them outside vmap."
                )
        if isinstance(results[0], tuple):
            stacked = tuple(torch.stack([r[i] for r in results]) for i in range(len(results[0])))
            return stacked, (0,) * len(stacked)
        return torch.stack(results), 0

    return rule


def _empty_batch(qual: str, op: Any, in_dims: tuple[Any, ...], args: tuple[Any, ...]) -> tuple[Any, Any]:
    """The op under vmap over a batch of no samples: outputs of no samples, each sample's shape and dtype
    from the op's fake kernel (its shape rule, or its reference on meta or fake tensors), as PyTorch's own
    ops give them. Nothing runs the reference on real data."""
    import torch
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    from torch.utils._python_dispatch import _disable_current_modes

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    # traced (torch.compile, torch.export): fake samples of the tracer's fake mode, which knows its symbolic
    # sizes; eagerly meta samples, which run the op's fake kernel as its meta kernel
    traced = detect_fake_mode(tensors)
    spec = _TORCH_IMPLS[qual].spec
    device = tensors[0].device if tensors else torch.device("cpu")

    def samples() -> list[Any]:
        return [
            torch.empty(
                a.shape[:d] + a.shape[d + 1 :] if d is not None else a.shape,
                dtype=a.dtype,
                device=a.device if traced is not None else "meta",
            )
            if isinstance(a, torch.Tensor)
            else a
            for a, d in zip(args, in_dims)
        ]

    # (with vmap's layers on the stack they take calls before the fake or the meta kernel does)
    with temporarily_clear_interpreter_stack(), _disable_current_modes():
        if traced is not None:  # (torch 2.11 trips an internal assert here, in PythonFallbackKernel)
            with traced:
                result = op(*samples())
        else:  # (no fake mode of its own: one entered here trips that assert eagerly too)
            try:
                result = op(*samples())
            except RuntimeError as exc:  # (torch's meta tensors refuse an output of data-dependent shape)
                if "data-dependent" not in str(exc):
                    raise
                raise _no_sample_shape(spec, "") from None
    outputs = result if isinstance(result, tuple) else (result,)
    for i, o in enumerate(outputs):
        if free_unbacked_symbols(o.shape):
            raise _no_sample_shape(spec, f" {i} ({spec.outputs[i].name!r})", f" (its shape is {list(o.shape)})")
    # tied to the inputs that require grad (a backward through the empty batch gives them zero gradients)
    tied = [t.reshape(-1)[:0].sum() for t in tensors if t.requires_grad] if torch.is_grad_enabled() else []
    empty: list[Any] = []
    for o in outputs:
        out = torch.empty((0, *o.shape), dtype=o.dtype, device=o.device if traced is not None else device)
        if o.is_floating_point() or o.is_complex():
            for t in tied:
                out = out + t.to(o.dtype)
        empty.append(out)
    if isinstance(result, tuple):
        return tuple(empty), (0,) * len(empty)
    return empty[0], 0


def _no_sample_shape(spec: OpSpec, output: str, shape: str = "") -> OpCallError:
    """The error of vmap over an empty batch where an output's size depends on the data."""
    return OpCallError(
        f"{spec.qualname}: vmap over a batch of size 0 gives no output{output} shape: a size of it depends on "
        f"the data{shape} and there is no sample to take it from; skip the call where the batch is empty."
    )


def _op_by_name(module: str | None, domain: str, name: str, version: int) -> OpDef:
    """The op ``domain::name`` at ``version``, once ``module`` (where it was defined) is imported."""
    import importlib

    if domain in _BUILTIN_DOMAINS:
        _ensure_builtins()
    if module and module != "__main__" and (domain, name, version) not in _OPS:
        importlib.import_module(module)
    found = _OPS.get((domain, name, version))
    if found is None:
        where = f"module {module}" if module else "its module"
        raise OpDefinitionError(
            f"{domain}::{name} v{version} is not defined in this process; import {where}, which defines it, "
            "before loading what holds the op."
        )
    return found


def _make_current(qual: str, opdef: OpDef) -> None:
    """``opdef`` is what the torch op ``qual`` runs from now on (its index: a backward's way back to it)."""
    if opdef._definition_index < 0:
        opdef._definition_index = next(_DEFINED_COUNT)
        _DEFINITIONS[opdef._definition_index] = opdef
    previous = _TORCH_IMPLS.get(qual)
    if previous is not None and previous is not opdef:
        _SUPERSEDED.append(previous)
        _forget_compiled_code()
    _TORCH_IMPLS[qual] = opdef
    _tag_compile_caches()


def _forget_compiled_code() -> None:
    """Drop what torch.compile compiled (an op's definition, shape rule or backward formula changed): its
    graphs hold the old one's output sizes, dtypes and backward, which no guard checks, so a compiled model
    ran the new definition into the old buffers, or the old formula. Each compiled function compiles again
    at its next call."""
    dynamo = sys.modules.get("torch._dynamo")  # (nothing was compiled where it was never imported)
    if dynamo is not None:
        logger.info("an op was redefined: torch.compile's compiled code is dropped and compiled again when called")
        dynamo.reset()


_TAG_MARK = "|opbridge-"


def _tag_compile_caches() -> None:
    """Make the ops' definitions part of torch.compile's cache keys (``torch.compiler.config.cache_key_tag``).
    Inductor's graph caches, in memory and on disk, know an op by its name: a graph compiled with another
    definition of it (the cell run before, or the file as it was in the last process) came back from them,
    with that definition's output dtypes and sizes, and ran the new one into its buffers (garbage, no error)."""
    import hashlib

    import torch.compiler.config as compiler_config

    digest = hashlib.sha256()
    for qual in sorted(_TORCH_IMPLS):
        digest.update(qual.encode() + _TORCH_IMPLS[qual]._fingerprint())
    base = compiler_config.cache_key_tag.split(_TAG_MARK)[0]
    compiler_config.cache_key_tag = f"{base}{_TAG_MARK}{digest.hexdigest()[:20]}"


def _definition_digest(spec: OpSpec, functions: Sequence[Any]) -> bytes:
    """What decides an op's traced graphs: its schema, and the code of ``functions`` (the reference, the shape
    rule, the backward formula) with their defaults, the values of their closures and of the globals they
    read (``dtype`` of a factory's op, a module constant; functions among them alike, three calls deep) and
    their source files' contents. Values whose repr holds an address give another digest in each process (a
    cache miss, never a wrong hit)."""
    import hashlib

    digest = hashlib.sha256(f"{spec.qualname}/{spec.version}/{_torch_schema(spec)}".encode())
    for fn in functions:
        _digest_callable(digest, fn, depth=0)
    return digest.digest()


def _digest_callable(digest: Any, fn: Any, depth: int) -> None:
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        digest.update(_value_text(fn).encode())
        return
    _digest_code(digest, code)
    digest.update(_value_text((getattr(fn, "__defaults__", None), getattr(fn, "__kwdefaults__", None))).encode())
    digest.update(_file_digest(code.co_filename))
    values: list[Any] = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # (a cell not filled yet)
            continue
    scope = getattr(fn, "__globals__", {})
    values += [scope[name] for name in _names(code) if name in scope]  # (a module-level dtype, a helper)
    for value in values:
        if isinstance(value, types.ModuleType):
            digest.update(value.__name__.encode())
        elif depth < 3 and isinstance(getattr(value, "__code__", None), types.CodeType):
            _digest_callable(digest, value, depth + 1)
        else:
            digest.update(_value_text(value).encode())


def _names(code: types.CodeType) -> list[str]:
    """The global and attribute names ``code`` and the code nested in it read."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _names(const)
    return names


def _digest_code(digest: Any, code: types.CodeType) -> None:
    digest.update(code.co_code + repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _digest_code(digest, const)
        else:
            digest.update(repr(const).encode())


def _value_text(value: Any) -> str:
    """A short text of ``value`` for a digest (a tensor by its dtype and shape, not its data)."""
    import reprlib

    if type(value).__name__ in ("Tensor", "Parameter", "ndarray"):
        return f"{type(value).__name__}({getattr(value, 'dtype', '')}, {tuple(getattr(value, 'shape', ()))})"
    try:
        return reprlib.repr(value)
    except Exception:  # (a repr that fails: the type stands for it)
        return type(value).__qualname__


_FILE_DIGESTS: dict[tuple[str, int, int], bytes] = {}


def _file_digest(path: str) -> bytes:
    """The digest of a source file's contents (an edit anywhere in the op's file changes it); empty for code
    without a file (a notebook cell, exec)."""
    try:
        stat = os.stat(path)
    except OSError:
        return b""
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _FILE_DIGESTS:
        import hashlib

        try:
            with open(path, "rb") as f:
                _FILE_DIGESTS[key] = hashlib.sha256(f.read()).digest()
        except OSError:
            return b""
    return _FILE_DIGESTS[key]


def _definition(index: int) -> OpDef:
    """The definition a forward ran, for its backward."""
    found = _DEFINITIONS.get(index)
    if found is None:
        raise OpCallError(
            f"the op definition this backward's forward ran is gone: ops were redefined more than "
            f"{_SUPERSEDED_KEPT} times since; run the forward again."
        )
    return found


def _version(t: Any) -> int | None:
    """``t``'s version counter (bumped by in-place writes); None for an inference tensor, which has none."""
    return None if t is None or t.is_inference() else int(t._version)


def _decode(opdef: OpDef, args: tuple[Any, ...]) -> tuple[list[Any], dict[str, Any]]:
    """A torch op's arguments as (tensor inputs, attribute values by name), FLOAT and FLOATS values that are
    numbers rounded to float32 as an eager call rounds them: compiled code, an ExportedProgram's module and
    direct ``torch.ops`` calls hand the op the value as given (0.7, where the ONNX node carries 0.699999988)."""
    n = len(opdef.spec.inputs)
    if len(args) == n:
        return list(args), {}
    attrs = {}
    for a, v in zip(opdef.spec.attributes, args[n:]):
        try:
            attrs[a.name] = _decode_attr(a, v)
        except ValueError as exc:  # (only a string list decodes)
            raise OpCallError(
                f"{opdef.spec.qualname}: attribute {a.name!r} (a list of strings) reached torch.ops."
                f"{opdef.torch_op_name.replace('::', '.')} as {v!r}, which is not a string list as that op takes it ({exc}): "
                "each string as '<length>:<text>', joined (['ab', ''] is '2:ab0:'); call the OpDef itself with "
                "a list where the code allows it."
            ) from None
    for a in opdef.spec.attributes:
        value = attrs.get(a.name)
        plain = value if isinstance(value, tuple) else (value,)
        if a.choices is not None and all(type(v) in (int, str) for v in plain):  # (not a symbolic int)
            a.check_choices(value, opdef.spec.qualname)  # (the OpDef's call checks them: torch.ops calls too)
        if a.type is AttrType.FLOAT and type(value) is float:  # (a symbolic float under tracing stays as it is)
            attrs[a.name] = _float32(value)
        elif a.type is AttrType.FLOATS and isinstance(value, tuple) and all(type(v) is float for v in value):
            attrs[a.name] = tuple(_float32(v) for v in value)
    return list(args[:n]), attrs


def _fresh_outputs(outputs: tuple[Any, ...], inputs: list[Any], rule: Any) -> tuple[Any, ...]:
    """A torch.library op's outputs: no views or aliases of its inputs or of each other; contiguous where
    a shape rule gives them (its fake outputs are)."""
    fresh: list[Any] = []
    for t in outputs:
        if rule is not None and not t.is_contiguous():
            t = t.contiguous()
        elif any(x is not None and shares_memory(t, x) for x in (*inputs, *fresh)):
            t = t.clone()
        fresh.append(t)
    return tuple(fresh)


def inside_reference() -> AbstractContextManager[None]:
    """Mark this thread as running an op's reference (op calls there are not the traced model's), with
    autocast off: an op is one unit to autocast, its reference computing in its inputs' dtypes, as its
    shape rule, its fake kernel and compiled code (which sees no autocast at run time) have it."""
    return _InsideReference()


class _InsideReference(AbstractContextManager[None]):
    """What :func:`inside_reference` gives: a class, not a generator (it is entered at every op call)."""

    def __enter__(self) -> None:
        import torch

        _TRACE_STATE.inside += 1
        self._autocast: ExitStack | None = None
        try:
            for device in ("cpu", "cuda"):
                if torch.is_autocast_enabled(device):
                    if self._autocast is None:
                        self._autocast = ExitStack()
                    self._autocast.enter_context(torch.autocast(device, enabled=False))
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._autocast is not None:
                self._autocast.__exit__(*exc)
        finally:
            _TRACE_STATE.inside -= 1


def _signature_error(spec: OpSpec, previous: OpSpec) -> OpDefinitionError:
    return OpDefinitionError(
        f"{spec.qualname} v{spec.version} is already defined with another signature "
        f"({_torch_schema(previous)}, now {_torch_schema(spec)}) and PyTorch has its op: bump version= or use "
        "another name (the earlier definition stays)."
    )


_LIB: Any = None


def _library() -> Any:
    global _LIB
    import torch

    if _LIB is None:
        _LIB = torch.library.Library(_TORCH_NAMESPACE, "FRAGMENT")
    return _LIB


def op(
    qualname: str,
    *,
    version: int = 1,
    outputs: tuple[str, ...] | None = None,
    shape: ShapeRule | None = None,
    tolerances: Mapping[str, Tolerance] | None = None,
) -> Callable[[Callable[P, R]], OpDef[P, R]]:
    """Define a custom op from a typed function whose body is its PyTorch reference.

    Args:
        qualname: ``"domain::Name"``, the ONNX domain and op type.
        version: the op's version in its domain (the ``opset_import`` version).
        outputs: names of the outputs (default ``output`` / ``output0``, ``output1``...).
        shape: an output shape/dtype rule; derived from the reference when omitted.
        tolerances: comparison tolerances per dtype name, e.g. ``{"float16": Tolerance(1e-2, 1e-3)}``.

    Tensor parameters (``torch.Tensor``, ``Optional[torch.Tensor]``) become inputs;
    ``float``, ``int``, ``bool``, ``str``, ``list[float]``, ``list[int]`` and
    ``list[str]`` parameters become ONNX attributes with their defaults; a ``Literal`` of str or int
    values (``mode: Literal["avg", "max"] = "avg"``) is an attribute that takes only those values.

    Example:
        >>> import torch, opbridge
        >>> @opbridge.op("doc.op::Scale")
        ... def scale(x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        ...     return x * factor
        >>> scale(torch.ones(2), factor=3.0)
        tensor([3., 3.])
        >>> [(a.name, a.type.name, a.default) for a in scale.spec.attributes]
        [('factor', 'FLOAT', 2.0)]
    """
    parse_qualname(qualname)

    def decorate(fn: Callable[P, R]) -> OpDef[P, R]:
        # the module that applies the decorator defines the op (its reference may come from elsewhere)
        defined_in = sys._getframe(1).f_globals.get("__name__")
        spec = spec_from_function(fn, qualname, version, outputs, tolerances)
        builtin = _is_builtin(fn)
        if spec.domain in _BUILTIN_DOMAINS and not builtin:
            _ensure_builtins()  # a clash with a built-in op is named now, not when a lookup loads them
        opdef = OpDef(spec, fn, shape=shape)
        opdef._defined_in = defined_in if isinstance(defined_in, str) else None
        qual = f"{_TORCH_NAMESPACE}::{_torch_op_name(spec)}"
        with _LOCK:
            _check_name_is_free(spec, builtin)
            defined = _TORCH_IMPLS.get(qual)
            old = _OPS.get(spec.key)
            if defined is not None:
                # PyTorch keeps an op's schema for the process: the new definition must fit it, and from
                # now on the op (called through either object) runs the new definition
                if _torch_schema(defined.spec) != _torch_schema(spec):
                    raise _signature_error(spec, defined.spec)
                _make_current(qual, opdef)
            if old is not None:
                logger.info("redefining op %s v%d", spec.qualname, spec.version)
            _OPS[spec.key] = opdef
            if "torch" in sys.modules:
                # defined now, where a first call inside torch.compile's tracing could not define it; an op
                # PyTorch refuses leaves the registry as it was
                try:
                    opdef.torch_op()
                except Exception:
                    _restore(_OPS, spec.key, old)
                    _restore(_TORCH_IMPLS, qual, defined)
                    raise
        return opdef

    return decorate


# Domains of the built-in ops: a lookup in one of them defines the built-ins first.
_BUILTIN_DOMAINS = frozenset({"opbridge", "Test", "mmdeploy"})


def _is_builtin(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is the reference of one of opbridge's built-in ops (defined in opbridge.ops)."""
    module = getattr(fn, "__module__", "") or ""
    return module == "opbridge.ops" or module.startswith("opbridge.ops.")


def _check_name_is_free(spec: OpSpec, builtin: bool) -> None:
    """Refuse a definition that would take a built-in op's place, or another op's PyTorch name."""
    old = _OPS.get(spec.key)
    if old is not None and _is_builtin(old.reference) and not builtin:
        raise OpDefinitionError(
            f"{spec.qualname} v{spec.version} is one of opbridge's built-in ops ({old.reference.__module__}); "
            f"define yours under another domain or name (e.g. 'acme::{spec.name}'), or at another version= if "
            "it is a new version of that op."
        )
    torch_name = _torch_op_name(spec)
    for other in _OPS.values():
        if other.spec.qualname != spec.qualname and _torch_op_name(other.spec) == torch_name:
            raise OpDefinitionError(
                f"{spec.qualname} v{spec.version} and the op {other.spec.qualname} v{other.spec.version} defined "
                f"before it would be one PyTorch op, {_TORCH_NAMESPACE}::{torch_name} (PyTorch's names have no dots: "
                "they become '_'); rename the domain or the name of this one."
            )


def _restore(registry: dict[Any, Any], key: Any, value: Any) -> None:
    if value is None:
        registry.pop(key, None)
    else:
        registry[key] = value


def _ensure_builtins() -> None:
    """Define the built-in ops (opbridge.ops) so that lookups find them; needs torch."""
    try:
        import opbridge.ops  # noqa: F401
    except ImportError as exc:  # torch absent: only numpy kernels can run
        logger.debug("built-in ops unavailable: %s", exc)


def find_op(domain: str, name: str, version: int | None = None) -> OpDef | None:
    """The op defined in this process for ``domain::name`` (highest version <= ``version``).

    The built-in ops of :mod:`opbridge.ops` are always included (looking one up
    imports torch; other lookups do not).
    """
    if domain in _BUILTIN_DOMAINS:
        _ensure_builtins()
    with _LOCK:
        candidates = [d for (dom, n, v), d in _OPS.items() if dom == domain and n == name]
    if version is not None:
        candidates = [d for d in candidates if d.spec.version <= version]
    return max(candidates, key=lambda d: d.spec.version, default=None)


def later_op_note(domain: str, name: str, version: int) -> str | None:
    """Why no op ``domain::name`` serves opset ``version`` when this process defines it only at later
    versions (None when it defines none, or one serves it)."""
    if domain in _BUILTIN_DOMAINS:
        _ensure_builtins()
    with _LOCK:
        versions = sorted(v for (dom, n, v) in _OPS if dom == domain and n == name)
    if not versions or versions[0] <= version:
        return None
    shown = ", ".join(map(str, versions))
    return (
        f"{domain}::{name} is defined here at version {shown} only, but the model imports {domain} at opset "
        f"{version}: export the model again with this definition (its opset import follows the op's version), or "
        f'define version {version} too (@opbridge.op("{domain}::{name}", version={version})).'
    )


def all_ops() -> list[OpDef]:
    """Every op defined in this process (built-ins included), sorted by qualified name and version."""
    _ensure_builtins()
    with _LOCK:
        return sorted(_OPS.values(), key=lambda d: (d.spec.domain, d.spec.name, d.spec.version))


def ops_argument(ops: OpDef | str | Iterable[OpDef | str] | None, caller: str) -> list[OpDef]:
    """``ops`` as a list of op definitions (every op where None): an :class:`OpDef` or a qualified
    name ``"domain::Name"`` is one op; an OpbridgeError names anything else."""
    if ops is None:
        return all_ops()
    items = [ops] if isinstance(ops, (OpDef, str)) else ops
    if not isinstance(items, Iterable):
        raise OpDefinitionError(
            f"{caller}: ops is a {type(ops).__name__}; give op definitions or 'domain::Name' names."
        )
    out: list[OpDef] = []
    for item in items:
        if isinstance(item, str):
            domain, _, name = item.rpartition("::")
            found = find_op(domain, name) if domain else None
            if found is None:
                raise OpDefinitionError(
                    f"{caller}: no op {item!r} is defined; give an op definition or its qualified name, e.g. "
                    f"{[d.spec.qualname for d in all_ops()][:3]}."
                )
            out.append(found)
        elif isinstance(item, OpDef):
            out.append(item)
        else:
            raise OpDefinitionError(
                f"{caller}: {item!r} is a {type(item).__name__}; give op definitions (@opbridge.op) or 'domain::Name' names."
            )
    return out


def _forward_mode_ad(tensors: Sequence[Any]) -> str:
    """Which forward-mode AD the call runs under (``torch.func.jvp``/``jacfwd``, or dual tensors of
    ``torch.autograd.forward_ad``), else ``""``. torch.library ops have no forward-mode formula: through
    them ``jvp`` gives zero tangents and dual tensors lose theirs, silently."""
    import torch

    if torch.compiler.is_compiling():
        return ""
    forward_ad = torch.autograd.forward_ad
    functorch = torch._C._functorch
    if functorch.peek_interpreter_stack() is not None:
        if any(i.key() == functorch.TransformType.Jvp for i in functorch.get_interpreter_stack()):
            return "torch.func.jvp / jacfwd"
    if getattr(forward_ad, "_current_level", -1) >= 0:
        for t in tensors:
            if t is not None and forward_ad.unpack_dual(t).tangent is not None:
                return "torch.autograd.forward_ad"
    return ""


def _func_grad_transform() -> bool:
    """Whether the call runs under ``torch.func.grad``, ``vjp`` or ``jacrev`` (eagerly)."""
    import torch

    if torch.compiler.is_compiling():
        return False
    functorch = torch._C._functorch
    if functorch.peek_interpreter_stack() is None:
        return False
    return any(i.key() == functorch.TransformType.Grad for i in functorch.get_interpreter_stack())


def _dynamo_tracing() -> bool:
    import torch

    return bool(torch.compiler.is_dynamo_compiling())


def _run_eagerly_after_graph_breaks(*codes: types.CodeType) -> None:
    """Have torch.compile run ``codes``, and what they call, as plain Python where they run outside its
    graphs: an op call a graph break leaves to Python (an output size that depends on the data, without
    ``capture_dynamic_output_shape_ops``). There it compiled opbridge's own code, slower than running it,
    and as one code object for every op, past its recompile limit. An op call traced into a graph
    (``fullgraph=True``, ``torch.export``) inlines the code, which this leaves as it is."""
    import torch

    eval_frame = getattr(torch._C, "_dynamo", None)
    eval_frame = getattr(eval_frame, "eval_frame", None)
    set_strategy = getattr(eval_frame, "set_code_exec_strategy", None)
    if set_strategy is None:  # (a torch without per-code strategies)
        return
    skip = eval_frame._FrameAction.SKIP  # type: ignore[union-attr]
    strategy = eval_frame._FrameExecStrategy(skip, skip)  # type: ignore[union-attr]
    for code in codes:
        set_strategy(code, strategy)


@contextmanager
def tracing_calls() -> Iterator[TracedCalls]:
    """Count op calls in this thread (used by export to prove no op call was lost)."""
    previous = _TRACE_STATE.counts
    counts = TracedCalls()
    _TRACE_STATE.counts = counts
    try:
        yield counts
    finally:
        _TRACE_STATE.counts = previous
