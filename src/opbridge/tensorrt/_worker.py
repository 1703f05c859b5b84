"""Child process of :mod:`opbridge.tensorrt._build`: ``python -m opbridge.tensorrt._worker REQUEST RESULT``."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from opbridge.errors import OpbridgeError


def _end_with_caller() -> None:
    """On Linux, have the kernel kill this process when its caller ends (even by SIGKILL), and end now
    where the caller (its id in OPBRIDGE_TENSORRT_WORKER) is already gone."""
    caller = os.environ.get("OPBRIDGE_TENSORRT_WORKER", "")
    if not sys.platform.startswith("linux") or not caller.isdigit():
        return
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    pr_set_pdeathsig = 1
    if prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if os.getppid() != int(caller):
        os._exit(1)  # the caller ended before the request above took effect (this process was reparented)


def main(argv: list[str]) -> int:
    """Run the request in ``argv[0]``; write the report to ``argv[1]``."""
    _end_with_caller()
    request_path, result_path = Path(argv[0]), Path(argv[1])
    request = json.loads(request_path.read_text())
    from opbridge.tensorrt import _loader
    from opbridge.tensorrt._build import _work

    # the caller removes its folder even where it has to kill this process; a folder of our own would stay
    _loader._STAND_IN_PARENT = str(request_path.parent)
    try:
        result = _work(request, echo=True)
    except OpbridgeError as exc:
        # raised again in the calling process as the same kind of error (TensorRT missing, a bad model...)
        result = {
            "ok": False,
            "backend": "?",
            "errors": [["", "", str(exc)]],
            "usage_error": True,
            "error_type": type(exc).__name__,
        }
    result_path.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
