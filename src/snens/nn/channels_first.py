"""Member norms for channels-first LayerNorms: layer norm over dim 1 of (B, C, *) inputs.

timm's ``LayerNorm2d``, Hugging Face's ``ConvNextLayerNorm`` (``data_format="channels_first"``)
and ``SqueezeBertLayerNorm`` normalize (B, C, *) inputs over C: permute to channels-last, layer
norm, permute back; so does a layer norm wrapped in ``x.transpose(1, 2)`` on the (N, C, W)
inputs of 1-D convolutional and audio models (its 3-D inputs decide its layout). Their sources
vary between libraries and versions; :mod:`snens.nn.registry` recognizes them by what they
compute (:mod:`snens.nn.probe`) and converts them to a :class:`MemberLayerNorm2d` through
:func:`~snens.nn.plain_conversion.from_plain_as`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from snens.nn import fused, probe
from snens.nn.norms import path_override
from snens.nn.per_example_norms import MemberLayerNorm
from snens.nn.plain_conversion import RebuildsPlain, feature_shape, from_plain_as, norm_eps

__all__ = ["MemberLayerNorm2d"]


# -- the member norm -----------------------------------------------------------------------------
class MemberLayerNorm2d(RebuildsPlain, MemberLayerNorm):
    """σNorm over a channels-first LayerNorm: layer norm over dim 1 of (M·B, C, *) inputs.

    What timm's ``LayerNorm2d`` and Hugging Face's ``ConvNextLayerNorm(data_format=
    "channels_first")`` compute, member m with its folded affine:

        y_m = F.layer_norm(x_m.movedim(1, -1), (C,), scale_m, shift_m, eps).movedim(-1, 1)

    through :class:`MemberLayerNorm`'s kernels on the channels-last view.

    Args:
        num_channels: C.
        num_members: M.
        eps: as in ``torch.nn.LayerNorm``.
        bias: whether the member affine has a bias (default True).
        plain_type, plain_options: the class ``to_plain`` rebuilds, called as
            ``plain_type(C, eps=eps, **plain_options)``; ``from_plain`` records the converted
            module's (with ``data_format`` where it has one).

    Shape:
        Input: (M·B, C, *), member-major. Output: same shape.
    """

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
        super().__init__(
            num_channels,
            num_members,
            eps,
            bias,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            device=device,
            dtype=dtype,
        )
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
        """:class:`MemberLayerNorm`'s paths, in its order and on its conditions, on the
        channels-last view (M·B, *, C).

        1. fused (:func:`snens.nn.fused.member_layer_norm` on the view): M > 1, CPU,
           float32/64 with x and scale of one dtype, non-empty, kernels built and
           ``SNENS_FUSED`` ≠ 0, neither traced by ``torch.compile``/``torch.export`` nor
           inside a ``torch.func`` transform (why: :meth:`MemberLayerNorm._normalize`).
        2. vectorized (:meth:`_vectorized` on the view): M > 1, non-empty, on any device other
           than the CPU. Unmeasured on a GPU so far: ``scripts/gpu_check.sh`` compares it with
           the reference loop.
        3. reference (:meth:`_reference`): everything else.

        :func:`snens.nn.norms.force_path` sends every input with M > 1 that is non-empty down
        path 2 or 3, on any device.
        """
        view = x.movedim(1, -1)  # (M·B, C, *) -> (M·B, *, C)
        if self.num_members > 1 and x.numel() > 0:
            path = path_override(x)
            if path == "vectorized":
                return self._vectorized(view, scale, shift).movedim(-1, 1)
            if path is None and fused.applies(view, scale):
                y = fused.member_layer_norm(
                    view, scale, shift, self.normalized_shape, self.eps, self.num_members
                )
                return y.movedim(-1, 1)
        return self._reference(x, scale, shift)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """:meth:`MemberLayerNorm._reference` (``F.layer_norm`` over C of each member's rows)
        on the channels-last view, moved back."""
        # (M·B, C, *) -> (M·B, *, C) -> normalized over C -> (M·B, C, *)
        return super()._reference(x.movedim(1, -1), scale, shift).movedim(-1, 1)

    @classmethod
    def from_plain(
        cls, plain: nn.Module, num_members: int, *, generator: torch.Generator | None = None, **kw
    ) -> MemberLayerNorm2d:
        """A member norm whose every member reproduces ``plain``, a module that normalizes
        over dim 1 on probe inputs (:func:`snens.nn.probe.match`).

        Raises:
            TypeError: if ``plain`` does not compute a channels-first layer norm.
        """
        found = probe.match(plain, [cls])
        if found is None or not found.reproduces:
            raise TypeError(
                f"{cls.__name__}.from_plain expects a layer norm normalizing over dim 1 (timm's "
                f"LayerNorm2d, ConvNextLayerNorm(data_format='channels_first')); "
                f"{type(plain).__name__} does not compute one on a probe input"
            )
        return from_plain_as(cls, plain, num_members, eps=found.eps, generator=generator, **kw)

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

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = self._rebuild_plain(self.num_channels)
        return self._carrying_member(plain, member)

    def extra_repr(self) -> str:
        plain = "" if self.plain_type is None else f", plain_type={self.plain_type.__name__}"
        return f"{self.num_channels}, num_members={self.num_members}, eps={self.eps}{plain}"
