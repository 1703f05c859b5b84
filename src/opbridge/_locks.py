"""Module locks that a forked child gets unlocked.

``os.fork`` copies a lock in whatever state it is in, and the thread holding it does not exist in
the child: a registry lock taken by another thread at the moment of the fork would hang the child
at its first op lookup. Locks made here are replaced by fresh ones in every forked child.
"""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType
from typing import Any

__all__ = ["ForkSafeLock"]

_ALL: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()
_HOOKED = False


class ForkSafeLock:
    """A ``threading.Lock`` (``RLock`` with ``reentrant=True``) renewed in forked children."""

    def __init__(self, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._lock: Any = threading.RLock() if reentrant else threading.Lock()
        global _HOOKED
        if not _HOOKED and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_renew_all)
            _HOOKED = True
        _ALL.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return bool(self._lock.acquire(blocking, timeout))

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _renew_all() -> None:
    for lock in list(_ALL):
        lock._lock = threading.RLock() if lock._reentrant else threading.Lock()
