"""Member norms: M member-specific, sigmoid-scaled normalization layers (σNorm).

For member m, with its own statistics and its own affine,

    σNorm_m(x) = sigmoid(gamma_m) ⊙ (weight_m ⊙ x̂_m + bias_m)

where x̂_m is x normalized as the plain layer would normalize it. Inputs are member-major:
rows [m·B, (m+1)·B) of an (M·B, …) tensor belong to member m. The sigmoid scale and the affine
are folded into one per-member scale and shift before they touch the activations, and every
member goes through a native fused norm kernel:

* batch norms (statistics over each member's own rows): one native kernel per member writing
  straight into its slice of one preallocated output (``native_batch_norm.out``), inside an
  autograd function whose backward runs the native backward kernel per member (CPU; other
  devices take the per-member loop below until this path is checked there);
* group norm (statistics per example): one native kernel over the whole (M·B, …) tensor, viewed
  as a single example of M·B·C channels, so the per-member affine becomes a per-channel one;
* layer and RMS norm (statistics per example, but an affine over the normalized features, which
  no native kernel takes per row): one native kernel per member's rows, then a concatenation.

Each fast path equals the per-member loop of plain norms (``tests/test_norms_fast.py``). Under
``torch.compile`` the plain loop is traced instead.

Loading a plain norm's state_dict (weight of shape (C,) instead of (M, C)) into a member norm is
output-preserving: every member is set so that it reproduces the plain layer exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

__all__ = [
    "MemberBatchNorm1d",
    "MemberBatchNorm2d",
    "MemberBatchNorm3d",
    "MemberGroupNorm",
    "MemberLayerNorm",
    "MemberNorm",
    "MemberRMSNorm",
    "check_member",
    "check_num_members",
]


def check_num_members(num_members: Any) -> int:
    """Validate a member count and return it unchanged.

    Raises:
        TypeError: if ``num_members`` is not an int (bools are refused too).
        ValueError: if ``num_members < 1``.
    """
    if isinstance(num_members, bool) or not isinstance(num_members, int):
        raise TypeError(
            f"num_members must be an int, got {num_members!r} ({type(num_members).__name__}); "
            "pass a whole number such as num_members=4"
        )
    if num_members < 1:
        raise ValueError(f"num_members must be >= 1, got {num_members}; use e.g. num_members=4")
    return num_members


def check_member(member: Any, num_members: int) -> int:
    """Validate a member index against M and return it unchanged.

    Raises:
        TypeError: if ``member`` is not an int (bools are refused too).
        ValueError: if ``member`` is outside 0 <= member < num_members.
    """
    if isinstance(member, bool) or not isinstance(member, int):
        raise TypeError(f"member must be an int, got {member!r}")
    if not 0 <= member < num_members:
        raise ValueError(
            f"member {member} is out of range for num_members={num_members}; "
            f"use 0 <= member <= {num_members - 1}"
        )
    return member


class MemberNorm(nn.Module):
    """Base class of the member norms: owns gamma, the per-member affine and the state migration.

    Subclasses set ``_stat_shape`` (the shape of one member's affine, e.g. ``(C,)``) and
    implement ``_normalize(x, scale, shift)``.

    Attributes:
        gamma: importance logits, shape (M, *feature_shape); importance = sigmoid(gamma).
        weight, bias: per-member affine, shape (M, *feature_shape) (no bias for RMSNorm).
    """

    plain_type: type[nn.Module]
    has_bias: bool = True

    def __init__(
        self,
        feature_shape: Sequence[int],
        num_members: int,
        *,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.num_members = check_num_members(num_members)
        self.feature_shape = tuple(int(s) for s in feature_shape)
        for name, value in (("gamma_mean", gamma_mean), ("gamma_std", gamma_std)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a real number, got {value!r}")
        if gamma_std < 0 or not math.isfinite(gamma_std) or not math.isfinite(gamma_mean):
            raise ValueError(
                f"gamma_mean={gamma_mean} and gamma_std={gamma_std} must be finite, gamma_std >= 0"
            )
        self.gamma_mean = float(gamma_mean)
        self.gamma_std = float(gamma_std)
        factory = {"device": device, "dtype": dtype}
        shape = (self.num_members, *self.feature_shape)
        self.gamma = nn.Parameter(torch.empty(shape, **factory))
        self.weight = nn.Parameter(torch.empty(shape, **factory))
        if self.has_bias:
            self.bias = nn.Parameter(torch.empty(shape, **factory))
        else:
            self.register_parameter("bias", None)

    # -- parameters ------------------------------------------------------------------------
    def reset_parameters(self) -> None:
        """gamma ~ N(gamma_mean, gamma_std²) (asymmetric, so the regularizer has a gradient);
        weight = 1, bias = 0."""
        with torch.no_grad():
            self.gamma.normal_(self.gamma_mean, self.gamma_std)
            self.weight.fill_(1.0)
            if self.bias is not None:
                self.bias.zero_()

    def importances(self) -> Tensor:
        """sigmoid(gamma) flattened to (M, C): the per-feature importance of each member."""
        return torch.sigmoid(self.gamma).reshape(self.num_members, -1)

    def scale_and_shift(self) -> tuple[Tensor, Tensor | None]:
        """The folded per-member affine: (sigmoid(gamma)·weight, sigmoid(gamma)·bias)."""
        s = torch.sigmoid(self.gamma)
        return s * self.weight, (s * self.bias if self.bias is not None else None)

    @torch.no_grad()
    def load_plain_affine(self, weight: Tensor | None, bias: Tensor | None) -> None:
        """Set every member so that it reproduces a plain norm with this weight and bias.

        weight_m = weight / sigmoid(gamma_m), bias_m = bias / sigmoid(gamma_m), so that
        sigmoid(gamma_m)·(weight_m x̂ + bias_m) = weight x̂ + bias for every member m.
        """
        # In float64, then checked: w / sigmoid(gamma) overflows float32 below gamma ≈ -87
        # and float16 below gamma ≈ -11.
        s = torch.sigmoid(self.gamma.detach().double())
        w = torch.ones(self.feature_shape) if weight is None else weight.detach()
        new_weight = w.double().to(s.device) / s
        new_bias = None
        if self.bias is not None:
            b = torch.zeros(self.feature_shape) if bias is None else bias.detach()
            new_bias = b.double().to(s.device) / s
        limit = torch.finfo(self.weight.dtype).max
        for value in (new_weight, new_bias):
            if value is None or value.is_meta:  # meta tensors (shape-only models) hold no values
                continue
            if not (value.abs() <= limit).all():
                raise ValueError(
                    f"gamma down to {float(self.gamma.min()):.3g} (gamma_mean={self.gamma_mean!r}, "
                    f"gamma_std={self.gamma_std!r}) makes weight / sigmoid(gamma) overflow "
                    f"{self.weight.dtype}; use a larger gamma_mean (e.g. 0.0) or a smaller "
                    "gamma_std"
                )
        self.weight.copy_(new_weight)
        if new_bias is not None:
            self.bias.copy_(new_bias)

    # -- input checks ------------------------------------------------------------------------
    def _check_rows(self, x: Tensor) -> None:
        if x.dim() == 0 or x.shape[0] % self.num_members:
            rows = x.shape[0] if x.dim() else "a scalar"
            raise ValueError(
                f"{type(self).__name__} expects a member-major input of M·B rows with "
                f"M={self.num_members}, got {rows} rows (shape {tuple(x.shape)}); run the model "
                "through snens.Ensemble, which repeats (B, …) inputs to (M·B, …)"
            )

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        self._check_rows(x)
        scale, shift = self.scale_and_shift()
        return self._normalize(x, scale, shift)

    def _check_input(self, x: Tensor) -> None:
        raise NotImplementedError

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        raise NotImplementedError

    def _per_member(self, x: Tensor, normalize_chunk) -> Tensor:
        """Run ``normalize_chunk(rows, m)`` on each member's contiguous rows and concatenate.

        Every member's rows go through the native, fused norm kernel with that member's folded
        affine; the only cost over the plain layer is the concatenation of the outputs. This is
        the reference the fast paths are tested against, and the path traced under
        ``torch.compile``. Vectorized alternatives measured slower here: ``var_mean`` over
        (M, B, …) views 1.6–2.5× a plain BatchNorm, one un-affine norm call followed by a
        broadcast per-member affine 2–3×.
        """
        M = self.num_members
        if M == 1:
            return normalize_chunk(x, 0)
        # split, not x[m·B:(m+1)·B]: the backward of M slices builds M full-size zero
        # gradients and sums them (measured 1.6–2.5× a plain BatchNorm); split's backward is
        # one concatenation (1.1–1.2×).
        chunks = x.split(x.shape[0] // M)
        return torch.cat([normalize_chunk(rows, m) for m, rows in enumerate(chunks)])

    # -- state_dict migration -----------------------------------------------------------------
    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        gamma_key, weight_key = prefix + "gamma", prefix + "weight"
        if gamma_key in state_dict:
            got = state_dict[gamma_key].shape
            if tuple(got) != tuple(self.gamma.shape):
                raise ValueError(
                    f"cannot load {gamma_key} of shape {tuple(got)} into {type(self).__name__} "
                    f"with gamma {tuple(self.gamma.shape)}: the state_dict comes from an ensemble "
                    f"with num_members={got[0]}, this one has num_members={self.num_members}; "
                    f"convert with num_members={got[0]} or use snens.extract_member to get one "
                    "member as a plain model"
                )
        elif weight_key in state_dict or self._is_plain_state(state_dict, prefix):
            self._migrate_plain_state(state_dict, prefix, local_metadata)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _is_plain_state(self, state_dict, prefix) -> bool:
        return False

    def _migrate_plain_state(self, state_dict, prefix, local_metadata) -> None:
        """Rewrite a plain norm's entries in place into this layer's member layout."""
        weight = state_dict.pop(prefix + "weight", None)
        bias = state_dict.pop(prefix + "bias", None)
        expected = self.feature_shape
        for name, value in (("weight", weight), ("bias", bias)):
            if value is not None and tuple(value.shape) != expected:
                raise ValueError(
                    f"cannot load {prefix}{name} of shape {tuple(value.shape)} into "
                    f"{type(self).__name__} with feature shape {expected}; the plain layer "
                    "must have the same number of features"
                )
        self.load_plain_affine(weight, bias if self.bias is not None else None)
        state_dict[prefix + "gamma"] = self.gamma.detach().clone()
        state_dict[prefix + "weight"] = self.weight.detach().clone()
        if self.bias is not None:
            state_dict[prefix + "bias"] = self.bias.detach().clone()

    def to_plain(self, member: int) -> nn.Module:
        """A plain norm equal to member ``member`` (sigmoid(gamma) folded into its affine)."""
        raise NotImplementedError

    @classmethod
    def from_plain(
        cls, plain: nn.Module, num_members: int, *, generator: torch.Generator | None = None, **kw
    ) -> MemberNorm:
        """A member norm whose every member reproduces ``plain`` (same statistics and output).

        gamma is drawn from N(gamma_mean, gamma_std²) (``generator`` for reproducibility), then
        each member's affine is set to the plain affine divided by sigmoid(gamma_m).

        Args:
            plain: a norm of exactly ``cls.plain_type``.
            num_members: M.
            generator: optional ``torch.Generator`` for gamma.
            **kw: ``gamma_mean``, ``gamma_std``.
        """
        if type(plain) is not cls.plain_type:
            raise TypeError(
                f"{cls.__name__}.from_plain expects {cls.plain_type.__name__}, "
                f"got {type(plain).__name__}"
            )
        tensors = [*plain.parameters(recurse=False), *plain.buffers(recurse=False)]
        floats = [t for t in tensors if t.is_floating_point()]
        factory = {
            "device": tensors[0].device if tensors else None,
            "dtype": floats[0].dtype if floats else None,
        }
        member = cls(**cls._plain_config(plain), num_members=num_members, **kw, **factory)
        with torch.no_grad():
            if generator is not None:
                noise = torch.randn(member.gamma.shape, generator=generator, dtype=torch.float32)
                member.gamma.copy_(noise.mul_(member.gamma_std).add_(member.gamma_mean))
            member.load_plain_affine(plain.weight, getattr(plain, "bias", None))
            member._copy_plain_stats(plain)
        return member.train(plain.training)

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        raise NotImplementedError

    def _copy_plain_stats(self, plain: nn.Module) -> None:
        """Copy a plain norm's running statistics into every member (batch norms only)."""

    def _check_member(self, member: int) -> None:
        check_member(member, self.num_members)

    def extra_repr(self) -> str:
        return f"{self.feature_shape}, num_members={self.num_members}"


def _dense(x: Tensor) -> Tensor:
    """x itself if its memory is dense (contiguous or channels-last), else a contiguous copy."""
    if x.is_contiguous():
        return x
    if x.dim() in (4, 5):
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        if x.is_contiguous(memory_format=fmt):
            return x
    return x.contiguous()


def _member_batch_norm(x, scale, shift, running_mean, running_var, training, momentum, eps, M):
    """``native_batch_norm.out`` once per member into that member's slice of one output.

    Returns the output and the members' saved mean and invstd as two (M, C) tensors, which the
    backward needs. Called directly, without the autograd function, when no gradient is wanted
    (an eval forward). Per-member views come from one ``unbind`` each rather than M Python
    indexings: at small shapes the fixed cost of a member norm is Python's, not the kernels'.
    """
    # x: (M·B, C, *), member-major and dense; scale, shift: (M, C)
    out = torch.empty_like(x)
    # the kernel writes one (C,) row of each; on CPU they hold the parameters' dtype (float32
    # for a bf16 input with float32 parameters)
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
        # torch.native_batch_norm(out=...), not torch.ops.aten.native_batch_norm.out: the
        # same kernel at half the Python cost per call (11 vs 21 µs)
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
    """Batch norm of each member's rows, written straight into one output.

    Forward runs ``native_batch_norm.out`` once per member into that member's slice of a
    preallocated output (no concatenation: measured against a plain BatchNorm2d on a loaded
    CPU thread, eval forward 1.9× → 1.1×, forward + backward 1.18× → 1.15×); backward runs
    ``native_batch_norm_backward`` per member (its out= form is only a copy) and copies each
    member's input gradient into one preallocated gradient while it is still in cache.
    Running statistics are rows of the (M, C) buffers, updated in place by the kernel.
    """

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
    if (
        x.dim() == 4
        and not x.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last)
    ):
        return torch.channels_last
    if x.dim() == 5 and not x.is_contiguous():
        if x.is_contiguous(memory_format=torch.channels_last_3d):
            return torch.channels_last_3d
    return torch.contiguous_format


# ------------------------------------------------------------------------------------------------
# Batch norms
# ------------------------------------------------------------------------------------------------


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
        # Same convention as torch.nn.BatchNorm: momentum=None means a cumulative average.
        if not (self.training and self.track_running_stats):
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        use_batch_stats = self.training or not self.track_running_stats
        momentum = self._momentum()
        tracked = self.track_running_stats
        # CPU only: the out= kernel's saved-statistics dtypes are pinned down for CPU kernels.
        fast = x.device.type == "cpu" and x.numel() > 0 and not torch.compiler.is_compiling()
        if self.num_members > 1 and fast:
            rows = x.shape[0] // self.num_members
            if use_batch_stats and rows * math.prod(x.shape[2:]) == 1:
                # the check F.batch_norm makes on each member's rows
                raise ValueError(
                    "Expected more than 1 value per channel when training, got input size "
                    f"{torch.Size((rows, *x.shape[1:]))}"
                )
            args = (
                _dense(x),
                scale,
                shift,
                self.running_mean if tracked else None,
                self.running_var if tracked else None,
                use_batch_stats,
                momentum,
                self.eps,
                self.num_members,
            )
            needs_grad = torch.is_grad_enabled() and (
                x.requires_grad or scale.requires_grad or shift.requires_grad
            )
            if not needs_grad:
                return _member_batch_norm(*args)[0]
            return _MemberBatchNormFunction.apply(*args)
        return self._per_member(
            x,
            lambda rows, m: F.batch_norm(
                rows,
                self.running_mean[m] if tracked else None,  # a view: updated in place
                self.running_var[m] if tracked else None,
                scale[m],
                shift[m],
                use_batch_stats,
                momentum,
                self.eps,
            ),
        )

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        for key in ("running_mean", "running_var"):
            value = state_dict.get(prefix + key)
            if value is not None and value.dim() == 1 and self.track_running_stats:
                # A plain BatchNorm's running stats: every member starts from them.
                state_dict[prefix + key] = value.unsqueeze(0).expand(self.num_members, -1).clone()
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _is_plain_state(self, state_dict, prefix) -> bool:
        return prefix + "running_mean" in state_dict

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
        scale, shift = self.scale_and_shift()
        with torch.no_grad():
            plain.weight.copy_(scale[member])
            plain.bias.copy_(shift[member])
            if self.track_running_stats:
                plain.running_mean.copy_(self.running_mean[member])
                plain.running_var.copy_(self.running_var[member])
                plain.num_batches_tracked.copy_(self.num_batches_tracked)
        return plain.train(self.training)

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


# ------------------------------------------------------------------------------------------------
# Per-example norms: statistics are per row, so members differ only in their affine.
# ------------------------------------------------------------------------------------------------


def _as_shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(s) for s in normalized_shape)


class MemberLayerNorm(MemberNorm):
    """σNorm over ``nn.LayerNorm``: one layer_norm per member's rows with its folded affine.

    No native kernel takes a per-row affine over the normalized features, so the members'
    outputs are concatenated: a full extra pass over the activations, which costs about as much
    as the memory-bound norm itself (measured 1.4–1.7× a plain LayerNorm for forward +
    backward, ~2.5× for an eval forward; an un-affine whole-tensor call plus an in-place member
    affine measured the same, ``torch.compile`` slower).

    Args:
        normalized_shape: trailing shape to normalize over, as in ``torch.nn.LayerNorm``.
        num_members: M.
        eps: as in ``torch.nn.LayerNorm``.
        bias: whether the member affine has a bias (default True).

    Shape:
        Input: (M·B, *, *normalized_shape), member-major. Output: same shape.
    """

    plain_type = nn.LayerNorm

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

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        return self._per_member(
            x,
            lambda rows, m: F.layer_norm(
                rows, self.normalized_shape, scale[m], None if shift is None else shift[m], self.eps
            ),
        )

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        return {
            "normalized_shape": plain.normalized_shape,
            "eps": plain.eps,
            "bias": plain.bias is not None or plain.weight is None,
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
        scale, shift = self.scale_and_shift()
        with torch.no_grad():
            plain.weight.copy_(scale[member])
            if shift is not None:
                plain.bias.copy_(shift[member])
        return plain.train(self.training)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, num_members={self.num_members}, eps={self.eps}"


class MemberRMSNorm(MemberNorm):
    """σNorm over ``nn.RMSNorm``: one rms_norm per member's rows with its folded scale.

    RMSNorm has no bias, so member m computes sigmoid(gamma_m) ⊙ weight_m ⊙ x / rms(x).

    Args:
        normalized_shape: trailing shape to normalize over.
        num_members: M.
        eps: as in ``torch.nn.RMSNorm`` (None: the dtype's machine epsilon).

    Shape:
        Input: (M·B, *, *normalized_shape), member-major. Output: same shape.
    """

    plain_type = nn.RMSNorm
    has_bias = False

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

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        M = self.num_members
        if M > 1 and x.dtype == scale.dtype and x.dtype in (torch.float32, torch.float64):
            # In float32/64 rms_norm multiplies by its weight as a last, separate step, so one
            # un-weighted call over all rows followed by the member weights broadcast over
            # (M, B, …) is the member loop's arithmetic, op for op, without its concatenation
            # (measured eval forward 1.5× → 1.0× a plain RMSNorm). Half-precision inputs keep
            # the loop: there the weight is applied inside rms_norm's float upcast.
            y = F.rms_norm(x, self.normalized_shape, None, self.eps).unflatten(0, (M, -1))
            ones = (1,) * (y.dim() - 1 - len(self.normalized_shape))
            return (y * scale.view(M, *ones, *self.normalized_shape)).flatten(0, 1)
        return self._per_member(
            x, lambda rows, m: F.rms_norm(rows, self.normalized_shape, scale[m], self.eps)
        )

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        return {"normalized_shape": plain.normalized_shape, "eps": plain.eps}

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = nn.RMSNorm(
            self.normalized_shape, eps=self.eps, device=self.weight.device, dtype=self.weight.dtype
        )
        with torch.no_grad():
            plain.weight.copy_(self.scale_and_shift()[0][member])
        return plain.train(self.training)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, num_members={self.num_members}, eps={self.eps}"


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
        M = self.num_members
        # one value per group is an error whose message should name the member's rows: the
        # plain path raises it
        per_group = self.num_channels // self.num_groups * math.prod(x.shape[2:])
        fast = x.dim() > 2 and x.numel() > 0 and per_group > 1 and x.is_contiguous()
        if M > 1 and fast and not torch.compiler.is_compiling():
            # Statistics are per example, so the whole (M·B, C, *) tensor viewed as one example
            # of M·B·C channels in M·B·G groups normalizes exactly as the plain layer does, and
            # the member affine becomes a per-channel affine of (M·B·C,): one native kernel, no
            # concatenation (measured 1.4–1.6× → 1.0–1.1× a plain GroupNorm, forward +
            # backward). Channels-last inputs cannot be viewed so and take the member loop.
            rows = x.shape[0] // M
            per_channel = (M, rows, self.num_channels)
            scale = scale.unsqueeze(1).expand(per_channel).reshape(-1)
            shift = shift.unsqueeze(1).expand(per_channel).reshape(-1)
            y = F.group_norm(
                x.reshape(1, -1, *x.shape[2:]), x.shape[0] * self.num_groups, scale, shift, self.eps
            )
            return y.view(x.shape)
        return self._per_member(
            x, lambda rows, m: F.group_norm(rows, self.num_groups, scale[m], shift[m], self.eps)
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
        scale, shift = self.scale_and_shift()
        with torch.no_grad():
            plain.weight.copy_(scale[member])
            plain.bias.copy_(shift[member])
        return plain.train(self.training)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, num_members={self.num_members}, "
            f"eps={self.eps}"
        )
