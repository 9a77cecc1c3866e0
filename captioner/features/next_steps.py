"""The "next:" commands that ``prepare-dataset`` and ``prepare-features`` print, so that each
runs as printed: a feature cache named after the dataset and its encoder, a config that fits the
machine (the small CPU config where torch sees no GPU) and the cache's encoder settings given to
``fit`` explicitly, which would otherwise refuse a cache of another encoder than its config's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Setup:
    """A config of ``configs/`` and the frozen encoder its model has (``model.encoder_*``,
    ``data.image_size``), which the feature cache must be made with."""

    config: str
    arch: str
    layer: str
    weights: str
    image_size: int


# The settings of configs/base/cpu_small.yaml and of the paper's configs (the model's defaults,
# configs/base/flickr30k_data.yaml); tests/test_next_steps.py checks them against the files.
CPU_SETUP = Setup("cpu_small_tvmax.yaml", "resnet18", "layer4", "IMAGENET1K_V1", 224)
GPU_SETUP = Setup("flickr30k_tvmax.yaml", "resnet101", "layer4", "IMAGENET1K_V2", 256)


def machine_setup() -> Setup:
    """The setup that trains in reasonable time here: the paper's on a GPU, else the small
    CPU one."""
    import torch

    return GPU_SETUP if torch.cuda.is_available() else CPU_SETUP


def dataset_stem(data: Path) -> str:
    """``data/mine/dataset_mine.json`` -> ``mine``: what caches and runs are named after."""
    return data.stem.removeprefix("dataset_") or data.stem


def cache_path(data: Path, arch: str, layer: str) -> Path:
    """The feature cache of dataset ``data`` for an encoder, beside it, named after both:
    two datasets in one folder, or two encoders of one dataset, get two caches."""
    return data.with_name(f"features_{dataset_stem(data)}_{arch}_{layer}.h5")


def _command(words: list[object]) -> str:
    return " ".join(shlex.quote(str(word)) for word in words)


def prepare_features_command(data: Path, images: Path, setup: Setup) -> str:
    return _command([
        "captioner", "prepare-features", "--data", data, "--images", images,
        "--arch", setup.arch, "--layer", setup.layer, "--weights", setup.weights,
        "--image-size", setup.image_size, "--out", cache_path(data, setup.arch, setup.layer),
    ])


def fit_command(config: str, data: Path, images: Path, cache: Path, encoder: dict) -> str:
    """``captioner fit`` with ``configs/CONFIG`` on dataset ``data`` and the feature cache
    ``cache``, whose encoder settings (``arch``, ``layer``, ``weights``, ``image_size``, as the
    cache records them) are given explicitly; the run is named after the dataset and the
    config's output attention (``mine_tvmax``), not after the config, whose runs of other
    data ``--ckpt_path last`` / ``best`` would otherwise mix with these."""
    from captioner import CONFIGS

    attention = config.removesuffix(".yaml").rsplit("_", 1)[-1]
    return _command([
        "captioner", "fit", "--config", CONFIGS / config,
        "--run_name", f"{dataset_stem(data)}_{attention}",
        "--data.karpathy_json", data, "--data.image_root", images,
        "--data.feature_cache", cache, "--data.image_size", encoder["image_size"],
        "--model.encoder_arch", encoder["arch"], "--model.encoder_layer", encoder["layer"],
        "--model.encoder_weights", encoder["weights"],
    ])


def setup_encoder(setup: Setup) -> dict:
    """The encoder settings of ``setup`` as a feature cache records them."""
    return {"arch": setup.arch, "layer": setup.layer, "weights": setup.weights,
            "image_size": setup.image_size}
