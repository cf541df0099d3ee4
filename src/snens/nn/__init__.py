"""Layers of σN-Ens: member norms, member heads, the ``norm_layer`` factory, and
``register_norm`` for norm classes snens does not know."""

from snens.nn.adapters import register_norm
from snens.nn.batch_norms import MemberBatchNorm1d, MemberBatchNorm2d, MemberBatchNorm3d
from snens.nn.channels_first import MemberLayerNorm2d
from snens.nn.factory import MEMBER_NORMS, member_norm
from snens.nn.hf_norms import (
    MemberCohereLayerNorm,
    MemberGemma3nRMSNorm,
    MemberGemmaRMSNorm,
    MemberLlamaRMSNorm,
    MemberOlmo2RMSNorm,
    MemberOlmoLayerNorm,
    MemberT5RMSNorm,
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

__all__ = [
    "MEMBER_NORMS",
    "MemberBatchNorm1d",
    "MemberBatchNorm2d",
    "MemberBatchNorm3d",
    "MemberCohereLayerNorm",
    "MemberGemma3nRMSNorm",
    "MemberGemmaRMSNorm",
    "MemberGroupNorm",
    "MemberInstanceNorm1d",
    "MemberInstanceNorm2d",
    "MemberInstanceNorm3d",
    "MemberLayerNorm",
    "MemberLayerNorm2d",
    "MemberLinear",
    "MemberLlamaRMSNorm",
    "MemberNorm",
    "MemberOlmo2RMSNorm",
    "MemberOlmoLayerNorm",
    "MemberRMSNorm",
    "MemberT5RMSNorm",
    "member_norm",
    "register_norm",
    "sequence_first",
]
