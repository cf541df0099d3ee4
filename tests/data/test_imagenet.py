"""ImageNet-style class folders with tiny PNGs, and the torch ImageNet transforms."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from snens.data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    EvalTransform,
    ImageFolder,
    TrainTransform,
    imagenet_folder,
)
from snens.data.transforms import center_crop, resize_shorter

Image = pytest.importorskip("PIL.Image", reason="the image folder decodes files with Pillow")


def _write_png(path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


@pytest.fixture
def imagenet_root(tmp_path):
    """<root>/imagenet/{train,val}/<wnid>/*.png; image content encodes (class, index)."""
    for split in ("train", "val"):
        for label, wnid in enumerate(("n01440764", "n01443537")):
            for index in range(2):
                array = np.full((6, 9, 3), 40 * label + index, dtype=np.uint8)
                array[1, 2] = (200, 100, 50)
                _write_png(tmp_path / "imagenet" / split / wnid / f"img_{index}.png", array)
    (tmp_path / "imagenet" / "train" / "n01440764" / "notes.txt").write_text("not an image")
    return tmp_path


def test_imagenet_folder_classes_samples_and_pixels(imagenet_root):
    dataset = imagenet_folder(imagenet_root, split="train")
    assert dataset.classes == ["n01440764", "n01443537"]
    assert dataset.class_to_idx == {"n01440764": 0, "n01443537": 1}
    assert len(dataset) == 4 and dataset.targets == [0, 0, 1, 1]
    image, label = dataset[3]
    assert label == 1 and image.shape == (3, 6, 9) and image.dtype == torch.uint8
    assert image[:, 0, 0].tolist() == [41, 41, 41]
    assert image[:, 1, 2].tolist() == [200, 100, 50]  # channels first, RGB


def test_imagenet_folder_is_the_folder_itself_and_batches(imagenet_root):
    transform = EvalTransform(resize=8, crop=4)
    dataset = imagenet_folder(imagenet_root / "imagenet", split="val", transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)
    x, y = next(iter(loader))
    assert x.shape == (4, 3, 4, 4) and x.dtype == torch.float32 and y.tolist() == [0, 0, 1, 1]
    expected = (40 / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    torch.testing.assert_close(x[2, :, 3, 3], expected, rtol=0, atol=1e-5)


def test_eval_transform_geometry():
    image = torch.arange(30 * 40, dtype=torch.float32).view(1, 30, 40).expand(3, 30, 40)
    assert resize_shorter(image, 15).shape == (3, 15, 20)
    assert resize_shorter(image.transpose(1, 2), 15).shape == (3, 20, 15)
    assert resize_shorter(torch.zeros(3, 300, 400, dtype=torch.uint8), 256).shape == (3, 256, 341)
    crop = center_crop(image, 10)
    assert torch.equal(crop, image[:, 10:20, 15:25])  # offsets round((30 - 10) / 2), (40 - 10) / 2
    with pytest.raises(ValueError, match="cannot crop 31"):
        center_crop(image, 31)
    constant = torch.full((3, 300, 260), 128, dtype=torch.uint8)
    out = EvalTransform()(constant)
    assert out.shape == (3, 224, 224)
    expected = (128 / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    torch.testing.assert_close(out[:, 100, 100], expected, rtol=0, atol=1e-5)


def test_train_transform_crop_boxes_and_output():
    torch.manual_seed(0)
    transform = TrainTransform(size=16)
    for height, width in ((20, 30), (50, 10), (7, 7)):
        for _ in range(50):
            top, left, h, w = transform.crop_box(height, width)
            assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
            assert h > 0 and w > 0
    image = torch.full((3, 20, 30), 255, dtype=torch.uint8)
    out = transform(image)
    assert out.shape == (3, 16, 16)
    expected = (1 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    torch.testing.assert_close(out[:, 8, 8], expected, rtol=0, atol=1e-5)


def test_missing_imagenet_says_where_to_put_it(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        imagenet_folder(tmp_path, split="val")
    message = str(err.value)
    assert "https://image-net.org" in message and str(tmp_path / "imagenet" / "val") in message
    assert "SNENS_DATA" in message
    with pytest.raises(ValueError, match=r"\['train', 'val'\].*'test'"):
        imagenet_folder(tmp_path, split="test")


def test_flat_val_folder_and_empty_class_are_errors(tmp_path):
    _write_png(tmp_path / "flat" / "ILSVRC2012_val_00000001.png", np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="no class folders"):
        ImageFolder(tmp_path / "flat")
    (tmp_path / "classes" / "n0" / "empty").mkdir(parents=True)
    _write_png(tmp_path / "classes" / "n1" / "a.png", np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(FileNotFoundError, match=r"without images \['n0'\]"):
        ImageFolder(tmp_path / "classes")


def test_without_pillow_says_how_to_install(monkeypatch, imagenet_root):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match="pip install pillow"):
        imagenet_folder(imagenet_root, split="train")
