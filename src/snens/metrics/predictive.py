"""Metrics of the predictive distribution: accuracy, proper scores, calibration, AURC."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from snens.metrics._inputs import _check_num_bins, _check_probs_labels

__all__ = ["accuracy", "adaptive_ece", "aurc", "brier", "classwise_ece", "ece", "nll"]


def accuracy(probs: Any, labels: Any) -> float:
    """Fraction of examples whose argmax class is the label.

    Returns:
        A float in [0, 1].

    Raises:
        TypeError, ValueError: probabilities or labels that are not valid (:func:`ece`).
    """
    p, y, _ = _check_probs_labels(probs, labels)
    return (p.argmax(-1) == y).double().mean().item()


def _log_true_class(p: Tensor, y: Tensor, dtype: torch.dtype) -> Tensor:
    """log p_y, a p_y of 0 taken as the smallest normal number of the input ``dtype`` (a
    subnormal p_y, valid in float16, is kept)."""
    p_true = p.gather(-1, y.expand(p.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    return torch.where(p_true > 0, p_true, torch.finfo(dtype).tiny).log()


def nll(probs: Any, labels: Any) -> float:
    """Negative log-likelihood of the labels, −(1/B) Σ_i log p_{i, y_i}, in nats; a probability
    of 0 is clamped at ``torch.finfo(dtype).tiny`` of the input's dtype.

    Returns:
        A float >= 0.

    Raises:
        TypeError, ValueError: probabilities or labels that are not valid (:func:`ece`).
    """
    p, y, dtype = _check_probs_labels(probs, labels)
    return -_log_true_class(p, y, dtype).mean().item()


def brier(probs: Any, labels: Any) -> float:
    """Brier score, (1/B) Σ_i Σ_k (p_ik − 1[y_i = k])², summed over classes (in [0, 2]).

    Returns:
        A float in [0, 2].

    Raises:
        TypeError, ValueError: probabilities or labels that are not valid (:func:`ece`).
    """
    p, y, _ = _check_probs_labels(probs, labels)
    one_hot = torch.nn.functional.one_hot(y, p.shape[-1]).to(p.dtype)
    return (p - one_hot).square().sum(-1).mean().item()


def _top_label(p: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """The top-label confidence max_k p_k and 1. where the argmax is the label, 0. elsewhere."""
    confidence, prediction = p.max(-1)
    return confidence, (prediction == y).double()


def _binned_gap(confidence: Tensor, hit: Tensor, bins: Tensor, num_bins: int) -> Tensor:
    """Σ_b |Σ_{i∈b} hit_i − Σ_{i∈b} conf_i| / N over the last dimension (empty bins: 0)."""
    lead, N = confidence.shape[:-1], confidence.shape[-1]
    gap = torch.zeros(*lead, num_bins, dtype=torch.float64, device=confidence.device)
    gap.scatter_add_(-1, bins, hit - confidence)
    return gap.abs().sum(-1) / N


def _equal_width_bins(values: Tensor, num_bins: int) -> Tensor:
    """Bin index of each value in [0, 1]: bin b is (b/n, (b+1)/n], and bin 0 also holds 0."""
    return torch.bucketize(values, inner_edges(num_bins, values.device), right=False)


def inner_edges(num_bins: int, device: torch.device | str = "cpu") -> Tensor:
    """The n − 1 inner edges b/n of n equal-width bins, each correctly rounded (linspace's are
    not: its 11/20 is 0.5499999999999999, so a confidence of 0.55 fell in the bin above)."""
    return torch.arange(1, num_bins, dtype=torch.float64, device=device) / num_bins


def ece(probs: Any, labels: Any, *, num_bins: int = 15) -> float:
    """Expected calibration error of the top-label confidence, with ``num_bins`` = n equal-width
    bins (0, 1/n], …, ((n−1)/n, 1]: ``ECE = Σ_b (|B_b| / N) · |acc(B_b) − conf(B_b)|``.

    Returns:
        A float in [0, 1].

    Raises:
        TypeError: ``probs`` not floating point, ``labels`` not integer or ``num_bins`` not an int.
        ValueError: mismatched shapes, empty ``probs``, rows not summing to 1, a label out of
            range, or ``num_bins < 1``.
    """
    n = _check_num_bins(num_bins)
    p, y, _ = _check_probs_labels(probs, labels)
    confidence, hit = _top_label(p, y)
    return _binned_gap(confidence, hit, _equal_width_bins(confidence, n), n).item()


def adaptive_ece(probs: Any, labels: Any, *, num_bins: int = 15) -> float:
    """Expected calibration error of the top-label confidence, as :func:`ece` but with the
    examples sorted by confidence (stably) split into ``num_bins`` bins of equal count, the first
    N mod n holding one more (``numpy.array_split``).

    Returns:
        A float in [0, 1].

    Raises:
        TypeError, ValueError: as :func:`ece`.
    """
    n = _check_num_bins(num_bins)
    p, y, _ = _check_probs_labels(probs, labels)
    confidence, hit = _top_label(p, y)
    N = confidence.numel()
    sizes = torch.full((n,), N // n, dtype=torch.long)
    sizes[: N % n] += 1
    bin_of_rank = torch.repeat_interleave(torch.arange(n), sizes).to(p.device)
    order = confidence.argsort(stable=True)
    bins = torch.empty_like(bin_of_rank).scatter_(0, order, bin_of_rank)
    return _binned_gap(confidence, hit, bins, n).item()


def classwise_ece(probs: Any, labels: Any, *, num_bins: int = 15) -> float:
    """Class-wise ECE: the mean over classes k of the ECE of p_k against 1[y = k], each class
    binned by p_k into the equal-width bins of :func:`ece` (Kull et al., 2019).

    Returns:
        A float in [0, 1].

    Raises:
        TypeError, ValueError: as :func:`ece`.
    """
    n = _check_num_bins(num_bins)
    p, y, _ = _check_probs_labels(probs, labels)
    p_t = p.T.contiguous()  # (K, B): each class binned on its own
    is_class = (y == torch.arange(p.shape[1], device=p.device).unsqueeze(1)).double()  # (K, B)
    return _binned_gap(p_t, is_class, _equal_width_bins(p_t, n), n).mean().item()


def aurc(probs: Any, labels: Any) -> float:
    """Area under the risk–coverage curve of selective prediction by confidence (lower is better).

        AURC = (1/N) Σ_{i=1..N} risk(i),     risk(i) = (1/i) Σ_{j ≤ i} 1[argmax p_(j) ≠ y_(j)]

    over examples ranked by decreasing max probability (Geifman et al., 2019); among equal
    confidences each risk(i) is its expectation over the orders of the ties.

    Returns:
        A float in [0, 1].

    Raises:
        TypeError, ValueError: probabilities or labels that are not valid (:func:`ece`).
    """
    p, y, _ = _check_probs_labels(probs, labels)
    confidence, hit = _top_label(p, y)
    confidence, order = confidence.sort(descending=True, stable=True)
    error = (1 - hit)[order]
    _, group, size = torch.unique_consecutive(confidence, return_inverse=True, return_counts=True)
    group_errors = torch.zeros(size.numel(), dtype=torch.float64, device=p.device)
    group_errors.index_add_(0, group, error)
    errors_before = group_errors.cumsum(0) - group_errors
    start = size.cumsum(0) - size
    rank = torch.arange(1, error.numel() + 1, device=p.device)  # i = 1..N
    in_group = rank - start[group]  # 1..g inside each tie group
    expected_errors = errors_before[group] + group_errors[group] * in_group / size[group]
    return (expected_errors / rank).mean().item()
