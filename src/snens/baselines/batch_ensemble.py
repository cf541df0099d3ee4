"""BatchEnsemble (Wen et al., 2020): rank-1 fast weights on shared convolutions and linears.

Member m of a layer with shared weight W uses W_m = W ⊙ (s_m r_mᵀ), computed as
y_m = ((x_m ⊙ r_m) W ⊙ s_m) + b_m: the shared layer runs once for all members; r, s ~ N(1, 0.5²).
Norms stay shared between members, as in the paper. :func:`batch_ensemble` keeps every
pretrained weight (the shared weight *is* the plain layer's parameter, so tying survives).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from snens.method.ensemble import forward_repeated
from snens.nn.layout import check_batch_first
from snens.nn.norms import check_num_members
from snens.nn.surgery import ConversionReport, replace_modules
from snens.nn.torch_transformers import adapt

__all__ = ["BatchEnsemble", "BatchEnsembleConv2d", "BatchEnsembleLinear", "batch_ensemble"]

# r, s ~ N(1, σ²) scale a layer's output by ~σ²: σ = 100 takes every member far from it
_MAX_INIT_STD = 100.0


def _check_rows(layer: nn.Module, x: Tensor, num_members: int) -> None:
    check_batch_first(layer, x)
    if x.dim() < 2 or x.shape[0] % num_members:
        raise ValueError(
            f"{type(layer).__name__} expects a member-major input of M·B rows with "
            f"M={num_members}, got shape {tuple(x.shape)}; run the model through "
            "snens.baselines.BatchEnsemble, which repeats (B, …) inputs to (M·B, …)"
        )


def _member_affine(x: Tensor, scale: Tensor, shift: Tensor | None, dim: int) -> Tensor:
    """x (M·B, …) with features at ``dim`` times scale[m] (+ shift[m]) on member m's rows."""
    M, C = scale.shape
    xm = x.reshape(M, x.shape[0] // M, *x.shape[1:])  # (M, B, …)
    view = (M,) + (1,) * dim + (C,) + (1,) * (x.dim() - dim - 1)
    if shift is None:
        out = xm * scale.reshape(view)
    else:
        out = torch.addcmul(shift.reshape(view), xm, scale.reshape(view))
    return out.reshape(x.shape)


class _FastWeights:
    """r (M, in), s (M, out) and the per-member bias (M, out), mixed in before ``nn.Linear`` /
    ``nn.Conv2d``, whose ``weight`` is the shared weight."""

    num_members: int
    init_std: float
    random_sign: bool
    #: members along dimension 0 (:mod:`snens.nn.layout`)
    member_major: bool = True

    def _make_fast_weights(
        self, in_features: int, out_features: int, bias: bool, factory: dict
    ) -> None:
        M = self.num_members
        self.r = nn.Parameter(torch.empty(M, in_features, **factory))
        self.s = nn.Parameter(torch.empty(M, out_features, **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(M, out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self._reset_members()

    def reset_parameters(self) -> None:
        """The plain layer's initialization of the shared weight, then r, s and member biases."""
        super().reset_parameters()
        if "r" in self._parameters:  # not yet during the plain layer's __init__
            self._reset_members()

    @torch.no_grad()
    def _reset_members(self) -> None:
        if self.bias is not None:  # the plain layer's rule, drawn per member
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
            bound = fan_in**-0.5 if fan_in > 0 else 0.0
            self.bias.uniform_(-bound, bound)
        self.reset_fast_weights()

    @torch.no_grad()
    def reset_fast_weights(
        self,
        init_std: float | None = None,
        random_sign: bool | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        """r, s ~ N(1, init_std²), or ±1 with ``random_sign``; None: the layer's own settings."""
        init_std = self.init_std if init_std is None else init_std
        random_sign = self.random_sign if random_sign is None else random_sign
        if not 0 <= init_std <= _MAX_INIT_STD:
            raise ValueError(
                f"init_std must be a number in [0, {_MAX_INIT_STD:g}], got {init_std}; the "
                "paper's is 0.5"
            )
        for p in (self.r, self.s):
            if random_sign:
                draw = torch.rand(p.shape, generator=generator).lt(0.5).float().mul(2).sub(1)
            else:
                draw = torch.randn(p.shape, generator=generator).mul(init_std).add(1)
            p.copy_(draw.to(p))

    @classmethod
    def from_plain(
        cls,
        plain: nn.Linear | nn.Conv2d,
        num_members: int,
        *,
        init_std: float = 0.5,
        random_sign: bool = False,
        generator: torch.Generator | None = None,
    ) -> _FastWeights:
        """A BatchEnsemble layer sharing ``plain.weight`` (the same parameter), every member's
        bias a copy of ``plain.bias``."""
        args, options = cls._plain_arguments(plain)
        layer = cls(
            *args,
            num_members,
            bias=plain.bias is not None,
            init_std=init_std,
            random_sign=random_sign,
            device=plain.weight.device,
            dtype=plain.weight.dtype,
            **options,
        )
        layer.weight = plain.weight  # the same parameter: pretrained, and tied if it was tied
        if layer.bias is not None:
            with torch.no_grad():
                layer.bias.copy_(plain.bias.detach().unsqueeze(0).expand_as(layer.bias))
        layer.reset_fast_weights(generator=generator)
        return layer.train(plain.training)

    def _fast_weights_repr(self) -> str:
        return f"num_members={self.num_members}, bias={self.bias is not None}"


class BatchEnsembleLinear(_FastWeights, nn.Linear):
    """``nn.Linear`` with rank-1 fast weights: y_m = ((x_m ⊙ r_m) Wᵀ) ⊙ s_m + b_m.

    ``weight`` (K, D) is shared; ``r`` (M, D), ``s`` (M, K) and ``bias`` (M, K, if ``bias``) are
    per member, r, s ~ N(1, init_std²) or ±1 with ``random_sign``; input (M·B, *, D),
    member-major."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_members: int,
        bias: bool = True,
        *,
        init_std: float = 0.5,
        random_sign: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        factory = {"device": device, "dtype": dtype}
        nn.Linear.__init__(self, in_features, out_features, bias=False, **factory)
        self.num_members = check_num_members(num_members)
        self.init_std, self.random_sign = init_std, random_sign
        self._make_fast_weights(in_features, out_features, bias, factory)

    def forward(self, x: Tensor) -> Tensor:
        _check_rows(self, x, self.num_members)
        y = F.linear(_member_affine(x, self.r, None, dim=x.dim() - 1), self.weight)
        return _member_affine(y, self.s, self.bias, dim=y.dim() - 1)

    @staticmethod
    def _plain_arguments(linear: nn.Linear) -> tuple[tuple, dict]:
        return (linear.in_features, linear.out_features), {}

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            + self._fast_weights_repr()
        )


class BatchEnsembleConv2d(_FastWeights, nn.Conv2d):
    """``nn.Conv2d`` with rank-1 fast weights: y_m = conv(x_m ⊙ r_m, W) ⊙ s_m + b_m.

    ``weight`` is shared; ``r`` (M, C_in), ``s`` (M, C_out) and ``bias`` (M, C_out) are per
    member; input (M·B, C_in, H, W), member-major. Arguments as ``torch.nn.Conv2d`` and
    :class:`BatchEnsembleLinear`."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        num_members: int,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        *,
        init_std: float = 0.5,
        random_sign: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        factory = {"device": device, "dtype": dtype}
        nn.Conv2d.__init__(
            self,
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=False,
            padding_mode=padding_mode,
            **factory,
        )
        self.num_members = check_num_members(num_members)
        self.init_std, self.random_sign = init_std, random_sign
        self._make_fast_weights(in_channels, out_channels, bias, factory)

    def forward(self, x: Tensor) -> Tensor:
        _check_rows(self, x, self.num_members)
        y = self._conv_forward(_member_affine(x, self.r, None, dim=1), self.weight, None)
        return _member_affine(y, self.s, self.bias, dim=1)

    @staticmethod
    def _plain_arguments(conv: nn.Conv2d) -> tuple[tuple, dict]:
        options = ("stride", "padding", "dilation", "groups", "padding_mode")
        return (conv.in_channels, conv.out_channels, conv.kernel_size), {
            k: getattr(conv, k) for k in options
        }

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, " + self._fast_weights_repr()
        )


class BatchEnsemble(nn.Module):
    """A model of BatchEnsemble layers of ``num_members`` members: (B, …) -> (M, B, K);
    ``output`` picks the logits from the model's output, ``report`` is :func:`batch_ensemble`'s.

    Raises:
        ValueError: if the model holds no BatchEnsemble layer or one with a different M.
    """

    def __init__(
        self,
        model: nn.Module,
        num_members: int,
        *,
        output: Callable[[Any], Tensor] | None = None,
        report: ConversionReport | None = None,
    ) -> None:
        super().__init__()
        self.num_members = check_num_members(num_members)
        layers = [(n, m) for n, m in model.named_modules() if isinstance(m, _FastWeights)]
        if not layers:
            raise ValueError(
                f"{type(model).__name__} holds no BatchEnsemble layer; use "
                f"snens.baselines.batch_ensemble(model, num_members={num_members})"
            )
        for name, m in layers:
            if m.num_members != num_members:
                raise ValueError(
                    f"{name} has num_members={m.num_members}, the ensemble num_members="
                    f"{num_members}; build every layer with the same M"
                )
        self.model = model
        self.output = output
        self.report = report

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return forward_repeated(self.model, self.num_members, args, kwargs, output=self.output)

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}"


def batch_ensemble(
    model: nn.Module,
    num_members: int,
    *,
    init_std: float = 0.5,
    random_sign: bool = False,
    generator: torch.Generator | None = None,
    output: Callable[[Any], Tensor] | None = None,
    inplace: bool = False,
) -> BatchEnsemble:
    """Turn any model (a deep copy unless ``inplace``) into a BatchEnsemble: every ``nn.Conv2d``
    and ``nn.Linear`` (exact types: not ``nn.MultiheadAttention``'s ``out_proj``) shared, with
    r and s drawn by ``init_std``, ``random_sign`` and ``generator`` (0: every member the
    original model); ``output`` as :class:`BatchEnsemble`.

    Returns:
        A :class:`BatchEnsemble` whose ``report`` lists the converted layers.

    Raises:
        ValueError: if the model has no ``nn.Conv2d`` or ``nn.Linear``.
    """
    check_num_members(num_members)
    target = model if inplace else copy.deepcopy(model)
    params_before = sum(p.numel() for p in target.parameters())
    kinds = {nn.Conv2d: BatchEnsembleConv2d, nn.Linear: BatchEnsembleLinear}

    def make(name: str, module: nn.Module) -> nn.Module | None:
        cls = kinds.get(type(module))
        if cls is None:
            return None
        return cls.from_plain(
            module, num_members, init_std=init_std, random_sign=random_sign, generator=generator
        )

    replaced = replace_modules(target, make)
    if not replaced:
        raise ValueError(
            f"{type(model).__name__} has no nn.Conv2d or nn.Linear layer for BatchEnsemble to share"
        )
    adapted = adapt(target)
    linears = [n for n, _, new in replaced if isinstance(new, BatchEnsembleLinear)]
    report = ConversionReport(
        num_members=num_members,
        converted=tuple((n, type(old).__name__, type(new).__name__) for n, old, new in replaced),
        head=linears[-1] if linears else None,
        params_before=params_before,
        params_after=sum(p.numel() for p in target.parameters()),
        notes=("rank-1 fast weights on every layer above; norms stay shared between members",)
        + adapted,
    )
    return BatchEnsemble(target, num_members, output=output, report=report)
