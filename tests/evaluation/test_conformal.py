"""Split conformal prediction: hand-computed thresholds and sets of THR, APS and RAPS, the
finite-sample quantile, coverage >= 1 − α over many random calibration splits, and the set
metrics."""

import dataclasses
import math
from fractions import Fraction

import pytest
import torch
from torch.testing import assert_close

import snens
from snens.evaluation.conformal import (
    SCORES,
    calibrate,
    class_conditional_coverage,
    conformal_quantile,
    coverage,
    mean_set_size,
    min_calibration_size,
    resampled_coverage,
    size_stratified_coverage,
)

# Calibration probabilities (n = 4, K = 3), passed as log-probabilities (softmax(log p) = p).
# With α = 0.4 the threshold is the ⌈5 · 0.6⌉ = 3rd smallest calibration score.
CAL_PROBS = [[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.2, 0.7, 0.1], [0.8, 0.1, 0.1]]
CAL_LABELS = [0, 1, 1, 0]
TEST_PROBS = [[0.4, 0.35, 0.25], [0.7, 0.2, 0.1], [0.15, 0.3, 0.55]]
ALPHA = 0.4


def _log(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()


def _fit(score: str, **options):
    return calibrate(_log(CAL_PROBS), torch.tensor(CAL_LABELS), ALPHA, score, **options)


def _sets(*rows: tuple[int, ...]) -> torch.Tensor:
    sets = torch.zeros(len(rows), 3, dtype=torch.bool)
    for i, row in enumerate(rows):
        sets[i, list(row)] = True
    return sets


# ------------------------------------------------------------------------------------------------
# Hand-computed thresholds and sets
# ------------------------------------------------------------------------------------------------


def test_thr_hand():
    # s = 1 − p_y: 0.4, 0.6, 0.3, 0.2 -> sorted 0.2, 0.3, 0.4, 0.6: q̂ = 0.4, so y ∈ C iff p_y >= 0.6
    fit = _fit("thr")
    assert fit.threshold == pytest.approx(0.4, abs=1e-12)
    assert (fit.score, fit.num_calibration, fit.num_classes) == ("thr", 4, 3)
    assert not fit.randomized and fit.penalty == 0 and fit.k_reg == 0
    assert torch.equal(fit.predict(_log(TEST_PROBS)), _sets((), (0,), ()))


def test_aps_hand():
    # s = mass of the classes ranked above y plus p_y: 0.6, 0.5 + 0.4, 0.7, 0.8 -> q̂ = 0.8
    fit = _fit("aps", randomized=False)
    assert fit.threshold == pytest.approx(0.8, abs=1e-12)
    # first row: 0.4, 0.75 <= 0.8 < 1.0; second: 0.7 <= 0.8 < 0.9; third: 0.55 <= 0.8 < 0.85
    assert torch.equal(fit.predict(_log(TEST_PROBS)), _sets((0, 1), (0,), (2,)))
    expected = [[0.4, 0.75, 1.0], [0.7, 0.9, 1.0], [1.0, 0.85, 0.55]]
    scores = fit.scores(_log(TEST_PROBS))
    assert_close(scores, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_raps_hand():
    # APS + 0.5 · max(0, rank − 1): 0.6, 0.9 + 0.5, 0.7, 0.8 -> q̂ = 0.8 again, but the second
    # class of the first test row costs 0.75 + 0.5 = 1.25 now: the penalty drops it
    fit = _fit("raps", randomized=False, penalty=0.5, k_reg=1)
    assert fit.threshold == pytest.approx(0.8, abs=1e-12)
    assert (fit.penalty, fit.k_reg) == (0.5, 1)
    assert torch.equal(fit.predict(_log(TEST_PROBS)), _sets((0,), (0,), (2,)))
    expected = [[0.4, 1.25, 2.0], [0.7, 1.4, 2.0], [2.0, 1.35, 0.55]]
    scores = fit.scores(_log(TEST_PROBS))
    assert_close(scores, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    # k_reg = 0 penalizes the first rank too: 0.6 + 0.5, 1.4, 0.7 + 0.5, 0.8 + 0.5 -> q̂ = 1.3
    assert _fit("raps", randomized=False, penalty=0.5, k_reg=0).threshold == pytest.approx(1.3)
    # λ = 0 is APS
    assert _fit("raps", randomized=False, penalty=0.0).threshold == pytest.approx(0.8)


@pytest.mark.parametrize("score", ["aps", "raps"])
def test_randomized_scores_hand(score):
    """ρ(y) + u·p_y (+ RAPS's 0.01 · max(0, rank − 5), 0 for K = 3), with one u per example
    drawn as torch.rand(n, generator=g, dtype=torch.float64)."""
    u = torch.rand(4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # the true class's rank: 1, 2, 1, 1; the mass above it: 0, 0.5, 0, 0
    cal = [u[0] * 0.6, 0.5 + u[1] * 0.4, u[2] * 0.7, u[3] * 0.8]
    q = sorted(v.item() for v in cal)[2]
    fit = _fit(score, generator=torch.Generator().manual_seed(0))
    assert fit.randomized and fit.threshold == pytest.approx(q, abs=1e-12)

    v = torch.rand(3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    p = torch.tensor(TEST_PROBS, dtype=torch.float64)
    ranked = p.sort(-1, descending=True).values
    above = ranked.cumsum(-1) - ranked
    expected = torch.zeros(3, 3, dtype=torch.bool)
    order = p.argsort(-1, descending=True)
    for i in range(3):
        for r in range(3):
            expected[i, order[i, r]] = (above[i, r] + v[i] * ranked[i, r]).item() <= q
    sets = fit.predict(_log(TEST_PROBS), generator=torch.Generator().manual_seed(1))
    assert torch.equal(sets, expected)


def test_ensemble_sets_are_those_of_the_mean_of_softmaxes():
    """An ensemble's sets are one model's on log p̄, p̄ = (1/M) Σ_m softmax(z_m)."""
    g = torch.Generator().manual_seed(0)
    cal, test = torch.randn(4, 60, 7, generator=g), torch.randn(4, 40, 7, generator=g)
    labels = torch.randint(0, 7, (60,), generator=g)
    for score in SCORES:
        ens = calibrate(cal, labels, 0.2, score, generator=torch.Generator().manual_seed(3))
        one = calibrate(
            snens.predictive_probs(cal).log(),
            labels,
            0.2,
            score,
            generator=torch.Generator().manual_seed(3),
        )
        assert ens.threshold == pytest.approx(one.threshold, abs=1e-6)
        g_ens, g_one = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
        assert torch.equal(
            ens.predict(test, generator=g_ens),
            one.predict(snens.predictive_probs(test).log(), generator=g_one),
        )


def test_aps_and_raps_sets_are_prefixes_of_the_ranking():
    g = torch.Generator().manual_seed(0)
    cal, test = 2 * torch.randn(200, 10, generator=g), 2 * torch.randn(300, 10, generator=g)
    labels = torch.randint(0, 10, (200,), generator=g)
    order = test.sort(dim=-1, descending=True, stable=True).indices
    for score in ("aps", "raps"):
        for randomized in (True, False):
            fit = calibrate(cal, labels, 0.1, score, randomized=randomized, generator=g)
            ranked = fit.predict(test, generator=g).gather(-1, order)  # by decreasing p
            # once a class is out, every less likely class is out
            assert torch.equal(ranked, ranked.cummin(-1).values)


def test_the_same_generator_gives_the_same_sets():
    g = torch.Generator().manual_seed(0)
    cal, test = torch.randn(100, 5, generator=g), torch.randn(100, 5, generator=g)
    labels = torch.randint(0, 5, (100,), generator=g)

    def sets(seed: int) -> torch.Tensor:
        fit = calibrate(cal, labels, 0.1, "aps", generator=torch.Generator().manual_seed(seed))
        return fit.predict(test, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sets(0), sets(0)) and not torch.equal(sets(0), sets(1))


def test_the_predictor_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _fit("thr").threshold = 1.0


# ------------------------------------------------------------------------------------------------
# The finite-sample quantile
# ------------------------------------------------------------------------------------------------


def test_conformal_quantile_is_the_ceil_rank_score():
    scores = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6], dtype=torch.float64)
    # n = 9: α = 0.1 -> ⌈9⌉ = 9th, α = 0.25 -> ⌈7.5⌉ = 8th, α = 0.5 -> 5th
    assert conformal_quantile(scores, 0.1) == 0.9
    assert conformal_quantile(scores, 0.25) == 0.8
    assert conformal_quantile(scores, 0.5) == 0.5
    # α = 0.7: ⌈10 · 0.3⌉ = 3, though in floats 10 · (1 − 0.7) = 3.0000000000000004
    assert 10 * (1 - 0.7) > 3
    assert conformal_quantile(scores, 0.7) == 0.3


def test_min_calibration_size():
    assert [min_calibration_size(a) for a in (0.1, 0.05, 0.3, 0.5, 0.7)] == [9, 19, 3, 1, 1]
    for alpha in (0.01, 0.05, 0.1, 0.15, 0.2, 0.3, 1 / 3, 0.45):
        least = min_calibration_size(alpha)
        exact = Fraction(repr(alpha))
        assert math.ceil((least + 1) * (1 - exact)) <= least  # the quantile exists at n_min
        assert math.ceil(least * (1 - exact)) > least - 1  # and not at n_min − 1


def test_a_calibration_split_too_small_is_refused_naming_n_alpha_and_the_minimum():
    match = r"n = 8 examples is too small for alpha = 0.1.*= 9-th smallest.*at least n = 9"
    with pytest.raises(ValueError, match=match):
        conformal_quantile(torch.rand(8), 0.1)
    with pytest.raises(ValueError, match=match):
        calibrate(torch.randn(8, 3), torch.zeros(8, dtype=torch.long), alpha=0.1)
    assert conformal_quantile(torch.rand(9), 0.1) <= 1


# ------------------------------------------------------------------------------------------------
# Coverage over random calibration splits
# ------------------------------------------------------------------------------------------------

N_POOL, N_CAL, K, SPLITS, ALPHA_COVER = 3000, 500, 10, 200, 0.1


@pytest.fixture(scope="module")
def pool():
    """Three members' logits (M, N, K) and labels drawn from a known distribution that the
    ensemble does not match: softmax of half the mean logit plus a class bias (the ensemble is
    overconfident and biased, and conformal covers anyway)."""
    g = torch.Generator().manual_seed(0)
    shared = 2 * torch.randn(N_POOL, K, generator=g, dtype=torch.float64)
    logits = shared + 0.5 * torch.randn(3, N_POOL, K, generator=g, dtype=torch.float64)
    truth = (shared / 2 + torch.linspace(-1, 1, K, dtype=torch.float64)).softmax(-1)
    labels = torch.multinomial(truth, 1, generator=g).squeeze(1)
    return logits, labels


@pytest.mark.parametrize(
    ("score", "options"),
    [
        ("thr", {}),
        ("aps", {}),
        ("aps", {"randomized": False}),
        ("raps", {"penalty": 0.05, "k_reg": 2}),
        ("raps", {"penalty": 0.05, "k_reg": 2, "randomized": False}),
    ],
)
def test_coverage_is_at_least_one_minus_alpha_over_random_splits(pool, score, options):
    """Over 200 random calibration/test splits of one pool, the mean coverage lies in
    [1 − α, 1 − α + 1/(n+1)] (the scores are continuous: no ties), within 4 standard errors
    of the mean (per split ~ sqrt(α(1−α)/n) = 0.013); ``resampled_coverage`` is that loop."""
    logits, labels = pool
    g = torch.Generator().manual_seed(1)
    covered, sizes = [], []
    for _ in range(SPLITS):
        perm = torch.randperm(N_POOL, generator=g)
        cal, test = perm[:N_CAL], perm[N_CAL:]
        fit = calibrate(logits[:, cal], labels[cal], ALPHA_COVER, score, generator=g, **options)
        sets = fit.predict(logits[:, test], generator=g)
        covered.append(coverage(sets, labels[test]))
        sizes.append(mean_set_size(sets))
    mean = sum(covered) / SPLITS
    std = (sum((c - mean) ** 2 for c in covered) / (SPLITS - 1)) ** 0.5
    se = std / SPLITS**0.5
    assert 1 - ALPHA_COVER - 4 * se <= mean <= 1 - ALPHA_COVER + 1 / (N_CAL + 1) + 4 * se
    assert se < 0.002

    check = resampled_coverage(
        logits,
        labels,
        ALPHA_COVER,
        score,
        splits=SPLITS,
        calibration_size=N_CAL,
        generator=torch.Generator().manual_seed(1),
        **options,
    )
    assert (check.splits, check.calibration_size) == (SPLITS, N_CAL)
    assert check.coverage == pytest.approx(mean, abs=1e-12)
    assert check.coverage_std == pytest.approx(std, abs=1e-12)
    assert check.size == pytest.approx(sum(sizes) / SPLITS, abs=1e-12)


def test_resampled_coverage_spread_is_the_calibration_and_test_draws():
    """One split's coverage varies by √(α(1−α)/n + α(1−α)/n') (the calibration quantile's draw
    and the test sample's): 0.0147 for n = 500, n' = 2500; 200 splits estimate it within ~5%."""
    g = torch.Generator().manual_seed(3)
    logits = 2 * torch.randn(N_POOL, K, generator=g, dtype=torch.float64)
    labels = torch.multinomial(logits.softmax(-1), 1, generator=g).squeeze(1)
    check = resampled_coverage(logits, labels, 0.1, "thr", calibration_size=N_CAL)
    predicted = math.sqrt(0.09 / N_CAL + 0.09 / (N_POOL - N_CAL))
    assert predicted == pytest.approx(0.0147, abs=1e-4)
    assert 0.8 * predicted < check.coverage_std < 1.2 * predicted
    assert abs(check.coverage - 0.9) < 3 * check.coverage_std / math.sqrt(check.splits) + 0.002


def test_resampled_coverage_hand():
    """Every example confidently right: every set is the true class alone, in every split."""
    labels = torch.arange(40) % 4
    logits = 10 * torch.nn.functional.one_hot(labels, 4).double()
    check = resampled_coverage(logits.unsqueeze(0), labels, 0.1, "thr", splits=5)
    assert dataclasses.astuple(check) == (1.0, 0.0, 1.0, 5, 20)
    # one model's (n, K) logits are the ensemble of one
    assert resampled_coverage(logits, labels, 0.1, "thr", splits=5) == check


def test_resampled_coverage_is_the_same_each_call_and_follows_its_generator(pool):
    logits, labels = pool
    first = resampled_coverage(logits, labels, 0.2, "aps", splits=20)
    assert resampled_coverage(logits, labels, 0.2, "aps", splits=20) == first
    other = resampled_coverage(
        logits, labels, 0.2, "aps", splits=20, generator=torch.Generator().manual_seed(5)
    )
    assert other.coverage != first.coverage
    assert first.calibration_size == N_POOL // 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"splits": 1}, r"splits must be an int in 2\.\.100,000 .*got 1"),
        ({"splits": True}, r"splits must be an int in 2\.\.100,000"),
        ({"splits": 2.5}, r"splits must be an int in 2\.\.100,000"),
        ({"splits": 10**12}, r"splits must be an int in 2\.\.100,000 .*got 1000000000000"),
        ({"calibration_size": 0}, r"calibration_size must be an int in \[1, 19\] for 20"),
        ({"calibration_size": 20}, r"calibration_size must be an int in \[1, 19\]"),
        ({"calibration_size": 5.0}, r"calibration_size must be an int"),
        ({"calibration_size": 5}, r"n = 5 examples is too small for alpha = 0.1.*n = 9"),
        ({"alpha": 1.5}, r"alpha must lie in \(0, 1\)"),
        ({"score": "saps"}, r"unknown conformal score 'saps'"),
    ],
)
def test_resampled_coverage_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        resampled_coverage(CAL, LABELS, **{"alpha": 0.1, **kwargs})


# ------------------------------------------------------------------------------------------------
# Set metrics
# ------------------------------------------------------------------------------------------------


def test_set_metrics_hand():
    sets = _sets((0,), (0, 1, 2), (), (1, 2))
    labels = torch.tensor([0, 1, 2, 0])
    assert coverage(sets, labels) == 0.5  # rows 0 and 1
    assert mean_set_size(sets) == 1.5  # (1 + 3 + 0 + 2) / 4
    # sizes 1, 3, 0, 2 in bins 0-1 (rows 0, 2: one covered), 2-3 (rows 1, 3: one covered)
    assert size_stratified_coverage(sets, labels) == {(0, 1): 0.5, (2, 3): 0.5}
    assert size_stratified_coverage(sets, labels, edges=(0, 2)) == {
        (0, 0): 0.0,
        (1, 2): 0.5,
        (3, 3): 1.0,
    }
    # class 0: rows 0 (in), 3 (out); class 1: row 1 (in); class 2: row 2 (out)
    assert_close(
        class_conditional_coverage(sets, labels),
        torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64),
    )
    assert class_conditional_coverage(sets[:2], labels[:2])[2].isnan()


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------

CAL = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
LABELS = torch.randint(0, 3, (20,), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"alpha": 0.0}, ValueError, r"alpha must lie in \(0, 1\)"),
        ({"alpha": 1.0}, ValueError, r"alpha must lie in \(0, 1\)"),
        ({"alpha": -0.1}, ValueError, r"alpha must lie in \(0, 1\)"),
        ({"alpha": math.nan}, ValueError, r"alpha must lie in \(0, 1\)"),
        ({"alpha": True}, TypeError, "alpha must be a real number"),
        ({"score": "lac"}, ValueError, r"unknown conformal score 'lac'.*'thr', 'aps', 'raps'"),
        ({"score": "thr", "randomized": True}, ValueError, "'thr' has no randomization"),
        ({"score": "aps", "penalty": 0.1}, ValueError, "regularization of score 'raps'"),
        ({"score": "thr", "k_reg": 2}, ValueError, "regularization of score 'raps'"),
        ({"score": "raps", "penalty": -1.0}, ValueError, r"penalty.*\[0, 1e\+06\], got -1"),
        ({"score": "raps", "penalty": math.inf}, ValueError, r"penalty.*1e\+06\], got inf"),
        ({"score": "raps", "k_reg": -1}, ValueError, r"k_reg.*an int in 0\.\.2\*\*31, got -1"),
        ({"score": "raps", "k_reg": 1.5}, TypeError, "k_reg must be an int"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        calibrate(CAL, LABELS, **kwargs)


def test_bad_logits_labels_and_sets():
    with pytest.raises(ValueError, match=r"\[0, 2\] for K = 3"):
        calibrate(CAL, LABELS + 1)
    with pytest.raises(ValueError, match=r"labels must be \(N,\) with N = 20"):
        calibrate(CAL, LABELS[:10])
    with pytest.raises(TypeError, match="integer tensor of class indices"):
        calibrate(CAL, LABELS.float())
    with pytest.raises(ValueError, match=r"\(N, K\) for one model or \(M, N, K\)"):
        calibrate(CAL[:, 0], LABELS)
    with pytest.raises(TypeError, match="floating-point"):
        calibrate(LABELS.unsqueeze(-1).expand(20, 3), LABELS)
    with pytest.raises(ValueError, match="NaN"):
        calibrate(torch.full((20, 3), math.nan), LABELS)
    fit = calibrate(CAL, LABELS, 0.2, "thr")
    with pytest.raises(ValueError, match="calibrated on K = 3 classes"):
        fit.predict(torch.randn(5, 4))
    with pytest.raises(TypeError, match="boolean tensor"):
        coverage(torch.ones(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"\(B, K\) with B >= 1"):
        mean_set_size(torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[0, 2\] for K = 3"):
        coverage(torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="edges must be increasing"):
        size_stratified_coverage(torch.ones(2, 3, dtype=torch.bool), LABELS[:2], edges=(3, 1))


@pytest.mark.parametrize("randomized", ["no", "False", 0, 1.0, "yes"])
def test_randomized_must_be_a_bool(randomized):
    """randomized="no" had been taken as True."""
    logits, labels = torch.randn(2, 50, 4), torch.randint(0, 4, (50,))
    with pytest.raises(TypeError) as err:
        calibrate(logits, labels, 0.2, "aps", randomized=randomized)
    assert str(err.value) == (
        f"randomized must be True, False or None (the score's default), got {randomized!r}"
    )


def test_non_randomized_aps_with_two_classes_puts_the_second_class_in_at_a_quantile_of_1():
    """K = 2, more than α of the calibration labels ranked second: q̂ is the score of the
    second class, exactly 1. Summed from the top, p̄_1 + p̄_2 had ended within an ulp of 1 on
    either side, and coverage and size depended on those last bits (0.991-0.999 and
    1.95-1.98, where exact arithmetic gives 1 and 2)."""
    g = torch.Generator().manual_seed(0)
    cal, test = torch.randn(1, 2000, 2, generator=g), torch.randn(1, 5000, 2, generator=g)
    cal_labels = torch.randint(0, 2, (2000,), generator=g)  # half ranked second: α = 0.1 < 0.5
    fit = calibrate(cal, cal_labels, 0.1, "aps", randomized=False)
    assert fit.threshold == 1.0
    scores = fit.scores(test)
    assert (scores.max(-1).values == 1.0).all()  # the second class scores exactly 1
    sets = fit.predict(test)
    assert coverage(sets, torch.randint(0, 2, (5000,), generator=g)) == 1.0
    assert mean_set_size(sets) == 2.0


@pytest.mark.parametrize(
    "options, error, message",
    [
        (
            {"penalty": 1e308},
            ValueError,
            r"penalty \(λ of RAPS\) must be a number in \[0, 1e\+06\]",
        ),
        ({"k_reg": 10**400}, ValueError, r"k_reg .* must be an int in 0\.\.2\*\*31, got 1000"),
        ({"k_reg": -1}, ValueError, r"must be an int in 0\.\.2\*\*31, got -1"),
    ],
)
def test_raps_options_are_bounded(options, error, message):
    """A huge penalty had made every score inf; a huge k_reg raised an OverflowError."""
    logits, labels = torch.randn(2, 50, 4), torch.randint(0, 4, (50,))
    with pytest.raises(error, match=message):
        calibrate(logits, labels, 0.2, "raps", **options)


def test_a_generator_that_is_not_one_is_named():
    """generator=3 had raised an AttributeError from inside the draw of u."""
    with pytest.raises(TypeError, match="generator must be a torch.Generator .*got int"):
        calibrate(torch.randn(2, 50, 4), torch.randint(0, 4, (50,)), 0.2, "aps", generator=3)
