"""Whether a feature cache stands in for a model's encoder: cached features are only valid for
the frozen encoder that wrote them (architecture, weights, layer, image size). Training refuses
a cache of another encoder at setup, inference before captioning from it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from data_prep.features import FeatureCache
from data_prep.hashes import file_sha256
from data_prep.settings_files import check_integers

# The encoder settings a feature cache records, and the option that sets each.
CACHE_SETTINGS = {"arch": "model.encoder_arch", "weights": "model.encoder_weights",
                  "image_size": "data.image_size", "layer": "model.encoder_layer"}


def model_settings(hparams: Any, weights: str | None = None) -> dict[str, Any]:
    """The settings :func:`check_feature_cache` compares, of a model's hyperparameters
    ``hparams`` (a checkpoint's, or a LightningModule's ``hparams``); ``weights``: the file
    its encoder was built from, where that is known (default: ``hparams.encoder_weights``)."""
    return {"model.encoder_arch": hparams.encoder_arch,
            "model.encoder_weights": weights or hparams.encoder_weights,
            "data.image_size": hparams.image_size, "model.encoder_layer": hparams.encoder_layer,
            "model.encoder_trainable": hparams.encoder_trainable}


def check_feature_cache(settings: Mapping[str, Any], cache: FeatureCache, *,
                        checkpoint: str | None = None, advice: bool = True) -> None:
    """Refuse a feature cache written by another encoder than the one configured: cached
    features are only valid for the frozen encoder that produced them. A weights file counts
    as the cache's when it is the same path or holds the same bytes (a copy, or the cache and
    its ``NAME.encoder.pt`` moved together).

    Args:
        settings: the configured values by option name: CACHE_SETTINGS' options and
            ``model.encoder_trainable``.
        cache: the feature cache, with the encoder settings it recorded.
        checkpoint: the checkpoint whose model the settings are (``--ckpt_path``), which
            keeps them: the advice is then another cache, not another setting.
        advice: end the message with what a fit should change (False: the mismatch alone,
            for a caller that does not train).

    Raises:
        ValueError: naming the option to set and the value the cache needs.
    """
    path = cache.path
    # A setting that is wrong in itself is named as such, not as a mismatch with the cache.
    check_integers([("data.image_size", settings["data.image_size"], 1)])
    if settings["model.encoder_trainable"]:
        raise ValueError(
            f"data.feature_cache={path} holds features of a frozen encoder, but "
            "model.encoder_trainable is true; drop the cache to fine-tune the encoder"
        )
    # Caches written before the layer was configurable hold layer4 features.
    cached = {"layer": "layer4", **cache.encoder}
    # Every differing setting at once: a cache of another encoder usually differs in several
    # (arch, layer, image size, weights), and one refusal per command would take as many runs.
    differing = [
        (key, option) for key, option in CACHE_SETTINGS.items()
        if not _same_setting(cached.get(key), settings[option],
                             cache.weights_sha256 if key == "weights" else None)
    ]
    if not differing:
        return
    written = ", ".join(f"{key}={cached.get(key)!r}" for key, _ in differing)
    configured = ", ".join(f"{key}={settings[option]!r}" for key, option in differing)
    mismatch = (f"feature cache {path} was written with encoder {written}, but the model has "
                f"{configured}")
    if not advice:
        raise ValueError(mismatch)
    if checkpoint is None:
        told = "to use this cache, set " + ", ".join(
            f"{option} to {_value_to_set(key, cached.get(key), cache)}"
            for key, option in differing)
    else:
        kept = ", ".join(f"{option}={settings[option]}" for _, option in differing)
        told = (f"the model of {checkpoint} keeps {kept}: give a feature cache written with "
                "that encoder, or --data.feature_cache null to read the images")
    raise ValueError(f"{mismatch}; {told}")


def _value_to_set(key: str, cached: Any, cache: FeatureCache) -> Any:
    """The value that the cache's setting ``key`` (recorded as ``cached``) asks for: the
    recorded one, but for weights no longer at the recorded path, the file beside the cache
    that holds them (the cache and its ``NAME.encoder.pt`` moved together), if any."""
    if key != "weights" or not isinstance(cached, str) or Path(cached).exists():
        return cached
    from captioner.features.random_encoder import encoder_weights_path

    beside = encoder_weights_path(cache.path)
    if beside.is_file() and file_sha256(beside) == cache.weights_sha256:
        return str(beside)
    return f"{cached} (no longer there: a copy of it)"


def _same_setting(cached: Any, configured: Any, sha256: str | None = None) -> bool:
    """Equal values, or one weights file: two spellings of its path (relative vs absolute), or
    a configured file holding the bytes whose SHA-256 the cache recorded (``sha256``)."""
    if cached == configured:
        return True
    if not (isinstance(cached, str) and isinstance(configured, str)):
        return False
    if Path(cached).exists() and Path(cached).resolve() == Path(configured).resolve():
        return True
    return sha256 is not None and Path(configured).is_file() and file_sha256(configured) == sha256
