"""The blinded human-rating kit of the paper's appendix B written into a folder, with its key
beside it: what ``captioner rating-kit`` runs (the page and key are :mod:`eval.rating.kit`).
torch is imported when the work starts, so that the command's options are read at once (hence
no type-only imports here: jsonargparse runs them to read the signature)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Literal, NamedTuple

from captioner.inference.heatmap_folder import DEFAULT_SIZE, Upsample, check_figure_options
from captioner.model.decoding_options import DecodingOverrides, apply_overrides
from captioner.reporting import report_error
from data_prep.settings_files import check_options_at_least
from data_prep.wording import counted
from eval.rating.kit import check_image_source

PROG = "captioner rating-kit"


class _Source(NamedTuple):
    """Where the images are sampled from: a folder, or a Karpathy split."""

    image_dir: Path | None
    data: Path | None
    images: Path | None
    split: str


def key_path_of(out: Path, key: Path | None) -> Path:
    """The key file of the kit folder ``out``: ``key``, or ``OUT-key.json`` beside it.
    ValueError when the key would lie inside the kit or ``out`` names no folder of its own."""
    kit = Path(out).resolve()
    if key is None and not kit.name:
        raise ValueError(f"--out {out}: the kit needs a folder of its own (its key is written "
                         "beside it), not the root folder")
    key_path = Path(key) if key is not None else kit.with_name(kit.name + "-key.json")
    if key_path.resolve().is_relative_to(kit):
        raise ValueError(f"the key {key_path} must not be inside the kit folder {out}")
    return key_path


def make_rating_kit(
    ckpt: list[Path],
    out: Path,
    image_dir: Path | None = None,
    data: Path | None = None,
    images: Path | None = None,
    split: Literal["train", "val", "test"] = "test",
    n: int = 100,
    seed: int = 0,
    key: Path | None = None,
    overwrite: bool = False,
    title: str = "Image caption rating",
    upsample: Upsample = "nearest",
    size: int = DEFAULT_SIZE,
    decoding: DecodingOverrides | None = None,
    batch_size: int = 16,
    device: str | None = None,
    progress: bool = True,
) -> int:
    """Sample ``n`` images, caption them with every checkpoint of ``ckpt`` and write the kit
    into ``out`` and its blinding key to ``key``; the exit status: 0, 1 when an image drawn
    could not be read (another drawn in its place), 2 for a user error (one line, before
    anything is captioned) or fewer than ``n`` readable images.

    Args:
        ckpt: checkpoint of one model; repeat for every model to compare.
        out: kit folder to write.
        image_dir: sample from the images of this folder instead of a Karpathy split.
        data: Karpathy split JSON (dataset_coco.json).
        images: image root of the Karpathy JSON.
        split: split of --data to sample from.
        n: images to sample.
        seed: seed of the sample and of the blinding.
        key: key file (default: OUT-key.json).
        overwrite: replace the rating kit (and its key) of an earlier run in --out, wholly
            (default: --out must be new or empty).
        title: page title.
        upsample: attention cells drawn as blocks (nearest) or smoothed (bilinear).
        size: longer image side in pixels, 32 to 4096.
        decoding: decoding options; each not given is the checkpoint's own.
        batch_size: images per batch.
        device: torch device: cpu, cuda, cuda:1, ... (default: cuda when available, else cpu).
        progress: show progress bars.
    """
    ckpt, out = [Path(path) for path in ckpt], Path(out)
    with contextlib.ExitStack() as claim:  # the --out folder, held until the work ends
        try:
            check_figure_options(size)
            # numpy's generators take no negative seed.
            check_options_at_least([("n", n, 1), ("batch_size", batch_size, 1), ("seed", seed, 0)])
            check_image_source("IMAGE_DIR", image_dir is not None, data, images)
            key_path = key_path_of(out, key)
            source = _Source(image_dir, data, images, split)
            opened = _open(ckpt, out, key_path, overwrite, source, device, claim)
        except (OSError, ValueError) as exc:
            return report_error(PROG, exc)
        candidates, replaces_key, earlier, captioners = opened
        options = [apply_overrides(captioner.decoding, decoding) for captioner in captioners]
        style = dict(title=title, upsample=upsample, size=size, batch_size=batch_size,
                     progress=progress, seed=seed)
        return _make(ckpt, out, key_path, source, n, candidates, captioners, options,
                     replaces_key, earlier, style)


def _candidates(source: _Source) -> list[tuple[str, Path]]:
    """(key, path) of every image to sample from, in a deterministic order."""
    if source.image_dir is not None:
        from captioner.inference.image_files import collect_images

        root = Path(source.image_dir)
        return [(p.relative_to(root).as_posix(), p) for p in collect_images([root])]
    from data_prep.karpathy import load_karpathy

    entries = load_karpathy(source.data, source.images).split(source.split)
    return [(str(entry.image_id), entry.path) for entry in entries]


def _open(ckpt, out, key_path, overwrite, source: _Source, device, claim):
    """Everything checked before an image is captioned. Returns (the candidates, whether the
    key replaces an earlier one, the earlier kit in --out or None, the captioners); raises
    OSError or ValueError."""
    from captioner.inference.heatmaps import checkpoint_names
    from captioner.inference.pipeline import open_captioner
    from data_prep.output_folders import (
        check_output_folder,
        claimed_output,
        refuse_inputs_in_output,
    )
    from data_prep.text import check_utf8_names
    from eval.rating.kit import KIT_FORMAT, kit_files

    checkpoint_names(ckpt)  # a checkpoint given twice is refused
    candidates = _candidates(source)
    check_utf8_names((path for _, path in candidates), "the rating kit's page")
    # With --data, the image root is an input folder too.
    roots = [source.image_dir] if source.image_dir is not None else [source.images]
    refuse_inputs_in_output(out, [*map(Path, roots), *(path for _, path in candidates)])
    reads = [*(("checkpoint", path) for path in ckpt),
             *([("dataset file", source.data)] if source.data is not None else []),
             *(("image", path) for _, path in candidates)]
    replaces_key = _check_key(key_path, overwrite, reads)
    earlier = claim.enter_context(claimed_output(out, "rating kit", lambda: check_output_folder(
        out, "rating kit", "index.html", f'"format": "{KIT_FORMAT}"', overwrite, kit_files)))
    captioners = [open_captioner(path, device) for path in ckpt]
    return candidates, replaces_key, earlier, captioners


def _check_key(path: Path, overwrite: bool, reads: list[tuple[str, Path]]) -> bool:
    """Check, before any work, that the key can be written to ``path``; returns whether it
    replaces an earlier key (only with ``overwrite``).

    Raises:
        OutputPathError: ``path`` cannot be written, is one of the files the command
            ``reads`` ((what, path) pairs), is a file but not a key (also with ``overwrite``),
            or holds a key and ``overwrite`` is False (the ratings of its kit could never be
            unblinded again).
    """
    from data_prep.paths import OutputPathError, check_output_file
    from eval.rating.kit import is_key_file

    check_output_file(path, reads)
    if not path.exists():
        return False
    if not is_key_file(path):
        raise OutputPathError(f"{path}: exists and is not the blinding key of a rating kit, "
                              "which --overwrite alone may replace; choose another --key")
    if not overwrite:
        raise OutputPathError(
            f"{path}: the blinding key of an earlier kit exists; ratings of that kit cannot be "
            "unblinded without it: choose another --out (or --key), or keep a copy of it and "
            "pass --overwrite to replace kit and key"
        )
    return True


def _make(ckpt, out, key_path, source, n, candidates, captioners, options, replaces_key,
          earlier, style) -> int:
    """Sample, caption and write kit and key; the exit status."""
    from captioner.inference.heatmaps import checkpoint_names
    from eval.rating.kit import KitModel, fewer_than_asked, sample_readable

    sample, skipped = sample_readable(candidates, n, style["seed"])
    for error in skipped:
        print(f"{PROG}: skipped {error}", file=sys.stderr)
    if len(sample) < n:
        where = (str(source.image_dir) if source.image_dir is not None
                 else f"the {source.split} split")
        # The kit is never made smaller than asked behind the user's back (a study plans its
        # size), but the line says how to make the kit that can be made.
        print(f"{PROG}: {fewer_than_asked(n, len(sample), len(candidates), where)}; pass "
              f"--n {len(sample)} for a kit of those", file=sys.stderr)
        return 2
    models = [KitModel(name, str(path), c.output_attention_name)
              for name, path, c in zip(checkpoint_names(ckpt), ckpt, captioners, strict=True)]
    images = _caption_sample(sample, captioners, options, source.image_dir is not None, style)
    try:
        kit = _write_kit(out, images, models, key_path, earlier, style)
    except (OSError, ValueError) as exc:
        return report_error(PROG, exc, status=1)
    print(f"rating kit {kit.kit_id}: {counted(len(images), 'image')} x "
          f"{counted(len(models), 'model')} -> {kit.html}")
    print(f"blinding key (keep it from the raters): {key_path}"
          + (" (replaced the earlier key)" if replaces_key else ""))
    if skipped:
        print(f"{PROG}: {len(skipped)} of the images drawn could not be read (each is named "
              "above); others were drawn in their place", file=sys.stderr)
        return 1
    return 0


def _caption_sample(sample, captioners, options, from_folder: bool, style: dict) -> list:
    """KitImage of each sampled (key, path, image), with every model's caption of it; the
    sampled images are decoded already, so every model captions them from memory."""
    from eval.rating.kit import KitCaption, KitImage

    pictures = [image for _, _, image in sample]
    captions: list[list[KitCaption]] = [[] for _ in sample]
    for captioner, decoding in zip(captioners, options, strict=True):
        results = captioner.caption(pictures, decoding, batch_size=style["batch_size"],
                                    progress=style["progress"])
        for i, caption in enumerate(results):
            captions[i].append(KitCaption(caption.text, list(caption.tokens),
                                          caption.attention.float().numpy()))
    # An IMAGE_DIR image's key is its path inside the folder: unique, where file names may
    # repeat in two subfolders; a split's key is its image id, shown beside its file name.
    return [KitImage(key, key if from_folder else path.name, image, caps)
            for (key, path, image), caps in zip(sample, captions, strict=True)]


def _write_kit(out: Path, images, models, key_path: Path, earlier, style: dict):
    """Write the kit into ``out`` and its key to ``key_path``, replacing the ``earlier`` kit
    (--overwrite) only once the new one is whole, so that it is never replaced by none (one
    stopped half-way, or of only empty captions). Returns the `RatingKit`."""
    from data_prep.output_folders import result_folder
    from data_prep.stop_signals import stops_held
    from eval.rating.kit import build_kit, kit_scale, write_key

    vmax = kit_scale(images, models)
    with contextlib.ExitStack() as kit_and_key:
        with result_folder(out, earlier) as folder:
            kit = build_kit(folder, images, models, seed=style["seed"], title=style["title"],
                            upsample=style["upsample"], max_side=style["size"], vmax=vmax)
            # From the key's write until the kit is in place, a stop waits: a kit without its
            # key could never be unblinded. A failed write keeps the earlier kit and key.
            # The kit's id, in both, tells a key of another kit apart (rating-summary refuses it).
            kit_and_key.enter_context(stops_held())
            write_key(kit.key, key_path)
    return dataclasses.replace(kit, html=out / kit.html.relative_to(folder))
