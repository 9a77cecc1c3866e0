"""The encoding pass: the images not yet in the cache encoded batch by batch, each batch
committed, so that a run killed at any point resumes at the next batch boundary and writes the
same bits as an uninterrupted run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from captioner.features.settings import FeatureExtractionError, FeatureSettings
from data_prep import images as image_files
from data_prep.features import FeatureCacheWriter, partial_cache_path
from data_prep.wording import agreeing, counted

if TYPE_CHECKING:
    from captioner.model.encoder import GridEncoder
    from data_prep.karpathy import ImageEntry


def feature_grid(encoder: GridEncoder, image_size: int, device: str) -> tuple[int, int]:
    """(H, W) of the feature grid that ``encoder`` gives for ``image_size`` pixels."""
    import torch

    with torch.no_grad():
        probe = encoder(torch.zeros(1, 3, image_size, image_size, device=device))
    return int(probe.shape[1]), int(probe.shape[2])


def report_start(writer: FeatureCacheWriter, total: int, say: Callable[[str], None]) -> None:
    """Say whether the writer resumes a partial cache (and how far it got) or starts it over."""
    partial = partial_cache_path(writer.path)
    if writer.restarted:
        say(f"starting over: {partial} {writer.restarted}")
    elif writer.done:
        skipped = len(writer.skipped)
        detail = f" ({writer.rows} encoded, {skipped} skipped)" if skipped else " encoded"
        say(f"resuming: {writer.done} of {total} images already{detail} ({partial})")


def encode(writer: FeatureCacheWriter, encoder: GridEncoder, entries: Sequence[ImageEntry],
           reasons: Sequence[str | None], settings: FeatureSettings, *, progress: bool,
           max_pixels: int) -> int:
    """Encode ``entries[writer.done:]`` (``reasons``: the pre-check's, None for a usable image)
    batch by batch, committing after each batch; returns how many images were encoded.

    Batches cover the same source positions as in an uninterrupted run (a resumed run starts
    at a batch boundary), so the encoder sees the same batches and writes the same bits."""
    import torch
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    start, size = writer.done, settings.batch_size
    loader = DataLoader(
        _SourceImages(entries[start:], reasons[start:], settings.image_size, max_pixels),
        batch_size=size, num_workers=settings.num_workers, collate_fn=list,
    )
    encoded = 0
    arch = getattr(encoder, "arch", "encoder")
    with (
        torch.no_grad(),
        tqdm(total=len(entries), initial=start, desc=f"{arch} features", unit="img",
             disable=not progress) as bar,
    ):
        for offset, batch in zip(range(start, len(entries), size), loader, strict=True):
            kept, inputs = _usable_in_batch(writer, entries[offset : offset + len(batch)], batch,
                                            settings.on_error)
            if inputs:
                features = encoder(torch.stack(inputs).to(settings.device))
                writer.add(kept, features.half().cpu().numpy())
                encoded += len(kept)
            writer.commit()
            bar.update(len(batch))
    return encoded


def _usable_in_batch(writer: FeatureCacheWriter, chunk: Sequence[ImageEntry], batch: list,
                     on_error: str) -> tuple[list[int], list]:
    """The image ids and inputs of the images of ``batch`` (``(image, reason)`` per entry of
    ``chunk``) that decoded; the others are skipped (``on_error="skip"``), or the work so far
    is committed and the first one refused.

    Raises:
        FeatureExtractionError: an image that cannot be decoded, with ``on_error="fail"``.
    """
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
    return kept, inputs


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
