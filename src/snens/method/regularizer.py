"""The diversity regularizer of σN-Ens and its temperature–sharing relation.

For every feature i of every regularized member norm, with importances s_m = sigmoid(gamma_m)
of the M members and p = softmax(s / τ) across members,

    r_i(s) = Σ_m log p_m = −M·(log M + KL(U‖p)),      L_div = λ · Σ_layers Σ_i (r_i + M·log M),

(the paper's sum of r_i, less its constant: 0 at equal sharing, the same gradient), and L_div
is added to the task loss and minimized, which pushes features away from equal
sharing. What the regularizer does on its own (derived, and pinned in the tests):

* r is concave in s ∈ [0, 1]^M, so alone it drives each feature to a vertex: k members at
  importance 1, M − k at 0. Over the vertices its value is convex in k with minimum at

      k*(τ) = M·(τ − 1/(e^{1/τ} − 1)),

  so the global optimum is the integer next to k* (at least 1: k = 0 and k = M are both the
  uniform point). k* ≈ M·τ as τ → 0 (one owner per feature, a hard partition) and k* → M/2
  as τ → ∞ (soft sharing among half the members). ``tau_for_k`` inverts k* for 0 < k < M/2.
* ∂r/∂s_m = (1 − M·p_m)/τ is exactly zero when all members are equal: gamma must start
  asymmetric (random), or the regularizer does nothing.
* Every vertex with 1 ≤ k ≤ M − 1 is a local minimum (owners have p ≥ 1/M, non-owners
  p ≤ 1/M), and near equal sharing the gradient is ≈ −(s_m − mean s)/τ² ("rich get richer"),
  so from a random start gradient descent lands wherever the initial ordering leads, about
  half the members per feature at moderate τ. Measured with Adam on the regularizer alone
  (M=4, 500 features, gamma ~ N(0, 1)): 1.22 / 1.83 / 1.99 members above importance 0.5 per
  feature at τ = 0.05 / 0.5 / 5, where k* = 0.20 / 1.37 / 1.93; at τ = 5 a sixth of the
  features end with 3 owners. **k* is the global optimum, not where gradient
  descent goes**, and in training the task loss pulls importances back up. Measure the
  realized sharing with :func:`snens.method.allocation.allocation` (effective members per feature)
  and report it next to k*(τ); never assume it.
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

#: τ that σN-Ens uses unless told otherwise, chosen on validation data where ensembles pay (a
#: backbone that overfits its data); the measurements behind it, and the regimes where a
#: weaker partition (τ=5, λ=0.01) does better, are on the results page's table of defaults.
DEFAULT_TEMPERATURE = 1.0
#: λ that σN-Ens uses unless told otherwise (on the sum over features; see ``diversity_loss``),
#: chosen with τ, as the results page's table of defaults records.
DEFAULT_DIVERSITY_WEIGHT = 0.1

# Below this 1/τ the closed form τ − 1/(e^{1/τ} − 1) cancels (both terms ≈ τ); its series
# 1/2 − x/12 + x³/720 − x⁵/30240 + x⁷/1209600 is exact to ~1e-20 there.
_SERIES_BELOW = 1e-2
# Relative width of the final bracket in tau_for_k.
_TAU_RTOL = 1e-13


# ------------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------------


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except OverflowError:
        shown = repr(value)
        shown = shown if len(shown) <= 24 else f"{shown[:20]}…({len(shown)} digits)"
        raise ValueError(f"{name}={shown} is too large for a float") from None


def _check_temperature(temperature: Any) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(
            f"temperature must be a real number, got {temperature!r} "
            f"({type(temperature).__name__}); pass e.g. temperature=1.0"
        )
    tau = _as_float("temperature", temperature)
    if not math.isfinite(tau) or tau <= 0:
        raise ValueError(
            f"temperature must be finite and > 0, got {temperature!r}; use e.g. temperature=1.0 "
            "(smaller τ: fewer members share each feature), or snens.tau_for_k(k, num_members) "
            "to pick τ for a target sharing k"
        )
    return tau


def _check_weight(weight: Any) -> float:
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        raise TypeError(
            f"weight must be a real number, got {weight!r} ({type(weight).__name__}); "
            "pass e.g. weight=1e-2"
        )
    w = _as_float("weight", weight)
    if not math.isfinite(w) or w < 0:
        raise ValueError(
            f"weight must be finite and >= 0, got {weight!r}; use e.g. weight=1e-2 "
            "(weight=0 switches the regularizer off)"
        )
    return w


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
        by_name = dict(found)
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            shown = ", ".join(repr(n) for n, _ in found[:5])
            more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
            raise ValueError(
                f"layers names {unknown} are not member norms of {type(model).__name__}; "
                f"available names (as model.named_modules() gives them): {shown}{more}"
            )
        keep = set(wanted)
        chosen = [(n, m) for n, m in found if n in keep]
        what = f"layers={wanted!r}"
    if not chosen:
        raise ValueError(
            f"{what} selected none of the {len(found)} member norms of {type(model).__name__}; "
            "select at least one, or pass weight=0 to switch the regularizer off"
        )
    return chosen


# ------------------------------------------------------------------------------------------------
# Math on importances
# ------------------------------------------------------------------------------------------------


def diversity_penalty(importances: Tensor, temperature: float) -> Tensor:
    """Sum over features of the log-probabilities of the members' softmax over importances,
    counted from equal sharing.

        penalty = Σ_i Σ_m (log softmax_m(s[:, i] / τ) + log M) = −Σ_i M·KL(U ‖ p_i) <= 0

    Minimizing it pushes each feature away from equal sharing among the members. The constant
    M·log M per feature (the paper's regularizer leaves it in) changes no gradient; without it
    the value is 0 at equal sharing and a printed loss reads as the task loss minus
    λ × the gain over uniform, instead of being dominated by −λ·M·log M × the number of
    features (−19,710 for SmolLM2's 61 RMSNorms at λ = 0.1). Computed with ``log_softmax``
    over members, so τ from 1e-3 to 1e3 gives finite values and gradients; half-precision
    inputs are computed in float32.

    Args:
        importances: s, the members' importances sigmoid(gamma) of each feature.
        temperature: τ > 0; smaller τ favours fewer members per feature.

    Returns:
        A scalar tensor, differentiable in ``importances``.

    Shape:
        importances: (M, C). Output: ().

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
    s = importances
    if s.dtype in (torch.float16, torch.bfloat16):
        s = s.float()
    # log_softmax is shift-invariant: subtracting each feature's max keeps s/τ from
    # overflowing (inf − inf = NaN) at tiny τ. In float64 (the importances are a few
    # thousand numbers): near equal sharing each log(M·p_m) is ~1e-6, the difference of two
    # numbers near log M, and float32 lost 1% of the sum over SmolLM2's 35,136 features.
    # MPS has no float64.
    dtype = torch.float32 if s.device.type == "mps" else torch.float64
    shifted = (s - s.detach().amax(dim=0, keepdim=True)).to(dtype) / tau
    log_mp = torch.log_softmax(shifted, dim=0) + math.log(s.shape[0])  # log(M·p_m)
    return log_mp.sum().to(s.dtype)


def optimal_k(temperature: float, num_members: int) -> float:
    """The number of members per feature that minimizes the regularizer over vertices.

        k*(τ) = M·(τ − 1/(e^{1/τ} − 1))

    Increasing in τ, ≈ M·τ as τ → 0 and → M/2 as τ → ∞. The integer optimum is floor(k*) or
    ceil(k*), and at least 1. It is the global optimum of the regularizer alone, not what
    gradient descent reaches; see the module docstring.

    Args:
        temperature: τ > 0.
        num_members: M >= 1.

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
    """The temperature whose optimum shares each feature among k members: the inverse of k*.

    Solves k*(τ) = M·(τ − 1/(e^{1/τ} − 1)) = k by bisection in log τ (k* increases with τ)
    to ~1e-12 relative. As with k*, this is the regularizer's global optimum, not a promise of
    what training reaches: measure the realized sharing with
    :func:`snens.method.allocation.allocation`.

    Args:
        k: target members per feature, 0 < k < M/2; may be fractional.
        num_members: M >= 1.

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
    if target < 1e-3:
        # k*/M = τ − e^{−1/τ}/(1 − e^{−1/τ}) = τ to double precision for τ < 1e-3 (the second
        # term is below e^{−1000}); bisecting there would underflow lo·hi.
        if target == 0.0:
            raise ValueError(f"k={k!r} is too small: k/M underflows to 0")
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


# ------------------------------------------------------------------------------------------------
# On models
# ------------------------------------------------------------------------------------------------


def diversity_loss(
    model: nn.Module,
    temperature: float = DEFAULT_TEMPERATURE,
    weight: float = DEFAULT_DIVERSITY_WEIGHT,
    layers: LayerSelection = None,
) -> Tensor:
    """The diversity regularizer of a model with member norms, to add to the task loss.

        L_div = λ · Σ_{l ∈ R} Σ_i Σ_m (log softmax_m(sigmoid(gamma_{·,l,i}) / τ) + log M)

    (the paper's regularizer less its constant λ·M·log M per feature: the same gradient, and 0
    at equal sharing, so ``ensemble_loss + diversity_loss`` prints as the task loss minus
    λ × Σ M·KL(U ‖ p), see :func:`diversity_penalty`). It is a sum over features, not a
    mean: each gamma then feels a force λ·σ'(γ)·(1 − M·p)/τ that does not depend on how many
    features the model has, so a weight λ transfers across architectures. A mean would divide
    that force by the number of features (thousands), and the task loss would keep every
    feature fully shared.

    Args:
        model: a module containing :class:`snens.nn.MemberNorm` layers (e.g. from
            ``snens.convert``).
        temperature: τ > 0, the diversity knob; see :func:`optimal_k` and :func:`tau_for_k`.
        weight: λ >= 0.
        layers: which member norms to regularize (R). None: all of them; a sequence of module
            names as ``model.named_modules()`` gives them; or a callable
            ``(name, module) -> bool``.

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
    chosen = _select_layers(model, layers)
    total = None
    for _, layer in chosen:
        penalty = diversity_penalty(layer.importances(), tau)
        total = penalty if total is None else total + penalty.to(total.device)
    # λ·penalty in float64: a λ beyond float32's range would turn λ·0 into inf·0 = NaN.
    return (total.double() * lam).to(total.dtype)


@torch.no_grad()
def diversity_gain(
    model: nn.Module, temperature: float = DEFAULT_TEMPERATURE, layers: LayerSelection = None
) -> float:
    """How far the features are from equal sharing, per feature, for logging.

        gain = mean_i −(r_i + M·log M) = mean_i M·KL(U‖p_i) >= 0

    with r_i = Σ_m log p_m and p_i = softmax(s[:, i] / τ), pooled over all features of the
    selected layers. It is 0 when every member has the same importance and grows as features
    are owned by fewer members; it is the per-feature regularizer with its constant −M·log M
    removed and its sign flipped.

    Args:
        model: a module containing :class:`snens.nn.MemberNorm` layers.
        temperature: τ > 0.
        layers: as in :func:`diversity_loss`.

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
