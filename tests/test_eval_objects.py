"""Object mentions, area-downsampled masks and attention precision on a hand-made instances file."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from turned_photo import turned_photo

from data_prep.cell_labels import area_weights, downsample_mask
from eval.metrics.objects import (
    COCO_CATEGORY_WORDS,
    InstanceAnnotations,
    attention_precision,
    category_words_for,
    mentions,
    object_statistics,
)


def _rle(mask: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


@pytest.fixture
def instances(tmp_path):
    square = np.zeros((8, 8), dtype=bool)
    square[:4, :4] = True  # top-left quarter
    circle = np.zeros((8, 8), dtype=bool)
    circle[6:, 6:] = True
    star = np.zeros((8, 8), dtype=bool)
    star[:2, :] = True
    data = {
        "images": [
            {"id": 1, "width": 8, "height": 8, "file_name": "a.png"},
            {"id": 2, "width": 8, "height": 8, "file_name": "b.png"},
        ],
        "categories": [
            {"id": 1, "name": "square"},
            {"id": 2, "name": "circle"},
            {"id": 3, "name": "star"},
        ],
        "annotations": [
            {
                "id": 1,
                "image_id": 1,
                "category_id": 1,
                "segmentation": _rle(square),
                "area": 16.0,
                "bbox": [0, 0, 4, 4],
                "iscrowd": 0,
            },
            {
                "id": 2,
                "image_id": 1,
                "category_id": 2,
                "segmentation": _rle(circle),
                "area": 4.0,
                "bbox": [6, 6, 2, 2],
                "iscrowd": 0,
            },
            {
                "id": 3,
                "image_id": 2,
                "category_id": 3,
                "segmentation": _rle(star),
                "area": 16.0,
                "bbox": [0, 0, 8, 2],
                "iscrowd": 0,
            },
        ],
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data))
    return InstanceAnnotations.load(path, _blank_images(data, tmp_path))


def _blank_images(data: dict, folder) -> dict:
    """A black PNG of each image's size in the instances ``data``: image id -> file."""
    files = {}
    for image in data["images"]:
        files[image["id"]] = folder / image["file_name"]
        Image.new("RGB", (image["width"], image["height"])).save(files[image["id"]])
    return files


def test_coco_table_covers_the_80_categories():
    assert len(COCO_CATEGORY_WORDS) == 80
    assert all(words for words in COCO_CATEGORY_WORDS.values())


def test_mentions_plurals_multiword_and_longest_match():
    words = category_words_for(["person", "teddy bear", "bear", "dog", "bus"])
    found = mentions("Two men hug a teddy bear near the bears and puppies on buses".split(), words)
    assert found == {"person": [1], "teddy bear": [5], "bear": [8], "dog": [10], "bus": [12]}
    with pytest.raises(KeyError, match=r"no synonym list for categories unicorn, yeti \(known"):
        category_words_for(["unicorn", "dog", "yeti"])


def test_area_weights_and_downsampled_mask_by_hand():
    weights = area_weights(3, 8)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)
    mask = np.zeros((8, 8), dtype=bool)
    mask[:4, :4] = True
    # cells span 8/3 px: cell 0 fully inside; cell 1 covers [2.67, 5.33), half inside.
    expected = np.array([[1.0, 0.5, 0.0], [0.5, 0.25, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(downsample_mask(mask, (3, 3)), expected, atol=1e-12)
    np.testing.assert_allclose(downsample_mask(mask, (2, 2)), [[1.0, 0.0], [0.0, 0.0]])


def test_object_statistics_by_hand(instances):
    captions = {1: "a red square and two circles".split(), 2: "a blue square".split()}
    attention = {1: torch.full((6, 2, 2), 0.25), 2: torch.full((3, 2, 2), 0.25)}
    attention[1][2] = torch.tensor([[0.6, 0.2], [0.1, 0.1]])  # "square": 0.6 inside
    attention[1][5] = torch.tensor([[0.0, 0.0], [0.2, 0.8]])  # "circles": 0.8 * 1/4 inside
    stats = object_statistics(captions, attention, instances)
    # annotated: {square, circle}, {star}; mentioned: {square, circle}, {square}
    assert stats["object_recall"] == pytest.approx(2 / 3)
    assert stats["object_precision"] == pytest.approx(2 / 3)
    assert stats["attention_precision"] == pytest.approx((0.6 + 0.8 * 0.25) / 2)
    assert stats["attention_precision_words"] == 2
    shares = attention_precision(captions[1], attention[1], 1, instances)
    assert shares == pytest.approx({2: 0.6, 5: 0.2})


def _with_attributes(instances, tmp_path) -> InstanceAnnotations:
    """The fixture's file with the synthetic dataset's colour and size on every annotation."""
    data = json.loads(instances.path.read_text())
    for annotation, colour in zip(data["annotations"], ("red", "blue", "green"), strict=True):
        annotation.update(colour=colour, size="large")
    path = tmp_path / "instances_attributes.json"
    path.write_text(json.dumps(data))
    return InstanceAnnotations.load(path, _blank_images(data, tmp_path))


def test_phrase_precision_counts_the_colour_and_size_words_before_the_shape(instances, tmp_path):
    captions = {1: "a large red square and two circles".split()}
    attention = {1: torch.full((7, 2, 2), 0.25)}
    attention[1][1] = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # "large": all on the square
    attention[1][2] = torch.tensor([[0.0, 0.5], [0.5, 0.0]])  # "red": none on it
    attention[1][3] = torch.tensor([[0.6, 0.2], [0.1, 0.1]])  # "square": 0.6
    attention[1][6] = torch.tensor([[0.0, 0.0], [0.2, 0.8]])  # "circles": 0.8 * 1/4
    annotated = _with_attributes(instances, tmp_path)
    assert annotated.modifier_words == {"red", "blue", "green", "large"}
    stats = object_statistics(captions, attention, annotated)
    assert stats["attention_precision"] == pytest.approx((0.6 + 0.2) / 2)
    assert stats["attention_precision_phrase"] == pytest.approx((1.0 + 0.0 + 0.6 + 0.2) / 4)
    assert stats["attention_precision_phrase_words"] == 4
    # "and" and "two" are not attribute words: "circles" is its phrase alone. Without attribute
    # fields (COCO) the phrase is the category word.
    plain = object_statistics(captions, attention, instances)
    assert plain["attention_precision_phrase"] == plain["attention_precision"]


def test_missing_image_and_length_mismatch_are_named(instances):
    with pytest.raises(KeyError, match="image 9 was not loaded from the instances file"):
        object_statistics({9: ["a"]}, {9: torch.ones(1, 2, 2)}, instances)
    with pytest.raises(ValueError, match=r"image 1: attention of shape \(2, 2, 2\) for 1 tokens"):
        object_statistics({1: ["a"]}, {1: torch.ones(2, 2, 2)}, instances)
    assert math.isnan(
        object_statistics({2: ["nothing"]}, {2: torch.ones(1, 2, 2)}, instances)[
            "attention_precision"
        ]
    )


@pytest.mark.parametrize(("orientation", "annotated"), [
    *((orientation, "stored") for orientation in range(1, 9)),
    # Flips and half turns keep the size: such masks are taken as COCO's, so only the
    # quarter turns can be told to follow the pixels as shown.
    *((orientation, "shown") for orientation in range(5, 9)),
])
def test_masks_lie_over_the_photo_as_the_captioner_sees_it(tmp_path, orientation, annotated):
    """COCO's masks follow the stored pixels; a photo stored sideways is captioned turned by
    its EXIF orientation. The mask over the grid must be where the object's pixels are."""
    path, images, shown = turned_photo(tmp_path, orientation, annotated)
    annotations = InstanceAnnotations.load(path, images)
    for grid in ((4, 4), (3, 2)):
        np.testing.assert_allclose(annotations.mask(1, "square", grid),
                                   downsample_mask(shown, grid), atol=1e-12)


def test_an_instances_size_that_is_not_the_photos_is_refused(tmp_path):
    path, images, _ = turned_photo(tmp_path, 6, given_size=(10, 8))
    with pytest.raises(ValueError, match=(
            rf"^{path}: image 1 is 10x8 there, but {images[1]} is 12x8 \(width x height; "
            r"shown turned, 8x12, by its EXIF orientation 6\)$")):
        InstanceAnnotations.load(path, images)
    path, images, _ = turned_photo(tmp_path, 1, given_size=(12, 9))
    with pytest.raises(ValueError, match=rf"^{path}: image 1 is 12x9 there, but .* is 12x8 "
                                         r"\(width x height\)$"):
        InstanceAnnotations.load(path, images)
    with pytest.raises(ValueError, match=rf"^{path}: has no image 5 \(.*other.png\); 1 of the 2 "
                                         "images asked for are missing$"):
        InstanceAnnotations.load(path, {**images, 5: tmp_path / "other.png"})
