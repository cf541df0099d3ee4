"""The paired bootstrap's cost: many comparisons drawn together, and the AUROC bootstrap.

Two measurements on synthetic predictions of the size the studies compare (10,000 test
examples, 10 classes; OOD scores of 10,000 in- and 5,000 out-of-distribution examples):

* ``paired``: the comparisons of one pair of methods on two sets (raw and temperature-scaled)
  and four metrics, by eight :func:`~snens.evaluation.bootstrap.paired_bootstrap` calls
  against one :func:`~snens.evaluation.bootstrap.paired_bootstraps` call (the same intervals,
  checked);
* ``auroc``: :func:`~snens.evaluation.bootstrap.auroc_bootstrap` against its definition, the
  rank-based :func:`snens.metrics.auroc` of every resample (the same interval, checked).

    python benchmarks/bootstrap.py                 # 2 seeds a method, one thread
    python benchmarks/bootstrap.py --seeds 3 --repeats 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch

from snens import metrics
from snens.evaluation.bootstrap import (
    Examples,
    auroc_bootstrap,
    paired_bootstrap,
    paired_bootstraps,
)

N, K, N_OOD = 10_000, 10, 5_000
METRICS = ("nll", "ece", "accuracy", "brier")


def _method(labels: torch.Tensor, seeds: int, base: int) -> dict[str, list[Examples]]:
    """Per seed, a method's Examples on the test set and on its temperature-scaled copy."""
    sets: dict[str, list[Examples]] = {"test": [], "test_ts": []}
    for s in range(seeds):
        g = torch.Generator().manual_seed(base + s)
        logits = torch.randn(len(labels), K, generator=g, dtype=torch.float64)
        logits[torch.arange(len(labels)), labels] += 2.0
        sets["test"].append(Examples.from_probs(logits.softmax(-1), labels))
        sets["test_ts"].append(Examples.from_probs((logits / 1.3).softmax(-1), labels))
    return sets


def _scores(seeds: int, shift: float, base: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(base)
    return [
        (rng.normal(0, 1, N).astype(np.float32), rng.normal(shift, 1, N_OOD).astype(np.float32))
        for _ in range(seeds)
    ]


def auroc_bootstrap_by_ranks(a, b, resamples: int, seed: int) -> tuple[float, float, float]:
    """The AUROC bootstrap written as its definition: the rank-based :func:`snens.metrics.auroc`
    of each resample, drawn as :func:`~snens.evaluation.bootstrap.auroc_bootstrap` draws them.
    (estimate, low, high); ``tests/evaluation/test_bootstrap.py`` holds the library to it."""
    n_in, n_out = len(a[0][0]), len(a[0][1])

    def value(pairs, i, o):
        return float(
            np.mean([metrics.auroc(torch.as_tensor(x[i]), torch.as_tensor(y[o])) for x, y in pairs])
        )

    everything = (np.arange(n_in), np.arange(n_out))
    estimate = value(a, *everything) - value(b, *everything)
    rng = np.random.default_rng(seed)
    deltas = []
    for _ in range(resamples):
        i, o = rng.integers(0, n_in, n_in), rng.integers(0, n_out, n_out)
        pick_a = [a[k] for k in rng.integers(0, len(a), len(a))]
        pick_b = [b[k] for k in rng.integers(0, len(b), len(b))]
        deltas.append(value(pick_a, i, o) - value(pick_b, i, o))
    tail = (1 - 0.95) / 2  # the percentile interval's tails, as the library computes them
    low, high = np.quantile(deltas, [tail, 1 - tail])
    return estimate, float(low), float(high)


def _timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2, help="seeds of each method")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (the median)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    labels = torch.randint(0, K, (N,), generator=torch.Generator().manual_seed(0))
    a, b = _method(labels, args.seeds, 100), _method(labels, args.seeds, 200)
    wanted = [(a[s], b[s], m) for s in ("test", "test_ts") for m in METRICS]
    apart_s, apart = _timed(lambda: [paired_bootstrap(*w) for w in wanted], args.repeats)
    together_s, together = _timed(lambda: paired_bootstraps(wanted), args.repeats)
    if apart != together:
        raise SystemExit("paired_bootstraps gave other intervals than separate calls")

    sa, sb = _scores(args.seeds, 1.0, 300), _scores(args.seeds, 0.8, 400)
    resamples = 200
    counted_s, counted = _timed(lambda: auroc_bootstrap(sa, sb, resamples=resamples), args.repeats)
    ranked_s, ranked = _timed(lambda: auroc_bootstrap_by_ranks(sa, sb, resamples, 0), args.repeats)
    if (counted.estimate, counted.low, counted.high) != ranked:
        raise SystemExit("auroc_bootstrap's interval is not the rank-based one")

    print(
        f"# paired bootstrap, {platform.machine()}, torch {torch.__version__}, "
        f"{args.threads} thread(s), {args.seeds} seeds a method, N={N:,}, medians of "
        f"{args.repeats}\n"
    )
    print("| what | as before (s) | now (s) | speed-up |")
    print("|---|---|---|---|")
    print(
        f"| 8 comparisons (2 sets × 4 metrics), 2,000 resamples: separate calls vs "
        f"`paired_bootstraps` | {apart_s:.2f} | {together_s:.2f} | {apart_s / together_s:.1f}× |"
    )
    print(
        f"| AUROC, {resamples} resamples ({N:,} in, {N_OOD:,} OOD): rank-based AUROC per "
        f"resample vs counted | {ranked_s:.2f} | {counted_s:.2f} | {ranked_s / counted_s:.1f}× |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
