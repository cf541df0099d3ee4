"""Packed-Ensembles (Laurent et al., 2023): M narrow members packed into grouped convolutions.

Every hidden width C is scaled by α (each member has α·C/M channels) and every convolution split
into M·γ groups, so the members' channels never mix. As in the reference (torch-uncertainty), the
first convolution is not grouped, the first of every residual block uses γ = 1, γ is lowered
until each group has ``minimum_channels_per_group`` inputs, and the head is a grouped linear.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from snens.models.resnet import BasicBlock, Bottleneck
from snens.nn.norms import check_num_members

__all__ = [
    "PackedBasicBlock",
    "PackedBottleneck",
    "PackedConv2d",
    "PackedLinear",
    "PackedResNet",
    "PackedSmallCNN",
    "packed_resnet18",
    "packed_resnet50",
    "packed_small_cnn",
]

NormLayer = Callable[[int], nn.Module]
_MAX_ALPHA = 64


def _check_packing(num_members: int, alpha: float, gamma: int) -> None:
    check_num_members(num_members)
    if not (
        isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and 0 < alpha <= _MAX_ALPHA
    ):
        raise ValueError(
            f"alpha must be a number in (0, {_MAX_ALPHA}], got {alpha!r}; the paper uses alpha=2"
        )
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an int >= 1, got {gamma!r}; the paper uses gamma=2")


def member_width(channels: int, num_members: int, alpha: float) -> int:
    """Channels of one member where a single model has ``channels``: ⌈α·C / M⌉."""
    return math.ceil(alpha * channels / num_members)


def _member_widths(
    in_size: int, out_size: int, num_members: int, alpha: float, first: bool, last: bool
) -> tuple[int, int]:
    """One member's inputs and outputs: the plain input of the ``first`` layer, the plain output
    of the ``last``, else :func:`member_width`."""
    member_in = in_size if first else member_width(in_size, num_members, alpha)
    return member_in, out_size if last else member_width(out_size, num_members, alpha)


def _groups_per_member(member_in: int, member_out: int, gamma: int, minimum: int) -> int:
    """The largest g ≤ γ that divides both widths and leaves ≥ ``minimum`` inputs per group."""
    for g in range(gamma, 1, -1):
        if member_in % g == 0 and member_out % g == 0 and member_in // g >= minimum:
            return g
    return 1


def _packing(network: nn.Module, num_members: int, alpha: float, gamma: int, minimum: int) -> dict:
    """The packing options of ``network``'s layers, checked, and kept on it."""
    _check_packing(num_members, alpha, gamma)
    network.num_members, network.alpha, network.gamma = num_members, alpha, gamma
    names = ("num_members", "alpha", "gamma", "minimum_channels_per_group")
    return dict(zip(names, (num_members, alpha, gamma, minimum)))


def _init_members(network: nn.Module) -> None:
    """Kaiming-normal (fan-out, ReLU) of one group: what each plain member would get."""
    for module in network.modules():
        if isinstance(module, PackedConv2d):
            fan_out = module.out_channels // module.groups * math.prod(module.kernel_size)
            nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_out))


def _read_out(network: nn.Module, features: Tensor) -> Tensor:
    """Pooled (B, M·c, H, W) features through the packed head, as (M, B, K) logits."""
    x = torch.flatten(network.avgpool(features), 1)
    logits = network.fc(x)  # (B, M·K), member-major
    return logits.reshape(x.shape[0], network.num_members, -1).transpose(0, 1)


class PackedConv2d(nn.Conv2d):
    """A convolution of M packed members: a ``nn.Conv2d`` with M·γ groups over widened channels,
    input (B, M·c_in, H, W), member-major.

    ``in_channels`` and ``out_channels`` are the single model's (the layer holds M·⌈α·C/M⌉ of
    each); ``gamma`` is lowered where a group would get fewer than ``minimum_channels_per_group``
    input channels; the ``first`` layer takes the plain input (B, C_in, H, W), ungrouped; in the
    ``last`` each member produces ``out_channels``. The other arguments are ``nn.Conv2d``'s."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        num_members: int = 4,
        alpha: float = 2,
        gamma: int = 2,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        *,
        first: bool = False,
        last: bool = False,
        minimum_channels_per_group: int = 64,
        device=None,
        dtype=None,
    ) -> None:
        _check_packing(num_members, alpha, gamma)
        M = num_members
        member_in, member_out = _member_widths(in_channels, out_channels, M, alpha, first, last)
        if first:  # the plain input, ungrouped
            gamma = 1
        else:
            gamma = _groups_per_member(member_in, member_out, gamma, minimum_channels_per_group)
        groups = 1 if first else M * gamma
        total_in = in_channels if first else M * member_in
        super().__init__(
            total_in,
            M * member_out,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
            padding_mode=padding_mode,
            device=device,
            dtype=dtype,
        )
        self.num_members = M
        self.alpha = alpha
        self.gamma = gamma  # after lowering
        self.first = first
        self.last = last

    def extra_repr(self) -> str:
        return super().extra_repr() + (
            f", num_members={self.num_members}, alpha={self.alpha}, gamma={self.gamma}"
            + (", first=True" if self.first else "")
            + (", last=True" if self.last else "")
        )


class PackedLinear(nn.Module):
    """A linear layer of M packed members: block-diagonal over M·γ groups of features, input
    (B, *, M·d), member-major; the arguments as :class:`PackedConv2d`'s."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_members: int = 4,
        alpha: float = 2,
        gamma: int = 1,
        bias: bool = True,
        *,
        first: bool = False,
        last: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        _check_packing(num_members, alpha, gamma)
        M = num_members
        member_in, member_out = _member_widths(in_features, out_features, M, alpha, first, last)
        if first:
            self.groups, self.in_features = 1, in_features
        else:
            self.groups = M * _groups_per_member(member_in, member_out, gamma, 1)
            self.in_features = M * member_in
        self.out_features = M * member_out
        self.num_members = M
        self.alpha, self.first, self.last = alpha, first, last
        factory = {"device": device, "dtype": dtype}
        G = self.groups
        self.weight = nn.Parameter(
            torch.empty(G, self.out_features // G, self.in_features // G, **factory)
        )
        self.bias = nn.Parameter(torch.empty(self.out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s rule per group: U(−1/√d_g, 1/√d_g), d_g the group's inputs."""
        bound = (self.in_features // self.groups) ** -0.5
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"PackedLinear expects {self.in_features} features (M={self.num_members} "
                f"members × {self.in_features // self.num_members}), got shape {tuple(x.shape)}"
            )
        G = self.groups
        xg = x.reshape(*x.shape[:-1], G, self.in_features // G)  # (…, G, d_g)
        y = torch.einsum("...gi,goi->...go", xg, self.weight).flatten(-2)  # (…, M·k)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"groups={self.groups}, num_members={self.num_members}, bias={self.bias is not None}"
        )


class PackedBasicBlock(BasicBlock):
    """ResNet basic block of packed members: conv3×3 (γ=1) – norm – ReLU – conv3×3 (γ) – norm, of
    the single model's widths, ``norm_layer`` called with the packed channel count, ``**packing``
    as :class:`PackedConv2d` takes them."""

    def __init__(
        self,
        in_planes: int,
        planes: int,
        stride: int = 1,
        norm_layer: NormLayer = nn.BatchNorm2d,
        **packing,
    ) -> None:
        nn.Module.__init__(self)  # not the plain block's: it builds plain convolutions
        no_gamma = {**packing, "gamma": 1}  # the block's first convolution is not sub-grouped
        self.conv1 = PackedConv2d(
            in_planes, planes, 3, stride=stride, padding=1, bias=False, **no_gamma
        )
        self.bn1 = norm_layer(self.conv1.out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = PackedConv2d(planes, planes, 3, padding=1, bias=False, **packing)
        self.bn2 = norm_layer(self.conv2.out_channels)
        self.downsample = _packed_downsample(in_planes, planes, stride, norm_layer, packing)


class PackedBottleneck(Bottleneck):
    """ResNet bottleneck of packed members: 1×1 (γ=1), 3×3 (γ, stride), 1×1 ×4 (γ), each normed;
    arguments as :class:`PackedBasicBlock`'s."""

    def __init__(
        self,
        in_planes: int,
        planes: int,
        stride: int = 1,
        norm_layer: NormLayer = nn.BatchNorm2d,
        **packing,
    ) -> None:
        nn.Module.__init__(self)  # not the plain block's: it builds plain convolutions
        out_planes = planes * self.expansion
        self.conv1 = PackedConv2d(in_planes, planes, 1, bias=False, **{**packing, "gamma": 1})
        self.bn1 = norm_layer(self.conv1.out_channels)
        self.conv2 = PackedConv2d(
            planes, planes, 3, stride=stride, padding=1, bias=False, **packing
        )
        self.bn2 = norm_layer(self.conv2.out_channels)
        self.conv3 = PackedConv2d(planes, out_planes, 1, bias=False, **packing)
        self.bn3 = norm_layer(self.conv3.out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _packed_downsample(in_planes, out_planes, stride, norm_layer, packing)


def _packed_downsample(
    in_planes: int, out_planes: int, stride: int, norm_layer: NormLayer, packing: dict
) -> nn.Sequential | None:
    if stride == 1 and in_planes == out_planes:
        return None
    conv = PackedConv2d(in_planes, out_planes, 1, stride=stride, bias=False, **packing)
    return nn.Sequential(conv, norm_layer(conv.out_channels))


class PackedResNet(nn.Module):
    """CIFAR ResNet of M packed members (3×3 stem, stride 1, no max pool): (B, …) -> (M, B, K).

    Same layout and names as :class:`snens.models.ResNet`, ``block`` and ``layers`` as there;
    each member is initialized as a plain ResNet would be (Kaiming-normal with the fan-out of its
    own group); ``norm_layer`` must not mix channels of different members."""

    def __init__(
        self,
        block: type[PackedBasicBlock | PackedBottleneck],
        layers: tuple[int, int, int, int],
        num_classes: int = 10,
        num_members: int = 4,
        alpha: float = 2,
        gamma: int = 2,
        in_channels: int = 3,
        norm_layer: NormLayer = nn.BatchNorm2d,
        minimum_channels_per_group: int = 64,
    ) -> None:
        super().__init__()
        packing = _packing(self, num_members, alpha, gamma, minimum_channels_per_group)
        self.conv1 = PackedConv2d(in_channels, 64, 3, padding=1, bias=False, first=True, **packing)
        self.bn1 = norm_layer(self.conv1.out_channels)
        self.relu = nn.ReLU(inplace=True)
        planes_in = 64
        stages = []
        for planes, num_blocks, stride in zip((64, 128, 256, 512), layers, (1, 2, 2, 2)):
            blocks = []
            for i in range(num_blocks):
                blocks.append(
                    block(planes_in, planes, stride if i == 0 else 1, norm_layer, **packing)
                )
                planes_in = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = PackedLinear(planes_in, num_classes, num_members, alpha, gamma=1, last=True)
        _init_members(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))  # (B, M·c, H, W)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return _read_out(self, x)


def packed_resnet18(
    num_classes: int = 10,
    num_members: int = 4,
    alpha: float = 2,
    gamma: int = 2,
    in_channels: int = 3,
    norm_layer: NormLayer = nn.BatchNorm2d,
    minimum_channels_per_group: int = 64,
) -> PackedResNet:
    """Packed-Ensembles of the CIFAR ResNet-18 (8.2 M parameters at K=10, α=2, γ=2, M=4).

    Returns:
        A new :class:`PackedResNet` of :class:`PackedBasicBlock` (2-2-2-2).

    Raises:
        TypeError, ValueError: ``num_members``, ``alpha`` or ``gamma`` out of range.
    """
    options = (num_classes, num_members, alpha, gamma, in_channels, norm_layer)
    return PackedResNet(PackedBasicBlock, (2, 2, 2, 2), *options, minimum_channels_per_group)


def packed_resnet50(
    num_classes: int = 10,
    num_members: int = 4,
    alpha: float = 2,
    gamma: int = 2,
    in_channels: int = 3,
    norm_layer: NormLayer = nn.BatchNorm2d,
    minimum_channels_per_group: int = 64,
) -> PackedResNet:
    """Packed-Ensembles of the CIFAR ResNet-50 (14.6 M parameters at K=10, α=2, γ=2, M=4).

    Returns:
        A new :class:`PackedResNet` of :class:`PackedBottleneck` (3-4-6-3).

    Raises:
        TypeError, ValueError: ``num_members``, ``alpha`` or ``gamma`` out of range.
    """
    options = (num_classes, num_members, alpha, gamma, in_channels, norm_layer)
    return PackedResNet(PackedBottleneck, (3, 4, 6, 3), *options, minimum_channels_per_group)


class PackedSmallCNN(nn.Module):
    """:class:`snens.models.SmallCNN` of M packed members: (B, C, H, W) -> (M, B, K), three
    stride-2 stages of widths (w, 2w, 4w) for ``width`` w, two conv3×3-norm-ReLU layers each."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        width: int = 32,
        num_members: int = 4,
        alpha: float = 2,
        gamma: int = 2,
        norm_layer: NormLayer = nn.BatchNorm2d,
        minimum_channels_per_group: int = 64,
    ) -> None:
        super().__init__()
        packing = _packing(self, num_members, alpha, gamma, minimum_channels_per_group)

        def layer(c_in: int, c_out: int, stride: int, first: bool = False) -> nn.Sequential:
            conv = PackedConv2d(
                c_in, c_out, 3, stride=stride, padding=1, bias=False, first=first, **packing
            )
            return nn.Sequential(conv, norm_layer(conv.out_channels), nn.ReLU(inplace=True))

        widths = (width, 2 * width, 4 * width)
        stages, channels = [], in_channels
        for i, out_channels in enumerate(widths):
            stages.append(
                nn.Sequential(
                    layer(channels, out_channels, 2, first=i == 0),
                    layer(out_channels, out_channels, 1),
                )
            )
            channels = out_channels
        self.stage1, self.stage2, self.stage3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = PackedLinear(channels, num_classes, num_members, alpha, gamma=1, last=True)
        _init_members(self)

    def forward(self, x: Tensor) -> Tensor:
        return _read_out(self, self.stage3(self.stage2(self.stage1(x))))


def packed_small_cnn(
    num_classes: int = 10,
    in_channels: int = 1,
    width: int = 32,
    num_members: int = 4,
    alpha: float = 2,
    gamma: int = 2,
    norm_layer: NormLayer = nn.BatchNorm2d,
    minimum_channels_per_group: int = 64,
) -> PackedSmallCNN:
    """Packed-Ensembles of :class:`snens.models.SmallCNN`; see :class:`PackedSmallCNN`.

    Returns:
        A new :class:`PackedSmallCNN`, (B, C, H, W) -> (M, B, K).

    Raises:
        TypeError, ValueError: ``num_members``, ``alpha`` or ``gamma`` out of range.
    """
    options = (num_classes, in_channels, width, num_members, alpha, gamma, norm_layer)
    return PackedSmallCNN(*options, minimum_channels_per_group)
