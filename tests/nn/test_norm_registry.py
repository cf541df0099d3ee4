"""One registry answers "which member norm replaces this module" for every caller.

``snens.nn.registry.lookup`` gives a conversion, a reason, or nothing; conversion, the
``norm_layer`` factory, ``register_norm``, ``is_norm``/``is_unsupported_norm`` and the refusal
messages all ask it (or its table), in its order: member modules and non-norms, the table
(torch's exact types, then registered ones), then the probe.
"""

import importlib
import importlib.util

import pytest
import torch
from torch import nn

import snens
import snens.nn as snn
from snens.nn import registry
from snens.nn.registry import (
    MEMBER_NORMS,
    is_norm,
    is_unsupported_norm,
    lookup,
    member_converter,
    refusal,
)

M = 2
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

pytestmark = pytest.mark.usefixtures("one_thread")


class ScaleNorm(nn.Module):
    """An RMS norm under another name (the probe recognizes it)."""

    def __init__(self, dim=6, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def test_the_public_names_are_the_registrys():
    assert snn.MEMBER_NORMS is MEMBER_NORMS
    assert snn.register_norm is registry.register_norm
    assert snn.member_norm is registry.member_norm
    assert MEMBER_NORMS[nn.BatchNorm2d] is snn.MemberBatchNorm2d
    for gone in ("external_norms", "hf_formulas.hf_formula", "channels_first.layer_norm_layout"):
        module, _, name = gone.partition(".")
        if name:
            assert not hasattr(importlib.import_module(f"snens.nn.{module}"), name)
        else:
            assert importlib.util.find_spec(f"snens.nn.{module}") is None


def test_the_lookup_order():
    """Member modules and non-norms: nothing; torch's exact types: their from_plain (or the
    reason a setting is refused); then the probe."""
    assert lookup(snn.MemberLayerNorm(4, M)) is None
    assert lookup(snn.MemberLinear(4, 2, M)) is None
    assert lookup(nn.Linear(4, 2)) is None
    assert lookup(nn.LayerNorm(4)) == snn.MemberLayerNorm.from_plain
    assert lookup(nn.InstanceNorm2d(4, track_running_stats=True)).startswith(
        "InstanceNorm2d(track_running_stats=True) normalizes by running statistics"
    )
    assert member_converter(ScaleNorm()).args == (snn.MemberT5RMSNorm,)
    assert refusal(ScaleNorm()) is None and refusal(nn.Linear(4, 2)) is None
    assert refusal(nn.LocalResponseNorm(2)).startswith("LocalResponseNorm (torch)")
    # not probed (it has no formula of its own to find): the reason names the fix
    assert refusal(nn.SyncBatchNorm(4)) == (
        "SyncBatchNorm (torch) computes its batch statistics over every process, which no "
        "member version does; convert the model while it holds nn.BatchNorm*d layers (before "
        "nn.SyncBatchNorm.convert_sync_batchnorm): each member then normalizes with its "
        "process's own batch"
    )


def test_a_registration_comes_before_the_probe():
    class RegisteredScaleNorm(ScaleNorm):
        pass

    assert member_converter(RegisteredScaleNorm()).args == (snn.MemberT5RMSNorm,)  # probed
    snn.register_norm(RegisteredScaleNorm, snn.MemberRMSNorm)
    plain = RegisteredScaleNorm()
    member = member_converter(plain)(plain, M)
    assert type(member) is snn.MemberRMSNorm and member.eps == 1e-6
    x = torch.randn(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(member(x.repeat(M, 1))[:3], plain(x), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
def test_register_norm_accepts_any_class_the_user_vouches_for():
    """HeliumRMSNorm multiplies in float32 before its cast (Gemma 3n's formula); registered as
    a Llama RMS norm it converts so (the user's word), equal to it in float32. It had been
    refused because its source differed from LlamaRMSNorm's."""
    from transformers.models.helium.modeling_helium import HeliumRMSNorm

    class MyHeliumRMSNorm(HeliumRMSNorm):  # registration is by exact type: keep Helium's own
        pass

    assert member_converter(MyHeliumRMSNorm(8)).args == (snn.MemberGemma3nRMSNorm,)
    snn.register_norm(MyHeliumRMSNorm, snn.MemberLlamaRMSNorm)
    model = nn.Sequential(nn.Linear(4, 8), MyHeliumRMSNorm(8), nn.Linear(8, 3)).eval()
    with torch.no_grad():
        model[1].weight.add_(0.3 * torch.randn(8))
        ens = snens.convert(model, M).eval()
        x = torch.randn(5, 4)
        out, ref = ens(x), model(x)
    assert ens.report.converted == (("1", "MyHeliumRMSNorm", "MemberLlamaRMSNorm"),)
    for m in range(M):
        torch.testing.assert_close(out[m], ref, rtol=1e-6, atol=1e-6)


def test_is_norm_and_is_unsupported_norm_ask_the_same_registry():
    """is_norm (no weight decay, fine-tuning's norms): member norms, table types, and what
    looks like a norm; is_unsupported_norm (what FiLM, with exact types of its own, refuses):
    norms other than torch's exact types in a setting their member versions compute."""
    assert is_norm(snn.MemberLayerNorm(4, M)) and is_norm(nn.BatchNorm2d(3))
    assert is_norm(ScaleNorm()) and is_norm(nn.LocalResponseNorm(2))
    assert not any(is_norm(m) for m in (nn.PReLU(4), nn.Linear(4, 2), snn.MemberLinear(4, 2, M)))
    assert not is_unsupported_norm(nn.BatchNorm2d(3))
    assert is_unsupported_norm(nn.InstanceNorm2d(3, track_running_stats=True))
    assert is_unsupported_norm(ScaleNorm())  # converts, but is not one of torch's types
    assert not is_unsupported_norm(snn.MemberLayerNorm(4, M))


def test_the_norm_layer_factory_takes_the_tables_member_classes():
    class MyLayerNorm(nn.LayerNorm):
        pass

    with pytest.raises(TypeError, match="no member version of.*MyLayerNorm"):
        snn.member_norm(M, MyLayerNorm)
    snn.register_norm(MyLayerNorm, snn.MemberLayerNorm)
    layer = snn.member_norm(M, MyLayerNorm, eps=1e-6)(8)
    assert type(layer) is snn.MemberLayerNorm and layer.eps == 1e-6 and layer.num_members == M

    class FunctionNorm(nn.LayerNorm):
        pass

    snn.register_norm(FunctionNorm, from_plain=snn.MemberLayerNorm.from_plain)
    with pytest.raises(TypeError, match="no member version of.*FunctionNorm"):
        snn.member_norm(M, FunctionNorm)  # a conversion function builds no fresh layer


def test_a_refusal_names_each_class_and_its_reason():
    class AffineOnly(nn.Module):  # x·w + b: no norm
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))
            self.bias = nn.Parameter(torch.zeros(4))

        def forward(self, x):
            return x * self.weight + self.bias

    class GatedNorm(ScaleNorm):
        def forward(self, x, gate=None):
            return super().forward(x)

    model = nn.Sequential(
        nn.Linear(4, 4), AffineOnly(), nn.LocalResponseNorm(2), GatedNorm(4), AffineOnly()
    )
    with pytest.raises(TypeError) as err:
        snens.convert(model, M, skip_unsupported=False)
    message = str(err.value)
    assert message.startswith(
        "Sequential has norms with no member version: 1 (AffineOnly), 2 (LocalResponseNorm), "
        "3 (GatedNorm), 4 (AffineOnly). AffineOnly computes none of the supported formulas"
    )
    assert message.count("AffineOnly computes none") == 1  # each reason once
    # a gated norm is probed against the gated formulas: this one ignores its gate
    assert "GatedNorm computes none of the supported formulas on probe inputs (gated" in message
    assert "register_norm(AffineOnly, <MemberNorm class computing it>)" in message
    # by default the rest converts; here nothing does, and the reasons are named all the same
    with pytest.raises(ValueError, match=r"no supported norm layer.*AffineOnly computes none"):
        snens.convert(model, M)


class _Registered(nn.Module):
    """A norm class the next two tests register and then expect gone."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, (4,), self.weight)


def test_a_registration_holds_within_its_test():
    snn.register_norm(_Registered, snn.MemberLayerNorm)
    assert snn.registry.member_converter(_Registered()) is not None


def test_a_registration_does_not_outlive_its_test():
    from snens.nn.registry import _TABLE

    assert _Registered not in _TABLE
