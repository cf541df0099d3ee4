"""A Lightning module for σN-Ens ensembles.

    ens = snens.convert(model, num_members=4)
    module = SnensModule(ens, lr=3e-3, temperature=1.0, diversity_weight=0.1)
    lightning.pytorch.Trainer(max_epochs=10).fit(module, train_loader, val_loader)

What :class:`SnensModule` does:

* **training step**: ``ensemble_loss(ens(x), y) + diversity_loss(ens, τ, λ)`` is what it
  returns (and so what is differentiated); it logs the task loss as ``train_loss``, ~ln K at
  the start, and :func:`snens.diversity_gain` as ``diversity_gain``. The diversity loss is a
  sum over features with a constant −M·log M each (≈ −90 on MiniLM at λ = 1e-2), unreadable
  as a log entry.
* **optimizer**: ``optimizer(snens.param_groups(ens, lr, weight_decay, gamma_lr_multiplier))``,
  AdamW by default; γ's group runs at ``lr × gamma_lr_multiplier`` without weight decay.
* **validation and test**: the ensemble's mean prediction (the mean of the M members'
  softmaxes, :func:`snens.predictive_probs`), logged as ``val_loss`` / ``test_loss`` (its NLL)
  and ``val_accuracy`` / ``test_accuracy``, averaged over the epoch by batch size.
* **prediction**: ``trainer.predict`` returns the mean probabilities (B, K) of each batch.

Batches: ``(x, y)`` for image models; ``(inputs, y)`` with ``inputs`` a dict of keyword
inputs (``snens.data.TokenLoader``); or a dict of keyword inputs holding ``"labels"`` (or
``"label"``), as a Hugging Face collator gives them. Prediction also takes inputs without
labels.

Needs Lightning 2: ``pip install 'snens[lightning]'`` (the ``lightning`` package, imported as
``lightning.pytorch``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

try:
    from lightning.pytorch import LightningModule
except ImportError as error:
    raise ImportError(
        "snens.integrations.lightning needs Lightning: pip install 'snens[lightning]'"
    ) from error

import torch
from torch import Tensor

from snens.method.ensemble import Ensemble, ensemble_loss, predictive_probs
from snens.method.optim import GAMMA_LR_MULTIPLIER, param_groups
from snens.method.regularizer import (
    DEFAULT_DIVERSITY_WEIGHT,
    DEFAULT_TEMPERATURE,
    LayerSelection,
    diversity_gain,
    diversity_loss,
)
from snens.metrics import accuracy, nll

__all__ = ["SnensModule"]

OptimizerFactory = Callable[[Iterable[dict]], torch.optim.Optimizer]
_LABEL_KEYS = ("labels", "label")


def _unpack(batch: Any, *, need_labels: bool) -> tuple[tuple, dict, Tensor | None]:
    """``(args, kwargs, labels)`` of a batch, for ``ens(*args, **kwargs)``."""
    if isinstance(batch, Mapping):
        key = next((k for k in _LABEL_KEYS if k in batch), None)
        if key is None and need_labels:
            raise ValueError(
                f"a dict batch needs a 'labels' (or 'label') entry, got keys {sorted(batch)}; "
                "or give batches as (inputs, labels) pairs"
            )
        return (), {k: v for k, v in batch.items() if k != key}, batch.get(key)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        return ((), dict(x), y) if isinstance(x, Mapping) else ((x,), {}, y)
    if isinstance(batch, Tensor) and not need_labels:
        return (batch,), {}, None
    raise TypeError(
        f"cannot read a batch of type {type(batch).__name__}"
        f"{f' of length {len(batch)}' if isinstance(batch, (tuple, list)) else ''}; give "
        "(inputs, labels) pairs, with inputs a tensor or a dict of keyword inputs, or a dict "
        "of keyword inputs holding 'labels'"
    )


class SnensModule(LightningModule):
    """A ``LightningModule`` training a :class:`snens.Ensemble` with the σN-Ens loss.

    Loss of a training batch: ``ensemble_loss(ens(x), y, label_smoothing) +
    diversity_loss(ens, temperature, diversity_weight, diversity_layers)``. Logged:
    ``train_loss`` (the first term), ``diversity_gain``; ``val_loss``, ``val_accuracy``
    (``test_*`` in testing) of the ensemble's mean prediction.

    Args:
        ensemble: the ensemble, from :func:`snens.convert`.
        lr: base learning rate (groups "decay" and "no_decay").
        weight_decay: weight decay of the "decay" group.
        gamma_lr_multiplier: γ's learning rate over ``lr``.
        temperature: τ of the diversity loss.
        diversity_weight: λ; 0 trains on the task loss alone.
        diversity_layers: which member norms to regularize (see :func:`snens.diversity_loss`);
            None: all.
        label_smoothing: of the task loss, in [0, 1].
        optimizer: called with the parameter groups, returns the optimizer; default
            ``torch.optim.AdamW`` (e.g. ``functools.partial(torch.optim.SGD, momentum=0.9)``).
            Each group carries its own ``lr`` and ``weight_decay``. Override
            ``configure_optimizers`` to add a learning-rate schedule.

    Shape:
        ``module(*inputs)``: (B, …) -> logits (M, B, K). Labels: (B,).

    Raises:
        TypeError: ``ensemble`` is not a :class:`snens.Ensemble`.
        ValueError: a learning rate, weight decay or multiplier that :func:`snens.param_groups`
            refuses, or a temperature, weight or layer selection that
            :func:`snens.diversity_loss` refuses.
    """

    def __init__(
        self,
        ensemble: Ensemble,
        *,
        lr: float,
        weight_decay: float = 0.0,
        gamma_lr_multiplier: float = GAMMA_LR_MULTIPLIER,
        temperature: float = DEFAULT_TEMPERATURE,
        diversity_weight: float = DEFAULT_DIVERSITY_WEIGHT,
        diversity_layers: LayerSelection = None,
        label_smoothing: float = 0.0,
        optimizer: OptimizerFactory = torch.optim.AdamW,
    ) -> None:
        super().__init__()
        if not isinstance(ensemble, Ensemble):
            raise TypeError(
                f"SnensModule trains a snens.Ensemble, got {type(ensemble).__name__}; build one "
                "with snens.convert(model, num_members=4)"
            )
        # refuse bad settings now, not at the first step
        param_groups(ensemble, lr, weight_decay, gamma_lr_multiplier)
        with torch.no_grad():
            diversity_loss(ensemble, temperature, diversity_weight, diversity_layers)
        self.ensemble = ensemble
        self.lr = lr
        self.weight_decay = weight_decay
        self.gamma_lr_multiplier = gamma_lr_multiplier
        self.temperature = temperature
        self.diversity_weight = diversity_weight
        self.diversity_layers = diversity_layers
        self.label_smoothing = label_smoothing
        self.optimizer_factory = optimizer

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.ensemble(*args, **kwargs)  # (M, B, K)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        args, kwargs, labels = _unpack(batch, need_labels=True)
        logits = self.ensemble(*args, **kwargs)  # (M, B, K), or (M, B/M, K) with "split"
        task = ensemble_loss(logits, labels, label_smoothing=self.label_smoothing)
        size = labels.shape[0]
        self.log("train_loss", task.detach(), prog_bar=True, batch_size=size)
        self.log(
            "diversity_gain",
            diversity_gain(self.ensemble, self.temperature, self.diversity_layers),
            batch_size=size,
        )
        if self.diversity_weight == 0:
            return task
        return task + diversity_loss(
            self.ensemble, self.temperature, self.diversity_weight, self.diversity_layers
        )

    def _evaluate(self, batch: Any, stage: str) -> None:
        args, kwargs, labels = _unpack(batch, need_labels=True)
        probs = predictive_probs(self.ensemble(*args, **kwargs))  # (M, B, K) -> (B, K)
        size = labels.shape[0]
        # epoch means weighted by batch size; sync_dist averages them over data-parallel ranks
        log = {"prog_bar": True, "batch_size": size, "sync_dist": True}
        self.log(f"{stage}_loss", nll(probs, labels), **log)
        self.log(f"{stage}_accuracy", accuracy(probs, labels), **log)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """The ensemble's mean probabilities (B, K) on the batch's inputs."""
        args, kwargs, _ = _unpack(batch, need_labels=False)
        return predictive_probs(self.ensemble(*args, **kwargs))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """``optimizer(snens.param_groups(...))``: groups "decay", "no_decay" and "gamma"."""
        groups = param_groups(self.ensemble, self.lr, self.weight_decay, self.gamma_lr_multiplier)
        return self.optimizer_factory(groups)
