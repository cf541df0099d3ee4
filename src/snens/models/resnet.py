"""CIFAR ResNets (He et al., 2016) as in the Packed-Ensembles and uncertainty-baselines papers.

The stem is one 3×3 convolution with stride 1 and no max pool; names follow torchvision.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50"]

NormLayer = Callable[[int], nn.Module]


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def init_convs(model: nn.Module) -> None:
    """Kaiming-normal (fan-out, ReLU) convolutions; norms keep their own rule (a member norm's)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")


def _downsample(
    in_channels: int, out_channels: int, stride: int, norm_layer: NormLayer
) -> nn.Sequential | None:
    # projection shortcut (option B of the paper) only where the shape changes
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), norm_layer(out_channels)
    )


class BasicBlock(nn.Module):
    """Two 3×3 conv-norm layers with a residual connection: relu(x' + shortcut(x))."""

    expansion = 1

    def __init__(
        self, in_channels: int, planes: int, stride: int = 1, norm_layer: NormLayer = nn.BatchNorm2d
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, planes, stride)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = norm_layer(planes)
        self.downsample = _downsample(in_channels, planes, stride, norm_layer)

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1×1 reduce, 3×3 (strided, "ResNet v1.5"), 1×1 expand to 4 · ``planes``, with a residual."""

    expansion = 4

    def __init__(
        self, in_channels: int, planes: int, stride: int = 1, norm_layer: NormLayer = nn.BatchNorm2d
    ) -> None:
        super().__init__()
        out_channels = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = norm_layer(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = norm_layer(planes)
        self.conv3 = nn.Conv2d(planes, out_channels, 1, bias=False)
        self.bn3 = norm_layer(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(in_channels, out_channels, stride, norm_layer)

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """CIFAR ResNet: 3×3 stem, four stages of widths 64–512 (``layers`` blocks each), a head."""

    def __init__(
        self,
        block: type[BasicBlock | Bottleneck],
        layers: tuple[int, int, int, int],
        num_classes: int = 10,
        in_channels: int = 3,
        norm_layer: NormLayer = nn.BatchNorm2d,
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, 64)
        self.bn1 = norm_layer(64)
        self.relu = nn.ReLU(inplace=True)
        channels = 64
        stages = []
        for planes, num_blocks, stride in zip((64, 128, 256, 512), layers, (1, 2, 2, 2)):
            blocks = []
            for i in range(num_blocks):
                blocks.append(block(channels, planes, stride if i == 0 else 1, norm_layer))
                channels = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        init_convs(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))  # (B, 64, H, W)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))  # (B, 512·e, H/8, W/8)
        x = torch.flatten(self.avgpool(x), 1)  # (B, 512·e)
        return self.fc(x)


def resnet18(
    num_classes: int = 10, in_channels: int = 3, norm_layer: NormLayer = nn.BatchNorm2d
) -> ResNet:
    """CIFAR ResNet-18 (BasicBlock, 2-2-2-2): 11,173,962 parameters at 10 classes.

    Returns:
        A new :class:`ResNet`.
    """
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, in_channels, norm_layer)


def resnet50(
    num_classes: int = 10, in_channels: int = 3, norm_layer: NormLayer = nn.BatchNorm2d
) -> ResNet:
    """CIFAR ResNet-50 (Bottleneck, 3-4-6-3): 23,520,842 parameters at 10 classes.

    Returns:
        A new :class:`ResNet`.
    """
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, in_channels, norm_layer)
