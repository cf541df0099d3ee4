"""Every post-hoc calibrator in the engine's final evaluation (``data.calibrators``), and
``snens eval`` measuring a finished run at another α, with other calibrators and OOD scores,
on real Fashion-MNIST."""

import json
import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snens.engine.cli import main
from snens.engine.config import load_config
from snens.engine.presets import preset
from snens.engine.reload import evaluate_run
from snens.engine.train import train
from snens.evaluation.calibration import fit_calibrator
from snens.evaluation.protocol import (
    calibrated_metrics,
    ensemble_metrics,
    held_out_metrics,
    temperature_scaled_metrics,
)

ALL = ["temperature", "vector", "matrix", "histogram"]
KEPT = ("accuracy", "nll", "brier", "ece", "adaptive_ece")


@pytest.fixture(scope="module")
def outputs():
    """Kept logits of a 3-member ensemble, overconfident, with a class bias to repair."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (800,), generator=g)
    logits = torch.randn(3, 800, 5, generator=g)
    logits[:, torch.arange(800), labels] += 0.8
    logits = 6 * logits + torch.tensor([1.0, 0, 0, 0, -1.0])
    return {
        "val": logits[:, :400],
        "val_labels": labels[:400],
        "test": logits[:, 400:],
        "test_labels": labels[400:],
    }


def test_each_calibrator_is_fitted_on_validation_and_measured_on_test(outputs):
    got = calibrated_metrics(outputs, ALL)
    assert {k for k in got if k != "test_ts/temperature"} == {
        f"{prefix}/{k}" for prefix in ("test_ts", "test_vs", "test_ms", "test_hb") for k in KEPT
    }
    # temperature is the engine's test_ts as before
    assert {k: v for k, v in got.items() if k.startswith("test_ts/")} == (
        temperature_scaled_metrics(outputs)
    )
    for name, prefix in (("vector", "test_vs"), ("matrix", "test_ms"), ("histogram", "test_hb")):
        calibrator = fit_calibrator(name, outputs["val"], outputs["val_labels"])
        probs = calibrator.apply(outputs["test"]).softmax(-1)
        expected = ensemble_metrics(probs, outputs["test_labels"])
        assert {k: got[f"{prefix}/{k}"] for k in KEPT} == {k: expected[k] for k in KEPT}
    # overconfident logits: every calibrator lowers the test NLL
    raw = ensemble_metrics(outputs["test"].softmax(-1), outputs["test_labels"])["nll"]
    for prefix in ("test_ts", "test_vs", "test_ms", "test_hb"):
        assert got[f"{prefix}/nll"] < raw, prefix


def test_no_calibrators_and_bad_names(outputs):
    assert calibrated_metrics(outputs, ()) == {}
    assert "test_vs/nll" in calibrated_metrics(outputs, "vector")
    with pytest.raises(ValueError, match=r"unknown calibrator 'platt'; choose among \['temp"):
        calibrated_metrics(outputs, ["platt"])
    with pytest.raises(ValueError, match="'vector' is listed twice"):
        calibrated_metrics(outputs, ["vector", "vector"])
    # checked even where no validation split would fit them
    test_only = {k: outputs[k] for k in ("test", "test_labels")}
    with pytest.raises(ValueError, match="unknown calibrator"):
        held_out_metrics(test_only, calibrators=["platt"])


def test_the_config_names_the_calibrators_it_knows():
    tiny = preset("fashion_mnist_small_cnn_tiny")
    assert load_config(tiny).data.calibrators == ("temperature",)
    with pytest.raises(ValueError, match=r"data.calibrators.*'platt'"):
        load_config(tiny, ['data.calibrators=["platt"]'])
    with pytest.raises(ValueError, match="data.calibrators lists 'vector' twice"):
        load_config(tiny, ['data.calibrators=["vector", "vector"]'])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    config = load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(tmp_path_factory.mktemp('runs')))}",
            'name="run"',
            "threads=1",
            "deterministic=true",
            "data.train_examples=400",
            "data.validation_examples=300",
            "data.test_examples=300",
            "optim.epochs=1",
            f"data.calibrators={json.dumps(ALL)}",
        ],
    )
    return train(config, progress=False, log=None)


def test_the_engine_reports_every_calibrator_it_is_given(run):
    final = json.loads((run / "final.json").read_text())["metrics"]
    for prefix in ("test_ts", "test_vs", "test_ms", "test_hb"):
        assert 0 < final[f"{prefix}/accuracy"] <= 1 and 0 < final[f"{prefix}/nll"] < 5
    # evaluated again: the same fits on the same logits
    again, _ = evaluate_run(run, corruptions=False)
    for prefix in ("test_ts", "test_vs", "test_ms", "test_hb"):
        assert again[f"{prefix}/nll"] == pytest.approx(final[f"{prefix}/nll"], rel=1e-5)


def test_a_run_is_measured_again_at_another_alpha_with_other_calibrators(run):
    final = json.loads((run / "final.json").read_text())["metrics"]
    wider, _ = evaluate_run(
        run, corruptions=False, conformal_alpha=0.3, calibrators=["vector"], ood_scores="energy"
    )
    assert "test_vs/nll" in wider and not [k for k in wider if k.startswith("test_ts/")]
    assert wider["test_vs/nll"] == pytest.approx(final["test_vs/nll"], rel=1e-5)
    # α = 0.3 against the run's 0.1: smaller sets that cover less
    assert wider["test/conformal_thr_size"] < final["test/conformal_thr_size"]
    assert wider["test/conformal_thr_coverage"] < final["test/conformal_thr_coverage"]
    assert wider["test/nll"] == pytest.approx(final["test/nll"], rel=1e-6)
    with pytest.raises(TypeError, match="conformal_alpha must be a number"):
        evaluate_run(run, conformal_alpha="0.1")


def _files(run):
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file()}


def test_snens_eval_takes_alpha_calibrators_and_scores(run, capsys):
    before = _files(run)
    argv = ["eval", str(run), "--json", "--no-corruptions", "--alpha", "0.3"]
    assert main([*argv, "--calibrators", "histogram", "--ood-scores", "entropy"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert "test_hb/ece" in got and "test_ts/nll" not in got
    assert not [k for k in got if k.startswith("shift/")]
    again, _ = evaluate_run(run, corruptions=False, conformal_alpha=0.3)
    assert got["test/conformal_aps_size"] == pytest.approx(again["test/conformal_aps_size"])
    assert main([*argv, "--calibrators"]) == 0  # none
    assert not [k for k in json.loads(capsys.readouterr().out) if k.startswith("test_")]
    assert _files(run) == before  # measured, not rewritten: final.json is the run's own


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--alpha", "1.5"], r"data.conformal_alpha.*\[1e-06, 1\).*1.5"),
        (["--alpha", "0.001"], r"300 is too few to calibrate conformal sets.*least 999"),
        (["--calibrators", "platt"], r"data.calibrators.*'platt'"),
        (["--ood-scores", "odin"], r"data.ood_scores.*'odin'"),
    ],
)
def test_snens_eval_refuses_bad_settings_naming_them(run, capsys, flags, message):
    assert main(["eval", str(run), "--no-corruptions", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("snens eval: ") and "(given on the command line)" in err
    assert re.search(message, err), err


def test_alpha_or_calibrators_without_a_validation_split_are_refused(run, tmp_path, capsys):
    with pytest.raises(ValueError, match="validation=False leaves it out"):
        evaluate_run(run, corruptions=False, validation=False, conformal_alpha=0.2)
    config = load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(tmp_path))}",
            'name="plain"',
            "threads=1",
            "data.train_examples=200",
            "data.test_examples=200",
            "optim.epochs=1",
        ],
    )
    plain = train(config, progress=False, log=None)
    assert main(["eval", str(plain), "--no-corruptions", "--calibrators", "vector"]) == 2
    err = capsys.readouterr().err
    assert "it has none (data.validation_examples = 0)" in err, err
    # no calibrators asked for: nothing to fit, measured as trained
    got, _ = evaluate_run(plain, corruptions=False, calibrators=[])
    assert "test/nll" in got and not [k for k in got if k.startswith(("val/", "test_"))]


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    alpha=st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=3),
    calibrators=st.none() | st.lists(st.sampled_from(ALL) | st.text(max_size=4), max_size=3),
    scores=st.none()
    | st.text(max_size=4)
    | st.lists(st.sampled_from(["energy", "msp"]) | st.integers(), max_size=2),
)
def test_any_override_is_measured_or_refused_with_a_message(run, alpha, calibrators, scores):
    try:
        got, _ = evaluate_run(
            run,
            corruptions=False,
            conformal_alpha=alpha,
            calibrators=calibrators,
            ood_scores=scores,
        )
    except (ValueError, TypeError) as error:
        assert len(str(error)) > 20 and "Traceback" not in str(error)
        return
    if alpha is not None:  # measured: only an α in (0, 1) gets this far
        assert 0 < alpha < 1 and got["test/conformal_thr_size"] >= 0
    assert math.isfinite(got["test/nll"])
