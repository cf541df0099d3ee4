"""Post-hoc calibrators behind fit_calibrator: each lowers the NLL of a miscalibrated ensemble,
is about the identity on a calibrated one, matches hand-computed optima on small cases, and
acts on an ensemble as documented."""

import dataclasses
import math

import pytest
import torch
from torch.testing import assert_close

from snens import metrics
from snens.evaluation.calibration import (
    CALIBRATORS,
    HistogramBinning,
    MatrixScaling,
    TemperatureScaling,
    VectorScaling,
    fit_calibrator,
    fit_temperature,
)

N, K, M = 4000, 10, 4


def _probs(logits: torch.Tensor) -> torch.Tensor:
    """The mean of softmaxes in float64 (snens.predictive_probs computes in float32)."""
    return logits.softmax(-1).mean(0)


def _nll(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return metrics.nll(_probs(logits), labels)


@pytest.fixture(scope="module")
def calibrated():
    """Member logits (M, N, K) whose mean of softmaxes is calibrated: labels ~ that mean."""
    g = torch.Generator().manual_seed(0)
    shared = 1.5 * torch.randn(N, K, generator=g, dtype=torch.float64)
    members = shared + 0.7 * torch.randn(M, N, K, generator=g, dtype=torch.float64)
    labels = torch.multinomial(members.softmax(-1).mean(0), 1, generator=g).squeeze(1)
    return members, labels


MISCALIBRATIONS = {
    "overconfident": lambda z: 3 * z,
    "underconfident": lambda z: z / 2,
    "class_biased": lambda z: 2 * z + torch.linspace(-2, 2, K, dtype=torch.float64),
}


@pytest.mark.parametrize("method", list(CALIBRATORS))
@pytest.mark.parametrize("miscalibration", list(MISCALIBRATIONS))
def test_each_calibrator_lowers_the_nll_of_a_miscalibrated_ensemble(
    calibrated, method, miscalibration
):
    """Fitted on the first half: lower NLL on it (validation) and on the held-out second half."""
    members, labels = calibrated
    z = MISCALIBRATIONS[miscalibration](members)
    val, test = slice(0, N // 2), slice(N // 2, None)
    calibrator = fit_calibrator(method, z[:, val], labels[val])
    for part in (val, test):
        before, after = (
            _nll(z[:, part], labels[part]),
            _nll(calibrator.apply(z[:, part]), labels[part]),
        )
        assert after < before - 0.02, (part, before, after)


def test_parametric_calibrators_are_about_the_identity_when_calibrated(calibrated):
    members, labels = calibrated
    assert fit_calibrator("temperature", members, labels).temperature == pytest.approx(1, abs=0.05)
    vector = fit_calibrator("vector", members, labels)
    # sampling noise of 4000 labels: fitted weights within ±0.17 of 1 (measured)
    assert_close(vector.weight, torch.ones(K, dtype=torch.float64), rtol=0, atol=0.25)
    assert_close(vector.bias, torch.zeros(K, dtype=torch.float64), rtol=0, atol=0.25)
    matrix = fit_calibrator("matrix", members, labels)
    assert_close(matrix.weight, torch.eye(K, dtype=torch.float64), rtol=0, atol=0.25)
    assert_close(matrix.bias, torch.zeros(K, dtype=torch.float64), rtol=0, atol=0.25)
    # the fitted maps barely move the prediction (matrix scaling fits 110 parameters on 4000
    # labels: mean largest move 0.045, vector scaling 0.015 measured), and lower the NLL of
    # calibrated data only by overfitting: fitting p free parameters at the truth gains
    # χ²_p / (2N) in expectation, p / (2N); p / N is far in the tail
    raw = _probs(members)
    for calibrator, noise, p in ((vector, 0.03, 2 * K - 1), (matrix, 0.06, K * K + K - 1)):
        moved = _probs(calibrator.apply(members))
        assert (moved - raw).abs().max(-1).values.mean() < noise
        before, after = _nll(members, labels), _nll(calibrator.apply(members), labels)
        assert before - p / N < after <= before


def test_histogram_binning_is_about_the_identity_when_calibrated(calibrated):
    """Binning coarsens p̄ into 15 bins per class: close to it, its NLL within 0.01."""
    members, labels = calibrated
    binned = fit_calibrator("histogram", members, labels).apply(members)
    moved = _probs(binned) - _probs(members)
    assert moved.abs().max(-1).values.mean() < 0.06
    assert _nll(binned, labels) == pytest.approx(_nll(members, labels), abs=0.01)


# ------------------------------------------------------------------------------------------------
# Hand-checked small cases
# ------------------------------------------------------------------------------------------------

# Two classes, one model, logits (0, a): in the group a = 0 one label in four is class 1, in the
# group a = 1 three in four. Scaling class 1's logit and shifting it is logistic regression on a,
# whose maximum likelihood reproduces each group's frequency: p(1 | a=0) = 1/4, p(1 | a=1) = 3/4,
# i.e. b_1 − b_0 = logit(1/4) = −log 3 and w_1 = logit(3/4) − logit(1/4) = 2 log 3.
GROUPS_A = torch.tensor([0.0] * 4 + [1.0] * 4, dtype=torch.float64)
GROUPS_LOGITS = torch.stack([torch.zeros(8, dtype=torch.float64), GROUPS_A], dim=-1)
GROUPS_LABELS = torch.tensor([1, 0, 0, 0, 1, 1, 1, 0])
GROUPS_PROBS = torch.tensor([[0.75, 0.25]] * 4 + [[0.25, 0.75]] * 4, dtype=torch.float64)


def test_vector_scaling_hand():
    vector = fit_calibrator("vector", GROUPS_LOGITS, GROUPS_LABELS)
    assert vector.weight[1].item() == pytest.approx(2 * math.log(3), abs=1e-5)
    assert (vector.bias[1] - vector.bias[0]).item() == pytest.approx(-math.log(3), abs=1e-5)
    assert vector.weight[0].item() == 1.0  # multiplies a logit that is always 0: no gradient
    probs = _probs(vector.apply(GROUPS_LOGITS))
    assert_close(probs, GROUPS_PROBS, rtol=0, atol=1e-6)


def test_matrix_scaling_hand():
    """Unregularized it reaches the same optimum; a huge λ keeps W diagonal."""
    free = fit_calibrator("matrix", GROUPS_LOGITS, GROUPS_LABELS, off_diagonal=0.0)
    assert_close(_probs(free.apply(GROUPS_LOGITS)), GROUPS_PROBS, atol=1e-6, rtol=0)
    assert free.off_diagonal == 0.0
    held = fit_calibrator("matrix", 3 * GROUPS_LOGITS, GROUPS_LABELS, off_diagonal=1e6)
    off = held.weight - torch.diag(torch.diag(held.weight))
    assert off.abs().max().item() < 1e-4
    assert held.weight[1, 1].item() == pytest.approx(2 * math.log(3) / 3, abs=1e-3)


def test_histogram_binning_hand():
    """Two bins per class, Laplace's rule: θ = (positives + 1) / (count + 2)."""
    p1 = torch.tensor([0.1, 0.2, 0.7, 0.9], dtype=torch.float64)
    logits = torch.stack([1 - p1, p1], dim=-1).log()
    binning = fit_calibrator("histogram", logits, torch.tensor([0, 1, 1, 1]), num_bins=2)
    # class 1: edge 0.7 (rank 2 of 0.1, 0.2, 0.7, 0.9); bins {0.1, 0.2}: 1 positive of 2 ->
    # 2/4, {0.7, 0.9}: 2 of 2 -> 3/4. Class 0: p = 0.9, 0.8, 0.3, 0.1, edge 0.8; bins
    # {0.3, 0.1}: 0 of 2 -> 1/4, {0.9, 0.8}: 1 of 2 -> 2/4
    assert_close(binning.edges, torch.tensor([[0.8], [0.7]], dtype=torch.float64))
    assert_close(binning.values, torch.tensor([[0.25, 0.5], [0.5, 0.75]], dtype=torch.float64))
    # test p = (0.5, 0.5): class 0 in bin 0 (1/4), class 1 in bin 0 (2/4) -> (1/3, 2/3)
    out = binning.apply(torch.tensor([[0.5, 0.5]], dtype=torch.float64).log())
    assert out.shape == (1, 1, 2)
    assert_close(out.exp()[0], torch.tensor([[1 / 3, 2 / 3]], dtype=torch.float64))
    # the validation rows: (2/4, 2/4), (2/4, 2/4), (1/4, 3/4), (1/4, 3/4) normalized
    expected = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.25, 0.75], [0.25, 0.75]])
    assert_close(binning.apply(logits).exp()[0], expected.double())


def test_temperature_is_fit_temperature(calibrated):
    members, labels = calibrated
    z = 3 * members
    scaling = fit_calibrator("temperature", z, labels)
    assert isinstance(scaling, TemperatureScaling)
    assert scaling.temperature == fit_temperature(z, labels)
    assert_close(scaling.apply(z), z / scaling.temperature, rtol=0, atol=0)
    logit_mode = fit_calibrator("temperature", z, labels, mode="logits")
    assert logit_mode.temperature == fit_temperature(z, labels, mode="logits")
    assert_close(logit_mode.apply(z), z.mean(0, keepdim=True) / logit_mode.temperature)


# ------------------------------------------------------------------------------------------------
# How they act on an ensemble, and the interface
# ------------------------------------------------------------------------------------------------


def test_parametric_maps_act_on_each_member_alike(calibrated):
    members, labels = calibrated
    for method in ("vector", "matrix"):
        calibrator = fit_calibrator(method, 2 * members, labels)
        out = calibrator.apply(members)
        assert out.shape == members.shape
        for m in range(M):
            assert_close(out[m], calibrator.apply(members[m])[0], rtol=0, atol=0)


def test_apply_keeps_the_dtype_and_the_fit_is_deterministic(calibrated):
    members, labels = calibrated
    z = 2 * members[:, :500]
    for method in CALIBRATORS:
        first, again = (fit_calibrator(method, z, labels[:500]) for _ in range(2))
        out = first.apply(z.float())
        assert out.dtype == torch.float32 and out.shape[1:] == z.shape[1:]
        assert torch.equal(first.apply(z), again.apply(z))
        assert isinstance(first, CALIBRATORS[method])


def test_calibrators_are_frozen():
    vector = VectorScaling(torch.ones(3), torch.zeros(3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        vector.weight = torch.zeros(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        TemperatureScaling(2.0).temperature = 1.0


def test_bad_calls():
    z, y = torch.randn(2, 30, 4), torch.randint(0, 4, (30,))
    with pytest.raises(ValueError, match="unknown calibrator 'platt'.*'temperature', 'vector'"):
        fit_calibrator("platt", z, y)
    with pytest.raises(TypeError, match="num_bins"):
        fit_calibrator("vector", z, y, num_bins=10)
    with pytest.raises(ValueError, match=r"num_bins must be in 1..N = 30"):
        fit_calibrator("histogram", z, y, num_bins=31)
    with pytest.raises(ValueError, match="off_diagonal must be finite and >= 0"):
        fit_calibrator("matrix", z, y, off_diagonal=-1.0)
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
        TemperatureScaling(0.0)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\]"):
        fit_calibrator("vector", z, y + 4)
    for calibrator in (
        fit_calibrator("vector", z, y),
        MatrixScaling(torch.eye(4), torch.zeros(4), 0.0),
        fit_calibrator("histogram", z, y, num_bins=3),
    ):
        with pytest.raises(ValueError, match="fitted on K = 4 classes"):
            calibrator.apply(torch.randn(2, 5, 3))
    assert isinstance(fit_calibrator("histogram", z, y, num_bins=3), HistogramBinning)


def _sharp(n=2000, seed=0):
    """Logits whose labels are drawn from softmax(z / 0.2): temperature scaling fits T ≈ 0.2."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 4, generator=g, dtype=torch.float64)
    y = torch.multinomial((z / 0.2).softmax(-1), 1, generator=g).squeeze(-1)
    return z, y


def test_a_label_of_probability_0_leaves_the_temperature_to_the_others():
    """One validation label with a logit of −inf had sent fit_temperature to its bound (T =
    0.01 instead of 0.20): its NLL is infinite at every T, so every T tied; the warning said
    every example was right with a margin."""
    z, y = _sharp()
    expected = fit_temperature(z, y)
    assert 0.18 < expected < 0.22
    ruled_out = torch.cat([z, torch.tensor([[0.0, -math.inf, 1.0, 2.0]], dtype=torch.float64)])
    labels = torch.cat([y, torch.tensor([1])])
    with pytest.warns(RuntimeWarning) as caught:
        got = fit_temperature(ruled_out, labels)
    assert got == expected
    assert str(caught[0].message).startswith(
        "1 of the 2001 labels given to temperature scaling have probability 0 under the model "
        "(a logit of −inf): their NLL is infinite whatever the calibration, so it was fitted on "
        "the other 2000"
    )
    with pytest.raises(ValueError, match="every one of the 1 labels has probability 0"):
        fit_temperature(ruled_out[-1:], labels[-1:])


def test_vector_scaling_keeps_a_logit_of_minus_inf_and_fits_finite_weights():
    """Log-probabilities with −inf entries (which the docs invite) had given NaN weights."""
    z, y = _sharp()
    log_p = z.log_softmax(-1)
    log_p[::7, 3] = -math.inf  # probability 0 for class 3 of every 7th example
    y = torch.where((torch.arange(len(y)) % 7 == 0) & (y == 3), 0, y)  # labels stay possible
    fit = VectorScaling.fit(log_p, y)
    assert torch.isfinite(fit.weight).all() and torch.isfinite(fit.bias).all()
    mapped = fit.apply(log_p)
    assert (mapped[0, ::7, 3] == -math.inf).all() and torch.isfinite(mapped[0, 1::7]).all()
    before = metrics.nll(log_p.softmax(-1), y)
    assert metrics.nll(mapped[0].softmax(-1), y) < before  # w ≈ 1/0.2 sharpens, as T does
    with pytest.raises(ValueError, match="matrix scaling mixes the classes' logits, so a logit"):
        MatrixScaling.fit(log_p, y)
    finite = MatrixScaling.fit(log_p.clamp(min=-1e4), y)
    with pytest.raises(ValueError, match="matrix scaling mixes the classes' logits"):
        finite.apply(log_p)


def test_matrix_scaling_names_an_off_diagonal_that_is_not_a_number():
    """off_diagonal="x" had raised float()'s "could not convert string to float"."""
    z, y = _sharp(100)
    with pytest.raises(TypeError, match="off_diagonal must be a number >= 0, got 'x'"):
        MatrixScaling.fit(z, y, off_diagonal="x")
