"""The pre-check of every image before a cache is made (:func:`precheck_images`), and what
``on_error`` makes of the unusable ones (:func:`usable_images`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captioner.features.settings import FeatureExtractionError
from data_prep import images as image_files

if TYPE_CHECKING:
    from data_prep.karpathy import ImageEntry

SHOWN_BAD_IMAGES = 10  # unusable images listed by name in a message; the rest are counted
_CHECK_BATCH = 64  # images per pre-check work item


def precheck_images(
    paths: Sequence[Path], *, num_workers: int = 0, progress: bool = False,
    max_pixels: int | None = None,
) -> list[str | None]:
    """:func:`data_prep.images.check_image` of every path, in order (``num_workers`` worker
    processes)."""
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    checks = _ImageChecks(list(paths), max_pixels)
    loader = DataLoader(
        checks, batch_size=_CHECK_BATCH, num_workers=num_workers, collate_fn=list
    )
    reasons: list[str | None] = []
    with tqdm(total=len(checks), desc="checking images", unit="img", disable=not progress) as bar:
        for batch in loader:
            reasons.extend(batch)
            bar.update(len(batch))
    return reasons


class _ImageChecks:
    """Dataset: index -> :func:`data_prep.images.check_image` of that path."""

    def __init__(self, paths: list[Path], max_pixels: int | None) -> None:
        self.paths = paths
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> str | None:
        return image_files.check_image(self.paths[index], self.max_pixels)


def usable_images(entries: Sequence[ImageEntry], reasons: Sequence[str | None], where: str,
                  on_error: str, say: Callable[[str], None]) -> None:
    """Apply ``on_error`` to the pre-check's ``reasons`` (None: usable) of ``entries``: report
    the unusable images (``say``) to be skipped, or refuse them all in one line (``"fail"``).
    ``where`` names the inputs ("--images DIR: none of the N images of SPLIT_FILE").

    Raises:
        FeatureExtractionError: no image is usable, or some are not and ``on_error="fail"``.
    """
    bad = [(entry, reason) for entry, reason in zip(entries, reasons, strict=True) if reason]
    if entries and len(bad) == len(entries):  # none at all: the image root, most likely
        raise FeatureExtractionError(
            f"{where} can be used (the first, {bad[0][0].path}: {bad[0][1]}); is --images the "
            "folder that the split file's paths are relative to?")
    if bad and on_error == "fail":
        raise FeatureExtractionError(
            bad_images_message(bad, len(entries), "cannot be used", one_line=True)
            + f" (fix or remove them, or rerun with --on-error skip to encode the other "
            f"{len(entries) - len(bad)})"
        )
    if bad:
        say(bad_images_message(bad, len(entries), "cannot be used and will be skipped"))


def bad_images_message(bad: Sequence[tuple[Any, str]], total: int, what: str, *,
                       one_line: bool = False) -> str:
    """``N of TOTAL images WHAT:`` and the first bad files with their reasons, one per line,
    or (``one_line``, for an error) separated by semicolons."""
    items = [f"{entry.path}: {reason}" for entry, reason in bad[:SHOWN_BAD_IMAGES]]
    if len(bad) > SHOWN_BAD_IMAGES:
        items.append(f"and {len(bad) - SHOWN_BAD_IMAGES} more")
    head = f"{len(bad)} of {total} images {what}:"
    if one_line:
        return f"{head} {'; '.join(items)}"
    return "\n".join([head, *(f"  {item}" for item in items)])
