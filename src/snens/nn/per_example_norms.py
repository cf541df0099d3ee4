"""Per-example member norms: LayerNorm, RMSNorm, GroupNorm and InstanceNorm with a member affine.

Their statistics are per row, so members differ only in their folded affine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from snens.nn import fused, triton_norms
from snens.nn.norms import MemberNorm, custom_functions_unavailable, needs_grad, path_override
from snens.nn.plain_conversion import feature_shape, norm_eps, positive_int

__all__ = [
    "MemberGroupNorm",
    "MemberInstanceNorm1d",
    "MemberInstanceNorm2d",
    "MemberInstanceNorm3d",
    "MemberLayerNorm",
    "MemberRMSNorm",
]


def _as_shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    return (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)


def _recorded_shape(plain: nn.Module) -> tuple[int, ...]:
    shape = getattr(plain, "normalized_shape", None) or feature_shape(plain)
    if shape is None:
        raise TypeError("it records no size (normalized_shape, hidden_size, …)")
    return shape


class MemberLayerNorm(MemberNorm):
    """σNorm over ``nn.LayerNorm`` (its arguments, and M): inputs ``(M·B, *, *shape)``."""

    plain_type = nn.LayerNorm
    triton_variant = triton_norms.Variant(
        center=True, round_first=False, last_dim=False, output="autocast"
    )

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        num_members: int,
        eps: float = 1e-5,
        bias: bool = True,
        *,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        self.has_bias = bias
        options = dict(gamma_mean=gamma_mean, gamma_std=gamma_std, device=device, dtype=dtype)
        super().__init__(_as_shape(normalized_shape), num_members, **options)
        self.normalized_shape = self.feature_shape
        self.eps = eps
        self.reset_parameters()

    def _check_input(self, x: Tensor) -> None:
        n = len(self.normalized_shape)
        if x.dim() < n + 1 or tuple(x.shape[-n:]) != self.normalized_shape:
            raise ValueError(
                f"{type(self).__name__} normalizes over the trailing shape "
                f"{self.normalized_shape}, got input of shape {tuple(x.shape)}"
            )

    def _fused_forward(self, x: Tensor) -> Tensor | None:
        return triton_norms.forward(self, x, self.eps) if triton_norms.applies(self, x) else None

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """The fused CPU kernel, the vectorized path off the CPU, else the reference."""
        y = self._fast_path(x, scale, shift)
        return self._reference(x, scale, shift) if y is None else y

    def _fast_path(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor | None:
        if self.num_members > 1 and x.numel() > 0:
            path = path_override(x)
            if path == "vectorized":
                return self._vectorized(x, scale, shift)
            if path is None and fused.applies(x, scale):
                return fused.member_layer_norm(
                    x, scale, shift, self.normalized_shape, self.eps, self.num_members
                )
        return None

    def _vectorized(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """One un-affine ``F.layer_norm`` over all rows, then each member's affine broadcast
        (half inputs in float32, rounded once after the affine, as the reference's kernel)."""
        M = self.num_members
        half = x.dtype in (torch.float16, torch.bfloat16)
        widen = half and not torch.is_autocast_enabled(x.device.type)
        y = F.layer_norm(x.float() if widen else x, self.normalized_shape, None, None, self.eps)
        out_dtype = x.dtype if widen else y.dtype
        y = y.unflatten(0, (M, -1))
        affine = (M, *(1,) * (y.dim() - 1 - len(self.normalized_shape)), *self.normalized_shape)
        if shift is None:
            y = y * scale.view(affine)
        else:
            y = torch.addcmul(shift.view(affine), y, scale.view(affine))
        return y.flatten(0, 1).to(out_dtype)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        shape, eps = self.normalized_shape, self.eps
        return self._per_member(
            x, scale, shift, lambda r, _, w, b: F.layer_norm(r, shape, w, b, eps)
        )

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        weight = plain._parameters.get("weight")
        return {
            "normalized_shape": _recorded_shape(plain),
            "eps": norm_eps(plain),
            "bias": plain._parameters.get("bias") is not None or weight is None,
        }

    def _new_plain(self) -> nn.Module:
        bias = self.bias is not None
        return nn.LayerNorm(self.normalized_shape, eps=self.eps, bias=bias, **self._factory())

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, num_members={self.num_members}, eps={self.eps}"


class MemberRMSNorm(MemberNorm):
    """σNorm over ``nn.RMSNorm`` (its arguments, and M): inputs ``(M·B, *, *normalized_shape)``."""

    plain_type = nn.RMSNorm
    has_bias = False
    triton_variant = triton_norms.Variant(
        center=False, round_first=True, last_dim=False, output="autocast"
    )

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        num_members: int,
        eps: float | None = None,
        *,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        options = dict(gamma_mean=gamma_mean, gamma_std=gamma_std, device=device, dtype=dtype)
        super().__init__(_as_shape(normalized_shape), num_members, **options)
        self.normalized_shape = self.feature_shape
        self.eps = eps
        self.reset_parameters()

    _check_input = MemberLayerNorm._check_input

    def _fused_forward(self, x: Tensor) -> Tensor | None:
        if triton_norms.applies(self, x):
            # eps=None: F.rms_norm's default, float32's machine epsilon (its compute dtype)
            eps = torch.finfo(torch.float32).eps if self.eps is None else self.eps
            return triton_norms.forward(self, x, eps)
        return None

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """:meth:`_broadcast` for float32/64 (not eager CPU training, where the loop's backward
        is cheaper), else the reference (half precision: ``rms_norm`` weighs inside its upcast)."""
        cpu_training = x.device.type == "cpu" and needs_grad(x, scale)
        eager_cpu_training = cpu_training and not custom_functions_unavailable(x)
        same_float = x.dtype == scale.dtype and x.dtype in (torch.float32, torch.float64)
        if self.num_members > 1 and same_float and not eager_cpu_training:
            return self._broadcast(x, scale)
        return self._reference(x, scale, shift)

    def _broadcast(self, x: Tensor, scale: Tensor) -> Tensor:
        """One un-weighted ``rms_norm`` over all rows, times each member's scale: in float32/64
        the member loop's arithmetic, op for op."""
        M = self.num_members
        y = F.rms_norm(x, self.normalized_shape, None, self.eps).unflatten(0, (M, -1))
        ones = (1,) * (y.dim() - 1 - len(self.normalized_shape))
        return (y * scale.view(M, *ones, *self.normalized_shape)).flatten(0, 1)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        shape, eps = self.normalized_shape, self.eps
        return self._per_member(x, scale, None, lambda r, _, w, b: F.rms_norm(r, shape, w, eps))

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        return {"normalized_shape": _recorded_shape(plain), "eps": norm_eps(plain)}

    def _new_plain(self) -> nn.Module:
        return nn.RMSNorm(self.normalized_shape, eps=self.eps, **self._factory())

    extra_repr = MemberLayerNorm.extra_repr


class MemberGroupNorm(MemberNorm):
    """σNorm over ``nn.GroupNorm`` (its arguments, and M): inputs ``(M·B, C, *)``."""

    plain_type = nn.GroupNorm

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        num_members: int,
        eps: float = 1e-5,
        *,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        for name, value in (("num_groups", num_groups), ("num_channels", num_channels)):
            if not positive_int(value):
                raise ValueError(f"{name} must be an int >= 1, got {name}={value!r}")
        if num_channels % num_groups:
            raise ValueError(
                f"num_channels={num_channels} must be divisible by num_groups={num_groups}"
            )
        options = dict(gamma_mean=gamma_mean, gamma_std=gamma_std, device=device, dtype=dtype)
        super().__init__((num_channels,), num_members, **options)
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.reset_parameters()

    def _check_input(self, x: Tensor) -> None:
        if x.dim() < 2 or x.shape[1] != self.num_channels:
            raise ValueError(
                f"{type(self).__name__} was built for {self.num_channels} channels at dim 1, "
                f"got input of shape {tuple(x.shape)}"
            )

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """:meth:`_as_one_example` where it can view x so, else the reference (which raises on
        one value per group)."""
        per_group = self.num_channels // self.num_groups * math.prod(x.shape[2:])
        fast = x.dim() > 2 and x.numel() > 0 and per_group > 1 and x.is_contiguous()
        if self.num_members > 1 and fast and not torch.compiler.is_compiling():
            return self._as_one_example(x, scale, shift)
        return self._reference(x, scale, shift)

    def _as_one_example(self, x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
        """The input as one example of M·B·C channels in M·B·G groups, with the member affine
        per channel: one kernel, the same statistics."""
        M = self.num_members
        rows = x.shape[0] // M
        per_channel = (M, rows, self.num_channels)
        scale = scale.unsqueeze(1).expand(per_channel).reshape(-1)
        shift = shift.unsqueeze(1).expand(per_channel).reshape(-1)
        y = F.group_norm(
            x.reshape(1, -1, *x.shape[2:]), x.shape[0] * self.num_groups, scale, shift, self.eps
        )
        return y.view(x.shape)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        groups, eps = self.num_groups, self.eps
        return self._per_member(
            x, scale, shift, lambda r, _, w, b: F.group_norm(r, groups, w, b, eps)
        )

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        return {name: getattr(plain, name) for name in ("num_groups", "num_channels", "eps")}

    def _new_plain(self) -> nn.Module:
        return nn.GroupNorm(self.num_groups, self.num_channels, eps=self.eps, **self._factory())

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, num_members={self.num_members}, "
            f"eps={self.eps}"
        )


class _MemberInstanceNorm(MemberGroupNorm):
    """σNorm over ``nn.InstanceNorm{1,2,3}d`` without running statistics: one channel per
    group; :meth:`to_plain` gives an ``affine=True`` layer."""

    plain_type: type[nn.modules.instancenorm._InstanceNorm]
    spatial_dims: int

    def __init__(
        self,
        num_features: int,
        num_members: int,
        eps: float = 1e-5,
        *,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        if not positive_int(num_features):
            raise ValueError(f"num_features must be an int >= 1, got num_features={num_features!r}")
        options = dict(gamma_mean=gamma_mean, gamma_std=gamma_std, device=device, dtype=dtype)
        super().__init__(num_features, num_features, num_members, eps, **options)
        self.num_features = num_features

    def _check_input(self, x: Tensor) -> None:
        dims = 2 + self.spatial_dims
        if x.dim() != dims or x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__} was built for (M·B, {self.num_features}, "
                f"{', '.join('*' * self.spatial_dims)}) inputs ({dims} dimensions, "
                f"{self.num_features} channels at dim 1), got input of shape {tuple(x.shape)}"
            )
        if self.training and math.prod(x.shape[2:]) == 1:
            raise ValueError(
                f"{type(self).__name__}: expected more than 1 spatial element when training, got "
                f"input of shape {tuple(x.shape)} (as torch's {self.plain_type.__name__})"
            )

    @classmethod
    def refusal(cls, plain: nn.Module) -> str | None:
        if not getattr(plain, "track_running_stats", False):
            return None
        return (
            f"{type(plain).__name__}(track_running_stats=True) normalizes by running statistics "
            "in eval mode, which the member instance norm does not keep; build the model with "
            "track_running_stats=False (the default)"
        )

    @classmethod
    def _plain_config(cls, plain: nn.Module) -> dict[str, Any]:
        reason = cls.refusal(plain)
        if reason is not None:
            raise ValueError(reason)
        return {"num_features": plain.num_features, "eps": plain.eps}

    def _new_plain(self) -> nn.Module:
        return self.plain_type(self.num_features, eps=self.eps, affine=True, **self._factory())

    def extra_repr(self) -> str:
        return f"{self.num_features}, num_members={self.num_members}, eps={self.eps}"


class MemberInstanceNorm1d(_MemberInstanceNorm):
    """σNorm over ``nn.InstanceNorm1d``; inputs (M·B, C, L)."""

    plain_type = nn.InstanceNorm1d
    spatial_dims = 1


class MemberInstanceNorm2d(_MemberInstanceNorm):
    """σNorm over ``nn.InstanceNorm2d``; inputs (M·B, C, H, W)."""

    plain_type = nn.InstanceNorm2d
    spatial_dims = 2


class MemberInstanceNorm3d(_MemberInstanceNorm):
    """σNorm over ``nn.InstanceNorm3d``; inputs (M·B, C, D, H, W)."""

    plain_type = nn.InstanceNorm3d
    spatial_dims = 3
