"""A layer norm over the channels of (N, C, W) inputs converts, and every member equals it.

The idiom of 1-D convolutional and audio models, ``x.transpose(1, 2)`` around a layer norm over
C, normalizes the channels of (N, C, W) inputs but the last dimension of 4-D ones (the swap leaves
it last): on probe inputs it computes both layouts, each at its own rank, and the layout of its
3-D inputs decides. The 4-D channels-first and the channels-last layer norms still convert; a
module that takes either layout at one rank cannot be told and is refused, saying what to do.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import snens
import snens.nn as snn
from snens.nn import registry
from snens.nn.registry import member_converter, refusal

pytestmark = pytest.mark.usefixtures("one_thread")

M, C = 4, 8
TOL = 1e-5  # every member against the original, in eval mode right after conversion


class _Affine(nn.Module):
    """A weight and a bias of size C off 1 and 0, and an eps."""

    def __init__(self, channels=C, eps=1e-6):
        super().__init__()
        g = torch.Generator().manual_seed(channels)
        self.weight = nn.Parameter(1 + 0.5 * torch.randn(channels, generator=g))
        self.bias = nn.Parameter(0.5 * torch.randn(channels, generator=g))
        self.eps = eps
        self.channels = channels


class TransposedLayerNorm(_Affine):
    """(N, C, W) -> (N, W, C), layer norm over C, and back: a 1-D ConvNeXt's or an audio
    model's channels-first layer norm."""

    def forward(self, x):
        y = F.layer_norm(x.transpose(1, 2), (self.channels,), self.weight, self.bias, self.eps)
        return y.transpose(1, 2)


class TransposedTorchLayerNorm(nn.LayerNorm):
    """The same as an ``nn.LayerNorm`` subclass."""

    def forward(self, x):
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class PermutedLayerNorm(nn.Module):
    """A block holding an ``nn.LayerNorm(C)`` that it applies to (N, C, W) permuted."""

    def __init__(self, channels=C):
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 1)).permute(0, 2, 1)


class ChannelsFirst2d(_Affine):
    """timm's LayerNorm2d: (N, C, H, W) -> (N, H, W, C), layer norm, and back."""

    def forward(self, x):
        y = F.layer_norm(x.permute(0, 2, 3, 1), (self.channels,), self.weight, self.bias, self.eps)
        return y.permute(0, 3, 1, 2)


class ChannelsLast(_Affine):
    """A layer norm over the last dimension, named anything."""

    def forward(self, x):
        return F.layer_norm(x, (self.channels,), self.weight, self.bias, self.eps)


class EitherLayout(_Affine):
    """Normalizes the last dimension where it has C features, else dim 1: it takes (N, T, C) and
    (N, C, W) inputs alike, so which one a model gives it cannot be told from the module."""

    def forward(self, x):
        if x.shape[-1] == self.channels:
            return F.layer_norm(x, (self.channels,), self.weight, self.bias, self.eps)
        y = F.layer_norm(x.movedim(1, -1), (self.channels,), self.weight, self.bias, self.eps)
        return y.movedim(-1, 1)


def _conv1d(norm):
    """(N, 3, 16) -> logits of 5 classes, the norm between two 1-D convolutions."""
    return nn.Sequential(
        nn.Conv1d(3, C, 3, padding=1),
        norm,
        nn.GELU(),
        nn.Conv1d(C, C, 3, padding=1),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(C, 5),
    )


def _conv2d(norm):
    return nn.Sequential(
        nn.Conv2d(3, C, 3, padding=1),
        norm,
        nn.GELU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(C, 5),
    )


def _tokens(norm):
    """(N, T, 3) -> (N, 5), the norm over the features of each token."""
    return nn.Sequential(nn.Linear(3, C), norm, nn.GELU(), nn.Flatten(), nn.Linear(6 * C, 5))


def _randomize(module):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return module


def _assert_every_member_equals(model, x, member_type, num_norms=1):
    model = _randomize(model).eval()
    ens = snens.convert(model, M, skip_unsupported=False).eval()
    members = [m for m in ens.modules() if isinstance(m, snn.MemberNorm)]
    assert [type(m) for m in members] == [member_type] * num_norms
    with torch.no_grad():
        expected = model(x)
        got = ens(x)
    assert got.shape == (M, *expected.shape)
    for m in range(M):
        assert (got[m] - expected).abs().max().item() < TOL, m


# -- (N, C, W): converts and matches -----------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [lambda: TransposedLayerNorm(), lambda: TransposedTorchLayerNorm(C)],
    ids=["functional", "layer_norm_subclass"],
)
def test_a_layer_norm_over_the_channels_of_3d_inputs_converts_and_every_member_equals_it(make):
    norm = _randomize(make())
    assert refusal(norm) is None
    assert member_converter(norm).args == (snn.MemberLayerNorm2d,)
    g = torch.Generator().manual_seed(1)
    for width in (16, C):  # W = C too: the channels still, as the module does on 3-D inputs
        x = 2 * torch.randn(6, 3, width, generator=g) + 0.5
        _assert_every_member_equals(_conv1d(norm), x, snn.MemberLayerNorm2d)


def test_the_member_rebuilds_the_plain_class():
    norm = _randomize(TransposedTorchLayerNorm(C, eps=1e-5))
    member = member_converter(norm)(norm, M)
    back = member.to_plain(2)
    assert type(back) is TransposedTorchLayerNorm and back.eps == 1e-5
    x = torch.randn(3, C, 5)
    with torch.no_grad():
        torch.testing.assert_close(back(x), norm(x), rtol=TOL, atol=TOL)


def test_a_block_permuting_around_an_nn_layer_norm_converts_its_layer_norm():
    x = torch.randn(6, 3, 16, generator=torch.Generator().manual_seed(1))
    _assert_every_member_equals(_conv1d(PermutedLayerNorm()), x, snn.MemberLayerNorm)


# -- the other layouts still convert -----------------------------------------------------------
def test_a_4d_channels_first_layer_norm_still_converts():
    x = torch.randn(4, 3, 6, 5, generator=torch.Generator().manual_seed(1))
    _assert_every_member_equals(_conv2d(ChannelsFirst2d()), x, snn.MemberLayerNorm2d)


@pytest.mark.parametrize("make", [ChannelsLast, lambda: nn.LayerNorm(C)], ids=["named", "torch"])
def test_a_channels_last_layer_norm_still_converts(make):
    x = torch.randn(4, 6, 3, generator=torch.Generator().manual_seed(1))
    _assert_every_member_equals(_tokens(make()), x, snn.MemberLayerNorm)


# -- what cannot be told -----------------------------------------------------------------------
def test_a_module_taking_either_layout_at_one_rank_is_refused_saying_what_to_do(monkeypatch):
    norm = _randomize(EitherLayout())
    reason = refusal(norm)
    assert reason.startswith("EitherLayout computes both layer norm over the last dimension and")
    assert "register_norm(EitherLayout, snens.nn.MemberLayerNorm2d)" in reason
    model = _conv1d(norm)
    with pytest.raises(TypeError, match=r"1 \(EitherLayout\)\. EitherLayout computes both"):
        snens.convert(model, M, skip_unsupported=False)
    # what the refusal says to do: register the class as the layout the model gives it
    monkeypatch.setattr(registry, "_TABLE", dict(registry._TABLE))
    snn.register_norm(EitherLayout, snn.MemberLayerNorm2d)
    x = torch.randn(6, 3, 16, generator=torch.Generator().manual_seed(1))
    _assert_every_member_equals(model, x, snn.MemberLayerNorm2d)
