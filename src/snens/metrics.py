"""Evaluation metrics: accuracy and calibration, selective prediction, OOD detection, and the
ensemble's uncertainty decomposition into aleatoric and epistemic (modulation) parts.

Conventions shared by every function here:

* ``probs (B, K)`` are predictive probabilities, for an ensemble the mean of member softmaxes
  (:func:`snens.predictive_probs`); ``labels (B,)`` are integer class indices;
  ``member_probs (M, B, K)`` are the members' probabilities, ``logits.softmax(-1)`` of an
  ensemble's ``(M, B, K)`` logits.
* Torch tensors and NumPy arrays are accepted. Inputs are detached and computed in float64 on
  their own device (on the CPU for MPS, which has no float64).
* Scalar metrics return a Python ``float``; per-example metrics a float64 tensor ``(B,)``,
  per-member metrics float64 tensors ``(M,)``.
* The prediction is the argmax (the first index on ties), the confidence its probability.
  Entropies are in nats.
* OOD metrics take uncertainty scores, higher = more likely out-of-distribution, with OOD as the
  positive class; :data:`OOD_SCORES` turns member probabilities into such scores.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "OOD_SCORES",
    "accuracy",
    "adaptive_ece",
    "aupr",
    "aurc",
    "auroc",
    "brier",
    "classwise_ece",
    "disagreement",
    "ece",
    "expected_entropy",
    "fpr_at_95_tpr",
    "member_correlation",
    "mutual_information",
    "nll",
    "per_member",
    "predictive_entropy",
]

# Rows of probabilities must sum to 1 within this: it catches inputs that are not probabilities
# (logits, unnormalized scores) and passes rounded ones — float32 softmax over 1000 classes is
# off by ~1e-6, bfloat16 softmax rows (also once cast to float64) by up to ~2e-3.
_SUM_ATOL = 5e-3
_MAX_BINS = 10**6  # more bins than any data set has examples; beyond int64 torch overflows
_TPR_LEVEL = 0.95


# ------------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------------


def _as_tensor(x: Any, name: str) -> Tensor:
    if isinstance(x, np.ndarray):
        x = torch.tensor(x)
    elif not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    x = x.detach()
    return x.cpu() if x.device.type == "mps" else x


def _check_probs(probs: Any, ndim: int, name: str) -> tuple[Tensor, torch.dtype]:
    """``probs`` as float64, and its original dtype (for the NLL clamp)."""
    p = _as_tensor(probs, name)
    layout = "(B, K)" if ndim == 2 else "(M, B, K)"
    if not p.is_floating_point():
        raise TypeError(f"{name} must be floating-point probabilities {layout}, got {p.dtype}")
    if p.dim() != ndim:
        hint = ""
        if ndim == 2 and p.dim() == 3:
            hint = "; for member probabilities (M, B, K) pass their mean, snens.predictive_probs"
        elif ndim == 3 and p.dim() == 2:
            hint = "; for a single model pass probs.unsqueeze(0) (M = 1)"
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(p.shape)}{hint}")
    if p.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(p.shape)}); metrics need at least one example and "
            "one class"
        )
    dtype, p = p.dtype, p.to(torch.float64)
    if not torch.isfinite(p).all():
        raise ValueError(f"{name} contains NaN or inf")
    if (p < 0).any():
        raise ValueError(
            f"{name} has negative entries (min {p.min().item():.4g}); pass probabilities, not "
            "logits: snens.predictive_probs(logits) or logits.softmax(-1)"
        )
    sums = p.sum(-1)
    tolerance = max(_SUM_ATOL, torch.finfo(dtype).eps * math.sqrt(p.shape[-1]))
    bad = (sums - 1).abs() > tolerance
    if bad.any():
        where = tuple(torch.nonzero(bad)[0].tolist())
        raise ValueError(
            f"{name} rows must sum to 1 (within {tolerance:.3g}), but row {where} sums to "
            f"{sums[where].item():.6g}; pass probabilities: snens.predictive_probs(logits) for "
            "ensemble logits (M, B, K), or logits.softmax(-1)"
        )
    return p, dtype


def _check_labels(labels: Any, probs: Tensor) -> Tensor:
    """``labels`` as int64 on ``probs``' device, checked against its (…, B, K) shape."""
    y = _as_tensor(labels, "labels")
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise TypeError(f"labels must be integer class indices, got {y.dtype}; use labels.long()")
    if y.dim() != 1:
        raise ValueError(f"labels must be 1-D class indices (B,), got shape {tuple(y.shape)}")
    B, K = probs.shape[-2:]
    if y.shape[0] != B:
        raise ValueError(
            f"labels has {y.shape[0]} entries but the probabilities {tuple(probs.shape)} have "
            f"B = {B} examples; they must match"
        )
    y = y.to(device=probs.device, dtype=torch.long)
    out = (y < 0) | (y >= K)
    if out.any():
        raise ValueError(
            f"labels must lie in [0, {K - 1}] for K = {K} classes, got {y[out][:5].tolist()}"
        )
    return y


def _check_num_bins(num_bins: Any) -> int:
    if isinstance(num_bins, bool) or not isinstance(num_bins, numbers.Integral):
        raise TypeError(f"num_bins must be an int, got {num_bins!r}; use e.g. num_bins=15")
    if not 1 <= num_bins <= _MAX_BINS:
        raise ValueError(
            f"num_bins must be in 1..{_MAX_BINS:,}, got num_bins={num_bins}; use e.g. num_bins=15"
        )
    return int(num_bins)


def _check_scores(scores: Any, name: str) -> Tensor:
    s = _as_tensor(scores, name)
    if s.is_complex():
        raise TypeError(f"{name} must be real scores, got {s.dtype}")
    if s.dim() != 1:
        raise ValueError(f"{name} must be 1-D per-example scores (N,), got {tuple(s.shape)}")
    if s.numel() == 0:
        raise ValueError(
            f"{name} is empty; OOD metrics need at least one in-distribution and one OOD score"
        )
    s = s.to(torch.float64)
    if not torch.isfinite(s).all():
        raise ValueError(f"{name} contains NaN or inf")
    return s


def _check_ood(in_scores: Any, out_scores: Any) -> tuple[Tensor, Tensor]:
    """In- and out-of-distribution scores concatenated, and 1. for OOD (the positives)."""
    s_in = _check_scores(in_scores, "in_scores")
    s_out = _check_scores(out_scores, "out_scores").to(s_in.device)
    is_ood = torch.cat([torch.zeros_like(s_in), torch.ones_like(s_out)])
    return torch.cat([s_in, s_out]), is_ood


# ------------------------------------------------------------------------------------------------
# Accuracy and proper scores
# ------------------------------------------------------------------------------------------------


def accuracy(probs: Any, labels: Any) -> float:
    """Fraction of examples whose argmax class is the label, (1/B) Σ_i 1[argmax_k p_ik = y_i].

    Args:
        probs: predictive probabilities.
        labels: class indices.

    Returns:
        A float in [0, 1].

    Shape:
        probs: (B, K). labels: (B,).

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
    dtype (``torch.finfo(dtype).tiny``), so the NLL stays finite: one such example costs at most
    −log(tiny) = 87.3 nats in float32, 708.4 in float64.

    Args:
        probs: predictive probabilities.
        labels: class indices.

    Returns:
        A float >= 0.

    Shape:
        probs: (B, K). labels: (B,).

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
        probs: predictive probabilities.
        labels: class indices.

    Returns:
        A float in [0, 2].

    Shape:
        probs: (B, K). labels: (B,).

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
        probs: predictive probabilities; for an ensemble, the mean of the members'.
        labels: class indices.
        num_bins: n, the number of bins; 15 is the field's convention.

    Returns:
        A float in [0, 1].

    Shape:
        probs: (B, K). labels: (B,).

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
        probs: predictive probabilities.
        labels: class indices.
        num_bins: n, the number of bins.

    Returns:
        A float in [0, 1].

    Shape:
        probs: (B, K). labels: (B,).

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
        probs: predictive probabilities.
        labels: class indices.
        num_bins: n, the number of bins per class.

    Returns:
        A float in [0, 1].

    Shape:
        probs: (B, K). labels: (B,).

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
        probs: predictive probabilities.
        labels: class indices.

    Returns:
        A float in [0, 1].

    Shape:
        probs: (B, K). labels: (B,).

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


# ------------------------------------------------------------------------------------------------
# Out-of-distribution detection
# ------------------------------------------------------------------------------------------------


def _curve_at_thresholds(scores: Tensor, is_ood: Tensor) -> tuple[Tensor, Tensor]:
    """True- and false-positive counts when flagging score >= t, for each distinct score t
    from the highest down (the points of scikit-learn's ROC and precision-recall curves)."""
    scores, order = scores.sort(descending=True, stable=True)
    positives = is_ood[order]
    _, size = torch.unique_consecutive(scores, return_counts=True)
    last = size.cumsum(0) - 1  # the last example of each tie group
    return positives.cumsum(0)[last], (1 - positives).cumsum(0)[last]


def auroc(in_scores: Any, out_scores: Any) -> float:
    """Area under the ROC curve for telling OOD (positive) from in-distribution examples.

        AUROC = P(s_out > s_in) + ½·P(s_out = s_in)

    the Mann–Whitney statistic over all (in, out) pairs, computed from average ranks:
    (Σ rank(out) − n_out(n_out + 1)/2) / (n_in·n_out). Equal to scikit-learn's
    ``roc_auc_score`` with OOD labelled 1, ties included.

    Args:
        in_scores: uncertainty scores of in-distribution examples, higher = more likely OOD.
        out_scores: the same scores of OOD examples.

    Returns:
        A float in [0, 1]; 0.5 is chance, 1 a perfect separation.

    Shape:
        in_scores: (N_in,). out_scores: (N_out,).

    Raises:
        TypeError: if a score tensor is complex or neither a tensor nor an array.
        ValueError: if either is empty, not 1-D, or holds NaN or inf.
    """
    scores, is_ood = _check_ood(in_scores, out_scores)
    sorted_scores, order = scores.sort(stable=True)
    _, group, size = torch.unique_consecutive(
        sorted_scores, return_inverse=True, return_counts=True
    )
    group_rank = size.cumsum(0) - (size - 1) / 2  # mean of the 1-based positions of a tie group
    ranks = torch.empty_like(scores).scatter_(0, order, group_rank[group].double())
    n_out = is_ood.sum()
    n_in = is_ood.numel() - n_out
    u = (ranks * is_ood).sum() - n_out * (n_out + 1) / 2
    return (u / (n_in * n_out)).item()


def aupr(in_scores: Any, out_scores: Any) -> float:
    """Area under the precision–recall curve with OOD as the positive class (AUPR-Out).

        AP = Σ_n (R_n − R_{n−1}) · P_n

    over the distinct score thresholds t_n from the highest down, flagging score >= t_n as OOD,
    with R_0 = 0. This is scikit-learn's ``average_precision_score`` with OOD labelled 1, ties
    included (no interpolation).

    Args:
        in_scores: uncertainty scores of in-distribution examples, higher = more likely OOD.
        out_scores: the same scores of OOD examples.

    Returns:
        A float in (0, 1]; chance is the OOD fraction n_out / (n_in + n_out).

    Shape:
        in_scores: (N_in,). out_scores: (N_out,).

    Raises:
        TypeError: if a score tensor is complex or neither a tensor nor an array.
        ValueError: if either is empty, not 1-D, or holds NaN or inf.
    """
    scores, is_ood = _check_ood(in_scores, out_scores)
    tp, fp = _curve_at_thresholds(scores, is_ood)
    recall = tp / tp[-1]
    precision = tp / (tp + fp)
    recall_step = torch.diff(recall, prepend=recall.new_zeros(1))
    return (recall_step * precision).sum().item()


def fpr_at_95_tpr(in_scores: Any, out_scores: Any) -> float:
    """False-positive rate on in-distribution data when 95% of OOD examples are flagged.

        FPR@95 = FP(t*) / n_in,     t* = the highest threshold t with TP(t) / n_out >= 0.95

    flagging score >= t as OOD, over the distinct scores as thresholds (the points of
    scikit-learn's ``roc_curve(..., drop_intermediate=False)``): the fraction of
    in-distribution examples wrongly flagged at the first operating point reaching 95% TPR.

    Args:
        in_scores: uncertainty scores of in-distribution examples, higher = more likely OOD.
        out_scores: the same scores of OOD examples.

    Returns:
        A float in [0, 1]; lower is better.

    Shape:
        in_scores: (N_in,). out_scores: (N_out,).

    Raises:
        TypeError: if a score tensor is complex or neither a tensor nor an array.
        ValueError: if either is empty, not 1-D, or holds NaN or inf.
    """
    scores, is_ood = _check_ood(in_scores, out_scores)
    tp, fp = _curve_at_thresholds(scores, is_ood)
    tpr, fpr = tp / tp[-1], fp / (is_ood.numel() - tp[-1])
    first = torch.nonzero(tpr >= _TPR_LEVEL)[0, 0]  # exists: the last point has TPR = 1
    return fpr[first].item()


# ------------------------------------------------------------------------------------------------
# Ensemble metrics
# ------------------------------------------------------------------------------------------------


def _entropy(p: Tensor) -> Tensor:
    """−Σ_k p_k log p_k over the last dimension, with 0·log 0 = 0."""
    return -torch.special.xlogy(p, p).sum(-1)


def disagreement(member_probs: Any) -> Tensor:
    """Per example, the fraction of member pairs whose argmax predictions differ.

        d_i = (1 / (M(M−1)/2)) Σ_{m < m'} 1[ŷ_mi ≠ ŷ_m'i],     ŷ_mi = argmax_k p_mik

    computed from the vote counts c_ik as 1 − Σ_k c_ik(c_ik − 1) / (M(M − 1)). With one member
    there are no pairs and d = 0.

    Args:
        member_probs: the members' probabilities.

    Returns:
        Float64 values in [0, 1].

    Shape:
        member_probs: (M, B, K). Output: (B,).

    Raises:
        TypeError: if ``member_probs`` is not floating point.
        ValueError: if it is not 3-D, is empty, or its rows do not sum to 1.
    """
    p, _ = _check_probs(member_probs, 3, "member_probs")
    M, B, K = p.shape
    if M == 1:
        return p.new_zeros(B)
    votes = torch.zeros(B, K, dtype=torch.float64, device=p.device)
    votes.scatter_add_(1, p.argmax(-1).T, torch.ones(B, M, dtype=torch.float64, device=p.device))
    agreeing = (votes * (votes - 1)).sum(-1)  # 2 × the number of agreeing pairs
    return 1 - agreeing / (M * (M - 1))


def predictive_entropy(member_probs: Any) -> Tensor:
    """Total uncertainty: the entropy of the mean prediction, in nats.

        H[p̄] = −Σ_k p̄_k log p̄_k,     p̄ = (1/M) Σ_m p_m

    Args:
        member_probs: the members' probabilities.

    Returns:
        Float64 values in [0, log K].

    Shape:
        member_probs: (M, B, K). Output: (B,).

    Raises:
        TypeError: if ``member_probs`` is not floating point.
        ValueError: if it is not 3-D, is empty, or its rows do not sum to 1.
    """
    p, _ = _check_probs(member_probs, 3, "member_probs")
    return _entropy(p.mean(0))


def expected_entropy(member_probs: Any) -> Tensor:
    """Aleatoric uncertainty: the mean of the members' entropies, in nats.

        E_m H[p_m] = (1/M) Σ_m −Σ_k p_mk log p_mk

    Args:
        member_probs: the members' probabilities.

    Returns:
        Float64 values in [0, log K].

    Shape:
        member_probs: (M, B, K). Output: (B,).

    Raises:
        TypeError: if ``member_probs`` is not floating point.
        ValueError: if it is not 3-D, is empty, or its rows do not sum to 1.
    """
    p, _ = _check_probs(member_probs, 3, "member_probs")
    return _entropy(p).mean(0)


def mutual_information(member_probs: Any) -> Tensor:
    """Epistemic uncertainty: total minus aleatoric, the members' disagreement in nats.

        I = H[p̄] − E_m H[p_m]

    the mutual information between the prediction and the member index. In σN-Ens the members
    differ only by their norm modulations, so this is the modulation uncertainty. It is >= 0 by
    concavity of H and clamped at 0 against rounding; it is 0 exactly when all members agree,
    and at most log M.

    Args:
        member_probs: the members' probabilities.

    Returns:
        Float64 values in [0, min(log M, log K)].

    Shape:
        member_probs: (M, B, K). Output: (B,).

    Raises:
        TypeError: if ``member_probs`` is not floating point.
        ValueError: if it is not 3-D, is empty, or its rows do not sum to 1.
    """
    p, _ = _check_probs(member_probs, 3, "member_probs")
    return (_entropy(p.mean(0)) - _entropy(p).mean(0)).clamp_min(0)


def member_correlation(member_probs: Any) -> float:
    """Mean pairwise Pearson correlation of the members' outputs.

        ρ = (1 / (M(M−1)/2)) Σ_{m < m'} corr(vec p_m, vec p_m')

    where vec p_m is member m's probabilities flattened over examples and classes (B·K values).
    1 means the members predict alike; lower means more diverse members.

    Args:
        member_probs: the members' probabilities.

    Returns:
        A float in [−1, 1].

    Shape:
        member_probs: (M, B, K), M >= 2.

    Raises:
        TypeError: if ``member_probs`` is not floating point.
        ValueError: if it is not 3-D, is empty, its rows do not sum to 1, M < 2, or a member's
            output is constant (its correlation is undefined).
    """
    p, _ = _check_probs(member_probs, 3, "member_probs")
    M = p.shape[0]
    if M < 2:
        raise ValueError(
            f"member_correlation needs at least 2 members, got member_probs of shape "
            f"{tuple(p.shape)}; a single model has no member pairs"
        )
    x = p.reshape(M, -1)
    x = x - x.mean(1, keepdim=True)
    norm = x.norm(dim=1)
    if (norm == 0).any():
        constant = torch.nonzero(norm == 0).flatten().tolist()
        raise ValueError(
            f"members {constant} output the same probability for every example and class, so "
            "their Pearson correlation is undefined"
        )
    corr = (x @ x.T) / (norm.unsqueeze(1) * norm.unsqueeze(0))
    i, j = torch.triu_indices(M, M, offset=1, device=p.device)
    return corr[i, j].mean().item()


def per_member(member_probs: Any, labels: Any) -> dict[str, Tensor]:
    """Accuracy and NLL of each member on its own.

        acc_m = (1/B) Σ_i 1[argmax_k p_mik = y_i],     nll_m = −(1/B) Σ_i log p_{m,i,y_i}

    with p clamped at ``torch.finfo(dtype).tiny`` of the input dtype, as in :func:`nll`.

    Args:
        member_probs: the members' probabilities.
        labels: class indices.

    Returns:
        ``{"accuracy": acc, "nll": nll}``, float64 tensors.

    Shape:
        member_probs: (M, B, K). labels: (B,). Outputs: (M,) each.

    Raises:
        TypeError: if ``member_probs`` is not floating point or ``labels`` not integer.
        ValueError: if the shapes do not match, ``member_probs`` is empty or its rows do not
            sum to 1, or a label is out of range.
    """
    p, dtype = _check_probs(member_probs, 3, "member_probs")
    y = _check_labels(labels, p)
    return {
        "accuracy": (p.argmax(-1) == y).double().mean(-1),
        "nll": -_log_true_class(p, y, dtype).mean(-1),
    }


def _max_prob_score(member_probs: Any) -> Tensor:
    """1 − max_k p̄_k, the complement of the maximum softmax probability of the mean."""
    p, _ = _check_probs(member_probs, 3, "member_probs")
    return 1 - p.mean(0).amax(-1)


OOD_SCORES: dict[str, Callable[[Any], Tensor]] = {
    "msp": _max_prob_score,
    "entropy": predictive_entropy,
    "mutual_information": mutual_information,
}
"""OOD scores from member probabilities (M, B, K) to per-example scores (B,), higher = more
likely OOD: ``"msp"`` 1 − max of the mean probability (the default in the field),
``"entropy"`` the predictive entropy, ``"mutual_information"`` the epistemic part."""
