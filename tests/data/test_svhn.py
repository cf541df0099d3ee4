"""SVHN from a ``.mat`` fixture in the official layout (written with scipy.io.savemat)."""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import pytest
import torch

from snens.data import ChecksumError, load_svhn
from snens.data import svhn as svhn_module

scipy_io = pytest.importorskip("scipy.io", reason="SVHN's .mat files are read with SciPy")


def _svhn_arrays(n: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """X (32, 32, 3, n) uint8 with known pixels, y (n, 1) with the digit 0 stored as 10."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    x[4, 7, :, 0] = (101, 102, 103)  # row 4, column 7 of image 0 is (R, G, B)
    y = np.array([[10], [1], [2], [9], [10], [5]], dtype=np.uint8)[:n]
    return x, y


@pytest.fixture
def svhn_file(tmp_path):
    x, y = _svhn_arrays()
    path = tmp_path / "fixture" / "test_32x32.mat"
    path.parent.mkdir()
    scipy_io.savemat(path, {"X": x, "y": y})
    return path, x, y


def test_load_svhn_layout_and_label_ten_is_zero(tmp_path, svhn_file):
    path, x, _ = svhn_file
    (tmp_path / "svhn").mkdir()
    (tmp_path / "svhn" / "test_32x32.mat").write_bytes(path.read_bytes())
    images, labels = load_svhn("test", root=tmp_path)
    assert images.shape == (6, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 1, 2, 9, 0, 5]
    assert images[0, :, 4, 7].tolist() == [101, 102, 103]
    assert torch.equal(images, torch.from_numpy(x.transpose(3, 2, 0, 1).copy()))


def test_load_svhn_downloads_with_checksum(monkeypatch, tmp_path, svhn_file):
    path = svhn_file[0]
    monkeypatch.setattr(svhn_module, "SVHN_URL", path.parent.as_uri() + "/")
    monkeypatch.setitem(svhn_module.SVHN_MD5, "test", hashlib.md5(path.read_bytes()).hexdigest())
    root = tmp_path / "root"
    _, labels = load_svhn("test", root=root, download=True)
    assert labels.tolist() == [0, 1, 2, 9, 0, 5]
    assert sorted(p.name for p in (root / "svhn").iterdir()) == ["test_32x32.mat"]


def test_svhn_checksum_mismatch_leaves_nothing(monkeypatch, tmp_path, svhn_file):
    monkeypatch.setattr(svhn_module, "SVHN_URL", svhn_file[0].parent.as_uri() + "/")
    root = tmp_path / "root"
    with pytest.raises(ChecksumError, match="eb5a983be6a315427106f1b164d9cef3"):
        load_svhn("test", root=root, download=True)  # fixture bytes != official file
    assert list((root / "svhn").iterdir()) == []


def test_svhn_torchvision_layout(tmp_path, svhn_file):
    (tmp_path / "test_32x32.mat").write_bytes(svhn_file[0].read_bytes())
    assert load_svhn("test", root=tmp_path)[1].tolist() == [0, 1, 2, 9, 0, 5]


def test_svhn_missing_and_bad_split(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_svhn("extra", root=tmp_path)
    message = str(err.value)
    assert "download=True" in message and "SNENS_DATA" in message
    assert "http://ufldl.stanford.edu/housenumbers/extra_32x32.mat" in message
    with pytest.raises(ValueError, match=r"\['extra', 'test', 'train'\].*'validation'"):
        load_svhn("validation", root=tmp_path)


def test_svhn_rejects_a_file_of_another_layout(tmp_path):
    (tmp_path / "svhn").mkdir()
    scipy_io.savemat(tmp_path / "svhn" / "train_32x32.mat", {"X": np.zeros((28, 28, 1, 2))})
    with pytest.raises(ValueError, match="expected arrays X and y"):
        load_svhn("train", root=tmp_path)


def test_svhn_without_scipy_says_how_to_install(monkeypatch, tmp_path, svhn_file):
    (tmp_path / "test_32x32.mat").write_bytes(svhn_file[0].read_bytes())
    monkeypatch.setitem(sys.modules, "scipy.io", None)  # makes `from scipy.io import` fail
    with pytest.raises(ImportError, match="pip install scipy"):
        load_svhn("test", root=tmp_path)


def _damaged_mat_files(good: bytes) -> dict[str, bytes]:
    v73 = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, HDF5 schema 1.00 .".ljust(116)
    return {
        "empty": b"",
        "truncated": good[:300],
        "html": b"<html>404 not found</html>\n" * 20,
        "v7.3": v73 + b"\0" * 8 + b"\x00\x02IM" + b"\0" * 512,
    }


@pytest.mark.parametrize("case", ["empty", "truncated", "html", "v7.3"])
def test_a_damaged_or_v73_mat_file_names_the_file_and_the_fix(tmp_path, svhn_file, case):
    (tmp_path / "svhn").mkdir()
    path = tmp_path / "svhn" / "test_32x32.mat"
    path.write_bytes(_damaged_mat_files(svhn_file[0].read_bytes())[case])
    with pytest.raises(ValueError) as err:
        load_svhn("test", root=tmp_path)
    message = str(err.value)
    assert str(path) in message and "MATLAB v5" in message
    assert "Delete it" in message and "download=True" in message


def test_memory_error_while_reading_a_mat_file_is_not_hidden(monkeypatch, tmp_path, svhn_file):
    (tmp_path / "test_32x32.mat").write_bytes(svhn_file[0].read_bytes())

    def out_of_memory(path):
        raise MemoryError

    monkeypatch.setattr(scipy_io, "loadmat", out_of_memory)
    with pytest.raises(MemoryError):
        load_svhn("test", root=tmp_path)
