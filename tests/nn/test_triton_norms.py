"""The Triton member-norm kernels (``snens.nn.triton_norms``) against each family's ``_reference``.

Without a CUDA device the kernels run in Triton's interpreter on CPU tensors
(``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before triton is imported), so CI checks
their arithmetic without a GPU: forward values and the gradients of x, gamma, weight and bias in
float32, bfloat16 and float16, on shapes that stress the tiling (rows not a multiple of a tile,
hidden sizes not a power of two, several backward programs per member, M = 1). Which inputs the
dispatch sends to the kernels is pinned here too. The ``cuda`` tests run the compiled kernels
through the default dispatch on a GPU (skipped without one). ``tests/nn/test_norms.py``'s matrix
holds the kernels' path to the per-member loop of plain norms for every family that has it.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

import snens.nn as snn
from snens.nn import triton_norms
from snens.nn.norms import force_path

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None, reason="needs triton (pip install triton)"
    ),
    pytest.mark.usefixtures("one_thread"),
]
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
# (output, gradients): float32 sums in another order; half precision rounds at other points.
# bf16 output: Triton's interpreter truncates to bfloat16 where a GPU rounds to nearest (2,032
# of 4,096 random float32 values measured one ulp apart), and DeBERTa's formula rounds twice
# (the product, then the sum with the bias): measured up to 0.125 at |y| = 4.8 (D=300).
TOL = {
    torch.float32: ({"rtol": 1e-5, "atol": 1e-5}, {"rtol": 1e-4, "atol": 1e-4}),
    torch.float16: ({"rtol": 4e-3, "atol": 4e-3}, {"rtol": 1e-2, "atol": 1e-2}),
    torch.bfloat16: ({"rtol": 2e-2, "atol": 5e-2}, {"rtol": 6e-2, "atol": 6e-2}),
}


def _llama(features: int, members: int) -> snn.MemberNorm:
    return snn.MemberLlamaRMSNorm(features, members, eps=1e-5)


def _deberta(features: int, members: int) -> snn.MemberNorm:
    return snn.MemberDebertaLayerNorm(features, members, eps=1e-7)


LAYERS = {
    "rms_norm": lambda d, m: snn.MemberRMSNorm(d, m),
    "layer_norm": lambda d, m: snn.MemberLayerNorm(d, m),
    "layer_norm_no_bias": lambda d, m: snn.MemberLayerNorm(d, m, bias=False),
    "llama": _llama,
    "deberta": _deberta,
}
# (members, rows per member, features, backward programs per member): rows not a multiple of
# a tile, features not a power of 2, one member, several programs over unequal chunks
SHAPES = [(3, 7, 37, None), (2, 13, 300, 3), (1, 5, 24, None), (4, 1, 5, 1), (2, 9, 130, 2)]


def _layer(name: str, features: int, members: int, dtype: torch.dtype, device="cpu"):
    if name in ("llama", "deberta") and not HAS_TRANSFORMERS:
        pytest.skip("the Hugging Face member norms' tests run with transformers installed")
    g = torch.Generator().manual_seed(0)
    layer = LAYERS[name](features, members)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return layer.to(device, dtype)


def _run(layer, x, grad, through_triton: bool):
    """Output and the gradients of x and of every parameter, through the kernels or through
    the layer's ``_reference``."""
    x = x.clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    if through_triton:
        with force_path("triton"):
            assert triton_norms.applies(layer, x)
            y = layer(x)
    else:
        y = layer._reference(x, *layer.scale_and_shift())
    y.backward(grad)
    return [y, x.grad, *(p.grad for p in layer.parameters())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "M{}_R{}_D{}_P{}".format(*s))
@pytest.mark.parametrize("name", LAYERS)
def test_the_kernels_compute_the_reference(name, shape, dtype, monkeypatch):
    members, rows, features, programs = shape
    layer = _layer(name, features, members, dtype)
    ref = copy.deepcopy(layer)
    g = torch.Generator().manual_seed(1)
    x = (0.5 + 2 * torch.randn(members * rows, 2, features, generator=g)).to(dtype)
    grad = torch.randn(x.shape, generator=g).to(dtype)
    if programs is not None:
        real = triton_norms.member_norm
        monkeypatch.setattr(
            triton_norms, "member_norm", lambda *a, **k: real(*a, **k, programs=programs)
        )
    got = _run(layer, x, grad, through_triton=True)
    want = _run(ref, x, grad, through_triton=False)
    out_tol, grad_tol = TOL[dtype]
    names = ["output", "x grad", *(n + " grad" for n, _ in layer.named_parameters())]
    for label, a, b in zip(names, got, want, strict=True):
        assert a.dtype == b.dtype, label
        torch.testing.assert_close(a, b, **(out_tol if label == "output" else grad_tol), msg=label)


@pytest.mark.parametrize("name", ["llama", "deberta", "olmo2", "gemma"])
def test_hugging_face_formulas_take_a_half_input_to_float32_parameters(name):
    """A bf16 input to a float32 member norm gives the formula's dtype: Llama's and DeBERTa's
    the promoted float32 (x̂ rounded to bf16 first), OLMo-2's and Gemma's x's bf16."""
    if not HAS_TRANSFORMERS:
        pytest.skip("the Hugging Face member norms' tests run with transformers installed")
    make = {
        "olmo2": lambda d, m: snn.MemberOlmo2RMSNorm(d, m),
        "gemma": lambda d, m: snn.MemberGemmaRMSNorm(d, m),
    }.get(name) or LAYERS[name]
    g = torch.Generator().manual_seed(0)
    layer = make(40, 2)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    ref = copy.deepcopy(layer)
    x = torch.randn(2 * 5, 40, generator=g).bfloat16()
    expected = torch.float32 if name in ("llama", "deberta") else torch.bfloat16
    y_ref = ref._reference(x, *ref.scale_and_shift())
    grad = torch.randn(x.shape, generator=g).to(y_ref.dtype)
    got = _run(layer, x, grad, through_triton=True)
    want = _run(ref, x, grad, through_triton=False)
    assert got[0].dtype == want[0].dtype == expected
    out_tol, grad_tol = TOL[torch.bfloat16]
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, **(out_tol if i == 0 else grad_tol), msg=str(i))


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_the_cuda_autocast_arithmetic(name):
    """What the dispatch runs for a half input under CUDA autocast, which runs torch's layer
    and RMS norms in float32: the bf16 input read as it is, a float32 output, nothing rounded
    first; equal to the reference on the input cast to float32."""
    layer = _layer(name, 24, 3, torch.float32)
    ref = copy.deepcopy(layer)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3 * 4, 24, generator=g).bfloat16()
    xi = x.clone().requires_grad_(True)
    variant = type(layer).triton_variant
    eps = torch.finfo(torch.float32).eps if layer.eps is None else layer.eps
    with force_path("triton"):
        y = triton_norms.member_norm(
            xi,
            layer.gamma,
            layer.weight,
            layer.bias,
            3,
            eps,
            variant,
            out_dtype=torch.float32,
            round_first=False,
        )
    grad = torch.randn(y.shape, generator=g)
    y.backward(grad)
    want = _run(ref, x.float(), grad, through_triton=False)
    assert y.dtype == torch.float32 and xi.grad.dtype == torch.bfloat16
    torch.testing.assert_close(y, want[0], **TOL[torch.float32][0])
    torch.testing.assert_close(xi.grad, want[1].bfloat16(), **TOL[torch.bfloat16][1])
    for p, w in zip(layer.parameters(), want[2:], strict=True):
        torch.testing.assert_close(p.grad, w, **TOL[torch.float32][1])


def test_a_large_mean_is_centred_before_the_variance():
    """Layer norm of rows far from zero (mean 1000, std 3) in float32: the variance is taken
    around the mean, not as E[x²] − E[x]², which would lose every digit."""
    layer = _layer("layer_norm", 96, 2, torch.float32)
    g = torch.Generator().manual_seed(3)
    x = 1000 + 3 * torch.randn(2 * 6, 96, generator=g)
    with force_path("triton"), torch.no_grad():
        got = layer(x)
    want = layer._reference(x, *layer.scale_and_shift()).detach()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_without_grad_no_graph_is_recorded():
    layer = _layer("rms_norm", 16, 2, torch.float32)
    x = torch.randn(4, 16)
    with force_path("triton"), torch.no_grad():
        y = layer(x)
    assert y.grad_fn is None
    torch.testing.assert_close(y, layer._reference(x, *layer.scale_and_shift()).detach())


def test_a_frozen_affine_gets_no_gradient_and_x_still_does():
    layer = _layer("layer_norm", 20, 2, torch.float32).requires_grad_(False)
    ref = copy.deepcopy(layer)
    x = torch.randn(6, 20)
    grad = torch.randn(6, 20)
    got = _run(layer, x, grad, through_triton=True)
    want = _run(ref, x, grad, through_triton=False)
    assert all(p.grad is None for p in layer.parameters())
    torch.testing.assert_close(got[1], want[1], **TOL[torch.float32][1])


# -- which inputs the dispatch sends to the kernels ----------------------------------------------
def test_cpu_inputs_take_the_kernels_only_when_forced():
    layer = _layer("rms_norm", 8, 2, torch.float32)
    x = torch.randn(4, 8)
    assert not triton_norms.applies(layer, x)
    with force_path("triton"):
        assert triton_norms.applies(layer, x)
    for other in ("vectorized", "reference"):
        with force_path(other):
            assert not triton_norms.applies(layer, x)


@pytest.mark.parametrize(
    "why",
    ["float64", "mixed_dtypes", "empty", "too_wide", "compiling", "autocast_half", "env_off"],
)
def test_inputs_the_kernels_do_not_take(why, monkeypatch):
    features = triton_norms.MAX_FEATURES + 1 if why == "too_wide" else 8
    layer = _layer("layer_norm", features, 2, torch.float32)
    x = torch.randn(0 if why == "empty" else 4, features)
    if why == "float64":
        layer, x = layer.double(), x.double()
    if why in ("mixed_dtypes", "autocast_half"):
        x = x.bfloat16()
    if why == "autocast_half":
        layer = layer.bfloat16()
    if why == "compiling":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    if why == "env_off":
        monkeypatch.setenv(triton_norms.ENV, "0")
    with force_path("triton"), torch.autocast("cpu", enabled=why == "autocast_half"):
        assert not triton_norms.applies(layer, x)


def test_families_without_a_variant_of_their_own_keep_their_paths():
    """Layer norm over the channels (a subclass of MemberLayerNorm), group and batch norms
    declare no kernel; Cohere's per-head (H, D) weight normalizes over D alone."""
    x = torch.randn(4, 6, 3, 3)
    for layer in (snn.MemberLayerNorm2d(6, 2), snn.MemberGroupNorm(2, 6, 2)):
        with force_path("triton"):
            assert not triton_norms.applies(layer, x)
    if HAS_TRANSFORMERS:
        cohere = snn.MemberCohereLayerNorm((3, 8), 2)
        with force_path("triton"):
            assert not triton_norms.applies(cohere, torch.randn(4, 5, 3, 8))
            assert triton_norms.applies(snn.MemberCohereLayerNorm(8, 2), torch.randn(4, 8))


def test_forcing_the_kernels_on_the_cpu_without_the_interpreter_is_an_error(monkeypatch):
    monkeypatch.setattr(triton_norms, "_interpreted", lambda: False)
    layer = _layer("rms_norm", 8, 2, torch.float32)
    with force_path("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        layer(torch.randn(4, 8))


# -- CUDA: the compiled kernels through the default dispatch ------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize(
    "shape", [(4, 8 * 16, 576), (4, 33, 384), (1, 7, 100), (2, 3, 4096)], ids=str
)
def test_cuda_dispatch_takes_the_kernels(name, shape, dtype, monkeypatch):
    """On a GPU the default dispatch runs the kernels (SmolLM2's hidden size 576 at M·B·T rows,
    ViT-S's 384, odd sizes, a wide one) and they compute the reference."""
    members, rows, features = shape
    layer = _layer(name, features, members, dtype, "cuda")
    ref = copy.deepcopy(layer)
    calls = []
    real = triton_norms.forward
    monkeypatch.setattr(triton_norms, "forward", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(1)
    x = (0.5 + 2 * torch.randn(members * rows, features, generator=g)).to("cuda", dtype)
    grad = torch.randn(x.shape, generator=g).to("cuda", dtype)
    xi = x.clone().requires_grad_(True)
    y = layer(xi)
    y.backward(grad)
    assert calls
    want = _run(ref, x, grad, through_triton=False)
    out_tol, grad_tol = TOL[dtype]
    got = [y, xi.grad, *(p.grad for p in layer.parameters())]
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, **(out_tol if i == 0 else grad_tol), msg=str(i))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "llama"])
def test_cuda_autocast_takes_the_kernels(name, monkeypatch):
    """A bf16 input to a float32 member norm under CUDA autocast (the LLM benchmark's row, a
    mixed-precision step) runs the kernels and computes the reference under autocast."""
    layer = _layer(name, 576, 4, torch.float32, "cuda")
    ref = copy.deepcopy(layer)
    calls = []
    real = triton_norms.forward
    monkeypatch.setattr(triton_norms, "forward", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(4 * 64, 576, device="cuda").bfloat16()
    results = []
    for run, via in ((layer, True), (ref, False)):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = run(xi) if via else run._reference(xi, *run.scale_and_shift())
        y.float().square().mean().backward()
        results.append([y, xi.grad, *(p.grad for p in run.parameters())])
    assert calls
    for i, (a, b) in enumerate(zip(*results, strict=True)):
        assert a.dtype == b.dtype, i
        torch.testing.assert_close(a, b, **TOL[torch.bfloat16][0 if i == 0 else 1], msg=str(i))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_first_call_that_fails_on_a_gpu_turns_the_kernels_off(monkeypatch):
    """A GPU or driver Triton cannot compile for: the first call's error is a warning, the
    layer takes its other path, and the kernels stay off for the process."""
    monkeypatch.setattr(triton_norms, "_working", set())
    monkeypatch.setattr(triton_norms, "_failure", None)

    def failing(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(triton_norms, "member_norm", failing)
    layer = _layer("rms_norm", 32, 2, torch.float32, "cuda")
    x = torch.randn(8, 32, device="cuda")
    with pytest.warns(RuntimeWarning, match="no kernel image"):
        y = layer(x)
    torch.testing.assert_close(y, layer._reference(x, *layer.scale_and_shift()))
    assert not triton_norms.available() and not triton_norms.applies(layer, x)
