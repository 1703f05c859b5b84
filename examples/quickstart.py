"""Define a custom op, export it with both exporters, run it in ONNX Runtime and verify parity.

Run: python examples/quickstart.py [OUTPUT_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import opbridge


@opbridge.op("acme::ScaledSwish")
def scaled_swish(x: torch.Tensor, beta: float = 1.0, tag: str = "") -> torch.Tensor:
    """x * sigmoid(beta * x): the body is the PyTorch reference."""
    return x * torch.sigmoid(beta * x)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scaled_swish(self.conv(x), beta=2.0, tag="这是字符串属性")


def factory() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """What ``opbridge verify --reference examples/quickstart.py:factory`` calls."""
    torch.manual_seed(0)
    return Model().eval(), (torch.randn(2, 3, 32, 32),)


def main(out_dir: Path) -> int:
    model, (x,) = factory()
    batch = torch.export.Dim("batch")
    dynamo = opbridge.export(model, (x,), out_dir / "dynamo.onnx", dynamic_shapes=({0: batch},))
    legacy = opbridge.export(
        model, (x,), out_dir / "torchscript.onnx", exporter="torchscript", dynamic_axes={"x": {0: "batch"}}
    )
    for result in (dynamo, legacy):
        print(result.summary())
        session = opbridge.InferenceSession(result.path)
        (y,) = session.run(None, {"x": x.numpy()})
        print("  kernels:", {name: k.path for name, k in session.kernels.items()})
        print("  max abs error vs PyTorch:", float(np.abs(y - model(x).detach().numpy()).max()))
    record = opbridge.verify(dynamo.path, reference=(model, (x,)), shapes=[{"x": (5, 3, 32, 32)}])
    print(record.table())
    return record.exit_code


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="opbridge_quickstart_"))
    sys.exit(main(target))
