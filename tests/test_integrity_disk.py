"""Writes that survive a full disk: a checkpoint, a cache or an output stopped by the disk
(or by the file size limit, ``ulimit -f``, which fails a write as a full disk does) keeps the
previous file, leaves no temporary and says so in one line naming the folder."""

from __future__ import annotations

import resource
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest
import robust_inputs as bad
import torch
from conftest import tiny_fit_args

from captioner.checkpointing import load_safely, save_atomically
from captioner.commands.lightning import main as lightning_main
from captioner.training.runs import read_progress

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def file_size_limit(size: int):
    """Writes past ``size`` bytes fail with EFBIG inside the block (Python ignores SIGXFSZ;
    it is set again here in case a library changed it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_checkpoint_stopped_by_the_disk_keeps_the_previous_one(tmp_path):
    path = tmp_path / "last.ckpt"
    save_atomically({"weights": torch.zeros(16)}, path)
    before = path.read_bytes()
    with file_size_limit(1 << 20), pytest.raises(OSError) as caught:
        save_atomically({"weights": torch.zeros(1 << 20)}, path)  # 4 MB
    assert str(caught.value) == (
        f"[Errno 27] the file size limit (ulimit -f) was reached after 1.0 MB of last.ckpt; "
        f"the previous last.ckpt is kept; raise the limit and run again: '{tmp_path}'")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_text_output_stopped_by_the_disk_names_the_folder(tmp_path, tiny_checkpoint,
                                                           capsys):
    images = [bad.write_png(tmp_path / f"good{seed}.png", seed=seed) for seed in range(2)]
    out = tmp_path / "out" / "captions.jsonl"
    out.parent.mkdir()
    out.write_text("the earlier captions\n")
    with file_size_limit(out.stat().st_size + 10):  # the new records are longer
        outcome = bad.run_cli(capsys, [
            "caption", *images, "--ckpt", tiny_checkpoint, "--format", "jsonl", "--out", out,
            "--overwrite", "--beam-size", "1", "--no-progress", "--device", "cpu"])
    assert outcome.code != 0 and "Traceback" not in outcome.err
    [line] = outcome.error_lines("captioner caption: ")
    assert f"{out.parent}: the file size limit (ulimit -f) was reached" in line, line
    assert "the previous captions.jsonl is kept" in line
    assert out.read_text() == "the earlier captions\n"
    assert not bad.leftover_temporaries(tmp_path)


def test_a_fit_that_cannot_save_its_checkpoint_stops_in_one_line_and_resumes(
        synthetic_data, cache32, tmp_path, capsys):
    args = ["fit", *tiny_fit_args("demo_softmax.yaml", synthetic_data, cache32,
                                  tmp_path / "runs")]
    assert lightning_main([*args, "--trainer.max_epochs", "1"]) == 0
    checkpoints = tmp_path / "runs" / "demo_softmax" / "version_0" / "checkpoints"
    last = checkpoints / "last.ckpt"
    saved = last.read_bytes()
    capsys.readouterr()
    with file_size_limit(len(saved) // 2):
        code = lightning_main([*args, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err, err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("captioner fit: ")]
    assert f"{checkpoints}: the file size limit (ulimit -f) was reached" in line, line
    assert last.read_bytes() == saved and not bad.leftover_temporaries(checkpoints)
    assert read_progress(checkpoints)["epochs_done"] == 1
    # With room again, the run resumes from the checkpoint that was whole.
    assert lightning_main([*args, "--trainer.max_epochs", "2", "--ckpt_path", "last"]) == 0
    assert load_safely(last)["epoch"] == 1


def _split(tmp_path, count=6):
    images = tmp_path / "images"
    images.mkdir()
    records = []
    for i in range(count):
        bad.write_png(images / f"{i}.png", seed=i)
        records.append(bad.karpathy_record(f"{i}.png", i, "train" if i < count - 1 else "test"))
    return bad.write_karpathy(tmp_path / "split.json", records), images


ENCODER = ["--arch", "resnet18", "--layer", "layer3", "--image-size", "256", "--batch-size",
           "8", "--num-workers", "0", "--no-progress", "--device", "cpu"]


@pytest.mark.parametrize("limit", ["full disk", "ulimit -f"])
def test_prepare_features_refuses_a_cache_that_cannot_fit_before_encoding(
        limit, tmp_path, capsys, monkeypatch):
    import shutil as shutil_module

    data, images = _split(tmp_path)
    weights = bad.write_foreign_state_dict(tmp_path / "encoder.pt")
    out = tmp_path / "out" / "f.h5"
    argv = ["prepare-features", "--data", data, "--images", images, "--out", out,
            "--weights", weights, *ENCODER]
    # 6 rows of 16x16x256 float16 (layer3 at 256 px): 786 KB.
    if limit == "full disk":
        usage = shutil_module.disk_usage(tmp_path)
        monkeypatch.setattr(shutil_module, "disk_usage",
                            lambda path: usage._replace(free=100_000))
        outcome = bad.run_cli(capsys, argv)
        phrase = "the cache of 6 images needs about 0.8 MB more, and 0.1 MB are free"
    else:
        with file_size_limit(200_000):
            outcome = bad.run_cli(capsys, argv)
        phrase = ("the cache of 6 images grows to about 0.8 MB, past the file size limit "
                  "(ulimit -f) of 0.2 MB")
    assert outcome.code != 0 and "Traceback" not in outcome.err, outcome.err[-2000:]
    [line] = outcome.error_lines("captioner prepare-features: ")
    assert line.startswith(f"captioner prepare-features: {out.parent}: {phrase}"), line
    assert not out.exists() and not bad.leftover_temporaries(tmp_path)


# A child process running prepare-features in which the disk fills after the third commit (the
# empty file's, then two batches'): the file size limit drops to 300 KB past the partial cache,
# less than the next batch of 4 rows of 16x16x256 float16 (524 KB) needs.
_FILLED_MIDWAY = """
import os, resource, signal, sys
from data_prep.features import FeatureCacheWriter, partial_cache_path
commit, commits = FeatureCacheWriter.commit, []
def filling_commit(self):
    commit(self)
    commits.append(self.rows)
    if len(commits) == 3:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        size = os.stat(partial_cache_path(self.path)).st_size
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 300_000, hard))
FeatureCacheWriter.commit = filling_commit
from captioner.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.subprocess
def test_prepare_features_stopped_midway_by_the_disk_is_one_line_and_resumes(tmp_path, capsys):
    import subprocess
    import sys

    import numpy as np

    from data_prep.features import FeatureCache, partial_cache_path

    data, images = _split(tmp_path, count=12)
    weights = bad.write_foreign_state_dict(tmp_path / "encoder.pt")
    out = tmp_path / "out" / "f.h5"
    argv = ["prepare-features", "--data", data, "--images", images, "--out", out,
            "--weights", weights, *ENCODER, "--batch-size", "4"]
    child = subprocess.run([sys.executable, "-c", _FILLED_MIDWAY, *map(str, argv)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 2 and "Traceback" not in child.stderr, child.stderr[-3000:]
    [line] = child.stderr.splitlines()
    assert line.startswith(f"captioner prepare-features: {out.parent}: the cache f.h5 (8 rows "
                           "written so far, kept for the rerun) grows to about "), line
    assert "past the file size limit (ulimit -f) of" in line, line
    assert line.endswith("; raise the limit and run again"), line
    assert not out.exists() and partial_cache_path(out).is_file()
    assert not bad.leftover_temporaries(tmp_path)

    outcome = bad.run_cli(capsys, argv)  # with room again
    assert outcome.code == 0, outcome.err[-2000:]
    assert "resuming: 8 of 12 images already encoded" in outcome.out
    whole = tmp_path / "whole" / "f.h5"
    assert bad.run_cli(capsys, [*argv[:6], whole, *argv[7:]]).code == 0
    resumed, uninterrupted = FeatureCache(out), FeatureCache(whole)
    assert resumed.image_ids == uninterrupted.image_ids
    for image_id in resumed.image_ids:
        assert np.array_equal(resumed.get(image_id), uninterrupted.get(image_id))
