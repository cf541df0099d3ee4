"""Member heads: one linear classifier per member over shared features."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from snens.nn.layout import check_batch_first
from snens.nn.norms import check_member, check_num_members

__all__ = ["MemberLinear"]


class MemberLinear(nn.Module):
    """M independent linear layers on their members' rows: ``(M·B, *, D) -> (M·B, *, K)``."""

    member_major: bool = True

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_members: int,
        bias: bool = True,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.num_members = check_num_members(num_members)
        self.in_features = in_features
        self.out_features = out_features
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(num_members, out_features, in_features, **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(num_members, out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        with torch.no_grad():
            # nn.Linear's default initialization, drawn per member
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    @torch.no_grad()
    def load_plain(self, linear: nn.Linear) -> None:
        self.weight.copy_(linear.weight)  # every member a copy of it
        if self.bias is not None and linear.bias is not None:
            self.bias.copy_(linear.bias)
        elif self.bias is not None:
            self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        M = self.num_members
        check_batch_first(self, x)
        if x.dim() < 2 or x.shape[0] % M or x.shape[-1] != self.in_features:
            raise ValueError(
                f"MemberLinear expects a member-major input (M·B, *, {self.in_features}) with "
                f"M={M}, got shape {tuple(x.shape)}"
            )
        lead = x.shape[:-1]
        xm = x.reshape(M, -1, self.in_features)  # (M, B·*, D)
        if self.bias is None:
            out = torch.bmm(xm, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), xm, self.weight.transpose(1, 2))
        return out.reshape(*lead, self.out_features)  # (M·B, *, K)

    def to_plain(self, member: int) -> nn.Linear:
        check_member(member, self.num_members)
        factory = {"device": self.weight.device, "dtype": self.weight.dtype}
        plain = nn.Linear(self.in_features, self.out_features, self.bias is not None, **factory)
        with torch.no_grad():
            plain.weight.copy_(self.weight[member])
            if self.bias is not None:
                plain.bias.copy_(self.bias[member])
        return plain.train(self.training)

    #: 2: per-member rows (M, K, D) and (M, K); 1 (or none): a plain nn.Linear's.
    _version = 2

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        version = local_metadata.get("version")
        for key in ("weight", "bias"):
            value = state_dict.get(prefix + key)
            param = getattr(self, key)
            if value is None or param is None:
                continue
            if (version is None or version < 2) and value.dim() == param.dim() - 1:
                # a plain nn.Linear's: every member starts as a copy of it
                state_dict[prefix + key] = value.unsqueeze(0).expand_as(param).clone()
            elif tuple(value.shape) != tuple(param.shape):
                raise ValueError(
                    f"cannot load {prefix}{key} of shape {tuple(value.shape)} (state_dict "
                    f"version {version}) into MemberLinear of {key} {tuple(param.shape)}: it "
                    f"comes from an ensemble with num_members={value.shape[0]} or another layer"
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"num_members={self.num_members}, bias={self.bias is not None}"
        )
