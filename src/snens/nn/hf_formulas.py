"""What Hugging Face's norm classes compute: the formulas their member versions compute.

**RMS norms.** Hugging Face models do not use ``nn.RMSNorm``: about 160 of their RMS norm
classes (transformers 5.24) are copies of a few formulas, which compute the statistics in
float32 and differ in where they cast, with x̂ = x_f32 · rsqrt(mean(x_f32²) + eps):

* Llama (``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm``, ``Llama4TextRMSNorm``,
  ``CpmAntLayerNorm``, …): weight ⊙ x̂.to(x.dtype);
* Gemma (``GemmaRMSNorm``, ``Gemma2RMSNorm``, ``Qwen3NextRMSNorm``, …): (x̂ ⊙ (1 + weight_f32))
  .to(x.dtype), the weight stored as an offset from 1;
* T5 (``T5LayerNorm``, ``MT5LayerNorm``, ``LongT5LayerNorm``, …): weight ⊙ (x · rsqrt(…)), the
  product cast to the weight's dtype first where that is half precision;
* OLMo-2 (``Olmo2RMSNorm``, …): (weight ⊙ x̂).to(x.dtype), the product in float32 (in float64
  for a float64 weight) and cast once;
* Gemma 3n (``Gemma3nRMSNorm``, ``HeliumRMSNorm``, ``NemotronHRMSNorm``, …): (x̂ ⊙ weight_f32)
  .to(x.dtype), the product in float32 whatever the weight's dtype (Gemma 3n writes the inverse
  root as ``torch.pow(·, −0.5)``, which rounds as ``rsqrt`` does on the CPU).

**Layer norms**, mean-centred in float32:

* Cohere (``CohereLayerNorm``): (weight_f32 ⊙ (x_f32 − μ) · rsqrt(mean((x_f32 − μ)²) + eps))
  .to(x.dtype), as explicit ops, over the last dimension; the weight may be (H, D) (its QK
  norms);
* DeBERTa (``DebertaLayerNorm``): weight ⊙ ((x_f32 − μ) / sqrt(var + eps)).to(x.dtype) + bias,
  Llama's order: cast, then the affine;
* OLMo-1 (``OlmoLayerNorm``): ``F.layer_norm(x_f32, (C,), eps=1e-5)``, no weight at all.

**Gated RMS norms** take a second input, the gate g, and multiply by act(g_f32) (SiLU, or a
sigmoid where the class's ``activation`` says so), each over groups of ``group_size`` features
(the whole last dimension unless the class records groups), :func:`gated_rms_norm`:

* norm, then gate, the weight after the cast (``Qwen3NextRMSNormGated``,
  ``Qwen3_5RMSNormGated``, ``OlmoHybridRMSNormGated``, …): ((weight ⊙ x̂.to(x.dtype)) ⊙
  act(g_f32)).to(x.dtype);
* norm, then gate, the weight in float32 (``KimiLinearRMSNormGated``,
  ``FalconH1RMSNormGated``, …): (weight_f32 ⊙ x̂ ⊙ act(g_f32)).to(x.dtype);
* gate, then norm (``MambaRMSNormGated`` of Mamba-2, Bamba, Zamba2, Nemotron-H, Granite
  hybrid): h = x_f32 ⊙ silu(g_f32), weight ⊙ ĥ.to(x.dtype); without a gate, Llama's formula;
* gate, then norm, the weight in float32 (``FalconH1RMSNormGated(norm_before_gate=False)``):
  (weight_f32 ⊙ ĥ).to(x.dtype).

**Weightless RMS norms** (``Llama4TextL2Norm``, ``NanoChatRMSNorm``,
``FalconMambaWeightlessRMSNorm``): x̂.type_as(x), OLMo-2's formula with weight 1; DeepSeek-V4's
``DeepseekV4UnweightedRMSNorm``: x ⊙ rsqrt(mean(x_f32²) + eps).to(x.dtype), the factor cast
before the product (:func:`deepseek_unweighted_rms_norm`); nGPT's L2 norm (``DoryL2Norm``):
x_f32 · rsqrt(Σ x_f32² + eps), cast once (:func:`unweighted_l2_norm`), the sum, not the mean.

In float32 the formulas of one kind agree; in half precision they differ by where they round,
which is how :mod:`snens.nn.probe` tells them apart. Each function takes x of shape (*, C) and a
weight broadcastable to it, and returns a tensor like x (Llama's, T5's and DeBERTa's in the
promoted dtype of x and the weight).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "cohere_layer_norm",
    "deberta_layer_norm",
    "deepseek_unweighted_rms_norm",
    "gated_rms_norm",
    "gemma3n_rms_norm",
    "gemma_rms_norm",
    "llama_rms_norm",
    "olmo2_rms_norm",
    "olmo_layer_norm",
    "t5_rms_norm",
    "unweighted_l2_norm",
]


def llama_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype), as ``LlamaRMSNorm`` computes it."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def gemma_rms_norm(x: Tensor, factor: Tensor, eps: float) -> Tensor:
    """(x̂ ⊙ factor_f32).to(x.dtype), x̂ = x_f32 · rsqrt(mean(x_f32²) + eps), as ``GemmaRMSNorm``
    computes it with factor = 1 + weight.
    """
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * factor.float()).type_as(x)


def t5_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight ⊙ (x · rsqrt(mean(x_f32²) + eps)), as ``T5LayerNorm`` computes it: the normalized
    input is cast to the weight's dtype first where that is float16 or bfloat16.
    """
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        h = h.to(weight.dtype)
    return weight * h


def olmo2_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(weight ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps))).to(x.dtype), as ``Olmo2RMSNorm`` computes
    it: the product in the promoted dtype of the weight and float32, cast once.
    """
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h).to(x.dtype)


def gemma3n_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(x_f32 · pow(mean(x_f32²) + eps, −0.5) ⊙ weight_f32).to(x.dtype), as
    ``Gemma3nRMSNorm(with_scale=True)`` computes it.
    """
    h = x.float()
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (h * weight.float()).type_as(x)


def cohere_layer_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(weight_f32 ⊙ (x_f32 − μ) · rsqrt(mean((x_f32 − μ)²) + eps)).to(x.dtype), μ the mean
    over the last dimension, as ``CohereLayerNorm`` computes it.
    """
    h = x.to(torch.float32)
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    h = (h - mean) * torch.rsqrt(variance + eps)
    return (weight.to(torch.float32) * h).to(x.dtype)


def deberta_layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    """weight ⊙ ((x_f32 − μ) / sqrt(mean((x_f32 − μ)²) + eps)).to(x.dtype) + bias, μ the mean
    over the last dimension, as ``DebertaLayerNorm`` computes it (no bias: none added).
    """
    h = x.float()
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    h = ((h - mean) / torch.sqrt(variance + eps)).to(x.dtype)
    return weight * h if bias is None else weight * h + bias


def olmo_layer_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(F.layer_norm(x_f32, (C,), eps=eps) ⊙ weight_f32).to(x.dtype): ``OlmoLayerNorm``'s
    float32 layer norm and its one cast, with a weight (``OlmoLayerNorm`` is weight = 1).
    """
    h = F.layer_norm(x.to(torch.float32), x.shape[-1:], None, None, eps=eps)
    return (h * weight.to(torch.float32)).to(x.dtype)


def deepseek_unweighted_rms_norm(x: Tensor, scale: Tensor, eps: float) -> Tensor:
    """x ⊙ (scale_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype), as ``DeepseekV4UnweightedRMSNorm``
    computes it with scale = 1: the inverse root cast to x's dtype before the product.
    """
    r = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps)
    return x * (scale.float() * r).to(x.dtype)


#: The gate's activations, by the names Hugging Face's ``ACT2FN`` gives them.
GATE_ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "sigmoid": torch.sigmoid}


def gated_rms_norm(
    x: Tensor,
    gate: Tensor | None,
    weight: Tensor,
    eps: float,
    *,
    group_size: int | None = None,
    gate_first: bool = False,
    activation: str = "silu",
    weight_in_float32: bool = False,
) -> Tensor:
    """A gated RMS norm, as the Hugging Face classes listed in the module docstring compute it.

    Statistics in float32 over groups of ``group_size`` features of the last dimension (None:
    all of them). ``gate_first``: x_f32 ⊙ act(g_f32) is normalized (Mamba-2); else the gate
    multiplies the normalized output (Qwen3-Next). ``weight_in_float32``: the weight multiplies
    in float32 and the result is cast once to x's dtype (Kimi, Falcon-H1); else it multiplies
    x̂.to(x.dtype) (Llama's order). A None gate skips the gate.

    Shape:
        x, gate: (*, C). weight: broadcastable to x. Output: like x (in the promoted dtype of
        weight and x for the gate-first, weight-after-cast formula, as Mamba-2's).
    """
    act = GATE_ACTIVATIONS[activation]
    h = x.to(torch.float32)
    if gate is not None and gate_first:
        h = h * act(gate.to(torch.float32))
    size = h.shape[-1] if group_size is None else group_size
    groups = h.unflatten(-1, (h.shape[-1] // size, size))
    groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + eps)
    h = groups.flatten(-2)
    if weight_in_float32:
        h = weight.to(torch.float32) * h
    else:
        h = weight * h.to(x.dtype)
    if gate is not None and not gate_first:
        return (h * act(gate.to(torch.float32))).to(x.dtype)
    return h.to(x.dtype) if weight_in_float32 else h


def unweighted_l2_norm(x: Tensor, scale: Tensor, eps: float) -> Tensor:
    """(scale_f32 ⊙ x_f32 · rsqrt(Σ x_f32² + eps)).to(x.dtype), as nGPT's ``DoryL2Norm``
    computes it with scale = 1: onto the unit sphere (the sum of squares, not their mean).
    """
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).sum(-1, keepdim=True) + eps)
    return (scale.to(torch.float32) * h).to(x.dtype)
