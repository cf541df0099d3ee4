"""Backbones in plain torch, built by name.

Every model takes images (B, C, H, W) and returns logits (B, K); its norms are plain torch norms
(or whatever ``norm_layer`` builds) and its classification head is the last ``nn.Linear`` in
``named_modules()`` order, which is where :func:`snens.convert` looks for it.

    model = snens.models.create("resnet18", num_classes=10)
    snens.models.available()  # ['mobilenet_v2', 'resnet18', …]
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from snens.models.mobilenet_v2 import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    MobileNetV2,
    mobilenet_v2,
    pretrained_weights_path,
)
from snens.models.resnet import ResNet, resnet18, resnet50
from snens.models.small_cnn import SmallCNN, small_cnn
from snens.models.text import TextClassifier, minilm, minilm_path
from snens.models.vit import VisionTransformer, vit_small
from snens.models.wide_resnet import WideResNet, wrn28_10

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MobileNetV2",
    "ResNet",
    "SmallCNN",
    "TextClassifier",
    "VisionTransformer",
    "WideResNet",
    "available",
    "create",
    "minilm",
    "minilm_path",
    "mobilenet_v2",
    "pretrained_weights_path",
    "register",
    "resnet18",
    "resnet50",
    "small_cnn",
    "vit_small",
    "wrn28_10",
]

Builder = Callable[..., nn.Module]

_BUILDERS: dict[str, Builder] = {
    "minilm": minilm,
    "mobilenet_v2": mobilenet_v2,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "small_cnn": small_cnn,
    "vit_small": vit_small,
    "wrn28_10": wrn28_10,
}


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator adding a model builder to the registry under ``name``.

    Example::

        @snens.models.register("my_net")
        def my_net(num_classes=10, **kwargs): ...

    Raises:
        ValueError: if ``name`` is already registered.
    """

    def decorator(builder: Builder) -> Builder:
        if name in _BUILDERS:
            raise ValueError(
                f"a model named {name!r} is already registered ({_BUILDERS[name]!r}); "
                "choose another name"
            )
        _BUILDERS[name] = builder
        return builder

    return decorator


def available() -> list[str]:
    """Names accepted by :func:`create`, sorted."""
    return sorted(_BUILDERS)


def create(name: str, num_classes: int | None = None, **kwargs) -> nn.Module:
    """Build a registered model by name.

    Args:
        name: one of :func:`available`.
        num_classes: K; ``None`` keeps the builder's default (10, or 1000 for ``mobilenet_v2``).
        **kwargs: passed to the builder (``in_channels``, ``norm_layer``, ``pretrained``, …).

    Raises:
        ValueError: if ``name`` is not registered; the message lists the available names.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available())}")
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    return _BUILDERS[name](**kwargs)
