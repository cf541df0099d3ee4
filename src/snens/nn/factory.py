"""Member-norm lookup: which member norm replaces which plain norm, and a ``norm_layer`` factory."""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import nn

from snens.nn.batch_norms import MemberBatchNorm1d, MemberBatchNorm2d, MemberBatchNorm3d
from snens.nn.norms import MemberNorm, check_num_members
from snens.nn.per_example_norms import MemberGroupNorm, MemberLayerNorm, MemberRMSNorm

__all__ = ["MEMBER_NORMS", "member_norm"]

#: Plain norm type -> its member counterpart. Exact types: a subclass may change ``forward``.
MEMBER_NORMS: dict[type[nn.Module], type[MemberNorm]] = {
    nn.BatchNorm1d: MemberBatchNorm1d,
    nn.BatchNorm2d: MemberBatchNorm2d,
    nn.BatchNorm3d: MemberBatchNorm3d,
    nn.LayerNorm: MemberLayerNorm,
    nn.GroupNorm: MemberGroupNorm,
    nn.RMSNorm: MemberRMSNorm,
}


def member_norm(
    num_members: int, norm: type[nn.Module] = nn.BatchNorm2d, **defaults
) -> Callable[..., MemberNorm]:
    """A ``norm_layer=`` factory for models built with one (torchvision, timm style).

    ``member_norm(4)(64)`` builds ``MemberBatchNorm2d(64, num_members=4)``;
    ``member_norm(4, nn.LayerNorm, eps=1e-6)(384)`` builds a ``MemberLayerNorm``.
    Positional and keyword arguments go to the member norm as they would to ``norm``.

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
    return functools.partial(cls, num_members=num_members, **defaults)
