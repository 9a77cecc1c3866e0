"""Image paths of a Karpathy split file are confined to the image root in every reader
(prepare-features, gallery, rating-kit, evaluate...), as prepare-dataset confines the paths of
a captions file: one shared check in data_prep.karpathy."""

from __future__ import annotations

import pytest
import robust_inputs as bad

ENCODER = ["--arch", "resnet18", "--layer", "layer3", "--image-size", "32", "--batch-size", "8",
           "--num-workers", "0", "--no-progress", "--device", "cpu"]
FAST = ["--beam-size", "1", "--max-length", "4", "--device", "cpu"]

# How a split file can name an image outside --images: record field changes -> the name shown.
ESCAPES = {
    "parent folder in filename": ({"filename": "../secret/x.png"}, "'../secret/x.png'"),
    "absolute filename": (None, "secret/x.png"),  # filled in with the absolute path
    "parent folder in filepath": ({"filepath": "../secret"}, "'../secret'"),
}


def _split_outside(tmp_path, name):
    """A split file whose test image lies outside the image folder, where it exists (a reader
    that does not check would read it); returns (split file, image folder, outside image)."""
    images = tmp_path / "images"
    images.mkdir()
    (tmp_path / "secret").mkdir()
    secret = bad.write_png(tmp_path / "secret" / "x.png", seed=3)
    records = [bad.karpathy_record(f"{i}.png", i, "train") for i in range(2)]
    for record in records:
        bad.write_png(images / record["filename"], seed=record["imgid"])
    change, _ = ESCAPES[name]
    outside = bad.karpathy_record("x.png", 9, "test")
    outside.update({"filename": str(secret)} if change is None else change)
    return bad.write_karpathy(tmp_path / "split.json", [*records, outside]), images, secret


def _command(name, data, images, out, ckpt):
    if name == "prepare-features":
        return ["prepare-features", "--data", data, "--images", images, "--out", out,
                "--weights", "none", *ENCODER]
    return [name, "--ckpt", ckpt, "--data", data, "--images", images, "--split", "test",
            "--out", out, *FAST]


@pytest.mark.parametrize("row", list(ESCAPES))
@pytest.mark.parametrize("command", ["prepare-features", "gallery", "rating-kit"])
def test_a_split_file_naming_an_image_outside_the_image_root_is_refused(
        command, row, tiny_checkpoint, tmp_path, capsys):
    data, images, secret = _split_outside(tmp_path, row)
    out = tmp_path / "out"
    outcome = bad.run_cli(capsys, _command(command, data, images, out, tiny_checkpoint))
    bad.assert_user_error(outcome, command, str(data), "leaves the image folder",
                          "images[2]", ESCAPES[row][1] if ESCAPES[row][0] else str(secret))
    assert not out.exists() or not any(out.iterdir())
