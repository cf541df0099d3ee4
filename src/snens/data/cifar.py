"""CIFAR-10/100 (Krizhevsky 2009) and CIFAR-10-C/100-C (Hendrycks & Dietterich 2019).

Under the data root: ``cifar-10/cifar-10-python.tar.gz`` and its ``cifar-10-batches-py/``
(torchvision's layout, directly under the root, is read too), ``cifar-100/…``,
``cifar-10-c/CIFAR-10-C.tar`` and ``cifar-10-c/CIFAR-10-C/<corruption>.npy``, ``cifar-100-c/…``.

The batches are pickles, so each one's MD5 is checked **before** it is unpickled. Archives
are MD5-checked, may hold only plain files and folders inside their one top folder, and are
refused above :data:`MAX_ARCHIVE_MEMBERS` members or :data:`MAX_ARCHIVE_BYTES` (env
``SNENS_MAX_ARCHIVE_MEMBERS``, ``SNENS_MAX_ARCHIVE_BYTES``) or the free space; they extract
into a temporary folder renamed into place. CIFAR-C arrays load with ``allow_pickle=False``.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import pickle
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from .corruptions import CORRUPTIONS, SEVERITIES
from .download import (
    ChecksumError,
    check_split,
    data_root,
    download_url,
    not_found,
    verify_checksum,
)

__all__ = [
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR_C_CORRUPTIONS",
    "CIFAR_C_EXTRA_CORRUPTIONS",
    "load_cifar10",
    "load_cifar100",
    "load_cifar_c",
]

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_FILE_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"
CIFAR100_FILE_MD5 = {
    "train": "16019d7e3df5f24257cddd939b257f8d",
    "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
}
CIFAR10_C_URL = "https://zenodo.org/records/2535967/files/CIFAR-10-C.tar"
CIFAR10_C_MD5 = "56bf5dcef84df0e2308c6dcbcbbd8499"
CIFAR100_C_URL = "https://zenodo.org/records/3555552/files/CIFAR-100-C.tar"
CIFAR100_C_MD5 = "11f0ed0f1191edbf9fa23466ae6021d3"

CIFAR10_CLASSES = tuple("airplane automobile bird cat deer dog frog horse ship truck".split())
# Per-channel mean and std of the training images in [0, 1] (the values the literature uses).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)

# The 15 corruptions of the benchmark, in the order of Hendrycks & Dietterich (2019), Fig. 1.
CIFAR_C_CORRUPTIONS = CORRUPTIONS
# Released alongside, held out of the benchmark average ("validation" corruptions).
CIFAR_C_EXTRA_CORRUPTIONS = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
_FILTER_ERROR = getattr(tarfile, "FilterError", ())  # () catches nothing before Python 3.10.12
# What one archive may unpack to, checked from its member headers before anything is written.
MAX_ARCHIVE_MEMBERS = 2_000_000
MAX_ARCHIVE_BYTES = 256 * 2**30
ARCHIVE_MEMBERS_ENV = "SNENS_MAX_ARCHIVE_MEMBERS"
ARCHIVE_BYTES_ENV = "SNENS_MAX_ARCHIVE_BYTES"
_IMAGE_BYTES = 3 * 32 * 32


def _source(dataset: str) -> tuple[str, str, str, str, str]:
    """``(title, url, md5, folder under the data root, the archive's one top folder)``."""
    # looked up at call time so that tests (and mirrors) can replace the module constants
    return {
        "cifar10": ("CIFAR-10", CIFAR10_URL, CIFAR10_MD5, "cifar-10", "cifar-10-batches-py"),
        "cifar100": ("CIFAR-100", CIFAR100_URL, CIFAR100_MD5, "cifar-100", "cifar-100-python"),
        "cifar10-c": ("CIFAR-10-C", CIFAR10_C_URL, CIFAR10_C_MD5, "cifar-10-c", "CIFAR-10-C"),
        "cifar100-c": ("CIFAR-100-C", CIFAR100_C_URL, CIFAR100_C_MD5, "cifar-100-c", "CIFAR-100-C"),
    }[dataset]


def _limit(env: str, default: int) -> int:
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{env} must be a positive integer, got {raw!r}; unset it for {default}")
    return value


def _check_members(tar: tarfile.TarFile, archive: Path, top: str) -> list[tarfile.TarInfo]:
    """The archive's members, refusing paths outside ``top/`` and archives over the limits."""
    max_members = _limit(ARCHIVE_MEMBERS_ENV, MAX_ARCHIVE_MEMBERS)
    max_bytes = _limit(ARCHIVE_BYTES_ENV, MAX_ARCHIVE_BYTES)
    members, total = [], 0
    for member in tar:
        if len(members) == max_members:
            raise ValueError(
                f"refusing to extract {archive}: it holds more than {max_members} members, the "
                f"limit ({ARCHIVE_MEMBERS_ENV}). The official archive holds far fewer; delete "
                f"this one, or if you trust it, set {ARCHIVE_MEMBERS_ENV} to a larger count."
            )
        parts = PurePosixPath(member.name).parts
        if member.name.startswith(("/", "\\")) or ".." in parts or not parts or parts[0] != top:
            raise ValueError(
                f"refusing to extract {archive}: member {member.name!r} lies outside the "
                f"expected top folder {top!r}. The archive is not the official one; delete it."
            )
        if not (member.isfile() or member.isdir()):
            raise ValueError(
                f"refusing to extract {archive}: member {member.name!r} is a link or special "
                "file, which the official archive does not contain; delete it."
            )
        total += member.size
        if total > max_bytes:
            raise ValueError(
                f"refusing to extract {archive}: its members hold more than {max_bytes} bytes "
                f"({max_bytes / 2**30:.3g} GiB) uncompressed, the limit ({ARCHIVE_BYTES_ENV}). "
                "The official archive holds far less; delete this one, or if you trust it, set "
                f"{ARCHIVE_BYTES_ENV} to a larger number of bytes."
            )
        members.append(member)
    return members


def _check_space(archive: Path, members: list[tarfile.TarInfo]) -> None:
    needed = sum(member.size for member in members)
    free = shutil.disk_usage(archive.parent).free
    if needed > free:
        raise OSError(
            errno.ENOSPC,
            f"extracting {archive} needs {needed / 2**30:.3g} GiB but {archive.parent} has "
            f"{free / 2**30:.3g} GiB free; free some space, or move the data root (SNENS_DATA "
            "or root=) to a larger disk",
        )


def _extract_members(
    tar: tarfile.TarFile, staging: Path, members: list[tarfile.TarInfo], archive: Path
) -> None:
    # Python < 3.10.12 has no filters; _check_members already vetted every path
    filters = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    try:
        tar.extractall(staging, members=members, **filters)
    except gzip.BadGzipFile:
        raise  # an OSError too, but a damaged archive: _extract says so
    except OSError as err:  # the disk filled up, or failed, while writing
        raise type(err)(
            err.errno,
            f"extracting {archive} into {archive.parent} failed ({err.strerror or err}); "
            "nothing was kept. Fix the disk (free space, permissions), then call again",
        ) from err


def _extract(archive: Path, top: str) -> Path:
    """Extract ``archive`` (single top folder ``top``) next to it via a temporary folder."""
    target = archive.parent / top
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{top}-", dir=archive.parent))
    except OSError as err:  # a read-only or full data root, or one without write permission
        raise type(err)(
            err.errno,
            f"cannot extract {archive}: no folder can be made in {archive.parent} "
            f"({err.strerror or err}). Make the data root writable, or point root= (or "
            "SNENS_DATA) to a writable folder and copy or download the archive there",
        ) from err
    try:
        with tarfile.open(archive) as tar:
            members = _check_members(tar, archive, top)
            _check_space(archive, members)
            _extract_members(tar, staging, members, archive)
        extracted = staging / top
        if not extracted.is_dir():
            raise ValueError(f"{archive} holds no {top}/ folder; it is not the official archive")
        if not target.exists():
            os.replace(extracted, target)
    except _FILTER_ERROR as err:
        raise ValueError(f"refusing to extract {archive}: {err}; delete it") from err
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise ValueError(
            f"{archive} is damaged or not a tar archive ({type(err).__name__}: {err}); delete "
            "it and download it again"
        ) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _locate(dataset: str, root, download: bool, required: tuple[str, ...]) -> Path:
    """The folder holding the files ``required``: found, extracted, or downloaded and extracted."""
    title, url, md5, subdir, top = _source(dataset)
    base = data_root(root)
    candidates = (base / subdir / top, base / top)
    for folder in candidates:
        if all((folder / name).is_file() for name in required):
            return folder
    archive = base / subdir / url.rsplit("/", 1)[-1]
    if download:
        download_url(url, archive, md5=md5)
    elif archive.is_file():
        verify_checksum(archive, md5=md5)
    else:
        looked = f"looked for {list(required)} in {' and '.join(map(str, candidates))}"
        raise not_found(title, f"{looked}, and for the archive {archive}", url, archive)
    folder = _extract(archive, top)
    missing = [name for name in required if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{folder} lacks {missing} after extracting {archive}; delete {folder} and call "
            "again to extract a fresh copy."
        )
    return folder


def _unpickle_verified(path: Path, md5: str) -> dict:
    raw = path.read_bytes()  # hash and unpickle the same bytes: no swap between check and load
    got = hashlib.md5(raw).hexdigest()
    if got != md5:
        raise ChecksumError(
            f"md5 mismatch for {path}: expected {md5}, got {got}. Refusing to unpickle it (a "
            f"pickle can run code). Delete {path.parent} and call again (with download=True if "
            "the archive is gone) to extract a fresh copy."
        )
    batch = pickle.loads(raw, encoding="bytes")
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a dict batch, got {type(batch).__name__}")
    return batch


def _read_batches(
    folder: Path, names: tuple[str, ...], md5s: dict[str, str], label_key: bytes
) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = [], []
    for name in names:
        path = folder / name
        batch = _unpickle_verified(path, md5s[name])
        missing = [k for k in (b"data", label_key) if k not in batch]
        if missing:
            raise ValueError(f"{path}: batch lacks keys {missing}, has {sorted(batch)}")
        data = np.asarray(batch[b"data"])
        label = np.asarray(batch[label_key], dtype=np.int64)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _IMAGE_BYTES:
            raise ValueError(
                f"{path}: expected uint8 data (N, {_IMAGE_BYTES}), got {data.dtype} {data.shape}"
            )
        if label.shape != (data.shape[0],):
            raise ValueError(f"{path}: {data.shape[0]} images but labels of shape {label.shape}")
        images.append(data.reshape(-1, 3, 32, 32))  # rows of R, G, B planes, each 32×32
        labels.append(label)
    return torch.from_numpy(np.concatenate(images)), torch.from_numpy(np.concatenate(labels))


def load_cifar10(
    split: str = "train", root: str | os.PathLike | None = None, download: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load CIFAR-10: 50 000 train / 10 000 test 32×32 colour images, 10 classes.

    Returns:
        ``(images, labels)``: ``(N, 3, 32, 32)`` uint8 RGB, ``(N,)`` int64 in [0, 9].

    Raises:
        ValueError: unknown ``split``; an archive with members outside its top folder.
        FileNotFoundError: no local copy and ``download=False``; the message says how to get it.
        ChecksumError: the archive or a batch file differs from the official one.
    """
    splits = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
    check_split(split, splits)
    folder = _locate("cifar10", root, download, splits[split])
    return _read_batches(folder, splits[split], CIFAR10_FILE_MD5, b"labels")


def load_cifar100(
    split: str = "train",
    root: str | os.PathLike | None = None,
    download: bool = False,
    *,
    coarse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load CIFAR-100: 50 000 train / 10 000 test images, 100 fine (``coarse``: 20) classes.

    Returns:
        ``(images, labels)``: ``(N, 3, 32, 32)`` uint8 RGB, ``(N,)`` int64.

    Raises:
        ValueError: unknown ``split``; an archive with members outside its top folder.
        FileNotFoundError: no local copy and ``download=False``; the message says how to get it.
        ChecksumError: the archive or a batch file differs from the official one.
    """
    splits = {"train": ("train",), "test": ("test",)}
    check_split(split, splits)
    folder = _locate("cifar100", root, download, splits[split])
    label_key = b"coarse_labels" if coarse else b"fine_labels"
    return _read_batches(folder, splits[split], CIFAR100_FILE_MD5, label_key)


def load_cifar_c(
    name: str,
    severity: int,
    root: str | os.PathLike | None = None,
    dataset: str = "cifar10",
    download: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one corruption at one severity (1–5) of the released CIFAR-10-C or CIFAR-100-C.

    ``name`` is one of :data:`CIFAR_C_CORRUPTIONS` or :data:`CIFAR_C_EXTRA_CORRUPTIONS`;
    ``dataset`` ``"cifar10"`` or ``"cifar100"``. The ``.npy`` is memory-mapped, so only the
    severity's rows are read.

    Returns:
        ``(images, labels)``: ``(n, 3, 32, 32)`` uint8 RGB, ``(n,)`` int64.

    Raises:
        ValueError: unknown ``name``, ``dataset`` or ``severity``; arrays of the wrong shape or
            dtype, ``.npy`` files that are empty, damaged, ``.npz`` archives or hold Python
            objects; labels that are not integers in [0, classes).
        FileNotFoundError: no local copy and ``download=False``; the message says how to get it.
        ChecksumError: the archive differs from the official one.
    """
    datasets = {"cifar10": "cifar10-c", "cifar100": "cifar100-c"}
    if dataset not in datasets:
        raise ValueError(f"dataset must be one of {sorted(datasets)}, got {dataset!r}")
    names = CIFAR_C_CORRUPTIONS + CIFAR_C_EXTRA_CORRUPTIONS
    if name not in names:
        raise ValueError(f"unknown corruption {name!r}; choose from {list(names)}")
    is_int = isinstance(severity, (int, np.integer)) and not isinstance(severity, bool)
    if not is_int or severity not in SEVERITIES:
        raise ValueError(f"severity must be an int in {list(SEVERITIES)}, got {severity!r}")
    folder = _locate(datasets[dataset], root, download, (f"{name}.npy", "labels.npy"))
    images = _load_npy(folder / f"{name}.npy")
    labels = _load_npy(folder / "labels.npy")
    classes = {"cifar10": 10, "cifar100": 100}[dataset]
    if images.ndim != 4 or images.shape[1:] != (32, 32, 3) or images.dtype != np.uint8:
        raise ValueError(
            f"{folder / name}.npy: expected uint8 (5·n, 32, 32, 3), got {images.dtype} "
            f"{images.shape}"
        )
    if images.shape[0] % len(SEVERITIES) or labels.shape != (images.shape[0],):
        raise ValueError(
            f"{folder}: {name}.npy has {images.shape[0]} images and labels.npy shape "
            f"{labels.shape}; expected 5·n images (one block per severity) and as many labels"
        )
    n = images.shape[0] // len(SEVERITIES)
    rows = slice((severity - 1) * n, severity * n)
    chosen = np.ascontiguousarray(images[rows].transpose(0, 3, 1, 2))  # NHWC -> NCHW
    return torch.from_numpy(chosen), torch.from_numpy(_check_labels(labels, classes, folder)[rows])


def _check_labels(labels: np.ndarray, classes: int, folder: Path) -> np.ndarray:
    """``labels`` as int64, refusing a non-integer dtype or a label outside [0, classes)."""
    path = folder / "labels.npy"
    fix = f"delete {folder} and call again (with download=True if the archive is gone)"
    if labels.dtype.kind not in "iu":
        raise ValueError(
            f"{path}: expected integer class labels, got dtype {labels.dtype}; the file is "
            f"damaged or not the official one ({fix})"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(
            f"{path}: labels from {labels.min()} to {labels.max()}, outside 0..{classes - 1}; "
            f"the file is damaged or not the official one ({fix})"
        )
    return labels.astype(np.int64)


def _load_npy(path: Path) -> np.ndarray:
    fix = f"delete it (or {path.parent}) and call again (with download=True if the archive is gone)"
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except EOFError as err:  # an empty file: an interrupted copy
        raise ValueError(f"{path} is empty or cut short ({err}); {fix}") from err
    except (ValueError, OSError) as err:
        raise ValueError(
            f"{path}: not a plain numeric .npy file ({err}); it is damaged or not the official "
            f"one: {fix}"
        ) from err
    if not isinstance(array, np.ndarray):  # an .npz archive saved under the .npy name
        close = getattr(array, "close", None)
        if close is not None:
            close()
        raise ValueError(
            f"{path}: not a .npy array but a {type(array).__name__} (an .npz archive?); {fix}"
        )
    return array
