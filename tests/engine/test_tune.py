"""snens tune: every recipe probed for the first epochs of its schedule on Fashion-MNIST, the
best on validation trained to the end, and that run the same as one trained straight.

The module's probe trains 4 tiny recipes (300 images, width 4) for 2 of 3 epochs and
finishes one of them.
"""

import csv
import json
import math

import pytest
import torch

import snens.engine.train
from snens.engine.cli import main
from snens.engine.config import load_config
from snens.engine.presets import preset
from snens.engine.runs import read_final, read_metrics
from snens.engine.train import train
from snens.engine.tune import RECIPES, TUNE_FILE, default_probe_epochs, plan_tune, tune

TINY = "fashion_mnist_small_cnn_tiny"
SMALL = [
    "optim.epochs=3",
    "deterministic=true",
    "data.train_examples=300",
    "data.validation_examples=300",
    "data.test_examples=300",
    "data.ood_examples=300",
    "data.corruptions=false",
    "threads=1",
]


def _settings(*extra):
    return [flag for item in (*SMALL, *extra) for flag in ("--set", item)]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tune") / "probe"
    command = ["tune", "--preset", TINY, *_settings(), "--no-progress", "--out", str(out)]
    assert main(command) == 0
    return out, command


def test_every_recipe_is_probed_for_half_its_schedule_and_one_is_finished(tuned):
    out, _ = tuned
    record = json.loads((out / TUNE_FILE).read_text())
    # by default half of the 3 epochs, rounded up; NLL where the config selects by nothing
    assert record["probe_epochs"] == 2 and record["epochs"] == 3 and record["metric"] == "nll"
    assert list(record["recipes"]) == list(RECIPES)
    chosen = record["chosen"]
    for name, entry in record["recipes"].items():
        metrics = read_metrics(out / name)
        epochs = [r["epoch"] for r in metrics]
        # the probe's value is the best validation NLL of its first two epochs, as logged
        assert entry["value"] == min(r["val/nll"] for r in metrics[:2])
        assert metrics[entry["epoch"] - 1]["val/nll"] == entry["value"] and entry["epoch"] <= 2
        assert entry["set"] == list(RECIPES[name])
        if name == chosen:
            assert epochs == [1, 2, 3] and (out / name / "final.json").is_file()
        else:  # paused after the probe, resumable
            assert epochs == [1, 2] and not (out / name / "final.json").exists()
            assert (out / name / "last.pt").is_file()
    values = {name: entry["value"] for name, entry in record["recipes"].items()}
    assert chosen == min(values, key=values.get)
    with open(out / "sweep.csv", newline="", encoding="utf-8") as file:
        statuses = {row["run"]: row["status"] for row in csv.DictReader(file)}
    assert statuses == {
        name: "done" if name == chosen else "stopped after epoch 2" for name in RECIPES
    }
    config = load_config(out / "split_soft" / "config.toml")
    assert (config.method.input_policy, config.method.temperature) == ("split", 5.0)
    assert config.method.diversity_weight == 0.01
    config = load_config(out / "no_diversity" / "config.toml")
    assert (config.method.diversity_weight, config.method.gamma_lr_multiplier) == (0.0, 1.0)


def test_the_chosen_run_is_the_run_trained_straight(tuned, tmp_path):
    out, _ = tuned
    chosen = json.loads((out / TUNE_FILE).read_text())["chosen"]
    config = load_config(out / chosen / "config.toml")
    straight = train(config, run_dir=tmp_path / "straight", progress=False, log=None)
    assert read_final(straight)["metrics"] == read_final(out / chosen)["metrics"]
    assert read_final(straight)["selection"] == read_final(out / chosen)["selection"]


def test_running_it_again_trains_nothing(tuned, monkeypatch, capsys):
    out, command = tuned

    def refuse(*args, **kwargs):
        raise AssertionError("a finished probe trained again")

    monkeypatch.setattr(snens.engine.train, "train", refuse)
    before = (out / TUNE_FILE).read_text()
    assert main(command) == 0
    text = capsys.readouterr().out
    assert "probing 4 recipes for 2 of 3 epochs (0 to train)" in text
    assert "probed in" not in text and "finished in" not in text
    assert (out / TUNE_FILE).read_text() == before


def test_a_probe_of_more_epochs_goes_on_from_the_paused_runs(tmp_path):
    torch.set_num_threads(1)
    base = load_config(preset(TINY), SMALL)
    runs = plan_tune(base, tmp_path, recipes=["base", "split"])
    lines = []
    first = tune(runs, tmp_path, probe_epochs=1, log=lines.append)
    assert [line.split(" in ")[0] for line in lines if line.startswith("[")] == [
        "[1/2] base: training",
        "[1/2] base: probed",
        "[2/2] split: training",
        "[2/2] split: probed",
        f"[1/1] {first.chosen}: resuming from last.pt",
        f"[1/1] {first.chosen}: finished",
    ]
    runs = plan_tune(base, tmp_path, recipes=["base", "split"])
    assert [r.status for r in runs] == [
        "done" if r.name == first.chosen else "resume" for r in runs
    ]
    second = tune(runs, tmp_path, probe_epochs=2, log=lambda line: None)
    record = json.loads((tmp_path / TUNE_FILE).read_text())
    for run in runs:
        metrics = read_metrics(run.path())
        expected = min(r["val/nll"] for r in metrics[:2])
        assert second.values[run.name] == expected
        epoch = record["recipes"][run.name]["epoch"]
        assert metrics[epoch - 1]["val/nll"] == expected
        assert len(metrics) == (3 if run.name in (first.chosen, second.chosen) else 2)


def test_a_recipe_equal_to_the_base_is_tried_once(tmp_path):
    soft = ['method.input_policy="split"', "method.temperature=5.0", "method.diversity_weight=0.01"]
    base = load_config(preset(TINY), [*SMALL, *soft])
    names = [run.name for run in plan_tune(base, tmp_path)]
    assert names == ["base", "split", "no_diversity"]


def test_the_default_probe_is_half_the_schedule_rounded_up():
    assert [default_probe_epochs(e) for e in (1, 2, 3, 4, 5, 10, 20, 40)] == [
        1,
        1,
        2,
        2,
        3,
        5,
        10,
        20,
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--recipes", "base,wide"], "'wide' is not one"),
        (["--recipes", "base,base"], "give distinct names among base, split"),
        (
            ["--set", "method.temperature=2.0"],
            "--set method.temperature: the recipes split, split_soft set it; to change the "
            "base recipe's value write it in the --config file",
        ),
        (["--set", 'method.name="deep_ensemble"'], "a probe chooses σN-Ens recipes"),
        (["--set", "data.validation_examples=0"], "data.validation_examples is 0: a probe"),
        (["--probe-epochs", "4"], "probe_epochs must be an int in 1..3 (optim.epochs), got 4"),
        (["--probe-epochs", "0"], "probe_epochs must be an int in 1..3 (optim.epochs), got 0"),
    ],
)
def test_bad_input_exits_2_naming_the_value(tmp_path, capsys, extra, message):
    command = ["tune", "--preset", TINY, *_settings(), *extra, "--out", str(tmp_path / "t")]
    assert main(command) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "t" / TUNE_FILE).exists()


def test_nothing_to_probe_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no recipe to probe; plan them with plan_tune"):
        tune([], tmp_path)


def test_until_epoch_outside_the_schedule_is_refused(tmp_path):
    config = load_config(preset(TINY), SMALL)
    for bad in (0, 4, 1.5, True):
        with pytest.raises(ValueError, match=r"until_epoch must be an epoch of the schedule"):
            train(config, run_dir=tmp_path / "r", until_epoch=bad)
    assert not (tmp_path / "r").exists()


def test_a_failed_recipe_stops_the_probe_with_exit_1(tmp_path, monkeypatch, capsys):
    def fail(config, **kwargs):
        if config.name == "split":
            raise RuntimeError("disk full")
        return train(config, **kwargs)

    monkeypatch.setattr(snens.engine.train, "train", fail)
    command = ["tune", "--preset", TINY, *_settings(), "--recipes", "base,split"]
    assert main([*command, "--no-progress", "--out", str(tmp_path / "t")]) == 1
    err = capsys.readouterr().err
    assert "the recipe split failed (RuntimeError: disk full)" in err
    assert not (tmp_path / "t" / TUNE_FILE).exists()
    assert math.isfinite(read_metrics(tmp_path / "t" / "base")[0]["val/nll"])
