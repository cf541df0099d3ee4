"""Paired bootstrap confidence intervals of the difference between two methods' metrics.

Δ = mean_s metric(A_s) − mean_s metric(B_s) over the seeds s of each method, and its percentile
interval over R resamples, each drawing the N test examples with replacement (the same draw
for both methods: paired) and each method's seeds with replacement. A difference is a win only
when its 95 % interval excludes 0 (:func:`verdict`)::

    a = [Examples.from_probs(p, y) for p in probs_of_each_seed_of_A]
    diff = paired_bootstrap(a, b, "nll")          # Interval(estimate, low, high, …)
    verdict(diff, "nll")                          # "better" | "worse" | "level"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from snens import metrics
from snens.evaluation.protocol import CALIBRATED_PREFIXES, _calibration_map, _score
from snens.metrics.predictive import inner_edges

__all__ = [
    "BOOTSTRAP_METRICS",
    "DECIMALS",
    "Examples",
    "Interval",
    "auroc_bootstrap",
    "paired_bootstrap",
    "paired_bootstraps",
    "run_examples",
    "verdict",
]

#: The metrics an interval is computed for, and whether higher is better.
BOOTSTRAP_METRICS: dict[str, bool] = {"accuracy": True, "nll": False, "brier": False, "ece": False}
_FIELDS = ("nll", "brier", "confidence", "correct")
#: Equal-width bins of the ECE, the field's convention (as :func:`snens.metrics.ece`).
NUM_BINS = 15
#: Replicates processed at once (R × N float64 weights).
_CHUNK = 200


@dataclass(frozen=True)
class Examples:
    """Per-example quantities (N,) of one model's predictions on one labelled set, enough for the
    accuracy, NLL, Brier score and ECE of any resample: ``nll`` −log p(y), ``brier``
    Σ_k (p_k − 1[k = y])², ``confidence`` max_k p_k, ``correct`` 1.0 or 0.0, and the int64
    ``labels`` (pairing checks two models scored the same examples)."""

    nll: np.ndarray
    brier: np.ndarray
    confidence: np.ndarray
    correct: np.ndarray
    labels: np.ndarray

    @classmethod
    def from_probs(cls, probs: Tensor, labels: Tensor) -> Examples:
        """The per-example quantities of predicted probabilities (N, K) and labels (N,).

        Raises:
            ValueError: shapes that do not match, probabilities that are not finite, or labels
                outside 0..K−1.
        """
        given = torch.as_tensor(probs)
        if not given.is_floating_point():
            raise ValueError(f"probs must be floating-point probabilities, got {given.dtype}")
        p = given.detach().to("cpu", torch.float64)
        y = torch.as_tensor(labels).detach().to("cpu")
        if p.dim() != 2 or y.shape != (p.shape[0],):
            raise ValueError(
                f"probs must be (N, K) and labels (N,), got {tuple(p.shape)} and {tuple(y.shape)}"
            )
        if not torch.isfinite(p).all():
            raise ValueError("probs contain NaN or inf")
        y = y.long()
        if len(y) and (y.min() < 0 or y.max() >= p.shape[1]):
            raise ValueError(f"labels must be in 0..{p.shape[1] - 1}")
        true = p.gather(1, y[:, None]).squeeze(1)
        # as snens.metrics.nll clamps: a probability of 0 costs −log(tiny), not inf
        nll = -torch.where(true > 0, true, torch.finfo(given.dtype).tiny).log()
        one_hot = torch.nn.functional.one_hot(y, p.shape[1]).to(p.dtype)
        confidence, predicted = p.max(1)
        return cls(
            nll=nll.numpy(),
            brier=(p - one_hot).square().sum(1).numpy(),
            confidence=confidence.numpy(),
            correct=(predicted == y).to(torch.float64).numpy(),
            labels=y.numpy(),
        )

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str = "") -> Examples:
        """Read back what :meth:`arrays` wrote (keys ``<prefix>nll``, …).

        Raises:
            KeyError: a field is missing. ValueError: the fields' lengths differ.
        """
        values = {f: np.asarray(arrays[prefix + f], dtype=np.float64) for f in _FIELDS}
        labels = np.asarray(arrays[prefix + "labels"], dtype=np.int64)
        lengths = {len(v) for v in values.values()} | {len(labels)}
        if len(lengths) != 1:
            raise ValueError(f"{prefix or 'examples'}: fields of different lengths {lengths}")
        return cls(**values, labels=labels)

    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """The fields as ``{<prefix><field>: array}`` to save: float32 values, ``correct`` as
        uint8 and int32 labels."""
        out = {prefix + f: getattr(self, f).astype(np.float32) for f in _FIELDS[:3]}
        out[prefix + "correct"] = self.correct.astype(np.uint8)
        out[prefix + "labels"] = self.labels.astype(np.int32)
        return out

    def __len__(self) -> int:
        return len(self.labels)

    def metric(self, name: str) -> float:
        """The metric on all the examples (as :mod:`snens.metrics` computes it)."""
        return float(_weighted([self], name, np.ones((1, len(self))))[0, 0])


#: Decimals a difference and its interval are shown with, and read at by
#: :meth:`Interval.excludes_zero`.
DECIMALS = 4


@dataclass(frozen=True)
class Interval:
    """A difference Δ between two methods (``estimate``, on every example and seed) and its
    percentile bootstrap interval [``low``, ``high``] of confidence ``level`` over ``resamples``."""

    metric: str
    estimate: float
    low: float
    high: float
    level: float
    resamples: int

    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly on one side of 0 at the :data:`DECIMALS` it is
        shown with: a bound that reads ±0.0000 touches 0, so no verdict says "better" or
        "worse" beside an interval that shows 0 as its end."""
        return round(self.low, DECIMALS) > 0 or round(self.high, DECIMALS) < 0

    def __str__(self) -> str:
        d = DECIMALS
        return f"{self.estimate:+.{d}f} [{self.low:+.{d}f}, {self.high:+.{d}f}]"


def run_examples(
    outputs: Mapping[str, Tensor],
    calibrators: Sequence[str] = ("temperature",),
    ood_scores: Sequence[str] = ("msp", "entropy", "mutual_information", "max_logit", "energy"),
) -> dict[str, np.ndarray]:
    """What a run's intervals need, from its kept member logits, as arrays to save: the
    :class:`Examples` fields of every labelled set (``test/<field>``, ``shift/<name>/<s>/…``,
    ``domain/<name>/…``), the same after each calibrator fitted on the validation logits (under
    the prefixes of :data:`~snens.evaluation.protocol.CALIBRATED_PREFIXES`: ``test_ts/…``,
    ``shift_ts/…``), and each OOD score of the OOD and test examples (``ood/<set>/<score>``,
    ``test/ood/<score>``).

    Raises:
        KeyError: no ``test`` or ``test_labels``; an unknown calibrator.
        ValueError: an unknown OOD score.
    """
    known = {**metrics.OOD_SCORES, **metrics.LOGIT_OOD_SCORES}
    unknown = [s for s in ood_scores if s not in known]
    if unknown:
        raise ValueError(f"unknown OOD scores {unknown}; choose among {', '.join(known)}")
    arrays: dict[str, np.ndarray] = {}
    other = [k for k in outputs if k.startswith(("shift/", "domain/")) and f"{k}_labels" in outputs]
    sets = ["test", *sorted(other)]
    fitted = calibrators if "val" in outputs and "val_labels" in outputs else ()
    for calibrator in [None, *fitted]:
        # None: the logits as kept; a calibrator as the run's test_ts/… (its final.json's T)
        mapped = _calibration_map(calibrator, outputs) if calibrator else None
        tail = CALIBRATED_PREFIXES[calibrator].removeprefix("test") if calibrator else ""
        for name in sets:
            logits = outputs[name] if mapped is None else mapped(outputs[name])
            examples = Examples.from_probs(logits.softmax(-1).mean(0), outputs[f"{name}_labels"])
            head, _, rest = name.partition("/")
            arrays.update(examples.arrays(f"{head}{tail}/{rest}/" if rest else f"{head}{tail}/"))
    ood_sets = sorted(k for k in outputs if k.startswith("ood/"))
    for score in ood_scores if ood_sets else ():
        for key in ["test", *ood_sets]:
            values = _score(score, outputs[key]).detach().cpu().numpy().astype(np.float32)
            arrays[f"{'test/ood' if key == 'test' else key}/{score}"] = values
    return arrays


def _weighted(seeds: Sequence[Examples], metric: str, weights: np.ndarray) -> np.ndarray:
    """The metric of each seed (R, S) under each row of example weights (R, N) summing to N."""
    n = weights.sum(1, keepdims=True)  # (R, 1)
    out = np.empty((weights.shape[0], len(seeds)))
    for s, ex in enumerate(seeds):
        if metric == "ece":
            # |Σ_i∈bin w_i (conf_i − correct_i)| summed over the bins of snens.metrics.ece, / Σ w
            edges = inner_edges(NUM_BINS)
            bins = torch.bucketize(torch.from_numpy(ex.confidence), edges, right=False).numpy()
            gap = ex.confidence - ex.correct
            per_bin = np.zeros((weights.shape[0], NUM_BINS))
            for b in np.unique(bins):
                where = bins == b
                per_bin[:, b] = weights[:, where] @ gap[where]
            out[:, s] = np.abs(per_bin).sum(1) / n[:, 0]
        else:
            field = "correct" if metric == "accuracy" else metric
            out[:, s] = (weights @ getattr(ex, field)) / n[:, 0]
    return out


def _check_seeds(a: Sequence[Examples], b: Sequence[Examples], metric: str) -> int:
    if metric not in BOOTSTRAP_METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(BOOTSTRAP_METRICS)}")
    if isinstance(a, Examples) or isinstance(b, Examples):
        raise TypeError("a and b are lists of Examples, one per seed; wrap one as [examples]")
    if not a or not b:
        raise ValueError("each method needs at least one seed's Examples")
    first = a[0].labels
    for i, ex in enumerate([*a, *b]):
        if len(ex) != len(first) or not np.array_equal(ex.labels, first):
            raise ValueError(
                f"seed {i} of the two methods scored other examples (labels differ from the "
                "first's); a paired interval compares predictions on one test set"
            )
    return len(first)


def paired_bootstrap(
    a: Sequence[Examples],
    b: Sequence[Examples],
    metric: str,
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Δ = metric(A) − metric(B) and its paired percentile bootstrap interval: each of the
    ``resamples`` draws the N test examples with replacement, the same draw for A and B, and each
    method's seeds with replacement.

    Args:
        a, b: per seed, the methods' :class:`Examples` on the same test examples.
        metric: ``"accuracy"``, ``"nll"``, ``"brier"`` or ``"ece"`` (15 equal-width bins).
        level: the interval's confidence.
        seed: the bootstrap's random seed.

    Returns:
        The :class:`Interval`.

    Raises:
        ValueError: an unknown metric, no seeds, seeds scored on other examples, resamples < 100
            or level outside (0, 1).
        TypeError: ``a`` or ``b`` a single :class:`Examples` instead of a list.
    """
    (interval,) = paired_bootstraps([(a, b, metric)], resamples=resamples, level=level, seed=seed)
    return interval


def paired_bootstraps(
    comparisons: Sequence[tuple[Sequence[Examples], Sequence[Examples], str]],
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> list[Interval]:
    """:func:`paired_bootstrap` of each ``(a, b, metric)``, drawing the resamples once for
    the comparisons alike in N and both numbers of seeds (the intervals equal those of separate
    calls, bit for bit).

    Returns:
        One :class:`Interval` per comparison, in their order.

    Raises:
        As :func:`paired_bootstrap`.
    """
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"resamples must be an int >= 100, got {resamples!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i, (a, b, metric) in enumerate(comparisons):
        n = _check_seeds(a, b, metric)
        groups.setdefault((n, len(a), len(b)), []).append(i)
    found: dict[int, Interval] = {}
    for (n, _, _), members in groups.items():
        intervals = _paired_group([comparisons[i] for i in members], n, resamples, level, seed)
        found.update(zip(members, intervals, strict=True))
    return [found[i] for i in range(len(comparisons))]


def _paired_group(comparisons, n: int, resamples: int, level: float, seed: int) -> list[Interval]:
    full = np.ones((1, n))
    estimates = [
        float(_weighted(a, metric, full).mean() - _weighted(b, metric, full).mean())
        for a, b, metric in comparisons
    ]
    seeds_a, seeds_b = len(comparisons[0][0]), len(comparisons[0][1])
    rng = np.random.default_rng(seed)
    deltas = np.empty((len(comparisons), resamples))
    for start in range(0, resamples, _CHUNK):
        r = min(_CHUNK, resamples - start)
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=r).astype(np.float64)
        picks_a = rng.integers(0, seeds_a, size=(r, seeds_a))
        picks_b = rng.integers(0, seeds_b, size=(r, seeds_b))
        rows = np.arange(r)[:, None]
        for c, (a, b, metric) in enumerate(comparisons):
            values_a, values_b = _weighted(a, metric, weights), _weighted(b, metric, weights)
            mean_a, mean_b = values_a[rows, picks_a].mean(1), values_b[rows, picks_b].mean(1)
            deltas[c, start : start + r] = mean_a - mean_b
    return [
        _percentile_interval(metric, estimate, row, level)
        for (_, _, metric), estimate, row in zip(comparisons, estimates, deltas, strict=True)
    ]


def _percentile_interval(metric: str, estimate: float, deltas: np.ndarray, level: float):
    tail = (1 - level) / 2
    low, high = np.quantile(deltas, [tail, 1 - tail])
    return Interval(metric, estimate, float(low), float(high), level, len(deltas))


class _RankedScores:
    """One seed's in- and out-of-distribution scores, ranked once, so the AUROC of any resample
    is counting: the Mann–Whitney statistic :func:`snens.metrics.auroc` computes, bit for bit."""

    def __init__(self, in_scores: np.ndarray, out_scores: np.ndarray):
        metrics.auroc(torch.as_tensor(in_scores), torch.as_tensor(out_scores))  # its checks
        scores = np.concatenate([in_scores, out_scores]).astype(np.float64)
        _, group = np.unique(scores, return_inverse=True)
        self.groups = int(group.max()) + 1
        self.group_in, self.group_out = group[: len(in_scores)], group[len(in_scores) :]

    def auroc(self, idx_in: np.ndarray, idx_out: np.ndarray) -> float:
        counts = np.bincount(self.group_in[idx_in], minlength=self.groups).astype(np.float64)
        below_or_half = np.cumsum(counts) - counts / 2  # in-examples below a group, ½ of its ties
        u = below_or_half[self.group_out[idx_out]].sum()
        return float(u / (len(idx_in) * len(idx_out)))


def auroc_bootstrap(
    a: Sequence[tuple[np.ndarray, np.ndarray]],
    b: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Δ AUROC (OOD positive) of two methods' OOD scores and its paired bootstrap interval; ``a``
    and ``b`` hold per seed ``(in-distribution scores, OOD scores)`` of the same examples, the
    other arguments as :func:`paired_bootstrap`.

    Raises:
        ValueError: no seeds, or seeds scored on different numbers of examples.
    """
    if not a or not b:
        raise ValueError("each method needs at least one seed's scores")
    n_in, n_out = len(a[0][0]), len(a[0][1])
    if any(len(i) != n_in or len(o) != n_out for i, o in [*a, *b]):
        raise ValueError("every seed must score the same in- and out-of-distribution examples")
    ranked_a = [_RankedScores(np.asarray(i), np.asarray(o)) for i, o in a]
    ranked_b = [_RankedScores(np.asarray(i), np.asarray(o)) for i, o in b]

    def value(seeds, idx_in, idx_out) -> float:
        return float(np.mean([s.auroc(idx_in, idx_out) for s in seeds]))

    all_in, all_out = np.arange(n_in), np.arange(n_out)
    estimate = value(ranked_a, all_in, all_out) - value(ranked_b, all_in, all_out)
    rng = np.random.default_rng(seed)
    deltas = np.empty(resamples)
    for r in range(resamples):
        idx_in, idx_out = rng.integers(0, n_in, n_in), rng.integers(0, n_out, n_out)
        pick_a = [ranked_a[i] for i in rng.integers(0, len(a), len(a))]
        pick_b = [ranked_b[i] for i in rng.integers(0, len(b), len(b))]
        deltas[r] = value(pick_a, idx_in, idx_out) - value(pick_b, idx_in, idx_out)
    return _percentile_interval("auroc", estimate, deltas, level)


def verdict(interval: Interval, metric: str | None = None) -> str:
    """``"better"`` or ``"worse"`` (A against B) when the interval excludes 0, by the metric's
    direction, ``"level"`` otherwise."""
    name = metric or interval.metric
    higher = BOOTSTRAP_METRICS.get(name, name == "auroc")
    if not interval.excludes_zero():
        return "level"
    return "better" if (interval.low > 0) == higher else "worse"
