"""Member norms: each member is the plain norm on its own rows, with sigmoid(gamma) on top.

The matrix, ``test_every_member_norm_is_the_per_member_loop_of_plain_norms``, holds every kernel
path of every member norm to its definition, the per-member loop of plain norms: member m's rows
through ``to_plain(m)``, the plain class (torch's, or the Hugging Face class it converted)
holding sigmoid(gamma_m)·weight_m and sigmoid(gamma_m)·bias_m. It compares the output, the input
gradient, the gradients of gamma, weight and bias (the plain weights' and biases' gradients
carried back through the folding) and, for batch norms, running_mean, running_var and
num_batches_tracked, at every step: two training steps for batch norms (their running statistics
move twice), one for the others, then an eval step. Its axes:

* family (``FAMILIES``): every member norm class, torch's and Hugging Face's (with
  ``transformers`` installed), some on inputs of several shapes (odd sizes, zero to three
  spatial dimensions, one value per group, a wide layer norm far from zero);
* path (``PATHS``): the default dispatch (on the CPU: the fused kernels, the native out=
  kernels, the broadcast or one-example paths, as each ``_normalize`` lists them), the dispatch
  with ``SNENS_FUSED=0`` (the native paths the fused kernels fall back to; CPU only), the
  vectorized path (batch and layer norms) and the reference, ``_reference``, each family's
  definition (both forced by ``snens.nn.norms.force_path`` for batch and layer norms; for the
  others ``_reference`` runs in place of ``_normalize``), and the Triton kernels of the RMS and
  layer norms (``force_path("triton")``; on the CPU in Triton's interpreter, with ``triton``
  installed);
* dtype (``DTYPES``): float32, float64, bfloat16, each with its tolerances;
* input (``INPUTS``): contiguous for every family; for the families where it picks another path
  or branch, channels-last, strided (with an expanded output gradient), under ``no_grad``, with a
  frozen affine, one example per member, one member, empty, a bf16 input to a float32 norm, bf16
  autocast;
* device: the CPU, and CUDA (``cuda``-marked, skipped without a device).

Which path an input takes, ``torch.func`` and ``torch.compile`` are
``tests/nn/test_norm_dispatch.py``'s; the fused kernels' build, fallbacks and thread counts
``tests/nn/test_fused.py``'s.
"""

import contextlib
import copy
import functools
import importlib.util
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import snens
import snens.nn as snn
from snens.nn import fused, triton_norms
from snens.nn.norms import force_path
from snens.nn.registry import member_converter

M, B = 4, 6
TOL = {"rtol": 1e-5, "atol": 1e-5}
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None

pytestmark = pytest.mark.usefixtures("one_thread")


def _randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random affine and running stats, so identity-like defaults cannot hide a bug; two batches
    tracked, so that a cumulative average (momentum=None) weighs the next one 1/3."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            elif name.endswith("num_batches_tracked"):
                b.fill_(2)
    return module


# (plain layer, member class, input shape per member)
CASES = {
    "bn1d": (lambda: nn.BatchNorm1d(5), snn.MemberBatchNorm1d, (B, 5)),
    "bn1d_seq": (lambda: nn.BatchNorm1d(5), snn.MemberBatchNorm1d, (B, 5, 7)),
    "bn2d": (lambda: nn.BatchNorm2d(5), snn.MemberBatchNorm2d, (B, 5, 4, 3)),
    "bn3d": (lambda: nn.BatchNorm3d(5), snn.MemberBatchNorm3d, (B, 5, 2, 3, 2)),
    "ln": (lambda: nn.LayerNorm(5), snn.MemberLayerNorm, (B, 7, 5)),
    "ln2": (lambda: nn.LayerNorm((3, 5)), snn.MemberLayerNorm, (B, 3, 5)),
    "gn": (lambda: nn.GroupNorm(2, 6), snn.MemberGroupNorm, (B, 6, 4, 3)),
    "rms": (lambda: nn.RMSNorm(5), snn.MemberRMSNorm, (B, 7, 5)),
    "in1d": (lambda: nn.InstanceNorm1d(5, affine=True), snn.MemberInstanceNorm1d, (B, 5, 7)),
    "in2d": (lambda: nn.InstanceNorm2d(5, affine=True), snn.MemberInstanceNorm2d, (B, 5, 4, 3)),
    "in3d": (
        lambda: nn.InstanceNorm3d(5, 1e-3, affine=True),
        snn.MemberInstanceNorm3d,
        (B, 5, 2, 3, 2),
    ),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("training", [True, False])
def test_from_plain_reproduces_the_plain_layer(case, training):
    """M=1 and M=4 both compute exactly the plain layer right after conversion."""
    make_plain, cls, shape = CASES[case]
    plain = _randomize(make_plain()).train(training)
    for num_members in (1, M):
        layer = cls.from_plain(plain, num_members).train(training)
        x = torch.randn(num_members * shape[0], *shape[1:])
        ref = torch.cat([plain(x[m * B : (m + 1) * B]) for m in range(num_members)])
        torch.testing.assert_close(layer(x), ref, **TOL)
        # gamma starts asymmetric: the regularizer needs members to differ
        if num_members > 1:
            assert layer.gamma.std(dim=0).min() > 0


# -- the matrix: family × path × dtype × input × device ------------------------------------------
class LayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm2d: layer norm over the channels of (B, C, *) inputs."""

    def forward(self, x):
        y = F.layer_norm(x.movedim(1, -1), self.normalized_shape, self.weight, self.bias, self.eps)
        return y.movedim(-1, 1)


def _hf(module_path: str, name: str, *args, **kwargs):
    def make():
        module = importlib.import_module(f"transformers.models.{module_path}")
        return getattr(module, name)(*args, **kwargs)

    return make


@dataclass(frozen=True)
class Family:
    """A plain norm, one member's input shape, and the class ``to_plain`` gives back."""

    make: Callable[[], nn.Module]
    shape: tuple[int, ...]
    plain_class: type | tuple[str, str]  # a Hugging Face class as (module, name)
    mean: float = 0.5  # inputs are mean + std · N(0, 1)
    std: float = 2.0


FAMILIES = {
    "batch_norm_1d": Family(lambda: nn.BatchNorm1d(5), (B, 5, 7), nn.BatchNorm1d),
    "batch_norm_1d_flat": Family(lambda: nn.BatchNorm1d(5), (B, 5), nn.BatchNorm1d),
    "batch_norm_2d": Family(lambda: nn.BatchNorm2d(5), (B, 5, 4, 3), nn.BatchNorm2d),
    "batch_norm_2d_no_stats": Family(  # batch statistics in eval too
        lambda: nn.BatchNorm2d(5, track_running_stats=False), (B, 5, 4, 3), nn.BatchNorm2d
    ),
    "batch_norm_2d_cumulative": Family(  # momentum=None: num_batches_tracked sets the factor
        lambda: nn.BatchNorm2d(5, momentum=None), (B, 5, 4, 3), nn.BatchNorm2d
    ),
    "batch_norm_3d": Family(lambda: nn.BatchNorm3d(5), (B, 5, 2, 3, 2), nn.BatchNorm3d),
    "layer_norm": Family(lambda: nn.LayerNorm(5), (B, 7, 5), nn.LayerNorm),
    "layer_norm_flat": Family(lambda: nn.LayerNorm(16), (B, 16), nn.LayerNorm),
    "layer_norm_two_dims": Family(lambda: nn.LayerNorm((3, 5)), (B, 3, 5), nn.LayerNorm),
    "layer_norm_no_bias": Family(lambda: nn.LayerNorm(8, bias=False), (B, 7, 8), nn.LayerNorm),
    "layer_norm_two_dims_no_bias": Family(
        lambda: nn.LayerNorm((3, 8), bias=False), (B, 3, 8), nn.LayerNorm
    ),
    # the fused kernel's vectorized loops over a large D, on inputs whose mean is far from 0
    "layer_norm_wide": Family(lambda: nn.LayerNorm(384), (2, 5, 384), nn.LayerNorm, 1000, 300),
    "layer_norm_2d": Family(lambda: LayerNorm2d(6), (B, 6, 4, 3), LayerNorm2d),
    "layer_norm_2d_sequence": Family(lambda: LayerNorm2d(6), (B, 6, 7), LayerNorm2d),
    "group_norm": Family(lambda: nn.GroupNorm(2, 6), (B, 6, 4, 3), nn.GroupNorm),
    "group_norm_sequence": Family(lambda: nn.GroupNorm(2, 6), (B, 6, 7), nn.GroupNorm),
    "group_norm_volume": Family(lambda: nn.GroupNorm(2, 6), (B, 6, 3, 2, 2), nn.GroupNorm),
    "group_norm_flat": Family(lambda: nn.GroupNorm(2, 6), (B, 6), nn.GroupNorm),
    "group_norm_one_value_per_group": Family(lambda: nn.GroupNorm(6, 6), (B, 6, 1), nn.GroupNorm),
    "rms_norm": Family(lambda: nn.RMSNorm(5), (B, 7, 5), nn.RMSNorm),
    "rms_norm_two_dims": Family(lambda: nn.RMSNorm((3, 8), eps=1e-6), (B, 3, 8), nn.RMSNorm),
    "instance_norm_1d": Family(
        lambda: nn.InstanceNorm1d(5, affine=True), (B, 5, 7), nn.InstanceNorm1d
    ),
    "instance_norm_2d": Family(lambda: nn.InstanceNorm2d(5), (B, 5, 4, 3), nn.InstanceNorm2d),
    "instance_norm_3d": Family(
        lambda: nn.InstanceNorm3d(5, 1e-3, affine=True), (B, 5, 2, 3, 2), nn.InstanceNorm3d
    ),
}
HF_FAMILIES = {
    "llama": ("llama.modeling_llama", "LlamaRMSNorm"),
    "t5": ("t5.modeling_t5", "T5LayerNorm"),
    "olmo2": ("olmo2.modeling_olmo2", "Olmo2RMSNorm"),
    "gemma3n": ("gemma3n.modeling_gemma3n", "Gemma3nRMSNorm"),
    "gemma": ("gemma.modeling_gemma", "GemmaRMSNorm"),
    "cohere": ("cohere.modeling_cohere", "CohereLayerNorm"),
    "deberta": ("deberta.modeling_deberta", "DebertaLayerNorm"),
    "olmo": ("olmo.modeling_olmo", "OlmoLayerNorm"),  # weightless; to_plain: CohereLayerNorm
}
if HAS_TRANSFORMERS:
    for family, (path, name) in HF_FAMILIES.items():
        back = ("cohere.modeling_cohere", "CohereLayerNorm") if family == "olmo" else (path, name)
        FAMILIES[family] = Family(_hf(path, name, 8), (B, 7, 8), back)
#: the families with fused kernels and a vectorized path, which force_path acts on
KERNEL_FAMILIES = [f for f in FAMILIES if f.startswith(("batch_norm", "layer_norm"))]
#: the families with Triton kernels (snens.nn.triton_norms): torch's RMS and layer norms over
#: the last dimensions and Hugging Face's, not layer norms over the channels
TRITON_FAMILIES = [
    f
    for f in FAMILIES
    if f.startswith(("layer_norm", "rms_norm"))
    and not f.startswith("layer_norm_2d")
    or f in HF_FAMILIES
]
#: the default dispatch; with SNENS_FUSED=0 (the fused kernels' fallbacks); the vectorized
#: path; the reference, ``_reference`` (the definition every other path is held to)
PATHS = ("dispatch", "no_fused", "vectorized", "reference")
DTYPES = {  # (output, gradients)
    torch.float32: ({"rtol": 1e-5, "atol": 1e-5}, {"rtol": 1e-4, "atol": 1e-4}),
    torch.float64: ({"rtol": 1e-10, "atol": 1e-10}, {"rtol": 1e-9, "atol": 1e-9}),
    # output and input gradient: bf16 kernels round at other points than the plain ones
    torch.bfloat16: ({"rtol": 2e-2, "atol": 2e-2}, {"rtol": 6e-2, "atol": 6e-2}),
}
F32, F32_F64, ALL_DTYPES = (torch.float32,), (torch.float32, torch.float64), tuple(DTYPES)


@dataclass(frozen=True)
class Input:
    """How the member norm's input is made and run, and for which families and dtypes."""

    families: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES  # of the norm
    layout: str = "contiguous"  # "channels_last", or "strided": every other last-dim column
    members: int = M
    rows: int | None = None  # per member; None: the family's
    bf16_input: bool = False  # a bf16 input to a norm of another dtype
    autocast: bool = False  # bf16 autocast on the input's device
    grad: str = "all"  # "none": under no_grad; "input": a frozen affine
    cuda: bool = True  # also on CUDA


BATCH_NORMS = ("batch_norm_1d", "batch_norm_2d", "batch_norm_3d")
INPUTS = {
    "contiguous": Input(tuple(FAMILIES)),
    "channels_last": Input(
        ("batch_norm_2d", "batch_norm_3d", "layer_norm_2d", "group_norm", "group_norm_volume"),
        F32_F64,
        layout="channels_last",
    ),
    "strided": Input(("batch_norm_1d_flat", "batch_norm_2d", "layer_norm"), F32, "strided"),
    "no_grad": Input(
        (*BATCH_NORMS, "batch_norm_2d_no_stats", "batch_norm_2d_cumulative", "layer_norm"),
        F32_F64,
        grad="none",
    ),
    "frozen_affine": Input(("batch_norm_2d", "layer_norm"), F32, grad="input"),
    "one_row": Input(
        (*BATCH_NORMS, "layer_norm", "layer_norm_flat", "group_norm", "rms_norm"), F32_F64, rows=1
    ),
    "one_member": Input(
        ("batch_norm_2d", "layer_norm", "layer_norm_2d", "group_norm", "rms_norm"), F32, members=1
    ),
    "empty": Input(("batch_norm_2d", "layer_norm", "group_norm"), F32, rows=0),
    "bf16_input": Input(("batch_norm_2d",), F32, bf16_input=True),
    # CUDA's layer norm may not take a bf16 input with float32 weights (autocast is how CUDA
    # gets bf16 inputs): the per-example norms take one on the CPU only
    "bf16_input_cpu": Input(
        ("layer_norm", "layer_norm_2d", "group_norm", "rms_norm"), F32, bf16_input=True, cuda=False
    ),
    "autocast": Input((*BATCH_NORMS, "layer_norm", "group_norm", "rms_norm"), F32, autocast=True),
    "bf16_input_autocast": Input(
        (*BATCH_NORMS, "layer_norm", "group_norm", "rms_norm"), F32, bf16_input=True, autocast=True
    ),
}
DEVICES = {
    "cpu": (),
    "cuda": (
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ),
}


def _paths(family: str, dtype: torch.dtype, device: str, case: Input) -> tuple[str, ...]:
    """The paths of ``PATHS`` that ``family`` has for this dtype, device and input, and
    "triton" on the CPU (Triton's interpreter) where the kernels take the input (float32 or
    bf16, non-empty, x of the norm's dtype)."""
    triton = (
        ("triton",)
        if family in TRITON_FAMILIES
        and device == "cpu"  # on CUDA the dispatch takes the kernels: its rows check them
        and dtype != torch.float64
        and case.rows != 0
        and not case.bf16_input
        else ()
    )
    if family not in KERNEL_FAMILIES:
        return ("dispatch", "reference", *triton)
    # SNENS_FUSED=0 changes only what the fused kernels take: float32/64 CPU inputs
    fusable = device == "cpu" and dtype != torch.bfloat16 and not case.bf16_input
    return (*(PATHS if fusable else [p for p in PATHS if p != "no_fused"]), *triton)


NO_TRITON = pytest.mark.skipif(not HAS_TRITON, reason="needs triton (pip install triton)")


MATRIX = [
    pytest.param(
        family,
        path,
        dtype,
        name,
        device,
        marks=(*marks, NO_TRITON) if path == "triton" else marks,
        id=f"{family}-{path}-{str(dtype)[6:]}-{name}-{device}",
    )
    for name, case in INPUTS.items()
    for device, marks in DEVICES.items()
    if case.cuda or device == "cpu"
    for family in case.families
    if family in FAMILIES
    for dtype in case.dtypes
    for path in _paths(family, dtype, device, case)
]


def _plain_class(family: str) -> type:
    back = FAMILIES[family].plain_class
    if isinstance(back, tuple):
        return getattr(importlib.import_module(f"transformers.models.{back[0]}"), back[1])
    return back


def _input_tolerances(family: str, dtype: torch.dtype, case: Input) -> tuple[dict, dict]:
    """The (output, gradient) tolerances of the dtype the norm computes in."""
    if case.bf16_input or case.autocast:
        dtype = torch.bfloat16
    # Hugging Face's norms compute in float32 whatever the input, float64's included
    if family in HF_FAMILIES and dtype == torch.float64:
        dtype = torch.float32
    return DTYPES[dtype]


def _exact_affine_grads(family: str, path: str, device: str, dtype: torch.dtype, case: Input):
    """Whether the member's gamma, weight and bias gradients are held, to the output tolerance,
    to the plain loop's run in float64 on the same values, rather than to its own: CPU layer
    norm's backward for bf16 inputs sums the affine gradients imprecisely (a bias gradient of
    0.484 where exact arithmetic on the same bf16 values gives 0.4466, and the vectorized path
    0.4466 to 2e-7), so the vectorized path (M > 1; M = 1 takes the loop) is held to the exact
    sums."""
    bf16 = dtype == torch.bfloat16 or case.bf16_input
    vectorized = path == "vectorized" and case.members > 1
    return device == "cpu" and bf16 and vectorized and family.startswith("layer_norm")


def _member_grads(member: snn.MemberNorm, plains: list[nn.Module]) -> dict[str, torch.Tensor]:
    """The gradients of the member's gamma, weight and bias that the plain norms' weight and bias
    gradients give through the folding (scale_m = sigmoid(gamma_m)·weight_m, shift_m likewise)."""
    scale, shift = member.scale_and_shift()
    tensors = [scale] + ([] if shift is None else [shift])
    names = ["weight"] + ([] if shift is None else ["bias"])
    grads = [
        torch.stack([getattr(p, n).grad for p in plains]).to(t) for n, t in zip(names, tensors)
    ]
    params = dict(member.named_parameters())
    return dict(zip(params, torch.autograd.grad(tensors, list(params.values()), grads)))


def _plain_loop(plains: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Each plain norm on its member's rows of ``x``, concatenated."""
    rows = x.shape[0] // len(plains)
    return torch.cat([p(x[m * rows : (m + 1) * rows]) for m, p in enumerate(plains)])


@functools.cache
def _converted(family: str, dtype: torch.dtype, members: int) -> snn.MemberNorm:
    """The family's plain norm (random affine and statistics) through ``snens.convert``'s own
    lookup; once per family, dtype and M (Hugging Face norms are recognized by probing them,
    60 ms each)."""
    plain = _randomize(FAMILIES[family].make()).to(dtype)
    return member_converter(plain)(plain, members, generator=torch.Generator().manual_seed(0))


def _member_and_plains(family: str, dtype, device: str, case: Input, tol: dict):
    """A member norm from ``snens.convert``'s own lookup with its members set apart, and the
    plain norms of its loop, each holding its member's folded affine."""
    member = copy.deepcopy(_converted(family, dtype, case.members))
    member = _randomize(member.to(dtype), seed=1).to(device)  # members apart
    plains = [member.to_plain(m) for m in range(case.members)]
    assert all(type(p) is _plain_class(family) and p.training == member.training for p in plains)
    scale, shift = member.scale_and_shift()
    weights = torch.stack([p.weight for p in plains]) + (1 if family == "gemma" else 0)  # 1 + w
    torch.testing.assert_close(weights.to(dtype), scale.detach(), **tol)
    if shift is not None:
        torch.testing.assert_close(torch.stack([p.bias for p in plains]), shift.detach(), **tol)
    if case.grad == "input":
        for module in (member, *plains):
            module.requires_grad_(False)
    return member, plains


@contextlib.contextmanager
def _through_triton(monkeypatch):
    """``force_path("triton")``, checked: the Triton kernels ran within the block."""
    calls = []
    real = triton_norms.forward
    monkeypatch.setattr(triton_norms, "forward", lambda *a: calls.append(1) or real(*a))
    with force_path("triton"):
        yield
    assert calls, "the Triton kernels did not run"


def _taking(path: str, family: str, member: snn.MemberNorm, monkeypatch):
    """What makes ``member`` take ``path``: the context each forward runs in."""
    if path == "triton":
        return lambda: _through_triton(monkeypatch)
    if path == "no_fused":
        monkeypatch.setenv(fused.ENV, "0")
    if path in ("vectorized", "reference") and family in KERNEL_FAMILIES:
        return lambda: force_path(path)
    if path == "reference":  # a stateless norm: its definition in place of its dispatch
        monkeypatch.setattr(member, "_normalize", member._reference)
    return contextlib.nullcontext


def _inputs(family: str, case: Input, dtype, device: str, g: torch.Generator):
    """Two leaves of equal values (the member's, the loop's) and what makes a norm's input of
    one, inside the graph: a strided view, a channels-last copy, a bf16 cast."""
    fam = FAMILIES[family]
    shape = ((fam.shape[0] if case.rows is None else case.rows) * case.members, *fam.shape[1:])
    values = fam.mean + fam.std * torch.randn(shape, generator=g)
    if case.layout == "strided":  # every other column of one twice as wide
        values = torch.stack([values, torch.randn(shape, generator=g)], -1).flatten(-2)
    values = values.to(device, dtype)

    def prepare(leaf: torch.Tensor) -> torch.Tensor:
        x = leaf[..., ::2] if case.layout == "strided" else leaf
        if case.layout == "channels_last":
            fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            x = x.contiguous(memory_format=fmt)
        return x.to(torch.bfloat16) if case.bf16_input else x

    leaf, rows = (values.clone().requires_grad_(case.grad != "none") for _ in range(2))
    return leaf, rows, prepare


def _assert_same_running_stats(member, plains, tol: dict, msg: str) -> None:
    """Each member's rows of the running statistics are its plain norm's."""
    if getattr(member, "running_mean", None) is None:
        return
    for name in ("running_mean", "running_var"):
        want = torch.stack([getattr(p, name) for p in plains])
        torch.testing.assert_close(getattr(member, name), want, **tol, msg=f"{msg}: {name}")
    assert all(member.num_batches_tracked == p.num_batches_tracked for p in plains), msg


def _exact_member_grads(member, plains, x: torch.Tensor, grad: torch.Tensor) -> dict:
    """:func:`_member_grads` of the plain loop run in float64 on ``x`` and ``grad``."""
    plains64 = [copy.deepcopy(p).double() for p in plains]
    _plain_loop(plains64, x.detach().double()).backward(grad.double())
    return _member_grads(copy.deepcopy(member).double(), plains64)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
@pytest.mark.parametrize(("family", "path", "dtype", "input_name", "device"), MATRIX)
def test_every_member_norm_is_the_per_member_loop_of_plain_norms(
    family, path, dtype, input_name, device, monkeypatch
):
    """Output, input gradient, gamma/weight/bias gradients and running statistics, step by step
    in training and eval, on the path (forced, or the default dispatch), for a member norm from
    ``snens.convert``'s own lookup with its members set apart; each plain norm of the loop holds
    its member's folded affine."""
    case = INPUTS[input_name]
    out_tol, grad_tol = _input_tolerances(family, dtype, case)
    member, plains = _member_and_plains(family, dtype, device, case, out_tol)
    taking = _taking(path, family, member, monkeypatch)
    exact = _exact_affine_grads(family, path, device, dtype, case)
    affine_tol = out_tol if exact else grad_tol
    steps = [True, True, False] if hasattr(member, "running_mean") else [True, False]
    g = torch.Generator().manual_seed(2)
    for step, training in enumerate(steps):
        msg = f"{'train' if training else 'eval'} step {step}"
        for module in (member, *plains):
            module.train(training).zero_grad(set_to_none=True)
        leaf, rows, prepare = _inputs(family, case, dtype, device, g)
        autocast = torch.autocast(device, torch.bfloat16, enabled=case.autocast)
        with taking(), autocast, torch.set_grad_enabled(case.grad != "none"):
            out = member(prepare(leaf))
            ref = _plain_loop(plains, prepare(rows))
        assert out.dtype == ref.dtype
        torch.testing.assert_close(out, ref, **out_tol, msg=msg)
        _assert_same_running_stats(member, plains, out_tol, msg)
        if case.grad == "none":
            assert out.grad_fn is None
            continue
        grad = torch.randn(out.shape, generator=g).to(device, out.dtype)
        if case.layout == "strided":  # an expanded (stride-0) output gradient, as sum()'s
            grad = grad[:1].expand(out.shape)
        out.backward(grad)
        ref.backward(grad)
        torch.testing.assert_close(leaf.grad, rows.grad, **grad_tol, msg=f"{msg}: input grad")
        if case.grad == "input":  # a frozen affine
            assert all(p.grad is None for p in member.parameters())
            continue
        got = {n: p.grad for n, p in member.named_parameters()}
        want = _member_grads(member, plains)
        if exact:
            exact_grads = _exact_member_grads(member, plains, prepare(rows), grad)
            want = {n: v.to(want[n].dtype) for n, v in exact_grads.items()}
        assert got.keys() == want.keys() and {"gamma", "weight"} <= got.keys()
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, **affine_tol, msg=f"{msg}: {name} grad")


@pytest.mark.parametrize("case", ["bn1d", "bn2d", "bn3d"])
def test_batch_norm_keeps_running_stats_per_member(case):
    make_plain, cls, shape = CASES[case]
    layer = cls(5, num_members=M, momentum=0.25)
    x = torch.randn(M * shape[0], *shape[1:]) + torch.arange(M * shape[0]).view(
        -1, *[1] * (len(shape) - 1)
    )
    layer.train()(x)
    dims = [0] + list(range(2, x.dim()))
    for m in range(M):
        xm = x[m * B : (m + 1) * B]
        torch.testing.assert_close(layer.running_mean[m], 0.25 * xm.mean(dims), **TOL)
        torch.testing.assert_close(
            layer.running_var[m], 0.75 + 0.25 * xm.var(dims, unbiased=True), **TOL
        )
    assert int(layer.num_batches_tracked) == 1
    # members saw different data, so their statistics differ
    assert (layer.running_mean[0] - layer.running_mean[-1]).abs().min() > 1


def test_batch_norm_cumulative_momentum_matches_torch():
    plain = nn.BatchNorm2d(3, momentum=None)
    layer = snn.MemberBatchNorm2d.from_plain(plain, 1)
    for _ in range(3):
        x = torch.randn(5, 3, 2, 2)
        plain(x), layer(x)
    torch.testing.assert_close(layer.running_mean[0], plain.running_mean, **TOL)
    torch.testing.assert_close(layer.running_var[0], plain.running_var, **TOL)


@pytest.mark.parametrize("case", CASES)
def test_state_dict_round_trip(case):
    make_plain, cls, shape = CASES[case]
    src = _randomize(cls.from_plain(make_plain(), M), seed=1).eval()
    dst = cls.from_plain(make_plain(), M).eval()
    dst.load_state_dict(src.state_dict())
    x = torch.randn(M * shape[0], *shape[1:])
    torch.testing.assert_close(dst(x), src(x), rtol=0, atol=0)


@pytest.mark.parametrize("case", CASES)
def test_loading_a_plain_state_dict_preserves_the_output(case):
    make_plain, cls, shape = CASES[case]
    plain = _randomize(make_plain(), seed=2).eval()
    layer = cls.from_plain(make_plain(), M).eval()
    gamma = layer.gamma.detach().clone()
    layer.load_state_dict(plain.state_dict())
    torch.testing.assert_close(layer.gamma, gamma)  # gamma keeps its asymmetric init
    x = torch.randn(M * shape[0], *shape[1:])
    torch.testing.assert_close(layer(x), plain(x), **TOL)


def test_a_version_1_state_dict_loads():
    """Member layers record state_dict version 2, the member layout. A version-1 state_dict
    (written before they recorded one: the same layout) or one with no version at all (a
    safetensors file, a dict copy) loads as it is; a plain norm's migrates to every member,
    whatever version its own class records (nn.BatchNorm2d: 2); a head's version-2 entries are
    never read as a plain nn.Linear's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.BatchNorm2d(5), nn.Flatten(1), nn.Linear(20, 3))
    _randomize(model[1])
    ens = snens.convert(model, M, generator=torch.Generator().manual_seed(0))
    _randomize(ens.model[1], seed=1)
    state = ens.model.state_dict()
    assert state._metadata["1"]["version"] == state._metadata["3"]["version"] == 2
    x = torch.randn(M * 2, 3, 4, 4)
    expected = ens.model.eval()(x)
    for version in (1, None):
        old = copy.deepcopy(state)
        for prefix in ("1", "3"):
            if version is None:
                del old._metadata[prefix]["version"]
            else:
                old._metadata[prefix]["version"] = version
        fresh = snens.convert(model, M, generator=torch.Generator().manual_seed(5)).model
        fresh.load_state_dict(old)
        torch.testing.assert_close(fresh.eval()(x), expected, rtol=0, atol=0)
    plain = model.eval().state_dict()  # BatchNorm2d records 2, Linear 1
    assert (plain._metadata["1"]["version"], plain._metadata["3"]["version"]) == (2, 1)
    fresh = snens.convert(model, M, generator=torch.Generator().manual_seed(5)).model
    fresh.load_state_dict(plain)
    torch.testing.assert_close(
        fresh.eval()(x), torch.cat([model(rows) for rows in x.chunk(M)]), **TOL
    )
    head = snn.MemberLinear(20, 3, M)
    relabelled = OrderedDict(model[3].state_dict())
    relabelled._metadata = OrderedDict({"": {"version": 2}})  # a plain layout, called version 2
    with pytest.raises(ValueError, match=r"weight of shape \(3, 20\) \(state_dict version 2\)"):
        head.load_state_dict(relabelled)


def test_state_dict_from_another_num_members_is_refused():
    src = snn.MemberBatchNorm2d(3, num_members=2)
    dst = snn.MemberBatchNorm2d(3, num_members=4)
    with pytest.raises(ValueError, match="num_members=2.*num_members=4"):
        dst.load_state_dict(src.state_dict())


def test_plain_state_dict_with_other_features_is_refused():
    with pytest.raises(ValueError, match="same number of features"):
        snn.MemberLayerNorm(4, num_members=2).load_state_dict(nn.LayerNorm(5).state_dict())


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_num_members_value(bad):
    with pytest.raises(ValueError, match=f"num_members must be >= 1, got {bad}"):
        snn.MemberBatchNorm2d(3, num_members=bad)


@pytest.mark.parametrize("bad", [2.0, "4", True, None])
def test_bad_num_members_type(bad):
    with pytest.raises(TypeError, match="num_members must be an int"):
        snn.MemberLayerNorm(3, num_members=bad)


def test_rows_not_divisible_by_members():
    layer = snn.MemberBatchNorm2d(3, num_members=4)
    with pytest.raises(ValueError, match="M=4, got 6 rows"):
        layer(torch.randn(6, 3, 2, 2))


def test_wrong_channels_and_rank():
    with pytest.raises(ValueError, match="built for 3 channels.*with 5"):
        snn.MemberBatchNorm2d(3, num_members=2)(torch.randn(4, 5, 2, 2))
    with pytest.raises(ValueError, match="expects a 4D input"):
        snn.MemberBatchNorm2d(3, num_members=2)(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"trailing shape \(5,\)"):
        snn.MemberLayerNorm(5, num_members=2)(torch.randn(4, 3))
    with pytest.raises(ValueError, match="divisible by num_groups=4"):
        snn.MemberGroupNorm(4, 6, num_members=2)


def test_member_index_out_of_range():
    layer = snn.MemberBatchNorm2d(3, num_members=2)
    with pytest.raises(ValueError, match="member 2 is out of range for num_members=2"):
        layer.to_plain(2)
    with pytest.raises(TypeError, match="member must be an int"):
        layer.to_plain(True)


def test_device_and_dtype_are_threaded_through():
    layer = snn.MemberBatchNorm2d(3, num_members=2, dtype=torch.float64)
    assert {t.dtype for t in (layer.gamma, layer.weight, layer.bias, layer.running_mean)} == {
        torch.float64
    }
    plain = nn.LayerNorm(4, dtype=torch.float64)
    assert snn.MemberLayerNorm.from_plain(plain, 3).weight.dtype == torch.float64


def test_extra_repr_names_members():
    assert "num_members=4" in repr(snn.MemberBatchNorm2d(8, num_members=4))
    assert "(8,), num_members=2" in repr(snn.MemberLayerNorm(8, num_members=2))


def test_member_norm_factory_builds_models():
    norm_layer = snn.member_norm(4)
    layer = norm_layer(16)
    assert isinstance(layer, snn.MemberBatchNorm2d) and layer.num_members == 4
    ln = snn.member_norm(2, nn.LayerNorm, eps=1e-6)(8)
    assert isinstance(ln, snn.MemberLayerNorm) and ln.eps == 1e-6
    with pytest.raises(TypeError, match="no member version of.*LocalResponseNorm"):
        snn.member_norm(2, nn.LocalResponseNorm)
    instance = snn.member_norm(2, nn.InstanceNorm2d)(8, 1e-3)
    assert isinstance(instance, snn.MemberInstanceNorm2d) and instance.eps == 1e-3
    with pytest.raises(ValueError, match=r"track_running_stats=True\) normalizes by running"):
        snn.member_norm(2, nn.InstanceNorm2d)(8, track_running_stats=True)


def test_gradients_reach_gamma_weight_and_bias_of_every_member():
    layer = snn.MemberBatchNorm2d(3, num_members=M)
    layer(torch.randn(M * B, 3, 2, 2)).pow(2).sum().backward()
    for p in (layer.gamma, layer.weight, layer.bias):
        assert p.grad is not None and (p.grad.abs().sum(dim=1) > 0).all()


def test_member_linear_is_one_linear_per_member():
    head = snn.MemberLinear(5, 3, num_members=M)
    x = torch.randn(M * B, 5)
    y = head(x)
    for m in range(M):
        ref = x[m * B : (m + 1) * B] @ head.weight[m].T + head.bias[m]
        torch.testing.assert_close(y[m * B : (m + 1) * B], ref, **TOL)
        torch.testing.assert_close(head.to_plain(m)(x[m * B : (m + 1) * B]), ref, **TOL)
    plain = nn.Linear(5, 3)
    head.load_state_dict(plain.state_dict())
    torch.testing.assert_close(head(x), plain(x), **TOL)
    with pytest.raises(ValueError, match="num_members=2"):
        head.load_state_dict(snn.MemberLinear(5, 3, num_members=2).state_dict())


def test_norm_layer_factory_takes_torchs_own_signatures():
    """What torchvision and timm pass to ``norm_layer``: positional eps, momentum, affine flags,
    device and dtype; each built as the plain norm would be, member options apart."""
    bn = snn.member_norm(4)(64, 1e-3)
    assert (bn.eps, bn.momentum, bn.num_members) == (1e-3, 0.1, 4)
    bn = snn.member_norm(4)(64, momentum=None, affine=False, dtype=torch.float64)
    assert bn.momentum is None and bn.weight.dtype == torch.float64
    torch.testing.assert_close(bn.weight, torch.ones(4, 64, dtype=torch.float64))  # identity
    ln = snn.member_norm(2, nn.LayerNorm, gamma_std=0.0)(384, elementwise_affine=False)
    assert ln.normalized_shape == (384,) and torch.equal(ln.gamma, torch.zeros(2, 384))
    gn = snn.member_norm(2, nn.GroupNorm)(4, 32, 1e-6)
    assert (gn.num_groups, gn.num_channels, gn.eps) == (4, 32, 1e-6)
    with pytest.raises(TypeError, match="unexpected keyword argument 'afine'"):
        snn.member_norm(4)(64, afine=False)  # torch's own message names the typo
