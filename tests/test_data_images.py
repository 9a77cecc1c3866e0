"""Robust image loading: every mode COCO/Flickr contain, EXIF rotation, and bad files."""

from __future__ import annotations

import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from data_prep.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageLoadError,
    imagenet_transform,
    load_image,
    orient,
    stored_layout,
)


def pixels(image: Image.Image) -> np.ndarray:
    assert image.mode == "RGB"
    return np.asarray(image).astype(int)


def test_rgb_png_is_returned_unchanged(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, size=(7, 9, 3), dtype=np.uint8)
    Image.fromarray(data).save(tmp_path / "rgb.png")
    assert np.array_equal(np.asarray(load_image(tmp_path / "rgb.png")), data)


@pytest.mark.parametrize("mode", ["L", "1"])
def test_grayscale_is_replicated(tmp_path, mode):
    gray = np.array([[0, 255], [255, 0]], dtype=np.uint8)
    Image.fromarray(gray).convert(mode).save(tmp_path / "gray.png")
    assert np.array_equal(pixels(load_image(tmp_path / "gray.png")), np.stack([gray] * 3, -1))


def _over_white(value: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Hand-written alpha compositing on white, per 8-bit channel."""
    a = alpha[..., None] / 255.0
    return np.rint(value * a + 255 * (1 - a)).astype(int)


def test_rgba_is_composited_on_white(tmp_path):
    rgb = np.array([[[200, 10, 30], [0, 0, 0], [40, 80, 120]]], dtype=np.uint8)
    alpha = np.array([[255, 0, 128]], dtype=np.uint8)
    Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(tmp_path / "rgba.png")
    got = pixels(load_image(tmp_path / "rgba.png"))
    assert np.abs(got - _over_white(rgb, alpha)).max() <= 1
    assert got[0, 1].tolist() == [255, 255, 255]


def test_la_is_composited_on_white(tmp_path):
    gray = np.array([[10, 20, 200]], dtype=np.uint8)
    alpha = np.array([[255, 0, 64]], dtype=np.uint8)
    Image.fromarray(np.dstack([gray, alpha]), "LA").save(tmp_path / "la.png")
    got = pixels(load_image(tmp_path / "la.png"))
    expected = _over_white(np.stack([gray] * 3, -1), alpha)
    assert np.abs(got - expected).max() <= 1


def test_palette_with_transparency(tmp_path):
    image = Image.new("P", (3, 1))
    image.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * 759)
    image.putdata([0, 1, 2])
    image.save(tmp_path / "p.png", transparency=1)
    assert pixels(load_image(tmp_path / "p.png")).tolist() == [
        [[255, 0, 0], [255, 255, 255], [0, 0, 255]]
    ]
    image.save(tmp_path / "opaque.png")
    assert pixels(load_image(tmp_path / "opaque.png")).tolist() == [
        [[255, 0, 0], [0, 255, 0], [0, 0, 255]]
    ]


def test_cmyk(tmp_path):
    # Pure inks: cyan = no red, magenta = no green, yellow = no blue, K = black, none = white.
    cmyk = np.array(
        [[[255, 0, 0, 0], [0, 255, 0, 0], [0, 0, 255, 0], [0, 0, 0, 255], [0, 0, 0, 0]]],
        dtype=np.uint8,
    )
    Image.fromarray(cmyk, "CMYK").save(tmp_path / "cmyk.tif")
    assert pixels(load_image(tmp_path / "cmyk.tif")).tolist() == [
        [[0, 255, 255], [255, 0, 255], [255, 255, 0], [0, 0, 0], [255, 255, 255]]
    ]


@pytest.mark.parametrize(("suffix", "dtype"), [(".png", np.uint16), (".tif", np.int32)])
def test_sixteen_bit_is_scaled_to_eight_bits(tmp_path, suffix, dtype):
    values = np.array([[0, 257 * 128, 65535, 1000]], dtype=dtype)
    Image.fromarray(values).save(tmp_path / f"deep{suffix}")
    with Image.open(tmp_path / f"deep{suffix}") as raw:
        assert raw.mode in ("I;16", "I")
    got = pixels(load_image(tmp_path / f"deep{suffix}"))
    expected = [0, 128, 255, round(1000 * 255 / 65535)]
    assert got[..., 0].tolist() == [expected]
    assert np.array_equal(got[..., 0], got[..., 2])


def test_integer_image_beyond_sixteen_bits_is_refused(tmp_path):
    Image.fromarray(np.array([[-5, 70000]], dtype=np.int32)).save(tmp_path / "wide.tif")
    with pytest.raises(ImageLoadError, match="wide.tif.*16-bit range"):
        load_image(tmp_path / "wide.tif")


def test_floating_point_image_is_refused(tmp_path):
    Image.fromarray(np.array([[0.5, 2.0]], dtype=np.float32)).save(tmp_path / "float.tif")
    with pytest.raises(ImageLoadError, match="float.tif.*mode 'F'"):
        load_image(tmp_path / "float.tif")


# Orientation tag -> where the stored top-left corner appears once displayed (EXIF 2.3).
ORIENTATIONS = {
    1: ("top", "left", False),
    3: ("bottom", "right", False),
    6: ("top", "right", True),
    8: ("bottom", "left", True),
}


@pytest.mark.parametrize("orientation", sorted(ORIENTATIONS))
def test_exif_orientation_is_applied(tmp_path, orientation):
    stored = np.zeros((40, 60, 3), dtype=np.uint8)
    stored[...] = (0, 0, 255)
    stored[:12, :12] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(stored).save(tmp_path / "photo.jpg", quality=95, exif=exif)
    got = pixels(load_image(tmp_path / "photo.jpg"))
    vertical, horizontal, swapped = ORIENTATIONS[orientation]
    assert got.shape[:2] == ((60, 40) if swapped else (40, 60))
    row = 3 if vertical == "top" else got.shape[0] - 4
    column = 3 if horizontal == "left" else got.shape[1] - 4
    red = got[row, column]
    assert red[0] > 200 and red[2] < 60
    # The opposite corner stays blue.
    far = got[got.shape[0] - 1 - row, got.shape[1] - 1 - column]
    assert far[2] > 200 and far[0] < 60


@pytest.mark.parametrize("orientation", range(10))
def test_orient_turns_stored_pixels_as_load_image_shows_them(tmp_path, orientation):
    """Every EXIF orientation (and 0, 9: no turn), on a non-square image of distinct pixels;
    Pillow's own exif_transpose inside load_image is the reference."""
    stored = np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(stored).save(tmp_path / "photo.png", exif=exif)
    size, found = stored_layout(tmp_path / "photo.png")
    assert size == (7, 5)
    assert found == (orientation if 1 <= orientation <= 8 else 1)
    np.testing.assert_array_equal(orient(stored, found), pixels(load_image(tmp_path / "photo.png")))


def test_stored_layout_names_a_bad_file(tmp_path):
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(ImageLoadError, match="empty.jpg: "):
        stored_layout(tmp_path / "empty.jpg")
    with pytest.raises(ImageLoadError, match="none.jpg: file not found"):
        stored_layout(tmp_path / "none.jpg")


def _png_header(width: int, height: int) -> bytes:
    """A PNG with a valid IHDR declaring a huge 8-bit grayscale image and no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("width", "height", "size_text"),
    [
        (9000, 8000, "9000x8000 = 72,000,000 pixels"),  # above our limit, below Pillow's warning
        (10000, 9000, "10000x9000 = 90,000,000 pixels"),  # Pillow warns
        (30000, 30000, "900000000 pixels"),  # Pillow refuses while reading the header
    ],
)
def test_decompression_bomb_is_refused_before_decoding(tmp_path, width, height, size_text):
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_header(width, height))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's own warning must not leak through
        with pytest.raises(ImageLoadError, match="decompression bomb") as info:
            load_image(path)
    assert str(path) in str(info.value) and size_text in str(info.value)


def test_pixel_limit_is_configurable(tmp_path):
    Image.new("RGB", (20, 10)).save(tmp_path / "small.png")
    assert load_image(tmp_path / "small.png", max_pixels=200).size == (20, 10)
    with pytest.raises(ImageLoadError, match="20x10 = 200 pixels exceeds the limit of 199"):
        load_image(tmp_path / "small.png", max_pixels=199)


def _jpeg_bytes() -> bytes:
    import io

    noise = np.random.default_rng(1).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _png_bytes() -> bytes:
    import io

    noise = np.random.default_rng(2).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, format="PNG")
    return buffer.getvalue()


BAD_FILES = {
    "truncated.jpg": (lambda: _jpeg_bytes()[: len(_jpeg_bytes()) // 2], "truncated"),
    "truncated.png": (lambda: _png_bytes()[: len(_png_bytes()) // 2], "truncated"),
    "corrupt.png": (lambda: _png_bytes()[:40] + b"\x00" * 200, "corrupt"),
    "notes.jpg": (lambda: b"this is a caption file, not an image\n", "not an image"),
    "empty.png": (lambda: b"", r"is empty \(0 bytes\)"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_raise_naming_the_file(tmp_path, name):
    content, reason = BAD_FILES[name]
    (tmp_path / name).write_bytes(content())
    with pytest.raises(ImageLoadError, match=reason) as info:
        load_image(tmp_path / name)
    assert str(tmp_path / name) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ImageLoadError, match="absent.jpg: file not found"):
        load_image(tmp_path / "absent.jpg")
    with pytest.raises(ImageLoadError, match="is a folder, not an image file"):
        load_image(tmp_path)


def test_a_loop_of_links_is_not_called_a_damaged_image(tmp_path):
    (tmp_path / "a.jpg").symlink_to(tmp_path / "b.jpg")
    (tmp_path / "b.jpg").symlink_to(tmp_path / "a.jpg")
    with pytest.raises(ImageLoadError) as caught:
        load_image(tmp_path / "a.jpg")
    assert str(caught.value) == f"{tmp_path / 'a.jpg'}: cannot be read (Too many levels of " \
                                "symbolic links)"


def test_an_empty_file_is_named_alike_by_loading_and_by_checking(tmp_path):
    from data_prep.images import check_image

    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(ImageLoadError) as info:
        load_image(tmp_path / "empty.jpg")
    assert str(info.value) == f"{tmp_path / 'empty.jpg'}: is empty (0 bytes)"
    assert check_image(tmp_path / "empty.jpg") == "is empty (0 bytes)"


def test_imagenet_transform_matches_hand_computation():
    colour = (200, 100, 30)
    tensor = imagenet_transform(64)(Image.new("RGB", (50, 80), colour))
    assert tuple(tensor.shape) == (3, 64, 64)
    for channel in range(3):
        expected = (colour[channel] / 255 - IMAGENET_MEAN[channel]) / IMAGENET_STD[channel]
        assert tensor[channel].min().item() == pytest.approx(expected, abs=1e-5)
        assert tensor[channel].max().item() == pytest.approx(expected, abs=1e-5)
    assert imagenet_transform()(Image.new("RGB", (10, 10))).shape == (3, 256, 256)
    with pytest.raises(ValueError, match="size"):
        imagenet_transform(0)
