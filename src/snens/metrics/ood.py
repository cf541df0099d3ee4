"""OOD detection from uncertainty scores: AUROC, AUPR and FPR at 95% TPR, OOD positive."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from snens.metrics._inputs import _check_ood

__all__ = ["aupr", "auroc", "fpr_at_95_tpr"]

_TPR_LEVEL = 0.95


def _curve_at_thresholds(scores: Tensor, is_ood: Tensor) -> tuple[Tensor, Tensor]:
    """True- and false-positive counts when flagging score >= t, for each distinct score t
    from the highest down (the points of scikit-learn's ROC and precision-recall curves)."""
    scores, order = scores.sort(descending=True, stable=True)
    positives = is_ood[order]
    _, size = torch.unique_consecutive(scores, return_counts=True)
    last = size.cumsum(0) - 1  # the last example of each tie group
    return positives.cumsum(0)[last], (1 - positives).cumsum(0)[last]


def auroc(in_scores: Any, out_scores: Any) -> float:
    """Area under the ROC curve for telling OOD (positive) from in-distribution examples, from
    scores (N_in,) and (N_out,), higher = more likely OOD: P(s_out > s_in) + ½·P(s_out = s_in),
    equal to scikit-learn's ``roc_auc_score`` with OOD labelled 1.

    Returns:
        A float in [0, 1]; 0.5 is chance.

    Raises:
        TypeError: a score tensor complex or neither a tensor nor an array.
        ValueError: either empty, not 1-D, or holding NaN or inf.
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
    """Area under the precision–recall curve with OOD as the positive class (AUPR-Out):
    scikit-learn's ``average_precision_score`` with OOD labelled 1 (no interpolation).

    Returns:
        A float in (0, 1]; chance is the OOD fraction n_out / (n_in + n_out).

    Raises:
        TypeError, ValueError: as :func:`auroc`.
    """
    scores, is_ood = _check_ood(in_scores, out_scores)
    tp, fp = _curve_at_thresholds(scores, is_ood)
    recall = tp / tp[-1]
    precision = tp / (tp + fp)
    recall_step = torch.diff(recall, prepend=recall.new_zeros(1))
    return (recall_step * precision).sum().item()


def fpr_at_95_tpr(in_scores: Any, out_scores: Any) -> float:
    """False-positive rate on in-distribution data at the highest threshold flagging 95% of OOD
    examples (the points of scikit-learn's ``roc_curve(..., drop_intermediate=False)``).

    Returns:
        A float in [0, 1]; lower is better.

    Raises:
        TypeError, ValueError: as :func:`auroc`.
    """
    scores, is_ood = _check_ood(in_scores, out_scores)
    tp, fp = _curve_at_thresholds(scores, is_ood)
    tpr, fpr = tp / tp[-1], fp / (is_ood.numel() - tp[-1])
    first = torch.nonzero(tpr >= _TPR_LEVEL)[0, 0]  # exists: the last point has TPR = 1
    return fpr[first].item()
