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
  positive class; :data:`OOD_SCORES` turns member probabilities into such scores,
  :data:`LOGIT_OOD_SCORES` member logits (M, B, K) (max logit and energy of the members' mean
  logit, torch-uncertainty's convention).
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
