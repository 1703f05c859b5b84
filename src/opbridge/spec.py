"""Op specifications: the frozen, backend-neutral description of a custom op.

An :class:`OpSpec` says everything an exporter or runtime needs to know about an
op: its ONNX identity (domain, name, version), its tensor inputs and outputs,
and its attributes with their ONNX types and defaults. It is plain data: it
holds no torch, ONNX or runtime objects, so every backend can read it.

Example:
    >>> from opbridge.spec import AttrSpec, AttrType, InputSpec, OpSpec, OutputSpec
    >>> spec = OpSpec(
    ...     domain="acme", name="ScaledSwish", version=1,
    ...     inputs=(InputSpec("x"),), outputs=(OutputSpec("y"),),
    ...     attributes=(AttrSpec("beta", AttrType.FLOAT, 1.0),),
    ... )
    >>> spec.qualname
    'acme::ScaledSwish'
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opbridge.errors import OpCallError, OpDefinitionError

__all__ = [
    "ONNX_DOMAINS",
    "AttrSpec",
    "AttrType",
    "InputSpec",
    "OpSpec",
    "OutputSpec",
    "Tolerance",
    "parse_qualname",
    "valid_tolerance",
]

_NO_DEFAULT: Any = object()

#: The domains of ONNX's own ops (onnx's schema registry holds "", "ai.onnx.ml", "ai.onnx.preview" and
#: "ai.onnx.preview.training"; "ai.onnx" is another name of ""): no custom op may live there, and every
#: runtime runs its own op of a node there.
ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training"})


class AttrType(enum.Enum):
    """The attribute types an op may declare, named after ONNX's AttributeProto types.

    ``BOOL`` is stored in ONNX as an INT holding 0 or 1 (ONNX has no boolean attribute).
    """

    FLOAT = "float"
    INT = "int"
    BOOL = "bool"
    STRING = "str"
    FLOATS = "list[float]"
    INTS = "list[int]"
    STRINGS = "list[str]"

    @property
    def is_list(self) -> bool:
        return self in (AttrType.FLOATS, AttrType.INTS, AttrType.STRINGS)

    @property
    def onnx_name(self) -> str:
        """The ONNX AttributeProto type name (``BOOL`` is stored as ``INT``)."""
        return {
            AttrType.FLOAT: "FLOAT",
            AttrType.INT: "INT",
            AttrType.BOOL: "INT",
            AttrType.STRING: "STRING",
            AttrType.FLOATS: "FLOATS",
            AttrType.INTS: "INTS",
            AttrType.STRINGS: "STRINGS",
        }[self]


_FLOAT32_MAX = 3.4028234663852886e38


def _numpy_kind(value: Any) -> str:
    """numpy's kind code of a numpy scalar (``"f"``, ``"i"``, ``"u"``, ``"b"``...); ``""`` for any other value."""
    np = sys.modules.get("numpy")  # (a numpy scalar means numpy is imported)
    if np is None or not isinstance(value, np.generic):
        return ""
    return str(value.dtype.kind)


def _check_scalar(kind: AttrType, value: Any) -> Any:
    """Return ``value`` normalised to ``kind``'s scalar Python type, or raise TypeError.

    numpy scalars of the matching kind (``np.float32`` for a float, ``np.int64`` for an int, ``np.bool_``
    for a bool) are taken as the Python value they hold."""
    numpy_kind = _numpy_kind(value)
    if numpy_kind:
        wanted = {AttrType.FLOAT: "fiu", AttrType.FLOATS: "fiu", AttrType.INT: "iu", AttrType.INTS: "iu"}
        if numpy_kind in wanted.get(kind, ""):
            value = value.item()
        elif numpy_kind == "b" and kind is AttrType.BOOL:
            value = bool(value)
    if kind in (AttrType.FLOAT, AttrType.FLOATS):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        value = float(value)
        # (comparisons, not math.isfinite: torch.compile traces a float attribute as a symbolic one; NaN
        # first, which an ordering comparison of a symbolic float refuses)
        if value != value:
            return value
        if _FLOAT32_MAX < abs(value) < math.inf:
            raise OverflowError(f"{value!r} is beyond float32, which ONNX FLOAT attributes hold")
        return value
    if kind in (AttrType.INT, AttrType.INTS):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        if not -(2**63) <= value < 2**63:
            raise OverflowError(f"{value} is beyond int64, which ONNX INT attributes hold")
        return int(value)
    if kind is AttrType.BOOL:
        if not isinstance(value, bool):
            raise TypeError
        return value
    if not isinstance(value, str):
        raise TypeError
    value.encode("utf-8")  # (UnicodeEncodeError for a lone surrogate, which no UTF-8 attribute holds)
    return value


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: its name, type, (optional) default value and (optional) allowed values.

    ``choices``: the values the attribute may take (of a list attribute: each element), as a
    ``Literal[...]`` annotation declares them; every call, node and plugin field outside them is refused.

    Example:
        >>> mode = AttrSpec("mode", AttrType.STRING, "avg", choices=("avg", "max"))
        >>> mode.normalize("max")
        'max'
    """

    name: str
    type: AttrType
    default: Any = _NO_DEFAULT
    choices: tuple[Any, ...] | None = None
    #: no default: a call must give it. A field, not a property: torch.compile traces op calls, and
    #: torch 2.11's dynamo can neither read a frozen dataclass's property nor compare the sentinel.
    required: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "required", self.default is _NO_DEFAULT)
        if self.choices is None:
            return
        scalar = {AttrType.FLOATS: AttrType.FLOAT, AttrType.INTS: AttrType.INT, AttrType.STRINGS: AttrType.STRING}
        kind = scalar.get(self.type, self.type)
        if kind is AttrType.BOOL or isinstance(self.choices, (str, bytes)) or not self.choices:
            raise OpDefinitionError(
                f"attribute {self.name!r}: choices= takes a non-empty tuple of {kind.value} values"
                + (" (a bool attribute takes True and False already)" if kind is AttrType.BOOL else "")
                + f"; got {self.choices!r}."
            )
        try:
            choices = tuple(_check_scalar(kind, c) for c in self.choices)
        except (TypeError, OverflowError, UnicodeEncodeError):
            raise OpDefinitionError(
                f"attribute {self.name!r} is {self.type.value}, and its choices must be {kind.value} values; "
                f"got {self.choices!r}."
            ) from None
        object.__setattr__(self, "choices", choices)
        if not self.required:
            default = self.default if self.type.is_list else (self.default,)
            outside = [v for v in default if v not in choices]
            if outside:
                raise OpDefinitionError(
                    f"attribute {self.name!r}: the default {self.default!r} is not among its choices {choices}; "
                    "give a default among them."
                )

    def normalize(self, value: Any, op: str = "") -> Any:
        """Check ``value`` against this attribute's type and return it normalised.

        Lists come back as tuples (hashable, immutable). Raises
        :class:`~opbridge.errors.OpCallError` (a TypeError) with a message that names
        the op, the attribute and the expected type, or the values it may take.
        """
        try:
            if self.type.is_list:
                if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                    raise TypeError
                checked: Any = tuple(_check_scalar(self.type, v) for v in value)
            else:
                checked = _check_scalar(self.type, value)
        except OverflowError as exc:
            where = f"{op}: " if op else ""
            raise OpCallError(
                f"{where}attribute {self.name!r} = {exc}; pass a value within that range (or a tensor input)."
            ) from None
        except UnicodeEncodeError as exc:
            where = f"{op}: " if op else ""
            raise OpCallError(
                f"{where}attribute {self.name!r} holds text that is not valid Unicode (a lone surrogate "
                f"{exc.object[exc.start : exc.end]!r} at index {exc.start}), which an ONNX STRING attribute "
                "cannot hold (UTF-8); pass valid text, e.g. decode bytes with errors='replace'."
            ) from None
        except TypeError:
            where = f"{op}: " if op else ""
            article = "an" if self.type.value[0] in "aeiou" else "a"
            raise OpCallError(
                f"{where}attribute {self.name!r} expects {self.type.value}, got "
                f"{type(value).__name__} ({value!r}). Pass {article} {self.type.value}, e.g. "
                f"{self.name}={_example(self.type)}.{_traced_size_hint(value)}"
            ) from None
        self.check_choices(checked, op)
        return checked

    def outside_choices(self, value: Any) -> list[Any]:
        """The values among ``value`` (a normalised value; of a list attribute, its elements) that
        :attr:`choices` does not hold; ``[]`` for an attribute without choices."""
        if self.choices is None:
            return []
        return [v for v in (value if self.type.is_list else (value,)) if v not in self.choices]

    def check_choices(self, value: Any, op: str = "") -> None:
        """Raise :class:`~opbridge.errors.OpCallError` (naming ``op``) for a normalised value outside
        :attr:`choices`."""
        outside = self.outside_choices(value)
        if outside and self.choices is not None:
            where = f"{op}: " if op else ""
            which = f"holds {outside[0]!r}, which is" if self.type.is_list else f"= {outside[0]!r} is"
            example = [self.choices[0]] if self.type.is_list else self.choices[0]
            raise OpCallError(
                f"{where}attribute {self.name!r} {which} not one of the values it takes, {list(self.choices)}; "
                f"pass one of them, e.g. {self.name}={example!r}."
            )

    def to_onnx_value(self, value: Any) -> Any:
        """The value as written into an ONNX attribute (bool -> int, tuples -> lists)."""
        if self.type is AttrType.BOOL:
            return int(bool(value))
        if self.type.is_list:
            return list(value)
        return value

    def from_onnx_value(self, value: Any) -> Any:
        """The inverse of :meth:`to_onnx_value` (int -> bool for BOOL, lists -> tuples)."""
        if self.type is AttrType.BOOL:
            return bool(value)
        if self.type.is_list:
            return tuple(value)
        return value


def _traced_size_hint(value: Any) -> str:
    """What to say of a 0-d tensor given for an attribute: the TorchScript exporter traces sizes such as
    ``x.shape[0]`` as tensors, where eager PyTorch gives an int, and makes a Python number given as an
    example input of the model a tensor input."""
    if type(value).__name__ != "Tensor" or getattr(value, "ndim", None) != 0:
        return ""
    return (
        " An attribute is a constant of the ONNX node: where this value comes from a size (x.shape[0]), the "
        "TorchScript exporter traces it as a tensor; pass a constant, or take the value as a tensor input "
        "if it must follow the input's shape; where it is a Python number given as an example input of the "
        "model (export(model, (x, 3.0))), the exporter made it a tensor input: make it a constant of the "
        "model, or export with exporter='dynamo'."
    )


def _example(kind: AttrType) -> str:
    return {
        AttrType.FLOAT: "1.0",
        AttrType.INT: "1",
        AttrType.BOOL: "True",
        AttrType.STRING: "'text'",
        AttrType.FLOATS: "[1.0, 2.0]",
        AttrType.INTS: "[1, 2]",
        AttrType.STRINGS: "['a', 'b']",
    }[kind]


@dataclass(frozen=True)
class InputSpec:
    """A tensor input. ``optional`` inputs may be ``None`` (an empty input name in ONNX)."""

    name: str
    optional: bool = False


@dataclass(frozen=True)
class OutputSpec:
    """A tensor output."""

    name: str


def valid_tolerance(value: object) -> bool:
    """Whether ``value`` can be an rtol or atol: a real number, finite and >= 0.

    >>> [valid_tolerance(v) for v in (1e-3, 0, float("inf"), -1.0, True)]
    [True, True, False, False, False]
    """
    try:
        return not isinstance(value, bool) and math.isfinite(value) and value >= 0  # type: ignore[arg-type,operator]
    except TypeError:  # not a real number
        return False


@dataclass(frozen=True)
class Tolerance:
    """Comparison tolerance: ``|a - b| <= atol + rtol * |b|``; both finite and >= 0.

    An infinite tolerance would pass any value (and ``inf * 0`` is NaN), so it is refused.
    """

    rtol: float = 1e-3
    atol: float = 1e-5

    def __post_init__(self) -> None:
        if not (valid_tolerance(self.rtol) and valid_tolerance(self.atol)):
            raise ValueError(
                f"Tolerance(rtol={self.rtol!r}, atol={self.atol!r}): tolerances must be finite numbers >= 0 "
                "(an infinite one would pass any value); give e.g. Tolerance(rtol=1e-3, atol=1e-5)."
            )


def parse_qualname(qualname: str) -> tuple[str, str]:
    """Split ``"domain::Name"`` into ``(domain, name)``; raise a helpful error otherwise."""
    if isinstance(qualname, str) and qualname.count("::") > 1:
        raise OpDefinitionError(
            f"op name {qualname!r} has {qualname.count('::')} '::'; write it 'domain::Name' with one, e.g. "
            "'acme::ScaledSwish' (a domain nests with dots: 'com.acme::ScaledSwish')."
        )
    if not isinstance(qualname, str) or qualname.count("::") != 1:
        raise OpDefinitionError(
            f"op name {qualname!r} must be written 'domain::Name' (e.g. 'acme::ScaledSwish'); "
            "a custom op without a domain lands in ONNX's default domain, which every runtime rejects."
        )
    domain, name = qualname.split("::")
    if not domain:
        raise OpDefinitionError(f"op name {qualname!r} has an empty domain; write it as 'mydomain::{name}'.")
    if domain in ONNX_DOMAINS | {"onnx", "ai.onnx.training", "com.microsoft"}:
        owner = "ONNX Runtime's" if domain == "com.microsoft" else "ONNX's"
        raise OpDefinitionError(
            f"op name {qualname!r}: domain {domain!r} is {owner} own (runtimes run their own ops there); choose a "
            f"domain of your own, e.g. 'acme::{name}'."
        )
    if not (name.isascii() and name.isidentifier()):
        raise OpDefinitionError(
            f"op name {qualname!r}: {name!r} is not a valid op type; use ASCII letters, digits and '_' "
            "(PyTorch's op names are ASCII)."
        )
    if not all(part.isascii() and part.isidentifier() for part in domain.split(".")):
        raise OpDefinitionError(
            f"op name {qualname!r}: domain {domain!r} must be dot-separated ASCII identifiers, e.g. 'com.acme'."
        )
    return domain, name


@dataclass(frozen=True)
class OpSpec:
    """The frozen description of a custom op.

    Attributes:
        domain: ONNX domain, e.g. ``"acme"``.
        name: ONNX op type, e.g. ``"ScaledSwish"``.
        version: opset version of the domain that defines the op.
        inputs: tensor inputs in call order.
        outputs: tensor outputs in return order.
        attributes: attributes in call order, with types and defaults.
        tolerances: comparison tolerance per dtype name (``"float32"``, ``"float16"``,
            ...); dtypes not listed use :class:`Tolerance`'s defaults.
        doc: a one-line description (the reference function's docstring).
        shape_rule: the output shape/dtype rule (see :mod:`opbridge.shape`), or None
            when it is derived from the reference.
    """

    domain: str
    name: str
    version: int = 1
    inputs: tuple[InputSpec, ...] = ()
    outputs: tuple[OutputSpec, ...] = (OutputSpec("output"),)
    attributes: tuple[AttrSpec, ...] = ()
    tolerances: Mapping[str, Tolerance] = field(default_factory=dict, hash=False, compare=False)
    doc: str = ""
    shape_rule: Callable[..., Any] | None = field(default=None, hash=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise OpDefinitionError(f"{self.qualname}: version must be an int >= 1, got {self.version!r}")
        if not self.outputs:
            raise OpDefinitionError(f"{self.qualname}: an op needs at least one output")
        names = [p.name for p in self.inputs] + [a.name for a in self.attributes]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise OpDefinitionError(f"{self.qualname}: parameter names repeat: {sorted(dup)}")
        outs = [o.name for o in self.outputs]
        bad = [n for n in outs if not isinstance(n, str) or not n.strip()]
        clash = sorted({n for n in outs if outs.count(n) > 1} | (set(outs) & {p.name for p in self.inputs}))
        if bad or clash:
            raise OpDefinitionError(
                f"{self.qualname}: output names {outs} must be distinct non-empty names, none an input's name "
                "(they name the values of the op's ONNX schema and function body); "
                f"{'bad: ' + repr(bad) if bad else 'repeated: ' + repr(clash)}. Pass e.g. outputs=('values', 'indices')."
            )

    @property
    def qualname(self) -> str:
        """``"domain::Name"``."""
        return f"{self.domain}::{self.name}"

    @property
    def key(self) -> tuple[str, str, int]:
        """``(domain, name, version)``: how runtimes look the op up."""
        return (self.domain, self.name, self.version)

    def attribute(self, name: str) -> AttrSpec:
        for attr in self.attributes:
            if attr.name == name:
                return attr
        raise KeyError(f"{self.qualname} has no attribute {name!r}")

    def tolerance(self, dtype: str) -> Tolerance:
        """Tolerance declared for ``dtype`` (e.g. ``"float16"``), else the default."""
        return self.tolerances.get(dtype, Tolerance())

    def bind_attributes(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Check and complete attribute values: defaults filled in, types checked.

        Raises :class:`~opbridge.errors.OpCallError` naming the op and attribute on a
        wrong type, an unknown attribute or a missing required one.
        """
        unknown = set(given) - {a.name for a in self.attributes}
        if unknown:
            raise OpCallError(
                f"{self.qualname}: unknown attribute(s) {sorted(unknown)}; "
                f"the op takes {[a.name for a in self.attributes]}."
            )
        out: dict[str, Any] = {}
        for attr in self.attributes:
            if attr.name in given:
                out[attr.name] = attr.normalize(given[attr.name], self.qualname)
            elif attr.required:
                raise OpCallError(f"{self.qualname}: missing required attribute {attr.name!r}.")
            else:
                out[attr.name] = attr.normalize(attr.default, self.qualname)
        return out
