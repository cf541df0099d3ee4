"""The data sets the training engine reads: :func:`build_data` turns a
:class:`~snens.engine.config.DataConfig` into a :class:`Data` of loaders.

Every loader draws epoch e from (seed, e) and can be sharded across data-parallel ranks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from snens import data
from snens.data import registry
from snens.engine.config import (
    FOLDER_DATASETS,
    IMAGE_OOD_SETS,
    TEXT_DATASETS,
    TEXT_OOD_SETS,
    DataConfig,
)

__all__ = ["Data", "build_data", "data_shape"]


def _convert(images: Tensor, config: DataConfig) -> Tensor:
    """Stored uint8 images (N, C, H, W) as the model sees them, still uint8: resized to
    ``data.resize``, then grey repeated to RGB where ``data.channels`` is 3."""
    if config.resize:
        images = data.resize_images(images, config.resize)
    if config.channels == 3 and images.shape[1] == 1:
        images = data.grey_to_rgb(images)
    return images


class _CorruptedLoader:
    """Batches of one corrupted copy of the test images, generated when iterated (one copy
    held at a time); corrupted before ``loader`` converts them, so the same whatever size the
    model sees."""

    def __init__(self, images, labels, name, severity, seed, loader) -> None:
        self.corruption = (images, labels, name, severity)
        self.seed, self.loader = seed, loader

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        _, _, x, y = next(data.corrupted(*self.corruption, seed=self.seed))
        yield from self.loader(x, y)


Loader = data.TensorLoader | data.TokenLoader | data.FolderLoader


@dataclass
class Data:
    """Everything :func:`train` reads: loaders and the data set's shape (``channels`` None
    for text)."""

    train: Loader
    test: Loader
    ood: dict[str, Loader]
    corruptions: dict[tuple[str, int], Iterable[tuple[Tensor, Tensor]]]
    num_classes: int
    channels: int | None
    validation: Loader | None = None  # held out of the training set (data.validation_examples)
    domains: dict[str, Loader] = field(default_factory=dict)  # data.domains: labelled shift sets

    def bad_images(self) -> dict[str, str] | None:
        """Class-folder images found undecodable so far, path to reason; None for data that
        are not class folders."""
        loaders = [self.train, self.test, self.validation, *self.ood.values()]
        folders = [f for f in map(_image_folder, loaders) if f is not None]
        if not folders:
            return None
        return {str(path): why for folder in folders for path, why in folder.bad_images.items()}


def _image_folder(loader: Any) -> data.ImageFolder | None:
    dataset = getattr(loader, "dataset", None)
    while isinstance(dataset, torch.utils.data.Subset):
        dataset = dataset.dataset
    return dataset if isinstance(dataset, data.ImageFolder) else None


def _check_count(n: int, total: int, key: str | None, what: str) -> None:
    if key is not None and n > total:  # an error, never silently all of it
        raise ValueError(
            f"{key} {n:,} is more than the {total:,} examples of {what}; ask for at most "
            f"{total:,}, or 0 for all of them"
        )


def _check_batch(examples: int, config: DataConfig) -> None:
    if examples < config.batch_size:  # the last partial batch is dropped: nothing would train
        raise ValueError(
            f"data.batch_size {config.batch_size:,} is more than the {examples:,} training "
            f"examples, so no full batch is left to train on; lower data.batch_size (at most "
            f"{examples:,}) or train on more examples"
        )


def _head(
    x: Tensor, y: Tensor, n: int, key: str | None = None, what: str = ""
) -> tuple[Tensor, Tensor]:
    """The first n examples (all if n is 0); with ``key``, more than there are is refused."""
    _check_count(n, len(x), key, what)
    return (x[:n], y[:n]) if n else (x, y)


def _subset(total: int, n: int, key: str | None = None, what: str = "") -> list[int]:
    """A fixed random subset of n of ``range(total)`` (all if n is 0), in increasing order, the
    same for every run seed (stored texts and folders are ordered: their first n is no sample);
    with ``key``, more than ``total`` is refused."""
    _check_count(n, total, key, what)
    if not n or n >= total:
        return list(range(total))
    keep = torch.randperm(total, generator=torch.Generator().manual_seed(0))[:n]
    return sorted(keep.tolist())


def text_split(config: DataConfig, total: int) -> tuple[list[int], list[int]]:
    """Which of a text set's ``total`` training texts ``config`` holds out for validation and
    which it trains on: two disjoint, increasing lists of indices (independent of the seed)."""
    held: list[int] = []
    if config.validation_examples:
        n = config.validation_examples
        if n >= total:
            raise ValueError(
                f"data.validation_examples {n:,} leaves no training texts of the {total:,} "
                f"in {config.dataset}'s training set; hold out fewer (e.g. {total // 10:,})"
            )
        held = _subset(total, n)
    rest = sorted(set(range(total)) - set(held))
    what = f"{config.dataset}'s training texts{' left after data.validation_examples' * bool(held)}"
    keep = _subset(len(rest), config.train_examples, "data.train_examples", what)
    return held, [rest[i] for i in keep]


def build_data(
    config: DataConfig,
    *,
    seed: int,
    device: torch.device | str = "cpu",
    encoder: str | os.PathLike | None = None,
    member_orders: int = 1,
) -> Data:
    """Load the data set named by ``config`` and wrap it in loaders: in-memory image sets on
    ``device`` (a :class:`~snens.data.TensorLoader`), text sets tokenized once with
    ``encoder``'s tokenizer (a :class:`~snens.data.TokenLoader`), class folders read by
    DataLoader workers (a :class:`~snens.data.FolderLoader`). ``seed`` seeds the training order
    and augmentation; ``member_orders`` M > 1 gives each member a batch of its own per step.

    Raises:
        ValueError: an OOD set or option that does not fit the data set, or a count, batch
            size or ``max_length`` it cannot hold.
        FileNotFoundError: the data is not on disk and ``download`` is off or impossible.
    """
    if config.dataset in TEXT_DATASETS:
        return _text_data(config, seed, device, encoder, member_orders)
    if config.dataset in FOLDER_DATASETS:
        if member_orders > 1:
            raise ValueError(
                f"method.input_policy 'own' (a training order per member) is implemented for "
                f"in-memory image sets and text sets, not class folders ({config.dataset}); "
                'use method.input_policy="repeat"'
            )
        return _folder_data(config, seed, device)
    spec = registry.DATASETS[config.dataset]
    channels = config.channels_after(spec.channels)
    root = config.root or None
    # the mean and std data.normalize names (a grey set's one value is broadcast); a seed for
    # every loader: building the data leaves torch's global generator untouched
    imagenet = config.normalize == "imagenet"
    mean, std = (data.IMAGENET_MEAN, data.IMAGENET_STD) if imagenet else (spec.mean, spec.std)
    norm = {"mean": mean, "std": std, "device": device, "seed": seed}

    def evaluation(x: Tensor, y: Tensor) -> data.TensorLoader:
        return data.TensorLoader(_convert(x, config), y, config.eval_batch_size, **norm)

    x, y = spec.load("train", root, config.download)
    validation = None
    if config.validation_examples:
        n = config.validation_examples
        if n >= len(x):
            raise ValueError(
                f"data.validation_examples {n} leaves no training examples of the {len(x):,} in "
                f"{config.dataset}'s training set; hold out fewer (e.g. {len(x) // 12:,})"
            )
        validation, x, y = evaluation(x[-n:], y[-n:]), x[:-n], y[:-n]
    held = " left after data.validation_examples" if validation is not None else ""
    what = f"{config.dataset}'s training set{held}"
    x, y = _head(x, y, config.train_examples, "data.train_examples", what)
    xt, yt = spec.load("test", root, config.download)
    what = f"{config.dataset}'s test set"
    xt, yt = _head(xt, yt, config.test_examples, "data.test_examples", what)
    _check_batch(len(x), config)
    train_loader = data.TensorLoader(
        _convert(x, config),
        y,
        config.batch_size,
        shuffle=True,
        drop_last=True,
        augment=config.augment,
        member_orders=member_orders,
        **norm,
    )
    test_loader = evaluation(xt, yt)
    ood = {}
    for name in config.ood:
        _check_ood_name(name, IMAGE_OOD_SETS, config.dataset)
        xo, yo = registry.OOD_SETS[name].load(root, config.download)
        ood_channels = config.channels_after(xo.shape[1])
        if ood_channels != channels:
            raise ValueError(
                f"data.ood {name!r} has {ood_channels} channel(s), {config.dataset} has "
                f"{channels} (with data.channels {config.channels}); choose an OOD set with "
                "the same channels, or set data.channels=3 to repeat the grey images of both "
                "to RGB"
            )
        if config.ood_examples and config.ood_examples < len(xo):
            keep = torch.randperm(len(xo), generator=torch.Generator().manual_seed(0))
            xo, yo = xo[keep[: config.ood_examples]], yo[keep[: config.ood_examples]]
        ood[name] = evaluation(xo, yo)
    corruptions = {}
    if config.corruptions:
        xc, yc = _head(xt, yt, config.corruption_examples)
        for name in config.corruption_names or data.CORRUPTIONS:
            for severity in config.severities:
                corruptions[(name, severity)] = _CorruptedLoader(
                    xc, yc, name, severity, config.corruption_seed, evaluation
                )
    return Data(train_loader, test_loader, ood, corruptions, spec.num_classes, channels, validation)


def data_shape(config: DataConfig) -> tuple[int, int | None]:
    """(number of classes, input channels) of the data set, without loading its examples
    (channels None for text)."""
    if config.dataset in TEXT_DATASETS:
        return 2, None
    if config.dataset in FOLDER_DATASETS:
        folders = registry.DATASETS[config.dataset].load(config.root or None, "train")
        return len(folders.classes), 3
    spec = registry.DATASETS[config.dataset]
    return spec.num_classes, config.channels_after(spec.channels)


def _check_ood_name(name: str, allowed: tuple[str, ...], dataset: str) -> None:
    if name not in allowed:
        raise ValueError(
            f"data.ood {name!r} is not an OOD set for data.dataset {dataset!r}; choose from "
            f"{list(allowed)}"
        )


def _text_data(
    config: DataConfig,
    seed: int,
    device: torch.device | str,
    encoder: str | os.PathLike | None,
    member_orders: int,
) -> Data:
    """SST-2 or Rotten Tomatoes, tokenized once; see :func:`build_data`."""
    if config.augment or config.corruptions:
        raise ValueError(
            f"data.dataset {config.dataset!r} is text: set data.augment=[] and "
            "data.corruptions=false (both apply to images)"
        )
    root = config.root or None
    spec = registry.DATASETS[config.dataset]
    texts, labels, test_texts, test_labels = spec.load(root, config.download)

    held, trained = text_split(config, len(texts))

    from snens.models.text import tokenizer  # imports transformers: text only

    tok = tokenizer(encoder)

    def loader(texts, labels, keep, batch_size=config.eval_batch_size, **options):
        kept = [texts[i] for i in keep]
        ids, mask = data.tokenize(tok, kept, max_length=config.max_length, padding=config.padding)
        y = torch.tensor([labels[i] for i in keep], dtype=torch.long)
        return data.TokenLoader(ids, mask, y, batch_size, seed=seed, device=device, **options)

    _check_batch(len(trained), config)
    options = {"shuffle": True, "drop_last": True, "member_orders": member_orders}
    train_loader = loader(texts, labels, trained, config.batch_size, **options)
    validation = loader(texts, labels, held) if held else None
    what = f"{config.dataset}'s test texts"
    keep = _subset(len(test_texts), config.test_examples, "data.test_examples", what)
    test_loader = loader(test_texts, test_labels, keep)
    ood = {}
    for name in config.ood:
        _check_ood_name(name, TEXT_OOD_SETS, config.dataset)
        ood_texts = registry.OOD_SETS[name].load(root, config.download)
        zeros = [0] * len(ood_texts)  # OOD labels are not used
        ood[name] = loader(ood_texts, zeros, _subset(len(ood_texts), config.ood_examples))
    domains = {}
    for name in config.domains:
        domain_texts, domain_labels = registry.DOMAIN_SETS[name].load(root, config.download)
        what = f"the domain set {name!r}"
        keep = _subset(len(domain_texts), config.domain_examples, "data.domain_examples", what)
        domains[name] = loader(domain_texts, domain_labels, keep)
    return Data(train_loader, test_loader, ood, {}, 2, None, validation, domains)  # K=2, text


@dataclass(frozen=True)
class _Flip:
    """``transform(image)``, mirrored along the width with probability ``flip_prob`` (torch's
    global generator, which the FolderLoader seeds per example)."""

    transform: Callable[[Tensor], Tensor]
    flip_prob: float = 0.5

    def __call__(self, image: Tensor) -> Tensor:
        out = self.transform(image)
        return out.flip(-1) if torch.rand(()).item() < self.flip_prob else out


def _folder_data(config: DataConfig, seed: int, device: torch.device | str) -> Data:
    """ImageNet-style class folders read by DataLoader workers; see :func:`build_data`."""
    if config.corruptions:
        raise ValueError(
            f"data.corruptions is not available for data.dataset {config.dataset!r}; set "
            "data.corruptions=false"
        )
    if config.ood:
        raise ValueError(
            f"data.ood {list(config.ood)} names in-memory sets; data.dataset "
            f"{config.dataset!r} takes an OOD class-folder tree as data.ood_folder"
        )
    ood_folder = Path(config.ood_folder).expanduser()
    if config.ood_folder and not ood_folder.is_dir():  # before reading any training folder
        raise FileNotFoundError(
            f"data.ood_folder {str(ood_folder)!r} does not exist; give a folder of class "
            'sub-folders of images (e.g. ImageNet-O), or set data.ood_folder=""'
        )
    root = config.root or None
    size, resize = config.image_size, config.resize_size
    evaluation = data.EvalTransform(resize=resize, crop=size)
    flip = 0.5 if "flip" in config.augment else 0.0
    if "crop" in config.augment:
        training: Callable[[Tensor], Tensor] = data.TrainTransform(size=size, flip_prob=flip)
    else:
        training = _Flip(evaluation, flip) if flip else evaluation
    policy = {"on_bad_image": config.on_bad_image, "scan": config.scan_images}
    load = registry.DATASETS[config.dataset].load
    train_set = load(root, "train", transform=training, **policy)
    test_set = load(root, "val", transform=evaluation, **policy)
    if test_set.classes != train_set.classes:
        extra = sorted(set(test_set.classes) ^ set(train_set.classes))
        raise ValueError(
            f"{test_set.root} and {train_set.root} hold different class folders (e.g. "
            f"{extra[:5]}); the labels are the sorted folder names, so both need the same ones"
        )
    pin = torch.device(device).type == "cuda"
    options = {"seed": seed, "num_workers": config.num_workers, "pin_memory": pin}

    def subset(dataset: Any, n: int, key: str | None = None) -> Any:
        keep = _subset(len(dataset), n, key, f"{getattr(dataset, 'root', 'the folder')}")
        return dataset if len(keep) == len(dataset) else torch.utils.data.Subset(dataset, keep)

    train_subset = subset(train_set, config.train_examples, "data.train_examples")
    _check_batch(len(train_subset), config)
    train_loader = data.FolderLoader(
        train_subset, config.batch_size, shuffle=True, drop_last=True, **options
    )
    test_subset = subset(test_set, config.test_examples, "data.test_examples")
    test_loader = data.FolderLoader(test_subset, config.eval_batch_size, **options)
    ood = {}
    if config.ood_folder:
        ood_set = data.ImageFolder(ood_folder, transform=evaluation, **policy)
        ood[ood_folder.name] = data.FolderLoader(
            subset(ood_set, config.ood_examples), config.eval_batch_size, **options
        )
    return Data(train_loader, test_loader, ood, {}, len(train_set.classes), channels=3)
