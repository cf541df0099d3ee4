"""Training and prediction for a model and batches built by hand, without a run directory (a
run from a config, with checkpoints and the full evaluation: :func:`snens.engine.train.train`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from snens.engine.build import lr_factor
from snens.engine.epoch import StepSettings, run_epoch
from snens.method.optim import GAMMA_LR_MULTIPLIER, param_groups
from snens.method.regularizer import DEFAULT_TEMPERATURE, diversity_gain
from snens.nn.norms import MemberNorm

__all__ = ["TrainResult", "fit", "predict"]


@dataclass(frozen=True)
class TrainResult:
    """What :func:`fit` measured, per epoch: mean task loss, gain over uniform, seconds."""

    task_loss: tuple[float, ...]
    diversity_gain: tuple[float, ...]
    seconds: float


def fit(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    epochs: int,
    lr: float = 3e-3,
    weight_decay: float = 0.0,
    temperature: float = DEFAULT_TEMPERATURE,
    diversity_weight: float = 0.1,
    gamma_lr_multiplier: float = GAMMA_LR_MULTIPLIER,
    log: Callable[[str], None] | None = print,
) -> TrainResult:
    """Train ``model`` with AdamW and a cosine schedule; add the diversity loss for σN-Ens.

    Loss per batch: ``ensemble_loss(model(x), y) + diversity_loss(model, τ, λ)`` (the second
    term only when the model holds member norms), over ``epochs`` passes of the re-iterable
    ``batches``; ``log`` gets one line per epoch (None: silence).

    Raises:
        ValueError: on ``epochs < 1``; :class:`NonFiniteLossError` (a ``ValueError``) on a
            non-finite loss, naming the epoch and step.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    member_norms = any(isinstance(m, MemberNorm) for m in model.modules())
    regularize = member_norms and diversity_weight > 0
    optimizer = torch.optim.AdamW(param_groups(model, lr, weight_decay, gamma_lr_multiplier), lr=lr)
    steps = epochs * len(batches)  # type: ignore[arg-type]
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, functools.partial(lr_factor, total_steps=steps, schedule="cosine")
    )
    settings = StepSettings(
        temperature=temperature, diversity_weight=diversity_weight if regularize else 0.0
    )
    losses, gains, step, start = [], [], 0, time.perf_counter()
    for epoch in range(epochs):
        stats = run_epoch(model, batches, optimizer, schedule, settings, epoch=epoch, step=step)
        step += stats.steps
        losses.append(stats.task_loss)
        gains.append(diversity_gain(model, temperature) if regularize else 0.0)
        if log is not None:
            log(
                f"  epoch {epoch + 1}/{epochs}  loss {losses[-1]:.4f}  "
                f"gain over uniform {gains[-1]:.4f}  {time.perf_counter() - start:.0f}s"
            )
    return TrainResult(tuple(losses), tuple(gains), time.perf_counter() - start)


@torch.no_grad()
def predict(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Member probabilities (M, N, K) in float32 and labels (N,) over all batches, in eval
    mode."""
    model.eval()
    pairs = [(model(x).float().softmax(dim=-1), y) for x, y in batches]
    return torch.cat([p for p, _ in pairs], dim=1), torch.cat([y for _, y in pairs])
