"""Member norms for channels-first LayerNorms: layer norm over dim 1 of (B, C, *) inputs.

timm's ``LayerNorm2d`` and Hugging Face's ``ConvNextLayerNorm``
(``data_format="channels_first"``) are ``nn.LayerNorm`` subclasses that normalize (B, C, H, W)
inputs over C: permute to channels-last, layer norm, permute back. Their sources vary between
libraries and versions, so these are recognised by what they compute: a float32 copy of the
module with a random affine runs on a probe input and must equal that formula
(:func:`layer_norm_layout`). A subclass that computes layer norm over the last dimension
instead (``ConvNextLayerNorm``'s default) becomes a :class:`MemberLayerNorm`; one over dim 1 a
:class:`MemberLayerNorm2d`, converted through :func:`~snens.nn.plain_conversion.from_plain_as`;
``snens.nn.adapters`` decides which module goes where.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from snens.nn import fused
from snens.nn.norms import path_override
from snens.nn.per_example_norms import MemberLayerNorm
from snens.nn.plain_conversion import RebuildsPlain, from_plain_as, only_state

__all__ = ["MemberLayerNorm2d", "layer_norm_layout"]

Layout = Literal["channels_first", "channels_last"]


# -- recognition ---------------------------------------------------------------------------------
def layer_norm_layout(module: nn.Module) -> Layout | None:
    """Which layout an ``nn.LayerNorm`` (or subclass) over one dimension C normalizes, found by
    running its forward.

    A float32 CPU copy with a random affine (whatever the module's device and dtype, meta
    included) runs, hooks aside, on a random (2, C, 1, W) input, W ≠ C: "channels_first" if it
    equals layer norm over dim 1 (to channels-last, ``F.layer_norm``, back); else on a
    (2, 3, C) input, "channels_last" if it equals ``F.layer_norm`` over the last dim; else None
    (a forward that raises on a probe does not take that layout).
    """
    if not isinstance(module, nn.LayerNorm) or len(module.normalized_shape) != 1:
        return None
    if not only_state(module, {"weight", "bias"}):
        return None
    probe = copy.deepcopy(module).to_empty(device="cpu").float()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        if probe.weight is not None:
            probe.weight.copy_(1 + 0.5 * torch.randn(probe.weight.shape, generator=g))
        if probe.bias is not None:
            probe.bias.copy_(0.5 * torch.randn(probe.bias.shape, generator=g))
        (C,) = probe.normalized_shape

        def layer_norm(x: Tensor) -> Tensor:
            return F.layer_norm(x, (C,), probe.weight, probe.bias, probe.eps)

        channels_first = torch.randn(2, C, 1, 2 if C != 2 else 3, generator=g)
        if _computes(
            probe, channels_first, layer_norm(channels_first.movedim(1, -1)).movedim(-1, 1)
        ):
            return "channels_first"
        channels_last = torch.randn(2, 3, C, generator=g)
        if _computes(probe, channels_last, layer_norm(channels_last)):
            return "channels_last"
    return None


def _computes(module: nn.Module, x: Tensor, expected: Tensor) -> bool:
    try:
        out = type(module).forward(module, x)
    except (RuntimeError, ValueError, IndexError):
        return False
    return (
        isinstance(out, Tensor)
        and out.shape == expected.shape
        and torch.allclose(out, expected, rtol=1e-5, atol=1e-5)
    )


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
        """A member norm whose every member reproduces ``plain``, an ``nn.LayerNorm`` subclass
        that normalizes over dim 1 (see :func:`layer_norm_layout`).

        Raises:
            TypeError: if ``plain`` does not compute a channels-first layer norm.
        """
        if layer_norm_layout(plain) != "channels_first":
            raise TypeError(
                f"{cls.__name__}.from_plain expects an nn.LayerNorm subclass normalizing over "
                f"dim 1 (timm's LayerNorm2d, ConvNextLayerNorm(data_format='channels_first')); "
                f"{type(plain).__name__} does not compute one on a probe input"
            )
        return from_plain_as(cls, plain, num_members, generator=generator, **kw)

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if hasattr(plain, "data_format"):
            options["data_format"] = plain.data_format
        has_bias = plain.bias is not None or plain.weight is None
        if not has_bias:
            options["bias"] = False
        return {
            "num_channels": plain.normalized_shape[0],
            "eps": plain.eps,
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
