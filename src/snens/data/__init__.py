"""Data: the paper's data sets, packaged stand-ins, checksummed downloads, a batch loader.

The paper's data sets are downloaded on request from their official sources, checksummed
(ImageNet is read from a class-folder tree); stand-ins that ship in packages serve machines
without network access. :class:`TensorLoader`, :class:`TokenLoader` and :class:`FolderLoader`
all draw epoch e from (seed, e) and shard a global batch across data-parallel ranks.
"""

from .cifar import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    CIFAR_C_CORRUPTIONS,
    CIFAR_C_EXTRA_CORRUPTIONS,
    load_cifar10,
    load_cifar100,
    load_cifar_c,
)
from .corruptions import CORRUPTIONS, SEVERITIES, corrupt, corrupted
from .download import (
    ChecksumError,
    DownloadError,
    data_root,
    download_url,
    file_digest,
    package_data_file,
    verify_checksum,
)
from .imagenet import (
    BAD_IMAGE_POLICIES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    BadImageError,
    EvalTransform,
    ImageFolder,
    ImageFolderWarning,
    TrainTransform,
    imagenet_folder,
    read_image,
)
from .images import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    grey_to_rgb,
    load_fashion_mnist,
    load_mnist_5k,
    read_idx,
    resize_images,
    write_idx,
)
from .loader import TensorLoader
from .sst2 import SST2_CLASSES, load_sst2
from .streaming import FolderLoader, default_num_workers
from .svhn import SVHN_MEAN, SVHN_STD, load_svhn
from .text import RottenTomatoes, TextSplit, load_rotten_tomatoes, split_texts
from .tokens import TokenLoader, tokenize
from .tweets import Tweets, load_tweets

__all__ = [
    "BAD_IMAGE_POLICIES",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR_C_CORRUPTIONS",
    "CIFAR_C_EXTRA_CORRUPTIONS",
    "CORRUPTIONS",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SST2_CLASSES",
    "SVHN_MEAN",
    "SVHN_STD",
    "BadImageError",
    "ChecksumError",
    "DownloadError",
    "EvalTransform",
    "FolderLoader",
    "ImageFolder",
    "ImageFolderWarning",
    "RottenTomatoes",
    "SEVERITIES",
    "TensorLoader",
    "TextSplit",
    "TokenLoader",
    "TrainTransform",
    "Tweets",
    "corrupt",
    "corrupted",
    "data_root",
    "default_num_workers",
    "download_url",
    "file_digest",
    "grey_to_rgb",
    "imagenet_folder",
    "load_cifar10",
    "load_cifar100",
    "load_cifar_c",
    "load_fashion_mnist",
    "load_mnist_5k",
    "load_rotten_tomatoes",
    "load_sst2",
    "load_svhn",
    "load_tweets",
    "package_data_file",
    "read_idx",
    "read_image",
    "resize_images",
    "split_texts",
    "tokenize",
    "verify_checksum",
    "write_idx",
]
