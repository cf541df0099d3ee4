"""Split conformal prediction sets from an ensemble's prediction (Vovk et al., 2005).

A score s(x, y) says how badly class y conforms to the ensemble mean p̄. On a calibration split
of n examples, exchangeable with the test data, q̂ = s_(⌈(n+1)(1−α)⌉) and the sets
C(x) = {y : s(x, y) <= q̂} cover with P(y ∈ C(x)) >= 1 − α. Scores: ``"thr"`` (Sadinle et al.,
2019) s = 1 − p̄_y; ``"aps"`` (Romano et al., 2020) s = ρ(y) + u·p̄_y, ρ(y) the mass of the
classes ranked above y, u ~ U(0, 1) or u = 1; ``"raps"`` (Angelopoulos et al., 2021) APS +
λ·max(0, o(y) − k_reg), o(y) the rank of y. Ties are ranked by class index; sets can be empty.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor

from snens.evaluation._checks import _check_labels, _check_logits, _is_int, _is_real

__all__ = [
    "SCORES",
    "ConformalPredictor",
    "ResampledCoverage",
    "calibrate",
    "class_conditional_coverage",
    "conformal_quantile",
    "coverage",
    "mean_set_size",
    "min_calibration_size",
    "resampled_coverage",
    "size_stratified_coverage",
]

SCORES = ("thr", "aps", "raps")
"""The conformity scores of :func:`calibrate`."""

# RAPS defaults (λ, k_reg)
_PENALTY, _K_REG = 0.01, 5
# a score is at most 1 + λ·K: exact in float64 for any K below 2**31 at λ <= 1e6
_MAX_PENALTY, _MAX_K_REG = 1e6, 2**31
_MAX_SPLITS = 100_000
# size bins of the size-stratified coverage
_SIZE_EDGES = (1, 3, 6, 10, 100, 1000)


def _check_alpha(alpha: Any) -> float:
    if not _is_real(alpha):
        raise TypeError(f"alpha must be a real number in (0, 1), got {alpha!r}")
    if not 0 < alpha < 1:
        raise ValueError(
            f"alpha must lie in (0, 1) (the miscoverage: sets hold the label with probability "
            f">= 1 − alpha), got {alpha!r}; e.g. alpha=0.1 for 90% coverage"
        )
    return float(alpha)


def _exact(alpha: float) -> Fraction:
    """α as written: in floats 1 − 0.7 = 0.30000000000000004, and ⌈10·that⌉ = 4, not 3."""
    return Fraction(repr(alpha))


def _rank(n: int, alpha: float) -> int:
    """k = ⌈(n+1)(1−α)⌉, the rank of q̂ among n calibration scores; refused when k > n."""
    k = math.ceil((n + 1) * (1 - _exact(alpha)))
    if k > n:
        raise ValueError(
            f"a calibration split of n = {n} examples is too small for alpha = {alpha}: the "
            f"conformal quantile is the ⌈(n+1)(1−α)⌉ = {k}-th smallest score; use at least "
            f"n = {min_calibration_size(alpha)} examples, or a larger alpha"
        )
    return k


def min_calibration_size(alpha: float) -> int:
    """The fewest calibration examples, ⌈1/α⌉ − 1, with a conformal quantile at ``alpha``.

    Returns:
        n_min as an int (at least 1).

    Raises:
        TypeError, ValueError: ``alpha`` not a number in (0, 1).

    >>> min_calibration_size(0.1), min_calibration_size(0.05)
    (9, 19)
    """
    return math.ceil(1 / _exact(_check_alpha(alpha))) - 1


def conformal_quantile(scores: Tensor, alpha: float) -> float:
    """The threshold q̂: the ⌈(n+1)(1−α)⌉-th smallest of the true classes' n scores (n,).

    Returns:
        q̂ as a float.

    Raises:
        TypeError, ValueError: ``alpha`` not a number in (0, 1); ``scores`` not 1-D or not finite;
            n < :func:`min_calibration_size` (``alpha``).

    >>> scores = torch.tensor([0.3, 0.1, 0.4, 0.2], dtype=torch.float64)
    >>> conformal_quantile(scores, alpha=0.4)  # k = ⌈5·0.6⌉ = 3
    0.3
    """
    alpha = _check_alpha(alpha)
    if not isinstance(scores, Tensor) or scores.dim() != 1:
        got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"scores must be a 1-D tensor (n,), got {got}")
    if not torch.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf")
    k = _rank(scores.shape[0], alpha)
    return scores.sort().values[k - 1].item()


def _class_scores(p: Tensor, score: str, u: Tensor, penalty: float, k_reg: int) -> Tensor:
    """s(x, y) of every class y: (N, K) from probabilities p (N, K) and one u per example."""
    if score == "thr":
        return 1 - p
    p_sorted, order = p.sort(dim=-1, descending=True, stable=True)  # ties: by class index
    if bool((u == 1).all()):
        # u = 1: summed from the bottom so that the last class scores exactly 1
        below = p_sorted.flip(-1).cumsum(-1).flip(-1) - p_sorted
        s_sorted = 1 - below
    else:
        above_and_own = p_sorted.cumsum(-1)  # ρ(y) + p̄_y at each rank
        s_sorted = above_and_own - (1 - u.unsqueeze(-1)) * p_sorted  # ρ(y) + u·p̄_y
    if score == "raps":
        rank = torch.arange(1, p.shape[-1] + 1, dtype=p.dtype, device=p.device)
        s_sorted = s_sorted + penalty * (rank - k_reg).clamp_min(0)
    return torch.empty_like(p).scatter_(-1, order, s_sorted)


def _uniforms(n: int, randomized: bool, generator: torch.Generator | None) -> Tensor:
    """One u ~ U(0, 1) per example, float64 on the CPU (u = 1 when not randomized)."""
    if not randomized:
        return torch.ones(n, dtype=torch.float64)
    device = generator.device if generator is not None else None
    return torch.rand(n, generator=generator, dtype=torch.float64, device=device).cpu()


@dataclass(frozen=True)
class ConformalPredictor:
    """Split-conformal prediction sets fitted by :func:`calibrate`: C(x) = {y : s(x, y) <= q̂}, with
    ``threshold`` q̂, n = ``num_calibration``, K = ``num_classes``, and ``penalty`` λ and ``k_reg``
    of RAPS (0 for THR and APS)."""

    score: str
    alpha: float
    threshold: float
    num_calibration: int
    num_classes: int
    randomized: bool
    penalty: float
    k_reg: int

    def scores(self, logits: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        """Float64 s(x, y) of every class (N, K) from logits (M, N, K) or (N, K); ``generator``
        draws u of randomized APS and RAPS.

        Raises:
            TypeError, ValueError: logits that are not floating (M, N, K) or (N, K), or whose K
                is not the calibration's.
        """
        p = _check_logits(logits).softmax(-1).mean(0)  # p̄ (N, K)
        if p.shape[-1] != self.num_classes:
            raise ValueError(
                f"the predictor was calibrated on K = {self.num_classes} classes, got logits "
                f"{tuple(logits.shape)}"
            )
        u = _uniforms(p.shape[0], self.randomized, generator).to(p.device)
        return _class_scores(p, self.score, u, self.penalty, self.k_reg)

    def predict(self, logits: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        """Prediction sets (B, K), ``sets[i, y]`` True when y ∈ C(x_i); arguments as :meth:`scores`.

        Raises:
            TypeError, ValueError: as :meth:`scores`.
        """
        return self.scores(logits, generator=generator) <= self.threshold


def calibrate(
    logits: Tensor,
    labels: Tensor,
    alpha: float = 0.1,
    score: str = "aps",
    *,
    randomized: bool | None = None,
    penalty: float | None = None,
    k_reg: int | None = None,
    generator: torch.Generator | None = None,
) -> ConformalPredictor:
    """Fit split-conformal prediction sets on a calibration split of an ensemble's logits, held
    out of training and exchangeable with the test data.

    Args:
        logits: calibration logits (M, n, K) of the members, or (n, K) of one model;
            log-probabilities work as well (−inf entries are allowed).
        labels: calibration class indices (n,).
        alpha: the miscoverage, in (0, 1): sets cover with probability >= 1 − α.
        randomized: draw u ~ U(0, 1) in APS and RAPS (default True); False uses u = 1.
        penalty: λ in [0, 1e6] of RAPS (default 0.01).
        k_reg: k_reg in 0..2**31 of RAPS, the ranks free of penalty (default 5).
        generator: draws the calibration examples' u.

    Returns:
        A frozen :class:`ConformalPredictor`.

    Raises:
        TypeError: an argument of the wrong type (each named).
        ValueError: α outside (0, 1); an unknown score; options the score does not take or out of
            range; bad logits or labels; a split smaller than :func:`min_calibration_size`.

    >>> g = torch.Generator().manual_seed(0)
    >>> logits, labels = torch.randn(4, 200, 10, generator=g), torch.randint(0, 10, (200,))
    >>> fit = calibrate(logits, labels, alpha=0.1, score="thr")
    >>> fit.predict(torch.randn(4, 3, 10, generator=g)).shape
    torch.Size([3, 10])
    """
    alpha = _check_alpha(alpha)
    if score not in SCORES:
        raise ValueError(f"unknown conformal score {score!r}; choose one of {list(SCORES)}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator (or None), got {type(generator).__name__}"
        )
    if randomized is not None and not isinstance(randomized, bool):
        raise TypeError(
            f"randomized must be True, False or None (the score's default), got {randomized!r}"
        )
    if score == "thr" and randomized:
        raise ValueError("score 'thr' has no randomization; leave randomized unset")
    if score != "raps" and (penalty is not None or k_reg is not None):
        raise ValueError(
            f"penalty and k_reg are the regularization of score 'raps', not {score!r}; leave "
            "them unset or use score='raps'"
        )
    penalty, k_reg = _check_raps(penalty, k_reg) if score == "raps" else (0.0, 0)
    randomized = score != "thr" if randomized is None else randomized
    z = _check_logits(logits)
    y = _check_labels(labels, z)
    n, K = y.shape[0], z.shape[-1]
    _rank(n, alpha)  # a split too small is refused before any work
    u = _uniforms(n, randomized, generator).to(z.device)
    scores = _class_scores(z.softmax(-1).mean(0), score, u, penalty, k_reg)  # (n, K)
    q = conformal_quantile(scores.gather(-1, y.unsqueeze(-1)).squeeze(-1), alpha)
    return ConformalPredictor(score, alpha, q, n, K, randomized, penalty, k_reg)


def _check_raps(penalty: Any, k_reg: Any) -> tuple[float, int]:
    penalty = _PENALTY if penalty is None else penalty
    k_reg = _K_REG if k_reg is None else k_reg
    if not _is_real(penalty):
        raise TypeError(f"penalty must be a real number >= 0, got {penalty!r}")
    if not (math.isfinite(penalty) and 0 <= penalty <= _MAX_PENALTY):
        raise ValueError(
            f"penalty (λ of RAPS) must be a number in [0, {_MAX_PENALTY:g}], got {penalty!r}; "
            "λ >= 1 already keeps every penalized class out of the sets"
        )
    if not _is_int(k_reg):
        raise TypeError(f"k_reg must be an int >= 0, got {k_reg!r}")
    if not 0 <= k_reg <= _MAX_K_REG:
        raise ValueError(
            f"k_reg (the ranks RAPS does not penalize) must be an int in 0..2**31, got {k_reg}; "
            "k_reg >= K penalizes no class"
        )
    return float(penalty), int(k_reg)


def _check_sets(sets: Any) -> Tensor:
    if not isinstance(sets, Tensor) or sets.dtype != torch.bool:
        got = sets.dtype if isinstance(sets, Tensor) else type(sets).__name__
        raise TypeError(f"sets must be a boolean tensor (B, K), e.g. predict()'s, got {got}")
    if sets.dim() != 2 or sets.shape[0] == 0:
        raise ValueError(f"sets must be (B, K) with B >= 1, got shape {tuple(sets.shape)}")
    return sets


def _covered(sets: Any, labels: Any) -> tuple[Tensor, Tensor, Tensor]:
    """Checked sets (B, K), labels (B,), and whether each set holds its label (B,)."""
    sets = _check_sets(sets)
    y = _check_labels(labels, sets.unsqueeze(0), "sets")
    return sets, y, sets.gather(-1, y.unsqueeze(-1)).squeeze(-1)


def coverage(sets: Tensor, labels: Tensor) -> float:
    """The empirical coverage: the fraction of ``sets`` (B, K) that hold their label (B,).

    Returns:
        A float in [0, 1].

    Raises:
        TypeError: ``sets`` not boolean, ``labels`` not integer.
        ValueError: bad shapes, labels out of range.

    >>> coverage(torch.tensor([[True, False], [True, True]]), torch.tensor([1, 0]))
    0.5
    """
    _, _, hit = _covered(sets, labels)
    return hit.double().mean().item()


def mean_set_size(sets: Tensor) -> float:
    """The mean number of classes per prediction set (B, K).

    Returns:
        The mean size as a float in [0, K].

    Raises:
        TypeError, ValueError: ``sets`` not a boolean (B, K) tensor.

    >>> mean_set_size(torch.tensor([[True, False], [True, True]]))
    1.5
    """
    return _check_sets(sets).sum(-1).double().mean().item()


def size_stratified_coverage(
    sets: Tensor, labels: Tensor, *, edges: Sequence[int] = _SIZE_EDGES
) -> dict[tuple[int, int], float]:
    """Coverage among the sets (B, K) of each size bin 0..e_1, e_1+1..e_2, …, K of the increasing
    ``edges`` (Angelopoulos et al., 2021).

    Returns:
        ``{(low, high): coverage}`` for the bins that hold a set, in increasing order.

    Raises:
        TypeError, ValueError: as :func:`coverage`; ``edges`` not increasing ints >= 0.

    >>> sets = torch.tensor([[True, False, False], [True, True, True], [False, True, True]])
    >>> size_stratified_coverage(sets, torch.tensor([1, 2, 0]), edges=(1,))
    {(0, 1): 0.0, (2, 3): 0.5}
    """
    sets, _, hit = _covered(sets, labels)
    edges = list(edges)
    ints = all(_is_int(e) for e in edges)
    if not edges or not ints or edges[0] < 0 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges must be increasing ints >= 0, got {edges!r}")
    K = sets.shape[-1]
    highs = [e for e in edges if e < K] + [K]
    sizes = sets.sum(-1)
    result = {}
    for low, high in zip([0] + [h + 1 for h in highs[:-1]], highs):
        in_bin = (sizes >= low) & (sizes <= high)
        if in_bin.any():
            result[(low, high)] = hit[in_bin].double().mean().item()
    return result


def class_conditional_coverage(sets: Tensor, labels: Tensor) -> Tensor:
    """Coverage among the examples of each class (K,), NaN for a class with no example.

    Returns:
        Float64 coverages.

    Raises:
        TypeError, ValueError: as :func:`coverage`.

    >>> sets = torch.tensor([[True, False, False], [True, True, False], [False, True, False]])
    >>> class_conditional_coverage(sets, torch.tensor([0, 1, 0]))
    tensor([0.5000, 1.0000,    nan], dtype=torch.float64)
    """
    sets, y, hit = _covered(sets, labels)
    count = torch.bincount(y, minlength=sets.shape[-1]).double()
    covered = torch.bincount(y, weights=hit.double(), minlength=sets.shape[-1])
    return covered / count  # 0/0 = NaN for an absent class


@dataclass(frozen=True)
class ResampledCoverage:
    """The test coverage's mean and standard deviation, and the mean set size, over ``splits``
    random splits of ``calibration_size`` examples calibrated on, the rest tested."""

    coverage: float
    coverage_std: float
    size: float
    splits: int
    calibration_size: int


def resampled_coverage(
    logits: Tensor,
    labels: Tensor,
    alpha: float = 0.1,
    score: str = "aps",
    *,
    splits: int = 200,
    calibration_size: int | None = None,
    generator: torch.Generator | None = None,
    **options: Any,
) -> ResampledCoverage:
    """Calibrate on a random ``calibration_size`` of held-out examples (default: half), measure
    coverage and set size on the rest, ``splits`` times (drawn by ``generator``, default seeded
    0). On exchangeable data the mean coverage lies in [1 − α, 1 − α + 1/(n+1)]. The other
    arguments, and ``randomized``, ``penalty``, ``k_reg``, are :func:`calibrate`'s.

    Returns:
        A :class:`ResampledCoverage`.

    Raises:
        TypeError, ValueError: as :func:`calibrate`; ``splits`` not an int >= 2;
            ``calibration_size`` not an int that leaves a test example, or too small for α.

    >>> g = torch.Generator().manual_seed(0)
    >>> logits = torch.randn(4, 1000, 10, generator=g)
    >>> labels = torch.distributions.Categorical(logits=logits.mean(0)).sample()
    >>> check = resampled_coverage(logits, labels, alpha=0.1, score="thr", splits=50)
    >>> check.calibration_size, round(check.coverage, 1)
    (500, 0.9)
    """
    z = _check_logits(logits)
    y = _check_labels(labels, z)
    n = y.shape[0]
    if not _is_int(splits) or not 2 <= splits <= _MAX_SPLITS:
        raise ValueError(
            f"splits must be an int in 2..{_MAX_SPLITS:,} (a spread needs two), got {splits!r}"
        )
    size = n // 2 if calibration_size is None else calibration_size
    if not _is_int(size) or not 0 < size < n:
        raise ValueError(
            f"calibration_size must be an int in [1, {n - 1}] for {n} examples (the rest are "
            f"measured), got {calibration_size!r}"
        )
    _rank(int(size), _check_alpha(alpha))  # refused before any work
    generator = torch.Generator().manual_seed(0) if generator is None else generator
    covered, sizes = [], []
    for _ in range(int(splits)):
        order = torch.randperm(n, generator=generator).to(y.device)
        fit, held = order[:size], order[size:]
        predictor = calibrate(z[:, fit], y[fit], alpha, score, generator=generator, **options)
        sets = predictor.predict(z[:, held], generator=generator)
        covered.append(coverage(sets, y[held]))
        sizes.append(mean_set_size(sets))
    mean = math.fsum(covered) / len(covered)
    std = math.sqrt(math.fsum((c - mean) ** 2 for c in covered) / (len(covered) - 1))
    return ResampledCoverage(mean, std, math.fsum(sizes) / len(sizes), int(splits), int(size))
