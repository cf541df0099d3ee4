"""Texts tokenized once into id tensors, and a loader of ``(dict(input_ids, attention_mask), y)``.

:class:`TokenLoader` batches the ids through a :class:`~snens.data.TensorLoader`, which gives
it the same seeded shuffling and sharding; a batch is cut to the columns its texts use.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .loader import TensorLoader

__all__ = ["TokenLoader", "tokenize"]

PADDINGS = ("longest", "max_length")


def tokenize(
    tokenizer: Any, texts: Sequence[str], *, max_length: int, padding: str = "longest"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of ``texts``, truncated to ``max_length`` tokens.

    ``padding``: ``"longest"`` pads to the longest text, ``"max_length"`` to ``max_length``.

    Returns:
        ``(input_ids, attention_mask)``, int64 ``(N, T)``.

    Raises:
        ValueError: no texts, an unknown ``padding``, or ``max_length`` above what the model
            accepts.
    """
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    if not texts:
        raise ValueError("no texts to tokenize")
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and limit < 1_000_000 and max_length > limit:
        raise ValueError(
            f"data.max_length {max_length} exceeds the {limit} tokens the tokenizer's model "
            f"accepts; set data.max_length <= {limit}"
        )
    encoded = tokenizer(
        list(texts), truncation=True, max_length=max_length, padding=padding, return_tensors="pt"
    )
    return encoded["input_ids"].long(), encoded["attention_mask"].long()


class TokenLoader:
    """Iterate over ``({"input_ids", "attention_mask"}, labels)`` batches of tokenized texts.

    ``trim`` cuts every batch to the last column any of its texts uses; ``member_orders`` is as
    for :class:`~snens.data.TensorLoader`.

    Raises:
        ValueError: ids and mask of different shapes, floating ids, or what
            :class:`~snens.data.TensorLoader` refuses.
    """

    def __init__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        device: torch.device | str | None = None,
        trim: bool = True,
        member_orders: int = 1,
    ) -> None:
        input_ids, attention_mask = torch.as_tensor(input_ids), torch.as_tensor(attention_mask)
        if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
            raise ValueError(
                f"input_ids and attention_mask must both be (N, T), got "
                f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
            )
        if input_ids.is_floating_point() or attention_mask.is_floating_point():
            raise ValueError("input_ids and attention_mask must be integer tensors")
        self.trim = trim
        # One int64 tensor (N, 2, T): TensorLoader keeps integer inputs as ids, unnormalized.
        rows = torch.stack([input_ids.long(), attention_mask.long()], dim=1)
        self.rows = TensorLoader(
            rows,
            labels,
            batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            device=device,
            seed=seed,
            member_orders=member_orders,
        )

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def epoch(self) -> int:
        """The epoch the next pass will be."""
        return self.rows.epoch

    @property
    def batch_size(self) -> int:
        return self.rows.batch_size

    def shard(self, rank: int, world_size: int) -> TokenLoader:
        """Yield rank ``rank``'s rows of every global batch, as :meth:`TensorLoader.shard`."""
        self.rows.shard(rank, world_size)
        return self

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch``."""
        self.rows.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        for x, y in self.rows:
            ids, mask = x[:, 0], x[:, 1]  # (B, T) each
            if self.trim and len(mask):
                used = mask.any(dim=0)  # (T,): columns any text of the batch uses
                length = len(used) - int(used.flip(0).int().argmax()) if used.any() else 1
                ids, mask = ids[:, :length], mask[:, :length]
            yield {"input_ids": ids, "attention_mask": mask}, y

    def __repr__(self) -> str:
        return f"{type(self).__name__}(trim={self.trim}, rows={self.rows!r})"
