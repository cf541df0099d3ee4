"""How the members of an ensemble share the features: the realized allocation.

For each feature i of a member norm, with q_m = s_m / Σ_m' s_m' for importances s = sigmoid(gamma),

    effective members_i = exp(H(q_i)) = exp(−Σ_m q_m log q_m),  from 1 (one owner) to M.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from snens.nn.norms import MemberNorm

__all__ = ["LayerAllocation", "allocation", "mean_effective_members"]


@dataclass(frozen=True)
class LayerAllocation:
    """The importances of one member norm and how many members effectively use each feature.

    Attributes:
        importances: sigmoid(gamma), detached float32 on the CPU.
        effective_members: exp(entropy of q) per feature.

    Shape:
        importances: (M, C). effective_members: (C,).
    """

    importances: Tensor
    effective_members: Tensor

    @property
    def num_members(self) -> int:
        return self.importances.shape[0]

    @property
    def mean_effective_members(self) -> float:
        return float(self.effective_members.double().mean())


def _layer_allocation(layer: MemberNorm) -> LayerAllocation:
    M = layer.num_members
    gamma = layer.gamma.detach().double().reshape(M, -1)
    # q = softmax(log s): logsigmoid keeps features whose every importance underflows finite
    q = torch.softmax(F.logsigmoid(gamma), dim=0)
    entropy = -torch.special.xlogy(q, q).sum(dim=0)  # (C,)
    return LayerAllocation(
        importances=layer.importances().detach().float().cpu(),
        effective_members=entropy.exp().float().cpu(),
    )


@torch.no_grad()
def allocation(model: nn.Module) -> dict[str, LayerAllocation]:
    """The allocation of every member norm of a model, keyed by module name.

    Returns:
        ``{name: LayerAllocation}`` in ``model.named_modules()`` order.

    Raises:
        ValueError: if the model has no member norms.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    result = {
        name: _layer_allocation(module)
        for name, module in model.named_modules()
        if isinstance(module, MemberNorm)
    }
    if not result:
        raise ValueError(
            f"{type(model).__name__} has no member norm layers (snens.nn.MemberNorm), so there "
            "is no allocation to measure; call snens.convert(model, num_members=M) first"
        )
    return result


def mean_effective_members(model_or_allocation: nn.Module | Mapping[str, LayerAllocation]) -> float:
    """Effective members per feature over all member norms of a model (or an :func:`allocation`).

    Returns:
        A value between 1 (every feature has one owner) and M (every feature equally shared).

    Raises:
        ValueError: if there are no member norms (or the mapping is empty).
    """
    layers = model_or_allocation
    if isinstance(layers, nn.Module):
        layers = allocation(layers)
    elif not isinstance(layers, Mapping):
        raise TypeError(
            "mean_effective_members takes a model or the dict from snens.allocation(model), "
            f"got {type(model_or_allocation).__name__}"
        )
    if not layers:
        raise ValueError("the allocation is empty: it holds no member norm layers")
    total = sum(float(a.effective_members.double().sum()) for a in layers.values())
    count = sum(a.effective_members.numel() for a in layers.values())
    return total / count
