"""The engine on ImageNet-style class folders: a tiny tree of PNG files written here.

3 classes × 6 training and 2 validation images of 40×40 px, each class one colour with noise;
an OOD folder of grey images. Crops of 32 px (resize 36), a width-4 small CNN, σN-Ens M=2,
1 thread, no worker processes in the runs (one check compares against 2 workers).
"""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from snens.data import FolderLoader, ImageFolder, TrainTransform
from snens.engine.config import load_config
from snens.engine.presets import preset
from snens.engine.train import build_data, evaluate_run, train

COLOURS = {"blue": (30, 60, 220), "green": (40, 200, 60), "red": (220, 40, 40)}


def _write_folder(root, classes, count, seed):
    rng = np.random.default_rng(seed)
    for name, colour in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            pixels = np.clip(np.array(colour) + rng.normal(0, 25, (40, 40, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet_root")
    _write_folder(root / "imagenet" / "train", COLOURS, 6, seed=0)
    _write_folder(root / "imagenet" / "val", COLOURS, 2, seed=1)
    _write_folder(root / "grey" / "images", {"grey": (128, 128, 128)}, 6, seed=2)
    return root


def _config(tree, out_dir, *overrides):
    return load_config(
        preset("imagenet_resnet50"),
        [
            f"data.root={json.dumps(str(tree))}",
            f"out_dir={json.dumps(str(out_dir))}",
            "name='folders'",
            "threads=1",
            "deterministic=true",
            "device='cpu'",
            "data.image_size=32",
            "data.resize_size=36",
            "data.batch_size=6",
            "data.eval_batch_size=4",
            "data.num_workers=0",
            f"data.ood_folder={json.dumps(str(tree / 'grey'))}",
            "model.backbone='small_cnn'",
            "model.num_classes=0",
            "model.options.width=4",
            "method.num_members=2",
            "optim.optimizer='adamw'",
            "optim.lr=0.02",
            "optim.weight_decay=0.0",
            "optim.schedule='cosine'",
            "optim.milestones=[]",
            "optim.warmup_epochs=0",
            "optim.epochs=2",
            "optim.bf16=false",
            *overrides,
        ],
    )


def test_trains_and_evaluates_on_class_folders(tree, tmp_path):
    config = _config(tree, tmp_path)
    run_dir = train(config, progress=False, log=None)
    final = json.loads((run_dir / "final.json").read_text())
    metrics = final["metrics"]
    assert final["train"]["steps"] == 2 * 3  # 18 images in batches of 6, two epochs
    assert metrics["test/num_members"] == 2
    for key in ("test/accuracy", "test/nll", "test/ece", "ood/grey/auroc", "ood/grey/fpr95"):
        assert math.isfinite(metrics[key]), key
    assert 0.0 <= metrics["test/accuracy"] <= 1.0
    # last.pt and config.toml rebuild the same model and data: the same metrics again
    again, state = evaluate_run(run_dir)
    assert state["epoch"] == 2
    assert again == pytest.approx(metrics, rel=1e-6, abs=1e-9, nan_ok=True)


def test_your_own_class_folders_train_under_their_own_name(tree, tmp_path):
    """data.dataset 'image_folder': data.root holds train/ and val/ directly (here the tree's
    imagenet/ folder), the same images as the ImageNet run, so the same run."""
    grey = f"data.ood_folder={json.dumps(str(tree / 'grey'))}"
    own = _config(tree / "imagenet", tmp_path / "own", "data.dataset='image_folder'", grey)
    imagenet = train(_config(tree, tmp_path / "imagenet"), progress=False, log=None)
    run_dir = train(own, progress=False, log=None)
    got = json.loads((run_dir / "final.json").read_text())["metrics"]
    expected = json.loads((imagenet / "final.json").read_text())["metrics"]
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-9, nan_ok=True)
    with pytest.raises(
        ValueError, match=r"'image_folder' reads your class folders from data\.root"
    ):
        _config(tree, tmp_path, "data.dataset='image_folder'", 'data.root=""')
    with pytest.raises(FileNotFoundError, match=r"needs .*nowhere[/\\]train \(class sub-folders"):
        build_data(
            _config(tree / "nowhere", tmp_path, "data.dataset='image_folder'", grey).data, seed=0
        )


def test_folder_loader_is_seeded_independent_of_workers_and_shards(tree):
    dataset = ImageFolder(tree / "imagenet" / "train", TrainTransform(size=32))
    batches = {}
    for workers in (0, 2):
        loader = FolderLoader(dataset, 6, shuffle=True, drop_last=True, seed=3, num_workers=workers)
        loader.set_epoch(1)
        batches[workers] = list(loader)
    assert len(batches[0]) == 3
    for (x0, y0), (x2, y2) in zip(batches[0], batches[2], strict=True):
        torch.testing.assert_close(x0, x2, rtol=0, atol=0)
        assert torch.equal(y0, y2)
    # Two ranks: rank r holds the r-th half of each global batch of one process, bitwise.
    shards = []
    for rank in (0, 1):
        loader = FolderLoader(dataset, 6, shuffle=True, drop_last=True, seed=3).shard(rank, 2)
        loader.set_epoch(1)
        assert len(loader) == 3
        shards.append(list(loader))
    for step, (x, y) in enumerate(batches[0]):
        (xa, ya), (xb, yb) = shards[0][step], shards[1][step]
        assert len(ya) == len(yb) == 3
        torch.testing.assert_close(torch.cat([xa, xb]), x, rtol=0, atol=0)
        assert torch.equal(torch.cat([ya, yb]), y)
    with pytest.raises(ValueError, match="not divisible by world_size 4"):
        FolderLoader(dataset, 6).shard(0, 4)


def test_missing_folders_say_how_to_get_imagenet(tmp_path):
    config = _config(tmp_path / "empty", tmp_path, f"data.ood_folder={json.dumps('')}")
    with pytest.raises(FileNotFoundError, match=r"image-net\.org.*SNENS_DATA"):
        build_data(config.data, seed=0)
    config = _config(tmp_path, tmp_path, f"data.ood_folder={json.dumps(str(tmp_path / 'x'))}")
    with pytest.raises(FileNotFoundError, match=r"data\.ood_folder .* does not exist"):
        build_data(config.data, seed=0)


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["data.corruptions=true"], r"data\.corruptions is not available for .*'imagenet'"),
        (
            ["data.ood=['svhn']"],
            r"data\.ood 'svhn' .* give a class-folder tree as data\.ood_folder",
        ),
        (
            ["data.resize_size=16"],
            r"data\.resize_size must be an int in data\.image_size \(32\)\.\.4096",
        ),
    ],
)
def test_options_that_do_not_apply_to_folders_are_refused(tree, tmp_path, overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        _config(tree, tmp_path, *overrides)


@pytest.fixture
def tree_with_a_bad_image(tree, tmp_path):
    import shutil

    root = tmp_path / "bad_root"
    shutil.copytree(tree, root)
    bad = root / "imagenet" / "train" / "blue" / "9_broken.png"
    bad.write_bytes(b"not a png at all" * 4)
    return root, bad


def test_a_bad_training_image_is_counted_per_epoch_and_listed(tree_with_a_bad_image, tmp_path):
    root, bad = tree_with_a_bad_image
    run_dir = train(
        _config(root, tmp_path, "data.num_workers=1", "data.batch_size=19"),
        progress=False,
        log=None,
    )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["bad_images"] for r in records] == [1, 1]  # found by a worker, in epoch 1
    final = json.loads((run_dir / "final.json").read_text())
    assert list(final["data"]["bad_images"]) == [str(bad)]
    assert final["train"]["steps"] == 2  # 19 images (the bad one among them), one batch


def test_on_bad_image_raise_and_scan_images_reach_the_folders(tree_with_a_bad_image, tmp_path):
    from snens.data import BadImageError, ImageFolderWarning

    root, bad = tree_with_a_bad_image
    with pytest.raises(BadImageError, match="9_broken.png"):
        train(_config(root, tmp_path / "a", "data.on_bad_image='raise'"), progress=False, log=None)
    with pytest.warns(ImageFolderWarning, match="1 undecodable image"):
        loaded = build_data(_config(root, tmp_path / "b", "data.scan_images=true").data, seed=0)
    assert len(loaded.train.dataset) == 18 and loaded.bad_images() == {}


def test_bad_image_options_are_refused_for_in_memory_sets():
    with pytest.raises(ValueError, match=r"data\.on_bad_image applies to class-folder data sets"):
        load_config(preset("fashion_mnist_small_cnn_tiny"), ["data.on_bad_image='raise'"])
    with pytest.raises(ValueError, match=r"data\.scan_images applies to class-folder"):
        load_config(preset("fashion_mnist_small_cnn_tiny"), ["data.scan_images=true"])
