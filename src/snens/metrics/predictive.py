"""Metrics of the predictive distribution: accuracy, proper scores, calibration, AURC."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from snens.metrics._inputs import _check_labels, _check_num_bins, _check_probs

__all__ = ["accuracy", "adaptive_ece", "aurc", "brier", "classwise_ece", "ece", "nll"]


def accuracy(probs: Any, labels: Any) -> float:
    """Fraction of examples whose argmax class is the label, (1/B) Σ_i 1[argmax_k p_ik = y_i].

    Args:
        probs: predictive probabilities, (B, K).
        labels: class indices, (B,).

    Returns:
        A float in [0, 1].

    Raises:
        TypeError: if ``probs`` is not floating point or ``labels`` not integer.
        ValueError: if the shapes do not match, ``probs`` is empty or its rows do not sum to 1,
            or a label is out of range.
    """
    p, _ = _check_probs(probs, 2, "probs")
    y = _check_labels(labels, p)
    return (p.argmax(-1) == y).double().mean().item()


def _log_true_class(p: Tensor, y: Tensor, dtype: torch.dtype) -> Tensor:
    """log p_y, with p_y clamped at the smallest normal number of the input ``dtype``."""
    p_true = p.gather(-1, y.expand(p.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    return p_true.clamp_min(torch.finfo(dtype).tiny).log()


def nll(probs: Any, labels: Any) -> float:
    """Negative log-likelihood of the labels, −(1/B) Σ_i log p_{i, y_i}, in nats.

    A probability that underflowed to 0 is clamped at the smallest normal number of the input's
    dtype (``torch.finfo(dtype).tiny``), so the NLL stays finite.

    Args:
        probs: predictive probabilities, (B, K).
        labels: class indices, (B,).

    Returns:
        A float >= 0.

    Raises:
        TypeError: if ``probs`` is not floating point or ``labels`` not integer.
        ValueError: if the shapes do not match, ``probs`` is empty or its rows do not sum to 1,
            or a label is out of range.
    """
    p, dtype = _check_probs(probs, 2, "probs")
    y = _check_labels(labels, p)
    return -_log_true_class(p, y, dtype).mean().item()


def brier(probs: Any, labels: Any) -> float:
    """Brier score, the mean over examples of the squared error to the one-hot label.

        Brier = (1/B) Σ_i Σ_k (p_ik − 1[y_i = k])²

    Summed over classes, not averaged, so it lies in [0, 2].

    Args:
        probs: predictive probabilities, (B, K).
        labels: class indices, (B,).

    Returns:
        A float in [0, 2].

    Raises:
        TypeError: if ``probs`` is not floating point or ``labels`` not integer.
        ValueError: if the shapes do not match, ``probs`` is empty or its rows do not sum to 1,
            or a label is out of range.
    """
    p, _ = _check_probs(probs, 2, "probs")
    y = _check_labels(labels, p)
    one_hot = torch.nn.functional.one_hot(y, p.shape[-1]).to(p.dtype)
    return (p - one_hot).square().sum(-1).mean().item()


# ------------------------------------------------------------------------------------------------
# Calibration
# ------------------------------------------------------------------------------------------------


def _binned_gap(confidence: Tensor, hit: Tensor, bins: Tensor, num_bins: int) -> Tensor:
    """Σ_b (n_b/N)·|acc_b − conf_b| = Σ_b |Σ_{i∈b} hit_i − Σ_{i∈b} conf_i| / N (empty bins: 0).

    The last dimension is binned; leading dimensions get their own gaps.
    """
    lead, N = confidence.shape[:-1], confidence.shape[-1]
    gap = torch.zeros(*lead, num_bins, dtype=torch.float64, device=confidence.device)
    gap.scatter_add_(-1, bins, hit - confidence)
    return gap.abs().sum(-1) / N


def _equal_width_bins(values: Tensor, num_bins: int) -> Tensor:
    """Bin index of each value in [0, 1]: bin b is (b/n, (b+1)/n], and bin 0 also holds 0."""
    edges = torch.linspace(0, 1, num_bins + 1, dtype=torch.float64, device=values.device)
    return torch.bucketize(values, edges[1:-1], right=False)


def ece(probs: Any, labels: Any, *, num_bins: int = 15) -> float:
    """Expected calibration error of the top-label confidence, with equal-width bins.

        ECE = Σ_b (|B_b| / N) · |acc(B_b) − conf(B_b)|

    where the confidence of an example is its max probability, bins are (0, 1/n], (1/n, 2/n],
    …, ((n−1)/n, 1], acc(B_b) is the fraction of bin b whose argmax is correct and conf(B_b) its
    mean confidence; empty bins contribute 0.

    Args:
        probs: predictive probabilities; for an ensemble, the mean of the members', (B, K).
        labels: class indices, (B,).
        num_bins: n, the number of bins; 15 is the field's convention.

    Returns:
        A float in [0, 1].

    Raises:
        TypeError: if ``probs`` is not floating point, ``labels`` not integer or ``num_bins``
            not an int.
        ValueError: if the shapes do not match, ``probs`` is empty or its rows do not sum to 1,
            a label is out of range, or ``num_bins < 1``.
    """
    n = _check_num_bins(num_bins)
    p, _ = _check_probs(probs, 2, "probs")
    y = _check_labels(labels, p)
    confidence, prediction = p.max(-1)
    hit = (prediction == y).double()
    return _binned_gap(confidence, hit, _equal_width_bins(confidence, n), n).item()


def adaptive_ece(probs: Any, labels: Any, *, num_bins: int = 15) -> float:
    """Expected calibration error of the top-label confidence, with equal-mass bins.

        ACE = Σ_b (|B_b| / N) · |acc(B_b) − conf(B_b)|

    as :func:`ece`, but the examples sorted by confidence are split into ``num_bins`` bins of
    equal count (the first N mod n bins hold one more, as ``numpy.array_split``; examples of
    equal confidence are kept in their input order). With more bins than examples, the extra
    bins are empty.

    Args:
        probs: predictive probabilities, (B, K).
        labels: class indices, (B,).
        num_bins: n, the number of bins.

    Returns:
        A float in [0, 1].

    Raises:
        TypeError: if ``probs`` is not floating point, ``labels`` not integer or ``num_bins``
            not an int.
        ValueError: if the shapes do not match, ``probs`` is empty or its rows do not sum to 1,
            a label is out of range, or ``num_bins < 1``.
    """
    n = _check_num_bins(num_bins)
    p, _ = _check_probs(probs, 2, "probs")
    y = _check_labels(labels, p)
    confidence, prediction = p.max(-1)
    hit = (prediction == y).double()
    N = confidence.numel()
    sizes = torch.full((n,), N // n, dtype=torch.long)
    sizes[: N % n] += 1
    bin_of_rank = torch.repeat_interleave(torch.arange(n), sizes).to(p.device)
    order = confidence.argsort(stable=True)
    bins = torch.empty_like(bin_of_rank).scatter_(0, order, bin_of_rank)
    return _binned_gap(confidence, hit, bins, n).item()


def classwise_ece(probs: Any, labels: Any, *, num_bins: int = 15) -> float:
    """Class-wise expected calibration error: the mean over classes of each class's ECE.

        cwECE = (1/K) Σ_k Σ_b (|B_bk| / N) · |freq_k(B_bk) − conf_k(B_bk)|

    where, for each class k, every example is binned by p_k into the equal-width bins of
    :func:`ece` ([0, 1/n], (1/n, 2/n], …), freq_k(B_bk) is the fraction of bin B_bk labelled k
    and conf_k(B_bk) its mean p_k (Kull et al., 2019).

    Args:
        probs: predictive probabilities, (B, K).
        labels: class indices, (B,).
        num_bins: n, the number of bins per class.

    Returns:
        A float in [0, 1].

    Raises:
        TypeError: if ``probs`` is not floating point, ``labels`` not integer or ``num_bins``
            not an int.
        ValueError: if the shapes do not match, ``probs`` is empty or its rows do not sum to 1,
            a label is out of range, or ``num_bins < 1``.
    """
    n = _check_num_bins(num_bins)
    p, _ = _check_probs(probs, 2, "probs")
    y = _check_labels(labels, p)
    p_t = p.T.contiguous()  # (K, B): each class binned on its own
    is_class = (y == torch.arange(p.shape[1], device=p.device).unsqueeze(1)).double()  # (K, B)
    return _binned_gap(p_t, is_class, _equal_width_bins(p_t, n), n).mean().item()


# ------------------------------------------------------------------------------------------------
# Selective prediction
# ------------------------------------------------------------------------------------------------


def aurc(probs: Any, labels: Any) -> float:
    """Area under the risk–coverage curve of selective prediction by confidence (lower is better).

        AURC = (1/N) Σ_{i=1..N} risk(i),     risk(i) = (1/i) Σ_{j ≤ i} 1[argmax p_(j) ≠ y_(j)]

    where examples are ranked by decreasing max probability, so risk(i) is the error rate when
    only the i most confident predictions are kept (coverage i/N; Geifman et al., 2019). The
    order among equal confidences is arbitrary, so each risk(i) is its expectation over the
    orders of those ties: inside a tie group of size g with e errors, the errors before the
    group plus e·(position in group)/g.

    Args:
        probs: predictive probabilities, (B, K).
        labels: class indices, (B,).

    Returns:
        A float in [0, 1].

    Raises:
        TypeError: if ``probs`` is not floating point or ``labels`` not integer.
        ValueError: if the shapes do not match, ``probs`` is empty or its rows do not sum to 1,
            or a label is out of range.
    """
    p, _ = _check_probs(probs, 2, "probs")
    y = _check_labels(labels, p)
    confidence, prediction = p.max(-1)
    confidence, order = confidence.sort(descending=True, stable=True)
    error = (prediction != y).double()[order]
    _, group, size = torch.unique_consecutive(confidence, return_inverse=True, return_counts=True)
    group_errors = torch.zeros(size.numel(), dtype=torch.float64, device=p.device)
    group_errors.index_add_(0, group, error)
    errors_before = group_errors.cumsum(0) - group_errors
    start = size.cumsum(0) - size
    rank = torch.arange(1, error.numel() + 1, device=p.device)  # i = 1..N
    in_group = rank - start[group]  # 1..g inside each tie group
    expected_errors = errors_before[group] + group_errors[group] * in_group / size[group]
    return (expected_errors / rank).mean().item()
