"""TensorLoader: coverage, determinism per (seed, epoch), normalization, vectorized crop/flip."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from snens.data import TensorLoader


def make_data(n=50, channels=1, size=28, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, channels, size, size), generator=g, dtype=torch.uint8)
    return images, torch.arange(n)


def epoch_labels(loader):
    return torch.cat([y for _, y in loader]).tolist()


def test_shuffled_epoch_covers_every_example_once():
    images, labels = make_data(n=50)
    loader = TensorLoader(images, labels, batch_size=8, shuffle=True, seed=0)
    assert len(loader) == 7
    for _ in range(3):
        order = epoch_labels(loader)
        assert sorted(order) == list(range(50))
    assert [len(y) for _, y in loader] == [8] * 6 + [2]


def test_unshuffled_is_in_order_and_drop_last():
    images, labels = make_data(n=50)
    assert epoch_labels(TensorLoader(images, labels, 8)) == list(range(50))
    loader = TensorLoader(images, labels, 8, drop_last=True)
    assert len(loader) == 6
    assert epoch_labels(loader) == list(range(48))
    shuffled = TensorLoader(images, labels, 8, shuffle=True, drop_last=True, seed=0)
    assert len(set(epoch_labels(shuffled))) == 48


def test_order_depends_only_on_seed_and_epoch():
    images, labels = make_data()
    a = TensorLoader(images, labels, 10, shuffle=True, seed=7)
    b = TensorLoader(images, labels, 10, shuffle=True, seed=7)
    epochs_a = [epoch_labels(a) for _ in range(3)]
    assert epochs_a == [epoch_labels(b) for _ in range(3)]
    assert len({tuple(e) for e in epochs_a}) == 3  # different across epochs
    b.set_epoch(1)
    assert epoch_labels(b) == epochs_a[1]
    assert b.epoch == 2
    c = TensorLoader(images, labels, 10, shuffle=True, seed=8)
    assert epoch_labels(c) != epochs_a[0]


def test_base_seed_from_generator_or_global_rng():
    images, labels = make_data()
    seeds = [
        TensorLoader(images, labels, 4, generator=torch.Generator().manual_seed(3)).seed
        for _ in range(2)
    ]
    assert seeds[0] == seeds[1]
    torch.manual_seed(0)
    first = TensorLoader(images, labels, 4).seed
    torch.manual_seed(0)
    assert TensorLoader(images, labels, 4).seed == first


def test_normalization_values():
    images, labels = make_data(n=6, channels=3, size=4)
    mean, std = [0.1, 0.2, 0.3], [0.5, 0.25, 2.0]
    loader = TensorLoader(images, labels, 6, mean=mean, std=std)
    x, y = next(iter(loader))
    expected = (
        images.double() / 255 - torch.tensor(mean).view(1, 3, 1, 1).double()
    ) / torch.tensor(std).view(1, 3, 1, 1).double()
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    torch.testing.assert_close(x, expected.float(), rtol=0, atol=1e-6)
    x_plain, _ = next(iter(TensorLoader(images, labels, 6)))
    torch.testing.assert_close(x_plain, images.float() / 255, rtol=0, atol=0)
    assert loader.images.dtype == torch.float32  # converted once, resident


def test_flip_with_probability_one_equals_torch_flip():
    images, labels = make_data(n=20)
    plain = next(iter(TensorLoader(images, labels, 20)))[0]
    flipped = next(iter(TensorLoader(images, labels, 20, augment="flip", flip_prob=1.0, seed=0)))
    torch.testing.assert_close(flipped[0], torch.flip(plain, dims=[-1]), rtol=0, atol=0)
    kept = next(iter(TensorLoader(images, labels, 20, augment="flip", flip_prob=0.0, seed=0)))
    torch.testing.assert_close(kept[0], plain, rtol=0, atol=0)


def test_crop_matches_per_sample_reference():
    images, labels = make_data(n=16, channels=2, size=28)
    mean, std = [0.3, 0.5], [0.4, 0.2]
    loader = TensorLoader(images, labels, 16, augment=("crop",), mean=mean, std=std, seed=5)
    assert loader.crop_padding == 2
    x, _ = next(iter(loader))
    assert x.shape == (16, 2, 28, 28)
    offsets = torch.randint(0, 5, (16, 2), generator=loader.epoch_generator(0))
    base = loader.images
    for i in range(16):
        r, c = offsets[i].tolist()
        for ch in range(2):
            fill = -mean[ch] / std[ch]  # a black pixel after normalization
            padded = F.pad(base[i, ch], (2, 2, 2, 2), value=fill)
            torch.testing.assert_close(x[i, ch], padded[r : r + 28, c : c + 28], rtol=0, atol=1e-6)
    assert not torch.equal(x, base)


def test_crop_and_flip_keep_shape_and_are_reproducible():
    images, labels = make_data(n=40, channels=3, size=32)
    a, b = (
        TensorLoader(images, labels, 16, shuffle=True, augment=("crop", "flip"), seed=1)
        for _ in range(2)
    )
    assert a.crop_padding == 4
    batches = list(a)
    assert [x.shape for x, _ in batches] == [(16, 3, 32, 32)] * 2 + [(8, 3, 32, 32)]
    for (xa, ya), (xb, yb) in zip(batches, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(next(iter(a))[0], batches[0][0])  # epoch 1 differs
    assert TensorLoader(images, labels, 4, augment="crop", crop_padding=1).crop_padding == 1


def test_token_ids_are_kept():
    ids = torch.randint(0, 100, (9, 5))
    x, y = next(iter(TensorLoader(ids, torch.zeros(9, dtype=torch.int32), 9)))
    assert torch.equal(x, ids) and y.dtype == torch.int64
    with pytest.raises(ValueError, match="kept as ids"):
        TensorLoader(ids, torch.zeros(9), 3, mean=0.5)


def test_validation():
    images, labels = make_data(n=10)
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            TensorLoader(images, labels, bad)
    with pytest.raises(ValueError, match="10 images and 9 labels"):
        TensorLoader(images, labels[:9], 4)
    with pytest.raises(ValueError, match="unknown augmentation"):
        TensorLoader(images, labels, 4, augment=("rotate",))
    with pytest.raises(ValueError, match="crop needs images"):
        TensorLoader(images.flatten(1), labels, 4, augment="crop")
    with pytest.raises(ValueError, match="yields no batch"):
        TensorLoader(images, labels, 11, drop_last=True)
    with pytest.raises(ValueError, match="one per channel"):
        TensorLoader(images, labels, 4, mean=[0.1, 0.2])
    with pytest.raises(ValueError, match="std must be positive"):
        TensorLoader(images, labels, 4, mean=0.5, std=0.0)
    with pytest.raises(ValueError, match="crop_padding"):
        TensorLoader(images, labels, 4, augment="crop", crop_padding=0)
    with pytest.raises(ValueError, match="epoch"):
        TensorLoader(images, labels, 4).set_epoch(-1)


def test_validation_of_data_set_flip_and_seed():
    images, labels = make_data(n=10)
    with pytest.raises(ValueError, match="the data set is empty"):
        TensorLoader(images[:0], labels[:0], 4)
    for bad in (-0.1, 1.5, "0.5", None, True):  # a string had raised a bare TypeError
        with pytest.raises(ValueError, match=r"flip_prob must be in \[0, 1\], got"):
            TensorLoader(images, labels, 4, flip_prob=bad)
    # a crop padding without a crop had been accepted and ignored
    with pytest.raises(ValueError, match=r"crop_padding=3 applies to augment 'crop'"):
        TensorLoader(images, labels, 4, augment="flip", crop_padding=3)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="seed must be a non-negative int"):
            TensorLoader(images, labels, 4, seed=bad)
    with pytest.raises(ValueError, match=r"flip needs images \(N, C, ..., W\), got \(10, 784\)"):
        TensorLoader(images.flatten(1), labels, 4, augment="flip")
