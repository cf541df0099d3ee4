"""Baselines under the (B, …) -> (M, B, K) contract, and one factory that builds any of them.

    net = snens.baselines.create("packed", "resnet18", num_classes=10, num_members=4)

* :class:`SingleModel`, :class:`DeepEnsemble`, :func:`batch_ensemble` (Wen et al., 2020),
  :func:`packed_resnet18` and the other Packed-Ensembles (Laurent et al., 2023), :func:`film`
  (Turkoglu et al., 2022) and :class:`MCDropout` (Gal & Ghahramani, 2016).
"""

from snens.baselines.batch_ensemble import (
    BatchEnsemble,
    BatchEnsembleConv2d,
    BatchEnsembleLinear,
    batch_ensemble,
)
from snens.baselines.deep_ensemble import DeepEnsemble, reinitialized_copy
from snens.baselines.factory import DEFAULT_NUM_MEMBERS, METHOD_RECORDS, METHODS, Method, create
from snens.baselines.film import (
    FILM_NORMS,
    FiLMBatchNorm1d,
    FiLMBatchNorm2d,
    FiLMBatchNorm3d,
    FiLMGroupNorm,
    FiLMLayerNorm,
    FiLMRMSNorm,
    film,
    film_norm,
)
from snens.baselines.mc_dropout import MCDropout, MCDropoutLayer
from snens.baselines.packed import (
    PackedBasicBlock,
    PackedBottleneck,
    PackedConv2d,
    PackedLinear,
    PackedResNet,
    PackedSmallCNN,
    packed_resnet18,
    packed_resnet50,
    packed_small_cnn,
)
from snens.baselines.single import SingleModel

__all__ = [
    "DEFAULT_NUM_MEMBERS",
    "FILM_NORMS",
    "METHODS",
    "METHOD_RECORDS",
    "BatchEnsemble",
    "BatchEnsembleConv2d",
    "BatchEnsembleLinear",
    "DeepEnsemble",
    "FiLMBatchNorm1d",
    "FiLMBatchNorm2d",
    "FiLMBatchNorm3d",
    "FiLMGroupNorm",
    "FiLMLayerNorm",
    "FiLMRMSNorm",
    "MCDropout",
    "MCDropoutLayer",
    "Method",
    "PackedBasicBlock",
    "PackedBottleneck",
    "PackedConv2d",
    "PackedLinear",
    "PackedResNet",
    "PackedSmallCNN",
    "SingleModel",
    "batch_ensemble",
    "create",
    "film",
    "film_norm",
    "packed_resnet18",
    "packed_resnet50",
    "packed_small_cnn",
    "reinitialized_copy",
]
