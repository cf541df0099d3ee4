"""A Lightning module for σN-Ens ensembles.

    module = SnensModule(snens.convert(model, num_members=4), lr=3e-3, temperature=1.0)
    lightning.pytorch.Trainer(max_epochs=10).fit(module, train_loader, val_loader)

Reload with ``SnensModule.load_from_checkpoint(ckpt, ensemble=snens.convert(fresh_model, M))``
(with the ``norms=`` and ``head=`` the trained ensemble was converted with).
Batches are ``(x, y)``, ``(inputs, y)`` with ``inputs`` a dict of keyword inputs, or such a dict
holding ``"labels"`` (or ``"label"``). Needs Lightning 2: ``pip install 'snens[lightning]'``.
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

from snens.method.config import SnensConfig
from snens.method.ensemble import Ensemble, predictive_probs
from snens.method.optim import param_groups
from snens.method.regularizer import LayerSelection, diversity_gain, diversity_loss
from snens.method.step import check_finite, training_loss
from snens.metrics import accuracy, nll

__all__ = ["SnensModule"]

#: The checkpoint entry holding M and whether a function chose the regularized layers.
CHECKPOINT_KEY = "snens"

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


def _other_options(saved: Any, config: SnensConfig) -> dict[str, Any]:
    """The ``norms=`` and ``head=`` of the checkpoint's config (``saved``, a dict) that differ
    from the ensemble's ``config``, as the checkpoint's."""
    if not isinstance(saved, dict):
        return {}  # a checkpoint written before the config was kept
    given = config.to_dict()
    return {
        key: saved.get(key, default)
        for key, default in (("norms", None), ("head", "auto"))
        if saved.get(key, default) != given[key]
    }


class SnensModule(LightningModule):
    """A ``LightningModule`` training a :class:`snens.Ensemble` with the σN-Ens loss.

    Logs ``train_loss`` (the task loss), ``diversity_gain``, and ``val_loss``, ``val_accuracy``
    (``test_*`` in testing) of the ensemble's mean prediction. ``lr`` and ``weight_decay`` set the
    "decay" group; ``temperature`` (τ), ``diversity_weight`` (λ) and ``gamma_lr_multiplier``
    default to the ensemble's ``snens_config``; ``optimizer`` is called with the parameter groups.

    Raises:
        TypeError: ``ensemble`` is missing or not a :class:`snens.Ensemble`.
        ValueError: settings :func:`snens.param_groups` or :func:`snens.diversity_loss` refuses;
            on loading, a checkpoint of another M, of weights that do not fit, or with chosen
            layers not passed again.
    """

    def __init__(
        self,
        ensemble: Ensemble | None = None,
        *,
        lr: float,
        weight_decay: float = 0.0,
        gamma_lr_multiplier: float | None = None,
        temperature: float | None = None,
        diversity_weight: float | None = None,
        diversity_layers: LayerSelection = None,
        label_smoothing: float = 0.0,
        optimizer: OptimizerFactory = torch.optim.AdamW,
    ) -> None:
        super().__init__()
        if ensemble is None:
            raise TypeError(
                "SnensModule needs the ensemble: SnensModule(snens.convert(model, num_members=4), "
                "lr=...); to reload a checkpoint, SnensModule.load_from_checkpoint(path, "
                "ensemble=snens.convert(fresh_model, M)) with the M it was trained with"
            )
        if not isinstance(ensemble, Ensemble):
            raise TypeError(
                f"SnensModule trains a snens.Ensemble, got {type(ensemble).__name__}; build one "
                "with snens.convert(model, num_members=4)"
            )
        # code (the optimizer factory, a layer-selecting function) is what Lightning's reload
        # (torch.load(weights_only=True)) refuses
        ignore = ["ensemble", "optimizer"]
        if callable(diversity_layers):
            ignore.append("diversity_layers")
        self.save_hyperparameters(ignore=ignore)
        # None: the ensemble's SnensConfig's value; the checkpoint keeps the values in force
        config = ensemble.snens_config
        for name, value in (
            ("gamma_lr_multiplier", gamma_lr_multiplier),
            ("temperature", temperature),
            ("diversity_weight", diversity_weight),
        ):
            setattr(self, name, getattr(config, name) if value is None else value)
            self.hparams[name] = getattr(self, name)
        # refuse bad settings now, not at the first step
        param_groups(ensemble, lr, weight_decay, self.gamma_lr_multiplier)
        with torch.no_grad():
            diversity_loss(ensemble, self.temperature, self.diversity_weight, diversity_layers)
        self.ensemble = ensemble
        self.lr = lr
        self.weight_decay = weight_decay
        self.diversity_layers = diversity_layers
        self.label_smoothing = label_smoothing
        self.optimizer_factory = optimizer

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Saves M, and whether a function chose the regularized layers."""
        config = self.ensemble.snens_config.replace(
            temperature=self.temperature,
            diversity_weight=self.diversity_weight,
            gamma_lr_multiplier=self.gamma_lr_multiplier,
        )
        checkpoint[CHECKPOINT_KEY] = {
            "num_members": self.ensemble.num_members,
            "layers_chosen_by_function": callable(self.diversity_layers),
            "config": config.to_dict(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuses a checkpoint this module cannot hold, before its weights are loaded.

        Raises:
            ValueError: another M; a tensor of another shape (naming the ``norms=`` or ``head=``
                the checkpoint was converted with, where the ensemble given differs); layers
                chosen by a function not passed again.
        """
        saved = checkpoint.get(CHECKPOINT_KEY, {})
        num_members = saved.get("num_members", self.ensemble.num_members)
        if num_members != self.ensemble.num_members:
            raise ValueError(
                f"the checkpoint holds an ensemble of num_members={num_members}, the ensemble "
                f"given has {self.ensemble.num_members}; pass "
                f"ensemble=snens.convert(fresh_model, {num_members})"
            )
        if saved.get("layers_chosen_by_function") and self.diversity_layers is None:
            raise ValueError(
                "the checkpoint was trained with diversity_layers a function, which is not "
                "saved; pass the same function again: load_from_checkpoint(path, ensemble=..., "
                "diversity_layers=...)"
            )
        # names missing or unexpected are Lightning's to judge (strict=False allows them);
        # a tensor of another shape never loads
        expected = self.state_dict()
        wrong = [
            f"{k} {tuple(v.shape)} saved, {tuple(expected[k].shape)} here"
            for k, v in checkpoint.get("state_dict", {}).items()
            if k in expected and v.shape != expected[k].shape
        ]
        if wrong:
            shown = "; ".join(wrong[:3]) + ("; …" if len(wrong) > 3 else "")
            problem = (
                f"the checkpoint's weights do not fit the ensemble given ({len(wrong)} tensors of "
                f"another shape: {shown})"
            )
            differ = _other_options(saved.get("config"), self.ensemble.snens_config)
            if differ:
                options = ", ".join(f"{key}={value!r}" for key, value in differ.items())
                raise ValueError(
                    f"{problem}: it was converted with {options}; pass ensemble=snens.convert("
                    f"fresh_model, {num_members}, {options})"
                )
            raise ValueError(
                f"{problem}; pass ensemble=snens.convert(fresh_model, {num_members}) of the "
                "architecture it was trained from (the same class and configuration), with the "
                "norms= and head= it was converted with"
            )
        if "config" in saved:  # the SnensConfig it trained with (input policy, γ's init, …)
            self.ensemble.snens_config = SnensConfig.from_dict(saved["config"])

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.ensemble(*args, **kwargs)  # (M, B, K)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """The σN-Ens loss of the batch.

        Raises:
            NonFiniteLossError: the loss is NaN or infinite, before the backward pass.
        """
        args, kwargs, labels = _unpack(batch, need_labels=True)
        logits = self.ensemble(*args, **kwargs)  # (M, B, K), or (M, B/M, K) with "split"
        loss = training_loss(
            self.ensemble,
            logits,
            labels,
            temperature=self.temperature,
            weight=self.diversity_weight,
            layers=self.diversity_layers,
            label_smoothing=self.label_smoothing,
        )
        check_finite(
            loss,
            self.ensemble,
            args[0] if args else kwargs,
            where=f"epoch {self.current_epoch + 1}, step {self.global_step + 1}",
            temperature=self.temperature,
            remedy="lower lr or set the Trainer's gradient_clip_val",
        )
        size = labels.shape[0]
        self.log("train_loss", loss.task.detach(), prog_bar=True, batch_size=size)
        self.log(
            "diversity_gain",
            diversity_gain(self.ensemble, self.temperature, self.diversity_layers),
            batch_size=size,
        )
        return loss.total

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
