"""The task loss of an ensemble: the mean over members of each member's cross-entropy."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from snens.method.ensemble import check_logits

__all__ = ["check_labels", "check_loss_inputs", "ensemble_loss", "member_cross_entropy"]


def check_labels(labels: Any, num_classes: int) -> Tensor:
    """(B,) class indices of ``num_classes``-way logits, checked (on a GPU, a device sync).

    Returns:
        ``labels`` as int64.

    Raises:
        TypeError: ``labels`` is not a tensor of integers.
        ValueError: ``labels`` is not 1-D, or a label lies outside [0, K − 1] (named).
    """
    if not isinstance(labels, Tensor):
        raise TypeError(
            f"labels must be a tensor of class indices, got {type(labels).__name__}; "
            "use torch.as_tensor(labels)"
        )
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise TypeError(f"labels must be integer class indices, got dtype {labels.dtype}")
    if labels.dim() != 1:
        raise ValueError(f"labels must be 1-D class indices (B,), got shape {tuple(labels.shape)}")
    if labels.numel():
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            bad = low if low < 0 else high
            raise ValueError(
                f"label {bad} is out of range for {num_classes} classes; labels must lie in "
                f"[0, {num_classes - 1}]"
            )
    return labels.long()


def ensemble_loss(logits: Tensor, labels: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
    """(1/M) Σ_m CE(logits[m], labels_m) for (B,) labels: every member scored on all labels with
    (M, B, K) logits (``repeat``), member m on its own slice with (M, B/M, K) (``split``).

    Returns:
        The loss as a float32 scalar tensor, differentiable with respect to ``logits``.

    Raises:
        ValueError: shapes that fit neither policy, a label out of range, empty or non-3-D
            logits, or ``label_smoothing`` outside [0, 1].
        TypeError: non-floating logits, labels not integer tensors, or a non-number smoothing.

    Example:
        >>> logits = torch.tensor([[[2.0, 0.0]], [[0.0, 2.0]]])  # (M=2, B=1, K=2)
        >>> snens.ensemble_loss(logits, torch.tensor([0]))  # (0.1269 + 2.1269) / 2
        tensor(1.1269)
    """
    check_loss_inputs(logits, label_smoothing)
    return member_cross_entropy(logits, check_labels(labels, logits.shape[2]), label_smoothing)


def check_loss_inputs(logits: Tensor, label_smoothing: float) -> None:
    """What :func:`ensemble_loss` checks besides the labels, none of it on the device.

    Raises:
        ValueError: the logits are empty or not 3-D, or ``label_smoothing`` is outside [0, 1].
        TypeError: non-floating logits, or a ``label_smoothing`` that is not a number.
    """
    check_logits(logits)
    if logits.dim() != 3:
        raise ValueError(
            f"ensemble_loss takes logits (M, B, K), got {tuple(logits.shape)}; for per-token "
            "logits (M, B, T, K) fold the tokens into the batch: logits.flatten(1, -2) with "
            "labels (B·T,)"
        )
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, int | float):
        raise TypeError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")


def member_cross_entropy(logits: Tensor, labels: Tensor, label_smoothing: float) -> Tensor:
    """:func:`ensemble_loss` after its checks, for (M, b, K) logits and (b,) or (M·b,) labels.

    Returns:
        The mean member cross-entropy, a float32 scalar tensor.

    Raises:
        ValueError: the labels' length is neither b nor M·b.
    """
    M, b, _ = logits.shape
    if labels.shape[0] == b:
        target = labels.unsqueeze(0).expand(M, b)  # repeat
    elif labels.shape[0] == M * b:
        target = labels.reshape(M, b)  # split
    else:
        raise ValueError(
            f"labels of length {labels.shape[0]} fit neither logits {tuple(logits.shape)} "
            f"(repeat: B={b}) nor split training (B={M * b})"
        )
    flat = logits.reshape(M * b, -1).float()
    return F.cross_entropy(flat, target.reshape(-1).long(), label_smoothing=label_smoothing)
