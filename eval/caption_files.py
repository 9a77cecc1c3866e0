"""Reading caption files for scoring: COCO results, COCO caption annotations, Karpathy JSON."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from data_prep.karpathy import tokenize
from data_prep.paths import require_file
from data_prep.settings_files import parse_json
from data_prep.wording import agreeing, counted, first_names


class CaptionFileError(ValueError):
    """A results or references file is malformed; the message names the file and entry."""


# What score reads as results, and what writes it: a JSON Lines file of `caption --format jsonl`
# is the likeliest wrong input.
_RESULTS_FORMAT = ('one JSON list of {"image_id", "caption"} objects, as `captioner caption '
                   '--format coco` and `captioner evaluate` write')


def _read_json(path: Path, what: str) -> Any:
    require_file(path, f"{what} file")
    try:
        with path.open(encoding="utf-8") as handle:
            return parse_json(handle.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if isinstance(exc, json.JSONDecodeError) and exc.msg == "Extra data" and exc.colno == 1:
            expected = f"; a {what} file is {_RESULTS_FORMAT}" if what == "results" else ""
            raise CaptionFileError(
                f"{path}: JSON Lines (a JSON value on each line), not one JSON document{expected}"
            ) from exc
        raise CaptionFileError(f"{path}: not valid JSON ({exc})") from exc


def _image_id(value: Any, where: str) -> int:
    """``value`` if it is an integer image id, else a CaptionFileError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CaptionFileError(f"{where}: image_id must be an integer, got {value!r}")
    return value


class Results(NamedTuple):
    """A results file: ``captions`` {image_id: caption}, and ``file_names`` {image_id: file}
    of the records that name their image (`caption --format coco` writes them so)."""

    captions: dict[int, str]
    file_names: dict[int, str]


class References(NamedTuple):
    """A references file: ``captions`` {image_id: [reference, ...]}; ``file_names`` {image_id:
    file name, no folder} of its images (a COCO captions file's ``images``, where it lists
    them); ``other_splits`` {image_id: split} of a Karpathy JSON's images in other splits."""

    captions: dict[int, list[str]]
    file_names: dict[int, str]
    other_splits: dict[int, str]


def load_results(path: str | Path) -> Results:
    """``[{"image_id": int, "caption": str}, ...]`` (COCO results format; a record may name its
    image in ``"file_name"``).

    Raises CaptionFileError for a wrong structure or no caption, listing duplicate image ids
    if any."""
    path = Path(path)
    data = _read_json(path, "results")
    if not isinstance(data, list):
        raise CaptionFileError(
            f"{path}: COCO results must be a list of {{'image_id', 'caption'}} objects, "
            f"got {type(data).__name__}"
        )
    if not data:
        raise CaptionFileError(f"{path}: holds no captions (an empty list)")
    results: dict[int, str] = {}
    for index, entry in enumerate(data):
        if not isinstance(entry, dict) or "image_id" not in entry or "caption" not in entry:
            raise CaptionFileError(
                f"{path}: entry {index} must have 'image_id' and 'caption', got {entry!r:.200}"
            )
        if not isinstance(entry["caption"], str):
            raise CaptionFileError(
                f"{path}: entry {index}: caption must be a string, got {entry['caption']!r:.200}"
            )
        results.setdefault(_image_id(entry["image_id"], f"{path}: entry {index}"),
                           entry["caption"])
    counts = Counter(entry["image_id"] for entry in data)
    duplicates = sorted(image_id for image_id, n in counts.items() if n > 1)
    if duplicates:
        count = len(duplicates)
        raise CaptionFileError(
            f"{path}: {counted(count, 'image id')} {agreeing(count, 'has', 'have')} more than "
            f"one caption ({first_names(duplicates)}); keep one caption per image"
        )
    file_names = {entry["image_id"]: entry["file_name"] for entry in data
                  if isinstance(entry.get("file_name"), str)}
    return Results(results, file_names)


def _coco_references(path: Path, data: dict[str, Any]) -> References:
    if not isinstance(data["annotations"], list):
        raise CaptionFileError(f"{path}: field 'annotations' must be a list of {{'image_id', "
                               f"'caption'}} objects, got {type(data['annotations']).__name__}")
    references: dict[int, list[str]] = {}
    for index, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or "image_id" not in ann or "caption" not in ann:
            raise CaptionFileError(
                f"{path}: annotations[{index}] must have 'image_id' and 'caption'"
            )
        if not isinstance(ann["caption"], str):
            raise CaptionFileError(f"{path}: annotations[{index}]: caption must be a string")
        image_id = _image_id(ann["image_id"], f"{path}: annotations[{index}]")
        references.setdefault(image_id, []).append(ann["caption"])
    images = data.get("images")
    file_names = {image["id"]: Path(image["file_name"]).name for image in images
                  if isinstance(image, dict) and isinstance(image.get("id"), int)
                  and isinstance(image.get("file_name"), str)
                  } if isinstance(images, list) else {}
    return References(references, file_names, {})


def load_references(path: str | Path, split: str | None = None) -> References:
    """The references of a COCO captions annotation file (``{"annotations": [{"image_id",
    "caption"}], "images": [{"id", "file_name"}], ...}``) or, with ``split``, of a Karpathy
    JSON's split (``{"images": [{"sentences": ...}]}``, read by
    ``data_prep.karpathy.load_karpathy``; the raw sentences are used, as pycocoevalcap
    tokenizes them itself)."""
    path = Path(path)
    data = _read_json(path, "references")
    if isinstance(data, dict) and "annotations" in data:
        if split is not None:
            raise CaptionFileError(
                f"{path}: a COCO captions file has no splits; drop --split {split}"
            )
        return _coco_references(path, data)
    if isinstance(data, dict) and "images" in data and "dataset" not in data:
        raise CaptionFileError(f"{path}: neither a COCO captions file (it has no field "
                               "'annotations') nor a Karpathy JSON (no field 'dataset')")
    if isinstance(data, dict) and "images" in data:
        if split is None:
            raise CaptionFileError(f"{path}: a Karpathy JSON needs --split (train, val or test)")
        from data_prep.karpathy import load_karpathy

        dataset = load_karpathy(path, path.parent)
        try:
            entries = dataset.split(split)
        except KeyError as exc:  # an unknown split, named with the dataset's own
            raise CaptionFileError(f"{path}: {exc.args[0]}") from None
        if not entries:
            raise CaptionFileError(f"{path}: split {split!r} holds no images")
        return References({entry.image_id: list(entry.raws) for entry in entries},
                          {entry.image_id: entry.path.name for entry in entries},
                          {entry.image_id: entry.split for name, others in dataset.entries.items()
                           if name != split for entry in others})
    raise CaptionFileError(
        f"{path}: neither a COCO captions file ('annotations') nor a Karpathy JSON ('images')"
    )


def check_result_names(results: Path, result_names: dict[int, str], references: Path,
                       reference_names: dict[int, str]) -> str | None:
    """Check that the references give the image ids of the results records that name their
    images (``result_names``, as `caption --format coco` writes them) to files of the same
    names (``reference_names``; compared without folders), and no file to another id, so that
    no caption is scored against another image's references: ids taken from COCO file names,
    or input positions, are not a converted dataset's. ``results`` and ``references`` are the
    files, for messages.

    Returns a warning where the references name no files to check against (else None).
    Raises CaptionFileError naming the first ids whose files differ."""
    if not result_names:
        return None
    if not reference_names:
        return (f"warning: {references} names no image files, so the image ids of the "
                f"captions in {results} are not checked against their file names")
    id_of_name = {name: image_id for image_id, name in reference_names.items()}
    wrong = []
    for image_id, name in sorted(result_names.items()):
        given = reference_names.get(image_id)
        if given is not None and Path(name).name != given:
            wrong.append(f"image id {image_id}: {name}, but {given} in {references}")
        elif given is None and Path(name).name in id_of_name:
            # Ids of another numbering that the references do not use at all (Flickr30k's
            # file names, numbers, read as COCO ids): the file has an id of its own there.
            wrong.append(f"image id {image_id}: {name}, image id {id_of_name[Path(name).name]} "
                         f"in {references}")
    if wrong:
        raise CaptionFileError(
            f"{results}: {len(wrong)} of its {counted(len(result_names), 'caption')} "
            f"{agreeing(len(wrong), 'names', 'name')} another image than {references} gives "
            f"its image id ({first_names(wrong, limit=3, separator='; ')}); `captioner caption "
            "--format coco` takes ids from COCO file names (or input positions), not a "
            "converted dataset's: score a dataset's split with `captioner evaluate`")
    return None


def empty_caption_ids(captions: dict[int, str]) -> list[int]:
    """Ids whose caption has no words: no letter, number or mark, as ``prepare-dataset`` finds
    a reference caption empty (:func:`data_prep.karpathy.tokenize`). Punctuation alone is a
    token to coco-caption's tokenizer ("!!!"), which scores it as a one-word caption, REP 0."""
    return sorted(image_id for image_id, caption in captions.items() if not tokenize(caption))
