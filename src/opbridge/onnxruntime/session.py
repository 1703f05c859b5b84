"""``opbridge.InferenceSession``: an ONNX Runtime session that runs opbridge custom ops.

It mirrors ``onnxruntime.InferenceSession`` (``run``, ``get_inputs``,
``get_outputs``) and, before creating the session, finds every custom node of
the model and gives it a kernel (see :mod:`opbridge.onnxruntime.bridge`):

- ops whose function body is in the model run natively in ONNX Runtime, except
  nodes of ops that declare their kernel faster than ONNX Runtime's body
  (``register_function(prefer_kernel=...)``; ``bodies="always"`` runs every body);
- other ops run a Python kernel inside ONNX Runtime through the native bridge:
  the op's own kernel, a kernel registered with ``@opbridge.kernel``, or the
  op's PyTorch reference.

Models written by TorchScript-era exporters with custom ops in ONNX's default
domain are repaired in memory (the ops move to ``opbridge.legacy``; a warning
says which). A model with custom ops opbridge knows nothing about raises
:class:`~opbridge.errors.UnknownOpError` listing them.

Example:
    >>> import numpy as np, onnx, opbridge
    >>> from onnx import helper, TensorProto
    >>> @opbridge.kernel("Negate", domain="doc.session")
    ... def negate(x):
    ...     return -x
    >>> node = helper.make_node("Negate", ["x"], ["y"], domain="doc.session")
    >>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
    ...                                                 helper.make_opsetid("doc.session", 1)])
    >>> sess = opbridge.InferenceSession(model)
    >>> sess.run(None, {"x": np.array([1.0, -2.0], np.float32)})[0].tolist()
    [-1.0, 2.0]
    >>> sess.kernels["Negate_0"].path
    'registered'
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opbridge.errors import ModelLoadError, OpbridgeError, OutputPathError, UnknownOpError, unknown_ops_message
from opbridge.kernels import later_kernel_note
from opbridge.legacy_domain import (
    DEFAULT_LEGACY_DOMAIN,
    default_domain_opset,
    move_default_domain_ops,
    runs_default_domain_kernel,
)
from opbridge.model_io import (
    adopt_function_domains,
    check_domain_imports,
    elem_types,
    load_model,
    refuse_unread_external_data,
    save_with_data_file,
    too_large,
    walk_nodes,
)
from opbridge.onnxruntime.bridge import (
    NODE_ATTRIBUTE,
    BoundKernel,
    NodeKernel,
    kernel_for_node,
    register_ops,
    spec_attributes,
)
from opbridge.spec import ONNX_DOMAINS

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["InferenceSession"]

logger = logging.getLogger(__name__)

# per thread: the sessions (ids) whose Python kernels run on it, innermost last (parallel execution mode)
_INSIDE = threading.local()

# the element types the bridge hands to kernels and takes back (numpy's): not bfloat16, float8, 4-bit
_BRIDGED_TYPES = frozenset(range(1, 16)) - {8}  # (8: strings, which custom nodes do not take)

# A model too large for one protobuf message (model_io.too_large) goes to ONNX Runtime from a temporary
# directory, as a model file and one external data file.

# In-memory domain of nodes that run opbridge's kernel although their op's body is in the model.
_KERNEL_DOMAIN_PREFIX = "opbridge.kernel."

# In-memory domains of bridged nodes whose outputs have other element types than their op's first
# node's (see InferenceSession._op_table).
_TYPED_DOMAIN_PREFIX = "opbridge.types"

# Domains whose ops ONNX Runtime implements itself.
_NATIVE_DOMAINS = ONNX_DOMAINS | {"com.microsoft"}

# SessionOptions properties carried over to the copy that receives the bridge.
_COPIED_OPTIONS = (
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "enable_mem_reuse",
    "enable_profiling",
    "execution_mode",
    "execution_order",
    "graph_optimization_level",
    "inter_op_num_threads",
    "intra_op_num_threads",
    "log_severity_level",
    "log_verbosity_level",
    "logid",
    "profile_file_prefix",
    "use_deterministic_compute",
)

# Suffix of the in-memory op type of a bridged node named like an op ONNX Runtime implements.
_RENAMED_SUFFIX = ".opbridge"


@functools.cache
def _runtime_op_names() -> frozenset[str]:
    """Op types ONNX Runtime knows in any domain (ONNX's, its contrib ops'); ONNX's where it cannot list them."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        return frozenset(str(schema.name) for schema in state.get_all_operator_schema())
    except Exception:  # an ONNX Runtime build without the schema list: ONNX's own names
        import onnx

        return frozenset(schema.name for schema in onnx.defs.get_all_schemas_with_history())


def _is_custom(node: onnx.NodeProto) -> bool:
    return node.domain not in _NATIVE_DOMAINS


def _pending_signals() -> None:
    """Nothing: calling a Python function lets the interpreter run pending signal handlers (a
    KeyboardInterrupt a kernel's Ctrl-C left pending) at this point."""


def _refuse_omitted_inputs(model: onnx.ModelProto) -> None:
    """A ModelLoadError where an ONNX op's node, in the graph or once the function bodies are inlined,
    leaves out one of a variadic list's inputs: the checker passes it, and ONNX Runtime crashes on some
    (``Sum`` of an input left out ends the process)."""
    from opbridge.model_io import omitted_variadic_inputs

    omitted = omitted_variadic_inputs(model)
    if omitted:
        more = f" (and {len(omitted) - 1} more)" if len(omitted) > 1 else ""
        raise ModelLoadError(
            f"InferenceSession: {omitted[0][1]}{more}; ONNX Runtime may crash on such a node. Give the input, or, "
            "where the node is in an op's function body, make the body handle a call that leaves the op's "
            "optional input out (or run the op's kernel: bodies='never')."
        )


def _functions_need_bridge(model: onnx.ModelProto) -> bool:
    """Whether a model-local function's body (its If/Loop/Scan bodies too) holds a custom node no function
    covers, which the bridge serves only once the functions are inlined."""
    local = {(f.domain, f.name) for f in model.functions}
    return any(
        _is_custom(n) and (n.domain, n.op_type) not in local for f in model.functions for n in walk_nodes(f.node)
    )


# Session config entries carried over when set (SessionOptions cannot list its entries).
_COPIED_CONFIG = (
    "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning",
    "session.set_denormal_as_zero",
    "session.disable_prepacking",
    "session.use_env_allocators",
)


# Defaults for sessions with bridged kernels, unless the caller's options set them: a
# Python kernel (numpy, torch) runs its own threads on the cores where ONNX Runtime's
# idle intra-op workers would otherwise spin, and measured 2-4x slower beside them.
_BRIDGE_DEFAULTS = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}


def _config_entry(options: Any, key: str) -> str | None:
    try:
        value = options.get_session_config_entry(key)
    except Exception:
        return None
    return value if isinstance(value, str) else None


def _copy_options(options: Any) -> Any:
    """A fresh SessionOptions with ``options``' settings (see :class:`InferenceSession`)."""
    import onnxruntime as ort

    fresh = ort.SessionOptions()
    for key in _COPIED_CONFIG:
        value = _config_entry(options, key) if options is not None else None
        if value is None and key in _BRIDGE_DEFAULTS:
            value = _BRIDGE_DEFAULTS[key]
        if value is not None:
            fresh.add_session_config_entry(key, value)
    if options is None:
        return fresh
    if getattr(options, "optimized_model_filepath", ""):
        logger.warning(
            "SessionOptions.optimized_model_filepath is not used in a session with bridged kernels: the graph "
            "ONNX Runtime would save holds opbridge's in-memory node tags, which no runtime loads; the model "
            "you give the session is the one to keep"
        )
    for name in _COPIED_OPTIONS:
        try:
            value = getattr(options, name)
        except AttributeError:
            continue
        try:
            setattr(fresh, name, value)
        except (AttributeError, TypeError, ValueError, RuntimeError):
            logger.debug("could not copy SessionOptions.%s", name)
    return fresh


def _made_options(factory: Callable[[], Any]) -> Any:
    """The SessionOptions ``factory()`` makes (a new one each call: the session registers the bridge in it)."""
    import onnxruntime as ort

    options = factory()
    if not isinstance(options, ort.SessionOptions):
        raise TypeError(
            f"InferenceSession: sess_options is a function, so it must return an onnxruntime.SessionOptions; "
            f"it returned {type(options).__name__}."
        )
    return options


def _checked_options(sess_options: Any) -> None:
    """Refuse a ``sess_options`` that is neither an ``onnxruntime.SessionOptions`` nor a function making one
    (a dict of settings would otherwise be dropped without a word)."""
    import onnxruntime as ort

    if sess_options is None or callable(sess_options) or isinstance(sess_options, ort.SessionOptions):
        return
    if isinstance(sess_options, (str, list, tuple)):  # (providers, given where onnxruntime takes sess_options)
        raise TypeError(
            f"InferenceSession: sess_options got {sess_options!r}, which looks like execution providers: the "
            "arguments are onnxruntime's, in its order (path_or_bytes, sess_options, providers); give "
            "providers=... by name."
        )
    raise TypeError(
        f"InferenceSession: sess_options must be an onnxruntime.SessionOptions (or a function returning a new "
        f"one), got {type(sess_options).__name__}; set the settings on one, e.g. options = "
        "onnxruntime.SessionOptions(); options.intra_op_num_threads = 1."
    )


def _has_providers(options: Any) -> bool:
    """Whether the SessionOptions ``options`` names execution providers of its own (``add_provider``)."""
    has = getattr(options, "has_providers", None)  # (onnxruntime 1.22 and later)
    return bool(has()) if callable(has) else False


def _provider_list(providers: Any) -> list[Any]:
    """``providers`` as a list: one string is one provider (not its letters); CPU when None."""
    if providers is None:
        return ["CPUExecutionProvider"]
    return [providers] if isinstance(providers, str) else list(providers)


def _with_bridge_defaults(options: Any) -> Any:
    """``options`` with the bridge's defaults for the config entries it does not set."""
    for key, value in _BRIDGE_DEFAULTS.items():
        if _config_entry(options, key) in (None, ""):
            options.add_session_config_entry(key, value)
    return options


def _intra_op_threads(options: Any) -> int:
    """The session's intra-op threads: ``intra_op_num_threads``, or where it is 0 (ONNX Runtime's
    choice, its physical cores) the CPUs this process may run on."""
    threads = int(getattr(options, "intra_op_num_threads", 0) or 0)
    if threads > 0:
        return threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # platforms without sched_getaffinity
        return max(1, os.cpu_count() or 1)


class InferenceSession:
    """An ONNX Runtime session in which every custom op of the model runs.

    The arguments are onnxruntime's, in its order (``path_or_bytes, sess_options, providers,
    provider_options``), then opbridge's own.

    Args:
        path_or_bytes: a path to an .onnx file, its bytes, or an ``onnx.ModelProto``.
        providers: execution providers, as for onnxruntime (default: those ``sess_options`` names with
            ``add_provider``, else CPU); one string is one provider. Bridged kernels always run on CPU.
        provider_options: one dict of options per provider, as for onnxruntime.
        bodies: which model-local function bodies of opbridge ops run natively: ``"auto"`` (default)
            all but the nodes whose op prefers its kernel for their attributes (an op whose body
            ONNX Runtime runs slower than its CPU kernel, e.g. bicubic resize), ``"always"`` every
            body (what any ONNX Runtime does with the file), ``"never"`` none where opbridge knows
            the op (its kernel or PyTorch reference runs instead). Unknown ops' bodies always run.
        native: run the native C kernels of ops that have one (``register_kernel(native=...)``, e.g.
            grid_sampler's) inside ONNX Runtime, without Python, on the session's intra-op threads;
            ``False`` runs their Python kernels (which run on PyTorch's threads).
        sess_options: an ``onnxruntime.SessionOptions``. When the model needs
            bridged kernels, its settable properties (threads, optimization level,
            execution mode, logging, profiling, and the spinning/denormal/prepacking
            config entries) are copied into a fresh SessionOptions that receives the
            bridge, so the object you pass is never modified; other session config
            entries are not copied. ONNX Runtime's idle threads do not spin in such a
            session unless ``sess_options`` asks for it: they would compete with the
            Python kernels' own threads for the same cores. A SessionOptions cannot
            report everything set on it: initializer overrides (``add_initializer``,
            ``add_external_initializers``), free-dimension overrides and other config
            entries are not copied. For those, pass a function that makes a new
            SessionOptions each call (``sess_options=make_options``): the session takes
            the object it returns as it is, and registers the bridge in it.

    Attributes:
        kernels: node name -> :class:`~opbridge.onnxruntime.bridge.NodeKernel`, the
            path each custom node took.
        model: the model as given to ONNX Runtime (repaired, node ids added).
        moved_ops: op types moved out of the default domain (legacy exports).

    Raises:
        ModelLoadError: the model cannot be read.
        UnknownOpError: the model has custom nodes opbridge has no kernel for.
        TypeError: ``sess_options`` is neither a SessionOptions nor a function making one.

    Example:
        >>> sess = opbridge.InferenceSession("model.onnx")  # doctest: +SKIP
        >>> (y,) = sess.run(None, {"x": x})  # doctest: +SKIP
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto,
        sess_options: Any = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
        bodies: str = "auto",
        native: bool = True,
    ) -> None:
        import onnxruntime as ort

        model_or_path = path_or_bytes
        if bodies not in ("auto", "always", "never"):
            raise ValueError(f"InferenceSession: bodies must be 'auto', 'always' or 'never', got {bodies!r}.")
        self.bodies = bodies
        self.native = bool(native)
        _checked_options(sess_options)

        model = load_model(model_or_path, copy=True, caller="InferenceSession")
        refuse_unread_external_data(model, "InferenceSession")
        model, self.moved_ops = move_default_domain_ops(model, copy=False)
        # (the bridge adds imports for the domains it binds, in memory: a model without its own would run here
        # and fail in plain ONNX Runtime, the reference evaluator and OpenVINO)
        check_domain_imports(model, "InferenceSession")
        adopt_function_domains(model, "InferenceSession")
        if self.moved_ops:
            logger.warning(
                "moved custom op(s) %s out of ONNX's default domain into %r (in memory; the file is unchanged): "
                "runtimes reject custom ops in the default domain",
                ", ".join(self.moved_ops),
                DEFAULT_LEGACY_DOMAIN,
            )
        if _functions_need_bridge(model):
            from opbridge.model_io import inline_functions

            # (the nodes that run their op's kernel instead of its body leave the body's domain first: inlined,
            # they would run the body)
            self._keep_kernels(model)
            model = inline_functions(model)
        self.kernels: dict[str, NodeKernel] = {}
        self._untyped: list[str] = []
        bound = self._plan(model)
        _refuse_omitted_inputs(model)
        self.model = model
        made = callable(sess_options)
        options = _made_options(sess_options) if made else sess_options
        descriptors: list[Any] = []
        self._bridged = bool(bound)
        self._parallel = False
        self._exit_threads: list[int] = []  # (list.append and pop are atomic)
        if bound and not made and providers is None and _has_providers(sess_options):
            logger.warning(
                "InferenceSession: the providers set on sess_options (add_provider, add_provider_for_devices) are "
                "not copied into the session options that receive the bridge; it runs on CPU. Give providers=... "
                "or a function making the options (sess_options=make_options)."
            )
        if bound:
            options = _with_bridge_defaults(options) if made else _copy_options(sess_options)
            threads = _intra_op_threads(options)
            self._parallel = getattr(options, "execution_mode", None) == ort.ExecutionMode.ORT_PARALLEL
            table, self._untyped = self._op_table(model, bound, self._nodes)
            descriptors = register_ops(options, table, self._resolver(bound, threads, self._parallel))
        source: str | bytes = self._large_model_file(model) if too_large(model) else b""
        try:
            self._session = ort.InferenceSession(
                source or model.SerializeToString(),
                sess_options=options,
                # (None where the options name their own providers: onnxruntime then takes theirs)
                providers=None if providers is None and _has_providers(options) else _provider_list(providers),
                provider_options=provider_options,
            )
        except Exception as exc:
            if type(exc).__name__ == "InvalidProtobuf":
                raise ModelLoadError(f"ONNX Runtime cannot parse the model: {exc}") from None
            if self._untyped and "Type Error" in str(exc):
                raise ModelLoadError(
                    f"ONNX Runtime could not load the model: {str(exc).rstrip('.')}. {self._untyped_hint()}"
                ) from exc
            # (ONNX Runtime's own exception types, and words that do not name the file)
            where = os.fspath(model_or_path) if isinstance(model_or_path, (str, os.PathLike)) else "the model"
            raise ModelLoadError(f"{where}: ONNX Runtime cannot load it: {' '.join(str(exc).split())}") from exc
        finally:
            for d in descriptors:
                d.release()
        from opbridge._feeds import FeedCheck

        # (a declared scalar ONNX Runtime does not check: it takes an array of any shape there)
        self._check_feed = FeedCheck(
            "InferenceSession.run",
            model.graph,
            [i.name for i in self._session.get_inputs()],
            [i.name for i in self._session.get_overridable_initializers()],
            check_scalars=False,
        )
        self._output_names = [o.name for o in self._session.get_outputs()]  # (run() names an unknown one)

    def _untyped_hint(self) -> str:
        return (
            f"opbridge could not tell the element type of {', '.join(self._untyped)} (no value_info in the model, "
            "and no op spec with a shape rule), so ONNX Runtime took its node's first input's type; give the "
            "model value_info for those values, or define the op with @opbridge.op and a shape rule."
        )

    def _large_model_file(self, model: onnx.ModelProto) -> str:
        """Write a model over protobuf's 2 GiB limit to a temporary directory (removed with the
        session), its tensors as one external data file; the path for ONNX Runtime. ``self.model``'s
        tensors then refer to that file."""
        import shutil
        import tempfile
        import weakref

        folder = tempfile.mkdtemp(prefix="opbridge-session-")
        weakref.finalize(self, shutil.rmtree, folder, True)
        path = os.path.join(folder, "model.onnx")
        try:
            save_with_data_file(model, path, data_name="model.data", keep_tensors=False)
        except (OSError, OutputPathError) as exc:
            raise ModelLoadError(
                f"the model is over protobuf's 2 GiB limit and could not be written to {folder} for ONNX Runtime "
                f"({exc}); free disk space there or set TMPDIR to a folder with room."
            ) from None
        logger.info("the model is over 2 GiB: ONNX Runtime reads it from %s", path)
        return path

    # ------------------------------------------------------------------ planning

    def _plan(self, model: onnx.ModelProto) -> dict[int, BoundKernel]:
        """Choose a kernel for every custom node; tag bridged nodes with their id."""
        import onnx

        opset = {o.domain: o.version for o in model.opset_import}
        default_opset = default_domain_opset(model) or 1
        local = {(f.domain, f.name) for f in model.functions}
        moved = set(self.moved_ops)
        bound: dict[int, BoundKernel] = {}
        unknown: list[tuple[str, str, int, str]] = []
        # the main graph's nodes and those of its If/Loop/Scan bodies (torch.cond's branches): a node's id
        # is its place in this walk, which ONNX Runtime hands back when it creates the node's kernel
        self._nodes = nodes = list(walk_nodes(model.graph.node))
        names = {n.name for n in nodes if n.name}
        counters: dict[str, int] = {}
        for index, node in enumerate(nodes):
            if not _is_custom(node):
                continue
            if not node.name or node.name in self.kernels:
                while True:
                    i = counters.get(node.op_type, 0)
                    counters[node.op_type] = i + 1
                    candidate = f"{node.op_type}_{i}"
                    if candidate not in names:
                        break
                node.name = candidate
                names.add(candidate)
            legacy = runs_default_domain_kernel(node.domain, node.op_type, opset.get(node.domain, 1), moved)
            lookup = "" if legacy else node.domain
            # (the default domain's kernel for the model's opset of that domain)
            version = default_opset if legacy else opset.get(node.domain, 1)
            if node.domain.startswith(_KERNEL_DOMAIN_PREFIX):  # (moved by _keep_kernels, before inlining)
                lookup = node.domain.removeprefix(_KERNEL_DOMAIN_PREFIX)
                version = opset.get(lookup, 1)
            elif (node.domain, node.op_type) in local:
                if not self._kernel_instead_of_body(node, version):
                    self.kernels[node.name] = NodeKernel(
                        node.name, node.domain, node.op_type, version, "function", None
                    )
                    continue
                # the body stays for the op's other nodes: this one moves to a domain of its own, where
                # only the bridge defines the op
                # (its opset import is added with the other bridged domains' below)
                lookup = node.domain
                node.domain = _KERNEL_DOMAIN_PREFIX + node.domain
            found = kernel_for_node(node, version, lookup_domain=lookup, native=self.native)
            if found is None:
                unknown.append((lookup, node.op_type, version, node.name))
                continue
            for attr in list(node.attribute):
                if attr.name == NODE_ATTRIBUTE:
                    node.attribute.remove(attr)
            node.attribute.append(onnx.helper.make_attribute(NODE_ATTRIBUTE, index))
            bound[index] = found
            self.kernels[node.name] = NodeKernel(
                node.name,
                node.domain.removeprefix(_KERNEL_DOMAIN_PREFIX),  # (the in-memory domain is no name for users)
                node.op_type,
                version,
                found.path,
                found.kind,
                found.shapes is not None,
                found.native is not None,
            )
        if unknown:
            notes = (later_kernel_note(domain, op_type, version) for domain, op_type, version, _ in unknown)
            raise UnknownOpError("\n".join([unknown_ops_message(unknown), *dict.fromkeys(n for n in notes if n)]))
        for domain in {nodes[i].domain for i in bound}:
            if domain not in opset:
                model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
        return bound

    def _keep_kernels(self, model: onnx.ModelProto) -> None:
        """Move each node (of the graph or a function body) whose op has a body in the model but runs
        opbridge's kernel here into a domain of its own, so that inlining the bodies leaves it a node."""
        local = {(f.domain, f.name) for f in model.functions}
        opset = {o.domain: o.version for o in model.opset_import}
        holders: list[tuple[Any, dict[str, int]]] = [(model.graph.node, opset)]
        holders += [(f.node, {**opset, **{o.domain: o.version for o in f.opset_import}}) for f in model.functions]
        for nodes, versions in holders:
            for node in walk_nodes(nodes):
                key = (node.domain, node.op_type)
                if key in local and self._kernel_instead_of_body(node, versions.get(node.domain, 1)):
                    node.domain = _KERNEL_DOMAIN_PREFIX + node.domain

    def _kernel_instead_of_body(self, node: onnx.NodeProto, version: int) -> bool:
        """Whether ``node``, whose op has a body in the model, runs opbridge's kernel instead."""
        if self.bodies == "always":
            return False
        from opbridge.definition import find_op
        from opbridge.kernels import find_kernel

        opdef = find_op(node.domain, node.op_type, version)
        if opdef is None:  # (a kernel registered by name runs where the caller asks for kernels)
            return self.bodies == "never" and find_kernel(node.domain, node.op_type, version) is not None
        if self.bodies == "never":
            return True
        try:
            attrs = spec_attributes(opdef, node)
        except OpbridgeError:  # attributes the op does not declare: the body, which ONNX Runtime checks
            return False
        return opdef.prefers_kernel(attrs)

    @staticmethod
    def _op_table(
        model: onnx.ModelProto, bound: Mapping[int, BoundKernel], nodes: Sequence[onnx.NodeProto]
    ) -> tuple[list[tuple[str, str, int, list[int]]], list[str]]:
        """One entry per bridged (domain, op type, output element types): input count and output
        element types; and the outputs whose type is unknown. ONNX Runtime gives a registered op one
        element type per output, so nodes of an op type whose outputs have other types than its first
        node's (an op with a dtype attribute) move to a domain of their own, in memory, one per set of
        types; and a node named like an op ONNX Runtime knows gets an op type of its own."""
        import onnx

        untyped: list[str] = []
        types = elem_types(model, [name for i in bound for name in nodes[i].output if name])
        for i in bound:
            for name in nodes[i].output:
                elem = types.get(name, 0) if name else 0
                if elem and elem not in _BRIDGED_TYPES:
                    node = nodes[i]
                    raise OpbridgeError(
                        f"{node.domain}::{node.op_type} node {node.name!r}: output {name!r} is "
                        f"{onnx.TensorProto.DataType.Name(elem).lower()}, which ONNX Runtime's Python bridge does not "
                        "pass to kernels (numpy has no such type): cast to float32 around the op for ONNX Runtime, "
                        "or run the model in opbridge.ReferenceSession."
                    )
        taken = _runtime_op_names()
        original = {i: nodes[i].op_type for i in bound}
        for i in bound:
            node = nodes[i]
            if node.op_type in taken:
                # ONNX Runtime's graph optimizers match some ops by type alone: a bridged acme::Conv
                # with one input aborted the process in a Conv fusion. In memory it gets a name of its own.
                node.op_type = f"{node.op_type}{_RENAMED_SUFFIX}"
        n_out: dict[tuple[str, str], int] = {}
        for index in bound:
            node = nodes[index]
            key = (node.domain, node.op_type)
            n_out[key] = max(n_out.get(key, 0), len(node.output))
        groups: dict[tuple[str, str, tuple[int, ...]], list[onnx.NodeProto]] = {}
        for index in sorted(bound):
            node = nodes[index]
            width = n_out[(node.domain, node.op_type)]
            names = list(node.output) + [""] * (width - len(node.output))
            signature = tuple(types.get(name, 0) if name else 0 for name in names)
            groups.setdefault((node.domain, node.op_type, signature), []).append(node)
            untyped.extend(
                f"{node.domain}::{original[index]} output {name!r}" for name in names if name and not types.get(name)
            )
        table = []
        seen: dict[tuple[str, str], int] = {}
        opset = {o.domain for o in model.opset_import}
        for (domain, op_type, signature), nodes in groups.items():
            k = seen.get((domain, op_type), 0)
            seen[(domain, op_type)] = k + 1
            if k:
                domain = f"{_TYPED_DOMAIN_PREFIX}{k}.{domain}"
                for node in nodes:
                    node.domain = domain
                if domain not in opset:
                    model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
                    opset.add(domain)
            table.append((domain, op_type, max(len(n.input) for n in nodes), list(signature)))
        return table, untyped

    def _resolver(self, bound: Mapping[int, BoundKernel], threads: int, parallel: bool) -> Any:
        # in the parallel execution mode each Python kernel marks its thread as inside this session, so that
        # run() can refuse a call from one of them (the nested run would wait for the thread it runs on)
        # and records the inter-op threads on which a kernel raised SystemExit, whose kept exit (by thread,
        # in the bridge) run() takes
        token = id(self)
        exits = self._exit_threads

        def marked(fn: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                inside = _INSIDE.__dict__.setdefault("sessions", [])
                inside.append(token)
                try:
                    return fn(*args, **kwargs)
                except SystemExit:
                    exits.append(threading.get_ident())
                    raise
                finally:
                    inside.pop()

            return call

        def resolve(node_id: int) -> tuple[Any, str, bool, Any, Any, int]:
            kernel = bound[node_id]
            fn = marked(kernel.fn) if parallel and kernel.fn is not None else kernel.fn
            return fn, kernel.label, kernel.writable_inputs, kernel.shapes, kernel.native, threads

        return resolve

    # ------------------------------------------------------------------ onnxruntime API

    def run(
        self,
        output_names: str | Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[np.ndarray]:
        """Run the model, as ``onnxruntime.InferenceSession.run``: outputs in ``output_names`` order (all if None;
        one string is one name). ``input_feed`` values are numpy arrays or CPU tensors.

        Raises:
            InputError: an input is missing, unknown, or has another dtype, rank or fixed dim than the
                model declares, or an output name is unknown (a ValueError, as
                :class:`~opbridge.reference.ReferenceSession` raises).
        """
        from opbridge._dtypes import feed_arrays, output_name_list

        if self._parallel and id(self) in getattr(_INSIDE, "sessions", ()):
            raise OpbridgeError(
                "InferenceSession.run: a kernel called run() of its own session, which runs in ONNX Runtime's "
                "parallel execution mode: the nested run would wait forever for the inter-op thread it runs on. "
                "Run the nested model in a session of its own (or this one in ORT_SEQUENTIAL mode)."
            )
        if self._bridged and not self._parallel:
            from opbridge.onnxruntime import _native

            _native.module().take_exit()  # (one a run of the raw .session left on this thread is not this run's)
        feed = feed_arrays(input_feed)
        self._check_feed(feed)
        for name, value in feed.items():
            if getattr(getattr(value, "dtype", None), "kind", None) == "V":  # (ml_dtypes' bfloat16, float8)
                from opbridge.backends.base import InputError

                raise InputError(
                    f"InferenceSession.run: input {name!r} is {value.dtype}, which ONNX Runtime's Python API takes "
                    "no arrays of (it raised 'Numpy_type 256 can't be converted'): give the model a float32 input "
                    "and a Cast to it, or run it with opbridge.ReferenceSession."
                )
        names = output_name_list(output_names)
        if names:
            known = self._output_names
            bad = [n for n in names if n not in known]
            if bad:  # (ONNX Runtime's own refusal is an InvalidArgument that lists nothing)
                from opbridge.backends.base import InputError

                raise InputError(f"unknown output name(s) {bad}; the model's outputs are {known}.")
        try:
            return self._session.run(names, feed, run_options)
        except Exception as exc:
            _pending_signals()  # Ctrl-C inside a kernel failed the run: raise it here, from run()
            if self._bridged:
                from opbridge.onnxruntime import _native

                exiting = _native.module().take_exit()
                if exiting is None and self._parallel and "kernel raised SystemExit" in str(exc):
                    # the kernel ran on one of ONNX Runtime's inter-op threads, which it recorded (a run of this
                    # session from another thread at the same time may take it: either ends the process)
                    while exiting is None and self._exit_threads:
                        try:
                            exiting = _native.module().take_exit(self._exit_threads.pop())
                        except IndexError:  # (taken by such a run in the meantime)
                            break
                if exiting is not None:  # sys.exit() inside a kernel: it ends the caller too
                    raise exiting from None
            if self._untyped and "but the node's output type is" in str(exc):
                # the kernel may be right and the type a guess: say so, with the same exception type
                try:
                    hinted = type(exc)(f"{exc} {self._untyped_hint()}")
                except Exception:  # an exception type that takes other arguments
                    raise exc from None
                raise hinted from exc
            raise

    def get_inputs(self) -> list[Any]:
        """The model's inputs (onnxruntime NodeArgs: ``name``, ``shape``, ``type``)."""
        return self._session.get_inputs()

    def get_outputs(self) -> list[Any]:
        """The model's outputs (onnxruntime NodeArgs)."""
        return self._session.get_outputs()

    def get_providers(self) -> list[str]:
        """The execution providers of the session."""
        return self._session.get_providers()

    # onnxruntime's other calls, on the underlying session: those that run the model (I/O binding, OrtValues)
    # skip opbridge's feed checks

    def get_provider_options(self) -> dict[str, Any]:
        """Each provider's options, as ``onnxruntime.InferenceSession.get_provider_options``."""
        return self._session.get_provider_options()

    def get_session_options(self) -> Any:
        """The session's ``SessionOptions`` (with the bridge's library registered where it has one)."""
        return self._session.get_session_options()

    def get_modelmeta(self) -> Any:
        """The model's metadata (producer, graph name, custom metadata map...)."""
        return self._session.get_modelmeta()

    def get_overridable_initializers(self) -> list[Any]:
        """The initializers a feed may replace (onnxruntime NodeArgs)."""
        return self._session.get_overridable_initializers()

    def end_profiling(self) -> str:
        """End profiling (``SessionOptions.enable_profiling``) and return the profile file's name."""
        return self._session.end_profiling()

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started, in nanoseconds."""
        return self._session.get_profiling_start_time_ns()

    def io_binding(self) -> Any:
        """An ``onnxruntime.IOBinding`` of the session, for :meth:`run_with_iobinding`."""
        return self._session.io_binding()

    def run_with_iobinding(self, iobinding: Any, run_options: Any = None) -> None:
        """Run on the inputs and outputs ``iobinding`` binds (no feed checks)."""
        self._session.run_with_iobinding(iobinding, run_options)

    def run_with_ort_values(
        self, output_names: Sequence[str] | None, input_dict_ort_values: Any, run_options: Any = None
    ) -> Any:
        """Run on ``onnxruntime.OrtValue`` inputs, returning OrtValues (no feed checks)."""
        return self._session.run_with_ort_values(output_names, input_dict_ort_values, run_options)

    @property
    def session(self) -> Any:
        """The underlying ``onnxruntime.InferenceSession``."""
        return self._session

    def __repr__(self) -> str:
        paths: dict[str, int] = {}
        for k in self.kernels.values():
            paths[k.path] = paths.get(k.path, 0) + 1
        summary = ", ".join(f"{n} {p}" for p, n in sorted(paths.items())) or "no custom nodes"
        return f"<opbridge.InferenceSession ({summary})>"
