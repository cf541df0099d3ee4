"""A single model under the ensemble contract: (B, …) -> (1, B, K)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

__all__ = ["SingleModel"]


class SingleModel(nn.Module):
    """Wraps a plain classifier so it returns logits (M=1, B, K) like every ensemble."""

    num_members = 1

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        out = self.model(*args, **kwargs)
        logits = getattr(out, "logits", out)
        return logits.unsqueeze(0)  # (1, B, K)
