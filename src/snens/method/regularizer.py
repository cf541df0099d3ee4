"""The diversity regularizer of σN-Ens and its temperature–sharing relation.

For every feature i of every regularized member norm, with importances s_m = sigmoid(gamma_m)
of the M members and p = softmax(s / τ) across members,

    r_i(s) = Σ_m log p_m = −M·(log M + KL(U‖p)),      L_div = λ · Σ_layers Σ_i (r_i + M·log M),

(the paper's sum of r_i less its constant: 0 at equal sharing, the same gradient).

Alone, r is concave in s ∈ [0, 1]^M and drives each feature to a vertex (k members at 1, the
rest at 0); over the vertices its minimum is at k*(τ) = M·(τ − 1/(e^{1/τ} − 1)) (:func:`optimal_k`,
inverted by :func:`tau_for_k`). Its gradient (1 − M·p_m)/τ is zero at equal sharing, so gamma
must start asymmetric. k* is the global optimum, not where gradient descent goes: measure the
realized sharing with :func:`snens.method.allocation.allocation`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from snens.nn.norms import MemberNorm, check_num_members

__all__ = [
    "DEFAULT_DIVERSITY_WEIGHT",
    "DEFAULT_TEMPERATURE",
    "diversity_gain",
    "diversity_loss",
    "diversity_penalty",
    "optimal_k",
    "tau_for_k",
]

LayerSelection = Sequence[str] | Callable[[str, nn.Module], bool] | None

#: τ that σN-Ens uses unless told otherwise (the results page's table of defaults).
DEFAULT_TEMPERATURE = 1.0
#: λ that σN-Ens uses unless told otherwise (on the sum over features).
DEFAULT_DIVERSITY_WEIGHT = 0.1

# Below this 1/τ the closed form τ − 1/(e^{1/τ} − 1) cancels (both terms ≈ τ); its series
# 1/2 − x/12 + x³/720 − x⁵/30240 + x⁷/1209600 is exact to ~1e-20 there.
_SERIES_BELOW = 1e-2
_TAU_RTOL = 1e-13


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except OverflowError:
        shown = repr(value)
        shown = shown if len(shown) <= 24 else f"{shown[:20]}…({len(shown)} digits)"
        raise ValueError(f"{name}={shown} is too large for a float") from None


def _check_real(name: str, value: Any, example: str, positive: bool, hint: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number, got {value!r} ({type(value).__name__}); "
            f"pass e.g. {name}={example}"
        )
    real = _as_float(name, value)
    if not math.isfinite(real) or real < 0 or (positive and real == 0):
        raise ValueError(
            f"{name} must be finite and {'>' if positive else '>='} 0, got {value!r}; use e.g. "
            f"{name}={example} {hint}"
        )
    return real


_TEMPERATURE_HINT = (
    "(smaller τ: fewer members share each feature), or snens.tau_for_k(k, num_members) "
    "to pick τ for a target sharing k"
)


def _check_temperature(temperature: Any) -> float:
    return _check_real("temperature", temperature, "1.0", True, _TEMPERATURE_HINT)


def _check_weight(weight: Any) -> float:
    return _check_real("weight", weight, "1e-2", False, "(weight=0 switches the regularizer off)")


def _select_layers(model: nn.Module, layers: LayerSelection) -> list[tuple[str, MemberNorm]]:
    """The (name, member norm) pairs of ``model`` chosen by ``layers``, in named_modules order."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, MemberNorm)]
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no member norm layers (snens.nn.MemberNorm), so there "
            "is nothing to regularize; call snens.convert(model, num_members=M) first, or build "
            "the model with snens.nn member norms"
        )
    if layers is None:
        return found
    if callable(layers):
        chosen = [(n, m) for n, m in found if layers(n, m)]
        what = "the layers callable"
    else:
        if isinstance(layers, str):
            raise TypeError(
                f"layers must be a sequence of module names, got the string {layers!r}; "
                f"wrap it in a list: layers=[{layers!r}]"
            )
        wanted = list(layers)
        unknown = [n for n in wanted if n not in dict(found)]
        if unknown:
            shown = ", ".join(repr(n) for n, _ in found[:5])
            more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
            raise ValueError(
                f"layers names {unknown} are not member norms of {type(model).__name__}; "
                f"available names (as model.named_modules() gives them): {shown}{more}"
            )
        chosen = [(n, m) for n, m in found if n in set(wanted)]
        what = f"layers={wanted!r}"
    if not chosen:
        raise ValueError(
            f"{what} selected none of the {len(found)} member norms of {type(model).__name__}; "
            "select at least one, or pass weight=0 to switch the regularizer off"
        )
    return chosen


def diversity_penalty(importances: Tensor, temperature: float) -> Tensor:
    """Σ_i Σ_m (log softmax_m(s[:, i] / τ) + log M) = −Σ_i M·KL(U ‖ p_i) <= 0 for (M, C)
    importances s: 0 at equal sharing.

    Returns:
        A scalar tensor, differentiable in ``importances``.

    Raises:
        TypeError: if ``temperature`` is not a real number.
        ValueError: if ``temperature`` is not finite and > 0, or ``importances`` is not 2-D.
    """
    tau = _check_temperature(temperature)
    if not isinstance(importances, Tensor) or importances.dim() != 2:
        got = tuple(importances.shape) if isinstance(importances, Tensor) else type(importances)
        raise ValueError(
            f"importances must be a 2-D tensor of shape (M, C), got {got}; use "
            "layer.importances(), which flattens the features of a member norm to (M, C)"
        )
    s = importances.float() if importances.dtype in (torch.float16, torch.bfloat16) else importances
    # the max subtracted keeps s/τ from overflowing at tiny τ; float64 because near equal
    # sharing each log(M·p_m) cancels (float32 lost 1% of the sum); MPS has no float64
    dtype = torch.float32 if s.device.type == "mps" else torch.float64
    shifted = (s - s.detach().amax(dim=0, keepdim=True)).to(dtype) / tau
    log_mp = torch.log_softmax(shifted, dim=0) + math.log(s.shape[0])  # log(M·p_m)
    return log_mp.sum().to(s.dtype)


def optimal_k(temperature: float, num_members: int) -> float:
    """k*(τ) = M·(τ − 1/(e^{1/τ} − 1)), the members per feature minimizing the regularizer
    over vertices (not what gradient descent reaches).

    Returns:
        k*, a float in (0, M/2).

    Raises:
        TypeError: if ``temperature`` is not a real number or ``num_members`` not an int.
        ValueError: if ``temperature`` is not finite and > 0, or ``num_members < 1``.

    Example:
        >>> round(snens.optimal_k(1.0, num_members=4), 4)  # 4·(1 − 1/(e − 1))
        1.6721
        >>> round(snens.optimal_k(0.05, num_members=4), 2)  # ≈ M·τ: one owner per feature
        0.2
    """
    tau = _check_temperature(temperature)
    M = check_num_members(num_members, ceiling=False)
    return M * _k_per_member(tau)


def _k_per_member(tau: float) -> float:
    """k*(τ)/M = τ − 1/(e^{1/τ} − 1), stable from τ → 0 to τ → ∞."""
    x = 1.0 / tau
    if x < _SERIES_BELOW:
        x2 = x * x
        return 0.5 - x / 12 + x * x2 / 720 - x * x2 * x2 / 30240 + x * x2 * x2 * x2 / 1209600
    # 1/(e^x − 1) = e^{−x} / (1 − e^{−x}): no overflow for large x, where it is ~0.
    return tau - math.exp(-x) / -math.expm1(-x)


def tau_for_k(k: float, num_members: int) -> float:
    """The τ whose optimum k*(τ) is ``k`` (0 < k < M/2, may be fractional), by bisection.

    Returns:
        τ > 0 with optimal_k(τ, M) == k.

    Raises:
        TypeError: if ``k`` is not a real number or ``num_members`` not an int.
        ValueError: if ``k`` is outside (0, M/2) or ``num_members < 1``.

    Example:
        >>> round(snens.tau_for_k(1.5, num_members=4), 3)
        0.641
        >>> round(snens.optimal_k(snens.tau_for_k(1.5, num_members=4), num_members=4), 6)
        1.5
    """
    M = check_num_members(num_members, ceiling=False)
    if isinstance(k, bool) or not isinstance(k, numbers.Real):
        raise TypeError(f"k must be a real number, got {k!r} ({type(k).__name__})")
    if not (0 < _as_float("k", k) < M / 2):
        raise ValueError(
            f"k={k!r} is outside the valid range 0 < k < M/2 = {M / 2} for num_members M={M}: "
            "k*(τ) rises from 0 (τ → 0) to M/2 (τ → ∞) and never reaches it; a smaller k "
            "gives a smaller τ"
        )
    target = float(k) / M
    if target == 0.0:
        raise ValueError(f"k={k!r} is too small: k/M underflows to 0")
    if target < 1e-3:  # k*/M = τ to double precision here; bisecting would underflow lo·hi
        return target
    # k*(τ)/M <= τ, so τ >= target; grow the upper end until it brackets.
    lo, hi = target, max(2.0 * target, 1.0)
    while _k_per_member(hi) < target:
        lo, hi = hi, hi * 16.0
    while hi / lo - 1.0 > _TAU_RTOL:
        mid = math.sqrt(lo * hi)
        if _k_per_member(mid) < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def diversity_loss(
    model: nn.Module,
    temperature: float = DEFAULT_TEMPERATURE,
    weight: float = DEFAULT_DIVERSITY_WEIGHT,
    layers: LayerSelection = None,
) -> Tensor:
    """λ · Σ_layers :func:`diversity_penalty` of ``model``'s member norms, to add to the task
    loss: a sum over features, so λ transfers across architectures.

    Args:
        temperature: τ > 0; see :func:`optimal_k` and :func:`tau_for_k`.
        weight: λ >= 0.
        layers: which member norms (None: all; module names; or ``(name, module) -> bool``).

    Returns:
        A scalar tensor on the importances' device, differentiable in every selected gamma.

    Raises:
        TypeError: if ``temperature`` or ``weight`` is not a real number.
        ValueError: if ``temperature`` is not finite and > 0, ``weight`` is negative or not
            finite, the model has no member norms, a name in ``layers`` is not one, or
            ``layers`` selects none.
    """
    tau = _check_temperature(temperature)
    lam = _check_weight(weight)
    total = None
    for _, layer in _select_layers(model, layers):
        penalty = diversity_penalty(layer.importances(), tau)
        total = penalty if total is None else total + penalty.to(total.device)
    # λ·penalty in float64: a λ beyond float32's range would turn λ·0 into inf·0 = NaN.
    return (total.double() * lam).to(total.dtype)


@torch.no_grad()
def diversity_gain(
    model: nn.Module, temperature: float = DEFAULT_TEMPERATURE, layers: LayerSelection = None
) -> float:
    """mean_i M·KL(U‖p_i) >= 0 over the selected layers' features: 0 at equal sharing.

    Returns:
        The mean gain per feature, in nats.

    Raises:
        TypeError, ValueError: as :func:`diversity_loss`.
    """
    tau = _check_temperature(temperature)
    total, count = 0.0, 0
    for _, layer in _select_layers(model, layers):
        s = layer.importances().detach().double()
        M = s.shape[0]
        r = torch.log_softmax(s / tau, dim=0).sum(dim=0)  # (C,)
        total += float((-(r + M * math.log(M))).clamp_min(0).sum())
        count += s.shape[1]
    return total / count if count else 0.0
