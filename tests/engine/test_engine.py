"""The training engine on real Fashion-MNIST: run directory, determinism, resume after SIGKILL,
non-finite losses, fine-tuning modes, and the `snens train` / `snens eval` commands.

Every run here: a width-8 small CNN, σN-Ens with M=4, 600 training images in 6 steps per
epoch, 1 thread, deterministic algorithms; about a second per run on a 2-core machine.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import snens.engine.runs
import snens.engine.train
from snens.engine.checkpoint import load_checkpoint
from snens.engine.cli import main
from snens.engine.config import RunConfig, load_config, to_toml
from snens.engine.presets import preset
from snens.engine.runs import RunDirError, read_metrics
from snens.engine.train import NonFiniteLossError, lr_factor, train

EPOCHS = 3


def _config(out_dir: Path, name: str, *overrides: str) -> RunConfig:
    return load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(out_dir))}",
            f"name={json.dumps(name)}",
            "threads=1",
            "deterministic=true",
            "data.train_examples=600",
            "data.test_examples=500",
            "data.ood_examples=500",
            "data.augment=['crop', 'flip']",
            f"optim.epochs={EPOCHS}",
            "optim.lr=0.02",
            "model.options.width=8",
            *overrides,
        ],
    )


def _final(run_dir: Path) -> dict:
    return json.loads((run_dir / "final.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, with a small corruption set so every section of final.json exists."""
    out = tmp_path_factory.mktemp("runs")
    config = _config(
        out,
        "reference",
        "data.corruptions=true",
        "data.corruption_names=['contrast', 'gaussian_noise']",
        "data.severities=[1, 5]",
        "data.corruption_examples=200",
    )
    return config, train(config, progress=False, log=None)


def test_training_fills_the_run_directory(reference):
    config, run_dir = reference
    names = {p.name for p in run_dir.iterdir()}
    assert {"config.toml", "provenance.json", "metrics.jsonl", "last.pt", "prev.pt"} <= names
    assert "final.json" in names
    assert load_config(run_dir / "config.toml") == config

    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert provenance["git_sha"] is None or len(provenance["git_sha"]) == 40
    assert provenance["torch"] == torch.__version__ and provenance["python"]

    records = read_metrics(run_dir)
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert [r["step"] for r in records] == [6, 12, 18]
    assert records[-1]["task_loss"] < records[0]["task_loss"] < math.log(10)  # it learns
    assert all(0 < r["effective_members"] <= 4 and r["diversity_gain"] > 0 for r in records)

    final = _final(run_dir)
    metrics = final["metrics"]
    for key in ("test/accuracy", "test/nll", "test/ece", "ood/mnist_5k/auroc", "shift/mean/ece"):
        assert math.isfinite(metrics[key])
    assert "shift/contrast/5/accuracy" in metrics
    assert metrics["test/accuracy"] > 0.25  # chance is 0.1; measured 0.38
    train = final["train"]
    peak = {k: train.pop(k) for k in ("peak_rss_mib",) if k in train}  # Linux only
    assert train == {"epochs": EPOCHS, "steps": 18, "skipped_steps": 0, "seconds": train["seconds"]}
    if sys.platform == "linux":  # each epoch's peak resident set, the run's is the largest
        assert peak["peak_rss_mib"] == max(r["peak_rss_mib"] for r in records) > 100
    assert load_checkpoint(run_dir / "last.pt")["epoch"] == EPOCHS
    assert load_checkpoint(run_dir / "prev.pt")["epoch"] == EPOCHS - 1


def test_same_seed_same_metrics(reference, tmp_path):
    config, run_dir = reference
    again = train(load_config(config, ["name='again'"]), progress=False, log=None)
    assert _final(again)["metrics"] == _final(run_dir)["metrics"]
    other = train(load_config(config, ["name='other'", "seed=1"]), progress=False, log=None)
    assert _final(other)["metrics"] != _final(run_dir)["metrics"]


def test_resume_after_sigkill_gives_the_same_metrics(reference, tmp_path):
    """Kill a `snens train` process with SIGKILL during epoch 2, resume: bitwise the same run."""
    config, run_dir = reference
    killed = load_config(config, [f"out_dir={json.dumps(str(tmp_path))}", "name='killed'"])
    path = tmp_path / "killed"
    config_file = tmp_path / "killed.toml"
    config_file.write_text(to_toml(killed))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "snens.engine.cli",
            "train",
            "--config",
            str(config_file),
            "--no-progress",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # a guard against a hang, not a speed test: a loaded machine may take minutes for epoch 1
    deadline = time.monotonic() + 600
    while not (path / "last.pt").exists():  # the first checkpoint: end of epoch 1
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "no checkpoint within 600 s"
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    assert not (path / "final.json").exists()  # killed mid-run
    assert load_checkpoint(path / "last.pt")["epoch"] < EPOCHS

    assert main(["train", "--resume", str(path), "--no-progress"]) == 0
    assert _final(path)["metrics"] == _final(run_dir)["metrics"]
    records, expected = read_metrics(path), read_metrics(run_dir)
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert [r["task_loss"] for r in records] == [r["task_loss"] for r in expected]
    provenance = json.loads((path / "provenance.json").read_text())
    assert len(provenance["resumed"]) == 1


def test_resume_refuses_another_config(reference):
    config, run_dir = reference
    with pytest.raises(ValueError, match=r"optim\.lr: saved 0\.02, given 0\.5"):
        train(load_config(config, ["optim.lr=0.5"]), resume=True, run_dir=run_dir, log=None)


class _Poisoned:
    """A training loader whose batch at (epoch, step) holds a NaN."""

    def __init__(self, loader, epoch: int, step: int) -> None:
        self.loader, self.target = loader, (epoch, step)

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self):
        epoch = self.loader.epoch
        for step, (x, y) in enumerate(self.loader):
            if (epoch, step) == self.target:
                x = x.clone()
                x[0, 0, 0, 0] = math.nan
            yield x, y


def _poison(monkeypatch, epoch: int, step: int) -> None:
    build = snens.engine.train.build_data

    def poisoned(*args, **kwargs):
        loaded = build(*args, **kwargs)
        loaded.train = _Poisoned(loaded.train, epoch, step)
        return loaded

    monkeypatch.setattr(snens.engine.train, "build_data", poisoned)


def test_nonfinite_loss_stops_naming_epoch_step_and_cause(tmp_path, monkeypatch):
    _poison(monkeypatch, epoch=1, step=2)  # the third step of the second epoch
    config = _config(tmp_path, "nan")
    with pytest.raises(NonFiniteLossError) as error:
        train(config, progress=False, log=None)
    message = str(error.value)
    assert "epoch 2, step 3 of 6 (global step 9)" in message
    assert "input batch holds NaN" in message
    assert "last good checkpoint is" in message
    state = load_checkpoint(tmp_path / "nan" / "last.pt")
    assert state["epoch"] == 1 and state["step"] == 6
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    assert not (tmp_path / "nan" / "final.json").exists()
    assert len(read_metrics(tmp_path / "nan")) == 1


def test_nonfinite_loss_skip_mode_drops_the_step(tmp_path, monkeypatch):
    _poison(monkeypatch, epoch=1, step=2)
    config = _config(tmp_path, "skip", "on_nonfinite='skip'")
    with pytest.warns(UserWarning, match="skipped the step at epoch 2, step 3"):
        run_dir = train(config, progress=False, log=None)
    assert [r["skipped_steps"] for r in read_metrics(run_dir)] == [0, 1, 0]
    final = _final(run_dir)
    assert final["train"]["skipped_steps"] == 1
    assert math.isfinite(final["metrics"]["test/nll"])  # norm statistics were restored


def test_unwritable_output_fails_before_loading_data(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")

    def never(*args, **kwargs):
        raise AssertionError("data was loaded")

    monkeypatch.setattr(snens.engine.train, "build_data", never)
    with pytest.raises(RunDirError, match="not writable"):
        train(_config(blocker, "x"), progress=False, log=None)


def test_finetune_norms_and_heads_freezes_the_rest(tmp_path):
    config = _config(tmp_path, "ft", "optim.epochs=1", "optim.finetune='norms_and_heads'")
    run_dir = train(config, progress=False, log=None)
    trained = load_checkpoint(run_dir / "last.pt")["model"]
    torch.manual_seed(config.seed)  # the engine's initialization, rebuilt
    fresh = snens.engine.train.build_model(config, num_classes=10, channels=1).state_dict()
    changed = {name for name, value in trained.items() if not torch.equal(value, fresh[name])}
    convolutions = {name for name, value in trained.items() if value.dim() == 4}
    assert len(convolutions) == 6 and not convolutions & changed  # frozen
    for kind in ("gamma", "bias", "running_mean", "model.fc.weight"):
        assert any(kind in name for name in changed), kind  # trained


def test_compile_failure_falls_back_to_eager(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    config = _config(tmp_path, "compiled", "optim.epochs=1", "optim.compile=true")
    with pytest.warns(UserWarning, match="torch.compile failed, training eagerly"):
        run_dir = train(config, progress=False, log=None)
    assert (run_dir / "final.json").exists()


def test_schedule_warmup_cosine_and_multistep():
    cosine = [lr_factor(s, total_steps=10, warmup_steps=2) for s in range(10)]
    assert cosine[:3] == [0.5, 1.0, 1.0]
    assert cosine[2:] == sorted(cosine[2:], reverse=True) and cosine[-1] > 0
    assert lr_factor(6, total_steps=10, warmup_steps=2) == pytest.approx(0.5)  # halfway
    steps = dict(schedule="multistep", steps_per_epoch=10, milestones=(2, 4), decay=0.1)
    assert [lr_factor(s, total_steps=60, **steps) for s in (0, 19, 20, 39, 40, 59)] == [
        1.0,
        1.0,
        pytest.approx(0.1),
        pytest.approx(0.1),
        pytest.approx(0.01),
        pytest.approx(0.01),
    ]


def test_cli_train_then_eval_reproduces_final_metrics(tmp_path, capsys):
    args = ["train", "--preset", "fashion_mnist_small_cnn_tiny", "--out", str(tmp_path)]
    args += ["--set", "name='cli'", "--set", "threads=1", "--set", "data.train_examples=300"]
    args += ["--set", "data.test_examples=300", "--set", "data.ood_examples=300"]
    assert main([*args, "--no-progress"]) == 0
    run_dir = tmp_path / "cli"
    assert capsys.readouterr().out.strip().endswith(str(run_dir))

    assert main(["eval", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "| test/accuracy |" in out and "| ood/mnist_5k/auroc |" in out
    assert main(["eval", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == _final(run_dir)["metrics"]

    assert main([*args, "--no-progress"]) == 2  # the name is taken
    assert "already holds a run" in capsys.readouterr().err


def test_cli_rejects_bad_configs(tmp_path, capsys):
    assert main(["train", "--preset", "fashion_mnist_small_cnn_tiny", "--set", "optim.lr=x"]) == 2
    assert "optim.lr must be a number" in capsys.readouterr().err
    assert main(["train", "--preset", "nope"]) == 2
    assert "fashion_mnist_small_cnn_tiny" in capsys.readouterr().err
    assert main(["train"]) == 2
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["train", "--preset", "cifar10_resnet18", "--print-config"]) == 0
    assert 'backbone = "resnet18"' in capsys.readouterr().out


@pytest.mark.parametrize(
    "overrides",
    [
        ["method.name='single'", "method.num_members=1"],
        ["method.name='deep_ensemble'", "method.num_members=2"],
        ["method.input_policy='split'"],
        # SGD, warm-up then multistep, clipping, bf16 autocast, channels-last, evaluation
        # every epoch, label smoothing
        [
            "optim.optimizer='sgd'",
            "optim.lr=0.05",
            "optim.nesterov=true",
            "optim.weight_decay=5e-4",
            "optim.schedule='multistep'",
            "optim.milestones=[1]",
            "optim.warmup_epochs=1",
            "optim.grad_clip=1.0",
            "optim.bf16=true",
            "optim.channels_last=true",
            "optim.label_smoothing=0.1",
            "eval_every=1",
        ],
    ],
    ids=["single", "deep_ensemble", "split", "sgd_bf16_clip"],
)
def test_engine_options_train_to_finite_metrics(tmp_path, overrides):
    config = _config(tmp_path, "run", "optim.epochs=2", "data.train_examples=400", *overrides)
    run_dir = train(config, progress=False, log=None)
    records = read_metrics(run_dir)
    assert all(math.isfinite(r["task_loss"]) and math.isfinite(r["grad_norm"]) for r in records)
    metrics = _final(run_dir)["metrics"]
    assert metrics["test/num_members"] == config.method.num_members
    assert math.isfinite(metrics["test/nll"]) and math.isfinite(metrics["test/ece"])
    if config.eval_every:
        assert all("test/accuracy" in r for r in records)
        assert records[0]["lr"] == pytest.approx(0.05)  # the warm-up's last step: full lr
        assert records[1]["lr"] == pytest.approx(0.005)  # after the milestone: × 0.1


def test_resume_before_the_first_checkpoint_starts_over(reference, tmp_path):
    config, run_dir = reference
    fresh = load_config(config, [f"out_dir={json.dumps(str(tmp_path))}", "name='early'"])
    snens.engine.runs.create_run(fresh)  # as if killed before epoch 1 ended
    path = train(fresh, resume=True, progress=False, log=None)
    assert _final(path)["metrics"] == _final(run_dir)["metrics"]


def test_the_validation_split_is_not_run_again_for_final_json(tmp_path, monkeypatch):
    """The last epoch's learning curve kept the validation logits of the final weights; the
    final evaluation reuses them (one pass over the validation split fewer per run): its val/
    metrics are those logits' and equal the last epoch's curve, and snens eval, which runs
    the split again, reproduces them."""
    import snens.engine.reload as reload

    final_passes = []
    real = reload.validation_metrics
    monkeypatch.setattr(
        reload, "validation_metrics", lambda *a, **k: final_passes.append(1) or real(*a, **k)
    )
    config = _config(tmp_path, "val", "data.validation_examples=200", "optim.epochs=2")
    run_dir = train(config, progress=False, log=None)
    assert final_passes == []  # final_metrics took the kept logits
    final = _final(run_dir)["metrics"]
    last = read_metrics(run_dir)[-1]
    for key in ("val/accuracy", "val/nll", "val/ece", "val/disagreement"):
        assert final[key] == last[key], key
    monkeypatch.setattr(reload, "validation_metrics", real)
    again, _ = reload.evaluate_run(run_dir)
    for key in ("val/nll", "test_ts/nll", "test/conformal_aps_size"):
        assert again[key] == pytest.approx(final[key], rel=1e-5, abs=1e-6), key
