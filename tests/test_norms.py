"""Member norms: each member is the plain norm on its own rows, with sigmoid(gamma) on top."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import snens.nn as snn

M, B = 4, 6
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random affine and running stats, so identity-like defaults cannot hide a bug."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
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


def _member_reference(layer: snn.MemberNorm, x: torch.Tensor, m: int) -> torch.Tensor:
    """Member m computed by hand: sigmoid(gamma_m) * (weight_m * x̂ + bias_m) on its slice."""
    xm = x[m * B : (m + 1) * B]
    s, w = torch.sigmoid(layer.gamma[m]), layer.weight[m]
    b = layer.bias[m] if layer.bias is not None else torch.zeros_like(w)
    if isinstance(layer, snn.MemberBatchNorm1d | snn.MemberBatchNorm2d | snn.MemberBatchNorm3d):
        if layer.training:
            y = F.batch_norm(xm, None, None, training=True, eps=layer.eps)
        else:
            y = F.batch_norm(xm, layer.running_mean[m], layer.running_var[m], eps=layer.eps)
        view = (1, -1) + (1,) * (x.dim() - 2)
        return s.view(view) * (w.view(view) * y + b.view(view))
    if isinstance(layer, snn.MemberGroupNorm):
        y = F.group_norm(xm, layer.num_groups, eps=layer.eps)
        view = (1, -1) + (1,) * (x.dim() - 2)
        return s.view(view) * (w.view(view) * y + b.view(view))
    if isinstance(layer, snn.MemberRMSNorm):
        y = F.rms_norm(xm, layer.normalized_shape, eps=layer.eps)
        return s * w * y
    y = F.layer_norm(xm, layer.normalized_shape, eps=layer.eps)
    return s * (w * y + b)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("training", [True, False])
def test_member_m_is_the_plain_norm_on_its_slice(case, training):
    make_plain, cls, shape = CASES[case]
    layer = _randomize(cls.from_plain(make_plain(), M)).train(training)
    x = torch.randn(M * shape[0], *shape[1:]) * 3 + 1
    y = layer(x)
    for m in range(M):
        torch.testing.assert_close(y[m * B : (m + 1) * B], _member_reference(layer, x, m), **TOL)


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


@pytest.mark.parametrize("case", CASES)
def test_to_plain_folds_member_into_an_ordinary_norm(case):
    make_plain, cls, shape = CASES[case]
    layer = _randomize(cls.from_plain(make_plain(), M), seed=3).eval()
    x = torch.randn(M * shape[0], *shape[1:])
    y = layer(x)
    for m in range(M):
        plain = layer.to_plain(m)
        assert type(plain) is cls.plain_type
        torch.testing.assert_close(plain(x[m * B : (m + 1) * B]), y[m * B : (m + 1) * B], **TOL)


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


def test_batch_norm_without_running_stats_uses_batch_stats_in_eval():
    layer = snn.MemberBatchNorm2d(3, num_members=2, track_running_stats=False).eval()
    assert layer.running_mean is None
    x = torch.randn(2 * B, 3, 2, 2)
    torch.testing.assert_close(layer(x)[:B], _member_reference(layer.train(), x, 0), **TOL)


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
