"""Member batch norms: member m normalizes its own rows with their statistics, keeps its own
running mean and variance (rows of (M, C) buffers) and applies its folded affine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from snens.nn import fused
from snens.nn.norms import MemberNorm, custom_functions_unavailable, needs_grad, path_override

__all__ = ["MemberBatchNorm1d", "MemberBatchNorm2d", "MemberBatchNorm3d"]


def _dense(x: Tensor) -> Tensor:
    return x.contiguous(memory_format=_memory_format(x))


def _member_batch_norm(x, scale, shift, running_mean, running_var, training, momentum, eps, M):
    """``native_batch_norm.out`` once per member: the output and the saved (M, C) mean and
    invstd."""
    out = torch.empty_like(x)
    # on CPU these hold the parameters' dtype (float32 for a bf16 input, float32 parameters)
    save_mean, save_invstd = scale.new_empty((2, *scale.shape)).unbind(0)
    rows = [_rows(t, M) for t in (scale, shift, running_mean, running_var)]
    saved = [_rows(t, M) for t in (save_mean, save_invstd)]
    for *args, out_m in zip(_blocks(x, M), *rows, zip(_blocks(out, M), *saved), strict=True):
        torch.native_batch_norm(*args, training, momentum, eps, out=out_m)
    return out, (save_mean, save_invstd)


def _blocks(x: Tensor | None, M: int) -> Sequence[Tensor | None]:
    return (None,) * M if x is None else x.unflatten(0, (M, -1)).unbind(0)


def _rows(stats: Tensor | None, M: int) -> Sequence[Tensor | None]:
    return (None,) * M if stats is None else stats.unbind(0)


_BATCH_NORM_BACKWARD = torch.ops.aten.native_batch_norm_backward


class _MemberBatchNormFunction(torch.autograd.Function):
    """:func:`_member_batch_norm` with a backward writing into one preallocated gradient."""

    @staticmethod
    def forward(ctx, x, scale, shift, running_mean, running_var, training, momentum, eps, M):
        out, saved = _member_batch_norm(
            x, scale, shift, running_mean, running_var, training, momentum, eps, M
        )
        ctx.M, ctx.training, ctx.eps = M, training, eps
        stats = [] if running_mean is None else [running_mean, running_var]
        ctx.save_for_backward(x, scale, *saved, *stats)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x, scale, save_mean, save_invstd, *stats = ctx.saved_tensors
        M = ctx.M
        running_mean, running_var = stats if stats else (None, None)
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
        grad_out = grad_out.contiguous(memory_format=_memory_format(x))
        grad_x = torch.empty_like(x) if mask[0] else None
        grad_scale, grad_shift = [], []
        rows = [_rows(t, M) for t in (scale, running_mean, running_var, save_mean, save_invstd)]
        members = zip(_blocks(grad_out, M), _blocks(x, M), *rows, _blocks(grad_x, M), strict=True)
        for *args, grad_x_m in members:
            gx, gw, gb = _BATCH_NORM_BACKWARD(*args, ctx.training, ctx.eps, mask)
            if grad_x_m is not None:
                grad_x_m.copy_(gx)
            grad_scale.append(gw)
            grad_shift.append(gb)
        return (
            grad_x,
            torch.stack(grad_scale) if mask[1] else None,
            torch.stack(grad_shift) if mask[2] else None,
            *[None] * 6,
        )


def _memory_format(x: Tensor) -> torch.memory_format:
    if not x.is_contiguous() and x.dim() in (4, 5):
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        if x.is_contiguous(memory_format=fmt):
            return fmt
    return torch.contiguous_format


class _MemberBatchNorm(MemberNorm):
    _input_dims: tuple[int, ...]

    def __init__(
        self,
        num_features: int,
        num_members: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        track_running_stats: bool = True,
        *,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        options = dict(gamma_mean=gamma_mean, gamma_std=gamma_std, device=device, dtype=dtype)
        super().__init__((num_features,), num_members, **options)
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.track_running_stats = track_running_stats
        factory, on = {"device": device, "dtype": dtype}, track_running_stats
        shape = (self.num_members, num_features)
        self.register_buffer("running_mean", torch.zeros(shape, **factory) if on else None)
        self.register_buffer("running_var", torch.ones(shape, **factory) if on else None)
        count = torch.tensor(0, dtype=torch.long, device=device) if on else None
        self.register_buffer("num_batches_tracked", count)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        super().reset_parameters()

    def _check_input(self, x: Tensor) -> None:
        if x.dim() not in self._input_dims:
            raise ValueError(
                f"{type(self).__name__} expects a {' or '.join(map(str, self._input_dims))}D "
                f"input, got shape {tuple(x.shape)}"
            )
        if x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__} was built for {self.num_features} channels, got input "
                f"of shape {tuple(x.shape)} with {x.shape[1]} at dim 1"
            )

    def _momentum(self) -> float:
        if not (self.training and self.track_running_stats):
            return 0.0
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """Counts the batch, then: the fused CPU kernel, the native out= kernel on the other
        CPU inputs, the vectorized path off the CPU, else the reference."""
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)  # this batch, as torch.nn.BatchNorm counts it
        if self.num_members == 1 or x.numel() == 0:
            return self._reference(x, scale, shift)
        path = path_override(x)
        if path == "vectorized":
            return self._vectorized(x, scale, shift)
        if path == "reference" or custom_functions_unavailable(x):
            return self._reference(x, scale, shift)
        self._check_values_per_channel(x)
        args = self._kernel_args(scale, shift)
        if fused.applies_batch_norm(x, scale):
            return fused.member_batch_norm(x, *args)
        if not needs_grad(x, scale, shift):
            return _member_batch_norm(_dense(x), *args)[0]
        return _MemberBatchNormFunction.apply(_dense(x), *args)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        _, _, mean, var, batch_stats, momentum, eps, _ = self._kernel_args(scale, shift)

        def normalize(rows: Tensor, m: int, scale_m: Tensor, shift_m: Tensor | None) -> Tensor:
            stats = (None, None) if mean is None else (mean[m], var[m])  # views: updated in place
            return F.batch_norm(rows, *stats, scale_m, shift_m, batch_stats, momentum, eps)

        return self._per_member(x, scale, shift, normalize)

    def _vectorized(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """Every member in one ``F.batch_norm`` call, the members stacked as channels:
        (M·B, C, *) -> (B, M·C, *) -> (M·B, C, *)."""
        self._check_values_per_channel(x)
        _, _, mean, var, batch_stats, momentum, eps, M = self._kernel_args(scale, shift)
        stacked = x.unflatten(0, (M, -1)).transpose(0, 1).flatten(1, 2)  # (B, M·C, *)
        # flat views of the running statistics: updated in place
        flat = [None if t is None else t.reshape(-1) for t in (mean, var, scale, shift)]
        y = F.batch_norm(stacked, *flat, batch_stats, momentum, eps)
        return y.unflatten(1, (M, -1)).transpose(0, 1).flatten(0, 1)  # (M·B, C, *)

    def _check_values_per_channel(self, x: Tensor) -> None:
        rows = x.shape[0] // self.num_members
        if (self.training or not self.track_running_stats) and rows * math.prod(x.shape[2:]) == 1:
            raise ValueError(
                "Expected more than 1 value per channel when training, got input size "
                f"{torch.Size((rows, *x.shape[1:]))}"
            )

    def _kernel_args(self, scale: Tensor, shift: Tensor | None) -> tuple:
        tracked = self.track_running_stats
        return (
            scale,
            shift,
            self.running_mean if tracked else None,
            self.running_var if tracked else None,
            self.training or not tracked,
            self._momentum(),
            self.eps,
            self.num_members,
        )

    # a plain batch norm with affine=False saves only its running statistics
    _plain_keys = ("weight", "bias", "running_mean", "running_var")

    def _migrate_plain_state(self, state_dict, prefix, local_metadata) -> None:
        for key in ("running_mean", "running_var"):
            value = state_dict.get(prefix + key)
            if value is not None and self.track_running_stats:
                state_dict[prefix + key] = value.unsqueeze(0).expand(self.num_members, -1).clone()
        super()._migrate_plain_state(state_dict, prefix, local_metadata)

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        names = ("num_features", "eps", "momentum", "track_running_stats")
        return {name: getattr(plain, name) for name in names}

    def _copy_plain_stats(self, plain: nn.Module) -> None:
        if self.track_running_stats and plain.running_mean is not None:
            self.running_mean.copy_(plain.running_mean.unsqueeze(0).expand_as(self.running_mean))
            self.running_var.copy_(plain.running_var.unsqueeze(0).expand_as(self.running_var))
            self.num_batches_tracked.copy_(plain.num_batches_tracked)

    def _new_plain(self) -> nn.Module:
        tracked = self.track_running_stats
        options = {"momentum": self.momentum, "affine": True, "track_running_stats": tracked}
        return self.plain_type(self.num_features, eps=self.eps, **options, **self._factory())

    @torch.no_grad()
    def _carrying_member(self, plain: nn.Module, member: int) -> nn.Module:
        if self.track_running_stats:
            plain.running_mean.copy_(self.running_mean[member])
            plain.running_var.copy_(self.running_var[member])
            plain.num_batches_tracked.copy_(self.num_batches_tracked)
        return super()._carrying_member(plain, member)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, num_members={self.num_members}, eps={self.eps}, "
            f"momentum={self.momentum}, track_running_stats={self.track_running_stats}"
        )


class MemberBatchNorm1d(_MemberBatchNorm):
    """σNorm over ``nn.BatchNorm1d`` (its arguments, and M): inputs (M·B, C) or (M·B, C, L)."""

    plain_type = nn.BatchNorm1d
    _input_dims = (2, 3)


class MemberBatchNorm2d(_MemberBatchNorm):
    """σNorm over ``nn.BatchNorm2d``: inputs (M·B, C, H, W), member-major."""

    plain_type = nn.BatchNorm2d
    _input_dims = (4,)


class MemberBatchNorm3d(_MemberBatchNorm):
    """σNorm over ``nn.BatchNorm3d``: inputs (M·B, C, D, H, W), member-major."""

    plain_type = nn.BatchNorm3d
    _input_dims = (5,)
