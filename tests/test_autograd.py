"""Ops are differentiable: the reference's gradients by default, a registered formula otherwise,
eagerly, twice over and under torch.compile, with no autograd fallback warning."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _detection_cases import CASES

import opbridge
from opbridge import OpDefinitionError
from opbridge.definition import _encode_attr
from opbridge.ops import DynamicResize, MySELU, MyStrangeOp, MyStrangeOp2
from opbridge.ops import detection as d

Case = tuple[str, opbridge.OpDef, tuple[torch.Tensor, ...], dict[str, Any]]


def _seed_cases() -> list[Case]:
    g = torch.Generator().manual_seed(1)
    return [
        ("MySELU", MySELU, (torch.randn(2, 3, generator=g), torch.randn(3, generator=g), torch.ones(3)), {}),
        (
            "MyStrangeOp",
            MyStrangeOp,
            (torch.randn(2, 3, generator=g), torch.randn(3, generator=g), torch.randn(2, 1, generator=g)),
            {},
        ),
        (
            "MyStrangeOp2",
            MyStrangeOp2,
            (torch.randn(4, 1, generator=g), torch.randn(1, 5, generator=g), torch.randn(5, generator=g)),
            {"int_attr1": 3},
        ),
        (
            "DynamicTRTResize",
            DynamicResize,
            (torch.randn(1, 2, 5, 4, generator=g), torch.zeros(1, 1, 7, 9)),
            {"align_corners": True},
        ),
    ]


ALL_CASES = _seed_cases() + list(CASES)
IDS = [c[0] for c in ALL_CASES]


def _leaves(args: tuple[torch.Tensor, ...], dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """Fresh copies; floating-point ones require grad (in ``dtype`` where given)."""
    out = []
    for a in args:
        a = a.detach().clone()
        if a.is_floating_point():
            a = (a if dtype is None else a.to(dtype)).requires_grad_()
        out.append(a)
    return tuple(out)


def _loss(outputs: Any) -> torch.Tensor:
    """A weighted sum of the floating-point outputs (fixed weights: every element's gradient differs)."""
    items = outputs if isinstance(outputs, tuple) else (outputs,)
    total = torch.zeros((), dtype=torch.float64, device=items[0].device)
    for o in items:
        if o.is_floating_point():
            w = torch.linspace(-1.0, 2.0, o.numel(), dtype=o.dtype, device=o.device).reshape(o.shape)
            total = total + (o * w).sum().double()
    return total


def _grads(fn: Callable[..., Any], args: tuple[torch.Tensor, ...], attrs: dict[str, Any]) -> list[Any]:
    leaves = _leaves(args)
    _loss(fn(*leaves, **attrs)).backward()
    return [a.grad if a.requires_grad else None for a in leaves]


@pytest.mark.parametrize("case", ALL_CASES, ids=IDS)
def test_gradients_are_the_references(case: Case) -> None:
    """The op's gradients equal those of its reference called as a plain function (bit for bit)."""
    _, op, args, attrs = case
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the autograd-not-implemented fallback warns
        ours = _grads(op, args, attrs)
    theirs = _grads(op.reference, args, attrs)
    assert any(g is not None and g.abs().sum() > 0 for g in ours), "no input got a gradient"
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if b is None:
            assert a is None or not a.any(), f"input {i}"
        else:
            assert a is not None and torch.equal(a, b), f"input {i}"


@pytest.mark.parametrize("case", ALL_CASES, ids=IDS)
def test_opcheck(case: Case) -> None:
    """torch.library's conformance checks: schema, autograd registration, fake tensors, and
    torch.compile's AOT dispatch with dynamic shapes (which runs forward and backward)."""
    _, op, args, attrs = case
    tensors, checked = op.bind(_leaves(args), attrs)
    encoded = [_encode_attr(a, checked[a.name]) for a in op.spec.attributes]
    torch.library.opcheck(op.torch_op(), (*tensors, *encoded))


# References that compute in their inputs' dtype: float64 gradients checked against finite differences.
GRADCHECK = [c for c in _seed_cases()] + [
    (
        f"grid_sampler-{m}-{p}-{ac}",
        d.GridSample,
        CASES[0][2],
        {"interpolation_mode": m, "padding_mode": p, "align_corners": ac},
    )
    for m in (0, 2)
    for p in (0, 1, 2)
    for ac in (False, True)
]


@pytest.mark.parametrize("case", GRADCHECK, ids=[c[0] for c in GRADCHECK])
def test_gradcheck(case: Case) -> None:
    _, op, args, attrs = case
    leaves = _leaves(args, torch.float64)
    assert torch.autograd.gradcheck(lambda *a: op(*a, **attrs), leaves, eps=1e-6, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("case", [GRADCHECK[0], GRADCHECK[1], GRADCHECK[4]], ids=lambda c: c[0])
def test_second_derivatives(case: Case) -> None:
    _, op, args, attrs = case
    leaves = _leaves(args, torch.float64)
    try:  # the reference's own second derivative first: older torch builds lack some (grid_sampler_2d's)
        torch.autograd.gradgradcheck(lambda *a: op.reference(*a, **attrs), leaves, eps=1e-6, atol=1e-5, rtol=1e-3)
    except RuntimeError as exc:
        if "not implemented" not in str(exc):
            raise
        pytest.skip(f"torch {torch.__version__} cannot differentiate the reference twice: {exc}")
    assert torch.autograd.gradgradcheck(lambda *a: op(*a, **attrs), leaves, eps=1e-6, atol=1e-5, rtol=1e-3)


class _Head(torch.nn.Module):
    """A conv, then RoIAlign, whose reference walks the RoIs in Python (torch.compile cannot trace it)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        y = MySELU(self.conv(x), torch.zeros(1), torch.zeros(1))
        return d.RoIAlign(y, rois, output_height=3, output_width=2, spatial_scale=0.5, sampling_ratio=2)


def test_compiled_training_step_equals_eager() -> None:
    """Under torch.compile (AOT autograd), the backward runs the reference eagerly as an op of its own."""
    x = torch.randn(2, 3, 16, 16)
    rois = torch.tensor([[0.0, 1, 2, 20, 24], [1.0, 3, 1, 9, 6]])
    grads = []
    for compiled in (False, True):
        model = _Head()
        run = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
        _loss(run(x, rois)).backward()
        grads.append([p.grad for p in model.parameters()])
    for eager, compiled in zip(*grads):
        torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)


@opbridge.op("tests.grad::Cube")
def _cube(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return scale * x * x * x


def test_registered_formula_replaces_the_reference() -> None:
    calls: list[str] = []

    @opbridge.op("tests.grad::Square")
    def square(x: torch.Tensor, bias: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        calls.append("reference")
        return scale * x * x + (0 if bias is None else bias)

    @square.register_autograd
    def _(ctx: opbridge.BackwardContext, grad: torch.Tensor) -> tuple[Any, Any]:
        calls.append("formula")
        x, bias = ctx.inputs
        assert ctx.needs_input_grad == (True, False) and bias is None and len(ctx.outputs) == 1
        return grad * 2 * ctx.attrs["scale"] * x, None

    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    square(x, scale=0.5).sum().backward()
    assert calls == ["reference", "formula"]
    assert x.grad is not None and x.grad.tolist() == [1.0, -2.0, 3.0]


@opbridge.op("tests.grad::ReadsDetached")
def _reads_detached(x: torch.Tensor) -> torch.Tensor:
    return x * torch.from_numpy(x.detach().numpy()).sum()


@pytest.mark.parametrize(
    ("read", "how"),
    [
        (lambda x: torch.from_numpy(np.tanh(x.numpy())), "numpy"),
        (lambda x: torch.from_numpy(np.tanh(np.asarray(x))), "__array__"),
    ],
    ids=["numpy", "asarray"],
)
def test_a_reference_handing_a_tracked_tensor_to_numpy_is_named(read: Callable[..., Any], how: str) -> None:
    """torch's own error ("Can't call numpy() on Tensor that requires grad") named neither the op nor the
    backward formula it needs."""

    @opbridge.op("tests.grad::ReadsValues")
    def reads_values(x: torch.Tensor) -> torch.Tensor:
        return read(x)

    x = torch.linspace(0, 1, 5, requires_grad=True)
    y = reads_values(x)
    torch.testing.assert_close(y, torch.tanh(x.detach()), rtol=1e-6, atol=0)
    with pytest.raises(
        OpDefinitionError,
        match=rf"tests.grad::ReadsValues: its reference, run again for the gradient, hands a tensor that autograd "
        rf"tracks to numpy \({how}\).*@ReadsValues.register_autograd.*x.detach\(\).numpy\(\)",
    ):
        y.sum().backward()
    # a value read from a detached tensor is a constant of the reference, as asked
    _reads_detached(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((5,), float(x.detach().sum())), rtol=1e-6, atol=0)


_CAPTURED = torch.nn.Parameter(torch.tensor([2.0, -1.0, 0.5]))


def test_a_reference_reading_a_tensor_that_requires_grad_from_elsewhere_is_named() -> None:
    """The captured parameter silently got no gradient: plain PyTorch gives it one."""

    @opbridge.op("tests.grad::ScaleByCaptured")
    def scale_by_captured(x: torch.Tensor) -> torch.Tensor:
        return x * _CAPTURED

    x = torch.ones(2, 3, requires_grad=True)
    with pytest.raises(
        OpDefinitionError,
        match=r"tests.grad::ScaleByCaptured: its reference reads a tensor that requires grad and is not one of its "
        r"inputs \(nn.Parameter, shape \[3\] float32\).*Pass it to the op as a tensor input",
    ):
        scale_by_captured(x).sum().backward()
    assert _CAPTURED.grad is None

    # read detached, it is a constant of the reference; second derivatives see no captured tensor either
    @opbridge.op("tests.grad::ScaleByConstant")
    def scale_by_constant(x: torch.Tensor) -> torch.Tensor:
        return x * x * _CAPTURED.detach()

    (g,) = torch.autograd.grad(scale_by_constant(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, 2 * x.detach() * _CAPTURED.detach(), rtol=0, atol=0)
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg, (2 * _CAPTURED.detach()).expand(2, 3), rtol=0, atol=0)


def test_bad_formulas_are_named() -> None:
    @opbridge.op("tests.grad::Twice")
    def twice(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 2 * x + y

    x, y = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    twice.register_autograd(lambda ctx, g: 2 * g)
    with pytest.raises(OpDefinitionError, match=r"returned 1 value\(s\) for 2 tensor input\(s\) \['x', 'y'\]"):
        twice(x, y).sum().backward()
    twice.register_autograd(lambda ctx, g: (2 * g, g[:2]))
    with pytest.raises(OpDefinitionError, match=r"gradient for input 'y' is \[2\]; it must be a tensor of shape \[3\]"):
        twice(x, y).sum().backward()
    with pytest.raises(OpDefinitionError, match="register_autograd takes a function"):
        twice.register_autograd("backward")  # type: ignore[arg-type]


def test_reference_leaving_autograd_is_named() -> None:
    @opbridge.op("tests.grad::NumpySin")
    def numpy_sin(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.sin(x.detach().numpy()))

    x = torch.linspace(0, 1, 5, requires_grad=True)
    with pytest.raises(
        OpDefinitionError, match=r"tests.grad::NumpySin: .*leaves autograd.*@NumpySin.register_autograd"
    ):
        numpy_sin(x).sum().backward()

    numpy_sin.register_autograd(lambda ctx, g: g * torch.cos(ctx.inputs[0]))
    numpy_sin(x).sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, torch.cos(x.detach()), rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("case", ALL_CASES, ids=IDS)
def test_gradients_on_the_gpu(case: Case) -> None:
    """On CUDA tensors the gradients are those of the reference there too (up to the order of the
    atomic additions of CUDA's backward kernels)."""
    _, op, args, attrs = case
    args = tuple(a.cuda() for a in args)
    ours, theirs = _grads(op, args, attrs), _grads(op.reference, args, attrs)
    for a, b in zip(ours, theirs):
        if b is None:
            assert a is None or not a.any()
        else:
            assert a is not None and a.is_cuda
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gradients_of_inputs_that_only_give_a_shape_are_zero() -> None:
    x, size = torch.randn(1, 1, 3, 3, requires_grad=True), torch.zeros(1, 1, 5, 5, requires_grad=True)
    DynamicResize(x, size).sum().backward()
    assert size.grad is not None and not size.grad.any()
    assert x.grad is not None and x.grad.abs().sum() > 0


@opbridge.op("tests.grad::Mix")
def _mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b + b


def test_second_order_with_inputs_that_share_a_tensor() -> None:
    """With create_graph, each input's gradient counts only the paths through it: the same tensor given
    twice, or one input computed from another, as the reference called directly."""
    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    for b_of in (lambda t: t, lambda t: 2 * t):
        grads = []
        for fn in (_mix, _mix.reference):
            (g,) = torch.autograd.grad(fn(a, b_of(a)).sum(), a, create_graph=True)
            (gg,) = torch.autograd.grad(g.sum(), a)
            grads.append((g.detach(), gg))
        assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@opbridge.op("tests.grad::Dropout")
def _dropout(x: torch.Tensor, p: float = 0.5) -> torch.Tensor:
    return torch.nn.functional.dropout(x, p, training=True)


def test_reference_drawing_random_numbers() -> None:
    """Eagerly, the backward's second run starts from the forward's random state (the forward's mask)
    and leaves the global random state as the forward left it; under torch.compile, where that state
    is not kept, the backward refuses instead of differentiating other random numbers."""
    torch.manual_seed(3)
    x = torch.ones(64, requires_grad=True)
    y = _dropout(x)
    after_forward = torch.get_rng_state()
    y.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, (y != 0).float() * 2)
    assert torch.equal(torch.get_rng_state(), after_forward)

    compiled = torch.compile(lambda t: _dropout(t), backend="aot_eager", fullgraph=True)
    with pytest.raises(
        OpDefinitionError, match=r"tests.grad::Dropout: its reference draws random numbers.*register_autograd"
    ):
        compiled(torch.ones(8, requires_grad=True)).sum().backward()


def test_autocast_reaches_neither_the_forward_nor_its_backward() -> None:
    """A forward under autocast (bfloat16) and its backward outside it: the reference's gradients in the
    inputs' dtype, as without autocast."""

    @opbridge.op("tests.grad::TanhMatmul")
    def tanh_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ w)

    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    grads = []
    for fn, autocast in ((tanh_matmul, True), (tanh_matmul.reference, False)):
        leaves = [t.clone().requires_grad_() for t in (x, w)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = fn(*leaves)
        assert out.dtype == torch.float32
        out.sum().backward()
        grads.append([t.grad for t in leaves])
    for ours, theirs in zip(*grads):
        assert torch.equal(ours, theirs)


def test_outputs_never_alias_each_other_or_inputs() -> None:
    @opbridge.op("tests.grad::Twin", outputs=("a", "b"))
    def twin(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        return y, y

    x = torch.tensor([1.0, 10.0], requires_grad=True)
    a, b = twin(x)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    a.mul_(3)
    b.sum().backward()
    assert x.grad is not None and x.grad.tolist() == [2.0, 2.0]
    torch.library.opcheck(twin.torch_op(), (torch.randn(3, requires_grad=True),))


def test_outputs_over_an_inputs_buffer_at_an_offset_or_empty_are_copies() -> None:
    """A numpy view at an offset into the input is a storage of its own over the input's buffer, and an
    empty view keeps the input's storage: both passed the aliasing guard (the first let an in-place write
    to the output change the caller's input; the second failed opcheck's schema test)."""

    @opbridge.op("tests.grad::DropFirst")
    def drop_first(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.detach().numpy()[1:])

    @opbridge.op("tests.grad::Nothing")
    def nothing(x: torch.Tensor) -> torch.Tensor:
        return x[:0]

    x = torch.zeros(5)
    drop_first(x).add_(1)
    assert x.tolist() == [0.0] * 5
    torch.library.opcheck(nothing.torch_op(), (torch.randn(3),))


def test_reference_writing_its_input_is_named() -> None:
    @opbridge.op("tests.grad::AddOneInPlace")
    def add_one(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y.add_(1)
        return x + y

    y = torch.ones(2)
    with pytest.raises(OpDefinitionError, match=r"changed its input 'y' in place.*y = y.clone\(\)"):
        add_one(torch.ones(2), y)


def test_inputs_the_reference_ignores_get_zero_gradients() -> None:
    """MySELU's parameter input p rides along: a model training only p gets zeros, not an error."""
    p = torch.nn.Parameter(torch.randn(3))
    MySELU(torch.randn(2, 3), p, torch.ones(3)).sum().backward()
    assert p.grad is not None and not p.grad.any()


def test_backward_runs_the_definition_its_forward_ran() -> None:
    @opbridge.op("tests.grad::Redefined")
    def first(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.ones(2, requires_grad=True)
    y = first(x)

    @opbridge.op("tests.grad::Redefined")
    def second(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    y.sum().backward()
    assert x.grad is not None and x.grad.tolist() == [2.0, 2.0]
    assert second(x).tolist() == [3.0, 3.0]


def test_batched_gradients() -> None:
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    p, c = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    eye = torch.eye(3, dtype=torch.float64)
    (ours,) = torch.autograd.grad(MySELU(x, p, c), x, eye, is_grads_batched=True)
    (theirs,) = torch.autograd.grad(MySELU.reference(x, p, c), x, eye, is_grads_batched=True)
    assert torch.equal(ours, theirs)


@opbridge.op("tests.grad::RowScale", shape=lambda x, s, **_: opbridge.TensorInfo(x.shape, x.dtype))
def _row_scale(x: torch.Tensor, s: torch.Tensor, names: list[str] = ["a", "b"]) -> torch.Tensor:  # noqa: B006
    return x * s + len(names)


@opbridge.op("tests.grad::SumTwice")
def _sum_twice(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x + y) * 2  # autograd gives x and y one gradient tensor


def test_inductor_training_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile's default backend: outputs and gradients of inputs of any layout (the shape rule's
    outputs are contiguous), two inputs whose gradients autograd gives as one tensor (compiled code
    reuses memory), a list[str] attribute, and an op whose first call is inside the compiled region."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    @opbridge.op("tests.grad::FirstCalledCompiled")
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 1.5

    def model(a: torch.Tensor, s: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x = _row_scale(a.t(), s.t(), names=["p", "q", "r"])
        return scaled(_sum_twice(torch.mm(x, w), torch.sin(x)))

    g = torch.Generator().manual_seed(5)
    a, s, w = torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g), torch.randn(4, 4, generator=g)
    results = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (a, s, w)]
        out = fn(*leaves)
        (out * torch.arange(12.0).view(3, 4)).sum().backward()
        results.append((out.detach(), [t.grad for t in leaves]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    for compiled, eager in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_forward_mode_ad_is_refused_not_zero() -> None:
    """torch.library ops carry no forward-mode formula: through them torch.func.jvp gave zero tangents and
    forward_ad's dual tensors lost theirs, silently. Both are refused by name; reverse mode works."""
    import torch.autograd.forward_ad as fwad

    x = torch.randn(4, dtype=torch.float64)
    ride = torch.ones(1, dtype=torch.float64)

    def selu(t: torch.Tensor) -> torch.Tensor:
        return MySELU(t, ride, ride)

    with pytest.raises(opbridge.OpCallError, match=r"forward-mode AD \(torch.func.jvp / jacfwd\).*functional.jacobian"):
        torch.func.jvp(selu, (x,), (torch.ones_like(x),))
    with fwad.dual_level(), pytest.raises(opbridge.OpCallError, match=r"forward-mode AD \(torch.autograd.forward_ad\)"):
        selu(fwad.make_dual(x, torch.ones_like(x)))
    jac = torch.autograd.functional.jacobian(selu, x)
    torch.testing.assert_close(
        jac, torch.diag(torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x)))), rtol=1e-10, atol=1e-12
    )
    assert torch.func.vmap(selu)(x.reshape(2, 2)).shape == (2, 2)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: torch.func.grad(lambda t: f(t).sum())(x),
        lambda f, x: torch.func.vjp(f, x)[1](torch.ones_like(x)),
        lambda f, x: torch.func.jacrev(f)(x),
        lambda f, x: torch.func.vmap(torch.func.grad(lambda t: f(t).sum()))(x.reshape(2, 2)),
    ],
    ids=["grad", "vjp", "jacrev", "vmap-of-grad"],
)
def test_func_reverse_transforms_are_refused_by_name(transform: Callable[..., Any]) -> None:
    """torch.func.grad/vjp/jacrev raised PyTorch's own error, which asks for an autograd.Function's
    setup_context the user never wrote; the refusal names the op and the torch.autograd calls that work."""
    x = torch.randn(4, dtype=torch.float64)
    ride = torch.ones(1, dtype=torch.float64)

    def selu(t: torch.Tensor) -> torch.Tensor:
        return MySELU(t, ride, ride)

    with pytest.raises(
        opbridge.OpCallError, match=r"MySELU: called under torch.func.grad / vjp / jacrev.*torch.autograd.grad"
    ):
        transform(selu, x)
    _, vjp = torch.autograd.functional.vjp(selu, x, torch.ones_like(x))
    torch.testing.assert_close(vjp, torch.sigmoid(x) * (1 + x * (1 - torch.sigmoid(x))), rtol=1e-10, atol=1e-12)


def test_compiled_backward_of_a_redefined_op_follows_the_new_definition() -> None:
    """A compiled backward runs the op's definition of now, as its compiled forward does (re-running a
    notebook cell, importlib.reload): it gave the old definition's gradient."""

    @opbridge.op("tests.grad::RedefinedCompiled")
    def first(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    run = torch.compile(lambda t: first(t) + 1, backend="aot_eager", fullgraph=True)
    x = torch.ones(2, requires_grad=True)
    run(x).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [2.0, 2.0]

    @opbridge.op("tests.grad::RedefinedCompiled")
    def second(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    x = torch.ones(2, requires_grad=True)
    y = run(x)
    y.sum().backward()
    assert y.tolist() == [4.0, 4.0] and x.grad is not None and x.grad.tolist() == [3.0, 3.0]


def test_compiled_backward_follows_a_formula_registered_after_the_compile() -> None:
    """A backward formula registered (or edited) after torch.compile ran left the compiled graphs with the
    old backward: the compiled gradient stayed the reference's where the eager one took the formula."""

    @opbridge.op("tests.grad::FormulaLater")
    def square(x: torch.Tensor) -> torch.Tensor:
        return x * x

    run = torch.compile(lambda t: square(t).sum(), backend="aot_eager", fullgraph=True)
    x = torch.full((3,), 0.5, requires_grad=True)
    run(x).backward()
    assert x.grad is not None and x.grad.tolist() == [1.0, 1.0, 1.0]
    for factor in (100.0, 5.0):  # (registered, then edited)

        @square.register_autograd
        def _straight_through(ctx: Any, grad: torch.Tensor, factor: float = factor) -> torch.Tensor:
            return grad * factor

        x.grad = None
        run(x).backward()
        assert x.grad.tolist() == [factor] * 3


def test_compiled_backward_loaded_from_the_cache_in_another_process(tmp_path: Path) -> None:
    """torch.compile's on-disk cache hands a second process the first one's backward graph: it must name
    the op, not its place among the ops the first process defined (the second defines another one
    first, so that place is another op's there)."""
    script = f"""
        import os, sys
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = {str(tmp_path / "cache")!r}
        import torch, opbridge
        if sys.argv[1] == "second":
            @opbridge.op("tests.cache::Other")
            def other(x: torch.Tensor) -> torch.Tensor:
                return x * 10.0
            other(torch.ones(1))

        @opbridge.op("tests.cache::Twice")
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2.0

        x = torch.ones(3, requires_grad=True)
        y = torch.compile(lambda t: twice(t) + 1)(x)
        y.sum().backward()
        print(y.tolist(), x.grad.tolist())
    """
    path = tmp_path / "compiled_grad.py"
    path.write_text(textwrap.dedent(script), encoding="utf-8")
    for run in ("first", "second"):
        done = subprocess.run(
            [sys.executable, str(path), run], capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "[3.0, 3.0, 3.0] [2.0, 2.0, 2.0]", (run, done.stdout)


@opbridge.op("tests.grad::SwishDefault")
def _swish_default(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    return x * torch.sigmoid(beta * x)


class _SwishBeta(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.beta = 1.5  # a float attribute: dynamic=True traces it as a symbolic float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _swish_default(x) + _swish_default(x, beta=self.beta) + MySELU(x, x, x)


@opbridge.op("tests.grad::ScaledBy")
def _scaled_by(x: torch.Tensor, a: float = 1.0) -> torch.Tensor:
    return x * a


def test_float_attributes_under_dynamic_compile() -> None:
    """A float attribute at its default or from a module attribute: dynamic=True traces it as a symbolic
    float, which the attribute check met with math.isfinite (unsupported in a full graph, a graph break
    otherwise)."""
    torch._dynamo.reset()
    model = _SwishBeta()
    x = torch.randn(3, 4)
    run = torch.compile(model, fullgraph=True, dynamic=True, backend="eager")
    torch.testing.assert_close(run(x), model(x), rtol=0, atol=0)
    assert run(torch.randn(5, 2)).shape == (5, 2)
    # a NaN value: the range check's ordering comparison of the symbolic float raised "Invalid NaN comparison"
    scaled = torch.compile(lambda t, a: _scaled_by(t, a=a), fullgraph=True, dynamic=True, backend="eager")
    assert scaled(x, 2.0).tolist() == (x * 2.0).tolist()
    assert torch.isnan(scaled(x, float("nan"))).all()


def test_inference_mode_and_inference_tensors() -> None:
    """Under torch.inference_mode, and with an inference tensor outside it: inference tensors keep no
    version counter, which the in-place check read."""
    x = torch.randn(2, 3)
    with torch.inference_mode():
        y = _swish_default(x, beta=2.0)
        z = MySELU(x, x, x)
        t = torch.randn(2, 3)
    assert y.is_inference() and z.is_inference()
    torch.testing.assert_close(y, _swish_default.reference(x, beta=2.0), rtol=0, atol=0)
    torch.testing.assert_close(_swish_default(t), _swish_default.reference(t), rtol=0, atol=0)


@opbridge.op("tests.grad::KeepHalf")
def _keep_half(x: torch.Tensor) -> torch.Tensor:
    return x * (torch.rand_like(x) > 0.5)


def test_vmap_follows_its_randomness_mode_and_the_reference() -> None:
    """vmap ran an op once per sample without its randomness mode: no error in "error" mode, and samples
    of their own random numbers in "same" mode."""
    x = torch.ones(3, 8)
    with pytest.raises(RuntimeError, match=r"tests.grad::KeepHalf's reference drew random numbers while in randomness"):
        torch.func.vmap(_keep_half)(x)
    same = torch.func.vmap(_keep_half, randomness="same")(x)
    assert bool((same == same[0]).all())
    different = torch.func.vmap(_keep_half, randomness="different")(torch.ones(16, 64))
    assert not bool((different == different[0]).all())

    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 2, 3, generator=g), torch.randn(3, generator=g)
    ride = torch.ones(1)
    got = torch.func.vmap(lambda t: MySELU(t, ride, ride))(a)
    assert torch.equal(got, MySELU.reference(a, ride, ride))
    s, f = torch.func.vmap(MyStrangeOp, in_dims=(0, None, None))(a, b, torch.ones(1))
    want_s, want_f = MyStrangeOp.reference(a, b, torch.ones(1))
    assert torch.equal(s, want_s) and torch.equal(f, want_f)
    nested = torch.func.vmap(torch.func.vmap(lambda t: MySELU(t, ride, ride)))(a)
    assert torch.equal(nested, got)
    leaf = a.clone().requires_grad_()
    (grad,) = torch.autograd.grad(torch.func.vmap(lambda t: MySELU(t, ride, ride))(leaf).sum(), leaf)
    (want,) = torch.autograd.grad(MySELU.reference(leaf, ride, ride).sum(), leaf)
    torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-7)


def test_vmap_runs_under_compile_export_and_fake_tensors() -> None:
    """vmap's randomness check compared the real random state with torch.equal while tracing: torch.compile,
    torch.export and FakeTensorMode failed ("Please convert all Tensors to FakeTensors first")."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class PerSample(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return torch.func.vmap(_swish_default)(t)

    x = torch.randn(5, 4)
    want = _swish_default.reference(x)
    torch.testing.assert_close(torch.compile(PerSample(), backend="aot_eager", fullgraph=True)(x), want)
    torch.testing.assert_close(torch.export.export(PerSample(), (x,)).module()(x), want)
    with FakeTensorMode():
        assert torch.func.vmap(_swish_default)(torch.randn(3, 4)).shape == (3, 4)
    with pytest.raises(RuntimeError, match=r"reference drew random numbers while in randomness"):
        torch.func.vmap(_keep_half)(torch.ones(3, 8))  # (eagerly still checked)


@opbridge.op("tests.grad::RowMean", shape=lambda x: opbridge.TensorInfo(x.shape[:-1], torch.float64))
def _row_mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(-1).double()


@opbridge.op("tests.grad::Positives", shape=lambda x: opbridge.TensorInfo((opbridge.SymDim(),), torch.int64))
def _positives(x: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(x > 0).flatten()


def test_vmap_over_an_empty_batch_gives_an_empty_result() -> None:
    """vmap over a batch of size 0 was refused ("not supported") where PyTorch's own ops give an empty
    result: each output has no samples, of the shape and dtype a sample would have (from the shape rule
    or the reference on fake tensors, never on real data), and a backward through it gives zero gradients."""
    x = torch.empty(0, 3)
    assert torch.func.vmap(torch.sigmoid)(x).shape == (0, 3)  # (PyTorch's own op)
    y = torch.func.vmap(_swish_default)(x)
    assert (y.shape, y.dtype) == ((0, 3), torch.float32)
    m = torch.func.vmap(_row_mean)(torch.empty(0, 2, 5))
    assert (m.shape, m.dtype) == ((0, 2), torch.float64)
    s, f = torch.func.vmap(MyStrangeOp, in_dims=(0, None, None))(torch.empty(0, 2, 3), torch.ones(3), torch.ones(1))
    assert s.shape == f.shape == (0, 2, 3)
    assert torch.func.vmap(torch.func.vmap(_swish_default))(torch.empty(4, 0, 3)).shape == (4, 0, 3)
    assert torch.func.vmap(_swish_default, in_dims=1)(torch.empty(3, 0)).shape == (0, 3)
    leaf = torch.empty(0, 3, requires_grad=True)
    (grad,) = torch.autograd.grad(torch.func.vmap(_swish_default)(leaf).sum(), leaf)
    assert grad.shape == (0, 3)
    with pytest.raises(
        opbridge.OpCallError, match=r"tests.grad::Positives: vmap over a batch of size 0 .* depends on the data"
    ):
        torch.func.vmap(_positives)(torch.empty(0, 3))


@pytest.mark.skipif(
    torch.__version__ < (2, 13),
    reason=f"torch {torch.__version__} trips its own internal assert (PythonFallbackKernel tls_on_entry) when a "
    "fake mode is entered inside vmap's rule",
)
def test_vmap_over_an_empty_batch_under_compile_and_export() -> None:
    """Each output of no samples, of a sample's shape and dtype, from the tracer's fake mode."""

    class PerSample(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return torch.func.vmap(_row_mean)(t)

    compiled = torch.compile(PerSample(), backend="aot_eager", fullgraph=True)(torch.empty(0, 2, 5))
    exported = torch.export.export(PerSample(), (torch.empty(0, 2, 5),)).module()(torch.empty(0, 2, 5))
    for got in (compiled, exported):
        assert (got.shape, got.dtype) == ((0, 2), torch.float64)


def test_compiled_autograd_differentiates_the_reference() -> None:
    """Under compiled autograd, the backward of an op without a formula failed, blaming the reference ("gives
    no output that autograd can differentiate"): a compiled graph's first call runs under AOTAutograd's
    custom-op aliasing check, a TorchDispatchMode, whose kernels run below autograd, so the reference's
    second run recorded nothing. As under a user's mode (FlopCounterMode) around a compiled backward."""
    from torch._dynamo import compiled_autograd
    from torch.utils.flop_counter import FlopCounterMode

    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, generator=g, dtype=torch.float64)
    leaf = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(_swish_default.reference(leaf, beta=1.5).sum(), leaf)
    torch._dynamo.reset()
    for _ in range(2):  # (the first call runs under the aliasing check)
        leaf = x.clone().requires_grad_()
        with compiled_autograd._enable(torch.compile(backend="aot_eager")):
            _swish_default(leaf, beta=1.5).sum().backward()
        assert leaf.grad is not None
        torch.testing.assert_close(leaf.grad, want, rtol=1e-12, atol=1e-12)
    leaf = x.clone().requires_grad_()
    loss = torch.compile(lambda t: _swish_default(t, beta=1.5).sum(), backend="aot_eager", fullgraph=True)(leaf)
    with FlopCounterMode(display=False):
        (grad,) = torch.autograd.grad(loss, leaf)
    torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


_CALM_RUNS: list[int] = []


@opbridge.op("tests.grad::Calm")
def _calm(x: torch.Tensor) -> torch.Tensor:
    import threading

    _CALM_RUNS.append(1)
    if len(_CALM_RUNS) % 2 == 0:  # while the backward runs it again, another thread draws (a data loader's)
        other = threading.Thread(target=lambda: torch.rand(4))
        other.start()
        other.join()
    return x * torch.sigmoid(x)


def test_another_threads_draws_do_not_make_an_op_random() -> None:
    """The checks compared the process's random state before and after the reference: a draw of another
    thread made a deterministic op's backward fail ("its reference draws random numbers"), intermittently
    in training with a data-loading thread. They watch this thread's ops now."""
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    _CALM_RUNS.clear()
    (grad,) = torch.autograd.grad(_calm(x).sum(), x)
    assert len(_CALM_RUNS) == 2  # (the forward, and the backward's run)
    leaf = x.detach().requires_grad_()
    (want,) = torch.autograd.grad((leaf * torch.sigmoid(leaf)).sum(), leaf)
    torch.testing.assert_close(grad, want)


def test_a_forward_takes_no_op_of_its_reference_through_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward with inputs that require grad ran its reference under a TorchDispatchMode that noted random
    draws, each of its ops through Python (most of the op's eager cost). It compares the random states
    instead: a deterministic reference's gradient is still its own, and a random one's still replays its
    draws (test_reference_drawing_random_numbers), also where it leaves the states as they were."""
    from opbridge import _autograd

    watch = _autograd._draw_watch()
    entered: list[int] = []

    class Counted(watch):  # type: ignore[misc, valid-type]
        def __enter__(self) -> Any:
            entered.append(1)
            return super().__enter__()

    monkeypatch.setattr(_autograd, "_draw_watch", lambda: Counted)
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    y = _swish_default(x, beta=1.5)
    assert entered == []
    (grad,) = torch.autograd.grad(y.sum(), x)
    leaf = x.detach().requires_grad_()
    (want,) = torch.autograd.grad(_swish_default.reference(leaf, beta=1.5).sum(), leaf)
    torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


@opbridge.op("tests.grad::ForkDrop")
def _fork_drop(x: torch.Tensor) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):  # (draws, and leaves the random state as it found it)
        mask = (torch.rand(x.shape) > 0.5).to(x.dtype)
    return x * mask


def test_a_reference_drawing_under_fork_rng_replays_its_draws_in_the_backward() -> None:
    """A reference that draws under fork_rng leaves the random states unchanged, which a comparison of the
    states took for no draw: its backward, after another draw of the program, ran it again on other numbers
    (and refused it). The forward's states are kept for the backward whatever they are afterwards."""
    torch.manual_seed(0)
    x = torch.ones(64, requires_grad=True)
    y = _fork_drop(x)
    torch.rand(3)  # (the program draws between the forward and the backward)
    y.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, (y != 0).to(x.dtype))
    assert 0 < int((y != 0).sum()) < 64


def test_redefinitions_free_old_definitions_and_a_late_backward_is_named() -> None:
    """Re-running a cell that defines an op keeps the last few definitions a pending backward may still
    run, not every one with all its reference holds; a backward whose definition is gone says so."""
    import gc
    import weakref

    from opbridge import definition

    def define(k: int) -> opbridge.OpDef:
        @opbridge.op("tests.grad::Redefined")
        def redefined(x: torch.Tensor) -> torch.Tensor:
            return x * k

        return redefined

    x = torch.ones(2, requires_grad=True)
    early = define(1)(x).sum()  # its backward needs definition 1
    refs = [weakref.ref(define(k)) for k in range(2, 3 + definition._SUPERSEDED_KEPT)]
    late = refs[-1]()(x).sum()  # type: ignore[misc]
    gc.collect()
    assert sum(r() is not None for r in refs) == definition._SUPERSEDED_KEPT + 1  # the current one, the last kept
    late.backward()
    assert x.grad is not None and x.grad.tolist() == [float(2 + definition._SUPERSEDED_KEPT)] * 2
    with pytest.raises(
        opbridge.OpCallError, match=r"ops were redefined more than 32 times since; run the forward again"
    ):
        early.backward()
