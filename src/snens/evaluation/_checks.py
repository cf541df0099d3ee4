"""Checks of logits, labels and temperatures shared by the calibrators and the conformal sets."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import Tensor


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_temperature(temperature: Any) -> float:
    """``temperature`` as a float, refused if not a real number finite and > 0."""
    if isinstance(temperature, Tensor) and temperature.numel() == 1:
        temperature = temperature.item()
    if not _is_real(temperature):
        raise TypeError(f"temperature must be a real number, got {temperature!r}")
    value = float(temperature)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"temperature must be finite and > 0, got {value}; fit one with "
            "snens.evaluation.calibration.fit_temperature(val_logits, val_labels)"
        )
    return value


def _check_logits(logits: Any) -> Tensor:
    """Logits as float64 (M, N, K), detached; (N, K) of one model becomes (1, N, K)."""
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
    if z.shape[0] == 0 or z.shape[1] == 0 or z.shape[2] < 2:
        raise ValueError(
            f"logits {tuple(logits.shape)} need at least one member, one example and two classes"
        )
    # -inf (probability 0) is allowed where a row keeps a finite entry
    if torch.isnan(z).any() or (z == math.inf).any() or not torch.isfinite(z).any(-1).all():
        raise ValueError("logits contain NaN, +inf, or a row with no finite entry")
    return z


def _check_labels(labels: Any, z: Tensor, what: str = "logits") -> Tensor:
    """Labels as int64 (N,) on the device of the checked ``what`` ``z`` (M, N, K)."""
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.dtype == torch.bool:
        got = labels.dtype if isinstance(labels, Tensor) else type(labels).__name__
        raise TypeError(f"labels must be an integer tensor of class indices, got {got}")
    if labels.dim() != 1 or labels.shape[0] != z.shape[1]:
        raise ValueError(
            f"labels must be (N,) with N = {z.shape[1]} to match the {what}' "
            f"{z.shape[1]} examples, got shape {tuple(labels.shape)}"
        )
    y = labels.to(z.device, torch.long)
    K = z.shape[2]
    if ((y < 0) | (y >= K)).any():
        raise ValueError(f"labels must lie in [0, {K - 1}] for K = {K} classes")
    return y
