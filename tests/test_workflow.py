"""The researcher's workflow, as the README gives it, through the command line.

Every step runs ``captioner ...`` in a subprocess, in one working folder, on the files the
previous steps wrote: prepare-dataset (a JSONL over generated photos) -> prepare-features ->
fit, killed with SIGKILL during a later epoch -> fit --ckpt_path last -> runs -> test ->
evaluate -> caption (text, jsonl, coco) -> heatmaps -> rating-kit -> rating-summary on ratings
in the kit's export format. Every inference step uses the checkpoints that fit wrote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220)}
SHAPES = ("circle", "square")
BACKGROUNDS = {"white": (240, 240, 240), "black": (15, 15, 15)}
EPOCHS = 4
TRAIN, VAL, TEST = 16, 4, 4
STEPS_PER_EPOCH = TRAIN * 3 // 4  # three captions per image, batch size 4

CONFIG = f"""\
# A small TVmax captioner on one's own photos (see the README, "Your own dataset").
trainer:
  max_epochs: {EPOCHS}
  accelerator: cpu
  devices: 1
  num_sanity_val_steps: 0
  enable_progress_bar: false
  log_every_n_steps: 5
model:
  encoder_arch: resnet18
  encoder_weights: data/features_resnet18.encoder.pt
  encoder_layer: layer3
  output_attention: tvmax
  output_attention_kwargs: {{lam: 0.1}}
  feature_dim: 32
  embed_dim: 16
  hidden_dim: 32
  attention_dim: 16
  dropout: 0.1
  lr: 0.003
  decoding: {{beam_size: 2, max_length: 8}}
data:
  karpathy_json: data/dataset_mine.json
  image_root: photos
  feature_cache: data/features_resnet18.h5
  min_count: 1
  image_size: 64
  batch_size: 4
  eval_batch_size: 8
  num_workers: 0
"""


def _photos(folder: Path) -> list[dict]:
    """JPEG "photos" of different sizes (a coloured shape on a noisy background) and three
    captions each; returns the JSONL records."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    records = []
    for index in range(TRAIN + VAL + TEST):
        colour, shape = list(COLOURS)[index % 3], SHAPES[index // 3 % 2]
        background = list(BACKGROUNDS)[index // 6 % 2]
        width, height = int(rng.integers(90, 140)), int(rng.integers(70, 120))
        pixels = np.clip(np.array(BACKGROUNDS[background]) + rng.normal(0, 12, (height, width, 3)),
                         0, 255).astype(np.uint8)
        image = Image.fromarray(pixels)
        box = (width // 4, height // 4, 3 * width // 4, 3 * height // 4)
        draw = ImageDraw.Draw(image)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
        name = f"IMG_{index:04d}.jpg"
        image.save(folder / name, quality=90)
        records.append({"image": name, "captions": [
            f"A {colour} {shape} on a {background} background.",
            f"a {shape} that is {colour}",
            f"The {colour} {shape}, in the middle of the picture!",
        ]})
    return records


def _captioner(cwd: Path, *args: str, timeout: float = 300,
               status: int = 0) -> subprocess.CompletedProcess:
    run = subprocess.run(
        [sys.executable, "-m", "captioner.cli", *args], cwd=cwd, env=_env(),
        capture_output=True, text=True, timeout=timeout,
    )
    assert run.returncode == status, (
        f"captioner {' '.join(args)}:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    )
    return run


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def _fit_killed_after(cwd: Path, epochs_done: int, progress: Path) -> dict:
    """Start ``captioner fit``, SIGKILL it once ``progress`` says ``epochs_done`` epochs are
    saved (so during a later epoch); returns the progress at the kill."""
    process = subprocess.Popen(
        [sys.executable, "-m", "captioner.cli", "fit", "--config", "tiny_tvmax.yaml"],
        cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            if progress.is_file():
                state = json.loads(progress.read_text())
                if state["epochs_done"] >= epochs_done:
                    assert process.poll() is None, "fit ended before it could be killed"
                    process.send_signal(signal.SIGKILL)
                    process.wait(timeout=30)
                    return state
            assert process.poll() is None, process.stderr.read()[-3000:]
            time.sleep(0.02)
        raise AssertionError("fit saved no checkpoint in time")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow
@pytest.mark.java
def test_the_readme_workflow_on_ones_own_photos(tmp_path):
    work = tmp_path
    records = _photos(work / "photos")
    (work / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (work / "tiny_tvmax.yaml").write_text(CONFIG)

    # Your own dataset -> Karpathy JSON -> feature cache.
    _captioner(work, "prepare-dataset", "--captions", "captions.jsonl", "--images", "photos",
               "--out", "data/dataset_mine.json", "--split", f"{TRAIN},{VAL},{TEST}",
               "--no-progress")
    dataset = json.loads((work / "data" / "dataset_mine.json").read_text())
    assert len(dataset["images"]) == TRAIN + VAL + TEST
    _captioner(work, "prepare-features", "--data", "data/dataset_mine.json", "--images",
               "photos", "--arch", "resnet18", "--layer", "layer3", "--weights", "none",
               "--image-size", "64", "--batch-size", "8", "--num-workers", "0",
               "--out", "data/features_resnet18.h5", "--no-progress")

    # Train; killed during epoch 3 (or its validation), then resumed from last.ckpt.
    run = work / "runs" / "tiny_tvmax" / "version_0"
    checkpoints = run / "checkpoints"
    killed = _fit_killed_after(work, 2, checkpoints / "progress.json")
    assert killed["epochs_done"] < EPOCHS
    resumed = _captioner(work, "fit", "--config", "tiny_tvmax.yaml", "--ckpt_path", "last")
    assert f"run folder: {Path('runs') / 'tiny_tvmax' / 'version_0'}" in resumed.stdout
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]  # the same run
    progress = json.loads((checkpoints / "progress.json").read_text())
    assert progress["epochs_done"] == EPOCHS
    assert progress["global_step"] == EPOCHS * STEPS_PER_EPOCH
    best = Path(progress["best_checkpoint"])
    last = checkpoints / "last.ckpt"
    assert (work / best).is_file() and best.parent == Path("runs/tiny_tvmax/version_0/checkpoints")
    listed = _captioner(work, "runs").stdout
    assert "tiny_tvmax" in listed and str(best) in listed

    # Test and evaluate the checkpoint fit wrote.
    tested = _captioner(work, "test", "--config", "tiny_tvmax.yaml", "--ckpt_path", "best")
    assert "test/CIDEr" in tested.stdout
    _captioner(work, "evaluate", "--ckpt", str(best), "--data", "data/dataset_mine.json",
               "--images", "photos", "--split", "test", "--metrics", "Bleu,CIDEr,ROUGE_L,REP",
               "--out", "eval", "--no-progress")
    metrics = json.loads((work / "eval" / "metrics_test.json").read_text())
    assert {"Bleu_4", "CIDEr", "ROUGE_L", "REP"} <= set(metrics)
    assert metrics["info"]["num_images"] == TEST

    # Caption photos in the three formats.
    photos = sorted((work / "photos").glob("*.jpg"))[-TEST:]
    text = _captioner(work, "caption", *map(str, photos), "--ckpt", str(best),
                      "--no-progress").stdout.splitlines()
    assert [line.split("\t")[0] for line in text] == list(map(str, photos))
    assert all(line.split("\t")[1] for line in text)  # no empty caption
    assert all("<unk>" not in line for line in text)
    _captioner(work, "caption", "photos", "--ckpt", str(last), "--format", "jsonl",
               "--out", "caps.jsonl", "--no-progress")
    jsonl = [json.loads(line) for line in (work / "caps.jsonl").read_text().splitlines()]
    assert len(jsonl) == TRAIN + VAL + TEST and jsonl[0]["grid"] == [4, 4]
    _captioner(work, "caption", "photos", "--ckpt", str(best), "--format", "coco",
               "--out", "results.json", "--no-progress")
    results = json.loads((work / "results.json").read_text())
    assert [r["image_id"] for r in results] == list(range(TRAIN + VAL + TEST))  # IMG_0000...
    # Those ids come from the file names (IMG_0007.jpg: 7), not from the converted dataset's
    # numbering: score refuses to pair the captions with other images' references.
    refused = _captioner(work, "score", "--results", "results.json", "--references",
                         "data/dataset_mine.json", "--split", "test", "--metrics", "Bleu",
                         status=2)
    assert ("another image than data/dataset_mine.json gives its image id (image id "
            in refused.stderr), refused.stderr

    # Heatmaps of the best and the last checkpoint on one colour scale.
    _captioner(work, "heatmaps", str(photos[0]), "--ckpt", str(best), "--ckpt", str(last),
               "--out", "heatmaps", "--no-progress")
    index = json.loads((work / "heatmaps" / "index.json").read_text())
    assert len(index["images"]) == 2 and all(entry["files"] for entry in index["images"])

    # Blinded rating kit, one rater's export, Table 2.
    _captioner(work, "rating-kit", "--ckpt", str(best), "--ckpt", str(last), "--split", "test",
               "--data", "data/dataset_mine.json", "--images", "photos", "--n", "3",
               "--seed", "0", "--out", "kit", "--no-progress")
    assert (work / "kit" / "index.html").is_file()
    key = json.loads((work / "kit-key.json").read_text())
    ratings = {
        "format": "captioner-ratings/1", "kit_id": key["kit_id"], "rater_id": "rater-1",
        "exported_at": "2026-11-26T10:00:00Z",
        "ratings": [
            {"image": image["key"], "label": label, "caption_score": 3 + n % 3,
             "attention_score": 2 + n % 4, "caption_time": "2026-11-26T10:00:00Z",
             "attention_time": "2026-11-26T10:00:00Z"}
            for n, (image, label) in enumerate(
                (image, label) for image in key["images"] for label in image["labels"])
        ],
    }
    (work / "ratings_rater-1.json").write_text(json.dumps(ratings))
    summary = _captioner(work, "rating-summary", "ratings_rater-1.json", "--key", "kit-key.json",
                         "--out", "table2.json")
    table = json.loads((work / "table2.json").read_text())
    assert set(table["models"]) == {entry["name"] for entry in key["models"]}
    assert "caption" in summary.stdout.lower()
