"""Conversion to and from plain norm classes a member norm does not own."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from snens.nn.norms import MemberNorm

__all__ = [
    "EPS_ATTRIBUTES",
    "RebuildsPlain",
    "SIZE_ATTRIBUTES",
    "feature_shape",
    "from_plain_as",
    "norm_eps",
    "positive_int",
]

#: Where norms keep eps: torch's, Hugging Face's (``variance_epsilon``) and other spellings.
EPS_ATTRIBUTES = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps", "norm_eps")
#: Where a norm without a weight records its size.
SIZE_ATTRIBUTES = ("normalized_shape", "hidden_size", "dim", "num_features", "num_channels")


def positive_int(value: object) -> bool:
    """Whether ``value`` is an int >= 1 (bools are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def norm_eps(module: nn.Module) -> float | None:
    """The first real value among ``module``'s :data:`EPS_ATTRIBUTES`, or None."""
    for name in EPS_ATTRIBUTES:
        value = getattr(module, name, None)
        if not isinstance(value, bool) and isinstance(value, int | float):
            return float(value)
    return None


def feature_shape(module: nn.Module) -> tuple[int, ...] | None:
    """The shape of one member's affine: ``module``'s weight's, else the size it records."""
    weight = module._parameters.get("weight")
    if weight is not None:
        return tuple(weight.shape)
    for name in SIZE_ATTRIBUTES:
        value = getattr(module, name, None)
        sizes = tuple(value) if isinstance(value, tuple | list | torch.Size) else (value,)
        if sizes and all(positive_int(s) for s in sizes):
            return sizes
    return None


def from_plain_as(
    member_type: type[MemberNorm],
    plain: nn.Module,
    num_members: int,
    *,
    eps: float | None = None,
    generator: torch.Generator | None = None,
    **kw: Any,
) -> MemberNorm:
    """``MemberNorm.from_plain`` without its exact-type check: a ``member_type`` whose every
    member reproduces ``plain`` (``eps``: where it keeps none).

    Raises:
        TypeError: if ``plain`` lacks what ``member_type`` reads, or holds a bias it has none for.
    """
    try:
        config = member_type._plain_config(plain)
    except (AttributeError, TypeError) as err:
        raise TypeError(
            f"{member_type.__name__} cannot be built from {type(plain).__name__}: {err}; "
            "register it with snens.nn.register_norm(..., from_plain=function) instead"
        ) from None
    if eps is not None:
        config["eps"] = eps
    if config.get("eps", 0) is None and getattr(member_type, "plain_type", None) is not nn.RMSNorm:
        raise TypeError(
            f"{member_type.__name__} needs the eps of {type(plain).__name__}, which keeps it in "
            f"none of {', '.join(EPS_ATTRIBUTES)}; register it with "
            "snens.nn.register_norm(..., from_plain=function) instead"
        )
    member = member_type._from_plain_config(plain, config, num_members, generator, kw)
    if plain._parameters.get("bias") is not None and member.bias is None:
        raise TypeError(
            f"{type(plain).__name__} has a bias, which {member_type.__name__} has none for; "
            "register it with snens.nn.register_norm and a member class with a bias"
        )
    return member


class RebuildsPlain:
    """``to_plain`` rebuilds ``plain_type(size, eps=eps, **plain_options)``."""

    plain_type: type[nn.Module] | None
    plain_options: dict[str, Any]
    eps: float
    weight: Tensor

    def _rebuild_plain(self, size: int | tuple[int, ...]) -> nn.Module:
        if self.plain_type is None:
            raise ValueError(
                f"this {type(self).__name__} was built without plain_type, so it has no plain "
                "class to become; build it with plain_type= (from_plain records the converted "
                "module's class)"
            )
        try:
            plain = self.plain_type(size, eps=self.eps, **self.plain_options)
        except TypeError as err:
            raise TypeError(
                f"cannot rebuild {self.plain_type.__name__}({size}, eps={self.eps}, "
                f"**{self.plain_options}): {err}; register it with snens.nn.register_norm(..., "
                "from_plain=function) returning a member norm whose to_plain builds it"
            ) from None
        return plain.to(device=self.weight.device, dtype=self.weight.dtype)
