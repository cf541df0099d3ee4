"""Image files decoded to 8-bit RGB by value (:func:`snens.data.images.image_to_rgb`).

``Image.convert("RGB")`` clipped every mode wider than 8 bits: a 16-bit PNG read 99.6% white,
a float TIFF as 0 and 1 only. And Pillow only warns below twice its pixel limit, so a 140 KB PNG
of just under 179 M pixels decoded to 1.7 GB. Every image here is made by Pillow.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib

import numpy as np
import pytest

from snens.data.images import MAX_IMAGE_PIXELS, image_to_rgb

Image = pytest.importorskip("PIL.Image", reason="images are decoded with Pillow")

# 16-bit values and the 8-bit ones they read as: round(v / 257).
SIXTEEN = np.array([[0, 257, 32896, 65535], [128, 129, 1000, 65280]], dtype=np.uint16)
SIXTEEN_AS_8 = [[0, 1, 128, 255], [0, 1, 4, 254]]


def _reopened(array: np.ndarray, fmt: str):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt)
    buffer.seek(0)
    return Image.open(buffer)


def _rgb_of_grey(grey) -> np.ndarray:
    grey = np.asarray(grey, dtype=np.uint8)
    return np.repeat(grey[:, :, None], 3, axis=2)


@pytest.mark.parametrize(("fmt", "mode"), [("PNG", "I;16"), ("TIFF", "I;16"), ("PPM", "I")])
def test_16_bit_images_are_read_by_value(fmt, mode):
    image = _reopened(SIXTEEN, fmt)
    assert image.mode == mode  # 16-bit PGM opens as 32-bit "I" with values in [0, 65535]
    rgb = image_to_rgb(image)
    assert rgb.dtype == np.uint8 and rgb.shape == (2, 4, 3)
    assert np.array_equal(rgb, _rgb_of_grey(SIXTEEN_AS_8))


def test_a_big_endian_16_bit_image_is_read_by_value():
    image = Image.frombytes("I;16B", (4, 2), SIXTEEN.astype(">u2").tobytes())
    assert np.array_equal(image_to_rgb(image), _rgb_of_grey(SIXTEEN_AS_8))


def test_a_float_image_in_0_1_is_read_by_value():
    values = np.array([[0.0, 0.25, 0.5, 1.0]], dtype=np.float32)
    image = _reopened(values, "TIFF")
    assert image.mode == "F"
    assert np.array_equal(image_to_rgb(image), _rgb_of_grey([[0, 64, 128, 255]]))


@pytest.mark.parametrize("mode", ["1", "L", "P", "LA", "RGB", "RGBA", "CMYK", "YCbCr"])
def test_8_bit_modes_convert_as_pillow_does(mode):
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (3, 5, 3), dtype=np.uint8)).convert(mode)
    rgb = image_to_rgb(image)
    assert rgb.dtype == np.uint8 and rgb.shape == (3, 5, 3)
    assert np.array_equal(rgb, np.asarray(image.convert("RGB")))


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (
            Image.fromarray(np.array([[0.0, 2.5]], dtype=np.float32)),
            "a float image (mode F) with values in [0, 2.5] has no fixed white level (only "
            "[0, 1] is read, as 0 to 255); save it as an 8- or 16-bit image, or scale it to "
            "[0, 1]",
        ),
        (
            Image.fromarray(np.array([[0.5, np.nan]], dtype=np.float32)),
            "a float image (mode F) holding NaN or inf values; save it as an 8- or 16-bit image",
        ),
        (
            Image.fromarray(np.array([[-3, 70_000]], dtype=np.int32)),
            "a 32-bit integer image (mode I) with values in [-3, 70000] has no fixed white level "
            "(only [0, 65535] is read, as 16-bit); save it as an 8- or 16-bit image",
        ),
    ],
    ids=["float-above-1", "float-nan", "int32-outside-16-bit"],
)
def test_images_without_a_fixed_white_level_are_refused_by_mode(image, message):
    with pytest.raises(ValueError) as err:
        image_to_rgb(image)
    assert str(err.value) == message


def _png_claiming(width: int, height: int) -> bytes:
    """A 1 × 1 PNG whose header claims ``width`` × ``height``: 69 bytes, undecodable at that
    size, so only a refusal before decoding passes the test."""
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def test_an_image_over_the_pixel_limit_is_refused_before_decoding():
    assert MAX_IMAGE_PIXELS == 89_478_485  # Pillow's default limit, where it only warns
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's DecompressionBombWarning at 1×–2× its limit
        image = Image.open(io.BytesIO(_png_claiming(12_000, 12_000)))
    with pytest.raises(ValueError) as err:
        image_to_rgb(image)
    assert str(err.value) == (
        "the image is 12000 × 12000 = 144,000,000 pixels, more than the 89,478,485 an image may "
        "decode to (snens.data.images.MAX_IMAGE_PIXELS); shrink it or leave it out"
    )
    small = Image.fromarray(np.zeros((4, 5), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"4 = 20 pixels, more than the 19 an image"):
        image_to_rgb(small, max_pixels=19)
    assert image_to_rgb(small, max_pixels=20).shape == (4, 5, 3)
