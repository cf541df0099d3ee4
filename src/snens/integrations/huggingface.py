"""A Hugging Face ``Trainer`` for σN-Ens ensembles.

    ens = snens.convert(model, num_members=4)
    trainer = SnensTrainer(model=ens, args=TrainingArguments(...), train_dataset=...,
                           eval_dataset=..., compute_metrics=..., temperature=1.0,
                           diversity_weight=0.1, gamma_lr_multiplier=30.0)
    trainer.train()

What it changes in ``transformers.Trainer``, and why a plain ``Trainer`` cannot train an
:class:`~snens.Ensemble`:

* **columns**: ``Trainer`` keeps the batch columns named in ``model.forward``'s signature; an
  ensemble's is ``(*args, **kwargs)``, so every column would be dropped. A plain ``Trainer``
  on a converted model therefore fails with "The batch received was empty, your model won't
  be able to train on it. Double-check that your training dataset contains keys expected by
  the model: args,kwargs,label,label_ids,labels" (a ``datasets.Dataset``), or hands the
  wrapped model nothing but ``labels`` (a torch ``Dataset``): use ``SnensTrainer``, which
  reads the wrapped model's signature (``ens.model.forward``), so
  ``remove_unused_columns=True`` keeps ``input_ids``, ``attention_mask``, … and the labels.
  (Even with every column kept, a plain ``Trainer`` would pass the labels into the model and
  take ``outputs[0]``, the first member's logits, as the loss.)
* **loss**: ``ensemble_loss(logits (M, B, K), labels) + diversity_loss(ens, τ, λ)``, with
  ``args.label_smoothing_factor`` as the label smoothing (applied here, in the ensemble loss:
  ``Trainer``'s own label smoother reads ``model.config``, which an ensemble has not). The
  labels are taken out of the batch (``"labels"``, or ``args.label_names``; the default
  collator renames ``"label"``) and never reach the model.
* **non-finite loss**: a NaN or infinite loss stops training with
  :class:`snens.engine.epoch.NonFiniteLossError`, naming the step and the likely cause (NaN inputs,
  diverged parameters, overflowing logits), before that step's update, as the snens engine
  does. ``Trainer`` alone goes on: with ``logging_nan_inf_filter`` (its default) it leaves
  the NaN steps out of the logged loss, so NaN inputs trained every parameter to NaN while
  reporting ``training_loss 0.0``.
* **logged loss**: the task loss, ~ln K at the start. The diversity loss is a sum over
  features with a constant −M·log M each (≈ −90 at λ = 1e-2 for MiniLM), so a logged sum
  would be unreadable; it still enters the gradient, and the per-feature gain over equal
  sharing, :func:`snens.diversity_gain`, is logged beside the loss as ``diversity_gain``.
* **optimizer**: the class ``args.optim`` names (AdamW by default) over
  :func:`snens.param_groups` (``"decay"``, ``"no_decay"``, ``"gamma"``), γ at
  ``args.learning_rate × gamma_lr_multiplier`` without weight decay; the learning-rate
  schedule scales every group alike.
* **evaluation and prediction**: the ensemble's prediction, the mean of the M members'
  softmaxes. ``compute_metrics`` (and ``trainer.predict(...).predictions``) receives those
  mean probabilities, (N, K), summing to 1 over K; ``eval_loss`` is their negative
  log-likelihood, the ensemble's NLL (at most the mean member cross-entropy).

Needs ``transformers`` and ``accelerate``: ``pip install 'snens[huggingface]'``.
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

try:
    import transformers
except ImportError as error:
    raise ImportError(
        "snens.integrations.huggingface needs transformers and accelerate: "
        "pip install 'snens[huggingface]'"
    ) from error
if importlib.util.find_spec("accelerate") is None:
    raise ImportError(
        "snens.integrations.huggingface needs accelerate (transformers.Trainer runs on it): "
        "pip install 'snens[huggingface]'"
    )

import torch
from torch import Tensor, nn

from snens.engine.epoch import NonFiniteLossError
from snens.method.ensemble import Ensemble, ensemble_loss, predictive_probs
from snens.method.optim import GAMMA_LR_MULTIPLIER, param_groups
from snens.method.regularizer import (
    DEFAULT_DIVERSITY_WEIGHT,
    DEFAULT_TEMPERATURE,
    LayerSelection,
    diversity_gain,
    diversity_loss,
)
from snens.metrics import nll

__all__ = ["SnensTrainer"]


class SnensTrainer(transformers.Trainer):
    """``transformers.Trainer`` training a :class:`snens.Ensemble` with the σN-Ens loss.

    Loss of a training batch: ``ensemble_loss(ens(**inputs), labels, label_smoothing) +
    diversity_loss(ens, temperature, diversity_weight, diversity_layers)``; the value logged as
    ``loss`` is the first term, with ``diversity_gain`` beside it. See the module docstring for
    the columns kept, the optimizer groups and what evaluation returns.

    Args:
        model: the ensemble, from :func:`snens.convert`.
        args: ``transformers.TrainingArguments``; ``learning_rate`` and ``weight_decay`` set the
            "decay" group, ``label_smoothing_factor`` the label smoothing.
        temperature: τ of the diversity loss.
        diversity_weight: λ; 0 trains on the task loss alone.
        gamma_lr_multiplier: γ's learning rate over ``args.learning_rate``.
        diversity_layers: which member norms the diversity loss regularizes (see
            :func:`snens.diversity_loss`); None: all.
        **kwargs: the other ``transformers.Trainer`` arguments (``train_dataset``,
            ``eval_dataset``, ``data_collator``, ``compute_metrics``, ``callbacks``, …).

    Shape:
        Batches: the wrapped model's keyword inputs, (B, …), and labels (B,). Predictions:
        (N, K) mean probabilities.

    Raises:
        TypeError: ``model`` is not a :class:`snens.Ensemble` (a plain ``transformers.Trainer``
            cannot train one either: see the module docstring).
        ValueError: ``compute_loss_func`` given (the loss is the σN-Ens loss), more than one
            label name, more than one GPU in one process (DataParallel), a
            ``label_smoothing_factor`` outside [0, 1), or a temperature, weight or layer
            selection that :func:`snens.diversity_loss` refuses.
        NonFiniteLossError: while training, a NaN or infinite loss (the step and the cause
            named); nothing of that step is applied.
    """

    def __init__(
        self,
        model: Ensemble,
        args: transformers.TrainingArguments | None = None,
        *,
        temperature: float = DEFAULT_TEMPERATURE,
        diversity_weight: float = DEFAULT_DIVERSITY_WEIGHT,
        gamma_lr_multiplier: float = GAMMA_LR_MULTIPLIER,
        diversity_layers: LayerSelection = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(model, Ensemble):
            raise TypeError(
                f"SnensTrainer trains a snens.Ensemble, got {type(model).__name__}; build one "
                "with ens = snens.convert(model, num_members=4) and pass model=ens"
            )
        if kwargs.get("compute_loss_func") is not None:
            raise ValueError(
                "SnensTrainer computes the σN-Ens loss itself (ensemble_loss + diversity_loss); "
                "drop compute_loss_func, or subclass SnensTrainer and override compute_loss"
            )
        if kwargs.get("model_init") is not None:
            raise ValueError(
                "SnensTrainer takes the ensemble as model=; model_init is not supported: build "
                "the ensemble with snens.convert before creating the trainer"
            )
        with torch.no_grad():  # refuse a bad τ, λ or layer selection now, not at step 1
            diversity_loss(model, temperature, diversity_weight, diversity_layers)
        smoothing = 0.0 if args is None else args.label_smoothing_factor
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(
                f"TrainingArguments(label_smoothing_factor={smoothing!r}) must lie in [0, 1); "
                "0 trains on the hard labels"
            )
        self.temperature = temperature
        self.diversity_weight = diversity_weight
        self.gamma_lr_multiplier = gamma_lr_multiplier
        self.diversity_layers = diversity_layers
        # Trainer.__init__ builds a label smoother when label_smoothing_factor is set, reading
        # model.config, which an ensemble has not (AttributeError); compute_loss applies the
        # smoothing itself, so Trainer is shown 0 while it is built and the value is restored.
        if smoothing:
            args.label_smoothing_factor = 0.0
        try:
            super().__init__(model=model, args=args, **kwargs)
        finally:
            if smoothing:
                args.label_smoothing_factor = smoothing
        # refuse a bad multiplier now, not when training builds the optimizer
        param_groups(model, self.args.learning_rate, self.args.weight_decay, gamma_lr_multiplier)
        if self.args.n_gpu > 1:
            raise ValueError(
                f"SnensTrainer sees {self.args.n_gpu} GPUs in one process, and "
                "torch.nn.DataParallel would gather the (M, B, K) logits along M; launch one "
                "process per GPU (torchrun --nproc_per_node=N) or make one GPU visible "
                "(CUDA_VISIBLE_DEVICES=0)"
            )
        # The ensemble's forward takes **kwargs, which Trainer reads as "accepts
        # num_items_in_batch"; the wrapped model would then receive it and fail.
        self.model_accepts_loss_kwargs = False
        names = list(self.args.label_names or ["labels"])
        if len(names) != 1:
            raise ValueError(
                f"SnensTrainer trains a classifier on one label column, got label_names={names}; "
                "pass TrainingArguments(label_names=['labels'])"
            )
        self.label_names = names

    # -- columns ---------------------------------------------------------------------------------
    def _set_signature_columns_if_needed(self) -> None:
        # Trainer keeps the columns named in model.forward's signature; the ensemble's is
        # (*args, **kwargs), so name the wrapped model's parameters instead.
        if self._signature_columns is not None:
            return
        forward = self.accelerator.unwrap_model(self.model).model.forward
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        names = [
            n for n, p in inspect.signature(forward).parameters.items() if p.kind not in variadic
        ]
        if not names:
            raise ValueError(
                f"{type(self.model.model).__name__}.forward names no parameters, so the batch "
                "columns it uses are unknown; pass TrainingArguments(remove_unused_columns=False)"
            )
        self._signature_columns = [*names, *sorted({"label", "label_ids", *self.label_names})]

    def _split_labels(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], Tensor]:
        (name,) = self.label_names
        if inputs.get(name) is None:
            raise ValueError(
                f"the batch holds no {name!r} (keys: {sorted(inputs)}); give every example a "
                f"'label' or {name!r} entry, or name the label column with "
                "TrainingArguments(label_names=[...])"
            )
        return {k: v for k, v in inputs.items() if k != name}, inputs[name]

    # -- loss ------------------------------------------------------------------------------------
    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The σN-Ens loss of a batch: its value is the task loss, its gradient the total's.

        Returns ``task + (div − div.detach())``: the bracket is exactly 0 in value and has the
        diversity loss's gradient, so Trainer's backward, gradient-accumulation scaling and
        logged ``loss`` all see the readable task loss while γ feels the regularizer.
        ``num_items_in_batch`` is not used: the task loss is a mean over the batch.

        Raises:
            NonFiniteLossError: the loss is NaN or infinite, before the backward pass; the
                message names the step and the likely cause.
        """
        inputs, labels = self._split_labels(inputs)
        logits = model(**inputs)  # (M, B, K), or (M, B/M, K) with input_policy="split"
        task = ensemble_loss(logits, labels, label_smoothing=self.args.label_smoothing_factor)
        loss = task
        div = None
        if self.diversity_weight > 0:
            div = diversity_loss(
                self.accelerator.unwrap_model(model),
                self.temperature,
                self.diversity_weight,
                self.diversity_layers,
            )
            loss = loss + (div - div.detach())
        # One host sync per step (Trainer's NaN filter of the logged loss syncs as well): a
        # non-finite loss would turn every parameter NaN at the optimizer step.
        if not bool(torch.isfinite(loss)):
            self._stop_on_nonfinite(model, inputs, task, div)
        return (loss, logits) if return_outputs else loss

    def _stop_on_nonfinite(
        self, model: nn.Module, inputs: dict[str, Any], task: Tensor, div: Tensor | None
    ) -> None:
        """Raise :class:`NonFiniteLossError` naming the step and the likely cause."""
        bad = [
            name
            for name, value in inputs.items()
            if isinstance(value, Tensor)
            and value.is_floating_point()
            and not torch.isfinite(value).all()
        ]
        unwrapped = self.accelerator.unwrap_model(model)
        if bad:
            cause = (
                f"the batch's {', '.join(map(repr, bad))} hold NaN or inf values; check the data"
            )
        elif any(not torch.isfinite(p).all() for p in unwrapped.parameters()):
            cause = (
                "the parameters hold NaN or inf values: an earlier update diverged; lower "
                "learning_rate or set max_grad_norm"
            )
        elif not torch.isfinite(task):
            cause = (
                f"the task loss is {task.item()} with finite inputs and parameters: the logits "
                "overflowed; lower learning_rate or set max_grad_norm"
                + (", or turn off bf16/fp16" if self.args.bf16 or self.args.fp16 else "")
            )
        else:
            cause = f"the diversity loss is {div.item()} at temperature {self.temperature}"
        diversity = "off" if div is None else f"{div.item()}"
        steps = f" of {self.state.max_steps}" if self.state.max_steps else ""
        raise NonFiniteLossError(
            f"non-finite loss at step {self.state.global_step + 1}{steps}: "
            f"task loss {task.item()}, diversity loss {diversity}; cause: {cause}. Training "
            "stopped before this step's update"
        )

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """Adds ``diversity_gain`` (:func:`snens.diversity_gain`, nats per feature) to each
        training log, the one holding ``loss``."""
        if "loss" in logs:
            logs["diversity_gain"] = diversity_gain(
                self.accelerator.unwrap_model(self.model), self.temperature, self.diversity_layers
            )
        super().log(logs, *args, **kwargs)

    # -- optimizer -------------------------------------------------------------------------------
    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """The optimizer ``args.optim`` names over :func:`snens.param_groups`.

        Groups: "decay" (``args.weight_decay``), "no_decay" (norms, biases) and "gamma"
        (``args.learning_rate × gamma_lr_multiplier``, no weight decay). An optimizer passed
        as ``optimizers=(optimizer, scheduler)`` is kept as it is.
        """
        if self.optimizer is None:
            opt_model = self.model if model is None else model
            groups = param_groups(
                opt_model, self.args.learning_rate, self.args.weight_decay, self.gamma_lr_multiplier
            )
            if self.optimizer_cls_and_kwargs is not None:
                optimizer_cls, optimizer_kwargs = self.optimizer_cls_and_kwargs
            else:
                optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(
                    self.args, opt_model
                )
            optimizer_kwargs = dict(optimizer_kwargs)
            for key in ("params", "model", "optimizer_dict"):
                if key in optimizer_kwargs:
                    raise ValueError(
                        f"optim={self.args.optim!r} builds its own parameter groups, which "
                        "would replace snens.param_groups (γ's group); use an optimizer that "
                        "takes parameter groups, such as optim='adamw_torch'"
                    )
            # each group carries its own lr and weight_decay, which override these defaults
            self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    # -- evaluation ------------------------------------------------------------------------------
    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The ensemble's mean prediction on a batch, in eval mode (every member, every row).

        Returns:
            ``(loss, probs, labels)``: the NLL of the mean prediction (None without labels),
            the mean probabilities ``snens.predictive_probs(logits)`` (B, K), and the labels.
        """
        inputs = self._prepare_inputs(inputs)
        (name,) = self.label_names
        labels = inputs.get(name)
        features = {k: v for k, v in inputs.items() if k != name}
        with torch.no_grad(), self.compute_loss_context_manager():
            probs = predictive_probs(model(**features))  # (M, B, K) -> (B, K)
        loss = None if labels is None else torch.tensor(nll(probs, labels), device=probs.device)
        if prediction_loss_only:
            return loss, None, None
        return loss, probs, labels
