"""The standard ImageNet transforms in torch, on uint8 RGB tensors ``(3, H, W)``.

:class:`EvalTransform` matches torchvision's ``Resize(256) → CenterCrop(224) → ToTensor() →
Normalize`` up to the uint8 rounding of the PIL resize; :class:`TrainTransform` is the
random-resized crop (torchvision's sampling rule), flip and normalize.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "EvalTransform",
    "TrainTransform",
    "center_crop",
    "normalize",
    "resize_shorter",
]

#: Per-channel RGB mean and std of ImageNet (inputs in [0, 1]), as pretrained weights expect.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _resize(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Antialiased bilinear resize of one image ``(C, H, W)``, uint8 scaled to [0, 1] first."""
    x = image.float() / 255 if image.dtype == torch.uint8 else image.float()
    size = (height, width)  # x[None]: interpolate wants a batch (1, C, H, W)
    return F.interpolate(x[None], size, mode="bilinear", align_corners=False, antialias=True)[0]


def resize_shorter(image: torch.Tensor, size: int) -> torch.Tensor:
    """Resize (antialiased bilinear) so that the shorter side is ``size``, keeping the aspect ratio;
    uint8 input is scaled to [0, 1] first.
    """
    height, width = image.shape[-2:]
    if height <= width:
        return _resize(image, size, int(size * width / height))
    return _resize(image, int(size * height / width), size)


#: Longest resized side, as a multiple of the shorter, that :class:`EvalTransform` resizes whole;
#: past it (aspect ratios beyond 16:1) it resizes only the central strip that its crop keeps, so
#: a tiny 1 × 40 000 image no longer becomes a 256 × 10 240 000 intermediate.
MAX_RESIZE_ASPECT = 16


def _resize_shorter_central(image: torch.Tensor, size: int, keep: int) -> torch.Tensor:
    """The central ``keep`` columns (rows, for a tall image) of ``resize_shorter(image, size)``,
    computed from the source pixels they need only: memory ``size × keep``, not ``size × long``.

    The kept columns' antialiased bilinear weights are those ``F.interpolate`` uses (PyTorch's
    port of Pillow's triangle filter, its float32 scale and centers); the shorter side is then
    resized by ``F.interpolate`` itself. Equal to the whole-image path up to float rounding.
    """
    tall = image.shape[-2] > image.shape[-1]
    if tall:
        image = image.transpose(-1, -2)
    short, long = image.shape[-2:]
    out_long = int(size * long / short)  # as resize_shorter
    left = int(round((out_long - keep) / 2.0))  # as center_crop
    scale = np.float32(long) / np.float32(out_long)  # area_pixel_compute_scale, in float32
    support = scale if scale >= 1 else np.float32(1.0)
    invscale = 1 / float(scale) if scale >= 1 else 1.0
    centers = (float(scale) * (np.arange(left, left + keep) + 0.5)).astype(np.float32)
    lows = np.maximum((centers - support).astype(np.float64) + 0.5, 0).astype(np.int64)
    highs = np.minimum(((centers + support).astype(np.float64) + 0.5).astype(np.int64), long)
    start, stop = int(lows.min()), int(highs.max())
    columns = np.arange(start, stop)[None, :]  # (1, span) against (keep, 1)
    weights = np.clip(1 - np.abs((columns - centers[:, None] + 0.5) * invscale), 0, None)
    weights *= (columns >= lows[:, None]) & (columns < highs[:, None])
    weights /= weights.sum(axis=1, keepdims=True)
    window = image[..., start:stop]
    window = window.float() / 255 if window.dtype == torch.uint8 else window.float()
    strip = window @ torch.from_numpy(weights.T.astype(np.float32))  # (C, short, keep)
    strip = _resize(strip, size, keep)  # the shorter side; keep → keep is the identity
    return strip.transpose(-1, -2) if tall else strip


def center_crop(image: torch.Tensor, size: int) -> torch.Tensor:
    """The central ``size × size`` window, offsets rounded as torchvision's.

    Raises:
        ValueError: the image is smaller than ``size`` on a side.
    """
    height, width = image.shape[-2:]
    if height < size or width < size:
        raise ValueError(f"cannot crop {size}×{size} from an image of {height}×{width}")
    top, left = int(round((height - size) / 2.0)), int(round((width - size) / 2.0))
    return image[..., top : top + size, left : left + size]


def normalize(image: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(x − mean) / std`` per channel (dim −3)."""
    mean_t = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(-1, 1, 1)
    return (image - mean_t) / std_t


@dataclass(frozen=True)
class EvalTransform:
    """Resize the shorter side, center-crop, normalize: uint8 ``(3, H, W)`` → float32.

    Beyond :data:`MAX_RESIZE_ASPECT` only the part the crop keeps is resized (memory bounded).
    """

    resize: int = 256
    crop: int = 224
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        short, long = sorted(image.shape[-2:])
        if short > 0 and int(self.resize * long / short) > MAX_RESIZE_ASPECT * self.resize:
            resized = _resize_shorter_central(image, self.resize, self.crop)  # bounded memory
        else:
            resized = resize_shorter(image, self.resize)
        cropped = center_crop(resized, self.crop)
        return normalize(cropped, self.mean, self.std)


@dataclass(frozen=True)
class TrainTransform:
    """Random-resized crop (area fraction from ``scale``, aspect log-uniform in ``ratio``), flip and
    normalize; randomness from torch's global generator.
    """

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_prob: float = 0.5
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def crop_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """Draw ``(top, left, crop_height, crop_width)`` for an image of ``height × width``."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(*self.scale).item()
            aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, (1,)).item())
                left = int(torch.randint(0, width - w + 1, (1,)).item())
                return top, left, h, w
        aspect = width / height
        if aspect < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif aspect > max(self.ratio):
            w, h = int(round(height * max(self.ratio))), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        top, left, h, w = self.crop_box(*image.shape[-2:])
        crop = _resize(image[..., top : top + h, left : left + w], self.size, self.size)
        if torch.rand(()).item() < self.flip_prob:
            crop = crop.flip(-1)
        return normalize(crop, self.mean, self.std)
