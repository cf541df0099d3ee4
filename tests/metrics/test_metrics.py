"""Metrics against hand-computed values, scikit-learn, loop references and known limits."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score, roc_curve
from torch.testing import assert_close

from snens.metrics import (
    LOGIT_OOD_SCORES,
    OOD_SCORES,
    accuracy,
    adaptive_ece,
    aupr,
    aurc,
    auroc,
    brier,
    classwise_ece,
    disagreement,
    ece,
    energy_score,
    expected_entropy,
    fpr_at_95_tpr,
    max_logit_score,
    member_correlation,
    mutual_information,
    nll,
    per_member,
    predictive_entropy,
)

SEEDS = [0, 1, 2, 3]


def _random_probs(*shape: int, seed: int, sharp: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (sharp * torch.randn(*shape, generator=g, dtype=torch.float64)).softmax(-1)


def _random_labels(B: int, K: int, seed: int) -> torch.Tensor:
    return torch.randint(0, K, (B,), generator=torch.Generator().manual_seed(seed + 100))


def _two_class(confidences: list[float], correct: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary probs whose top class is 0 with the given confidence; label 0 iff correct."""
    conf = torch.tensor(confidences, dtype=torch.float64)
    probs = torch.stack([conf, 1 - conf], dim=1)
    labels = torch.tensor([0 if c else 1 for c in correct])
    return probs, labels


# Four examples, K = 3; the last row ties classes 0 and 1 (argmax takes the first).
HAND_PROBS = torch.tensor(
    [[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.5, 0.5, 0.0]], dtype=torch.float64
)
HAND_LABELS = torch.tensor([0, 2, 2, 1])


# ------------------------------------------------------------------------------------------------
# Accuracy, NLL, Brier
# ------------------------------------------------------------------------------------------------


def test_accuracy_hand():
    # predictions 0, 1, 2, 0 (tie → first) against labels 0, 2, 2, 1: right, wrong, right, wrong
    assert accuracy(HAND_PROBS, HAND_LABELS) == 0.5


def test_nll_hand():
    # p_y = 0.7, 0.1, 0.4, 0.5
    expected = -(math.log(0.7) + math.log(0.1) + math.log(0.4) + math.log(0.5)) / 4
    assert nll(HAND_PROBS, HAND_LABELS) == pytest.approx(expected, abs=1e-12)


def test_brier_hand():
    # (0.3² + 0.2² + 0.1²) + (0.1² + 0.8² + 0.9²) + (0.3² + 0.3² + 0.6²) + (0.5² + 0.5² + 0²)
    # = 0.14 + 1.46 + 0.54 + 0.50 = 2.64, over 4 examples
    assert brier(HAND_PROBS, HAND_LABELS) == pytest.approx(0.66, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_nll_matches_sklearn_log_loss(seed):
    K = 5
    probs = _random_probs(200, K, seed=seed, sharp=2.0)
    labels = _random_labels(200, K, seed)
    expected = log_loss(labels.numpy(), probs.numpy(), labels=list(range(K)))
    assert nll(probs, labels) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("seed", SEEDS)
def test_accuracy_and_brier_match_numpy(seed):
    probs = _random_probs(100, 4, seed=seed)
    labels = _random_labels(100, 4, seed)
    p, y = probs.numpy(), labels.numpy()
    assert accuracy(probs, labels) == pytest.approx(np.mean(p.argmax(1) == y), abs=1e-15)
    assert brier(probs, labels) == pytest.approx(np.mean(np.sum((p - np.eye(4)[y]) ** 2, 1)))


@pytest.mark.parametrize(
    ("dtype", "expected"), [(torch.float32, 87.336544750553), (torch.float64, 708.39641853226)]
)
def test_nll_finite_when_a_probability_underflows(dtype, expected):
    # p_y = 0 is clamped at finfo(dtype).tiny: −log(2^-126) = 87.34, −log(2^-1022) = 708.40
    probs = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=dtype)
    labels = torch.tensor([0, 0])
    assert nll(probs, labels) == pytest.approx(expected / 2, rel=1e-12)
    member = per_member(probs.unsqueeze(0), labels)["nll"]
    assert torch.isfinite(member).all()
    assert member.item() == pytest.approx(expected / 2, rel=1e-12)


def test_scalar_metrics_return_floats_and_accept_numpy():
    probs = _random_probs(30, 3, seed=0)
    labels = _random_labels(30, 3, 0)
    for metric in (accuracy, nll, brier, ece, adaptive_ece, classwise_ece, aurc):
        value = metric(probs, labels)
        assert type(value) is float
        assert metric(probs.numpy(), labels.numpy()) == value
        assert metric(probs.float(), labels.int()) == pytest.approx(value, abs=1e-6)


def test_metrics_ignore_autograd():
    probs = _random_probs(10, 3, seed=0).requires_grad_()
    labels = _random_labels(10, 3, 0)
    assert math.isfinite(nll(probs, labels))
    assert not predictive_entropy(probs.unsqueeze(0)).requires_grad


# ------------------------------------------------------------------------------------------------
# Calibration
# ------------------------------------------------------------------------------------------------


def _ece_loop(conf: np.ndarray, hit: np.ndarray, num_bins: int) -> float:
    """ECE written as the textbook loop over bins (lower, upper]."""
    edges = np.linspace(0, 1, num_bins + 1)
    total = 0.0
    for lower, upper in itertools.pairwise(edges):
        in_bin = (conf > lower) & (conf <= upper)
        if lower == 0:
            in_bin |= conf == 0
        if in_bin.any():
            total += in_bin.mean() * abs(hit[in_bin].mean() - conf[in_bin].mean())
    return total


def test_ece_hand():
    # 15 bins. Confidences 0.9, 0.9 (one right) fall in (13/15, 14/15]: acc 0.5, conf 0.9;
    # 0.7 (right) in (10/15, 11/15]: acc 1, conf 0.7.
    # ECE = 2/3·|0.5 − 0.9| + 1/3·|1 − 0.7| = 0.8/3 + 0.1 = 1.1/3
    probs, labels = _two_class([0.9, 0.9, 0.7], [1, 0, 1])
    assert ece(probs, labels) == pytest.approx(1.1 / 3, abs=1e-12)


def test_ece_bins_are_closed_on_the_right():
    # 2 bins (0, 0.5], (0.5, 1]. Confidence 0.5 (right) is in the first: 1/2·|1 − 0.5| = 0.25;
    # 0.8 (wrong) in the second: 1/2·|0 − 0.8| = 0.4. Total 0.65 (0.15 if 0.5 went right).
    probs, labels = _two_class([0.5, 0.8], [1, 0])
    assert ece(probs, labels, num_bins=2) == pytest.approx(0.65, abs=1e-12)


def test_ece_zero_for_a_perfectly_calibrated_construction():
    # confidence 0.75: 3 of 4 right; 0.6: 3 of 5 right; 1.0: 2 of 2 right
    probs, labels = _two_class(
        [0.75] * 4 + [0.6] * 5 + [1.0] * 2, [1, 1, 1, 0] + [1, 0, 1, 0, 1] + [1, 1]
    )
    assert ece(probs, labels) == pytest.approx(0.0, abs=1e-12)
    assert ece(probs, labels, num_bins=1) == pytest.approx(0.0, abs=1e-12)
    # equal-mass bins align with the groups: 4 at 0.5 (2 right), 4 at 0.75 (3 right)
    probs, labels = _two_class([0.75] * 4 + [0.5] * 4, [1, 0, 1, 1, 0, 1, 1, 0])
    assert adaptive_ece(probs, labels, num_bins=2) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_bins", [1, 10, 15])
def test_ece_matches_loop_reference(seed, num_bins):
    probs = _random_probs(300, 6, seed=seed, sharp=3.0)
    labels = _random_labels(300, 6, seed)
    conf, pred = probs.max(1)
    hit = (pred == labels).double()
    expected = _ece_loop(conf.numpy(), hit.numpy(), num_bins)
    assert ece(probs, labels, num_bins=num_bins) == pytest.approx(expected, abs=1e-12)


def test_adaptive_ece_hand():
    # sorted confidences 0.6 (right), 0.7 (wrong), 0.8 (right), 0.9 (right), given shuffled.
    # 2 bins {0.6, 0.7}, {0.8, 0.9}: 1/2·|0.5 − 0.65| + 1/2·|1 − 0.85| = 0.075 + 0.075 = 0.15
    # 3 bins of sizes 2, 1, 1: 1/2·0.15 + 1/4·|1 − 0.8| + 1/4·|1 − 0.9| = 0.075 + 0.05 + 0.025
    probs, labels = _two_class([0.8, 0.6, 0.9, 0.7], [1, 1, 1, 0])
    assert adaptive_ece(probs, labels, num_bins=2) == pytest.approx(0.15, abs=1e-12)
    assert adaptive_ece(probs, labels, num_bins=3) == pytest.approx(0.15, abs=1e-12)
    # one bin per example: mean of |hit − conf| = (0.4 + 0.7 + 0.2 + 0.1) / 4
    assert adaptive_ece(probs, labels, num_bins=4) == pytest.approx(0.35, abs=1e-12)
    # more bins than examples: the extra bins are empty
    assert adaptive_ece(probs, labels, num_bins=9) == pytest.approx(0.35, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_adaptive_ece_matches_array_split_reference(seed):
    probs = _random_probs(203, 5, seed=seed, sharp=3.0)
    labels = _random_labels(203, 5, seed)
    conf, pred = (t.numpy() for t in probs.max(1))
    hit = (pred == labels.numpy()).astype(float)
    expected = sum(
        len(b) / len(conf) * abs(hit[b].mean() - conf[b].mean())
        for b in np.array_split(np.argsort(conf, kind="stable"), 15)
    )
    assert adaptive_ece(probs, labels) == pytest.approx(expected, abs=1e-12)


def test_classwise_ece_hand():
    # 2 bins [0, 0.5], (0.5, 1]. Rows [0.6, 0.3, 0.1] label 0 and [0.2, 0.2, 0.6] label 2.
    # class 0: 0.6 (is 0) in bin 1, 0.2 (not) in bin 0 → (|1 − 0.6| + |0 − 0.2|) / 2 = 0.3
    # class 1: 0.3, 0.2 (neither is 1) both in bin 0 → |0 − 0.5| / 2 = 0.25
    # class 2: 0.1 (not) in bin 0, 0.6 (is 2) in bin 1 → (0.1 + 0.4) / 2 = 0.25
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]], dtype=torch.float64)
    labels = torch.tensor([0, 2])
    assert classwise_ece(probs, labels, num_bins=2) == pytest.approx(0.8 / 3, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_classwise_ece_matches_loop_reference(seed):
    K = 4
    probs = _random_probs(150, K, seed=seed, sharp=2.0)
    labels = _random_labels(150, K, seed)
    p, y = probs.numpy(), labels.numpy()
    expected = np.mean([_ece_loop(p[:, k], (y == k).astype(float), 15) for k in range(K)])
    assert classwise_ece(probs, labels) == pytest.approx(expected, abs=1e-12)


# ------------------------------------------------------------------------------------------------
# Selective prediction
# ------------------------------------------------------------------------------------------------


def _aurc_sorted(errors: list[float]) -> float:
    """Mean over i of the error rate of the first i examples, in the given order."""
    return float(np.mean(np.cumsum(errors) / np.arange(1, len(errors) + 1)))


def test_aurc_hand():
    # by confidence 0.9, 0.8, 0.7, 0.6 the errors are 0, 1, 0, 1:
    # risks 0/1, 1/2, 1/3, 2/4 → AURC = (0 + 0.5 + 1/3 + 0.5) / 4 = 1/3
    probs, labels = _two_class([0.7, 0.9, 0.6, 0.8], [1, 1, 0, 0])
    assert aurc(probs, labels) == pytest.approx(1 / 3, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_aurc_matches_loop_without_ties(seed):
    probs = _random_probs(100, 4, seed=seed, sharp=2.0)
    labels = _random_labels(100, 4, seed)
    conf, pred = probs.max(1)
    errors = (pred != labels).double()[conf.argsort(descending=True)]
    assert aurc(probs, labels) == pytest.approx(_aurc_sorted(errors.tolist()), abs=1e-12)


def test_aurc_ties_are_the_mean_over_their_orders():
    # 6 examples, tie groups at 0.8 and 0.6: average the plain AURC over all 720 input orders
    conf = [0.8, 0.6, 0.8, 0.6, 0.8, 0.9]
    correct = [1, 0, 0, 1, 0, 1]
    per_order = []
    for order in itertools.permutations(range(6)):
        ranked = sorted(order, key=lambda i: -conf[i])  # stable: ties keep the permuted order
        per_order.append(_aurc_sorted([1.0 - correct[i] for i in ranked]))
    probs, labels = _two_class(conf, correct)
    assert aurc(probs, labels) == pytest.approx(np.mean(per_order), abs=1e-12)


# ------------------------------------------------------------------------------------------------
# OOD detection
# ------------------------------------------------------------------------------------------------


def _sklearn_ood(in_scores, out_scores) -> tuple[float, float, float]:
    y = np.r_[np.zeros(len(in_scores)), np.ones(len(out_scores))]
    s = np.r_[np.asarray(in_scores), np.asarray(out_scores)]
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    fpr95 = fpr[np.argmax(tpr >= 0.95)]
    return roc_auc_score(y, s), average_precision_score(y, s), fpr95


def test_auroc_hand():
    # out 0.8 beats in 0.1, 0.4, 0.35: 3; out 0.4 beats 0.1 and 0.35, ties 0.4: 2.5
    # AUROC = 5.5 / (3·2)
    assert auroc(torch.tensor([0.1, 0.4, 0.35]), torch.tensor([0.8, 0.4])) == pytest.approx(
        5.5 / 6, abs=1e-15
    )


def test_aupr_hand():
    # thresholds 0.8: TP 1, FP 0 → P 1, R 1/2; 0.4: TP 2, FP 1 → P 2/3, R 1;
    # AP = 1/2·1 + 1/2·2/3 = 5/6
    assert aupr(torch.tensor([0.1, 0.4, 0.35]), torch.tensor([0.8, 0.4])) == pytest.approx(
        5 / 6, abs=1e-15
    )


def test_fpr_at_95_tpr_hand():
    # OOD scores 1..20; 95% TPR flags 19 of 20, threshold 2; in-distribution 2.5 and 30 are
    # above it, 1.5 is not: FPR = 2/3
    out_scores = torch.arange(1, 21, dtype=torch.float64)
    assert fpr_at_95_tpr(torch.tensor([1.5, 2.5, 30.0]), out_scores) == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("n_in", "n_out", "levels"), [(200, 150, None), (97, 41, 6), (5, 1, 3)])
def test_ood_metrics_match_sklearn(seed, n_in, n_out, levels):
    g = torch.Generator().manual_seed(seed)
    s_in = torch.randn(n_in, generator=g, dtype=torch.float64)
    s_out = torch.randn(n_out, generator=g, dtype=torch.float64) + 0.7
    if levels is not None:  # few distinct values: many ties, within and across the two sets
        s_in, s_out = ((s * levels / 3).round() for s in (s_in, s_out))
    expected_auroc, expected_aupr, expected_fpr = _sklearn_ood(s_in.numpy(), s_out.numpy())
    assert auroc(s_in, s_out) == pytest.approx(expected_auroc, abs=1e-12)
    assert aupr(s_in, s_out) == pytest.approx(expected_aupr, abs=1e-12)
    assert fpr_at_95_tpr(s_in, s_out) == pytest.approx(expected_fpr, abs=1e-12)


def test_ood_limits():
    s_in, s_out = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 0.9])
    assert auroc(s_in, s_out) == 1.0
    assert aupr(s_in, s_out) == 1.0
    assert fpr_at_95_tpr(s_in, s_out) == 0.0
    assert auroc(s_out, s_in) == 0.0  # the direction matters: higher = more likely OOD
    assert fpr_at_95_tpr(s_out, s_in) == 1.0
    constant_in, constant_out = torch.zeros(3), torch.zeros(2)
    assert auroc(constant_in, constant_out) == 0.5
    assert aupr(constant_in, constant_out) == pytest.approx(2 / 5)
    assert fpr_at_95_tpr(constant_in, constant_out) == 1.0


def test_ood_metrics_accept_numpy_and_integers():
    s_in, s_out = np.array([0, 1, 2]), np.array([2, 3])
    assert auroc(s_in, s_out) == pytest.approx(_sklearn_ood(s_in, s_out)[0])


# ------------------------------------------------------------------------------------------------
# Ensemble metrics
# ------------------------------------------------------------------------------------------------


def _members_predicting(*classes: int, K: int = 4) -> torch.Tensor:
    """(M, 1, K) one-hot-ish member probabilities with the given argmax classes."""
    probs = torch.full((len(classes), 1, K), 0.1 / (K - 1), dtype=torch.float64)
    for m, k in enumerate(classes):
        probs[m, 0, k] = 0.9
    return probs


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        ((0, 0, 1), 2 / 3),  # pairs (0,1) agree, (0,2) and (1,2) disagree
        ((0, 1, 2, 3), 1.0),
        ((0, 0, 1, 1), 4 / 6),  # 2 of 6 pairs agree
        ((2, 2, 2), 0.0),
        ((3,), 0.0),  # one member: no pairs
    ],
)
def test_disagreement_hand(classes, expected):
    assert disagreement(_members_predicting(*classes)).item() == pytest.approx(expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_disagreement_matches_pair_loop(seed):
    probs = _random_probs(5, 40, 3, seed=seed)
    pred = probs.argmax(-1)
    pairs = list(itertools.combinations(range(5), 2))
    expected = torch.stack([(pred[a] != pred[b]).double() for a, b in pairs]).mean(0)
    assert_close(disagreement(probs), expected, rtol=0, atol=1e-15)


def test_entropies_hand():
    ln2 = math.log(2)
    # two confident members that disagree: total log 2, aleatoric 0, epistemic log 2
    split = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)
    # two members both at 50/50: total log 2, aleatoric log 2, epistemic 0
    unsure = torch.full((2, 1, 2), 0.5, dtype=torch.float64)
    for probs, (total, aleatoric, epistemic) in [(split, (ln2, 0, ln2)), (unsure, (ln2, ln2, 0))]:
        assert predictive_entropy(probs).item() == pytest.approx(total, abs=1e-15)
        assert expected_entropy(probs).item() == pytest.approx(aleatoric, abs=1e-15)
        assert mutual_information(probs).item() == pytest.approx(epistemic, abs=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
def test_mutual_information_is_mean_kl_to_the_mean(seed):
    # I = H[p̄] − E_m H[p_m] = (1/M) Σ_m KL(p_m ‖ p̄), an independent way to compute it
    probs = _random_probs(4, 50, 6, seed=seed, sharp=2.0)
    mean = probs.mean(0)
    kl = (probs * (probs.log() - mean.log())).sum(-1).mean(0)
    assert_close(mutual_information(probs), kl, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_total_is_aleatoric_plus_epistemic(seed):
    probs = _random_probs(3, 64, 10, seed=seed, sharp=3.0).float()
    total, aleatoric = predictive_entropy(probs), expected_entropy(probs)
    epistemic = mutual_information(probs)
    assert total.dtype == torch.float64 and total.shape == (64,)
    assert_close(total, aleatoric + epistemic, rtol=0, atol=1e-6)
    assert (epistemic >= 0).all()
    assert (total <= math.log(10) + 1e-12).all()
    assert (epistemic <= math.log(3) + 1e-12).all()


def test_identical_members_have_no_epistemic_uncertainty():
    single = _random_probs(1, 20, 5, seed=0, sharp=2.0).float()
    probs = single.expand(4, 20, 5)
    assert_close(
        mutual_information(probs), torch.zeros(20, dtype=torch.float64), atol=1e-12, rtol=0
    )
    assert_close(disagreement(probs), torch.zeros(20, dtype=torch.float64), atol=0, rtol=0)
    assert member_correlation(probs) == pytest.approx(1.0, abs=1e-12)
    assert_close(predictive_entropy(probs), expected_entropy(probs), atol=1e-12, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_member_correlation_matches_numpy(seed):
    probs = _random_probs(4, 30, 3, seed=seed)
    corr = np.corrcoef(probs.reshape(4, -1).numpy())
    expected = corr[np.triu_indices(4, k=1)].mean()
    assert member_correlation(probs) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_per_member_matches_single_model_metrics(seed):
    probs = _random_probs(3, 60, 4, seed=seed, sharp=2.0)
    labels = _random_labels(60, 4, seed)
    result = per_member(probs, labels)
    assert set(result) == {"accuracy", "nll"}
    for m in range(3):
        assert result["accuracy"][m].item() == accuracy(probs[m], labels)
        expected_nll = log_loss(labels.numpy(), probs[m].numpy(), labels=list(range(4)))
        assert result["nll"][m].item() == pytest.approx(expected_nll, rel=1e-10)


def test_ood_scores():
    probs = torch.tensor(
        [[[0.7, 0.2, 0.1], [0.2, 0.2, 0.6]], [[0.5, 0.4, 0.1], [0.2, 0.2, 0.6]]],
        dtype=torch.float64,
    )
    assert set(OOD_SCORES) == {"msp", "entropy", "mutual_information"}
    # mean probs [0.6, 0.3, 0.1] and [0.2, 0.2, 0.6]: 1 − max = 0.4, 0.4
    assert_close(OOD_SCORES["msp"](probs), torch.tensor([0.4, 0.4], dtype=torch.float64))
    assert_close(OOD_SCORES["entropy"](probs), predictive_entropy(probs))
    assert_close(OOD_SCORES["mutual_information"](probs), mutual_information(probs))
    # the second example's members agree: no epistemic uncertainty
    assert OOD_SCORES["mutual_information"](probs)[1].item() == pytest.approx(0, abs=1e-15)


# Member logits (M=2, B=2, K=3); their mean over members is [2, 2, 2] and [1, 0, −1].
LOGITS = torch.tensor(
    [[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], [[3.0, 2.0, 1.0], [2.0, 0.0, -2.0]]],
    dtype=torch.float64,
)


def test_logit_ood_scores_hand():
    assert LOGIT_OOD_SCORES == {"max_logit": max_logit_score, "energy": energy_score}
    # −max of the mean logit: −2 and −1 (the members' own maxima, 3 and 2, are not used)
    assert_close(max_logit_score(LOGITS), torch.tensor([-2.0, -1.0], dtype=torch.float64))
    # −log(3 e²) = −(2 + log 3) = −3.0986…; −log(e + 1 + 1/e) = −1.4076…
    expected = [-(2 + math.log(3)), -math.log(math.e + 1 + 1 / math.e)]
    assert_close(energy_score(LOGITS), torch.tensor(expected, dtype=torch.float64))
    assert energy_score(LOGITS).tolist() == pytest.approx([-3.0986123, -1.4076060], abs=1e-7)


def test_logit_ood_scores_follow_torch_uncertainty():
    """torch-uncertainty's MaxLogitCriterion and EnergyCriterion, on its (B, M, K) layout:
    −inputs.mean(dim=1).max(dim=-1).values and −inputs.mean(dim=1).logsumexp(dim=-1)."""
    z = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    theirs = z.transpose(0, 1)  # (B, M, K)
    assert_close(max_logit_score(z), -theirs.mean(dim=1).max(dim=-1).values, rtol=0, atol=0)
    assert_close(energy_score(z), -theirs.mean(dim=1).logsumexp(dim=-1), rtol=0, atol=1e-15)


def test_logit_ood_scores_of_one_member_and_their_invariants():
    g = torch.Generator().manual_seed(1)
    z = 3 * torch.randn(1, 50, 10, generator=g, dtype=torch.float64)
    # M = 1: the plain max logit and energy (Liu et al., 2020) of the one model
    assert_close(max_logit_score(z), -z[0].amax(-1), rtol=0, atol=0)
    assert_close(energy_score(z), -torch.logsumexp(z[0], -1), rtol=0, atol=0)
    # a shift c of every logit moves both by −c: the scores read the logits' level
    assert_close(energy_score(z + 2.0), energy_score(z) - 2.0)
    assert_close(max_logit_score(z + 2.0), max_logit_score(z) - 2.0)
    # the energy of the mean logit is >= the mean of the members' energies (logsumexp convex)
    members = 3 * torch.randn(4, 50, 10, generator=g, dtype=torch.float64)
    member_energies = torch.stack([energy_score(m.unsqueeze(0)) for m in members])
    assert (energy_score(members) >= member_energies.mean(0) - 1e-12).all()
    # float32 and NumPy input: computed in float64
    assert energy_score(z.float().numpy()).dtype == torch.float64


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------

GOOD_PROBS = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
GOOD_LABELS = torch.tensor([0, 1])


@pytest.mark.parametrize(
    ("probs", "labels", "error", "match"),
    [
        (torch.ones(2, 2, 2) / 2, GOOD_LABELS, ValueError, r"2-D \(B, K\).*predictive_probs"),
        (torch.tensor([0.5, 0.5]), GOOD_LABELS, ValueError, r"2-D \(B, K\), got shape \(2,\)"),
        (torch.empty(0, 3), torch.empty(0, dtype=torch.long), ValueError, "empty"),
        (torch.tensor([[2.0, 1.0], [0.3, 0.7]]), GOOD_LABELS, ValueError, r"sum to 1.*softmax"),
        (torch.tensor([[1.5, -0.5], [0.3, 0.7]]), GOOD_LABELS, ValueError, "negative"),
        (torch.tensor([[float("nan"), 1.0]]), GOOD_LABELS[:1], ValueError, "NaN"),
        (torch.tensor([[1, 0], [0, 1]]), GOOD_LABELS, TypeError, "floating-point"),
        ([[0.5, 0.5]], GOOD_LABELS[:1], TypeError, "torch.Tensor or numpy.ndarray"),
        (GOOD_PROBS, torch.tensor([0, 1, 1]), ValueError, "3 entries.*B = 2"),
        (GOOD_PROBS, torch.tensor([[0, 1]]), ValueError, r"1-D class indices \(B,\)"),
        (GOOD_PROBS, torch.tensor([0, 2]), ValueError, r"\[0, 1\] for K = 2 classes, got \[2\]"),
        (GOOD_PROBS, torch.tensor([-1, 0]), ValueError, r"got \[-1\]"),
        (GOOD_PROBS, torch.tensor([0.0, 1.0]), TypeError, "integer class indices"),
    ],
)
@pytest.mark.parametrize("metric", [accuracy, nll, brier, ece, adaptive_ece, classwise_ece, aurc])
def test_bad_probs_and_labels(metric, probs, labels, error, match):
    with pytest.raises(error, match=match):
        metric(probs, labels)


@pytest.mark.parametrize(
    ("num_bins", "error"), [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)]
)
@pytest.mark.parametrize("metric", [ece, adaptive_ece, classwise_ece])
def test_bad_num_bins(metric, num_bins, error):
    with pytest.raises(error, match="num_bins"):
        metric(GOOD_PROBS, GOOD_LABELS, num_bins=num_bins)


@pytest.mark.parametrize(
    ("in_scores", "out_scores", "match"),
    [
        (torch.rand(5), torch.empty(0), "out_scores is empty"),
        (torch.empty(0), torch.rand(5), "in_scores is empty"),
        (torch.rand(5, 1), torch.rand(5), r"1-D per-example scores \(N,\), got \(5, 1\)"),
        (torch.rand(5), torch.tensor([0.1, float("nan")]), "NaN"),
    ],
)
@pytest.mark.parametrize("metric", [auroc, aupr, fpr_at_95_tpr])
def test_bad_ood_scores(metric, in_scores, out_scores, match):
    with pytest.raises(ValueError, match=match):
        metric(in_scores, out_scores)


@pytest.mark.parametrize(
    "metric",
    [disagreement, predictive_entropy, expected_entropy, mutual_information, member_correlation]
    + list(OOD_SCORES.values()),
)
def test_bad_member_probs(metric):
    with pytest.raises(ValueError, match=r"3-D \(M, B, K\).*unsqueeze\(0\)"):
        metric(GOOD_PROBS)
    with pytest.raises(ValueError, match="sum to 1"):
        metric(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="empty"):
        metric(torch.empty(2, 0, 4))


@pytest.mark.parametrize("score", [max_logit_score, energy_score])
def test_bad_member_logits(score):
    with pytest.raises(ValueError, match=r"3-D \(M, B, K\).*unsqueeze\(0\)"):
        score(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="empty"):
        score(torch.empty(2, 0, 4))
    with pytest.raises(ValueError, match="NaN or inf.*not log-probabilities"):
        score(torch.tensor([[[0.0, -math.inf]]]))
    with pytest.raises(TypeError, match="floating-point logits"):
        score(torch.zeros(1, 2, 3, dtype=torch.long))


def test_per_member_checks_labels():
    with pytest.raises(ValueError, match="3 entries"):
        per_member(GOOD_PROBS.expand(2, 2, 2), torch.tensor([0, 1, 1]))


def test_member_correlation_needs_two_varying_members():
    with pytest.raises(ValueError, match="at least 2 members"):
        member_correlation(GOOD_PROBS.unsqueeze(0))
    uniform = torch.full((1, 3, 2), 0.5)
    varying = _random_probs(1, 3, 2, seed=0).float()
    with pytest.raises(ValueError, match=r"members \[1\].*undefined"):
        member_correlation(torch.cat([varying, uniform]))


def test_a_subnormal_float16_probability_is_kept_only_zero_is_clamped():
    """float16's p_y = 1e-5 is subnormal but valid: clamping every p_y below finfo.tiny (6.1e-5)
    gave NLL 5.1986 where log_loss gives 6.1024."""
    p16 = torch.tensor([[1 - 1e-5, 1e-5], [0.5, 0.5]], dtype=torch.float16)
    y = torch.tensor([1, 0])
    expected = log_loss(y.numpy(), p16.double().numpy(), labels=[0, 1])
    assert nll(p16, y) == pytest.approx(expected, rel=1e-12)
    assert per_member(p16.unsqueeze(0), y)["nll"].item() == pytest.approx(expected, rel=1e-6)
    zero = torch.tensor([[1.0, 0.0]], dtype=torch.float16)  # a 0 still costs −log(tiny)
    assert nll(zero, torch.tensor([1])) == pytest.approx(-math.log(torch.finfo(torch.float16).tiny))


def test_rounded_rows_of_any_length_pass_rows_off_by_half_their_mass_do_not():
    """The row-sum tolerance grew with sqrt(K) (1.4 at K = 32,000 in bfloat16), so rows summing
    to 0.5 were scored; a rounded softmax row is within eps/2 of 1 at any length."""
    z = torch.randn(2, 32000, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([31999, 31998])
    rounded = z.softmax(-1).bfloat16()
    assert math.isfinite(nll(rounded, labels))
    halved = z.softmax(-1)
    halved[:, :16000] = 0
    with pytest.raises(ValueError, match="rows must sum to 1"):
        nll(halved.bfloat16(), labels)


def test_a_confidence_on_a_bin_edge_falls_in_the_bin_closed_on_its_right():
    """Bins are (b/n, (b+1)/n]: linspace's 11/20 is 0.5499999999999999, so a confidence of
    0.55 fell in (0.55, 0.60] while 0.65 and 0.75 stayed in the bins they close."""
    for edge in (0.55, 0.65, 0.75):  # a right answer at the edge, a wrong one just above it
        probs = torch.tensor([[edge, 1 - edge], [edge + 0.01, 0.99 - edge]], dtype=torch.float64)
        apart = (abs(1 - edge) + abs(0 - (edge + 0.01))) / 2  # each alone in its bin
        assert ece(probs, torch.tensor([0, 1]), num_bins=20) == pytest.approx(apart), edge
