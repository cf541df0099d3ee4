"""Data: packaged data sets, checksummed downloads, and a device-resident batch loader.

Stand-ins that ship in packages (see DESIGN.md §5): Fashion-MNIST for CIFAR-10, MNIST-5k as
image OOD, Rotten Tomatoes snippets for SST-2 with plot descriptions as text OOD.
"""

from .download import (
    ChecksumError,
    DownloadError,
    data_root,
    download_url,
    file_digest,
    package_data_file,
    verify_checksum,
)
from .images import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    load_fashion_mnist,
    load_mnist_5k,
    read_idx,
    write_idx,
)
from .loader import TensorLoader
from .text import RottenTomatoes, TextSplit, load_rotten_tomatoes, split_texts

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "ChecksumError",
    "DownloadError",
    "RottenTomatoes",
    "TensorLoader",
    "TextSplit",
    "data_root",
    "download_url",
    "file_digest",
    "load_fashion_mnist",
    "load_mnist_5k",
    "load_rotten_tomatoes",
    "package_data_file",
    "read_idx",
    "split_texts",
    "verify_checksum",
    "write_idx",
]
