"""A copy of a model without its values, to try a load on before the model itself is changed.

The loaders convert such a copy (tensors on the meta device) and check the save against it
first, so that a save that does not fit leaves the caller's model unconverted.
"""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn

__all__ = ["meta_copy"]


def meta_copy(model: nn.Module) -> nn.Module | None:
    """``model`` deep-copied with every parameter and buffer on the meta device (tied tensors
    stay tied); None where the model cannot be deep-copied (legacy weight-norm hooks)."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        empty = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, nn.Parameter):
            empty = nn.Parameter(empty, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = empty
    try:
        return copy.deepcopy(model, memo)
    except (TypeError, RuntimeError, AttributeError, copy.Error):
        return None
