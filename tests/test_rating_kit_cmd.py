"""``captioner rating-kit`` on real checkpoints and the synthetic Karpathy split."""

from __future__ import annotations

import json
import shutil

import pytest
from PIL import Image

from eval.commands import rating_kit as command

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress"]


def test_kit_from_karpathy_split_with_key_outside(tiny_checkpoint, synthetic_data, tmp_path,
                                                  capsys):
    other = tmp_path / "models" / "model-zeta.ckpt"
    other.parent.mkdir()
    shutil.copy(tiny_checkpoint, other)
    out = tmp_path / "kit"
    args = ["--ckpt", str(tiny_checkpoint), "--ckpt", str(other), "--split", "test",
            "--data", str(synthetic_data.karpathy_json), "--images",
            str(synthetic_data.image_root), "--seed", "3", "--out", str(out), *FAST]
    assert command.main([*args, "--n", "3"]) == 0
    key = json.loads((tmp_path / "kit-key.json").read_text())
    assert [m["name"] for m in key["models"]] == [tiny_checkpoint.stem, "model-zeta"]
    assert len(key["images"]) == 3 and len({i["key"] for i in key["images"]}) == 3
    page = (out / "index.html").read_text()
    assert key["kit_id"] in page and "model-zeta" not in page
    assert len(list((out / "images").iterdir())) == 3

    capsys.readouterr()
    assert command.main([*args, "--n", "99", "--overwrite"]) == 2
    assert capsys.readouterr().err == (
        "captioner rating-kit: --n 99 but the test split has only 4 images; pass --n 4 for a "
        "kit of those\n")
    assert json.loads((tmp_path / "kit-key.json").read_text()) == key  # kept as it was


def test_an_existing_key_or_kit_is_never_replaced_silently(tiny_checkpoint, synthetic_data,
                                                          tmp_path, capsys):
    out, key_path = tmp_path / "kit", tmp_path / "kit-key.json"
    args = ["--ckpt", str(tiny_checkpoint), str(synthetic_data.image_root / "test"), "--n", "2",
            "--out", str(out), *FAST]
    assert command.main(args) == 0
    key, page = key_path.read_text(), (out / "index.html").read_text()
    capsys.readouterr()

    # The same --out again: refused before any work, the key (and so the ratings) kept.
    assert command.main([*args, "--seed", "1"]) == 2
    assert capsys.readouterr().err == (
        f"captioner rating-kit: {key_path}: the blinding key of an earlier kit exists; ratings "
        "of that kit cannot be unblinded without it: choose another --out (or --key), or keep "
        "a copy of it and pass --overwrite to replace kit and key\n")
    # A new key beside the earlier kit's folder: the kit is refused, not mixed with a new one.
    other_key = tmp_path / "other-key.json"
    assert command.main([*args, "--seed", "1", "--key", str(other_key)]) == 2
    assert capsys.readouterr().err == (
        f"captioner rating-kit: {out}: holds the rating kit of an earlier run "
        f"({out / 'index.html'}); choose a new or empty folder, or pass --overwrite to replace "
        "it\n")
    assert key_path.read_text() == key and (out / "index.html").read_text() == page
    assert not other_key.exists()

    assert command.main([*args, "--seed", "1", "--overwrite"]) == 0
    printed = capsys.readouterr().out
    assert f": 2 images x 1 model -> {out / 'index.html'}\n" in printed
    assert f"blinding key (keep it from the raters): {key_path} (replaced the earlier key)" \
        in printed
    new_key = json.loads(key_path.read_text())
    assert new_key["kit_id"] != json.loads(key)["kit_id"]
    assert new_key["kit_id"] in (out / "index.html").read_text()
    assert len(list((out / "images").iterdir())) == 2


def test_a_stop_while_the_key_is_written_leaves_kit_and_key_together(
        tiny_checkpoint, synthetic_data, tmp_path, monkeypatch):
    """A stop after the new kit was in place, before its key was written, left a kit that
    could never be unblinded; a key that cannot be written keeps the earlier kit and key."""
    import os
    import signal

    import eval.rating.kit

    out, key_path = tmp_path / "kit", tmp_path / "kit-key.json"
    args = ["--ckpt", str(tiny_checkpoint), str(synthetic_data.image_root / "test"), "--n", "2",
            "--out", str(out), *FAST]
    assert command.main(args) == 0
    earlier = (key_path.read_text(), (out / "index.html").read_text())
    write_key = eval.rating.kit.write_key

    def unwritable(key, path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(eval.rating.kit, "write_key", unwritable)
    assert command.main([*args, "--seed", "1", "--overwrite"]) != 0
    assert (key_path.read_text(), (out / "index.html").read_text()) == earlier

    def stopped_while_writing(key, path):
        os.kill(os.getpid(), signal.SIGINT)
        write_key(key, path)

    monkeypatch.setattr(eval.rating.kit, "write_key", stopped_while_writing)
    with pytest.raises(KeyboardInterrupt):
        command.main([*args, "--seed", "1", "--overwrite"])
    kit_id = json.loads(key_path.read_text())["kit_id"]
    assert kit_id != json.loads(earlier[0])["kit_id"]
    assert kit_id in (out / "index.html").read_text()


def test_a_checkpoint_given_twice_is_refused(tiny_checkpoint, synthetic_data, tmp_path, capsys):
    code = command.main(["--ckpt", str(tiny_checkpoint), "--ckpt", str(tiny_checkpoint),
                         str(synthetic_data.image_root / "test"), "--n", "2",
                         "--out", str(tmp_path / "kit"), *FAST])
    assert code == 2 and not (tmp_path / "kit").exists()
    assert capsys.readouterr().err == (f"captioner rating-kit: checkpoint {tiny_checkpoint} is "
                                       "given twice; give each checkpoint once\n")


def test_unreadable_images_are_reported_and_never_sampled(tiny_checkpoint, synthetic_data,
                                                          tmp_path, capsys):
    photos = tmp_path / "photos"
    shutil.copytree(synthetic_data.image_root / "test", photos)
    for name in ("0_broken.png", "1_empty.jpg", "2_text.webp"):
        (photos / name).write_bytes(b"" if name.endswith(".jpg") else b"not an image")
    args = ["--ckpt", str(tiny_checkpoint), str(photos), "--out", str(tmp_path / "kit"),
            "--n", "4", "--overwrite", *FAST]
    errs = []
    for seed in ("0", "1", "2"):
        code = command.main([*args, "--seed", seed])
        errs.append(capsys.readouterr().err)
        # Exit status 1 when an unreadable image was met (and named), as caption's.
        assert code == (1 if "skipped" in errs[-1] else 0), errs[-1]
        key = json.loads((tmp_path / "kit-key.json").read_text())
        assert sorted(i["key"] for i in key["images"]) == sorted(
            p.name for p in photos.iterdir() if p.suffix == ".png" and p.name[0] != "0")
    assert any("0_broken.png" in err for err in errs)

    assert command.main([*args, "--n", "5"]) == 2
    assert (f"--n 5 but only 4 of the 7 images in {photos} are readable"
            in capsys.readouterr().err)


def test_an_out_of_dot_puts_the_key_beside_the_current_folder(tiny_checkpoint, synthetic_data,
                                                              tmp_path, capsys, monkeypatch):
    kit = tmp_path / "kit"
    kit.mkdir()
    monkeypatch.chdir(kit)
    args = ["--ckpt", str(tiny_checkpoint), str(synthetic_data.image_root / "test"), "--n", "2",
            *FAST]
    assert command.main([*args, "--out", "."]) == 0, capsys.readouterr().err
    assert (tmp_path / "kit-key.json").is_file() and (kit / "index.html").is_file()
    with pytest.raises(SystemExit) as exit_info:
        command.main([*args, "--out", "/"])
    assert exit_info.value.code == 2
    assert "--out /: the kit needs a folder of its own" in capsys.readouterr().err


def _exported_ratings(key: dict, rater: str, score: int) -> dict:
    """A rater's file as the kit page exports it: every caption of the key, scored."""
    return {"format": "captioner-ratings/1", "kit_id": key["kit_id"], "rater_id": rater,
            "exported_at": "2026-01-02T10:00:00.000Z", "ratings": [
                {"image": image["key"], "label": label, "caption_score": score,
                 "attention_score": score, "caption_time": "2026-01-02T09:00:00.000Z",
                 "attention_time": "2026-01-02T09:00:01.000Z"}
                for image in key["images"] for label in image["labels"]]}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("image", ["1"], "image must be a string, the kit's image key, got ['1']"),
    ("label", {"A": 1}, "label must be a string, a caption's letter, got {'A': 1}"),
    ("caption_time", 1767344400, "caption_time must be an ISO 8601 time string, got 1767344400"),
])
def test_rating_summary_names_a_hand_edited_field_of_the_kits_ratings(
    tiny_checkpoint, synthetic_data, tmp_path, capsys, field, value, message
):
    from captioner.cli import main as captioner

    assert command.main(["--ckpt", str(tiny_checkpoint), str(synthetic_data.image_root / "test"),
                         "--n", "2", "--out", str(tmp_path / "kit"), *FAST]) == 0
    key = json.loads((tmp_path / "kit-key.json").read_text())
    edited = _exported_ratings(key, "rater-1", 4)
    edited["ratings"][1][field] = value
    ratings = tmp_path / "ratings_rater-1.json"
    ratings.write_text(json.dumps(edited))
    capsys.readouterr()
    assert captioner(["rating-summary", str(ratings), "--key",
                      str(tmp_path / "kit-key.json")]) == 2
    assert capsys.readouterr().err == f"captioner rating-summary: {ratings}: rating 1: {message}\n"


def test_rating_summary_lists_every_rating_of_a_rater_who_exported_none_as_missing(
    tiny_checkpoint, synthetic_data, tmp_path, capsys
):
    from captioner.cli import main as captioner

    assert command.main(["--ckpt", str(tiny_checkpoint), str(synthetic_data.image_root / "test"),
                         "--n", "2", "--out", str(tmp_path / "kit"), *FAST]) == 0
    key = json.loads((tmp_path / "kit-key.json").read_text())
    done, empty = _exported_ratings(key, "rater-1", 4), _exported_ratings(key, "rater-2", 3)
    empty["ratings"] = []  # exported before scoring anything
    files = []
    for data in (done, empty):
        files.append(tmp_path / f"ratings_{data['rater_id']}.json")
        files[-1].write_text(json.dumps(data))
    assert captioner(["rating-summary", *map(str, files), "--key", str(tmp_path / "kit-key.json"),
                      "--out", str(tmp_path / "table2.json")]) == 0
    printed = capsys.readouterr().out
    assert "raters: 2, images rated: 2 of 2" in printed
    assert "missing: 2 (rater rater-2, image " in printed  # listed, with --out too
    summary = json.loads((tmp_path / "table2.json").read_text())
    assert summary["raters"] == ["rater-1", "rater-2"]
    assert sorted((m["rater"], m["image"], m["label"]) for m in summary["missing"]) == sorted(
        ("rater-2", image["key"], label) for image in key["images"] for label in image["labels"])


def test_images_of_one_name_in_two_subfolders_keep_their_paths(tiny_checkpoint, tmp_path):
    photos = tmp_path / "photos"
    (photos / "sub").mkdir(parents=True)
    Image.new("RGB", (20, 20), (10, 120, 30)).save(photos / "img.png")
    Image.new("RGB", (24, 16), (200, 20, 30)).save(photos / "sub" / "img.png")
    assert command.main(["--ckpt", str(tiny_checkpoint), str(photos), "--out",
                         str(tmp_path / "kit"), "--n", "2", *FAST]) == 0
    key = json.loads((tmp_path / "kit-key.json").read_text())
    assert sorted(image["name"] for image in key["images"]) == ["img.png", "sub/img.png"]


def test_a_key_over_the_dataset_file_or_an_image_is_refused_with_overwrite_too(
        tiny_checkpoint, synthetic_data, tmp_path, capsys):
    data = tmp_path / "data.json"
    shutil.copy(synthetic_data.karpathy_json, data)
    image = next((synthetic_data.image_root / "test").glob("*.png"))
    before = (data.read_bytes(), image.read_bytes())
    args = ["--ckpt", str(tiny_checkpoint), "--data", str(data), "--images",
            str(synthetic_data.image_root), "--split", "test", "--n", "2",
            "--out", str(tmp_path / "kit"), "--overwrite", *FAST]
    for key, what in ((data, "dataset file"), (image, "image")):
        assert command.main([*args, "--key", str(key)]) == 2
        assert (f"{key}: is the {what} this command reads; writing the output there would "
                "replace it") in capsys.readouterr().err
    assert (data.read_bytes(), image.read_bytes()) == before
    assert not (tmp_path / "kit").exists()
    # Nor a file of the user's, or an image of another split, which --overwrite replaced.
    notes = tmp_path / "notes.txt"
    notes.write_text("which model is which: ask Ana")
    train_image = next((synthetic_data.image_root / "train").glob("*.png"))
    kept = train_image.read_bytes()
    for key in (notes, train_image):
        assert command.main([*args, "--key", str(key)]) == 2
        assert capsys.readouterr().err == (
            f"captioner rating-kit: {key}: exists and is not the blinding key of a rating kit, "
            "which --overwrite alone may replace; choose another --key\n")
    assert notes.read_text() == "which model is which: ask Ana"
    assert train_image.read_bytes() == kept and not (tmp_path / "kit").exists()


def test_a_kit_of_empty_captions_only_is_refused_naming_why(tiny_checkpoint, synthetic_data,
                                                            tmp_path, capsys, monkeypatch):
    """An under-trained checkpoint may write nothing but empty captions: the kit would have
    nothing to rate, and the line says so (rating-kit has no --vmax to suggest)."""
    import dataclasses

    from captioner.inference.pipeline import Captioner

    original = Captioner.caption

    def empty_captions(self, *args, **kwargs):
        return [dataclasses.replace(c, text="", tokens=[], attention=c.attention[:0],
                                    input_attention=c.input_attention[:0])
                for c in original(self, *args, **kwargs)]

    monkeypatch.setattr(Captioner, "caption", empty_captions)
    out = tmp_path / "kit"
    assert command.main(["--ckpt", str(tiny_checkpoint), "--split", "test", "--n", "2",
                         "--data", str(synthetic_data.karpathy_json), "--images",
                         str(synthetic_data.image_root), "--out", str(out), *FAST]) == 1
    assert capsys.readouterr().err == (
        "captioner rating-kit: every caption of the 2 sampled images is empty (an under-trained "
        "checkpoint writes some): the kit would have nothing to rate; train the models further\n")
    assert not out.exists() or not any(out.iterdir())
    assert not (tmp_path / "kit-key.json").exists()


def test_an_out_inside_the_image_root_of_a_karpathy_split_is_refused(
        tiny_checkpoint, synthetic_data, tmp_path, capsys):
    # Its images would be read as photos by the next command given that root.
    images = tmp_path / "images"
    shutil.copytree(synthetic_data.image_root, images)
    kit = images / "kit"
    code = command.main(["--ckpt", str(tiny_checkpoint), "--data",
                         str(synthetic_data.karpathy_json), "--images", str(images),
                         "--split", "test", "--n", "2", "--out", str(kit), *FAST])
    assert code == 2 and not kit.exists()
    assert "the output folder lies inside the input folder" in capsys.readouterr().err
