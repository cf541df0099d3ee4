"""snens.evaluate: every reported number equals snens.metrics on independently collected
probabilities, for a σN-Ens ensemble and a single model alike, whatever the batch size."""

import math

import pytest
import torch

import snens
from snens import metrics
from snens.baselines import SingleModel
from snens.data import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    TensorLoader,
    load_fashion_mnist,
    load_mnist_5k,
)
from snens.engine.fit import fit, predict
from snens.evaluation import conformal
from snens.evaluation.protocol import (
    SHIFT_METRICS,
    collect,
    ensemble_metrics,
    evaluate,
    logit_metrics,
    ood_detection,
    posthoc_metrics,
)
from snens.models import create
from snens.nn.norms import MemberNorm

from conftest import TinyResNet, randomize_norms

N, K = 23, 5  # 23: batches of 3 and 7 both end in a partial batch


def _diversify(ens: snens.Ensemble, seed: int = 0) -> snens.Ensemble:
    """Members that differ: γ moved away from the values the converted affine compensates."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in ens.modules():
            if isinstance(module, MemberNorm):
                module.gamma.add_(torch.randn(module.gamma.shape, generator=g))
    return ens


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, 8, 8, generator=g)
    y = torch.randint(0, K, (N,), generator=g)
    ood = 3 * torch.randn(11, 3, 8, 8, generator=g)
    return x, y, ood


@pytest.fixture
def ensemble(resnet):
    ens = snens.convert(resnet, num_members=4, generator=torch.Generator().manual_seed(0))
    return _diversify(ens).eval()


def _corruptions(x, y, batch_size):
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(x.shape, generator=g)
    return {
        (name, s): TensorLoader(x + scale * s * noise, y, batch_size)
        for name, scale in (("noise", 0.2), ("loud_noise", 0.5))
        for s in (1, 3, 5)
    }


def _run(model, data, batch_size, **kwargs):
    x, y, ood = data
    return evaluate(
        model,
        TensorLoader(x, y, batch_size),
        ood={"blobs": TensorLoader(ood, torch.zeros(len(ood), dtype=torch.long), batch_size)},
        corruptions=_corruptions(x, y, batch_size),
        **kwargs,
    )


def test_ensemble_and_single_model_report_the_same_keys(ensemble, resnet, data):
    ens = _run(ensemble, data, 7)
    single = _run(SingleModel(resnet), data, 7)
    assert list(ens) == list(single)
    expected = {
        "test/accuracy",
        "test/nll",
        "test/brier",
        "test/ece",
        "test/adaptive_ece",
        "test/classwise_ece",
        "test/aurc",
        "test/disagreement",
        "test/predictive_entropy",
        "test/expected_entropy",
        "test/mutual_information",
        "test/member_correlation",
        "test/member_accuracy_mean",
        "test/member_nll_mean",
        "test/member_ece_mean",
        "test/num_members",
        "ood/blobs/auroc",
        "ood/blobs/aupr",
        "ood/blobs/fpr95",
    }
    shift = {
        f"shift/{name}/{s}/{m}"
        for name in ("noise", "loud_noise", "severity")
        for s in (1, 3, 5)
        for m in SHIFT_METRICS
    } | {f"shift/mean/{m}" for m in SHIFT_METRICS}
    assert set(ens) == expected | shift
    assert all(isinstance(v, float) for v in ens.values())
    assert ens["test/num_members"] == 4.0 and single["test/num_members"] == 1.0
    # one member: no pairs to correlate, nothing to disagree about
    assert math.isnan(single["test/member_correlation"])
    assert single["test/mutual_information"] == 0.0 and single["test/disagreement"] == 0.0
    assert -1 <= ens["test/member_correlation"] < 1 and ens["test/mutual_information"] > 0


@pytest.mark.parametrize("score", ["msp", "entropy", "mutual_information"])
def test_values_equal_metrics_on_independently_collected_probs(ensemble, data, score):
    x, y, ood = data
    result = _run(ensemble, data, 3, ood_score=score, num_bins=10)
    with torch.no_grad():
        member_probs = ensemble(x).softmax(-1)  # (M, N, K), one batch
        ood_probs = ensemble(ood).softmax(-1)
    probs = snens.predictive_probs(ensemble(x).detach())
    expected = {
        "test/accuracy": metrics.accuracy(probs, y),
        "test/nll": metrics.nll(probs, y),
        "test/brier": metrics.brier(probs, y),
        "test/ece": metrics.ece(probs, y, num_bins=10),
        "test/adaptive_ece": metrics.adaptive_ece(probs, y, num_bins=10),
        "test/classwise_ece": metrics.classwise_ece(probs, y, num_bins=10),
        "test/aurc": metrics.aurc(probs, y),
        "test/disagreement": metrics.disagreement(member_probs).mean().item(),
        "test/predictive_entropy": metrics.predictive_entropy(member_probs).mean().item(),
        "test/expected_entropy": metrics.expected_entropy(member_probs).mean().item(),
        "test/mutual_information": metrics.mutual_information(member_probs).mean().item(),
        "test/member_correlation": metrics.member_correlation(member_probs),
        "test/member_accuracy_mean": metrics.per_member(member_probs, y)["accuracy"].mean().item(),
        "test/member_nll_mean": metrics.per_member(member_probs, y)["nll"].mean().item(),
        "test/member_ece_mean": sum(metrics.ece(p, y, num_bins=10) for p in member_probs) / 4,
    }
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=1e-6), key
    s_in = metrics.OOD_SCORES[score](member_probs)
    s_out = metrics.OOD_SCORES[score](ood_probs)
    assert result["ood/blobs/auroc"] == pytest.approx(metrics.auroc(s_in, s_out), abs=1e-6)
    assert result["ood/blobs/aupr"] == pytest.approx(metrics.aupr(s_in, s_out), abs=1e-6)
    assert result["ood/blobs/fpr95"] == pytest.approx(metrics.fpr_at_95_tpr(s_in, s_out), abs=1e-6)


def test_shift_values_and_their_averages(ensemble, data):
    x, y, _ = data
    result = _run(ensemble, data, 7)
    for (name, s), loader in _corruptions(x, y, 7).items():
        member_probs, labels = predict(ensemble, loader)
        probs = member_probs.mean(0)
        assert result[f"shift/{name}/{s}/nll"] == pytest.approx(
            metrics.nll(probs, labels), abs=1e-6
        )
        assert result[f"shift/{name}/{s}/ece"] == pytest.approx(
            metrics.ece(probs, labels), abs=1e-6
        )
    for m in SHIFT_METRICS:
        for s in (1, 3, 5):
            mean = (result[f"shift/noise/{s}/{m}"] + result[f"shift/loud_noise/{s}/{m}"]) / 2
            assert result[f"shift/severity/{s}/{m}"] == pytest.approx(mean, abs=1e-12)
        overall = sum(result[f"shift/severity/{s}/{m}"] for s in (1, 3, 5)) / 3
        assert result[f"shift/mean/{m}"] == pytest.approx(overall, abs=1e-12)


def test_batch_size_does_not_change_the_results(ensemble, data):
    small, large = _run(ensemble, data, 3), _run(ensemble, data, 7)
    assert small.keys() == large.keys()
    for key in small:
        assert small[key] == pytest.approx(large[key], abs=1e-6), key


def test_training_mode_is_restored_module_by_module(ensemble, data):
    ensemble.train()
    frozen = ensemble.model.stem[1]
    frozen.eval()  # a user's frozen norm inside a training model
    before = {name: m.training for name, m in ensemble.named_modules()}
    x, y, _ = data
    evaluate(ensemble, TensorLoader(x, y, 7))
    assert {name: m.training for name, m in ensemble.named_modules()} == before
    assert ensemble.training and not frozen.training


def test_evaluation_does_not_touch_batchnorm_statistics(ensemble, data):
    x, y, _ = data
    ensemble.train()
    state = {k: v.clone() for k, v in ensemble.state_dict().items()}
    evaluate(ensemble, TensorLoader(x, y, 7))
    for key, value in ensemble.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0)


def test_collect_matches_predict_and_returns_logits(ensemble, data):
    x, y, _ = data
    probs, labels = collect(ensemble, TensorLoader(x, y, 3))
    ref_probs, ref_labels = predict(ensemble, TensorLoader(x, y, 23))
    torch.testing.assert_close(probs, ref_probs, rtol=0, atol=1e-6)
    assert torch.equal(labels, ref_labels)
    logits, _ = collect(ensemble, TensorLoader(x, y, 3), logits=True)
    torch.testing.assert_close(logits.softmax(-1), probs, rtol=0, atol=1e-6)
    assert probs.dtype == torch.float32 and probs.shape == (4, N, K)


def test_text_model_takes_mapping_batches(transformer, text_batch):
    ids, mask = text_batch
    labels = torch.tensor([0, 1, 2, 1, 0])
    ens = snens.convert(transformer, num_members=2, generator=torch.Generator().manual_seed(0))
    ens = _diversify(ens).eval()
    batches = [
        ({"input_ids": ids[:2], "attention_mask": mask[:2]}, labels[:2]),
        ({"input_ids": ids[2:], "attention_mask": mask[2:]}, labels[2:]),
    ]
    result = evaluate(ens, batches)
    with torch.no_grad():
        probs = snens.predictive_probs(ens(input_ids=ids, attention_mask=mask))
    assert result["test/nll"] == pytest.approx(metrics.nll(probs, labels), abs=1e-6)


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------


def test_empty_loader_names_the_data_set(ensemble, data):
    x, y, _ = data
    with pytest.raises(ValueError, match="test set.*empty"):
        evaluate(ensemble, [])
    with pytest.raises(ValueError, match="OOD set 'svhn'.*empty"):
        evaluate(ensemble, TensorLoader(x, y, 7), ood={"svhn": []})
    with pytest.raises(ValueError, match="corruption 'fog' at severity 2.*empty"):
        evaluate(ensemble, TensorLoader(x, y, 7), corruptions={("fog", 2): []})


def test_unknown_ood_score_lists_the_choices(ensemble, data):
    x, y, _ = data
    choices = "'energy', 'entropy', 'max_logit', 'msp', 'mutual_information'"
    with pytest.raises(ValueError, match=choices):
        evaluate(ensemble, TensorLoader(x, y, 7), ood_score="odin")


@pytest.mark.parametrize("score", ["max_logit", "energy"])
def test_logit_scores_equal_metrics_on_independently_collected_logits(ensemble, data, score):
    """The logit scores read the logits of the same pass: equal to snens.metrics on the
    members' logits collected in one batch, and to ood_detection(..., logits=True)."""
    x, _, ood = data
    result = _run(ensemble, data, 3, ood_score=score)
    with torch.no_grad():
        inside, outside = ensemble(x), ensemble(ood)
    s_in = metrics.LOGIT_OOD_SCORES[score](inside)
    s_out = metrics.LOGIT_OOD_SCORES[score](outside)
    direct = ood_detection(inside, outside, score, logits=True)
    assert result["ood/blobs/auroc"] == pytest.approx(metrics.auroc(s_in, s_out), abs=1e-6)
    assert result["ood/blobs/aupr"] == pytest.approx(metrics.aupr(s_in, s_out), abs=1e-6)
    assert result["ood/blobs/fpr95"] == pytest.approx(metrics.fpr_at_95_tpr(s_in, s_out), abs=1e-6)
    for key in ("auroc", "aupr", "fpr95"):
        assert result[f"ood/blobs/{key}"] == pytest.approx(direct[key], abs=1e-6)
    with pytest.raises(ValueError, match=f"OOD score '{score}' reads logits"):
        ood_detection(inside.softmax(-1), outside.softmax(-1), score)


def test_ood_detection_on_logits_equals_it_on_probabilities(ensemble, data):
    x, _, ood = data
    with torch.no_grad():
        inside, outside = ensemble(x), ensemble(ood)
    for score in metrics.OOD_SCORES:
        on_logits = ood_detection(inside, outside, score, logits=True)
        assert on_logits == ood_detection(inside.softmax(-1), outside.softmax(-1), score)


def test_several_ood_scores_from_one_pass_equal_each_alone(ensemble, data):
    """A list of scores gives ood/<name>/<score>/… keys, each equal to that score's own call
    and to ood_detection on the member probabilities; the other keys are unchanged."""
    x, y, ood = data
    scores = ["msp", "entropy", "mutual_information", "max_logit", "energy"]
    together = _run(ensemble, data, 3, ood_score=scores)
    with torch.no_grad():
        inside, outside = ensemble(x), ensemble(ood)
    for score in scores:
        alone = _run(ensemble, data, 3, ood_score=score)
        direct = ood_detection(inside, outside, score, logits=True)
        for key in ("auroc", "aupr", "fpr95"):
            assert together[f"ood/blobs/{score}/{key}"] == alone[f"ood/blobs/{key}"]
            assert together[f"ood/blobs/{score}/{key}"] == pytest.approx(direct[key], abs=1e-6)
    assert {k for k in together if not k.startswith("ood/")} == {
        k for k in alone if not k.startswith("ood/")
    }
    assert not any(k in together for k in ("ood/blobs/auroc", "ood/blobs/aupr"))
    with pytest.raises(ValueError, match="ood_score is an empty list"):
        _run(ensemble, data, 3, ood_score=[])
    with pytest.raises(ValueError, match="unknown ood_score 'odin'"):
        _run(ensemble, data, 3, ood_score=["msp", "odin"])
    with pytest.raises(ValueError, match="unknown OOD score 'odin'"):
        ood_detection(inside, outside, "odin")


def test_posthoc_metrics_from_kept_logits_equal_a_second_pass(ensemble, data):
    """posthoc_metrics reads the logits evaluate kept: its OOD keys equal evaluate's own for
    those scores, and its conformal keys are calibrate → predict → coverage, size on them."""
    x, y, ood = data
    kept = {}
    result = _run(ensemble, data, 3, keep_logits=kept)
    shifted = {f"shift/{n}/{s}" for n in ("noise", "loud_noise") for s in (1, 3, 5)}
    assert set(kept) == {
        "test",
        "test_labels",
        "ood/blobs",
        *shifted,
        *(k + "_labels" for k in shifted),
    }
    # a corrupted set's kept logits are the model's on it, its labels the test labels
    was_training = ensemble.training
    ensemble.eval()
    with torch.no_grad():
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
        direct = ensemble(x + 0.5 * 3 * noise)
    ensemble.train(was_training)
    torch.testing.assert_close(kept["shift/loud_noise/3"], direct, rtol=1e-5, atol=1e-5)
    assert torch.equal(kept["shift/loud_noise/3_labels"], y)
    extra = posthoc_metrics(kept, ood_scores=("max_logit", "energy", "entropy"))
    listed = _run(ensemble, data, 3, ood_score=["max_logit", "energy", "entropy"])
    assert extra == {k: v for k, v in listed.items() if k.startswith("ood/")}
    assert not set(extra) & set(result)  # the msp keys ood/blobs/auroc, … stay evaluate's

    g = torch.Generator().manual_seed(1)
    val_x = torch.randn(30, 3, 8, 8, generator=g)
    val_y = torch.randint(0, K, (30,), generator=g)
    with torch.no_grad():
        val = ensemble(val_x)
    kept.update(val=val, val_labels=val_y)
    extra = posthoc_metrics(kept, ood_scores=(), conformal_alpha=0.2)
    generator = torch.Generator().manual_seed(0)
    for score in ("thr", "aps"):
        fit = conformal.calibrate(val, val_y, 0.2, score, generator=generator)
        sets = fit.predict(kept["test"], generator=generator)
        assert extra[f"test/conformal_{score}_coverage"] == conformal.coverage(sets, y)
        assert extra[f"test/conformal_{score}_size"] == conformal.mean_set_size(sets)
    assert len(extra) == 4
    with pytest.raises(ValueError, match="n = 30 examples is too small for alpha = 0.01"):
        posthoc_metrics(kept, conformal_alpha=0.01)
    with pytest.raises(ValueError, match="unknown ood_score 'odin'"):
        posthoc_metrics(kept, ood_scores=["odin"])


def test_ensemble_metrics_of_models_evaluated_apart_equal_evaluate_of_their_ensemble(data):
    """Two models evaluated one by one, their probabilities stacked: ensemble_metrics gives
    evaluate's test metrics of the DeepEnsemble of the two, and the member means are the two
    models' own metrics."""
    x, y, _ = data
    torch.manual_seed(0)
    models = [TinyResNet(num_classes=K).eval() for _ in range(2)]
    loader = TensorLoader(x, y, 7)
    apart = torch.cat([collect(SingleModel(model), loader)[0] for model in models])  # (2, N, K)
    values = ensemble_metrics(apart, y)
    together = evaluate(snens.baselines.DeepEnsemble(models), loader)
    assert values.keys() == {k.removeprefix("test/") for k in together if k.startswith("test/")}
    for key, value in values.items():
        assert value == pytest.approx(together[f"test/{key}"], rel=1e-5, abs=1e-7), key
    alone = [metrics.nll(p, y) for p in apart]
    assert values["member_nll_mean"] == pytest.approx(sum(alone) / 2, rel=1e-6)
    assert values["num_members"] == 2.0
    assert values["nll"] == pytest.approx(metrics.nll(apart.mean(0), y), rel=1e-12)
    assert values["nll"] < values["member_nll_mean"]  # mixing two models helps the NLL here


def test_ensemble_metrics_refuses_a_shape_without_members(data):
    _, y, _ = data
    probs = torch.full((N, K), 1 / K)
    with pytest.raises(ValueError, match=r"member_probs must be \(M, N, K\), got shape \(23, 5\)"):
        ensemble_metrics(probs, y)
    with pytest.raises(ValueError, match="num_bins must be an int >= 1, got 0"):
        ensemble_metrics(probs[None], y, num_bins=0)
    with pytest.raises(ValueError, match="label"):
        ensemble_metrics(probs[None], torch.full((N,), K))


@pytest.mark.parametrize("severity", [7, 0, -1, 2.0, True])
def test_severity_outside_one_to_five(ensemble, data, severity):
    x, y, _ = data
    loader = TensorLoader(x, y, 7)
    with pytest.raises(ValueError, match="severity must be an int in 1..5"):
        evaluate(ensemble, loader, corruptions={("gaussian_noise", severity): loader})


@pytest.mark.parametrize(
    "key", ["gaussian_noise", ("a", 1, 2), ("severity", 1), ("mean", 2), ("a/b", 1)]
)
def test_malformed_corruption_keys(ensemble, data, key):
    x, y, _ = data
    loader = TensorLoader(x, y, 7)
    with pytest.raises(ValueError):
        evaluate(ensemble, loader, corruptions={key: loader})


def test_plain_model_output_points_to_single_model(resnet, data):
    x, y, _ = data
    with pytest.raises(ValueError, match=r"\(M, B, K\).*snens.baselines.SingleModel"):
        evaluate(resnet, TensorLoader(x, y, 7))


def test_changing_num_members_between_data_sets(data):
    class Flaky(torch.nn.Module):
        """Returns 2 members on 8×8 inputs, 3 on others: not an ensemble."""

        def __init__(self):
            super().__init__()
            self.net = randomize_norms(TinyResNet()).eval()

        def forward(self, x):
            logits = self.net(x[..., :8, :8])
            return logits.expand(2 if x.shape[-1] == 8 else 3, *logits.shape)

    x, y, _ = data
    ood = TensorLoader(torch.randn(5, 3, 9, 9), torch.zeros(5, dtype=torch.long), 5)
    with pytest.raises(ValueError, match=r"OOD set 'big'.*\(3, 5\) but \(2, 5\)"):
        evaluate(Flaky(), TensorLoader(x, y, 7), ood={"big": ood})


def test_bad_num_bins(ensemble, data):
    x, y, _ = data
    with pytest.raises(ValueError, match="num_bins"):
        evaluate(ensemble, TensorLoader(x, y, 7), num_bins=0)


def test_works_on_a_transformer_without_labels_in_ood_batches(transformer, text_batch):
    ids, mask = text_batch
    ens = snens.convert(transformer, num_members=2, generator=torch.Generator().manual_seed(0))
    ens = _diversify(ens).eval()
    test = [({"input_ids": ids, "attention_mask": mask}, torch.tensor([0, 1, 2, 1, 0]))]
    ood = [({"input_ids": ids.flip(1), "attention_mask": mask},)]
    result = evaluate(ens, test, ood={"shuffled": ood})
    assert 0.0 <= result["ood/shuffled/auroc"] <= 1.0


# ------------------------------------------------------------------------------------------------
# Real data: Fashion-MNIST, MNIST-5k as OOD, two hand-made corruptions
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fashion_mnist_with_mnist_ood_and_corruptions():
    """A small CNN, M=2, 30 training steps, then the whole protocol.

    Measured (seed 0): test accuracy 0.59, MNIST AUROC 0.54 (msp); shift accuracy 0.61 at
    severity 1 and 0.21 at severity 5 (noise 0.61 -> 0.29, contrast 0.61 -> 0.13); 2-10 s on
    2 CPU cores depending on load.
    """
    norm = {"mean": FASHION_MNIST_MEAN, "std": FASHION_MNIST_STD}
    x, y = load_fashion_mnist("train")
    xt, yt = load_fashion_mnist("test")
    xm, ym = load_mnist_5k()
    torch.manual_seed(0)
    model = create("small_cnn", num_classes=10, in_channels=1, width=8)
    ens = snens.convert(
        model, num_members=2, generator=torch.Generator().manual_seed(0), input_policy="split"
    )
    train = TensorLoader(x[: 30 * 64], y[: 30 * 64], 64, shuffle=True, seed=0, **norm)
    fit(ens, train, epochs=1, lr=2e-2, log=None)  # 30 steps, each member on 32 images

    xt, yt = xt[:500], yt[:500]
    mnist = torch.randperm(len(xm), generator=torch.Generator().manual_seed(0))[:500]  # sorted
    clean = xt.float() / 255  # corrupt in [0, 1], before normalization
    noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(0))
    mean = clean.mean(dim=(1, 2, 3), keepdim=True)
    corrupted = {}
    for s in (1, 3, 5):
        corrupted[("gaussian_noise", s)] = (clean + noise * s / 10).clamp(0, 1)
        corrupted[("contrast", s)] = mean + (clean - mean) * (1 - s / 6)
    result = evaluate(
        ens,
        TensorLoader(xt, yt, 250, **norm),
        ood={"mnist": TensorLoader(xm[mnist], ym[mnist], 250, **norm)},
        corruptions={key: TensorLoader(v, yt, 250, **norm) for key, v in corrupted.items()},
    )
    for key in ("ood/mnist/auroc", "ood/mnist/aupr", "ood/mnist/fpr95", "shift/mean/ece"):
        assert key in result
    assert len([k for k in result if k.startswith("shift/contrast/")]) == 3 * 4
    assert all(math.isfinite(v) for v in result.values())
    assert result["test/accuracy"] > 0.5  # chance is 0.1
    assert 0 < result["test/disagreement"] < 1 and result["test/num_members"] == 2.0
    for name in ("gaussian_noise", "contrast"):
        assert result[f"shift/{name}/5/accuracy"] < result[f"shift/{name}/1/accuracy"]
    assert result["shift/severity/5/accuracy"] < result["shift/severity/1/accuracy"]


@pytest.mark.parametrize(
    "key, shape",
    [("ood/other", (3, 40, 7)), ("ood/other", (2, 40, 5)), ("val", (3, 50, 6)), ("ood/x", (40, 5))],
)
def test_posthoc_metrics_refuse_logits_of_another_model_or_classes(key, shape):
    """OOD logits of another K or M than the test set's had been scored against it (AUROC
    0.025), without a word."""
    g = torch.Generator().manual_seed(0)
    outputs = {
        "test": torch.randn(3, 60, 5, generator=g),
        "test_labels": torch.randint(0, 5, (60,), generator=g),
        "val": torch.randn(3, 50, 5, generator=g),
        "val_labels": torch.randint(0, 5, (50,), generator=g),
    }
    outputs[key] = torch.randn(*shape, generator=g)
    with pytest.raises(ValueError) as err:
        posthoc_metrics(outputs, conformal_alpha=0.2)
    assert str(err.value) == (
        f"outputs[{key!r}] holds logits of shape {shape} torch.float32, the test set's are "
        "(3, 60, 5) torch.float32: every set's logits must be (M, N, K) floats of the test "
        "set's M = 3 and K = 5 (the same model's, on the same classes)"
    )
    outputs["val_labels"] = outputs["val_labels"][:10]
    outputs[key] = torch.randn(3, 40, 5) if key != "val" else torch.randn(3, 50, 5)
    with pytest.raises(ValueError, match=r"outputs\['val_labels'\] must be the \(N,\) labels"):
        posthoc_metrics(outputs, conformal_alpha=0.2)


def test_posthoc_metrics_name_missing_labels_integer_and_nan_logits():
    """Validation logits without labels had been a KeyError, integer logits a
    NotImplementedError from inside torch, NaN logits an error naming no set."""
    g = torch.Generator().manual_seed(0)
    test = {"test": torch.randn(2, 30, 4, generator=g), "test_labels": torch.arange(30) % 4}
    with pytest.raises(ValueError, match=r"outputs\['val'\] has no labels: give outputs\['val_"):
        posthoc_metrics({**test, "val": torch.randn(2, 30, 4)}, conformal_alpha=0.2)
    with pytest.raises(ValueError, match=r"outputs\['test'\] must be \(M, N, K\) floating"):
        posthoc_metrics({**test, "test": torch.randint(0, 3, (2, 30, 4))})
    nan = test["test"].clone()
    nan[1, 3, 2] = math.nan
    with pytest.raises(
        ValueError, match=r"outputs\['ood/x'\] holds 1 logits that are NaN or \+inf"
    ):
        posthoc_metrics({**test, "ood/x": nan})
    minus_inf = test["test"].clone()
    minus_inf[:, :, 3] = -math.inf  # log-probabilities: the logit scores say what they need
    with pytest.raises(ValueError, match="these scores need the model's finite logits"):
        posthoc_metrics({**test, "ood/x": minus_inf})


class _Terminal:
    """A stderr that says it is a terminal and keeps what is written to it."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_progress_bars_name_each_set_inside_the_block_on_a_terminal_only(monkeypatch):
    pytest.importorskip("tqdm")
    from snens.data import TensorLoader
    from snens.evaluation.predictions import progress_bars

    torch.manual_seed(0)
    model = SingleModel(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))).eval()
    x, y = torch.randn(12, 4), torch.arange(12) % 3
    test = TensorLoader(x, y, 4)
    ood = TensorLoader(torch.randn(8, 4), torch.zeros(8, dtype=torch.long), 4)
    shifted = {("noise", 1): TensorLoader(x + 1, y, 4)}

    def run():
        return snens.evaluate(model, test, ood={"far": ood}, corruptions=shifted)

    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    quiet = run()
    assert terminal.text == ""  # no block: no bar
    with progress_bars():
        shown = run()
        with progress_bars(enabled=False):
            run()
    assert shown == quiet  # the bars change no number
    for name in ("the test set", "the OOD set 'far'", "the corruption 'noise' at severity 1"):
        assert f"evaluating {name}" in terminal.text
    assert "evaluating the test set:   0%|          | 0/3" in terminal.text  # 3 batches ahead
    before = terminal.text
    terminal.isatty = lambda: False  # a log file: no bar even inside the block
    with progress_bars():
        run()
    assert terminal.text == before


def test_the_calibrated_errors_take_the_bins_asked_for():
    """num_bins reached val/ and test/ but not test_ts/: the ECE before and after temperature
    scaling were computed over different bins."""
    g = torch.Generator().manual_seed(0)

    def data(n):
        z = 3 * torch.randn(2, n, 5, generator=g)
        return z, torch.distributions.Categorical(logits=z.mean(0) / 2).sample()

    (val, val_y), (test, test_y) = data(400), data(400)
    outputs = {"val": val, "val_labels": val_y, "test": test, "test_labels": test_y}
    results = logit_metrics(outputs, num_bins=3, ood_scores=())
    scaled = (test / results["test_ts/temperature"]).softmax(-1).mean(0)
    assert results["test_ts/ece"] == pytest.approx(metrics.ece(scaled, test_y, num_bins=3))
    assert results["test_ts/ece"] != pytest.approx(metrics.ece(scaled, test_y, num_bins=15))
