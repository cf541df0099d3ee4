"""Per-example member norms: LayerNorm, RMSNorm, GroupNorm and InstanceNorm with a member affine.

Their statistics are per example (per row), so members share them and differ only in their
folded affine sigmoid(gamma_m)·weight_m, sigmoid(gamma_m)·bias_m.
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
from snens.nn.plain_conversion import feature_shape, norm_eps

__all__ = [
    "MemberGroupNorm",
    "MemberInstanceNorm1d",
    "MemberInstanceNorm2d",
    "MemberInstanceNorm3d",
    "MemberLayerNorm",
    "MemberRMSNorm",
]


def _as_shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(s) for s in normalized_shape)


def _recorded_shape(plain: nn.Module) -> tuple[int, ...]:
    shape = getattr(plain, "normalized_shape", None) or feature_shape(plain)
    if shape is None:
        raise TypeError("it records no size (normalized_shape, hidden_size, …)")
    return shape


class MemberLayerNorm(MemberNorm):
    """σNorm over ``nn.LayerNorm``: one layer_norm per member's rows with its folded affine.

    Args:
        normalized_shape: trailing shape to normalize over, as in ``torch.nn.LayerNorm``.
        num_members: M.
        eps: as in ``torch.nn.LayerNorm``.
        bias: whether the member affine has a bias (default True).

    Shape:
        Input: (M·B, *, *normalized_shape), member-major. Output: same shape.
    """

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
        super().__init__(
            _as_shape(normalized_shape),
            num_members,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            device=device,
            dtype=dtype,
        )
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
        if triton_norms.applies(self, x):
            return triton_norms.forward(self, x, self.eps)
        return None

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """Layer norm of each member's rows: the first path that applies.

        0. triton, taken in ``forward``: CUDA, where :func:`snens.nn.triton_norms.applies`.
        1. fused (:func:`snens.nn.fused.member_layer_norm`): M > 1, CPU, float32/64, non-empty,
           kernels built, not traced. No native kernel takes a per-row affine.
        2. vectorized (one un-affine ``F.layer_norm``, the member affine broadcast): M > 1,
           non-empty, off the CPU (or forced).
        3. reference: everything else.
        """
        if self.num_members > 1 and x.numel() > 0:
            path = path_override(x)
            if path == "vectorized":
                return self._vectorized(x, scale, shift)
            if path is None and fused.applies(x, scale):
                return fused.member_layer_norm(
                    x, scale, shift, self.normalized_shape, self.eps, self.num_members
                )
        return self._reference(x, scale, shift)

    def _vectorized(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """One un-affine ``F.layer_norm`` over all M·B rows, then each member's affine broadcast.

        Half inputs are normalized in float32 and rounded once, after the affine, as the
        reference's kernel does; under autocast ``F.layer_norm`` picks the precision.
        """
        M = self.num_members
        widen = x.dtype in (torch.float16, torch.bfloat16) and not torch.is_autocast_enabled(
            x.device.type
        )
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
        return self._per_member(
            x,
            scale,
            shift,
            lambda rows, m, scale_m, shift_m: F.layer_norm(
                rows, self.normalized_shape, scale_m, shift_m, self.eps
            ),
        )

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        weight = plain._parameters.get("weight")
        return {
            "normalized_shape": _recorded_shape(plain),
            "eps": norm_eps(plain),
            "bias": plain._parameters.get("bias") is not None or weight is None,
        }

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = nn.LayerNorm(
            self.normalized_shape,
            eps=self.eps,
            bias=self.bias is not None,
            device=self.weight.device,
            dtype=self.weight.dtype,
        )
        return self._carrying_member(plain, member)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, num_members={self.num_members}, eps={self.eps}"


class MemberRMSNorm(MemberNorm):
    """σNorm over ``nn.RMSNorm``: the member's folded scale on x / rms(x).

    Args:
        normalized_shape: trailing shape to normalize over.
        num_members: M.
        eps: as in ``torch.nn.RMSNorm`` (None: the dtype's machine epsilon).

    Shape:
        Input: (M·B, *, *normalized_shape), member-major. Output: same shape.
    """

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
        super().__init__(
            _as_shape(normalized_shape),
            num_members,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            device=device,
            dtype=dtype,
        )
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
        """RMS norm of each member's rows: the first path that applies.

        0. triton, taken in ``forward``: CUDA, where :func:`snens.nn.triton_norms.applies`.
        1. broadcast (:meth:`_broadcast`): M > 1, x and scale both float32 or both float64, and
           not eager training on the CPU (there the broadcast product's backward costs more
           than the loop's concatenation).
        2. reference: everything else, half precision included (``rms_norm`` applies its
           weight inside its float upcast).
        """
        dtypes = (torch.float32, torch.float64)
        eager_cpu_training = (
            x.device.type == "cpu" and needs_grad(x, scale) and not custom_functions_unavailable(x)
        )
        if (
            self.num_members > 1
            and x.dtype == scale.dtype
            and x.dtype in dtypes
            and not eager_cpu_training
        ):
            return self._broadcast(x, scale)
        return self._reference(x, scale, shift)

    def _broadcast(self, x: Tensor, scale: Tensor) -> Tensor:
        """One un-weighted ``rms_norm`` over all M·B rows, times each member's scale."""
        M = self.num_members
        # in float32/64 rms_norm multiplies by its weight as a last, separate step, so this
        # is the member loop's arithmetic, op for op
        y = F.rms_norm(x, self.normalized_shape, None, self.eps).unflatten(0, (M, -1))
        ones = (1,) * (y.dim() - 1 - len(self.normalized_shape))
        return (y * scale.view(M, *ones, *self.normalized_shape)).flatten(0, 1)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        return self._per_member(
            x,
            scale,
            None,
            lambda rows, m, scale_m, _: F.rms_norm(rows, self.normalized_shape, scale_m, self.eps),
        )

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        return {"normalized_shape": _recorded_shape(plain), "eps": norm_eps(plain)}

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = nn.RMSNorm(
            self.normalized_shape, eps=self.eps, device=self.weight.device, dtype=self.weight.dtype
        )
        return self._carrying_member(plain, member)

    extra_repr = MemberLayerNorm.extra_repr


class MemberGroupNorm(MemberNorm):
    """σNorm over ``nn.GroupNorm``: one group_norm over all rows, the member affine per channel.

    Args:
        num_groups: groups to separate the channels into, as in ``torch.nn.GroupNorm``.
        num_channels: C.
        num_members: M.
        eps: as in ``torch.nn.GroupNorm``.

    Shape:
        Input: (M·B, C, *), member-major. Output: same shape.
    """

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
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {name}={value!r}")
        if num_channels % num_groups:
            raise ValueError(
                f"num_channels={num_channels} must be divisible by num_groups={num_groups}"
            )
        super().__init__(
            (num_channels,),
            num_members,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            device=device,
            dtype=dtype,
        )
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
        """Group norm of each member's rows: the first path that applies.

        1. one example (:meth:`_as_one_example`): M > 1, spatial dims, non-empty, more than one
           value per group, contiguous, not traced by ``torch.compile``/``torch.export``.
        2. reference: everything else (one value per group raises there, naming the member's
           rows; channels-last inputs cannot be viewed as one example).
        """
        per_group = self.num_channels // self.num_groups * math.prod(x.shape[2:])
        fast = x.dim() > 2 and x.numel() > 0 and per_group > 1 and x.is_contiguous()
        if self.num_members > 1 and fast and not torch.compiler.is_compiling():
            return self._as_one_example(x, scale, shift)
        return self._reference(x, scale, shift)

    def _as_one_example(self, x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
        """The (M·B, C, *) input as one example of M·B·C channels in M·B·G groups, with the
        member affine as a per-channel affine of (M·B·C,): statistics are per example, so this
        normalizes exactly as the plain layer does, in one kernel."""
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
        return self._per_member(
            x,
            scale,
            shift,
            lambda rows, m, scale_m, shift_m: F.group_norm(
                rows, self.num_groups, scale_m, shift_m, self.eps
            ),
        )

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        return {
            "num_groups": plain.num_groups,
            "num_channels": plain.num_channels,
            "eps": plain.eps,
        }

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = nn.GroupNorm(
            self.num_groups,
            self.num_channels,
            eps=self.eps,
            device=self.weight.device,
            dtype=self.weight.dtype,
        )
        return self._carrying_member(plain, member)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, num_members={self.num_members}, "
            f"eps={self.eps}"
        )


class _MemberInstanceNorm(MemberGroupNorm):
    """σNorm over ``nn.InstanceNorm{1,2,3}d``: :class:`MemberGroupNorm` with one channel per
    group, for inputs of exactly the plain layer's dimensions.

    Only instance norms without running statistics convert (the default); ``affine=False``
    starts every member's affine at the identity, and :meth:`to_plain` gives an
    ``affine=True`` layer carrying the member's.

    Args:
        num_features: C.
        num_members: M.
        eps: as in ``torch.nn.InstanceNorm2d``.

    Shape:
        Input: (M·B, C, *spatial), member-major. Output: same shape.
    """

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
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features must be an int >= 1, got num_features={num_features!r}")
        super().__init__(
            num_features,
            num_features,
            num_members,
            eps,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            device=device,
            dtype=dtype,
        )
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

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = self.plain_type(
            self.num_features,
            eps=self.eps,
            affine=True,
            device=self.weight.device,
            dtype=self.weight.dtype,
        )
        return self._carrying_member(plain, member)

    def extra_repr(self) -> str:
        return f"{self.num_features}, num_members={self.num_members}, eps={self.eps}"


class MemberInstanceNorm1d(_MemberInstanceNorm):
    """σNorm over ``nn.InstanceNorm1d``; inputs (M·B, C, L). See :class:`_MemberInstanceNorm`."""

    plain_type = nn.InstanceNorm1d
    spatial_dims = 1


class MemberInstanceNorm2d(_MemberInstanceNorm):
    """σNorm over ``nn.InstanceNorm2d``; inputs (M·B, C, H, W). See :class:`_MemberInstanceNorm`."""

    plain_type = nn.InstanceNorm2d
    spatial_dims = 2


class MemberInstanceNorm3d(_MemberInstanceNorm):
    """σNorm over ``nn.InstanceNorm3d``; inputs (M·B, C, D, H, W).

    See :class:`_MemberInstanceNorm`."""

    plain_type = nn.InstanceNorm3d
    spatial_dims = 3
