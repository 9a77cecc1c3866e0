"""``captioner evaluate`` reads the features of the feature cache its checkpoint's run trained
on, where the cache was written by the checkpoint's frozen encoder and holds the split, instead
of encoding every image again; it says which features it read, and why not the cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="module")
def cached_run(synthetic_data, tiny_fit, tmp_path_factory):
    """(checkpoint, cache): a tiny captioner trained on a feature cache of its frozen, randomly
    initialized ResNet-18, laid out as fit lays out a run (RUN/config.yaml naming the cache,
    RUN/checkpoints/last.ckpt)."""
    from conftest import TINY_IMAGE_SIZE

    from captioner.features.extraction import extract_features
    from captioner.features.random_encoder import encoder_weights_path

    root = tmp_path_factory.mktemp("cached_run")
    cache = root / "features_resnet18.h5"
    extract_features(synthetic_data.karpathy_json, synthetic_data.image_root, cache,
                     arch="resnet18", weights=None, image_size=TINY_IMAGE_SIZE, batch_size=8,
                     num_workers=0, progress=False)
    trainer, _, _ = tiny_fit(synthetic_data, root, max_steps=2, feature_cache=cache,
                             encoder_weights=str(encoder_weights_path(cache)))
    run = root / "runs" / "tiny" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint = run / "checkpoints" / "last.ckpt"
    trainer.save_checkpoint(checkpoint, weights_only=False)
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"feature_cache": str(cache)}}))
    return checkpoint, cache


def _evaluate(checkpoint: Path, synthetic_data, features: str) -> tuple:
    from captioner.inference.pipeline import Captioner
    from eval.evaluation import evaluate_captioner

    told = []
    report = evaluate_captioner(Captioner.load(checkpoint), synthetic_data.karpathy_json,
                                synthetic_data.image_root, metrics=["Bleu"], progress=False,
                                features=features, on_features=told.append)
    return report, told


def test_the_runs_cache_stands_in_for_the_encoder(cached_run, synthetic_data):
    from captioner.inference.pipeline import Captioner
    from data_prep.features import FeatureCache
    from data_prep.karpathy import load_karpathy

    checkpoint, cache = cached_run
    report, told = _evaluate(checkpoint, synthetic_data, "run")
    assert told == [f"features: the run's cache {cache}, written by this checkpoint's frozen "
                    "encoder (--features images encodes the images instead)"]
    assert report.info["features"] == str(cache)
    # The captions of the cached features, as decoded from them directly.
    ids = [e.image_id for e in load_karpathy(synthetic_data.karpathy_json,
                                             synthetic_data.image_root).split("test")]
    with FeatureCache(cache) as features:
        expected = Captioner.load(checkpoint).caption_cached(features, ids)
    assert [r["caption"] for r in report.results] == [c.text for c in expected]
    images, told = _evaluate(checkpoint, synthetic_data, "images")
    assert told == [] and images.info["features"] == "images"


def test_a_cache_that_cannot_stand_in_is_named_with_the_reason(cached_run, synthetic_data,
                                                               tmp_path):
    import shutil

    checkpoint, cache = cached_run
    run = tmp_path / "runs" / "tiny" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    copy = shutil.copy(checkpoint, run / "checkpoints" / "last.ckpt")
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"feature_cache": None}}))
    _, told = _evaluate(copy, synthetic_data, "run")
    assert told == []  # the run trained on the images: nothing else to say
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"feature_cache": "gone.h5"}}))
    _, told = _evaluate(copy, synthetic_data, "run")
    assert told == ["features: encoding the images (the run's feature cache gone.h5 is gone)"]
    # A cache of another encoder (here: other image size) is not read.
    from captioner.features.extraction import extract_features

    other = tmp_path / "other.h5"
    extract_features(synthetic_data.karpathy_json, synthetic_data.image_root, other,
                     arch="resnet18", weights=None, image_size=64, batch_size=8,
                     num_workers=0, progress=False)
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"feature_cache": str(other)}}))
    report, [line] = _evaluate(copy, synthetic_data, "run")
    assert line.startswith(f"features: encoding the images (feature cache {other} w")
    assert "image_size" in line and "--data" not in line and report.info["features"] == "images"
