"""What made a cache (its resume key: the settings, the ordered image ids, the weights file's
content hash), and whether a cache or a partial cache already at the destination matches this
run's: a finished one made with these settings from these images is kept, anything else holding
work is refused, saying what differs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captioner.features.settings import FeatureExtractionError
from data_prep.features import FeatureCache, partial_cache_path, partial_resume_key
from data_prep.hashes import file_sha256

# How a cache is computed, not what it holds: a finished cache serves any of them. A partial
# cache is only resumed with its own, so that its rows match an uninterrupted run's bitwise.
_EXECUTION_SETTINGS = frozenset({"batch_size", "device"})


def cache_key(settings: dict[str, Any], image_ids: Sequence[int]) -> dict[str, Any]:
    """The resume key of a cache of ``image_ids`` made with ``settings``
    (:meth:`~captioner.features.settings.FeatureSettings.recorded`); a local weights file is
    recorded by its content (SHA-256) too, so that its path's spelling does not matter."""
    digest = hashlib.sha256(json.dumps(list(image_ids)).encode()).hexdigest()
    key = {"settings": settings, "images": {"count": len(image_ids), "ids_sha256": digest}}
    weights = settings["weights"]
    if weights is not None and Path(weights).is_file():
        key["weights_sha256"] = file_sha256(weights)
    return key


def _differences(recorded: dict[str, Any], key: dict[str, Any],
                 ignore: frozenset[str] = frozenset()) -> list[str]:
    """What differs between a cache's recorded resume key and this run's (settings, images),
    but for the settings named in ``ignore``; a weights file is the same weights by its content
    (the SHA-256 both record), under any path, and other weights under the same path."""
    differences = []
    before, now = recorded.get("settings") or {}, key["settings"]
    same_file = recorded.get("weights_sha256") is not None and (
        recorded.get("weights_sha256") == key.get("weights_sha256"))
    for name in sorted((before.keys() | now.keys()) - ignore):
        if name == "weights" and same_file:
            continue
        if before.get(name) != now.get(name):
            differences.append(f"{name} {before.get(name)!r} there, {now.get(name)!r} now")
    # A weights file replaced at the same path is other weights: its rows would be stale.
    if recorded.get("weights_sha256") and key.get("weights_sha256") and not same_file:
        differences.append(f"the weights file's content (SHA-256 {recorded['weights_sha256'][:12]}"
                           f"... there, {key['weights_sha256'][:12]}... now)")
    if recorded.get("images") != key["images"]:
        count = (recorded.get("images") or {}).get("count")
        differences.append(f"another list of images ({count} there, {key['images']['count']} now)")
    return differences


def finished_cache(out: Path, key: dict[str, Any],
                   names: dict[int, str]) -> FeatureCache | None:
    """The finished cache at ``out`` when these settings made it from these images, by id
    and, where it recorded them, by ``names`` (nothing to do); None when ``out`` does not
    exist. Any other file there holds work (hours of it, at COCO scale, and runs trained on
    it): refused, saying what differs."""
    if not out.exists():
        return None
    try:
        cache = FeatureCache(out)
    except ValueError as exc:
        raise FeatureExtractionError(
            f"{out} exists and is not a feature cache this command made ({exc}); give another "
            "--out, or move it away"
        ) from None
    differences = _differences(cache.resume_key or {}, key, ignore=_EXECUTION_SETTINGS)
    recorded = cache.image_names()
    same_ids = (cache.resume_key or {}).get("images") == key["images"]
    if same_ids and recorded is not None and recorded != names:
        differences.append("the same image ids name other images")
    if differences:
        raise FeatureExtractionError(
            f"{out} is a finished cache made with other settings ({'; '.join(differences)}); "
            "give another --out, or delete it to encode again (runs trained on it then no "
            "longer match it)"
        )
    return cache


def refuse_other_partial(out: Path, key: dict[str, Any]) -> None:
    """A partial cache made with other settings or for other images holds work that a run with
    these settings would throw away: refuse, and say what differs."""
    recorded = partial_resume_key(out)
    if recorded is None:
        return
    differences = _differences(recorded, key)
    if differences:
        raise FeatureExtractionError(
            f"{partial_cache_path(out)} is an unfinished cache made with other settings "
            f"({'; '.join(differences)}): rerun with its settings to finish it, or delete it "
            "to start over"
        )
