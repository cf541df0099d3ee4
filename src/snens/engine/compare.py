"""Differences between two groups of finished runs, with paired bootstrap intervals.

A group is the runs of one method, one per seed, each with its ``examples.npz``. A difference
is "better" or "worse" only where its 95 % interval excludes 0, "level" otherwise.

    rows = compare_runs(snens_runs, single_runs)       # one Comparison per set and metric
    cells = comparison_cells(rows)                     # a table's cells, with the words
    describe(rows[0], "σN-Ens", "one model")           # "σN-Ens beats one model on test nll …"
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from snens.engine.runs import read_examples
from snens.evaluation.bootstrap import (
    Examples,
    Interval,
    auroc_bootstrap,
    paired_bootstraps,
    verdict,
)

__all__ = [
    "COMPARISON_HEADER",
    "Comparison",
    "compare_arrays",
    "compare_ood",
    "compare_runs",
    "comparison_cells",
    "describe",
    "run_arrays",
]

#: What is compared by default: the test set raw and after temperature scaling.
SETS = ("test", "test_ts")
METRICS = ("nll", "ece", "accuracy", "brier")


@dataclass(frozen=True)
class Comparison:
    """A's metric minus B's on one set, with its interval and its word."""

    set: str
    metric: str
    interval: Interval
    verdict: str  # "better", "worse" or "level" (for A against B)


def run_arrays(runs: Sequence[str | os.PathLike]) -> list[dict[str, np.ndarray]]:
    """Each run's ``examples.npz``.

    Raises:
        FileNotFoundError: a run without one, named.
    """
    out = []
    for run in runs:
        try:
            out.append(read_examples(run))
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{Path(run) / 'examples.npz'} is missing: the run finished before runs kept "
                "their per-example results; retrain it to compare it with intervals"
            ) from None
    return out


def _examples(arrays: Sequence[Mapping[str, np.ndarray]], prefix: str) -> list[Examples]:
    try:
        return [Examples.from_arrays(a, f"{prefix}/") for a in arrays]
    except KeyError:
        raise KeyError(f"a run kept no {prefix!r} examples") from None


def compare_runs(
    a: Sequence[str | os.PathLike],
    b: Sequence[str | os.PathLike],
    *,
    sets: Sequence[str] = SETS,
    metrics: Sequence[str] = METRICS,
    resamples: int = 2000,
    seed: int = 0,
) -> list[Comparison]:
    """A's runs against B's (run directories, one per seed) on each set (a prefix of
    ``examples.npz``) and metric: a paired bootstrap over examples, seeds as a second level.

    Raises:
        FileNotFoundError: a run without ``examples.npz``.
        KeyError: a set a run did not keep.
        ValueError: runs scored on other test examples, or what the bootstrap refuses.
    """
    return compare_arrays(
        run_arrays(a), run_arrays(b), sets=sets, metrics=metrics, resamples=resamples, seed=seed
    )


def compare_arrays(
    a: Sequence[Mapping[str, np.ndarray]],
    b: Sequence[Mapping[str, np.ndarray]],
    *,
    sets: Sequence[str] = SETS,
    metrics: Sequence[str] = METRICS,
    resamples: int = 2000,
    seed: int = 0,
) -> list[Comparison]:
    """:func:`compare_runs` on per-example arrays already at hand, one mapping per seed."""
    wanted = [(name, metric) for name in sets for metric in metrics]
    examples = {name: (_examples(a, name), _examples(b, name)) for name in sets}
    intervals = paired_bootstraps(
        [(*examples[name], metric) for name, metric in wanted], resamples=resamples, seed=seed
    )
    return [
        Comparison(name, metric, interval, verdict(interval))
        for (name, metric), interval in zip(wanted, intervals, strict=True)
    ]


def compare_ood(
    a: Sequence[Mapping[str, np.ndarray]],
    b: Sequence[Mapping[str, np.ndarray]],
    ood_set: str,
    score: str,
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> Comparison:
    """Δ AUROC of one OOD score on one OOD set (``test/ood/<score>`` against
    ``ood/<set>/<score>`` of each seed's arrays), with its interval and word.

    Raises:
        KeyError: a seed's arrays without that score, named.
    """

    def pairs(arrays):
        try:
            return [(x[f"test/ood/{score}"], x[f"ood/{ood_set}/{score}"]) for x in arrays]
        except KeyError as error:
            raise KeyError(f"no {score!r} scores of OOD set {ood_set!r}: {error}") from None

    interval = auroc_bootstrap(pairs(a), pairs(b), resamples=resamples, seed=seed)
    return Comparison(f"ood/{ood_set}/{score}", "auroc", interval, verdict(interval))


def describe(comparison: Comparison, a: str, b: str) -> str:
    """One sentence for a comparison: "A beats B on test NLL (Δ −0.021 [−0.030, −0.012])",
    "A is level with B …" or "A is behind B …" — the words follow the interval."""
    what = f"{comparison.set} {comparison.metric}"
    words = {"better": "beats", "worse": "is behind", "level": "is level with"}
    return f"{a} {words[comparison.verdict]} {b} on {what} (Δ {comparison.interval})"


#: The columns of :func:`comparison_cells`.
COMPARISON_HEADER = ("set", "metric", "Δ (A − B)", "95 % interval", "A against B")


def comparison_cells(rows: Sequence[Comparison]) -> list[list[str]]:
    """A table's cells, one row per comparison (:data:`COMPARISON_HEADER`)."""
    return [[r.set, r.metric, *_interval_cells(r.interval), r.verdict] for r in rows]


def _interval_cells(interval: Interval) -> list[str]:
    estimate, bounds = str(interval).split(" ", 1)
    return [estimate, bounds]
