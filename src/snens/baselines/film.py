"""FiLM-Ensemble (Turkoglu et al., 2022): members differ only in their norms' affine.

Every norm becomes M member norms with their own statistics and affine, everything else shared:
a σN-Ens member norm with gamma fixed at +∞ (a buffer), so every snens tool applies. The affine
is drawn around the plain one, weight_m = weight ⊙ (1 + spread·ε), bias_m = bias + spread·ε',
ε, ε' ~ N(0, 1) (the reference draws Xavier-uniform); ``spread=0`` gives the plain model.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from snens.method.ensemble import Ensemble
from snens.nn.batch_norms import MemberBatchNorm1d, MemberBatchNorm2d, MemberBatchNorm3d
from snens.nn.norms import MemberNorm, check_num_members
from snens.nn.per_example_norms import MemberGroupNorm, MemberLayerNorm, MemberRMSNorm
from snens.nn.registry import MEMBER_NORMS, is_unsupported_norm
from snens.nn.surgery import ConversionReport, replace_modules

__all__ = [
    "FILM_NORMS",
    "FiLMBatchNorm1d",
    "FiLMBatchNorm2d",
    "FiLMBatchNorm3d",
    "FiLMGroupNorm",
    "FiLMLayerNorm",
    "FiLMRMSNorm",
    "film",
    "film_norm",
]


def _check_spread(spread: float) -> float:
    if not isinstance(spread, (int, float)) or isinstance(spread, bool) or not spread >= 0:
        raise ValueError(f"spread must be a number >= 0, got {spread!r}; e.g. spread=0.5")
    if math.isinf(spread):
        raise ValueError("spread must be finite")
    return float(spread)


class _FiLM:
    """Mixed in before a :class:`~snens.nn.MemberNorm` class: gamma fixed at +∞, the affine drawn
    with ``spread``."""

    gamma: Tensor
    weight: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, *args: Any, spread: float = 0.5, **kwargs: Any) -> None:
        self.spread = _check_spread(spread)
        super().__init__(*args, **kwargs)
        gamma = self.gamma.detach()
        del self.gamma
        self.register_buffer("gamma", gamma)  # +∞: sigmoid(gamma) = 1, not trained

    def reset_parameters(self) -> None:
        """Statistics reset; weight ~ N(1, spread²), bias ~ N(0, spread²)."""
        super().reset_parameters()
        with torch.no_grad():
            self.gamma.fill_(math.inf)
        self.perturb(self.spread)

    @torch.no_grad()
    def perturb(self, spread: float, generator: torch.Generator | None = None) -> None:
        """weight ⊙= 1 + spread·ε, bias += spread·ε' with ε, ε' ~ N(0, 1) per member."""
        if spread == 0:
            return
        noise = torch.randn(self.weight.shape, generator=generator).mul_(spread).add_(1)
        self.weight.mul_(noise.to(self.weight))
        if self.bias is not None:
            noise = torch.randn(self.bias.shape, generator=generator).mul_(spread)
            self.bias.add_(noise.to(self.bias))

    def scale_and_shift(self) -> tuple[Tensor, Tensor | None]:
        """The member affine as it is: no importance scale."""
        return self.weight, self.bias

    @classmethod
    def from_plain(
        cls,
        plain: nn.Module,
        num_members: int,
        *,
        spread: float = 0.5,
        generator: torch.Generator | None = None,
    ) -> MemberNorm:
        """A FiLM norm whose members start at ``plain``, then perturbed with ``spread``."""
        member = super().from_plain(plain, num_members, spread=spread)
        member.perturb(spread, generator)
        return member

    def extra_repr(self) -> str:
        return super().extra_repr() + f", spread={self.spread}"


class FiLMBatchNorm1d(_FiLM, MemberBatchNorm1d):
    """FiLM over ``nn.BatchNorm1d``: per-member statistics and affine, no importance scale; args
    as :class:`snens.nn.MemberBatchNorm1d`'s, plus ``spread``."""


class FiLMBatchNorm2d(_FiLM, MemberBatchNorm2d):
    """FiLM over ``nn.BatchNorm2d``."""


class FiLMBatchNorm3d(_FiLM, MemberBatchNorm3d):
    """FiLM over ``nn.BatchNorm3d``."""


class FiLMLayerNorm(_FiLM, MemberLayerNorm):
    """FiLM over ``nn.LayerNorm``: one layer_norm over all rows, then the member affine."""


class FiLMGroupNorm(_FiLM, MemberGroupNorm):
    """FiLM over ``nn.GroupNorm``."""


class FiLMRMSNorm(_FiLM, MemberRMSNorm):
    """FiLM over ``nn.RMSNorm`` (a per-member scale; RMSNorm has no shift)."""


#: Plain norm type -> its FiLM counterpart (exact types, as for the member norms).
FILM_NORMS: dict[type[nn.Module], type[MemberNorm]] = {
    nn.BatchNorm1d: FiLMBatchNorm1d,
    nn.BatchNorm2d: FiLMBatchNorm2d,
    nn.BatchNorm3d: FiLMBatchNorm3d,
    nn.LayerNorm: FiLMLayerNorm,
    nn.GroupNorm: FiLMGroupNorm,
    nn.RMSNorm: FiLMRMSNorm,
}


def film_norm(
    num_members: int, norm: type[nn.Module] = nn.BatchNorm2d, **defaults: Any
) -> Callable[..., MemberNorm]:
    """A ``norm_layer=`` factory: ``film_norm(4)(64)`` builds ``FiLMBatchNorm2d(64, 4)``;
    ``defaults`` (e.g. ``eps``, ``spread``) go to every layer built.

    Returns:
        A ``functools.partial`` of the FiLM class of ``norm`` (a key of :data:`FILM_NORMS`).

    Raises:
        TypeError: a norm type with no FiLM version, or ``num_members`` not an int.
        ValueError: ``num_members`` out of range.
    """
    check_num_members(num_members)
    if norm not in FILM_NORMS:
        supported = ", ".join(t.__name__ for t in FILM_NORMS)
        raise TypeError(f"no FiLM version of {norm!r}; supported norms: {supported}")
    return functools.partial(FILM_NORMS[norm], num_members=num_members, **defaults)


def film(
    model: nn.Module,
    num_members: int,
    *,
    spread: float = 0.5,
    generator: torch.Generator | None = None,
    skip_unsupported: bool = False,
    output: Callable[[Any], Tensor] | None = None,
    inplace: bool = False,
) -> Ensemble:
    """Turn any model with norm layers into a FiLM-Ensemble of ``num_members`` members: every
    supported norm becomes a FiLM norm, perturbed with ``spread`` (0 keeps every member equal to
    ``model``) by ``generator``; ``skip_unsupported`` leaves norms with no FiLM version shared.

    Returns:
        An :class:`snens.Ensemble`, (B, …) -> (M, B, K); its ``report`` lists the converted norms.

    Raises:
        TypeError: an unsupported norm (named), unless ``skip_unsupported``.
        ValueError: no supported norm in the model; a bad ``spread``.
    """
    check_num_members(num_members)
    _check_spread(spread)
    target = model if inplace else copy.deepcopy(model)
    params_before = sum(p.numel() for p in target.parameters())
    unsupported = [(n, type(m).__name__) for n, m in target.named_modules() if _unsupported(m)]
    if unsupported and not skip_unsupported:
        listed = ", ".join(f"{n} ({t})" for n, t in unsupported[:8])
        supported = ", ".join(t.__name__ for t in FILM_NORMS)
        raise TypeError(
            f"{type(model).__name__} has norms with no FiLM version: {listed}. Supported: "
            f"{supported}. Pass skip_unsupported=True to leave them shared"
        )

    def make(name: str, module: nn.Module) -> nn.Module | None:
        cls = FILM_NORMS.get(type(module))
        if cls is None:
            return None
        return cls.from_plain(module, num_members, spread=spread, generator=generator)

    replaced = replace_modules(target, make)
    if not replaced:
        raise ValueError(
            f"{type(model).__name__} has no norm layer for FiLM to modulate (looked for "
            f"{', '.join(t.__name__ for t in FILM_NORMS)})"
        )
    report = ConversionReport(
        num_members=num_members,
        converted=tuple((n, type(old).__name__, type(new).__name__) for n, old, new in replaced),
        head=None,
        skipped=tuple(unsupported),
        params_before=params_before,
        params_after=sum(p.numel() for p in target.parameters()),
        notes=("FiLM-Ensemble: per-member norm affine without importance scale",),
    )
    return Ensemble(target, num_members, output=output, report=report)


def _unsupported(module: nn.Module) -> bool:
    # a norm σN-Ens converts but FiLM has no version of (instance norms) is refused too
    in_snens = type(module) in MEMBER_NORMS
    return type(module) not in FILM_NORMS and (in_snens or is_unsupported_norm(module))
