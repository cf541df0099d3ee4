"""Conversion to and from plain norm classes a member norm does not own.

A torch member norm converts exactly its ``plain_type`` (``MemberNorm.from_plain``). The
member versions of other libraries' norms (:mod:`snens.nn.hf_norms`,
:mod:`snens.nn.channels_first`) and the norms users register (``snens.nn.register_norm``)
convert modules of other classes: :func:`from_plain_as` runs ``from_plain``'s steps for them,
:class:`RebuildsPlain` gives ``to_plain`` the class it rebuilds, and :func:`only_state` is the
first check of recognition, what a module holds.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from snens.nn.norms import MemberNorm

__all__ = ["RebuildsPlain", "from_plain_as", "only_state"]


def only_state(module: nn.Module, names: set[str]) -> bool:
    """A leaf holding no parameters beyond ``names`` and no buffers."""
    params = {name for name, _ in module.named_parameters(recurse=False)}
    return (
        next(module.children(), None) is None
        and params <= names
        and next(module.buffers(recurse=False), None) is None
    )


def from_plain_as(
    member_type: type[MemberNorm],
    plain: nn.Module,
    num_members: int,
    *,
    generator: torch.Generator | None = None,
    **kw: Any,
) -> MemberNorm:
    """A ``member_type`` whose every member reproduces ``plain``, a module of any type that
    computes what ``member_type`` does.

    ``MemberNorm.from_plain`` without its exact-type check: ``member_type`` is built
    from ``member_type._plain_config(plain)`` on plain's device and dtype, gamma drawn from
    N(gamma_mean, gamma_std²), each member's affine set to plain's ``weight`` and ``bias``
    divided by sigmoid(gamma_m), running statistics copied.

    Args:
        member_type: a :class:`MemberNorm` subclass.
        plain: the module to replace.
        num_members: M.
        generator: optional ``torch.Generator`` for gamma.
        **kw: ``gamma_mean``, ``gamma_std``.

    Raises:
        TypeError: if ``plain`` lacks what ``member_type`` reads from it (named in the message).
    """
    try:
        config = member_type._plain_config(plain)
    except AttributeError as err:
        raise TypeError(
            f"{member_type.__name__} cannot be built from {type(plain).__name__}: {err}; "
            "register it with snens.nn.register_norm(..., from_plain=function) instead"
        ) from None
    return member_type._from_plain_config(plain, config, num_members, generator, kw)


class RebuildsPlain:
    """to_plain's half for member norms of external classes: the plain class is rebuilt as
    ``plain_type(size, eps=eps, **plain_options)`` (recorded by from_plain)."""

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
