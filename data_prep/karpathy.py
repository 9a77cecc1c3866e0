"""Karpathy-split caption files: ``dataset_coco.json``, ``dataset_flickr30k.json``, ...

The files of Karpathy & Fei-Fei (2015) are the standard splits used by the TVmax paper
(section 4): ``{"images": [...], "dataset": "coco"}`` where each image is

    {"filepath": "val2014",            # optional (absent in the Flickr files)
     "filename": "COCO_val2014_000000391895.jpg",
     "imgid": 0,                       # index of the image in the file
     "cocoid": 391895,                 # COCO only: the id used by the COCO annotations
     "split": "train" | "val" | "test" | "restval",
     "sentences": [{"tokens": ["a", "man", ...], "raw": "A man ...", ...}, ...],
     ...}

COCO's ``restval`` images (the rest of the 2014 validation set) are used for training, as in
the paper, so they are folded into ``"train"`` here (113,287 training images).
Every problem is reported as a :class:`KarpathyFormatError` naming the file, the image's index
in ``images`` and the offending field, because a silently dropped image or caption would change
the published splits.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from data_prep.paths import require_file
from data_prep.settings_files import parse_json
from data_prep.wording import shown

SPLITS: tuple[str, ...] = ("train", "val", "test")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Karpathy's split names -> the split an image is used in.
_SPLIT_OF: dict[str, str] = {"train": "train", "restval": "train", "val": "val", "test": "test"}


class KarpathyFormatError(ValueError):
    """A Karpathy-split JSON file that does not have the expected structure."""


@dataclass(frozen=True)
class ImageEntry:
    """One image of a Karpathy split with its reference captions.

    ``image_id`` is ``cocoid`` when the file has it (so that it matches the COCO annotations and
    the COCO results format), else ``imgid``. ``sentences`` holds the lower-cased tokens of each
    reference caption and ``raws`` the original caption strings, in the same order.
    """

    image_id: int
    path: Path
    split: str
    sentences: tuple[tuple[str, ...], ...]
    raws: tuple[str, ...]


@dataclass(frozen=True)
class KarpathyDataset:
    """A parsed Karpathy file: ``name`` is its ``"dataset"`` field, ``entries`` maps each of
    ``"train"``, ``"val"``, ``"test"`` to its images in file order."""

    name: str
    entries: dict[str, list[ImageEntry]]

    def split(self, name: str) -> list[ImageEntry]:
        """The images of split ``name`` (``"train"`` includes COCO's ``restval``)."""
        if name not in self.entries:
            raise KeyError(
                f"unknown split {name!r} of dataset {self.name!r}; expected one of "
                f"{', '.join(self.entries)}"
            )
        return self.entries[name]

    def __len__(self) -> int:
        return sum(len(images) for images in self.entries.values())


def inside_folder(name: str) -> bool:
    """Whether the image name ``name``, read from a file, stays inside the image folder it is
    relative to: not absolute, no ``..``. Every reader of image names from a file (a captions
    file, a split file) confines them with it: a name like ``../secret/x.png`` would read,
    copy into a rating kit or show a file the user never gave."""
    path = PurePosixPath(name.strip())
    return not path.is_absolute() and ".." not in path.parts


def normalize_image_path(name: str) -> str | None:
    """``name`` as a clean relative POSIX path (``./a//b.jpg`` -> ``a/b.jpg``), or None when
    it is empty or leaves the image folder (:func:`inside_folder`)."""
    path = PurePosixPath(name.strip())
    if not path.parts or str(path) == "." or not inside_folder(name):
        return None
    return str(path)


def image_name(entry: ImageEntry, image_root: str | Path) -> str:
    """The entry's image as its split file names it, ``filepath/filename``: the path below
    ``image_root`` (a feature cache records it for every image id)."""
    return entry.path.relative_to(Path(image_root)).as_posix()


def load_karpathy(json_path: str | Path, image_root: str | Path) -> KarpathyDataset:
    """Parse and validate a Karpathy-split JSON file.

    Image paths are ``image_root / filepath / filename`` (``filepath`` omitted when absent);
    they are not opened here (prepare-features checks every image before encoding).

    Raises:
        FileNotFoundError: ``json_path`` does not exist. ValueError: it is a folder or FIFO.
        KarpathyFormatError: invalid JSON, a missing or ill-typed field, an unknown split, an
            image without captions, a caption without tokens, a duplicate image id, or an
            image file listed twice.
    """
    json_path = Path(json_path)
    image_root = Path(image_root)
    require_file(json_path, "Karpathy split file")
    try:
        with json_path.open(encoding="utf-8") as handle:
            data = parse_json(handle.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KarpathyFormatError(f"{json_path}: not valid JSON ({exc})") from exc

    if not isinstance(data, Mapping):
        raise KarpathyFormatError(
            f"{json_path}: top level must be an object, got {type(data).__name__}"
        )
    name = data.get("dataset")
    if "annotations" in data and "dataset" not in data:
        annotations = data["annotations"]
        first = annotations[0] if isinstance(annotations, list) and annotations else {}
        if isinstance(first, dict) and "caption" in first:
            raise KarpathyFormatError(
                f"{json_path}: a COCO captions file ('annotations' with captions), not a "
                "Karpathy split file; make one from it with captioner prepare-dataset "
                f"--captions {json_path} --images FOLDER --out SPLIT_FILE.json")
        raise KarpathyFormatError(
            f"{json_path}: a COCO annotations file (of objects or an empty one), not a Karpathy "
            "split file (with 'dataset' and 'images', each with its split and sentences)")
    if not isinstance(name, str) or not name:
        raise KarpathyFormatError(f"{json_path}: field 'dataset' must be a non-empty string")
    images = data.get("images")
    if not isinstance(images, list):
        raise KarpathyFormatError(f"{json_path}: field 'images' must be a list")

    entries: dict[str, list[ImageEntry]] = {split: [] for split in SPLITS}
    first_index_of_id: dict[int, int] = {}
    first_of_path: dict[Path, tuple[int, str]] = {}
    # The ids of a COCO split file are its cocoids: an image without one would take its imgid,
    # another numbering, and stand for another image of the COCO annotations and caches.
    with_cocoid = next((i for i, record in enumerate(images)
                        if isinstance(record, dict) and "cocoid" in record), None)
    for index, record in enumerate(images):
        entry = _parse_image(record, json_path, index, image_root)
        if with_cocoid is not None and "cocoid" not in record:
            raise KarpathyFormatError(
                f"{json_path}: images[{index}] ({entry.path.name}): field 'cocoid' is missing, "
                f"which images[{with_cocoid}] has; every image of a COCO split file needs its "
                "cocoid")
        if entry.image_id in first_index_of_id:
            raise KarpathyFormatError(
                f"{json_path}: images[{index}]: duplicate image id {entry.image_id} "
                f"(already used by images[{first_index_of_id[entry.image_id]}])"
            )
        if entry.path in first_of_path:
            # Under two ids, one image would be trained on and scored as two, and in two
            # splits its test captions would be learnt.
            first, split = first_of_path[entry.path]
            raise KarpathyFormatError(
                f"{json_path}: images[{index}] ({record['split']}): the image file "
                f"{image_name(entry, image_root)} of images[{first}] ({split}) again; "
                "every image is listed once")
        first_index_of_id[entry.image_id] = index
        first_of_path[entry.path] = (index, record["split"])
        entries[entry.split].append(entry)
    return KarpathyDataset(name=name, entries=entries)


def _parse_image(record: Any, json_path: Path, index: int, image_root: Path) -> ImageEntry:
    def fail(field: str, problem: str) -> KarpathyFormatError:
        filename = record.get("filename") if isinstance(record, dict) else None
        label = f" ({filename})" if isinstance(filename, str) else ""
        return KarpathyFormatError(
            f"{json_path}: images[{index}]{label}: field {field!r} {problem}"
        )

    if not isinstance(record, dict):
        raise fail("images", f"entry must be an object, got {type(record).__name__}")

    filename = _require(record, "filename", str, fail)
    if not filename:
        raise fail("filename", "is empty")
    filepath = record.get("filepath", "")
    if not isinstance(filepath, str):
        raise fail("filepath", f"must be a string, got {type(filepath).__name__}")
    for field, name in (("filepath", filepath), ("filename", filename)):
        if not inside_folder(name):
            raise fail(field, f"leaves the image folder ({name!r}); image paths must be "
                              "relative to the image folder, without '..'")
    imgid = _require(record, "imgid", int, fail)
    image_id = imgid
    if "cocoid" in record:
        image_id = _require(record, "cocoid", int, fail)
    for field in ("imgid", "cocoid"):
        # Ids are stored as int64 (feature caches, tensors, COCO results).
        if field in record and not INT64_MIN <= record[field] <= INT64_MAX:
            raise fail(field, f"is {shown(record[field], 30)}, outside the 64-bit integers an "
                              "image id must fit in")

    split_name = _require(record, "split", str, fail)
    if split_name not in _SPLIT_OF:
        raise fail(
            "split", f"has unknown value {split_name!r}; expected one of {', '.join(_SPLIT_OF)}"
        )

    sentences = _require(record, "sentences", list, fail)
    if not sentences:
        raise fail("sentences", "is empty: every image needs at least one caption")
    token_lists: list[tuple[str, ...]] = []
    raws: list[str] = []
    for k, sentence in enumerate(sentences):
        if not isinstance(sentence, dict):
            raise fail(f"sentences[{k}]", f"must be an object, got {type(sentence).__name__}")
        raw = sentence.get("raw")
        if not isinstance(raw, str):
            raise fail(f"sentences[{k}].raw", "is missing or not a string")
        token_lists.append(_lower_tokens(sentence.get("tokens"), f"sentences[{k}].tokens", fail))
        raws.append(raw)

    return ImageEntry(
        image_id=image_id,
        path=image_root / filepath / filename,
        split=_SPLIT_OF[split_name],
        sentences=tuple(token_lists),
        raws=tuple(raws),
    )


def _lower_tokens(tokens: Any, field: str, fail) -> tuple[str, ...]:
    """Lower-cased tokens; each must be a non-empty string without whitespace."""
    if not isinstance(tokens, list):
        raise fail(field, "is missing or not a list")
    if not tokens:
        raise fail(field, "is empty")
    # Fast path in C for the ~6 million tokens of COCO: joining with single spaces and splitting
    # on any whitespace gives the tokens back exactly when none is empty or holds whitespace.
    try:
        joined = " ".join(tokens).lower()
    except TypeError:
        joined = None
    if joined is not None:
        words = joined.split()
        if len(words) == len(tokens) and " ".join(words) == joined:
            return tuple(words)
    for j, token in enumerate(tokens):
        if not isinstance(token, str) or not token.strip():
            raise fail(f"{field}[{j}]", f"must be a non-empty string, got {token!r}")
        if token.split() != [token]:
            raise fail(f"{field}[{j}]", f"must not contain whitespace, got {token!r}")
    raise AssertionError(f"{field}: tokens rejected by the fast path passed every check")


def _require(record: Mapping, field: str, kind: type, fail) -> Any:
    if field not in record:
        raise fail(field, "is missing")
    value = record[field]
    # bool is an int subclass, but True is never a valid image id.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise fail(field, f"must be of type {kind.__name__}, got {value!r}")
    return value


def tokenize(raw: str) -> list[str]:
    """Karpathy-style tokens of a caption.

    The rule: normalize to Unicode NFKC, lower-case (``str.lower``), delete every character
    that is not a letter, a number, a combining mark (Unicode categories L*, N*, M*) or
    whitespace, and split on whitespace. Deleting rather than splitting at punctuation is what
    Karpathy's preprocessing did (neuraltalk2 removed ``string.punctuation``):
    ``"A man's T-shirt, 2 dogs!"`` -> ``["a", "mans", "tshirt", "2", "dogs"]``; accented and
    non-Latin words stay whole (``"Café"`` -> ``["café"]``).
    """
    text = unicodedata.normalize("NFKC", raw).lower()
    kept = "".join(
        char for char in text if char.isspace() or unicodedata.category(char)[0] in "LNM"
    )
    return kept.split()
