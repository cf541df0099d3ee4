"""Member norms for Hugging Face's RMS norms and float32 layer norms.

Each member version computes one formula of :mod:`snens.nn.hf_formulas`, op for op, with
member m's folded scale sigmoid(gamma_m)·weight_m in place of the weight. A norm without a
weight starts at weight_m = 1/sigmoid(gamma_m). Gated RMS norms take the gate as a second
input, ``forward(x, gate=None)``, member-major like x.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from snens.nn import probe, triton_norms
from snens.nn.hf_formulas import (
    GATE_ACTIVATIONS,
    cohere_layer_norm,
    deberta_layer_norm,
    deepseek_unweighted_rms_norm,
    gated_rms_norm,
    gemma3n_rms_norm,
    gemma_rms_norm,
    llama_rms_norm,
    olmo2_rms_norm,
    olmo_layer_norm,
    t5_rms_norm,
    unweighted_l2_norm,
)
from snens.nn.norms import MemberNorm
from snens.nn.per_example_norms import MemberLayerNorm
from snens.nn.plain_conversion import RebuildsPlain, feature_shape, norm_eps, positive_int

__all__ = [
    "MemberCohereLayerNorm",
    "MemberDebertaLayerNorm",
    "MemberDeepseekUnweightedRMSNorm",
    "MemberGateFirstRMSNorm",
    "MemberGateFirstRMSNormF32",
    "MemberGatedRMSNorm",
    "MemberGatedRMSNormF32",
    "MemberGemma3nRMSNorm",
    "MemberGemmaRMSNorm",
    "MemberLayerNorm1P",
    "MemberLlamaRMSNorm",
    "MemberOlmo2RMSNorm",
    "MemberOlmoLayerNorm",
    "MemberT5RMSNorm",
    "MemberUnweightedL2Norm",
    "MemberUnweightedRMSNorm",
    "ScaledRMSNorm",
]


def _feature_shape(hidden_size: Any) -> tuple[int, ...]:
    sizes = hidden_size if isinstance(hidden_size, tuple | list) else (hidden_size,)
    if not sizes or not all(positive_int(s) for s in sizes):
        raise ValueError(
            f"hidden_size must be an int >= 1 (or a tuple of them), got {hidden_size!r}"
        )
    return tuple(sizes)


def _config(shape: tuple[int, ...], plain: nn.Module, plain_type: type[nn.Module]) -> dict:
    size = shape[0] if len(shape) == 1 else shape
    return {"hidden_size": size, "eps": norm_eps(plain), "plain_type": plain_type}


class _MemberHFNorm(probe.ProbedFromPlain, RebuildsPlain, MemberNorm):
    """Member m computes ``formula(x_m, sigmoid(gamma_m)·weight_m, eps)``."""

    has_bias = False
    formula: str
    norm_kind = "RMS norm"
    plain_type = None

    def __init__(
        self,
        hidden_size: int | Sequence[int],
        num_members: int,
        eps: float = 1e-6,
        *,
        plain_type: type[nn.Module] | None = None,
        gamma_mean: float = 0.0,
        gamma_std: float = 1.0,
        device=None,
        dtype=None,
    ) -> None:
        shape = _feature_shape(hidden_size)
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps):
            raise TypeError(f"eps must be a real number, got {eps!r}")
        options = dict(gamma_mean=gamma_mean, gamma_std=gamma_std, device=device, dtype=dtype)
        super().__init__(shape, num_members, **options)
        self.hidden_size = hidden_size if isinstance(hidden_size, int) else shape
        self.eps = eps
        self.plain_type = plain_type
        self.plain_options: dict[str, Any] = {}
        self.reset_parameters()

    @staticmethod
    def _norm_fn(x: Tensor, scale: Tensor, eps: float) -> Tensor:
        raise NotImplementedError

    def _formula(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        return self._norm_fn(x, scale, self.eps)

    def _check_input(self, x: Tensor) -> None:
        n = len(self.feature_shape)
        if x.dim() < n + 1 or tuple(x.shape[-n:]) != self.feature_shape:
            over = f"dimension of {self.hidden_size}" if n == 1 else f"shape {self.feature_shape}"
            raise ValueError(
                f"{type(self).__name__} normalizes over a trailing {over}, got input of shape "
                f"{tuple(x.shape)}"
            )

    def _fused_forward(self, x: Tensor) -> Tensor | None:
        return triton_norms.forward(self, x, self.eps) if triton_norms.applies(self, x) else None

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        M = self.num_members
        rows = x.unflatten(0, (M, -1))
        affine = (M, *(1,) * (rows.dim() - 1 - len(self.feature_shape)), *self.feature_shape)
        shift = None if shift is None else shift.view(affine)
        return self._formula(rows, scale.view(affine), shift).flatten(0, 1)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        return self._per_member(x, scale, shift, lambda r, _, w, b: self._formula(r, w, b))

    @classmethod
    def _expects(cls) -> str:
        return f"a module computing the Hugging Face {cls.formula} {cls.norm_kind} formula"

    @classmethod
    def _plain_config(cls, plain: nn.Module) -> dict[str, Any]:
        weight = plain._parameters.get("weight")
        if weight is None:
            raise TypeError(f"it has no weight parameter for {cls.__name__} to hold")
        return _config(tuple(weight.shape), plain, type(plain))

    def _new_plain(self) -> nn.Module:
        return self._rebuild_plain(self.hidden_size)

    def extra_repr(self) -> str:
        plain = "" if self.plain_type is None else f", plain_type={self.plain_type.__name__}"
        return f"{self.hidden_size}, num_members={self.num_members}, eps={self.eps}{plain}"


class MemberLlamaRMSNorm(_MemberHFNorm):
    """σNorm over the Llama RMS norm (``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm``, …).

    ``plain_type`` is the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.
    """

    formula = "llama"
    triton_variant = triton_norms.Variant(center=False, round_first=True, output="promoted")
    _norm_fn = staticmethod(llama_rms_norm)


class MemberT5RMSNorm(_MemberHFNorm):
    """σNorm over the T5 RMS norm (``T5LayerNorm``, ``MT5LayerNorm``, ``LongT5LayerNorm``, …)."""

    formula = "t5"
    triton_variant = triton_norms.Variant(center=False, round_first=True)
    _norm_fn = staticmethod(t5_rms_norm)


class MemberGemmaRMSNorm(_MemberHFNorm):
    """σNorm over the Gemma RMS norm (``GemmaRMSNorm``, …): a member's weight is the whole
    factor 1 + w."""

    formula = "gemma"
    triton_variant = triton_norms.Variant(center=False, round_first=False, output="input")
    _norm_fn = staticmethod(gemma_rms_norm)
    _weight_offset = 1

    def _plain_weight(self, scale: Tensor) -> Tensor:
        return scale.float() - 1


class MemberOlmo2RMSNorm(_MemberHFNorm):
    """σNorm over ``Olmo2RMSNorm``: Llama's with the cast after the product."""

    formula = "olmo2"
    triton_variant = triton_norms.Variant(center=False, round_first=False, output="input")
    _norm_fn = staticmethod(olmo2_rms_norm)


class MemberGemma3nRMSNorm(_MemberHFNorm):
    """σNorm over ``Gemma3nRMSNorm(with_scale=True)``, whose weight is a scale."""

    formula = "gemma3n"
    triton_variant = triton_norms.Variant(center=False, round_first=False, output="input")
    _norm_fn = staticmethod(gemma3n_rms_norm)


class MemberCohereLayerNorm(_MemberHFNorm):
    """σNorm over ``CohereLayerNorm``: a float32 layer norm without bias; ``hidden_size`` may
    be (H, D), as in Cohere's QK norms."""

    formula = "cohere"
    triton_variant = triton_norms.Variant(center=True, round_first=False, output="input")
    norm_kind = "layer norm"
    _norm_fn = staticmethod(cohere_layer_norm)


class MemberOlmoLayerNorm(_MemberHFNorm):
    """σNorm over OLMo-1's ``OlmoLayerNorm``, a float32 layer norm without weight or bias;
    ``to_plain`` gives a ``CohereLayerNorm``, the same formula with a weight."""

    formula = "olmo"
    triton_variant = triton_norms.Variant(center=True, round_first=False, output="input")
    norm_kind = "layer norm"
    _norm_fn = staticmethod(olmo_layer_norm)

    @classmethod
    def _plain_config(cls, plain: nn.Module) -> dict[str, Any]:
        # transformers is installed wherever an OlmoLayerNorm exists
        from transformers.models.cohere.modeling_cohere import CohereLayerNorm

        if plain._parameters.get("weight") is not None:
            raise TypeError(f"it has a weight; {cls.__name__} is for layer norms without one")
        shape = feature_shape(plain)
        if shape is None:
            raise TypeError("it records no size (normalized_shape, hidden_size, …)")
        return _config(shape, plain, CohereLayerNorm)


class MemberDebertaLayerNorm(_MemberHFNorm):
    """σNorm over ``DebertaLayerNorm``: a float32 layer norm cast back to the input's dtype,
    then the affine."""

    formula = "deberta"
    triton_variant = triton_norms.Variant(center=True, round_first=True, output="promoted")
    norm_kind = "layer norm"

    def __init__(
        self,
        hidden_size: int | Sequence[int],
        num_members: int,
        eps: float = 1e-12,
        bias: bool = True,
        **kw,
    ) -> None:
        self.has_bias = bias
        super().__init__(hidden_size, num_members, eps, **kw)

    def _formula(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        return deberta_layer_norm(x, scale, shift, self.eps)

    @classmethod
    def _plain_config(cls, plain: nn.Module) -> dict[str, Any]:
        return {**super()._plain_config(plain), "bias": plain._parameters.get("bias") is not None}


class ScaledRMSNorm(nn.Module):
    """A weightless RMS norm's formula with a weight: an extracted member of
    :class:`MemberUnweightedRMSNorm` (``hidden_size`` 1: one scale broadcast).

    ``formula``: ``"unweighted"``, ``"deepseek_unweighted"`` or ``"l2"``.
    """

    def __init__(
        self,
        hidden_size: int = 1,
        eps: float = 1e-6,
        formula: str = "unweighted",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if formula not in _UNWEIGHTED:
            raise ValueError(f"formula must be one of {sorted(_UNWEIGHTED)}, got {formula!r}")
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps = eps
        self.formula = formula

    def forward(self, x: Tensor) -> Tensor:
        return _UNWEIGHTED[self.formula]._norm_fn(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, formula={self.formula!r}"


class MemberUnweightedRMSNorm(_MemberHFNorm):
    """σNorm over a weightless RMS norm (``Llama4TextL2Norm``, ``NanoChatRMSNorm``, …).

    ``hidden_size`` None: one scale per member, broadcast over any last dimension.
    ``to_plain`` gives :class:`ScaledRMSNorm`.
    """

    formula = "unweighted"
    _norm_fn = staticmethod(olmo2_rms_norm)
    _fallback_dtype = torch.float32

    def __init__(self, hidden_size: int | None, num_members: int, eps: float = 1e-6, **kw) -> None:
        super().__init__(1 if hidden_size is None else hidden_size, num_members, eps, **kw)
        self.broadcast = hidden_size is None
        if self.broadcast:
            self.hidden_size = None
        self.plain_type = ScaledRMSNorm
        self.plain_options = {"formula": self.formula}

    def _check_input(self, x: Tensor) -> None:
        if not self.broadcast:
            return super()._check_input(x)
        if x.dim() < 2 or x.shape[-1] < 1:
            raise ValueError(
                f"{type(self).__name__} normalizes over the last dimension of inputs of two "
                f"dimensions or more, got input of shape {tuple(x.shape)}"
            )
        return None

    def _new_plain(self) -> nn.Module:
        return self._rebuild_plain(1 if self.hidden_size is None else self.hidden_size)

    @classmethod
    def _plain_config(cls, plain: nn.Module) -> dict[str, Any]:
        for name in ("weight", "bias"):
            if plain._parameters.get(name) is not None:
                raise TypeError(f"it has a {name}; {cls.__name__} is for RMS norms without one")
        shape = feature_shape(plain)
        return {
            "hidden_size": None if shape is None or len(shape) != 1 else shape[0],
            "eps": norm_eps(plain),
        }

    def _plain_affine(self, plain: nn.Module) -> tuple[None, None]:
        # FalconMamba's unused weight buffer is not what it computes with
        return None, None

    def extra_repr(self) -> str:
        size = "broadcast" if self.broadcast else self.hidden_size
        return f"{size}, num_members={self.num_members}, eps={self.eps}"

    @staticmethod
    def from_scaled(
        plain: ScaledRMSNorm,
        num_members: int,
        *,
        generator: torch.Generator | None = None,
        **kw: Any,
    ) -> MemberUnweightedRMSNorm:
        """A member norm whose every member reproduces ``plain``.

        Raises:
            TypeError: if ``plain`` is not a :class:`ScaledRMSNorm`.
        """
        if not isinstance(plain, ScaledRMSNorm):
            raise TypeError(f"from_scaled expects a ScaledRMSNorm, got {type(plain).__name__}")
        cls = _UNWEIGHTED[plain.formula]
        weight = plain.weight
        size = None if tuple(weight.shape) == (1,) else weight.shape[0]
        member = cls(size, num_members, plain.eps, **kw, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            member._draw_gamma(generator)
            member.load_plain_affine(weight, None)
        return member.train(plain.training)


class MemberDeepseekUnweightedRMSNorm(MemberUnweightedRMSNorm):
    """σNorm over DeepSeek-V4's ``DeepseekV4UnweightedRMSNorm``."""

    formula = "deepseek_unweighted"
    _norm_fn = staticmethod(deepseek_unweighted_rms_norm)


class MemberUnweightedL2Norm(MemberUnweightedRMSNorm):
    """σNorm over nGPT's weightless L2 norm (``DoryL2Norm``)."""

    formula = "l2"
    norm_kind = "L2 norm"
    _norm_fn = staticmethod(unweighted_l2_norm)


#: The weightless formulas by name: what a ScaledRMSNorm computes, and its member class.
_UNWEIGHTED = {
    cls.formula: cls
    for cls in (MemberUnweightedRMSNorm, MemberDeepseekUnweightedRMSNorm, MemberUnweightedL2Norm)
}


class _MemberGatedRMSNorm(_MemberHFNorm):
    norm_kind = "gated RMS norm"
    gate_first = False
    weight_in_float32 = False
    takes_gate = True

    def __init__(
        self,
        hidden_size: int,
        num_members: int,
        eps: float = 1e-6,
        *,
        group_size: int | None = None,
        activation: str = "silu",
        plain_options: dict[str, Any] | None = None,
        **kw,
    ) -> None:
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int):
            raise ValueError(f"hidden_size must be an int >= 1, got {hidden_size!r}")
        if group_size is not None and (not positive_int(group_size) or hidden_size % group_size):
            raise ValueError(
                f"group_size must be None or an int >= 1 dividing hidden_size={hidden_size}, "
                f"got {group_size!r}"
            )
        if activation not in GATE_ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(GATE_ACTIVATIONS)}, got {activation!r}"
            )
        super().__init__(hidden_size, num_members, eps, **kw)
        self.group_size = None if group_size == hidden_size else group_size
        self.activation = activation
        self.plain_options = dict(plain_options or {})

    def _gated(self, x: Tensor, gate: Tensor | None, scale: Tensor) -> Tensor:
        names = ("group_size", "gate_first", "activation", "weight_in_float32")
        return gated_rms_norm(x, gate, scale, self.eps, **{n: getattr(self, n) for n in names})

    def forward(self, x: Tensor, gate: Tensor | None = None) -> Tensor:  # type: ignore[override]
        self._check_input(x)
        self._check_rows(x)
        if gate is not None and (gate.dim() == 0 or gate.shape[0] != x.shape[0]):
            raise ValueError(
                f"{type(self).__name__} takes a member-major gate of the input's M·B rows, got "
                f"a gate of shape {tuple(gate.shape)} for an input of shape {tuple(x.shape)}"
            )
        scale, _ = self.scale_and_shift()
        M = self.num_members
        rows = x.unflatten(0, (M, -1))
        gates = None if gate is None else gate.unflatten(0, (M, -1))
        affine = (M, *(1,) * (rows.dim() - 2), self.hidden_size)
        return self._gated(rows, gates, scale.view(affine)).flatten(0, 1)

    def _reference(  # type: ignore[override]
        self, x: Tensor, scale: Tensor, shift: Tensor | None, gate: Tensor | None = None
    ) -> Tensor:
        M = self.num_members
        xs = x.unflatten(0, (M, -1)).unbind(0)
        gs = (None,) * M if gate is None else gate.unflatten(0, (M, -1)).unbind(0)
        return torch.cat([self._gated(xs[m], gs[m], scale[m]) for m in range(M)])

    @classmethod
    def _plain_config(cls, plain: nn.Module) -> dict[str, Any]:
        config = super()._plain_config(plain)
        size = config["hidden_size"]
        if not isinstance(size, int):
            raise TypeError(f"its weight is not 1-D; {cls.__name__} takes a 1-D weight")
        group_size = getattr(plain, "group_size", None)
        groups = getattr(plain, "n_groups", None)
        if not positive_int(group_size):
            group_size = size // groups if positive_int(groups) and size % groups == 0 else None
        activation = getattr(plain, "activation", "silu")
        if not isinstance(activation, str) or activation not in GATE_ACTIVATIONS:
            raise TypeError(f"its activation {activation!r} is none of {sorted(GATE_ACTIVATIONS)}")
        return {
            **config,
            "group_size": group_size,
            "activation": activation,
            "plain_options": _constructor_options(plain),
        }

    def to_plain(self, member: int) -> nn.Module:
        plain = super().to_plain(member)
        if isinstance(getattr(plain, "activation", None), str):
            plain.activation = self.activation
        return plain

    def extra_repr(self) -> str:
        groups = "" if self.group_size is None else f", group_size={self.group_size}"
        return f"{super().extra_repr()}{groups}, activation={self.activation!r}"


def _constructor_options(plain: nn.Module) -> dict[str, Any]:
    """``plain``'s constructor arguments after the size it keeps as plain attributes."""
    try:
        parameters = list(inspect.signature(type(plain).__init__).parameters.values())[2:]
    except (TypeError, ValueError):
        return {}
    options = {}
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("eps", "device", "dtype"):
            continue
        value = getattr(plain, p.name, None)
        if isinstance(value, int | float | str | bool) and not isinstance(value, nn.Module):
            options[p.name] = value
    return options


class MemberGatedRMSNorm(_MemberGatedRMSNorm):
    """σNorm over a gated RMS norm that normalizes, casts, weighs, then gates
    (``Qwen3NextRMSNormGated``, …).

    Args:
        group_size: features per RMS group (None: all C).
        activation: the gate's, ``"silu"`` or ``"sigmoid"``.
    """

    formula = "gated"


class MemberGatedRMSNormF32(_MemberGatedRMSNorm):
    """σNorm over a gated RMS norm weighing in float32 (``KimiLinearRMSNormGated``, …)."""

    formula = "gated, weight in float32"
    weight_in_float32 = True


class MemberGateFirstRMSNorm(_MemberGatedRMSNorm):
    """σNorm over a gated RMS norm that gates first (Mamba-2's ``MambaRMSNormGated``, …)."""

    formula = "gate first"
    gate_first = True


class MemberGateFirstRMSNormF32(_MemberGatedRMSNorm):
    """σNorm over a gated RMS norm that gates first and weighs in float32."""

    formula = "gate first, weight in float32"
    gate_first = True
    weight_in_float32 = True


class MemberLayerNorm1P(probe.ProbedFromPlain, MemberLayerNorm):
    """σNorm over a layer norm whose scale is weight + 1 (Nemotron's ``NemotronLayerNorm1P``).

    A member's weight is the whole scale. ``plain_type``: the class ``to_plain`` rebuilds (None:
    ``nn.LayerNorm`` holding the scale itself).
    """

    triton_variant = None
    _weight_offset = 1

    def __init__(self, *args, plain_type: type[nn.Module] | None = None, **kw) -> None:
        super().__init__(*args, **kw)
        self.plain_type = plain_type

    def forward(self, x: Tensor) -> Tensor:
        """As ``NemotronLayerNorm1P``: autocast off, the input and affine cast to its dtype."""
        device = x.device.type
        if not torch.is_autocast_enabled():
            with torch.autocast(device, enabled=False):
                return super().forward(x)
        dtype = torch.get_autocast_dtype(device)
        self._check_input(x)
        self._check_rows(x)
        with torch.autocast(device, enabled=False):
            scale, shift = self.scale_and_shift()
            shift = None if shift is None else shift.to(dtype)
            return self._reference(x.to(dtype), scale.to(dtype), shift)

    @classmethod
    def _expects(cls) -> str:
        return "a layer norm with the scale 1 + weight"

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        if plain._parameters.get("weight") is None:
            raise TypeError("it has no weight, so no scale 1 + weight")
        return {**MemberLayerNorm._plain_config(plain), "plain_type": type(plain)}

    def _new_plain(self) -> nn.Module:
        if self.plain_type is None:
            return super()._new_plain()
        plain = self.plain_type(self.normalized_shape, eps=self.eps, bias=self.bias is not None)
        return plain.to(**self._factory())

    def _plain_weight(self, scale: Tensor) -> Tensor:
        return scale if self.plain_type is None else scale.double() - 1
