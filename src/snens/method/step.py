"""The training objective, written once for every training loop of snens, and the stop of a
step whose loss is NaN or infinite.

    loss = ensemble_loss(ens(x), y) + diversity_loss(ens, τ, λ)    (second term if λ > 0)
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

__all__ = ["NonFiniteLossError", "TrainingLoss", "check_finite", "nonfinite_cause", "training_loss"]


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
    """``ensemble_loss(logits, labels) + diversity_loss(model, τ, λ, layers)`` and its parts.

    Args:
        model: the (unwrapped) ensemble whose member norms the diversity loss regularizes.
        temperature, weight: τ and λ; None: the ensemble's ``snens_config``'s, or the defaults.
        host_labels: the same labels on the host, where their range is checked instead (no
            device sync).
        task_value: give ``total`` the task loss's value and the whole loss's gradient,
            ``task + (div − div.detach())``, for trainers that log the loss they differentiate.

    Returns:
        ``TrainingLoss(total, task, diversity)``; ``diversity`` is None at λ = 0, and ``total``
        is then ``task`` itself.

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
    """The likely cause of a NaN or infinite loss: the batch's inputs (a tensor or a mapping),
    the parameters, the task loss (the logits overflowed), else the diversity loss. ``remedy`` is
    what to change; ``precision`` a reduced-precision setting to name when the logits overflowed.

    Returns:
        The cause and its remedy, a clause for an error message.
    """
    if isinstance(inputs, Mapping):
        bad = [name for name, value in inputs.items() if _nonfinite(value)]
        if bad:
            return f"the batch's {', '.join(map(repr, bad))} hold NaN or inf values; check the data"
    elif _nonfinite(inputs):
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


def _nonfinite(value: Any) -> bool:
    return (
        isinstance(value, Tensor) and value.is_floating_point() and not torch.isfinite(value).all()
    )


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
    """Stop a training step whose loss is NaN or infinite, before its backward pass; ``where``
    names the step (``"step 3 of 100"``), the rest as :func:`nonfinite_cause` reads.

    Raises:
        NonFiniteLossError: the loss is NaN or infinite.
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
