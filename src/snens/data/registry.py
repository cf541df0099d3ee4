"""The data sets snens knows by name and their OOD test sets, in one table.

A data set is ``image`` (uint8 tensors in memory, augmented on the device), ``folder`` (class
folders streamed from disk) or ``text`` (labelled texts, tokenized once); an OOD set serves
the data sets of its kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cifar import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    load_cifar10,
    load_cifar100,
)
from .imagenet import ImageFolder, imagenet_folder
from .images import FASHION_MNIST_MEAN, FASHION_MNIST_STD, load_fashion_mnist, load_mnist_5k
from .sst2 import load_sst2
from .svhn import SVHN_MEAN, SVHN_STD, load_svhn
from .text import TextSplit, load_rotten_tomatoes, split_texts
from .tweets import load_tweets

__all__ = [
    "DATASETS",
    "DOMAIN_SETS",
    "KINDS",
    "OOD_SETS",
    "DataSet",
    "DomainSet",
    "OODSet",
    "dataset_names",
    "domain_names",
    "ood_names",
]

#: The kinds of data set, see the module docstring.
KINDS = ("image", "folder", "text")


@dataclass(frozen=True)
class DataSet:
    """A data set by name: its kind, classes and, for in-memory images, how it is stored.

    Attributes:
        kind: one of :data:`KINDS`.
        num_classes: None where the data decides (class folders).
        channels: channels of the stored images (``image`` only); ``mean``, ``std`` in [0, 1].
        load: ``image``: ``load(split, root, download) -> (images, labels)``; ``text``:
            ``load(root, download) ->`` :class:`~snens.data.TextSplit`; ``folder``:
            ``load(root, split, transform, **policy) ->`` :class:`~snens.data.ImageFolder`.
    """

    kind: str
    num_classes: int | None
    channels: int | None = None
    mean: float | tuple[float, ...] | None = None
    std: float | tuple[float, ...] | None = None
    load: Callable[..., Any] | None = None


@dataclass(frozen=True)
class OODSet:
    """An out-of-distribution test set for the data sets of one kind (``"image"`` or ``"text"``).

    ``load(root, download)`` gives uint8 images ``(N, C, H, W)`` and labels, or a list of texts.
    """

    kind: str
    load: Callable[..., Any]
    about: str


@dataclass(frozen=True)
class DomainSet:
    """A labelled test set of another domain with the classes of the data sets it ``serves``.

    ``load(root, download) -> (texts, labels)``.
    """

    serves: tuple[str, ...]
    load: Callable[..., Any]
    about: str


def _sentiment_tweets(root: Any, download: bool) -> tuple[list[str], list[int]]:
    """The tweets graded negative (0) or positive (1); neutral ones are left out."""
    tweets = load_tweets(root)
    keep = [(t, s) for t, s in zip(tweets.texts, tweets.sentiments, strict=True) if s != 1]
    return [t for t, _ in keep], [0 if s == 0 else 1 for _, s in keep]


def _sst2(root: Any, download: bool) -> TextSplit:
    """GLUE SST-2: train, and validation as the test set (GLUE's test labels are private)."""
    return TextSplit(*load_sst2("train", root, download), *load_sst2("validation", root, download))


def _rotten_tomatoes(root: Any, download: bool) -> TextSplit:
    """Rotten Tomatoes has no split of its own: a fixed stratified 80/20 one (seed 0)."""
    corpus = load_rotten_tomatoes(root)
    return split_texts(corpus.texts, corpus.labels, test_fraction=0.2, seed=0)


#: Why ``image_folder`` needs a root (the engine's config says it before anything runs).
IMAGE_FOLDER_NEEDS_ROOT = (
    "data.dataset 'image_folder' reads your class folders from data.root: set data.root to the "
    "folder holding train/ and val/, each with one sub-folder of images per class"
)


def _image_folder(root: Any, split: str, transform: Any = None, **policy: Any) -> ImageFolder:
    if root is None:
        raise ValueError(IMAGE_FOLDER_NEEDS_ROOT)
    folder = Path(root).expanduser() / split
    if not folder.is_dir():
        raise FileNotFoundError(
            f"data.dataset 'image_folder' needs {folder} (class sub-folders of images); "
            f"data.root {str(root)!r} holds train/ and val/"
        )
    return ImageFolder(folder, transform, **policy)


DATASETS: dict[str, DataSet] = {
    "fashion_mnist": DataSet(
        "image", 10, 1, FASHION_MNIST_MEAN, FASHION_MNIST_STD, load_fashion_mnist
    ),
    "cifar10": DataSet("image", 10, 3, CIFAR10_MEAN, CIFAR10_STD, load_cifar10),
    "cifar100": DataSet("image", 100, 3, CIFAR100_MEAN, CIFAR100_STD, load_cifar100),
    "svhn": DataSet("image", 10, 3, SVHN_MEAN, SVHN_STD, load_svhn),
    "imagenet": DataSet("folder", None, load=imagenet_folder),
    "image_folder": DataSet("folder", None, load=_image_folder),
    "sst2": DataSet("text", 2, load=_sst2),
    "rotten_tomatoes": DataSet("text", 2, load=_rotten_tomatoes),
}


def _test_split(name: str) -> Callable[..., Any]:
    def load(root: Any, download: bool) -> Any:
        return DATASETS[name].load("test", root, download)

    return load


OOD_SETS: dict[str, OODSet] = {
    "mnist_5k": OODSet("image", lambda root, download: load_mnist_5k(root), "MNIST, 5,000 digits"),
    **{
        name: OODSet("image", _test_split(name), f"the {name} test set")
        for name in ("fashion_mnist", "cifar10", "cifar100", "svhn")
    },
    "rt_plots": OODSet(
        "text",
        lambda root, download: load_rotten_tomatoes(root).ood_texts,
        "Rotten Tomatoes movie plot descriptions (near OOD for reviews)",
    ),
    "tweets": OODSet(
        "text",
        lambda root, download: load_tweets(root).texts,
        "tweets on airlines, brands and self-driving cars (far OOD for reviews)",
    ),
}


#: Labelled test sets of another domain, by name (``data.domains``); their metrics are
#: ``domain/<name>/<metric>``.
DOMAIN_SETS: dict[str, DomainSet] = {
    "tweets": DomainSet(
        ("rotten_tomatoes", "sst2"),
        _sentiment_tweets,
        "tweets on airlines, brands and self-driving cars graded negative or positive by the "
        "crowd (neutral ones left out): sentiment in another domain than reviews",
    )
}


def domain_names(dataset: str) -> tuple[str, ...]:
    """The labelled sets of another domain that serve ``dataset``, in table order."""
    return tuple(name for name, entry in DOMAIN_SETS.items() if dataset in entry.serves)


def dataset_names(kind: str) -> tuple[str, ...]:
    """The data sets of one of :data:`KINDS`, in table order."""
    return tuple(name for name, entry in DATASETS.items() if entry.kind == kind)


def ood_names(kind: str) -> tuple[str, ...]:
    """The OOD sets for data sets of ``kind`` (``"image"`` or ``"text"``), in table order."""
    return tuple(name for name, entry in OOD_SETS.items() if entry.kind == kind)
