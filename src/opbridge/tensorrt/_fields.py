"""Op attributes <-> TensorRT plugin fields, without importing TensorRT.

A field here is ``(name, type_name, numpy array)`` where ``type_name`` is a
``PluginFieldType`` member name (``"FLOAT32"``, ``"INT32"``, ``"CHAR"``...).

What the ONNX parser hands ``create_plugin`` (measured with TensorRT-RTX 1.7):
INT and BOOL attributes arrive as INT32, FLOAT as FLOAT32, STRING as CHAR
(the UTF-8 bytes plus one NUL), lists likewise. What opbridge serializes keeps
every value exact: FLOAT as FLOAT64, INT as INT64, STRING as UTF-8 plus one NUL,
STRINGS as each string's UTF-8 followed by a NUL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from opbridge.errors import OpDefinitionError
from opbridge.spec import AttrSpec, AttrType, OpSpec

__all__ = ["Field", "decode_fields", "encode_attrs", "field_names"]

Field = tuple[str, str, np.ndarray]

_INT_TYPES = ("INT8", "INT16", "INT32", "INT64")
_FLOAT_TYPES = ("FLOAT16", "FLOAT32", "FLOAT64", "BF16")
_CHAR_TYPES = ("CHAR", "INT8")
# Node attributes that steer the ONNX parser's plugin lookup, not the op.
PARSER_ATTRIBUTES = frozenset({"plugin_version", "plugin_namespace"})


def field_names(spec: OpSpec) -> list[tuple[str, str]]:
    """``(name, type_name)`` of the fields a creator advertises: one per attribute, as the parser sends it."""
    kinds = {
        AttrType.FLOAT: "FLOAT32",
        AttrType.FLOATS: "FLOAT32",
        AttrType.INT: "INT32",
        AttrType.INTS: "INT32",
        AttrType.BOOL: "INT32",
        AttrType.STRING: "CHAR",
        AttrType.STRINGS: "CHAR",
    }
    return [(a.name, kinds[a.type]) for a in spec.attributes]


def _encode(attr: AttrSpec, value: Any) -> Field:
    kind = attr.type
    if kind is AttrType.FLOAT:
        return attr.name, "FLOAT64", np.array([value], dtype=np.float64)
    if kind is AttrType.FLOATS:
        return attr.name, "FLOAT64", np.array(list(value), dtype=np.float64)
    if kind is AttrType.INT:
        return attr.name, "INT64", np.array([value], dtype=np.int64)
    if kind is AttrType.INTS:
        return attr.name, "INT64", np.array(list(value), dtype=np.int64)
    if kind is AttrType.BOOL:
        return attr.name, "INT32", np.array([int(bool(value))], dtype=np.int32)
    if kind is AttrType.STRING:
        raw = value.encode("utf-8") + b"\0"
    else:
        raw = b"".join(s.encode("utf-8") + b"\0" for s in value)
    return attr.name, "CHAR", np.frombuffer(raw, dtype=np.int8).copy()


def encode_attrs(spec: OpSpec, attrs: Mapping[str, Any]) -> list[Field]:
    """The fields that serialize ``attrs`` (checked against ``spec``) exactly.

    Example:
        >>> from opbridge.ops import MySELU
        >>> [(n, t) for n, t, _ in encode_attrs(MySELU.spec, MySELU.spec.bind_attributes({}))]
        [('attr1', 'CHAR'), ('attr2', 'INT64'), ('attr3', 'FLOAT64')]
    """
    checked = spec.bind_attributes(dict(attrs))
    return [_encode(a, checked[a.name]) for a in spec.attributes]


def _scalar(spec: OpSpec, attr: AttrSpec, data: np.ndarray) -> np.generic:
    if data.size != 1:
        raise OpDefinitionError(
            f"{spec.qualname}: attribute {attr.name!r} is a single {attr.type.value} but its plugin field "
            f"holds {data.size} values; write it as a scalar attribute in the ONNX node."
        )
    return data.reshape(-1)[0]


def _decode(spec: OpSpec, attr: AttrSpec, type_name: str, data: np.ndarray) -> Any:
    kind = attr.type
    flat = np.asarray(data).reshape(-1)
    if kind in (AttrType.FLOAT, AttrType.FLOATS):
        # an INT/INTS attribute for a float one is taken, as on the ONNX side (onnx_schema.attribute_values)
        if type_name not in _FLOAT_TYPES and type_name not in _INT_TYPES:
            raise OpDefinitionError(
                f"{spec.qualname}: attribute {attr.name!r} expects {kind.value} but its plugin field has type "
                f"{type_name}; store it as an ONNX FLOAT/FLOATS attribute."
            )
        if kind is AttrType.FLOAT:
            return float(_scalar(spec, attr, flat))
        return tuple(float(v) for v in flat)
    if kind in (AttrType.INT, AttrType.INTS, AttrType.BOOL):
        if type_name not in _INT_TYPES:
            raise OpDefinitionError(
                f"{spec.qualname}: attribute {attr.name!r} expects {kind.value} but its plugin field has type "
                f"{type_name}; store it as an ONNX INT/INTS attribute."
            )
        if kind is AttrType.INTS:
            return tuple(int(v) for v in flat)
        value = int(_scalar(spec, attr, flat))
        return bool(value) if kind is AttrType.BOOL else value
    if type_name not in _CHAR_TYPES:
        raise OpDefinitionError(
            f"{spec.qualname}: attribute {attr.name!r} expects {kind.value} but its plugin field has type "
            f"{type_name}; store it as an ONNX STRING/STRINGS attribute."
        )
    raw = flat.astype(np.int8).tobytes()
    try:
        if kind is AttrType.STRING:
            return raw[:-1].decode("utf-8") if raw.endswith(b"\0") else raw.decode("utf-8")
        if not raw:
            return ()
        body = raw[:-1] if raw.endswith(b"\0") else raw
        return tuple(s.decode("utf-8") for s in body.split(b"\0"))
    except UnicodeDecodeError as exc:
        raise OpDefinitionError(
            f"{spec.qualname}: attribute {attr.name!r} is not valid UTF-8 ({exc}); write strings as UTF-8."
        ) from None


def decode_fields(spec: OpSpec, fields: Iterable[Field]) -> dict[str, Any]:
    """Attribute values from plugin fields: parser-made or from :func:`encode_attrs`.

    Missing fields take the spec's defaults; a missing required attribute, an
    unknown field or a field of the wrong type raises :class:`OpDefinitionError`.
    """
    by_name = {a.name: a for a in spec.attributes}
    values: dict[str, Any] = {}
    for name, type_name, data in fields:
        if name in PARSER_ATTRIBUTES:
            continue
        attr = by_name.get(name)
        if attr is None:
            raise OpDefinitionError(
                f"{spec.qualname}: the node has attribute {name!r}, which the op does not declare "
                f"(it takes {sorted(by_name)}); remove it from the node or add it to the op's signature."
            )
        values[name] = _decode(spec, attr, type_name, data)
    try:
        return spec.bind_attributes(values)
    except TypeError as exc:
        raise OpDefinitionError(str(exc)) from None
