"""Member batch norms: per-member batch statistics and running statistics, one output.

Member m normalizes its own rows [m·B, (m+1)·B) of the member-major (M·B, C, *) input with
statistics over those rows, keeps its own running mean and variance (rows of (M, C) buffers),
and applies its folded affine sigmoid(gamma_m)·weight_m, sigmoid(gamma_m)·bias_m
(``_MemberBatchNorm._normalize`` lists the paths that compute it).
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
    """x itself if its memory is dense (contiguous or channels-last), else a contiguous copy."""
    return x.contiguous(memory_format=_memory_format(x))


def _member_batch_norm(x, scale, shift, running_mean, running_var, training, momentum, eps, M):
    """``native_batch_norm.out`` once per member into that member's slice of one output.

    Returns the output and the members' saved mean and invstd as two (M, C) tensors.
    """
    out = torch.empty_like(x)
    # on CPU these hold the parameters' dtype (float32 for a bf16 input, float32 parameters)
    save_mean, save_invstd = scale.new_empty((2, *scale.shape)).unbind(0)
    members = zip(
        _members_of(x, M),
        _members_of(out, M),
        scale.unbind(0),
        shift.unbind(0),
        _rows(running_mean, M),
        _rows(running_var, M),
        save_mean.unbind(0),
        save_invstd.unbind(0),
        strict=True,
    )
    for x_m, out_m, scale_m, shift_m, mean_m, var_m, save_mean_m, save_invstd_m in members:
        # torch.native_batch_norm(out=...): the same kernel as aten's .out at half the Python cost
        torch.native_batch_norm(
            x_m,
            scale_m,
            shift_m,
            mean_m,
            var_m,
            training,
            momentum,
            eps,
            out=(out_m, save_mean_m, save_invstd_m),
        )
    return out, (save_mean, save_invstd)


def _members_of(x: Tensor, M: int) -> Sequence[Tensor]:
    """The M members' row blocks of a member-major (M·B, …) tensor, as views."""
    return x.unflatten(0, (M, -1)).unbind(0)


def _rows(stats: Tensor | None, M: int) -> Sequence[Tensor | None]:
    return (None,) * M if stats is None else stats.unbind(0)


_BATCH_NORM_BACKWARD = torch.ops.aten.native_batch_norm_backward


class _MemberBatchNormFunction(torch.autograd.Function):
    """Batch norm of each member's rows, written straight into one output (no concatenation);
    backward copies each member's input gradient into one preallocated gradient."""

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
        members = zip(
            _members_of(grad_out, M),
            _members_of(x, M),
            scale.unbind(0),
            _rows(running_mean, M),
            _rows(running_var, M),
            save_mean.unbind(0),
            save_invstd.unbind(0),
            (None,) * M if grad_x is None else _members_of(grad_x, M),
            strict=True,
        )
        for grad_m, x_m, scale_m, mean_m, var_m, save_mean_m, save_invstd_m, grad_x_m in members:
            gx, gw, gb = _BATCH_NORM_BACKWARD(
                grad_m,
                x_m,
                scale_m,
                mean_m,
                var_m,
                save_mean_m,
                save_invstd_m,
                ctx.training,
                ctx.eps,
                mask,
            )
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
    """Batch norm with per-member batch statistics and per-member running mean/var."""

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
        super().__init__(
            (num_features,),
            num_members,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            device=device,
            dtype=dtype,
        )
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.track_running_stats = track_running_stats
        factory = {"device": device, "dtype": dtype}
        if track_running_stats:
            M = self.num_members
            self.register_buffer("running_mean", torch.zeros(M, num_features, **factory))
            self.register_buffer("running_var", torch.ones(M, num_features, **factory))
            self.register_buffer(
                "num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device)
            )
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
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
        """The running statistics' update factor, as torch.nn.BatchNorm's (None: cumulative)."""
        if not (self.training and self.track_running_stats):
            return 0.0
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """Batch norm of each member's rows: counts the batch, then the first path that applies.

        1. fused (:func:`snens.nn.fused.member_batch_norm`): M > 1, CPU, contiguous, float32/64,
           non-empty, kernels built, neither traced nor inside a ``torch.func`` transform.
        2. native out= (:func:`_member_batch_norm`, inside :class:`_MemberBatchNormFunction`
           where a gradient is wanted): the other CPU inputs with M > 1, non-empty, not traced.
        3. vectorized (:meth:`_vectorized`): M > 1, non-empty, off the CPU (traced or not).
        4. reference: everything else (M = 1, empty inputs, traced or transformed on the CPU).

        :func:`snens.nn.norms.force_path` sends non-empty inputs with M > 1 down path 3 or 4.
        """
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)  # this batch, as torch.nn.BatchNorm counts it
        if self.num_members == 1 or x.numel() == 0:
            return self._reference(x, scale, shift)
        # off the CPU the vectorized path: the out= kernel's saved-statistics dtypes are pinned
        # down for CPU kernels only
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
        """``F.batch_norm`` on each member's rows with its rows of the running statistics."""
        tracked = self.track_running_stats
        use_batch_stats = self.training or not tracked
        momentum = self._momentum()
        return self._per_member(
            x,
            scale,
            shift,
            lambda rows, m, scale_m, shift_m: F.batch_norm(
                rows,
                self.running_mean[m] if tracked else None,  # a view: updated in place
                self.running_var[m] if tracked else None,
                scale_m,
                shift_m,
                use_batch_stats,
                momentum,
                self.eps,
            ),
        )

    def _vectorized(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """Every member in one ``F.batch_norm`` call, the members stacked as channels:

            (M·B, C, *) -> (B, M·C, *) -> F.batch_norm -> (M·B, C, *)

        Channel m·C + c holds member m's channel c over its B rows, so the kernel's per-channel
        statistics, affine and running statistics (flat views, updated in place) are each
        member's.
        """
        self._check_values_per_channel(x)
        _, _, mean, var, batch_stats, momentum, eps, M = self._kernel_args(scale, shift)
        stacked = x.unflatten(0, (M, -1)).transpose(0, 1).flatten(1, 2)  # (B, M·C, *)
        y = F.batch_norm(
            stacked,
            None if mean is None else mean.view(-1),  # flat views: updated in place
            None if var is None else var.view(-1),
            scale.reshape(-1),
            None if shift is None else shift.reshape(-1),
            batch_stats,
            momentum,
            eps,
        )
        return y.unflatten(1, (M, -1)).transpose(0, 1).flatten(0, 1)  # (M·B, C, *)

    def _check_values_per_channel(self, x: Tensor) -> None:
        """The check ``F.batch_norm`` makes on each member's rows."""
        rows = x.shape[0] // self.num_members
        if (self.training or not self.track_running_stats) and rows * math.prod(x.shape[2:]) == 1:
            raise ValueError(
                "Expected more than 1 value per channel when training, got input size "
                f"{torch.Size((rows, *x.shape[1:]))}"
            )

    def _kernel_args(self, scale: Tensor, shift: Tensor | None) -> tuple:
        """The arguments after x of the fused and out= paths."""
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
        """Also the plain running statistics as every member's rows (M, C)."""
        for key in ("running_mean", "running_var"):
            value = state_dict.get(prefix + key)
            if value is not None and self.track_running_stats:
                state_dict[prefix + key] = value.unsqueeze(0).expand(self.num_members, -1).clone()
        super()._migrate_plain_state(state_dict, prefix, local_metadata)

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        return {
            "num_features": plain.num_features,
            "eps": plain.eps,
            "momentum": plain.momentum,
            "track_running_stats": plain.track_running_stats,
        }

    def _copy_plain_stats(self, plain: nn.Module) -> None:
        if self.track_running_stats and plain.running_mean is not None:
            self.running_mean.copy_(plain.running_mean.unsqueeze(0).expand_as(self.running_mean))
            self.running_var.copy_(plain.running_var.unsqueeze(0).expand_as(self.running_var))
            self.num_batches_tracked.copy_(plain.num_batches_tracked)

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = self.plain_type(
            self.num_features,
            eps=self.eps,
            momentum=self.momentum,
            affine=True,
            track_running_stats=self.track_running_stats,
            device=self.weight.device,
            dtype=self.weight.dtype,
        )
        if self.track_running_stats:
            with torch.no_grad():
                plain.running_mean.copy_(self.running_mean[member])
                plain.running_var.copy_(self.running_var[member])
                plain.num_batches_tracked.copy_(self.num_batches_tracked)
        return self._carrying_member(plain, member)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, num_members={self.num_members}, eps={self.eps}, "
            f"momentum={self.momentum}, track_running_stats={self.track_running_stats}"
        )


class MemberBatchNorm1d(_MemberBatchNorm):
    """σNorm over ``nn.BatchNorm1d``: per-member batch statistics and running mean/var.

    Args:
        num_features: C, channels of the input.
        num_members: M, ensemble members.
        eps, momentum, track_running_stats: as in ``torch.nn.BatchNorm1d``.
        gamma_mean, gamma_std: gamma ~ N(gamma_mean, gamma_std²) at reset; N(0, 1) puts the
            importances where the sigmoid is steepest, so they can move.

    Shape:
        Input: (M·B, C) or (M·B, C, L), member-major. Output: same shape.
    """

    plain_type = nn.BatchNorm1d
    _input_dims = (2, 3)


class MemberBatchNorm2d(_MemberBatchNorm):
    """σNorm over ``nn.BatchNorm2d``: per-member batch statistics and running mean/var.

    Args: as :class:`MemberBatchNorm1d`.

    Shape:
        Input: (M·B, C, H, W), member-major. Output: same shape.
    """

    plain_type = nn.BatchNorm2d
    _input_dims = (4,)


class MemberBatchNorm3d(_MemberBatchNorm):
    """σNorm over ``nn.BatchNorm3d``.

    Shape:
        Input: (M·B, C, D, H, W), member-major. Output: same shape.
    """

    plain_type = nn.BatchNorm3d
    _input_dims = (5,)
