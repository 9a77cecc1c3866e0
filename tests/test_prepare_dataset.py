"""``captioner prepare-dataset``: captions files of every format, tokens, splits, bad input."""

from __future__ import annotations

import csv
import gzip
import json
import os
import random
import re
import subprocess
import sys
import unicodedata
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioner import CONFIGS
from captioner.cli import main as cli_main
from captioner.features.next_steps import machine_setup
from data_prep.importers.splits import parse_split, split_sizes
from data_prep.karpathy import load_karpathy, tokenize

NO_PROGRESS = ["--no-progress"]


def save_photo(path: Path, seed: int = 0) -> Path:
    """A small noise or gradient "photo"; the suffix picks JPEG or PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if seed % 2:
        pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
    else:
        ramp = np.linspace(0, 255, 32, dtype=np.uint8)
        pixels = np.stack([np.tile(ramp, (24, 1))] * 3, axis=-1)
    Image.fromarray(pixels).save(path)
    return path


def photo_folder(root: Path, names: list[str]) -> Path:
    for seed, name in enumerate(names):
        save_photo(root / name, seed)
    return root


def write_jsonl(path: Path, records: list[dict | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run(capsys, *args: object) -> tuple[int, str, str]:
    """``captioner prepare-dataset ARGS``, replacing an earlier output (many tests run it again
    into the same file)."""
    code = cli_main(["prepare-dataset", *map(str, args), *NO_PROGRESS, "--overwrite"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def twelve_photos(tmp_path: Path) -> tuple[Path, list[str]]:
    names = [f"{'sub/' if i % 4 == 0 else ''}img{i:02d}.{'png' if i % 3 else 'jpg'}"
             for i in range(12)]
    return photo_folder(tmp_path / "photos", names), names


# --- tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "tokens"),
    [
        ("A man's T-shirt, 2 dogs!", ["a", "mans", "tshirt", "2", "dogs"]),
        ("  Two\tcats\non a MAT.  ", ["two", "cats", "on", "a", "mat"]),
        ("\"Quoted\" (words); semi: colon", ["quoted", "words", "semi", "colon"]),
        ("Café ÉCOLE Straße", ["café", "école", "straße"]),
        ("Cafe\u0301", ["café"]),                      # decomposed accent, composed by NFKC
        ("\ufb01sh", ["fish"]),                        # the ligature "fi"
        ("A dog \u2014 running\u2026 \U0001f415", ["a", "dog", "running"]),
        ("日本の猫", ["日本の猫"]),
        ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),            # vowel signs are marks: kept
        ("!!! ... ?", []),
    ],
)
def test_tokenize_hand_computed(raw, tokens):
    assert tokenize(raw) == tokens


def test_synthetic_captions_tokenize_the_same_with_either_rule():
    """The synthetic captions use only letters, spaces, commas and periods: the shared rule
    tokenizes them as the synthetic data's earlier rule (lower-case letter runs) did, so the
    demo's data are unchanged."""
    from data_prep import synthetic_captions as synthetic

    rng = np.random.default_rng(0)
    scenes = [
        [synthetic.DescribedObject("circle", "red", "small", (40.0, 30.0), 256)],
        [synthetic.DescribedObject("star", "blue", "large", (200.0, 60.0), 256),
         synthetic.DescribedObject("cross", "green", "small", (60.0, 200.0), 256)],
        [synthetic.DescribedObject("square", "purple", "large", (128.0, 128.0), 256),
         synthetic.DescribedObject("triangle", "yellow", "small", (20.0, 230.0), 256),
         synthetic.DescribedObject("circle", "orange", "small", (230.0, 20.0), 256)],
    ]
    raws = [raw for _ in range(30) for objects in scenes
            for raw in synthetic.describe_scene(objects, "stripes", rng)]
    assert len(raws) == 450
    assert all(tokenize(raw) == re.findall(r"[a-z]+", raw.lower()) for raw in raws)


# --- splits ------------------------------------------------------------------------------------


def test_split_sizes_by_largest_remainder():
    # 7 x (1/2, 1/4, 1/4) = 3.5, 1.75, 1.75: floors 3, 1, 1; two left for the .75 remainders.
    assert split_sizes(7, (Fraction(1, 2), Fraction(1, 4), Fraction(1, 4))) == (3, 2, 2)
    # 10 x (0.8, 0.1, 0.1) is exact.
    assert split_sizes(10, parse_split("0.8,0.1,0.1").fractions) == (8, 1, 1)
    # 5 x (1/3, 1/3, 1/3) = 1.67 each: ties go to the earlier splits.
    assert split_sizes(5, (Fraction(1, 3),) * 3) == (2, 2, 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.8,0.1", "expected train,val,test"),
        ("0.8,0.1,0.2", "sum to 1, they sum to 1.1"),
        # Printed with its digits, not rounded to the 1 it is not.
        ("0.8,0.1,0.1000000000000001", "sum to 1, they sum to 1.0000000000000001"),
        # A digit that int() does not read (str.isdigit calls it one).
        ("8,\u00b2,2", "expected train,val,test"),
        ("0.9,-0.1,0.2", "must be >= 0"),
        ("a,b,c", "expected train,val,test"),
        ("missing_split.json", "split file not found"),
    ],
)
def test_bad_split_options_are_refused_before_any_work(tmp_path, capsys, text, message):
    photos, names = twelve_photos(tmp_path)
    captions = write_jsonl(tmp_path / "c.jsonl", [{"image": n, "captions": ["a cat"]}
                                                  for n in names])
    out = tmp_path / "out.json"
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", text)
    assert code == 2
    assert err.startswith("captioner prepare-dataset: ") and message in err
    assert "Traceback" not in err and not out.exists()


def test_fraction_splits_are_seeded_sized_and_independent_of_file_order(tmp_path, capsys):
    photos, names = twelve_photos(tmp_path)
    records = [{"image": n, "captions": [f"photo number {i}"]} for i, n in enumerate(names)]
    shuffled = records[:]
    random.Random(5).shuffle(shuffled)

    def splits_of(captions_records, seed, out_name):
        captions = write_jsonl(tmp_path / f"{out_name}.jsonl", captions_records)
        out = tmp_path / f"{out_name}.json"
        code, stdout, _ = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                              "--split", "0.5,0.25,0.25", "--seed", seed)
        assert code == 0
        assert "train: 6 images, 6 captions" in stdout
        dataset = load_karpathy(out, photos)
        return {s: [e.path.relative_to(photos).as_posix() for e in dataset.split(s)]
                for s in ("train", "val", "test")}

    first = splits_of(records, 0, "a")
    assert [len(first[s]) for s in ("train", "val", "test")] == [6, 3, 3]
    assert sorted(sum(first.values(), [])) == sorted(names)
    assert splits_of(records, 0, "b") == first
    assert splits_of(shuffled, 0, "c") == first
    assert splits_of(records, 1, "d") != first


def test_count_splits_leave_the_rest_out_and_say_so(tmp_path, capsys):
    photos, names = twelve_photos(tmp_path)
    captions = write_jsonl(tmp_path / "c.jsonl", [{"image": n, "captions": ["a cat"]}
                                                  for n in names])
    out = tmp_path / "out.json"
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", "6,3,2")
    assert code == 0
    dataset = load_karpathy(out, photos)
    assert [len(dataset.split(s)) for s in ("train", "val", "test")] == [6, 3, 2]
    assert "left out 1 usable image beyond the --split counts" in err

    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", "10,2,1")
    assert code == 2 and "13 images requested, 12 usable" in err

    # Too few because some were skipped: the message says which and why, as no report follows.
    (photos / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    write_jsonl(captions, [{"image": n, "captions": ["a cat"]} for n in [*names, "broken.jpg"]])
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", "10,2,1")
    assert code == 2 and ("13 images requested, 12 usable; 1 skipped as unreadable image, e.g. "
                          f"{photos / 'broken.jpg'}: not an image file") in err, err


def test_split_file_assigns_listed_images_and_reports_the_others(tmp_path, capsys):
    photos, names = twelve_photos(tmp_path)
    captions = write_jsonl(tmp_path / "c.jsonl", [{"image": n, "captions": ["a cat"]}
                                                  for n in names])
    lists = {"train": names[:8], "val": names[8:10], "test": [names[10], "./not_captioned.jpg"]}
    split_file = tmp_path / "splits.json"
    split_file.write_text(json.dumps(lists))
    out = tmp_path / "out.json"
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", split_file)
    assert code == 0
    dataset = load_karpathy(out, photos)
    got = {s: sorted(e.path.relative_to(photos).as_posix() for e in dataset.split(s))
           for s in ("train", "val", "test")}
    assert got == {"train": sorted(names[:8]), "val": sorted(names[8:10]), "test": [names[10]]}
    assert f"skipped 1 (image not in the split file): {names[11]}" in err
    assert "skipped 1 (split-file name without captions): not_captioned.jpg" in err

    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", split_file, "--on-error", "fail")
    assert code == 2 and "image not in the split file" in err

    split_file.write_text(json.dumps({"train": names[:8], "val": names[7:10], "test": []}))
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", split_file)
    assert code == 2 and f"image {names[7]!r} is listed in 'train' and again in 'val'" in err

    split_file.write_text(json.dumps({"train": names[:8], "dev": names[8:10], "exam": []}))
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", split_file)
    assert (code, err) == (2, f"captioner prepare-dataset: {split_file}: split file must be an "
                              "object with keys among train, val, test, got dev, exam, train\n")


# --- formats -----------------------------------------------------------------------------------


def test_jsonl_gives_a_valid_karpathy_file_with_paths_ids_and_tokens(tmp_path, capsys):
    photos, names = twelve_photos(tmp_path)
    records = [{"image": n, "captions": [f"A Dog's toy #{i}.", "Two cats"], "extra": 1}
               for i, n in enumerate(names)]
    captions = write_jsonl(tmp_path / "captions.jsonl", records)
    out = tmp_path / "out" / "dataset_pets.json"
    old_umask = os.umask(0o027)
    try:
        code, stdout, err = run(capsys, "--captions", captions, "--images", photos,
                                "--out", out)
    finally:
        os.umask(old_umask)
    assert code == 0, err
    assert (out.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in out.parent.iterdir()] == [out.name]   # no temporary file left
    assert f"captioner prepare-features --data {out} --images {photos}" in stdout
    assert f"--data.karpathy_json {out} --data.image_root {photos}" in stdout
    fit = next(line for line in stdout.splitlines() if "captioner fit" in line)
    # The config that fits the machine (tests/test_next_steps.py: the small CPU one without
    # a GPU).
    config = machine_setup().config
    assert f"--config {CONFIGS / config} --run_name pets_tvmax " in fit
    assert (CONFIGS / config).is_file()

    dataset = load_karpathy(out, photos)
    assert dataset.name == "pets" and len(dataset) == 12
    raw = json.loads(out.read_text(encoding="utf-8"))
    sentid = 0
    for imgid, image in enumerate(raw["images"]):
        assert image["imgid"] == imgid and "cocoid" not in image
        assert image["sentids"] == [sentid, sentid + 1]
        assert [s["sentid"] for s in image["sentences"]] == image["sentids"]
        assert all(s["imgid"] == imgid for s in image["sentences"])
        sentid += 2
        name = f"{image['filepath']}/{image['filename']}".lstrip("/")
        number = names.index(name)
        assert image["sentences"][0]["raw"] == f"A Dog's toy #{number}."
        assert image["sentences"][0]["tokens"] == ["a", "dogs", "toy", str(number)]
        assert image["sentences"][1]["tokens"] == ["two", "cats"]
    assert {i["filepath"] for i in raw["images"]} == {"", "sub"}
    entries = [e for s in ("train", "val", "test") for e in dataset.split(s)]
    assert [e.image_id for e in entries] == list(range(12))
    assert all(e.path.is_file() for e in entries)


def test_same_file_name_in_two_folders_is_two_images(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", [f"{d}/{n}.jpg" for d in "ab" for n in "xyz"])
    captions = write_jsonl(tmp_path / "c.jsonl", [
        {"image": f"{d}/{n}.jpg", "captions": [f"{d} {n}"]} for d in "ab" for n in "xyz"])
    out = tmp_path / "out.json"
    code, _, _ = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                     "--split", "4,1,1", "--name", "twins")
    assert code == 0
    dataset = load_karpathy(out, photos)
    assert dataset.name == "twins" and len(dataset) == 6
    by_path = {e.path.relative_to(photos).as_posix(): e.raws for s in ("train", "val", "test")
               for e in dataset.split(s)}
    assert by_path["a/x.jpg"] == ("a x",) and by_path["b/x.jpg"] == ("b x",)


def test_flickr8k_captions_txt_with_quoted_commas(tmp_path, capsys):
    names = [f"{1000268201 + i}_693b08cb0e.jpg" for i in range(6)]
    photos = photo_folder(tmp_path / "Images", names)
    rows = []
    for i, name in enumerate(names):
        rows += [(name, f"A child in a pink dress, climbing stairs number {i} ."),
                 (name, 'A girl going into a "wooden" building , smiling .')]
    with (tmp_path / "captions.txt").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)                       # quotes the fields holding commas
        writer.writerow(["image", "caption"])
        writer.writerows(rows)
    assert '"A child in a pink dress, climbing' in (tmp_path / "captions.txt").read_text()
    out = tmp_path / "dataset_flickr8k.json"
    code, stdout, err = run(capsys, "--captions", tmp_path / "captions.txt", "--images", photos,
                            "--out", out, "--split", "4,1,1")
    assert code == 0, err
    assert "captions read as csv" in stdout
    dataset = load_karpathy(out, photos)
    assert dataset.name == "flickr8k"
    entry = next(e for s in ("train", "val", "test") for e in dataset.split(s)
                 if e.path.name == names[2])
    assert entry.raws == ("A child in a pink dress, climbing stairs number 2 .",
                          'A girl going into a "wooden" building , smiling .')
    assert entry.sentences[0] == ("a", "child", "in", "a", "pink", "dress", "climbing",
                                  "stairs", "number", "2")
    assert entry.sentences[1] == ("a", "girl", "going", "into", "a", "wooden", "building",
                                  "smiling")


def test_tsv_fields_are_literal_and_auto_detected(tmp_path, capsys):
    photos = photo_folder(tmp_path / "p", ["a.jpg", "b.jpg", "c.jpg"])
    text = "image\tcaption\n" + "".join(
        f"{n}.jpg\t\"Hi\" said {n}, twice\n" for n in "abc")
    for name in ("caps.tsv", "caps.txt"):
        (tmp_path / name).write_text(text, encoding="utf-8")
        out = tmp_path / f"{name}.json"
        code, stdout, err = run(capsys, "--captions", tmp_path / name, "--images", photos,
                                "--out", out, "--split", "1,1,1")
        assert code == 0, err
        assert "captions read as tsv" in stdout
        raws = {e.raws for s in ("train", "val", "test")
                for e in load_karpathy(out, photos).split(s)}
        assert raws == {(f'"Hi" said {n}, twice',) for n in "abc"}
    # Quoting cannot hold a tab in TSV, so the message does not advise it.
    (tmp_path / "tab.tsv").write_text(text + 'a.jpg\t"a dog\tsitting"\n', encoding="utf-8")
    code, _, err = run(capsys, "--captions", tmp_path / "tab.tsv", "--images", photos,
                       "--out", tmp_path / "tab.json", "--split", "1,1,1", "--on-error", "fail")
    assert code == 2 and "tab.tsv line 5: 3 fields, expected 2" in err
    assert err.rstrip().endswith("a caption cannot hold a tab in TSV"), err


def test_coco_captions_keep_the_coco_ids(tmp_path, capsys):
    names = {391895: "COCO_val2014_000000391895.jpg", 522418: "COCO_val2014_000000522418.jpg",
             184613: "COCO_val2014_000000184613.jpg"}
    photos = photo_folder(tmp_path / "val2014", list(names.values()))
    coco = {
        "info": {}, "licenses": [],
        "images": [{"id": i, "file_name": n, "width": 32, "height": 24} for i, n in names.items()],
        "annotations": [
            {"id": 1, "image_id": 522418, "caption": "A woman cutting a large white cake."},
            {"id": 2, "image_id": 391895, "caption": "A man riding a motorcycle."},
            {"id": 3, "image_id": 184613, "caption": "A child holding an umbrella."},
            {"id": 4, "image_id": 522418, "caption": "Someone slicing a cake."},
        ],
    }
    captions = tmp_path / "captions_val2014.json"
    captions.write_text(json.dumps(coco))
    out = tmp_path / "dataset_coco_mini.json"
    code, stdout, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                            "--split", "1,1,1")
    assert code == 0, err
    assert "captions read as coco" in stdout
    dataset = load_karpathy(out, photos)
    entries = {e.image_id: e for s in ("train", "val", "test") for e in dataset.split(s)}
    assert set(entries) == set(names)
    assert entries[522418].path == photos / names[522418]
    assert entries[522418].raws == ("A woman cutting a large white cake.",
                                    "Someone slicing a cake.")
    assert entries[391895].sentences == (("a", "man", "riding", "a", "motorcycle"),)


def test_format_option_overrides_detection(tmp_path, capsys):
    photos = photo_folder(tmp_path / "p", ["a.jpg", "b.jpg", "c.jpg"])
    captions = write_jsonl(tmp_path / "caps.data", [{"image": f"{n}.jpg", "captions": [n * 3]}
                                                    for n in "abc"])
    out = tmp_path / "out.json"
    code, stdout, _ = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                          "--split", "1,1,1", "--format", "jsonl")
    assert code == 0 and "captions read as jsonl)" in stdout
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", "1,1,1", "--format", "csv")
    assert code == 2 and "must be the header 'image,caption'" in err


def test_a_karpathy_file_given_as_captions_is_named(tmp_path, capsys):
    photos = photo_folder(tmp_path / "p", ["a.jpg"])
    captions = tmp_path / "dataset_x.json"
    captions.write_text(json.dumps({"images": [], "dataset": "x"}))
    code, _, err = run(capsys, "--captions", captions, "--images", photos,
                       "--out", tmp_path / "out.json")
    assert code == 2 and "looks like a Karpathy split file already" in err


# --- bad input ---------------------------------------------------------------------------------

GOOD = [f"good{i}.jpg" for i in range(6)]


def _jsonl_case(tmp_path: Path, extra: list[dict | str]) -> Path:
    records = [{"image": n, "captions": [f"a photo {n}"]} for n in GOOD]
    return write_jsonl(tmp_path / "captions.jsonl", [*records, *extra])


def _csv_case(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "captions.csv"
    path.write_text(text, encoding="utf-8")
    return path


# name -> (make the captions file and the odd files, skip message, fail message, images kept)
CASES = {
    "missing image": (
        lambda t: _jsonl_case(t, [{"image": "gone.jpg", "captions": ["a cat"]}]),
        "skipped 1 (missing image): gone.jpg", "missing image: ", 6),
    "text saved as .jpg": (
        lambda t: ((t / "photos" / "text.jpg").write_text("not a picture"),
                   _jsonl_case(t, [{"image": "text.jpg", "captions": ["a cat"]}]))[1],
        "skipped 1 (unreadable image): text.jpg", "not an image file", 6),
    "zero-byte file": (
        lambda t: ((t / "photos" / "empty.png").write_bytes(b""),
                   _jsonl_case(t, [{"image": "empty.png", "captions": ["a cat"]}]))[1],
        "skipped 1 (unreadable image): empty.png", "unreadable image: ", 6),
    "over the pixel limit": (
        lambda t: (Image.new("1", (8001, 8001)).save(t / "photos" / "huge.png"),
                   _jsonl_case(t, [{"image": "huge.png", "captions": ["a cat"]}]))[1],
        "skipped 1 (unreadable image): huge.png", "exceeds the limit of 64,000,000 pixels", 6),
    "captionless image": (
        lambda t: (save_photo(t / "photos" / "mute.jpg"),
                   _jsonl_case(t, [{"image": "mute.jpg", "captions": []}]))[1],
        "skipped 1 (image without captions): mute.jpg", "image without captions: mute.jpg", 6),
    "empty caption": (
        lambda t: (save_photo(t / "photos" / "half.jpg"),
                   _jsonl_case(t, [{"image": "half.jpg", "captions": ["!!!", "a dog"]}]))[1],
        "skipped 1 (empty caption): half.jpg caption 1", "has no words: '!!!'", 7),
    "duplicate entry": (
        lambda t: _jsonl_case(t, [{"image": "./good1.jpg", "captions": ["again"]}]),
        "skipped 1 (duplicate entry): good1.jpg",
        "listed again at captions.jsonl line 7 (first at captions.jsonl line 2)\n", 6),
    "path outside the folder": (
        lambda t: _jsonl_case(t, [{"image": "../good1.jpg", "captions": ["a"]}]),
        "skipped 1 (invalid image path): captions.jsonl line 7", "without '..'", 6),
    "malformed JSONL line": (
        lambda t: _jsonl_case(t, ['{"image": "x.jpg", "captions": ["a"]', {"image": 3}]),
        "skipped 2 (malformed record): captions.jsonl line 7, captions.jsonl line 8",
        "captions.jsonl line 7: not valid JSON (Expecting ',' delimiter: column 37)", 6),
    "JSONL record with a misnamed field": (
        lambda t: _jsonl_case(t, [{"file": "good1.jpg", "captions": ["a dog"]}]),
        "skipped 1 (malformed record): captions.jsonl line 7",
        "captions.jsonl line 7: field 'image' is missing (a record holds 'image' and "
        "'captions'; it has 'file', 'captions')", 6),
    "CSV row with an unquoted comma": (
        lambda t: _csv_case(t, "image,caption\n" + "".join(f"{n},a photo\n" for n in GOOD)
                            + "good1.jpg,a dog, running\n"),
        "skipped 1 (malformed record): captions.csv line 8",
        "line 8: 3 fields, expected 2", 6),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_items_are_skipped_by_default_and_fatal_with_on_error_fail(tmp_path, capsys, case):
    make, skip_message, fail_message, kept = CASES[case]
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = make(tmp_path)
    out = tmp_path / "out.json"
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", "4,1,1")
    assert code == 0, err
    assert skip_message in err
    assert "Traceback" not in err
    dataset = load_karpathy(out, photos)
    assert len(dataset) == 6
    images = {e.path.name: e.raws for s in ("train", "val", "test") for e in dataset.split(s)}
    if case == "duplicate entry":
        assert images["good1.jpg"] == ("a photo good1.jpg",)     # the first entry is kept
        assert "(first at captions.jsonl line 2); the later entry is skipped" in err
    if kept == 7:   # the image keeps its other caption; 6 of the 7 usable images are in splits
        code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                           "--split", "5,1,1")
        images = {e.path.name: e.raws for s in ("train", "val", "test")
                  for e in load_karpathy(out, photos).split(s)}
        assert code == 0 and images["half.jpg"] == ("a dog",)

    out.unlink()
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", "4,1,1", "--on-error", "fail")
    assert code == 2
    assert err.startswith("captioner prepare-dataset: ") and err.count("\n") == 1
    assert fail_message in err
    assert not out.exists()


def test_malformed_jsonl_reports_field_and_line(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = _jsonl_case(tmp_path, ['["a list"]', {"image": "good1.jpg", "captions": "one"}])
    code, _, err = run(capsys, "--captions", captions, "--images", photos,
                       "--out", tmp_path / "o.json", "--split", "4,1,1")
    assert code == 0
    assert "captions.jsonl line 7" in err and "captions.jsonl line 8" in err
    code, _, err = run(capsys, "--captions", captions, "--images", photos,
                       "--out", tmp_path / "o.json", "--split", "4,1,1", "--on-error", "fail")
    assert code == 2 and "captions.jsonl line 7: must be a JSON object, got list" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("good0.jpg,a photo\ngood1.jpg,a photo\n",
         "the first line must be the header 'image,caption' (columns 'image' and 'caption'), got "
         "'good0.jpg,a photo'"),
        ("", "captions file is empty"),
        # A COCO captions JSON read as CSV: one line of megabytes, quoted only in part.
        ('{"annotations": [' + '{"image_id": 1, "caption": "x"}, ' * 5000 + "]}\n",
         "got '{\"annotations\": [{\"image_id\": 1"),
    ],
)
def test_csv_without_header_is_refused_in_both_modes(tmp_path, capsys, text, message):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = _csv_case(tmp_path, text)
    for mode in ("skip", "fail"):
        out = tmp_path / "out.json"
        code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                           "--on-error", mode)
        assert code == 2 and message in err and not out.exists()
        assert len(err) < 400, err[:1000]


def test_empty_split_is_refused_and_an_older_output_is_kept(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD[:3])
    captions = write_jsonl(tmp_path / "c.jsonl", [{"image": n, "captions": ["a cat"]}
                                                  for n in GOOD[:3]])
    out = tmp_path / "out.json"
    out.write_text("older result")
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", "0.8,0.1,0.1")     # 3 images: sizes 3, 0, 0
    assert code == 2
    assert "split 'val' would be empty (3 usable images, --split 0.8,0.1,0.1)" in err
    assert out.read_text() == "older result"
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", "2,1,0")
    assert code == 2 and "split 'test' would be empty" in err


def test_a_wrong_images_folder_is_named_in_the_empty_split_error(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD)
    (photos / "home").mkdir()
    captions = _jsonl_case(tmp_path, [])  # paths relative to photos/, not to photos/home/
    code, _, err = run(capsys, "--captions", captions, "--images", photos / "home",
                       "--out", tmp_path / "o.json")
    assert code == 2 and len(err.splitlines()) == 1
    assert f"(0 usable images, --split 0.8,0.1,0.1; {len(GOOD)} skipped as missing image, " \
           f"e.g. {photos / 'home' / GOOD[0]}: file not found" in err


def test_images_without_captions_in_the_folder_are_counted(tmp_path, capsys):
    extra = [f"extra/e{i:02d}.jpg" for i in range(12)]
    photos = photo_folder(tmp_path / "photos", GOOD + extra)
    (photos / "notes.txt").write_text("not an image")
    captions = _jsonl_case(tmp_path, [])
    code, _, err = run(capsys, "--captions", captions, "--images", photos,
                       "--out", tmp_path / "o.json", "--split", "4,1,1", "--on-error", "fail")
    assert code == 0
    listed = ", ".join(extra[:10])
    assert f"note: 12 images in {photos} have no captions and were not used: {listed} and " \
           "2 more" in err


def test_input_and_output_paths_are_checked(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = _jsonl_case(tmp_path, [])
    save_photo(photos / "uncaptioned.png", 99)
    split_file = tmp_path / "split.json"
    split_file.write_text(json.dumps({"train": GOOD[:4], "val": GOOD[4:5], "test": GOOD[5:]}))
    (tmp_path / "link.json").symlink_to(captions)
    out = ["--out", tmp_path / "o.json"]
    cases = [
        (["--captions", tmp_path / "nope.jsonl", "--images", photos, *out],
         f"captions file not found: {tmp_path / 'nope.jsonl'}"),
        (["--captions", captions, "--images", tmp_path / "nodir", *out],
         "nodir: image folder not found"),
        (["--captions", captions, "--images", captions, *out],
         "captions.jsonl: is a file, not the folder of the images"),
        (["--captions", captions, "--images", photos, "--out", captions],
         "captions.jsonl: is the captions file this command reads; writing the output there "
         "would replace it"),
        (["--captions", captions, "--images", photos, "--out", tmp_path / "link.json"],
         "link.json: is the captions file this command reads"),
        (["--captions", captions, "--images", photos, "--out", photos / "good3.jpg"],
         "good3.jpg: is the image this command reads"),
        (["--captions", captions, "--images", photos, "--out", photos / "uncaptioned.png"],
         "uncaptioned.png: is an image file in the --images folder; writing the output there "
         "would replace it"),
        (["--captions", captions, "--images", photos, "--out", split_file, "--split",
          split_file], "split.json: is the split file this command reads"),
        (["--captions", captions, "--images", photos, "--out", photos], "is a folder"),
    ]
    inputs = [captions, split_file, *sorted(photos.iterdir())]
    before = [path.read_bytes() for path in inputs]
    for args, message in cases:
        split = [] if "--split" in args else ["--split", "4,1,1"]
        code, _, err = run(capsys, *args, *split)
        assert code == 2 and message in err and "Traceback" not in err, err
    assert [path.read_bytes() for path in inputs] == before


def test_a_caption_holding_half_a_surrogate_pair_is_a_malformed_record(tmp_path, capsys):
    # Valid JSON (an emoji cut in two by a tool), but no text: writing it as UTF-8 failed
    # with a traceback after every image had been decoded.
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = _jsonl_case(tmp_path, ['{"image": "good1.jpg", "captions": ["a cut \\ud83d"]}'])
    code, _, err = run(capsys, "--captions", captions, "--images", photos,
                       "--out", tmp_path / "o.json", "--split", "4,1,1")
    assert code == 0 and "Traceback" not in err
    assert ("captions.jsonl line 7: not valid JSON (the string 'a cut \\ud83d' holds half of a "
            "UTF-16 surrogate pair, not text: column ") in err


@pytest.mark.subprocess
def test_an_output_name_of_bytes_that_are_not_utf8_still_names_the_dataset(tmp_path):
    # The name reaches Python as surrogate escapes: the 'dataset' field, written as UTF-8,
    # failed with a traceback, and so did printing the path in a UTF-8 locale.
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = _jsonl_case(tmp_path, [])
    out = tmp_path / os.fsdecode(b"dataset_caf\xe9.json")
    result = subprocess.run(
        [Path(sys.executable).with_name("captioner"), "prepare-dataset", "--captions", captions,
         "--images", photos, "--out", out, "--split", "4,1,1", "--no-progress"],
        capture_output=True, timeout=120, check=False,
        env={**os.environ, "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"},
    )
    assert result.returncode == 0, result.stderr
    assert os.fsencode(out) in result.stdout  # the name as its bytes, as ls shows it
    assert json.loads(out.read_bytes())["dataset"] == "caf\ufffd"


@pytest.mark.parametrize(
    ("name", "data", "kind"),
    # mtime=0: the header holds no clock time, so that every pytest-xdist worker collects the
    # same test (the data is part of its id).
    [("c.jsonl.gz", gzip.compress(b'{"image": "a.jpg", "captions": ["a"]}\n', mtime=0),
      "gzip-compressed"),
     ("c.zip", b"PK\x03\x04\x14\x00\x00\x00\x08\x00\xff\xfe", "zip")],
)
def test_a_compressed_captions_file_is_named_as_such(tmp_path, capsys, name, data, kind):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = tmp_path / name
    captions.write_bytes(data)
    code, _, err = run(capsys, "--captions", captions, "--images", photos,
                       "--out", tmp_path / "o.json")
    assert code == 2
    assert err == (f"captioner prepare-dataset: {captions}: is a {kind} file, not text; "
                   "decompress it and give the captions file\n")


def test_not_utf8_captions_are_named(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = tmp_path / "c.csv"
    captions.write_bytes("image,caption\ngood0.jpg,caf\xe9\n".encode("latin-1"))
    code, _, err = run(capsys, "--captions", captions, "--images", photos,
                       "--out", tmp_path / "o.json")
    assert code == 2 and "c.csv line 2 (byte offset 27): not UTF-8 text: byte 0xe9" in err
    assert f"iconv -f cp1252 -t utf-8 {captions} > {captions.with_name('c.utf8.csv')}" in err


def test_utf16_captions_with_a_byte_order_mark_are_read(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = tmp_path / "c.csv"  # as Windows programs save "Unicode text"
    captions.write_text("image,caption\n" + "".join(f"{n},un café {n}\n" for n in GOOD),
                        encoding="utf-16")
    assert captions.read_bytes()[:2] == b"\xff\xfe"
    out = tmp_path / "o.json"
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                       "--split", "4,1,1")
    assert code == 0, err
    raws = {i["filename"]: i["sentences"][0]["raw"] for i in json.loads(out.read_text())["images"]}
    assert raws == {n: f"un café {n}" for n in GOOD}


def test_a_json_array_of_records_is_read_and_its_bad_records_named_by_index(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = tmp_path / "records.json"
    records = [{"image": n, "captions": [f"a photo {n}"]} for n in GOOD]
    captions.write_text(json.dumps([*records, {"file": "x.jpg", "captions": ["x"]}], indent=1))
    out = tmp_path / "o.json"
    code, stdout, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                            "--split", "4,1,1")
    assert code == 0, err
    assert "captions read as json)" in stdout
    assert f"{captions}: [6]: field 'image' is missing" in err
    assert sorted(i["filename"] for i in json.loads(out.read_text())["images"]) == GOOD


def test_jsonl_named_json_with_a_malformed_first_line_is_read_as_jsonl(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = write_jsonl(tmp_path / "captions.json", [
        '{"image": "bad.jpg", "captions": ["cut off"', *(
            {"image": n, "captions": [f"a photo {n}"]} for n in GOOD)])
    out = tmp_path / "o.json"
    code, stdout, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                            "--split", "4,1,1")
    assert code == 0, err
    assert "captions read as jsonl)" in stdout
    assert f"{captions} line 1: not valid JSON (Expecting ',' delimiter: column" in err
    assert len(json.loads(out.read_text())["images"]) == len(GOOD)


@pytest.mark.parametrize(("fmt", "text", "reason"), [
    ("json", "[" * 100_000 + "]" * 100_000, "arrays or objects nested too deeply"),
    ("coco", '{"images": [{"id": ' + "1" * 5000 + "}]}", "an integer too long"),
    ("jsonl", '{"image": "a.jpg", "captions": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
     "arrays or objects nested too deeply"),
])
def test_json_past_the_parsers_limits_is_named_as_not_valid(fmt, text, reason, tmp_path,
                                                           capsys):
    # json raises RecursionError and a plain ValueError here, not its JSONDecodeError.
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = tmp_path / "captions.txt"
    captions.write_text(text)
    code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out",
                       tmp_path / "o.json", "--format", fmt, "--on-error", "fail")
    assert code == 2 and "Traceback" not in err
    assert f"{captions}" in err and f"not valid JSON ({reason}" in err, err


def test_a_name_in_another_unicode_normalization_is_pointed_out(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD)
    decomposed = unicodedata.normalize("NFD", "café.jpg")  # as a copy from macOS names it
    save_photo(photos / decomposed)
    captions = _jsonl_case(tmp_path, [{"image": "café.jpg", "captions": ["a cafe"]}])
    code, _, err = run(capsys, "--captions", captions, "--images", photos,
                       "--out", tmp_path / "o.json", "--split", "4,1,1")
    assert code == 0
    assert (f"{photos / 'café.jpg'}: file not found; the folder holds {decomposed!r}, the same "
            "name in another Unicode normalization") in err


@pytest.mark.subprocess
def test_entry_point_runs_as_a_subprocess(tmp_path):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = _jsonl_case(tmp_path, [])
    out = tmp_path / "dataset_sub.json"
    result = subprocess.run(
        [Path(sys.executable).with_name("captioner"), "prepare-dataset", "--captions", captions,
         "--images", photos, "--out", out, "--split", "4,1,1"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "checking images" in result.stderr and "checking images" not in result.stdout
    assert load_karpathy(out, photos).name == "sub"


def test_a_captions_file_of_another_format_asks_whether_format_is_right(tmp_path, capsys):
    photos = photo_folder(tmp_path / "photos", GOOD)
    captions = _csv_case(tmp_path, "image,caption\n" + "".join(f"{n},a photo\n" for n in GOOD))
    code, _, err = run(capsys, "--captions", captions, "--images", photos,
                       "--out", tmp_path / "o.json", "--format", "jsonl")
    assert code == 2
    assert f"{captions}: holds no captions as jsonl ({len(GOOD) + 1} lines could not be read, " \
           f"the first: {captions} line 1: not valid JSON" in err and "is --format right?" in err


def test_an_image_added_or_removed_moves_few_others_to_another_split(tmp_path, capsys):
    # A photo fixed and the file rebuilt: a shuffle of the whole list dealt 18 of 59 images
    # anew, moving test images into training.
    names = [f"img{i:02d}.jpg" for i in range(60)]
    photos = photo_folder(tmp_path / "photos", names)

    def splits(kept, out_name):
        captions = write_jsonl(tmp_path / f"{out_name}.jsonl",
                               [{"image": n, "captions": ["a cat"]} for n in kept])
        out = tmp_path / f"{out_name}.json"
        code, _, err = run(capsys, "--captions", captions, "--images", photos, "--out", out,
                           "--split", "0.8,0.1,0.1")
        assert code == 0, err
        return {e.path.name: s for s in ("train", "val", "test")
                for e in load_karpathy(out, photos).split(s)}

    every = splits(names, "all")
    for left_out in (names[7], names[33]):
        fewer = splits([n for n in names if n != left_out], "fewer")
        moved = [n for n in fewer if fewer[n] != every[n]]
        assert len(moved) <= 2, moved
