"""The seed articles' models, rebuilt around opbridge's built-in ops.

Each factory returns ``(model, example_inputs)`` and is what ``opbridge verify
--reference opbridge.examples.seeds:NAME`` expects. :data:`SEED_MODELS` lists
them with their export settings.

Example:
    >>> from opbridge.examples.seeds import myselu_model
    >>> model, (x,) = myselu_model()
    >>> tuple(model(x).shape)
    (2, 1, 8, 8)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from opbridge.ops import DynamicResize, MySELU, MyStrangeOp, MyStrangeOp2

__all__ = [
    "SEED_MODELS",
    "MySELUModel",
    "MyStrangeNet",
    "MyStrangeNet2",
    "SeedModel",
    "StrangeSuperResolutionNet",
    "myselu_model",
    "strange_net",
    "strange_net2",
    "super_resolution_net",
]


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class MySELUModel(nn.Module):
    """Seed 000: Conv2d(1, 1, 3) followed by MySELU with a parameter and a constant input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)
        self.param = nn.Parameter(torch.arange(3).float())
        nn.init.ones_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)  # type: ignore[arg-type]  # Conv2d has a bias here
        # the constant input (a buffer: a tensor built in forward would be traced as a constant with a warning)
        self.register_buffer("const", torch.tensor([3.0, 2.0, 1.0]), persistent=False)
        self.const: torch.Tensor

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.conv(image)
        return MySELU(x, self.param, self.const, attr1="这是字符串属性", attr2=[1, 2, 3], attr3=222.0)


class MyStrangeNet(nn.Module):
    """Seed 004: two MyStrangeOp layers (two outputs each) and convolutions."""

    def __init__(self) -> None:
        super().__init__()
        g = _seeded(4)
        self.w1 = nn.Parameter(torch.rand(1, 3, 4, 4, generator=g) + 0.5)
        self.b1 = nn.Parameter(torch.rand(1, 3, 4, 4, generator=g))
        self.w2 = nn.Parameter(torch.rand(1, 3, 4, 4, generator=g) + 0.5)
        self.b2 = nn.Parameter(torch.rand(1, 3, 4, 4, generator=g))
        self.conv1 = nn.Conv2d(3, 3, kernel_size=3, padding=1)

    def forward(self, inputTensor: torch.Tensor) -> torch.Tensor:
        x1, x2 = MyStrangeOp(inputTensor, self.w1, self.b1, float_attr=[0.1, 0.5], int_attr=[2, 2])
        x3, x4 = MyStrangeOp(inputTensor, self.w2, self.b2, float_attr=[0.5, 0.5], int_attr=[3, 3])
        return self.conv1(x1) + self.conv1(x2) + self.conv1(x3) + self.conv1(x4)


class MyStrangeNet2(nn.Module):
    """Seed 004: two MyStrangeOp2 layers over four inputs."""

    def __init__(self) -> None:
        super().__init__()
        g = _seeded(5)
        self.bias1 = nn.Parameter(torch.rand(1, 3, 4, 4, generator=g))
        self.bias2 = nn.Parameter(torch.rand(1, 3, 4, 4, generator=g))
        self.conv1 = nn.Conv2d(3, 3, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(3, 3, kernel_size=3, padding=1)

    def forward(
        self, input1: torch.Tensor, input2: torch.Tensor, input3: torch.Tensor, input4: torch.Tensor
    ) -> torch.Tensor:
        x1 = MyStrangeOp2(input1, input2, self.bias1, int_attr1=10, int_attr2=[3, 5], str_attr3="first")
        x2 = MyStrangeOp2(input3, input4, self.bias2, int_attr1=40, int_attr2=[12, 22], str_attr3="second")
        return self.conv1(x1) + self.conv2(x2)


class StrangeSuperResolutionNet(nn.Module):
    """Seed 001: SRCNN layers after a DynamicResize to the size of ``size_tensor``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=9, padding=4)
        self.conv2 = nn.Conv2d(64, 32, kernel_size=1, padding=0)
        self.conv3 = nn.Conv2d(32, 3, kernel_size=5, padding=2)
        self.relu = nn.ReLU()

    def forward(self, input: torch.Tensor, size_tensor: torch.Tensor) -> torch.Tensor:
        x = DynamicResize(input, size_tensor, align_corners=False)
        out = self.relu(self.conv1(x))
        out = self.relu(self.conv2(out))
        return self.conv3(out)


def _init(model: nn.Module, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.Conv2d) and m is not getattr(model, "conv", None):
            m.reset_parameters()
    return model.eval()


def myselu_model() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Seed 000's model and an example input (batch 2, 8x8)."""
    model = MySELUModel().eval()
    return model, (torch.randn(2, 1, 8, 8, generator=_seeded(0)),)


def strange_net() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Seed 004's MyStrangeNet and an example input."""
    return _init(MyStrangeNet(), 4), (torch.randn(2, 3, 4, 4, generator=_seeded(1)),)


def strange_net2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Seed 004's MyStrangeNet2 and four example inputs."""
    g = _seeded(2)
    return _init(MyStrangeNet2(), 5), tuple(torch.randn(2, 3, 4, 4, generator=g) for _ in range(4))


def super_resolution_net() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Seed 001's StrangeSuperResolutionNet, a 2x3x16x16 input and a 2x1x32x32 size tensor."""
    g = _seeded(3)
    return _init(StrangeSuperResolutionNet(), 1), (
        torch.rand(2, 3, 16, 16, generator=g),
        torch.rand(2, 1, 32, 32, generator=g),
    )


@dataclass(frozen=True)
class SeedModel:
    """A seed model with its export settings.

    ``dynamic`` maps each input name to ``{axis: dim_name}``; ``shapes`` gives
    further input shapes to test beyond the example's.
    """

    name: str
    factory: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic: dict[str, dict[int, str]]
    shapes: tuple[dict[str, tuple[int, ...]], ...]
    output_dynamic: dict[str, dict[int, str]] | None = None

    @property
    def reference(self) -> str:
        """The factory's ``module:function`` path for ``--reference``."""
        return f"{__name__}:{self.factory.__name__}"

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """TorchScript-style dynamic axes, outputs included."""
        axes = {k: dict(v) for k, v in self.dynamic.items()}
        axes.update({k: dict(v) for k, v in (self.output_dynamic or {}).items()})
        return axes

    def dynamic_shapes(self) -> tuple[Any, ...]:
        dims: dict[str, Any] = {}
        out: list[dict[int, Any] | None] = []
        for name in self.input_names:
            axes = self.dynamic.get(name)
            if not axes:
                out.append(None)
                continue
            out.append({a: dims.setdefault(d, torch.export.Dim(d)) for a, d in axes.items()})
        return tuple(out)


_BHW = {0: "batch", 2: "height", 3: "width"}

SEED_MODELS: tuple[SeedModel, ...] = (
    SeedModel(
        "myselu",
        myselu_model,
        ("image",),
        ("output",),
        {"image": _BHW},
        ({"image": (1, 1, 5, 7)}, {"image": (3, 1, 12, 9)}),
        {"output": _BHW},
    ),
    SeedModel(
        "strange_net",
        strange_net,
        ("inputTensor",),
        ("outputTensor",),
        {"inputTensor": {0: "batch"}},
        ({"inputTensor": (1, 3, 4, 4)}, {"inputTensor": (5, 3, 4, 4)}),
    ),
    SeedModel(
        "strange_net2",
        strange_net2,
        ("input1", "input2", "input3", "input4"),
        ("outputTensor",),
        {f"input{i}": {0: "batch"} for i in range(1, 5)},
        (
            {f"input{i}": (1, 3, 4, 4) for i in range(1, 5)},
            {f"input{i}": (4, 3, 4, 4) for i in range(1, 5)},
        ),
    ),
    SeedModel(
        "super_resolution",
        super_resolution_net,
        ("input", "size_tensor"),
        ("output",),
        {"input": _BHW, "size_tensor": {0: "size_batch", 2: "out_height", 3: "out_width"}},
        (
            {"input": (1, 3, 12, 20), "size_tensor": (1, 1, 48, 40)},
            {"input": (3, 3, 24, 24), "size_tensor": (3, 1, 17, 13)},
        ),
        {"output": {0: "batch", 2: "out_height", 3: "out_width"}},
    ),
)
