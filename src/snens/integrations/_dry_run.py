"""A copy of a model without its values, to try a load on before the model itself is changed.

Converting a model for a save (``snens.convert(..., inplace=True)``, PEFT's
``get_peft_model``) changes the caller's model; a save that turns out not to fit would leave it
converted, and a retry with the right directory would fail. The loaders first convert a copy
whose tensors are on the meta device (shapes and dtypes, no memory) and check the save against
it; only a save that fits is then loaded into the caller's model.
"""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn

__all__ = ["meta_copy"]


def meta_copy(model: nn.Module) -> nn.Module | None:
    """``model`` deep-copied with every parameter and buffer on the meta device (tied tensors
    stay tied); None where the model cannot be deep-copied (legacy weight-norm hooks), in which
    case the loader converts the model itself, as before."""
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
