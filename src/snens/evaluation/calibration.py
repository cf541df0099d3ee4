"""Post-hoc temperature scaling of an ensemble's prediction (Guo et al., 2017).

One scalar T > 0 divides every member's logits; it is chosen to minimize the negative
log-likelihood of the ensemble's prediction on held-out **validation** data:

    T* = argmin_T  −(1/N) Σ_i log p̄_T(y_i | x_i)

with, by ``mode``,

* ``"mean_of_softmax"`` (the ensemble's prediction everywhere in snens):
  p̄_T = (1/M) Σ_m softmax(z_m / T);
* ``"logits"`` (logit averaging): p̄_T = softmax(((1/M) Σ_m z_m) / T).

For one model (M = 1) both are ordinary temperature scaling. T > 1 softens overconfident
predictions, T < 1 sharpens underconfident ones; the argmax, hence accuracy, is unchanged in
``"logits"`` mode and for one model (averaging softmaxes can move the argmax slightly).

Fit T on a validation split, never on the test set: a temperature fitted on the data it is
evaluated on reports a calibration the model does not have.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Literal

import torch
from torch import Tensor, nn

__all__ = ["TemperatureScaled", "fit_temperature"]

Mode = Literal["mean_of_softmax", "logits"]
MODES = ("mean_of_softmax", "logits")

# log T is searched in [log 0.01, log 100]: a coarse grid of 0.2 in log T (T steps of 22%)
# finds the basin, golden-section search refines it to 1e-6 in log T.
_LOG_T_BOUNDS = (math.log(1e-2), math.log(1e2))
_GRID_STEP = 0.2
_TOLERANCE = 1e-6
_GOLDEN = (math.sqrt(5) - 1) / 2


def _check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def _check_temperature(temperature: Any) -> float:
    """``temperature`` as a float, or an error saying what a temperature must be.

    Raises:
        TypeError: if it is not a real number (``bool`` included).
        ValueError: if it is not finite and > 0.
    """
    if isinstance(temperature, Tensor) and temperature.numel() == 1:
        temperature = temperature.item()
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number, got {temperature!r}")
    value = float(temperature)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"temperature must be finite and > 0, got {value}; fit one with "
            "snens.evaluation.calibration.fit_temperature(val_logits, val_labels)"
        )
    return value


def _check_inputs(logits: Any, labels: Any) -> tuple[Tensor, Tensor]:
    """Logits as float64 (M, N, K) and labels as int64 (N,), on the logits' device."""
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        got = logits.dtype if isinstance(logits, Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point tensor, got {got}")
    if logits.dim() not in (2, 3):
        raise ValueError(
            "logits must be (N, K) for one model or (M, N, K) for an ensemble's members, got "
            f"shape {tuple(logits.shape)}"
        )
    z = logits.detach()
    z = (z if z.dim() == 3 else z.unsqueeze(0)).double()  # (M, N, K)
    if z.shape[1] == 0 or z.shape[2] < 2:
        raise ValueError(f"logits {tuple(logits.shape)} need at least one example and two classes")
    # -inf is a logit of probability 0 (from log-probabilities): allowed where a row keeps a
    # finite entry, since softmax ignores it.
    if torch.isnan(z).any() or (z == math.inf).any() or not torch.isfinite(z).any(-1).all():
        raise ValueError("logits contain NaN, +inf, or a row with no finite entry")
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.dtype == torch.bool:
        got = labels.dtype if isinstance(labels, Tensor) else type(labels).__name__
        raise TypeError(f"labels must be an integer tensor of class indices, got {got}")
    if labels.dim() != 1 or labels.shape[0] != z.shape[1]:
        raise ValueError(
            f"labels must be (N,) with N = {z.shape[1]} to match logits "
            f"{tuple(logits.shape)}, got shape {tuple(labels.shape)}"
        )
    y = labels.to(z.device, torch.long)
    K = z.shape[2]
    if ((y < 0) | (y >= K)).any():
        raise ValueError(f"labels must lie in [0, {K - 1}] for K = {K} classes")
    return z, y


def _nll(z: Tensor, y: Tensor, log_t: float, mode: str) -> float:
    """−(1/N) Σ_i log p̄_T(y_i), computed in the log domain (finite even when p underflows).

    log p̄ = logsumexp_m log softmax(z_m / T)_y − log M for the mean of softmaxes.
    """
    scaled = z * math.exp(-log_t)
    if mode == "logits":
        log_p = scaled.mean(0).log_softmax(-1)  # (N, K)
    else:
        log_p = torch.logsumexp(scaled.log_softmax(-1), dim=0) - math.log(z.shape[0])
    return -log_p.gather(-1, y.unsqueeze(-1)).mean().item()


def fit_temperature(
    logits: Tensor,
    labels: Tensor,
    *,
    mode: Mode = "mean_of_softmax",
) -> float:
    """The temperature T minimizing the validation NLL of the ensemble's scaled prediction.

        T* = argmin_{T ∈ [0.01, 100]}  −(1/N) Σ_i log p̄_T(y_i),
        p̄_T = (1/M) Σ_m softmax(z_m / T)   (``mode="mean_of_softmax"``)
        p̄_T = softmax(mean_m z_m / T)       (``mode="logits"``)

    Deterministic and derivative-free: the NLL is evaluated on a grid of log T with step 0.2,
    then a golden-section search refines the best grid point's bracket to 1e-6 in log T.
    Get the validation logits with ``collect(model, val_loader, logits=True)``
    (``from snens.evaluation.protocol import collect``).
    Log-probabilities work as well (softmax ignores a per-row shift; −inf entries of
    underflowed probabilities are allowed).

    Fit on a validation split, never on the test set you report.

    Args:
        logits: validation logits of the members, or of one model.
        labels: validation class indices.
        mode: ``"mean_of_softmax"`` (the snens ensemble prediction) or ``"logits"``.

    Returns:
        T as a float; apply it with :class:`TemperatureScaled`. A warning is issued when the
        optimum lies at a bound of [0.01, 100] (e.g. every validation example already right
        with margin: the NLL keeps falling as T -> 0).

    Shape:
        logits: (M, N, K) or (N, K). labels: (N,).

    Raises:
        TypeError: non-floating logits or non-integer labels.
        ValueError: bad shapes, labels out of range, NaN or +inf logits, unknown ``mode``.
    """
    mode = _check_mode(mode)
    z, y = _check_inputs(logits, labels)  # detached: no graph is built
    low, high = _LOG_T_BOUNDS
    steps = round((high - low) / _GRID_STEP)
    grid = [low + (high - low) * i / steps for i in range(steps + 1)]
    values = [_nll(z, y, t, mode) for t in grid]
    best = min(range(len(grid)), key=values.__getitem__)
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, steps)]
    # golden-section search on [a, b], which brackets the grid minimum
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = _nll(z, y, c, mode), _nll(z, y, d, mode)
    while b - a > _TOLERANCE:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = _nll(z, y, c, mode)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = _nll(z, y, d, mode)
    candidates = [(values[best], grid[best]), (fc, c), (fd, d)]
    log_t = min(candidates)[1]
    if log_t - low < 2 * _GRID_STEP:
        reason = "every validation example is right with a margin (or it is the training set)"
    elif high - log_t < 2 * _GRID_STEP:
        reason = "the predictions carry no information about these labels (uniform is best)"
    else:
        return math.exp(log_t)
    warnings.warn(
        f"the fitted temperature {math.exp(log_t):.4g} is at the bound of the search interval "
        f"[0.01, 100]: the validation NLL keeps falling beyond it; {reason}",
        RuntimeWarning,
        stacklevel=2,
    )
    return math.exp(log_t)


class TemperatureScaled(nn.Module):
    """An ensemble whose logits are divided by a fitted temperature: z_m / T.

    Keeps the (B, …) -> logits (M, B, K) contract, so ``snens.evaluate`` and
    ``snens.predictive_probs`` apply unchanged. With ``mode="logits"`` (a temperature fitted on
    averaged logits) the output is the one scaled mean logit, (1, B, K).

    Fit ``temperature`` with :func:`fit_temperature` on validation data, never on the test set.

    Args:
        model: an ensemble (or ``snens.baselines.SingleModel``) returning (M, B, K).
        temperature: T, finite and > 0; stored as the buffer ``temperature``.
        mode: the ``mode`` the temperature was fitted with.

    Shape:
        Input: (B, …). Output: (M, B, K), or (1, B, K) with ``mode="logits"``.

    Raises:
        TypeError, ValueError: a temperature that is not a finite number > 0; unknown mode.
        ValueError: in forward, if the model does not return 3-D logits.
    """

    def __init__(self, model: nn.Module, temperature: float, *, mode: Mode = "mean_of_softmax"):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.mode = _check_mode(mode)
        self.register_buffer(
            "temperature", torch.tensor(_check_temperature(temperature), dtype=torch.float64)
        )

    @property
    def num_members(self) -> int | None:
        """M of the output: the wrapped model's, or 1 with ``mode="logits"``."""
        return 1 if self.mode == "logits" else getattr(self.model, "num_members", None)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        logits = self.model(*args, **kwargs)
        if not isinstance(logits, Tensor) or logits.dim() != 3:
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(
                f"TemperatureScaled needs a model returning logits (M, B, K), got {got}; wrap "
                "a plain classifier in snens.baselines.SingleModel first"
            )
        if self.mode == "logits":
            logits = logits.mean(0, keepdim=True)  # (M, B, K) -> (1, B, K)
        return logits / self.temperature.to(logits.dtype)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature.item():.4g}, mode={self.mode!r}"
