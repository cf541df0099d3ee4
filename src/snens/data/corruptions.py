"""CIFAR-10-C corruptions (Hendrycks & Dietterich 2019) generated on tensors, from a seed.

The 15 standard corruptions × 5 severities with the CIFAR-C constants of
``ImageNet-C/create_c/make_cifar_c.py`` in hendrycks/robustness, for images ``(N, C, H, W)``
with 1 or 3 channels and H, W ≥ 28; extras (the "held-out" set): ``speckle_noise``,
``gaussian_blur``, ``saturate`` (3 channels only). Spatter needs OpenCV and is not provided.
Use the released ``.npy`` files when you have them. JPEG needs Pillow.

Every draw comes from one ``numpy.random.Generator`` seeded by ``(seed, name, severity)``, on
the CPU, so the output is the same on every device; parameters are drawn per image.

Differences from the released files: ``frost`` blends five synthetic textures (not the
reference's photographs), so its error rates are not comparable; ``motion_blur`` and ``snow``
re-implement ImageMagick in torch; nothing is rounded to 8 bits between steps (uint8 inputs
give rounded uint8 outputs); constants scale with the image size (the reference hard-codes
32 px); 1-channel images stay 1-channel.
"""

from __future__ import annotations

import io
import math
import numbers
import zlib
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from .filters import (
    box_resize_matrix,
    clipped_zoom,
    disk_kernel,
    filter2d,
    gaussian_blur,
    gray,
    hsv_to_rgb,
    motion_blur,
    rgb_to_hsv,
)

__all__ = [
    "CIFAR_C_CONSTANTS",
    "CORRUPTIONS",
    "EXTRA_CORRUPTIONS",
    "SEVERITIES",
    "corrupt",
    "corrupted",
]

CORRUPTIONS = tuple(
    "gaussian_noise shot_noise impulse_noise defocus_blur glass_blur motion_blur zoom_blur snow "
    "frost fog brightness contrast elastic_transform pixelate jpeg_compression".split()
)
EXTRA_CORRUPTIONS = ("speckle_noise", "gaussian_blur", "saturate")
SEVERITIES = (1, 2, 3, 4, 5)
MIN_SIZE = 28

# make_cifar_c.py, index = severity - 1. Zoom blur holds np.arange(start, stop, step)
# arguments; elastic_transform holds fractions of IMSIZE (alpha, sigma, affine jitter).
CIFAR_C_CONSTANTS: dict[str, tuple] = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    "shot_noise": (500, 250, 100, 75, 50),
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
    "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
    "motion_blur": ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),
    "zoom_blur": tuple((1, stop, 0.01) for stop in (1.06, 1.11, 1.16, 1.21, 1.26)),
    "snow": (
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
        (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
    ),
    "frost": ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)),
    "fog": ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)),
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    "elastic_transform": (
        (0, 0, 0.08),
        (0.05, 0.2, 0.07),
        (0.08, 0.06, 0.06),
        (0.1, 0.04, 0.05),
        (0.1, 0.03, 0.03),
    ),
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
    "jpeg_compression": (80, 65, 58, 50, 40),
    "speckle_noise": (0.06, 0.1, 0.12, 0.16, 0.2),
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1),
    "saturate": ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)),
}

_FROST_TEXTURES = 5  # the reference draws np.random.randint(5) over its frost photographs
_FROST_TEXTURE_SEED = 20190101  # fixed: the textures play the role of fixed image files
_FROST_MEAN = 0.45
_FROST_TINT = (0.84, 0.92, 1.0)  # ice: bright, slightly blue
_FROST_BACKGROUND = (0.03, 0.06, 0.10)  # dark blue-gray glass between the crystals

_Fn = Callable[[torch.Tensor, np.random.Generator, object], torch.Tensor]


def _normal(rng: np.random.Generator, loc, scale, shape, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(rng.normal(loc, scale, shape), dtype=like.dtype, device=like.device)


def _gaussian_noise(x, rng, c):
    return x + _normal(rng, 0.0, c, x.shape, x)


def _shot_noise(x, rng, c):
    rate = (x * c).double().cpu().numpy()
    return torch.as_tensor(rng.poisson(rate) / c, dtype=x.dtype, device=x.device)


def _impulse_noise(x, rng, c):
    # skimage.util.random_noise(mode="s&p"): each value flips with probability c, half to 1.
    flipped = torch.as_tensor(rng.random(x.shape) < c, device=x.device)
    salt = torch.as_tensor(rng.random(x.shape) < 0.5, device=x.device)
    return torch.where(flipped, salt.to(x.dtype), x)


def _speckle_noise(x, rng, c):
    return x + x * _normal(rng, 0.0, c, x.shape, x)


def _defocus_blur(x, rng, c):
    return filter2d(x, disk_kernel(*c), "mirror")  # cv2.filter2D's default border


def _glass_shuffle(x: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """One pass of the reference's pixel "swap" loop (max_delta = 1) as one gather.

    The reference's swap assigns NumPy views, so it copies the up/left neighbour into (h, w) and
    leaves the neighbour as it is (numpy/numpy#14428).
    """
    n, c, h, w = x.shape
    if dx.min() < -1 or dy.min() < -1 or dx.max() > 0 or dy.max() > 0:
        raise ValueError("glass blur offsets must be in {-1, 0} (max_delta = 1)")
    rows = torch.arange(h, device=x.device)
    cols = torch.arange(w, device=x.device)
    visited = ((rows >= 2) & (rows < h))[:, None] & ((cols >= 2) & (cols < w))[None, :]
    dx, dy = dx.to(x.device) * visited, dy.to(x.device) * visited
    index = ((rows[:, None] + dy) * w + cols[None, :] + dx).reshape(n, 1, h * w)
    return x.reshape(n, c, h * w).gather(2, index.expand(n, c, h * w)).view_as(x)


def _glass_blur(x, rng, c):
    sigma, max_delta, iterations = c
    n, _, h, w = x.shape
    x = torch.floor(gaussian_blur(x, sigma) * 255) / 255  # np.uint8(... * 255)
    for _ in range(iterations):
        # randint(-max_delta, max_delta): the upper end is exclusive, so {-1, 0}.
        dx, dy = torch.as_tensor(rng.integers(-max_delta, max_delta, size=(2, n, h, w)))
        x = _glass_shuffle(x, dx, dy)
    return gaussian_blur(x, sigma)


def _motion_blur(x, rng, c):
    return motion_blur(x, c[0], c[1], rng.uniform(-45, 45, x.shape[0]))


def _zoom_blur(x, rng, c):
    factors = np.arange(*c)  # float arange as the reference: 7, 12, 16, 21, 26 factors
    out = x.clone()
    for factor in factors:
        out += clipped_zoom(x, float(factor))
    return out / (len(factors) + 1)


def _snow(x, rng, c):
    loc, scale, zoom, threshold, radius, sigma, mix = c
    n, _, h, w = x.shape
    layer = clipped_zoom(_normal(rng, loc, scale, (n, 1, h, w), x), zoom)
    layer = torch.where(layer < threshold, 0.0, layer)
    layer = torch.floor(layer.clamp(0, 1) * 255) / 255  # PIL "L" image via astype(uint8)
    layer = motion_blur(layer, radius, sigma, rng.uniform(-135, -45, n))
    layer = torch.round(layer * 255) / 255  # ImageMagick writes 8 bits
    x = mix * x + (1 - mix) * torch.maximum(x, gray(x) * 1.5 + 0.5)
    return x + layer + torch.rot90(layer, 2, dims=(2, 3))


def _plasma_fractal(rng: np.random.Generator, n: int, size: int, decay: float) -> np.ndarray:
    """The reference's diamond-square height map, n at once: (n, size, size) in [0, 1]."""
    field = np.zeros((n, size, size))
    step, wibble = size, 100.0
    while step >= 2:
        half = step // 2

        def wibbled_mean(total: np.ndarray, wibble: float = wibble) -> np.ndarray:
            return total / 4 + wibble * rng.uniform(-wibble, wibble, total.shape)

        corners = field[:, 0::step, 0::step]
        square = corners + np.roll(corners, -1, axis=1)
        square = square + np.roll(square, -1, axis=2)
        field[:, half::step, half::step] = wibbled_mean(square)
        centres = field[:, half::step, half::step]
        corners = field[:, 0::step, 0::step]
        left = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=2)
        field[:, 0::step, half::step] = wibbled_mean(left)
        top = centres + np.roll(centres, 1, axis=2) + corners + np.roll(corners, -1, axis=1)
        field[:, half::step, 0::step] = wibbled_mean(top)
        step //= 2
        wibble /= decay
    field -= field.min(axis=(1, 2), keepdims=True)
    return field / field.max(axis=(1, 2), keepdims=True)


def _fog(x, rng, c):
    n, _, h, w = x.shape
    size = max(32, 1 << (max(h, w) - 1).bit_length())  # a power of two ≥ the image
    fractal = _plasma_fractal(rng, n, size, c[1])[:, None, :h, :w]
    peak = x.amax(dim=(1, 2, 3), keepdim=True)
    x = x + c[0] * torch.as_tensor(fractal, dtype=x.dtype, device=x.device)
    return x * peak / (peak + c[0])


@lru_cache(maxsize=4)
def _frost_textures(size: int) -> torch.Tensor:
    """Five fixed synthetic frost textures, (5, 3, size, size) in [0, 1]."""
    rng = np.random.default_rng(_FROST_TEXTURE_SEED)
    textures = []
    for _ in range(_FROST_TEXTURES):
        veins = torch.zeros(1, 1, size, size, dtype=torch.float64)
        for cells, weight in ((6, 1.0), (12, 0.7), (24, 0.45), (48, 0.3)):
            noise = torch.as_tensor(rng.standard_normal((1, 1, cells + 1, cells + 1)))
            noise = F.interpolate(noise, size=(size, size), mode="bicubic", align_corners=True)
            veins += weight * (1 - noise.abs().clamp(max=1)) ** 6
        dots = torch.as_tensor(rng.random((16, 1, size, size)) < 0.004, dtype=torch.float64)
        dots *= torch.as_tensor(rng.uniform(0.5, 1.0, (16, 1, size, size)))
        streaks = motion_blur(dots, max(2, size // 24), size / 48, rng.uniform(0, 360, 16))
        texture = veins[0, 0] / veins.amax() + 3 * streaks.sum(0)[0]
        texture = gaussian_blur(texture[None, None], 0.5)[0, 0]
        texture = (texture / torch.quantile(texture, 0.995)).clamp(0, 1)
        low, high = 0.05, 20.0  # bisect the gamma that gives the target mean
        for _ in range(40):
            gamma = math.sqrt(low * high)
            low, high = (gamma, high) if texture.pow(gamma).mean() > _FROST_MEAN else (low, gamma)
        texture = texture.pow(gamma)
        tint = torch.tensor(_FROST_TINT, dtype=torch.float64)[:, None, None]
        background = torch.tensor(_FROST_BACKGROUND, dtype=torch.float64)[:, None, None]
        textures.append(texture * tint + (1 - texture) * background)
    return torch.stack(textures).float()


def _frost(x, rng, c):
    n, channels, h, w = x.shape
    size = 4 * max(h, w)
    textures = _frost_textures(size).to(device=x.device, dtype=x.dtype)
    if channels == 1:
        textures = gray(textures)
    pick = torch.as_tensor(rng.integers(_FROST_TEXTURES, size=n), device=x.device)
    top = torch.as_tensor(rng.integers(0, size - h, n), device=x.device)
    left = torch.as_tensor(rng.integers(0, size - w, n), device=x.device)
    rows = (top[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (left[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    chans = torch.arange(channels, device=x.device)[None, :, None, None]
    frost = textures[pick[:, None, None, None], chans, rows, cols]
    return c[0] * x + c[1] * frost


def _brightness(x, rng, c):
    if x.shape[1] == 1:
        return x + c
    hsv = rgb_to_hsv(x)
    hsv[:, 2] = (hsv[:, 2] + c).clamp(0, 1)
    return hsv_to_rgb(hsv)


def _saturate(x, rng, c):
    hsv = rgb_to_hsv(x)
    hsv[:, 1] = (hsv[:, 1] * c[0] + c[1]).clamp(0, 1)
    return hsv_to_rgb(hsv)


def _contrast(x, rng, c):
    mean = x.mean(dim=(2, 3), keepdim=True)
    return (x - mean) * c + mean


def _pixel_grid(x: torch.Tensor) -> torch.Tensor:
    """Pixel coordinates (H, W, 2) as (column, row) of an (N, C, H, W) batch."""
    h, w = x.shape[-2:]
    rows = torch.arange(h, dtype=x.dtype, device=x.device)
    cols = torch.arange(w, dtype=x.dtype, device=x.device)
    yy, xx = torch.meshgrid(rows, cols, indexing="ij")
    return torch.stack((xx, yy), -1)


def _warp_affine(x: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """out(p) = x(inverse · (p, 1)), bilinear: cv2.warpAffine with BORDER_REFLECT_101."""
    h, w = x.shape[-2:]
    grid = _pixel_grid(x)
    points = torch.cat((grid, torch.ones_like(grid[..., :1])), -1)  # (H, W, 3)
    source = torch.einsum("nij,hwj->nhwi", inverse.to(x), points)  # (N, H, W, 2)
    scale = torch.tensor([2 / (w - 1), 2 / (h - 1)], dtype=x.dtype, device=x.device)
    return F.grid_sample(
        x, source * scale - 1, mode="bilinear", padding_mode="reflection", align_corners=True
    )


def _displace(x: torch.Tensor, field: torch.Tensor) -> torch.Tensor:
    """out(p) = x(p + field(p)), field (N, 2, H, W) of (column, row) offsets, reflected border."""
    h, w = x.shape[-2:]
    target = _pixel_grid(x) + field.permute(0, 2, 3, 1)
    size = torch.tensor([w, h], dtype=x.dtype, device=x.device)
    grid = (2 * target + 1) / size - 1
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def _elastic_transform(x, rng, c):
    n, _, h, w = x.shape
    imsize = min(h, w)
    alpha, sigma, jitter = (imsize * v for v in c)
    # Random affine: three control points around the centre move by U(-jitter, jitter) px;
    # getAffineTransform solves for the map, warpAffine samples the source at its inverse.
    cx, cy, sq = w // 2, h // 2, imsize // 3
    src = np.array([[cx + sq, cy + sq], [cx + sq, cy - sq], [cx - sq, cy - sq]], np.float64)
    dst = src + rng.uniform(-jitter, jitter, (n, 3, 2))
    forward = np.zeros((n, 3, 3))
    forward[:, :2] = np.linalg.solve(np.c_[src, np.ones(3)], dst).transpose(0, 2, 1)
    forward[:, 2, 2] = 1
    x = _warp_affine(x, torch.as_tensor(np.linalg.inv(forward)[:, :2]))
    # Smooth random displacement: U(-1, 1) per pixel, Gaussian σ (mirrored, truncate 3), ×α.
    noise = torch.as_tensor(rng.uniform(-1, 1, (n, 2, h, w)), dtype=x.dtype, device=x.device)
    return _displace(x, gaussian_blur(noise, sigma, mode="reflect", truncate=3) * alpha)


def _box_resize(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    rows, cols = box_resize_matrix(x.shape[2], h).to(x), box_resize_matrix(x.shape[3], w).to(x)
    return torch.einsum("oh,nchw,pw->ncop", rows, x, cols)


def _pixelate(x, rng, c):
    _, _, h, w = x.shape
    return _box_resize(_box_resize(x, int(h * c), int(w * c)), h, w)


def _jpeg_compression(x, rng, c):
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError(
            "jpeg_compression needs Pillow: `pip install pillow` (the other corruptions do not)"
        ) from err
    pixels = torch.round(x.clamp(0, 1) * 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    mode = "L" if x.shape[1] == 1 else "RGB"
    out = np.empty_like(pixels)
    for i, image in enumerate(pixels):
        buffer = io.BytesIO()
        Image.fromarray(image.squeeze(-1) if mode == "L" else image).save(buffer, "JPEG", quality=c)
        decoded = np.asarray(Image.open(buffer))
        out[i] = decoded[..., None] if mode == "L" else decoded
    return torch.as_tensor(out, device=x.device).permute(0, 3, 1, 2).to(x.dtype) / 255


_FUNCTIONS: dict[str, _Fn] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "defocus_blur": _defocus_blur,
    "glass_blur": _glass_blur,
    "motion_blur": _motion_blur,
    "zoom_blur": _zoom_blur,
    "snow": _snow,
    "frost": _frost,
    "fog": _fog,
    "brightness": _brightness,
    "contrast": _contrast,
    "elastic_transform": _elastic_transform,
    "pixelate": _pixelate,
    "jpeg_compression": _jpeg_compression,
    "speckle_noise": _speckle_noise,
    "gaussian_blur": lambda x, rng, c: gaussian_blur(x, c),
    "saturate": _saturate,
}


def _check_name(name: object) -> str:
    if not isinstance(name, str) or name not in _FUNCTIONS:
        raise ValueError(
            f"unknown corruption {name!r}; choose from {CORRUPTIONS} or the extras "
            f"{EXTRA_CORRUPTIONS}"
        )
    return name


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_severity(severity: object) -> int:
    if not _is_int(severity) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
    return int(severity)


def _check_seed(seed: object) -> int:
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _check_images(images: object, name: str) -> None:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor (N, C, H, W), got {type(images)}")
    shape = tuple(images.shape)
    if images.dtype != torch.uint8 and not images.is_floating_point():
        raise TypeError(
            f"images must be floating point in [0, 1] or uint8, got {images.dtype} of shape {shape}"
        )
    if images.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {shape}")
    if images.shape[1] not in (1, 3):
        raise ValueError(f"images must have 1 or 3 channels (dim 1), got shape {shape}")
    if min(images.shape[2:]) < MIN_SIZE:
        raise ValueError(
            f"images must be at least {MIN_SIZE}×{MIN_SIZE} (the CIFAR-C constants are for "
            f"32 px), got shape {shape}; upsample first"
        )
    if name == "saturate" and images.shape[1] != 3:
        raise ValueError(f"saturate needs 3-channel (RGB) images, got shape {shape}")
    if images.is_floating_point() and images.numel():
        if torch.isnan(images).any():
            raise ValueError(f"images contain nan (shape {shape}); corrupt finite images in [0, 1]")
        low, high = images.aminmax()
        if low < 0 or high > 1:
            raise ValueError(
                f"images must be in [0, 1] (corrupt before normalizing), got values in "
                f"[{low.item():.4g}, {high.item():.4g}] for shape {shape}"
            )


def _generator(key: tuple[int, ...], name: str, severity: int) -> np.random.Generator:
    return np.random.default_rng([*key, zlib.crc32(name.encode()), severity])


def _corrupt(images: torch.Tensor, name: str, severity: int, key: tuple[int, ...]):
    if images.shape[0] == 0:
        return images.clone()
    work = torch.float64 if images.dtype == torch.float64 else torch.float32
    x = images.to(work) / 255 if images.dtype == torch.uint8 else images.to(work)
    constant = CIFAR_C_CONSTANTS[name][severity - 1]
    with torch.no_grad():
        out = _FUNCTIONS[name](x, _generator(key, name, severity), constant).clamp(0, 1)
    if images.dtype == torch.uint8:
        return torch.round(out * 255).to(torch.uint8)
    return out.to(images.dtype)


def corrupt(images: torch.Tensor, name: str, severity: int, *, seed: int = 0) -> torch.Tensor:
    """Apply one CIFAR-10-C corruption at one severity to a batch of images.

    Each image gets its own random draw; the batch is a deterministic function of
    ``(images, name, severity, seed)``, on any device.

    Args:
        images: ``(N, C, H, W)``, C ∈ {1, 3}, H, W ≥ 28; float in [0, 1] or uint8.
        name: one of :data:`CORRUPTIONS` (or :data:`EXTRA_CORRUPTIONS`).
        severity: 1 (mildest) … 5.
        seed: non-negative integer.

    Returns:
        The corrupted images, same shape, dtype and device, clipped to [0, 1] (uint8: [0, 255]).

    Raises:
        ValueError: unknown ``name``, bad severity, seed, shape or value range, ``saturate`` on 1
            channel.
        TypeError: not a tensor, or a dtype other than float or uint8.
        ImportError: ``jpeg_compression`` without Pillow.
    """
    name = _check_name(name)
    severity = _check_severity(severity)
    _check_images(images, name)
    return _corrupt(images, name, severity, (_check_seed(seed),))


def corrupted(
    images: torch.Tensor,
    labels: torch.Tensor,
    names: str | Sequence[str] = CORRUPTIONS,
    severities: int | Sequence[int] = SEVERITIES,
    *,
    seed: int = 0,
    batch_size: int = 1000,
) -> Iterator[tuple[str, int, torch.Tensor, torch.Tensor]]:
    """Yield every corrupted version of a data set, one ``(name, severity)`` at a time.

    Images are corrupted ``batch_size`` at a time; with ``batch_size ≥ N`` each output equals
    ``corrupt(images, name, severity, seed=seed)`` (a chunk starting at image s > 0 draws from
    ``(seed, s, name, severity)``). ``labels`` pass through unchanged.

    Yields:
        ``(name, severity, corrupted_images, labels)``, names outer, severities inner.

    Raises:
        ValueError: as :func:`corrupt` (checked before the first yield); ``labels`` not of
            length N; ``batch_size`` < 1.
    """
    names = (names,) if isinstance(names, str) else tuple(names)
    severities = (severities,) if isinstance(severities, numbers.Integral) else tuple(severities)
    names = tuple(_check_name(n) for n in names)
    severities = tuple(_check_severity(s) for s in severities)
    seed = _check_seed(seed)
    for name in names:
        _check_images(images, name)
    if len(labels) != len(images):
        raise ValueError(f"labels has length {len(labels)}, images has {len(images)}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    for name in names:
        for severity in severities:
            out = torch.empty_like(images)
            for start in range(0, len(images), batch_size):
                key = (seed,) if start == 0 else (seed, start)
                chunk = images[start : start + batch_size]
                out[start : start + batch_size] = _corrupt(chunk, name, severity, key)
            yield name, severity, out, labels
