"""CPU kernels for custom ops that have no opbridge spec (models exported elsewhere).

``@opbridge.kernel`` attaches a Python kernel to an ONNX op identified only by
its domain and type, e.g. the ``MYSELU`` node that seed 000's unchanged script
writes in the default domain. Runtimes look kernels up with :func:`find_kernel`;
ops defined with ``@opbridge.op`` carry their own kernel (or run their reference).

Example (seed 000's script writes ``MYSELU`` in the default domain; the doc uses its own name):
    >>> import numpy as np, opbridge
    >>> @opbridge.kernel("DocSELU", domain="")
    ... def doc_selu(x, p, c, *, attr1="", attr2=(), attr3=0.0):
    ...     return x / (1.0 + np.exp(-x))
    >>> opbridge.find_kernel("", "DocSELU", 11).name
    'DocSELU'
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from opbridge._locks import ForkSafeLock
from opbridge.errors import OpDefinitionError

__all__ = ["KernelDef", "all_kernels", "find_kernel", "kernel", "later_kernel_note"]

F = TypeVar("F", bound=Callable[..., Any])

_LOCK = ForkSafeLock()
_KERNELS: dict[tuple[str, str, int], KernelDef] = {}


@dataclass(frozen=True)
class KernelDef:
    """A kernel for ``domain::name`` from opset version ``since_version`` on.

    ``fn(*inputs, **attributes)`` gets numpy arrays (``kind="numpy"``) or CPU
    torch tensors (``kind="torch"``), with ``None`` for omitted optional inputs
    (those left out at the node's end too, up to ``fn``'s positional parameters
    without a default: :meth:`pad_inputs`), and the node's attributes as Python values (strings decoded as UTF-8, lists
    as lists). It returns one array or a tuple, one per node output.
    """

    domain: str
    name: str
    since_version: int
    fn: Callable[..., Any]
    kind: str = "numpy"
    num_outputs: int | None = None

    @property
    def qualname(self) -> str:
        return f"{self.domain or '<default>'}::{self.name}"

    def pad_inputs(self, inputs: Sequence[Any], attributes: Collection[str]) -> tuple[Any, ...]:
        """``inputs`` with ``None`` for optional inputs a node leaves out at its end: in ONNX ``["x"]`` is
        ``["x", "", ""]``, so either gives ``fn`` its leading positional parameters without a default
        (other than ``attributes`` and ``out``).

        Example:
            >>> k = KernelDef("doc", "Sum3", 1, lambda a, b, c, *, scale=1.0: a)
            >>> k.pad_inputs([1.0], {"scale"})
            (1.0, None, None)
        """
        return (*inputs, *[None] * (_leading_positionals(self.fn, frozenset(attributes)) - len(inputs)))


def _leading_positionals(fn: Callable[..., Any], attributes: frozenset[str]) -> int:
    """How many positional parameters ``fn`` takes before its first with a default, its first attribute
    or ``out`` (0 where its signature cannot be read); kept per kernel, where it can be hashed."""
    try:
        return _leading_positionals_kept(fn, attributes)
    except TypeError:  # (a kernel object that cannot be hashed)
        return _count_leading_positionals(fn, attributes)


@functools.lru_cache(maxsize=256)
def _leading_positionals_kept(fn: Callable[..., Any], attributes: frozenset[str]) -> int:
    return _count_leading_positionals(fn, attributes)


def _count_leading_positionals(fn: Callable[..., Any], attributes: frozenset[str]) -> int:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    count = 0
    for p in parameters:
        positional = p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if not positional or p.default is not inspect.Parameter.empty or p.name in attributes or p.name == "out":
            break
        count += 1
    return count


def kernel(
    name: str,
    *,
    domain: str = "",
    since_version: int = 1,
    kind: str = "numpy",
    outputs: int | None = None,
) -> Callable[[F], F]:
    """Register a CPU kernel for the ONNX op ``domain::name`` (see :class:`KernelDef`).

    ``name`` may also be written ``"domain::name"``. ``outputs`` fixes the number
    of outputs when known (it is otherwise read from each node).
    """
    if not isinstance(name, str):
        raise OpDefinitionError(
            f"opbridge.kernel takes the op's name first, got {type(name).__name__}; write "
            "@opbridge.kernel('domain::Name') above the kernel."
        )
    if "::" in name:
        domain, name = name.split("::", 1)
    if not name.isidentifier():
        raise OpDefinitionError(f"kernel op type {name!r} is not a valid ONNX op type")
    if kind not in ("numpy", "torch"):
        raise OpDefinitionError(f"{domain}::{name}: kernel kind must be 'numpy' or 'torch', got {kind!r}")
    if not isinstance(since_version, int) or isinstance(since_version, bool) or since_version < 1:
        owner = domain or "the default domain"
        raise OpDefinitionError(
            f"{domain}::{name}: since_version must be an int >= 1 (the first opset version of {owner} the kernel "
            f"serves), got {since_version!r}; give it as a number, e.g. since_version=1."
        )

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise OpDefinitionError(
                f"{domain}::{name}: a kernel is a function fn(*arrays, **attrs), got {type(fn).__name__}."
            )
        entry = KernelDef(domain, name, since_version, fn, kind, outputs)
        with _LOCK:
            _KERNELS[(domain, name, since_version)] = entry
        return fn

    return decorate


def find_kernel(domain: str, name: str, version: int | None = None) -> KernelDef | None:
    """The kernel registered for ``domain::name`` with the highest since_version <= ``version``."""
    with _LOCK:
        found = [k for (d, n, _), k in _KERNELS.items() if d == domain and n == name]
    if version is not None:
        found = [k for k in found if k.since_version <= version]
    return max(found, key=lambda k: k.since_version, default=None)


def later_kernel_note(domain: str, name: str, version: int) -> str | None:
    """Why no kernel of ``domain::name`` serves opset ``version`` when kernels are registered only for later
    versions (None when there are none, or one serves it)."""
    with _LOCK:
        first = min((k.since_version for (d, n, _), k in _KERNELS.items() if d == domain and n == name), default=None)
    if first is None or first <= version:
        return None
    return (
        f'@opbridge.kernel("{name}", domain="{domain}") is registered only from opset version {first} on '
        f"(since_version={first}), but the model imports opset {version} of {domain or 'the default domain'}: "
        f"register it with since_version={version} or lower (since_version=1 serves every opset)."
    )


def all_kernels() -> list[KernelDef]:
    """Every kernel registered in this process."""
    with _LOCK:
        return sorted(_KERNELS.values(), key=lambda k: (k.domain, k.name, k.since_version))
