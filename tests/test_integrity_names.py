"""Odd names and numbers refused in one line before any work (or written as they are): file
names that are not UTF-8, image ids past 64 bits, JSON objects giving a key twice, a negative
sampling seed."""

from __future__ import annotations

import os

import pytest
import robust_inputs as bad

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress", "--device", "cpu"]
ENCODER = ["--arch", "resnet18", "--layer", "layer3", "--image-size", "32", "--batch-size", "8",
           "--num-workers", "0", "--no-progress", "--device", "cpu"]
LATIN1 = os.fsdecode(b"caf\xe9.png")  # "café.png" in Latin-1: not UTF-8


@pytest.fixture
def photos(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    bad.write_png(folder / "plain.png")
    bad.write_png(folder / LATIN1, seed=1)
    return folder


@pytest.mark.parametrize(("command", "extra"), [
    ("caption", ["--format", "jsonl", "--out", "captions.jsonl"]),
    ("caption", ["--format", "coco", "--out", "captions.json"]),
    ("heatmaps", ["--out", "figures"]),
    ("gallery", ["--out", "gallery"]),
    ("rating-kit", ["--out", "kit", "--n", "2"]),
], ids=["caption jsonl", "caption coco", "heatmaps", "gallery", "rating-kit"])
def test_a_file_name_that_is_not_utf8_is_refused_before_any_work(
        command, extra, photos, tiny_checkpoint, tmp_path, capsys):
    before = bad.names_under(tmp_path)
    extra = [str(tmp_path / value) if value.startswith(("captions", "figures", "gallery",
                                                        "kit")) else value for value in extra]
    outcome = bad.run_cli(capsys, [command, photos, "--ckpt", tiny_checkpoint, *extra, *FAST])
    bad.assert_user_error(outcome, command, "caf\\xe9.png: the file name is not UTF-8 text")
    assert bad.names_under(tmp_path) == before


def test_a_file_name_that_is_not_utf8_is_written_as_its_bytes_in_text(
        photos, tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "captions.txt"
    outcome = bad.run_cli(capsys, ["caption", photos, "--ckpt", tiny_checkpoint, "--out", out,
                                   *FAST])
    assert outcome.code == 0, outcome.err[-2000:]
    names = [line.split(b"\t")[0] for line in out.read_bytes().splitlines()]
    assert os.fsencode(photos / LATIN1) in names  # as ls and the shell give it


def test_an_image_id_past_64_bits_is_refused_before_encoding(tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    bad.write_png(images / "a.png")
    data = bad.write_karpathy(tmp_path / "split.json",
                              [bad.karpathy_record("a.png", 2**70, "train")])
    out = tmp_path / "f.h5"
    outcome = bad.run_cli(capsys, ["prepare-features", "--data", data, "--images", images,
                                   "--out", out, "--weights", "none", *ENCODER])
    bad.assert_user_error(outcome, "prepare-features", str(data), "images[0] (a.png)",
                          "field 'imgid' is 1180591620717411303424, outside the 64-bit")
    assert not out.exists()


def test_a_results_record_giving_a_key_twice_is_refused(tmp_path, capsys):
    references = bad.write_karpathy(tmp_path / "refs.json",
                                    [bad.karpathy_record("5.png", 5, "test")])
    results = tmp_path / "results.json"
    results.write_text('[{"image_id": 5, "caption": "a dog", "caption": "a cat"}]')
    outcome = bad.run_cli(capsys, ["score", "--results", results, "--references", references,
                                   "--split", "test", "--metrics", "Bleu"])
    bad.assert_user_error(outcome, "score", str(results), "gives the key 'caption' twice")


def test_a_negative_seed_is_refused_before_any_image_is_captioned(photos, tiny_checkpoint,
                                                                 tmp_path, capsys):
    (photos / LATIN1).unlink()
    outcome = bad.run_cli(capsys, ["rating-kit", photos, "--ckpt", tiny_checkpoint, "--out",
                                   tmp_path / "kit", "--seed", "-1", *FAST])
    assert outcome.code == 2 and "Traceback" not in outcome.err
    assert "--seed" in outcome.err and "-1" in outcome.err
    assert not (tmp_path / "kit").exists()
