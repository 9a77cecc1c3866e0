"""Karpathy-split loader on small COCO- and Flickr-format files written by the tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from data_prep.karpathy import ImageEntry, KarpathyFormatError, load_karpathy


def _sentence(raw: str) -> dict:
    return {"tokens": raw.rstrip(".").split(), "raw": raw, "imgid": 0, "sentid": 0}


def coco_like() -> dict:
    """Same fields and shapes as dataset_coco.json (filepath, cocoid, restval)."""
    images = []
    for imgid, (split, cocoid) in enumerate(
        [("train", 9), ("restval", 25), ("val", 30), ("test", 42), ("restval", 57)]
    ):
        filepath = "train2014" if split == "train" else "val2014"
        images.append(
            {
                "filepath": filepath,
                "sentids": [imgid],
                "filename": f"COCO_{filepath}_{cocoid:012d}.jpg",
                "imgid": imgid,
                "split": split,
                "sentences": [
                    _sentence(f"A Dog number {cocoid} on the grass."),
                    _sentence("Another caption here"),
                ],
                "cocoid": cocoid,
            }
        )
    return {"images": images, "dataset": "coco"}


def flickr_like() -> dict:
    """Same fields as dataset_flickr30k.json / dataset_flickr8k.json: no filepath, no cocoid."""
    images = [
        {
            "sentids": [0],
            "imgid": imgid,
            "sentences": [_sentence("Two young guys with shaggy hair.")],
            "split": split,
            "filename": f"{1000092795 + imgid}.jpg",
        }
        for imgid, split in enumerate(["train", "train", "val", "test"])
    ]
    return {"images": images, "dataset": "flickr30k"}


def write(tmp_path: Path, data: dict, name: str = "dataset.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_coco_restval_is_training_and_ids_are_cocoids(tmp_path):
    dataset = load_karpathy(write(tmp_path, coco_like()), tmp_path / "coco")
    assert dataset.name == "coco"
    assert [e.image_id for e in dataset.split("train")] == [9, 25, 57]
    assert [e.image_id for e in dataset.split("val")] == [30]
    assert [e.image_id for e in dataset.split("test")] == [42]
    assert len(dataset) == 5
    restval = dataset.split("train")[1]
    assert restval == ImageEntry(
        image_id=25,
        path=tmp_path / "coco" / "val2014" / "COCO_val2014_000000000025.jpg",
        split="train",
        sentences=(
            ("a", "dog", "number", "25", "on", "the", "grass"),
            ("another", "caption", "here"),
        ),
        raws=("A Dog number 25 on the grass.", "Another caption here"),
    )


def test_flickr_ids_are_imgids_and_paths_have_no_filepath(tmp_path):
    dataset = load_karpathy(write(tmp_path, flickr_like()), tmp_path / "images")
    assert dataset.name == "flickr30k"
    assert [e.image_id for e in dataset.split("train")] == [0, 1]
    assert dataset.split("test")[0].path == tmp_path / "images" / "1000092798.jpg"
    assert dataset.split("val")[0].sentences == (
        ("two", "young", "guys", "with", "shaggy", "hair"),
    )


def test_unknown_split_name_is_a_key_error(tmp_path):
    dataset = load_karpathy(write(tmp_path, flickr_like()), tmp_path)
    with pytest.raises(KeyError, match="restval"):
        dataset.split("restval")


def _set(path: tuple, value):
    def mutate(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: tuple):
    def mutate(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


MALFORMED = {
    "missing images": (_delete(("images",)), "field 'images'"),
    "missing dataset": (_delete(("dataset",)), "field 'dataset'"),
    "image not an object": (_set(("images", 1), "oops"), r"images\[1\]"),
    "missing filename": (_delete(("images", 2, "filename")), r"images\[2\].*'filename' is missing"),
    "missing imgid": (_delete(("images", 0, "imgid")), r"images\[0\].*'imgid' is missing"),
    "string cocoid": (_set(("images", 3, "cocoid"), "42"), r"images\[3\].*'cocoid'.*'42'"),
    "bool imgid": (_set(("images", 3, "imgid"), True), r"images\[3\].*'imgid'"),
    "missing split": (_delete(("images", 1, "split")), r"images\[1\].*'split' is missing"),
    "unknown split": (_set(("images", 1, "split"), "dev"), r"images\[1\].*'split'.*'dev'"),
    "missing sentences": (
        _delete(("images", 4, "sentences")),
        r"images\[4\].*'sentences' is missing",
    ),
    "empty sentences": (_set(("images", 4, "sentences"), []), r"images\[4\].*'sentences' is empty"),
    "empty tokens": (
        _set(("images", 2, "sentences", 1, "tokens"), []),
        r"images\[2\].*'sentences\[1\].tokens' is empty",
    ),
    "blank token": (
        _set(("images", 2, "sentences", 0, "tokens", 3), " "),
        r"images\[2\].*'sentences\[0\].tokens\[3\]'",
    ),
    "tab token": (
        _set(("images", 2, "sentences", 0, "tokens", 1), "\t"),
        r"images\[2\].*'sentences\[0\].tokens\[1\]'.*non-empty",
    ),
    "token with a space": (
        _set(("images", 2, "sentences", 0, "tokens", 0), "hot dog"),
        r"images\[2\].*'sentences\[0\].tokens\[0\]'.*whitespace.*'hot dog'",
    ),
    "number token": (
        _set(("images", 1, "sentences", 1, "tokens", 2), 7),
        r"images\[1\].*'sentences\[1\].tokens\[2\]'.*got 7",
    ),
    "tokens not a list": (
        _set(("images", 1, "sentences", 0, "tokens"), "a dog"),
        r"images\[1\].*'sentences\[0\].tokens' is missing or not a list",
    ),
    "missing raw": (
        _delete(("images", 0, "sentences", 1, "raw")),
        r"images\[0\].*'sentences\[1\].raw'",
    ),
    # It took its imgid, another numbering: another image's id in the COCO annotations.
    "missing cocoid": (
        _delete(("images", 2, "cocoid")),
        r"images\[2\] \(COCO_val2014_000000000030.jpg\): field 'cocoid' is missing, which "
        r"images\[0\] has",
    ),
    "duplicate cocoid": (
        _set(("images", 3, "cocoid"), 9),
        r"images\[3\].*duplicate image id 9.*images\[0\]",
    ),
    # A test image that is a training image under another id would leak into training.
    "an image file listed twice": (
        lambda data: data["images"][3].update(filepath="train2014",
                                              filename="COCO_train2014_000000000009.jpg"),
        r"images\[3\] \(test\): the image file train2014/COCO_train2014_000000000009.jpg of "
        r"images\[0\] \(train\) again",
    ),
    "an image file listed twice, spelt otherwise": (
        lambda data: data["images"][4].update(filepath="",
                                              filename="./val2014//COCO_val2014_000000000030.jpg"),
        r"images\[4\] \(restval\): the image file val2014/COCO_val2014_000000000030.jpg of "
        r"images\[2\] \(val\)",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_names_file_image_and_field(tmp_path, case):
    mutate, pattern = MALFORMED[case]
    data = copy.deepcopy(coco_like())
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(KarpathyFormatError, match=pattern) as info:
        load_karpathy(path, tmp_path)
    assert str(path) in str(info.value)


def test_duplicate_imgid_in_flickr_format(tmp_path):
    data = flickr_like()
    data["images"][2]["imgid"] = 0
    with pytest.raises(KarpathyFormatError, match=r"images\[2\].*duplicate image id 0"):
        load_karpathy(write(tmp_path, data), tmp_path)


def test_invalid_json_and_missing_file(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [')
    with pytest.raises(KarpathyFormatError, match="broken.json: not valid JSON"):
        load_karpathy(broken, tmp_path)
    with pytest.raises(FileNotFoundError, match="absent.json"):
        load_karpathy(tmp_path / "absent.json", tmp_path)


def test_a_coco_captions_file_given_as_a_split_file_says_what_it_is(tmp_path):
    coco = tmp_path / "captions_mine.json"
    coco.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg"}],
        "annotations": [{"id": 1, "image_id": 1, "caption": "a dog"}]}))
    with pytest.raises(KarpathyFormatError) as error:
        load_karpathy(coco, tmp_path)
    assert str(error.value) == (
        f"{coco}: a COCO captions file ('annotations' with captions), not a Karpathy split "
        f"file; make one from it with captioner prepare-dataset --captions {coco} --images "
        "FOLDER --out SPLIT_FILE.json")
    instances = tmp_path / "instances_val.json"
    instances.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg"}], "categories": [{"id": 1, "name": "dog"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 2]}]}))
    with pytest.raises(KarpathyFormatError) as error:
        load_karpathy(instances, tmp_path)
    assert str(error.value) == (
        f"{instances}: a COCO annotations file (of objects or an empty one), not a Karpathy "
        "split file (with 'dataset' and 'images', each with its split and sentences)")
