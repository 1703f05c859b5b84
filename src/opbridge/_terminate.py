"""SIGTERM as an exception: a block that writes temporary files, or runs a worker, unwinds on it.

By default SIGTERM ends the process where it stands: a temporary file being written (gigabytes, beside the
user's output), a worker process or a temporary folder stays behind. Inside :func:`sigterm_unwinds`, a
SIGTERM raises :class:`Terminated` instead, so that the ``finally`` and ``except BaseException`` blocks on
the way clean up; then the process ends as SIGTERM would have ended it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

__all__ = ["Terminated", "sigterm_unwinds"]

logger = logging.getLogger(__name__)


class Terminated(BaseException):
    """A SIGTERM came inside :func:`sigterm_unwinds`; a BaseException, as it ends the process: no
    ``except Exception`` on the way should take it for a failure of the work."""


@contextlib.contextmanager
def sigterm_unwinds(*, exit_code: int | None = None) -> Iterator[None]:
    """While inside, a SIGTERM to this process unwinds the block, and then ends the process as SIGTERM
    would have (with ``exit_code``: by ``SystemExit(exit_code)`` instead, so that the interpreter's exit
    handlers run too). Only in the main thread (the only one that may set handlers) and where SIGTERM has
    its default action: a caller's own handler, or SIG_IGN, stays in charge (an enclosing
    ``sigterm_unwinds`` included)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        logger.debug("SIGTERM: the work unwound, its temporary files removed; ending as SIGTERM does")
        if exit_code is not None:
            raise SystemExit(exit_code) from None
        signal.raise_signal(signal.SIGTERM)
        raise  # not reached: SIGTERM's default action ends the process
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
