"""Robustness table of ``captioner caption``: one row per input class and its expected outcome.

Rules checked: an unusable image is reported by name, skipped, the others are captioned and the
exit status is 1; good images of unusual formats are captioned (exit 0); user errors (bad
output path, checkpoint, empty folder) exit 2 with one line ``captioner caption: ...`` naming
the file, before any work; no ``.*.tmp`` file is left; nothing hangs on a FIFO; a checkpoint
that would run code is refused without running it and without suggesting weights_only=False.

Covered elsewhere: folder expansion, output formats and a corrupt file among others in
tests/test_caption_cmd.py; every decoder branch of load_image in tests/test_data_images.py.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import robust_inputs as bad
import torch

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress", "--device", "cpu"]
PREFIX = "captioner caption: "


def _caption(capsys, ckpt, *inputs, out=None, fmt="text", fifos=()):
    argv = ["caption", *inputs, "--ckpt", ckpt, "--format", fmt, *FAST]
    if out is not None:
        argv += ["--out", out]
    return bad.run_cli(capsys, argv, fifos=fifos)


@pytest.mark.parametrize("name", list(bad.EXOTIC_IMAGES))
def test_good_images_of_unusual_formats_are_captioned(name, tiny_checkpoint, tmp_path, capsys):
    file_name, write = bad.EXOTIC_IMAGES[name]
    good = bad.write_png(tmp_path / "good.png")
    image = write(tmp_path / file_name)
    out = tmp_path / "captions.txt"
    outcome = _caption(capsys, tiny_checkpoint, good, image, out=out)
    assert outcome.code == 0, outcome.err
    assert not outcome.error_lines(PREFIX)
    paths = [line.split("\t")[0] for line in out.read_text(encoding="utf-8").splitlines()]
    assert paths == [str(good), str(image)]
    assert not bad.leftover_temporaries(tmp_path)


# Named on the command line or found in a folder: a folder keeps every entry with an image
# suffix but folders, so a FIFO or a link loop there is reported too, not passed over unseen.
@pytest.mark.parametrize("given", ["named", "in a folder"])
@pytest.mark.parametrize("name", list(bad.BAD_IMAGES))
def test_an_unusable_image_is_named_and_skipped_and_the_rest_captioned(
    name, given, tiny_checkpoint, tmp_path, capsys
):
    file_name, write, phrase = bad.BAD_IMAGES[name]
    folder = tmp_path / "photos"
    folder.mkdir()
    good = bad.write_png(folder / "good.png")
    image = write(folder / file_name)
    out = tmp_path / "captions.txt"
    inputs = (good, image) if given == "named" else (folder,)
    outcome = _caption(capsys, tiny_checkpoint, *inputs, out=out, fifos=(image,))
    bad.assert_skipped(outcome, "caption", image, phrase)
    assert f"1 of 2 images could not be read: {image}" in outcome.err
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(good)]
    assert not bad.leftover_temporaries(tmp_path)


@pytest.mark.parametrize("name", list(bad.ODD_NAMES))
def test_odd_file_names_stay_one_record_each(name, tiny_checkpoint, tmp_path, capsys):
    image = bad.write_png(tmp_path / bad.ODD_NAMES[name])
    other = bad.write_png(tmp_path / "plain.png", seed=1)
    outcome = _caption(capsys, tiny_checkpoint, image, other)
    assert outcome.code == 0, outcome.err
    escaped = str(image).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    lines = outcome.out.splitlines()
    assert [line.split("\t")[0] for line in lines] == [escaped, str(other)]
    outcome = _caption(capsys, tiny_checkpoint, image, fmt="jsonl")
    assert outcome.code == 0
    [record] = [json.loads(line) for line in outcome.out.splitlines()]
    assert record["image"] == str(image)


@pytest.mark.parametrize(("kind", "phrase"),
                         [("folder", "is a folder"),
                          ("under a file", "somefile.txt is not a folder"),
                          ("device", "not a regular file")],
                         ids=["existing folder", "under a regular file", "a device"])
def test_unusable_out_is_refused_before_any_work(kind, phrase, tiny_checkpoint, tmp_path,
                                                 capsys):
    out = bad.unusable_out(kind, tmp_path, "out.txt")
    image = bad.write_png(tmp_path / "good.png")
    before = bad.names_under(tmp_path)
    outcome = _caption(capsys, tiny_checkpoint, image, out=out)
    bad.assert_user_error(outcome, "caption", str(out), phrase)
    assert bad.names_under(tmp_path) == before
    if kind == "device":
        assert bad.is_full_device(out)
    if kind == "under a file":
        assert (tmp_path / "somefile.txt").read_text() == bad.KEEP_ME


def test_empty_folder_is_a_user_error(tiny_checkpoint, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    outcome = _caption(capsys, tiny_checkpoint, tmp_path / "empty")
    bad.assert_user_error(outcome, "caption", "empty", "folder holds no image files")


@pytest.fixture(scope="module")
def bad_checkpoints(tiny_checkpoint, tmp_path_factory):
    return bad.checkpoint_rows(tmp_path_factory.mktemp("bad_checkpoints"), tiny_checkpoint)


CHECKPOINT_ROWS = ["malicious pickle", "foreign state_dict", "empty file", "folder",
                   "class_path hyperparameters", "NaN weights", "huge image_size"]


@pytest.mark.parametrize("name", CHECKPOINT_ROWS)
def test_unusable_checkpoint_is_one_line_and_nothing_runs(
    name, bad_checkpoints, tmp_path, capsys
):
    ckpt, phrase = bad_checkpoints[name]
    image = bad.write_png(tmp_path / "good.png")
    out = tmp_path / "captions.txt"
    outcome = _caption(capsys, ckpt, image, out=out)
    bad.assert_user_error(outcome, "caption", str(ckpt), phrase)
    assert "weights_only=False" not in outcome.err and "weights_only` set to `False" not in \
        outcome.err
    assert not (ckpt.parent / "EXECUTED").exists()
    assert not out.exists()


def test_fifo_as_checkpoint_is_refused_without_hanging(tmp_path, capsys):
    fifo = bad.write_fifo(tmp_path / "model.ckpt")
    image = bad.write_png(tmp_path / "good.png")
    outcome = bad.run_cli(capsys, ["caption", image, "--ckpt", fifo, *FAST], seconds=30,
                          fifos=(fifo,))
    bad.assert_user_error(outcome, "caption", str(fifo), "not a regular file")


@pytest.mark.subprocess
def test_console_script_refuses_a_malicious_checkpoint_without_running_it(tmp_path):
    """The installed ``captioner`` script, end to end, in its own process."""
    marker = tmp_path / "EXECUTED"
    evil = bad.write_malicious_checkpoint(tmp_path / "evil.ckpt", marker)
    image = bad.write_png(tmp_path / "good.png")
    outcome = bad.run_subprocess(["caption", image, "--ckpt", evil, *FAST], seconds=120)
    bad.assert_user_error(outcome, "caption", str(evil))
    assert "weights_only" not in outcome.err
    assert not marker.exists()


@pytest.mark.subprocess
def test_a_beam_that_asks_for_more_memory_than_there_is_is_one_line(tiny_checkpoint, tmp_path):
    # A search whose first step surely needs more than is free is refused before it starts:
    # beams that each fit (3 million, 47 GiB in all, on a 24 GiB machine) were allocated one
    # tensor after another until the OOM killer ended the process without a word. The
    # address-space limit keeps any allocation that would still be tried from the machine.
    image = bad.write_png(tmp_path / "good.png")
    script = Path(sys.executable).with_name("captioner")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "captioner.cli"]
    done = subprocess.run(
        [*command, "caption", str(image), "--ckpt", str(tiny_checkpoint), "--device", "cpu",
         "--no-progress", "--beam-size", str(10**10)],
        capture_output=True, text=True, timeout=240, check=False,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (16 * 2**30, 16 * 2**30)))
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and re.fullmatch(
        r"captioner caption: out of memory \(a beam search of 10,000,000,000 beams x 1 image "
        r"needs \d+\.\d\d GiB or more, and \d+\.\d\d GiB is free\); a smaller batch size, beam "
        r"size or image size needs less", lines[0]), done.stderr[-3000:]


def test_an_allocation_torch_refuses_is_named_with_its_size():
    from captioner.cli import _allocation_refused

    with pytest.raises(RuntimeError) as caught:
        torch.empty(2**62, dtype=torch.uint8)
    assert _allocation_refused(caught.value) == "4294967296.00 GiB asked at once"
    assert _allocation_refused(RuntimeError("another failure")) is None
    with pytest.raises(MemoryError) as caught:  # numpy's words for it
        np.empty((2**40, 2**20), dtype=np.float32)
    assert _allocation_refused(caught.value) == "4.00 EiB asked at once"
