"""Numerics: temperatures from 1e-3 to 1e3, bf16 autocast, float64, and extreme logits.

Claims pinned here:

* the diversity loss and its gradient with respect to every gamma are finite for
  τ ∈ {1e-3, 1e-2, 1, 1e2, 1e3} and gamma anywhere in [−30, 30], in float32, under
  ``torch.autocast("cpu", dtype=torch.bfloat16)`` and with bfloat16 parameters;
* a converted TinyResNet and TinyTransformer train under bf16 autocast with finite losses and
  gradients, and every member norm's output under autocast is within 2e-2 (relative,
  Frobenius) of its float32 output;
* a model cast to float64 before conversion reproduces the original to 1e-10;
* ``predictive_probs`` and ``ensemble_loss`` of bf16 logits differ from the float32 results by
  no more than the bf16 rounding of the logits allows (softmax and cross-entropy are
  Lipschitz in the max-norm of the logits);
* logits of ±1e4 give a finite NLL, a finite ``ensemble_loss`` and finite gradients.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import snens
from snens import metrics
from snens.nn import MemberBatchNorm2d, MemberGroupNorm, MemberLayerNorm, MemberNorm

from conftest import TinyResNet, TinyTransformer, randomize_norms

TEMPERATURES = [1e-3, 1e-2, 1.0, 1e2, 1e3]


pytestmark = pytest.mark.usefixtures("one_thread")


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """‖got − want‖ / ‖want‖ in float64 (Frobenius)."""
    want = want.double()
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


# ------------------------------------------------------------------------------------------------
# The diversity loss across temperatures and gammas
# ------------------------------------------------------------------------------------------------


def _member_norms(M: int, gammas: str, seed: int = 0) -> nn.Module:
    """Three member-norm types whose gammas span [−30, 30] in the named arrangement."""
    model = nn.Sequential(
        MemberBatchNorm2d(8, M), MemberLayerNorm((2, 5), M), MemberGroupNorm(2, 6, M)
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if not isinstance(m, MemberNorm):
                continue
            n = m.gamma.numel()
            grid = torch.linspace(-30, 30, n)
            if gammas == "spread":  # the grid shuffled over members and features
                values = grid[torch.randperm(n, generator=g)]
            elif gammas == "extremes":  # ±30 only, one member owning each feature
                values = torch.full((M, n // M), -30.0)
                owner = torch.randint(0, M, (n // M,), generator=g)
                values[owner, torch.arange(n // M)] = 30.0
            elif gammas == "equal":  # every member alike: the gradient is exactly 0
                values = grid[torch.randint(0, n, (1,), generator=g)].expand(n)
            else:  # members a hair apart around a steep or a flat part of the sigmoid
                values = torch.full((n,), float(gammas)) + 1e-3 * torch.randn(n, generator=g)
            m.gamma.copy_(values.reshape(m.gamma.shape))
    return model


def _reference_loss(model: nn.Module, tau: float) -> float:
    """Σ_i Σ_m (log softmax_m(s_i / τ) + log M), in float64: 0 at equal sharing."""
    return sum(
        (torch.log_softmax(m.importances().detach().double() / tau, 0) + math.log(m.num_members))
        .sum()
        .item()
        for m in model.modules()
        if isinstance(m, MemberNorm)
    )


def _check_finite_loss_and_gammas(model: nn.Module, loss: torch.Tensor) -> None:
    assert loss.dim() == 0 and torch.isfinite(loss), loss
    loss.backward()
    for name, m in model.named_modules():
        if isinstance(m, MemberNorm):
            assert m.gamma.grad is not None, name
            assert torch.isfinite(m.gamma.grad).all(), f"{name}: {m.gamma.grad}"


@pytest.mark.parametrize("gammas", ["spread", "extremes", "equal", "0", "-30", "30"])
@pytest.mark.parametrize("tau", TEMPERATURES)
@pytest.mark.parametrize("M", [2, 4])
def test_diversity_loss_finite_in_float32(M, tau, gammas):
    model = _member_norms(M, gammas)
    loss = snens.diversity_loss(model, temperature=tau, weight=1.0)
    _check_finite_loss_and_gammas(model, loss)
    assert loss.item() == pytest.approx(_reference_loss(model, tau), rel=1e-5, abs=1e-4)
    if gammas == "equal":  # ∂r/∂s_m = (1 − M·p_m)/τ = 0 at equal sharing
        for m in model.modules():
            if isinstance(m, MemberNorm):
                assert m.gamma.grad.abs().max() <= 1e-6 / tau


@pytest.mark.parametrize("gammas", ["spread", "extremes", "equal", "0", "-30", "30"])
@pytest.mark.parametrize("tau", TEMPERATURES)
def test_diversity_loss_finite_under_bf16_autocast(tau, gammas):
    model = _member_norms(4, gammas)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = snens.diversity_loss(model, temperature=tau, weight=1.0)
    _check_finite_loss_and_gammas(model, loss)
    # sigmoid and log_softmax run in float32 under autocast: the float32 value
    assert loss.item() == pytest.approx(_reference_loss(model, tau), rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("gammas", ["spread", "extremes", "equal", "0", "-30", "30"])
@pytest.mark.parametrize("tau", TEMPERATURES)
def test_diversity_loss_finite_with_bf16_parameters(tau, gammas):
    model = _member_norms(4, gammas).bfloat16()
    loss = snens.diversity_loss(model, temperature=tau, weight=1.0)
    assert loss.dtype == torch.float32  # half-precision importances are computed in float32
    _check_finite_loss_and_gammas(model, loss)


# ------------------------------------------------------------------------------------------------
# Training under bf16 autocast
# ------------------------------------------------------------------------------------------------


def _resnet_case(M: int):
    torch.manual_seed(0)
    model = randomize_norms(TinyResNet())
    g = torch.Generator().manual_seed(1)
    x = torch.rand(8, 3, 8, 8, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    return model, (x,), {}, y


def _transformer_case(M: int):
    torch.manual_seed(0)
    model = randomize_norms(TinyTransformer())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50, (8, 7), generator=g)
    mask = torch.ones(8, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[5, 2:] = 0
    y = torch.randint(0, 3, (8,), generator=g)
    return model, (ids,), {"attention_mask": mask}, y


CASES = {"resnet": _resnet_case, "transformer": _transformer_case}


@pytest.mark.parametrize("input_policy", ["repeat", "split"])
@pytest.mark.parametrize("tau", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("case", list(CASES))
def test_training_under_bf16_autocast_stays_finite(case, tau, input_policy):
    M = 4
    model, args, kwargs, y = CASES[case](M)
    ens = snens.convert(model, M, input_policy=input_policy).train()
    opt = torch.optim.SGD(ens.parameters(), lr=0.05, momentum=0.9)
    for step in range(4):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = ens(*args, **kwargs)
            task = snens.ensemble_loss(logits, y)
            div = snens.diversity_loss(ens, temperature=tau, weight=1e-2)
            loss = task + div
        assert logits.shape[0] == M
        assert torch.isfinite(task) and torch.isfinite(div), (step, task, div)
        loss.backward()
        for name, p in ens.named_parameters():
            if p.grad is not None:
                assert torch.isfinite(p.grad).all(), f"step {step}: {name}"
        gammas = [m.gamma for m in ens.modules() if isinstance(m, MemberNorm)]
        assert all(g.grad is not None for g in gammas)
        opt.step()
    assert all(torch.isfinite(p).all() for p in ens.parameters())


def _member_norm_outputs(ens: nn.Module, args, kwargs, autocast: bool) -> dict[str, torch.Tensor]:
    outputs: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda _m, _a, out, n=name: outputs.__setitem__(n, out.detach()))
        for name, m in ens.named_modules()
        if isinstance(m, MemberNorm)
    ]
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            ens(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return outputs


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_member_norm_outputs_under_autocast_stay_close_to_float32(case, training):
    model, args, kwargs, _ = CASES[case](4)
    ens = snens.convert(model, 4).train(training)
    # the same state for both passes: training updates running statistics
    reference = _member_norm_outputs(copy.deepcopy(ens), args, kwargs, autocast=False)
    low = _member_norm_outputs(copy.deepcopy(ens), args, kwargs, autocast=True)
    assert reference.keys() == low.keys() and len(reference) >= 5
    if case == "resnet":  # batch norms follow bf16 convolutions: they run in bf16
        assert any(out.dtype == torch.bfloat16 for out in low.values())
    for name, out in low.items():
        assert out.shape == reference[name].shape
        assert _relative_error(out, reference[name]) < 2e-2, name


# ------------------------------------------------------------------------------------------------
# float64
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("M", [1, 3, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_float64_conversion_reproduces_the_model_to_1e_10(case, M, training):
    model, args, kwargs, _ = CASES[case](M)
    model = model.double().train(training)
    args = tuple(a.double() if a.is_floating_point() else a for a in args)
    generator = torch.Generator().manual_seed(2)
    ens = snens.convert(model, M, gamma_std=3.0, generator=generator).train(training)
    assert all(p.dtype == torch.float64 for p in ens.parameters())
    with torch.no_grad():
        expected = model(*args, **kwargs)
        out = ens(*args, **kwargs)
    assert out.dtype == torch.float64 and out.shape == (M, *expected.shape)
    assert_close(out, expected.expand_as(out), atol=1e-10, rtol=1e-10)
    for m in range(M):
        with torch.no_grad():
            single = snens.extract_member(ens, m).train(training)(*args, **kwargs)
        assert_close(single, expected, atol=1e-10, rtol=1e-10)


def test_float32_conversion_cast_to_float64_keeps_float32_precision():
    """Converted in float32, weights were divided by sigmoid(gamma) in float32: a later
    .double() computes in float64 but reproduces the model only to float32 precision."""
    model, args, kwargs, _ = _resnet_case(4)
    model.eval()
    ens = snens.convert(model, 4, gamma_std=3.0).eval().double()
    x = args[0].double()
    with torch.no_grad():
        out, expected = ens(x), model.double()(x)
    assert out.dtype == torch.float64
    assert_close(out, expected.expand_as(out), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# bf16 logits
# ------------------------------------------------------------------------------------------------


def _logits(scale: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(4, 32, 10, generator=g) * scale
    return z, torch.randint(0, 10, (32,), generator=g)


@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0, 100.0])
def test_predictive_probs_of_bf16_logits_within_bf16_precision(scale):
    z32, _ = _logits(scale)
    z16 = z32.bfloat16()
    delta = (z16.float() - z32).abs().max().item()  # the bf16 rounding of the logits
    p16, p32 = snens.predictive_probs(z16), snens.predictive_probs(z32)
    assert p16.dtype == torch.float32
    assert torch.equal(p16, snens.predictive_probs(z16.float()))
    # every softmax entry moves by a factor within e^{±2δ} when each logit moves by ≤ δ
    assert_close(p16, p32, atol=math.expm1(2 * delta) + 1e-6, rtol=0)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0, 100.0])
def test_ensemble_loss_of_bf16_logits_within_bf16_precision(scale, split, label_smoothing):
    z32, y = _logits(scale)
    if split:
        z32 = z32[:, :8]  # (M, B/M, K): member m is scored on labels[8m:8m+8]
    z16 = z32.bfloat16()
    delta = (z16.float() - z32).abs().max().item()
    loss16 = snens.ensemble_loss(z16, y, label_smoothing=label_smoothing)
    loss32 = snens.ensemble_loss(z32, y, label_smoothing=label_smoothing)
    assert loss16.dtype == torch.float32
    # CE = logsumexp(z) − Σ_k q_k z_k moves by ≤ 2δ when each logit moves by ≤ δ
    assert abs(loss16.item() - loss32.item()) <= 2 * delta + 1e-5 * (1 + abs(loss32.item()))


# ------------------------------------------------------------------------------------------------
# Extreme logits
# ------------------------------------------------------------------------------------------------


def _extreme_logits(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """±1e4 logits, members disagreeing, each label on a class some member scores −1e4."""
    M, B, K = 3, 6, 4
    z = torch.full((M, B, K), -1e4)
    for m in range(M):
        z[m, :, m % K] = 1e4
    labels = torch.tensor([3, 3, 0, 1, 3, 2])
    return z.to(dtype), labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_extreme_logits_give_finite_nll_and_ensemble_loss(dtype):
    z, y = _extreme_logits(dtype)
    probs = snens.predictive_probs(z)
    assert torch.isfinite(probs).all()
    nll = metrics.nll(probs, y)
    # label 3 has probability exp(−2e4) = 0 in float32, clamped at tiny: −log(tiny) = 87.3
    assert math.isfinite(nll) and 0 < nll <= -math.log(torch.finfo(torch.float32).tiny) + 1e-6
    member = metrics.per_member(z.float().softmax(-1), y)["nll"]
    assert torch.isfinite(member).all()

    z = z.clone().requires_grad_(True)
    loss = snens.ensemble_loss(z, y)
    assert torch.isfinite(loss)
    # a member scoring the label at −1e4 and another class at 1e4 pays 2e4 nats
    assert loss.item() <= 2e4 * (1 + 1e-2)
    loss.backward()
    assert torch.isfinite(z.grad).all()
    smoothed = snens.ensemble_loss(z.detach(), y, label_smoothing=0.1)
    assert torch.isfinite(smoothed)


def test_extreme_logits_through_a_converted_model_stay_finite():
    """A head that outputs ±1e4 still gives finite losses and gradients."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    with torch.no_grad():
        model[3].weight.mul_(1e4)
    ens = snens.convert(model, 4).train()
    x, y = torch.randn(16, 3), torch.randint(0, 4, (16,))
    logits = ens(x)
    assert logits.abs().max() > 1e3
    loss = snens.ensemble_loss(logits, y) + snens.diversity_loss(ens, temperature=1e-3)
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in ens.parameters() if p.grad is not None)
    assert math.isfinite(metrics.nll(snens.predictive_probs(logits.detach()), y))
