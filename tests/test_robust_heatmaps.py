"""Robustness table of ``captioner heatmaps``: one row per input class and its expected outcome.

Rules checked: an unusable image is reported by name and skipped, the other images get their
figures, exit status 1; good images of unusual formats get figures (exit 0); odd file names
become sanitized folder names; an unusable --out or checkpoint is one line, exit 2, before any
work; nothing hangs on a FIFO; no ``.*.tmp`` file is left.

Covered elsewhere: colour scale, white mask pixels and a broken PNG among good ones in
tests/test_heatmaps_cmd.py; the checkpoint loader's every bad-file class in
tests/test_robust_caption.py (the same open_captioner); figure geometry in tests/test_heatmaps.py.
"""

from __future__ import annotations

import json

import pytest
import robust_inputs as bad

FAST = ["--beam-size", "1", "--max-length", "2", "--size", "48", "--no-progress",
        "--device", "cpu"]


def _heatmaps(capsys, ckpt, out, *inputs, fifos=()):
    return bad.run_cli(capsys, ["heatmaps", *inputs, "--ckpt", ckpt, "--out", out, *FAST],
                       fifos=fifos)


def _figures(out, model: str) -> dict[str, list[str]]:
    """Image folder name -> its files, from OUT/MODEL/."""
    return {folder.name: sorted(p.name for p in folder.iterdir())
            for folder in sorted((out / model).iterdir())}


def _indexed_images(out) -> list[str]:
    return [entry["image"] for entry in json.loads((out / "index.json").read_text())["images"]]


@pytest.mark.parametrize("name", list(bad.EXOTIC_IMAGES))
def test_good_images_of_unusual_formats_get_figures(name, tiny_checkpoint, tmp_path, capsys):
    file_name, write = bad.EXOTIC_IMAGES[name]
    good = bad.write_png(tmp_path / "good.png")
    image = write(tmp_path / file_name)
    out = tmp_path / "out"
    outcome = _heatmaps(capsys, tiny_checkpoint, out, good, image)
    assert outcome.code == 0, outcome.err
    assert _indexed_images(out) == [str(good), str(image)]
    figures = _figures(out, tiny_checkpoint.stem)
    assert sorted(figures) == sorted(["good", image.stem])
    assert "strip.png" in figures[image.stem] and "attention.npz" in figures[image.stem]
    assert not bad.leftover_temporaries(tmp_path)


@pytest.mark.parametrize("name", list(bad.BAD_IMAGES))
def test_an_unusable_image_is_named_and_skipped_and_the_rest_drawn(
    name, tiny_checkpoint, tmp_path, capsys
):
    file_name, write, phrase = bad.BAD_IMAGES[name]
    good = bad.write_png(tmp_path / "good.png")
    image = write(tmp_path / file_name)
    out = tmp_path / "out"
    outcome = _heatmaps(capsys, tiny_checkpoint, out, good, image, fifos=(image,))
    bad.assert_skipped(outcome, "heatmaps", image, phrase)
    assert "1 of 2 images could not be read" in outcome.err
    assert _indexed_images(out) == [str(good)]
    assert list(_figures(out, tiny_checkpoint.stem)) == ["good"]
    assert not bad.leftover_temporaries(tmp_path)


def test_only_unusable_images_exit_1_and_write_nothing(tiny_checkpoint, tmp_path, capsys):
    image = bad.write_text_as_jpg(tmp_path / "notes.jpg")
    out = tmp_path / "out"
    outcome = _heatmaps(capsys, tiny_checkpoint, out, image)
    assert outcome.code == 1 and "no image could be captioned" in outcome.err
    assert not (out / "index.json").exists()


@pytest.mark.parametrize(("name", "folder"),
                         [("space", "holiday_photo_1"), ("unicode", "caf"),
                          ("newline", "two_lines"), ("tab", "tab_here")])
def test_odd_file_names_become_safe_folder_names(name, folder, tiny_checkpoint, tmp_path,
                                                 capsys):
    image = bad.write_png(tmp_path / bad.ODD_NAMES[name])
    out = tmp_path / "out"
    outcome = _heatmaps(capsys, tiny_checkpoint, out, image)
    assert outcome.code == 0, outcome.err
    assert _indexed_images(out) == [str(image)]
    [made] = _figures(out, tiny_checkpoint.stem)
    assert made.startswith(folder) and all(c.isalnum() or c in "._-" for c in made), made
    assert made.isascii()


@pytest.mark.parametrize(("kind", "phrase"),
                         [("file", "exists and is not a folder"),
                          ("under a file", "somefile.txt is not a folder"),
                          ("device", "exists and is not a folder")],
                         ids=["an existing file", "under a regular file", "a device"])
def test_unusable_out_is_refused_before_any_work(kind, phrase, tiny_checkpoint, tmp_path,
                                                 capsys):
    out = bad.unusable_out(kind, tmp_path, "heatmaps")
    image = bad.write_png(tmp_path / "good.png")
    before = bad.names_under(tmp_path)
    outcome = _heatmaps(capsys, tiny_checkpoint, out, image)
    bad.assert_user_error(outcome, "heatmaps", str(out), phrase)
    assert bad.names_under(tmp_path) == before
    if kind == "device":
        assert bad.is_full_device(out)


def test_empty_folder_is_a_user_error(tiny_checkpoint, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    outcome = _heatmaps(capsys, tiny_checkpoint, tmp_path / "out", tmp_path / "empty")
    bad.assert_user_error(outcome, "heatmaps", "empty", "folder holds no image files")


@pytest.fixture(scope="module")
def bad_checkpoints(tiny_checkpoint, tmp_path_factory):
    return bad.checkpoint_rows(tmp_path_factory.mktemp("bad_checkpoints"), tiny_checkpoint)


@pytest.mark.parametrize("name", ["malicious pickle", "foreign state_dict"])
def test_unusable_second_checkpoint_stops_before_any_figure(
    name, bad_checkpoints, tiny_checkpoint, tmp_path, capsys
):
    ckpt, phrase = bad_checkpoints[name]
    image = bad.write_png(tmp_path / "good.png")
    out = tmp_path / "out"
    outcome = bad.run_cli(capsys, ["heatmaps", image, "--ckpt", tiny_checkpoint, "--ckpt", ckpt,
                                   "--out", out, *FAST])
    bad.assert_user_error(outcome, "heatmaps", str(ckpt), phrase)
    assert "weights_only" not in outcome.err
    assert not (ckpt.parent / "EXECUTED").exists()
    assert not out.exists()



def _photo_folder_as_out(photos, tmp_path, capsys, ckpt):
    """--out the folder that holds the input photo."""
    return photos / "p0.png", photos, ("folder is not empty (p0.png, p1.png) and holds no "
                                       "heatmaps of an earlier run")


def _earlier_figure_as_input(photos, tmp_path, capsys, ckpt):
    """An earlier run's figure given as the input photo of a run into that run's folder."""
    out = tmp_path / "figures"
    assert _heatmaps(capsys, ckpt, out, photos / "p0.png").code == 0
    figure = sorted((out / ckpt.stem / "p0").glob("00_*.png"))[0]
    return figure, out, f"{figure}: an input inside the output folder {out}"


def _photo_inside_earlier_figures(photos, tmp_path, capsys, ckpt):
    """A photo moved into an earlier run's folder, given to a run into that folder."""
    out = tmp_path / "figures"
    assert _heatmaps(capsys, ckpt, out, photos / "p0.png").code == 0
    photo = bad.write_png(out / "mine.png", seed=6)
    return photo, out, ("holds the heatmaps of an earlier run and other files too (mine.png), "
                        "which --overwrite would delete")


@pytest.mark.parametrize("overwrite", [False, True], ids=["", "--overwrite"])
@pytest.mark.parametrize("make", [_photo_folder_as_out, _earlier_figure_as_input,
                                  _photo_inside_earlier_figures],
                         ids=["the photo folder", "an earlier figure as input",
                              "a photo inside an earlier run's folder"])
def test_an_out_holding_the_input_photo_is_refused_and_left_alone(make, overwrite,
                                                                 tiny_checkpoint, tmp_path,
                                                                 capsys):
    photos = tmp_path / "photos"
    photos.mkdir()
    for seed in range(2):
        bad.write_png(photos / f"p{seed}.png", seed=seed)
    image, out, phrase = make(photos, tmp_path, capsys, tiny_checkpoint)
    if make is not _photo_folder_as_out and not overwrite:
        phrase = "holds the heatmaps of an earlier run ("  # without --overwrite: a used folder
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    outcome = bad.run_cli(capsys, ["heatmaps", image, "--ckpt", tiny_checkpoint, "--out", out,
                                   *(["--overwrite"] if overwrite else []), *FAST])
    bad.assert_user_error(outcome, "heatmaps", str(out), phrase)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
