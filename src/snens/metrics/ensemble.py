"""Ensemble metrics: disagreement, the entropy decomposition, member correlation, OOD scores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from snens.metrics._inputs import _check_member_logits, _check_probs, _check_probs_labels
from snens.metrics.predictive import _log_true_class

__all__ = [
    "LOGIT_OOD_SCORES",
    "OOD_SCORES",
    "disagreement",
    "energy_score",
    "expected_entropy",
    "max_logit_score",
    "member_correlation",
    "mutual_information",
    "per_member",
    "predictive_entropy",
]


def _entropy(p: Tensor) -> Tensor:
    """−Σ_k p_k log p_k over the last dimension, with 0·log 0 = 0."""
    return -torch.special.xlogy(p, p).sum(-1)


def _members(member_probs: Any) -> Tensor:
    return _check_probs(member_probs, 3, "member_probs")[0]


def disagreement(member_probs: Any) -> Tensor:
    """Per example, the fraction of member pairs whose argmax predictions differ (0 for M = 1).

    Returns:
        Float64 values in [0, 1], shape (B,).

    Raises:
        TypeError, ValueError: ``member_probs`` not floating, not 3-D, empty, or rows not
            summing to 1.
    """
    p = _members(member_probs)
    M, B, K = p.shape
    if M == 1:
        return p.new_zeros(B)
    votes = torch.zeros(B, K, dtype=torch.float64, device=p.device)
    votes.scatter_add_(1, p.argmax(-1).T, torch.ones(B, M, dtype=torch.float64, device=p.device))
    agreeing = (votes * (votes - 1)).sum(-1)  # 2 × the number of agreeing pairs
    return 1 - agreeing / (M * (M - 1))


def predictive_entropy(member_probs: Any) -> Tensor:
    """Total uncertainty: the entropy of the mean prediction H[p̄], in nats.

    Returns:
        Float64 values in [0, log K], shape (B,).

    Raises:
        TypeError, ValueError: as :func:`disagreement`.
    """
    return _entropy(_members(member_probs).mean(0))


def expected_entropy(member_probs: Any) -> Tensor:
    """Aleatoric uncertainty: the mean of the members' entropies E_m H[p_m], in nats.

    Returns:
        Float64 values in [0, log K], shape (B,).

    Raises:
        TypeError, ValueError: as :func:`disagreement`.
    """
    return _entropy(_members(member_probs)).mean(0)


def mutual_information(member_probs: Any) -> Tensor:
    """Epistemic uncertainty: I = H[p̄] − E_m H[p_m], the members' disagreement in nats
    (0 exactly when all members agree; clamped at 0 against rounding).

    Returns:
        Float64 values in [0, min(log M, log K)], shape (B,).

    Raises:
        TypeError, ValueError: as :func:`disagreement`.
    """
    p = _members(member_probs)
    return (_entropy(p.mean(0)) - _entropy(p).mean(0)).clamp_min(0)


def member_correlation(member_probs: Any) -> float:
    """Mean pairwise Pearson correlation of the members' probabilities, each flattened over
    examples and classes; 1 means the members predict alike.

    Returns:
        A float in [−1, 1].

    Raises:
        TypeError, ValueError: as :func:`disagreement`; M < 2, or a member's output is
            constant (its correlation is undefined).
    """
    p = _members(member_probs)
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
    """Accuracy and NLL of each member on its own (p clamped as in :func:`nll`).

    Returns:
        ``{"accuracy": acc, "nll": nll}``, float64 tensors, shape (M,) each.

    Raises:
        TypeError, ValueError: as :func:`disagreement`; labels not integer, of another B or out
            of range.
    """
    p, y, dtype = _check_probs_labels(member_probs, labels, 3, "member_probs")
    return {
        "accuracy": (p.argmax(-1) == y).double().mean(-1),
        "nll": -_log_true_class(p, y, dtype).mean(-1),
    }


def _max_prob_score(member_probs: Any) -> Tensor:
    """1 − max_k p̄_k, the complement of the maximum softmax probability of the mean."""
    return 1 - _members(member_probs).mean(0).amax(-1)


OOD_SCORES: dict[str, Callable[[Any], Tensor]] = {
    "msp": _max_prob_score,
    "entropy": predictive_entropy,
    "mutual_information": mutual_information,
}
"""OOD scores from member probabilities (M, B, K) to per-example scores (B,), higher = more
likely OOD: ``"msp"`` 1 − max of the mean probability, ``"entropy"``, ``"mutual_information"``."""


def max_logit_score(member_logits: Any) -> Tensor:
    """OOD score −max_k z̄_k of the members' mean logit z̄ (Hendrycks et al., 2022; as
    torch-uncertainty's ``MaxLogitCriterion``); not invariant to a shift of the logits.

    Returns:
        Float64 scores, shape (B,).

    Raises:
        TypeError, ValueError: ``member_logits`` not floating, not 3-D, empty, or not finite.

    >>> max_logit_score(torch.tensor([[[2.0, 0.0]], [[0.0, 1.0]]]))
    tensor([-1.], dtype=torch.float64)
    """
    return -_check_member_logits(member_logits).mean(0).amax(-1)


def energy_score(member_logits: Any) -> Tensor:
    """OOD score of the free energy −log Σ_k exp(z̄_k) of the members' mean logit z̄, at T = 1
    (Liu et al., 2020; as torch-uncertainty's ``EnergyCriterion``).

    Returns:
        Float64 scores, shape (B,).

    Raises:
        TypeError, ValueError: as :func:`max_logit_score`.

    >>> energy_score(torch.zeros(1, 1, 4))  # −log 4
    tensor([-1.3863], dtype=torch.float64)
    """
    return -torch.logsumexp(_check_member_logits(member_logits).mean(0), dim=-1)


LOGIT_OOD_SCORES: dict[str, Callable[[Any], Tensor]] = {
    "max_logit": max_logit_score,
    "energy": energy_score,
}
"""OOD scores from member logits (M, B, K) to per-example scores (B,), higher = more likely OOD:
``"max_logit"`` −max_k z̄_k, ``"energy"`` −log Σ_k exp z̄_k of the members' mean logit z̄."""
