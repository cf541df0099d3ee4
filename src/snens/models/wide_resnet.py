"""Wide ResNet (Zagoruyko & Komodakis, 2016) for CIFAR, with pre-activation blocks."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from snens.models.resnet import init_convs

__all__ = ["WideBasicBlock", "WideResNet", "wrn28_10"]

NormLayer = Callable[[int], nn.Module]


class WideBasicBlock(nn.Module):
    """Pre-activation block: norm-ReLU-conv3×3, norm-ReLU-dropout-conv3×3, plus a shortcut (a 1×1
    convolution of the pre-activated input where the shape changes).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int = 1,
        dropout: float = 0.0,
        norm_layer: NormLayer = nn.BatchNorm2d,
    ) -> None:
        super().__init__()
        self.bn1 = norm_layer(in_channels)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = norm_layer(out_channels)
        self.relu2 = nn.ReLU(inplace=True)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        pre = self.relu1(self.bn1(x))
        identity = x if self.shortcut is None else self.shortcut(pre)
        out = self.conv1(pre)
        out = self.conv2(self.dropout(self.relu2(self.bn2(out))))
        return out + identity


class WideResNet(nn.Module):
    """WRN-d-k: 3×3 stem, three stages of (d − 4) / 6 blocks of widths 16k, 32k, 64k, head ``fc``.

    Raises:
        ValueError: ``depth`` is not of the form 6n + 4.
    """

    def __init__(
        self,
        depth: int = 28,
        widen_factor: int = 10,
        num_classes: int = 10,
        dropout: float = 0.0,
        in_channels: int = 3,
        norm_layer: NormLayer = nn.BatchNorm2d,
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, …), got {depth}")
        blocks_per_stage = (depth - 4) // 6
        widths = (16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        stages, channels = [], 16
        for width, stride in zip(widths, (1, 2, 2)):
            blocks = []
            for i in range(blocks_per_stage):
                blocks.append(
                    WideBasicBlock(channels, width, stride if i == 0 else 1, dropout, norm_layer)
                )
                channels = width
            stages.append(nn.Sequential(*blocks))
        self.block1, self.block2, self.block3 = stages
        self.bn = norm_layer(channels)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        init_convs(self)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)  # (B, 16, H, W)
        x = self.block3(self.block2(self.block1(x)))  # (B, 64k, H/4, W/4)
        x = self.relu(self.bn(x))
        x = torch.flatten(self.avgpool(x), 1)  # (B, 64k)
        return self.fc(x)


def wrn28_10(
    num_classes: int = 10,
    dropout: float = 0.0,
    in_channels: int = 3,
    norm_layer: NormLayer = nn.BatchNorm2d,
) -> WideResNet:
    """WRN-28-10: 36,479,194 parameters at 10 classes, 25 norms.

    Returns:
        A new :class:`WideResNet`.
    """
    return WideResNet(28, 10, num_classes, dropout, in_channels, norm_layer)
