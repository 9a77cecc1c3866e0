"""The researcher's workflow on their own photos, as the README gives it, through the command
line.

The commands are the README's own: its shell blocks marked ``<!-- run: tests/test_workflow.py
-->``, run in order in one working folder, each in a subprocess, on the files the previous
steps wrote: prepare-dataset (a JSONL over generated photos) -> prepare-features -> fit, killed
with SIGKILL during a later epoch -> the README's resume -> runs -> test -> evaluate -> caption
-> heatmaps -> gallery -> rating-kit -> rating-summary on ratings in the kit's export format.
What the test changes in them (:data:`OVERRIDES`, :data:`EXTRA`) makes them small and offline:
a ResNet-18 with random weights instead of a download, a tiny model, 64 px images, counts for
the split, and no progress bars. It then checks what each step wrote, and runs a few steps the
README does not show (text and COCO captions, a refused score) on the same files.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
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

README = Path(__file__).resolve().parent.parent / "README.md"
MARKER = "<!-- run: tests/test_workflow.py -->"
PHOTO_FOLDER = "beach"  # the README's photos are photos/beach/IMG_0001.jpg, ...
CONFIG = "tiny_tvmax.yaml"
# What the test changes in the README's commands, by command and option: the README's value
# must be there, so that a command the README changes is noticed.
OVERRIDES = {
    "prepare-dataset": {"--split": f"{TRAIN},{VAL},{TEST}"},
    "prepare-features": {"--arch": "resnet18", "--weights": "none"},
    "fit": {"--config": CONFIG},  # the first fit only: the resume gives its run's config.yaml
    "rating-kit": {"--n": "3"},
}
# Options the test adds to the README's commands.
EXTRA = {
    "prepare-dataset": ["--no-progress"],
    "prepare-features": ["--layer", "layer3", "--image-size", "64", "--batch-size", "8",
                         "--num-workers", "0", "--no-progress"],
    "evaluate": ["--metrics", "Bleu,CIDEr,ROUGE_L,REP", "--no-progress"],
    "caption": ["--no-progress"],
    "heatmaps": ["--no-progress"],
    "gallery": ["--no-progress"],
    "rating-kit": ["--seed", "0", "--no-progress"],
}


def readme_workflow() -> list[list[str]]:
    """The README's workflow: the commands of its shell blocks marked :data:`MARKER`, in
    order, each as its arguments after ``captioner`` (comments left out)."""
    parts = README.read_text(encoding="utf-8").split(MARKER)
    assert len(parts) > 1, f"README.md has no shell block marked {MARKER}"
    commands = []
    for part in parts[1:]:
        block = part.split("```bash\n", 1)[1].split("\n```", 1)[0]
        words = [shlex.split(line, comments=True) for line in block.splitlines()]
        assert all(w[0] == "captioner" for w in words if w), block
        commands += [w[1:] for w in words if w]
    return commands


def adapted(argv: list[str], overrides: dict[str, str]) -> list[str]:
    """``argv`` with the values of ``overrides`` (option -> value) in place of the README's and
    :data:`EXTRA` added."""
    argv = list(argv)
    for option, value in overrides.items():
        assert option in argv, f"the README's 'captioner {argv[0]}' no longer gives {option}"
        argv[argv.index(option) + 1] = value
    return argv + EXTRA.get(argv[0], [])


def tiny_config(encoder_weights: str) -> str:
    """A small TVmax captioner on the README's feature cache, whose random encoder
    prepare-features saved as ``encoder_weights``; the README's fit gives the data paths."""
    return f"""\
trainer:
  max_epochs: {EPOCHS}
  accelerator: cpu
  devices: 1
  num_sanity_val_steps: 0
  enable_progress_bar: false
  log_every_n_steps: 5
model:
  encoder_arch: resnet18
  encoder_weights: {encoder_weights}
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
    (folder / PHOTO_FOLDER).mkdir(parents=True)
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
        name = f"{PHOTO_FOLDER}/IMG_{index:04d}.jpg"
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


def _fit_killed_after(cwd: Path, argv: list[str], epochs_done: int, progress: Path) -> dict:
    """Start ``captioner ARGV`` (a fit), SIGKILL it once ``progress`` says ``epochs_done``
    epochs are saved (so during a later epoch); returns the progress at the kill."""
    process = subprocess.Popen(
        [sys.executable, "-m", "captioner.cli", *argv],
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


def _option(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def _ratings_of(key: dict) -> dict:
    """One rater's export of the kit whose blinding key is ``key``, every rating given."""
    return {
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


@pytest.mark.slow
@pytest.mark.java
def test_the_readme_workflow_on_ones_own_photos(tmp_path):
    work = tmp_path
    steps = readme_workflow()
    names = [argv[0] for argv in steps]
    assert names == ["prepare-dataset", "prepare-features", "fit", "fit", "runs", "test",
                     "evaluate", "caption", "heatmaps", "gallery", "rating-kit",
                     "rating-summary"], names
    (prepare_dataset, prepare_features, first_fit, resume, runs, test, evaluate, caption,
     heatmaps, gallery, rating_kit, rating_summary) = steps
    captions_file = Path(_option(prepare_dataset, "--captions"))
    photos_dir = Path(_option(prepare_dataset, "--images"))
    records = _photos(work / photos_dir)
    (work / captions_file).write_text("".join(json.dumps(r) + "\n" for r in records))
    cache = Path(_option(prepare_features, "--out"))
    (work / CONFIG).write_text(tiny_config(str(cache.with_suffix(".encoder.pt"))))

    # Your own photos -> Karpathy JSON -> feature cache.
    _captioner(work, *adapted(prepare_dataset, OVERRIDES["prepare-dataset"]))
    dataset_file = work / _option(prepare_dataset, "--out")
    dataset = json.loads(dataset_file.read_text())
    assert len(dataset["images"]) == TRAIN + VAL + TEST
    _captioner(work, *adapted(prepare_features, OVERRIDES["prepare-features"]))
    assert (work / cache).is_file()

    # Train; killed during epoch 3 (or its validation), then resumed by the README's command.
    run_config = Path(_option(resume, "--config"))
    run = run_config.parent
    checkpoints = work / run / "checkpoints"
    killed = _fit_killed_after(work, adapted(first_fit, OVERRIDES["fit"]), 2,
                               checkpoints / "progress.json")
    assert killed["epochs_done"] < EPOCHS
    resumed = _captioner(work, *adapted(resume, {}))
    assert f"run folder: {run}" in resumed.stdout
    assert sorted(p.name for p in (work / run).parent.iterdir()) == [run.name]  # the same run
    progress = json.loads((checkpoints / "progress.json").read_text())
    assert progress["epochs_done"] == EPOCHS
    assert progress["global_step"] == EPOCHS * STEPS_PER_EPOCH
    best = Path(progress["best_checkpoint"])
    last = Path(_option(evaluate, "--ckpt"))
    assert (work / best).is_file() and best.parent == run / "checkpoints"
    assert (work / last).is_file() and last == run / "checkpoints" / "last.ckpt"
    listed = _captioner(work, *adapted(runs, {})).stdout
    assert run.parent.name in listed and str(best) in listed

    # Test and evaluate the checkpoints fit wrote.
    tested = _captioner(work, *adapted(test, {}))
    assert "test/CIDEr" in tested.stdout
    _captioner(work, *adapted(evaluate, {}))
    split = _option(evaluate, "--split")
    metrics = json.loads((work / _option(evaluate, "--out") / f"metrics_{split}.json")
                         .read_text())
    assert {"Bleu_4", "CIDEr", "ROUGE_L", "REP"} <= set(metrics)
    assert metrics["info"]["num_images"] == TEST

    # Captions with per-word attention of every photo.
    _captioner(work, *adapted(caption, {}))
    jsonl = [json.loads(line)
             for line in (work / _option(caption, "--out")).read_text().splitlines()]
    assert len(jsonl) == TRAIN + VAL + TEST and jsonl[0]["grid"] == [4, 4]
    assert all(len(r["attention"]) == len(r["tokens"]) for r in jsonl)

    # Heatmaps of one photo, a gallery of the folder.
    _captioner(work, *adapted(heatmaps, {}))
    index = json.loads((work / _option(heatmaps, "--out") / "index.json").read_text())
    assert len(index["images"]) == 1 and all(entry["files"] for entry in index["images"])
    _captioner(work, *adapted(gallery, {}))
    assert (work / _option(gallery, "--out") / "index.html").is_file()

    # Blinded rating kit, one rater's export, Table 2.
    _captioner(work, *adapted(rating_kit, OVERRIDES["rating-kit"]))
    kit = work / _option(rating_kit, "--out")
    assert (kit / "index.html").is_file()
    key_file = Path(_option(rating_summary, "--key"))
    key = json.loads((work / key_file).read_text())
    (work / "ratings_rater-1.json").write_text(json.dumps(_ratings_of(key)))
    summary = _captioner(work, *[expanded for word in adapted(rating_summary, {})
                                 for expanded in (sorted(glob.glob(word, root_dir=work))
                                                  if "*" in word else [word])])
    table = json.loads((work / _option(rating_summary, "--out")).read_text())
    assert set(table["models"]) == {entry["name"] for entry in key["models"]}
    assert "caption" in summary.stdout.lower()

    # Beyond the README: text and COCO captions of the test photos with the best checkpoint.
    photos = sorted((work / photos_dir).rglob("*.jpg"))
    text = _captioner(work, "caption", *map(str, photos[-TEST:]), "--ckpt", str(best),
                      "--no-progress").stdout.splitlines()
    assert [line.split("\t")[0] for line in text] == list(map(str, photos[-TEST:]))
    assert all(line.split("\t")[1] for line in text)  # no empty caption
    assert all("<unk>" not in line for line in text)
    _captioner(work, "caption", str(photos_dir), "--ckpt", str(best), "--format", "coco",
               "--out", "results.json", "--no-progress")
    results = json.loads((work / "results.json").read_text())
    assert [r["image_id"] for r in results] == list(range(TRAIN + VAL + TEST))  # IMG_0000...
    # Those ids come from the file names (IMG_0007.jpg: 7), not from the converted dataset's
    # numbering: score refuses to pair the captions with other images' references.
    refused = _captioner(work, "score", "--results", "results.json", "--references",
                         str(dataset_file.relative_to(work)), "--split", "test", "--metrics",
                         "Bleu", status=2)
    assert (f"another image than {dataset_file.relative_to(work)} gives its image id (image id "
            in refused.stderr), refused.stderr
