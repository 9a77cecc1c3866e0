"""Encode the images of a Karpathy split once with a frozen ResNet and cache their grid features
(the library behind ``captioner prepare-features``; cache format: :mod:`data_prep.features`).

:func:`extract_features` is built for COCO scale (123k images, hours of encoding):

1. the destination is checked before any work (a folder, an unwritable place: one error); a
   finished cache already there is kept: when these settings made it from these images there
   is nothing to do, otherwise (another encoder, other images, not a cache) it is refused;
2. every image of the chosen splits is pre-checked (``data_prep.images.check_image``: a
   regular file, a readable image of at most ``MAX_IMAGE_PIXELS`` pixels whose data decode); with
   ``on_error="fail"`` all unusable files are reported at once before anything is encoded,
   with ``on_error="skip"`` they are left out and recorded in the cache (``skipped_ids``) and in
   the sidecar ``NAME.skipped.json``. An image that passes the check but fails to decode while
   encoding is treated the same way (skipped with its reason, or one error naming the file);
3. the cache is filled through a resumable :class:`~data_prep.features.FeatureCacheWriter`
   (``.NAME.partial.h5`` beside the destination, committed after every batch): a run killed at
   any point continues from the committed images when the same command runs again, and the
   finished cache equals an uninterrupted run's (same ids, bitwise-equal features, same
   attributes). The partial file records the settings and the ordered image ids; a rerun with
   other settings is refused instead of discarding the work. One run at a time makes a cache:
   it holds ``.NAME.lock`` while it works, and a second run into the same cache is refused.

With ``weights=None`` the encoder is randomly initialized (``seed``) and its batch-norm statistics
are estimated on the first ``calibration_images`` training images
(:mod:`captioner.features.random_encoder`); those weights are saved beside the cache and that
file is recorded as the weights.

The steps live beside this module: :mod:`~captioner.features.cache_keys` (what made a cache,
and whether the one at the destination matches), :mod:`~captioner.features.image_checks` (the
pre-check and ``on_error``), :mod:`~captioner.features.encoding` (the resumable encoding pass).
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from captioner.features.cache_keys import cache_key, finished_cache, refuse_other_partial
from captioner.features.encoding import encode, feature_grid, report_start
from captioner.features.image_checks import precheck_images, usable_images
from captioner.features.random_encoder import (
    encoder_weights_path,
    install_copy,
    partial_weights_path,
    random_encoder_weights,
)
from captioner.features.settings import FeatureExtractionError, FeatureSettings
from data_prep import images as image_files
from data_prep.features import (
    FeatureCacheWriter,
    cache_lock_path,
    partial_cache_path,
    skipped_images_path,
)
from data_prep.locks import held_alone
from data_prep.output_folders import made_folder
from data_prep.paths import OutputPathError, check_output_file

if TYPE_CHECKING:
    from captioner.model.encoder import GridEncoder
    from data_prep.karpathy import ImageEntry, KarpathyDataset


def extract_features(
    karpathy_json: str | Path,
    image_root: str | Path,
    out: str | Path,
    *,
    arch: str = "resnet101",
    layer: str = "layer4",
    weights: str | None = "IMAGENET1K_V2",
    image_size: int = 256,
    splits: tuple[str, ...] = ("train", "val", "test"),
    batch_size: int = 32,
    num_workers: int = 2,
    device: str = "cpu",
    seed: int = 0,
    calibration_images: int = 64,
    progress: bool = True,
    on_error: str = "fail",
    log: Callable[[str], None] | None = None,
) -> dict:
    """Encode the images of ``splits`` with the ResNet ``arch`` up to stage ``layer`` and write
    the cache ``out`` (see the module docstring); returns the encoder dict recorded in it
    (``arch``, ``layer``, ``weights``, ``image_size``, ``init``). The keywords are those of
    :class:`~captioner.features.settings.FeatureSettings`, as ``prepare-features`` takes them.

    ``weights=None``: random initialization (``seed``) with batch-norm statistics estimated on
    the first ``calibration_images`` training images, saved to :func:`encoder_weights_path`.
    ``on_error``: ``"fail"`` or ``"skip"`` unusable images. ``log`` receives one line per
    event (bad images, resuming, what was encoded); progress bars go to stderr.

    Raises:
        FeatureExtractionError: bad options, an unwritable destination, unusable images
            (``on_error="fail"``), a partial cache made with other settings.
        OutputPathError: another run is making the same cache.
        ValueError, OSError, EncoderWeightsError: unreadable split file, unknown weights name,
            weights that cannot be loaded (each names the file or value); OSError also for a
            cache that the disk or the file size limit stops (one line naming the folder).
    """
    settings = FeatureSettings(
        arch=arch, layer=layer, weights=weights, image_size=image_size, splits=splits,
        batch_size=batch_size, num_workers=num_workers, device=device, seed=seed,
        calibration_images=calibration_images, on_error=on_error)
    run = _Run(Path(out), settings, progress, log or (lambda line: None))
    return make_feature_cache(karpathy_json, image_root, run)


@dataclass(frozen=True)
class _Run:
    """One run of :func:`make_feature_cache`: the cache ``out``, its settings, whether to show
    progress bars, and where its one-line reports go (``say``)."""

    out: Path
    settings: FeatureSettings
    progress: bool
    say: Callable[[str], None]


@dataclass(frozen=True)
class _Source:
    """The images to encode: ``entries`` of the chosen splits, each once, in split order, with
    their ``names`` by id, from the ``dataset`` of the split file ``karpathy_json``."""

    entries: list[ImageEntry]
    names: dict[int, str]
    dataset: KarpathyDataset
    karpathy_json: str | Path


def make_feature_cache(karpathy_json: str | Path, image_root: str | Path, run: _Run) -> dict:
    """The steps of :func:`extract_features`: check the destination and the inputs, then,
    holding the cache's lock, keep a finished cache made with these settings, or pre-check the
    images, ready the encoder and fill the cache; returns the encoder dict recorded in it."""
    _check_destination(run.out)
    source = _read_source(karpathy_json, image_root, run.settings.splits)
    # One writer per cache: a second run would read, or start over on, the partial file and
    # encoder weights the first is writing.
    busy = (f"{run.out}: another run is making this cache now (it holds "
            f"{cache_lock_path(run.out)}); wait for it to end, or stop it")
    with made_folder(run.out.parent), held_alone(cache_lock_path(run.out), busy):
        key = cache_key(run.settings.recorded(image_files.MAX_IMAGE_PIXELS),
                        [entry.image_id for entry in source.entries])
        finished = finished_cache(run.out, key, source.names)
        if finished is not None:
            run.say(f"{run.out} is complete already ({len(finished)} images, made with these "
                    "settings); nothing to do")
            return finished.encoder
        refuse_other_partial(run.out, key)
        # Named and local weights load before the (long) pre-check, so that a missing file is
        # reported at once (but not when the cache is done: rerunning offline has nothing to
        # load); a random encoder needs readable images and comes after it.
        encoder = _loaded_encoder(run.settings, run.settings.weights)
        reasons = _prechecked(source, f"--images {image_root}: none of the "
                              f"{len(source.entries)} images of {karpathy_json}", run)
        encoder, config = _ready_encoder(encoder, source, key, run)
        writer, encoded = _fill_cache(encoder, config, key, source, reasons, run)
    skipped = writer.skipped
    note = f", {len(skipped)} skipped (listed in {skipped_images_path(run.out)})" if skipped else ""
    run.say(f"encoded {encoded} images in this run; {run.out} holds {writer.rows} of "
            f"{len(source.entries)}{note}")
    return config


def _check_destination(out: Path) -> None:
    try:
        check_output_file(out)
    except OutputPathError as exc:
        raise FeatureExtractionError(str(exc)) from None


def _read_source(karpathy_json: str | Path, image_root: str | Path,
                 splits: tuple[str, ...]) -> _Source:
    """The images of ``splits`` in split order, each image once.

    Raises:
        FeatureExtractionError: no image folder, an unknown split, no images in the splits.
    """
    from data_prep.karpathy import image_name, load_karpathy

    if not Path(image_root).is_dir():  # one line, not a "file not found" per image
        raise FeatureExtractionError(f"{image_root}: image folder not found")
    dataset = load_karpathy(karpathy_json, image_root)
    entries, seen = [], set()
    for split in splits:
        for entry in _split(dataset, split, karpathy_json):
            if entry.image_id not in seen:
                seen.add(entry.image_id)
                entries.append(entry)
    if not entries:
        raise FeatureExtractionError(
            f"{karpathy_json}: no images in the splits {', '.join(splits)}"
        )
    names = {entry.image_id: image_name(entry, image_root) for entry in entries}
    return _Source(entries, names, dataset, karpathy_json)


def _split(dataset: KarpathyDataset, split: str, karpathy_json: str | Path) -> list[ImageEntry]:
    try:
        return dataset.split(split)
    except KeyError as exc:
        raise FeatureExtractionError(f"{karpathy_json}: {exc.args[0]}") from None


def _loaded_encoder(settings: FeatureSettings, weights: str | None) -> GridEncoder | None:
    """The encoder of named or local ``weights``; None for a random one (made later)."""
    from captioner.model.encoder import build_encoder

    return None if weights is None else build_encoder(settings.arch, weights,
                                                      layer=settings.layer)


def _prechecked(source: _Source, where: str, run: _Run) -> list[str | None]:
    """The pre-check's reason for each image (None: usable), ``on_error`` applied
    (:func:`~captioner.features.image_checks.usable_images`)."""
    reasons = precheck_images(
        [entry.path for entry in source.entries], num_workers=run.settings.num_workers,
        progress=run.progress, max_pixels=image_files.MAX_IMAGE_PIXELS,
    )
    usable_images(source.entries, reasons, where, run.settings.on_error, run.say)
    return reasons


def _ready_encoder(encoder: GridEncoder | None, source: _Source, key: dict,
                   run: _Run) -> tuple[GridEncoder, dict]:
    """The encoder on its device in eval mode (a random one made and calibrated now), with the
    encoder dict that the cache records; ``key`` gets the weights' hash and ``init``."""
    from captioner.model.encoder import build_encoder

    settings = run.settings
    if encoder is None:
        train = _split(source.dataset, "train", source.karpathy_json)
        weights_sha256, init = random_encoder_weights(run.out, train, settings)
        encoder = build_encoder(settings.arch, partial_weights_path(run.out),
                                layer=settings.layer)
        recorded_weights = str(encoder_weights_path(run.out).resolve())
    else:
        weights_sha256 = key.get("weights_sha256")
        recorded_weights, init = settings.weights, "loaded weights"
    key.update(weights_sha256=weights_sha256, init=init)
    config = {"arch": settings.arch, "layer": settings.layer, "weights": recorded_weights,
              "image_size": settings.image_size, "init": init}
    return encoder.to(settings.device).eval(), config


def _fill_cache(encoder: GridEncoder, config: dict, key: dict, source: _Source,
                reasons: list[str | None], run: _Run) -> tuple[FeatureCacheWriter, int]:
    """Encode into the resumable writer of ``run.out`` what it does not hold yet, and install
    a random encoder's weights beside the finished cache; returns the writer and how many
    images this run encoded. A run that fails keeps its partial cache and weights for the
    rerun, unless it wrote no row."""
    settings, out = run.settings, run.out
    writer = FeatureCacheWriter(
        out, grid=feature_grid(encoder, settings.image_size, settings.device),
        channels=encoder.channels, encoder=config, names=source.names, resume_key=key,
    )
    try:
        with writer:
            report_start(writer, len(source.entries), run.say)
            writer.check_room(len(source.entries) - writer.done,
                              f"the cache of {len(source.entries)} images")
            encoded = encode(writer, encoder, source.entries, reasons, settings,
                             progress=run.progress, max_pixels=image_files.MAX_IMAGE_PIXELS)
            if settings.weights is None:
                install_copy(partial_weights_path(out), encoder_weights_path(out))
    except BaseException:
        # The writer keeps no partial cache without rows: nor are its weights kept.
        if settings.weights is None and not partial_cache_path(out).exists():
            partial_weights_path(out).unlink(missing_ok=True)
        raise
    if settings.weights is None:
        partial_weights_path(out).unlink(missing_ok=True)
    return writer, encoded
