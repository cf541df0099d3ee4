"""A data loader for data sets that fit in device memory, in the style of airbench.

The whole data set is one tensor on the device, converted and normalized once; a batch is an
index slice of it, and crop and flip run on the whole batch at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

__all__ = ["TensorLoader"]

AUGMENTATIONS = ("crop", "flip")


def _as_augment(augment: str | Sequence[str] | None) -> tuple[str, ...]:
    if augment is None:
        return ()
    names = (augment,) if isinstance(augment, str) else tuple(augment)
    unknown = [a for a in names if a not in AUGMENTATIONS]
    if unknown:
        raise ValueError(f"unknown augmentation {unknown}; choose from {AUGMENTATIONS}")
    return tuple(dict.fromkeys(names))  # drop repeats, keep order


def _is_int_at_least(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


#: The most member orders a loader draws: the largest M (snens.nn.norms.MAX_MEMBERS).
_MAX_ORDERS = 1024


def check_shard(rank: int, world_size: int, batch_size: int) -> None:
    """Raise ValueError unless rank ``rank`` of ``world_size`` can take an equal share."""
    if not _is_int_at_least(world_size, 1) or not (_is_int_at_least(rank, 0) and rank < world_size):
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank!r} of {world_size!r}")
    if batch_size % world_size:
        raise ValueError(
            f"batch_size {batch_size} is not divisible by world_size {world_size}; "
            f"choose a batch size that is a multiple of {world_size}"
        )


def seed_of(*numbers: int) -> int:
    """One 64-bit seed mixed from all ``numbers``: (s, e + 1) and (s + 1, e) give different ones."""
    return int(np.random.SeedSequence(list(numbers)).generate_state(1, dtype=np.uint64)[0])


def check_batching(batch_size: int, num_examples: int, drop_last: bool) -> None:
    """Raise ValueError unless ``num_examples`` make at least one batch of ``batch_size``."""
    if not _is_int_at_least(batch_size, 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if num_examples == 0:
        raise ValueError("the data set is empty")
    if drop_last and batch_size > num_examples:
        raise ValueError(
            f"drop_last with batch_size {batch_size} > {num_examples} examples yields no "
            "batch; lower batch_size or set drop_last=False"
        )


class EpochLoader:
    """The epoch counter and data-parallel sharding that the loaders share."""

    batch_size: int
    epoch = 0
    rank, world_size = 0, 1

    def shard(self, rank: int, world_size: int) -> EpochLoader:
        """Yield only rank ``rank``'s contiguous share of every global batch; returns ``self``.

        Every rank draws the same order and augmentation; ``len`` does not change.

        Raises:
            ValueError: as :func:`check_shard`.
        """
        check_shard(rank, world_size, self.batch_size)
        self.rank, self.world_size = rank, world_size
        return self

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (a non-negative int)."""
        if not _is_int_at_least(epoch, 0):
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self.epoch = epoch

    def _share(self, start: int, stop: int) -> slice:
        """This rank's contiguous part of the global batch ``[start, stop)``."""
        size, r, world = stop - start, self.rank, self.world_size
        return slice(start + size * r // world, start + size * (r + 1) // world)

    def _shard_repr(self) -> str:
        return f", rank={self.rank}, world_size={self.world_size}" if self.world_size > 1 else ""


def _channel_stat(value: float | Sequence[float], channels: int, name: str) -> torch.Tensor:
    stat = torch.as_tensor(value, dtype=torch.float64).flatten()
    if stat.numel() not in (1, channels):
        raise ValueError(
            f"{name} needs 1 value or one per channel ({channels}), got {stat.numel()}"
        )
    return stat


def _length(tensor: torch.Tensor) -> int | str:
    return len(tensor) if tensor.dim() > 0 else "a scalar (no length)"


def _as_dataset(
    images: torch.Tensor, labels: torch.Tensor, batch_size: int, drop_last: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = torch.as_tensor(images), torch.as_tensor(labels)
    if images.dim() == 0 or labels.dim() == 0 or len(images) != len(labels):
        raise ValueError(
            f"images and labels must have the same length, got {_length(images)} images "
            f"and {_length(labels)} labels"
        )
    check_batching(batch_size, len(images), drop_last)
    return images, labels


def _base_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """``seed``, else one drawn from ``generator`` (torch's global generator when None)."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    if not _is_int_at_least(seed, 0):
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return seed


def _check_applies(
    images: torch.Tensor,
    is_ids: bool,
    augment: tuple[str, ...],
    mean: float | Sequence[float] | None,
    std: float | Sequence[float] | None,
) -> None:
    if is_ids and (mean is not None or std is not None or augment):
        raise ValueError(
            f"images of dtype {images.dtype} are kept as ids; mean, std and augment apply "
            "to uint8 or floating images only"
        )
    if "crop" in augment and images.dim() != 4:
        raise ValueError(f"crop needs images (N, C, H, W), got {tuple(images.shape)}")
    if "flip" in augment and images.dim() < 3:
        raise ValueError(f"flip needs images (N, C, ..., W), got {tuple(images.shape)}")


def _convert(
    x: torch.Tensor,
    is_ids: bool,
    dtype: torch.dtype,
    mean: float | Sequence[float] | None,
    std: float | Sequence[float] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs as stored (ids kept; images as ``dtype``, normalized) and a black pixel's value."""
    fill = torch.zeros(1, dtype=torch.float64)  # value of a black pixel after conversion
    if is_ids:
        return x, fill
    x = x.to(dtype) / 255 if x.dtype == torch.uint8 else x.to(dtype)
    if mean is None and std is None:
        return x, fill
    channels = x.shape[1] if x.dim() > 1 else 1
    mean_t = _channel_stat(0.0 if mean is None else mean, channels, "mean")
    std_t = _channel_stat(1.0 if std is None else std, channels, "std")
    if (std_t <= 0).any():
        raise ValueError(f"std must be positive, got {std_t.tolist()}")
    view = (1, -1) + (1,) * max(x.dim() - 2, 0)
    x = (x - mean_t.to(x.device, dtype).view(view)) / std_t.to(x.device, dtype).view(view)
    return x, -mean_t / std_t


def _crop_padding_and_fill(
    x: torch.Tensor, fill: torch.Tensor, crop_padding: int | None
) -> tuple[int, torch.Tensor]:
    """The crop padding (default 2 below 32 px, else 4) and the pad value, (1, C, 1, 1)."""
    height, width = x.shape[-2:]
    default = 4 if min(height, width) >= 32 else 2
    padding = default if crop_padding is None else crop_padding
    if not _is_int_at_least(padding, 1):
        raise ValueError(f"crop_padding must be a positive int, got {crop_padding!r}")
    channels = x.shape[1]
    fill = fill.expand(channels) if fill.numel() == 1 else fill
    return padding, fill.to(x.device, x.dtype).view(1, channels, 1, 1)


class TensorLoader(EpochLoader):
    """Iterate over ``(x, y)`` batches of a device-resident data set.

    At construction ``uint8`` images become ``dtype`` in [0, 1] (÷255), floating inputs are cast
    to ``dtype``, then ``x = (x − mean) / std`` per channel (dim 1) when given. Other integer
    inputs (token ids) are kept as they are, without normalization or augmentation. Integer
    labels become int64.

    Augmentation per batch: ``"crop"`` pads each side by ``crop_padding`` with a black pixel's
    normalized value and cuts a random H×W window; ``"flip"`` mirrors the width with probability
    ``flip_prob``. Epoch e draws from a CPU generator seeded from ``(seed, e)``; each pass
    advances ``epoch``, :meth:`set_epoch` chooses the next one.

    With ``member_orders=M`` (and ``shuffle``) each epoch draws M orders, and a batch is the M
    members' batches one after another (member m's at rows [m·B, (m+1)·B)), as an ensemble with
    ``input_policy="split"`` takes them.

    Args:
        generator: when ``seed`` is None, the base seed is drawn from it once (default: torch's
            global generator).
        device: where the data lives; default: the device of ``images``.
        mean: per-channel mean (one value or C), in the [0, 1] scale for uint8 images.
        std: per-channel standard deviation, same scale.
        crop_padding: pixels; default 2 below 32 px, 4 from 32 px (the CIFAR recipe).

    Raises:
        ValueError: a bad size or option, images and labels of different lengths, an empty data
            set, or an option that does not apply to the inputs.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        shuffle: bool = False,
        drop_last: bool = False,
        augment: str | Sequence[str] | None = None,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        *,
        mean: float | Sequence[float] | None = None,
        std: float | Sequence[float] | None = None,
        seed: int | None = None,
        crop_padding: int | None = None,
        flip_prob: float = 0.5,
        dtype: torch.dtype = torch.float32,
        member_orders: int = 1,
    ) -> None:
        images, labels = _as_dataset(images, labels, batch_size, drop_last)
        if not _is_int_at_least(member_orders, 1) or member_orders > _MAX_ORDERS:
            raise ValueError(
                f"member_orders must be an int in 1..{_MAX_ORDERS} (M), got {member_orders!r}"
            )
        if member_orders > 1 and not shuffle:
            raise ValueError(
                f"member_orders={member_orders} draws each member's own order, which needs "
                "shuffle=True (without it every order is the data set's)"
            )
        self.member_orders = member_orders
        if (
            isinstance(flip_prob, bool)
            or not isinstance(flip_prob, int | float)
            or not 0.0 <= flip_prob <= 1.0
        ):
            raise ValueError(f"flip_prob must be in [0, 1], got {flip_prob!r}")
        self.augment = _as_augment(augment)
        if crop_padding is not None and "crop" not in self.augment:
            raise ValueError(
                f"crop_padding={crop_padding!r} applies to augment 'crop', which "
                f"augment={self.augment} does not hold; add 'crop' or drop crop_padding"
            )
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.flip_prob = flip_prob
        self.device = torch.device(device) if device is not None else images.device
        self.seed = _base_seed(seed, generator)

        is_ids = not images.is_floating_point() and images.dtype != torch.uint8
        _check_applies(images, is_ids, self.augment, mean, std)
        self.images, fill = _convert(images.to(self.device), is_ids, dtype, mean, std)
        self.labels = labels.to(self.device)
        if not self.labels.is_floating_point():
            self.labels = self.labels.long()
        self.crop_padding = 0
        if "crop" in self.augment:
            self.crop_padding, self._fill = _crop_padding_and_fill(self.images, fill, crop_padding)

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.images)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def epoch_generator(self, epoch: int) -> torch.Generator:
        """The CPU generator of ``epoch``, seeded from ``(seed, epoch)``."""
        return torch.Generator().manual_seed(seed_of(self.seed, epoch))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        n, batch_size, M = len(self.images), self.batch_size, self.member_orders
        generator = self.epoch_generator(epoch)
        orders: list[torch.Tensor | None] = [None]
        if self.shuffle:
            orders = [torch.randperm(n, generator=generator).to(self.device) for _ in range(M)]
        offsets = flips = None
        if "crop" in self.augment:
            span = 2 * self.crop_padding + 1
            offsets = torch.randint(0, span, (M, n, 2), generator=generator).to(self.device)
        if "flip" in self.augment:
            flips = (torch.rand(M, n, generator=generator) < self.flip_prob).to(self.device)
        for i in range(len(self)):
            rows = self._share(i * batch_size, min((i + 1) * batch_size, n))
            batches = [
                self._batch(order, rows, offsets, flips, m) for m, order in enumerate(orders)
            ]
            if len(batches) == 1:
                yield batches[0]
            else:  # member m's batch at rows [m·B, (m+1)·B)
                yield torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])

    def _batch(
        self,
        order: torch.Tensor | None,
        rows: slice,
        offsets: torch.Tensor | None,
        flips: torch.Tensor | None,
        m: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch at ``rows`` of ``order`` (None: stored), member ``m``'s crops and flips."""
        if order is None:
            x, y = self.images[rows], self.labels[rows]  # views, no copy
        else:
            index = order[rows]
            x, y = self.images[index], self.labels[index]
        if offsets is not None:
            x = self._crop(x, offsets[m, rows])
        if flips is not None:
            x = torch.where(flips[m, rows].view(-1, *(1,) * (x.dim() - 1)), x.flip(-1), x)
        return x, y

    def _crop(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Pad by p and cut the H×W window at ``offsets`` (B, 2) in [0, 2p]."""
        batch, channels, height, width = x.shape
        p = self.crop_padding
        padded = self._fill.expand(batch, channels, height + 2 * p, width + 2 * p).clone()
        padded[:, :, p : p + height, p : p + width] = x  # (B, C, H+2p, W+2p)
        rows = offsets[:, 0:1] + torch.arange(height, device=x.device)  # (B, H)
        cols = offsets[:, 1:2] + torch.arange(width, device=x.device)  # (B, W)
        rows = rows.view(batch, 1, height, 1).expand(batch, channels, height, width + 2 * p)
        x = padded.gather(2, rows)  # (B, C, H, W+2p)
        cols = cols.view(batch, 1, 1, width).expand(batch, channels, height, width)
        return x.gather(3, cols)  # (B, C, H, W)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_examples={len(self.images)}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle}, drop_last={self.drop_last}, "
            f"augment={self.augment}, crop_padding={self.crop_padding}, seed={self.seed}, "
            f"device={self.device}"
            + (f", member_orders={self.member_orders}" if self.member_orders > 1 else "")
            + f"{self._shard_repr()})"
        )
