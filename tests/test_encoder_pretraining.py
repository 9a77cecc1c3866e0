"""Encoder pretraining: per-cell labels from instance masks (by hand), aligned crops, and
``captioner pretrain-encoder`` -> ``captioner prepare-features --weights`` through the CLI."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from pycocotools import mask as mask_utils
from turned_photo import turned_photo

from captioner.features.pretraining import CellLabelledImages
from captioner.features.pretraining_settings import PretrainingSettings
from captioner.model.encoder import EncoderWeightsError, build_encoder
from data_prep.cell_labels import MIN_COVER, CellLabeller, downsample_mask
from data_prep.features import FeatureCache


def _instances(path, annotations, size=64):
    """An instances file of one image (id 1, ``size`` px square) with these annotations, and
    that image (black, beside the file): (file, {1: image})."""
    def rle(mask):
        encoded = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        return {"size": list(encoded["size"]), "counts": encoded["counts"].decode("ascii")}

    path.write_text(json.dumps({
        "images": [{"id": 1, "width": size, "height": size, "file_name": "a.png"}],
        "categories": [{"id": 1, "name": "circle"}, {"id": 2, "name": "square"}],
        "annotations": [
            {"id": k + 1, "image_id": 1, "category_id": category, "segmentation": rle(mask),
             "area": float(mask.sum()), "bbox": [0, 0, 1, 1], "iscrowd": 0, **extra}
            for k, (category, mask, extra) in enumerate(annotations)
        ],
    }))
    image = path.with_suffix(".png")
    Image.new("RGB", (size, size)).save(image)
    return path, {1: image}


def test_cell_labels_by_hand(tmp_path):
    square = np.zeros((64, 64), dtype=bool)
    square[0:32, 0:24] = True  # cells (16 px) of column 0 fully, column 1 half: labelled
    circle = np.zeros((64, 64), dtype=bool)
    circle[40:64, 48:64] = True  # row 2 half (8 of 16 rows), row 3 fully, column 3
    path = _instances(tmp_path / "instances.json", [
        (2, square, {"colour": "red", "size": "large"}),
        (1, circle, {"colour": "blue", "size": "small"}),
    ])
    labeller = CellLabeller.load(*path)
    assert labeller.classes == {
        "category": ("none", "circle", "square"),
        "colour": ("none", "blue", "red"),
        "size": ("none", "large", "small"),
    }
    labels = labeller.labels(1, (4, 4))
    category = np.zeros((4, 4), dtype=np.int64)
    category[0:2, 0:2] = 2  # square; column 1 is covered at exactly half: labelled
    category[2:4, 3] = 1  # circle: row 2 covered at half
    np.testing.assert_array_equal(labels[0], category)
    np.testing.assert_array_equal(labels[1], np.where(category == 2, 2, np.where(category, 1, 0)))
    np.testing.assert_array_equal(labels[2], np.where(category == 2, 1, np.where(category, 2, 0)))
    # Less than half a cell: no object.
    assert CellLabeller.load(*path).labels(1, (2, 2))[0].tolist() == [[2, 0], [0, 0]]
    with pytest.raises(KeyError, match="image 7 was not loaded from the instances file"):
        labeller.labels(7, (4, 4))


@pytest.mark.parametrize("orientation", [3, 6])
def test_cell_labels_lie_over_the_photo_as_the_encoder_sees_it(tmp_path, orientation):
    """A photo stored turned: the labels follow its pixels once load_image has turned them."""
    path, images, shown = turned_photo(tmp_path, orientation)
    labels = CellLabeller.load(path, images).labels(1, (4, 4))
    on_object = downsample_mask(shown, (4, 4)) >= MIN_COVER
    assert on_object.any() and not on_object.all()
    np.testing.assert_array_equal(labels[0], np.where(on_object, 1, 0))  # class 1: square


def test_other_split_uses_the_training_classes_and_refuses_new_ones(tmp_path):
    mask = np.zeros((64, 64), dtype=bool)
    mask[:32, :32] = True
    train = CellLabeller.load(*_instances(tmp_path / "train.json", [
        (1, mask, {"colour": "red", "size": "large"}),
        (2, ~mask, {"colour": "blue", "size": "small"}),
    ]))
    val = CellLabeller.load(
        *_instances(tmp_path / "val.json", [(1, mask, {"colour": "blue", "size": "small"})]),
        train.classes,
    )
    assert val.classes == train.classes  # blue is class 1 in both, though val lacks red
    assert val.labels(1, (2, 2))[1, 0, 0] == train.classes["colour"].index("blue")
    with pytest.raises(ValueError,
                       match=r"colour green not among the training classes \(none, blue, red\)$"):
        CellLabeller.load(*_instances(tmp_path / "val2.json", [
            (1, mask, {"colour": "green", "size": "small"})]), train.classes)


def _annotation(index, **change):
    """A change to ``annotations[index]`` of the document of the mask-checking cases."""
    return lambda document: document["annotations"][index].update(change)


# (case, damage to a valid instances file, how its one-line error goes on after "PATH: ").
_BAD_MASKS = [
    ("text", _annotation(0, segmentation="hello"), "annotations[0].segmentation must be a list "
     "of polygons or an RLE object (size, counts), got str 'hello'"),
    ("no_polygon", _annotation(0, segmentation=[]),
     "annotations[0].segmentation is an empty list of polygons"),
    ("four_numbers", _annotation(0, segmentation=[[0, 0, 5, 5]]),
     "annotations[0].segmentation[0] must be a flat list of an even number (at least 6) of x, y "
     "coordinates, got [0, 0, 5, 5]"),
    ("odd_length", _annotation(0, segmentation=[[0, 0, 5, 0, 5, 5, 0]]),
     "annotations[0].segmentation[0] must be a flat list of an even number (at least 6)"),
    ("pairs", _annotation(0, segmentation=[[[0, 0], [5, 0], [5, 5], [0, 5], [0, 0], [1, 1]]]),
     "annotations[0].segmentation[0][0] must be a finite number, got [0, 0]"),
    ("bool", _annotation(0, segmentation=[[0, 0, True, 0, 5, 5]]),
     "annotations[0].segmentation[0][2] must be a finite number, got True"),
    ("nan", _annotation(0, segmentation=[[0, 0, float("nan"), 0, 10, 10]]),  # hung pycocotools
     "annotations[0].segmentation[0][2] must be a finite number, got nan"),
    ("huge", _annotation(0, segmentation=[[0, 0, 1e12, 0, 1e12, 1e12]]),  # crashed pycocotools
     "annotations[0].segmentation[0] has the point (1000000000000.0, 0) far outside its image "
     "(10 x 8)"),
    ("below", _annotation(0, segmentation=[[0, 0, 5, 0, 5, -8.5]]),
     "annotations[0].segmentation[0] has the point (5, -8.5) far outside its image (10 x 8)"),
    ("no_counts", _annotation(1, segmentation={"size": [8, 10]}),
     "annotations[1].segmentation (RLE) lacks field 'counts'"),
    ("size_text", lambda d: d["annotations"][1]["segmentation"].update(size="8x10"),
     "annotations[1].segmentation.size must be [height, width], got '8x10'"),
    ("garbage_counts", lambda d: d["annotations"][1]["segmentation"].update(counts="!!!"),
     "annotations[1].segmentation.counts '!!!' is not a compressed RLE string (pycocotools')"),
    ("short_counts", lambda d: d["annotations"][1]["segmentation"].update(counts="0"),
     "annotations[1].segmentation.counts '0' covers 0 pixels, not the 80 of its size 8 x 10"),
    ("short_list", lambda d: d["annotations"][1]["segmentation"].update(counts=[5, 7]),
     "annotations[1].segmentation.counts [5, 7] covers 12 pixels, not the 80 of its size 8 x 10"),
    ("negative_run", lambda d: d["annotations"][1]["segmentation"].update(counts=[85, -5]),
     "annotations[1].segmentation.counts[1] must be a non-negative integer, got -5"),
    ("number_counts", lambda d: d["annotations"][1]["segmentation"].update(counts=80),
     "annotations[1].segmentation.counts must be a list of run lengths or a compressed RLE "
     "string, got int 80"),
    ("other_size", lambda d: d["annotations"][1]["segmentation"].update(size=[10, 8]),
     "annotations[1].segmentation.size [10, 8] is not [8, 10], the height and width of its "
     "image 1"),
    ("same_id", _annotation(1, id=1), "annotations[1].id 1 is also the id of annotations[0]"),
    ("no_id", lambda d: d["annotations"][0].pop("id"), "annotations[0] lacks field 'id'"),
    ("crowd_2", _annotation(1, iscrowd=2), "annotations[1].iscrowd must be 0 or 1, got 2"),
    ("crowd_bool", _annotation(0, iscrowd=True), "annotations[0].iscrowd must be 0 or 1, got True"),
]


@pytest.mark.parametrize(("damage", "message"), [case[1:] for case in _BAD_MASKS],
                         ids=[case[0] for case in _BAD_MASKS])
def test_a_mask_pycocotools_cannot_draw_is_named_before_it_sees_it(tmp_path, damage, message):
    """Bad polygons and RLE masks crashed, hung or failed pycocotools without naming the
    annotation: they are refused on loading, in one line naming the file and annotation."""
    mask = np.zeros((8, 10), dtype=np.uint8)
    mask[2:6, 3:9] = 1
    encoded = mask_utils.encode(np.asfortranarray(mask))
    document = {
        "images": [{"id": 1, "width": 10, "height": 8, "file_name": "a.png"}],
        "categories": [{"id": 1, "name": "square"}],
        "annotations": [  # a polygon overshooting the image's edges a little, and an RLE mask
            {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0,
             "segmentation": [[-0.5, -1, 10.5, -1, 10.5, 3, -0.5, 3]]},
            {"id": 2, "image_id": 1, "category_id": 1,
             "segmentation": {"size": [8, 10], "counts": encoded["counts"].decode("ascii")}},
        ],
    }
    images = {1: tmp_path / "a.png"}
    Image.new("RGB", (10, 8)).save(images[1])
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(document))
    assert CellLabeller.load(path, images).labels(1, (2, 2))[0].tolist() == [[1, 1], [0, 0]]
    damage(document)
    path.write_text(json.dumps(document))  # NaN as JSON writes and reads it
    with pytest.raises(ValueError) as error:
        CellLabeller.load(path, images)
    assert str(error.value).startswith(f"{path}: {message}"), str(error.value)
    assert "\n" not in str(error.value)


def test_crops_keep_pixels_and_labels_aligned():
    torch.manual_seed(0)
    stride, cells = 16, 8
    # Every pixel holds the index of its cell, and so does the label: any crop and flip must
    # keep them equal.
    index = torch.arange(cells * cells).view(cells, cells)
    pixels = index.repeat_interleave(stride, 0).repeat_interleave(stride, 1).to(torch.uint8)
    images = pixels.expand(3, -1, -1).unsqueeze(0).repeat(4, 1, 1, 1)
    labels = index.expand(1, -1, -1).unsqueeze(0).repeat(4, 1, 1, 1).long()
    data = CellLabelledImages(images, labels, stride, crop=64)
    seen = set()
    for i in range(40):
        image, label = data[i % 4]
        assert image.shape == (3, 64, 64) and label.shape == (1, 4, 4)
        centres = image[0, stride // 2::stride, stride // 2::stride].long()
        assert torch.equal(centres, label[0])
        seen.add((int(label[0, 0, 0]), bool(label[0, 0, 1] < label[0, 0, 0])))
    assert len(seen) > 4  # crops move and flip


def test_settings_are_checked():
    with pytest.raises(ValueError, match="crop must be a multiple of 16"):
        PretrainingSettings(crop=100).check()
    with pytest.raises(ValueError, match="image size must be a multiple of 32"):
        PretrainingSettings(layer="layer4", image_size=200, crop=64).check()
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        PretrainingSettings(epochs=0).check()
    # An infinite rate trained an encoder of NaN weights; an arch without ResNet stages
    # ended in an AttributeError.
    for lr in (math.inf, math.nan, 0.0):
        with pytest.raises(ValueError, match=f"lr must be a finite number > 0, got {lr}"):
            PretrainingSettings(lr=lr).check()
    with pytest.raises(ValueError, match="unknown encoder arch 'vgg16'; valid: resnet18, "):
        PretrainingSettings(arch="vgg16").check()


def test_images_that_cannot_fit_in_memory_are_refused_before_they_are_read(
        synthetic_data, monkeypatch):
    import captioner.features.pretraining as pretraining
    from data_prep.karpathy import load_karpathy

    entries = load_karpathy(synthetic_data.karpathy_json, synthetic_data.image_root).split("val")
    monkeypatch.setattr(pretraining, "available_memory", lambda: 2**10)
    monkeypatch.setattr(pretraining, "load_image", None)  # nothing may be read
    with pytest.raises(MemoryError, match=rf"^{len(entries)} images of 256 px need 0\.00 GiB in "
                       r"memory, and 0\.00 GiB is free$"):
        CellLabelledImages.load(entries, None, PretrainingSettings(), crop=None)


def _captioner(*argv, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "captioner.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.subprocess
def test_pretrain_encoder_then_prepare_features_through_the_cli(synthetic_data, tmp_path):
    data = synthetic_data
    run = _captioner(
        "pretrain-encoder", "--data", str(data.karpathy_json), "--images", str(data.image_root),
        "--train-instances", str(data.instances["train"]),
        "--val-instances", str(data.instances["val"]), "--out", "encoder.pt",
        "--image-size", "128", "--crop", "64", "--epochs", "2", "--no-progress", cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "per-cell accuracy on the validation split (4 images)" in run.stdout
    report = json.loads((tmp_path / "encoder.json").read_text())
    assert report["images"] == {"train": 16, "val": 4}
    assert set(report["classes"]) == {"category", "colour", "size"}
    for value in report["val_cell_accuracy"].values():
        assert 0.0 <= value <= 1.0
    # A torchvision state_dict: it loads as encoder weights and differs from a random init.
    trained = build_encoder("resnet18", tmp_path / "encoder.pt", layer="layer3")
    state = torch.load(tmp_path / "encoder.pt", weights_only=True)
    assert "layer3.0.conv1.weight" in state and "fc.weight" in state
    assert torch.equal(trained.trunk[6][0].conv1.weight, state["layer3.0.conv1.weight"])
    # The untrained layer4 is not in it: read as a layer4 encoder's weights, it passed for
    # trained ones (batch-norm statistics never estimated).
    assert not any(key.startswith("layer4.") for key in state)
    run = _captioner(
        "prepare-features", "--data", str(data.karpathy_json), "--images", str(data.image_root),
        "--arch", "resnet18", "--weights", "encoder.pt", "--image-size", "128", "--out",
        "layer4.h5", "--num-workers", "0", "--no-progress", cwd=tmp_path,
    )
    assert run.returncode == 2 and run.stderr == (
        "captioner prepare-features: encoder weights from encoder.pt hold the ResNet up to "
        "layer3, not layer4: set the encoder layer to layer3\n")

    run = _captioner(
        "prepare-features", "--data", str(data.karpathy_json), "--images", str(data.image_root),
        "--arch", "resnet18", "--layer", "layer3", "--weights", "encoder.pt", "--image-size",
        "128", "--out", "features.h5", "--num-workers", "0", "--no-progress", cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert FeatureCache(tmp_path / "features.h5").encoder["weights"] == "encoder.pt"

    # A file of an earlier version held the untrained layer4 too, and loaded for layer4
    # without a word: its report beside it says which layer was trained.
    old = {**state, **{k: v for k, v in torchvision.models.resnet18().state_dict().items()
                       if k.startswith("layer4.")}}
    torch.save(old, tmp_path / "old.pt")
    (tmp_path / "old.json").write_text(json.dumps(report))
    with pytest.raises(EncoderWeightsError, match=re.escape(
            f"encoder weights from {tmp_path / 'old.pt'} were pretrained up to layer3 "
            f"({tmp_path / 'old.json'}), not layer4: the stages after layer3 are untrained; set "
            "the encoder layer to layer3")):
        build_encoder("resnet18", tmp_path / "old.pt", layer="layer4")
    build_encoder("resnet18", tmp_path / "old.pt", layer="layer3")


@pytest.mark.subprocess
def test_pretrain_encoder_bad_input_is_one_line(synthetic_data, tmp_path):
    data = synthetic_data
    run = _captioner(
        "pretrain-encoder", "--data", str(data.karpathy_json), "--images", str(data.image_root),
        "--train-instances", str(tmp_path / "missing.json"),
        "--val-instances", str(data.instances["val"]), "--out", "encoder.pt", cwd=tmp_path,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"captioner pretrain-encoder: instances file not found: {tmp_path / 'missing.json'}"
    ]
    run = _captioner(
        "pretrain-encoder", "--data", str(data.karpathy_json), "--images", str(data.image_root),
        "--train-instances", str(data.instances["train"]),
        "--val-instances", str(data.instances["val"]), "--out", "encoder.pt", "--crop", "100",
        cwd=tmp_path,
    )
    assert run.returncode == 2
    assert "crop must be a multiple of 16" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "encoder.pt").exists()
    (tmp_path / "a_folder.pt").mkdir()  # refused before any image is read or trained on
    run = _captioner(
        "pretrain-encoder", "--data", str(data.karpathy_json), "--images", str(data.image_root),
        "--train-instances", str(data.instances["train"]),
        "--val-instances", str(data.instances["val"]), "--out", "a_folder.pt", cwd=tmp_path,
    )
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "a_folder.pt" in run.stderr and "Traceback" not in run.stderr
    # An --out among the images it reads replaced that image, with --overwrite.
    image = next((data.image_root / "train").iterdir())
    before = image.read_bytes()
    run = _captioner(
        "pretrain-encoder", "--data", str(data.karpathy_json), "--images", str(data.image_root),
        "--train-instances", str(data.instances["train"]),
        "--val-instances", str(data.instances["val"]), "--out", str(image), "--overwrite",
        cwd=tmp_path,
    )
    assert run.returncode == 2 and run.stderr == (
        f"captioner pretrain-encoder: {image}: lies inside the image folder {data.image_root} "
        "this command reads, where it could replace an image; write it elsewhere\n")
    assert image.read_bytes() == before
    # NAME.json is where the report goes: the weights were replaced by it, silently.
    run = _captioner(
        "pretrain-encoder", "--data", str(data.karpathy_json), "--images", str(data.image_root),
        "--train-instances", str(data.instances["train"]),
        "--val-instances", str(data.instances["val"]), "--out", "weights.json", cwd=tmp_path,
    )
    assert run.returncode == 2 and run.stderr == (
        "captioner pretrain-encoder: --out weights.json: the report is written beside the "
        "weights as NAME.json; give the weights another name, such as weights.pt\n")


@pytest.mark.subprocess
def test_no_validation_cell_on_an_object_is_reported_as_undefined(synthetic_data, tmp_path):
    """The accuracies over cells on an object, of none, were NaN: printed as 'nan%' and
    written as NaN, which is not JSON (strict readers refuse the whole file)."""
    data = synthetic_data
    empty = json.loads(data.instances["val"].read_text())
    empty["annotations"] = []
    (tmp_path / "instances_val.json").write_text(json.dumps(empty))
    run = _captioner(
        "pretrain-encoder", "--data", str(data.karpathy_json), "--images", str(data.image_root),
        "--train-instances", str(data.instances["train"]),
        "--val-instances", str(tmp_path / "instances_val.json"), "--out", "encoder.pt",
        "--image-size", "64", "--crop", "32", "--epochs", "1", "--no-progress", cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "nan" not in run.stdout.lower()
    assert "  n/a  of cells on an object" in run.stdout
    assert "(n/a: no cell of the validation images lies on an object)" in run.stdout
    text = (tmp_path / "encoder.json").read_text()
    accuracy = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))[
        "val_cell_accuracy"]
    assert accuracy["all_accuracy_on_objects"] is None
    assert 0.0 <= accuracy["category_accuracy"] <= 1.0


def test_ctrl_c_stops_pretraining_with_one_line_and_status_130(synthetic_data, tmp_path,
                                                               capsys, monkeypatch):
    """Lightning ends a fit stopped by Ctrl-C with exit(1): pretrain-encoder (and the demo's
    pretraining) ended with status 1 and no line of its own."""
    import signal

    from captioner.cli import SIGINT_STATUS, main
    from captioner.features.pretraining import CellClassifier

    def interrupted(self, batch, batch_idx):
        raise KeyboardInterrupt

    monkeypatch.setattr(CellClassifier, "training_step", interrupted)
    monkeypatch.chdir(tmp_path)
    data = synthetic_data
    handler = signal.getsignal(signal.SIGINT)  # Lightning ignores Ctrl-C while it stops
    try:
        code = main(["pretrain-encoder", "--data", str(data.karpathy_json), "--images",
                     str(data.image_root), "--train-instances", str(data.instances["train"]),
                     "--val-instances", str(data.instances["val"]), "--out", "encoder.pt",
                     "--image-size", "64", "--crop", "32", "--epochs", "1", "--no-progress"])
    finally:
        signal.signal(signal.SIGINT, handler)
    assert code == SIGINT_STATUS
    assert capsys.readouterr().err.splitlines()[-1] == "captioner pretrain-encoder: interrupted"
    assert not (tmp_path / "encoder.pt").exists()
