"""Member norms for channels-first LayerNorms (timm's ``LayerNorm2d``, ``ConvNextLayerNorm``):
layer norm over dim 1 of ``(B, C, *)`` inputs, recognized by what they compute.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from snens.nn import probe
from snens.nn.per_example_norms import MemberLayerNorm
from snens.nn.plain_conversion import RebuildsPlain, feature_shape, norm_eps

__all__ = ["MemberLayerNorm2d"]


class MemberLayerNorm2d(probe.ProbedFromPlain, RebuildsPlain, MemberLayerNorm):
    """σNorm over a channels-first LayerNorm: :class:`MemberLayerNorm` over dim 1 of
    ``(M·B, C, *)`` inputs; ``to_plain`` builds ``plain_type(C, eps=eps, **plain_options)``."""

    def __init__(
        self,
        num_channels: int,
        num_members: int,
        eps: float = 1e-6,
        bias: bool = True,
        *,
        plain_type: type[nn.Module] | None = None,
        plain_options: dict[str, Any] | None = None,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        options = dict(gamma_mean=gamma_mean, gamma_std=gamma_std, device=device, dtype=dtype)
        super().__init__(num_channels, num_members, eps, bias, **options)
        self.num_channels = num_channels
        self.plain_type = plain_type
        self.plain_options = dict(plain_options or {})

    def _check_input(self, x: Tensor) -> None:
        if x.dim() < 3 or x.shape[1] != self.num_channels:
            raise ValueError(
                f"{type(self).__name__} normalizes over {self.num_channels} channels at dim 1 of "
                f"(M·B, C, *), got input of shape {tuple(x.shape)}"
            )

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """:class:`MemberLayerNorm`'s paths on the channels-last view (M·B, *, C)."""
        y = self._fast_path(x.movedim(1, -1), scale, shift)
        return self._reference(x, scale, shift) if y is None else y.movedim(-1, 1)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        return super()._reference(x.movedim(1, -1), scale, shift).movedim(-1, 1)

    @classmethod
    def _expects(cls) -> str:
        return (
            "a layer norm normalizing over dim 1 (timm's LayerNorm2d, "
            "ConvNextLayerNorm(data_format='channels_first'))"
        )

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        shape = feature_shape(plain)
        if shape is None or len(shape) != 1:
            raise TypeError(f"it normalizes over {shape}, not one channel dimension")
        options: dict[str, Any] = {}
        if hasattr(plain, "data_format"):
            options["data_format"] = plain.data_format
        weight = plain._parameters.get("weight")
        has_bias = plain._parameters.get("bias") is not None or weight is None
        if not has_bias:
            options["bias"] = False
        return {
            "num_channels": shape[0],
            "eps": norm_eps(plain),
            "bias": has_bias,
            "plain_type": type(plain),
            "plain_options": options,
        }

    def _new_plain(self) -> nn.Module:
        return self._rebuild_plain(self.num_channels)

    def extra_repr(self) -> str:
        plain = "" if self.plain_type is None else f", plain_type={self.plain_type.__name__}"
        return f"{self.num_channels}, num_members={self.num_members}, eps={self.eps}{plain}"
