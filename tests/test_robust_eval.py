"""Robustness tables of ``captioner score``, ``evaluate``, ``rating-kit`` and ``rating-summary``.

Rules checked: a malformed or unusable input file, checkpoint or output path is one line
``captioner <command>: ...`` naming the file and the problem, exit 2, no traceback, before any
work and with nothing written; nothing hangs on a FIFO; a checkpoint that would run code is
refused without running it; good images of unusual formats go into a rating kit.

Covered elsewhere (not repeated): score with results that are not a list, ids that are not
integers, duplicates, empty captions, invalid JSON and every unusable --out
(tests/test_eval_score_command.py, tests/test_score_faults.py); ratings that do not match the
key, field by field, and a ratings file that is not JSON (tests/test_rating_summary.py); the
checkpoint loader's bad-file classes through caption (tests/test_robust_caption.py).
"""

from __future__ import annotations

import json
import shutil

import pytest
import robust_inputs as bad

FAST = ["--beam-size", "1", "--max-length", "3", "--no-progress", "--device", "cpu"]
NOT_FOUND = "an existing {} is reported as 'not found' (the check is is_file(), not exists())"

# ------------------------------------------------------------------------------------- score


@pytest.fixture
def references(tmp_path):
    records = [bad.karpathy_record(f"{i}.png", i, "test") for i in (5, 6)]
    return bad.write_karpathy(tmp_path / "dataset_refs.json", records)


def _results(name):
    def make(folder):
        path = folder / "results.json"
        if name == "zero-byte file":
            return bad.write_zero_byte(path)
        if name == "FIFO":
            return bad.write_fifo(path)
        if name == "folder":
            path.mkdir()
            return path
        if name == "JSON Lines":  # captioner caption --format jsonl
            path.write_text('{"image": "a.png", "caption": "a dog"}\n'
                            '{"image": "b.png", "caption": "a cat"}\n')
            return path
        entries = {
            "missing image_id": [{"caption": "a dog"}, {"image_id": 6, "caption": "a cat"}],
            "caption not a string": [{"image_id": 5, "caption": ["a", "dog"]},
                                     {"image_id": 6, "caption": "a cat"}],
        }[name]
        path.write_text(json.dumps(entries))
        return path
    return make


@pytest.mark.parametrize(
    ("name", "phrase"),
    [
        ("missing image_id", "entry 0 must have 'image_id' and 'caption'"),
        ("caption not a string", "entry 0: caption must be a string"),
        ("zero-byte file", "not valid JSON"),
        ("JSON Lines", "JSON Lines (a JSON value on each line), not one JSON document; a results "
                       "file is one JSON list of"),
        pytest.param("FIFO", "FIFO"),
        pytest.param("folder", "is a folder"),
    ],
)
def test_score_refuses_malformed_results(name, phrase, references, tmp_path, capsys):
    results = _results(name)(tmp_path)
    out = tmp_path / "metrics.json"
    outcome = bad.run_cli(capsys, ["score", "--results", results, "--references", references,
                                   "--split", "test", "--metrics", "Bleu", "--out", out],
                          fifos=(results,))
    bad.assert_user_error(outcome, "score", str(results), phrase)
    assert not out.exists() and not bad.leftover_temporaries(tmp_path)


# ---------------------------------------------------------------------------------- evaluate


@pytest.fixture(scope="module")
def bad_checkpoints(tiny_checkpoint, tmp_path_factory):
    return bad.checkpoint_rows(tmp_path_factory.mktemp("bad_checkpoints"), tiny_checkpoint)


def _evaluate(capsys, ckpt, data, images, out, fifos=()):
    return bad.run_cli(capsys, ["evaluate", "--ckpt", ckpt, "--data", data, "--images", images,
                                "--metrics", "Bleu,REP", "--out", out, *FAST], fifos=fifos)


@pytest.mark.parametrize("name", ["malicious pickle", "foreign state_dict", "empty file",
                                  "folder", "class_path hyperparameters", "NaN weights"])
def test_evaluate_refuses_unusable_checkpoints(name, bad_checkpoints, synthetic_data, tmp_path,
                                               capsys):
    ckpt, phrase = bad_checkpoints[name]
    out = tmp_path / "evaluation"
    outcome = _evaluate(capsys, ckpt, synthetic_data.karpathy_json, synthetic_data.image_root,
                        out)
    bad.assert_user_error(outcome, "evaluate", str(ckpt), phrase)
    assert "weights_only" not in outcome.err
    assert not (ckpt.parent / "EXECUTED").exists()
    assert not out.exists() or not any(out.iterdir())


def _karpathy_rows():
    names = ["Karpathy: invalid JSON", "Karpathy: missing field", "Karpathy: wrong type"]
    rows = [pytest.param(name, id=name) for name in names]
    rows.append(pytest.param("FIFO", id="FIFO"))
    return rows


@pytest.mark.parametrize("name", _karpathy_rows())
def test_evaluate_refuses_a_malformed_karpathy_file(name, tiny_checkpoint, synthetic_data,
                                                    tmp_path, capsys):
    if name == "FIFO":
        data, phrase = bad.write_fifo(tmp_path / "dataset.json"), "FIFO"
    else:
        data, phrase = bad.malformed_karpathy(tmp_path, synthetic_data.karpathy_json)[name]
    out = tmp_path / "evaluation"
    outcome = _evaluate(capsys, tiny_checkpoint, data, synthetic_data.image_root, out,
                        fifos=(data,))
    bad.assert_user_error(outcome, "evaluate", str(data), phrase)
    assert not out.exists() or not any(out.iterdir())


def test_evaluate_names_an_unreadable_image_of_the_split(tiny_checkpoint, synthetic_data,
                                                         tmp_path, capsys):
    """Metrics over fewer images than the split would not be comparable: the run stops and
    names the file (exit 2) instead of skipping it."""
    images = tmp_path / "images"
    shutil.copytree(synthetic_data.image_root, images)
    broken = sorted((images / "test").glob("*.png"))[0]
    bad.write_text_as_jpg(broken)
    out = tmp_path / "evaluation"
    outcome = _evaluate(capsys, tiny_checkpoint, synthetic_data.karpathy_json, images, out)
    bad.assert_user_error(outcome, "evaluate", str(broken), "not an image file")
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(("kind", "phrase"), [("file", "exists and is not a folder"),
                                              ("under a file", "somefile.txt is not a folder")])
def test_evaluate_refuses_an_unusable_out(kind, phrase, tiny_checkpoint, synthetic_data,
                                          tmp_path, capsys):
    out = bad.unusable_out(kind, tmp_path, "evaluation")
    outcome = _evaluate(capsys, tiny_checkpoint, synthetic_data.karpathy_json,
                        synthetic_data.image_root, out)
    bad.assert_user_error(outcome, "evaluate", str(out), phrase)
    assert (tmp_path / "somefile.txt").read_text() == bad.KEEP_ME


# -------------------------------------------------------------------------------- rating-kit


def _photo_folder(folder, n=3):
    folder.mkdir()
    for i in range(n):
        bad.write_png(folder / f"photo{i}.png", seed=i)
    return folder


def _kit(capsys, ckpt, source, out, *extra):
    return bad.run_cli(capsys, ["rating-kit", source, "--ckpt", ckpt, "--out", out, *extra,
                                *FAST])


def test_rating_kit_takes_every_unusual_format(tiny_checkpoint, tmp_path, capsys):
    photos = tmp_path / "photos"
    photos.mkdir()
    for file_name, write in bad.EXOTIC_IMAGES.values():
        write(photos / file_name)
    out = tmp_path / "kit"
    outcome = _kit(capsys, tiny_checkpoint, photos, out, "--n", len(bad.EXOTIC_IMAGES))
    assert outcome.code == 0, outcome.err
    key = json.loads((tmp_path / "kit-key.json").read_text())
    assert sorted(image["name"] for image in key["images"]) == sorted(
        file_name for file_name, _ in bad.EXOTIC_IMAGES.values())
    assert (out / "index.html").is_file() and not bad.leftover_temporaries(tmp_path)


@pytest.mark.parametrize("name", ["text saved as .jpg", "truncated JPEG", "decompression bomb",
                                  "symlink loop", "FIFO"])
def test_rating_kit_samples_readable_images_and_names_the_others(
    name, tiny_checkpoint, tmp_path, capsys
):
    file_name, write, phrase = bad.BAD_IMAGES[name]
    photos = _photo_folder(tmp_path / "photos")
    image = write(photos / file_name)
    out = tmp_path / "kit"
    outcome = _kit(capsys, tiny_checkpoint, photos, out, "--n", "4")
    assert outcome.code == 2 and "Traceback" not in outcome.err
    assert str(image) in outcome.err and phrase in outcome.err
    assert f"--n 4 but only 3 of the 4 images in {photos} are readable" in outcome.err
    assert not out.exists() and not (tmp_path / "kit-key.json").exists()
    # The kit is built from the readable ones; the unreadable one met on the way is named, and
    # the exit status says that something was skipped.
    outcome = _kit(capsys, tiny_checkpoint, photos, out, "--n", "3")
    assert outcome.code == 1 and "Traceback" not in outcome.err
    assert str(image) in outcome.err and "1 of the images drawn could not be read" in outcome.err
    key = json.loads((tmp_path / "kit-key.json").read_text())
    assert sorted(i["name"] for i in key["images"]) == ["photo0.png", "photo1.png", "photo2.png"]


def test_rating_kit_refuses_an_empty_folder_and_a_malicious_checkpoint(
    bad_checkpoints, tiny_checkpoint, tmp_path, capsys
):
    (tmp_path / "empty").mkdir()
    outcome = _kit(capsys, tiny_checkpoint, tmp_path / "empty", tmp_path / "kit", "--n", "1")
    bad.assert_user_error(outcome, "rating-kit", "empty", "folder holds no image files")
    evil, phrase = bad_checkpoints["malicious pickle"]
    photos = _photo_folder(tmp_path / "photos")
    outcome = _kit(capsys, evil, photos, tmp_path / "kit", "--n", "1")
    bad.assert_user_error(outcome, "rating-kit", str(evil), phrase)
    assert not (evil.parent / "EXECUTED").exists() and not (tmp_path / "kit").exists()


OUT_EARLY = ("--out / --key are not checked before captioning: {} raises {} with a traceback "
             "after the work is done")


def _kit_out_file(tmp_path):
    return ["--out", bad.unusable_out("file", tmp_path)], "somefile.txt"


def _kit_out_under_file(tmp_path):
    return ["--out", bad.unusable_out("under a file", tmp_path, "kit")], "somefile.txt"


def _kit_key_under_file(tmp_path):
    key = bad.unusable_out("under a file", tmp_path, "key.json")
    return ["--out", tmp_path / "kit", "--key", key], "somefile.txt"


def _kit_key_device(tmp_path):
    return ["--out", tmp_path / "kit", "--key", bad.unusable_out("device", tmp_path)], "full"


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_kit_out_file, id="--out an existing file"),
        pytest.param(_kit_out_under_file, id="--out under a file"),
        pytest.param(_kit_key_under_file, id="--key under a file"),
        pytest.param(_kit_key_device, id="--key a device"),
    ],
)
def test_rating_kit_refuses_unusable_outputs_before_work(make, tiny_checkpoint, tmp_path,
                                                         capsys):
    photos = _photo_folder(tmp_path / "photos")
    out_args, phrase = make(tmp_path)
    try:
        outcome = bad.run_cli(capsys, ["rating-kit", photos, "--ckpt", tiny_checkpoint,
                                       *out_args, "--n", "2", *FAST])
        bad.assert_user_error(outcome, "rating-kit", phrase)
        assert not (tmp_path / "kit").exists()
    finally:
        if make is _kit_key_device:
            assert bad.is_full_device(tmp_path / "full")


# ---------------------------------------------------------------------------- rating-summary


@pytest.fixture
def kit_key(tmp_path):
    from eval.rating.kit import KEY_FORMAT, write_key

    key = {"format": KEY_FORMAT, "kit_id": "kit123", "seed": 0, "vmax": 1.0,
           "models": [{"name": "softmax", "checkpoint": "s.ckpt", "mapping": "softmax"},
                      {"name": "tvmax", "checkpoint": "t.ckpt", "mapping": "tvmax"}],
           "images": [{"key": "1", "name": "1.jpg", "labels": {"A": "softmax", "B": "tvmax"}}]}
    path = tmp_path / "kit-key.json"
    write_key(key, path)
    return path


def _ratings(path, kit_id="kit123", duplicate=False, rater="r1"):
    from eval.rating.kit import RATINGS_FORMAT

    entries = [{"image": "1", "label": label, "caption_score": 3, "attention_score": 4,
                "caption_time": "2026-01-01", "attention_time": "2026-01-01"}
               for label in ("A", "B")]
    if duplicate:
        entries.append({**entries[0], "caption_score": 5, "caption_time": "2026-02-01"})
    path.write_text(json.dumps({"format": RATINGS_FORMAT, "kit_id": kit_id, "rater_id": rater,
                                "exported_at": "2026-02-01", "ratings": entries}))
    return path


def _summary(capsys, ratings, key, *extra, fifos=()):
    return bad.run_cli(capsys, ["rating-summary", *ratings, "--key", key, *extra],
                       seconds=5, fifos=fifos)


def _ratings_rows():
    def wrong_kit(folder):
        return _ratings(folder / "r1.json", kit_id="other"), "kit 'other' do not match"

    return [
        pytest.param(wrong_kit, id="wrong kit id"),
        *bad.unreadable_file_rows("r1.json", empty="cannot read the ratings file",
                                  folder="is a folder, not a file"),
    ]


@pytest.mark.parametrize("make", _ratings_rows())
def test_rating_summary_refuses_unusable_ratings(make, kit_key, tmp_path, capsys):
    ratings, phrase = make(tmp_path)
    out = tmp_path / "table2.json"
    outcome = _summary(capsys, [ratings], kit_key, "--out", out, fifos=(ratings,))
    bad.assert_user_error(outcome, "rating-summary", str(ratings), phrase)
    assert not out.exists()


def test_rating_summary_counts_duplicates_once_and_lists_them(kit_key, tmp_path, capsys):
    ratings = _ratings(tmp_path / "r1.json", duplicate=True)
    out = tmp_path / "table2.json"
    outcome = _summary(capsys, [ratings], kit_key, "--out", out)
    assert outcome.code == 0, outcome.err
    assert "duplicates: 1" in outcome.out
    summary = json.loads(out.read_text())
    [duplicate] = summary["duplicates"]
    assert (duplicate["rater"], duplicate["image"], duplicate["count"]) == ("r1", "1", 2)
    assert summary["models"]["softmax"]["caption"]["mean"] == 5  # the newer rating counts
    assert summary["models"]["softmax"]["caption"]["n"] == 1


@pytest.mark.parametrize(
    ("kind", "phrase"),
    [
        pytest.param("folder", "is a folder", id="an existing folder"),
        pytest.param("under a file", "not a folder", id="under a regular file"),
        pytest.param("device", "not a regular file", id="a device"),
    ],
)
def test_rating_summary_refuses_an_unusable_out(kind, phrase, kit_key, tmp_path, capsys):
    ratings = _ratings(tmp_path / "r1.json")
    out = bad.unusable_out(kind, tmp_path, "table2.json")
    outcome = _summary(capsys, [ratings], kit_key, "--out", out)
    bad.assert_user_error(outcome, "rating-summary", str(out), phrase)
    assert not bad.leftover_temporaries(tmp_path)
