"""Images dealt into train, val and test: by fractions, by counts, or by a split file."""

from __future__ import annotations

import decimal
import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from data_prep.importers.checks import Item
from data_prep.importers.records import DatasetImportError, ProblemLog, skipped_summary
from data_prep.karpathy import normalize_image_path
from data_prep.settings_files import parse_json
from data_prep.wording import first_names

SPLITS: tuple[str, ...] = ("train", "val", "test")


@dataclass(frozen=True)
class SplitSpec:
    """How images are split: ``fractions`` (three exact fractions summing to 1), ``counts``
    (three image counts) or ``lists`` (image path -> split, from a split file)."""

    fractions: tuple[Fraction, ...] | None = None
    counts: tuple[int, ...] | None = None
    lists: dict[str, str] | None = None


def parse_split(text: str) -> SplitSpec:
    """Parse ``--split``: ``0.8,0.1,0.1`` (fractions: numbers with a decimal point, summing to
    exactly 1), ``800,100,100`` (image counts: integers) or the path of a JSON split file
    ``{"train": [paths], "val": [...], "test": [...]}`` (paths as in the captions file)."""
    if text.lower().endswith(".json") or Path(text).is_file():
        return SplitSpec(lists=_read_split_file(Path(text)))
    parts = [part.strip() for part in text.split(",")]
    usage = ("expected train,val,test fractions (0.8,0.1,0.1), counts (800,100,100) or a JSON "
             "split file")
    if len(parts) != 3:
        raise DatasetImportError(f"--split {text!r}: {usage}")
    if all(part.isdecimal() for part in parts):  # not isdigit: int() refuses '²'
        return SplitSpec(counts=tuple(int(part) for part in parts))
    try:
        fractions = tuple(Fraction(part) for part in parts)
    except (ValueError, ZeroDivisionError):
        raise DatasetImportError(f"--split {text!r}: {usage}") from None
    if any(f < 0 for f in fractions) or sum(fractions) != 1:
        raise DatasetImportError(
            f"--split {text!r}: fractions must be >= 0 and sum to 1, they sum to "
            f"{_decimal(sum(fractions))}"
        )
    return SplitSpec(fractions=fractions)


def _decimal(value: Fraction) -> str:
    """``value`` in decimal, to 30 significant digits: a sum of 1 + 1e-16 is not "1"."""
    quotient = decimal.Context(prec=30).divide(value.numerator, value.denominator)
    return f"{quotient.normalize():f}"


def _read_split_file(path: Path) -> dict[str, str]:
    try:
        with path.open(encoding="utf-8-sig") as handle:
            data = parse_json(handle.read())
    except FileNotFoundError:
        raise DatasetImportError(f"--split {path}: split file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetImportError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or set(data) - set(SPLITS):
        keys = first_names(sorted(data)) if isinstance(data, dict) else type(data).__name__
        raise DatasetImportError(f"{path}: split file must be an object with keys among "
                                 f"{', '.join(SPLITS)}, got {keys}")
    split_of: dict[str, str] = {}
    for split, names in data.items():
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise DatasetImportError(f"{path}: field {split!r} must be a list of image paths")
        for name in names:
            image = normalize_image_path(name)
            if image is None:
                raise DatasetImportError(f"{path}: field {split!r}: invalid image path {name!r}")
            if image in split_of:
                raise DatasetImportError(f"{path}: image {image!r} is listed in {split_of[image]!r}"
                                         f" and again in {split!r}")
            split_of[image] = split
    return split_of


def split_sizes(n: int, fractions: tuple[Fraction, ...]) -> tuple[int, ...]:
    """Split ``n`` images by ``fractions`` (summing to 1): each split gets the floor of its
    share and the images left over go to the largest remainders, ties to the earlier split."""
    exact = [n * f for f in fractions]
    sizes = [int(share) for share in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[: n - sum(sizes)]:
        sizes[i] += 1
    return tuple(sizes)


def assign_splits(items: list[Item], spec: SplitSpec, seed: int, log: ProblemLog, *,
                  listed: set[str]) -> tuple[dict[str, list[Item]], list[str]]:
    """Images per split (each split in path order) and the paths left out by ``counts``.

    Random splits cut the images in the order of :func:`_draw_order`, so the result depends
    only on the set of usable images and the seed, not on the order of the captions file, and
    an image added or removed moves at most a few others to another split. With a split
    file, usable images it does not list are reported as ``not_in_split_file``, and names it
    lists that no record of the captions file has (``listed`` holds every path the captions
    file named) as ``unknown_in_split_file``.
    """
    by_path = {item.image: item for item in items}
    if spec.lists is not None:
        chosen: dict[str, list[str]] = {split: [] for split in SPLITS}
        for image in sorted(by_path):
            if image in spec.lists:
                chosen[spec.lists[image]].append(image)
            else:
                item = by_path[image]
                log.add("not_in_split_file", image, f"{image} is in no list of the split file",
                        where=item.where, order=item.order)
        for image in sorted(set(spec.lists) - listed):
            log.add("unknown_in_split_file", image,
                    f"{image} ({spec.lists[image]}) is in the split file but not in the captions",
                    where=f"the split file's {spec.lists[image]!r} list", order=math.inf)
        log.stop_if_failing()
        return _items_by_split(chosen, by_path), []

    order = _draw_order(by_path, seed)
    if spec.counts is not None:
        sizes = spec.counts
        if sum(sizes) > len(order):
            skipped = skipped_summary(log)
            raise DatasetImportError(
                f"--split {','.join(map(str, sizes))}: {sum(sizes)} images requested, "
                f"{len(order)} usable{'; ' + skipped if skipped else ''}"
            )
    else:
        sizes = split_sizes(len(order), spec.fractions)
    chosen, start = {}, 0
    for split, size in zip(SPLITS, sizes, strict=True):
        chosen[split] = sorted(order[start:start + size])
        start += size
    return _items_by_split(chosen, by_path), sorted(order[start:])


def _draw_order(paths: Iterable[str], seed: int) -> list[str]:
    """``paths`` in the order of the SHA-256 of seed and path: a random order that gives each
    image its place whatever the other images are. A shuffle of the whole list would deal
    most images anew when one is added or removed (a photo fixed and the file rebuilt), moving
    test images into training."""
    def place(path: str) -> bytes:
        return hashlib.sha256(f"{seed}\n{path}".encode("utf-8", "surrogateescape")).digest()

    return sorted(paths, key=place)


def _items_by_split(chosen: dict[str, list[str]], by_path: dict[str, Item]
                    ) -> dict[str, list[Item]]:
    return {split: [by_path[image] for image in sorted(names)] for split, names in chosen.items()}
