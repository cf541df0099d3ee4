"""Archive extraction under limits: member count, uncompressed bytes, free space, a full disk.

The archive is a miniature CIFAR-10 tarball (one pickled test batch of 10 images) placed as
``<root>/cifar-10/cifar-10-python.tar.gz``, with the module's MD5s patched to the fixture's so
that extraction is reached. Each refusal must name the archive, the limit and how to raise it,
and leave nothing behind but the archive.
"""

from __future__ import annotations

import errno
import hashlib
import io
import pickle
import shutil
import tarfile

import numpy as np
import pytest

from snens.data import cifar as cifar_module
from snens.data import load_cifar10

TOP = "cifar-10-batches-py"


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        folder = tarfile.TarInfo(TOP)
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, data in files.items():
            member = tarfile.TarInfo(f"{TOP}/{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def archive(tmp_path, monkeypatch):
    """A valid miniature CIFAR-10 archive under ``tmp_path / "root"``, MD5s patched to it."""
    rng = np.random.default_rng(0)
    batch = {
        b"data": rng.integers(0, 256, (10, 3 * 32 * 32), dtype=np.uint8),
        b"labels": rng.integers(0, 10, 10).tolist(),
    }
    files = {"test_batch": pickle.dumps(batch, protocol=2)}
    files.update({f"extra_{i}": b"x" * 100 for i in range(5)})  # 7 members, about 31 kB
    data = _tarball(files)
    path = tmp_path / "root" / "cifar-10" / "cifar-10-python.tar.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    monkeypatch.setattr(cifar_module, "CIFAR10_MD5", _md5(data))
    monkeypatch.setattr(cifar_module, "CIFAR10_FILE_MD5", {"test_batch": _md5(files["test_batch"])})
    for env in (cifar_module.ARCHIVE_MEMBERS_ENV, cifar_module.ARCHIVE_BYTES_ENV):
        monkeypatch.delenv(env, raising=False)
    return path


def _leftovers(archive) -> list[str]:
    return sorted(p.name for p in archive.parent.iterdir())


def test_defaults_pass_the_official_archives():
    # CIFAR-10-C, the largest archive extracted here: 21 members, 2.9 GB. ImageNet's train set
    # (1 281 167 files, 147 GB) should pass too, should an archive of it ever be extracted.
    assert cifar_module.MAX_ARCHIVE_MEMBERS >= 1_281_167 + 1000
    assert cifar_module.MAX_ARCHIVE_BYTES >= 147e9


def test_archive_within_the_limits_extracts(archive, monkeypatch):
    monkeypatch.setenv(cifar_module.ARCHIVE_MEMBERS_ENV, "7")  # exactly the member count
    images, labels = load_cifar10("test", root=archive.parents[1])
    assert images.shape == (10, 3, 32, 32) and labels.shape == (10,)


def test_too_many_members_is_refused_before_extracting(archive, monkeypatch):
    monkeypatch.setenv(cifar_module.ARCHIVE_MEMBERS_ENV, "6")
    with pytest.raises(ValueError) as err:
        load_cifar10("test", root=archive.parents[1])
    message = str(err.value)
    assert f"refusing to extract {archive}: it holds more than 6 members" in message
    assert "set SNENS_MAX_ARCHIVE_MEMBERS to a larger count" in message
    assert _leftovers(archive) == [archive.name]  # no folder, no staging


def test_too_many_bytes_is_refused_before_extracting(archive, monkeypatch):
    monkeypatch.setattr(cifar_module, "MAX_ARCHIVE_BYTES", 1000)
    with pytest.raises(ValueError) as err:
        load_cifar10("test", root=archive.parents[1])
    message = str(err.value)
    assert f"refusing to extract {archive}: its members hold more than 1000 bytes" in message
    assert "set SNENS_MAX_ARCHIVE_BYTES to a larger number of bytes" in message
    assert _leftovers(archive) == [archive.name]
    monkeypatch.setenv(cifar_module.ARCHIVE_BYTES_ENV, "1_000_000")  # the way to raise it
    load_cifar10("test", root=archive.parents[1])


@pytest.mark.parametrize("value", ["0", "-5", "lots", "1e9"])
def test_a_bad_limit_in_the_environment_is_named(archive, monkeypatch, value):
    monkeypatch.setenv(cifar_module.ARCHIVE_BYTES_ENV, value)
    with pytest.raises(
        ValueError, match=f"SNENS_MAX_ARCHIVE_BYTES must be a positive integer, got '{value}'"
    ):
        load_cifar10("test", root=archive.parents[1])


def test_not_enough_free_space_is_refused_before_extracting(archive, monkeypatch):
    real = shutil.disk_usage

    def tiny_disk(path):
        return real(path)._replace(free=1000)

    monkeypatch.setattr(shutil, "disk_usage", tiny_disk)
    with pytest.raises(OSError) as err:
        load_cifar10("test", root=archive.parents[1])
    assert err.value.errno == errno.ENOSPC
    message = str(err.value)
    assert f"extracting {archive} needs" in message and "free some space" in message
    assert _leftovers(archive) == [archive.name]


def test_disk_full_while_extracting_leaves_nothing(archive, monkeypatch):
    def full(self, member, target):
        raise OSError(errno.ENOSPC, "No space left on device", target)

    monkeypatch.setattr(tarfile.TarFile, "makefile", full)  # writes one member's bytes
    with pytest.raises(OSError) as err:
        load_cifar10("test", root=archive.parents[1])
    assert err.value.errno == errno.ENOSPC
    assert f"extracting {archive} into {archive.parent} failed (No space left" in str(err.value)
    assert _leftovers(archive) == [archive.name]


def test_damaged_archive_says_to_download_again(archive, monkeypatch):
    damaged = archive.read_bytes()[: len(archive.read_bytes()) // 2]
    archive.write_bytes(damaged)
    monkeypatch.setattr(cifar_module, "CIFAR10_MD5", _md5(damaged))
    with pytest.raises(ValueError, match=r"is damaged or not a tar archive .*download it again"):
        load_cifar10("test", root=archive.parents[1])
    assert _leftovers(archive) == [archive.name]
