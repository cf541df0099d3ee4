"""CIFAR-10/100 and CIFAR-C from fixture files in the official formats; no network.

The fixtures are real-format miniatures: gzipped tarballs of Python-2-style pickled batches
with the official keys (10 images per batch) and ``.npy`` corruption arrays (5 severities × 4
images). Downloads come from a local 127.0.0.1 server; checksum constants are patched to the
fixtures' digests where a test needs them to pass.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import pickle
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from snens.data import (
    CIFAR_C_CORRUPTIONS,
    CIFAR_C_EXTRA_CORRUPTIONS,
    CORRUPTIONS,
    ChecksumError,
    load_cifar10,
    load_cifar100,
    load_cifar_c,
)
from snens.data import cifar as cifar_module

CIFAR10_BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture
def file_server(monkeypatch, tmp_path):
    """Serve ``tmp_path / "served"`` on 127.0.0.1; yields (folder, base URL, request log)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    folder = tmp_path / "served"
    folder.mkdir()
    requests: list[str] = []

    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=folder))
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}/", requests
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _batch(rng: np.random.Generator, n: int, label_keys: dict[bytes, int]) -> dict:
    batch = {b"batch_label": b"fixture", b"filenames": [b"img.png"] * n}
    batch[b"data"] = rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)
    for key, classes in label_keys.items():
        batch[key] = rng.integers(0, classes, n).tolist()
    return batch


def _add(tar: tarfile.TarFile, name: str, data: bytes, **info) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    for key, value in info.items():
        setattr(member, key, value)
    tar.addfile(member, io.BytesIO(data))


def _tarball(top: str, files: dict[str, bytes], gz: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w") as tar:
        folder = tarfile.TarInfo(top)
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, data in files.items():
            _add(tar, f"{top}/{name}", data)
    return buffer.getvalue()


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def cifar10_fixture():
    """A CIFAR-10 tarball with 10 images per batch; returns (tar bytes, batches, file bytes)."""
    rng = np.random.default_rng(0)
    batches = {name: _batch(rng, 10, {b"labels": 10}) for name in CIFAR10_BATCHES + ("test_batch",)}
    # One known pixel: image 0 of data_batch_1 at row 3, column 5 is (R, G, B) = (11, 22, 33).
    data = batches["data_batch_1"][b"data"]
    for channel, value in enumerate((11, 22, 33)):
        data[0, channel * 1024 + 3 * 32 + 5] = value
    files = {name: pickle.dumps(batch, protocol=2) for name, batch in batches.items()}
    files["batches.meta"] = pickle.dumps({b"label_names": [b"airplane"] * 10}, protocol=2)
    return _tarball("cifar-10-batches-py", files), batches, files


@pytest.fixture
def patched_cifar10(monkeypatch, cifar10_fixture):
    """Make the module accept the fixture: archive and per-batch MD5s of the fixture."""
    archive, _, files = cifar10_fixture
    monkeypatch.setattr(cifar_module, "CIFAR10_MD5", _md5(archive))
    monkeypatch.setattr(
        cifar_module, "CIFAR10_FILE_MD5", {name: _md5(data) for name, data in files.items()}
    )
    return cifar10_fixture


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_load_cifar10_downloads_end_to_end(monkeypatch, tmp_path, file_server, patched_cifar10):
    served, url, requests = file_server
    archive, batches, _ = patched_cifar10
    (served / "cifar-10-python.tar.gz").write_bytes(archive)
    monkeypatch.setattr(cifar_module, "CIFAR10_URL", url + "cifar-10-python.tar.gz")
    root = tmp_path / "root"

    images, labels = load_cifar10("train", root=root, download=True)
    assert images.shape == (50, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64
    assert tuple(images[0, :, 3, 5].tolist()) == (11, 22, 33)  # channels first, row-major planes
    for i, name in enumerate(CIFAR10_BATCHES):
        rows = batches[name][b"data"]
        block = images[10 * i : 10 * (i + 1)]
        assert torch.equal(block[:, 0].reshape(10, -1), torch.from_numpy(rows[:, :1024]))
        assert torch.equal(block[:, 2].reshape(10, -1), torch.from_numpy(rows[:, 2048:]))
        assert labels[10 * i : 10 * (i + 1)].tolist() == batches[name][b"labels"]
    test_images, test_labels = load_cifar10("test", root=root)
    assert torch.equal(
        test_images.reshape(10, -1), torch.from_numpy(batches["test_batch"][b"data"])
    )
    assert test_labels.tolist() == batches["test_batch"][b"labels"]
    assert requests == ["/cifar-10-python.tar.gz"]  # fetched once, then read locally
    assert sorted(p.name for p in (root / "cifar-10").iterdir()) == [
        "cifar-10-batches-py",
        "cifar-10-python.tar.gz",
    ]


def test_archive_checksum_mismatch_leaves_nothing(
    monkeypatch, tmp_path, file_server, cifar10_fixture
):
    served, url, _ = file_server
    (served / "cifar-10-python.tar.gz").write_bytes(cifar10_fixture[0])
    monkeypatch.setattr(cifar_module, "CIFAR10_URL", url + "cifar-10-python.tar.gz")
    root = tmp_path / "root"
    with pytest.raises(ChecksumError, match="c58f30108f718f92721af3b95e74349a"):
        load_cifar10("train", root=root, download=True)  # fixture bytes != official archive
    assert _listing(root) in ([], ["cifar-10"])  # at most the empty folder


def test_local_archive_with_wrong_checksum_is_not_extracted(tmp_path, cifar10_fixture):
    root = tmp_path / "root"
    (root / "cifar-10").mkdir(parents=True)
    (root / "cifar-10" / "cifar-10-python.tar.gz").write_bytes(cifar10_fixture[0])
    with pytest.raises(ChecksumError, match="md5 mismatch"):
        load_cifar10("train", root=root)
    assert _listing(root / "cifar-10") == ["cifar-10-python.tar.gz"]


def test_batch_with_wrong_checksum_is_never_unpickled(monkeypatch, tmp_path, patched_cifar10):
    root = tmp_path / "root"
    (root / "cifar-10").mkdir(parents=True)
    (root / "cifar-10" / "cifar-10-python.tar.gz").write_bytes(patched_cifar10[0])
    load_cifar10("test", root=root)  # extracts
    batch = root / "cifar-10" / "cifar-10-batches-py" / "data_batch_3"
    tampered = pickle.dumps({b"data": "tampered"})
    batch.write_bytes(tampered)
    real_loads = pickle.loads

    def guarded_loads(data, **kwargs):
        assert data != tampered, "a file with a wrong checksum was unpickled"
        return real_loads(data, **kwargs)

    monkeypatch.setattr(cifar_module.pickle, "loads", guarded_loads)
    with pytest.raises(ChecksumError, match="Refusing to unpickle") as err:
        load_cifar10("train", root=root)
    assert str(batch) in str(err.value)


@pytest.mark.parametrize(
    "evil",
    [
        {"name": "cifar-10-batches-py/../../escaped.txt"},
        {"name": "../escaped.txt"},
        {"name": "/tmp/escaped.txt"},
        {"name": "cifar-10-batches-py/link", "type": tarfile.SYMTYPE, "linkname": "/etc/passwd"},
        {"name": "elsewhere/escaped.txt"},
    ],
    ids=["dotdot-inside", "dotdot", "absolute", "symlink", "outside-top"],
)
def test_unsafe_archive_is_refused(monkeypatch, tmp_path, cifar10_fixture, evil):
    _, _, files = cifar10_fixture
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            _add(tar, f"cifar-10-batches-py/{name}", data)
        _add(tar, evil.pop("name"), b"pwned", **evil)
    archive = buffer.getvalue()
    monkeypatch.setattr(cifar_module, "CIFAR10_MD5", _md5(archive))
    root = tmp_path / "deep" / "root"
    (root / "cifar-10").mkdir(parents=True)
    (root / "cifar-10" / "cifar-10-python.tar.gz").write_bytes(archive)
    with pytest.raises(ValueError, match="refusing to extract"):
        load_cifar10("train", root=root)
    assert _listing(root / "cifar-10") == ["cifar-10-python.tar.gz"]  # no folder, no staging
    assert not list(tmp_path.rglob("escaped.txt"))


@pytest.mark.parametrize(
    "evil",
    [
        {"name": "cifar-10-batches-py/../../escaped.txt"},
        {"name": "cifar-10-batches-py/link", "type": tarfile.SYMTYPE, "linkname": "/etc/passwd"},
    ],
    ids=["dotdot", "symlink"],
)
def test_data_filter_refuses_even_without_the_member_check(
    monkeypatch, tmp_path, cifar10_fixture, evil
):
    # Defence in depth: tarfile's "data" filter stops what the member check would.
    monkeypatch.setattr(cifar_module, "_check_members", lambda tar, archive, top: tar.getmembers())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        _add(tar, "cifar-10-batches-py/test_batch", cifar10_fixture[2]["test_batch"])
        _add(tar, evil.pop("name"), b"pwned", **evil)
    archive = tmp_path / "root" / "cifar-10" / "cifar-10-python.tar.gz"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(buffer.getvalue())
    monkeypatch.setattr(cifar_module, "CIFAR10_MD5", _md5(buffer.getvalue()))
    with pytest.raises(ValueError, match="refusing to extract"):
        load_cifar10("test", root=tmp_path / "root")
    assert _listing(archive.parent) == ["cifar-10-python.tar.gz"]
    assert not list(tmp_path.rglob("escaped.txt"))


def test_missing_cifar_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SNENS_DATA", raising=False)
    with pytest.raises(FileNotFoundError) as err:
        load_cifar10("train", root=tmp_path)
    message = str(err.value)
    assert "download=True" in message and "SNENS_DATA" in message
    assert "--set data.download=true" in message  # the engine's switch, named
    assert cifar_module.CIFAR10_URL in message and str(tmp_path / "cifar-10") in message
    with pytest.raises(FileNotFoundError, match="cifar-100-python.tar.gz"):
        load_cifar100("test", root=tmp_path)


def test_bad_split_lists_the_splits(tmp_path):
    with pytest.raises(ValueError, match=r"\['test', 'train'\].*'valid'"):
        load_cifar10("valid", root=tmp_path)
    with pytest.raises(ValueError, match=r"\['test', 'train'\]"):
        load_cifar100("val", root=tmp_path)


def test_cifar100_fine_and_coarse_labels_from_torchvision_layout(monkeypatch, tmp_path):
    rng = np.random.default_rng(1)
    batches = {
        name: _batch(rng, 10, {b"fine_labels": 100, b"coarse_labels": 20})
        for name in ("train", "test")
    }
    files = {name: pickle.dumps(batch, protocol=2) for name, batch in batches.items()}
    monkeypatch.setattr(
        cifar_module, "CIFAR100_FILE_MD5", {name: _md5(data) for name, data in files.items()}
    )
    folder = tmp_path / "cifar-100-python"  # torchvision's layout: directly under the root
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    images, fine = load_cifar100("train", root=tmp_path)
    _, coarse = load_cifar100("train", root=tmp_path, coarse=True)
    assert torch.equal(images.reshape(10, -1), torch.from_numpy(batches["train"][b"data"]))
    assert fine.tolist() == batches["train"][b"fine_labels"]
    assert coarse.tolist() == batches["train"][b"coarse_labels"]


# CIFAR-C ----------------------------------------------------------------------------------


def _cifar_c_arrays(n: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """5 severities × n images, channels last; image k of severity s has value 10·s + k."""
    images = np.zeros((5 * n, 32, 32, 3), dtype=np.uint8)
    for s in range(5):
        for k in range(n):
            images[s * n + k] = 10 * (s + 1) + k
    images[0, 1, 2] = (7, 8, 9)  # row 1, column 2 of severity 1's first image
    labels = np.tile(np.arange(n, dtype=np.uint8) + 3, 5)
    return images, labels


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.fixture
def cifar_c_root(tmp_path):
    images, labels = _cifar_c_arrays()
    folder = tmp_path / "cifar-10-c" / "CIFAR-10-C"
    folder.mkdir(parents=True)
    np.save(folder / "gaussian_noise.npy", images)
    np.save(folder / "labels.npy", labels)
    return tmp_path, images, labels


@pytest.mark.parametrize("severity", [1, 2, 3, 4, 5])
def test_cifar_c_slices_by_severity(cifar_c_root, severity):
    root, images, labels = cifar_c_root
    x, y = load_cifar_c("gaussian_noise", severity, root=root)
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.uint8 and y.dtype == torch.int64
    assert x[:, 0, 5, 5].tolist() == [10 * severity + k for k in range(4)]
    assert y.tolist() == [3, 4, 5, 6]
    expected = images[(severity - 1) * 4 : severity * 4].transpose(0, 3, 1, 2)
    assert torch.equal(x, torch.from_numpy(np.ascontiguousarray(expected)))
    if severity == 1:
        assert x[0, :, 1, 2].tolist() == [7, 8, 9]  # channels first


def test_cifar_c_validates_name_severity_dataset(cifar_c_root):
    root = cifar_c_root[0]
    assert CIFAR_C_CORRUPTIONS == CORRUPTIONS  # the released files cover the generated 15
    assert len(CIFAR_C_EXTRA_CORRUPTIONS) == 4
    with pytest.raises(ValueError, match="unknown corruption 'gausian_noise'.*'saturate'"):
        load_cifar_c("gausian_noise", 1, root=root)
    for severity in (0, 6, True, 2.5, "3"):
        with pytest.raises(ValueError, match=r"severity must be an int in \[1, 2, 3, 4, 5\]"):
            load_cifar_c("gaussian_noise", severity, root=root)
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_cifar_c("gaussian_noise", 1, root=root, dataset="cifar1000")


def test_cifar_c_refuses_pickled_npy(cifar_c_root):
    root = cifar_c_root[0]
    folder = root / "cifar-10-c" / "CIFAR-10-C"
    np.save(folder / "fog.npy", np.array([{"x": 1}] * 5, dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="not a plain numeric .npy"):
        load_cifar_c("fog", 1, root=root)


def test_cifar_c_missing_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_cifar_c("snow", 3, root=tmp_path, dataset="cifar100")
    message = str(err.value)
    assert "download=True" in message and "SNENS_DATA" in message
    assert "zenodo.org/records/3555552" in message and "CIFAR-100-C.tar" in message


def test_cifar100_c_downloads_and_extracts(monkeypatch, tmp_path, file_server):
    served, url, _ = file_server
    images, labels = _cifar_c_arrays(n=2)
    archive = _tarball(
        "CIFAR-100-C", {"saturate.npy": _npy(images), "labels.npy": _npy(labels)}, gz=False
    )
    (served / "CIFAR-100-C.tar").write_bytes(archive)
    monkeypatch.setattr(cifar_module, "CIFAR100_C_URL", url + "CIFAR-100-C.tar")
    monkeypatch.setattr(cifar_module, "CIFAR100_C_MD5", _md5(archive))
    root = tmp_path / "root"
    x, y = load_cifar_c("saturate", 5, root=root, dataset="cifar100", download=True)
    assert x[:, 0, 0, 0].tolist() == [50, 51] and y.tolist() == [3, 4]
    assert _listing(root / "cifar-100-c") == [
        "CIFAR-100-C",
        "CIFAR-100-C.tar",
        "CIFAR-100-C/labels.npy",
        "CIFAR-100-C/saturate.npy",
    ]


def test_cifar_c_empty_or_npz_npy_names_the_file_and_the_fix(cifar_c_root):
    root = cifar_c_root[0]
    fog = root / "cifar-10-c" / "CIFAR-10-C" / "fog.npy"
    fog.write_bytes(b"")  # an interrupted copy
    with pytest.raises(ValueError, match=r"fog\.npy is empty or cut short.*delete it"):
        load_cifar_c("fog", 1, root=root)
    with open(fog, "wb") as f:
        np.savez(f, fog=np.zeros((10, 32, 32, 3), np.uint8))  # an .npz under the .npy name
    with pytest.raises(ValueError, match=r"fog\.npy: not a \.npy array but a NpzFile.*delete it"):
        load_cifar_c("fog", 1, root=root)
    fog.write_bytes(b"\x93NUMPY\x01\x00garbage")  # a damaged header
    with pytest.raises(ValueError, match=r"fog\.npy: not a plain numeric \.npy file.*delete it"):
        load_cifar_c("fog", 1, root=root)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (np.full(20, np.nan), r"expected integer class labels, got dtype float64"),
        (np.full(20, -7), r"labels from -7 to -7, outside 0\.\.9"),
        (np.full(20, 10, np.uint8), r"labels from 10 to 10, outside 0\.\.9"),
    ],
)
def test_cifar_c_labels_must_be_integers_of_the_classes(cifar_c_root, labels, expected):
    root = cifar_c_root[0]
    np.save(root / "cifar-10-c" / "CIFAR-10-C" / "labels.npy", labels)
    with pytest.raises(ValueError, match=rf"labels\.npy: {expected}.*delete .*CIFAR-10-C"):
        load_cifar_c("gaussian_noise", 1, root=root)


def test_cifar100_c_accepts_labels_up_to_99(tmp_path):
    folder = tmp_path / "cifar-100-c" / "CIFAR-100-C"
    folder.mkdir(parents=True)
    np.save(folder / "fog.npy", np.zeros((5, 32, 32, 3), np.uint8))
    np.save(folder / "labels.npy", np.array([0, 99, 5, 6, 7]))
    assert load_cifar_c("fog", 2, root=tmp_path, dataset="cifar100")[1].tolist() == [99]
    np.save(folder / "labels.npy", np.array([0, 100, 5, 6, 7]))
    with pytest.raises(ValueError, match=r"outside 0\.\.99"):
        load_cifar_c("fog", 2, root=tmp_path, dataset="cifar100")


def test_an_unwritable_data_root_names_the_archive_and_the_fix(
    monkeypatch, tmp_path, patched_cifar10
):
    archive = tmp_path / "cifar-10" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(patched_cifar10[0])

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(archive.parent / ".tmpXYZ"))

    monkeypatch.setattr(cifar_module.tempfile, "mkdtemp", read_only)
    with pytest.raises(OSError) as err:
        load_cifar10("test", root=tmp_path)
    assert err.value.errno == errno.EROFS
    message = str(err.value)
    assert str(archive) in message and "Read-only file system" in message
    assert "writable" in message and "root=" in message and "SNENS_DATA" in message
    assert ".tmpXYZ" not in message
