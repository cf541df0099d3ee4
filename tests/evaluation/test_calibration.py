"""Temperature scaling recovers a known overconfidence factor and lowers the validation NLL."""

import math
import warnings

import pytest
import torch

import snens
from snens import metrics
from snens.baselines import SingleModel
from snens.data import TensorLoader
from snens.evaluation.calibration import TemperatureScaled, fit_temperature
from snens.evaluation.protocol import collect, evaluate

N, K, M = 10_000, 10, 4


def _sample_labels(probs: torch.Tensor, seed: int) -> torch.Tensor:
    return torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).squeeze(1)


@pytest.fixture(scope="module")
def calibrated():
    """Member logits (M, N, K) whose ensemble mean is calibrated: labels ~ mean of softmaxes."""
    g = torch.Generator().manual_seed(0)
    shared = 1.5 * torch.randn(N, K, generator=g, dtype=torch.float64)
    members = shared + 0.7 * torch.randn(M, N, K, generator=g, dtype=torch.float64)
    return members, _sample_labels(members.softmax(-1).mean(0), seed=1)


def _nll(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> float:
    z = logits if logits.dim() == 3 else logits.unsqueeze(0)
    return metrics.nll(snens.predictive_probs(z / temperature), labels)


@pytest.mark.parametrize("factor", [3.0, 0.5])
def test_single_model_recovers_the_scaling_factor(factor):
    g = torch.Generator().manual_seed(2)
    logits = 2 * torch.randn(N, K, generator=g, dtype=torch.float64)
    labels = _sample_labels(logits.softmax(-1), seed=3)
    temperature = fit_temperature(factor * logits, labels)
    assert temperature == pytest.approx(factor, rel=0.05)


def test_ensemble_mean_recovers_the_scaling_factor(calibrated):
    members, labels = calibrated
    overconfident = 3 * members
    temperature = fit_temperature(overconfident, labels)
    assert temperature == pytest.approx(3.0, rel=0.05)
    # fitting lowers the validation NLL, and T is the minimum (±2% is worse)
    best = _nll(overconfident, labels, temperature)
    assert best < _nll(overconfident, labels) - 0.1
    assert best <= _nll(overconfident, labels, temperature * 1.02)
    assert best <= _nll(overconfident, labels, temperature / 1.02)


def test_logits_mode_scales_the_mean_logit(calibrated):
    members, _ = calibrated
    labels = _sample_labels(members.mean(0).softmax(-1), seed=4)  # calibrated logit average
    temperature = fit_temperature(3 * members, labels, mode="logits")
    assert temperature == pytest.approx(3.0, rel=0.05)
    assert temperature == pytest.approx(fit_temperature(3 * members.mean(0), labels), rel=1e-6)


def test_log_probabilities_give_the_same_temperature(calibrated):
    members, labels = calibrated
    z = (3 * members).float()
    log_probs = z.log_softmax(-1)
    log_probs[0, 0, log_probs[0, 0].argmin()] = -math.inf  # an underflowed probability
    assert fit_temperature(log_probs, labels) == pytest.approx(fit_temperature(z, labels), rel=1e-5)


def test_fit_is_deterministic_and_single_member_equals_two_d(calibrated):
    members, labels = calibrated
    one = 2 * members[0]
    assert fit_temperature(one, labels) == fit_temperature(one, labels)
    assert fit_temperature(one.unsqueeze(0), labels) == fit_temperature(one, labels)


def test_perfectly_separated_validation_set_warns_at_the_bound():
    labels = torch.arange(50) % K
    logits = 10 * torch.nn.functional.one_hot(labels, K).double()
    with pytest.warns(RuntimeWarning, match="bound"):
        temperature = fit_temperature(logits, labels)
    assert temperature < 0.015


# ------------------------------------------------------------------------------------------------
# TemperatureScaled
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def ensemble(resnet):
    return snens.convert(resnet, num_members=3, generator=torch.Generator().manual_seed(0)).eval()


def test_wrapper_divides_the_member_logits(ensemble):
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    scaled = TemperatureScaled(ensemble, 2.5).eval()
    with torch.no_grad():
        torch.testing.assert_close(scaled(x), ensemble(x) / 2.5, rtol=1e-6, atol=1e-7)
        mean_scaled = TemperatureScaled(ensemble, 2.5, mode="logits")(x)
        torch.testing.assert_close(
            mean_scaled, ensemble(x).mean(0, keepdim=True) / 2.5, rtol=1e-6, atol=1e-7
        )
    assert scaled.num_members == 3 and TemperatureScaled(ensemble, 2.5, mode="logits").num_members
    assert scaled.temperature.item() == 2.5 and "temperature" in scaled.state_dict()


def test_evaluate_works_on_the_scaled_ensemble(ensemble):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 3, 8, 8, generator=g)
    with torch.no_grad():
        y = snens.predictive_probs(ensemble(x)).argmax(-1)
    y[::3] = torch.randint(0, 5, (14,), generator=g)  # a third relabelled: T finite, inside bounds
    val, test = TensorLoader(x[:20], y[:20], 8), TensorLoader(x[20:], y[20:], 8)
    val_logits, val_labels = collect(ensemble, val, logits=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not at a bound
        temperature = fit_temperature(val_logits, val_labels)
    result = evaluate(TemperatureScaled(ensemble, temperature), test)
    with torch.no_grad():
        expected = _nll(ensemble(x[20:]), y[20:], temperature)
    assert result["test/nll"] == pytest.approx(expected, abs=1e-6)
    assert result["test/num_members"] == 3.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_temperature_values(ensemble, bad):
    with pytest.raises(ValueError, match="finite and > 0"):
        TemperatureScaled(ensemble, bad)


@pytest.mark.parametrize("bad", [True, "2", None])
def test_bad_temperature_types(ensemble, bad):
    with pytest.raises(TypeError, match="real number"):
        TemperatureScaled(ensemble, bad)


def test_wrapper_needs_the_ensemble_contract(resnet):
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(ValueError, match="SingleModel"):
        TemperatureScaled(resnet, 2.0)(x)
    torch.testing.assert_close(TemperatureScaled(SingleModel(resnet), 2.0)(x), resnet(x)[None] / 2)


def test_bad_inputs_to_fit():
    z, y = torch.randn(8, K), torch.arange(8)
    with pytest.raises(ValueError, match=r"\(N, K\).*\(M, N, K\)"):
        fit_temperature(torch.randn(8), y)
    with pytest.raises(ValueError, match=r"\(N, K\).*\(M, N, K\)"):
        fit_temperature(torch.randn(2, 2, 8, K), y)
    with pytest.raises(ValueError, match="N = 8"):
        fit_temperature(z, y[:5])
    with pytest.raises(ValueError, match=r"\[0, 9\]"):
        fit_temperature(z, y + 5)
    with pytest.raises(TypeError, match="integer"):
        fit_temperature(z, y.float())
    with pytest.raises(TypeError, match="floating"):
        fit_temperature(torch.ones(8, K, dtype=torch.long), y)
    with pytest.raises(ValueError, match="NaN"):
        fit_temperature(torch.full((8, K), math.nan), y)
    with pytest.raises(ValueError, match="mode"):
        fit_temperature(z, y, mode="vector")


def test_fit_temperature_takes_the_model_and_its_validation_loader():
    """What a user has, an ensemble and a loader: the same T as from the collected logits."""
    import snens
    from snens.evaluation.protocol import collect

    torch.manual_seed(0)
    ens = snens.convert(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)),
        num_members=2,
    )
    x = torch.randn(60, 4)
    with torch.no_grad():  # labels the ensemble gets right two times in three: a finite T
        y = snens.predictive_probs(ens.eval()(x)).argmax(-1)
    y[::3] = torch.randint(0, 3, (20,))
    loader = [(x[i : i + 20], y[i : i + 20]) for i in range(0, 60, 20)]
    logits, labels = collect(ens, loader, logits=True)
    assert snens.fit_temperature(ens, loader) == snens.fit_temperature(logits, labels)
