"""CIFAR-10-C corruptions on real images: invariants, severities, references, errors."""

from __future__ import annotations

import colorsys
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from snens.data import corruptions as C
from snens.data import filters
from snens.data.corruptions import (
    CIFAR_C_CONSTANTS,
    CORRUPTIONS,
    EXTRA_CORRUPTIONS,
    SEVERITIES,
    corrupt,
    corrupted,
)
from snens.data.images import load_fashion_mnist

RANDOM = {
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "glass_blur",
    "motion_blur",
    "snow",
    "frost",
    "fog",
    "elastic_transform",
    "speckle_noise",
}
ALL = CORRUPTIONS + EXTRA_CORRUPTIONS

# Mean |corrupted − clean| at severity 1 and 5 (seed 0): (gray batch), (rgb batch).
MEASURED_MAD = {
    "gaussian_noise": ((0.0231, 0.0561), (0.0311, 0.0748)),
    "shot_noise": ((0.0122, 0.0366), (0.0179, 0.0561)),
    "impulse_noise": ((0.0047, 0.0347), (0.0048, 0.0351)),
    "defocus_blur": ((0.0091, 0.0675), (0.0026, 0.0190)),
    "glass_blur": ((0.0627, 0.0959), (0.0210, 0.0320)),
    "motion_blur": ((0.0412, 0.0939), (0.0126, 0.0280)),
    "zoom_blur": ((0.0463, 0.0962), (0.0158, 0.0318)),
    "snow": ((0.0388, 0.1774), (0.0404, 0.2153)),
    "frost": ((0.0857, 0.1470), (0.0883, 0.1370)),
    "fog": ((0.0659, 0.2392), (0.0415, 0.1343)),
    "brightness": ((0.0492, 0.2709), (0.0339, 0.1989)),
    "contrast": ((0.0699, 0.2376), (0.0228, 0.0775)),
    "elastic_transform": ((0.1092, 0.0752), (0.0368, 0.0225)),
    "pixelate": ((0.0133, 0.0497), (0.0027, 0.0132)),
    "jpeg_compression": ((0.0120, 0.0263), (0.0233, 0.0319)),
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batches() -> dict[str, torch.Tensor]:
    """64 Fashion-MNIST test images (1 × 28 × 28) and 32 of them padded to 32 px, coloured."""
    images, _ = load_fashion_mnist("test")
    gray = images[:64].float() / 255
    g = torch.Generator().manual_seed(0)
    shape = F.pad(gray[:32], (2, 2, 2, 2))
    garment = torch.rand(32, 3, 1, 1, generator=g)
    background = 0.5 * torch.rand(32, 3, 1, 1, generator=g)
    return {"gray": gray, "rgb": shape * garment + (1 - shape) * background}


def _names(batch: str) -> tuple[str, ...]:
    return ALL if batch == "rgb" else tuple(n for n in ALL if n != "saturate")


CASES = [(batch, name) for batch in ("gray", "rgb") for name in _names(batch)]


@pytest.fixture(scope="module")
def outputs(batches) -> dict[tuple[str, str, int, int], torch.Tensor]:
    """Every corruption × severity on both batches with seed 0, the random ones also seed 1."""
    out = {}
    for batch, images in batches.items():
        for name in _names(batch):
            for severity in SEVERITIES:
                for seed in (0, 1) if name in RANDOM else (0,):
                    out[batch, name, severity, seed] = corrupt(images, name, severity, seed=seed)
    return out


def _mad(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().mean().item()


# ---------------------------------------------------------------- constants and invariants


def test_names_and_cifar_c_constants():
    assert CORRUPTIONS[:3] == ("gaussian_noise", "shot_noise", "impulse_noise")
    assert CORRUPTIONS[-3:] == ("elastic_transform", "pixelate", "jpeg_compression")
    assert len(CORRUPTIONS) == len(set(CORRUPTIONS)) == 15 and SEVERITIES == (1, 2, 3, 4, 5)
    assert set(CIFAR_C_CONSTANTS) == set(ALL)
    assert all(len(v) == 5 for v in CIFAR_C_CONSTANTS.values())
    # make_cifar_c.py values (not ImageNet-C's or Tiny-ImageNet-C's)
    assert CIFAR_C_CONSTANTS["gaussian_noise"] == (0.04, 0.06, 0.08, 0.09, 0.10)
    assert CIFAR_C_CONSTANTS["contrast"] == (0.75, 0.5, 0.4, 0.3, 0.15)
    assert CIFAR_C_CONSTANTS["brightness"] == (0.05, 0.1, 0.15, 0.2, 0.3)
    assert CIFAR_C_CONSTANTS["jpeg_compression"] == (80, 65, 58, 50, 40)
    assert CIFAR_C_CONSTANTS["pixelate"] == (0.95, 0.9, 0.85, 0.75, 0.65)
    assert CIFAR_C_CONSTANTS["motion_blur"][0] == (6, 1)
    assert CIFAR_C_CONSTANTS["motion_blur"][4] == (9, 2.5)
    # np.arange quirks of the reference: 7, 12, 16, 21, 26 zoom factors
    assert [len(np.arange(*c)) for c in CIFAR_C_CONSTANTS["zoom_blur"]] == [7, 12, 16, 21, 26]


@pytest.mark.parametrize(("batch", "name"), CASES)
def test_shape_dtype_range_and_change(batches, outputs, batch, name):
    clean = batches[batch]
    for severity in SEVERITIES:
        out = outputs[batch, name, severity, 0]
        assert out.shape == clean.shape and out.dtype == clean.dtype
        assert out.device == clean.device
        assert out.min() >= 0 and out.max() <= 1 and torch.isfinite(out).all()
        assert _mad(out, clean) > 1e-3, (name, severity)


@pytest.mark.parametrize(("batch", "name"), CASES)
def test_seeds(batches, outputs, batch, name):
    clean = batches[batch]
    for severity in SEVERITIES:
        again = corrupt(clean, name, severity, seed=0)
        torch.testing.assert_close(again, outputs[batch, name, severity, 0], rtol=0, atol=0)
        if name in RANDOM:
            other = outputs[batch, name, severity, 1]
            assert _mad(other, outputs[batch, name, severity, 0]) > 1e-4, (name, severity)
        else:  # no randomness: the seed does not matter
            other = corrupt(clean, name, severity, seed=1)
            torch.testing.assert_close(other, again, rtol=0, atol=0)


def test_random_draws_differ_between_images(batches):
    # The same image twice in a batch gets two different draws.
    pair = batches["rgb"][:1].repeat(2, 1, 1, 1)
    for name in RANDOM:
        out = corrupt(pair, name, 3)
        assert _mad(out[0], out[1]) > 1e-4, name


def test_severity_5_changes_more_than_severity_1(batches, outputs):
    measured = {}
    for batch in ("gray", "rgb"):
        for name in CORRUPTIONS:
            clean = batches[batch]
            measured[batch, name] = (
                _mad(outputs[batch, name, 1, 0], clean),
                _mad(outputs[batch, name, 5, 0], clean),
            )
    for (batch, name), (mild, severe) in measured.items():
        if name == "elastic_transform":
            # The reference's CIFAR constants trade the affine jitter (0.08 → 0.03 of the
            # image size) for local displacement (α 0 → 0.1, σ → 0.03): the pixel difference
            # shrinks with severity although the distortion becomes non-rigid.
            assert severe < mild, (batch, name, mild, severe)
        else:
            assert severe > 1.2 * mild, (batch, name, mild, severe)
    for (batch, name), values in measured.items():
        expected = MEASURED_MAD[name][0 if batch == "gray" else 1]
        np.testing.assert_allclose(values, expected, rtol=0.05, err_msg=f"{batch} {name}")


def test_elastic_non_rigid_part_grows_with_severity(batches):
    # Without the affine part, severity 1 is the identity and severity 5 moves pixels.
    x = batches["rgb"]
    n, _, h, w = x.shape
    rng = np.random.default_rng(0)
    for severity, expected_zero in ((1, True), (5, False)):
        alpha, sigma, _ = (32 * v for v in CIFAR_C_CONSTANTS["elastic_transform"][severity - 1])
        noise = torch.as_tensor(rng.uniform(-1, 1, (n, 2, h, w)), dtype=x.dtype)
        field = filters.gaussian_blur(noise, sigma, mode="reflect", truncate=3) * alpha
        moved = _mad(C._displace(x, field), x)
        assert (moved < 1e-6) == expected_zero, (severity, moved)


# ---------------------------------------------------------------- hand-computed references


def test_contrast_is_scaled_deviation_from_the_image_mean(batches):
    for images in batches.values():
        for severity, c in zip(SEVERITIES, CIFAR_C_CONSTANTS["contrast"]):
            x = images.double()
            mean = x.mean(dim=(2, 3), keepdim=True)
            expected = ((x - mean) * c + mean).clamp(0, 1)
            torch.testing.assert_close(
                corrupt(x, "contrast", severity), expected, rtol=0, atol=1e-12
            )


def test_brightness_adds_to_hsv_value(batches):
    x = batches["rgb"][:4].double()
    c = CIFAR_C_CONSTANTS["brightness"][2]
    out = corrupt(x, "brightness", 3)
    pixels = x.permute(0, 2, 3, 1).reshape(-1, 3).tolist()
    expected = []
    for r, g, b in pixels:
        h, s, v = colorsys.rgb_to_hsv(r, g, b)
        expected.append(colorsys.hsv_to_rgb(h, s, min(v + c, 1.0)))
    expected = torch.tensor(expected, dtype=x.dtype).reshape(4, 32, 32, 3).permute(0, 3, 1, 2)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    gray = batches["gray"].double()
    torch.testing.assert_close(
        corrupt(gray, "brightness", 5), (gray + 0.3).clamp(0, 1), rtol=0, atol=1e-12
    )


def test_hsv_round_trip_and_colorsys():
    rng = np.random.default_rng(3)
    x = torch.as_tensor(rng.random((2, 3, 8, 8)))
    x[0, :, 0, 0] = 0.0  # black
    x[0, :, 0, 1] = 0.5  # gray
    x[0, :, 0, 2] = torch.tensor([0.7, 0.7, 0.2], dtype=x.dtype)  # tie red/green
    hsv = filters.rgb_to_hsv(x)
    torch.testing.assert_close(filters.hsv_to_rgb(hsv), x, rtol=0, atol=1e-12)
    for n, i, j in ((0, 0, 0), (0, 0, 1), (1, 3, 4), (1, 7, 7)):
        expected = colorsys.rgb_to_hsv(*x[n, :, i, j].tolist())
        np.testing.assert_allclose(hsv[n, :, i, j].numpy(), expected, atol=1e-12)


@pytest.mark.parametrize("severity", SEVERITIES)
def test_gaussian_noise_std_on_mid_gray(severity):
    # On 0.5 gray nothing is clipped (0.5 ± 5σ at σ = 0.1), so corrupted − clean is N(0, c²).
    x = torch.full((64, 3, 32, 32), 0.5, dtype=torch.float64)
    c = CIFAR_C_CONSTANTS["gaussian_noise"][severity - 1]
    noise = corrupt(x, "gaussian_noise", severity, seed=7) - x
    assert abs(noise.std().item() - c) < 0.01 * c
    assert abs(noise.mean().item()) < 0.01 * c


def test_shot_and_impulse_noise_statistics():
    x = torch.full((64, 3, 32, 32), 0.4, dtype=torch.float64)
    for severity, c in zip(SEVERITIES, CIFAR_C_CONSTANTS["shot_noise"]):
        out = corrupt(x, "shot_noise", severity, seed=1)
        # Poisson(0.4 c) / c: mean 0.4, variance 0.4 / c, values on the grid k / c
        assert abs(out.mean().item() - 0.4) < 0.01
        assert abs(out.var().item() / (0.4 / c) - 1) < 0.05
        torch.testing.assert_close(out * c, (out * c).round(), rtol=0, atol=1e-9)
    for severity, c in zip(SEVERITIES, CIFAR_C_CONSTANTS["impulse_noise"]):
        out = corrupt(x, "impulse_noise", severity, seed=1)
        changed = out != x
        assert abs(changed.double().mean().item() / c - 1) < 0.06
        assert set(out[changed].unique().tolist()) <= {0.0, 1.0}
        assert abs((out[changed] == 1).double().mean().item() - 0.5) < 0.06


def test_frost_and_fog_formulas(batches):
    black = torch.zeros(8, 3, 32, 32, dtype=torch.float64)
    texture = corrupt(black, "frost", 1) / CIFAR_C_CONSTANTS["frost"][0][1]  # crops of textures
    assert 0.35 < texture.mean().item() < 0.55 and texture.min() >= 0
    assert (texture[:, 2] >= texture[:, 0] - 1e-9).all()  # ice-blue tint
    textures = C._frost_textures(128)
    assert textures.shape == (5, 3, 128, 128) and 0 <= textures.min() and textures.max() <= 1
    assert abs(textures.mean().item() - 0.45) < 0.03
    torch.testing.assert_close(C._frost_textures.__wrapped__(128), textures)  # fixed, seeded
    x = batches["rgb"].double()
    # fog: (x + c0 · fractal) · max(x) / (max(x) + c0), fractal in [0, 1]
    c0 = CIFAR_C_CONSTANTS["fog"][4][0]
    peak = x.amax(dim=(1, 2, 3), keepdim=True)
    fractal = (corrupt(x, "fog", 5) * (peak + c0) / peak - x) / c0
    assert fractal.min() > -1e-9 and fractal.max() < 1 + 1e-9
    assert (fractal[:, 0] - fractal[:, 1]).abs().max() < 1e-9  # one fractal for all channels


# ---------------------------------------------------------------- against the reference code


def test_filters_and_resampling_match_scipy_and_pillow():
    ndi = pytest.importorskip("scipy.ndimage")
    image_module = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    a = rng.random((2, 3, 32, 30))
    x = torch.as_tensor(a)
    # skimage.filters.gaussian = scipy gaussian_filter (glass/gaussian blur, elastic field)
    for sigma, mode, truncate in ((0.4, "nearest", 4), (1.0, "nearest", 4), (6.4, "reflect", 3)):
        expected = ndi.gaussian_filter(a, (0, 0, sigma, sigma), mode=mode, truncate=truncate)
        ours = filters.gaussian_blur(x, sigma, mode, truncate).numpy()
        np.testing.assert_allclose(ours, expected, atol=1e-12)
    # defocus: the reference's disk (17 × 17, then cv2.GaussianBlur 3 × 3), cv2.filter2D
    grid = np.arange(-8, 9)
    xx, yy = np.meshgrid(grid, grid)
    for radius, alias in CIFAR_C_CONSTANTS["defocus_blur"]:
        disk = (xx**2 + yy**2 <= radius**2).astype(float)
        g = np.exp(-((np.arange(3) - 1) ** 2) / (2 * alias**2))
        kernel = ndi.correlate(disk / disk.sum(), np.outer(g, g) / g.sum() ** 2, mode="mirror")
        expected = ndi.correlate(a, kernel[None, None], mode="mirror")
        ours = filters.filter2d(x, filters.disk_kernel(radius, alias), "mirror").numpy()
        np.testing.assert_allclose(ours, expected, atol=1e-12)
    # clipped_zoom: scipy.ndimage.zoom(order=1) of the centre crop, trimmed
    for factor in (1.06, 1.25, 1.75, 2.25):
        ours = filters.clipped_zoom(x, factor).numpy()
        ch, cw = int(np.ceil(32 / factor)), int(np.ceil(30 / factor))
        top, left = (32 - ch) // 2, (30 - cw) // 2
        zoomed = ndi.zoom(
            a[:, :, top : top + ch, left : left + cw], (1, 1, factor, factor), order=1
        )
        th, tw = (zoomed.shape[2] - 32) // 2, (zoomed.shape[3] - 30) // 2
        np.testing.assert_allclose(ours, zoomed[:, :, th : th + 32, tw : tw + 30], atol=1e-12)
    # pixelate: Pillow's BOX resize down and up (float "F" images)
    for c in CIFAR_C_CONSTANTS["pixelate"]:
        ours = C._pixelate(x.float(), None, c).numpy()
        for i, j in ((0, 0), (1, 2)):
            image = image_module.fromarray(a[i, j].astype(np.float32))
            small = image.resize((int(30 * c), int(32 * c)), image_module.Resampling.BOX)
            expected = np.asarray(small.resize((30, 32), image_module.Resampling.BOX))
            np.testing.assert_allclose(ours[i, j], expected, atol=1e-6)


def test_elastic_sampling_matches_opencv_and_scipy_conventions():
    ndi = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(1)
    a = rng.random((2, 1, 32, 30))
    x = torch.as_tensor(a)
    # warpAffine(BORDER_REFLECT_101) = scipy affine_transform(mode="mirror"), (row, col) order
    inverse = torch.tensor(
        [[[1.05, 0.1, -1.3], [-0.08, 0.97, 2.2]], [[0.9, -0.2, 3.0], [0.15, 1.1, -2.5]]],
        dtype=torch.float64,
    )
    ours = C._warp_affine(x, inverse).numpy()
    for i, m in enumerate(inverse.numpy()):
        matrix = np.array([[m[1, 1], m[1, 0]], [m[0, 1], m[0, 0]]])
        offset = np.array([m[1, 2], m[0, 2]])
        expected = ndi.affine_transform(a[i, 0], matrix, offset, order=1, mode="mirror")
        np.testing.assert_allclose(ours[i, 0], expected, atol=1e-12)
    # the displacement: map_coordinates(order=1, mode="reflect") at (row + dy, col + dx)
    field = torch.as_tensor(rng.normal(0, 3, (2, 2, 32, 30)))
    ours = C._displace(x, field).numpy()
    rows, cols = np.meshgrid(np.arange(32), np.arange(30), indexing="ij")
    for i in range(2):
        where = [rows + field[i, 1].numpy(), cols + field[i, 0].numpy()]
        expected = ndi.map_coordinates(a[i, 0], where, order=1, mode="reflect")
        np.testing.assert_allclose(ours[i, 0], expected, atol=1e-12)


def test_glass_shuffle_matches_the_reference_loop():
    rng = np.random.default_rng(2)
    image = rng.integers(0, 256, (32, 32, 3)).astype(np.uint8)  # HWC, as the reference
    dx, dy = rng.integers(-1, 1, size=(2, 32, 32))
    expected = image.copy()
    for h in range(32 - 1, 1, -1):
        for w in range(32 - 1, 1, -1):
            hp, wp = h + dy[h, w], w + dx[h, w]
            expected[h, w], expected[hp, wp] = expected[hp, wp], expected[h, w]
    x = torch.as_tensor(image).permute(2, 0, 1)[None].double()
    ours = C._glass_shuffle(x, torch.as_tensor(dx)[None], torch.as_tensor(dy)[None])
    np.testing.assert_array_equal(ours[0].permute(1, 2, 0).numpy(), expected)
    with pytest.raises(ValueError, match="max_delta = 1"):
        C._glass_shuffle(x, torch.ones(1, 32, 32, dtype=torch.long), torch.zeros(1, 32, 32))


def test_motion_blur_matches_imagemagick_formula():
    # ImageMagick's MotionBlurImage, one image at a time: width 2r + 1, weights
    # exp(-i²/2σ²) normalized, out(x, y) = Σ k_i in(x + ⌈i cos θ − ½⌉, y + ⌈i sin θ − ½⌉).
    rng = np.random.default_rng(4)
    a = rng.random((3, 2, 30, 28))
    angles = np.array([-45.0, 12.5, -100.0])
    radius, sigma = 6, 2.0
    ours = filters.motion_blur(torch.as_tensor(a), radius, sigma, angles).numpy()
    i = np.arange(2 * radius + 1)
    k = np.exp(-(i**2) / (2 * sigma**2))
    k /= k.sum()
    for n, angle in enumerate(angles):
        expected = np.zeros((2, 30, 28))
        for j in i:
            ox = int(np.ceil(j * np.cos(np.deg2rad(angle)) - 0.5))
            oy = int(np.ceil(j * np.sin(np.deg2rad(angle)) - 0.5))
            rows = np.clip(np.arange(30) + oy, 0, 29)
            cols = np.clip(np.arange(28) + ox, 0, 27)
            expected += k[j] * a[n][:, rows][:, :, cols]
        np.testing.assert_allclose(ours[n], expected, atol=1e-12)


def test_plasma_fractal_matches_the_reference_for_one_image():
    def reference(rng, mapsize, wibbledecay):  # make_cifar_c.plasma_fractal, rng passed in
        maparray = np.empty((mapsize, mapsize), dtype=np.float64)
        maparray[0, 0] = 0
        stepsize = mapsize
        wibble = 100

        def wibbledmean(array):
            return array / 4 + wibble * rng.uniform(-wibble, wibble, array.shape)

        while stepsize >= 2:
            half = stepsize // 2
            cornerref = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
            squareaccum = cornerref + np.roll(cornerref, shift=-1, axis=0)
            squareaccum += np.roll(squareaccum, shift=-1, axis=1)
            maparray[half:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(squareaccum)
            drgrid = maparray[half:mapsize:stepsize, half:mapsize:stepsize]
            ulgrid = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
            ltsum = drgrid + np.roll(drgrid, 1, axis=0) + ulgrid + np.roll(ulgrid, -1, axis=1)
            maparray[0:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(ltsum)
            ttsum = drgrid + np.roll(drgrid, 1, axis=1) + ulgrid + np.roll(ulgrid, -1, axis=0)
            maparray[half:mapsize:stepsize, 0:mapsize:stepsize] = wibbledmean(ttsum)
            stepsize //= 2
            wibble /= wibbledecay
        maparray -= maparray.min()
        return maparray / maparray.max()

    for decay in (3, 1.75):
        ours = C._plasma_fractal(np.random.default_rng(5), 1, 32, decay)[0]
        np.testing.assert_allclose(ours, reference(np.random.default_rng(5), 32, decay))


# ---------------------------------------------------------------- dtypes, uint8, chunks


def test_uint8_round_trip(batches):
    images, _ = load_fashion_mnist("test")
    x8 = images[:16]
    for name in ("contrast", "pixelate", "gaussian_noise", "jpeg_compression", "zoom_blur"):
        out8 = corrupt(x8, name, 3)
        assert out8.dtype == torch.uint8 and out8.shape == x8.shape
        reference = corrupt(x8.float() / 255, name, 3)
        assert (out8.float() - reference * 255).abs().max() <= 0.5 + 1e-3, name
    clean = corrupt(x8, "brightness", 1)
    assert (clean.int() - x8.int()).abs().max() <= 13  # +0.05 ≈ 12.75 levels


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_float_dtypes(batches, dtype):
    x = batches["rgb"][:4]
    for name in ("fog", "motion_blur", "jpeg_compression"):
        low = x.to(dtype)
        out = corrupt(low, name, 2)
        assert out.dtype == dtype
        # computed in float32 (float64 for float64) from the same values, rounded at the end
        expected = corrupt(low.to(torch.float32), name, 2)
        tolerance = {torch.float64: 1e-6, torch.float16: 5e-4, torch.bfloat16: 4e-3}[dtype]
        torch.testing.assert_close(out.float(), expected, rtol=0, atol=tolerance)


def test_corrupted_yields_every_pair_and_chunks(batches):
    images = batches["gray"][:20]
    labels = torch.arange(20)
    names = ("gaussian_noise", "contrast")
    got = list(corrupted(images, labels, names, (1, 5), batch_size=100))
    assert [(n, s) for n, s, _, _ in got] == [(n, s) for n in names for s in (1, 5)]
    for name, severity, out, out_labels in got:
        assert out_labels is labels
        torch.testing.assert_close(out, corrupt(images, name, severity), rtol=0, atol=0)
    chunked = list(corrupted(images, labels, "gaussian_noise", 3, batch_size=8))
    assert len(chunked) == 1
    out = chunked[0][2]
    torch.testing.assert_close(out[:8], corrupt(images[:8], "gaussian_noise", 3), rtol=0, atol=0)
    assert _mad(out[8:16], corrupt(images[:8], "gaussian_noise", 3)) > 0  # fresh draws
    again = next(corrupted(images, labels, "gaussian_noise", 3, batch_size=8))[2]
    torch.testing.assert_close(again, out, rtol=0, atol=0)
    # contrast has no randomness: chunking does not matter
    whole = next(corrupted(images, labels, "contrast", 4, batch_size=7))[2]
    torch.testing.assert_close(whole, corrupt(images, "contrast", 4), rtol=0, atol=0)


# ---------------------------------------------------------------- errors


def test_errors(batches):
    x = batches["rgb"][:2]
    with pytest.raises(ValueError, match="unknown corruption 'blur'.*gaussian_noise"):
        corrupt(x, "blur", 1)
    for severity in (0, 6, 2.5, "3", True):
        with pytest.raises(ValueError, match="severity must be an integer in 1..5"):
            corrupt(x, "fog", severity)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\), got shape \(32, 32\)"):
        corrupt(x[0, 0], "fog", 1)
    with pytest.raises(ValueError, match=r"1 or 3 channels.*\(2, 2, 32, 32\)"):
        corrupt(x[:, :2], "fog", 1)
    with pytest.raises(ValueError, match=r"at least 28.*\(2, 3, 16, 16\)"):
        corrupt(x[..., :16, :16], "fog", 1)
    with pytest.raises(TypeError, match=r"torch.int64 of shape \(2, 3, 32, 32\)"):
        corrupt(x.long(), "fog", 1)
    with pytest.raises(TypeError, match="torch.Tensor"):
        corrupt(x.numpy(), "fog", 1)
    with pytest.raises(ValueError, match=r"in \[0, 1\] \(corrupt before normalizing\)"):
        corrupt(x - 0.5, "fog", 1)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        corrupt(x, "fog", 1, seed=-1)
    with pytest.raises(ValueError, match="saturate needs 3-channel"):
        corrupt(batches["gray"][:2], "saturate", 1)
    with pytest.raises(ValueError, match="unknown corruption 'fogg'"):
        next(corrupted(x, torch.zeros(2), ("fog", "fogg")))
    with pytest.raises(ValueError, match="labels has length 3"):
        next(corrupted(x, torch.zeros(3), "fog"))
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        next(corrupted(x, torch.zeros(2), "fog", batch_size=0))
    assert corrupt(x[:0], "fog", 1).shape == (0, 3, 32, 32)


def test_jpeg_without_pillow_says_how_to_install(batches, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match="pip install pillow"):
        corrupt(batches["rgb"][:2], "jpeg_compression", 1)
    corrupt(batches["rgb"][:2], "pixelate", 1)  # the rest needs no Pillow


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_same_result_on_cuda(batches):
    x = batches["rgb"][:8]
    for name in ALL:
        out = corrupt(x.cuda(), name, 4)
        assert out.device.type == "cuda"
        torch.testing.assert_close(out.cpu(), corrupt(x, name, 4), rtol=0, atol=2e-5)
