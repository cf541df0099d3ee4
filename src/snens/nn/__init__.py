"""Layers of σN-Ens: member norms, member heads, and the ``norm_layer`` factory."""

from snens.nn.batch_norms import MemberBatchNorm1d, MemberBatchNorm2d, MemberBatchNorm3d
from snens.nn.factory import MEMBER_NORMS, member_norm
from snens.nn.linear import MemberLinear
from snens.nn.norms import MemberNorm
from snens.nn.per_example_norms import MemberGroupNorm, MemberLayerNorm, MemberRMSNorm

__all__ = [
    "MEMBER_NORMS",
    "MemberBatchNorm1d",
    "MemberBatchNorm2d",
    "MemberBatchNorm3d",
    "MemberGroupNorm",
    "MemberLayerNorm",
    "MemberLinear",
    "MemberNorm",
    "MemberRMSNorm",
    "member_norm",
]
