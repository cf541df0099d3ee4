"""snens: σN-Ens, sigma-Norm implicit ensembles with temperature-controlled diversity.

ens = snens.convert(model, num_members=4)      # (B, …) -> logits (M, B, K)
loss = snens.ensemble_loss(ens(x), y) + snens.diversity_loss(ens, temperature=1.0)
probs = snens.predictive_probs(ens(x))         # (B, K)

config = snens.SnensConfig(num_members=4, temperature=5.0, diversity_weight=0.01)
ens = snens.convert(model, config)             # ens.snens_config is config
loss = snens.training_loss(ens, ens(x), y).total   # the same loss, τ and λ from the config
"""

from snens import baselines, metrics, models, nn
from snens.evaluation.calibration import TemperatureScaled, fit_calibrator, fit_temperature
from snens.evaluation.protocol import evaluate
from snens.method.allocation import LayerAllocation, allocation, mean_effective_members
from snens.method.config import SnensConfig
from snens.method.convert import convert
from snens.method.ensemble import (
    Ensemble,
    extract_member,
    fold_members,
    forward_repeated,
    predictive_probs,
    unfold_members,
)
from snens.method.export import export, export_onnx
from snens.method.loss import ensemble_loss
from snens.method.optim import param_groups
from snens.method.regularizer import (
    diversity_gain,
    diversity_loss,
    diversity_penalty,
    optimal_k,
    tau_for_k,
)
from snens.method.step import training_loss

__version__ = "0.1.0"

__all__ = [
    "Ensemble",
    "LayerAllocation",
    "SnensConfig",
    "TemperatureScaled",
    "allocation",
    "baselines",
    "convert",
    "diversity_gain",
    "diversity_loss",
    "diversity_penalty",
    "ensemble_loss",
    "evaluate",
    "export",
    "export_onnx",
    "extract_member",
    "fit_calibrator",
    "fit_temperature",
    "fold_members",
    "forward_repeated",
    "mean_effective_members",
    "metrics",
    "models",
    "nn",
    "optimal_k",
    "param_groups",
    "predictive_probs",
    "tau_for_k",
    "training_loss",
    "unfold_members",
]
