"""Member-norm lookup: which member norm replaces which plain norm, and a ``norm_layer`` factory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from snens.nn.batch_norms import MemberBatchNorm1d, MemberBatchNorm2d, MemberBatchNorm3d
from snens.nn.norms import MemberNorm, check_num_members
from snens.nn.per_example_norms import (
    MemberGroupNorm,
    MemberInstanceNorm1d,
    MemberInstanceNorm2d,
    MemberInstanceNorm3d,
    MemberLayerNorm,
    MemberRMSNorm,
)

__all__ = ["MEMBER_NORMS", "member_norm", "refusal"]

#: Plain norm type -> its member counterpart. Exact types: a subclass may change ``forward``.
MEMBER_NORMS: dict[type[nn.Module], type[MemberNorm]] = {
    nn.BatchNorm1d: MemberBatchNorm1d,
    nn.BatchNorm2d: MemberBatchNorm2d,
    nn.BatchNorm3d: MemberBatchNorm3d,
    nn.LayerNorm: MemberLayerNorm,
    nn.GroupNorm: MemberGroupNorm,
    nn.RMSNorm: MemberRMSNorm,
    nn.InstanceNorm1d: MemberInstanceNorm1d,
    nn.InstanceNorm2d: MemberInstanceNorm2d,
    nn.InstanceNorm3d: MemberInstanceNorm3d,
}


def refusal(module: nn.Module) -> str | None:
    """Why ``module``, of a type in :data:`MEMBER_NORMS`, is in a setting its member version
    does not compute (:meth:`MemberNorm.refusal`); None where it converts or its type is not
    there."""
    member = MEMBER_NORMS.get(type(module))
    return None if member is None else member.refusal(module)


def member_norm(
    num_members: int, norm: type[nn.Module] = nn.BatchNorm2d, **defaults
) -> Callable[..., MemberNorm]:
    """A ``norm_layer=`` factory for models built with one (torchvision, timm style).

    ``member_norm(4)(64)`` builds ``MemberBatchNorm2d(64, num_members=4)``;
    ``member_norm(4, nn.LayerNorm, eps=1e-6)(384)`` builds a ``MemberLayerNorm``.
    The layer takes ``norm``'s own signature, positional and keyword (``(64, 1e-3)``,
    ``(64, momentum=None)``, ``(384, elementwise_affine=False)``, ``device=``, ``dtype=``),
    checked by ``norm`` itself; ``gamma_mean`` and ``gamma_std`` go to the member norm. A
    member norm always has its per-member affine (σ(γ_m) scales it): ``affine=False`` or
    ``elementwise_affine=False`` start it at the identity, as for any other layer.

    Args:
        num_members: M.
        norm: the plain norm type the model would otherwise use.
        **defaults: keyword arguments for every layer built (e.g. ``eps``, ``gamma_std``).

    Raises:
        TypeError, ValueError: on a bad ``num_members`` or a norm type with no member version.
    """
    check_num_members(num_members)
    if norm not in MEMBER_NORMS:
        supported = ", ".join(t.__name__ for t in MEMBER_NORMS)
        raise TypeError(f"no member version of {norm!r}; supported norms: {supported}")
    cls = MEMBER_NORMS[norm]

    def build(*args: Any, **kwargs: Any) -> MemberNorm:
        options = {**defaults, **kwargs}
        member = {k: options.pop(k) for k in _MEMBER_OPTIONS if k in options}
        factory = {k: options[k] for k in ("device", "dtype") if k in options}
        plain = norm(*args, **options)  # torch's own signature and checks
        return cls(**cls._plain_config(plain), num_members=num_members, **member, **factory)

    build.__name__ = build.__qualname__ = f"member_norm({num_members}, {norm.__name__})"
    return build


# Keyword arguments of the member norms that the plain norms do not take.
_MEMBER_OPTIONS = ("gamma_mean", "gamma_std")
