"""``captioner caption``: inputs, output formats, COCO ids and unreadable files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioner.commands import caption as command
from captioner.inference.image_files import coco_image_ids, collect_images
from captioner.model.decoding_options import DecodingOptions

FAST = ["--beam-size", "1", "--max-length", "5", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def photo_dir(synthetic_data, tmp_path_factory):
    """Ordinary photos of every kind next to two synthetic test images, plus a broken file."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    tests = sorted((synthetic_data.image_root).rglob("*test*.png"))[:2]
    for number, path in zip((101, 102), tests, strict=True):
        shutil.copy(path, folder / f"{number}.png")
    Image.fromarray(rng.integers(0, 255, (40, 300), dtype=np.uint8), "L").save(folder / "103.jpg")
    Image.fromarray(rng.integers(0, 255, (50, 60, 4), dtype=np.uint8), "RGBA").save(
        folder / "104.png")
    Image.fromarray(rng.integers(0, 255, (3, 5, 3), dtype=np.uint8)).save(folder / "105.png")
    Image.fromarray(rng.integers(0, 255, (1500, 2000, 3), dtype=np.uint8)).save(
        folder / "106.jpg", quality=70)
    (folder / "107.jpg").write_bytes(b"this is not a JPEG")
    (folder / "notes.txt").write_text("not an image, not collected from a folder")
    return folder


def test_collect_images_expands_folders_sorted_by_suffix(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("b.png", "a.JPG", "sub/c.jpeg", "skip.txt"):
        (tmp_path / name).write_bytes(b"")
    explicit = tmp_path / "skip.txt"
    assert collect_images([tmp_path, explicit]) == [
        tmp_path / "a.JPG", tmp_path / "b.png", tmp_path / "sub" / "c.jpeg", explicit]
    with pytest.raises(FileNotFoundError, match="nowhere.png"):
        collect_images([tmp_path / "nowhere.png"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: folder holds no image files"):
        collect_images([tmp_path / "empty"])
    # An image given twice, by name or by a folder and its name, would be captioned twice
    # (twice under one id in --format coco, twice in one gallery or rating kit).
    with pytest.raises(ValueError, match=r"^image .*b.png is given twice; give each image once"):
        collect_images([tmp_path / "b.png", tmp_path / "b.png"])
    with pytest.raises(ValueError, match=r"sub/../b.png is given twice \(also as .*/b.png\)"):
        collect_images([tmp_path / "b.png", tmp_path / "sub" / ".." / "b.png"])
    with pytest.raises(ValueError, match=r"b.png is given twice; give each image once"):
        collect_images([tmp_path, tmp_path / "b.png"])


def test_caption_refuses_an_image_given_twice_before_loading_a_model(tmp_path, capsys):
    image = tmp_path / "a.png"
    Image.new("RGB", (8, 8)).save(image)
    code = command.main([str(image), str(image), "--ckpt", str(tmp_path / "none.ckpt"), *FAST])
    assert code == 2
    assert capsys.readouterr().err == (
        f"captioner caption: image {image} is given twice; give each image once\n")


def test_coco_ids_from_names_or_positions(tmp_path):
    named = [tmp_path / "391895.jpg", tmp_path / "COCO_val2014_000000000042.jpg"]
    assert coco_image_ids(named) == ([391895, 42], True)
    assert coco_image_ids([*named, tmp_path / "cat.jpg"]) == ([1, 2, 3], False)
    assert coco_image_ids([tmp_path / "a" / "7.jpg", tmp_path / "b" / "7.jpg"]) == ([1, 2], False)


def test_text_output_skips_unreadable_files_and_keeps_the_rest(
    tiny_checkpoint, photo_dir, tmp_path, capsys
):
    out = tmp_path / "captions.txt"
    code = command.main([str(photo_dir), "--ckpt", str(tiny_checkpoint), "--out", str(out),
                         "--batch-size", "3", *FAST])
    assert code == 1
    err = capsys.readouterr().err
    assert "107.jpg" in err and "1 of 7 images could not be read" in err
    lines = out.read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == \
        [str(photo_dir / f"{n}.{'jpg' if n in (103, 106) else 'png'}") for n in range(101, 107)]
    assert all(line.split("\t")[1] for line in lines)


def test_the_progress_bar_says_what_it_counts(tiny_checkpoint, photo_dir, tmp_path, capsys):
    fast = [option for option in FAST if option != "--no-progress"]
    assert command.main([str(photo_dir), "--ckpt", str(tiny_checkpoint), "--out",
                         str(tmp_path / "captions.txt"), *fast]) == 1  # 107.jpg is unreadable
    assert re.search(r"captioning: 100%.* 7/7 ", capsys.readouterr().err)


def test_jsonl_carries_tokens_and_attention_maps(tiny_checkpoint, photo_dir, capsys):
    from captioner.inference.pipeline import Captioner

    images = [photo_dir / "101.png", photo_dir / "104.png"]
    assert command.main([*map(str, images), "--ckpt", str(tiny_checkpoint), "--format",
                         "jsonl", *FAST]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    captioner = Captioner.load(tiny_checkpoint)
    expected = captioner.caption(images, DecodingOptions(beam_size=1, max_length=5))
    assert [r["image"] for r in records] == list(map(str, images))
    for record, caption in zip(records, expected, strict=True):
        assert record["caption"] == caption.text == " ".join(record["tokens"])
        assert record["mapping"] == captioner.output_attention_name
        attention = np.array(record["attention"])
        assert attention.shape == (len(record["tokens"]), *captioner.grid)
        assert record["grid"] == list(captioner.grid)
        np.testing.assert_allclose(attention, caption.attention.numpy(), atol=1e-6)


def test_coco_results_use_numeric_file_names(tiny_checkpoint, photo_dir, tmp_path, capsys):
    out = tmp_path / "results" / "coco.json"
    code = command.main([str(photo_dir), "--ckpt", str(tiny_checkpoint), "--format", "coco",
                         "--out", str(out), *FAST])
    assert code == 1 and "107.jpg" in capsys.readouterr().err
    results = json.loads(out.read_text())
    assert [r["image_id"] for r in results] == [101, 102, 103, 104, 105, 106]
    assert all(r["caption"] for r in results)
    # Each record names its file, which `score` checks against the references' images.
    assert [Path(r["file_name"]).stem for r in results] == [str(i) for i in range(101, 107)]


def test_positional_coco_ids_name_their_images(tiny_checkpoint, photo_dir, tmp_path, capsys):
    # cat.png has no numeric id, so ids are input positions: the unreadable first file keeps
    # id 1, and each record names its file (a text output would have no line for 107.jpg).
    cat = tmp_path / "cat.png"
    shutil.copy(photo_dir / "101.png", cat)
    out = tmp_path / "coco.json"
    code = command.main([str(photo_dir / "107.jpg"), str(cat), str(photo_dir / "104.png"),
                         "--ckpt", str(tiny_checkpoint), "--format", "coco", "--out", str(out),
                         *FAST])
    assert code == 1
    assert 'each record names its image in "file_name"' in capsys.readouterr().err
    results = json.loads(out.read_text())
    assert [(r["image_id"], r["file_name"]) for r in results] == [
        (2, str(cat)), (3, str(photo_dir / "104.png"))]


def test_bad_arguments_are_clear_errors(tiny_checkpoint, tmp_path, capsys):
    assert command.main([str(tmp_path / "missing.png"), "--ckpt", str(tiny_checkpoint)]) == 2
    assert "missing.png: no such file" in capsys.readouterr().err
    image = tmp_path / "1.png"
    Image.new("RGB", (8, 8)).save(image)
    assert command.main([str(image), "--ckpt", str(tmp_path / "none.ckpt")]) == 2
    assert "none.ckpt" in capsys.readouterr().err
    assert command.main([str(image), "--ckpt", str(tiny_checkpoint), "--beam-size", "0"]) == 2


def test_devices_are_resolved_or_refused_by_name():
    import torch

    from captioner.inference.pipeline import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == expected
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    for other in ("mps", "meta", "xpu:0"):  # valid torch devices that captioner is not for
        with pytest.raises(ValueError, match=rf"device '{other}': captioner runs on the CPU "
                                             r"or on CUDA devices \(cpu, cuda, cuda:N\)"):
            resolve_device(other)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    message = "CUDA is not available" if not count else f"has {count} CUDA device"
    with pytest.raises(ValueError, match=message):
        resolve_device(f"cuda:{count}" if count else "cuda")


def test_unusable_device_is_a_clear_error(tiny_checkpoint, tmp_path, capsys):
    image = tmp_path / "1.png"
    Image.new("RGB", (8, 8)).save(image)
    assert command.main([str(image), "--ckpt", str(tiny_checkpoint), "--device", "gpu0"]) == 2
    assert "unknown device 'gpu0'" in capsys.readouterr().err


@pytest.mark.parametrize("earlier", [False, True])
@pytest.mark.parametrize("captioned", [0, 2])
def test_ctrl_c_keeps_the_captions_done_or_else_the_earlier_out_file(
    tiny_checkpoint, photo_dir, tmp_path, capsys, monkeypatch, captioned, earlier
):
    from captioner.cli import main as captioner
    from captioner.inference.pipeline import Captioner

    out = tmp_path / "caps.jsonl"
    args = ["caption", str(photo_dir / "101.png"), str(photo_dir / "102.png"),
            str(photo_dir / "103.jpg"), "--ckpt", str(tiny_checkpoint), "--format", "jsonl",
            "--out", str(out), "--overwrite", *FAST]
    assert captioner(args) == 0
    whole = out.read_text()
    if not earlier:
        out.unlink()
    caption_files = Captioner.caption_files

    def interrupted(self, *args, **kwargs):  # Ctrl-C once `captioned` images are captioned
        for done, record in enumerate(caption_files(self, *args, **kwargs)):
            if done == captioned:
                raise KeyboardInterrupt
            yield record

    monkeypatch.setattr(Captioner, "caption_files", interrupted)
    capsys.readouterr()
    assert captioner(args) == 130
    err = capsys.readouterr().err
    if captioned and earlier:  # half a result does not replace a whole one
        assert err == (f"captioner caption: interrupted; the earlier {out} is left as it was "
                       "(the 2 captions made are not written)\n")
        assert out.read_text() == whole
    elif captioned:
        assert err == f"captioner caption: interrupted; 2 captions of 3 images written to {out}\n"
        assert out.read_text().splitlines() == whole.splitlines()[:captioned]
    else:
        assert err == (f"captioner caption: interrupted before any image was captioned; {out} "
                       "was not written\n")
        assert out.exists() == earlier and (not earlier or out.read_text() == whole)


def test_print_config_writes_a_config_that_captions_alike(tiny_checkpoint, photo_dir, tmp_path,
                                                          capsys):
    """`caption --print_config > c.yaml && caption --config c.yaml IMAGE`, as fit's configs."""
    from captioner.cli import main as captioner

    with pytest.raises(SystemExit) as printed:
        captioner(["caption", "--print_config"])  # no option needed to write a config
    assert printed.value.code == 0
    assert "ckpt: null\n" in capsys.readouterr().out
    with pytest.raises(SystemExit) as printed:
        captioner(["caption", "--ckpt", str(tiny_checkpoint), *FAST, "--print_config"])
    assert printed.value.code == 0
    config = tmp_path / "c.yaml"
    config.write_text(capsys.readouterr().out)
    assert "beam_size: 1\n" in config.read_text() and "progress: false\n" in config.read_text()
    image = str(photo_dir / "101.png")
    assert captioner(["caption", "--config", str(config), image]) == 0
    from_config = capsys.readouterr().out
    assert captioner(["caption", image, "--ckpt", str(tiny_checkpoint), *FAST]) == 0
    assert capsys.readouterr().out == from_config != ""
    # An option after the config overrides it; an unknown key in it is refused in one line.
    assert captioner(["caption", "--config", str(config), "--format", "jsonl", image]) == 0
    assert json.loads(capsys.readouterr().out)["caption"] == from_config.split("\t")[1].strip()
    config.write_text(config.read_text() + "beam_width: 3\n")
    with pytest.raises(SystemExit) as refused:
        captioner(["caption", "--config", str(config), image])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("captioner caption: error: ") and err.count("\n") == 1
    assert "beam_width" in err
