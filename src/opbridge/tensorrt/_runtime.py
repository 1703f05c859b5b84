"""The runtime half of a generated plugin, free of TensorRT: raw pointers -> torch tensors -> GPU kernel.

TensorRT hands ``enqueue`` device pointers, tensor descriptions and a CUDA
stream handle. :class:`KernelLauncher` takes the same facts as plain Python
values (:class:`TensorRef`), wraps the memory in CUDA torch tensors without
copying (through ``__cuda_array_interface__``) and calls the op's GPU kernel
``fn(inputs, outputs, attrs, stream)`` with that stream current. The plugin's
``on_shape_change``/``enqueue`` delegate here, so the path can be exercised on
a GPU machine that has no TensorRT.

:func:`deserialize_engine` loads an engine holding these plugins: it registers
them first, and names the plugins TensorRT could not find.
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbridge.errors import OpbridgeError, OpDefinitionError

if TYPE_CHECKING:
    import torch

    from opbridge.definition import OpDef

__all__ = [
    "DEFAULT_GPU_DTYPES",
    "INDEX_DTYPES",
    "TENSORRT_DTYPES",
    "KernelLauncher",
    "TensorRef",
    "as_torch",
    "deserialize_engine",
    "dtype_supported",
    "kernel_dtypes",
]

logger = logging.getLogger(__name__)

DEFAULT_GPU_DTYPES: tuple[str, ...] = ("float32", "float16")

# TensorRT DataType member name -> opbridge (torch-style) dtype name.
TRT_DTYPE_NAMES: dict[str, str] = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
}

# The dtypes a plugin's tensors may have: TensorRT has no float64 (nor complex, int16 or uint16+) tensors.
TENSORRT_DTYPES: frozenset[str] = frozenset(TRT_DTYPE_NAMES.values())

_TYPESTR = {
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<i2",  # no typestr for bfloat16: wrap as int16, then view
    "int8": "|i1",
    "int32": "<i4",
    "int64": "<i8",
    "bool": "|b1",
    "uint8": "|u1",
}


@dataclass(frozen=True)
class TensorRef:
    """A device buffer as TensorRT describes it: pointer, dims and dtype name (``"float16"``...)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: str


class _CudaArray:
    """Just enough of ``__cuda_array_interface__`` (v3) for ``torch.as_tensor``."""

    def __init__(self, ref: TensorRef) -> None:
        self.__cuda_array_interface__ = {
            "shape": tuple(int(d) for d in ref.shape),
            "typestr": _TYPESTR[ref.dtype],
            "data": (int(ref.ptr), False),
            "version": 3,
            "strides": None,
            "stream": None,  # the caller orders work on its stream
        }


def as_torch(ref: TensorRef, device: Any = None) -> torch.Tensor:
    """A CUDA tensor viewing ``ref``'s memory (no copy). Empty tensors need no pointer."""
    import torch

    if ref.dtype not in _TYPESTR:
        raise OpDefinitionError(f"dtype {ref.dtype} cannot be passed to a GPU kernel; use one of {sorted(_TYPESTR)}")
    if any(int(d) == 0 for d in ref.shape):
        return torch.empty(tuple(ref.shape), dtype=getattr(torch, ref.dtype), device=device or "cuda")
    tensor = torch.as_tensor(_CudaArray(ref), device=device or "cuda")
    if ref.dtype == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor


# Integer and bool dtypes. An output of one of these (TRTBatchedNMS's int32 labels) has the dtype its
# op's shape rule gives it, whatever floating-point dtypes the GPU kernel declares.
INDEX_DTYPES = frozenset({"bool", "int8", "uint8", "int16", "int32", "int64"})


def kernel_dtypes(opdef: OpDef) -> tuple[str, ...]:
    """The dtypes ``opdef``'s GPU kernel declares (float32/float16 when it declares none)."""
    return tuple(opdef.gpu_kernel_dtypes) or DEFAULT_GPU_DTYPES


def dtype_supported(opdef: OpDef, dtype: str, output: bool = False) -> bool:
    """Whether ``opdef``'s GPU kernel takes a tensor of ``dtype``: one it declares, or for an output
    an integer or bool dtype (which the op's shape rule gives it). An op without a GPU kernel runs its
    PyTorch reference, which takes every dtype TensorRT hands a plugin.

    >>> from opbridge.ops.detection import BatchedNMS
    >>> [dtype_supported(BatchedNMS, d) for d in ("float16", "int32", "float64")]
    [True, False, False]
    >>> dtype_supported(BatchedNMS, "int32", output=True)
    True
    """
    if dtype not in TENSORRT_DTYPES:
        return False
    if opdef.gpu_kernel is None:
        return dtype in _TYPESTR
    return dtype in kernel_dtypes(opdef) or (output and dtype in INDEX_DTYPES)


class KernelLauncher:
    """Runs ``opdef``'s GPU kernel on buffers described as TensorRT describes them.

    Example:
        >>> launcher = KernelLauncher(MySELU, MySELU.spec.bind_attributes({}))  # doctest: +SKIP
        >>> launcher.on_shape_change([((2, 3), "float32")] * 3, [((2, 3), "float32")])  # doctest: +SKIP
        >>> launcher.launch(input_refs, output_refs, stream=torch.cuda.current_stream().cuda_stream)  # doctest: +SKIP
    """

    # Wrapped buffers kept per launcher: TensorRT hands an execution context the same buffers on every
    # enqueue, and wrapping one (``__cuda_array_interface__``) costs more host time than a small kernel.
    VIEW_CACHE_SIZE = 64

    def __init__(self, opdef: OpDef, attrs: Mapping[str, Any]) -> None:
        self.opdef = opdef
        self.attrs = dict(attrs)
        self.shapes: tuple[list[tuple[tuple[int, ...], str]], list[tuple[tuple[int, ...], str]]] | None = None
        self._views: OrderedDict[tuple[int, int, tuple[int, ...], str], torch.Tensor] = OrderedDict()
        self._streams: dict[tuple[int, int], Any] = {}

    def check_dtypes(self, dtypes: Sequence[str], what: str = "input") -> None:
        """Raise :class:`OpDefinitionError` unless TensorRT has tensors of every dtype (:data:`TENSORRT_DTYPES`)
        and the kernel takes them (:func:`dtype_supported`)."""
        allowed = kernel_dtypes(self.opdef)
        spec = self.opdef.spec
        names = [p.name for p in spec.inputs] if what == "input" else [o.name for o in spec.outputs]
        for i, dtype in enumerate(dtypes):
            name = names[i] if i < len(names) else str(i)
            if dtype not in TENSORRT_DTYPES:
                fix = (
                    "cast it to float32 before the op in the model, before export"
                    if what == "input"
                    else "make the op return float32 for TensorRT, casting to and from float32 around it in the "
                    "model before export where the model needs the wider dtype"
                )
                raise OpDefinitionError(
                    f"{spec.qualname}: {what} {name!r} is {dtype}, and TensorRT has no {dtype} tensors (a plugin's "
                    f"tensors are {', '.join(sorted(TENSORRT_DTYPES))}); {fix}."
                )
            if not dtype_supported(self.opdef, dtype, output=what == "output"):
                raise OpDefinitionError(
                    f"{spec.qualname}: {what} {name!r} is {dtype}, but the op's GPU kernel supports only "
                    f"{', '.join(allowed)}; cast the tensor in the model, or register a kernel for {dtype} with "
                    f"{spec.name}.register_gpu_kernel(fn, dtypes=(..., {dtype!r}))."
                )

    def on_shape_change(
        self, inputs: Sequence[tuple[Sequence[int], str]], outputs: Sequence[tuple[Sequence[int], str]]
    ) -> None:
        """Record (and check) the concrete shapes and dtypes of the next launches."""
        self.check_dtypes([d for _, d in inputs], "input")
        self.check_dtypes([d for _, d in outputs], "output")
        self.shapes = ([(tuple(s), d) for s, d in inputs], [(tuple(s), d) for s, d in outputs])

    def launch(self, inputs: Sequence[TensorRef], outputs: Sequence[TensorRef], stream: int) -> None:
        """Wrap the buffers as CUDA tensors and run the kernel on ``stream`` (a ``cudaStream_t`` as int)."""
        import torch

        fn = self.opdef.gpu_kernel or self._reference_kernel
        self.check_dtypes([r.dtype for r in inputs], "input")
        self.check_dtypes([r.dtype for r in outputs], "output")
        device = torch.cuda.current_device()
        ins = [self._view(r, device) for r in inputs]
        outs = [self._view(r, device) for r in outputs]
        ext = self._streams.get((int(stream), device))
        if ext is None:
            ext = self._streams[int(stream), device] = torch.cuda.ExternalStream(int(stream), device=device)
        with torch.cuda.stream(ext):
            fn(ins, outs, dict(self.attrs), int(stream))

    def _reference_kernel(self, ins: list[Any], outs: list[Any], attrs: dict[str, Any], stream: int) -> None:
        """The op's PyTorch reference as its GPU kernel (an op without ``register_gpu_kernel``): run on the
        CUDA tensors, on TensorRT's stream, its results copied into the outputs."""
        import torch

        spec = self.opdef.spec
        with torch.no_grad():
            result = self.opdef.run_reference(*ins, **attrs)
        results = result if isinstance(result, tuple) else (result,)
        for i, (out, value) in enumerate(zip(outs, results)):
            if tuple(value.shape) != tuple(out.shape):
                raise OpDefinitionError(
                    f"{spec.qualname}: the PyTorch reference (its GPU kernel here: none is registered) gave "
                    f"output {i} the shape {tuple(value.shape)}, TensorRT's buffer is {tuple(out.shape)}; declare "
                    f"the shape with @{spec.name}.register_shape, or register a GPU kernel."
                )
            out.copy_(value)

    def _view(self, ref: TensorRef, device: int) -> torch.Tensor:
        """``as_torch(ref)``, wrapped once per (device, pointer, shape, dtype) and reused.

        A view holds no memory of its own, so reusing one is the same as wrapping the pointer again.
        Each call gets a fresh tensor object (``detach``), so a kernel that changes its argument's
        metadata cannot change the cached view.
        """
        key = (device, int(ref.ptr), tuple(int(d) for d in ref.shape), ref.dtype)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = as_torch(ref, device=f"cuda:{device}")
            if len(self._views) > self.VIEW_CACHE_SIZE:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(key)
        return view.detach()


# How TensorRT's log names a plugin creator it could not find while deserializing: TensorRT 10
# ("Cannot find plugin: NAME, version: 1, namespace:NS.") and 8 ("could not find plugin NAME version 1").
_MISSING_PLUGIN = (
    re.compile(r"Cannot find plugin: ([^,\s]+), version: ([^,\s]+), namespace:\s*([^\s.)]*)"),
    re.compile(r"could not find plugin:? ([^,\s]+),? version:? ([^,\s]+)(?:,? namespace:?\s*([^\s.)]*))?"),
)


def deserialize_engine(engine: bytes | str | os.PathLike[str], *, ops: Sequence[str] = ()) -> Any:
    """Register opbridge's plugins, then deserialize ``engine`` (its bytes, or its file) with TensorRT.

    TensorRT tells which plugin creators an engine needs only by failing to find one, so the plugins of
    every op defined here are registered first: the built-in ops, the ops already imported and those of
    the ``ops`` targets (files or modules, as given to the build). The returned ``ICudaEngine`` keeps its
    runtime alive.

    Raises:
        OpbridgeError: TensorRT could not deserialize the engine; the message quotes TensorRT's errors and,
            where they name a plugin it could not find, the op it belongs to and how to register it.

    Example:
        >>> engine = deserialize_engine("srcnn.engine", ops=["my_ops.py"])  # doctest: +SKIP
        >>> context = engine.create_execution_context()  # doctest: +SKIP
    """
    from opbridge._loading import load_ops
    from opbridge.tensorrt._loader import load_tensorrt
    from opbridge.tensorrt._registry import register_plugins

    if isinstance(engine, (bytes, bytearray, memoryview)):
        data, what = bytes(engine), "the engine"
    else:
        try:
            data, what = Path(engine).read_bytes(), os.fspath(engine)
        except OSError as exc:
            raise OpbridgeError(
                f"{os.fspath(engine)}: cannot read the engine ({exc}); give the engine file's path."
            ) from exc
    load_ops(list(ops))
    trt, backend = load_tensorrt()
    registered = sorted({info.op for info in register_plugins() if info.op})

    class _Record(trt.ILogger):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity.name in ("ERROR", "INTERNAL_ERROR"):
                self.errors.append(msg)  # (raised below)
                logger.debug("TensorRT: %s", msg)
            elif severity.name == "WARNING":
                logger.warning("TensorRT: %s", msg)

    record = _Record()
    result = trt.Runtime(record).deserialize_cuda_engine(data)
    if result is None:
        raise OpbridgeError(_deserialize_failure(what, backend, record.errors, registered))
    return result


def _deserialize_failure(what: str, backend: str, errors: Sequence[str], registered: Sequence[str]) -> str:
    """Why ``what`` did not deserialize: TensorRT's ``errors``, then, for each plugin creator they say is
    missing, the opbridge op it belongs to (among those defined here) and what registers it."""
    from opbridge.definition import all_ops

    quoted = "; ".join(dict.fromkeys(e.strip() for e in errors)) or "no error logged"
    text = f"{backend} could not deserialize {what}: {quoted}."
    missing = list(dict.fromkeys(m.groups() for e in errors for p in _MISSING_PLUGIN for m in p.finditer(e)))
    for name, version, namespace in missing:
        plugin = f"Plugin {name} v{version}" + (f" (namespace {namespace!r})" if namespace else "")
        owners = [
            d.spec.qualname
            for d in all_ops()
            if d.spec.name == name and str(d.spec.version) == version and namespace in ("", None, d.spec.domain)
        ]
        if any(q in registered for q in owners):
            text += (
                f" {plugin} is {owners[0]}'s, which opbridge registered here; another library's creator of that "
                "name may hold its place (opbridge.tensorrt.list_plugins(include_all=True) lists them)."
            )
        else:
            op = f"{namespace}::{name}" if namespace else name
            text += (
                f" {plugin} belongs to no opbridge op defined in this process: import the module that defines "
                f"the {op} op (or pass its file in ops=...) so that opbridge.tensorrt.register_plugins() "
                "registers its plugin, then deserialize."
            )
    if not missing and any("plugin" in e.lower() for e in errors):
        text += (
            " An engine holding opbridge plugins needs each op's plugin registered before deserializing; "
            f"registered now: {', '.join(registered) or 'none'}. Import the modules that define the engine's "
            "other ops (or pass their files in ops=...), then call opbridge.tensorrt.register_plugins()."
        )
    return text
