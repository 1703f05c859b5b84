"""ONNX function bodies: decompositions of custom ops into standard ONNX ops.

An op may register a body with ``@my_op.register_function``. The registered
object is either an onnxscript function (``@onnxscript.script()``, anything
with ``to_function_proto()``) or a callable ``builder(spec) -> onnx.FunctionProto``.
At export the body is attached to the model as a model-local function named
``domain::Name``, so ONNX Runtime runs the custom node natively with no
registration at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from opbridge.errors import OpDefinitionError

if TYPE_CHECKING:
    import onnx

    from opbridge.definition import OpDef
    from opbridge.spec import OpSpec

__all__ = ["attach_functions", "function_proto"]

logger = logging.getLogger(__name__)


def function_proto(opdef: OpDef) -> onnx.FunctionProto | None:
    """The FunctionProto of ``opdef``'s registered body, renamed to its domain and op type."""
    import onnx

    builder: Any = opdef.function_builder
    if builder is None:
        return None
    spec: OpSpec = opdef.spec
    proto = builder.to_function_proto() if hasattr(builder, "to_function_proto") else builder(spec)
    if not isinstance(proto, onnx.FunctionProto):
        raise OpDefinitionError(
            f"{spec.qualname}: the registered function body gave {type(proto).__name__}; "
            "return an onnx.FunctionProto or register an onnxscript function."
        )
    fn = onnx.FunctionProto()
    fn.CopyFrom(proto)
    fn.domain, fn.name = spec.domain, spec.name
    if len(fn.input) != len(spec.inputs) or len(fn.output) != len(spec.outputs):
        raise OpDefinitionError(
            f"{spec.qualname}: function body has {len(fn.input)} input(s) / {len(fn.output)} output(s), the op "
            f"declares {len(spec.inputs)} / {len(spec.outputs)}."
        )
    declared = {a.name for a in spec.attributes}
    names = set(fn.attribute) | {a.name for a in fn.attribute_proto}
    if not names <= declared:
        raise OpDefinitionError(
            f"{spec.qualname}: function body uses attribute(s) {sorted(names - declared)} the op does not declare."
        )
    return fn


def attach_functions(model: onnx.ModelProto, ops: Iterable[OpDef]) -> list[str]:
    """Attach the bodies of ``ops`` to ``model`` as local functions (in place).

    Ops without a body, and ops whose function is already in the model, are
    skipped. Opset imports the bodies need are added. Returns the qualified
    names of the functions attached.
    """
    have = {(f.domain, f.name) for f in model.functions}
    imports = {o.domain: o for o in model.opset_import}
    attached: list[str] = []
    for opdef in ops:
        fn = function_proto(opdef)
        if fn is None or (fn.domain, fn.name) in have:
            continue
        for entry in fn.opset_import:
            if entry.domain not in imports:
                new = model.opset_import.add()
                new.domain, new.version = entry.domain, entry.version
                imports[entry.domain] = new
            elif imports[entry.domain].version != entry.version and entry.domain in ("", "ai.onnx"):
                # The model's default opset governs; the body is checked against it below.
                logger.debug("function %s uses opset %d, model has %d", fn.name, entry.version, imports[entry.domain].version)
        model.functions.append(fn)
        have.add((fn.domain, fn.name))
        attached.append(opdef.spec.qualname)
    return attached
