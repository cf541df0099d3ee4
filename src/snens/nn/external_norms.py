"""Member norms for norm classes from outside torch, under their former module name.

Their code lives by concept: :mod:`snens.nn.hf_formulas` (what Hugging Face's RMS norms and
float32 layer norms compute, and which formula a module computes), :mod:`snens.nn.hf_norms`
(their member versions), :mod:`snens.nn.channels_first` (channels-first LayerNorms) and
:mod:`snens.nn.plain_conversion` (conversion of classes a member norm does not own). This
module re-exports them; ``rms_formula`` and ``RMS_MEMBER_NORMS`` are the former names of
``hf_formula`` and ``HF_MEMBER_NORMS``.
"""

from snens.nn.channels_first import Layout, MemberLayerNorm2d, layer_norm_layout
from snens.nn.hf_formulas import (
    HFFormula,
    cohere_layer_norm,
    gemma3n_rms_norm,
    gemma_rms_norm,
    hf_formula,
    llama_rms_norm,
    olmo2_rms_norm,
    olmo_layer_norm,
    t5_rms_norm,
)
from snens.nn.hf_norms import (
    HF_MEMBER_NORMS,
    MemberCohereLayerNorm,
    MemberGemma3nRMSNorm,
    MemberGemmaRMSNorm,
    MemberLlamaRMSNorm,
    MemberOlmo2RMSNorm,
    MemberOlmoLayerNorm,
    MemberT5RMSNorm,
)
from snens.nn.plain_conversion import from_plain_as

__all__ = [
    "HF_MEMBER_NORMS",
    "RMS_MEMBER_NORMS",
    "HFFormula",
    "Layout",
    "MemberCohereLayerNorm",
    "MemberGemma3nRMSNorm",
    "MemberGemmaRMSNorm",
    "MemberLayerNorm2d",
    "MemberLlamaRMSNorm",
    "MemberOlmo2RMSNorm",
    "MemberOlmoLayerNorm",
    "MemberT5RMSNorm",
    "cohere_layer_norm",
    "from_plain_as",
    "gemma3n_rms_norm",
    "gemma_rms_norm",
    "hf_formula",
    "layer_norm_layout",
    "llama_rms_norm",
    "olmo2_rms_norm",
    "olmo_layer_norm",
    "rms_formula",
    "t5_rms_norm",
]

rms_formula = hf_formula
RMS_MEMBER_NORMS = HF_MEMBER_NORMS
