"""Differences between two groups of finished runs, with paired bootstrap intervals.

A group is the runs of one method under several seeds; each run keeps what its intervals need
per test example (``examples.npz``, :func:`snens.evaluation.bootstrap.run_examples`). Two groups
are compared on the test examples both scored (the same test set, checked by its labels),
raw and after each calibrator, and the difference is worded by its interval: "better" or
"worse" only where the 95 % interval excludes 0, "level" otherwise
(:func:`snens.evaluation.bootstrap.verdict`).

    rows = compare_runs(snens_runs, single_runs)       # one Comparison per set and metric
    cells = comparison_cells(rows)                     # a table's cells, with the words
    describe(rows[0], "σN-Ens", "one model")           # "σN-Ens beats one model on test nll …"
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from snens.engine.runs import read_examples
from snens.evaluation.bootstrap import Examples, Interval, paired_bootstrap, verdict

__all__ = ["COMPARISON_HEADER", "Comparison", "compare_runs", "comparison_cells", "describe"]

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


def _examples(runs: Sequence[str | os.PathLike], prefix: str) -> list[Examples]:
    out = []
    for run in runs:
        try:
            arrays = read_examples(run)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{Path(run) / 'examples.npz'} is missing: the run finished before runs kept "
                "their per-example results; retrain it to compare it with intervals"
            ) from None
        try:
            out.append(Examples.from_arrays(arrays, f"{prefix}/"))
        except KeyError:
            raise KeyError(f"{run} kept no {prefix!r} examples") from None
    return out


def compare_runs(
    a: Sequence[str | os.PathLike],
    b: Sequence[str | os.PathLike],
    *,
    sets: Sequence[str] = SETS,
    metrics: Sequence[str] = METRICS,
    resamples: int = 2000,
    seed: int = 0,
) -> list[Comparison]:
    """A's runs against B's on each set and metric (seeds as the second level of the
    bootstrap; the test examples resampled in pairs).

    Args:
        a, b: run directories of the two methods (one per seed).
        sets: prefixes of ``examples.npz``: ``test``, ``test_ts``, ``shift/<name>/<s>``,
            ``domain_ts/<name>``, …; a set some run lacks is an error naming it.
        metrics: of :data:`snens.evaluation.bootstrap.BOOTSTRAP_METRICS`.
        resamples, seed: of :func:`snens.evaluation.bootstrap.paired_bootstrap`.

    Raises:
        FileNotFoundError: a run without ``examples.npz``.
        KeyError: a set a run did not keep.
        ValueError: runs scored on other test examples, or what
            :func:`~snens.evaluation.bootstrap.paired_bootstrap` refuses.
    """
    out = []
    for name in sets:
        left, right = _examples(a, name), _examples(b, name)
        for metric in metrics:
            interval = paired_bootstrap(left, right, metric, resamples=resamples, seed=seed)
            out.append(Comparison(name, metric, interval, verdict(interval)))
    return out


def describe(comparison: Comparison, a: str, b: str) -> str:
    """One sentence for a comparison: "A beats B on test NLL (Δ −0.021 [−0.030, −0.012])",
    "A is level with B …" or "A is behind B …" — the words follow the interval."""
    what = f"{comparison.set} {comparison.metric}"
    words = {"better": "beats", "worse": "is behind", "level": "is level with"}
    return f"{a} {words[comparison.verdict]} {b} on {what} (Δ {comparison.interval})"


#: The columns of :func:`comparison_cells`.
COMPARISON_HEADER = ("set", "metric", "Δ (A − B)", "95 % interval", "A against B")


def comparison_cells(rows: Sequence[Comparison]) -> list[list[str]]:
    """A table's cells, one row per comparison (:data:`COMPARISON_HEADER`): set, metric,
    Δ (A − B), its 95 % interval and the word for A."""
    return [
        [
            r.set,
            r.metric,
            f"{r.interval.estimate:+.4f}",
            f"[{r.interval.low:+.4f}, {r.interval.high:+.4f}]",
            r.verdict,
        ]
        for r in rows
    ]
