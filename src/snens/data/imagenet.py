"""ImageNet as a class-folder tree, and the standard ImageNet transforms written in torch.

ImageNet's licence forbids redistribution, so nothing downloads: get ILSVRC-2012 from
https://image-net.org and lay it out as ``<data root>/imagenet/{train,val}/<wnid>/*.JPEG``
(the validation images sorted into class folders, e.g. with the widely used ``valprep.sh``).

:class:`ImageFolder` is a small stand-in for torchvision's (which does not import with the CPU
torch here): classes are the sorted sub-folder names, indexed 0…K−1, samples the image files
under each, sorted. Images decode with Pillow (imported on first use) to uint8 RGB tensors
``(3, H, W)``; the transforms take such a tensor:

* :class:`EvalTransform` — resize the shorter side to 256, center-crop 224, scale to [0, 1] and
  normalize with the ImageNet mean and std. It matches torchvision's
  ``Resize(256) → CenterCrop(224) → ToTensor() → Normalize`` up to the uint8 rounding of the
  PIL resize (antialiased bilinear either way).
* :class:`TrainTransform` — random-resized crop (area 8–100 %, aspect 3/4–4/3, torchvision's
  sampling rule) to 224, horizontal flip, normalize.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from .download import data_root

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "EvalTransform",
    "ImageFolder",
    "TrainTransform",
    "center_crop",
    "imagenet_folder",
    "normalize",
    "read_image",
    "resize_shorter",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGENET_SPLITS = ("train", "val")


def _pillow_image():
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError("reading image files needs Pillow: pip install pillow") from err
    return Image


def read_image(path: str | os.PathLike) -> torch.Tensor:
    """Decode an image file to RGB (grayscale, palette and CMYK images are converted).

    Returns:
        uint8 tensor ``(3, H, W)``.

    Raises:
        ImportError: Pillow is not installed.
    """
    image_module = _pillow_image()
    with image_module.open(path) as image:
        array = np.asarray(image.convert("RGB"))
    return torch.from_numpy(array.copy()).permute(2, 0, 1)  # (H, W, 3) -> (3, H, W)


def _to_float(image: torch.Tensor) -> torch.Tensor:
    return image.float() / 255 if image.dtype == torch.uint8 else image.float()


def _resize(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    batch = _to_float(image)[None]  # (C, H, W) -> (1, C, H, W): interpolate wants a batch
    resized = F.interpolate(
        batch, (height, width), mode="bilinear", align_corners=False, antialias=True
    )
    return resized[0]


def resize_shorter(image: torch.Tensor, size: int) -> torch.Tensor:
    """Resize so that the shorter side is ``size``, keeping the aspect ratio.

    The longer side becomes ``int(size · long / short)`` (torchvision's rule); antialiased
    bilinear interpolation. uint8 input is scaled to [0, 1] first.

    Shape:
        image: ``(C, H, W)`` → float ``(C, H', W')``.
    """
    height, width = image.shape[-2:]
    if height <= width:
        return _resize(image, size, int(size * width / height))
    return _resize(image, int(size * height / width), size)


def center_crop(image: torch.Tensor, size: int) -> torch.Tensor:
    """The central ``size × size`` window; offsets ``round((H − size) / 2)`` as torchvision's.

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
    """Resize the shorter side, center-crop, normalize: the standard ImageNet evaluation view.

    Args:
        resize: shorter side after resizing.
        crop: side of the square center crop.
        mean: per-channel mean in [0, 1].
        std: per-channel standard deviation.

    Shape:
        uint8 ``(3, H, W)`` → float32 ``(3, crop, crop)``.
    """

    resize: int = 256
    crop: int = 224
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        cropped = center_crop(resize_shorter(image, self.resize), self.crop)
        return normalize(cropped, self.mean, self.std)


@dataclass(frozen=True)
class TrainTransform:
    """Random-resized crop and horizontal flip, then normalize: the standard ImageNet training
    view.

    The crop covers a fraction of the area drawn uniformly from ``scale`` with an aspect ratio
    drawn log-uniformly from ``ratio``; after 10 draws that do not fit, it falls back to the
    largest central crop with the aspect ratio clamped to ``ratio`` (torchvision's rule).
    Randomness comes from torch's global generator, which a DataLoader seeds per worker.

    Args:
        size: side of the square output.
        scale: range of the cropped fraction of the image area.
        ratio: range of the crop's width / height.
        flip_prob: probability of mirroring the width.
        mean: per-channel mean in [0, 1].
        std: per-channel standard deviation.

    Shape:
        uint8 ``(3, H, W)`` → float32 ``(3, size, size)``.
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


class ImageFolder(Dataset):
    """Images in class folders: ``root/<class>/**/<image>``, labelled by sorted class name.

    Args:
        root: folder whose sub-folders are the classes (hidden ones, starting with ``.``,
            are skipped); images are found recursively, by extension
            (:data:`IMAGE_EXTENSIONS`, case-insensitive), and sorted.
        transform: called on each uint8 ``(3, H, W)`` image, e.g. :class:`EvalTransform`.

    Attributes:
        classes: class names, sorted; ``class_to_idx`` maps them to labels.
        samples: ``(path, label)`` pairs; ``targets`` the labels alone.

    Raises:
        FileNotFoundError: ``root`` missing, without class folders, or with a class folder
            holding no image (named).
        ValueError: ``root`` holds images but no class folders (an unsorted validation set).
        ImportError: Pillow is not installed.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        _pillow_image()  # fail at construction, not in a DataLoader worker
        self.root = Path(root)
        self.transform = transform
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder {self.root} does not exist")
        entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        self.classes = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]
        if not self.classes:
            loose = [e.name for e in entries if _is_image(e.name)]
            if loose:
                raise ValueError(
                    f"{self.root} holds {len(loose)} images but no class folders; sort them into "
                    "one folder per class (for ImageNet's val set, e.g. with valprep.sh)"
                )
            raise FileNotFoundError(f"{self.root} has no class folders")
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.samples: list[tuple[Path, int]] = []
        empty = []
        for name in self.classes:
            files = _image_files(self.root / name)
            if not files:
                empty.append(name)
            self.samples.extend((path, self.class_to_idx[name]) for path in files)
        if empty:
            raise FileNotFoundError(
                f"{self.root}: class folders without images {empty[:10]}"
                f"{' …' if len(empty) > 10 else ''} (extensions {IMAGE_EXTENSIONS})"
            )
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        image = read_image(path)
        if self.transform is not None:
            image = self.transform(image)
        return image, label

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(root={str(self.root)!r}, classes={len(self.classes)}, "
            f"samples={len(self.samples)}, transform={self.transform!r})"
        )


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _image_files(folder: Path) -> list[Path]:
    files = []
    for directory, subdirs, names in os.walk(folder, followlinks=True):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        files.extend(Path(directory, n) for n in sorted(names) if _is_image(n))
    return files


def imagenet_folder(
    root: str | os.PathLike | None = None,
    split: str = "train",
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> ImageFolder:
    """ImageNet (ILSVRC-2012) train or val as an :class:`ImageFolder`; nothing downloads.

    Search order: ``<data root>/imagenet/<split>/`` (the data root is ``root``, else
    ``$SNENS_DATA``, else ``~/.cache/snens``), then, only when ``root`` is given,
    ``<root>/<split>/``: so ``root`` may also be the ImageNet folder itself.

    Args:
        root: data root, or the folder holding ``train/`` and ``val/``.
        split: ``"train"`` (1.28 M images) or ``"val"`` (50 000, sorted into class folders).
        transform: applied to each uint8 ``(3, H, W)`` image; e.g. :class:`EvalTransform` for
            evaluation, :class:`TrainTransform` for training.

    Returns:
        An :class:`ImageFolder` whose labels index the sorted WordNet ids (``n01440764`` = 0).

    Raises:
        ValueError: unknown ``split``; an unsorted (flat) split folder.
        FileNotFoundError: the split folder is missing; the message says where to put it.
        ImportError: Pillow is not installed.
    """
    if split not in IMAGENET_SPLITS:
        raise ValueError(f"split must be one of {list(IMAGENET_SPLITS)}, got {split!r}")
    candidates = [data_root(root) / "imagenet" / split]
    if root is not None:
        candidates.append(Path(root).expanduser() / split)
    folder = next((c for c in candidates if c.is_dir()), None)
    if folder is None:
        raise FileNotFoundError(
            f"ImageNet {split} not found at {' or '.join(str(c) for c in candidates)}. Its "
            "licence forbids redistribution, so it cannot be downloaded for you: get ILSVRC-2012 "
            f"from https://image-net.org and put it at {candidates[0]}/<wnid>/*.JPEG (val "
            "sorted into class folders too), or set SNENS_DATA (or root=) to the folder that "
            "holds imagenet/."
        )
    return ImageFolder(folder, transform=transform)
