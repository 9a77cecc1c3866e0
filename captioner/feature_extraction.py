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
are estimated on the first ``calibration_images`` training images: a random network's features
are far more informative with normalized activations (on the synthetic demo data, validation
CIDEr 0.96 instead of 0.57 after the same training, measured). Those weights are saved beside
the cache (:func:`encoder_weights_path`) and that file is recorded as the weights, so that a model
trained on the cache loads the very encoder that produced it; an interrupted run keeps them in
``.NAME.encoder.partial.pt`` and reuses them when it resumes.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from data_prep import images as image_files
from data_prep.atomic import atomic_write
from data_prep.disk_space import check_room
from data_prep.features import (
    FeatureCache,
    FeatureCacheWriter,
    cache_lock_path,
    partial_cache_path,
    partial_resume_key,
    skipped_images_path,
)
from data_prep.hashes import file_sha256
from data_prep.locks import held_alone
from data_prep.output_folders import made_folder
from data_prep.paths import OutputPathError, check_output_file
from data_prep.settings_files import check_integers
from data_prep.wording import agreeing, counted

if TYPE_CHECKING:
    import torch

    from captioner.model.encoder import GridEncoder
    from data_prep.karpathy import ImageEntry

ON_ERROR = ("fail", "skip")
SHOWN_BAD_IMAGES = 10  # unusable images listed by name in a message; the rest are counted
_CHECK_BATCH = 64  # images per pre-check work item


class FeatureExtractionError(ValueError):
    """A problem with the inputs or the destination; the message names it."""


def encoder_weights_path(cache_path: str | Path) -> Path:
    """Where the weights of a randomly initialized encoder are saved for ``cache_path``."""
    cache_path = Path(cache_path)
    return cache_path.with_name(f"{cache_path.stem}.encoder.pt")


def _partial_weights_path(cache_path: Path) -> Path:
    return cache_path.with_name(f".{cache_path.stem}.encoder.partial.pt")


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
    (``arch``, ``layer``, ``weights``, ``image_size``, ``init``).

    ``weights=None``: random initialization (``seed``) with batch-norm statistics estimated on
    the first ``calibration_images`` training images, saved to :func:`encoder_weights_path`.
    ``on_error``: ``"fail"`` or ``"skip"`` unusable images. ``log`` receives one line per
    event (bad images, resuming, what was encoded); progress bars go to stderr.

    Raises:
        FeatureExtractionError: bad options, an unwritable destination, unusable images
            (``on_error="fail"``), a partial cache made with other settings.
        OutputPathError: another run is making the same cache.
        ValueError, OSError, EncoderWeightsError: unreadable split file, unknown weights name,
            weights that cannot be loaded (each names the file or value).
    """
    import torch

    from captioner.model.encoder import ARCHITECTURES, LAYERS, build_encoder
    from data_prep.karpathy import image_name, load_karpathy

    say = log or (lambda line: None)
    _check_options(on_error, image_size, batch_size, num_workers)
    for name, value, valid in (("arch", arch, ARCHITECTURES), ("layer", layer, LAYERS)):
        if value not in valid:
            raise FeatureExtractionError(
                f"unknown encoder {name} {value!r}; valid: {', '.join(valid)}"
            )
    out = Path(out)
    try:
        check_output_file(out)
    except OutputPathError as exc:
        raise FeatureExtractionError(str(exc)) from None
    max_pixels = image_files.MAX_IMAGE_PIXELS
    if not Path(image_root).is_dir():  # one line, not a "file not found" per image
        raise FeatureExtractionError(f"{image_root}: image folder not found")
    dataset = load_karpathy(karpathy_json, image_root)
    entries = _source_entries(dataset, splits, karpathy_json)

    # One writer per cache: a second run would read, or start over on, the partial file and
    # encoder weights the first is writing.
    busy = (f"{out}: another run is making this cache now (it holds {cache_lock_path(out)}); "
            "wait for it to end, or stop it")
    with made_folder(out.parent), held_alone(cache_lock_path(out), busy):
        settings = {
            "arch": arch, "layer": layer, "weights": weights, "image_size": image_size,
            "batch_size": batch_size, "device": torch.device(device).type, "max_pixels": max_pixels,
        }
        if weights is None:
            settings.update(seed=seed, calibration_images=calibration_images)
        key = {"settings": settings, "images": _ids_fingerprint([e.image_id for e in entries])}
        local = None if weights is None else Path(weights)
        if local is not None and local.is_file():
            # Before the caches are compared: a file is the same weights by its bytes, however
            # its path is spelled (enc.pt, ./enc.pt, an absolute path).
            key["weights_sha256"] = file_sha256(local)
        names = {entry.image_id: image_name(entry, image_root) for entry in entries}
        finished = _finished_cache(out, key, names)
        if finished is not None:
            say(f"{out} is complete already ({len(finished)} images, made with these settings); "
                "nothing to do")
            return finished.encoder
        _refuse_other_partial(out, key)
        # Named and local weights load before the (long) pre-check, so that a missing file is
        # reported at once (but not when the cache is done: rerunning offline has nothing to
        # load); a random encoder needs readable images and comes after it.
        encoder = None if weights is None else build_encoder(arch, weights, layer=layer)

        reasons = precheck_images(
            [entry.path for entry in entries], num_workers=num_workers, progress=progress,
            max_pixels=max_pixels,
        )
        bad = [(entry, reason) for entry, reason in zip(entries, reasons, strict=True) if reason]
        if entries and len(bad) == len(entries):  # none at all: the image root, most likely
            raise FeatureExtractionError(
                f"--images {image_root}: none of the {len(entries)} images of {karpathy_json} "
                f"can be used (the first, {bad[0][0].path}: {bad[0][1]}); is --images the "
                "folder that the split file's paths are relative to?")
        if bad and on_error == "fail":
            raise FeatureExtractionError(
                _bad_images_message(bad, len(entries), "cannot be used", one_line=True)
                + f" (fix or remove them, or rerun with --on-error skip to encode the other "
                f"{len(entries) - len(bad)})"
            )
        if bad:
            say(_bad_images_message(bad, len(entries), "cannot be used and will be skipped"))

        if weights is None:
            weights_sha256, init = _random_encoder_weights(
                out, dataset.split("train"), arch=arch, image_size=image_size, seed=seed,
                calibration_images=calibration_images,
            )
            encoder = build_encoder(arch, _partial_weights_path(out), layer=layer)
            recorded_weights = str(encoder_weights_path(out).resolve())
        else:
            weights_sha256 = key.get("weights_sha256")
            recorded_weights, init = weights, "loaded weights"
        key.update(weights_sha256=weights_sha256, init=init)
        encoder = encoder.to(device).eval()
        config = {
            "arch": arch, "layer": layer, "weights": recorded_weights, "image_size": image_size,
            "init": init,
        }

        grid = _grid(encoder, image_size, device)
        writer = FeatureCacheWriter(
            out, grid=grid, channels=encoder.channels, encoder=config,
            names=names, resume_key=key,
        )
        try:
            with writer:
                _report_start(writer, len(entries), say)
                # float16 rows, and a little for HDF5's own structures.
                row_bytes = 2 * math.prod(grid) * encoder.channels * 1.01
                check_room(out.parent, int((len(entries) - writer.done) * row_bytes),
                           int(len(entries) * row_bytes), f"the cache of {len(entries)} images")
                encoded = _encode(
                    writer, encoder, entries, reasons, image_size=image_size,
                    batch_size=batch_size, num_workers=num_workers, device=device,
                    on_error=on_error, progress=progress, max_pixels=max_pixels,
                )
                if weights is None:
                    _install_copy(_partial_weights_path(out), encoder_weights_path(out))
        except BaseException:
            # The writer keeps no partial cache without rows: nor are its weights kept.
            if weights is None and not partial_cache_path(out).exists():
                _partial_weights_path(out).unlink(missing_ok=True)
            raise
        if weights is None:
            _partial_weights_path(out).unlink(missing_ok=True)
    skipped = writer.skipped
    note = f", {len(skipped)} skipped (listed in {skipped_images_path(out)})" if skipped else ""
    say(f"encoded {encoded} images in this run; {out} holds {writer.rows} of {len(entries)}{note}")
    return config


def _check_options(on_error: str, image_size: int, batch_size: int, num_workers: int) -> None:
    if on_error not in ON_ERROR:
        raise FeatureExtractionError(
            f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}"
        )
    check_integers([("image size", image_size, 1), ("batch size", batch_size, 1),
                    ("number of workers", num_workers, 0)], FeatureExtractionError)


def _source_entries(dataset, splits: Sequence[str], karpathy_json) -> list[ImageEntry]:
    """The images of ``splits`` in split order, each image once."""
    entries, seen = [], set()
    for split in splits:
        try:
            split_entries = dataset.split(split)
        except KeyError as exc:
            raise FeatureExtractionError(f"{karpathy_json}: {exc.args[0]}") from None
        for entry in split_entries:
            if entry.image_id not in seen:
                seen.add(entry.image_id)
                entries.append(entry)
    if not entries:
        raise FeatureExtractionError(
            f"{karpathy_json}: no images in the splits {', '.join(splits)}"
        )
    return entries


def precheck_images(
    paths: Sequence[Path], *, num_workers: int = 0, progress: bool = False,
    max_pixels: int | None = None,
) -> list[str | None]:
    """:func:`data_prep.images.check_image` of every path, in order (``num_workers`` worker
    processes)."""
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    checks = _ImageChecks(list(paths), max_pixels)
    loader = DataLoader(
        checks, batch_size=_CHECK_BATCH, num_workers=num_workers, collate_fn=list
    )
    reasons: list[str | None] = []
    with tqdm(total=len(checks), desc="checking images", unit="img", disable=not progress) as bar:
        for batch in loader:
            reasons.extend(batch)
            bar.update(len(batch))
    return reasons


class _ImageChecks:
    """Dataset: index -> :func:`data_prep.images.check_image` of that path."""

    def __init__(self, paths: list[Path], max_pixels: int | None) -> None:
        self.paths = paths
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> str | None:
        return image_files.check_image(self.paths[index], self.max_pixels)


def _bad_images_message(bad: Sequence[tuple[Any, str]], total: int, what: str, *,
                        one_line: bool = False) -> str:
    """``N of TOTAL images WHAT:`` and the first bad files with their reasons, one per line,
    or (``one_line``, for an error) separated by semicolons."""
    items = [f"{entry.path}: {reason}" for entry, reason in bad[:SHOWN_BAD_IMAGES]]
    if len(bad) > SHOWN_BAD_IMAGES:
        items.append(f"and {len(bad) - SHOWN_BAD_IMAGES} more")
    head = f"{len(bad)} of {total} images {what}:"
    if one_line:
        return f"{head} {'; '.join(items)}"
    return "\n".join([head, *(f"  {item}" for item in items)])


def _ids_fingerprint(ids: Sequence[int]) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()
    return {"count": len(ids), "ids_sha256": digest}


# How a cache is computed, not what it holds: a finished cache serves any of them. A partial
# cache is only resumed with its own, so that its rows match an uninterrupted run's bitwise.
_EXECUTION_SETTINGS = frozenset({"batch_size", "device"})


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


def _finished_cache(out: Path, key: dict[str, Any],
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


def _refuse_other_partial(out: Path, key: dict[str, Any]) -> None:
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


def _random_encoder_weights(
    out: Path, train: Sequence[ImageEntry], *, arch: str, image_size: int, seed: int,
    calibration_images: int,
) -> tuple[str, str]:
    """Make (or, when resuming, reuse) the random encoder's weights file; returns its SHA-256
    and the ``init`` description.

    The file of an interrupted run is reused, with its recorded description, when the partial
    cache was made with it (same SHA-256): the resumed rows and the new ones then come from one
    encoder even if calibration were not bitwise reproducible or its images had changed."""
    from captioner.checkpointing import save_atomically  # imports torch and Lightning

    path = _partial_weights_path(out)
    recorded = partial_resume_key(out) or {}
    if path.is_file() and recorded.get("init") and file_sha256(path) == recorded["weights_sha256"]:
        return recorded["weights_sha256"], recorded["init"]
    images = _calibration_inputs(train, calibration_images, image_size)
    init = f"random (seed {seed}), batch-norm statistics of {len(images)} images"
    resnet = _calibrated_random_resnet(arch, images, seed)
    save_atomically(resnet.state_dict(), path)
    return file_sha256(path), init


def _calibration_inputs(
    entries: Sequence[ImageEntry], count: int, image_size: int
) -> list[torch.Tensor]:
    """The first ``count`` usable training images, preprocessed, float32 (3, S, S) each.

    Unusable ones are passed over here whatever ``on_error`` says (the encoding pass reports
    them), so that both modes calibrate on the same images."""
    images = []
    transform = image_files.imagenet_transform(image_size)
    for entry in entries:
        if len(images) == count:
            break
        if image_files.check_image(entry.path) is not None:
            continue  # e.g. a FIFO, which load_image would block on
        try:
            images.append(transform(image_files.load_image(entry.path)))
        except image_files.ImageLoadError:
            continue
    if not images:
        raise FeatureExtractionError(
            "random encoder initialization needs readable training images for batch norm"
        )
    return images


def _calibrated_random_resnet(arch: str, images: Sequence[torch.Tensor], seed: int):
    """A randomly initialized torchvision ResNet whose batch-norm running statistics are the
    exact mean and variance of its activations on ``images`` (no gradient step)."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    resnet = torchvision.models.get_model(arch, weights=None)
    for module in resnet.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # cumulative average over all calibration batches
    resnet.train()
    with torch.no_grad():
        for start in range(0, len(images), 16):
            resnet(torch.stack(list(images[start : start + 16])))
    return resnet.eval()


def _install_copy(source: Path, destination: Path) -> None:
    """Copy ``source`` over ``destination`` atomically, with the user's file mode."""
    with atomic_write(destination, "wb") as handle, source.open("rb") as original:
        shutil.copyfileobj(original, handle)


def _grid(encoder: GridEncoder, image_size: int, device: str) -> tuple[int, int]:
    import torch

    with torch.no_grad():
        probe = encoder(torch.zeros(1, 3, image_size, image_size, device=device))
    return int(probe.shape[1]), int(probe.shape[2])


def _report_start(writer: FeatureCacheWriter, total: int, say: Callable[[str], None]) -> None:
    partial = partial_cache_path(writer.path)
    if writer.restarted:
        say(f"starting over: {partial} {writer.restarted}")
    elif writer.done:
        skipped = len(writer.skipped)
        detail = f" ({writer.rows} encoded, {skipped} skipped)" if skipped else " encoded"
        say(f"resuming: {writer.done} of {total} images already{detail} ({partial})")


def _encode(
    writer: FeatureCacheWriter, encoder: GridEncoder, entries: Sequence[ImageEntry],
    reasons: Sequence[str | None], *, image_size: int, batch_size: int, num_workers: int,
    device: str, on_error: str, progress: bool, max_pixels: int,
) -> int:
    """Encode ``entries[writer.done:]`` batch by batch, committing after each batch; returns
    how many images were encoded.

    Batches cover the same source positions as in an uninterrupted run (a resumed run starts
    at a batch boundary), so the encoder sees the same batches and writes the same bits."""
    import torch
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    start = writer.done
    loader = DataLoader(
        _SourceImages(entries[start:], reasons[start:], image_size, max_pixels),
        batch_size=batch_size, num_workers=num_workers, collate_fn=list,
    )
    encoded = 0
    arch = getattr(encoder, "arch", "encoder")
    with (
        torch.no_grad(),
        tqdm(total=len(entries), initial=start, desc=f"{arch} features", unit="img",
             disable=not progress) as bar,
    ):
        for offset, batch in zip(range(start, len(entries), batch_size), loader, strict=True):
            chunk = entries[offset : offset + len(batch)]
            kept, inputs = [], []
            for entry, (image, reason) in zip(chunk, batch, strict=True):
                if image is not None:
                    kept.append(entry.image_id)
                    inputs.append(image)
                elif on_error == "skip":
                    writer.skip(entry.image_id, entry.path, reason)
                else:
                    writer.commit()
                    rows = writer.rows
                    kept_so_far = (f"the {counted(rows, 'image')} encoded so far "
                                   f"{agreeing(rows, 'is', 'are')} kept: " if rows else "")
                    raise FeatureExtractionError(
                        f"{entry.path}: {reason} (image id {entry.image_id}); {kept_so_far}fix "
                        "the file, or rerun with --on-error skip, to continue"
                    )
            if inputs:
                features = encoder(torch.stack(inputs).to(device))
                writer.add(kept, features.half().cpu().numpy())
                encoded += len(kept)
            writer.commit()
            bar.update(len(batch))
    return encoded


class _SourceImages:
    """Dataset: index -> (float32 (3, S, S) image, None), or (None, reason) for an image that
    failed the pre-check or cannot be decoded."""

    def __init__(
        self, entries: Sequence[ImageEntry], reasons: Sequence[str | None], image_size: int,
        max_pixels: int,
    ) -> None:
        self.entries = entries
        self.reasons = reasons
        self.transform = image_files.imagenet_transform(image_size)
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int):
        if self.reasons[index] is not None:
            return None, self.reasons[index]
        path = self.entries[index].path
        try:
            image = image_files.load_image(path, max_pixels=self.max_pixels)
        except image_files.ImageLoadError as exc:
            return None, str(exc).removeprefix(f"{path}: ")
        return self.transform(image), None

