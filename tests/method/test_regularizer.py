"""The diversity regularizer: hand values, its vertex optimum k*(τ), the inverse, the model API."""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from snens.method.regularizer import (
    diversity_gain,
    diversity_loss,
    diversity_penalty,
    optimal_k,
    tau_for_k,
)
from snens.nn import MemberBatchNorm2d, MemberGroupNorm, MemberLayerNorm


def _model(M: int = 4, seed: int = 0) -> nn.Module:
    """Two member-norm types, nested, plus a non-norm layer in between."""
    torch.manual_seed(seed)
    return nn.Sequential(
        OrderedDict(
            block=nn.Sequential(OrderedDict(bn=MemberBatchNorm2d(3, num_members=M))),
            act=nn.ReLU(),
            ln=MemberLayerNorm((2, 5), num_members=M),
            gn=MemberGroupNorm(2, 4, num_members=M),
        )
    )


def _hand_penalty(s: list[list[float]], tau: float) -> float:
    """Σ_i Σ_m (log softmax_m(s[:, i] / τ) + log M), written out."""
    M, C = len(s), len(s[0])
    total = 0.0
    for i in range(C):
        z = math.log(sum(math.exp(s[m][i] / tau) for m in range(M)))
        total += sum(s[m][i] / tau - z + math.log(M) for m in range(M))
    return total


def _vertex_value(k: int, M: int, tau: float) -> float:
    """r + M·log M at a vertex with k members at 1 and M − k at 0:
    k/τ − M·log(k·e^{1/τ} + M − k) + M·log M."""
    return k / tau - M * math.log(k * math.exp(1 / tau) + M - k) + M * math.log(M)


# ------------------------------------------------------------------------------------------------
# diversity_penalty
# ------------------------------------------------------------------------------------------------


def test_penalty_matches_hand_value_m2():
    s = [[0.2, 0.9], [0.7, 0.4]]
    # feature 0: s/τ = (0.4, 1.4), log Σ e = 1.4 + log(1 + e^{-1}), r = 1.8 − 2·(log Σ e);
    # each feature counted from equal sharing: + 2·log 2
    expected = (
        (1.8 - 2 * (1.4 + math.log(1 + math.exp(-1.0))))
        + (2.6 - 2 * (1.8 + math.log(1 + math.exp(-1.0))))
        + 2 * 2 * math.log(2)
    )
    got = diversity_penalty(torch.tensor(s, dtype=torch.float64), 0.5)
    assert_close(got.item(), expected, rtol=0, atol=1e-12)
    assert_close(got.item(), _hand_penalty(s, 0.5), rtol=0, atol=1e-12)
    # both features have s/τ one apart, so each gives r = −1 − 2·log(1 + e^{−1}) = −1.62652…,
    # + 2·log 2 = −0.24023…
    assert_close(expected, -0.48045802783311053, rtol=0, atol=1e-12)


def test_penalty_matches_hand_value_m3():
    s = [[0.1, 0.95], [0.5, 0.3], [0.8, 0.6]]
    got = diversity_penalty(torch.tensor(s, dtype=torch.float64), 0.3)
    assert_close(got.item(), _hand_penalty(s, 0.3), rtol=0, atol=1e-12)


def test_penalty_at_equal_sharing_is_zero():
    """The paper's −M·log M per feature is left out: 0 at equal sharing, the same gradient."""
    s = torch.full((4, 7), 0.37, dtype=torch.float64)
    assert diversity_penalty(s, 2.0).item() == 0.0
    s = torch.rand(4, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    paper = torch.log_softmax(s / 2.0, dim=0).sum()  # Σ_i Σ_m log softmax_m, constant kept
    assert_close(diversity_penalty(s, 2.0), paper + 7 * 4 * math.log(4), rtol=0, atol=1e-12)
    # in float32 the value keeps its digits at LLM size (35,136 features near equal sharing)
    big = 0.5 + 1e-3 * torch.randn(4, 35_136, generator=torch.Generator().manual_seed(1))
    exact = diversity_penalty(big.double(), 1.0).item()
    assert_close(diversity_penalty(big, 1.0).item(), exact, rtol=1e-6, atol=0)


def test_penalty_rejects_non_2d_importances():
    with pytest.raises(ValueError, match=r"2-D.*\(4, 2, 3\)"):
        diversity_penalty(torch.rand(4, 2, 3), 1.0)
    with pytest.raises(ValueError, match=r"2-D.*\(4,\)"):
        diversity_penalty(torch.rand(4), 1.0)


@pytest.mark.parametrize("M", [3, 4])
def test_gradient_is_zero_when_members_are_equal(M):
    layer = MemberBatchNorm2d(5, num_members=M)
    with torch.no_grad():
        layer.gamma.copy_(torch.randn(1, 5).expand(M, 5))
    diversity_loss(layer, temperature=0.5, weight=1.0).backward()
    assert_close(layer.gamma.grad, torch.zeros(M, 5), rtol=0, atol=1e-6)


def test_lower_temperature_pushes_harder():
    torch.manual_seed(0)
    layer = MemberLayerNorm(16, num_members=4)  # gamma ~ N(0, 1): asymmetric
    norms = []
    for tau in (0.05, 0.5, 5.0):
        layer.gamma.grad = None
        diversity_loss(layer, temperature=tau, weight=1.0).backward()
        norms.append(layer.gamma.grad.norm().item())
    assert norms[0] > norms[1] > norms[2] > 0
    # near equal sharing the pull is ≈ −(s − mean s)/τ², so 10× τ costs far more than 10×
    assert norms[1] / norms[2] > 50


# ------------------------------------------------------------------------------------------------
# k*(τ): the optimum over vertices
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("M", [4, 8])
@pytest.mark.parametrize("tau", [0.05, 0.2, 0.5, 1.0, 3.0, 10.0])
def test_brute_force_vertex_optimum_is_next_to_k_star(M, tau):
    best_value, best_k = math.inf, None
    for vertex in itertools.product((0.0, 1.0), repeat=M):
        v = torch.tensor(vertex, dtype=torch.float64).reshape(M, 1)
        value = diversity_penalty(v, tau).item()
        k = int(sum(vertex))
        # the value depends only on the number of ones; k = 0 and k = M are the uniform point
        expected = 0.0 if k in (0, M) else _vertex_value(k, M, tau)
        assert_close(value, expected, rtol=1e-12, atol=1e-9)
        if value < best_value - 1e-12:
            best_value, best_k = value, k
    k_star = optimal_k(tau, M)
    assert best_k >= 1
    assert best_k in {math.floor(k_star), math.ceil(k_star)}
    if k_star < 1:
        assert best_k == 1


def test_optimal_k_pinned_values():
    # k*(1) = M·(1 − 1/(e − 1))
    assert_close(optimal_k(1.0, 4), 4 * (1 - 1 / (math.e - 1)), rtol=1e-14, atol=0)
    assert_close(optimal_k(1.0, 4), 1.6720931725226942, rtol=1e-14, atol=0)
    assert_close(optimal_k(5.0, 4), 1.933377735492023, rtol=1e-13, atol=0)
    # τ → 0: k* = M·τ (e^{−1/τ} underflows); τ → ∞: k* = M·(1/2 − 1/(12τ) + …)
    assert optimal_k(1e-3, 4) == 4e-3
    assert optimal_k(1e-300, 8) == 8e-300
    assert_close(optimal_k(1e3, 4), 4 * (0.5 - 1e-3 / 12 + 1e-9 / 720), rtol=1e-14, atol=0)
    assert_close(optimal_k(1e12, 4), 2.0, rtol=1e-12, atol=0)


def test_optimal_k_is_increasing_and_smooth_across_regimes():
    taus = [10 ** (e / 20) for e in range(-60, 121)]  # 1e-3 .. 1e6, crossing τ = 100
    ks = [optimal_k(t, 4) for t in taus]
    assert all(b > a for a, b in itertools.pairwise(ks))
    assert all(0 < k < 2 for k in ks)
    # the series branch (1/τ < 1e-2) agrees with the closed form, which is still accurate there
    for tau in (100.5, 150.0, 400.0):
        closed = 4 * (tau - 1 / math.expm1(1 / tau))
        assert_close(optimal_k(tau, 4), closed, rtol=1e-12, atol=0)


@pytest.mark.parametrize("M", [2, 4, 8, 16])
@pytest.mark.parametrize("tau", [1e-3, 0.05, 0.5, 1.0, 5.0, 100.0, 1e3])
def test_tau_for_k_inverts_optimal_k(M, tau):
    assert_close(tau_for_k(optimal_k(tau, M), M), tau, rtol=1e-10, atol=0)


@pytest.mark.parametrize(("k", "M"), [(1, 4), (1.5, 4), (0.01, 4), (1.999, 4), (2, 8), (3.5, 8)])
def test_optimal_k_inverts_tau_for_k(k, M):
    assert_close(optimal_k(tau_for_k(k, M), M), float(k), rtol=1e-11, atol=0)


def test_tau_for_k_pinned():
    # k = 1 of M = 4 needs τ with τ − 1/(e^{1/τ} − 1) = 1/4
    tau = tau_for_k(1, 4)
    assert_close(tau - 1 / math.expm1(1 / tau), 0.25, rtol=1e-12, atol=0)
    assert tau_for_k(1, 4) < tau_for_k(1.5, 4) < tau_for_k(1.9, 4)


@pytest.mark.parametrize("k", [0, -1, 2, 2.0, 3, float("nan"), float("inf")])
def test_tau_for_k_rejects_k_outside_range(k):
    with pytest.raises(ValueError, match=rf"k={k!r}.*0 < k < M/2 = 2\.0.*M=4"):
        tau_for_k(k, 4)


def test_tau_for_k_rejects_bad_num_members():
    with pytest.raises(ValueError, match="num_members must be >= 1, got 0"):
        tau_for_k(0.5, 0)
    with pytest.raises(TypeError, match="num_members must be an int"):
        tau_for_k(1, 4.0)
    with pytest.raises(TypeError, match="num_members must be an int"):
        tau_for_k(0.25, True)
    with pytest.raises(TypeError, match="num_members must be an int"):
        optimal_k(1.0, "4")
    with pytest.raises(TypeError, match="k must be a real number"):
        tau_for_k("1", 4)


# ------------------------------------------------------------------------------------------------
# diversity_loss on models
# ------------------------------------------------------------------------------------------------


def test_loss_is_weight_times_sum_of_layer_penalties():
    model = _model()
    expected = 0.0
    for _, m in model.named_modules():
        if isinstance(m, (MemberBatchNorm2d, MemberLayerNorm, MemberGroupNorm)):
            expected += _hand_penalty(torch.sigmoid(m.gamma).reshape(4, -1).tolist(), 0.7)
    loss = diversity_loss(model, temperature=0.7, weight=0.3)
    assert loss.dim() == 0 and loss.requires_grad
    assert_close(loss.item(), 0.3 * expected, rtol=1e-6, atol=1e-6)
    loss.backward()
    for m in (model.block.bn, model.ln, model.gn):
        assert m.gamma.grad is not None and m.gamma.grad.abs().sum() > 0


def test_loss_default_weight_and_temperature():
    """The defaults are τ=1, λ=0.1 (chosen on validation: snens.method.regularizer), the same in the
    function, the engine's config and the presets."""
    from snens.engine.config import MethodConfig
    from snens.engine.presets import PRESETS
    from snens.method.regularizer import DEFAULT_DIVERSITY_WEIGHT, DEFAULT_TEMPERATURE

    assert (DEFAULT_TEMPERATURE, DEFAULT_DIVERSITY_WEIGHT) == (1.0, 0.1)
    model = _model()
    layers = (model.block.bn, model.ln, model.gn)
    expected = sum(diversity_penalty(m.importances(), 1.0) for m in layers)
    assert_close(diversity_loss(model), 0.1 * expected, rtol=1e-6, atol=1e-7)
    assert (MethodConfig().temperature, MethodConfig().diversity_weight) == (1.0, 0.1)
    # a preset whose recipe was chosen for its regime (a pretrained LLM: the weaker partition)
    chosen = {"rotten_tomatoes_smollm2": (5.0, 0.01)}
    for name, config in PRESETS.items():
        recipe = (config.method.temperature, config.method.diversity_weight)
        assert recipe == chosen.get(name, (1.0, 0.1)), name


def test_layers_by_name_and_by_callable():
    model = _model()
    tau = 0.4
    bn = diversity_penalty(model.block.bn.importances(), tau)
    ln = diversity_penalty(model.ln.importances(), tau)
    gn = diversity_penalty(model.gn.importances(), tau)
    got = diversity_loss(model, tau, 1.0, layers=["ln", "block.bn"])
    assert_close(got, bn + ln, rtol=1e-6, atol=1e-6)
    got = diversity_loss(model, tau, 1.0, layers=lambda name, m: isinstance(m, MemberGroupNorm))
    assert_close(got, gn, rtol=1e-6, atol=1e-6)
    got = diversity_loss(model, tau, 1.0, layers=lambda name, m: name.startswith("block"))
    assert_close(got, bn, rtol=1e-6, atol=1e-6)
    # only the selected layer gets a gradient
    diversity_loss(model, tau, 1.0, layers=["gn"]).backward()
    assert model.ln.gamma.grad is None and model.gn.gamma.grad is not None


def test_unknown_layer_name_lists_available_names():
    with pytest.raises(ValueError, match=r"\['blk.bn'\].*'block.bn', 'ln', 'gn'"):
        diversity_loss(_model(), layers=["blk.bn"])
    with pytest.raises(ValueError, match="selected none"):
        diversity_loss(_model(), layers=lambda name, m: False)
    with pytest.raises(TypeError, match=r"layers=\['ln'\]"):
        diversity_loss(_model(), layers="ln")


def test_model_without_member_norms_is_refused():
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    with pytest.raises(ValueError, match="snens.convert"):
        diversity_loss(plain)
    with pytest.raises(ValueError, match="snens.convert"):
        diversity_gain(plain)


@pytest.mark.parametrize(
    ("kwargs", "error", "shown"),
    [
        ({"weight": -0.1}, ValueError, "-0.1"),
        ({"weight": float("nan")}, ValueError, "nan"),
        ({"weight": "1"}, TypeError, "'1'"),
        ({"temperature": 0}, ValueError, "got 0"),
        ({"temperature": -1}, ValueError, "got -1"),
        ({"temperature": float("nan")}, ValueError, "nan"),
        ({"temperature": float("inf")}, ValueError, "inf"),
        ({"temperature": "1"}, TypeError, "'1'"),
        ({"temperature": True}, TypeError, "True"),
    ],
)
def test_bad_arguments_are_refused_with_their_value(kwargs, error, shown):
    with pytest.raises(error, match=shown):
        diversity_loss(_model(), **kwargs)
    if "temperature" in kwargs:
        with pytest.raises(error, match=shown):
            diversity_penalty(torch.rand(4, 3), kwargs["temperature"])
        with pytest.raises(error, match=shown):
            optimal_k(kwargs["temperature"], 4)
        with pytest.raises(error, match=shown):
            diversity_gain(_model(), kwargs["temperature"])


def test_zero_weight_gives_zero_loss():
    assert diversity_loss(_model(), weight=0).item() == 0.0


@pytest.mark.parametrize("tau", [1e-3, 1e3])
@pytest.mark.parametrize("autocast", [False, True])
def test_finite_loss_and_gradients_at_extreme_temperatures(tau, autocast):
    model = _model()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = diversity_loss(model, temperature=tau, weight=1.0)
    assert torch.isfinite(loss)
    loss.backward()
    for m in (model.block.bn, model.ln, model.gn):
        assert torch.isfinite(m.gamma.grad).all()
        assert m.gamma.grad.abs().sum() > 0


@pytest.mark.parametrize("tau", [1e-3, 1.0, 1e3])
def test_bfloat16_parameters_give_finite_loss(tau):
    model = _model().to(torch.bfloat16)
    loss = diversity_loss(model, temperature=tau, weight=1.0)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(model.ln.gamma.grad.float()).all()


# ------------------------------------------------------------------------------------------------
# diversity_gain
# ------------------------------------------------------------------------------------------------


def test_gain_is_zero_at_equal_sharing():
    model = _model()
    with torch.no_grad():
        for m in (model.block.bn, model.ln, model.gn):
            m.gamma.copy_(m.gamma[:1].expand_as(m.gamma))
    assert_close(diversity_gain(model, 0.3), 0.0, rtol=0, atol=1e-6)


def test_gain_is_positive_and_matches_hand_value():
    layer = MemberLayerNorm(2, num_members=2)
    s = [[0.2, 0.9], [0.7, 0.4]]
    with torch.no_grad():
        layer.gamma.copy_(torch.logit(torch.tensor(s)))
    # per feature: −(r_i + 2·log 2), averaged over the 2 features
    hand = -_hand_penalty(s, 0.5) / 2
    got = diversity_gain(layer, temperature=0.5)
    assert got > 0
    assert_close(got, hand, rtol=1e-5, atol=1e-7)
    # both features: −(r + 2·log 2) = 1 + 2·log(1 + e^{−1}) − 2·log 2 = 0.24022…
    assert_close(got, 0.24022901391655527, rtol=1e-6, atol=0)


def test_gain_pools_features_over_layers():
    model = _model()
    per_layer = []
    for name, C in (("block.bn", 3), ("ln", 10), ("gn", 4)):
        per_layer.append((diversity_gain(model, 0.5, layers=[name]), C))
    pooled = sum(g * c for g, c in per_layer) / sum(c for _, c in per_layer)
    assert_close(diversity_gain(model, 0.5), pooled, rtol=1e-9, atol=0)


# ------------------------------------------------------------------------------------------------
# Gradient descent does not go to k*
# ------------------------------------------------------------------------------------------------


def _owners_after_adam(tau: float, M: int = 4, C: int = 500, steps: int = 300, seed: int = 0):
    """Adam on the regularizer alone from gamma ~ N(0, 1); owners = members with s > 0.5."""
    g = torch.Generator().manual_seed(seed)
    gamma = torch.randn(M, C, generator=g).requires_grad_()
    opt = torch.optim.Adam([gamma], lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        diversity_penalty(torch.sigmoid(gamma), tau).backward()
        opt.step()
    s = torch.sigmoid(gamma.detach())
    # every feature ends at a vertex: importances near 0 or 1
    assert ((s > 0.05) & (s < 0.95)).sum() == 0
    return (s > 0.5).sum(dim=0)


def test_gradient_descent_lands_on_local_minima_not_k_star():
    owners = _owners_after_adam(5.0)
    counts = torch.bincount(owners, minlength=5).tolist()
    # k*(5) = 1.93, so the global optimum puts every feature at k = 2 (r(2) < r(1));
    # measured: 89 / 326 / 85 features at k = 1 / 2 / 3, mean 1.99 ≈ M/2 from the random start.
    assert _vertex_value(2, 4, 5.0) < _vertex_value(1, 4, 5.0)
    assert counts[0] == 0 and counts[4] == 0
    assert counts[3] > 50  # k = 3 is a local minimum, far from k*
    assert_close(owners.float().mean().item(), 1.99, rtol=0, atol=0.1)
    # τ = 0.05 (k* = 0.2): mostly one owner; measured 1.22
    few = _owners_after_adam(0.05).float().mean().item()
    assert_close(few, 1.22, rtol=0, atol=0.1)
    assert few < owners.float().mean().item() - 0.5
