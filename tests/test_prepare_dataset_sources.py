"""``captioner prepare-dataset`` with several captions files, each with its image folder (COCO
2017's train and val captions files and folders -> one Karpathy-format dataset), and options
that are given twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_prepare_dataset import photo_folder, run

from data_prep.karpathy import load_karpathy


def coco_captions(path: Path, images: dict[int, str], captions: dict[int, list[str]]) -> Path:
    """A captions file in the official COCO format (captions_train2017.json's fields)."""
    annotations, next_id = [], 1
    for image_id, texts in captions.items():
        for text in texts:
            annotations.append({"image_id": image_id, "id": next_id, "caption": text})
            next_id += 1
    path.write_text(json.dumps({
        "info": {"description": "COCO 2017 Dataset", "version": "1.0", "year": 2017},
        "licenses": [{"url": "http://creativecommons.org/licenses/by-nc-sa/2.0/", "id": 1,
                      "name": "Attribution-NonCommercial-ShareAlike License"}],
        "images": [{"license": 1, "file_name": name, "coco_url": f"http://x/{name}",
                    "height": 24, "width": 32, "date_captured": "2013-11-14 11:18:45",
                    "flickr_url": f"http://y/{name}", "id": image_id}
                   for image_id, name in images.items()],
        "annotations": annotations,
    }), encoding="utf-8")
    return path


def coco_2017(tmp_path: Path) -> dict:
    """data/coco/{train2017,val2017} with 4 and 2 photos, and annotations/ with their
    captions files (COCO's file names: the 12-digit id)."""
    root = tmp_path / "data" / "coco"
    train_ids, val_ids = [9, 25, 30, 34], [139, 285]
    names = {i: f"{i:012d}.jpg" for i in train_ids + val_ids}
    train = photo_folder(root / "train2017", [names[i] for i in train_ids])
    val = photo_folder(root / "val2017", [names[i] for i in val_ids])
    texts = {i: [f"A photo number {i}.", f"Picture {i} of a scene."] for i in names}
    annotations = tmp_path / "annotations"
    annotations.mkdir()
    return {
        "root": root, "train": train, "val": val, "names": names, "texts": texts,
        "train_captions": coco_captions(annotations / "captions_train2017.json",
                                        {i: names[i] for i in train_ids},
                                        {i: texts[i] for i in train_ids}),
        "val_captions": coco_captions(annotations / "captions_val2017.json",
                                      {i: names[i] for i in val_ids},
                                      {i: texts[i] for i in val_ids}),
    }


def test_coco_train_and_val_captions_with_their_folders_make_one_dataset(tmp_path, capsys):
    coco = coco_2017(tmp_path)
    out = coco["root"] / "dataset_coco2017.json"
    # The Karpathy-style split file names the images under the common root.
    split = tmp_path / "split.json"
    split.write_text(json.dumps({
        "train": ["train2017/000000000009.jpg", "train2017/000000000025.jpg",
                  "train2017/000000000030.jpg"],
        "val": ["train2017/000000000034.jpg", "val2017/000000000139.jpg"],
        "test": ["val2017/000000000285.jpg"],
    }))
    code, stdout, err = run(capsys, "--captions", coco["train_captions"], "--images",
                            coco["train"], "--captions", coco["val_captions"], "--images",
                            coco["val"], "--out", out, "--split", split)
    assert code == 0, err
    assert err == ""
    assert f"image root: {coco['root']}" in stdout
    dataset = load_karpathy(out, coco["root"])
    by_split = {s: {e.image_id: e for e in dataset.split(s)} for s in ("train", "val", "test")}
    assert {s: sorted(entries) for s, entries in by_split.items()} == {
        "train": [9, 25, 30], "val": [34, 139], "test": [285]}
    entries = {i: e for entries in by_split.values() for i, e in entries.items()}
    for image_id, entry in entries.items():
        folder = coco["train"] if image_id < 100 else coco["val"]
        assert entry.path == folder / coco["names"][image_id]
        assert entry.raws == tuple(coco["texts"][image_id])
    records = json.loads(out.read_text())["images"]
    assert {(r["filepath"], r["filename"], r["cocoid"]) for r in records} == {
        ("train2017" if i < 100 else "val2017", name, i) for i, name in coco["names"].items()}
    # The next commands name the common root, which the dataset's paths are relative to.
    assert f"--images {coco['root']} " in stdout
    assert f"--data.image_root {coco['root']} " in stdout


def test_a_coco_id_or_image_given_again_by_a_later_file_is_a_duplicate(tmp_path, capsys):
    coco = coco_2017(tmp_path)
    # The val file lists train image 9 again, under its id.
    again = coco_captions(tmp_path / "again.json", {9: "000000000139.jpg"},
                          {9: ["Another caption."]})
    out = tmp_path / "out.json"
    code, _, err = run(capsys, "--captions", coco["train_captions"], "--images", coco["train"],
                       "--captions", again, "--images", coco["val"], "--out", out,
                       "--split", "2,1,1")
    assert code == 0, err
    assert "skipped 1 (duplicate entry" in err
    assert "again.json images[0]" in err and "COCO id 9" in err
    records = json.loads(out.read_text())["images"]
    assert sorted(r["cocoid"] for r in records) == [9, 25, 30, 34]
    code, _, err = run(capsys, "--captions", coco["train_captions"], "--images", coco["train"],
                       "--captions", again, "--images", coco["val"], "--out", out,
                       "--split", "2,1,1", "--on-error", "fail")
    assert code == 2 and "again.json images[0]" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--captions", "a.json", "--captions", "b.json", "--images", "A"],
     "2 --captions files but 1 --images folder: give each captions file its image folder"),
    (["--captions", "a.json", "--images", "A", "--images", "B"],
     "1 --captions file but 2 --images folders"),
    (["--captions", "a.json", "--images", "A", "--out", "x.json", "--out", "y.json"],
     "--out is given twice (x.json and y.json); give it once"),
    (["--captions", "a.json", "--images", "A", "--out", "x.json", "--split", "1,1,1",
      "--split=2,2,2"], "--split is given twice (1,1,1 and 2,2,2); give it once"),
])
def test_no_repeated_option_is_dropped(tmp_path, capsys, args, message):
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path / "out.json")]
    with pytest.raises(SystemExit) as stop:
        run(capsys, *args)
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith(f"captioner prepare-dataset: error: {message}")
    assert not (tmp_path / "out.json").exists()
