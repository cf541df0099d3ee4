"""Checks shared by the metrics: probabilities, logits, labels, bin counts and OOD scores."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch
from torch import Tensor

# rows must sum to 1 within this: it refuses logits and passes rounded (bfloat16) softmax rows
_SUM_ATOL = 5e-3
_MAX_BINS = 10**6  # more bins than any data set has examples; beyond int64 torch overflows


def _as_tensor(x: Any, name: str) -> Tensor:
    if isinstance(x, np.ndarray):
        x = torch.tensor(x)
    elif not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    x = x.detach()
    return x.cpu() if x.device.type == "mps" else x


def _check_floats(x: Any, ndim: int, name: str, kind: str) -> Tensor:
    """``x`` as a non-empty floating-point tensor of ``ndim`` dims, (B, K) or (M, B, K)."""
    t = _as_tensor(x, name)
    layout = "(B, K)" if ndim == 2 else "(M, B, K)"
    if not t.is_floating_point():
        raise TypeError(f"{name} must be floating-point {kind} {layout}, got {t.dtype}")
    if t.dim() != ndim:
        hint = ""
        if ndim == 2 and t.dim() == 3:
            hint = "; for member probabilities (M, B, K) pass their mean, snens.predictive_probs"
        elif ndim == 3 and t.dim() == 2:
            single = "logits" if kind == "logits" else "probs"
            hint = f"; for a single model pass {single}.unsqueeze(0) (M = 1)"
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}{hint}")
    if t.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(t.shape)}); metrics need at least one example and "
            "one class"
        )
    return t


def _check_probs(probs: Any, ndim: int, name: str) -> tuple[Tensor, torch.dtype]:
    """``probs`` as float64, and its original dtype (for the NLL clamp)."""
    p = _check_floats(probs, ndim, name, "probabilities")
    dtype, p = p.dtype, p.to(torch.float64)
    if not torch.isfinite(p).all():
        raise ValueError(f"{name} contains NaN or inf")
    if (p < 0).any():
        raise ValueError(
            f"{name} has negative entries (min {p.min().item():.4g}); pass probabilities, not "
            "logits: snens.predictive_probs(logits) or logits.softmax(-1)"
        )
    sums = p.double().sum(-1)  # a rounded row is within eps/2 of 1, whatever its length
    tolerance = max(_SUM_ATOL, torch.finfo(dtype).eps)
    bad = (sums - 1).abs() > tolerance
    if bad.any():
        where = tuple(torch.nonzero(bad)[0].tolist())
        raise ValueError(
            f"{name} rows must sum to 1 (within {tolerance:.3g}), but row {where} sums to "
            f"{sums[where].item():.6g}; pass probabilities: snens.predictive_probs(logits) for "
            "ensemble logits (M, B, K), or logits.softmax(-1)"
        )
    return p, dtype


def _check_member_logits(member_logits: Any) -> Tensor:
    z = _check_floats(member_logits, 3, "member_logits", "logits").to(torch.float64)
    if not torch.isfinite(z).all():
        raise ValueError(
            "member_logits contains NaN or inf; these scores need the model's finite logits "
            "(collect(model, loader, logits=True)), not log-probabilities"
        )
    return z


def _check_labels(labels: Any, probs: Tensor) -> Tensor:
    """``labels`` as int64 on ``probs``' device, checked against its (…, B, K) shape."""
    y = _as_tensor(labels, "labels")
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise TypeError(f"labels must be integer class indices, got {y.dtype}; use labels.long()")
    if y.dim() != 1:
        raise ValueError(f"labels must be 1-D class indices (B,), got shape {tuple(y.shape)}")
    B, K = probs.shape[-2:]
    if y.shape[0] != B:
        raise ValueError(
            f"labels has {y.shape[0]} entries but the probabilities {tuple(probs.shape)} have "
            f"B = {B} examples; they must match"
        )
    y = y.to(device=probs.device, dtype=torch.long)
    out = (y < 0) | (y >= K)
    if out.any():
        raise ValueError(
            f"labels must lie in [0, {K - 1}] for K = {K} classes, got {y[out][:5].tolist()}"
        )
    return y


def _check_probs_labels(
    probs: Any, labels: Any, ndim: int = 2, name: str = "probs"
) -> tuple[Tensor, Tensor, torch.dtype]:
    """Checked float64 ``probs``, int64 ``labels``, and the probabilities' original dtype."""
    p, dtype = _check_probs(probs, ndim, name)
    return p, _check_labels(labels, p), dtype


def _check_num_bins(num_bins: Any) -> int:
    if isinstance(num_bins, bool) or not isinstance(num_bins, numbers.Integral):
        raise TypeError(f"num_bins must be an int, got {num_bins!r}; use e.g. num_bins=15")
    if not 1 <= num_bins <= _MAX_BINS:
        raise ValueError(
            f"num_bins must be in 1..{_MAX_BINS:,}, got num_bins={num_bins}; use e.g. num_bins=15"
        )
    return int(num_bins)


def _check_scores(scores: Any, name: str) -> Tensor:
    s = _as_tensor(scores, name)
    if s.is_complex():
        raise TypeError(f"{name} must be real scores, got {s.dtype}")
    if s.dim() != 1:
        raise ValueError(f"{name} must be 1-D per-example scores (N,), got {tuple(s.shape)}")
    if s.numel() == 0:
        raise ValueError(
            f"{name} is empty; OOD metrics need at least one in-distribution and one OOD score"
        )
    s = s.to(torch.float64)
    if not torch.isfinite(s).all():
        raise ValueError(f"{name} contains NaN or inf")
    return s


def _check_ood(in_scores: Any, out_scores: Any) -> tuple[Tensor, Tensor]:
    """In- and out-of-distribution scores concatenated, and 1. for OOD (the positives)."""
    s_in = _check_scores(in_scores, "in_scores")
    s_out = _check_scores(out_scores, "out_scores").to(s_in.device)
    is_ood = torch.cat([torch.zeros_like(s_in), torch.ones_like(s_out)])
    return torch.cat([s_in, s_out]), is_ood
