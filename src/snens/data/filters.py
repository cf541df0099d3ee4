"""Image filters the corruptions are built from, in torch on (N, C, H, W) batches."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "LUMA",
    "box_resize_matrix",
    "clipped_zoom",
    "disk_kernel",
    "extend_index",
    "filter2d",
    "gaussian_blur",
    "gaussian_kernel",
    "gray",
    "hsv_to_rgb",
    "motion_blur",
    "rgb_to_hsv",
    "separable",
]

# ITU-R 601 luma, as OpenCV's RGB2GRAY (snow) and for the frost texture on 1 channel.
LUMA = (0.299, 0.587, 0.114)


def extend_index(n: int, pad: int, mode: str, device: torch.device) -> torch.Tensor:
    """Indices of a length-n axis padded by ``pad`` on both sides (pad > n works).

    ``nearest`` repeats the edge, ``reflect`` mirrors including the edge (d c b a | a b c d),
    ``mirror`` about the edge pixel (OpenCV ``BORDER_REFLECT_101``: c b | a b c d).
    """
    i = np.arange(-pad, n + pad)
    if mode == "nearest":
        i = np.clip(i, 0, n - 1)
    elif mode == "reflect":
        i = np.mod(i, 2 * n)
        i = np.where(i >= n, 2 * n - 1 - i, i)
    else:
        period = max(2 * n - 2, 1)
        i = np.mod(i, period)
        i = np.where(i >= n, period - i, i)
    return torch.as_tensor(i, device=device)


def filter2d(x: torch.Tensor, kernel: torch.Tensor, mode: str) -> torch.Tensor:
    """Correlate every channel of ``x`` (N, C, H, W) with one odd 2-D kernel, padded by mode."""
    n, c, h, w = x.shape
    kh, kw = kernel.shape
    # One depthwise convolution over all N·C planes: several times faster on the CPU than a
    # batch of N·C single-channel planes, and independent of the kernel size.
    y = x.reshape(1, n * c, h, w)
    y = y.index_select(2, extend_index(h, kh // 2, mode, x.device))
    y = y.index_select(3, extend_index(w, kw // 2, mode, x.device))
    weight = kernel.to(x).expand(n * c, 1, kh, kw)
    return F.conv2d(y, weight, groups=n * c).reshape(n, c, h, w)


def separable(x: torch.Tensor, kernel: torch.Tensor, mode: str) -> torch.Tensor:
    """The same 1-D kernel along H, then W (one 2-D pass when the kernel is short)."""
    if kernel.numel() == 1:
        return x * kernel.item()
    if kernel.numel() <= 9:
        return filter2d(x, torch.outer(kernel, kernel), mode)
    x = filter2d(x, kernel[:, None], mode)
    return filter2d(x, kernel[None, :], mode)


def gaussian_kernel(sigma: float, truncate: float) -> torch.Tensor:
    """scipy.ndimage's Gaussian taps: radius int(truncate·σ + 0.5), exp(−t²/2σ²), sum 1."""
    if sigma < 1e-15:  # scipy skips the axis
        return torch.ones(1, dtype=torch.float64)
    radius = int(truncate * sigma + 0.5)
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * t**2 / sigma**2)
    return k / k.sum()


def gaussian_blur(x: torch.Tensor, sigma: float, mode: str = "nearest", truncate=4.0):
    """skimage.filters.gaussian (scipy's gaussian_filter) on H and W; mode as scipy's."""
    return separable(x, gaussian_kernel(sigma, truncate), mode)


def disk_kernel(radius: float, alias_blur: float) -> torch.Tensor:
    """The reference's anti-aliased disk: a binary disk, sum 1, then a 3×3 Gaussian (σ)."""
    half = 8 if radius <= 8 else int(radius)
    t = np.arange(-half, half + 1)
    yy, xx = np.meshgrid(t, t, indexing="ij")
    disk = (xx**2 + yy**2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    ksize = 3 if radius <= 8 else 5  # as cv2.GaussianBlur(ksize=(3, 3) or (5, 5))
    g = np.exp(-((np.arange(ksize) - ksize // 2) ** 2) / (2 * alias_blur**2))
    g = torch.as_tensor(g / g.sum())
    blurred = separable(torch.as_tensor(disk)[None, None], g, "mirror")[0, 0]
    # Only the centre is non-zero: crop to the support so padding stays below the image size.
    rows = torch.nonzero(blurred.abs().sum(1) > 0)
    r = int(max(half - rows.min(), rows.max() - half))
    return blurred[half - r : half + r + 1, half - r : half + r + 1]


def clipped_zoom(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Zoom the centre by ``factor`` and crop to the input size (the reference's clipped_zoom,
    scipy's order-1 zoom: bilinear with ``align_corners=True``).
    """
    h, w = x.shape[-2:]
    ch, cw = math.ceil(h / factor), math.ceil(w / factor)
    top, left = (h - ch) // 2, (w - cw) // 2
    crop = x[..., top : top + ch, left : left + cw]
    oh, ow = round(ch * factor), round(cw * factor)
    if (oh, ow) != (ch, cw):
        crop = F.interpolate(crop, size=(oh, ow), mode="bilinear", align_corners=True)
    th, tw = (oh - h) // 2, (ow - w) // 2
    return crop[..., th : th + h, tw : tw + w]


def motion_blur(x: torch.Tensor, radius: int, sigma: float, angles: np.ndarray) -> torch.Tensor:
    """ImageMagick's MotionBlurImage with one angle (degrees) per image: weights
    k_i ∝ exp(−i²/2σ²), i < 2·radius + 1, taken at offsets ⌈i·cos θ − ½⌉, ⌈i·sin θ − ½⌉.
    """
    n, c, h, w = x.shape
    width = 2 * int(radius) + 1
    i = np.arange(width)
    k = np.exp(-(i**2) / (2 * sigma**2))
    k = k / k.sum()
    theta = np.deg2rad(angles)[:, None]  # (N, 1)
    dx = torch.as_tensor(np.ceil(i * np.cos(theta) - 0.5), dtype=torch.long, device=x.device)
    dy = torch.as_tensor(np.ceil(i * np.sin(theta) - 0.5), dtype=torch.long, device=x.device)
    rows = torch.arange(h, device=x.device)
    cols = torch.arange(w, device=x.device)
    flat = x.reshape(n, c, h * w)
    out = torch.zeros_like(flat)
    for j in range(width):
        yy = (rows[None, :, None] + dy[:, j, None, None]).clamp(0, h - 1)  # (N, H, 1)
        xx = (cols[None, None, :] + dx[:, j, None, None]).clamp(0, w - 1)  # (N, 1, W)
        index = (yy * w + xx).reshape(n, 1, h * w).expand(n, c, h * w)
        out += float(k[j]) * flat.gather(2, index)
    return out.reshape(n, c, h, w)


def box_resize_matrix(n_in: int, n_out: int) -> torch.Tensor:
    """Pillow's BOX resampling along one axis as an (n_out, n_in) matrix."""
    scale = n_in / n_out
    filter_scale = max(scale, 1.0)
    support = 0.5 * filter_scale
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        centre = (o + 0.5) * scale
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), n_in)
        t = (np.arange(lo, hi) - centre + 0.5) / filter_scale
        weights = ((t > -0.5) & (t <= 0.5)).astype(np.float64)
        if weights.sum() > 0:
            m[o, lo:hi] = weights / weights.sum()
    return torch.as_tensor(m)


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """skimage.color.rgb2hsv on (N, 3, H, W): H in [0, 1), S = Δ/V, V = max; ties → blue."""
    r, g, b = x.unbind(1)
    v = x.amax(1)
    delta = v - x.amin(1)
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    s = torch.where(delta > 0, delta / torch.where(v > 0, v, torch.ones_like(v)), 0.0)
    hue = torch.where(
        b == v, 4 + (r - g) / safe, torch.where(g == v, 2 + (b - r) / safe, (g - b) / safe)
    )
    hue = torch.where(delta > 0, torch.remainder(hue / 6, 1.0), 0.0)
    return torch.stack((hue, s, v), 1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_hsv`, the sector formula in closed form."""
    hue, s, v = hsv[:, 0:1], hsv[:, 1:2], hsv[:, 2:3]
    n = torch.tensor([5.0, 3.0, 1.0], dtype=hsv.dtype, device=hsv.device).view(1, 3, 1, 1)
    k = torch.remainder(n + 6 * hue, 6.0)
    return v - v * s * torch.minimum(k, 4 - k).clamp(0, 1)


def gray(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 1:
        return x
    return torch.einsum("c,nchw->nhw", torch.tensor(LUMA).to(x), x)[:, None]
