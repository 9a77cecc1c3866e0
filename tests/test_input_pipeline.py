"""The training input pipeline on a feature cache: batched reads, float16 batches, preloading,
and the benchmark that times it in a real fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from captioner.training.datamodule import CaptionDataModule
from data_prep.features import FeatureCache, FeatureCacheWriter

GRID, CHANNELS = (2, 3), 4


@pytest.fixture
def cached_dataset(tmp_path):
    """Karpathy JSON of 6 train (2 captions each, the second of 2 to 4 tokens) and 2 val images,
    and their feature cache."""
    images = [
        {"imgid": i, "cocoid": 100 + i, "filepath": "x", "filename": f"{i}.jpg",
         "split": "train" if i < 6 else "val",
         "sentences": [{"tokens": ["a", f"w{i}"], "raw": f"a w{i}"},
                       {"tokens": ["b", *[f"w{i}"] * (1 + i % 3)],
                        "raw": " ".join(["b", *[f"w{i}"] * (1 + i % 3)])}]}
        for i in range(8)
    ]
    karpathy = tmp_path / "dataset.json"
    karpathy.write_text(json.dumps({"dataset": "coco", "images": images}))
    features = np.random.default_rng(0).normal(size=(8, *GRID, CHANNELS)).astype(np.float16)
    cache = tmp_path / "features.h5"
    with FeatureCacheWriter(cache, grid=GRID, channels=CHANNELS, encoder={"arch": "x"}) as writer:
        writer.add([100 + i for i in range(8)], features)
    return karpathy, cache, features


def _module(karpathy, cache, **kwargs):
    module = CaptionDataModule(karpathy, karpathy.parent, feature_cache=cache, min_count=1,
                               batch_size=5, eval_batch_size=3, num_workers=0, **kwargs)
    module.setup("fit")
    return module


@pytest.mark.parametrize("preload", [False, True])
def test_a_training_batch_holds_the_sampled_pairs_padded_to_its_longest(cached_dataset, preload):
    from data_prep.vocab import Vocabulary

    karpathy, cache, features = cached_dataset
    module = _module(karpathy, cache, preload_features=preload)
    train, vocabulary = module.datasets["train"], module.vocabulary
    images = json.loads(karpathy.read_text())["images"][:6]
    pairs = [sentence["tokens"] for image in images for sentence in image["sentences"]]
    indices = [7, 0, 3, 3, 11]  # pair 7 is image 3's second caption
    batch = train.__getitems__(indices)
    assert torch.equal(batch["inputs"], torch.from_numpy(features[[i // 2 for i in indices]]))
    width = max(len(pairs[index]) for index in indices) + 2
    assert batch["captions"].shape == (5, width) and batch["captions"].dtype == torch.long
    for row, index in enumerate(indices):
        caption = [Vocabulary.START_ID, *vocabulary.encode(pairs[index]), Vocabulary.END_ID]
        padding = [Vocabulary.PAD_ID] * (width - len(caption))
        assert batch["captions"][row].tolist() == caption + padding
        inputs, alone = train[index]
        assert torch.equal(inputs, torch.from_numpy(features[index // 2]))
        assert alone.tolist() == caption
    collated = next(iter(module.train_dataloader()))
    assert collated["inputs"].dtype == torch.float16  # the model computes in float32
    assert collated["inputs"].shape == (5, *GRID, CHANNELS)
    val = next(iter(module.val_dataloader()))
    assert val["image_ids"].tolist() == [106, 107]
    assert torch.equal(val["inputs"], torch.from_numpy(features[6:8]))
    assert val["references"][0] == ["a w6", "b w6"]


def test_preloaded_features_are_read_once_and_survive_pickling(cached_dataset, monkeypatch):
    import pickle

    karpathy, cache, features = cached_dataset
    module = _module(karpathy, cache, preload_features=True)
    inputs = module.datasets["train"].inputs
    assert inputs is module.datasets["val"].inputs  # one reader for every split

    def no_file_reads(*args, **kwargs):
        raise AssertionError("read the HDF5 file although the features are in memory")

    monkeypatch.setattr(type(inputs.cache), "get_many", no_file_reads)
    copy = pickle.loads(pickle.dumps(inputs))  # what a spawned worker receives
    entries = module.datasets["train"].entries[:3]
    assert torch.equal(copy.many(entries), torch.from_numpy(features[:3]))


def test_device_preload_carries_rows_and_gathers_the_features_after_the_transfer(
    cached_dataset, monkeypatch
):
    import pickle

    karpathy, cache, features = cached_dataset
    read = _module(karpathy, cache)
    held = _module(karpathy, cache, preload_features="device")
    for loader in ("train_dataloader", "val_dataloader"):
        torch.manual_seed(0)
        expected = list(getattr(read, loader)())
        torch.manual_seed(0)
        carried = list(getattr(held, loader)())
        assert len(carried) == len(expected)
        for rows, batch in zip(carried, expected, strict=True):
            assert rows["inputs"].dtype == torch.long and rows["inputs"].dim() == 1
            gathered = held.on_after_batch_transfer(dict(rows), 0)
            assert gathered["inputs"].dtype == torch.float16
            assert torch.equal(gathered["inputs"], batch["inputs"])
            assert all(torch.equal(gathered[k], batch[k]) for k in batch if k != "inputs"
                       and isinstance(batch[k], torch.Tensor))

    def no_file_reads(*args, **kwargs):
        raise AssertionError("read the HDF5 file although the features are held")

    monkeypatch.setattr(FeatureCache, "get_many", no_file_reads)
    batch = held.on_after_batch_transfer(next(iter(held.val_dataloader())), 0)
    assert torch.equal(batch["inputs"], torch.from_numpy(features[6:8]))
    # A worker receives the rows only, never the held features.
    inputs = held.datasets["train"].inputs
    copy = pickle.loads(pickle.dumps(inputs))
    entries = held.datasets["train"].entries
    assert copy.many(entries[2:4]).tolist() == [2, 3]
    assert len(pickle.dumps(inputs)) < features.nbytes


def test_device_preload_reads_only_the_images_added_since(cached_dataset, monkeypatch):
    from captioner.training.datamodule import DeviceFeatures

    karpathy, cache, features = cached_dataset
    module = _module(karpathy, cache)
    train, val = module.datasets["train"].entries, module.datasets["val"].entries
    held = DeviceFeatures(cache)
    held.preload(train)
    assert torch.equal(held.gather(torch.tensor([5, 0])), torch.from_numpy(features[[5, 0]]))
    reads = []
    original = FeatureCache.get_many
    monkeypatch.setattr(FeatureCache, "get_many",
                        lambda self, ids: reads.append(list(ids)) or original(self, ids))
    held.preload(val + train[:2])  # the train images have their rows already
    assert torch.equal(held.gather(held.many(val + train[:1])),
                       torch.from_numpy(features[[6, 7, 0]]))
    assert reads == [[106, 107]]


def test_device_preload_refuses_features_larger_than_the_free_device_memory(monkeypatch):
    from captioner.training.datamodule import _check_device_memory

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (20 * 2**30, 80 * 2**30))
    # 100,000 images x 8x8x2048 float16 = 26,214,400,000 bytes = 24.4 GiB.
    with pytest.raises(ValueError, match=r"data.preload_features device: the features of "
                       r"100,000 images in f.h5 need 24.4 GiB on cuda:0, which has 20.0 GiB free"):
        _check_device_memory(torch.device("cuda:0"), (100_000, 8, 8, 2048), Path("f.h5"))
    _check_device_memory(torch.device("cuda:0"), (80_000, 8, 8, 2048), Path("f.h5"))  # 19.5 GiB


@pytest.mark.parametrize(("preload", "cache", "message"), [
    ("memory", True, "data.preload_features must be false, true or device, got 'memory'"),
    (True, False, "data.preload_features true preloads cached features: it needs "
                  "data.feature_cache"),
    ("device", False, "data.preload_features device preloads cached features"),
])
def test_a_preload_setting_without_meaning_is_refused(cached_dataset, preload, cache, message):
    karpathy, features_file, _ = cached_dataset
    with pytest.raises(ValueError, match=message):
        CaptionDataModule(karpathy, karpathy.parent, feature_cache=features_file if cache else None,
                          preload_features=preload)


def test_pin_memory_follows_the_setting(cached_dataset):
    karpathy, cache, _ = cached_dataset
    assert not _module(karpathy, cache, pin_memory=False).train_dataloader().pin_memory
    default = _module(karpathy, cache).train_dataloader().pin_memory
    assert default == torch.cuda.is_available()


# 12 images x 5 captions = 15 batches of 4: 20 steps run into a second epoch, and the loader
# alone is timed on the first epoch's batches only.
@pytest.mark.slow
@pytest.mark.parametrize(("steps", "warmup"), [(4, 1), (20, 0)])
def test_bench_fit_times_a_real_fit_against_the_model(tmp_path, capsys, monkeypatch, steps,
                                                      warmup):
    from captioner.benchmarks import model
    from captioner.commands import bench

    model_steps = []
    step = model.train_step
    monkeypatch.setattr(model, "train_step", lambda *a, **k: model_steps.append(step(*a, **k)))
    assert bench.main(["fit", "--images", "12", "--grid", "2", "--vocab-size", "30",
                       "--batch-size", "4", "--steps", str(steps), "--warmup-steps", str(warmup),
                       "--mappings", "softmax", "--num-workers", "0", "--accelerator", "cpu",
                       "--data", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    header, row = [line for line in out.splitlines()
                   if line.startswith(("mapping", "softmax ")) and "phases" not in line]
    assert header.split()[:6] == ["mapping", "loader", "it/s", "loop", "ms", "fit"]
    values = [float(v.rstrip("x")) for v in row.split()[1:]]
    assert len(values) == 8 and all(v > 0 for v in values)
    assert "COCO epoch: 566,747 caption pairs = 141,687 steps" in out
    assert f"steps {warmup + 1}-{steps} timed" in out
    # The model's own step is averaged over as many steps as the fit's, after 3 untimed.
    assert len(model_steps) == 3 + steps - warmup
    # Without --precision, the precision that the config gave the fit.
    assert ", precision 32-true (the config's), loader workers 0, " in out
    assert "loop ms: the training thread's CPU time per loader batch" in out
    # The phases of the fit's steps add up to its time a step, those of the model's own step to
    # its time but the loop's few microseconds.
    phases = next(line for line in out.splitlines() if line.startswith("softmax phases"))
    fit_part, model_part = phases.split(": ", 1)[1].split("; ")
    fit_phases = dict(item.rsplit(" ", 1) for item in fit_part.removeprefix("fit ").split(", "))
    model_phases = dict(item.rsplit(" ", 1) for item in model_part.removeprefix("model ")
                        .split(", "))
    assert list(fit_phases) == ["forward+loss", "backward", "optimizer", "between steps"]
    assert list(model_phases) == ["forward+loss", "backward", "optimizer", "checks"]
    fit_ms, model_ms = values[3], values[4]
    assert sum(map(float, fit_phases.values())) == pytest.approx(fit_ms, rel=0.01, abs=0.02)
    assert sum(map(float, model_phases.values())) == pytest.approx(model_ms, rel=0.1)
    # The data are written once and reused.
    settings = json.loads((tmp_path / "data" / "settings.json").read_text())
    assert settings == {"images": 12, "grid": 2, "channels": 2048, "vocab_size": 30, "seed": 0}


def test_bench_fit_times_the_steps_up_to_the_end_of_the_last_one(monkeypatch):
    """Not the fit's work after its last step (the epoch's checkpoint, then on_train_end)."""
    from types import SimpleNamespace

    from captioner.benchmarks import fit

    now = [10.0]
    monkeypatch.setattr(fit.time, "perf_counter", lambda: now[0])
    timer = fit._step_timer(warmup_steps=2)
    trainer = SimpleNamespace(global_step=0, max_steps=6)
    module = SimpleNamespace(device=torch.device("cpu"))
    for step in range(6):  # a second each, then 0.125 s to the next
        trainer.global_step = step
        timer.on_train_batch_start(trainer, module, None, step)
        now[0] += 0.25
        timer.on_before_backward(trainer, module, None)
        now[0] += 0.5
        timer.on_after_backward(trainer, module)
        now[0] += 0.25
        trainer.global_step = step + 1
        timer.on_train_batch_end(trainer, module, None, None, step)
        now[0] += 0.125
    now[0] += 100.0  # the epoch's end: a checkpoint written
    timer.on_train_end(trainer, module)
    assert (timer.seconds, timer.steps) == (4.375, 4)
    # Steps 3-6, and the 3 gaps between them.
    assert timer.phases.seconds == {"forward+loss": 1.0, "backward": 2.0, "optimizer": 1.0,
                                   "between steps": 0.375}


def test_the_loaders_build_device_batches_in_the_training_process_unless_told(cached_dataset,
                                                                              monkeypatch):
    """Rows of held features take less to index than to receive from a worker; by default no
    more workers than usable CPUs, which they would only contend for (a given number stays)."""
    import os

    karpathy, cache, _ = cached_dataset

    def workers(**settings):
        module = CaptionDataModule(karpathy, karpathy.parent, feature_cache=cache, min_count=1,
                                   **settings)
        module.setup("fit")
        return module.train_dataloader().num_workers, module.val_dataloader().num_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert workers() == workers(preload_features=True) == (4, 4)
    assert workers(preload_features="device") == (0, 0)
    assert workers(preload_features="device", num_workers=2) == (2, 2)
    assert workers(num_workers=0) == (0, 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert workers() == (2, 2)
    assert workers(num_workers=8) == (8, 8)


def test_lightning_advises_no_workers_for_the_loaders_that_need_none(cached_dataset,
                                                                      monkeypatch):
    """Its advice stays for a user's own ``num_workers: 0`` (images, say), where it may help."""
    import warnings
    from types import SimpleNamespace

    from lightning.pytorch.trainer.connectors import data_connector

    karpathy, cache, _ = cached_dataset
    monkeypatch.setattr(data_connector, "suggested_max_num_workers", lambda devices: 8)
    trainer = SimpleNamespace(num_devices=1, reload_dataloaders_every_n_epochs=0)

    def advice(**settings) -> list[str]:
        module = CaptionDataModule(karpathy, karpathy.parent, feature_cache=cache, min_count=1,
                                   **settings)
        module.setup("fit")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            data_connector._worker_check(trainer, module.train_dataloader(), "train_dataloader")
        return [str(w.message) for w in caught if "many workers" in str(w.message)]

    assert len(advice(num_workers=0)) == 1
    assert advice(preload_features="device") == []


def test_a_missing_input_is_named_by_its_setting(cached_dataset, tmp_path):
    karpathy, cache, _ = cached_dataset
    cases = [
        (dict(karpathy_json=tmp_path / "no.json", image_root=karpathy.parent),
         f"data.karpathy_json: {tmp_path / 'no.json'} does not exist"),
        (dict(karpathy_json=karpathy, image_root=tmp_path / "none"),
         f"data.image_root: {tmp_path / 'none'} does not exist"),
        (dict(karpathy_json=karpathy, image_root=karpathy.parent,
              feature_cache=tmp_path / "f.h5"),
         f"data.feature_cache: {tmp_path / 'f.h5'} does not exist"),
    ]
    for settings, message in cases:
        with pytest.raises(FileNotFoundError) as raised:
            CaptionDataModule(**settings).prepare_data()
        assert str(raised.value) == message


def test_images_missing_from_every_split_of_the_stage_are_named_together(cached_dataset,
                                                                        tmp_path):
    """fit's refusal named the train split's missing images alone, by id; the val split's
    came only after those were mended; an empty image file stopped the epoch that read it."""
    karpathy, cache, _ = cached_dataset
    from PIL import Image

    (tmp_path / "x").mkdir()
    for i in (0, 1, 2, 4, 6):  # 3.jpg (train) is empty, 5.jpg (train) and 7.jpg (val) missing
        Image.new("RGB", (8, 6)).save(tmp_path / "x" / f"{i}.jpg")
    (tmp_path / "x" / "3.jpg").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as error:
        CaptionDataModule(karpathy, karpathy.parent, min_count=1, num_workers=0).setup("fit")
    folder = tmp_path / "x"
    assert str(error.value) == (
        f"{karpathy}: 3 image files missing or unusable: {folder / '3.jpg'} (is empty (0 "
        f"bytes)), {folder / '5.jpg'} (file not found), {folder / '7.jpg'} (file not found)")
    partial = tmp_path / "partial.h5"
    with FeatureCacheWriter(partial, grid=GRID, channels=CHANNELS,
                            encoder={"arch": "x"}) as writer:
        writer.add([100 + i for i in (0, 1, 2, 3, 4, 6)],
                   np.zeros((6, *GRID, CHANNELS), np.float16))
    with pytest.raises(FileNotFoundError) as error:
        _module(karpathy, partial).setup("fit")
    assert str(error.value) == (f"{karpathy}: 2 images missing from the feature cache {partial} "
                                "(id and file): 105 (x/5.jpg), 107 (x/7.jpg)")
