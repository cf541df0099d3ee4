"""Ensemble metrics: disagreement, the entropy decomposition, member correlation, OOD scores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from snens.metrics._inputs import _as_tensor, _check_labels, _check_probs
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


def disagreement(member_probs: Any) -> Tensor:
    """Per example, the fraction of member pairs whose argmax predictions differ.

        d_i = (1 / (M(M−1)/2)) Σ_{m < m'} 1[ŷ_mi ≠ ŷ_m'i],     ŷ_mi = argmax_k p_mik

    computed from the vote counts c_ik as 1 − Σ_k c_ik(c_ik − 1) / (M(M − 1)). With one member
    there are no pairs and d = 0.

    Args:
        member_probs: the members' probabilities, (M, B, K).

    Returns:
        Float64 values in [0, 1], shape (B,).

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
        member_probs: the members' probabilities, (M, B, K).

    Returns:
        Float64 values in [0, log K], shape (B,).

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
        member_probs: the members' probabilities, (M, B, K).

    Returns:
        Float64 values in [0, log K], shape (B,).

    Raises:
        TypeError: if ``member_probs`` is not floating point.
        ValueError: if it is not 3-D, is empty, or its rows do not sum to 1.
    """
    p, _ = _check_probs(member_probs, 3, "member_probs")
    return _entropy(p).mean(0)


def mutual_information(member_probs: Any) -> Tensor:
    """Epistemic uncertainty: total minus aleatoric, the members' disagreement in nats.

        I = H[p̄] − E_m H[p_m]

    the mutual information between the prediction and the member index (in σN-Ens, the
    modulation uncertainty). It is 0 exactly when all members agree, at most log M, and clamped
    at 0 against rounding.

    Args:
        member_probs: the members' probabilities, (M, B, K).

    Returns:
        Float64 values in [0, min(log M, log K)], shape (B,).

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
        member_probs: the members' probabilities, (M, B, K), M >= 2.

    Returns:
        A float in [−1, 1].

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
        member_probs: the members' probabilities, (M, B, K).
        labels: class indices, (B,).

    Returns:
        ``{"accuracy": acc, "nll": nll}``, float64 tensors, shape (M,) each.

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
``"entropy"`` the predictive entropy, ``"mutual_information"`` the epistemic part. The scores
that need logits are :data:`LOGIT_OOD_SCORES`."""


# ------------------------------------------------------------------------------------------------
# OOD scores from logits
# ------------------------------------------------------------------------------------------------


def _check_member_logits(member_logits: Any) -> Tensor:
    """``member_logits`` as float64 (M, B, K), finite."""
    z = _as_tensor(member_logits, "member_logits")
    if not z.is_floating_point():
        raise TypeError(f"member_logits must be floating-point logits (M, B, K), got {z.dtype}")
    if z.dim() != 3:
        hint = "; for a single model pass logits.unsqueeze(0) (M = 1)" if z.dim() == 2 else ""
        raise ValueError(f"member_logits must be 3-D (M, B, K), got shape {tuple(z.shape)}{hint}")
    if z.numel() == 0:
        raise ValueError(
            f"member_logits is empty (shape {tuple(z.shape)}); scores need at least one member, "
            "example and class"
        )
    z = z.to(torch.float64)
    if not torch.isfinite(z).all():
        raise ValueError(
            "member_logits contains NaN or inf; these scores need the model's finite logits "
            "(collect(model, loader, logits=True)), not log-probabilities"
        )
    return z


def max_logit_score(member_logits: Any) -> Tensor:
    """OOD score of the maximum logit (Hendrycks et al., 2022) of the members' mean logit.

        s(x) = −max_k z̄_k,     z̄ = (1/M) Σ_m z_m

    higher = more likely OOD. The members' logits are averaged first, as torch-uncertainty's
    ``MaxLogitCriterion`` does; for M = 1 it is the plain max logit. Not invariant to a shift of
    the logits: compare it only between outputs of one model.

    Args:
        member_logits: the members' logits, (M, B, K).

    Returns:
        Float64 scores, shape (B,).

    Raises:
        TypeError: if ``member_logits`` is not floating point.
        ValueError: if it is not 3-D, is empty, or holds NaN or inf.

    >>> max_logit_score(torch.tensor([[[2.0, 0.0]], [[0.0, 1.0]]]))
    tensor([-1.], dtype=torch.float64)
    """
    return -_check_member_logits(member_logits).mean(0).amax(-1)


def energy_score(member_logits: Any) -> Tensor:
    """OOD score of the free energy (Liu et al., 2020) of the members' mean logit, at T = 1.

        s(x) = E(x) = −log Σ_k exp(z̄_k),     z̄ = (1/M) Σ_m z_m

    higher = more likely OOD. The convention is torch-uncertainty's ``EnergyCriterion``
    (``−logsumexp`` of the members' mean logit), so the numbers compare across libraries; for
    M = 1 it is the plain energy.

    Args:
        member_logits: the members' logits, (M, B, K).

    Returns:
        Float64 scores, shape (B,).

    Raises:
        TypeError: if ``member_logits`` is not floating point.
        ValueError: if it is not 3-D, is empty, or holds NaN or inf.

    >>> energy_score(torch.zeros(1, 1, 4))  # −log 4
    tensor([-1.3863], dtype=torch.float64)
    """
    return -torch.logsumexp(_check_member_logits(member_logits).mean(0), dim=-1)


LOGIT_OOD_SCORES: dict[str, Callable[[Any], Tensor]] = {
    "max_logit": max_logit_score,
    "energy": energy_score,
}
"""OOD scores from member logits (M, B, K) to per-example scores (B,), higher = more likely OOD,
of the members' mean logit z̄: ``"max_logit"`` −max_k z̄_k, ``"energy"`` −log Σ_k exp z̄_k.
Logits, not probabilities: softmax removes the scale these scores read."""
