import pytest
import torch
from torch import nn

import snens

from conftest import TinyResNet


def test_param_groups_follow_one_rule():
    ens = snens.convert(TinyResNet(), num_members=4)
    groups = {g["name"]: g for g in snens.param_groups(ens, lr=0.1, weight_decay=5e-4)}
    ids = {name: {id(p) for p in g["params"]} for name, g in groups.items()}
    gammas = {id(m.gamma) for m in ens.modules() if isinstance(m, snens.nn.MemberNorm)}
    assert ids["gamma"] == gammas and len(gammas) == 6
    assert groups["gamma"]["lr"] == pytest.approx(3.0) and groups["gamma"]["weight_decay"] == 0
    norm_affine = {
        id(p)
        for m in ens.modules()
        if isinstance(m, snens.nn.MemberNorm)
        for p in (m.weight, m.bias)
    }
    assert norm_affine | {id(ens.model.fc.bias)} == ids["no_decay"]
    assert id(ens.model.fc.weight) in ids["decay"] and groups["decay"]["weight_decay"] == 5e-4
    # every parameter exactly once
    total = sum(len(g["params"]) for g in groups.values())
    assert total == len(list(ens.parameters())) == len(set().union(*ids.values()))
    torch.optim.SGD(snens.param_groups(ens, lr=0.1), lr=0.1)


def test_member_affine_decay_has_a_group_of_its_own_only_when_it_is_set():
    ens = snens.convert(TinyResNet(), num_members=4)
    norms = [m for m in ens.modules() if isinstance(m, snens.nn.MemberNorm)]
    affine = {id(p) for m in norms for p in (m.weight, m.bias)}
    plain = snens.param_groups(ens, lr=0.1)
    assert [g["name"] for g in plain] == ["decay", "no_decay", "gamma"]
    groups = {g["name"]: g for g in snens.param_groups(ens, lr=0.1, affine_weight_decay=0.5)}
    assert list(groups) == ["decay", "no_decay", "gamma", "member_affine"]
    assert {id(p) for p in groups["member_affine"]["params"]} == affine
    assert groups["member_affine"]["weight_decay"] == 0.5
    assert {id(p) for p in groups["no_decay"]["params"]} == {id(ens.model.fc.bias)}
    # AdamW's decoupled decay: with no gradient a member's scale shrinks by lr × decay, γ not
    optimizer = torch.optim.AdamW(list(groups.values()), lr=0.1)
    gamma, weight = norms[0].gamma.detach().clone(), norms[0].weight.detach().clone()
    for p in ens.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert torch.allclose(norms[0].weight, 0.95 * weight)
    assert torch.equal(norms[0].gamma, gamma)


def test_member_affine_decay_is_refused_where_there_are_no_member_norms():
    from snens.engine.config import load_config
    from snens.engine.presets import preset

    base = preset("fashion_mnist_small_cnn_tiny")
    for method in ("snens", "film"):
        config = load_config(base, [f"method.name={method}", "optim.affine_weight_decay=0.1"])
        assert config.optim.affine_weight_decay == 0.1
    with pytest.raises(ValueError, match="method 'packed' has no member norms; set it for"):
        load_config(base, ["method.name=packed", "optim.affine_weight_decay=0.1"])


def test_param_groups_refuse_bad_values():
    with pytest.raises(ValueError, match="lr must be a number >= 0, got -1"):
        snens.param_groups(TinyResNet(), lr=-1)
    with pytest.raises(ValueError, match="gamma_lr_multiplier must be finite"):
        snens.param_groups(TinyResNet(), lr=1e-3, gamma_lr_multiplier=float("inf"))
    with pytest.raises(ValueError, match="affine_weight_decay must be a number >= 0, got -0.1"):
        snens.param_groups(TinyResNet(), lr=1e-3, affine_weight_decay=-0.1)


def test_one_definition_of_a_norm_for_decay_and_finetuning():
    """A norm snens does not convert (a Hugging Face-style T5LayerNorm, a FrozenBatchNorm2d)
    is a norm for the parameter groups (no weight decay) and for fine-tuning (trained with
    norms_and_heads) alike: both ask snens.nn.registry.is_norm."""
    from snens.engine.build import select_finetune
    from snens.nn.registry import is_norm

    class T5LayerNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    model = nn.Sequential(
        nn.Linear(4, 8), T5LayerNorm(8), nn.LayerNorm(8), nn.InstanceNorm1d(8, affine=True),
        nn.Linear(8, 3),
    )  # fmt: skip
    assert [is_norm(m) for m in model] == [False, True, True, True, False]
    groups = {g["name"]: {id(p) for p in g["params"]} for g in snens.param_groups(model, 1e-3, 0.1)}
    norm_params = {id(p) for m in model if is_norm(m) for p in m.parameters()}
    assert norm_params <= groups["no_decay"] and not norm_params & groups["decay"]
    select_finetune(model, "norms_and_heads", num_classes=3)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    head = {id(p) for p in model[4].parameters()}
    assert trainable == norm_params | head
