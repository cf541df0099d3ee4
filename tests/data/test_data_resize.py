"""Converting in-memory image sets for pretrained RGB models (``data.resize``, ``data.channels``,
``data.normalize``): the loaders hold what ``F.interpolate``, a channel repeat and the named
statistics give, corruptions are made at the stored size, OOD channels are checked after the
conversion, bad values are refused by key, and the engine trains on the converted images.

Real Fashion-MNIST and MNIST-5k, a few hundred images; RGB sets (CIFAR-10) are stand-ins drawn
here, as the CIFAR files are not on this machine.
"""

import dataclasses
import json
import math
import time
import tracemalloc

import pytest
import torch
import torch.nn.functional as F

import snens.data.transforms
import snens.engine.datasets
import snens.engine.train
from snens import data
from snens.data import registry
from snens.data.images import grey_to_rgb, resize_images
from snens.data.transforms import center_crop, normalize, resize_shorter
from snens.engine.config import DataConfig, load_config
from snens.engine.datasets import build_data, data_shape
from snens.engine.presets import preset

MEAN = torch.tensor(data.IMAGENET_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(data.IMAGENET_STD).view(1, 3, 1, 1)


def _data(*overrides: str) -> DataConfig:
    base = ["data.train_examples=200", "data.test_examples=100", "data.ood_examples=100"]
    return load_config(
        preset("fashion_mnist_mobilenet_v2"), base + ["data.augment=[]", *overrides]
    ).data


def _images(loader) -> torch.Tensor:
    return torch.cat([x for x, _ in loader])


def _resized(x: torch.Tensor, size: int) -> torch.Tensor:
    """The reference: float bilinear interpolation, rounded to the uint8 grid."""
    return F.interpolate(x.float(), size=(size, size), mode="bilinear", align_corners=False).round()


def test_resize_of_a_known_image_gives_the_hand_computed_pixels():
    # 2×2 -> 4×4, align_corners=False: output column j samples source x = (j + 0.5) / 2 - 0.5,
    # so row 0 is 0, 0.25·255, 0.75·255, 255 and row 1 mixes row 0 (3/4) with row 1 (1/4).
    image = torch.tensor([[[[0, 255], [255, 0]]]], dtype=torch.uint8)
    out = resize_images(image, 4)
    assert out.dtype == torch.uint8
    assert out[0, 0, 0].tolist() == [0, 64, 191, 255]  # 63.75, 191.25 rounded
    assert out[0, 0, 1, 1].item() == 96  # 0.75 · 63.75 + 0.25 · 191.25 = 95.625
    assert resize_images(image, 2) is image  # the same size: nothing to do


def test_resize_in_chunks_equals_interpolate_rounded():
    x = torch.randint(
        0, 256, (37, 3, 9, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    out = resize_images(x, 20, chunk=8)
    torch.testing.assert_close(out.float(), _resized(x, 20), rtol=0, atol=0)
    rgb = grey_to_rgb(x[:, :1])
    assert rgb.shape == (37, 3, 9, 7) and all(torch.equal(rgb[:, c], x[:, 0]) for c in range(3))
    with pytest.raises(ValueError, match="uint8 images"):
        resize_images(x.float(), 20)
    with pytest.raises(ValueError, match=r"grey images \(N, 1, H, W\)"):
        grey_to_rgb(x)


def test_loaders_hold_the_resized_rgb_imagenet_normalized_images():
    config = _data("data.resize=32", "data.validation_examples=50")
    before = torch.random.get_rng_state()
    loaded = build_data(config, seed=0)
    assert torch.equal(torch.random.get_rng_state(), before)  # building draws from no global RNG
    assert loaded.channels == 3 and data_shape(config) == (10, 3)
    x, _ = data.load_fashion_mnist("train")
    xt, _ = data.load_fashion_mnist("test")
    for images, stored in (
        (loaded.train.images, x[:200]),
        (loaded.validation.images, x[-50:]),
        (_images(loaded.test), xt[:100]),
    ):
        expected = (_resized(stored, 32).expand(-1, 3, -1, -1) / 255 - MEAN) / STD
        torch.testing.assert_close(images, expected, rtol=0, atol=1e-6)
    # black and white in the red channel: (0 − 0.485) / 0.229 and (1 − 0.485) / 0.229
    red = loaded.train.images[:, 0]
    assert red.min().item() == pytest.approx(-2.117904, abs=1e-5)
    assert red.max().item() == pytest.approx(2.248908, abs=1e-5)
    grey = loaded.train.images * STD + MEAN  # every channel holds the same grey
    torch.testing.assert_close(grey[:, 1], grey[:, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(grey[:, 2], grey[:, 0], rtol=0, atol=1e-6)


def test_dataset_normalization_repeats_the_grey_statistic():
    loaded = build_data(_data("data.normalize='dataset'"), seed=0)
    x, _ = data.load_fashion_mnist("train")
    stored = _resized(x[:200], 48)  # the preset's 48 px
    expected = (stored / 255 - data.FASHION_MNIST_MEAN) / data.FASHION_MNIST_STD
    torch.testing.assert_close(
        loaded.train.images, expected.expand(-1, 3, -1, -1), rtol=0, atol=1e-6
    )
    # defaults: as stored, 28 px grey, the data set's statistic (today's behaviour)
    plain = build_data(
        _data("data.resize=0", "data.channels=0", "data.normalize='dataset'"), seed=0
    )
    expected = (x[:200].float() / 255 - data.FASHION_MNIST_MEAN) / data.FASHION_MNIST_STD
    torch.testing.assert_close(plain.train.images, expected, rtol=0, atol=1e-6)
    assert plain.channels == 1


def test_corruptions_are_made_at_the_stored_size_then_resized():
    config = _data(
        "data.resize=32",
        "data.corruptions=true",
        "data.corruption_names=['gaussian_noise']",
        "data.severities=[3]",
        "data.corruption_examples=50",
    )
    loaded = build_data(config, seed=0)
    xt, yt = data.load_fashion_mnist("test")
    _, _, corrupted, _ = next(data.corrupted(xt[:50], yt[:50], "gaussian_noise", 3, seed=0))
    expected = (_resized(corrupted, 32).expand(-1, 3, -1, -1) / 255 - MEAN) / STD
    got = _images(loaded.corruptions[("gaussian_noise", 3)])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    # not the same as corrupting the resized images: the noise is drawn per stored pixel
    _, _, late, _ = next(data.corrupted(resize_images(xt[:50], 32), yt[:50], "gaussian_noise", 3))
    assert not torch.allclose(got, (late.float().expand(-1, 3, -1, -1) / 255 - MEAN) / STD)


def _fake_rgb(monkeypatch, name: str = "cifar10") -> torch.Tensor:
    """A stand-in for an RGB set's files: 300 random 32 px images, 10 classes."""
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (300, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.arange(300) % 10
    fake = dataclasses.replace(
        registry.DATASETS[name], load=lambda split, root, download: (images, labels)
    )
    monkeypatch.setitem(registry.DATASETS, name, fake)
    return images


def test_a_grey_ood_set_with_an_rgb_data_set_needs_channels_3(monkeypatch):
    images = _fake_rgb(monkeypatch)
    rgb = DataConfig(dataset="cifar10", train_examples=200, ood=("mnist_5k",), ood_examples=100)
    with pytest.raises(ValueError, match=r"data.ood 'mnist_5k' has 1 channel.*data.channels=3"):
        build_data(rgb, seed=0)
    config = DataConfig(**{**rgb.__dict__, "channels": 3, "resize": 40, "augment": ()})
    loaded = build_data(config, seed=0)
    assert loaded.channels == 3 and data_shape(config) == (10, 3)
    mean = torch.tensor(data.CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(data.CIFAR10_STD).view(1, 3, 1, 1)
    # the RGB set is only resized (channels=3 on RGB changes nothing) ...
    expected = (_resized(images[:200], 40) / 255 - mean) / std
    torch.testing.assert_close(loaded.train.images, expected, rtol=0, atol=1e-6)
    # ... and the grey OOD digits are repeated to RGB, normalized with CIFAR-10's statistics
    ood = _images(loaded.ood["mnist_5k"]) * std + mean
    torch.testing.assert_close(ood[:, 1], ood[:, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(ood[:, 2], ood[:, 0], rtol=0, atol=1e-6)
    assert ood.shape == (100, 3, 40, 40)


def test_an_rgb_ood_set_with_a_grey_data_set_needs_channels_3(monkeypatch):
    images = _fake_rgb(monkeypatch)
    with pytest.raises(ValueError, match=r"data.ood 'cifar10' has 3 channel.*fashion_mnist has 1"):
        grey = _data("data.ood=['cifar10']", "data.channels=0", "data.normalize='dataset'")
        build_data(grey, seed=0)
    loaded = build_data(_data("data.ood=['cifar10']", "data.resize=32"), seed=0)
    keep = torch.randperm(300, generator=torch.Generator().manual_seed(0))[:100]  # ood_examples
    expected = (images[keep].float() / 255 - MEAN) / STD  # 32 px already: not resampled
    torch.testing.assert_close(_images(loaded.ood["cifar10"]), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        ({"resize": -1}, r"data\.resize must be an int in 0\.\.4096"),
        ({"channels": 2}, r"data\.channels must be one of \[0, 1, 3\].*got 2"),
        ({"dataset": "cifar10", "channels": 1}, r"data\.channels must be one of \[0, 3\].*got 1"),
        ({"normalize": "foo"}, r"data\.normalize must be one of 'dataset', 'imagenet', got 'foo'"),
        ({"normalize": "imagenet"}, r"data\.normalize 'imagenet' needs 3-channel.*channels=3"),
        (
            {"dataset": "rotten_tomatoes", "augment": [], "resize": 48},
            r"data\.resize applies to the in-memory image sets.*leave data\.resize at 0",
        ),
        (
            {"dataset": "sst2", "augment": [], "normalize": "imagenet"},
            r"data\.normalize applies to the in-memory image sets",
        ),
        ({"dataset": "imagenet", "channels": 3}, r"data\.channels applies to the in-memory"),
    ],
)
def test_bad_conversion_values_are_refused_by_key(values, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_config({"data": values})


def test_the_engine_trains_on_converted_images(tmp_path, monkeypatch):
    """One epoch of σN-Ens over a narrow, untrained MobileNetV2 on 256 images at 32 px RGB."""
    seen: list[tuple[int, ...]] = []
    build = snens.engine.train.build_model

    def recording(*args, **kwargs):
        model = build(*args, **kwargs)
        model.register_forward_pre_hook(lambda module, inputs: seen.append(tuple(inputs[0].shape)))
        return model

    monkeypatch.setattr(snens.engine.train, "build_model", recording)
    config = load_config(
        preset("fashion_mnist_mobilenet_v2"),
        [
            f"out_dir={json.dumps(str(tmp_path))}",
            "name='run'",
            "threads=1",
            "data.train_examples=256",
            "data.test_examples=100",
            "data.ood_examples=100",
            "data.resize=32",
            "data.corruptions=true",
            "data.corruption_names=['contrast']",
            "data.severities=[1]",
            "data.corruption_examples=100",
            "model.options={pretrained=false, width_mult=0.25}",
            "optim.epochs=1",
        ],
    )
    run_dir = snens.engine.train.train(config, progress=False, log=None)
    final = json.loads((run_dir / "final.json").read_text())
    assert seen[:8] == [(32, 3, 32, 32)] * 8  # the 8 training steps
    assert set(seen) <= {(32, 3, 32, 32), (100, 3, 32, 32)}  # evaluation: 100-image sets
    metrics = final["metrics"]
    assert 0 <= metrics["test/accuracy"] <= 1 and math.isfinite(metrics["test/nll"])


def _old_eval_transform(image: torch.Tensor, resize: int, crop: int) -> torch.Tensor:
    """EvalTransform as it was: the whole image resized, then center-cropped."""
    cropped = center_crop(resize_shorter(image, resize), crop)
    return normalize(cropped, data.IMAGENET_MEAN, data.IMAGENET_STD)


@pytest.mark.parametrize("shape", [(300, 260), (260, 300), (333, 500), (2000, 150), (7, 9)])
def test_eval_transform_unchanged_for_ordinary_aspect_ratios(shape):
    image = torch.randint(0, 256, (3, *shape), generator=torch.Generator().manual_seed(0))
    image = image.to(torch.uint8)
    assert torch.equal(data.EvalTransform()(image), _old_eval_transform(image, 256, 224))


@pytest.mark.parametrize(
    "shape", [(5, 200), (200, 5), (3, 300), (1, 1000), (17, 1000), (100, 5000), (40, 2000)]
)
def test_eval_transform_extreme_aspect_resizes_only_the_crop(shape):
    """Past 16:1 only the central strip is resized; it matches the whole-image resize."""
    image = torch.randint(0, 256, (3, *shape), generator=torch.Generator().manual_seed(1))
    image = image.to(torch.uint8)
    out = data.EvalTransform(resize=16, crop=14)(image)
    expected = _old_eval_transform(image, 16, 14)
    assert out.shape == expected.shape == (3, 14, 14)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_eval_transform_thin_strip_is_bounded(monkeypatch):
    """A 1 × 4000 image (a 92-byte PNG) was resized whole to 256 × 1 024 000 (3 GB)."""
    sizes = []

    def recording_resize(image, height, width):
        sizes.append(height * width)
        return resize(image, height, width)

    resize = snens.data.transforms._resize
    monkeypatch.setattr(snens.data.transforms, "_resize", recording_resize)
    image = torch.zeros(3, 1, 4000, dtype=torch.uint8)
    image[:, :, 2000:] = 255
    started = time.perf_counter()
    tracemalloc.start()
    try:
        wide = data.EvalTransform()(image)
        tall = data.EvalTransform()(image.transpose(1, 2))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 5
    assert sizes and max(sizes) <= 256 * 224  # what the crop keeps, not 256 × 1 024 000
    assert peak < 10 * 2**20  # numpy's part (the weights); torch's tensors are not traced
    assert wide.shape == tall.shape == (3, 224, 224)
    torch.testing.assert_close(tall, wide.transpose(1, 2), rtol=0, atol=1e-6)
    # 256-fold upsampling: the crop (columns 511 888 + k of 1 024 000) is the linear ramp between
    # source pixels 1999 (black) and 2000 (white), whose centers are at 1999.5 and 2000.5
    ramp = (511_888 + torch.arange(224) + 0.5) / 256 - 0.5 - 1999
    pixels = wide[None] * STD + MEAN  # back to [0, 1]
    torch.testing.assert_close(pixels[0], ramp.expand(3, 224, 224), rtol=0, atol=1e-5)
