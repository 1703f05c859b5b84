"""TensorRT plugins generated from op specs.

Every opbridge op becomes an ``IPluginV3`` plugin (core, build and runtime
capabilities) with an ``IPluginCreatorV3One`` creator: name = the ONNX op type,
version = the op version, registered under namespace ``""`` and under the op's
domain, fields from the op's attributes. Output shapes come from the op's shape
rule evaluated with TensorRT dimension expressions, formats from the dtypes its
GPU kernel declares; ``enqueue`` runs that kernel on TensorRT's stream.

``tensorrt`` is used where installed; otherwise ``tensorrt_rtx``, which parses and
builds (never runs) engines on a machine without a GPU.

Example:
    >>> import opbridge.tensorrt as obt
    >>> report = obt.build_engine("srcnn.onnx", "srcnn.engine",
    ...     profiles={"input": ((1, 3, 8, 8), (1, 3, 16, 16), (2, 3, 32, 32))})  # doctest: +SKIP
    >>> report.ok  # doctest: +SKIP
    True
"""

from __future__ import annotations

from opbridge.tensorrt._build import (
    BuildReport,
    ParseReport,
    Profile,
    build_engine,
    check_profiles,
    parse_with_tensorrt,
)
from opbridge.tensorrt._loader import backend_name, load_tensorrt
from opbridge.tensorrt._registry import PluginInfo, list_plugins, register_plugins
from opbridge.tensorrt._runtime import KernelLauncher, TensorRef, as_torch, deserialize_engine

__all__ = [
    "BuildReport",
    "KernelLauncher",
    "ParseReport",
    "PluginInfo",
    "Profile",
    "TensorRef",
    "as_torch",
    "backend_name",
    "build_engine",
    "check_profiles",
    "deserialize_engine",
    "list_plugins",
    "load_tensorrt",
    "parse_with_tensorrt",
    "register_plugins",
]
