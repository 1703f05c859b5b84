"""Shape rules evaluated with TensorRT dimension expressions.

:class:`TrtDim` wraps an ``IDimensionExpr`` so a shape rule written for torch or
ONNX (``x.shape[0] * 2``, ``size.shape[-1]``...) builds TensorRT expressions
through the ``IExprBuilder``. Dims TensorRT knows to be constant come to the rule
as plain ints, so rules that branch on static dims (broadcasting) work as well.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrtDim", "to_expr", "wrap_dim"]


def _binary(name: str, reflected: bool = False) -> Any:
    """A ``TrtDim`` operator method applying ``DimensionOperation.<name>``."""

    def method(self: TrtDim, other: Any) -> Any:
        expr = self._other(other)
        if expr is None:
            return NotImplemented
        return self._op(name, expr, self.expr) if reflected else self._op(name, self.expr, expr)

    return method


class TrtDim:
    """A dynamic TensorRT dim inside a shape rule; supports ``+ - * // %``, unary ``-`` and ``==`` with
    ints and dims (equal where TensorRT proves it)."""

    __slots__ = ("builder", "expr", "label", "ops")

    def __init__(self, expr: Any, builder: Any, ops: Any, label: str = "") -> None:
        self.expr, self.builder, self.ops, self.label = expr, builder, ops, label

    def __repr__(self) -> str:
        # (where it comes from: two inputs' dims of other ONNX names print apart, and are not equal)
        return f"TrtDim({self.label or '<computed>'})"

    def _other(self, other: Any) -> Any:
        if isinstance(other, TrtDim):
            return other.expr
        if isinstance(other, int) and not isinstance(other, bool):
            return self.builder.constant(int(other))
        return None

    def _op(self, name: str, a: Any, b: Any) -> Any:
        return wrap_dim(self.builder.operation(getattr(self.ops, name), a, b), self.builder, self.ops)

    __add__ = _binary("SUM")
    __radd__ = _binary("SUM", True)
    __sub__ = _binary("SUB")
    __rsub__ = _binary("SUB", True)
    __mul__ = _binary("PROD")
    __rmul__ = _binary("PROD", True)
    __floordiv__ = _binary("FLOOR_DIV")
    __rfloordiv__ = _binary("FLOOR_DIV", True)

    def __neg__(self) -> Any:
        return self._op("SUB", self.builder.constant(0), self.expr)

    def __mod__(self, other: Any) -> Any:
        if self._other(other) is None:
            return NotImplemented
        return self - (self // other) * other

    def __rmod__(self, other: Any) -> Any:
        if self._other(other) is None:
            return NotImplemented
        return other - (other // self) * self

    def __eq__(self, other: object) -> bool:
        """True where TensorRT proves the dims equal (dims of one named ONNX dim, say), else False:
        as a SymDim, whose unknown dims compare unequal."""
        expr = self._other(other)
        if expr is None:
            return False
        same = self.builder.operation(self.ops.EQUAL, self.expr, expr)
        return bool(same.is_constant() and same.get_constant_value() == 1)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise TypeError(
            "a dynamic TensorRT dim has no value while the engine is built: a shape rule cannot branch on it. "
            "Compute output dims arithmetically (+ - * //) from input dims."
        )

    def __int__(self) -> int:
        raise TypeError("a dynamic TensorRT dim has no int value while the engine is built.")

    __index__ = __int__

    def __lt__(self, other: Any) -> bool:
        return self.__bool__()

    __le__ = __gt__ = __ge__ = __lt__


def wrap_dim(expr: Any, builder: Any, ops: Any, label: str = "") -> int | TrtDim:
    """An ``IDimensionExpr`` as the rule sees it: an int when constant, else a :class:`TrtDim` (``label``:
    where it comes from, for messages, e.g. ``x.shape[0]``)."""
    if expr.is_constant():
        return int(expr.get_constant_value())
    return TrtDim(expr, builder, ops, label)


def to_expr(dim: Any, builder: Any) -> Any:
    """A rule's output dim back to an ``IDimensionExpr``; raise TypeError on anything else."""
    if isinstance(dim, TrtDim):
        return dim.expr
    if isinstance(dim, int) and not isinstance(dim, bool):
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
        import operator

        return builder.constant(operator.index(dim))
    except TypeError:
        raise TypeError(
            f"output dim {dim!r} ({type(dim).__name__}) is not an int or an input dim; "
            "build output dims from input dims with + - * // and ints"
        ) from None
