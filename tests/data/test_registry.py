"""The one table of data sets and OOD sets, and what the engine's config reads from it."""

from __future__ import annotations

import pytest

from snens.data import registry
from snens.engine import config


def test_the_table_names_every_kind():
    assert registry.dataset_names("image") == ("fashion_mnist", "cifar10", "cifar100", "svhn")
    assert registry.dataset_names("folder") == ("imagenet", "image_folder")
    assert registry.dataset_names("text") == ("sst2", "rotten_tomatoes")
    assert registry.ood_names("image") == (
        "mnist_5k",
        "fashion_mnist",
        "cifar10",
        "cifar100",
        "svhn",
    )
    assert registry.ood_names("text") == ("rt_plots", "tweets")
    assert {entry.kind for entry in registry.DATASETS.values()} == set(registry.KINDS)


@pytest.mark.parametrize("name", registry.dataset_names("image"))
def test_an_image_set_says_how_it_is_stored(name):
    entry = registry.DATASETS[name]
    assert entry.channels in (1, 3) and entry.num_classes in (10, 100)
    for values in (entry.mean, entry.std):
        assert len(values) == entry.channels if isinstance(values, tuple) else entry.channels == 1
    assert callable(entry.load)


def test_the_config_reads_the_table():
    assert config.DATASETS == tuple(registry.DATASETS)
    assert config.IMAGE_CHANNELS == {"fashion_mnist": 1, "cifar10": 3, "cifar100": 3, "svhn": 3}
    assert config.OOD_SETS == tuple(registry.OOD_SETS)
    assert config.TEXT_OOD_SETS == ("rt_plots", "tweets")


def test_rotten_tomatoes_loads_as_its_fixed_split():
    split = registry.DATASETS["rotten_tomatoes"].load(None, False)
    assert (len(split.train_texts), len(split.test_texts)) == (10_201, 2_551)
    plots = registry.OOD_SETS["rt_plots"].load(None, False)
    assert len(plots) == 1_083
