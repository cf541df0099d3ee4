"""The realized allocation: importances and effective members per feature."""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from snens.method.allocation import LayerAllocation, allocation, mean_effective_members
from snens.nn import MemberBatchNorm2d, MemberGroupNorm, MemberLayerNorm


def _model(M: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            stem=nn.Conv2d(3, 3, 1),
            block=nn.Sequential(OrderedDict(bn=MemberBatchNorm2d(3, num_members=M))),
            ln=MemberLayerNorm((2, 3), num_members=M),
            gn=MemberGroupNorm(1, 5, num_members=M),
        )
    )


def test_keys_are_module_names_and_importances_are_sigmoid_gamma():
    model = _model()
    result = allocation(model)
    assert list(result) == ["block.bn", "ln", "gn"]
    for name, layer in (("block.bn", model.block.bn), ("ln", model.ln), ("gn", model.gn)):
        expected = torch.sigmoid(layer.gamma.detach()).reshape(4, -1)
        assert_close(result[name].importances, expected, rtol=0, atol=1e-7)
        assert result[name].importances.device.type == "cpu"
        assert not result[name].importances.requires_grad
        assert result[name].num_members == 4
    assert result["ln"].importances.shape == (4, 6)  # (2, 3) features flattened


def test_effective_members_is_m_at_equal_sharing():
    model = _model()
    with torch.no_grad():
        for layer in (model.block.bn, model.ln, model.gn):
            layer.gamma.copy_(layer.gamma[:1].expand_as(layer.gamma))
    for layer_allocation in allocation(model).values():
        C = layer_allocation.effective_members.numel()
        assert_close(layer_allocation.effective_members, torch.full((C,), 4.0), rtol=0, atol=1e-5)
    assert_close(mean_effective_members(model), 4.0, rtol=0, atol=1e-5)


def test_effective_members_is_one_with_a_single_owner():
    layer = MemberBatchNorm2d(6, num_members=4)
    with torch.no_grad():
        layer.gamma.fill_(-20.0)
        layer.gamma[torch.arange(6) % 4, torch.arange(6)] = 20.0  # feature i owned by i mod 4
    result = allocation(nn.Sequential(layer))["0"]
    assert_close(result.effective_members, torch.ones(6), rtol=0, atol=1e-3)
    assert_close(result.mean_effective_members, 1.0, rtol=0, atol=1e-3)


def test_effective_members_hand_value():
    # q = (0.75, 0.25) after normalizing s = (0.6, 0.2): exp(H) = exp(−.75·log .75 − .25·log .25)
    layer = MemberLayerNorm(1, num_members=2)
    with torch.no_grad():
        layer.gamma.copy_(torch.logit(torch.tensor([[0.6], [0.2]])))
    expected = math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    got = allocation(layer)[""].effective_members
    assert_close(got, torch.tensor([expected]), rtol=1e-6, atol=0)
    assert_close(expected, 1.7547653, rtol=1e-7, atol=0)


def test_saturated_importances_stay_finite():
    layer = MemberLayerNorm(3, num_members=4)
    with torch.no_grad():
        layer.gamma.fill_(-200.0)  # sigmoid underflows to 0 in float32
        layer.gamma[0, 0] = 5.0
    result = allocation(layer)[""]
    assert torch.isfinite(result.effective_members).all()
    # feature 0 has one owner; features 1, 2 have four equally tiny importances
    assert_close(result.effective_members, torch.tensor([1.0, 4.0, 4.0]), rtol=0, atol=1e-5)


def test_mean_is_feature_weighted_over_layers():
    model = nn.Sequential(MemberLayerNorm(3, num_members=4), MemberLayerNorm(5, num_members=4))
    with torch.no_grad():
        model[0].gamma.fill_(0.3)  # 3 features, 4 effective members each
        model[1].gamma.fill_(-20.0)
        model[1].gamma[0] = 20.0  # 5 features, 1 owner each
    expected = (3 * 4 + 5 * 1) / 8
    assert_close(mean_effective_members(model), expected, rtol=0, atol=1e-5)
    assert_close(mean_effective_members(allocation(model)), expected, rtol=0, atol=1e-5)


def test_layer_allocation_is_frozen():
    result = allocation(_model())["ln"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.importances = torch.zeros(4, 6)
    assert isinstance(result, LayerAllocation)


def test_errors():
    plain = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    with pytest.raises(ValueError, match="snens.convert"):
        allocation(plain)
    with pytest.raises(ValueError, match="snens.convert"):
        mean_effective_members(plain)
    with pytest.raises(ValueError, match="empty"):
        mean_effective_members({})
    with pytest.raises(TypeError, match="list"):
        mean_effective_members([1, 2])
