import pytest
import torch

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


def test_param_groups_refuse_bad_values():
    with pytest.raises(ValueError, match="lr must be a number >= 0, got -1"):
        snens.param_groups(TinyResNet(), lr=-1)
    with pytest.raises(ValueError, match="gamma_lr_multiplier must be finite"):
        snens.param_groups(TinyResNet(), lr=1e-3, gamma_lr_multiplier=float("inf"))
