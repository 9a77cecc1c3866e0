"""Synthetic dataset: determinism, real loaders, COCO instances matching the painted pixels,
and captions that say what the annotations hold."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from PIL import Image

from captioner.commands import prepare_synthetic
from data_prep.images import load_image
from data_prep.karpathy import load_karpathy
from data_prep.synthetic import (
    CATEGORIES,
    CATEGORY_WORDS,
    COLOURS,
    SyntheticDataset,
    generate,
)

SIZE = 256
COUNTS = {"n_train": 10, "n_val": 3, "n_test": 3}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> SyntheticDataset:
    return generate(tmp_path_factory.mktemp("a"), **COUNTS, seed=3, progress=False)


def _fingerprint(data: SyntheticDataset) -> dict[str, str]:
    """Hashes of the JSON files and of every image's decoded pixels."""
    files = [data.karpathy_json, *data.instances.values()]
    digests = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in files}
    for path in sorted(data.image_root.rglob("*.png")):
        pixels = np.asarray(Image.open(path))
        digests[path.name] = hashlib.sha256(pixels.tobytes()).hexdigest()
    return digests


def test_same_seed_same_dataset_other_seed_differs(dataset, tmp_path):
    again = generate(tmp_path / "b", **COUNTS, seed=3, progress=False)
    other = generate(tmp_path / "c", **COUNTS, seed=4, progress=False)
    reference = _fingerprint(dataset)
    assert len(reference) == 4 + sum(COUNTS.values())
    assert _fingerprint(again) == reference
    different = _fingerprint(other)
    assert different.keys() == reference.keys()
    assert all(different[name] != reference[name] for name in reference)


def test_images_of_a_split_do_not_depend_on_other_split_sizes(dataset, tmp_path):
    larger = generate(tmp_path / "d", n_train=12, n_val=3, n_test=3, seed=3, progress=False)
    first = np.asarray(Image.open(dataset.image_root / "train" / "synthetic_train_000001.png"))
    same = np.asarray(Image.open(larger.image_root / "train" / "synthetic_train_000001.png"))
    assert np.array_equal(first, same)


def test_karpathy_file_loads_with_the_real_loader(dataset):
    karpathy = load_karpathy(dataset.karpathy_json, dataset.image_root)
    assert karpathy.name == "synthetic"
    assert [len(karpathy.split(s)) for s in ("train", "val", "test")] == [10, 3, 3]
    for entry in karpathy.split("val"):
        assert len(entry.sentences) == 5 and len(set(entry.raws)) == 5
        assert load_image(entry.path).size == (SIZE, SIZE)
        for raw, tokens in zip(entry.raws, entry.sentences, strict=True):
            assert raw[0].isupper() and raw.endswith(".")
            assert list(tokens) == re.findall(r"[a-z]+", raw.lower())


def _coco(dataset, split):
    from pycocotools.coco import COCO

    return COCO(str(dataset.instances[split]))


def _dilate(mask: np.ndarray) -> np.ndarray:
    grown = mask.copy()
    grown[1:] |= mask[:-1]
    grown[:-1] |= mask[1:]
    grown[:, 1:] |= mask[:, :-1]
    grown[:, :-1] |= mask[:, 1:]
    return grown


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_instances_load_and_masks_match_painted_pixels(dataset, split):
    coco = _coco(dataset, split)
    karpathy = load_karpathy(dataset.karpathy_json, dataset.image_root)
    entries = {entry.image_id: entry for entry in karpathy.split(split)}
    assert sorted(coco.getImgIds()) == sorted(entries)
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(CATEGORIES)
    for image_id, entry in entries.items():
        info = coco.loadImgs(image_id)[0]
        assert entry.path.name == info["file_name"]
        assert (info["width"], info["height"]) == (SIZE, SIZE)
        pixels = np.asarray(load_image(entry.path)).astype(int)
        annotations = coco.loadAnns(coco.getAnnIds(imgIds=image_id))
        assert 1 <= len(annotations) <= 3
        union = np.zeros((SIZE, SIZE), dtype=bool)
        for annotation in annotations:
            mask = coco.annToMask(annotation).astype(bool)
            assert not (mask & union).any(), "objects overlap"
            union |= mask
            ys, xs = np.nonzero(mask)
            x0, y0 = xs.min(), ys.min()
            assert annotation["bbox"] == [x0, y0, xs.max() - x0 + 1, ys.max() - y0 + 1]
            assert annotation["area"] == mask.sum() and annotation["iscrowd"] == 0
            assert xs.max() - x0 + 1 >= 0.15 * SIZE  # at least one 32 px attention cell
            colour = np.array(COLOURS[annotation["colour"]])
            distance = np.abs(pixels - colour).max(axis=-1)
            assert distance[mask].max() <= 12, "object pixels are not the object's colour"
            ring = _dilate(mask) & ~mask
            assert distance[ring].min() > 25, "the mask border is still object-coloured"


def test_circle_masks_are_round(dataset):
    coco = _coco(dataset, "train")
    circles = coco.loadAnns(coco.getAnnIds(catIds=coco.getCatIds(catNms=["circle"])))
    assert circles
    for annotation in circles:
        x, y, w, h = annotation["bbox"]
        assert abs(w - h) <= 1
        assert annotation["area"] / (w * h) == pytest.approx(np.pi / 4, abs=0.03)


def _words_before(tokens: list[str], index: int) -> list[str]:
    """The noun phrase ending at ``index``: words after the previous article."""
    start = max(i for i in range(index + 1) if tokens[i] in ("a", "an", "single")) + 1
    return tokens[start:index]


def test_captions_name_every_object_with_its_colour_shape_and_size(dataset):
    coco = _coco(dataset, "train")
    karpathy = load_karpathy(dataset.karpathy_json, dataset.image_root)
    shape_of = {word: c for c, words in CATEGORY_WORDS.items() for word in words}
    size_words = {"small": {"small", "little", "tiny"}, "large": {"large", "big"}}
    for entry in karpathy.split("train"):
        objects = {
            a["colour"]: (coco.cats[a["category_id"]]["name"], a["size"])
            for a in coco.loadAnns(coco.getAnnIds(imgIds=entry.image_id))
        }
        for tokens in entry.sentences:
            named = {}
            for index, token in enumerate(tokens):
                if token in shape_of:
                    phrase = _words_before(list(tokens), index)
                    named[phrase[-1]] = (shape_of[token], phrase[:-1])
            assert named.keys() == objects.keys(), tokens
            for colour, (shape, size_phrase) in named.items():
                assert shape == objects[colour][0], tokens
                assert set(size_phrase) <= size_words[objects[colour][1]], tokens


def test_spatial_words_agree_with_object_positions(dataset):
    coco = _coco(dataset, "train")
    karpathy = load_karpathy(dataset.karpathy_json, dataset.image_root)
    relation = re.compile(
        r"(\w+) (?:circle|disc|square|block|triangle|star|cross) (?:is )?"
        r"(to the left of|to the right of|above|below|under) an? (?:\w+ )*?"
        r"(red|green|blue|yellow|purple|orange) "
    )
    corner = re.compile(
        r"(\w+) (?:circle|disc|square|block|triangle|star|cross) (?:is )?"
        r"(?:in the|at the) (top|bottom) (left|right)"
    )
    checked = 0
    for entry in karpathy.split("train"):
        centre = {}
        for a in coco.loadAnns(coco.getAnnIds(imgIds=entry.image_id)):
            x, y, w, h = a["bbox"]
            centre[a["colour"]] = (x + w / 2, y + h / 2)
        for raw in entry.raws:
            text = " ".join(re.findall(r"[a-z]+", raw.lower())) + " "
            for first, where, second in relation.findall(text):
                dx = centre[first][0] - centre[second][0]
                dy = centre[first][1] - centre[second][1]
                horizontal = abs(dx) >= abs(dy)
                expected = {
                    "to the left of": horizontal and dx < 0,
                    "to the right of": horizontal and dx > 0,
                    "above": not horizontal and dy < 0,
                    "below": not horizontal and dy > 0,
                    "under": not horizontal and dy > 0,
                }[where]
                assert expected, (raw, centre)
                checked += 1
            for colour, vertical, side in corner.findall(text):
                x, y = centre[colour]
                assert (y < SIZE / 3) if vertical == "top" else (y >= 2 * SIZE / 3), raw
                assert (x < SIZE / 3) if side == "left" else (x >= 2 * SIZE / 3), raw
                checked += 1
    assert checked > 0


def test_category_words_cover_the_categories():
    assert set(CATEGORY_WORDS) == set(CATEGORIES)
    words = [word for names in CATEGORY_WORDS.values() for word in names]
    assert len(words) == len(set(words))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_train": -1, "n_val": 0, "n_test": 0}, "n_train must be an integer of at least 0"),
        ({"n_train": 0, "n_val": 0, "n_test": 0}, "at least 1"),
        # Below the smallest size, negative or not: one message.
        ({"n_train": 1, "n_val": 0, "n_test": 0, "image_size": 32},
         "image_size must be an integer of at least 64, got 32"),
        ({"n_train": 1, "n_val": 0, "n_test": 0, "image_size": -3},
         "image_size must be an integer of at least 64, got -3"),
        ({"n_train": 1.5, "n_val": 0, "n_test": 0}, "n_train"),
        # 100,000 px asked 37 GiB at once, after the earlier dataset's file was removed.
        ({"n_train": 1, "n_val": 0, "n_test": 0, "image_size": 100_000},
         "image_size must be at most 4096, got 100000"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    (tmp_path / "dataset_synthetic.json").write_text("an earlier dataset's")
    with pytest.raises(ValueError, match=message):
        generate(tmp_path, **kwargs, progress=False)
    assert (tmp_path / "dataset_synthetic.json").read_text() == "an earlier dataset's"


def test_prepare_synthetic_command(tmp_path, capsys):
    out = tmp_path / "synthetic"
    argv = ["--out", str(out), "--train", "2", "--val", "1", "--test", "1", "--image-size", "96"]
    assert prepare_synthetic.main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert str(out / "dataset_synthetic.json") in printed
    assert str(out / "instances_test.json") in printed
    data = json.loads((out / "dataset_synthetic.json").read_text())
    assert [image["split"] for image in data["images"]] == ["train", "train", "val", "test"]
    assert SyntheticDataset.from_dir(out) == SyntheticDataset(
        karpathy_json=out / "dataset_synthetic.json",
        image_root=out / "images",
        instances={s: out / f"instances_{s}.json" for s in ("train", "val", "test")},
    )
    assert prepare_synthetic.main(["--out", str(out), "--train", "-3"]) == 2
    assert "n_train" in capsys.readouterr().err
    file = out / "dataset_synthetic.json"
    for bad, message in ((file, f"{file}: exists and is not a folder"),
                         (file / "sub", f"{file / 'sub'}: cannot write to it: {file} is not a "
                                        "folder")):
        assert prepare_synthetic.main([*argv[2:], "--out", str(bad), "--no-progress"]) == 2
        assert capsys.readouterr().err.strip() == f"captioner prepare-synthetic: {message}"


def test_prepare_synthetic_help_says_every_default(capsys):
    with pytest.raises(SystemExit):
        prepare_synthetic.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option, default in (("--train TRAIN", 2000), ("--val VAL", 250), ("--test TEST", 250),
                            ("--seed SEED", 0), ("--image_size IMAGE_SIZE", 256)):
        assert re.search(rf"{option} [^-]*default: {default}\)", text), option


def test_from_dir_names_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset_synthetic.json"):
        SyntheticDataset.from_dir(tmp_path)


def test_rerun_in_the_same_folder_replaces_the_dataset(tmp_path, monkeypatch):
    import data_prep.synthetic as synthetic

    generate(tmp_path, n_train=3, n_val=1, n_test=0, progress=False)
    generate(tmp_path, n_train=1, n_val=1, n_test=0, progress=False)
    assert [p.name for p in (tmp_path / "images" / "train").iterdir()] == [
        "synthetic_train_000001.png"
    ]

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(synthetic, "_render", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        generate(tmp_path, n_train=1, n_val=1, n_test=0, progress=False)
    # An interrupted run does not leave a Karpathy file that claims a complete dataset.
    with pytest.raises(FileNotFoundError, match="dataset_synthetic.json"):
        SyntheticDataset.from_dir(tmp_path)


def test_a_second_run_into_a_folder_being_rendered_is_refused_and_touches_nothing(tmp_path):
    # Each run removes the staging folders it finds there (a killed run's): two at once would
    # have removed each other's.
    import data_prep.synthetic as synthetic
    from data_prep.locks import held_alone
    from data_prep.paths import OutputPathError

    staging = tmp_path / ".partial-synthetic-abcd"
    staging.mkdir()
    with held_alone(tmp_path / synthetic.LOCK_NAME, "busy"):
        with pytest.raises(OutputPathError, match="another run is rendering"):
            synthetic.generate(tmp_path, n_train=1, n_val=0, n_test=0, progress=False)
    assert staging.is_dir()
    assert not (tmp_path / synthetic.KARPATHY_FILENAME).exists()
