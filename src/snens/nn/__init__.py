"""Layers of σN-Ens: member norms, member heads, the ``norm_layer`` factory, and
``register_norm`` for norm classes snens does not recognize (:mod:`snens.nn.registry`)."""

from snens.nn.batch_norms import MemberBatchNorm1d, MemberBatchNorm2d, MemberBatchNorm3d
from snens.nn.channels_first import MemberLayerNorm2d
from snens.nn.hf_norms import (
    MemberCohereLayerNorm,
    MemberDebertaLayerNorm,
    MemberDeepseekUnweightedRMSNorm,
    MemberGatedRMSNorm,
    MemberGatedRMSNormF32,
    MemberGateFirstRMSNorm,
    MemberGateFirstRMSNormF32,
    MemberGemma3nRMSNorm,
    MemberGemmaRMSNorm,
    MemberLayerNorm1P,
    MemberLlamaRMSNorm,
    MemberOlmo2RMSNorm,
    MemberOlmoLayerNorm,
    MemberT5RMSNorm,
    MemberUnweightedL2Norm,
    MemberUnweightedRMSNorm,
    ScaledRMSNorm,
)
from snens.nn.layout import sequence_first
from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm
from snens.nn.per_example_norms import (
    MemberGroupNorm,
    MemberInstanceNorm1d,
    MemberInstanceNorm2d,
    MemberInstanceNorm3d,
    MemberLayerNorm,
    MemberRMSNorm,
)
from snens.nn.registry import MEMBER_NORMS, member_norm, register_norm

__all__ = [
    "MEMBER_NORMS",
    "MemberBatchNorm1d",
    "MemberBatchNorm2d",
    "MemberBatchNorm3d",
    "MemberCohereLayerNorm",
    "MemberDebertaLayerNorm",
    "MemberDeepseekUnweightedRMSNorm",
    "MemberGateFirstRMSNorm",
    "MemberGateFirstRMSNormF32",
    "MemberGatedRMSNorm",
    "MemberGatedRMSNormF32",
    "MemberGemma3nRMSNorm",
    "MemberGemmaRMSNorm",
    "MemberGroupNorm",
    "MemberInstanceNorm1d",
    "MemberInstanceNorm2d",
    "MemberInstanceNorm3d",
    "MemberLayerNorm",
    "MemberLayerNorm1P",
    "MemberLayerNorm2d",
    "MemberLinear",
    "MemberLlamaRMSNorm",
    "MemberNorm",
    "MemberOlmo2RMSNorm",
    "MemberOlmoLayerNorm",
    "MemberRMSNorm",
    "MemberT5RMSNorm",
    "MemberUnweightedL2Norm",
    "MemberUnweightedRMSNorm",
    "ScaledRMSNorm",
    "member_norm",
    "register_norm",
    "sequence_first",
]
