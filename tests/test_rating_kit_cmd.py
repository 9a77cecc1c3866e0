"""``captioner rating-kit`` on real checkpoints and the synthetic Karpathy split."""

from __future__ import annotations

import json
import shutil

import pytest

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
    assert "--n 99 but only 4 of the 4 images are readable" in capsys.readouterr().err
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
    assert f"blinding key (keep it from the raters): {key_path} (replaced the earlier key)" \
        in printed
    new_key = json.loads(key_path.read_text())
    assert new_key["kit_id"] != json.loads(key)["kit_id"]
    assert new_key["kit_id"] in (out / "index.html").read_text()
    assert len(list((out / "images").iterdir())) == 2


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
    assert "--n 5 but only 4 of the 7 images are readable" in capsys.readouterr().err


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
