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

In float32 the formulas of one kind agree; in half precision they differ by where they round,
which is how :mod:`snens.nn.probe` tells them apart. :mod:`snens.nn.hf_norms` holds the member
versions, which compute these functions with each member's folded scale in place of the weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "cohere_layer_norm",
    "deberta_layer_norm",
    "gemma3n_rms_norm",
    "gemma_rms_norm",
    "llama_rms_norm",
    "olmo2_rms_norm",
    "olmo_layer_norm",
    "t5_rms_norm",
]


def llama_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype), as ``LlamaRMSNorm`` computes it.

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x, in the promoted dtype.
    """
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def gemma_rms_norm(x: Tensor, factor: Tensor, eps: float) -> Tensor:
    """(x̂ ⊙ factor_f32).to(x.dtype), x̂ = x_f32 · rsqrt(mean(x_f32²) + eps), as ``GemmaRMSNorm``
    computes it with factor = 1 + weight.

    Shape:
        x: (*, C). factor: broadcastable to x. Output: like x.
    """
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * factor.float()).type_as(x)


def t5_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight ⊙ (x · rsqrt(mean(x_f32²) + eps)), as ``T5LayerNorm`` computes it: the normalized
    input is cast to the weight's dtype first where that is float16 or bfloat16.

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x, in the promoted dtype.
    """
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        h = h.to(weight.dtype)
    return weight * h


def olmo2_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(weight ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps))).to(x.dtype), as ``Olmo2RMSNorm`` computes
    it: the product in the promoted dtype of the weight and float32, cast once.

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x.
    """
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h).to(x.dtype)


def gemma3n_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(x_f32 · pow(mean(x_f32²) + eps, −0.5) ⊙ weight_f32).to(x.dtype), as
    ``Gemma3nRMSNorm(with_scale=True)`` computes it.

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x.
    """
    h = x.float()
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (h * weight.float()).type_as(x)


def cohere_layer_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(weight_f32 ⊙ (x_f32 − μ) · rsqrt(mean((x_f32 − μ)²) + eps)).to(x.dtype), μ the mean
    over the last dimension, as ``CohereLayerNorm`` computes it.

    Shape:
        x: (*, C) or (*, H, C). weight: broadcastable to x. Output: like x.
    """
    h = x.to(torch.float32)
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    h = (h - mean) * torch.rsqrt(variance + eps)
    return (weight.to(torch.float32) * h).to(x.dtype)


def deberta_layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    """weight ⊙ ((x_f32 − μ) / sqrt(mean((x_f32 − μ)²) + eps)).to(x.dtype) + bias, μ the mean
    over the last dimension, as ``DebertaLayerNorm`` computes it (no bias: none added).

    Shape:
        x: (*, C). weight, bias: broadcastable to x. Output: like x, in the promoted dtype.
    """
    h = x.float()
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    h = ((h - mean) / torch.sqrt(variance + eps)).to(x.dtype)
    return weight * h if bias is None else weight * h + bias


def olmo_layer_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(F.layer_norm(x_f32, (C,), eps=eps) ⊙ weight_f32).to(x.dtype): ``OlmoLayerNorm``'s
    float32 layer norm and its one cast, with a weight (``OlmoLayerNorm`` is weight = 1).

    Shape:
        x: (*, C). weight: broadcastable to x. Output: like x.
    """
    h = F.layer_norm(x.to(torch.float32), x.shape[-1:], None, None, eps=eps)
    return (h * weight.to(torch.float32)).to(x.dtype)
