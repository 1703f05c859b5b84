"""Child process of :mod:`opbridge.tensorrt._build`: ``python -m opbridge.tensorrt._worker REQUEST RESULT``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from opbridge.errors import OpbridgeError


def main(argv: list[str]) -> int:
    request_path, result_path = Path(argv[0]), Path(argv[1])
    request = json.loads(request_path.read_text())
    from opbridge.tensorrt._build import _work

    try:
        result = _work(request)
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
