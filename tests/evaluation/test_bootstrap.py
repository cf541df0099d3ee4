"""Paired bootstrap intervals (snens.evaluation.bootstrap): the metrics they resample are
snens.metrics', a difference that is there on every example is found exactly, the intervals
cover the true difference about 95 % of the time, and seeds widen them."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from snens import metrics
from snens.evaluation.bootstrap import (
    Examples,
    Interval,
    auroc_bootstrap,
    paired_bootstrap,
    paired_bootstraps,
    verdict,
)

K = 5


def _probs(n: int, sharpness: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, K, (n,), generator=g)
    logits = torch.randn(n, K, generator=g, dtype=torch.float64)
    logits[torch.arange(n), labels] += sharpness
    return logits.softmax(-1), labels


@pytest.mark.parametrize("name", ["accuracy", "nll", "brier", "ece"])
def test_the_metric_on_all_examples_is_snens_metrics(name):
    probs, labels = _probs(3000, 1.5, 0)
    expected = getattr(metrics, name)(probs, labels)
    assert Examples.from_probs(probs, labels).metric(name) == pytest.approx(expected, abs=1e-12)


def test_the_ece_bins_examples_on_an_edge_as_snens_metrics_does():
    # confidences exactly on the bin edges 1/15, 2/15 go to the lower bin, and 1.0 to the last
    probs = torch.tensor(
        [[1 / 15 * 2, 1 - 2 / 15], [0.5, 0.5], [1.0, 0.0], [0.2, 0.8]], dtype=torch.float64
    )
    labels = torch.tensor([0, 1, 0, 0])
    examples = Examples.from_probs(probs, labels)
    assert examples.metric("ece") == pytest.approx(metrics.ece(probs, labels), abs=1e-15)


def test_a_difference_on_every_example_is_found_exactly():
    probs, labels = _probs(400, 2.0, 1)
    a = Examples.from_probs(probs, labels)
    # B: the same predictions, its NLL 0.1 higher on every example
    b = Examples(a.nll + 0.1, a.brier, a.confidence, a.correct, a.labels)
    diff = paired_bootstrap([a], [b], "nll", resamples=500)
    assert diff.estimate == pytest.approx(-0.1, abs=1e-12)
    assert diff.low == pytest.approx(-0.1, abs=1e-12) and diff.high == pytest.approx(
        -0.1, abs=1e-12
    )
    assert verdict(diff) == "better" and verdict(paired_bootstrap([b], [a], "nll")) == "worse"
    same = paired_bootstrap([a], [a], "ece", resamples=200)
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0)
    assert verdict(same) == "level"
    accuracy = paired_bootstrap([a], [b], "accuracy", resamples=200)
    assert (accuracy.low, accuracy.high) == (0.0, 0.0)


def test_the_interval_covers_the_true_difference_about_95_percent_of_the_time():
    # two fixed classifiers of a population; each trial draws a test set of 300 from it
    population, labels = _probs(60_000, 1.0, 2)
    g = torch.Generator().manual_seed(3)
    other = (
        population.log() + 0.3 * torch.randn(population.shape, generator=g, dtype=torch.float64)
    ).softmax(-1)
    truth = metrics.nll(population, labels) - metrics.nll(other, labels)
    rng = np.random.default_rng(4)
    covered = 0
    trials = 120
    for t in range(trials):
        idx = torch.from_numpy(rng.choice(len(labels), 300, replace=False))
        a = Examples.from_probs(population[idx], labels[idx])
        b = Examples.from_probs(other[idx], labels[idx])
        diff = paired_bootstrap([a], [b], "nll", resamples=400, seed=t)
        covered += diff.low <= truth <= diff.high
    assert 0.88 <= covered / trials <= 0.99, covered / trials


def test_a_bound_that_reads_zero_does_not_exclude_zero():
    """The verdict reads the interval at the decimals it is shown with: an upper bound of
    −3e-5 prints as −0.0000, so the interval touches 0 and the word is "level"; −1e-4 does
    not."""
    touching = Interval("nll", -0.0172, -0.0370, -3e-5, 0.95, 2000)
    assert str(touching) == "-0.0172 [-0.0370, -0.0000]"
    assert not touching.excludes_zero() and verdict(touching) == "level"
    clear = Interval("nll", -0.0172, -0.0370, -1e-4, 0.95, 2000)
    assert str(clear) == "-0.0172 [-0.0370, -0.0001]"
    assert clear.excludes_zero() and verdict(clear) == "better"
    above = Interval("auroc", 0.02, 4e-5, 0.04, 0.95, 2000)
    assert (
        verdict(above) == "level"
        and verdict(Interval("auroc", 0.02, 6e-5, 0.04, 0.95, 2000)) == "better"
    )


def test_pairing_narrows_the_interval_and_seeds_widen_it():
    probs, labels = _probs(1000, 1.5, 5)
    a = Examples.from_probs(probs, labels)
    g = torch.Generator().manual_seed(6)
    noisy = (
        probs.log() + 0.2 * torch.randn(probs.shape, generator=g, dtype=torch.float64)
    ).softmax(-1)
    b = Examples.from_probs(noisy, labels)
    paired = paired_bootstrap([a], [b], "nll")
    # one model's own sampling spread (A against a constant) is wider than the paired Δ's
    flat = Examples(np.full(len(a), a.nll.mean()), a.brier, a.confidence, a.correct, a.labels)
    alone = paired_bootstrap([a], [flat], "nll")
    assert paired.high - paired.low < 0.5 * (alone.high - alone.low)
    # a second seed of A that differs a lot: the estimate is the mean over seeds, and the
    # interval takes in the seeds' spread
    worse = Examples(a.nll + 0.2, a.brier, a.confidence, a.correct, a.labels)
    two = paired_bootstrap([a, worse], [b], "nll")
    assert two.estimate == pytest.approx(paired.estimate + 0.1, abs=1e-12)
    assert two.high - two.low > 2 * (paired.high - paired.low)
    assert paired_bootstrap([a], [b], "nll") == paired  # the same seed, the same interval
    assert paired_bootstrap([a], [b], "nll", seed=1) != paired


def test_examples_round_trip_through_arrays():
    probs, labels = _probs(50, 1.0, 7)
    examples = Examples.from_probs(probs, labels)
    back = Examples.from_arrays(examples.arrays("test/"), "test/")
    assert np.array_equal(back.labels, examples.labels)
    np.testing.assert_allclose(back.nll, examples.nll, rtol=1e-6)
    assert back.metric("ece") == pytest.approx(examples.metric("ece"), abs=1e-6)


def test_bad_input_is_named():
    probs, labels = _probs(20, 1.0, 8)
    a = Examples.from_probs(probs, labels)
    other = Examples.from_probs(*_probs(20, 1.0, 9))
    with pytest.raises(ValueError, match="labels differ"):
        paired_bootstrap([a], [other], "nll")
    with pytest.raises(TypeError, match="lists of Examples"):
        paired_bootstrap(a, [a], "nll")
    with pytest.raises(ValueError, match="unknown metric 'auc'"):
        paired_bootstrap([a], [a], "auc")
    with pytest.raises(ValueError, match="resamples must be an int >= 100"):
        paired_bootstrap([a], [a], "nll", resamples=10)
    with pytest.raises(ValueError, match=r"probs must be \(N, K\)"):
        Examples.from_probs(probs[0], labels)
    with pytest.raises(ValueError, match="labels must be in 0..4"):
        Examples.from_probs(probs, labels + 5)


def test_auroc_bootstrap_finds_a_better_detector():
    rng = np.random.default_rng(0)
    inside = rng.normal(0, 1, 300)
    outside_good, outside_poor = rng.normal(2, 1, 200), rng.normal(0.3, 1, 200)
    diff = auroc_bootstrap([(inside, outside_good)], [(inside, outside_poor)], resamples=200)
    assert diff.low > 0.2 and verdict(diff) == "better"
    same = auroc_bootstrap([(inside, outside_good)], [(inside, outside_good)], resamples=100)
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0)


def test_comparisons_drawn_together_are_the_separate_calls_bit_for_bit():
    probs, labels = _probs(300, 1.5, 10)
    small, small_labels = _probs(120, 1.0, 11)

    def seeds(p, y, count, base):
        out = []
        for s in range(count):
            g = torch.Generator().manual_seed(base + s)
            noisy = p.log() + 0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            out.append(Examples.from_probs(noisy.softmax(-1), y))
        return out

    a, b, c = seeds(probs, labels, 2, 20), seeds(probs, labels, 3, 30), seeds(probs, labels, 2, 40)
    d, e = seeds(small, small_labels, 1, 50), seeds(small, small_labels, 2, 60)
    # three groups of draws: (300, 2 seeds, 3 seeds), (300, 2, 2) and (120, 1, 2)
    wanted = [(a, b, m) for m in ("nll", "ece", "accuracy")]
    wanted += [(a, c, "brier"), (d, e, "ece"), (b, a, "nll"), (a, c, "nll"), (d, e, "nll")]
    together = paired_bootstraps(wanted, resamples=300, seed=3)
    apart = [paired_bootstrap(x, y, m, resamples=300, seed=3) for x, y, m in wanted]
    assert together == apart
    assert [i.metric for i in together] == [m for _, _, m in wanted]
    assert len({i.low for i in together}) == len(wanted)  # no two share an answer by accident
    with pytest.raises(ValueError, match="labels differ"):
        paired_bootstraps([(a, b, "nll"), (a, d, "nll")])


def _auroc_bootstrap_by_ranks(a, b, resamples, seed):
    """The AUROC bootstrap as its definition, from the checkout's benchmarks/bootstrap.py."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bootstrap.py"
    spec = importlib.util.spec_from_file_location("bootstrap_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    return benchmark.auroc_bootstrap_by_ranks(a, b, resamples, seed)


def test_the_auroc_of_a_resample_is_the_rank_based_auroc_bit_for_bit():
    rng = np.random.default_rng(1)
    # scores rounded to a coarse grid: many ties within and across the two sets
    a = [(np.round(rng.normal(0, 1, 150), 1), np.round(rng.normal(1, 1, 90), 1)) for _ in range(2)]
    b = [
        (np.round(rng.normal(0, 1, 150), 1), np.round(rng.normal(0.5, 1, 90), 1)) for _ in range(3)
    ]
    found = auroc_bootstrap(a, b, resamples=150, seed=4)
    assert (found.estimate, found.low, found.high) == _auroc_bootstrap_by_ranks(a, b, 150, 4)
    with pytest.raises(ValueError, match="NaN or inf"):
        auroc_bootstrap([(np.array([0.1, np.nan]), np.array([0.3]))], [(np.zeros(2), np.ones(1))])


def test_a_runs_examples_give_its_final_metrics(tmp_path):
    """The engine keeps examples.npz beside final.json: its test, temperature-scaled,
    corrupted and OOD examples give the run's own metrics."""
    import json

    from snens.engine.config import load_config
    from snens.engine.presets import preset
    from snens.engine.runs import read_examples
    from snens.engine.train import train

    config = load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(tmp_path))}",
            "name='run'",
            "threads=1",
            "data.train_examples=300",
            "data.validation_examples=200",
            "data.test_examples=300",
            "data.ood_examples=200",
            "data.corruptions=true",
            "data.corruption_names=['contrast']",
            "data.severities=[5]",
            "data.corruption_examples=100",
            "optim.epochs=1",
            "model.options.width=8",
        ],
    )
    run = train(config, progress=False, log=None)
    final = json.loads((run / "final.json").read_text())["metrics"]
    arrays = read_examples(run)
    for prefix, key in (
        ("test/", "test/"),
        ("test_ts/", "test_ts/"),
        ("shift/contrast/5/", "shift/contrast/5/"),
    ):
        examples = Examples.from_arrays(arrays, prefix)
        for name in ("accuracy", "nll", "brier", "ece"):
            assert examples.metric(name) == pytest.approx(final[key + name], abs=2e-6), key + name
    inside, outside = arrays["test/ood/msp"], arrays["ood/mnist_5k/msp"]
    auroc = metrics.auroc(torch.from_numpy(inside), torch.from_numpy(outside))
    assert auroc == pytest.approx(final["ood/mnist_5k/auroc"], abs=1e-6)
    assert set(arrays) >= {"test/ood/energy", "ood/mnist_5k/mutual_information"}
