"""MC-dropout (Gal & Ghahramani, 2016): M stochastic forward passes with dropout left on.

Every dropout module is replaced by one that drops in evaluation too (if the model has none with
p > 0, one is inserted before the head, by option). The M passes run as one pass over the input
repeated M times, member-major (M·B, …), every row drawing its own masks. In training mode it
runs ``train_samples`` passes, by default one (Gal & Ghahramani's recipe).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from snens.method.ensemble import forward_repeated
from snens.nn.norms import check_num_members
from snens.nn.surgery import replace_modules
from snens.nn.torch_transformers import adapt

__all__ = ["MCDropout", "MCDropoutLayer"]

_DROPOUT_FUNCTIONS: dict[type[nn.Module], Callable[..., Tensor]] = {
    nn.Dropout: F.dropout,
    nn.Dropout1d: F.dropout1d,
    nn.Dropout2d: F.dropout2d,
    nn.Dropout3d: F.dropout3d,
    nn.AlphaDropout: F.alpha_dropout,
    nn.FeatureAlphaDropout: F.feature_alpha_dropout,
}


class MCDropoutLayer(nn.Module):
    """Dropout of ``p`` that stays on in evaluation mode, of the type ``kind`` it replaces."""

    def __init__(self, p: float, kind: type[nn.Module] = nn.Dropout) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        if kind not in _DROPOUT_FUNCTIONS:
            raise TypeError(f"no MC version of {kind.__name__}")
        self.p = p
        self.kind = kind

    def forward(self, x: Tensor) -> Tensor:
        return _DROPOUT_FUNCTIONS[self.kind](x, self.p, True)

    def extra_repr(self) -> str:
        return f"p={self.p}, kind={self.kind.__name__}"


class MCDropout(nn.Module):
    """A model (copied unless ``inplace``) with always-on dropout, sampled M times: (B, …) -> logits
    (M, B, K), or (train_samples, B, K) in training mode. Dropout of ``p`` is inserted before the
    head if ``insert`` (None: only where the model has none with p > 0); ``output`` picks the
    logits from the model's output.

    Raises:
        ValueError: if no dropout would be active, or the head to insert before cannot be found.
    """

    def __init__(
        self,
        model: nn.Module,
        num_members: int = 4,
        *,
        p: float = 0.1,
        insert: bool | None = None,
        output: Callable[[Any], Tensor] | None = None,
        inplace: bool = False,
        train_samples: int = 1,
    ) -> None:
        super().__init__()
        self.num_members = check_num_members(num_members)
        if isinstance(train_samples, bool) or not isinstance(train_samples, int):
            raise TypeError(f"train_samples must be an int >= 1, got {train_samples!r}")
        if train_samples < 1:
            raise ValueError(
                f"train_samples must be >= 1 (1: the plain model's step), got {train_samples}"
            )
        self.train_samples = train_samples
        target = model if inplace else copy.deepcopy(model)
        active = [
            m
            for m in target.modules()
            if (type(m) in _DROPOUT_FUNCTIONS or isinstance(m, MCDropoutLayer)) and m.p > 0
        ]
        replace_modules(
            target,
            lambda _, m: MCDropoutLayer(m.p, type(m)) if type(m) in _DROPOUT_FUNCTIONS else None,
        )
        if insert or (insert is None and not active):
            heads = [m for m in target.modules() if type(m) is nn.Linear]
            if not heads:
                raise ValueError(
                    f"{type(model).__name__} has no nn.Linear head to put dropout before; add a "
                    "dropout layer to the model and pass insert=False"
                )
            head = heads[-1]
            replace_modules(
                target, lambda _, m: nn.Sequential(MCDropoutLayer(p), head) if m is head else None
            )
        elif not active:
            raise ValueError(
                f"{type(model).__name__} has no dropout with p > 0; pass insert=True (or leave "
                "insert=None) to put one before the head"
            )
        adapt(target)  # torch's fused transformer layers apply no dropout
        self.model = target
        self.output = output

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        samples = self.train_samples if self.training else self.num_members
        return forward_repeated(self.model, samples, args, kwargs, output=self.output)

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}, train_samples={self.train_samples}"
