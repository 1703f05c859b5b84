"""Registering generated plugin creators with TensorRT's plugin registry."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opbridge._locks import ForkSafeLock
from opbridge.definition import OpDef, ops_argument
from opbridge.tensorrt._fields import field_names
from opbridge.tensorrt._loader import load_tensorrt
from opbridge.tensorrt._plugin import make_classes

__all__ = ["PluginInfo", "list_plugins", "register_plugins"]

logger = logging.getLogger(__name__)

_LOCK = ForkSafeLock()
# (name, version, namespace) -> (OpDef, creator). Holding the creators keeps them alive for TensorRT.
_REGISTERED: dict[tuple[str, str, str], tuple[OpDef, Any]] = {}


@dataclass(frozen=True)
class PluginInfo:
    """A creator in TensorRT's plugin registry, as ``opbridge plugins`` lists it."""

    name: str
    version: str
    namespace: str
    fields: tuple[tuple[str, str], ...]
    op: str | None = None  # the opbridge op's "domain::Name", None for creators opbridge did not make
    attributes: tuple[str, ...] = ()  # each field's ONNX attribute type (INT, INTS...), for opbridge's creators

    def describe(self) -> str:
        """One line: ``stride:INTS as INT32`` for an opbridge field (the attribute type, then the
        field type the parser sends), ``name:TYPE`` for another creator's."""
        kinds = self.attributes or ("",) * len(self.fields)
        fields = ", ".join(f"{n}:{a} as {t}" if a else f"{n}:{t}" for (n, t), a in zip(self.fields, kinds)) or "-"
        origin = f" (opbridge {self.op})" if self.op else ""
        return f"{self.name} v{self.version} namespace={self.namespace!r} fields=[{fields}]{origin}"


def _namespaces(opdef: OpDef) -> list[str]:
    # The ONNX parser looks the creator up under the node's plugin_namespace attribute (default "");
    # since TensorRT 10.10 it falls back to the node's domain. Register under both.
    return [""] + ([opdef.spec.domain] if opdef.spec.domain else [])


def register_plugins(ops: OpDef | str | Iterable[OpDef | str] | None = None) -> list[PluginInfo]:
    """Register an IPluginCreatorV3One for every op (default: every op defined so far). Idempotent.

    Each op gets a creator named after its ONNX op type, version ``str(spec.version)``,
    under namespace ``""`` and under its domain.

    Example:
        >>> import opbridge.tensorrt
        >>> infos = opbridge.tensorrt.register_plugins()  # doctest: +SKIP
        >>> sorted({i.name for i in infos})[:4]  # doctest: +SKIP
        ['DynamicTRTResize', 'MMCVModulatedDeformConv2d', 'MMCVMultiLevelRoiAlign', 'MMCVRoiAlign']
    """
    import opbridge.ops  # noqa: F401 - the built-in ops

    trt, _ = load_tensorrt()
    _, creator_cls = make_classes(trt)
    registry = trt.get_plugin_registry()
    selected = ops_argument(ops, "register_plugins")
    infos: list[PluginInfo] = []
    with _LOCK:
        for opdef in selected:
            spec = opdef.spec
            for namespace in _namespaces(opdef):
                key = (spec.name, str(spec.version), namespace)
                held = _REGISTERED.get(key)
                if held is not None and held[0] is not opdef:
                    if namespace == "" and held[0].spec.qualname != spec.qualname:
                        logger.warning(
                            "TensorRT: %s and %s share the name %s v%s; only %s is registered under namespace ''; "
                            "%s is found through its domain %r (TensorRT >= 10.10) or a plugin_namespace attribute.",
                            held[0].spec.qualname,
                            spec.qualname,
                            spec.name,
                            spec.version,
                            held[0].spec.qualname,
                            spec.qualname,
                            spec.domain,
                        )
                        continue
                    registry.deregister_creator(held[1])
                    del _REGISTERED[key]
                    held = None
                if held is None:
                    creator = creator_cls(opdef, namespace)
                    if not registry.register_creator(creator, namespace):
                        logger.warning(
                            "TensorRT already has a plugin creator %s v%s in namespace %r not made by opbridge; "
                            "%s is not registered there.",
                            spec.name,
                            spec.version,
                            namespace,
                            spec.qualname,
                        )
                        continue
                    _REGISTERED[key] = (opdef, creator)
                infos.append(_info(spec.name, str(spec.version), namespace, opdef))
    return infos


def list_plugins(include_all: bool = False) -> list[PluginInfo]:
    """The creators in TensorRT's registry: opbridge's, or every one with ``include_all``."""
    trt, _ = load_tensorrt()
    ours = {key: op for key, (op, _) in _REGISTERED.items()}
    out: list[PluginInfo] = []
    for creator in trt.get_plugin_registry().all_creators:
        op = ours.get((str(creator.name), str(creator.plugin_version), str(creator.plugin_namespace)))
        if op is None and not include_all:
            continue
        # Reading a built-in creator's fields can print internal errors (RTX's Myelin plugin): skip them.
        out.append(_info(str(creator.name), str(creator.plugin_version), str(creator.plugin_namespace), op))
    return out


def _info(name: str, version: str, namespace: str, op: OpDef | None) -> PluginInfo:
    if op is None:
        return PluginInfo(name, version, namespace, ())
    attributes = tuple(a.type.name for a in op.spec.attributes)
    return PluginInfo(name, version, namespace, tuple(field_names(op.spec)), op.spec.qualname, attributes)
