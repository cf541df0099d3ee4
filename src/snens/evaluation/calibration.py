"""Post-hoc calibration of an ensemble's prediction, fitted on a validation split.

Every calibrator is fitted by :func:`fit_calibrator` (validation logits → a frozen
:class:`Calibrator`, whose :meth:`~Calibrator.apply` maps test logits to calibrated logits):

* ``"temperature"`` — z_m / T (Guo et al., 2017), T from :func:`fit_temperature`;
* ``"vector"`` — z'_m = w ⊙ z_m + b, w, b ∈ R^K;
* ``"matrix"`` — z'_m = W z_m + b, W's off-diagonal entries L2-regularized (Kull et al., 2019);
* ``"histogram"`` — one-vs-rest histogram binning of p̄ (Zadrozny and Elkan, 2001),
  renormalized, returned as log-probabilities of one member (1, N, K).

The parametric maps act on every member's logits alike and are fitted on the NLL of the mean
of the mapped members' softmaxes. Fit on a validation split, never on the test set.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from snens.evaluation._checks import _check_labels, _check_logits, _check_temperature
from snens.evaluation.predictions import collect

__all__ = [
    "CALIBRATORS",
    "Calibrator",
    "HistogramBinning",
    "MatrixScaling",
    "TemperatureScaled",
    "TemperatureScaling",
    "VectorScaling",
    "fit_calibrator",
    "fit_temperature",
]

Mode = Literal["mean_of_softmax", "logits"]
MODES = ("mean_of_softmax", "logits")

# a coarse grid in log T finds the basin, golden-section search refines it
_LOG_T_BOUNDS = (math.log(1e-2), math.log(1e2))
_GRID_STEP = 0.2
_TOLERANCE = 1e-6
_GOLDEN = (math.sqrt(5) - 1) / 2


def _check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def _check_inputs(logits: Any, labels: Any) -> tuple[Tensor, Tensor]:
    z = _check_logits(logits)
    return z, _check_labels(labels, z)


def _possible(z: Tensor, y: Tensor, mode: str, what: str) -> tuple[Tensor, Tensor]:
    """``(z, y)`` without the examples whose label has probability 0 whatever the calibration."""
    label_logits = z.gather(-1, y.view(1, -1, 1).expand(z.shape[0], -1, 1)).squeeze(-1)
    ruled_out = label_logits == -math.inf  # (M, N)
    impossible = ruled_out.any(0) if mode == "logits" else ruled_out.all(0)
    count = int(impossible.sum())
    if not count:
        return z, y
    n = y.shape[0]
    if count == n:
        raise ValueError(
            f"every one of the {n} labels has probability 0 under the model (a logit of −inf), "
            f"so no {what} can fit them; check that the logits and labels belong together"
        )
    warnings.warn(
        f"{count} of the {n} labels given to {what} have probability 0 under the model (a "
        "logit of −inf): their NLL is infinite whatever the calibration, so it was fitted on "
        f"the other {n - count}; the model rules out what happened there: check those "
        "examples, or clamp log-probabilities (logits.clamp(min=-1e4)) to keep them",
        RuntimeWarning,
        stacklevel=3,
    )
    return z[:, ~impossible], y[~impossible]


def _nll(z: Tensor, y: Tensor, log_t: float, mode: str) -> float:
    """−(1/N) Σ_i log p̄_T(y_i), in the log domain (finite even when p underflows)."""
    scaled = z * math.exp(-log_t)
    if mode == "logits":
        log_p = scaled.mean(0).log_softmax(-1)  # (N, K)
    else:
        log_p = torch.logsumexp(scaled.log_softmax(-1), dim=0) - math.log(z.shape[0])
    return -log_p.gather(-1, y.unsqueeze(-1)).mean().item()


def fit_temperature(
    logits: Tensor | nn.Module, labels: Tensor | Any, *, mode: Mode = "mean_of_softmax"
) -> float:
    """The temperature T in [0.01, 100] minimizing the validation NLL of (1/M) Σ_m softmax(z_m / T),
    or of softmax(mean_m z_m / T) with ``mode="logits"``: a grid of log T, then a golden-section
    search.

    Args:
        logits: validation logits (M, N, K) of the members, or (N, K) of one model; or the model
            itself, with its validation loader of ``(x, y)`` batches as ``labels``.
        labels: validation class indices (N,).

    Returns:
        T as a float; a warning is issued when it lies at a bound of [0.01, 100].

    Raises:
        TypeError: non-floating logits or non-integer labels.
        ValueError: bad shapes, labels out of range, NaN or +inf logits, unknown ``mode``.
    """
    mode = _check_mode(mode)
    if isinstance(logits, nn.Module):  # (model, loader): one pass over the validation split
        logits, labels = collect(logits, labels, logits=True)
    z, y = _check_inputs(logits, labels)  # detached: no graph is built
    z, y = _possible(z, y, mode, "temperature scaling")
    low, high = _LOG_T_BOUNDS
    steps = round((high - low) / _GRID_STEP)
    grid = [low + (high - low) * i / steps for i in range(steps + 1)]
    values = [_nll(z, y, t, mode) for t in grid]
    best = min(range(len(grid)), key=values.__getitem__)
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, steps)]
    log_t = _golden_section(lambda t: _nll(z, y, t, mode), a, b, (values[best], grid[best]))
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


def _golden_section(f: Callable[[float], float], a: float, b: float, start: tuple) -> float:
    """The argmin of ``f`` on [a, b], which brackets the grid minimum ``start`` (f, x)."""
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    while b - a > _TOLERANCE:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    return min([start, (fc, c), (fd, d)])[1]


class TemperatureScaled(nn.Module):
    """A model returning (M, B, K) whose logits are divided by the buffer ``temperature`` T;
    with ``mode="logits"`` the output is the one scaled mean logit, (1, B, K).

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


_LBFGS_ITERATIONS = 200


def _mean_of_softmax_nll(z: Tensor, y: Tensor) -> Tensor:
    """−(1/N) Σ_i log p̄(y_i), differentiable; the label's column is taken before the logsumexp
    over members (−inf in every member would give a NaN gradient)."""
    label = y.view(1, -1, 1).expand(z.shape[0], -1, 1)
    log_p_y = z.log_softmax(-1).gather(-1, label).squeeze(-1)  # (M, N)
    return -(torch.logsumexp(log_p_y, dim=0) - math.log(z.shape[0])).mean()


def _minimize(loss: Callable[[], Tensor], params: list[Tensor]) -> None:
    optimizer = torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=_LBFGS_ITERATIONS,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        optimizer.zero_grad()
        value = loss()
        value.backward()
        return value

    with torch.enable_grad():
        optimizer.step(closure)
    for param in params:
        param.requires_grad_(False)


class Calibrator:
    """A post-hoc calibrator fitted on validation logits by :func:`fit_calibrator`; :meth:`apply`
    maps logits (M, N, K) or (N, K) to calibrated ones (M or 1, N, K) in the input's dtype."""

    method: ClassVar[str] = ""
    num_classes: ClassVar[int | None] = None  # K the calibrator was fitted on; None = any

    def apply(self, logits: Tensor) -> Tensor:
        """Calibrated logits, whose mean of softmaxes is the calibrated prediction.

        Raises:
            TypeError, ValueError: logits not (M, N, K) or (N, K) floating point, or of another K.
        """
        z = _check_logits(logits)
        K = self.num_classes
        if K is not None and z.shape[-1] != K:
            raise ValueError(
                f"this {self.method} calibrator was fitted on K = {K} classes, got logits "
                f"{tuple(logits.shape)}"
            )
        return self._map(z).to(logits.dtype)

    @classmethod
    def fit(cls, logits: Tensor, labels: Tensor, **options: Any) -> Calibrator:
        """Fit on validation logits and labels; options as :func:`fit_calibrator`."""
        raise NotImplementedError

    def _map(self, z: Tensor) -> Tensor:
        """Checked float64 logits (M, N, K) -> calibrated logits."""
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class _Affine(Calibrator):
    """A calibrator of one float64 ``weight`` and ``bias`` for every member, fitted on K classes."""

    weight: Tensor
    bias: Tensor

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return self.weight.shape[0]


@dataclass(frozen=True)
class TemperatureScaling(Calibrator):
    """z_m / T, or mean_m z_m / T as one member with ``mode="logits"``; wrap a model with
    ``TemperatureScaled(model, calibrator.temperature)``."""

    method: ClassVar[str] = "temperature"
    temperature: float
    mode: Mode = "mean_of_softmax"

    def __post_init__(self) -> None:
        object.__setattr__(self, "temperature", _check_temperature(self.temperature))
        _check_mode(self.mode)

    @classmethod
    def fit(
        cls, logits: Tensor, labels: Tensor, *, mode: Mode = "mean_of_softmax"
    ) -> TemperatureScaling:
        return cls(fit_temperature(logits, labels, mode=mode), mode)

    def _map(self, z: Tensor) -> Tensor:
        if self.mode == "logits":
            z = z.mean(0, keepdim=True)  # (M, N, K) -> (1, N, K)
        return z / self.temperature


def _affine(z: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """w ⊙ z + b, with a logit of −inf kept at −inf (−inf·w would give a NaN gradient)."""
    ruled_out = z == -math.inf
    if not bool(ruled_out.any()):
        return z * weight + bias
    return torch.where(ruled_out, -math.inf, z.masked_fill(ruled_out, 0) * weight + bias)


def _refuse_ruled_out(z: Tensor) -> None:
    if bool((z == -math.inf).any()):
        raise ValueError(
            "matrix scaling mixes the classes' logits, so a logit of −inf (probability 0) has "
            "no finite image; give finite logits (clamp log-probabilities: "
            "logits.clamp(min=-1e4)), or use vector or temperature scaling, which keep it"
        )


@dataclass(frozen=True, eq=False)
class VectorScaling(_Affine):
    """z'_m = w ⊙ z_m + b, one float64 (w, b) of shape (K,) for every member (Guo et al., 2017),
    fitted by L-BFGS from w = 1, b = 0 on the mean-of-softmax NLL; it can move the argmax."""

    method: ClassVar[str] = "vector"

    @classmethod
    def fit(cls, logits: Tensor, labels: Tensor) -> VectorScaling:
        z, y = _check_inputs(logits, labels)
        z, y = _possible(z, y, "mean_of_softmax", "vector scaling")
        K = z.shape[-1]
        weight = torch.ones(K, dtype=torch.float64, device=z.device, requires_grad=True)
        bias = torch.zeros(K, dtype=torch.float64, device=z.device, requires_grad=True)
        _minimize(lambda: _mean_of_softmax_nll(_affine(z, weight, bias), y), [weight, bias])
        return cls(weight, bias)

    def _map(self, z: Tensor) -> Tensor:
        return _affine(z, self.weight.to(z.device), self.bias.to(z.device))


@dataclass(frozen=True, eq=False)
class MatrixScaling(_Affine):
    """z'_m = W z_m + b, one float64 (W, b) for every member, fitted by L-BFGS from W = I, b = 0
    on the mean-of-softmax NLL plus ``off_diagonal`` λ/(K(K−1)) Σ_{j≠k} W_jk² (Kull et al.,
    2019, without the bias term)."""

    method: ClassVar[str] = "matrix"
    off_diagonal: float

    @classmethod
    def fit(cls, logits: Tensor, labels: Tensor, *, off_diagonal: float = 1e-2) -> MatrixScaling:
        if isinstance(off_diagonal, bool) or not isinstance(off_diagonal, numbers.Real):
            raise TypeError(f"off_diagonal must be a number >= 0, got {off_diagonal!r}")
        lam = float(off_diagonal)
        if not (math.isfinite(lam) and lam >= 0):
            raise ValueError(f"off_diagonal must be finite and >= 0, got {off_diagonal!r}")
        z, y = _check_inputs(logits, labels)
        _refuse_ruled_out(z)
        K = z.shape[-1]
        eye = torch.eye(K, dtype=torch.float64, device=z.device)
        weight = eye.clone().requires_grad_(True)
        bias = torch.zeros(K, dtype=torch.float64, device=z.device, requires_grad=True)

        def loss() -> Tensor:
            penalty = ((weight * (1 - eye)) ** 2).sum() / (K * (K - 1))
            return _mean_of_softmax_nll(z @ weight.T + bias, y) + lam * penalty

        _minimize(loss, [weight, bias])
        return cls(weight, bias, lam)

    def _map(self, z: Tensor) -> Tensor:
        _refuse_ruled_out(z)
        return z @ self.weight.to(z.device).T + self.bias.to(z.device)


@dataclass(frozen=True, eq=False)
class HistogramBinning(Calibrator):
    """One-vs-rest histogram binning of p̄: per class k, the validation p̄_k cut into B bins of
    equal mass with inner ``edges`` (K, B − 1), each bin valued θ_kb = (#{i in b : y_i = k} + 1) /
    (#{i in b} + 2) (``values`` (K, B)); at test q_k = θ_{k, bin_k(p̄_k)}, and q / Σ_k q is
    returned as log-probabilities of one member (1, N, K)."""

    method: ClassVar[str] = "histogram"
    edges: Tensor
    values: Tensor

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return self.values.shape[0]

    @classmethod
    def fit(cls, logits: Tensor, labels: Tensor, *, num_bins: int = 15) -> HistogramBinning:
        if isinstance(num_bins, bool) or not isinstance(num_bins, numbers.Integral):
            raise TypeError(f"num_bins must be an int, got {num_bins!r}")
        z, y = _check_inputs(logits, labels)
        N, K = z.shape[1:]
        if not 1 <= num_bins <= N:
            raise ValueError(
                f"num_bins must be in 1..N = {N} (validation examples), got {num_bins}"
            )
        p = z.softmax(-1).mean(0).T  # (K, N)
        # edge j: the value of rank ⌊jN/B⌋ (torch.quantile refuses more than 2^24 values)
        ranks = torch.arange(1, num_bins, device=z.device) * N // num_bins
        edges = p.sort(dim=1).values[:, ranks].contiguous()  # (K, B − 1)
        bins = _bin_index(edges, p)  # (K, N)
        is_class = y.unsqueeze(0) == torch.arange(K, device=z.device).unsqueeze(1)  # (K, N)
        positives = torch.zeros(K, num_bins, dtype=torch.float64, device=z.device)
        counts = torch.zeros_like(positives)
        positives.scatter_add_(1, bins, is_class.double())
        counts.scatter_add_(1, bins, torch.ones_like(p))
        return cls(edges, (positives + 1) / (counts + 2))

    def _map(self, z: Tensor) -> Tensor:
        edges, values = self.edges.to(z.device), self.values.to(z.device)
        p = z.softmax(-1).mean(0).T  # (K, N)
        q = values.gather(1, _bin_index(edges, p)).T  # (N, K), every entry > 0
        return (q / q.sum(-1, keepdim=True)).log().unsqueeze(0)  # (1, N, K)


def _bin_index(edges: Tensor, p: Tensor) -> Tensor:
    """Per class, the number of inner edges <= each value: bin indices (K, N) in 0..B−1."""
    return torch.searchsorted(edges, p.contiguous(), right=True)


CALIBRATORS: dict[str, type[Calibrator]] = {
    "temperature": TemperatureScaling,
    "vector": VectorScaling,
    "matrix": MatrixScaling,
    "histogram": HistogramBinning,
}
"""The calibrators of :func:`fit_calibrator`, by name."""


def fit_calibrator(method: str, logits: Tensor, labels: Tensor, **options: Any) -> Calibrator:
    """Fit a post-hoc calibrator on validation logits; apply it to test logits.

    Args:
        method: one of :data:`CALIBRATORS`.
        logits: validation logits (M, N, K) of the members, or (N, K) of one model.
        labels: validation class indices (N,).
        **options: ``mode`` (temperature), ``off_diagonal`` (matrix: λ >= 0, default 0.01),
            ``num_bins`` (histogram: B, default 15).

    Returns:
        A frozen :class:`Calibrator`.

    Raises:
        ValueError: an unknown method; bad shapes, labels out of range, NaN or +inf logits; an
            option out of range.
        TypeError: an option the method does not take; non-floating logits or non-integer labels.

    >>> g = torch.Generator().manual_seed(0)
    >>> logits = 3 * torch.randn(4, 500, 10, generator=g)
    >>> labels = torch.randint(0, 10, (500,), generator=g)
    >>> fit_calibrator("vector", logits, labels).apply(logits).shape
    torch.Size([4, 500, 10])
    """
    if method not in CALIBRATORS:
        raise ValueError(f"unknown calibrator {method!r}; choose one of {list(CALIBRATORS)}")
    return CALIBRATORS[method].fit(logits, labels, **options)
