"""Backbones in plain torch, built by name: ``snens.models.create("resnet18", num_classes=10)``.

Every model takes images (B, C, H, W) and returns logits (B, K); its classification head is
the last ``nn.Linear`` in ``named_modules()`` order, where :func:`snens.convert` looks for it.
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import math
import typing
from collections.abc import Callable

from torch import nn

from snens.models.llm import LLMClassifier, smollm2, smollm2_path
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
    "LLMClassifier",
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
    "smollm2",
    "smollm2_path",
    "vit_small",
    "wrn28_10",
]

Builder = Callable[..., nn.Module]

_BUILDERS: dict[str, Builder] = {
    b.__name__: b
    for b in (minilm, mobilenet_v2, resnet18, resnet50, small_cnn, smollm2, vit_small, wrn28_10)
}


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator adding a model builder to the registry under ``name``::

        @snens.models.register("my_net")
        def my_net(num_classes=10, **kwargs): ...

    Returns:
        The decorator, which returns the builder unchanged.

    Raises:
        ValueError: ``name`` is already registered.
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
    """Names accepted by :func:`create`.

    Returns:
        A new sorted list.
    """
    return sorted(_BUILDERS)


def create(name: str, num_classes: int | None = None, **kwargs) -> nn.Module:
    """Build a registered model by name.

    Args:
        name: one of :func:`available`.
        num_classes: K; ``None`` keeps the builder's default.
        **kwargs: passed to the builder (``in_channels``, ``norm_layer``, ``pretrained``, …).

    Returns:
        The builder's model.

    Raises:
        ValueError: an unknown name or option, a size that is not an int >= 1 or a rate that is
            not a finite number (checked before anything is built), or too little memory.
        FileNotFoundError, ImportError: from the builder, for weights or packages it needs.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available())}")
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    _check_options(name, _BUILDERS[name], kwargs)
    try:
        return _BUILDERS[name](**kwargs)
    except (RuntimeError, MemoryError) as error:
        # a size within its bound can still be too large for this machine
        if not isinstance(error, MemoryError) and "allocate" not in str(error):
            raise
        sizes = {k: v for k, v in kwargs.items() if isinstance(v, int) and not isinstance(v, bool)}
        raise ValueError(
            f"model {name!r} with {sizes} needs more memory than this machine has "
            f"({str(error).splitlines()[-1][:160]}); choose smaller sizes"
        ) from None


def _options(builder: Builder) -> tuple[dict[str, inspect.Parameter], bool]:
    """The keyword options of a builder (and of the class it returns, where it passes
    ``**kwargs`` on), and whether it takes any other."""
    signature = inspect.signature(builder, eval_str=True)
    named = {
        k: p
        for k, p in signature.parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    if not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return named, False
    returned = signature.return_annotation
    if (
        not (isinstance(returned, type) and issubclass(returned, nn.Module))
        or returned is nn.Module
    ):
        return named, True
    inner = inspect.signature(returned.__init__, eval_str=True).parameters
    for k, p in inner.items():
        if k != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            named.setdefault(k, p)
    return named, any(p.kind is p.VAR_KEYWORD for p in inner.values())


#: The largest size option (a width, depth, number of heads or classes).
_MAX_SIZE = 2**20


def _check_options(name: str, builder: Builder, kwargs: dict) -> None:
    named, open_ended = _options(builder)
    for key, value in kwargs.items():
        param = named.get(key)
        if param is None:
            if open_ended:
                continue
            close = difflib.get_close_matches(key, list(named), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ";"
            raise ValueError(
                f"model {name!r} has no option {key!r}{hint} its options: {', '.join(named)}"
            )
        if typing.get_origin(param.annotation) is collections.abc.Callable and not callable(value):
            raise ValueError(
                f"model {name!r}: {key} takes a Python callable (a norm class), got {value!r}, "
                "which a config cannot give; leave it out, or build the model in Python"
            )
        if param.annotation is int and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_SIZE
        ):
            raise ValueError(
                f"model {name!r}: {key} must be an int in 1..{_MAX_SIZE}, got {value!r}"
            )
        if param.annotation is float and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(f"model {name!r}: {key} must be a finite number, got {value!r}")
        if param.annotation is float and "dropout" in key and not 0 <= value < 1:
            raise ValueError(f"model {name!r}: {key} must be in [0, 1), got {value!r}")
        if param.annotation is float and "dropout" not in key and value <= 0:
            raise ValueError(f"model {name!r}: {key} must be > 0, got {value!r}")
