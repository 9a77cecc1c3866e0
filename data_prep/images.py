"""Reading images robustly and the paper's preprocessing.

:func:`load_image` returns an 8-bit RGB image for every format COCO and Flickr contain and
refuses everything else with an :class:`ImageLoadError` that names the file and the reason:

* EXIF orientation is applied (phone photos are stored sideways with an orientation tag);
* grayscale (``1``, ``L``) is replicated to three channels;
* transparency (``LA``, ``RGBA``, ``PA``, palette images with a transparent colour) is
  composited on a **white** background, which is what image viewers and browsers show, instead
  of dropping the alpha channel and exposing whatever colour the transparent pixels hold;
* ``CMYK`` and other colour spaces are converted by Pillow; floating-point (``F``) images,
  which have no standard range, are refused;
* 16-bit grayscale (``I;16``, ``I;16B``, ``I;16L``, and ``I``, which Pillow uses for 16-bit
  PNG/TIFF data) is scaled from [0, 65535] to [0, 255] (Pillow's own conversion would clip at
  255 and turn most of the image white);
* images of more than :data:`MAX_IMAGE_PIXELS` pixels are refused before they are decoded
  (decompression bombs);
* missing, unreadable, non-image, corrupt and truncated files are errors, and so are FIFOs,
  devices and sockets, refused before they are opened (reading a FIFO would block).

:func:`imagenet_transform` is the TVmax paper's preprocessing: images resized to 256x256
(section 4, "Settings"), normalised with the ImageNet mean and standard deviation that the
ImageNet-pretrained ResNet (section 3) was trained with.
"""

from __future__ import annotations

import stat
import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from data_prep.paths import check_input_file

# 64 megapixels: four times a 24-megapixel camera photo, far above any COCO/Flickr image
# (at most 640 / 500 px per side), and below Pillow's own warning threshold (~89.5 Mpx).
MAX_IMAGE_PIXELS = 64_000_000
# The largest image_size (the side of the square images are resized to): MAX_IMAGE_PIXELS.
MAX_IMAGE_SIZE = 8000

# Files taken as images when a folder is searched; files named explicitly are always tried.
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_ALPHA_MODES = ("LA", "La", "PA", "RGBA", "RGBa")
_BACKGROUND = (255, 255, 255)


class ImageLoadError(ValueError):
    """An image file that cannot be used; the message names the file and the reason."""


def load_image(path: str | Path, *, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Load ``path`` as an 8-bit RGB image (mode ``"RGB"``), fully decoded and detached from
    the file, with EXIF orientation applied.

    Raises:
        ImageLoadError: the file is missing, unreadable, not an image, corrupt, truncated, of
            an unsupported mode, or larger than ``max_pixels`` pixels.
    """
    with _opened(Path(path), max_pixels) as image:
        image.load()
        return _to_rgb(ImageOps.exif_transpose(image), path)


# What ImageOps.exif_transpose does to the pixels for each EXIF orientation, on arrays
# (rows, columns, ...): Pillow's FLIP_LEFT_RIGHT, ROTATE_180, FLIP_TOP_BOTTOM, TRANSPOSE,
# ROTATE_270, TRANSVERSE and ROTATE_90 (rotations counter-clockwise).
_EXIF_TURNS = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: np.rot90(a, 2).swapaxes(0, 1),
    8: lambda a: np.rot90(a, 1),
}


def orient(array: np.ndarray, orientation: int) -> np.ndarray:
    """``array`` (rows, columns, ...) laid out as an image's stored pixels, turned as
    :func:`load_image` turns the pixels of an image of that EXIF ``orientation`` (1-8)."""
    return np.ascontiguousarray(_EXIF_TURNS[orientation](array))


def stored_layout(path: str | Path) -> tuple[tuple[int, int], int]:
    """((width, height) of the pixels as stored, EXIF orientation) of an image file: the
    orientation :func:`load_image` applies, 1 (as stored) without a tag or with a value
    outside 2-8, which Pillow leaves as stored too. ImageLoadError as :func:`load_image`."""
    with _opened(Path(path), MAX_IMAGE_PIXELS) as image:
        orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
        return image.size, orientation if orientation in _EXIF_TURNS else 1


def header_problem(path: Path) -> str | None:
    """Why ``path`` is no image file that :func:`load_image` can open, judged from its header
    alone (missing, empty, a folder, unrecognised, too many pixels), or None: the check of a
    whole dataset before training reads its images (0.13 ms a 640x480 JPEG, measured, where
    :func:`check_image` decodes it in 3.5 ms). Truncated data are found only when read."""
    try:
        with _opened(path, MAX_IMAGE_PIXELS):
            return None
    except ImageLoadError as exc:
        return str(exc).removeprefix(f"{path}: ")


def check_image(path: str | Path, max_pixels: int | None = None) -> str | None:
    """Why the image file ``path`` cannot be used, or None when it can: the checks of
    :func:`load_image`, without a full decode.

    The file must be a regular, non-empty file that Pillow recognizes, of at most
    ``max_pixels`` pixels (default :data:`MAX_IMAGE_PIXELS`, read at call time), whose data are
    complete: JPEG data are decoded at 1/8 scale (all entropy-coded data are read, so
    truncation is found; 1.0 ms instead of 1.4 ms for a full decode of a 640x480 JPEG,
    measured), PNG chunks are checked against their CRCs without decompressing them, other
    formats are decoded. A FIFO or device is never opened.
    """
    path = Path(path)
    max_pixels = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    try:
        check_input_file(path)
        status = path.stat()
    except ValueError as exc:  # a FIFO, socket or device
        return str(exc).removeprefix(f"{path}: ")
    except FileNotFoundError:
        return "file not found"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISDIR(status.st_mode):
        return "is a folder, not an image file"
    if status.st_size == 0:
        return "is empty (0 bytes)"
    try:
        with _opened(path, max_pixels) as image:
            if image.format == "JPEG":
                width, height = image.size
                image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
                image.load()
            elif image.format == "PNG":
                image.verify()
            else:
                image.load()
    except ImageLoadError as exc:
        return str(exc).removeprefix(f"{path}: ")
    return None


@contextmanager
def _opened(path: Path, max_pixels: int) -> Iterator[Image.Image]:
    """``Image.open(path)`` of an image of at most ``max_pixels`` pixels; a FIFO or device
    (never opened) and Pillow's failures while it is open (corrupt, truncated, unrecognised,
    ...) are raised as :class:`ImageLoadError` naming the file and the reason in one line."""
    try:
        check_input_file(path)
    except ValueError as exc:
        raise ImageLoadError(str(exc)) from None
    try:
        with warnings.catch_warnings():
            # Our own, lower limit below gives the clearer message.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                if width * height > max_pixels:
                    raise ImageLoadError(
                        f"{path}: image of {width}x{height} = {width * height:,} pixels exceeds "
                        f"the limit of {max_pixels:,} pixels (possible decompression bomb)"
                    )
                yield image
    except ImageLoadError:
        raise
    except FileNotFoundError as exc:
        raise ImageLoadError(f"{path}: file not found") from exc
    except IsADirectoryError as exc:
        raise ImageLoadError(f"{path}: is a folder, not an image file") from exc
    except PermissionError as exc:
        raise ImageLoadError(f"{path}: permission denied") from exc
    except UnidentifiedImageError as exc:
        if path.stat().st_size == 0:  # said as check_image says it
            raise ImageLoadError(f"{path}: is empty (0 bytes)") from exc
        raise ImageLoadError(f"{path}: not an image file (unrecognised format)") from exc
    except Image.DecompressionBombError as exc:
        raise ImageLoadError(
            f"{path}: refused as a decompression bomb ({one_line(exc)})"
        ) from exc
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            # The file system's, not the image's: a loop of links, an I/O error.
            raise ImageLoadError(f"{path}: cannot be read ({exc.strerror})") from exc
        # Pillow reports corrupt and truncated data as OSError ("image file is truncated"),
        # SyntaxError (broken headers) or ValueError/EOFError depending on the codec.
        raise ImageLoadError(f"{path}: corrupt or truncated image ({one_line(exc)})") from exc


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (its type when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _to_rgb(image: Image.Image, path: Path) -> Image.Image:
    mode = image.mode
    if mode == "RGB":
        return image.copy()
    if mode in _SIXTEEN_BIT_MODES:
        return _sixteen_bit_to_rgb(image, path)
    if mode == "F":
        # No standard range to map to 8 bits; clipping would hide the problem.
        raise ImageLoadError(f"{path}: floating-point images (mode 'F') are not supported")
    if mode == "P" and "transparency" in image.info:
        image, mode = image.convert("RGBA"), "RGBA"
    if mode in _ALPHA_MODES:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*_BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    try:
        return image.convert("RGB")
    except (ValueError, OSError) as exc:
        raise ImageLoadError(f"{path}: unsupported image mode {mode!r} ({exc})") from exc


def _sixteen_bit_to_rgb(image: Image.Image, path: Path) -> Image.Image:
    values = np.asarray(image, dtype=np.float64)
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise ImageLoadError(
            f"{path}: integer image (mode {image.mode!r}) with values outside the 16-bit range "
            f"[0, 65535] (min {values.min():g}, max {values.max():g}); cannot map it to 8 bits"
        )
    gray = np.rint(values * (255.0 / 65535.0)).astype(np.uint8)
    return Image.fromarray(gray).convert("RGB")


def imagenet_transform(size: int = 256):
    """The paper's preprocessing: ``Resize((size, size))``, ``ToTensor()``, ImageNet
    ``Normalize``; maps an RGB PIL image to a float32 tensor (3, size, size)."""
    from torchvision import transforms

    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")
    return transforms.Compose(
        [
            transforms.Resize((size, size), antialias=True),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
