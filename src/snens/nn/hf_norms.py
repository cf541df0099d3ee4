"""Member norms for Hugging Face's RMS norms and float32 layer norms.

Each member version computes one formula of :mod:`snens.nn.hf_formulas`, op for op, with
member m's folded scale sigmoid(gamma_m)·weight_m in place of the weight (for Gemma in place of
the whole factor 1 + weight), so every member reproduces the plain module in every dtype, up to
the rounding of that folded scale (none in float32 beyond 1e-6). :mod:`snens.nn.registry` finds
the one that reproduces a module (:func:`snens.nn.probe.match`) and converts it through
:func:`~snens.nn.plain_conversion.from_plain_as`; each class's ``from_plain`` checks the same.

A norm without a weight converts as torch's do with ``elementwise_affine=False``: the member
affine starts at the identity, weight_m = 1/sigmoid(gamma_m). OLMo-1's ``OlmoLayerNorm`` has no
weight to hold a member's, so its member's ``to_plain`` gives the Hugging Face class that is
that float32 layer norm with a weight, ``CohereLayerNorm``. ``Gemma3nRMSNorm(with_scale=False)``
does not record its size, and neither do Llama 4's and NanoChat's weightless QK norms: their
member version, :class:`MemberUnweightedRMSNorm`, holds one scale per member (shape (M, 1),
starting at 1), broadcast over whatever last dimension it normalizes; one that records its size
gets a scale per feature.

The gated RMS norms of hybrid and linear-attention models (Qwen3-Next, Qwen3.5, OLMo-hybrid,
Kimi-Linear, Mamba-2, Bamba, Zamba2, Nemotron-H, Falcon-H1) take the gate as a second input;
their member versions take it too, ``forward(x, gate=None)``, member-major like x, and compute
:func:`~snens.nn.hf_formulas.gated_rms_norm` in the order of their class (gate before or after
the norm, the weight in float32 or after the cast). Nemotron's ``NemotronLayerNorm1P`` (scale
1 + w) converts to :class:`MemberLayerNorm1P`, every path of ``MemberLayerNorm``'s.
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
from snens.nn.plain_conversion import RebuildsPlain, feature_shape, from_plain_as, norm_eps

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
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(
            f"hidden_size must be an int >= 1 (or a tuple of them), got {hidden_size!r}"
        )
    return tuple(sizes)


class _MemberHFNorm(RebuildsPlain, MemberNorm):
    """Shared body of the member versions of Hugging Face's norms.

    Member m computes ``formula(x_m, scale_m, eps)`` with its folded scale
    sigmoid(gamma_m)·weight_m (and its folded shift, for DeBERTa's) (:meth:`_reference`);
    ``_normalize`` computes all members at once, the (M·B, …, C) input viewed as (M, B, …, C)
    and the scales as (M, 1, …, C), which is each member's formula elementwise.
    """

    has_bias = False
    #: the formula's name, as in :mod:`snens.nn.hf_formulas`
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
        super().__init__(
            shape,
            num_members,
            gamma_mean=gamma_mean,
            gamma_std=gamma_std,
            device=device,
            dtype=dtype,
        )
        self.hidden_size = hidden_size if isinstance(hidden_size, int) else shape
        self.eps = eps
        self.plain_type = plain_type
        self.plain_options: dict[str, Any] = {}
        self.reset_parameters()

    # the formula's function; not named _apply, which is nn.Module's (.to() and .float() call
    # it on every submodule)
    @staticmethod
    def _norm_fn(x: Tensor, scale: Tensor, eps: float) -> Tensor:
        raise NotImplementedError

    def _formula(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """The formula with a folded scale (and shift, for the classes with a bias)."""
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
        if triton_norms.applies(self, x):
            return triton_norms.forward(self, x, self.eps)
        return None

    def _normalize(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """The formula once, over (M, B, …, C) with the member scales broadcast as
        (M, 1, …, C). Its reductions are over C, row by row, so this is :meth:`_reference`'s
        arithmetic elementwise, without the per-member calls and the concatenation.

        Before it, in ``forward``, path 0: the Triton kernels (:mod:`snens.nn.triton_norms`,
        each class's ``triton_variant``) on CUDA, float32/bf16/fp16 with the parameters of
        x's dtype, where :func:`snens.nn.triton_norms.applies` lists. Why: the formula's ops,
        the folding and their backward are ~8 launches where the plain norm's are ~6 (H200,
        LlamaRMSNorm at (M·B·T, 576), bf16: 1.32× the plain norm)."""
        M = self.num_members
        rows = x.unflatten(0, (M, -1))  # (M·B, …, C) -> (M, B, …, C)
        affine = (M, *(1,) * (rows.dim() - 1 - len(self.feature_shape)), *self.feature_shape)
        shift = None if shift is None else shift.view(affine)
        return self._formula(rows, scale.view(affine), shift).flatten(0, 1)

    def _reference(self, x: Tensor, scale: Tensor, shift: Tensor | None) -> Tensor:
        """The formula on each member's rows with its folded scale, concatenated."""
        return self._per_member(
            x, scale, shift, lambda rows, m, scale_m, shift_m: self._formula(rows, scale_m, shift_m)
        )

    @classmethod
    def from_plain(
        cls, plain: nn.Module, num_members: int, *, generator: torch.Generator | None = None, **kw
    ) -> MemberNorm:
        """A member norm whose every member reproduces ``plain``, a module computing this
        class's formula: on probe inputs, in float32 and half precision
        (:func:`snens.nn.probe.match`).

        Raises:
            TypeError: if ``plain`` does not compute it.
        """
        found = probe.match(plain, [cls])
        if found is None or not found.reproduces:
            why = probe.unprobeable(plain) or (
                "it computes something else"
                if found is None
                else f"{found.worst_setting} differs by {found.worst:.3g}× the tolerance"
            )
            raise TypeError(
                f"{cls.__name__}.from_plain expects a module computing the Hugging Face "
                f"{cls.formula} {cls.norm_kind} formula; {type(plain).__name__} is not one "
                f"(on probe inputs: {why})"
            )
        return from_plain_as(cls, plain, num_members, eps=found.eps, generator=generator, **kw)

    @classmethod
    def _plain_config(cls, plain: nn.Module) -> dict[str, Any]:
        weight = plain._parameters.get("weight")
        if weight is None:
            raise TypeError(f"it has no weight parameter for {cls.__name__} to hold")
        shape = tuple(weight.shape)
        return {
            "hidden_size": shape[0] if len(shape) == 1 else shape,
            "eps": norm_eps(plain),
            "plain_type": type(plain),
        }

    def _plain_weight(self, scale: Tensor) -> Tensor:
        """The plain module's weight that computes ``scale`` (one member's folded scale)."""
        return scale

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = self._rebuild_plain(self.hidden_size)
        scale, shift = self.scale_and_shift()
        with torch.no_grad():
            plain.weight.copy_(self._plain_weight(scale[member]))
            if shift is not None:
                plain.bias.copy_(shift[member])
        return plain.train(self.training)

    def extra_repr(self) -> str:
        plain = "" if self.plain_type is None else f", plain_type={self.plain_type.__name__}"
        return f"{self.hidden_size}, num_members={self.num_members}, eps={self.eps}{plain}"


# -- RMS norms --------------------------------------------------------------------------------
class MemberLlamaRMSNorm(_MemberHFNorm):
    """σNorm over the Llama RMS norm (``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm``, …).

    Member m computes :func:`~snens.nn.hf_formulas.llama_rms_norm` with its folded scale:
    sigmoid(gamma_m)·weight_m ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype).

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``variance_epsilon``.
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "llama"
    triton_variant = triton_norms.Variant(center=False, round_first=True, output="promoted")
    _norm_fn = staticmethod(llama_rms_norm)


class MemberT5RMSNorm(_MemberHFNorm):
    """σNorm over the T5 RMS norm (``T5LayerNorm``, ``MT5LayerNorm``, ``LongT5LayerNorm``, …).

    Member m computes :func:`~snens.nn.hf_formulas.t5_rms_norm` with its folded scale: no mean
    subtraction, the variance in float32, the normalized input cast to the parameters' dtype if
    that is half.

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``variance_epsilon``.
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "t5"
    triton_variant = triton_norms.Variant(center=False, round_first=True)
    _norm_fn = staticmethod(t5_rms_norm)


class MemberGemmaRMSNorm(_MemberHFNorm):
    """σNorm over the Gemma RMS norm (``GemmaRMSNorm``, ``Gemma2RMSNorm``, …).

    The plain module multiplies by 1 + weight in float32; a member's weight is that whole
    factor, so member m computes :func:`~snens.nn.hf_formulas.gemma_rms_norm` with factor
    sigmoid(gamma_m)·weight_m. A plain weight w (from a module or a state_dict) is loaded as the
    factor 1 + w, and ``to_plain`` gives back w = factor − 1.

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``eps``.
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "gemma"
    triton_variant = triton_norms.Variant(center=False, round_first=False, output="input")
    _norm_fn = staticmethod(gemma_rms_norm)

    @torch.no_grad()
    def load_plain_affine(self, weight: Tensor | None, bias: Tensor | None) -> None:
        factor = None if weight is None else 1 + weight.detach().double()
        super().load_plain_affine(factor, None)

    def _plain_weight(self, scale: Tensor) -> Tensor:
        return scale.float() - 1


class MemberOlmo2RMSNorm(_MemberHFNorm):
    """σNorm over the OLMo-2 RMS norm (``Olmo2RMSNorm``): Llama's with the cast after the product.

    Member m computes :func:`~snens.nn.hf_formulas.olmo2_rms_norm` with its folded scale:
    (sigmoid(gamma_m)·weight_m ⊙ x_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype).

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``variance_epsilon``.
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "olmo2"
    triton_variant = triton_norms.Variant(center=False, round_first=False, output="input")
    _norm_fn = staticmethod(olmo2_rms_norm)


class MemberGemma3nRMSNorm(_MemberHFNorm):
    """σNorm over ``Gemma3nRMSNorm(with_scale=True)``, whose weight is a scale (not Gemma's
    offset from 1) and whose inverse root is ``torch.pow(·, −0.5)``.

    Member m computes :func:`~snens.nn.hf_formulas.gemma3n_rms_norm` with its folded scale:
    (x_f32 · pow(mean(x_f32²) + eps, −0.5) ⊙ sigmoid(gamma_m)·weight_m).to(x.dtype).

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``eps``.
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "gemma3n"
    triton_variant = triton_norms.Variant(center=False, round_first=False, output="input")
    _norm_fn = staticmethod(gemma3n_rms_norm)


# -- layer norms ------------------------------------------------------------------------------
class MemberCohereLayerNorm(_MemberHFNorm):
    """σNorm over ``CohereLayerNorm``: a mean-centred layer norm in float32 with a float32
    weight and no bias, over the last dimension.

    Member m computes :func:`~snens.nn.hf_formulas.cohere_layer_norm` with its folded scale. The
    weight may be (H, D), as in Cohere's QK norms, normalizing each head's D features.

    Args:
        hidden_size: C, or (H, D).
        num_members: M.
        eps: the plain module's ``variance_epsilon``.
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(hidden_size, eps=eps)``.

    Shape:
        Input: (M·B, *, *hidden_size), member-major. Output: same shape.
    """

    formula = "cohere"
    triton_variant = triton_norms.Variant(center=True, round_first=False, output="input")
    norm_kind = "layer norm"
    _norm_fn = staticmethod(cohere_layer_norm)


class MemberOlmoLayerNorm(_MemberHFNorm):
    """σNorm over OLMo-1's ``OlmoLayerNorm``, a float32 layer norm without weight or bias.

    Member m computes :func:`~snens.nn.hf_formulas.olmo_layer_norm`, ``OlmoLayerNorm``'s ops
    followed by its folded scale sigmoid(gamma_m)·weight_m in float32, before the one cast. At
    conversion weight_m = 1/sigmoid(gamma_m), so every member reproduces the plain module up to
    the rounding of that scale (measured ≤ 2.4e-7 in float32 at unit scale; in bfloat16 and
    float16 the same bits for all 7,680 values measured); the weights are built in float32,
    the precision ``OlmoLayerNorm`` computes in, and then train apart. A plain
    ``OlmoLayerNorm`` has no state to load: ``load_state_dict`` of a plain checkpoint reports
    this module's ``gamma`` and ``weight`` missing (``strict=False`` keeps them).

    ``to_plain`` cannot give back an ``OlmoLayerNorm``, which holds no weight; it gives
    ``CohereLayerNorm``, Hugging Face's float32 layer norm with a weight (the same formula as
    explicit ops: ≤ 1e-6 apart in float32, measured ≤ 7.2e-7 at unit scale). An extracted
    member is therefore no longer an OLMo-1 checkpoint: ``from_pretrained`` of its saved
    weights would drop the norm weights.

    Args:
        hidden_size: C.
        num_members: M.
        eps: 1e-5, the constant of ``OlmoLayerNorm``'s forward (found by the probe).
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``
            (``from_plain`` records ``CohereLayerNorm``).

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

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
        return {
            "hidden_size": shape[0] if len(shape) == 1 else shape,
            "eps": norm_eps(plain),
            "plain_type": CohereLayerNorm,
        }


class MemberDebertaLayerNorm(_MemberHFNorm):
    """σNorm over ``DebertaLayerNorm``: a mean-centred layer norm in float32, cast back to the
    input's dtype, then the affine (Llama's order), over the last dimension.

    Member m computes :func:`~snens.nn.hf_formulas.deberta_layer_norm` with its folded scale
    and shift: sigmoid(gamma_m)·weight_m ⊙ ((x_f32 − μ) / sqrt(var + eps)).to(x.dtype)
    + sigmoid(gamma_m)·bias_m.

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``variance_epsilon``.
        bias: whether the member affine has a bias (default True).
        plain_type: the class ``to_plain`` rebuilds as ``plain_type(C, eps=eps)``.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

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


# -- weightless RMS norms ---------------------------------------------------------------------
class ScaledRMSNorm(nn.Module):
    """A weightless RMS norm's formula with a weight: what a member of
    :class:`MemberUnweightedRMSNorm` becomes (``extract_member``), since the weightless class
    has no weight to hold the member's scale.

    Computes ``formula(x, weight, eps)``, :func:`~snens.nn.hf_formulas.olmo2_rms_norm`
    (``"unweighted"``), :func:`~snens.nn.hf_formulas.deepseek_unweighted_rms_norm`
    (``"deepseek_unweighted"``) or :func:`~snens.nn.hf_formulas.unweighted_l2_norm`
    (``"l2"``); with weight 1, the weightless norm itself.

    Args:
        hidden_size: C, or 1 for one scale broadcast over any last dimension.
        eps: the eps of the formula.
        formula: ``"unweighted"``, ``"deepseek_unweighted"`` or ``"l2"``.
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
        if formula not in _UNWEIGHTED_FORMULAS:
            raise ValueError(
                f"formula must be one of {sorted(_UNWEIGHTED_FORMULAS)}, got {formula!r}"
            )
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps = eps
        self.formula = formula

    def forward(self, x: Tensor) -> Tensor:
        return _UNWEIGHTED_FORMULAS[self.formula](x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, formula={self.formula!r}"


_UNWEIGHTED_FORMULAS = {
    "unweighted": olmo2_rms_norm,
    "deepseek_unweighted": deepseek_unweighted_rms_norm,
    "l2": unweighted_l2_norm,
}


class MemberUnweightedRMSNorm(_MemberHFNorm):
    """σNorm over a weightless RMS norm (``Llama4TextL2Norm``, ``NanoChatRMSNorm``,
    ``FalconMambaWeightlessRMSNorm``, ``Gemma3nRMSNorm(with_scale=False)``): x̂.type_as(x).

    Member m computes :func:`~snens.nn.hf_formulas.olmo2_rms_norm` with its folded scale
    sigmoid(gamma_m)·weight_m, in float32, cast once: the plain module is weight 1, so at
    conversion weight_m = 1/sigmoid(gamma_m) and every member reproduces it up to the rounding
    of that scale (float32: ≤ 1 ulp of the scale; in half precision the probe checks it). A
    module that records its size (``hidden_size``, ``dim``, …) gets a scale per feature; one
    that records none (Llama 4's QK norms; FalconMamba's, whose unused weight buffer has the
    model's width while it also normalizes narrower tensors) one scale per member, shape
    (M, 1), broadcast over whatever last dimension it normalizes.

    The weightless class cannot hold a member's scale: ``to_plain`` gives
    :class:`ScaledRMSNorm`, the same formula with a weight. A plain checkpoint holds nothing
    for these layers (``gamma`` and ``weight`` are reported missing by ``load_state_dict``).

    Args:
        hidden_size: C, or None for one scale per member broadcast over any last dimension.
        num_members: M.
        eps: the plain module's eps.

    Shape:
        Input: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "unweighted"
    _norm_fn = staticmethod(olmo2_rms_norm)

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

    def to_plain(self, member: int) -> nn.Module:
        self._check_member(member)
        plain = self._rebuild_plain(1 if self.hidden_size is None else self.hidden_size)
        scale, _ = self.scale_and_shift()
        with torch.no_grad():
            plain.weight.copy_(scale[member])
        return plain.train(self.training)

    @classmethod
    def _plain_config(cls, plain: nn.Module) -> dict[str, Any]:
        if plain._parameters.get("weight") is not None:
            raise TypeError(f"it has a weight; {cls.__name__} is for RMS norms without one")
        if plain._parameters.get("bias") is not None:
            raise TypeError(f"it has a bias; {cls.__name__} is for RMS norms without one")
        # the size it records (hidden_size, …), not that of a weight buffer it does not use:
        # FalconMamba's has the model's width and normalizes its SSM's B, C and dt as well
        shape = feature_shape(plain)
        return {
            "hidden_size": None if shape is None or len(shape) != 1 else shape[0],
            "eps": norm_eps(plain),
        }

    @classmethod
    def _from_plain_config(cls, plain, config, num_members, generator, kw) -> MemberNorm:
        # the plain module's weight, where it keeps one (FalconMamba's unused buffer), is not
        # what it computes with: every member starts at the identity scale
        tensors = [*plain.parameters(recurse=False), *plain.buffers(recurse=False)]
        floats = [t for t in tensors if t.is_floating_point()]
        member = cls(
            **config,
            num_members=num_members,
            **kw,
            device=tensors[0].device if tensors else None,
            dtype=torch.float32 if not floats else floats[0].dtype,
        )
        with torch.no_grad():
            if generator is not None:
                noise = torch.randn(member.gamma.shape, generator=generator, dtype=torch.float32)
                member.gamma.copy_(noise.mul_(member.gamma_std).add_(member.gamma_mean))
            member.load_plain_affine(None, None)
        return member.train(plain.training)

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
        """A member norm whose every member reproduces ``plain``, an extracted member
        (:class:`ScaledRMSNorm`): its formula's member class, its weight loaded (one of size 1
        is one scale per member again).

        Raises:
            TypeError: if ``plain`` is not a :class:`ScaledRMSNorm`.
        """
        if not isinstance(plain, ScaledRMSNorm):
            raise TypeError(f"from_scaled expects a ScaledRMSNorm, got {type(plain).__name__}")
        members = (MemberUnweightedRMSNorm, MemberDeepseekUnweightedRMSNorm, MemberUnweightedL2Norm)
        cls = {c.formula: c for c in members}[plain.formula]
        weight = plain.weight
        size = None if tuple(weight.shape) == (1,) else weight.shape[0]
        member = cls(size, num_members, plain.eps, **kw, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            if generator is not None:
                noise = torch.randn(member.gamma.shape, generator=generator, dtype=torch.float32)
                member.gamma.copy_(noise.mul_(member.gamma_std).add_(member.gamma_mean))
            member.load_plain_affine(weight, None)
        return member.train(plain.training)


class MemberDeepseekUnweightedRMSNorm(MemberUnweightedRMSNorm):
    """σNorm over DeepSeek-V4's ``DeepseekV4UnweightedRMSNorm``: x ⊙ rsqrt(mean(x_f32²) +
    eps).to(x.dtype), the inverse root cast before the product.

    Member m computes :func:`~snens.nn.hf_formulas.deepseek_unweighted_rms_norm` with its
    folded scale in the factor; otherwise as :class:`MemberUnweightedRMSNorm`.
    """

    formula = "deepseek_unweighted"
    _norm_fn = staticmethod(deepseek_unweighted_rms_norm)


class MemberUnweightedL2Norm(MemberUnweightedRMSNorm):
    """σNorm over nGPT's weightless L2 norm (``DoryL2Norm``): x_f32 · rsqrt(Σ x_f32² + eps),
    cast once, onto the unit sphere.

    Member m computes :func:`~snens.nn.hf_formulas.unweighted_l2_norm` with its folded scale;
    otherwise as :class:`MemberUnweightedRMSNorm`.
    """

    formula = "l2"
    norm_kind = "L2 norm"
    _norm_fn = staticmethod(unweighted_l2_norm)


# -- gated RMS norms --------------------------------------------------------------------------
class _MemberGatedRMSNorm(_MemberHFNorm):
    """Shared body of the gated RMS norms' member versions: ``forward(x, gate=None)``.

    Member m computes :func:`~snens.nn.hf_formulas.gated_rms_norm` on its rows of x and of the
    gate (both member-major, (M·B, *, C)), with its folded scale sigmoid(gamma_m)·weight_m in
    place of the weight, its class's order (gate first or not, the weight in float32 or after
    the cast), the plain module's activation (``activation``: SiLU or sigmoid) and groups
    (``group_size``, or C // ``n_groups``). ``to_plain`` rebuilds the plain class with the
    options of its constructor it records (``group_size``, ``n_groups``,
    ``norm_before_gate``, ``activation``).
    """

    norm_kind = "gated RMS norm"
    gate_first = False
    weight_in_float32 = False
    #: forward takes a second input, the gate (the probe feeds one)
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
        if group_size is not None and (
            isinstance(group_size, bool)
            or not isinstance(group_size, int)
            or group_size < 1
            or hidden_size % group_size
        ):
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
        return gated_rms_norm(
            x,
            gate,
            scale,
            self.eps,
            group_size=self.group_size,
            gate_first=self.gate_first,
            activation=self.activation,
            weight_in_float32=self.weight_in_float32,
        )

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
        """The formula on each member's rows (and gate rows) with its folded scale."""
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
        if not _positive_int(group_size):
            group_size = size // groups if _positive_int(groups) and size % groups == 0 else None
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


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _constructor_options(plain: nn.Module) -> dict[str, Any]:
    """The arguments of ``type(plain).__init__`` after its first (the size) and other than
    eps that ``plain`` keeps as attributes of the same name (plain values only)."""
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
    (``Qwen3NextRMSNormGated``, ``Qwen3_5RMSNormGated``, ``OlmoHybridRMSNormGated``, …):
    ((weight ⊙ x̂.to(x.dtype)) ⊙ act(g_f32)).to(x.dtype).

    ``forward(x, gate=None)`` takes the gate as the plain module does, positional or keyword.

    Args:
        hidden_size: C.
        num_members: M.
        eps: the plain module's ``variance_epsilon``.
        group_size: features per RMS group (None: all C).
        activation: the gate's, ``"silu"`` or ``"sigmoid"``.
        plain_type: the class ``to_plain`` rebuilds.

    Shape:
        Input and gate: (M·B, *, C), member-major. Output: same shape.
    """

    formula = "gated"


class MemberGatedRMSNormF32(_MemberGatedRMSNorm):
    """σNorm over a gated RMS norm whose weight multiplies in float32 before the gate
    (``KimiLinearRMSNormGated``, ``FalconH1RMSNormGated``, ``BailingHybridRMSNormGated``, …):
    (weight_f32 ⊙ x̂ ⊙ act(g_f32)).to(x.dtype). Otherwise as :class:`MemberGatedRMSNorm`."""

    formula = "gated, weight in float32"
    weight_in_float32 = True


class MemberGateFirstRMSNorm(_MemberGatedRMSNorm):
    """σNorm over a gated RMS norm that gates before it normalizes (Mamba-2's
    ``MambaRMSNormGated``, ``BambaRMSNormGated``, ``Zamba2RMSNormGated``,
    ``NemotronHRMSNormGated``, ``GraniteMoeHybridRMSNormGated``): h = x_f32 ⊙ silu(g_f32),
    weight ⊙ ĥ.to(x.dtype) over groups of ``group_size``. Otherwise as
    :class:`MemberGatedRMSNorm`."""

    formula = "gate first"
    gate_first = True


class MemberGateFirstRMSNormF32(_MemberGatedRMSNorm):
    """σNorm over a gated RMS norm that gates first and weighs in float32
    (``FalconH1RMSNormGated(norm_before_gate=False)``): (weight_f32 ⊙ ĥ).to(x.dtype).
    Otherwise as :class:`MemberGatedRMSNorm`."""

    formula = "gate first, weight in float32"
    gate_first = True
    weight_in_float32 = True


# -- layer norm with the weight 1 + w ---------------------------------------------------------
class MemberLayerNorm1P(MemberLayerNorm):
    """σNorm over a layer norm whose scale is weight + 1 (Nemotron's ``NemotronLayerNorm1P``,
    a subclass of ``nn.LayerNorm`` computing ``F.layer_norm(x, shape, weight + 1, bias, eps)``).

    A member's weight is the whole scale, so member m computes ``nn.LayerNorm``'s formula with
    sigmoid(gamma_m)·weight_m, every path of :class:`~snens.nn.MemberLayerNorm`. A plain
    weight w (from a module or a state_dict) is loaded as the scale 1 + w, and ``to_plain``
    rebuilds the plain class with w = scale − 1, as :class:`MemberGemmaRMSNorm` does.

    Args:
        normalized_shape, num_members, eps, bias: as :class:`~snens.nn.MemberLayerNorm`'s.
        plain_type: the class ``to_plain`` rebuilds, ``plain_type(shape, eps=eps, bias=…)``
            (None: ``nn.LayerNorm`` holding the scale itself).
    """

    triton_variant = None

    def __init__(self, *args, plain_type: type[nn.Module] | None = None, **kw) -> None:
        super().__init__(*args, **kw)
        self.plain_type = plain_type

    @torch.no_grad()
    def load_plain_affine(self, weight: Tensor | None, bias: Tensor | None) -> None:
        scale = None if weight is None else 1 + weight.detach().double()
        super().load_plain_affine(scale, bias)

    def forward(self, x: Tensor) -> Tensor:
        """As ``NemotronLayerNorm1P``: autocast off; under CUDA's autocast (what its
        ``torch.is_autocast_enabled()`` reads) the input and the folded affine are cast to the
        autocast dtype first, as it casts its input, weight + 1 and bias."""
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
    def from_plain(
        cls, plain: nn.Module, num_members: int, *, generator: torch.Generator | None = None, **kw
    ) -> MemberNorm:
        """A member norm whose every member reproduces ``plain``, a layer norm with the scale
        1 + weight (checked on probe inputs, :func:`snens.nn.probe.match`).

        Raises:
            TypeError: if ``plain`` does not compute it.
        """
        found = probe.match(plain, [cls])
        if found is None or not found.reproduces:
            raise TypeError(
                f"{cls.__name__}.from_plain expects a layer norm with the scale 1 + weight; "
                f"{type(plain).__name__} does not compute one on probe inputs"
            )
        return from_plain_as(cls, plain, num_members, eps=found.eps, generator=generator, **kw)

    @staticmethod
    def _plain_config(plain: nn.Module) -> dict[str, Any]:
        if plain._parameters.get("weight") is None:
            raise TypeError("it has no weight, so no scale 1 + weight")
        return {**MemberLayerNorm._plain_config(plain), "plain_type": type(plain)}

    def to_plain(self, member: int) -> nn.Module:
        if self.plain_type is None:
            return super().to_plain(member)
        self._check_member(member)
        plain = self.plain_type(self.normalized_shape, eps=self.eps, bias=self.bias is not None).to(
            device=self.weight.device, dtype=self.weight.dtype
        )
        scale, shift = self.scale_and_shift()
        with torch.no_grad():
            plain.weight.copy_(scale[member].double() - 1)
            if shift is not None:
                plain.bias.copy_(shift[member])
        return plain.train(self.training)
