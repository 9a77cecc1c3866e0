"""`captioner prepare-features` and captioner.features: the pre-check of every image,
skipping unusable images, resuming after SIGKILL with a result equal to an uninterrupted run's,
one-line errors, help text and file modes."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from robust_inputs import png_header

import captioner.features.extraction as fx
import captioner.features.random_encoder as random_encoder
from captioner.commands.prepare_features import main
from captioner.training.datamodule import CaptionDataModule
from data_prep.features import FeatureCache, partial_cache_path, skipped_images_path
from data_prep.images import check_image

SIZE = 64
ENCODER_ARGS = ["--arch", "resnet18", "--layer", "layer3", "--weights", "none",
                "--image-size", str(SIZE), "--batch-size", "8", "--num-workers", "0",
                "--no-progress"]


@pytest.fixture(autouse=True)
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _make_dataset(root: Path, n: int, *, seed: int = 0) -> tuple[Path, Path, list[int]]:
    """``n`` random 64 px PNGs and a Karpathy JSON (80% train, then val, test); returns the
    JSON, the image folder and the image ids in file order."""
    images = root / "images"
    images.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        pixels = rng.integers(0, 256, (SIZE // 8, SIZE // 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).resize((SIZE, SIZE)).save(images / f"{i}.png")
        split = "train" if i < 0.8 * n else ("val" if i < 0.9 * n else "test")
        records.append({
            "filename": f"{i}.png", "imgid": i, "cocoid": 1000 + i, "split": split,
            "sentences": [{"tokens": ["a", "picture", str(i % 7)], "raw": "a picture"}],
        })
    data = root / "data.json"
    data.write_text(json.dumps({"dataset": "test", "images": records}))
    return data, images, [1000 + i for i in range(n)]


def _spoil(images: Path, ids: list[int]) -> dict[int, str]:
    """Replace images of ``ids`` (8 of them) by unusable files; returns id -> expected reason."""
    jpeg = io.BytesIO()
    noise = np.random.default_rng(1).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    Image.fromarray(noise).save(jpeg, "JPEG")
    kinds = {
        "empty": (b"", "is empty"),
        "text": (b"this is not a picture\n", "not an image file"),
        "truncated": (jpeg.getvalue()[: len(jpeg.getvalue()) // 2], "truncated"),
        "bomb": (png_header(100_000, 100_000), "decompression bomb"),
        "large": (png_header(9_000, 9_000), "exceeds the limit of 64,000,000 pixels"),
        "fifo": (None, "not a regular file"),
        "missing": (None, "file not found"),
        "folder": (None, "is a folder"),
    }
    expected = {}
    for image_id, (kind, (content, reason)) in zip(ids, kinds.items(), strict=True):
        path = images / f"{image_id - 1000}.png"
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "folder":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        expected[image_id] = reason
    return expected


def _run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _user_error(code: int, err: str) -> str:
    assert code == 2
    assert err.startswith("captioner prepare-features: ") and "Traceback" not in err
    return err


def _cache_contents(path: Path) -> tuple[list[int], dict, np.ndarray]:
    with h5py.File(path, "r") as file:
        attrs = {key: np.asarray(value).tolist() for key, value in file.attrs.items()}
        return file["image_ids"][:].tolist(), attrs, file["features"][:]


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_precheck_lists_every_unusable_file_before_encoding(tmp_path, capsys):
    data, images, ids = _make_dataset(tmp_path, 30)
    expected = _spoil(images, ids[2:10])
    for image_id in ids[20:25]:  # 13 bad files in all: 10 named, "and 3 more"
        (images / f"{image_id - 1000}.png").unlink()
    out = tmp_path / "out" / "features.h5"
    code, _, err = _run(capsys, "--data", data, "--images", images, "--out", out, *ENCODER_ARGS)
    _user_error(code, err)
    [line] = err.splitlines()  # each file and its reason, separated by semicolons
    assert "13 of 30 images cannot be used: " in line and "; and 3 more (fix or remove" in line
    for image_id, reason in expected.items():
        assert re.search(rf"/{image_id - 1000}\.png: [^;]*{reason}[^;]*; ", line), (reason, err)
    assert "--on-error skip" in err
    assert not out.exists() and not partial_cache_path(out).exists()
    assert not out.parent.exists()  # nor the folder it made for the cache

    # Every case is found by check_image itself too, with the same reasons.
    reasons = fx.precheck_images([images / f"{i - 1000}.png" for i in ids])
    assert [i for i, r in zip(ids, reasons, strict=True) if r] == ids[2:10] + ids[20:25]


def test_pixel_limit_is_read_from_data_prep(tmp_path, monkeypatch):
    path = tmp_path / "small.png"
    Image.new("RGB", (SIZE, SIZE)).save(path)
    assert check_image(path) is None
    monkeypatch.setattr("data_prep.images.MAX_IMAGE_PIXELS", SIZE * SIZE - 1)
    assert "exceeds the limit of 4,095 pixels" in check_image(path)


def test_skip_mode_records_the_skipped_images_and_training_names_them(tmp_path, capsys):
    data, images, ids = _make_dataset(tmp_path, 40)
    expected = _spoil(images, ids[:8])
    # Passes the pre-check, fails when decoded: floating-point pixels have no 8-bit mapping.
    float_image = ids[30]
    Image.new("F", (SIZE, SIZE)).save(images / f"{float_image - 1000}.png", "TIFF")
    out = tmp_path / "features.h5"
    code, stdout, err = _run(capsys, "--data", data, "--images", images, "--out", out,
                             *ENCODER_ARGS, "--on-error", "skip")
    assert code == 0, err
    assert "8 of 40 images cannot be used and will be skipped" in stdout
    assert "encoded 31 images in this run" in stdout

    skipped = [*expected, float_image]
    cache = FeatureCache(out)
    assert cache.skipped_ids == skipped
    assert cache.image_ids == [i for i in ids if i not in skipped]
    records = json.loads(skipped_images_path(out).read_text())
    assert [r["id"] for r in records] == skipped
    assert records[-1]["path"] == str(images / f"{float_image - 1000}.png")
    assert "floating-point" in records[-1]["reason"]
    for record in records[:-1]:
        assert expected[record["id"]] in record["reason"]
    for path in (out, skipped_images_path(out), fx.encoder_weights_path(out)):
        assert _mode(path) == 0o644, path
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "data.json", "features.encoder.pt", "features.h5", "features.skipped.json", "images"]

    module = CaptionDataModule(data, images, feature_cache=out, min_count=1, num_workers=0)
    with pytest.raises(FileNotFoundError) as error:
        module.setup("fit")
    message = str(error.value)
    assert f"9 images missing from the feature cache {out} (id and file): " in message
    assert ("1000 (0.png), 1001 (1.png), 1002 (2.png), 1003 (3.png), 1004 (4.png) and 4 "
            "more (9 of them") in message
    assert "9 of them skipped as unusable images" in message
    assert str(skipped_images_path(out)) in message


def test_a_failure_before_any_image_is_encoded_leaves_nothing_in_the_way(tmp_path, capsys):
    """An empty partial file would refuse the rerun with other settings ("an unfinished cache
    made with other settings"), which for weights that always give non-finite features could
    never finish it."""
    data, images, _ = _make_dataset(tmp_path, 8)
    Image.new("F", (SIZE, SIZE)).save(images / "0.png", "TIFF")
    out = tmp_path / "features.h5"
    args = ["--data", data, "--images", images, "--out", out]
    code, _, err = _run(capsys, *args, *ENCODER_ARGS)
    err = _user_error(code, err)
    assert "image id 1000); fix the file, or rerun with --on-error skip" in err
    assert list(tmp_path.glob(".*")) == [] and not out.exists()
    code, stdout, err = _run(capsys, *args, *ENCODER_ARGS, "--image-size", "32",
                             "--on-error", "skip")
    assert code == 0, err
    assert "resuming" not in stdout and FeatureCache(out).skipped_ids == [1000]


def test_decode_failure_stops_with_one_line_and_a_skip_rerun_resumes(tmp_path, capsys):
    data, images, ids = _make_dataset(tmp_path, 32)
    bad = images / "20.png"
    Image.new("F", (SIZE, SIZE)).save(bad, "TIFF")
    out = tmp_path / "features.h5"
    args = ["--data", data, "--images", images, "--out", out, *ENCODER_ARGS]
    code, _, err = _run(capsys, *args)
    err = _user_error(code, err)
    assert err.count("\n") == 1 and str(bad) in err and "image id 1020" in err
    assert "16 images encoded so far are kept" in err
    assert partial_cache_path(out).is_file() and not out.exists()

    code, stdout, err = _run(capsys, *args, "--on-error", "skip")
    assert code == 0, err
    assert "resuming: 16 of 32 images already encoded" in stdout
    assert "encoded 15 images in this run" in stdout
    assert FeatureCache(out).skipped_ids == [1020]


def _reference_run(tmp_path, capsys, data, images):
    """An uninterrupted run: its cache path, arguments, cache contents and encoder weights.
    The cache and weights are then deleted, so that the same command encodes again."""
    out = tmp_path / "features.h5"
    args = ["--data", data, "--images", images, "--out", out, *ENCODER_ARGS]
    assert _run(capsys, *args)[0] == 0
    made = out, args, _cache_contents(out), fx.encoder_weights_path(out).read_bytes()
    out.unlink()
    fx.encoder_weights_path(out).unlink()
    return made


def test_a_weights_file_is_the_same_weights_under_any_spelling_of_its_path(
        tmp_path, capsys, monkeypatch):
    data, images, _ = _make_dataset(tmp_path, 4)
    monkeypatch.chdir(tmp_path)
    weights = tmp_path / "enc.pt"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)
    options = [*ENCODER_ARGS]
    options[options.index("none")] = "enc.pt"
    args = ["--data", data, "--images", images, "--out", "features.h5", *options]
    assert _run(capsys, *args)[0] == 0
    for spelling in ("./enc.pt", str(weights)):
        args[args.index("--weights") + 1] = spelling
        code, stdout, err = _run(capsys, *args)
        assert code == 0 and "nothing to do" in stdout, err
    # Other bytes under the same name are other weights.
    state = torchvision.models.resnet18(weights=None).state_dict()
    state["conv1.weight"] += 1
    torch.save(state, weights)
    code, _, err = _run(capsys, *args)
    assert "is a finished cache made with other settings (weights 'enc.pt' there" in (
        _user_error(code, err))


def test_a_finished_cache_is_reused_with_its_settings_and_kept_from_others(tmp_path, capsys):
    data, images, _ = _make_dataset(tmp_path, 12)
    out = tmp_path / "features.h5"
    args = ["--data", data, "--images", images, "--out", out, *ENCODER_ARGS]
    assert _run(capsys, *args)[0] == 0
    made = out.read_bytes(), fx.encoder_weights_path(out).read_bytes()

    code, stdout, err = _run(capsys, *args)  # the same command again: nothing to do
    assert code == 0, err
    assert "is complete already (12 images" in stdout and "nothing to do" in stdout
    assert "wrote" not in stdout
    # How it was computed is not what it holds: another batch size has nothing to do either.
    code, stdout, err = _run(capsys, *args, "--batch-size", "3")
    assert code == 0 and "nothing to do" in stdout, err
    for other in (["--seed", "1"], ["--image-size", "32"], ["--splits", "train"]):
        code, _, err = _run(capsys, *args, *other)
        err = _user_error(code, err)
        assert "is a finished cache made with other settings" in err, other
        assert "delete it to encode again" in err
    assert "seed 0 there, 1 now" in _run(capsys, *args, "--seed", "1")[2]
    # A split file that numbers other images alike (two datasets from prepare-dataset).
    raw = json.loads(Path(data).read_text())
    first, second = raw["images"][:2]
    first["filename"], second["filename"] = second["filename"], first["filename"]
    renumbered = tmp_path / "dataset_other.json"
    renumbered.write_text(json.dumps(raw))
    code, _, err = _run(capsys, "--data", renumbered, *args[2:])
    assert "the same image ids name other images" in _user_error(code, err)
    assert (out.read_bytes(), fx.encoder_weights_path(out).read_bytes()) == made

    stranger = tmp_path / "notes.h5"
    stranger.write_text("my notes")
    code, _, err = _run(capsys, "--data", data, "--images", images, "--out", stranger,
                        *ENCODER_ARGS)
    assert "exists and is not a feature cache" in _user_error(code, err)
    assert stranger.read_text() == "my notes"


@pytest.mark.slow
def test_resume_reuses_the_random_encoder_and_refuses_other_settings(tmp_path, capsys,
                                                                     monkeypatch):
    data, images, _ = _make_dataset(tmp_path, 48)
    out, args, reference, reference_weights = _reference_run(tmp_path, capsys, data, images)

    # Interrupt after three batches (Ctrl-C): the partial cache and weights are kept.
    original_add, calls = fx.FeatureCacheWriter.add, []

    def interrupted_add(self, *a, **k):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        original_add(self, *a, **k)

    monkeypatch.setattr(fx.FeatureCacheWriter, "add", interrupted_add)
    code, _, err = _run(capsys, *args)
    assert code == 130 and "run the same command again" in err
    monkeypatch.setattr(fx.FeatureCacheWriter, "add", original_add)
    assert partial_cache_path(out).is_file()

    code, _, err = _run(capsys, *args, "--batch-size", "16")
    err = _user_error(code, err)
    assert "batch_size 8 there, 16 now" in err and "delete it to start over" in err

    # A resumed run must not calibrate again: a different encoder would change the features.
    def other_encoder(*a, **k):
        raise AssertionError("the random encoder was made again instead of reused")

    monkeypatch.setattr(random_encoder, "_calibrated_random_resnet", other_encoder)
    code, stdout, err = _run(capsys, *args)
    assert code == 0, err
    assert "resuming: 24 of 48 images already encoded" in stdout
    assert "encoded 24 images in this run" in stdout
    ids, attrs, features = _cache_contents(out)
    assert ids == reference[0] and attrs == reference[1]
    assert features.tobytes() == reference[2].tobytes()
    assert fx.encoder_weights_path(out).read_bytes() == reference_weights
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "data.json", "features.encoder.pt", "features.h5", "images"]


@pytest.mark.parametrize("damage", ["garbage", "checksum"])
def test_a_damaged_partial_cache_is_started_over_with_a_message(tmp_path, capsys, damage):
    data, images, ids = _make_dataset(tmp_path, 24)
    out = tmp_path / "features.h5"
    args = ["--data", data, "--images", images, "--out", out, *ENCODER_ARGS]
    Image.new("F", (SIZE, SIZE)).save(images / "12.png", "TIFF")  # fails when decoded
    assert _run(capsys, *args)[0] == 2  # 8 images committed
    partial = partial_cache_path(out)
    if damage == "garbage":
        partial.write_bytes(b"\0" * 4096)
        expected = "cannot be read"
    else:
        with h5py.File(partial, "a") as file:
            assert json.loads(file.attrs["progress"])["rows"] == 8
            file["features"][3] += 1
        expected = "is damaged (checksum"
    (images / "12.png").unlink()
    Image.new("RGB", (SIZE, SIZE)).save(images / "12.png")
    code, stdout, err = _run(capsys, *args)
    assert code == 0, err
    assert f"starting over: {partial} {expected}" in stdout
    assert "encoded 24 images in this run" in stdout
    assert FeatureCache(out).image_ids == ids


def test_a_finished_cache_is_reused_without_loading_its_weights(tmp_path, capsys,
                                                                monkeypatch):
    # Offline, named weights cannot load: a finished cache must not need them again.
    import captioner.model.encoder as encoder_module

    data, images, _ = _make_dataset(tmp_path, 8)
    weights = tmp_path / "r18.pt"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    args = ["--data", data, "--images", images, "--out", tmp_path / "features.h5",
            *ENCODER_ARGS, "--weights", weights]
    assert _run(capsys, *args)[0] == 0

    def unloadable(*a, **k):
        raise AssertionError("the encoder was loaded for a finished cache")

    monkeypatch.setattr(encoder_module, "build_encoder", unloadable)
    code, stdout, err = _run(capsys, *args)
    assert code == 0, err
    assert "nothing to do" in stdout


def test_a_second_run_into_a_cache_being_made_is_refused_and_touches_nothing(tmp_path, capsys):
    """Two runs into one cache: the second would read, or start over on, the partial file and
    the random encoder's weights that the first is writing."""
    from data_prep.features import cache_lock_path
    from data_prep.locks import hold_exclusively, let_go

    data, images, ids = _make_dataset(tmp_path, 8)
    out = tmp_path / "features.h5"
    args = ["--data", data, "--images", images, "--out", out, *ENCODER_ARGS]
    lock = cache_lock_path(out)
    held = hold_exclusively(lock)  # as the first run holds it, from another process
    pid = os.fork()
    if pid == 0:  # the second run
        code, _, err = _run(capsys, *args)
        os._exit(0 if code == 2 and err == (
            f"captioner prepare-features: {out}: another run is making this cache now (it "
            f"holds {lock}); wait for it to end, or stop it\n") else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".features.lock", "data.json",
                                                          "images"]
    let_go(held)
    code, _, err = _run(capsys, *args)
    assert code == 0, err
    assert FeatureCache(out).image_ids == ids and not lock.exists()


@pytest.mark.subprocess
def test_sigkill_then_rerun_equals_an_uninterrupted_run(tmp_path, capsys):
    data, images, _ = _make_dataset(tmp_path, 160)
    out, args, reference, reference_weights = _reference_run(tmp_path, capsys, data, images)

    command = [sys.executable, "-m", "captioner.cli", "prepare-features", *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    partial, committed, deadline = partial_cache_path(out), 0, time.monotonic() + 120
    try:
        while committed < 40 and time.monotonic() < deadline and process.poll() is None:
            committed = _committed_rows(partial)
            time.sleep(0.01)
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()
    assert process.returncode == -signal.SIGKILL, "finished before it could be killed"
    assert 40 <= committed < 160
    weights_at_kill = fx.partial_weights_path(out).read_bytes()
    assert weights_at_kill == reference_weights

    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    done = int(re.search(r"resuming: (\d+) of 160 images already encoded", rerun.stdout)[1])
    assert committed <= done < 160 and done % 8 == 0
    assert f"encoded {160 - done} images in this run" in rerun.stdout
    ids, attrs, features = _cache_contents(out)
    assert ids == reference[0] and attrs == reference[1]
    assert features.tobytes() == reference[2].tobytes()
    assert fx.encoder_weights_path(out).read_bytes() == reference_weights
    assert _mode(out) == 0o644 and _mode(fx.encoder_weights_path(out)) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "data.json", "features.encoder.pt", "features.h5", "images"]


def _committed_rows(partial: Path) -> int:
    """Rows the partial file commits, read while another process writes it (0 when it cannot
    be read at this instant)."""
    try:
        with h5py.File(partial, "r", locking=False) as file:
            return json.loads(file.attrs["progress"])["rows"]
    except (OSError, KeyError, ValueError, RuntimeError):
        return 0


def test_user_errors_are_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    data, images, _ = _make_dataset(tmp_path, 4)
    base = ["--data", data, "--images", images]
    (tmp_path / "folder.h5").mkdir()
    (tmp_path / "file").write_text("x")
    cases = [
        (["--out", tmp_path / "folder.h5", *ENCODER_ARGS], "folder.h5: is a folder"),
        (["--out", tmp_path / "file" / "sub" / "f.h5", *ENCODER_ARGS], "cannot write to"),
        (["--out", tmp_path / "f.h5", *ENCODER_ARGS, "--arch", "resnet7"],
         "unknown encoder arch 'resnet7'; valid: resnet18"),
        (["--out", tmp_path / "f.h5", *ENCODER_ARGS, "--layer", "layer2"],
         "unknown encoder layer 'layer2'; valid: layer3, layer4"),
        (["--out", tmp_path / "f.h5", *ENCODER_ARGS, "--batch-size", "0"],
         "batch size must be an integer >= 1"),
        (["--out", tmp_path / "f.h5", *ENCODER_ARGS, "--splits", "train,dev"], "unknown split"),
        (["--out", tmp_path / "f.h5", *ENCODER_ARGS, "--weights", "IMAGENET9"],
         "unknown weights 'IMAGENET9' for resnet18"),
    ]
    for args, message in cases:
        code, _, err = _run(capsys, *base, *args)
        err = _user_error(code, err)
        assert message in err and err.count("\n") == 1, err
    code, _, err = _run(capsys, "--data", data, "--images", tmp_path / "pics", "--out",
                        tmp_path / "f.h5", *ENCODER_ARGS)
    err = _user_error(code, err)
    assert f"{tmp_path / 'pics'}: image folder not found" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:
        _run(capsys, *base, "--out", tmp_path / "f.h5", *ENCODER_ARGS, "--splits", " , ")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "captioner prepare-features: error: argument --splits: ' , ' names no split\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json", "file", "folder.h5",
                                                          "images"]

    # Offline without the pretrained weights in the hub cache.
    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    previous = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path / "hub"))
    try:
        code, _, err = _run(capsys, *base, "--out", tmp_path / "f.h5", "--arch", "resnet18",
                            "--weights", "IMAGENET1K_V1", "--num-workers", "0")
    finally:
        torch.hub.set_dir(previous)
    err = _user_error(code, err)
    assert err.count("\n") == 1
    assert str(tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth") in err
    assert "--weights none" in err and "local state_dict file" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_read_only_output_folder(tmp_path, capsys):
    data, images, _ = _make_dataset(tmp_path, 4)
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    code, _, err = _run(capsys, "--data", data, "--images", images, "--out", folder / "f.h5",
                        *ENCODER_ARGS)
    assert "cannot write to the folder" in _user_error(code, err)


def test_help_shows_every_default_and_no_markup(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and ":func:" not in text
    text = text[text.index("\noptions:"):]
    for option, default in [("--arch", "resnet101"), ("--layer", "layer4"),
                            ("--weights", "IMAGENET1K_V2"), ("--image_size", "256"),
                            ("--splits", "train,val,test"), ("--batch_size", "32"),
                            ("--num_workers", "2"), ("--seed", "0"), ("--on_error", "fail")]:
        block = " ".join(text[text.index(f"  {option}"):].split("\n  --", 1)[0].split())
        assert f"default: {default})" in block, (option, block)
    assert "--no_progress" in text


@pytest.mark.parametrize(("cpus", "workers"), [({0}, 1), ({0, 1}, 2), (set(range(16)), 2)])
def test_default_workers_fit_the_usable_cpus(cpus, workers, monkeypatch):
    """No more loader processes by default than CPUs to run them: torch warns (three times per
    run) when there are."""
    from captioner.commands import prepare_features

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus)
    args = prepare_features.build_parser().parse_args(
        ["--data", "d", "--images", "i", "--out", "o"])
    assert args.num_workers == workers


def test_a_wrong_image_root_is_named_as_such(tmp_path, capsys):
    data, images, _ = _make_dataset(tmp_path, 6)
    wrong = tmp_path / "elsewhere"
    wrong.mkdir()
    out = tmp_path / "out" / "features.h5"
    code, _, err = _run(capsys, "--data", data, "--images", wrong, "--out", out, *ENCODER_ARGS)
    _user_error(code, err)
    [line] = err.splitlines()
    assert f"--images {wrong}: none of the 6 images of {data} can be used (the first, " in line
    assert line.endswith("is --images the folder that the split file's paths are relative to?")
    assert "--on-error skip" not in line and not out.exists()


def test_the_commands_error_policies_are_the_extractions():
    """prepare-features offers the --on_error choices that extract_features takes."""
    import typing

    from captioner.features.preparation import prepare_feature_cache
    from captioner.features.settings import ON_ERROR

    kind = typing.get_type_hints(prepare_feature_cache)["on_error"]
    assert typing.get_args(kind) == ON_ERROR
