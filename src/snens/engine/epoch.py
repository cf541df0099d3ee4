"""One epoch of training, the step of the engine and of :func:`snens.engine.fit.fit`:

    loss = ensemble_loss(model(x), y) + diversity_loss(model, τ, λ)    (second term if λ > 0)

as :func:`snens.method.step.training_loss` computes it for the integrations too.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from snens.evaluation.predictions import to_device
from snens.method.regularizer import DEFAULT_TEMPERATURE
from snens.method.step import NonFiniteLossError, nonfinite_cause, training_loss

__all__ = ["EpochStats", "NonFiniteLossError", "StepSettings", "run_epoch"]


@dataclass(frozen=True)
class StepSettings:
    """What a training step does besides forward, backward and the optimizer step."""

    temperature: float = DEFAULT_TEMPERATURE  # τ of the diversity loss
    diversity_weight: float = 0.0  # λ; 0 = no diversity loss
    diversity_ramp_steps: int = 0  # λ rises linearly from 0 over these global steps; 0 = none
    diversity_layers: tuple[str, ...] = ()  # member norms regularized, by module name; () = all
    label_smoothing: float = 0.0
    grad_clip: float = 0.0  # max global gradient L2 norm; 0 = none
    bf16: bool = False  # bfloat16 autocast of forward and task loss
    channels_last: bool = False  # 4-d inputs in channels-last memory format
    on_nonfinite: str = "stop"  # "stop": raise NonFiniteLossError; "skip": drop the step


@dataclass(frozen=True)
class EpochStats:
    """Means over one epoch's steps (losses weighted by examples); skipped steps excluded."""

    task_loss: float
    diversity_loss: float
    grad_norm: float
    lr: float  # base learning rate of the epoch's last step
    steps: int  # steps taken, skipped ones included
    skipped: int
    seconds: float


def _diversity_weight(settings: StepSettings, step: int) -> float:
    """λ at global step ``step`` (1-based): λ·min(1, step / ramp), or λ without a ramp."""
    ramp = settings.diversity_ramp_steps
    return settings.diversity_weight * (min(1.0, step / ramp) if ramp > 0 else 1.0)


class _Pace:
    """Progress lines of a long epoch: step, s/step, examples (or tokens, counted from a host
    ``attention_mask``: on a GPU it would sync) per second, time left."""

    def __init__(self, epoch, per_epoch, start, say, every) -> None:
        self.epoch, self.per_epoch, self.say, self.every = epoch, per_epoch, say, every
        self.start = self.last = start
        self.examples = self.tokens = 0

    def count(self, x: Any, y: Any) -> None:
        if self.say is None:
            return
        self.examples += len(y)
        mask = x.get("attention_mask") if isinstance(x, Mapping) else None
        if isinstance(mask, Tensor) and mask.device.type == "cpu":
            self.tokens += int(mask.sum())

    def step(self, done: int) -> None:
        now = time.perf_counter()
        if self.say is None or now - self.last < self.every:
            return
        self.last = now
        seconds = now - self.start
        rate = f"{self.examples / seconds:,.1f} examples/s"
        if self.tokens:
            rate = f"{self.tokens / seconds:,.0f} tokens/s"
        line = f"  epoch {self.epoch + 1}: step {done}/{self.per_epoch}, "
        line += f"{seconds / done:.2f} s/step, {rate}"
        if isinstance(self.per_epoch, int):
            left = seconds / done * (self.per_epoch - done)
            when = f"{left:.0f} s" if left < 120 else f"{left / 60:.0f} min"
            line += f", {when} left in the epoch"
        self.say(line)


def run_epoch(
    model: nn.Module,
    batches: Iterable[tuple[Any, Tensor]],
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    settings: StepSettings,
    *,
    epoch: int,
    step: int = 0,
    forward: Callable[[Any], Tensor] | None = None,
    say: Callable[[str], None] | None = None,
    say_every: float = 60.0,
) -> EpochStats:
    """One pass over ``batches``: forward → loss → backward → clip → optimizer and schedule step.

    ``x`` of a batch may be a mapping of model keyword arguments; ``epoch`` (0-based) and
    ``step`` (taken before) are for messages; ``forward`` computes the logits (default
    ``model``); ``say`` gets a progress line at most every ``say_every`` seconds.

    Raises:
        NonFiniteLossError: with ``on_nonfinite="stop"``, a NaN or infinite loss or gradient
            norm; nothing of that step is applied (``"skip"`` drops the step instead).
    """
    forward = forward or model
    device = next(model.parameters()).device
    trainable = [p for p in model.parameters() if p.requires_grad]
    zero = torch.zeros((), device=device)
    model.train()
    start = time.perf_counter()
    total = div_total = norm_total = torch.zeros((), dtype=torch.float64, device=device)
    count = taken = skipped = 0
    lr = optimizer.param_groups[0]["lr"]
    per_epoch = len(batches) if hasattr(batches, "__len__") else "?"
    pace = _Pace(epoch, per_epoch, start, say, say_every)
    skip = settings.on_nonfinite == "skip"
    for i, (x, y) in enumerate(batches):
        labels = y  # range-checked where the loader made them: on the host, no device sync
        pace.count(x, y)
        x, y = to_device(x, device), to_device(y, device)
        if settings.channels_last and isinstance(x, Tensor) and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        # every buffer (running statistics) and its copy, to undo a skipped step's forward
        saved = [(b, b.detach().clone()) for b in model.buffers()] if skip else []
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.bf16):
            logits = forward(**x) if isinstance(x, Mapping) else forward(x)  # (M, B, K)
            # in float32 and float64 from float32 logits and γ: autocast changes none of it
            parts = training_loss(
                model,
                logits,
                y,
                temperature=settings.temperature,
                weight=_diversity_weight(settings, step + i + 1),
                layers=settings.diversity_layers or None,
                label_smoothing=settings.label_smoothing,
                host_labels=labels,
            )
        loss, task = parts.total, parts.task
        div = zero if parts.diversity is None else parts.diversity
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # a non-finite loss gives non-finite gradients, dropped below
        if settings.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(trainable, settings.grad_clip)
        else:
            grads = [p.grad for p in trainable if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else zero
        # The one host sync of a step: whether to step must see both values.
        if bool(torch.isfinite(loss) & torch.isfinite(norm)):
            problem = None
        elif not torch.isfinite(loss):
            problem = nonfinite_cause(
                model,
                x,
                parts,
                temperature=settings.temperature,
                remedy="lower optim.lr or set optim.grad_clip",
                precision="optim.bf16" if settings.bf16 else None,
            )
        else:
            problem = (
                f"the gradient norm is {norm.item()} with a finite loss {loss.item():.4g}; "
                "lower optim.lr or set optim.grad_clip"
            )
        lr = optimizer.param_groups[0]["lr"]
        if problem is not None:
            optimizer.zero_grad(set_to_none=True)
            where = f"epoch {epoch + 1}, step {i + 1} of {per_epoch} (global step {step + i + 1})"
            if settings.on_nonfinite == "stop":
                raise NonFiniteLossError(
                    f"non-finite loss at {where}: loss {loss.item()}, task loss {task.item()}, "
                    f"diversity loss {div.item()}; cause: {problem}"
                )
            with torch.no_grad():  # skip: undo what the forward pass changed, take no step
                for buffer, copy in saved:
                    buffer.copy_(copy)
            warnings.warn(f"skipped the step at {where}: {problem}", stacklevel=2)
            skipped += 1
        else:
            optimizer.step()
            taken += 1
            batch = len(y)
            # sums on the device, in float64 as Python floats would be: read once per epoch
            total, count = total + task.detach().double() * batch, count + batch
            div_total = div_total + div.detach().double()
            norm_total = norm_total + norm.detach().double()
        schedule.step()  # the schedule follows the batch position, skipped or not
        pace.step(i + 1)
    total, div_total, norm_total = torch.stack([total, div_total, norm_total]).tolist()
    return EpochStats(
        task_loss=total / count if count else math.nan,
        diversity_loss=div_total / taken if taken else math.nan,
        grad_norm=norm_total / taken if taken else math.nan,
        lr=lr,
        steps=taken + skipped,
        skipped=skipped,
        seconds=time.perf_counter() - start,
    )
