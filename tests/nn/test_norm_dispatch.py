"""Which kernel path each member norm takes, and what the matrix of ``tests/nn/test_norms.py``
cannot say about the paths: ``force_path``, ``torch.func`` and ``torch.compile``, the autograd
functions' limits, and the errors the paths raise.

Each family's ``_normalize`` lists its paths in the order they are tried, with the condition
for each. These tests pin that list: an input meeting a path's condition runs that path (its
entry point is wrapped to record the call), with the graph that path builds. That every path
computes the per-member loop of plain norms is the matrix's
(``tests/nn/test_norms.py::test_every_member_norm_is_the_per_member_loop_of_plain_norms``).

``torch.compile``/``torch.export`` are simulated by ``torch.compiler.is_compiling`` returning
True in the path tables; the ``torch_compile`` tests compile models for real.
The ``cuda`` tests are skipped without a CUDA device.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import snens
import snens.nn as snn
from snens.nn import batch_norms, fused, triton_norms
from snens.nn.layout import model_rows
from snens.nn.norms import FORCEABLE_PATHS, force_path

from conftest import TinyTransformer, member_loop

M = 4
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
}
CUDA = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=CUDA)]

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


def _bn3d(m):
    return snn.MemberBatchNorm3d(6, m)


def _ln(m):
    return snn.MemberLayerNorm(8, m)


def _ln2d(m):
    return snn.MemberLayerNorm2d(6, m)


def _rms(m):
    return snn.MemberRMSNorm(8, m, eps=1e-6)


def _gn(m):
    return snn.MemberGroupNorm(3, 6, m)


BN_SHAPE, BN3D_SHAPE, LN_SHAPE, IMAGE_SHAPE = (3, 6, 5, 4), (2, 6, 3, 4, 2), (3, 7, 8), (3, 6, 5, 4)
F64, BF16 = torch.float64, torch.bfloat16

BATCH_NORM_CASES = {
    "bn2d_float32": Case(_bn2d, BN_SHAPE, "fused", "out="),
    "bn2d_float64": Case(_bn2d, BN_SHAPE, "fused", "out=", dtype=F64),
    "bn1d": Case(lambda m: snn.MemberBatchNorm1d(5, m), (3, 5), "fused", "out="),
    "bn1d_seq": Case(lambda m: snn.MemberBatchNorm1d(5, m), (3, 5, 7), "fused", "out="),
    "bn3d": Case(_bn3d, BN3D_SHAPE, "fused", "out="),
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
    "channels_last_3d": Case(_bn3d, BN3D_SHAPE, "out=", "out=", layout="channels_last"),
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
    # eager CPU training: the loop (measured faster than the broadcast product's backward)
    "float32": Case(_rms, LN_SHAPE, "reference"),
    "float32_no_grad": Case(_rms, LN_SHAPE, "broadcast", setting="no_grad"),
    "float64_no_grad": Case(_rms, LN_SHAPE, "broadcast", dtype=F64, setting="no_grad"),
    "two_dims_no_grad": Case(
        lambda m: snn.MemberRMSNorm((3, 8), m), (3, 3, 8), "broadcast", setting="no_grad"
    ),
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
#: what a gradient-recording path's output was made by
GRAD_FNS = {
    ("fused", "batch"): "_FusedMemberBatchNormBackward",
    ("fused", "layer"): "_FusedMemberLayerNormBackward",
    ("out=", "batch"): "_MemberBatchNormFunctionBackward",
}


def _layer(case: Case, training: bool = True, device: str = "cpu") -> snn.MemberNorm:
    g = torch.Generator().manual_seed(0)
    layer = case.make(case.members).to(case.dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        if getattr(layer, "running_mean", None) is not None:
            layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=g))
            layer.running_var.copy_(torch.rand(layer.running_var.shape, generator=g) + 0.5)
            layer.num_batches_tracked.fill_(2)
    return layer.to(device).train(training)


def _input(case: Case, device: str = "cpu") -> tuple[torch.Tensor, Callable]:
    """A leaf and what makes the layer's input of it (inside the graph, so that a strided view
    reaches the layer as it is and the leaf's gradient flows through the layout change)."""
    g = torch.Generator().manual_seed(1)
    shape = (case.members * case.shape[0], *case.shape[1:])
    if case.layout == "strided":  # every other column of a wider tensor
        shape = (*shape[:-1], 2 * shape[-1])
    leaf = (torch.randn(shape, generator=g, dtype=case.dtype) * 2 + 0.5).to(device)

    def prepare(x: torch.Tensor) -> torch.Tensor:
        if case.layout == "strided":
            x = x[..., ::2]
        if case.layout == "channels_last":
            x = x.contiguous(memory_format=_channels_last(x))
        return x.to(case.input_dtype or case.dtype)

    return leaf, prepare


def _channels_last(x: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if x.dim() == 4 else torch.channels_last_3d


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
    wrap(triton_norms, "forward", "triton")
    for name, path in (
        ("_reference", "reference"),
        ("_vectorized", "vectorized"),
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


def _check(case: Case, monkeypatch) -> None:
    """``case``'s input takes ``case.path`` (its only path) and builds that path's graph."""
    expected = case.path if case.path != "fused" or fused.available() else case.no_kernels
    if case.setting == "SNENS_FUSED=0":
        monkeypatch.setenv(fused.ENV, "0")
    if case.setting == "tracing":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    layer = _layer(case)
    calls = _record_paths(monkeypatch, layer)
    leaf, prepare = _input(case)
    with torch.set_grad_enabled(case.setting != "no_grad"):
        y = layer(prepare(leaf.requires_grad_(case.setting != "no_grad")))
    assert calls == ([expected] if expected else []), f"took {calls}, expected {expected!r}"
    if isinstance(layer, batch_norms._MemberBatchNorm):
        kind = "batch"
    else:  # MemberLayerNorm2d's output is its autograd function's, permuted back
        kind = "layer" if type(layer) is snn.MemberLayerNorm else None
    if case.setting == "no_grad":
        assert y.grad_fn is None  # no graph recorded, whichever path ran
    elif (expected, kind) in GRAD_FNS:  # a gradient is wanted: the path's autograd function
        assert type(y.grad_fn).__name__ == GRAD_FNS[expected, kind]
    if expected == "out=" and case.layout == "channels_last":  # the memory format is kept
        assert y.is_contiguous(memory_format=_channels_last(y))


@pytest.mark.parametrize("case", BATCH_NORM_CASES)
def test_batch_norm_paths(case, monkeypatch):
    """Batch norms: fused for contiguous float32/64 CPU inputs (the out= path where the kernels
    are unavailable), the per-member out= kernels for other CPU inputs (keeping a channels-last
    layout), the reference for M = 1, empty inputs and code being traced."""
    _check(BATCH_NORM_CASES[case], monkeypatch)


@pytest.mark.parametrize("case", LAYER_NORM_CASES)
def test_layer_norm_paths(case, monkeypatch):
    """LayerNorm: fused for float32/64 CPU inputs, the reference for bf16, SNENS_FUSED=0,
    M = 1, empty inputs and code being traced."""
    _check(LAYER_NORM_CASES[case], monkeypatch)


@pytest.mark.parametrize("case", LAYER_NORM_2D_CASES)
def test_layer_norm_2d_paths(case, monkeypatch):
    """Channels-first LayerNorm: LayerNorm's paths on the channels-last view."""
    _check(LAYER_NORM_2D_CASES[case], monkeypatch)


# plain and member RMSNorm alike warn on a bf16 input with float32 weights (torch falls back)
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
@pytest.mark.parametrize("case", RMS_NORM_CASES)
def test_rms_norm_paths(case, monkeypatch):
    """RMSNorm: the broadcast member scale for float32/64 without a gradient (and traced), the
    reference for eager CPU training, half precision, mixed dtypes and M = 1."""
    _check(RMS_NORM_CASES[case], monkeypatch)


@pytest.mark.parametrize("case", GROUP_NORM_CASES)
def test_group_norm_paths(case, monkeypatch):
    """GroupNorm: one group norm over the tensor as one example for contiguous inputs with
    spatial dims, the reference for (M·B, C) inputs, one value per group, channels-last,
    M = 1, empty inputs and code being traced."""
    _check(GROUP_NORM_CASES[case], monkeypatch)


@pytest.mark.parametrize("case", HF_RMS_NORM_CASES)
def test_hugging_face_rms_norms_have_one_path(case, monkeypatch):
    """Hugging Face RMS norms: ``_normalize`` itself, never the reference."""
    _check(HF_RMS_NORM_CASES[case], monkeypatch)


# -- other devices and force_path ----------------------------------------------------------------
CUDA_CASES = {
    **{f"bn_{n}": BATCH_NORM_CASES[n] for n in ("bn2d_float32", "bn2d_float64", "bn1d", "bn3d")},
    **{f"bn_{n}": BATCH_NORM_CASES[n] for n in ("channels_last", "strided", "bf16_input")},
    **{f"ln_{n}": LAYER_NORM_CASES[n] for n in ("float32", "float64", "two_dims", "no_bias")},
    "ln2d": LAYER_NORM_2D_CASES["float32"],
}


@pytest.mark.parametrize("case", CUDA_CASES)
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA)])
def test_cuda_inputs_take_the_vectorized_path(case, device, monkeypatch):
    """Without forcing, batch and layer norms on other devices than the CPU take the
    vectorized path (the fused and out= kernels are CPU code); float32 layer norms over the
    last dimensions the Triton kernels, with triton installed."""
    name, case = case, CUDA_CASES[case]
    layer = _layer(case, device=device)
    calls = _record_paths(monkeypatch, layer)
    leaf, prepare = _input(case, device)
    layer(prepare(leaf.requires_grad_(True)))
    triton = name.startswith("ln_") and case.dtype != F64 and triton_norms.available()
    assert calls == ["triton" if triton else "vectorized"], calls


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
    layer, x = _layer(LAYER_NORM_CASES["float32"]), torch.randn(M * 3, 7, 8)
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


# -- errors and the autograd functions' limits ---------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 5), (1, 5, 1)], ids=["(N, C)", "(N, C, 1)"])
def test_one_value_per_channel_is_refused_as_plain_batch_norm_refuses_it(shape, device):
    layer = snn.MemberBatchNorm1d(5, M).to(device).train()
    x = torch.randn(M * shape[0], *shape[1:], device=device)
    for path in FORCEABLE_PATHS:
        with force_path(path), pytest.raises(ValueError, match="more than 1 value per channel"):
            layer(x)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        layer(x)  # the default dispatch: on the CPU the fused or out= kernels


def test_double_backward_of_batch_norm_is_refused_clearly():
    layer = snn.MemberBatchNorm2d(6, M).train()
    x = torch.randn(M * 3, 6, 5, 4, requires_grad=True)
    (gx,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


def test_two_forwards_then_one_backward():
    """Running statistics updated by a second forward do not break the first one's backward
    (the kernels' autograd functions save what they need, not the running buffers' values)."""
    layer = _layer(BATCH_NORM_CASES["bn2d_float32"])
    ref = copy.deepcopy(layer)
    stats = {"running_mean": ref.running_mean.clone(), "running_var": ref.running_var.clone()}
    x = torch.randn(M * 3, 6, 5, 4)
    grads = []
    for run in (layer, lambda t: member_loop(ref, t, stats)):
        xi = x.clone().requires_grad_(True)
        (run(xi).sum() + run(2 * xi).pow(2).sum()).backward()
        grads.append(xi.grad)
    torch.testing.assert_close(grads[0], grads[1], **TOL[torch.float32])
    torch.testing.assert_close(layer.running_mean, stats["running_mean"], **TOL[torch.float32])


# -- torch.func and torch.compile ----------------------------------------------------------------
FUNC_CASES = {
    "batch_norm": BATCH_NORM_CASES["bn2d_float32"],
    "batch_norm_1d": BATCH_NORM_CASES["bn1d_seq"],
    "layer_norm": LAYER_NORM_CASES["float32"],
    "layer_norm_two_dims": LAYER_NORM_CASES["two_dims"],
    "layer_norm_2d": LAYER_NORM_2D_CASES["float32"],
    "rms_norm": RMS_NORM_CASES["float32"],
    "group_norm": GROUP_NORM_CASES["float32"],
}
FORCEABLE = ("batch_norm", "layer_norm")  # the families force_path acts on


def _plain_op_path(layer: snn.MemberNorm, forced: str | None, device: str) -> str:
    """The path a layer takes where its custom kernels stand aside (``torch.func``)."""
    if isinstance(layer, snn.MemberRMSNorm):
        return "broadcast"
    if isinstance(layer, snn.MemberGroupNorm):
        return "one example"
    return forced or ("reference" if device == "cpu" else "vectorized")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "name, forced",
    [(n, None) for n in FUNC_CASES]
    + [(n, "vectorized") for n in FUNC_CASES if n.startswith(FORCEABLE)],
    ids=lambda v: v or "dispatch",
)
def test_torch_func_transforms_take_plain_op_paths(name, forced, device, monkeypatch):
    """Inside vmap and grad the fused and out= kernels (no vmap or jvp rules) stand aside: by
    default batch and layer norms run the reference on the CPU (the vectorized path elsewhere),
    RMS and group norm keep their plain-op paths, and force_path("vectorized") holds; vmap equals
    the reference per sample and torch.func.grad the reference's input gradient (eval: vmap
    cannot update unbatched running statistics)."""
    case = FUNC_CASES[name]
    layer = _layer(case, training=False, device=device)
    ref = copy.deepcopy(layer)
    leaf, prepare = _input(case, device)
    sample = prepare(leaf)
    x = torch.stack([sample, 2 * sample - 1])
    calls = _record_paths(monkeypatch, layer)
    with force_path(forced) if forced else contextlib.nullcontext():
        got = torch.func.vmap(layer)(x)
        assert set(calls) == {_plain_op_path(layer, forced, device)}, calls
        grad = torch.func.grad(lambda t: layer(t).pow(2).sum())(sample)
    assert set(calls) == {_plain_op_path(layer, forced, device)}, calls
    want = torch.stack([_reference_forward(ref, s) for s in x])
    torch.testing.assert_close(got, want, **TOL[case.dtype])
    xi = sample.clone().requires_grad_(True)
    _reference_forward(ref, xi).pow(2).sum().backward()
    torch.testing.assert_close(grad, xi.grad, **TOL[case.dtype])


def test_torch_compile_of_a_model_with_member_norms_runs():
    """Compiled (aot_eager) with the default dispatch, a model of member batch, group and layer
    norms gives the eager model's output and a gradient for gamma."""
    if not torch._dynamo.is_dynamo_supported():  # e.g. a Python newer than this torch knows
        pytest.skip("torch.compile is not supported on this Python/platform")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        snn.MemberBatchNorm2d(8, M),
        torch.nn.ReLU(),
        snn.MemberGroupNorm(2, 8, M),
        torch.nn.Flatten(1),
        snn.MemberLayerNorm(8 * 4 * 4, M),
    )
    x = torch.randn(M * 2, 3, 4, 4)
    want = copy.deepcopy(model)(x)
    got = torch.compile(model, backend="aot_eager")(x)  # any failure here is a failure
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    got.sum().backward()
    assert model[1].gamma.grad is not None


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_compiled_ensemble_is_one_graph(mode):
    """torch.compile of a converted model traces it whole: the batch-layout check of each
    member layer (a ContextVar, which dynamo cannot trace) broke the graph once per member
    norm (a 2-block transformer: 5 breaks), so a deep model reached dynamo's recompile limit
    and ran its norms eagerly."""
    if not torch._dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not supported on this Python/platform")
    torch.manual_seed(0)
    ens = getattr(snens.convert(TinyTransformer(), num_members=M), mode)()
    ids = torch.randint(1, 50, (2, 7))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(ens)(ids)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), [
        str(r.reason)[:200] for r in explained.break_reasons
    ]
    # the layout check still runs eagerly, where it names the mistake
    norm = ens.model.norm
    with model_rows(M * 2), pytest.raises(ValueError, match="not a multiple of the 8 rows"):
        norm(torch.randn(M * 2 + 1, 16))


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
