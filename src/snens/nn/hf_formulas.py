"""What Hugging Face's norm classes compute: the formulas their member versions compute.

Hugging Face's RMS norm classes are copies of a few formulas, which compute the statistics in
float32 and differ in where they cast (how :mod:`snens.nn.probe` tells them apart). Each
function takes x of shape (*, C) and a weight broadcastable to it, and returns a tensor like x
(Llama's, T5's and DeBERTa's in the promoted dtype of x and the weight).
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
    """(x̂ ⊙ factor_f32).to(x.dtype), as ``GemmaRMSNorm`` with factor = 1 + weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * factor.float()).type_as(x)


def t5_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight ⊙ (x · rsqrt(mean(x_f32²) + eps)), cast to a half weight's dtype first, as
    ``T5LayerNorm``."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        h = h.to(weight.dtype)
    return weight * h


def olmo2_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(weight ⊙ (x_f32 · rsqrt(mean(x_f32²) + eps))).to(x.dtype), as ``Olmo2RMSNorm``."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h).to(x.dtype)


def gemma3n_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(x_f32 · pow(mean(x_f32²) + eps, −0.5) ⊙ weight_f32).to(x.dtype), as ``Gemma3nRMSNorm``."""
    h = x.float()
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (h * weight.float()).type_as(x)


def cohere_layer_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(weight_f32 ⊙ (x_f32 − μ) · rsqrt(mean((x_f32 − μ)²) + eps)).to(x.dtype), as
    ``CohereLayerNorm``."""
    h = x.to(torch.float32)
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    h = (h - mean) * torch.rsqrt(variance + eps)
    return (weight.to(torch.float32) * h).to(x.dtype)


def deberta_layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    """weight ⊙ ((x_f32 − μ) / sqrt(mean((x_f32 − μ)²) + eps)).to(x.dtype) + bias, as
    ``DebertaLayerNorm``."""
    h = x.float()
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    h = ((h - mean) / torch.sqrt(variance + eps)).to(x.dtype)
    return weight * h if bias is None else weight * h + bias


def olmo_layer_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(F.layer_norm(x_f32, (C,), eps=eps) ⊙ weight_f32).to(x.dtype), as ``OlmoLayerNorm``
    (weight = 1)."""
    h = F.layer_norm(x.to(torch.float32), x.shape[-1:], None, None, eps=eps)
    return (h * weight.to(torch.float32)).to(x.dtype)


def deepseek_unweighted_rms_norm(x: Tensor, scale: Tensor, eps: float) -> Tensor:
    """x ⊙ (scale_f32 · rsqrt(mean(x_f32²) + eps)).to(x.dtype), as
    ``DeepseekV4UnweightedRMSNorm`` (scale = 1)."""
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
    """A gated RMS norm, statistics in float32 over groups of ``group_size`` features (None:
    all). ``gate_first``: x_f32 ⊙ act(g_f32) is normalized (Mamba-2), else the gate multiplies
    the output (Qwen3-Next). ``weight_in_float32``: the weight multiplies in float32 (Kimi),
    else x̂.to(x.dtype). A None gate skips the gate.
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
    """(scale_f32 ⊙ x_f32 · rsqrt(Σ x_f32² + eps)).to(x.dtype), as nGPT's ``DoryL2Norm``."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).sum(-1, keepdim=True) + eps)
    return (scale.to(torch.float32) * h).to(x.dtype)
