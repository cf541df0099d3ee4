"""The vectorized path of the batch and layer norms equals the per-member reference.

On devices other than the CPU, member batch norms and layer norms take ``_vectorized``: plain
torch ops over the whole (M·B, …) tensor (per-(member, channel) statistics of the (M, B, C, S)
view for batch norms, one un-affine layer norm for layer norms) and the member affine
broadcast. ``snens.nn.norms.force_path`` runs it on the CPU too. These tests pin that it equals
``_reference`` (the plain functional norm on each member's rows, concatenated) over three
training steps and one eval step: outputs, input gradients, gradients of gamma, weight and
bias, and running_mean/var/num_batches_tracked; float32 to rtol = atol = 1e-5, float64 to
1e-12, bf16 inputs and bf16 autocast to 2e-2 (on the CPU, a bf16 layer norm's affine
gradients against the reference run in float64 on the same values: CPU's own bf16 layer-norm
backward misses them by more than that). Also inside ``torch.func.vmap``/``grad`` and under
``torch.compile``. The ``cuda`` tests run the same checks on a GPU (skipped without one) and pin
that the default CUDA dispatch takes the vectorized path.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import snens.nn as snn
from snens.nn.norms import FORCEABLE_PATHS, force_path

M = 4
F64, BF16 = torch.float64, torch.bfloat16
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}
TRAINING_STEPS = 3

pytestmark = pytest.mark.usefixtures("one_thread")

DEVICES = [
    pytest.param("cpu"),
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]


@dataclass(frozen=True)
class Case:
    """One layer and the inputs it gets (one member's shape; M members are stacked)."""

    make: Callable[[], snn.MemberNorm]
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32  # of the layer and the input
    input_dtype: torch.dtype | None = None  # of the input only, where it differs
    autocast: bool = False  # bf16 autocast on the input's device
    channels_last: bool = False
    values_of: torch.dtype | None = None  # input and output gradient rounded to this dtype first
    # CPU layer norm's backward for bf16 inputs sums the affine gradients imprecisely (a bias
    # gradient of 0.484 where exact arithmetic on the same bf16 values gives 0.4466, and the
    # vectorized path 0.4466 to 2e-7): on the CPU these are compared with the reference run in
    # float64 on the same values
    cpu_affine_grads_in_float64: bool = False

    @property
    def tol(self) -> dict[str, float]:
        return TOL[BF16 if self.autocast else self.input_dtype or self.dtype]


def _bn2d(**kw):
    return lambda: snn.MemberBatchNorm2d(6, M, **kw)


def _ln(shape=8, **kw):
    return lambda: snn.MemberLayerNorm(shape, M, **kw)


IMAGE, SEQUENCE = (3, 6, 5, 4), (3, 7, 8)
CASES = {
    "bn1d": Case(lambda: snn.MemberBatchNorm1d(5, M), (3, 5)),
    "bn1d_seq": Case(lambda: snn.MemberBatchNorm1d(5, M), (3, 5, 7)),
    "bn2d": Case(_bn2d(), IMAGE),
    "bn2d_float64": Case(_bn2d(), IMAGE, dtype=F64),
    "bn2d_channels_last": Case(_bn2d(), IMAGE, channels_last=True),
    "bn3d": Case(lambda: snn.MemberBatchNorm3d(6, M), (2, 6, 3, 4, 2)),
    "bn2d_cumulative": Case(_bn2d(momentum=None), IMAGE),
    "bn2d_no_stats": Case(_bn2d(track_running_stats=False), IMAGE),
    "bn2d_bf16_input": Case(_bn2d(), IMAGE, input_dtype=BF16),
    "bn2d_autocast": Case(_bn2d(), IMAGE, autocast=True),
    "bn2d_bf16_input_autocast": Case(_bn2d(), IMAGE, input_dtype=BF16, autocast=True),
    "ln": Case(_ln(), SEQUENCE),
    "ln_float64": Case(_ln(), SEQUENCE, dtype=F64),
    "ln_two_dims": Case(_ln((3, 8)), (3, 3, 8)),
    "ln_no_bias": Case(_ln(bias=False), SEQUENCE),
    "ln_two_dims_no_bias": Case(_ln((3, 8), bias=False), (3, 3, 8)),
    "ln_bf16": Case(_ln(), SEQUENCE, dtype=BF16, cpu_affine_grads_in_float64=True),
    "ln_autocast": Case(_ln(), SEQUENCE, autocast=True),
    "ln_bf16_input_autocast": Case(
        _ln(), SEQUENCE, input_dtype=BF16, autocast=True, cpu_affine_grads_in_float64=True
    ),
    "ln2d": Case(lambda: snn.MemberLayerNorm2d(6, M), IMAGE),
}
# A bf16 input with float32 weights outside autocast: CPU layer norm takes mixed dtypes, so
# the reference runs there; CUDA layer norm may not, and autocast is how CUDA gets bf16 inputs.
CPU_ONLY_CASES = {
    "ln_bf16_input": Case(_ln(), SEQUENCE, input_dtype=BF16, cpu_affine_grads_in_float64=True)
}


def _layer(case: Case, device: str) -> snn.MemberNorm:
    """The case's layer with random parameters and running statistics, 2 batches tracked."""
    g = torch.Generator().manual_seed(0)
    layer = case.make().to(case.dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        if getattr(layer, "running_mean", None) is not None:
            layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=g))
            layer.running_var.copy_(torch.rand(layer.running_var.shape, generator=g) + 0.5)
            layer.num_batches_tracked.fill_(2)  # so that momentum=None averages 3 batches
    return layer.to(device)


def _input(case: Case, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A leaf on ``device`` and the layer's input made of it inside the graph (a dtype or
    layout change), so that the leaf's gradient flows through that change."""
    g = torch.Generator().manual_seed(seed)
    shape = (M * case.shape[0], *case.shape[1:])
    values = torch.randn(shape, generator=g) * 2 + 0.5
    if case.values_of is not None:
        values = values.to(case.values_of)
    leaf = values.to(device, case.dtype).requires_grad_(True)
    x = leaf.to(case.input_dtype or case.dtype)
    if case.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return leaf, x


def _record_paths(monkeypatch, layer: snn.MemberNorm) -> list[str]:
    """Wrap the layer's ``_vectorized`` and ``_reference`` to append their names when called."""
    calls: list[str] = []
    for path in ("vectorized", "reference"):
        original = getattr(layer, f"_{path}")

        def recording(*args, _original=original, _path=path, **kwargs):
            calls.append(_path)
            return _original(*args, **kwargs)

        monkeypatch.setattr(layer, f"_{path}", recording)  # on the instance only
    return calls


def _step(layer: snn.MemberNorm, case: Case, device: str, seed: int) -> dict[str, torch.Tensor]:
    """One forward and backward (of a fixed random output gradient): output and gradients."""
    layer.zero_grad(set_to_none=True)
    leaf, x = _input(case, device, seed)
    autocast = torch.autocast(device, torch.bfloat16) if case.autocast else contextlib.nullcontext()
    with autocast:
        y = layer(x)
    g = torch.Generator().manual_seed(seed + 100)
    grad = torch.randn(y.shape, generator=g)
    if case.values_of is not None:
        grad = grad.to(case.values_of)
    y.backward(grad.to(device, y.dtype))
    grads = {f"{n} grad": p.grad for n, p in layer.named_parameters()}
    return {"output": y.detach(), "input grad": leaf.grad} | grads


def _trajectory(layer: snn.MemberNorm, case: Case, device: str) -> dict[str, torch.Tensor]:
    """Every step's output and gradients over three training steps and one eval step, and
    the buffers after training."""
    results = {}
    layer.train()
    for step in range(TRAINING_STEPS):
        results |= {f"train {step}: {k}": v for k, v in _step(layer, case, device, step).items()}
    results |= {f"after training: {n}": b.clone() for n, b in layer.named_buffers()}
    layer.eval()
    return results | {f"eval: {k}": v for k, v in _step(layer, case, device, 10).items()}


def _assert_equal_results(got: dict, want: dict, tol: dict[str, float]) -> None:
    assert got.keys() == want.keys()
    assert all(value is not None for value in want.values())
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, **tol, msg=name)  # dtypes too


def _in_float64(layer: snn.MemberNorm, case: Case, device: str) -> dict[str, torch.Tensor]:
    """The reference's trajectory in float64 on the bf16 values of ``case``'s inputs and
    output gradients."""
    values_of = case.input_dtype or case.dtype
    case = dataclasses.replace(case, dtype=F64, input_dtype=None, values_of=values_of)
    with force_path("reference"):
        return _trajectory(layer.double(), case, device)


def _vectorized_against_reference(case: Case, device: str, monkeypatch, *, force: bool):
    """``case``'s layer with the vectorized path (forced, or by default dispatch) against a
    copy forced to the reference; both must have taken the path they stand for."""
    layer = _layer(case, device)
    ref, ref64 = copy.deepcopy(layer), copy.deepcopy(layer)
    calls, ref_calls = _record_paths(monkeypatch, layer), _record_paths(monkeypatch, ref)
    with force_path("vectorized") if force else contextlib.nullcontext():
        got = _trajectory(layer, case, device)
    with force_path("reference"):
        want = _trajectory(ref, case, device)
    steps = TRAINING_STEPS + 1
    assert calls == ["vectorized"] * steps, calls
    assert ref_calls == ["reference"] * steps, ref_calls
    if case.cpu_affine_grads_in_float64 and device == "cpu":
        exact = _in_float64(ref64, case, device)
        affine = [k for k in want if k.endswith(("gamma grad", "weight grad", "bias grad"))]
        for name in affine:
            want[name] = exact[name].to(got[name].dtype)
    _assert_equal_results(got, want, case.tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_vectorized_equals_the_reference(case, device, monkeypatch):
    """Forced to the vectorized path on any device, every output, gradient and running
    statistic over three training steps and an eval step equals the reference's."""
    _vectorized_against_reference(CASES[case], device, monkeypatch, force=True)


@pytest.mark.parametrize("case", CPU_ONLY_CASES)
def test_vectorized_equals_the_reference_for_mixed_dtypes_on_the_cpu(case, monkeypatch):
    """A bf16 input to a float32 layer norm, outside autocast, normalized in float32 and
    rounded once."""
    _vectorized_against_reference(CPU_ONLY_CASES[case], "cpu", monkeypatch, force=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", CASES)
def test_default_cuda_dispatch_is_the_vectorized_path(case, monkeypatch):
    """Without forcing, CUDA inputs take the vectorized path, equal to the reference."""
    _vectorized_against_reference(CASES[case], "cuda", monkeypatch, force=False)


@pytest.mark.parametrize("case", ["bn1d", "bn2d", "bn2d_bf16_input", "ln", "ln2d"])
def test_default_cpu_dispatch_never_takes_the_vectorized_path(case, monkeypatch):
    """CPU dispatch is as before: the fused, out= or reference paths, never the vectorized one
    (``tests/test_norm_dispatch.py`` pins which)."""
    layer = _layer(CASES[case], "cpu")
    calls = _record_paths(monkeypatch, layer)
    _trajectory(layer, CASES[case], "cpu")
    assert "vectorized" not in calls, calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "make, shape",
    [(snn.MemberBatchNorm2d, (3, 6, 5, 4)), (snn.MemberLayerNorm, (3, 7, 6))],
    ids=["bn2d", "ln"],
)
def test_one_member_and_empty_inputs_take_the_reference_even_when_forced(
    make, shape, device, monkeypatch
):
    """force_path("vectorized") leaves M = 1 and empty inputs to the reference, as the
    default dispatch does."""
    for members, rows in ((1, shape[0]), (M, 0)):
        layer = make(6, members).to(device)
        calls = _record_paths(monkeypatch, layer)
        with force_path("vectorized"):
            layer(torch.randn(rows, *shape[1:], device=device))
        assert calls == ["reference"], (members, rows, calls)


def test_force_path_nests_restores_and_refuses_unknown_paths(monkeypatch):
    layer, x = _layer(CASES["ln"], "cpu"), torch.randn(M * 3, 7, 8)
    calls = _record_paths(monkeypatch, layer)
    with force_path("reference"):
        with force_path("vectorized"):
            layer(x)
        layer(x)
    assert calls == ["vectorized", "reference"]
    with pytest.raises(ValueError, match="path must be one of"), force_path("fused"):
        pass
    with pytest.raises(RuntimeError), force_path("vectorized"):
        raise RuntimeError
    calls.clear()
    layer(x)  # the CPU dispatch again: fused or, without kernels, the reference
    assert "vectorized" not in calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 5), (1, 5, 1)], ids=["(N, C)", "(N, C, 1)"])
def test_one_value_per_channel_is_refused_as_plain_batch_norm_refuses_it(shape, device):
    layer = snn.MemberBatchNorm1d(5, M).to(device).train()
    x = torch.randn(M * shape[0], *shape[1:], device=device)
    for path in FORCEABLE_PATHS:
        with force_path(path), pytest.raises(ValueError, match="more than 1 value per channel"):
            layer(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["bn2d", "bn1d_seq", "ln", "ln_two_dims", "ln2d"])
def test_torch_func_transforms_of_the_vectorized_path(case, device, monkeypatch):
    """vmap of the vectorized path equals the reference per sample and torch.func.grad the
    reference's input gradient (eval: vmap cannot update unbatched running statistics)."""
    case = CASES[case]
    layer = _layer(case, device).eval()
    ref = copy.deepcopy(layer)
    _, sample = _input(case, device, seed=1)
    sample = sample.detach()
    x = torch.stack([sample, 2 * sample - 1])
    calls = _record_paths(monkeypatch, layer)
    with force_path("vectorized"):
        got = torch.func.vmap(layer)(x)
        grad = torch.func.grad(lambda t: layer(t).pow(2).sum())(sample)
    assert set(calls) == {"vectorized"}, calls
    xi = sample.clone().requires_grad_(True)
    with force_path("reference"):
        want = torch.stack([ref(s) for s in x])
        ref(xi).pow(2).sum().backward()
    torch.testing.assert_close(got, want, **case.tol)
    torch.testing.assert_close(grad, xi.grad, **case.tol)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_of_the_vectorized_path(device, monkeypatch):
    """A model of member batch and layer norms compiled (aot_eager) with the vectorized path
    forced traces that path and equals the eager reference over two training steps and an eval
    step: outputs, input and parameter gradients, running statistics. In float64: four norms
    deep, float32 rounding differences compound to 3e-5 relative."""
    if not torch._dynamo.is_dynamo_supported():  # e.g. a Python newer than this torch knows
        pytest.skip("torch.compile is not supported on this Python/platform")
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 6, 3, padding=1),
        snn.MemberBatchNorm2d(6, M),
        torch.nn.ReLU(),
        snn.MemberLayerNorm2d(6, M),
        torch.nn.Flatten(1),
        snn.MemberBatchNorm1d(6 * 4 * 4, M),
        snn.MemberLayerNorm(6 * 4 * 4, M),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    model = model.to(device, F64)
    ref = copy.deepcopy(model)
    norms = [m for m in model if isinstance(m, snn.MemberNorm)]
    calls = [_record_paths(monkeypatch, m) for m in norms]
    compiled = torch.compile(model, backend="aot_eager")
    for step, training in enumerate([True, True, False]):
        x = torch.randn(M * 3, 3, 4, 4, generator=g).to(device, F64)
        results = []
        for run, path in ((compiled, "vectorized"), (ref, "reference")):
            run.train(training)
            xi = x.clone().requires_grad_(True)
            with force_path(path):
                y = run(xi)
            y.pow(2).sum().backward()
            results.append([y, xi.grad, *(p.grad for p in run.parameters())])
        for got, want in zip(*results, strict=True):
            torch.testing.assert_close(got, want, **TOL[F64], msg=f"step {step}")
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
    assert all(set(c) == {"vectorized"} for c in calls), calls
    for (name, got), want in zip(model.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(got, want, **TOL[F64], msg=name)
