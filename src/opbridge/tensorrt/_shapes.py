"""Shape rules evaluated with TensorRT dimension expressions.

:class:`TrtDim` wraps an ``IDimensionExpr`` so a shape rule written for torch or
ONNX (``x.shape[0] * 2``, ``size.shape[-1]``...) builds TensorRT expressions
through the ``IExprBuilder``. Dims static in the model come to the rule as plain ints, so a
rule may branch on those (broadcasting against a static 1). A dynamic dim comes as a
:class:`TrtDim` when the parser asks (and again while the engine is built, unless the profile
fixes it: min == max); it has no value then: a comparison TensorRT cannot decide
(``x.shape[1] == 1``) and any branch on it (``if``, ``<``, ``int()``) raise
:class:`DynamicDimError`. Each :class:`TrtDim` also computes its value from concrete input
shapes (:func:`evaluate`), so the build checks the expressions against the rule run at the
profile's corners.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["DynamicDimError", "TrtDim", "evaluate", "input_dim", "to_expr", "wrap_dim"]

# a dim's value from the concrete shapes of the plugin's inputs
Value = Callable[[Sequence[Sequence[int]]], int]

_FIX = (
    "write the rule without branching on dynamic dims (output dims computed with + - * // from input dims), "
    "or make that dim static in the model (a fixed size at export), which makes it an int in the rule"
)


class DynamicDimError(TypeError):
    """A shape rule asked for the value of a dynamic dim, which TensorRT does not have while building."""


def _binary(name: str, fn: Callable[[int, int], int], reflected: bool = False) -> Any:
    """A ``TrtDim`` operator method applying ``DimensionOperation.<name>`` (``fn`` on values)."""

    def method(self: TrtDim, other: Any) -> Any:
        if self._other(other) is None:
            return NotImplemented
        return self._op(name, fn, other, self) if reflected else self._op(name, fn, self, other)

    return method


def _value(dim: Any) -> Value | None:
    """``dim``'s value function: a constant's, or a :class:`TrtDim`'s (None where it has none)."""
    if isinstance(dim, TrtDim):
        return dim.value
    n = int(dim)

    def constant(shapes: Sequence[Sequence[int]]) -> int:
        return n

    return constant


def input_dim(i: int, k: int) -> Value:
    """The value function of dim ``k`` of the plugin's input ``i``."""

    def value(shapes: Sequence[Sequence[int]]) -> int:
        return int(shapes[i][k])

    return value


class TrtDim:
    """A dynamic TensorRT dim inside a shape rule; supports ``+ - * // %``, unary ``-`` and ``==`` with
    ints and dims (equal where TensorRT proves it)."""

    __slots__ = ("builder", "expr", "label", "ops", "value")

    def __init__(self, expr: Any, builder: Any, ops: Any, label: str = "", value: Value | None = None) -> None:
        self.expr, self.builder, self.ops, self.label, self.value = expr, builder, ops, label, value

    def __repr__(self) -> str:
        # (where it comes from: two inputs' dims of other ONNX names print apart, and are not equal)
        return f"TrtDim({self.label or '<computed>'})"

    def _other(self, other: Any) -> Any:
        if isinstance(other, TrtDim):
            return other.expr
        if isinstance(other, int) and not isinstance(other, bool):
            return self.builder.constant(int(other))
        return None

    def _op(self, name: str, fn: Callable[[int, int], int], a: Any, b: Any) -> Any:
        """``a <name> b`` (each a dim or an int) as a dim, with its value function."""
        expr = self.builder.operation(getattr(self.ops, name), self._other(a), self._other(b))
        va, vb = _value(a), _value(b)
        value = None if va is None or vb is None else (lambda shapes: fn(va(shapes), vb(shapes)))
        return wrap_dim(expr, self.builder, self.ops, value=value)

    __add__ = _binary("SUM", operator.add)
    __radd__ = _binary("SUM", operator.add, True)
    __sub__ = _binary("SUB", operator.sub)
    __rsub__ = _binary("SUB", operator.sub, True)
    __mul__ = _binary("PROD", operator.mul)
    __rmul__ = _binary("PROD", operator.mul, True)
    __floordiv__ = _binary("FLOOR_DIV", operator.floordiv)
    __rfloordiv__ = _binary("FLOOR_DIV", operator.floordiv, True)

    def __neg__(self) -> Any:
        return self._op("SUB", operator.sub, 0, self)

    def __mod__(self, other: Any) -> Any:
        if self._other(other) is None:
            return NotImplemented
        return self - (self // other) * other

    def __rmod__(self, other: Any) -> Any:
        if self._other(other) is None:
            return NotImplemented
        return other - (other // self) * self

    def __eq__(self, other: object) -> bool:
        """Whether TensorRT proves the dims equal (dims of one named ONNX dim, say) or unequal; raise
        :class:`DynamicDimError` where it can tell neither (a dynamic dim against ``1``, say)."""
        expr = self._other(other)
        if expr is None:
            return False
        same = self.builder.operation(self.ops.EQUAL, self.expr, expr)
        if not same.is_constant():
            raise DynamicDimError(
                f"the shape rule compares {self!r} with {other!r}, which TensorRT cannot decide while the engine "
                f"is built ({self.label or 'the dim'} is dynamic); {_FIX}."
            )
        return bool(same.get_constant_value() == 1)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise DynamicDimError(
            f"{self!r} is a dynamic TensorRT dim, which has no value while the engine is built: a shape rule "
            f"cannot branch on it; {_FIX}."
        )

    def __int__(self) -> int:
        raise DynamicDimError(f"{self!r} is a dynamic TensorRT dim, which has no int value while the engine is built.")

    __index__ = __int__

    def __lt__(self, other: Any) -> bool:
        return self.__bool__()

    __le__ = __gt__ = __ge__ = __lt__


def wrap_dim(expr: Any, builder: Any, ops: Any, label: str = "", value: Value | None = None) -> int | TrtDim:
    """An ``IDimensionExpr`` as the rule sees it: an int when constant, else a :class:`TrtDim` (``label``:
    where it comes from, for messages, e.g. ``x.shape[0]``; ``value``: its value from concrete input shapes)."""
    if expr.is_constant():
        return int(expr.get_constant_value())
    return TrtDim(expr, builder, ops, label, value)


def evaluate(dim: Any, shapes: Sequence[Sequence[int]]) -> int | None:
    """The value of a rule's output ``dim`` (an int, a :class:`TrtDim` or its value function) for inputs of
    concrete ``shapes``; None where it has no value function or its expression fails there (a division by 0)."""
    value = dim.value if isinstance(dim, TrtDim) else dim
    if value is None:
        return None
    if not callable(value):
        return int(value)
    try:
        return int(value(shapes))
    except (ArithmeticError, IndexError):
        return None


def to_expr(dim: Any, builder: Any) -> Any:
    """A rule's output dim back to an ``IDimensionExpr``; raise TypeError on anything else."""
    if isinstance(dim, TrtDim):
        return dim.expr
    if isinstance(dim, bool):  # (an int to operator.index, but no size a rule means)
        raise TypeError(f"output dim {dim!r} is a bool, not a size; give an int or an input dim")
    if isinstance(dim, int):
        if dim < 0:
            raise TypeError(f"output dim {dim} is negative")
        return builder.constant(int(dim))
    from opbridge.shape import SymDim

    if isinstance(dim, SymDim):
        raise TypeError(
            "the size depends on the data (SymDim()), which the generated plugins cannot give TensorRT; "
            "give the op a fixed-size output (padded, as TRTBatchedNMS does) for TensorRT"
        )
    try:
        return builder.constant(operator.index(dim))
    except TypeError:
        raise TypeError(
            f"output dim {dim!r} ({type(dim).__name__}) is not an int or an input dim; "
            "build output dims from input dims with + - * // and ints"
        ) from None
