"""Norms from outside torch are recognized by what they compute (snens.nn.probe).

Each supported formula, written by hand under any class name, converts to the member class
that reproduces it in float32 and in half precision; a module computing something else (a layer
norm without the mean subtracted but with a bias, a norm over the wrong dimension, x·w + b, a
weightless x / mean(|x|)) is refused by name with the reason, as are modules that hold more
than a norm or take a second input other than a gate; ``convert`` leaves them shared and names
them by default, and refuses the model with ``skip_unsupported=False``. Probing leaves the
module, its tensors and the global random state as they were.
"""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import snens
import snens.nn as snn
from snens.nn import probe
from snens.nn.registry import lookup, member_converter, refusal

M, B = 3, 2
D = 8

pytestmark = pytest.mark.usefixtures("one_thread")


# -- hand-written norms, one per formula -------------------------------------------------------
class Affine(nn.Module):
    """A weight (and a bias) of size D, initialized off 1 and 0, and an eps."""

    def __init__(self, dim=D, bias=False, eps=1e-6):
        super().__init__()
        g = torch.Generator().manual_seed(dim)
        self.weight = nn.Parameter(1 + 0.5 * torch.randn(dim, generator=g))
        self.bias = nn.Parameter(0.5 * torch.randn(dim, generator=g)) if bias else None
        self.eps = eps


class Scale(Affine):
    """RMS norm in the input's own dtype, named anything."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class CastThenWeight(Affine):
    """RMS norm in float32, cast back, then the weight (Llama)."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class WeightThenCast(Affine):
    """RMS norm in float32 times the weight, then one cast (OLMo-2)."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


class OnePlusWeight(Affine):
    """RMS norm with the weight stored as an offset from 1 (Gemma)."""

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1 + self.weight.float())).type_as(x)


class OnePlusWeightLayerNorm(nn.LayerNorm):
    """Nemotron's LayerNorm1P: layer norm with the weight 1 + w."""

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)


class WeightlessL2Norm(nn.Module):
    """A weightless RMS norm in the input's dtype that records no size."""

    def __init__(self, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class WeightlessF32Norm(WeightlessL2Norm):
    """Llama 4's QK norm: in float32, cast once, no weight, no size."""

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


class UnitSphereNorm(WeightlessL2Norm):
    """nGPT's L2 norm: x / ‖x‖ in float32, the sum of squares (not their mean), no weight."""

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).sum(-1, keepdim=True) + self.eps)).type_as(x)


class LastDimLayerNorm(Affine):
    """Layer norm over the last dimension, its eps under another name."""

    def __init__(self, bias=True):
        super().__init__(bias=bias)
        del self.eps
        self.epsilon = 1e-3  # far from the usual: found by the probe, not assumed

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.epsilon)


class ChannelsFirstLayerNorm(Affine):
    """Layer norm over dim 1 of (B, C, *) inputs of any rank."""

    def __init__(self):
        super().__init__(bias=True)

    def forward(self, x):
        y = F.layer_norm(x.movedim(1, -1), (D,), self.weight, self.bias, self.eps)
        return y.movedim(-1, 1)


class ConstantEpsLayerNorm(nn.Module):
    """A weightless layer norm that records its size and writes its eps into its forward."""

    def __init__(self, hidden_size=D):
        super().__init__()
        self.hidden_size = hidden_size

    def forward(self, x):
        return F.layer_norm(x.float(), (self.hidden_size,), eps=1e-6).to(x.dtype)


class OneGroupNorm(nn.GroupNorm):
    """A GroupNorm subclass that changes only its constructor (PoolFormer's)."""

    def __init__(self, num_channels):
        super().__init__(1, num_channels)


class MomentumBatchNorm(nn.BatchNorm2d):
    """A BatchNorm2d subclass that changes only its constructor."""

    def __init__(self, num_features):
        super().__init__(num_features, momentum=0.3)


POSITIVE = {
    "rms_in_the_input_dtype": (Scale, snn.MemberT5RMSNorm, (B, 5, D)),
    "rms_cast_then_weight": (CastThenWeight, snn.MemberLlamaRMSNorm, (B, 5, D)),
    "rms_weight_then_cast": (WeightThenCast, snn.MemberOlmo2RMSNorm, (B, 5, D)),
    "rms_one_plus_weight": (OnePlusWeight, snn.MemberGemmaRMSNorm, (B, 5, D)),
    "layer_norm_with_bias": (LastDimLayerNorm, snn.MemberLayerNorm, (B, 5, D)),
    "layer_norm_without_bias": (
        lambda: LastDimLayerNorm(bias=False),
        snn.MemberCohereLayerNorm,
        (B, 5, D),
    ),
    "layer_norm_weightless": (ConstantEpsLayerNorm, snn.MemberOlmoLayerNorm, (B, 5, D)),
    "layer_norm_one_plus_weight": (
        lambda: OnePlusWeightLayerNorm(D),
        snn.MemberLayerNorm1P,
        (B, 5, D),
    ),
    "rms_weightless_without_size": (
        WeightlessL2Norm,
        snn.MemberDeepseekUnweightedRMSNorm,
        (B, 5, D),
    ),
    "rms_weightless_float32": (WeightlessF32Norm, snn.MemberUnweightedRMSNorm, (B, 5, D)),
    "l2_weightless": (UnitSphereNorm, snn.MemberUnweightedL2Norm, (B, 5, D)),
    "layer_norm_channels_first_3d": (ChannelsFirstLayerNorm, snn.MemberLayerNorm2d, (B, D, 5)),
    "layer_norm_channels_first_4d": (ChannelsFirstLayerNorm, snn.MemberLayerNorm2d, (B, D, 3, 5)),
    "layer_norm_channels_first_5d": (
        ChannelsFirstLayerNorm,
        snn.MemberLayerNorm2d,
        (B, D, 2, 3, 3),
    ),
    "group_norm_subclass": (lambda: OneGroupNorm(D), snn.MemberGroupNorm, (B, D, 3, 5)),
    "batch_norm_subclass": (lambda: MomentumBatchNorm(D), snn.MemberBatchNorm2d, (B, D, 3, 5)),
}


def _randomize(module):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
        if getattr(module, "running_var", None) is not None:
            module.running_mean.normal_(generator=g)
            module.running_var.uniform_(0.5, 1.5, generator=g)
    return module


@pytest.mark.parametrize("case", POSITIVE)
def test_each_formula_converts_to_the_member_class_that_reproduces_it(case):
    """In float32 to 1e-5, in bfloat16 (its parameters and input) to 2 units of bfloat16's
    epsilon; train and eval mode; batch norms' running statistics after a training step."""
    make, member_type, shape = POSITIVE[case]
    plain = _randomize(make())
    convert = member_converter(plain)
    assert convert is not None, refusal(plain)
    g = torch.Generator().manual_seed(1)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2 * 2**-7)):
        module = _randomize(make()).to(dtype)
        member = convert(module, M, generator=torch.Generator().manual_seed(2))
        assert type(member) is member_type and member.num_members == M
        for training in (False, True):
            module.train(training)
            member.train(training)
            x = (2 * torch.randn(shape, generator=g) + 0.5).to(dtype)
            with torch.no_grad():
                expected = module(x)
                out = member(x.repeat(M, *[1] * (x.dim() - 1))).unflatten(0, (M, -1))
            assert out.dtype == expected.dtype
            for m in range(M):
                torch.testing.assert_close(out[m], expected, rtol=tol, atol=tol)
            if getattr(module, "running_mean", None) is not None:
                torch.testing.assert_close(member.running_mean[0], module.running_mean)


def test_the_eps_is_read_from_the_module_or_found():
    assert member_converter(LastDimLayerNorm()).keywords == {"eps": 1e-3}  # its "epsilon"
    assert member_converter(ConstantEpsLayerNorm()).keywords == {"eps": 1e-6}  # its constant


# -- modules that compute something else, or hold more than a norm -----------------------------
class LayerNormWithoutMean(Affine):
    """x / rms(x) · w + b: no mean subtracted, but a bias."""

    def __init__(self):
        super().__init__(bias=True)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight + self.bias


class WrongDimensionNorm(Affine):
    """Layer norm over dim −2 of (…, T, D) inputs, the affine over the last."""

    def __init__(self):
        super().__init__(bias=True)

    def forward(self, x):
        h = F.layer_norm(x.transpose(-1, -2), x.shape[-2:-1], eps=self.eps).transpose(-1, -2)
        return h * self.weight + self.bias


class NoNormAtAll(Affine):
    """MobileBERT's NoNorm: x·w + b."""

    def __init__(self):
        super().__init__(bias=True)

    def forward(self, x):
        return x * self.weight + self.bias


class TrainModeDropoutNorm(CastThenWeight):
    """An RMS norm that drops features in training."""

    def forward(self, x):
        return F.dropout(super().forward(x), 0.5, self.training)


class MaskedRMSNorm(CastThenWeight):
    """A second input that is not a gate."""

    def forward(self, x, mask=None):
        return super().forward(x if mask is None else x * mask)


class MeanAbsoluteNorm(nn.Module):
    """x / mean(|x|): no weight, and neither an RMS nor an L2 norm."""

    def __init__(self, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x / (x.abs().mean(-1, keepdim=True) + self.eps)


class NormWithActivation(nn.GroupNorm):
    """Bit's GroupNormActivation: a group norm followed by an activation submodule."""

    def __init__(self, num_channels):
        super().__init__(2, num_channels)
        self.activation = nn.Identity()

    def forward(self, x):
        return self.activation(super().forward(x))


class StatefulNorm(CastThenWeight):
    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.zeros(1))


NEGATIVE = {
    "layer_norm_without_mean_with_bias": (LayerNormWithoutMean, "computes none of"),
    "norm_over_the_wrong_dimension": (WrongDimensionNorm, "computes none of"),
    "no_norm": (NoNormAtAll, "computes none of"),
    "dropout_in_training": (TrainModeDropoutNorm, "computes none of"),
    "second_input_not_a_gate": (MaskedRMSNorm, r"takes more than one input \(mask\)"),
    "weightless_mean_absolute": (MeanAbsoluteNorm, "computes none of"),
    "with_a_submodule": (lambda: NormWithActivation(D), r"holds submodules \(activation\)"),
    "with_a_buffer": (StatefulNorm, r"holds buffers \(shift\)"),
}


@pytest.mark.parametrize("case", NEGATIVE)
def test_a_module_computing_something_else_is_refused_by_name(case):
    make, reason = NEGATIVE[case]
    module = _randomize(make())
    name = type(module).__name__
    assert member_converter(module) is None
    assert refusal(module).startswith(name)
    model = nn.Sequential(nn.Linear(4, D), module, nn.LayerNorm(D), nn.Linear(D, 2))
    with pytest.raises(TypeError, match=rf"1 \({name}\)\. {name} {reason}"):
        snens.convert(model, M, skip_unsupported=False)
    assert snens.convert(model, M, skip_unsupported=True).report.skipped == (("1", name),)
    with pytest.warns(UserWarning, match=rf"left 1 norm of Sequential shared.*: {name} "):
        ens = snens.convert(model, M)  # the default: the rest converts, this one is named
    assert ens.report.skipped == (("1", name),)
    assert ens.report.converted == (("2", "LayerNorm", "MemberLayerNorm"),)


def test_what_is_no_norm_is_left_alone():
    """torch's other classes with a 1-D weight (nn.PReLU) and modules without one are not
    norms; neither is a block named after one that holds no weight of its own."""

    class PreLayerNormHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(D, D)
            self.bias = nn.Parameter(torch.zeros(D))

        def forward(self, x):
            return self.dense(x) + self.bias

    for module in (nn.PReLU(D), nn.Linear(D, D), PreLayerNormHead(), nn.GELU()):
        assert lookup(module) is None


@pytest.mark.parametrize("wrap", ["weight_norm", "spectral_norm"])
def test_a_weight_parametrization_is_no_norm(wrap):
    """torch's weight and spectral norm parametrizations (_WeightNorm, _SpectralNorm) normalize
    a weight, not activations: every wav2vec2, HuBERT and WavLM (a weight-normed positional
    convolution) converted with a warning that left them "shared", and not at all with
    skip_unsupported=False."""
    parametrize = getattr(nn.utils.parametrizations, wrap)
    model = nn.Sequential(parametrize(nn.Conv1d(3, 8, 3)), nn.GroupNorm(2, 8), nn.Flatten())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "left shared" warning
        ens = snens.convert(model, M, skip_unsupported=False)
    assert ens.report.skipped == ()
    assert ens.report.converted == (("1", "GroupNorm", "MemberGroupNorm"),)


class Fp32LayerNorm(nn.LayerNorm):
    """fairseq's: the norm in float32 whatever the input's dtype, cast back."""

    def forward(self, x):
        weight, bias = self.weight.float(), self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).type_as(x)


class Fp32GroupNorm(nn.GroupNorm):
    def forward(self, x):
        weight, bias = self.weight.float(), self.bias.float()
        return F.group_norm(x.float(), self.num_groups, weight, bias, self.eps).type_as(x)


@pytest.mark.parametrize(
    "norm, member",
    [(Fp32LayerNorm(D), "MemberLayerNorm"), (Fp32GroupNorm(2, D), "MemberGroupNorm")],
)
def test_a_subclass_is_not_held_to_dtypes_its_torch_class_refuses(norm, member):
    """fairseq's Fp32LayerNorm and Fp32GroupNorm were refused: in the probe's float64-weight,
    float32-input setting (which nn.LayerNorm and nn.GroupNorm refuse) they return float32,
    the member float64. The settings torch's class runs are still compared."""
    model = nn.Sequential(nn.Conv1d(3, D, 1), _randomize(norm), nn.Flatten())
    ens = snens.convert(model, M, skip_unsupported=False).eval()
    assert ens.report.converted == (("1", type(norm).__name__, member),)
    x = torch.randn(2, 3, D)
    torch.testing.assert_close(ens(x), model.eval()(x).expand(M, -1, -1), rtol=1e-5, atol=1e-5)
    for dtype in (torch.bfloat16, torch.float16):  # settings still compared, within 2 ulps
        low = copy.deepcopy(model).to(dtype)
        got, expected = snens.convert(low, M).eval()(x.to(dtype))[0], low(x.to(dtype))
        assert got.dtype == dtype
        torch.testing.assert_close(got, expected, rtol=2 * torch.finfo(dtype).eps, atol=1e-2)


# -- what probing leaves ------------------------------------------------------------------------
def test_probing_leaves_the_module_its_tensors_and_the_random_state_as_they_were():
    module = _randomize(MomentumBatchNorm(D)).train()
    tensors = {name: (t, t.clone()) for name, t in module.state_dict(keep_vars=True).items()}
    calls = []
    module.register_forward_hook(lambda *args: calls.append(args))
    state = torch.get_rng_state()
    assert member_converter(module) is not None
    assert torch.equal(torch.get_rng_state(), state)
    assert module.training and calls == []  # run on a copy, hooks aside
    for name, (tensor, before) in tensors.items():
        now = module.state_dict(keep_vars=True)[name]
        assert now is tensor and torch.equal(now, before), name


def test_a_module_on_the_meta_device_is_probed_on_the_cpu():
    module = CastThenWeight().to("meta")
    convert = member_converter(module)
    assert convert.args == (snn.MemberLlamaRMSNorm,)
    assert convert(module, M).weight.is_meta


def test_modules_of_one_class_and_settings_share_one_probe(monkeypatch):
    """Within a conversion: 6 norms of 2 settings, 2 probes (each of every member type)."""
    compared = []
    original = probe.compare

    def counting(module, member_type, *, eps):
        compared.append(id(module))
        return original(module, member_type, eps=eps)

    monkeypatch.setattr(probe, "compare", counting)
    norms = [CastThenWeight() for _ in range(3)] + [CastThenWeight(eps=1e-5) for _ in range(3)]
    model = nn.Sequential(nn.Linear(4, D), *norms, nn.Linear(D, 2))
    ens = snens.convert(model, M)
    assert len(ens.report.converted) == 6
    assert len(set(compared)) == 2


def test_the_member_classes_check_what_they_are_given():
    with pytest.raises(TypeError, match="is not one"):
        snn.MemberLlamaRMSNorm.from_plain(WeightThenCast(), M)
    assert type(snn.MemberLlamaRMSNorm.from_plain(CastThenWeight(), M)) is snn.MemberLlamaRMSNorm
    with pytest.raises(TypeError, match="does not compute one"):
        snn.MemberLayerNorm2d.from_plain(LastDimLayerNorm(), M)


def test_the_choice_among_member_versions_is_by_where_they_round():
    """In float32 the RMS norms agree; in half precision each version equals its own formula
    bit for bit and the others within a rounding."""
    found = {
        cls: probe.match(cls(), [snn.MemberLlamaRMSNorm, snn.MemberOlmo2RMSNorm])
        for cls in (CastThenWeight, WeightThenCast)
    }
    assert found[CastThenWeight].member_type is snn.MemberLlamaRMSNorm
    assert found[WeightThenCast].member_type is snn.MemberOlmo2RMSNorm
    assert all(c.error == 0.0 and c.reproduces for c in found.values())
    other = probe.compare(CastThenWeight(), snn.MemberOlmo2RMSNorm, eps=1e-6)
    assert other.computes and other.error == float("inf")  # float32 / bfloat16: another dtype
