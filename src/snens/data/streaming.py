"""A loader of image files too large for memory: a torch DataLoader with seeded epochs.

Like :class:`~snens.data.TensorLoader`, epoch e depends only on ``(seed, e)`` (example i's
random transform runs under torch's global generator seeded with ``(seed, e, i)``, whatever
the number of workers), and :meth:`FolderLoader.shard` gives its data-parallel contract.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .loader import EpochLoader, _is_int_at_least, check_batching, seed_of

__all__ = ["MAX_WORKERS", "FolderLoader", "default_num_workers"]

#: Most DataLoader worker processes a loader may start: above the cores of the largest hosts,
#: far below what exhausts a host's process table.
MAX_WORKERS = 512

_WORKERS = 2**63  # third seed number of the workers' base seed; item seeds use indices < N


def default_num_workers() -> int:
    """min(8, usable CPUs): enough to decode JPEGs for one GPU without crowding the host.

    Returns:
        An int in [1, 8].
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return min(8, cpus)


class _SeededItems(Dataset):
    """``dataset[i]`` with torch's global generator seeded from (seed, epoch, i) meanwhile."""

    def __init__(self, dataset: Any, seed: int, epoch: int) -> None:
        self.dataset, self.seed, self.epoch = dataset, seed, epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
            torch.manual_seed(seed_of(self.seed, self.epoch, int(index)))
            return self.dataset[index]


class FolderLoader(EpochLoader):
    """Iterate over ``(x, y)`` batches of a map-style data set, read by DataLoader workers.

    Args:
        dataset: ``dataset[i]`` returns ``(image, label)``.
        batch_size: examples per global batch.
        num_workers: DataLoader worker processes; 0 reads in this process, -1 =
            :func:`default_num_workers`.

    Raises:
        ValueError: an empty data set, a non-positive batch size, ``num_workers`` outside
            -1..:data:`MAX_WORKERS`, or ``drop_last`` with fewer examples than one batch.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        check_batching(batch_size, len(dataset), drop_last)
        if not _is_int_at_least(num_workers, -1) or num_workers > MAX_WORKERS:
            raise ValueError(
                f"num_workers must be an int in 0..{MAX_WORKERS}, or -1 for the default; got "
                f"{num_workers!r}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.num_workers = default_num_workers() if num_workers == -1 else num_workers
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def batches(self, epoch: int) -> list[list[int]]:
        """The indices of this rank's batches in ``epoch``, as :class:`TensorLoader` takes them."""
        n, size = len(self.dataset), self.batch_size
        if self.shuffle:
            generator = torch.Generator().manual_seed(seed_of(self.seed, epoch))
            order = torch.randperm(n, generator=generator).tolist()
        else:
            order = list(range(n))
        return [order[self._share(i * size, min((i + 1) * size, n))] for i in range(len(self))]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        loader = DataLoader(
            _SeededItems(self.dataset, self.seed, epoch),
            batch_sampler=self.batches(epoch),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            # Workers' own generators are seeded by the loader; the transforms do not use them.
            generator=torch.Generator().manual_seed(seed_of(self.seed, epoch, _WORKERS)),
        )
        yield from loader

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_examples={len(self.dataset)}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle}, drop_last={self.drop_last}, "
            f"num_workers={self.num_workers}, seed={self.seed}{self._shard_repr()})"
        )
