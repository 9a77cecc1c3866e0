"""``captioner heatmaps`` on a real checkpoint: files, white mask pixels, shared scale."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from captioner.commands import heatmaps as command
from captioner.inference.heatmaps import AttentionRecord

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress"]


def test_heatmaps_for_two_models_share_one_scale(tiny_checkpoint, synthetic_data, tmp_path):
    second = tmp_path / "second.ckpt"
    shutil.copy(tiny_checkpoint, second)
    image = sorted(synthetic_data.image_root.rglob("*test*.png"))[0]
    wide = tmp_path / "wide photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 200, (32, 96, 3), dtype=np.uint8)).save(
        wide)
    out = tmp_path / "out"
    code = command.main([str(image), str(wide), "--ckpt", str(tiny_checkpoint), "--ckpt",
                         str(second), "--out", str(out), "--zero-style", "white", "--size", "96",
                         *FAST])
    assert code == 0
    index = json.loads((out / "index.json").read_text())
    model = tiny_checkpoint.stem
    records = {
        (m, stem): AttentionRecord.load(out / m / stem / "attention.npz")
        for m in (model, "second") for stem in (image.stem, "wide_photo")
    }
    # One colour scale: the largest weight over both images and both models.
    assert index["vmax"] == max(float(r.attention.max()) for r in records.values())
    record = records[model, "wide_photo"]
    assert record.vmax == index["vmax"] and record.source == str(wide)
    names = sorted(p.name for p in (out / model / "wide_photo").iterdir())
    words = [f"{i:02d}_{w}.png" for i, w in enumerate(record.tokens)]
    assert names == sorted([*words, "strip.png", "attention.npz", "attention.json"])

    # Pixels of the first word: white exactly where the nearest grid cell has zero weight.
    figure = np.asarray(Image.open(out / model / "wide_photo" / words[0]).convert("RGB"))
    assert figure.shape == (32, 96, 3)  # the photo's own aspect ratio
    # (No pixel centre of a 32 x 96 image lies on a cell border of a 2^k grid: no ties.)
    cells = Image.fromarray(record.attention[0], mode="F").resize((96, 32),
                                                                  Image.Resampling.NEAREST)
    zero = np.asarray(cells) == 0
    assert (figure[zero] == 255).all()
    assert not (figure[~zero] == 255).all(axis=-1).any()


def test_unreadable_image_is_skipped_with_error_status(tiny_checkpoint, tmp_path, capsys):
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    Image.new("RGB", (20, 20), (10, 120, 30)).save(good)
    bad.write_bytes(b"\x89PNG broken")
    out = tmp_path / "out"
    code = command.main([str(good), str(bad), "--ckpt", str(tiny_checkpoint), "--out", str(out),
                         *FAST])
    assert code == 1
    assert "bad.png" in capsys.readouterr().err
    model = tiny_checkpoint.stem
    assert (out / model / "good" / "strip.png").exists() and not (out / model / "bad").exists()


def test_a_reused_out_is_refused_or_replaced_wholly(tiny_checkpoint, tmp_path, capsys):
    first, second = tmp_path / "first.png", tmp_path / "second.png"
    Image.new("RGB", (20, 20), (10, 120, 30)).save(first)
    Image.new("RGB", (24, 16), (200, 20, 30)).save(second)
    out = tmp_path / "out"
    args = ["--ckpt", str(tiny_checkpoint), "--out", str(out), *FAST]
    assert command.main([str(first), *args]) == 0
    before = sorted(out.rglob("*"))
    assert capsys.readouterr().out.startswith(f"wrote heatmaps of 1 image x 1 model to {out} ")

    # Refused before any work, the earlier figures untouched.
    assert command.main([str(second), *args]) == 2
    err = capsys.readouterr().err
    assert err == (f"captioner heatmaps: {out}: holds the heatmaps of an earlier run "
                   f"({out / 'index.json'}); choose a new or empty folder, or pass --overwrite "
                   "to replace it\n")
    assert sorted(out.rglob("*")) == before

    # --overwrite: only the new run's files remain, all of them indexed.
    assert command.main([str(second), *args, "--overwrite"]) == 0
    model = tiny_checkpoint.stem
    assert sorted(p.name for p in out.iterdir()) == ["index.json", model]
    assert [p.name for p in (out / model).iterdir()] == ["second"]
    index = json.loads((out / "index.json").read_text())
    assert [entry["image"] for entry in index["images"]] == [str(second)]


def test_a_folder_of_other_files_is_never_emptied(tiny_checkpoint, tmp_path, capsys):
    image = tmp_path / "photo.png"
    Image.new("RGB", (20, 20), (10, 120, 30)).save(image)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):
        assert command.main([str(image), "--ckpt", str(tiny_checkpoint), "--out", str(out),
                             *FAST, *extra]) == 2
        err = capsys.readouterr().err
        assert err == (f"captioner heatmaps: {out}: folder is not empty (notes.txt) and holds no "
                       "heatmaps of an earlier run; choose a new or empty folder\n")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_checkpoint_given_twice_is_refused(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    image = tmp_path / "photo.png"
    Image.new("RGB", (20, 20), (10, 120, 30)).save(image)
    monkeypatch.chdir(tiny_checkpoint.parent)
    out = tmp_path / "out"
    code = command.main([str(image), "--ckpt", str(tiny_checkpoint), "--ckpt",
                         f"./{tiny_checkpoint.name}", "--out", str(out), *FAST])
    assert code == 2
    assert capsys.readouterr().err == (
        f"captioner heatmaps: checkpoint {tiny_checkpoint.name} is given twice (also as "
        f"{tiny_checkpoint}); give each checkpoint once\n")
    assert not out.exists()


def test_write_figures_draws_each_image_into_its_given_folder_for_every_model(tmp_path):
    """The figures of a run: one folder per (model, image), named as the caller says (after
    every input path, so a skipped image renames none), indexed in input order."""
    import argparse
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from captioner.inference import heatmap_folder
    from captioner.inference.pipeline import Caption

    paths = [tmp_path / "a.png", tmp_path / "b.png"]
    for shade, path in enumerate(paths):
        Image.new("RGB", (24, 16), (40 * shade, 90, 30)).save(path)
    attention = torch.zeros(2, 2, 2)
    attention[0, 0, 0], attention[1, 1, 1] = 1.0, 0.5
    models = [heatmap_folder._Model(name, Path(f"{name}.ckpt"),
                                    SimpleNamespace(output_attention_name=mapping), None)
              for name, mapping in (("soft", "softmax"), ("tv", "tvmax"))]
    captions = {(model.name, path): Caption(f"a {model.name}", ["a", model.name], attention,
                                            attention, 0.0, str(path))
                for model in models for path in paths}
    args = argparse.Namespace(out=tmp_path / "out", vmax=None, zero_style="white",
                              upsample="nearest", size=48, colormap="Purples")
    index = heatmap_folder._write_figures(args.out, args, models, captions,
                                          [(paths[1], "second")], 1.0, False)

    keys = ("vmax", "vmax_rule", "zero_style", "upsample", "colormap")
    assert {key: index[key] for key in keys} == {
        "vmax": 1.0, "vmax_rule": "maximum weight of the run", "zero_style": "white",
        "upsample": "nearest", "colormap": "Purples"}
    # The weights in purple, over a green image: bluer than it is green where attended.
    figure = Image.open(args.out / "tv" / "second" / "00_a.png")
    assert "the darker the purple the higher" in figure.text["Colour scale"]
    red, green, blue = np.asarray(figure.convert("RGB"))[0, 0].astype(int)
    assert blue > green and red > green
    assert [(e["image"], e["model"], e["checkpoint"], e["mapping"], e["caption"])
            for e in index["images"]] == [(str(paths[1]), "soft", "soft.ckpt", "softmax", "a soft"),
                                          (str(paths[1]), "tv", "tv.ckpt", "tvmax", "a tv")]
    assert index["images"][1]["files"] == [
        "tv/second/00_a.png", "tv/second/01_tv.png", "tv/second/strip.png",
        "tv/second/attention.npz", "tv/second/attention.json"]
    assert sorted(p.name for p in args.out.iterdir()) == ["soft", "tv"]
    assert AttentionRecord.load(args.out / "tv" / "second" / "attention.npz").mapping == "tvmax"


def test_an_image_given_twice_is_refused(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    # Its figures would go into one folder, listed twice in the index and counted twice.
    image = tmp_path / "photos" / "photo.png"
    image.parent.mkdir()
    Image.new("RGB", (20, 20), (10, 120, 30)).save(image)
    monkeypatch.chdir(image.parent)
    out = tmp_path / "out"
    for given, also in ((["photo.png", "photo.png"], ""),
                        ([str(image.parent), "photo.png"], f" (also as {image})")):
        code = command.main([*given, "--ckpt", str(tiny_checkpoint), "--out", str(out), *FAST])
        assert code == 2
        assert capsys.readouterr().err == (
            f"captioner heatmaps: image photo.png is given twice{also}; give each image once\n")
        assert not out.exists()


def _empty_captions_of(monkeypatch, names):
    """Make the captioner's caption of the images ``names`` (file names) empty, as an
    under-trained model's often is."""
    import dataclasses

    from captioner.inference.pipeline import Captioner

    original = Captioner.caption_files

    def caption_files(self, paths, *args, **kwargs):
        for result, caption in original(self, paths, *args, **kwargs):
            if caption is not None and result.path.name in names:
                caption = dataclasses.replace(caption, text="", tokens=[],
                                              attention=caption.attention[:0],
                                              input_attention=caption.input_attention[:0])
            yield result, caption

    monkeypatch.setattr(Captioner, "caption_files", caption_files)


def test_an_empty_caption_gets_its_image_alone_and_no_word_figure(tiny_checkpoint, tmp_path,
                                                                  capsys, monkeypatch):
    first, second = tmp_path / "first.png", tmp_path / "second.png"
    Image.new("RGB", (20, 20), (10, 120, 30)).save(first)
    Image.new("RGB", (24, 16), (200, 20, 30)).save(second)
    _empty_captions_of(monkeypatch, {"second.png"})
    out = tmp_path / "out"
    assert command.main([str(first), str(second), "--ckpt", str(tiny_checkpoint),
                         "--out", str(out), *FAST]) == 0
    empty = out / tiny_checkpoint.stem / "second"
    assert sorted(p.name for p in empty.iterdir()) == ["attention.json", "attention.npz",
                                                      "strip.png"]
    record = AttentionRecord.load(empty / "attention.npz")
    assert record.tokens == [] and record.attention.shape[0] == 0
    index = json.loads((out / "index.json").read_text())
    assert [entry["caption"] for entry in index["images"]][1] == ""


def test_only_empty_captions_are_refused_and_leave_the_folder_for_a_rerun(
        tiny_checkpoint, tmp_path, capsys, monkeypatch):
    image = tmp_path / "photo.png"
    Image.new("RGB", (20, 20), (10, 120, 30)).save(image)
    _empty_captions_of(monkeypatch, {"photo.png"})
    out = tmp_path / "out"
    args = [str(image), "--ckpt", str(tiny_checkpoint), "--out", str(out), *FAST]
    assert command.main(args) == 1
    assert capsys.readouterr().err == (
        "captioner heatmaps: cannot choose a colour scale: every caption is empty, so there is "
        "no attention weight to scale by; give --vmax to draw them anyway\n")
    assert not out.exists() or not any(out.iterdir())
    assert command.main([*args, "--vmax", "0.2"]) == 0
    assert (out / tiny_checkpoint.stem / "photo" / "strip.png").is_file()


def test_a_failure_while_drawing_empties_the_folder_for_a_rerun(tiny_checkpoint, tmp_path,
                                                                capsys, monkeypatch):
    import captioner.inference.heatmaps

    image = tmp_path / "photo.png"
    Image.new("RGB", (20, 20), (10, 120, 30)).save(image)
    out = tmp_path / "out"
    args = [str(image), "--ckpt", str(tiny_checkpoint), "--out", str(out), *FAST]
    original = captioner.inference.heatmaps.render_strip

    def failing_strip(*a, **k):
        original(*a, **k)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(captioner.inference.heatmaps, "render_strip", failing_strip)
    assert command.main(args) == 1
    assert "no space left on device" in capsys.readouterr().err
    assert out.is_dir() and not any(out.iterdir())
    monkeypatch.undo()
    assert command.main(args) == 0


def test_the_figure_options_are_those_the_drawing_takes():
    """The command's choices and limits, spelled where its options are read without numpy and
    PIL, are those of captioner.inference.heatmaps."""
    import typing

    import pytest

    from captioner.inference import heatmap_folder, heatmaps

    assert typing.get_args(heatmap_folder.Upsample) == heatmaps.UPSAMPLE_MODES
    assert typing.get_args(heatmap_folder.ZeroStyle) == heatmaps.ZERO_STYLES
    assert typing.get_args(heatmap_folder.Colormap) == heatmaps.COLORMAPS
    assert heatmap_folder.DEFAULT_SIZE == heatmaps.DEFAULT_MAX_SIDE
    assert heatmap_folder.SIZE_RANGE == (heatmaps.MIN_MAX_SIDE, heatmaps.MAX_MAX_SIDE)
    for size, vmax, message in [(31, None, "size must be between 32 and 4096 pixels, got 31"),
                                (4097, None, "got 4097"), (32, 0.0, "vmax must be a finite"),
                                (32, float("nan"), "got nan")]:
        with pytest.raises(ValueError, match=message):
            heatmap_folder.check_figure_options(size, vmax)
    heatmap_folder.check_figure_options(4096, 0.5)


def test_a_colour_map_outside_the_offered_ones_is_refused_in_one_line(tiny_checkpoint, tmp_path,
                                                                     capsys):
    image = tmp_path / "photo.png"
    Image.new("RGB", (32, 32), (0, 120, 0)).save(image)
    with pytest.raises(SystemExit) as stop:
        command.main([str(image), "--ckpt", str(tiny_checkpoint), "--out",
                      str(tmp_path / "out"), "--colormap", "viridis", *FAST])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert err == ("captioner heatmaps: error: --colormap: invalid value viridis (expected one "
                   "of Greens, Blues, Purples, Reds, Oranges, Greys)\n")
    assert not (tmp_path / "out").exists()
