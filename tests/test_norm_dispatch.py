"""Which kernel path each member norm takes, and that every path computes ``_reference``.

Each family's ``_normalize`` lists its paths in the order they are tried, with the condition
for each. These tests pin that list: an input meeting a path's condition runs that path (its
entry point is wrapped to record the call), and the result equals the family's ``_reference``
(the plain functional norm on each member's rows, concatenated) in the output, the input
gradient, the gradients of gamma, weight and bias and the running statistics, in training and
eval: float32 to rtol = atol = 1e-5, float64 to 1e-12, bf16 inputs to 2e-2.

``torch.compile``/``torch.export`` are simulated by ``torch.compiler.is_compiling`` returning
True (``tests/test_norms_fast.py`` compiles a model for real); CUDA is not available here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import snens.nn as snn
from snens.nn import batch_norms, fused

M = 4
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}
TRAINING = pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class Case:
    """One input to one layer and the path ``_normalize`` must send it down.

    ``path`` "fused" stands for ``no_kernels`` where the fused kernels are unavailable here
    (``SNENS_FUSED=0`` or no toolchain), as ``_normalize``'s conditions say.
    """

    make: Callable[[int], snn.MemberNorm]  # M -> layer
    shape: tuple[int, ...]  # one member's input
    path: str
    no_kernels: str = "reference"
    dtype: torch.dtype = torch.float32  # of the input and the layer
    input_dtype: torch.dtype | None = None  # of the input only, where it differs
    layout: str = "contiguous"  # or "channels_last", "strided"
    setting: str = ""  # or "SNENS_FUSED=0", "tracing", "no_grad"
    members: int = M


def _bn2d(m):
    return snn.MemberBatchNorm2d(6, m)


def _ln(m):
    return snn.MemberLayerNorm(8, m)


def _ln2d(m):
    return snn.MemberLayerNorm2d(6, m)


def _rms(m):
    return snn.MemberRMSNorm(8, m, eps=1e-6)


def _gn(m):
    return snn.MemberGroupNorm(3, 6, m)


BN_SHAPE, LN_SHAPE, IMAGE_SHAPE = (3, 6, 5, 4), (3, 7, 8), (3, 6, 5, 4)
F64, BF16 = torch.float64, torch.bfloat16

BATCH_NORM_CASES = {
    "bn2d_float32": Case(_bn2d, BN_SHAPE, "fused", "out="),
    "bn2d_float64": Case(_bn2d, BN_SHAPE, "fused", "out=", dtype=F64),
    "bn1d": Case(lambda m: snn.MemberBatchNorm1d(5, m), (3, 5), "fused", "out="),
    "bn1d_seq": Case(lambda m: snn.MemberBatchNorm1d(5, m), (3, 5, 7), "fused", "out="),
    "bn3d": Case(lambda m: snn.MemberBatchNorm3d(6, m), (2, 6, 3, 4, 2), "fused", "out="),
    "bn2d_no_stats": Case(
        lambda m: snn.MemberBatchNorm2d(6, m, track_running_stats=False), BN_SHAPE, "fused", "out="
    ),
    "bn2d_cumulative": Case(
        lambda m: snn.MemberBatchNorm2d(6, m, momentum=None), BN_SHAPE, "fused", "out="
    ),
    "fused_no_grad": Case(_bn2d, BN_SHAPE, "fused", "out=", setting="no_grad"),
    "channels_last": Case(_bn2d, BN_SHAPE, "out=", "out=", layout="channels_last"),
    "channels_last_float64": Case(
        _bn2d, BN_SHAPE, "out=", "out=", dtype=F64, layout="channels_last"
    ),
    "strided": Case(_bn2d, BN_SHAPE, "out=", "out=", layout="strided"),
    "bf16_input": Case(_bn2d, BN_SHAPE, "out=", "out=", input_dtype=BF16),
    "switched_off": Case(_bn2d, BN_SHAPE, "out=", "out=", setting="SNENS_FUSED=0"),
    "out_no_grad": Case(_bn2d, BN_SHAPE, "out=", "out=", layout="channels_last", setting="no_grad"),
    "one_member": Case(_bn2d, BN_SHAPE, "reference", "reference", members=1),
    "tracing": Case(_bn2d, BN_SHAPE, "reference", "reference", setting="tracing"),
    "empty": Case(_bn2d, (0, 6, 5, 4), "reference", "reference"),
}
LAYER_NORM_CASES = {
    "float32": Case(_ln, LN_SHAPE, "fused"),
    "float64": Case(_ln, LN_SHAPE, "fused", dtype=F64),
    "two_dims": Case(lambda m: snn.MemberLayerNorm((3, 8), m), (3, 3, 8), "fused"),
    "no_bias": Case(lambda m: snn.MemberLayerNorm(8, m, bias=False), LN_SHAPE, "fused"),
    "strided": Case(_ln, LN_SHAPE, "fused", layout="strided"),
    "fused_no_grad": Case(_ln, LN_SHAPE, "fused", setting="no_grad"),
    "bf16_input": Case(_ln, LN_SHAPE, "reference", input_dtype=BF16),
    "switched_off": Case(_ln, LN_SHAPE, "reference", setting="SNENS_FUSED=0"),
    "one_member": Case(_ln, LN_SHAPE, "reference", members=1),
    "tracing": Case(_ln, LN_SHAPE, "reference", setting="tracing"),
    "empty": Case(_ln, (0, 7, 8), "reference"),
}
LAYER_NORM_2D_CASES = {
    "float32": Case(_ln2d, IMAGE_SHAPE, "fused"),
    "float64": Case(_ln2d, IMAGE_SHAPE, "fused", dtype=F64),
    "sequence": Case(_ln2d, (3, 6, 7), "fused"),
    "bf16_input": Case(_ln2d, IMAGE_SHAPE, "reference", input_dtype=BF16),
    "switched_off": Case(_ln2d, IMAGE_SHAPE, "reference", setting="SNENS_FUSED=0"),
    "one_member": Case(_ln2d, IMAGE_SHAPE, "reference", members=1),
    "tracing": Case(_ln2d, IMAGE_SHAPE, "reference", setting="tracing"),
}
RMS_NORM_CASES = {
    "float32": Case(_rms, LN_SHAPE, "broadcast"),
    "float64": Case(_rms, LN_SHAPE, "broadcast", dtype=F64),
    "two_dims": Case(lambda m: snn.MemberRMSNorm((3, 8), m), (3, 3, 8), "broadcast"),
    "tracing": Case(_rms, LN_SHAPE, "broadcast", setting="tracing"),  # plain ops: traced as is
    "bf16": Case(_rms, LN_SHAPE, "reference", dtype=BF16),
    "bf16_input": Case(_rms, LN_SHAPE, "reference", input_dtype=BF16),
    "one_member": Case(_rms, LN_SHAPE, "reference", members=1),
}
GROUP_NORM_CASES = {
    "float32": Case(_gn, IMAGE_SHAPE, "one example"),
    "float64": Case(_gn, IMAGE_SHAPE, "one example", dtype=F64),
    "sequence": Case(lambda m: snn.MemberGroupNorm(2, 6, m), (3, 6, 7), "one example"),
    "volume": Case(lambda m: snn.MemberGroupNorm(2, 6, m), (2, 6, 3, 2, 2), "one example"),
    "bf16_input": Case(_gn, IMAGE_SHAPE, "one example", input_dtype=BF16),
    "no_spatial_dims": Case(lambda m: snn.MemberGroupNorm(2, 6, m), (3, 6), "reference"),
    "one_value_per_group": Case(lambda m: snn.MemberGroupNorm(6, 6, m), (3, 6, 1), "reference"),
    "channels_last": Case(_gn, IMAGE_SHAPE, "reference", layout="channels_last"),
    "one_member": Case(_gn, IMAGE_SHAPE, "reference", members=1),
    "tracing": Case(_gn, IMAGE_SHAPE, "reference", setting="tracing"),
    "empty": Case(_gn, (0, 6, 5, 4), "reference"),
}
HF_RMS_NORM_CASES = {
    f"{cls.formula}_{name}": Case(lambda m, cls=cls: cls(8, m), LN_SHAPE, "", dtype=dtype)
    for cls in (snn.MemberLlamaRMSNorm, snn.MemberT5RMSNorm, snn.MemberGemmaRMSNorm)
    for name, dtype in (("float32", torch.float32), ("float64", F64))
}


def _layer(case: Case, training: bool) -> snn.MemberNorm:
    g = torch.Generator().manual_seed(0)
    layer = case.make(case.members).to(case.dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        if getattr(layer, "running_mean", None) is not None:
            layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=g))
            layer.running_var.copy_(torch.rand(layer.running_var.shape, generator=g) + 0.5)
            layer.num_batches_tracked.fill_(2)
    return layer.train(training)


def _input(case: Case) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """A leaf and what makes the layer's input of it (inside the graph, so that a strided view
    reaches the layer as it is and the leaf's gradient flows through the layout change)."""
    g = torch.Generator().manual_seed(1)
    shape = (case.members * case.shape[0], *case.shape[1:])
    if case.layout == "strided":  # every other column of a wider tensor
        shape = (*shape[:-1], 2 * shape[-1])
    leaf = torch.randn(shape, generator=g, dtype=case.dtype) * 2 + 0.5

    def prepare(x: torch.Tensor) -> torch.Tensor:
        if case.layout == "strided":
            x = x[..., ::2]
        if case.layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        return x.to(case.input_dtype or case.dtype)

    return leaf, prepare


def _record_paths(monkeypatch, layer: snn.MemberNorm) -> list[str]:
    """Wrap every path's entry point to append its name to the returned list when called."""
    calls: list[str] = []

    def wrap(owner, name: str, path: str) -> None:
        original = getattr(owner, name)

        def recording(*args, **kwargs):
            calls.append(path)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, recording)

    wrap(fused, "member_layer_norm", "fused")
    wrap(fused, "member_batch_norm", "fused")
    wrap(batch_norms, "_member_batch_norm", "out=")  # called inside its autograd function too
    for name, path in (
        ("_reference", "reference"),
        ("_broadcast", "broadcast"),
        ("_as_one_example", "one example"),
    ):
        if hasattr(layer, name):
            wrap(layer, name, path)  # on the instance: the class's method stays as it is
    return calls


def _reference_forward(layer: snn.MemberNorm, x: torch.Tensor) -> torch.Tensor:
    """``forward`` with ``_reference`` in place of ``_normalize``'s dispatch (which counts a
    batch norm's training batch before any path runs)."""
    if isinstance(layer, batch_norms._MemberBatchNorm):
        if layer.training and layer.track_running_stats:
            layer.num_batches_tracked.add_(1)
    return layer._reference(x, *layer.scale_and_shift())


def _results(layer: snn.MemberNorm, case: Case, forward) -> dict[str, torch.Tensor]:
    """Output, gradients (of a fixed random output gradient) and buffers after one forward."""
    leaf, prepare = _input(case)
    if case.setting == "no_grad":
        with torch.no_grad():
            y = forward(layer, prepare(leaf))
        assert y.grad_fn is None  # no graph recorded, whichever path ran
        results = {"output": y}
    else:
        leaf.requires_grad_(True)
        y = forward(layer, prepare(leaf))
        g = torch.Generator().manual_seed(2)
        y.backward(torch.randn(y.shape, generator=g, dtype=case.dtype).to(y.dtype))
        results = {"output": y, "input grad": leaf.grad}
        results |= {f"{n} grad": p.grad for n, p in layer.named_parameters()}
    return results | {n: b.clone() for n, b in layer.named_buffers()}


def _check(case: Case, training: bool, monkeypatch) -> None:
    """``case``'s input takes ``case.path`` and gives what ``_reference`` gives."""
    expected = case.path if case.path != "fused" or fused.available() else case.no_kernels
    if case.setting == "SNENS_FUSED=0":
        monkeypatch.setenv(fused.ENV, "0")
    if case.setting == "tracing":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    layer = _layer(case, training)
    ref = copy.deepcopy(layer)
    calls = _record_paths(monkeypatch, layer)
    got = _results(layer, case, lambda lay, t: lay(t))
    assert calls == ([expected] if expected else []), f"took {calls}, expected {expected!r}"
    with_grad = case.setting != "no_grad"
    if expected == "out=" and with_grad:  # a gradient is wanted: the autograd function
        assert type(got["output"].grad_fn).__name__ == "_MemberBatchNormFunctionBackward"
    want = _results(ref, case, _reference_forward)
    assert got.keys() == want.keys()
    assert not with_grad or {"input grad", "gamma grad", "weight grad"} <= got.keys()
    tol = TOL[case.input_dtype or case.dtype]
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, **tol, msg=name)


@TRAINING
@pytest.mark.parametrize("case", BATCH_NORM_CASES)
def test_batch_norm_paths(case, training, monkeypatch):
    """Batch norms: fused for contiguous float32/64 CPU inputs (the out= path where the kernels
    are unavailable), the per-member out= kernels for other CPU inputs, the reference for
    M = 1, empty inputs and code being traced."""
    _check(BATCH_NORM_CASES[case], training, monkeypatch)


@TRAINING
@pytest.mark.parametrize("case", LAYER_NORM_CASES)
def test_layer_norm_paths(case, training, monkeypatch):
    """LayerNorm: fused for float32/64 CPU inputs, the reference for bf16, SNENS_FUSED=0,
    M = 1, empty inputs and code being traced."""
    _check(LAYER_NORM_CASES[case], training, monkeypatch)


@TRAINING
@pytest.mark.parametrize("case", LAYER_NORM_2D_CASES)
def test_layer_norm_2d_paths(case, training, monkeypatch):
    """Channels-first LayerNorm: LayerNorm's paths on the channels-last view."""
    _check(LAYER_NORM_2D_CASES[case], training, monkeypatch)


# plain and member RMSNorm alike warn on a bf16 input with float32 weights (torch falls back)
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
@TRAINING
@pytest.mark.parametrize("case", RMS_NORM_CASES)
def test_rms_norm_paths(case, training, monkeypatch):
    """RMSNorm: the broadcast member scale for float32/64 (traced too), the reference for half
    precision, mixed dtypes and M = 1."""
    _check(RMS_NORM_CASES[case], training, monkeypatch)


@TRAINING
@pytest.mark.parametrize("case", GROUP_NORM_CASES)
def test_group_norm_paths(case, training, monkeypatch):
    """GroupNorm: one group norm over the tensor as one example for contiguous inputs with
    spatial dims, the reference for (M·B, C) inputs, one value per group, channels-last,
    M = 1, empty inputs and code being traced."""
    _check(GROUP_NORM_CASES[case], training, monkeypatch)


@TRAINING
@pytest.mark.parametrize("case", HF_RMS_NORM_CASES)
def test_hugging_face_rms_norms_have_one_path(case, training, monkeypatch):
    """Hugging Face RMS norms: ``_normalize`` itself, never the reference, equal to it."""
    _check(HF_RMS_NORM_CASES[case], training, monkeypatch)


TRANSFORM_CASES = {
    "batch_norm": (BATCH_NORM_CASES["bn2d_float32"], "reference"),
    "layer_norm": (LAYER_NORM_CASES["float32"], "reference"),
    "layer_norm_2d": (LAYER_NORM_2D_CASES["float32"], "reference"),
    "rms_norm": (RMS_NORM_CASES["float32"], "broadcast"),
    "group_norm": (GROUP_NORM_CASES["float32"], "one example"),
}


@pytest.mark.parametrize("name", TRANSFORM_CASES)
def test_torch_func_transforms_take_plain_op_paths(name, monkeypatch):
    """Inside vmap and grad the fused and out= kernels (no vmap or jvp rules) stand aside: batch
    and layer norms run the reference, RMS and group norm keep their plain-op paths; vmap equals
    the reference per sample and torch.func.grad the reference's input gradient (eval: vmap
    cannot update unbatched running statistics)."""
    case, path = TRANSFORM_CASES[name]
    layer = _layer(case, training=False)
    ref = copy.deepcopy(layer)
    leaf, prepare = _input(case)
    sample = prepare(leaf)
    x = torch.stack([sample, 2 * sample - 1])
    calls = _record_paths(monkeypatch, layer)
    got = torch.func.vmap(layer)(x)
    assert set(calls) == {path}, calls
    want = torch.stack([_reference_forward(ref, s) for s in x])
    torch.testing.assert_close(got, want, **TOL[case.dtype])
    calls.clear()
    grad = torch.func.grad(lambda t: layer(t).pow(2).sum())(sample)
    assert set(calls) == {path}, calls
    xi = sample.clone().requires_grad_(True)
    _reference_forward(ref, xi).pow(2).sum().backward()
    torch.testing.assert_close(grad, xi.grad, **TOL[case.dtype])
