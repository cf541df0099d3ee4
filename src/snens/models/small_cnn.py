"""A small, fast CNN for CPU experiments on 28×28 (Fashion-MNIST) and 32×32 images.

Strided convolutions instead of max pooling keep full-resolution activations out of the model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from snens.models.resnet import init_convs

__all__ = ["SmallCNN", "small_cnn"]

NormLayer = Callable[[int], nn.Module]


def _conv_norm_relu(
    in_channels: int, out_channels: int, stride: int, norm_layer: NormLayer
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        norm_layer(out_channels),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    """Six conv3×3-norm-ReLU layers in three stride-2 stages (w, 2w, 4w), average pool, head."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        width: int = 32,
        norm_layer: NormLayer = nn.BatchNorm2d,
    ) -> None:
        super().__init__()
        stages, channels = [], in_channels
        for out_channels in (width, 2 * width, 4 * width):
            stages.append(
                nn.Sequential(
                    _conv_norm_relu(channels, out_channels, 2, norm_layer),
                    _conv_norm_relu(out_channels, out_channels, 1, norm_layer),
                )
            )
            channels = out_channels
        self.stage1, self.stage2, self.stage3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        init_convs(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stage1(x)  # (B, w, H/2, W/2)
        x = self.stage2(x)  # (B, 2w, H/4, W/4)
        x = self.stage3(x)  # (B, 4w, H/8, W/8)
        x = torch.flatten(self.avgpool(x), 1)  # (B, 4w)
        return self.fc(x)


def small_cnn(
    num_classes: int = 10,
    in_channels: int = 1,
    width: int = 32,
    norm_layer: NormLayer = nn.BatchNorm2d,
) -> SmallCNN:
    """Build a :class:`SmallCNN`: 288,170 parameters at K=10, C=1, w=32.

    Returns:
        A new :class:`SmallCNN`.
    """
    return SmallCNN(num_classes, in_channels, width, norm_layer)
