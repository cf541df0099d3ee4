"""Member norms: M member-specific, sigmoid-scaled normalization layers (σNorm).

For member m, with its own statistics and its own affine,

    σNorm_m(x) = sigmoid(gamma_m) ⊙ (weight_m ⊙ x̂_m + bias_m)

where x̂_m is x normalized as the plain layer would. Inputs are member-major: rows
[m·B, (m+1)·B) of an (M·B, …) tensor belong to member m.

Every member norm has one definition, ``_reference`` (the plain functional norm on each
member's rows, concatenated), and one dispatch, ``_normalize``, among faster paths tested equal
to it (:mod:`snens.nn.fused`, a vectorized path, :mod:`snens.nn.triton_norms`).
Loading a plain norm's state_dict into a member norm makes every member reproduce it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from snens.nn.layout import check_batch_first

__all__ = [
    "MemberNorm",
    "check_member",
    "check_num_members",
    "custom_functions_unavailable",
    "force_path",
    "forced_path",
    "needs_grad",
    "path_override",
]

#: The most members an ensemble may have: every input is repeated M times.
MAX_MEMBERS = 1024


def check_num_members(num_members: Any, *, ceiling: bool = True) -> int:
    """Validate a member count and return it unchanged (``ceiling``: refuse M above
    :data:`MAX_MEMBERS`).

    Raises:
        TypeError: if ``num_members`` is not an int (bools are refused too).
        ValueError: if ``num_members < 1``, or ``> MAX_MEMBERS`` with ``ceiling``.
    """
    if isinstance(num_members, bool) or not isinstance(num_members, int):
        raise TypeError(
            f"num_members must be an int, got {num_members!r} ({type(num_members).__name__}); "
            "pass a whole number such as num_members=4"
        )
    if num_members < 1:
        raise ValueError(f"num_members must be >= 1, got {num_members}; use e.g. num_members=4")
    if ceiling and num_members > MAX_MEMBERS:
        raise ValueError(
            f"num_members must be <= {MAX_MEMBERS}, got {num_members:,}: every input is repeated "
            "M times; use e.g. num_members=4 (the field's standard)"
        )
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


def custom_functions_unavailable(x: Tensor) -> bool:
    """Whether snens' custom autograd functions must stand aside for plain torch ops: while
    ``torch.compile`` or ``torch.export`` traces, and inside ``torch.func`` transforms."""
    return torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(x)


def needs_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd must record an op on these tensors: grad mode on and one requires grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


FORCEABLE_PATHS = ("vectorized", "reference", "triton")
_forced_path: str | None = None


@contextlib.contextmanager
def force_path(path: str) -> Iterator[None]:
    """Within the block, the member batch norms and layer norms take ``path`` on every device
    (for tests and device checks; process-wide, the innermost block wins).

    Raises:
        ValueError: if ``path`` is not one of :data:`FORCEABLE_PATHS`.
    """
    global _forced_path
    if path not in FORCEABLE_PATHS:
        raise ValueError(f"path must be one of {FORCEABLE_PATHS}, got {path!r}")
    previous, _forced_path = _forced_path, path
    try:
        yield
    finally:
        _forced_path = previous


def forced_path() -> str | None:
    """The path :func:`force_path` forces now, or None."""
    return _forced_path


def path_override(x: Tensor) -> str | None:
    """The forced ``"vectorized"`` or ``"reference"`` path, else ``"vectorized"`` off the CPU,
    else None (the CPU dispatch decides)."""
    if _forced_path in ("vectorized", "reference"):
        return _forced_path
    return None if x.device.type == "cpu" else "vectorized"


def _state(module: nn.Module, name: str) -> Tensor | None:
    value = module._parameters.get(name)
    return module._buffers.get(name) if value is None else value


class MemberNorm(nn.Module):
    """Base class of the member norms: owns gamma, the per-member affine and the state migration.

    Subclasses pass ``feature_shape`` (one member's affine, e.g. ``(C,)``) and implement
    ``_check_input`` and ``_reference``; those with fast paths override ``_normalize``.

    Attributes:
        gamma: importance logits, shape (M, *feature_shape); importance = sigmoid(gamma).
        weight, bias: per-member affine, shape (M, *feature_shape) (no bias for RMSNorm).
    """

    plain_type: type[nn.Module]
    has_bias: bool = True
    member_major: bool = True
    #: the dtype of one built from a plain module holding no floating-point tensor
    _fallback_dtype: torch.dtype | None = None
    #: added to a plain norm's weight to give its scale (1 where it stores w for 1 + w)
    _weight_offset = 0

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

    def reset_parameters(self) -> None:
        """gamma ~ N(gamma_mean, gamma_std²); weight = 1, bias = 0."""
        with torch.no_grad():
            self.gamma.normal_(self.gamma_mean, self.gamma_std)
            self.weight.fill_(1.0)
            if self.bias is not None:
                self.bias.zero_()

    def importances(self) -> Tensor:
        """sigmoid(gamma) flattened to (M, C); an FSDP2-sharded γ is gathered whole."""
        gamma = self.gamma
        if gamma.numel() == 0 and hasattr(gamma, "ds_status"):
            raise RuntimeError(
                "this member norm's γ is partitioned by DeepSpeed ZeRO-3 (empty outside its "
                "module's forward), so the diversity loss cannot read it: train with ZeRO "
                "stage 1 or 2, or shard with FSDP2 (torch.distributed.fsdp.fully_shard), whose "
                "sharded γ the loss gathers"
            )
        whole = getattr(gamma, "full_tensor", None)
        return torch.sigmoid(gamma if whole is None else whole()).reshape(self.num_members, -1)

    def scale_and_shift(self) -> tuple[Tensor, Tensor | None]:
        """The folded per-member affine: (sigmoid(gamma)·weight, sigmoid(gamma)·bias)."""
        s = torch.sigmoid(self.gamma)
        return s * self.weight, (s * self.bias if self.bias is not None else None)

    @torch.no_grad()
    def load_plain_affine(self, weight: Tensor | None, bias: Tensor | None) -> None:
        """Set every member to reproduce a plain norm: weight_m = weight / sigmoid(gamma_m), and
        bias_m likewise."""
        # in float64, then checked: w / sigmoid(gamma) overflows float32 below gamma ≈ -87
        s = torch.sigmoid(self.gamma.detach().double())

        def divided(value: Tensor | None, fill: float) -> Tensor:
            value = torch.full(self.feature_shape, fill) if value is None else value.detach()
            return value.double().to(s.device) / s

        if weight is not None and self._weight_offset:
            weight = self._weight_offset + weight.detach().double()
        new_weight = divided(weight, 1.0)
        new_bias = None if self.bias is None else divided(bias, 0.0)
        limit = torch.finfo(self.weight.dtype).max
        for value in (new_weight, new_bias):
            if value is not None and not value.is_meta and not (value.abs() <= limit).all():
                raise ValueError(
                    f"gamma down to {float(self.gamma.min()):.3g} (gamma_mean={self.gamma_mean!r}, "
                    f"gamma_std={self.gamma_std!r}) makes weight / sigmoid(gamma) overflow "
                    f"{self.weight.dtype}; use a smaller gamma_std (the default is 1.0) or a "
                    "gamma_mean nearer 0 (the default)"
                )
        self.weight.copy_(new_weight)
        if new_bias is not None:
            self.bias.copy_(new_bias)

    def _check_rows(self, x: Tensor) -> None:
        check_batch_first(self, x)
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
        fused = self._fused_forward(x)
        if fused is not None:
            return fused
        scale, shift = self.scale_and_shift()
        return self._normalize(x, scale, shift)

    def _fused_forward(self, x: Tensor) -> Tensor | None:
        return None

    def _check_input(self, x: Tensor) -> None:
        raise NotImplementedError

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        return self._reference(x, scale, shift)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        raise NotImplementedError

    def _per_member(self, x: Tensor, scale: Tensor, shift: Tensor | None, normalize) -> Tensor:
        """``normalize(rows, m, scale_m, shift_m)`` on each member's rows, concatenated."""
        M = self.num_members
        # unbind, not slices: their backward sums M full-size zero-filled gradients; not
        # split: torch.export could not keep the batch size dynamic
        scales = scale.unbind(0)
        shifts = (None,) * M if shift is None else shift.unbind(0)
        if M == 1:
            return normalize(x, 0, scales[0], shifts[0])
        chunks = x.unflatten(0, (M, -1)).unbind(0)
        return torch.cat(
            [normalize(rows, m, scales[m], shifts[m]) for m, rows in enumerate(chunks)]
        )

    #: 2: ``gamma`` and per-member rows (M, …); 1 or none recorded: the same layout.
    _version = 2
    #: Entries a plain norm of this family saves (any one of them marks its state).
    _plain_keys: tuple[str, ...] = ("weight", "bias")

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        version = local_metadata.get("version")
        if prefix + "gamma" in state_dict:
            self._check_num_members(state_dict[prefix + "gamma"], prefix + "gamma", version)
        elif any(prefix + key in state_dict for key in self._plain_keys):
            self._migrate_plain_state(state_dict, prefix, local_metadata)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _check_num_members(self, gamma: Tensor, key: str, version: int | None) -> None:
        if tuple(gamma.shape) == tuple(self.gamma.shape):
            return
        cannot = (
            f"cannot load {key} of shape {tuple(gamma.shape)} into {type(self).__name__} "
            f"with gamma {tuple(self.gamma.shape)}: "
        )
        if gamma.shape[:1] == self.gamma.shape[:1]:  # the same M: another architecture
            raise ValueError(
                f"{cannot}the same num_members ({self.num_members}), other features, so the "
                "state_dict comes from another architecture or width; build the model it was "
                "saved from"
            )
        raise ValueError(
            f"{cannot}the state_dict (version {version}) comes "
            f"from an ensemble with num_members={gamma.shape[0]}, this one has "
            f"num_members={self.num_members}; convert with num_members={gamma.shape[0]} or "
            "use snens.extract_member to get one member as a plain model"
        )

    def _migrate_plain_state(self, state_dict, prefix, local_metadata) -> None:
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
        for name in ("gamma", "weight", "bias"):
            if getattr(self, name) is not None:
                state_dict[prefix + name] = getattr(self, name).detach().clone()

    def to_plain(self, member: int) -> nn.Module:
        """A plain norm equal to member ``member`` (sigmoid(gamma) folded into its affine)."""
        check_member(member, self.num_members)
        return self._carrying_member(self._new_plain(), member)

    def _new_plain(self) -> nn.Module:
        raise NotImplementedError

    def _factory(self) -> dict[str, Any]:
        return {"device": self.weight.device, "dtype": self.weight.dtype}

    @torch.no_grad()
    def _carrying_member(self, plain: nn.Module, member: int) -> nn.Module:
        scale, shift = self.scale_and_shift()
        plain.weight.copy_(self._plain_weight(scale[member]))
        if shift is not None:
            plain.bias.copy_(shift[member])
        return plain.train(self.training)

    def _plain_weight(self, scale: Tensor) -> Tensor:
        return scale

    @classmethod
    def from_plain(
        cls, plain: nn.Module, num_members: int, *, generator: torch.Generator | None = None, **kw
    ) -> MemberNorm:
        """A member norm whose every member reproduces ``plain``, a norm of exactly
        ``cls.plain_type`` (``generator`` draws gamma; ``**kw``: ``gamma_mean``, ``gamma_std``)."""
        if type(plain) is not cls.plain_type:
            raise TypeError(
                f"{cls.__name__}.from_plain expects {cls.plain_type.__name__}, "
                f"got {type(plain).__name__}"
            )
        return cls._from_plain_config(plain, cls._plain_config(plain), num_members, generator, kw)

    @classmethod
    def _from_plain_config(cls, plain, config, num_members, generator, kw) -> MemberNorm:
        tensors = [*plain.parameters(recurse=False), *plain.buffers(recurse=False)]
        floats = [t for t in tensors if t.is_floating_point()]
        factory = {
            "device": tensors[0].device if tensors else None,
            "dtype": floats[0].dtype if floats else cls._fallback_dtype,
        }
        member = cls(**config, num_members=num_members, **kw, **factory)
        with torch.no_grad():
            member._draw_gamma(generator)
            member.load_plain_affine(*member._plain_affine(plain))
            member._copy_plain_stats(plain)
        return member.train(plain.training)

    def _plain_affine(self, plain: nn.Module) -> tuple[Tensor | None, Tensor | None]:
        return _state(plain, "weight"), _state(plain, "bias")

    def _draw_gamma(self, generator: torch.Generator | None) -> None:
        """Redraw gamma from ``generator`` (on the CPU, so a seed gives the same gamma anywhere)."""
        if generator is not None:
            noise = torch.randn(self.gamma.shape, generator=generator, dtype=torch.float32)
            self.gamma.copy_(noise.mul_(self.gamma_std).add_(self.gamma_mean))

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def refusal(cls, plain: nn.Module) -> str | None:
        """Why this class cannot reproduce ``plain`` (a setting it does not compute), or None."""
        return None

    def _copy_plain_stats(self, plain: nn.Module) -> None:
        """Copy a plain norm's running statistics (batch norms only)."""

    def extra_repr(self) -> str:
        return f"{self.feature_shape}, num_members={self.num_members}"
