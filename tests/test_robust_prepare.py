"""Robustness tables of ``captioner prepare-features`` and ``captioner prepare-dataset``.

Rules checked: good images of unusual formats and odd names are used (exit 0); an unusable
image is named (prepare-features: all listed, exit 2, or skipped with --on-error skip;
prepare-dataset: skipped and listed, exit 0 with the rest written); a malformed or unusable
input file or output path is one line ``captioner <command>: ...`` naming the file and the
problem, exit 2, nothing written; nothing hangs on a FIFO; a weights file that would run code is
refused without running it and without suggesting weights_only=False; no ``.*.tmp`` is left.

Covered elsewhere (not repeated): prepare-features with empty, text, truncated, bomb, oversized,
FIFO, missing and folder images, --out a folder or under a file, bad options
(tests/test_feature_extraction.py); prepare-dataset with missing, text, zero-byte and oversized
images, captionless, duplicate and malformed records, CSV without header, --out a folder
(tests/test_prepare_dataset.py); unclosed CSV quotes, duplicate captions, --on-error fail in file
order, captions files that are not UTF-8 (tests/test_dataset_import_records.py); malformed
Karpathy fields one by one (tests/test_data_karpathy.py).
"""

from __future__ import annotations

import json

import h5py
import pytest
import robust_inputs as bad

ENCODER = ["--arch", "resnet18", "--layer", "layer3", "--image-size", "32", "--batch-size", "8",
           "--num-workers", "0", "--no-progress", "--device", "cpu"]
NOT_FOUND = "an existing {} is reported as 'not found' (the check is is_file(), not exists())"

# ----------------------------------------------------------------------------- prepare-features


def _dataset(folder, extra: dict[str, callable] | None = None):
    """Four plain PNGs (3 train, 1 test) plus ``extra`` {file name: writer} in train; returns
    the Karpathy JSON and the image folder."""
    images = folder / "images"
    images.mkdir(parents=True)
    records = []
    for i in range(4):
        bad.write_png(images / f"{i}.png", seed=i)
        records.append(bad.karpathy_record(f"{i}.png", i, "train" if i < 3 else "test"))
    for offset, (name, write) in enumerate((extra or {}).items()):
        write(images / name)
        records.append(bad.karpathy_record(name, 100 + offset, "train"))
    return bad.write_karpathy(folder / "dataset.json", records), images


UNUSUAL = {
    **{f"format: {name}": file_name for name, (file_name, _) in bad.EXOTIC_IMAGES.items()},
    **{f"name: {name}": file_name for name, file_name in bad.ODD_NAMES.items()},
}


@pytest.fixture(scope="module")
def unusual_cache(tmp_path_factory):
    """One prepare-features run over every unusual format and file name."""
    folder = tmp_path_factory.mktemp("unusual")
    writers = {file_name: write for file_name, write in bad.EXOTIC_IMAGES.values()}
    writers.update({file_name: bad.write_png for file_name in bad.ODD_NAMES.values()})
    data, images = _dataset(folder, writers)
    out = folder / "features.h5"
    from captioner.cli import main

    code = main(["prepare-features", "--data", str(data), "--images", str(images),
                 "--out", str(out), "--weights", "none", *ENCODER])
    records = json.loads(data.read_text(encoding="utf-8"))["images"]
    return code, out, {r["filename"]: r["cocoid"] for r in records}, folder


@pytest.mark.parametrize("name", list(UNUSUAL))
def test_features_of_unusual_images_are_cached(name, unusual_cache):
    code, out, ids, folder = unusual_cache
    assert code == 0
    with h5py.File(out, "r") as cache:
        cached = set(cache["image_ids"][:].tolist())
    assert ids[UNUSUAL[name]] in cached
    assert not bad.leftover_temporaries(folder)


def _features(capsys, data, images, out, *extra, fifos=()):
    return bad.run_cli(capsys, ["prepare-features", "--data", data, "--images", images,
                                "--out", out, *ENCODER, *extra], fifos=fifos)


def test_symlink_loop_image_is_named_then_skipped(tmp_path, capsys):
    data, images = _dataset(tmp_path, {"loop.png": bad.write_symlink_loop})
    out = tmp_path / "f.h5"
    outcome = _features(capsys, data, images, out, "--weights", "none")
    assert outcome.code == 2 and "Traceback" not in outcome.err
    assert str(images / "loop.png") in outcome.err and "symbolic links" in outcome.err
    assert not out.exists() and not bad.leftover_temporaries(tmp_path)
    outcome = _features(capsys, data, images, out, "--weights", "none", "--on-error", "skip")
    assert outcome.code == 0, outcome.err
    with h5py.File(out, "r") as cache:
        assert sorted(cache["image_ids"][:].tolist()) == [0, 1, 2, 3]


def _data_rows():
    def karpathy(name):
        def make(folder, source):
            return bad.malformed_karpathy(folder, source)[name]
        return make

    def zero_byte(folder, source):
        return bad.write_zero_byte(folder / "empty.json"), "not valid JSON"

    def fifo(folder, source):
        return bad.write_fifo(folder / "pipe.json"), "FIFO"

    def directory(folder, source):
        (folder / "split.json").mkdir()
        return folder / "split.json", "is a folder"

    return [
        pytest.param(karpathy("Karpathy: invalid JSON"), id="invalid JSON"),
        pytest.param(karpathy("Karpathy: missing field"), id="missing field"),
        pytest.param(karpathy("Karpathy: wrong type"), id="wrong type"),
        pytest.param(zero_byte, id="zero-byte file"),
        pytest.param(fifo, id="FIFO"),
        pytest.param(directory, id="folder"),
    ]


@pytest.mark.parametrize("make", _data_rows())
def test_unusable_karpathy_file_is_one_line(make, tmp_path, capsys):
    source, images = _dataset(tmp_path)
    data, phrase = make(tmp_path, source)
    out = tmp_path / "f.h5"
    outcome = _features(capsys, data, images, out, "--weights", "none", fifos=(data,))
    bad.assert_user_error(outcome, "prepare-features", str(data), phrase)
    assert not out.exists() and not bad.leftover_temporaries(tmp_path)


def test_device_as_out_is_refused_and_left_alone(tmp_path, capsys):
    data, images = _dataset(tmp_path)
    out = bad.write_full_device(tmp_path / "full")
    outcome = _features(capsys, data, images, out, "--weights", "none")
    bad.assert_user_error(outcome, "prepare-features", str(out), "not a regular file")
    assert bad.is_full_device(out)


@pytest.fixture(scope="module")
def bad_weights(tiny_checkpoint, tmp_path_factory):
    return bad.checkpoint_rows(tmp_path_factory.mktemp("bad_weights"), tiny_checkpoint)


def test_malicious_weights_file_is_refused_without_running_it(bad_weights, tmp_path, capsys):
    data, images = _dataset(tmp_path)
    evil, _ = bad_weights["malicious pickle"]
    outcome = _features(capsys, data, images, tmp_path / "f.h5", "--weights", evil)
    assert outcome.code == 2 and "Traceback" not in outcome.err
    assert not (evil.parent / "EXECUTED").exists()
    assert not (tmp_path / "f.h5").exists()


@pytest.mark.parametrize(
    ("name", "phrase"),
    [
        pytest.param("malicious pickle", "evil.ckpt"),
        pytest.param("empty file", "is empty"),
        pytest.param("folder", "is a folder"),
        pytest.param("class_path hyperparameters", "does not hold a state_dict"),
    ],
)
def test_unusable_weights_file_is_one_line_naming_the_problem(
    name, phrase, bad_weights, tmp_path, capsys
):
    data, images = _dataset(tmp_path)
    weights, _ = bad_weights[name]
    outcome = _features(capsys, data, images, tmp_path / "f.h5", "--weights", weights)
    line = bad.assert_user_error(outcome, "prepare-features", str(weights), phrase)
    assert "weights_only" not in outcome.err, line
    assert not (tmp_path / "f.h5").exists()


def test_foreign_state_dict_is_used_as_encoder_weights_of_its_architecture(
    bad_weights, tmp_path, capsys
):
    """A torchvision ResNet-18 state_dict is exactly what --weights FILE takes for resnet18;
    for resnet34 its tensors do not fit and that is said."""
    data, images = _dataset(tmp_path)
    weights, _ = bad_weights["foreign state_dict"]
    outcome = _features(capsys, data, images, tmp_path / "f.h5", "--weights", weights)
    assert outcome.code == 0, outcome.err
    outcome = bad.run_cli(capsys, ["prepare-features", "--data", data, "--images", images,
                                   "--out", tmp_path / "g.h5", *ENCODER, "--arch", "resnet34",
                                   "--weights", weights])
    bad.assert_user_error(outcome, "prepare-features", str(weights), "do not fit")
    assert not (tmp_path / "g.h5").exists()


# ------------------------------------------------------------------------------ prepare-dataset

GOOD = [f"good{i}.png" for i in range(6)]


def _photos(folder):
    photos = folder / "photos"
    photos.mkdir()
    for i, name in enumerate(GOOD):
        bad.write_png(photos / name, seed=i)
    return photos


def _captions(path, names):
    lines = [json.dumps({"image": name, "captions": [f"a photo number {i}"]}, ensure_ascii=False)
             for i, name in enumerate(names)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _dataset_cmd(capsys, captions, photos, out, *extra, fifos=()):
    return bad.run_cli(capsys, ["prepare-dataset", "--captions", captions, "--images", photos,
                                "--out", out, "--no-progress", *extra], fifos=fifos)


def _images_in(out, photos) -> set[str]:
    from data_prep.karpathy import load_karpathy

    dataset = load_karpathy(out, photos)
    return {entry.path.name for split in ("train", "val", "test") for entry in dataset.split(split)}


@pytest.mark.parametrize("name", list(UNUSUAL))
def test_unusual_images_enter_the_dataset(name, tmp_path, capsys):
    photos = _photos(tmp_path)
    file_name = UNUSUAL[name]
    writer = {f: w for f, w in bad.EXOTIC_IMAGES.values()}.get(file_name, bad.write_png)
    writer(photos / file_name)
    captions = _captions(tmp_path / "captions.jsonl", [*GOOD, file_name])
    out = tmp_path / "dataset_x.json"
    outcome = _dataset_cmd(capsys, captions, photos, out, "--split", "5,1,1",
                           "--on-error", "fail")
    assert outcome.code == 0, outcome.err
    assert _images_in(out, photos) == {*GOOD, file_name}
    assert not bad.leftover_temporaries(tmp_path)


@pytest.mark.parametrize("name", ["truncated JPEG", "decompression bomb", "symlink loop", "FIFO"])
def test_an_unusable_image_is_skipped_and_listed(name, tmp_path, capsys):
    file_name, write, _ = bad.BAD_IMAGES[name]
    photos = _photos(tmp_path)
    image = write(photos / file_name)
    captions = _captions(tmp_path / "captions.jsonl", [*GOOD, file_name])
    out = tmp_path / "dataset_x.json"
    outcome = _dataset_cmd(capsys, captions, photos, out, "--split", "4,1,1", fifos=(image,))
    assert outcome.code == 0, outcome.err
    assert "skipped 1 " in outcome.err and file_name in outcome.err
    assert _images_in(out, photos) == set(GOOD)
    outcome = _dataset_cmd(capsys, captions, photos, tmp_path / "dataset_y.json", "--split",
                           "4,1,1", "--on-error", "fail", fifos=(image,))
    bad.assert_user_error(outcome, "prepare-dataset", file_name)
    assert not (tmp_path / "dataset_y.json").exists()
    assert not bad.leftover_temporaries(tmp_path)


@pytest.mark.parametrize(
    "make", bad.unreadable_file_rows("captions.jsonl", empty="captions file is empty",
                                     folder="is a folder"))
def test_unusable_captions_file_is_one_line(make, tmp_path, capsys):
    photos = _photos(tmp_path)
    captions, phrase = make(tmp_path)
    out = tmp_path / "dataset_x.json"
    outcome = _dataset_cmd(capsys, captions, photos, out, fifos=(captions,))
    bad.assert_user_error(outcome, "prepare-dataset", str(captions), phrase)
    assert not out.exists()


@pytest.mark.parametrize(
    ("kind", "phrase"),
    [
        pytest.param("under a file", "not a folder", id="under a regular file"),
        pytest.param("device", "not a regular file", id="a device"),
    ],
)
def test_unusable_out_is_refused(kind, phrase, tmp_path, capsys):
    photos = _photos(tmp_path)
    captions = _captions(tmp_path / "captions.jsonl", GOOD)
    out = bad.unusable_out(kind, tmp_path, "dataset_x.json")
    try:
        outcome = _dataset_cmd(capsys, captions, photos, out, "--split", "4,1,1")
        bad.assert_user_error(outcome, "prepare-dataset", str(out), phrase)
    finally:
        if kind == "device":
            assert bad.is_full_device(out)
    assert not bad.leftover_temporaries(tmp_path)
