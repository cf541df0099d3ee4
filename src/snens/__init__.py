"""snens: σN-Ens, sigma-Norm implicit ensembles with temperature-controlled diversity.

    ens = snens.convert(model, num_members=4)      # (B, …) -> logits (M, B, K)
    loss = snens.ensemble_loss(ens(x), y) + snens.diversity_loss(ens, temperature=1.0)
    probs = snens.predictive_probs(ens(x))         # (B, K)
"""

from snens.ensemble import Ensemble, convert, ensemble_loss, extract_member, predictive_probs

__version__ = "0.1.0"

__all__ = [
    "Ensemble",
    "convert",
    "ensemble_loss",
    "extract_member",
    "predictive_probs",
]
