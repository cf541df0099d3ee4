"""Evaluation metrics: accuracy and calibration, selective prediction, OOD detection, and the
ensemble's uncertainty decomposition into aleatoric and epistemic (modulation) parts.

Conventions: ``probs (B, K)`` are predictive probabilities (for an ensemble, the mean of the
member softmaxes), ``labels (B,)`` class indices, ``member_probs (M, B, K)`` the members'
probabilities. Tensors and NumPy arrays are accepted, detached and computed in float64 (on the
CPU for MPS). Scalar metrics return a ``float``, per-example ones a float64 tensor ``(B,)``.
The prediction is the argmax (the first index on ties); entropies are in nats. OOD metrics take
scores, higher = more likely OOD, with OOD as the positive class.
"""

from snens.metrics.ensemble import (
    LOGIT_OOD_SCORES,
    OOD_SCORES,
    disagreement,
    energy_score,
    expected_entropy,
    max_logit_score,
    member_correlation,
    mutual_information,
    per_member,
    predictive_entropy,
)
from snens.metrics.ood import aupr, auroc, fpr_at_95_tpr
from snens.metrics.predictive import accuracy, adaptive_ece, aurc, brier, classwise_ece, ece, nll

__all__ = [
    "LOGIT_OOD_SCORES",
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
    "energy_score",
    "expected_entropy",
    "fpr_at_95_tpr",
    "max_logit_score",
    "member_correlation",
    "mutual_information",
    "nll",
    "per_member",
    "predictive_entropy",
]
