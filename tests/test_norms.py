"""Member norms: each member is the plain norm on its own rows, with sigmoid(gamma) on top.

The matrix (every member norm family × kernel path × dtype, train and eval) holds each member
norm to the per-member loop of plain norms: member m's rows through ``to_plain(m)``, the plain
class (torch's, or the Hugging Face class it converted) holding sigmoid(gamma_m)·weight_m and
sigmoid(gamma_m)·bias_m.
"""

import contextlib
import copy
import importlib.util
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import snens
import snens.nn as snn
from snens.nn.norms import force_path
from snens.nn.registry import member_converter

M, B = 4, 6
TOL = {"rtol": 1e-5, "atol": 1e-5}
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

pytestmark = pytest.mark.usefixtures("one_thread")


def _randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random affine and running stats, so identity-like defaults cannot hide a bug."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
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


# -- the matrix: family × path × dtype -------------------------------------------------------------
class LayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm2d: layer norm over the channels of (B, C, H, W) inputs."""

    def forward(self, x):
        return F.layer_norm(
            x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps
        ).permute(0, 3, 1, 2)


def _hf(module_path: str, name: str, *args, **kwargs):
    def make():
        module = importlib.import_module(f"transformers.models.{module_path}")
        return getattr(module, name)(*args, **kwargs)

    return make


# family -> (plain norm, one member's input shape, the class to_plain gives)
FAMILIES = {
    "batch_norm_1d": (lambda: nn.BatchNorm1d(5), (B, 5, 7), nn.BatchNorm1d),
    "batch_norm_1d_flat": (lambda: nn.BatchNorm1d(5), (B, 5), nn.BatchNorm1d),
    "batch_norm_2d": (lambda: nn.BatchNorm2d(5), (B, 5, 4, 3), nn.BatchNorm2d),
    "batch_norm_2d_no_stats": (
        lambda: nn.BatchNorm2d(5, track_running_stats=False),  # batch statistics in eval too
        (B, 5, 4, 3),
        nn.BatchNorm2d,
    ),
    "batch_norm_3d": (lambda: nn.BatchNorm3d(5), (B, 5, 2, 3, 2), nn.BatchNorm3d),
    "layer_norm": (lambda: nn.LayerNorm(5), (B, 7, 5), nn.LayerNorm),
    "layer_norm_two_dims": (lambda: nn.LayerNorm((3, 5)), (B, 3, 5), nn.LayerNorm),
    "layer_norm_2d": (lambda: LayerNorm2d(6), (B, 6, 4, 3), LayerNorm2d),
    "group_norm": (lambda: nn.GroupNorm(2, 6), (B, 6, 4, 3), nn.GroupNorm),
    "rms_norm": (lambda: nn.RMSNorm(5), (B, 7, 5), nn.RMSNorm),
    "instance_norm_1d": (lambda: nn.InstanceNorm1d(5, affine=True), (B, 5, 7), nn.InstanceNorm1d),
    "instance_norm_2d": (lambda: nn.InstanceNorm2d(5), (B, 5, 4, 3), nn.InstanceNorm2d),
    "instance_norm_3d": (
        lambda: nn.InstanceNorm3d(5, 1e-3, affine=True),
        (B, 5, 2, 3, 2),
        nn.InstanceNorm3d,
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
        FAMILIES[family] = (_hf(path, name, 8), (B, 7, 8), back)
#: the default dispatch, and the paths force_path can force (batch and layer norms only)
PATHS = ("dispatch", "vectorized", "reference")
DTYPES = {
    torch.float32: ({"rtol": 1e-5, "atol": 1e-5}, {"rtol": 1e-4, "atol": 1e-4}),
    torch.float64: ({"rtol": 1e-10, "atol": 1e-10}, {"rtol": 1e-9, "atol": 1e-9}),
    # output and input gradient: bf16 kernels round at other points than the plain ones
    torch.bfloat16: ({"rtol": 2e-2, "atol": 2e-2}, {"rtol": 6e-2, "atol": 6e-2}),
}
MATRIX = [
    pytest.param(family, path, dtype, id=f"{family}-{path}-{str(dtype)[6:]}")
    for family in FAMILIES
    for path in (PATHS if family.startswith(("batch_norm", "layer_norm")) else PATHS[:1])
    for dtype in DTYPES
]


def _plain_class(family):
    back = FAMILIES[family][2]
    if isinstance(back, tuple):
        return getattr(importlib.import_module(f"transformers.models.{back[0]}"), back[1])
    return back


@pytest.mark.parametrize(("family", "path", "dtype"), MATRIX)
def test_every_member_norm_is_the_per_member_loop_of_plain_norms(family, path, dtype):
    """Output, input gradient and running statistics, in training and eval, on the path forced
    (or the default dispatch), for a member norm from ``snens.convert``'s own lookup with its
    members set apart; each plain norm of the loop holds its member's folded affine."""
    make, shape, _ = FAMILIES[family]
    plain = _randomize(make()).to(dtype)
    member = member_converter(plain)(plain, M, generator=torch.Generator().manual_seed(0))
    member = _randomize(member.to(dtype), seed=1)  # members apart (weightless plains: float32)
    # Hugging Face's norms compute in float32 whatever the input, float64's included
    computes_in = torch.float32 if family in HF_FAMILIES and dtype == torch.float64 else dtype
    out_tol, grad_tol = DTYPES[computes_in]
    g = torch.Generator().manual_seed(2)
    for training in (True, False):
        member.train(training)
        plains = [member.to_plain(m) for m in range(M)]
        scale, shift = member.scale_and_shift()
        for m, plain_m in enumerate(plains):
            assert type(plain_m) is _plain_class(family) and plain_m.training == training
            weight = plain_m.weight + 1 if family == "gemma" else plain_m.weight  # 1 + w
            torch.testing.assert_close(weight.to(dtype), scale[m].detach(), **out_tol)
            if shift is not None:
                torch.testing.assert_close(plain_m.bias, shift[m].detach(), **out_tol)
        x = (2 * torch.randn((M * shape[0], *shape[1:]), generator=g) + 0.5).to(dtype)
        leaf, rows = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        forced = contextlib.nullcontext() if path == "dispatch" else force_path(path)
        with forced:
            out = member(leaf)
        ref = torch.cat([p(r) for p, r in zip(plains, rows.chunk(M), strict=True)])
        assert out.dtype == ref.dtype
        torch.testing.assert_close(out, ref, **out_tol)
        grad = torch.randn(out.shape, generator=g).to(out.dtype)
        out.backward(grad)
        ref.backward(grad)
        torch.testing.assert_close(leaf.grad, rows.grad, **grad_tol)
        if getattr(member, "running_mean", None) is not None:
            for m, plain_m in enumerate(plains):
                torch.testing.assert_close(member.running_mean[m], plain_m.running_mean, **out_tol)
                torch.testing.assert_close(member.running_var[m], plain_m.running_var, **out_tol)


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
