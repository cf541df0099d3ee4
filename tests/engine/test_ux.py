"""What a person reads: axis labels, progress in log files, the report's default output, the
CLI's download hint."""

import io
import json
import sys

import pytest

from snens.engine.cli import main
from snens.engine.train import _progress
from snens.evaluation.plots import axis_label


def test_axis_labels_are_words_not_keys():
    assert axis_label("test/nll") == "test NLL (negative log-likelihood)"
    assert axis_label("val/ece") == "validation ECE (15 bins)"
    assert axis_label("shift/mean/accuracy") == "corrupted accuracy"
    assert axis_label("accuracy") == "accuracy"
    assert axis_label("test/member_accuracy_mean") == "test member accuracy mean"


def test_no_progress_bar_into_a_log_file(monkeypatch):
    """A bar redrawn into a file is one line of carriage returns: only a terminal gets one."""
    batches = [1, 2, 3]
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file: not a terminal
    assert _progress(batches, True, "epoch 1/1") is batches

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    pytest.importorskip("tqdm")
    bar = _progress(batches, True, "epoch 1/1")
    assert bar is not batches and list(bar) == batches


def test_report_writes_beside_the_runs_by_default(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main(
        [
            "sweep", "--preset", "fashion_mnist_small_cnn_tiny", "--out", str(out),
            "--grid", "seed=0", "--set", "data.train_examples=200", "--set", "threads=1",
            "--set", "data.test_examples=200", "--set", "data.ood_examples=200", "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    assert main(["report", str(out)]) == 0
    table = (out / "report" / "report.md").read_text()
    final = json.loads((out / "seed=0" / "final.json").read_text())["metrics"]
    assert f"{final['test/accuracy']:.4f}" in table


def test_cli_says_how_to_download(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SNENS_DATA", str(tmp_path))
    code = main(
        [
            "train", "--preset", "fashion_mnist_small_cnn_tiny", "--out", str(tmp_path / "runs"),
            "--set", 'data.dataset="svhn"', "--set", "data.ood=[]",
            "--set", f"data.root={tmp_path}",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--set data.download=true" in err
    assert not (tmp_path / "runs").exists() or not any(
        (tmp_path / "runs").iterdir()
    )  # no empty run


def test_the_sigma_norm_epoch_numbers_are_explained_once_with_their_target():
    """ "gain over uniform 0.35" meant nothing to a reader: the run says once what it is and
    which effective-member count the diversity loss aims at (k*(τ) of snens.optimal_k)."""
    from snens.engine.config import load_config
    from snens.engine.presets import preset
    from snens.engine.train import _legend_line

    config = load_config(preset("fashion_mnist_small_cnn_tiny"), [])
    assert _legend_line(config) == (
        "per epoch, 'gain over uniform' is M·KL(uniform ‖ member importances) per feature, in "
        "nats (0: every member weighs every feature alike; higher: features owned by fewer "
        "members), and 'effective members' the members sharing a feature on average, which "
        "the diversity loss (λ = 0.1) pulls toward k*(τ=1) = 1.67 of M=4, against the task "
        "loss (the smaller λ, the less it moves them)"
    )
    plain = load_config(preset("fashion_mnist_small_cnn_tiny"), ["method.diversity_weight=0"])
    assert _legend_line(plain).endswith("on average, M=4 (no diversity loss: λ = 0)")
