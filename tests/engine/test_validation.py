"""The validation split (``data.validation_examples``) and the regularizer's ramp
(``method.diversity_ramp_epochs``), on real Fashion-MNIST through the engine."""

import json
import math

import pytest
import torch

from snens import data
from snens.engine.config import load_config
from snens.engine.datasets import build_data
from snens.engine.epoch import StepSettings, _diversity_weight
from snens.engine.presets import preset
from snens.engine.reload import evaluate_run
from snens.engine.train import train


def _data_config(*overrides: str):
    return load_config(preset("fashion_mnist_small_cnn_tiny"), list(overrides)).data


def _images(loader) -> torch.Tensor:
    return torch.cat([x for x, _ in loader])


def test_validation_is_the_last_n_training_images_never_trained_on():
    loaded = build_data(
        _data_config("data.validation_examples=300", "data.train_examples=500", "data.augment=[]"),
        seed=0,
    )
    x, y = data.load_fashion_mnist("train", None, False)
    # every loader normalizes with the data set's fixed constants
    mean, std = data.FASHION_MNIST_MEAN, data.FASHION_MNIST_STD
    expected = (x[-300:].float() / 255 - mean) / std
    torch.testing.assert_close(_images(loaded.validation), expected, rtol=0, atol=1e-6)
    assert torch.equal(torch.cat([t for _, t in loaded.validation]), y[-300:])
    # the training set is the first 500 of the other 59,700: none of the held-out images
    train_labels = torch.cat([t for _, t in loaded.train])
    assert len(loaded.train) * 100 == 500 and train_labels.numel() == 500
    train_images = (_images(loaded.train) * std + mean) * 255
    held_out = x[-300:].flatten(1).float()
    distances = torch.cdist(train_images.flatten(1).round(), held_out)
    assert distances.min() > 0


def test_no_validation_by_default():
    assert build_data(_data_config(), seed=0).validation is None


def test_validation_refused_where_it_does_not_apply():
    with pytest.raises(ValueError, match=r"data.validation_examples 60000 leaves no training"):
        build_data(_data_config("data.validation_examples=60000"), seed=0)
    with pytest.raises(ValueError, match=r"data.validation_examples applies to the in-memory"):
        load_config(preset("imagenet_resnet50"), ["data.validation_examples=100"])
    with pytest.raises(ValueError, match=r"data.validation_examples"):
        _data_config("data.validation_examples=-1")


def test_engine_logs_the_validation_curve_and_its_final_value(tmp_path):
    config = load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(tmp_path))}",
            'name="run"',
            "threads=1",
            "deterministic=true",
            "data.train_examples=400",
            "data.validation_examples=200",
            "data.test_examples=300",
            "optim.epochs=2",
            "method.diversity_ramp_epochs=1.5",
        ],
    )
    run = train(config, progress=False, log=None)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    for r in records:
        assert 0 < r["val/accuracy"] <= 1 and math.isfinite(r["val/nll"])
        assert 0 <= r["val/disagreement"] <= 1
    final = json.loads((run / "final.json").read_text())["metrics"]
    # the same model on the same 200 images: the last point of the curve is the final value
    assert final["val/nll"] == pytest.approx(records[-1]["val/nll"], rel=1e-12)
    assert final["val/accuracy"] == records[-1]["val/accuracy"]
    assert final["val/num_members"] == 4.0
    # the ramp: 4 steps per epoch, λ rises over 6 steps, so epoch 1 (steps 1..4) averages
    # λ·(1+2+3+4)/24 = λ·10/24 of the full weight; the logged loss carries that factor
    assert abs(records[0]["diversity_loss"]) < abs(records[1]["diversity_loss"])
    # re-evaluated, with or without the validation split: the test metrics are the same
    again, _ = evaluate_run(run, corruptions=False)
    assert again["val/nll"] == pytest.approx(final["val/nll"], rel=1e-6)
    test_only, _ = evaluate_run(run, corruptions=False, validation=False)
    assert not [k for k in test_only if k.startswith("val/")]
    assert test_only["test/nll"] == pytest.approx(final["test/nll"], rel=1e-6)
    assert test_only["test/accuracy"] == final["test/accuracy"]


def test_diversity_ramp_weights():
    ramp = StepSettings(diversity_weight=0.1, diversity_ramp_steps=4)
    assert [_diversity_weight(ramp, s) for s in (1, 2, 4, 9)] == pytest.approx(
        [0.025, 0.05, 0.1, 0.1]
    )
    flat = StepSettings(diversity_weight=0.1)
    assert _diversity_weight(flat, 1) == 0.1
    with pytest.raises(ValueError, match="method.diversity_ramp_epochs"):
        load_config(preset("fashion_mnist_small_cnn_tiny"), ["method.diversity_ramp_epochs=-1"])


def test_the_regularizer_acts_on_the_layers_named_and_no_others():
    # SGD at lr 0: γ stays where conversion put it, so every step's diversity loss is the
    # same number, the selected layer's penalty alone
    from snens import diversity_loss
    from snens.engine.build import build_model
    from snens.engine.epoch import run_epoch
    from snens.nn import MemberNorm

    config = load_config(preset("fashion_mnist_small_cnn_tiny"), [])
    model = build_model(config, num_classes=10, channels=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    schedule = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
    layer = "model.stage3.1.1"
    settings = StepSettings(temperature=1.0, diversity_weight=2.0, diversity_layers=(layer,))
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 1, 28, 28, generator=gen), torch.arange(8)) for _ in range(2)]
    stats = run_epoch(model, batches, optimizer, schedule, settings, epoch=0)
    alone = diversity_loss(model, 1.0, 2.0, [layer]).item()
    assert stats.diversity_loss == pytest.approx(alone, rel=1e-6)
    names = [n for n, m in model.named_modules() if isinstance(m, MemberNorm)]
    each = [diversity_loss(model, 1.0, 2.0, [n]).item() for n in names]
    assert len(names) == 6 and diversity_loss(model, 1.0, 2.0).item() == pytest.approx(sum(each))
    assert abs(sum(each)) > 3 * abs(alone)  # the five others left out


def test_diversity_layers_are_checked_before_anything_trains(tmp_path):
    with pytest.raises(TypeError, match=r"method.diversity_layers must be a list of strings"):
        load_config(preset("fashion_mnist_small_cnn_tiny"), ['method.diversity_layers="a"'])
    with pytest.raises(ValueError, match=r"diversity_layers applies to method 'snens' only"):
        load_config(
            preset("fashion_mnist_small_cnn_tiny"),
            ["method.name=deep_ensemble", 'method.diversity_layers=["model.stage3.1.1"]'],
        )
    config = load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [f"out_dir={json.dumps(str(tmp_path))}", 'name="run"', 'method.diversity_layers=["fc"]'],
    )
    with pytest.raises(ValueError, match=r"method.diversity_layers: .*\['fc'\] are not member"):
        train(config, progress=False, log=None)
    assert not (tmp_path / "run").exists()


def test_the_logged_sharing_is_of_the_layers_the_regularizer_acts_on(tmp_path):
    from snens.engine.reload import load_run_model
    from snens.method.allocation import allocation, mean_effective_members
    from snens.method.regularizer import diversity_gain

    layer = "model.stage3.1.1"
    config = load_config(
        preset("fashion_mnist_small_cnn_tiny"),
        [
            f"out_dir={json.dumps(str(tmp_path))}",
            'name="run"',
            "threads=1",
            "data.train_examples=400",
            "data.test_examples=200",
            "data.corruption_examples=0",
            "optim.epochs=1",
            "method.diversity_weight=1.0",
            f"method.diversity_layers={json.dumps([layer])}",
        ],
    )
    lines = []
    run = train(config, progress=False, log=lines.append)
    assert any(
        f"'effective members' the members sharing a feature of {layer} on" in x for x in lines
    )
    record = json.loads((run / "metrics.jsonl").read_text())
    model, _, _ = load_run_model(run)
    shares = allocation(model)
    assert record["effective_members"] == pytest.approx(
        mean_effective_members({layer: shares[layer]})
    )
    assert record["diversity_gain"] == pytest.approx(diversity_gain(model, 1.0, [layer]))
    final = json.loads((run / "final.json").read_text())
    assert final["model"]["effective_members"] == pytest.approx(record["effective_members"])
    # the regularized layer is partitioned, the five others far less: the pooled number differs
    assert mean_effective_members(shares) - record["effective_members"] > 0.1
