"""The training objective, written once for every training loop of snens.

    loss = ensemble_loss(ens(x), y) + diversity_loss(ens, τ, λ)    (second term if λ > 0)

:func:`training_loss` computes it from a batch's logits and returns it with its parts. The
engine's step (:func:`snens.engine.epoch.run_epoch`), the Hugging Face ``SnensTrainer``
(:mod:`snens.integrations.huggingface`) and the Lightning ``SnensModule``
(:mod:`snens.integrations.lightning`) all differentiate it, each with an optimizer over
:func:`snens.param_groups`. A loss that is NaN or infinite stops them before the update,
with a :class:`NonFiniteLossError` whose message names the step and
:func:`nonfinite_cause`, the likely cause; :func:`check_finite` is that stop for the loops
that check the loss alone (the engine also checks the gradient norm, in the same read).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from snens.method.loss import check_labels, check_loss_inputs, member_cross_entropy
from snens.method.regularizer import (
    DEFAULT_DIVERSITY_WEIGHT,
    DEFAULT_TEMPERATURE,
    LayerSelection,
    diversity_loss,
)

__all__ = [
    "NonFiniteLossError",
    "TrainingLoss",
    "check_finite",
    "nonfinite_cause",
    "training_loss",
]


class NonFiniteLossError(ValueError):
    """The loss or the gradient became NaN or infinite; the message names the step and cause."""


class TrainingLoss(NamedTuple):
    """A training step's loss and its parts, scalar tensors."""

    #: What is differentiated.
    total: Tensor
    #: The mean member cross-entropy, float32.
    task: Tensor
    #: The diversity loss; None at λ = 0.
    diversity: Tensor | None


def training_loss(
    model: nn.Module,
    logits: Tensor,
    labels: Tensor,
    *,
    temperature: float | None = None,
    weight: float | None = None,
    layers: LayerSelection = None,
    label_smoothing: float = 0.0,
    host_labels: Tensor | None = None,
    task_value: bool = False,
) -> TrainingLoss:
    """The σN-Ens loss of a batch, ``ensemble_loss + diversity_loss``, and its parts.

        total = ensemble_loss(logits, labels) + diversity_loss(model, τ, λ, layers)

    The second term is left out at λ = 0. The task loss is computed in float32 whatever the
    logits' dtype.

    Args:
        model: the ensemble whose member norms the diversity loss regularizes (unwrapped from
            any data-parallel or accelerator wrapper).
        logits: the ensemble's output on the batch.
        labels: class indices, on the logits' device.
        temperature: τ of the diversity loss; None (the default): the ensemble's
            ``snens_config.temperature`` (:class:`snens.SnensConfig`), or
            :data:`~snens.method.regularizer.DEFAULT_TEMPERATURE` for another model.
        weight: λ; 0 trains on the task loss alone; None (the default): the ensemble's
            ``snens_config.diversity_weight``, or ``DEFAULT_DIVERSITY_WEIGHT``.
        layers: which member norms to regularize (see :func:`snens.diversity_loss`).
        label_smoothing: of the task loss, in [0, 1].
        host_labels: the same labels on the host, as the data loader made them: their range
            is checked there instead (on a GPU, checking ``labels`` reads them back, a device
            sync each step).
        task_value: give ``total`` the task loss's value and the whole loss's gradient,
            ``task + (div − div.detach())``: a trainer that logs the loss it differentiates
            then logs the readable task loss (the diversity loss is a sum over features, with
            a constant −M·log M each).

    Returns:
        ``TrainingLoss(total, task, diversity)``, scalar tensors; ``diversity`` is None at
        λ = 0, and ``total`` is then ``task`` itself.

    Shape:
        logits: (M, B, K), or (M, B/M, K) from ``split`` training. labels: (B,).

    Raises:
        TypeError, ValueError: as :func:`snens.ensemble_loss` for the logits, labels and
            label smoothing, and as :func:`snens.diversity_loss` for τ, λ and the layers.
    """
    config = getattr(model, "snens_config", None)
    if temperature is None:
        temperature = DEFAULT_TEMPERATURE if config is None else config.temperature
    if weight is None:
        weight = DEFAULT_DIVERSITY_WEIGHT if config is None else config.diversity_weight
    check_loss_inputs(logits, label_smoothing)
    if host_labels is None:
        labels = check_labels(labels, logits.shape[2])
    else:
        check_labels(host_labels, logits.shape[2])
    task = member_cross_entropy(logits.float(), labels, label_smoothing)
    if weight == 0:
        return TrainingLoss(task, task, None)
    div = diversity_loss(model, temperature, weight, layers)
    total = task + (div - div.detach()) if task_value else task + div
    return TrainingLoss(total, task, div)


def nonfinite_cause(
    model: nn.Module,
    inputs: Any,
    loss: TrainingLoss,
    *,
    temperature: float,
    remedy: str,
    precision: str | None = None,
) -> str:
    """The likely cause of a NaN or infinite loss, for a :class:`NonFiniteLossError`.

    Looked for in this order: NaN or infinite values in the batch's floating inputs; in the
    parameters (an earlier update diverged); a task loss that is not finite while both are
    (the logits overflowed); otherwise the diversity loss.

    Args:
        model: the model trained; its parameters are read.
        inputs: the batch's inputs: a tensor, or a mapping of keyword inputs.
        loss: the step's :func:`training_loss`.
        temperature: τ, named when the diversity loss is the cause.
        remedy: what to change, in the words of the caller's settings (``"lower optim.lr or
            set optim.grad_clip"``).
        precision: the reduced-precision setting that is on, named as a further remedy when
            the logits overflowed (``"optim.bf16"``); None when there is none.

    Returns:
        The cause and its remedy, a clause for an error message.
    """
    if isinstance(inputs, Mapping):
        bad = [
            name
            for name, value in inputs.items()
            if isinstance(value, Tensor)
            and value.is_floating_point()
            and not torch.isfinite(value).all()
        ]
        if bad:
            return f"the batch's {', '.join(map(repr, bad))} hold NaN or inf values; check the data"
    elif (
        isinstance(inputs, Tensor)
        and inputs.is_floating_point()
        and not torch.isfinite(inputs).all()
    ):
        return "the input batch holds NaN or inf values; check the data"
    if any(not torch.isfinite(p).all() for p in model.parameters()):
        return f"the parameters hold NaN or inf values: an earlier update diverged; {remedy}"
    if not torch.isfinite(loss.task):
        return (
            f"the task loss is {loss.task.item()} with finite inputs and parameters: the logits "
            f"overflowed; {remedy}" + (f", or turn off {precision}" if precision else "")
        )
    diversity = "off" if loss.diversity is None else loss.diversity.item()
    return f"the diversity loss is {diversity} at temperature {temperature}"


def check_finite(
    loss: TrainingLoss,
    model: nn.Module,
    inputs: Any,
    *,
    where: str,
    temperature: float,
    remedy: str,
    precision: str | None = None,
) -> None:
    """Stop a training step whose loss is NaN or infinite, before its backward pass.

    One read of the loss from the device. An optimizer step on a non-finite loss would turn
    every parameter NaN, and a trainer that leaves NaN steps out of its logged loss would go
    on training without a word.

    Args:
        loss: the step's :func:`training_loss`.
        model, inputs, temperature, remedy, precision: as :func:`nonfinite_cause` reads them.
        where: the step, for the message (``"step 3 of 100"``).

    Raises:
        NonFiniteLossError: the loss is NaN or infinite; the message names ``where``, the
            task and diversity losses and the likely cause.
    """
    if bool(torch.isfinite(loss.total)):
        return
    cause = nonfinite_cause(
        model, inputs, loss, temperature=temperature, remedy=remedy, precision=precision
    )
    diversity = "off" if loss.diversity is None else loss.diversity.item()
    raise NonFiniteLossError(
        f"non-finite loss at {where}: task loss {loss.task.item()}, diversity loss {diversity}; "
        f"cause: {cause}. Training stopped before this step's update"
    )
