"""SVHN, the Street View House Numbers (Netzer et al. 2011), cropped digits.

The official MATLAB files are read with SciPy, from ``<data root>/svhn/`` or the data root.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .download import check_split, data_root, download_url, not_found

__all__ = ["SVHN_MEAN", "SVHN_STD", "load_svhn"]

SVHN_URL = "http://ufldl.stanford.edu/housenumbers/"
SVHN_MD5 = {
    "train": "e26dedcc434d2e4c54c9b2d4a06d8373",  # 73 257 digits
    "test": "eb5a983be6a315427106f1b164d9cef3",  # 26 032 digits
    "extra": "a93ce644f1a588dc4d68dda5feec44a7",  # 531 131 easier digits
}
# Per-channel mean and std of the training images in [0, 1] (the values the literature uses).
SVHN_MEAN = (0.4377, 0.4438, 0.4728)
SVHN_STD = (0.1980, 0.2010, 0.1970)


def _loadmat(path):
    try:
        from scipy.io import loadmat
    except ImportError as err:
        raise ImportError(
            f"reading SVHN's .mat files needs SciPy: pip install scipy (file: {path})"
        ) from err
    try:
        return loadmat(path)
    except MemoryError:
        raise
    except Exception as err:  # MatReadError, OSError, ValueError, NotImplementedError (v7.3), …
        raise ValueError(
            f"{path} cannot be read as a MATLAB file ({type(err).__name__}: {err}); it is damaged "
            "(empty or cut short) or not the official MATLAB v5 file (an HTML page, a v7.3 "
            "file). Delete it and call again with download=True (with snens train: --set "
            "data.download=true) to fetch a fresh copy"
        ) from err


def load_svhn(
    split: str = "train", root: str | os.PathLike | None = None, download: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load SVHN digits (``"train"``, ``"test"`` or ``"extra"``), the digit 0 labelled 0.

    With ``download`` the file is fetched (or an existing one re-checked), MD5-checked.

    Returns:
        ``(images, labels)``: ``(N, 3, 32, 32)`` uint8 RGB, ``(N,)`` int64 in [0, 9].

    Raises:
        ValueError: unknown ``split``; a file without SVHN's ``X``/``y`` arrays; a damaged file
            or one that is not MATLAB v5.
        FileNotFoundError: no local copy and ``download=False``; the message says how to get it.
        ChecksumError: the downloaded file differs from the official one.
        ImportError: SciPy is not installed.
    """
    check_split(split, SVHN_MD5)
    filename = f"{split}_32x32.mat"
    base = data_root(root)
    candidates = (base / "svhn" / filename, base / filename)
    path = next((c for c in candidates if c.is_file()), None)
    if download and path != candidates[1]:
        # download_url re-checks a copy already at candidates[0] and fetches only if it fails.
        path = download_url(SVHN_URL + filename, candidates[0], md5=SVHN_MD5[split])
    if path is None:
        looked = f"looked at {candidates[0]} and {candidates[1]}"
        raise not_found(f"SVHN {split}", looked, SVHN_URL + filename, candidates[0])
    contents = _loadmat(path)
    if "X" not in contents or "y" not in contents:
        raise ValueError(f"{path}: expected arrays X and y, found {sorted(contents)}")
    x, y = np.asarray(contents["X"]), np.asarray(contents["y"]).reshape(-1)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.dtype != np.uint8:
        raise ValueError(f"{path}: expected X uint8 (32, 32, 3, N), got {x.dtype} {x.shape}")
    if y.shape != (x.shape[3],):
        raise ValueError(f"{path}: {x.shape[3]} images but {y.shape[0]} labels")
    labels = y.astype(np.int64)
    if labels.size and (labels.min() < 1 or labels.max() > 10):
        raise ValueError(f"{path}: labels outside SVHN's 1..10 (10 is the digit 0)")
    labels[labels == 10] = 0
    images = np.ascontiguousarray(x.transpose(3, 2, 0, 1))  # (H, W, C, N) -> (N, C, H, W)
    return torch.from_numpy(images), torch.from_numpy(labels)
