"""Built-in ops: the custom ops of the seed articles, defined once with ``@opbridge.op``.

* :data:`MySELU` (``opbridge::MySELU``): ``x * sigmoid(x)`` with a parameter input,
  a constant input, a UTF-8 string, an int-list and a float attribute.
* :data:`MyStrangeOp` (``opbridge::MyStrangeOp``): three inputs, two outputs
  ``(x + w, x * w + b)``, float-list and int-list attributes.
* :data:`MyStrangeOp2` (``opbridge::MyStrangeOp2``): ``a + b - bias`` with int,
  int-list and string attributes.
* :data:`DynamicResize` (``Test::DynamicTRTResize``): bicubic resize of ``input``
  to the spatial size of the shape-only input ``size_tensor``.

and the detection ops of :mod:`opbridge.ops.detection` (domain ``mmdeploy``, with
MMDeploy's op names): ``grid_sampler``, ``MMCVModulatedDeformConv2d``,
``MMCVRoiAlign``, ``MMCVMultiLevelRoiAlign`` and ``TRTBatchedNMS``.

Importing this module defines the ops (it touches no global registry but
opbridge's own and torch.library's).
"""

from __future__ import annotations

from opbridge.ops import _seed_gpu  # noqa: F401 - attaches the GPU kernels (lazy imports)
from opbridge.ops._seed import DynamicResize, MySELU, MyStrangeOp, MyStrangeOp2
from opbridge.ops.detection import detection_ops

__all__ = ["DynamicResize", "MySELU", "MyStrangeOp", "MyStrangeOp2", "builtin_ops", "detection_ops"]


def builtin_ops() -> list:
    """The built-in ops, in a fixed order."""
    return [MySELU, MyStrangeOp, MyStrangeOp2, DynamicResize]
