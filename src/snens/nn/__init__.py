"""Layers of σN-Ens: member norms, member heads, the ``norm_layer`` factory, and
``register_norm`` for norm classes snens does not know."""

from snens.nn.adapters import register_norm
from snens.nn.batch_norms import MemberBatchNorm1d, MemberBatchNorm2d, MemberBatchNorm3d
from snens.nn.external_norms import (
    MemberGemmaRMSNorm,
    MemberLayerNorm2d,
    MemberLlamaRMSNorm,
    MemberT5RMSNorm,
)
from snens.nn.factory import MEMBER_NORMS, member_norm
from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm
from snens.nn.per_example_norms import MemberGroupNorm, MemberLayerNorm, MemberRMSNorm

__all__ = [
    "MEMBER_NORMS",
    "MemberBatchNorm1d",
    "MemberBatchNorm2d",
    "MemberBatchNorm3d",
    "MemberGemmaRMSNorm",
    "MemberGroupNorm",
    "MemberLayerNorm",
    "MemberLayerNorm2d",
    "MemberLinear",
    "MemberLlamaRMSNorm",
    "MemberNorm",
    "MemberRMSNorm",
    "MemberT5RMSNorm",
    "member_norm",
    "register_norm",
]
