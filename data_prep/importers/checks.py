"""Checks of the records read: captions tokenized (empty and repeated ones reported), image
files found and decoded, image files that no caption names."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from data_prep.images import IMAGE_SUFFIXES, ImageLoadError, load_image
from data_prep.importers.records import Caption, CaptionRecord, ProblemLog
from data_prep.karpathy import tokenize


@dataclass(frozen=True)
class Item:
    """A usable image: ``sentences`` holds ``(raw, tokens)`` per caption, in input order;
    ``where`` and ``order`` are its record's."""

    image: str
    sentences: tuple[tuple[str, tuple[str, ...]], ...]
    where: str
    order: int
    cocoid: int | None = None


def tokenized_items(records: Iterable[CaptionRecord], log: ProblemLog) -> list[Item]:
    """Tokenize every caption (see :func:`_sentences`); images left without captions are
    reported as ``no_captions``."""
    items = []
    for record in records:
        sentences = _sentences(record, log)
        if sentences:
            items.append(Item(record.image, tuple(sentences), record.where, record.order,
                              record.cocoid))
        else:
            log.add("no_captions", record.image,
                    f"{record.image} ({record.where}) has no non-empty caption",
                    where=record.where, order=record.order)
    return items


def _sentences(record: CaptionRecord, log: ProblemLog) -> list[tuple[str, tuple[str, ...]]]:
    """``(raw, tokens)`` of the captions of ``record``. A caption without words is reported as
    ``empty_caption``, one with the tokens of an earlier caption of the image as
    ``duplicate_caption`` (the first is kept: a caption listed twice would weigh twice in
    training and in the references of the scores); both are left out."""
    sentences = []
    first_with: dict[tuple[str, ...], Caption] = {}
    for number, caption in enumerate(record.captions, start=1):
        tokens = tuple(tokenize(caption.text))
        if not tokens:
            log.add("empty_caption", f"{record.image} caption {number}",
                    f"{record.image}: {caption.where} has no words: {caption.text!r}",
                    where=caption.where, order=caption.order)
        elif tokens in first_with:
            earlier = first_with[tokens]
            log.add("duplicate_caption", caption.where,
                    f"{record.image}: {caption.where} {caption.text!r} repeats {earlier.where} "
                    f"{earlier.text!r} (tokens: {' '.join(tokens)})", where=caption.where,
                    order=caption.order, skipping="the later one is skipped")
        else:
            first_with[tokens] = caption
            sentences.append((caption.text.strip(), tokens))
    return sentences


def _probe(path: Path) -> tuple[str, str] | None:
    """None when ``path`` is a usable image, else ``(reason, message)``."""
    if not path.exists():
        twin = _normalization_twin(path)
        return "missing_image", f"{path}: file not found" + (
            f"; the folder holds {twin!r}, the same name in another Unicode normalization "
            "(as macOS writes names): rename the file or the captions file's entry"
            if twin else "")
    try:
        # A full decode, as training does: truncated JPEGs pass a header check.
        load_image(path)
    except ImageLoadError as exc:
        return "unreadable_image", str(exc)
    return None


def _normalization_twin(path: Path) -> str | None:
    """The name of a file beside ``path`` that differs from its name only in Unicode
    normalization (NFC / NFD), if any."""
    if path.name.isascii() or not path.parent.is_dir():
        return None
    wanted = unicodedata.normalize("NFC", path.name)
    return next((entry for entry in os.listdir(path.parent)
                 if unicodedata.normalize("NFC", entry) == wanted), None)


def readable_items(items: list[Item], image_root: Path, log: ProblemLog, *,
                   progress: bool = False) -> list[Item]:
    """The items whose image file exists and decodes (:func:`data_prep.images.load_image`,
    which also refuses images over ``MAX_IMAGE_PIXELS``); the others are reported as
    ``missing_image`` or ``unreadable_image``. Files are decoded on a few threads (Pillow
    releases the GIL while decoding)."""
    from tqdm.auto import tqdm

    good = []
    pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1))
    try:
        results = pool.map(_probe, [image_root / item.image for item in items])
        with tqdm(total=len(items), desc="checking images", unit="img",
                  disable=not progress) as bar:
            for item, result in zip(items, results, strict=True):
                bar.update()
                if result is None:
                    good.append(item)
                else:
                    reason, message = result
                    log.add(reason, item.image, f"{message} (listed at {item.where})",
                            where=item.where, order=item.order)
                    log.stop_if_failing()
    finally:
        # At the first failure with on_error="fail", images not yet started are not decoded.
        pool.shutdown(wait=True, cancel_futures=True)
    return good


def uncaptioned_images(image_root: Path, listed: set[str]) -> list[str]:
    """Image files (by :data:`data_prep.images.IMAGE_SUFFIXES`) under ``image_root`` whose
    relative path is not in ``listed``, sorted."""
    found = (path for path in image_root.rglob("*")
             if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file())
    return sorted(
        name for name in (path.relative_to(image_root).as_posix() for path in found)
        if name not in listed
    )
